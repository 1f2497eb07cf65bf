//! Named limits files that several test files run on: a test names the shape it needs
//! instead of writing the YAML again. A test whose limits are what it is about (matching,
//! algorithms, reload, the reference's files) keeps its YAML beside its assertions.

/// Domain `d`, one descriptor key `k`, 100 per minute: a limit the tests' own traffic never
/// reaches, for tests about something other than limiting (TLS, the server's bounds).
pub const D_K_100_PER_MINUTE: &str =
    "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 100}\n";

/// Domain `q` with quota-mode `soft` (1 per minute) beside `hard` (2 per minute), `tokens`
/// (100) and `metered` (100, overdraft): a quota-mode denial and the refund of what the
/// store already debited.
pub const QUOTA: &str = r#"
domain: q
descriptors:
  - key: soft
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: hard
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: tokens
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: metered
    rate_limit: {unit: minute, requests_per_unit: 100, overdraft: true}
"#;
