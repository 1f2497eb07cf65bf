//! Scenarios that more than one test file runs, each against its own server: the in-process
//! server of `tests/rls.rs` (memory and Redis stores) and the real binary in the reference's
//! environment of `tests/reference_env.rs`. A scenario takes anything that answers
//! ShouldRateLimit ([`Ask`]) and the domain its limits are in.

use floodgate::proto::rls::rate_limit_response::{Code, DescriptorStatus};
use floodgate::proto::rls::{RateLimitRequest, RateLimitResponse};

use super::{TestServer, descriptor, request, simple};

/// Something that answers ShouldRateLimit.
pub trait Ask {
    /// The answer to `request` (a transport error fails the test).
    async fn ask(&mut self, request: RateLimitRequest) -> RateLimitResponse;
}

impl Ask for &TestServer {
    async fn ask(&mut self, request: RateLimitRequest) -> RateLimitResponse {
        TestServer::ask(self, request).await
    }
}

/// `replaces`: in `domain`, `plan: premium` replaces `plan: basic` (1 per period). Matched in
/// the same request, premium alone applies (`rounds` times, more than basic allows): basic's
/// status is a plain OK without a limit and nothing is taken from it; alone, basic applies
/// and its single hit is left.
pub async fn replaced_limit_is_dropped(server: &mut impl Ask, domain: &str, rounds: usize) {
    let both = || {
        request(
            domain,
            vec![
                descriptor(&[("plan", "basic")]),
                descriptor(&[("plan", "premium")]),
            ],
        )
    };
    for _ in 0..rounds {
        let response = server.ask(both()).await;
        assert_eq!(response.overall_code, Code::Ok as i32);
        assert_eq!(
            response.statuses[0],
            DescriptorStatus {
                code: Code::Ok as i32,
                ..Default::default()
            }
        );
        assert_eq!(
            response.statuses[1].current_limit.as_ref().unwrap().name,
            "premium"
        );
    }
    // Alone, basic applies: its one hit (none left), then over.
    let basic = || simple(domain, "plan", "basic");
    let first = server.ask(basic()).await;
    assert_eq!(first.overall_code, Code::Ok as i32);
    assert_eq!(first.statuses[0].limit_remaining, 0);
    assert_eq!(
        server.ask(basic()).await.overall_code,
        Code::OverLimit as i32
    );
}
