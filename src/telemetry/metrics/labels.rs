//! The label sets of floodgate's metrics, and the enums whose variants are label values.

use std::fmt;
use std::sync::Arc;

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};

/// Shared strings from the configuration: building the labels of a request's tally copies
/// no bytes (a label set is needed to look a series up, not only to create it).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct RuleLabels {
    pub(super) domain: LabelText,
    pub(super) rule: LabelText,
}

/// A label value that may hold request bytes (`detailed_metric`, `value_to_metric`),
/// escaped as the Prometheus and OpenMetrics text formats require: a raw `"` or newline
/// would end the value early and make the whole exposition unparseable (or forge series).
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub(super) struct LabelText(pub(super) Arc<str>);

impl EncodeLabelValue for LabelText {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), fmt::Error> {
        use fmt::Write as _;
        let text: &str = &self.0;
        let mut rest = text;
        while let Some(at) = rest.find(['\\', '"', '\n']) {
            encoder.write_str(&rest[..at])?;
            encoder.write_str(match rest.as_bytes()[at] {
                b'\\' => "\\\\",
                b'"' => "\\\"",
                _ => "\\n",
            })?;
            rest = &rest[at + 1..];
        }
        encoder.write_str(rest)
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct ResultLabels {
    pub(super) result: &'static str,
}

/// A configured domain (or [`UNKNOWN_DOMAIN`]) and how its request ended.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct DomainLabels {
    pub(super) domain: LabelText,
    pub(super) result: &'static str,
}

/// How a ShouldRateLimit call ended, for `floodgate_requests_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RequestResult {
    /// Answered OK.
    Ok,
    /// Answered OVER_LIMIT.
    OverLimit,
    /// Rejected as malformed.
    Invalid,
    /// The store failed.
    StoreError,
    /// Refused at once: `--max-in-flight` requests were already being answered.
    Overloaded,
}

impl RequestResult {
    /// Every result, in the order of [`RequestResult::index`].
    pub(super) const ALL: [RequestResult; 5] = [
        RequestResult::Ok,
        RequestResult::OverLimit,
        RequestResult::Invalid,
        RequestResult::StoreError,
        RequestResult::Overloaded,
    ];

    /// The result's place in [`RequestResult::ALL`].
    pub(super) fn index(self) -> usize {
        self as usize
    }

    /// The `result` label value (also a trace span's `ratelimit.result`).
    pub fn label(self) -> &'static str {
        match self {
            RequestResult::Ok => "ok",
            RequestResult::OverLimit => "over_limit",
            RequestResult::Invalid => "invalid",
            RequestResult::StoreError => "store_error",
            RequestResult::Overloaded => "overloaded",
        }
    }
}

/// How the wait of a request held by a `max_wait` limit ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShapedEnd {
    /// Its tokens arrived; it was answered OK.
    Served,
    /// Shutdown cuts the connections off before its turn: its tokens were given back and it
    /// was refused (OVER_LIMIT), never admitted early.
    Refused,
    /// The client went away (cancelled, timed out); its tokens were given back.
    Cancelled,
}

impl ShapedEnd {
    /// The `result` label value.
    pub fn label(self) -> &'static str {
        match self {
            ShapedEnd::Served => "served",
            ShapedEnd::Refused => "refused",
            ShapedEnd::Cancelled => "cancelled",
        }
    }
}

/// The label set of `result`.
pub(super) fn result_labels(result: RequestResult) -> ResultLabels {
    ResultLabels {
        result: result.label(),
    }
}
