//! Limits files (NUL-separated) → the loader: parse and validate must never panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| floodgate::fuzzing::config(data));
