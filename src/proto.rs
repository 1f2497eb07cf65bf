//! Generated RLS v3 and RLQS v3 types (see `build.rs` and `proto/`).
//!
//! `RateLimitDescriptor.Entry.key/value` are `Bytes` here: Envoy may send raw header bytes
//! that are not UTF-8, and decoding them as `string` would fail the whole RPC; as `Bytes`
//! (not `Vec<u8>`) they are slices of the request's buffer rather than copies of their own.
//! [`FILE_DESCRIPTOR_SET`] is the canonical, string-typed schema served by reflection.
#![allow(missing_docs, clippy::all, clippy::pedantic)]

include!(concat!(env!("OUT_DIR"), "/floodgate_proto.rs"));

/// Canonical encoded `FileDescriptorSet` of `proto/` (string-typed entries), for reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/floodgate_descriptor.bin"));

pub use envoy::extensions::common::ratelimit::v3 as common;
pub use envoy::service::discovery::v3 as discovery;
pub use envoy::service::rate_limit_quota::v3 as rlqs;
pub use envoy::service::ratelimit::v3 as rls;
pub use envoy::r#type::v3 as types;
pub use ratelimit::config::ratelimit::v3 as rls_conf;
