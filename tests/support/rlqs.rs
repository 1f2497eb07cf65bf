//! An RLQS client as Envoy's: one stream, its reports and the assignments it is sent, with
//! the helpers that read them.

use std::time::Duration;

use floodgate::proto::rlqs::rate_limit_quota_response::bucket_action::BucketAction as Action;
use floodgate::proto::rlqs::rate_limit_quota_response::bucket_action::QuotaAssignmentAction;
use floodgate::proto::rlqs::rate_limit_quota_service_client::RateLimitQuotaServiceClient;
use floodgate::proto::rlqs::rate_limit_quota_usage_reports::BucketQuotaUsage;
use floodgate::proto::rlqs::{BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports};
use floodgate::proto::types::TokenBucket;
use floodgate::proto::types::rate_limit_strategy::{BlanketRule, Strategy};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Streaming;
use tonic::transport::Channel;

use super::process::Floodgate;

/// How long a test waits for one message before failing.
pub const MESSAGE_DEADLINE: Duration = super::EVENTUALLY;

/// One Envoy's RLQS stream.
pub struct Envoy {
    pub reports: mpsc::Sender<RateLimitQuotaUsageReports>,
    pub responses: Streaming<RateLimitQuotaResponse>,
}

/// One report: the bucket's entries, requests allowed, requests denied, seconds elapsed.
pub type Usage<'a> = (&'a [(&'a str, &'a str)], u64, u64, i64);

pub fn bucket(entries: &[(&str, &str)]) -> BucketId {
    BucketId {
        bucket: entries
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    }
}

pub fn reports(domain: &str, usages: &[Usage<'_>]) -> RateLimitQuotaUsageReports {
    RateLimitQuotaUsageReports {
        domain: domain.to_owned(),
        bucket_quota_usages: usages
            .iter()
            .map(|(entries, allowed, denied, elapsed)| BucketQuotaUsage {
                bucket_id: Some(bucket(entries)),
                time_elapsed: Some(prost_types::Duration {
                    seconds: *elapsed,
                    nanos: 0,
                }),
                num_requests_allowed: *allowed,
                num_requests_denied: *denied,
            })
            .collect(),
    }
}

impl Envoy {
    /// Opens a stream to `server` on a connection of its own; an error status if it is
    /// refused.
    pub async fn open(server: &Floodgate) -> Result<Envoy, tonic::Status> {
        let mut client = RateLimitQuotaServiceClient::connect(format!("http://{}", server.grpc))
            .await
            .unwrap();
        Envoy::open_on(&mut client).await
    }

    /// Opens a stream on `client`'s connection; an error status if it is refused.
    pub async fn open_on(
        client: &mut RateLimitQuotaServiceClient<Channel>,
    ) -> Result<Envoy, tonic::Status> {
        let (reports, outbound) = mpsc::channel(16);
        let responses = client
            .stream_rate_limit_quotas(ReceiverStream::new(outbound))
            .await?
            .into_inner();
        Ok(Envoy { reports, responses })
    }

    /// Sends one message as is.
    pub async fn send(&self, message: RateLimitQuotaUsageReports) {
        self.reports.send(message).await.unwrap();
    }

    /// The next message, or the status that ended the stream (`Ok(None)`: ended cleanly).
    pub async fn next(&mut self) -> Result<Option<RateLimitQuotaResponse>, tonic::Status> {
        tokio::time::timeout(MESSAGE_DEADLINE, self.responses.message())
            .await
            .expect("no message from the server in time")
    }

    /// Reports `usages` in `domain` and returns the answer.
    pub async fn report(&mut self, domain: &str, usages: &[Usage<'_>]) -> RateLimitQuotaResponse {
        self.send(reports(domain, usages)).await;
        self.next().await.unwrap().expect("stream ended")
    }

    /// The status that ends the stream after `message`.
    pub async fn refused(&mut self, message: RateLimitQuotaUsageReports) -> tonic::Status {
        self.send(message).await;
        loop {
            match self.next().await {
                Ok(Some(_)) => continue,
                Ok(None) => panic!("stream ended without an error"),
                Err(status) => return status,
            }
        }
    }
}

/// The assignment of the only action of `response`.
pub fn assignment(response: &RateLimitQuotaResponse) -> &QuotaAssignmentAction {
    assert_eq!(response.bucket_action.len(), 1, "{response:?}");
    match &response.bucket_action[0].bucket_action {
        Some(Action::QuotaAssignmentAction(assignment)) => assignment,
        other => panic!("not an assignment: {other:?}"),
    }
}

pub fn token_bucket(assignment: &QuotaAssignmentAction) -> Option<&TokenBucket> {
    match assignment.rate_limit_strategy.as_ref()?.strategy.as_ref()? {
        Strategy::TokenBucket(bucket) => Some(bucket),
        Strategy::BlanketRule(_) | Strategy::RequestsPerTimeUnit(_) => None,
    }
}

pub fn blanket(assignment: &QuotaAssignmentAction) -> Option<BlanketRule> {
    match assignment.rate_limit_strategy.as_ref()?.strategy.as_ref()? {
        Strategy::BlanketRule(rule) => BlanketRule::try_from(*rule).ok(),
        _ => None,
    }
}

/// The fill rate a single-action response grants (tokens per fill; 0 when denied).
pub fn granted(response: &RateLimitQuotaResponse) -> u64 {
    let assignment = assignment(response);
    match token_bucket(assignment) {
        Some(bucket) => u64::from(bucket.tokens_per_fill.unwrap_or(1)),
        None => {
            assert_eq!(
                blanket(assignment),
                Some(BlanketRule::DenyAll),
                "{response:?}"
            );
            0
        }
    }
}

pub fn ttl_secs(assignment: &QuotaAssignmentAction) -> f64 {
    let ttl = assignment.assignment_time_to_live.unwrap();
    ttl.seconds as f64 + f64::from(ttl.nanos) / 1e9
}
