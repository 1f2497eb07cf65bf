//! `POST /json` body → parse and convert → request path → JSON response.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| floodgate::fuzzing::json(data));
