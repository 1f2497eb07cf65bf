use super::*;

/// The fixed limits load, and requests on every rule go through the checked path.
#[test]
fn request_limits_load_and_answer() {
    assert!(LIMITS.domain("edge").is_some());
    let entry = |k: &str, v: &str| crate::proto::common::rate_limit_descriptor::Entry {
        key: k.as_bytes().to_vec().into(),
        value: v.as_bytes().to_vec().into(),
    };
    let request = RateLimitRequest {
        domain: "edge".into(),
        descriptors: [
            vec![entry("remote_address", "192.0.2.10")],
            vec![entry("path", "/api/v1"), entry("method", "GET")],
            vec![entry("tenant", "t-1")],
            vec![entry("tokens", "x")],
        ]
        .into_iter()
        .map(|entries| crate::proto::common::RateLimitDescriptor {
            entries,
            hits_addend: Some(3),
            ..Default::default()
        })
        .collect(),
        hits_addend: 0,
    };
    let responses = answer(&request);
    assert_eq!(responses.len(), 2);
    // 3 hits against the fixed window of 2 per day: the quota-mode tenant is over.
    assert_eq!(responses[1].overall_code, Code::OverLimit as i32);
    super::request(&request.encode_to_vec());
}

/// Every request seed is valid and says in protobuf what its JSON twin says (the pair is
/// written by `fuzz/seeds/requests.py`): the `/json` conversion agrees with decoding.
#[test]
fn request_seeds_match_their_json_twins() {
    let seeds = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds");
    let mut checked = 0;
    for entry in std::fs::read_dir(seeds.join("request")).unwrap() {
        let path = entry.unwrap().path();
        let decoded = RateLimitRequest::decode(&*std::fs::read(&path).unwrap()).unwrap();
        let twin = seeds
            .join("json")
            .join(path.with_extension("json").file_name().unwrap());
        let body = std::fs::read(&twin).unwrap();
        let parsed = crate::http::parse_json_request(&body).unwrap();
        assert_eq!(decoded, parsed, "{}", path.display());
        assert_eq!(answer(&decoded).len(), 2, "{} is rejected", path.display());
        checked += 1;
    }
    assert!(checked >= 10, "only {checked} request seeds");
}

/// Every committed seed of the byte-input targets (`fuzz/seeds/{config,request,json}`)
/// replays through its entry point in the ordinary test build, so a change that breaks
/// one fails `cargo test` without a fuzz build; the `bucket_key` seeds are `arbitrary`
/// structures, replayed by the fuzz run alone.
#[test]
fn every_seed_replays() {
    let seeds = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds");
    let targets = [
        ("config", config as fn(&[u8])),
        ("request", request),
        ("json", json),
    ];
    for (target, entry) in targets {
        let mut replayed = 0;
        for file in std::fs::read_dir(seeds.join(target)).unwrap() {
            let path = file.unwrap().path();
            entry(&std::fs::read(&path).unwrap());
            replayed += 1;
        }
        assert!(replayed >= 5, "only {replayed} {target} seeds");
    }
}

/// The JSON target answers a valid body.
#[test]
fn json_body_is_answered() {
    json(br#"{"domain":"edge","descriptors":[{"entries":[{"key":"user","value":"u"}]}]}"#);
}

/// Long, escaped, shared and empty components all decode back to what was encoded.
#[test]
fn bucket_keys_decode_back() {
    let long = vec![0xffu8; MAX_COMPONENT];
    bucket_key(
        "d{x}",
        &[
            (b"k:=".to_vec(), FuzzValue::Value(b"{tag}|\xff*".to_vec())),
            (b"path".to_vec(), FuzzValue::Shared("/api/*".into())),
            (Vec::new(), FuzzValue::Value(Vec::new())),
            (long.clone(), FuzzValue::Value(long)),
        ],
        1,
        3_600_000_000,
        Some(7),
    );
    bucket_key("", &[], 0, 0, None);
}

/// A config split in files with a NUL byte: the second file's duplicate domain is an error,
/// and garbage is one.
#[test]
fn config_inputs_are_checked() {
    config(b"domain: a\n\0domain: a\n");
    config(b"\xff: [");
    config(REQUEST_LIMITS.as_bytes());
}
