//! A structured bucket identity → `BucketKey` → decoded back: the encoding is injective.
#![no_main]

use arbitrary::Arbitrary;
use floodgate::fuzzing::{FuzzValue, bucket_key};
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
struct Input {
    domain: String,
    entries: Vec<(Vec<u8>, Value)>,
    algorithm: u8,
    period_us: u64,
    override_rate: Option<u32>,
}

#[derive(Arbitrary, Debug)]
enum Value {
    Value(Vec<u8>),
    Shared(String),
}

fuzz_target!(|input: Input| {
    let entries: Vec<(Vec<u8>, FuzzValue)> = input
        .entries
        .into_iter()
        .map(|(key, value)| {
            let value = match value {
                Value::Value(v) => FuzzValue::Value(v),
                Value::Shared(p) => FuzzValue::Shared(p),
            };
            (key, value)
        })
        .collect();
    bucket_key(
        &input.domain,
        &entries,
        input.algorithm,
        input.period_us,
        input.override_rate,
    );
});
