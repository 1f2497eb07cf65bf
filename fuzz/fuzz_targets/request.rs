//! Protobuf `RateLimitRequest` → plan → memory store → response, with response invariants.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| floodgate::fuzzing::request(data));
