//! floodgate: a global rate-limit server speaking Envoy's rate-limit service API (RLS v3).
#![forbid(unsafe_code)]

pub mod config;
pub mod limiter;
pub mod proto;
