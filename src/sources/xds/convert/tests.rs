use super::*;
use crate::config::{Config, Defaults};

fn policy(unit: RateLimitUnit, rpu: u32) -> Option<RateLimitPolicy> {
    Some(RateLimitPolicy {
        unit: unit as i32,
        requests_per_unit: rpu,
        ..Default::default()
    })
}

/// A pushed configuration loads into the same limits as the equivalent file.
#[test]
fn pushed_config_loads_like_its_file() {
    let pushed = RateLimitConfig {
        name: "edge-config".into(),
        domain: "edge".into(),
        descriptors: vec![RateLimitDescriptor {
            key: "k".into(),
            value: "v".into(),
            rate_limit: policy(RateLimitUnit::Minute, 3),
            shadow_mode: true,
            descriptors: vec![RateLimitDescriptor {
                key: "inner".into(),
                rate_limit: Some(RateLimitPolicy {
                    unlimited: true,
                    ..Default::default()
                }),
                ..Default::default()
            }],
            ..Default::default()
        }],
    };
    let source = to_source(&pushed);
    assert_eq!(source.0, "xds:edge-config");
    let from_push = Config::compile(&[source], &Defaults::default(), false).unwrap();
    let file = "domain: edge\ndescriptors:\n  - key: k\n    value: v\n    shadow_mode: true\n    \
                rate_limit: {unit: minute, requests_per_unit: 3}\n    descriptors:\n      \
                - key: inner\n        rate_limit: {unlimited: true}\n";
    let from_file =
        Config::compile(&[("f".into(), file.into())], &Defaults::default(), false).unwrap();
    assert_eq!(from_push.describe(), from_file.describe());
}

/// A bad push fails with the loader's own error, naming the resource and the path in it.
#[test]
fn bad_push_fails_with_the_loaders_error() {
    let pushed = RateLimitConfig {
        name: "bad".into(),
        domain: "edge".into(),
        descriptors: vec![RateLimitDescriptor {
            key: "k".into(),
            rate_limit: policy(RateLimitUnit::Unknown, 3),
            ..Default::default()
        }],
    };
    let errors = Config::compile(&[to_source(&pushed)], &Defaults::default(), false)
        .unwrap_err()
        .to_string();
    assert!(
        errors.starts_with("xds:bad: descriptors[0].rate_limit"),
        "{errors}"
    );
}
