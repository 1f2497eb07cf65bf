use super::*;
use crate::proto::common::RateLimitDescriptor;
use crate::proto::common::rate_limit_descriptor::{Entry, RateLimitOverride};

/// The reference's dynamic metadata: domain, each descriptor's entries, its override and
/// its own hits_addend when present, the request's hits_addend, and admitted metadata.
#[test]
fn metadata_has_the_reference_shape() {
    let request = RateLimitRequest {
        domain: "d".into(),
        descriptors: vec![
            RateLimitDescriptor {
                entries: vec![Entry {
                    key: b"k".to_vec().into(),
                    value: b"v".to_vec().into(),
                }],
                limit: Some(RateLimitOverride {
                    requests_per_unit: 10,
                    unit: 1,
                }),
                hits_addend: Some(2),
                ..Default::default()
            },
            RateLimitDescriptor::default(),
        ],
        hits_addend: 3,
    };
    let mut admitted = BTreeMap::new();
    admitted.insert(
        "name".to_string(),
        Value {
            kind: Some(Kind::StringValue("svc".into())),
        },
    );
    let s = RequestSummary::of(&request).to_struct(admitted);
    let text = format!("{s:?}");
    for part in [
        "\"k=v\"",
        "requests_per_unit:10 unit:SECOND",
        "NumberValue(2.0)",
        "NumberValue(3.0)",
        "\"svc\"",
    ] {
        assert!(text.contains(part), "{part}: {text}");
    }
    assert_eq!(
        s.fields.keys().collect::<Vec<_>>(),
        ["descriptors", "domain", "hitsAddend", "metadata"]
    );
    let empty = RequestSummary::of(&RateLimitRequest::default()).to_struct(BTreeMap::new());
    assert_eq!(
        empty.fields.keys().collect::<Vec<_>>(),
        ["descriptors", "domain"]
    );
}
