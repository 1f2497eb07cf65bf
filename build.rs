//! Puts the protobuf code generated from `proto/` where `src/proto.rs` includes it from.
//!
//! The code is generated ahead of time and committed in `proto/gen/` (see
//! `tests/proto_gen.rs`, which regenerates it and fails when the committed copy is stale):
//! compiling the protos at build time needed a protobuf compiler (protox) and prost's and
//! tonic's code generators as build dependencies: 31 crates of their own (protox,
//! prost-reflect, two versions of logos, miette, petgraph, prost-build, tonic-build, ...) and,
//! in optimised builds, second host-built copies of shared ones (regex, prost, ...), all
//! compiled and run before floodgate itself could start, in every build and in the fuzz
//! build, for output that only changes when `proto/` does. This script copies the files as they are into `OUT_DIR`
//! (with the standard library only), so `src/proto.rs` and the Dockerfile read them where
//! they always have.
//!
//! What `proto/gen/` holds, from one compilation of `proto/`:
//! - `floodgate_descriptor.bin`: the canonical descriptor set, exactly as the `.proto` files
//!   say, embedded for gRPC reflection so that grpcurl shows descriptor entries as readable
//!   strings;
//! - the Rust code (`floodgate_proto.rs` and the files it includes), generated from a decoding
//!   variant in which `RateLimitDescriptor.Entry.key/value` are `bytes`. The wire encoding of
//!   `string` and `bytes` is identical, but prost rejects a `string` that is not UTF-8 and
//!   fails the whole RPC; Envoy may send raw header bytes, so we decode them as bytes. This
//!   code also holds the xDS client's protos (ADS, `RateLimitConfig`): a client, and a server
//!   for the tests' control plane, never offered by reflection.

use std::{env, error::Error, fs, path::PathBuf};

const GENERATED: &str = "proto/gen";

fn main() -> Result<(), Box<dyn Error>> {
    println!("cargo:rerun-if-changed={GENERATED}");
    let out_dir = PathBuf::from(env::var("OUT_DIR")?);
    for entry in fs::read_dir(GENERATED)? {
        let path = entry?.path();
        if let Some(name) = path.file_name() {
            fs::copy(&path, out_dir.join(name))
                .map_err(|e| format!("copying {}: {e}", path.display()))?;
        }
    }
    Ok(())
}
