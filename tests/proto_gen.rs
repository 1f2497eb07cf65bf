//! The protobuf code committed in `proto/gen/` (copied into place by `build.rs`) is what
//! `proto/` compiles to: this test compiles `proto/` with protox (a pure-Rust protobuf
//! compiler, so no system `protoc`) and tonic's code generator, and compares.
//!
//! After changing anything under `proto/`, regenerate the committed copy with
//! `FLOODGATE_WRITE_PROTO_GEN=1 cargo test --test proto_gen` and commit `proto/gen/`.

use std::{
    collections::{BTreeMap, BTreeSet},
    error::Error,
    fs,
    path::Path,
};

use prost::Message;
use prost_types::field_descriptor_proto::Type;

const PROTOS: &[&str] = &[
    "envoy/service/ratelimit/v3/rls.proto",
    "envoy/service/rate_limit_quota/v3/rlqs.proto",
];
/// The xDS client's protos (ADS and the pushed `RateLimitConfig`): compiled into code, but
/// not served by reflection, since floodgate serves no such service.
const XDS_PROTOS: &[&str] = &[
    "envoy/service/discovery/v3/ads.proto",
    "ratelimit/config/ratelimit/v3/rls_conf.proto",
];
const ENTRY_FILE: &str = "envoy/extensions/common/ratelimit/v3/ratelimit.proto";
const GENERATED: &str = "proto/gen";

/// Compiles `proto/` into `out`: the canonical descriptor set for reflection, and the Rust
/// code of the decoding variant (entries' key and value as `bytes`; see `build.rs`).
fn generate(out: &Path) -> Result<(), Box<dyn Error>> {
    let canonical = protox::Compiler::new(["proto"])?
        .include_imports(true)
        .include_source_info(false)
        .open_files(PROTOS)?
        .file_descriptor_set();
    fs::write(
        out.join("floodgate_descriptor.bin"),
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
        .out_dir(out)
        .include_file("floodgate_proto.rs")
        // Undecodable requests are INVALID_ARGUMENT (prost's codec says INTERNAL).
        .codec_path("crate::admission::RequestCodec")
        // Entries as `Bytes`: decoded as slices of the request's buffer (one reference
        // count each) instead of two heap copies per entry.
        .bytes(".envoy.extensions.common.ratelimit.v3.RateLimitDescriptor.Entry")
        .compile_fds(decoding)?;
    Ok(())
}

/// Every file of `dir`, by name.
fn files(dir: &Path) -> std::io::Result<BTreeMap<String, Vec<u8>>> {
    let mut files = BTreeMap::new();
    for entry in fs::read_dir(dir)? {
        let path = entry?.path();
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        files.insert(name.into_owned(), fs::read(&path)?);
    }
    Ok(files)
}

/// `proto/gen/` holds exactly the files that compiling `proto/` gives, byte for byte.
#[test]
fn committed_generated_code_is_what_proto_compiles_to() {
    let fresh = tempfile::tempdir().unwrap();
    generate(fresh.path()).unwrap();
    let fresh = files(fresh.path()).unwrap();
    if std::env::var_os("FLOODGATE_WRITE_PROTO_GEN").is_some() {
        let _ = fs::remove_dir_all(GENERATED);
        fs::create_dir_all(GENERATED).unwrap();
        for (name, bytes) in &fresh {
            fs::write(Path::new(GENERATED).join(name), bytes).unwrap();
        }
    }
    let committed = files(Path::new(GENERATED)).unwrap();
    let stale: BTreeSet<&String> = fresh
        .keys()
        .chain(committed.keys())
        .filter(|name| fresh.get(*name) != committed.get(*name))
        .collect();
    assert!(
        stale.is_empty(),
        "proto/gen/ is stale ({stale:?} differ from what proto/ compiles to): run \
         `FLOODGATE_WRITE_PROTO_GEN=1 cargo test --test proto_gen` and commit proto/gen/"
    );
}
