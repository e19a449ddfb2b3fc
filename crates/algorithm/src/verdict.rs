//! Turns a program reply into a contract outcome. Shared by every backend so that the same
//! status always means the same thing.

use std::time::Duration;

use super::{ProgramReply, Status};
use edgelimit_contract::{
    Algorithm, Certainty, DecisionSource, IncompatibleCause, RateLimitDecision, RateLimitOutcome,
    RateLimitPolicy, UnavailableCause,
};

pub fn outcome_from_reply(
    reply: &ProgramReply,
    policy: &RateLimitPolicy,
    source: DecisionSource,
    unavailable_retry_after: Duration,
) -> RateLimitOutcome {
    let allowed = match reply.status {
        Status::Allowed => true,
        Status::Denied => false,
        Status::ClockUnsafe => {
            return RateLimitOutcome::Unavailable {
                policy_id: policy.id().clone(),
                retry_after: unavailable_retry_after,
                cause: UnavailableCause::ClockUnsafe,
            }
        }
        Status::Expired => {
            return RateLimitOutcome::Unavailable {
                policy_id: policy.id().clone(),
                retry_after: unavailable_retry_after,
                cause: UnavailableCause::ExpiredInQueue,
            }
        }
        Status::StateIncompatible => {
            return RateLimitOutcome::Incompatible {
                policy_id: policy.id().clone(),
                cause: IncompatibleCause::StateIncompatible,
            }
        }
        Status::Invalid => {
            return RateLimitOutcome::Incompatible {
                policy_id: policy.id().clone(),
                cause: IncompatibleCause::InvalidArguments,
            }
        }
    };
    let certainty = match policy.algorithm() {
        Algorithm::SlidingWindow => Certainty::ApproximateAlgorithm,
        Algorithm::FixedWindow | Algorithm::TokenBucket => Certainty::Certain,
    };
    RateLimitOutcome::Evaluated(RateLimitDecision {
        allowed,
        limit: reply.limit,
        remaining: reply.remaining,
        retry_after: Duration::from_millis(reply.retry_after_ms),
        reset_at_ms: reply.reset_at_ms,
        decided_at_ms: reply.effective_now_ms,
        policy_id: policy.id().clone(),
        policy_revision: policy.revision(),
        source,
        certainty,
    })
}
