use super::*;

/// Both spellings of each protocol parse, in any case; others do not.
#[test]
fn protocols_parse() {
    assert_eq!(OtlpProtocol::parse("GRPC"), Some(OtlpProtocol::Grpc));
    assert_eq!(
        OtlpProtocol::parse("http"),
        Some(OtlpProtocol::HttpProtobuf)
    );
    assert_eq!(
        OtlpProtocol::parse("http/protobuf"),
        Some(OtlpProtocol::HttpProtobuf)
    );
    assert_eq!(OtlpProtocol::parse("http/json"), None);
}

/// Rates outside 0..=1 and non-numbers are refused.
#[test]
fn rates_are_bounded() {
    assert_eq!(parse_rate("0.25"), Ok(0.25));
    assert_eq!(parse_rate("1"), Ok(1.0));
    assert!(parse_rate("1.5").is_err());
    assert!(parse_rate("-0.1").is_err());
    assert!(parse_rate("NaN").is_err());
}
