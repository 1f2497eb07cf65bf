//! Compiles `proto/` without a system `protoc` (protox is a pure-Rust compiler).
//!
//! Two descriptor sets come out of one compilation:
//! - the canonical one, exactly as the `.proto` files say, embedded for gRPC reflection so that
//!   grpcurl shows descriptor entries as readable strings;
//! - a decoding variant in which `RateLimitDescriptor.Entry.key/value` are `bytes`. The wire
//!   encoding of `string` and `bytes` is identical, but prost rejects a `string` that is not
//!   UTF-8 and fails the whole RPC; Envoy may send raw header bytes, so we decode them as bytes.
//!   This one also holds the xDS client's protos (ADS, `RateLimitConfig`), compiled into code
//!   (client, and a server for the tests' control plane) but never offered by reflection.

use std::{env, error::Error, fs, path::PathBuf};

use prost::Message;
use prost_types::field_descriptor_proto::Type;

const PROTOS: &[&str] = &["envoy/service/ratelimit/v3/rls.proto"];
/// The xDS client's protos (ADS and the pushed `RateLimitConfig`): compiled into code, but
/// not served by reflection, since floodgate serves no such service.
const XDS_PROTOS: &[&str] = &[
    "envoy/service/discovery/v3/ads.proto",
    "ratelimit/config/ratelimit/v3/rls_conf.proto",
];
const ENTRY_FILE: &str = "envoy/extensions/common/ratelimit/v3/ratelimit.proto";

fn main() -> Result<(), Box<dyn Error>> {
    println!("cargo:rerun-if-changed=proto");
    let out_dir = PathBuf::from(env::var("OUT_DIR")?);

    let canonical = protox::Compiler::new(["proto"])?
        .include_imports(true)
        .include_source_info(false)
        .open_files(PROTOS)?
        .file_descriptor_set();
    fs::write(
        out_dir.join("floodgate_descriptor.bin"),
        canonical.encode_to_vec(),
    )?;

    let mut decoding = protox::Compiler::new(["proto"])?
        .include_imports(true)
        .include_source_info(false)
        .open_files(PROTOS.iter().chain(XDS_PROTOS))?
        .file_descriptor_set();
    let entry = decoding
        .file
        .iter_mut()
        .find(|f| f.name() == ENTRY_FILE)
        .and_then(|f| {
            f.message_type
                .iter_mut()
                .find(|m| m.name() == "RateLimitDescriptor")
        })
        .and_then(|m| m.nested_type.iter_mut().find(|m| m.name() == "Entry"))
        .ok_or("RateLimitDescriptor.Entry not found in proto/")?;
    for field in &mut entry.field {
        field.set_type(Type::Bytes);
    }

    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .include_file("floodgate_proto.rs")
        // Undecodable requests are INVALID_ARGUMENT (prost's codec says INTERNAL).
        .codec_path("crate::admission::RequestCodec")
        .compile_fds(decoding)?;
    Ok(())
}
