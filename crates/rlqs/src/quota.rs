//! Reported usage into the backend, through the same port `ShouldRateLimit` uses: what an
//! instance admitted is consumed against the limit's counter (so both APIs and every
//! instance share one count), and the decision says what is left.
//!
//! Envoy has already admitted those requests: when they exceed what is left, what is left
//! is consumed (the counter reads exhausted, so every instance is told `deny_all`) and the
//! excess is counted as overshoot. Reports are consumed under the policy with `max_cost`
//! raised (see `bucket`); a cost still above it is consumed in at most [`MAX_CHUNKS`] calls.

use std::time::Instant;

use edgelimit_contract::{
    Cost, RateLimitDecision, RateLimitOutcome, RateLimitPolicy, RateLimitPort, RateLimitRequest,
    SubjectDigest,
};

/// Backend calls one report of one limit may take.
pub(crate) const MAX_CHUNKS: usize = 4;

/// What consuming a report gave: the decision after it, and the admitted requests the
/// quota did not cover.
#[derive(Debug, Clone)]
pub(crate) struct Consumed {
    pub decision: RateLimitDecision,
    pub overshoot: u64,
}

/// Consumes `allowed` units (or peeks when there are none). `None` when the backend could
/// not decide: the caller fails closed.
pub(crate) async fn consume<B: RateLimitPort>(
    backend: &B,
    policy: &RateLimitPolicy,
    subject: SubjectDigest,
    allowed: u64,
    deadline: Instant,
) -> Option<Consumed> {
    if allowed == 0 {
        let decision = ask(backend, policy, subject, Cost::Peek, deadline).await?;
        return Some(Consumed {
            decision,
            overshoot: 0,
        });
    }
    let mut left = allowed;
    let mut last = None;
    for _ in 0..MAX_CHUNKS {
        if left == 0 {
            break;
        }
        let chunk = left.min(policy.max_cost());
        let decision = ask(
            backend,
            policy,
            subject,
            Cost::consume(chunk).ok()?,
            deadline,
        )
        .await?;
        if decision.allowed {
            left -= chunk;
            last = Some(decision);
            continue;
        }
        // Over what is left: take what is left, the rest is overshoot.
        let rest = decision.remaining.min(chunk);
        let decision = if rest > 0 {
            let taken = ask(
                backend,
                policy,
                subject,
                Cost::consume(rest).ok()?,
                deadline,
            )
            .await?;
            if taken.allowed {
                left -= rest;
            }
            taken
        } else {
            decision
        };
        return Some(Consumed {
            decision,
            overshoot: left,
        });
    }
    // Chunks exhausted with usage left: count it as overshoot rather than loop on.
    Some(Consumed {
        decision: last?,
        overshoot: left,
    })
}

async fn ask<B: RateLimitPort>(
    backend: &B,
    policy: &RateLimitPolicy,
    subject: SubjectDigest,
    cost: Cost,
    deadline: Instant,
) -> Option<RateLimitDecision> {
    let request = RateLimitRequest::new(policy, subject, cost, None, deadline).ok()?;
    match backend.evaluate(policy, &request).await {
        RateLimitOutcome::Evaluated(decision) => Some(decision),
        other => {
            tracing::debug!(
                policy = %policy.id(),
                category = other.category(),
                cause = other.cause(),
                "RLQS usage not decided; failing closed"
            );
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use edgelimit_contract::{AlgorithmParams, PolicyId};
    use edgelimit_memory::{MemoryBackend, MemoryConfig};
    use std::time::Duration;

    fn policy(limit: u64, max_cost: u64) -> RateLimitPolicy {
        RateLimitPolicy::new(
            PolicyId::new("p").unwrap(),
            1,
            AlgorithmParams::FixedWindow {
                limit,
                window_ms: 3_600_000,
            },
            max_cost,
            0,
            1000,
        )
        .unwrap()
    }

    fn later() -> Instant {
        Instant::now() + Duration::from_secs(1)
    }

    #[tokio::test]
    async fn usage_is_consumed_and_the_excess_is_overshoot() {
        let backend = MemoryBackend::new(MemoryConfig::default());
        let p = policy(100, 1000);
        let s = SubjectDigest::from_bytes([3; 32]);
        let peek = consume(&backend, &p, s, 0, later()).await.unwrap();
        assert_eq!((peek.decision.remaining, peek.overshoot), (100, 0));
        let some = consume(&backend, &p, s, 60, later()).await.unwrap();
        assert_eq!((some.decision.remaining, some.overshoot), (40, 0));
        // 50 admitted with 40 left: the 40 are taken, 10 are overshoot.
        let over = consume(&backend, &p, s, 50, later()).await.unwrap();
        assert_eq!((over.decision.remaining, over.overshoot), (0, 10));
        let after = consume(&backend, &p, s, 5, later()).await.unwrap();
        assert_eq!((after.decision.remaining, after.overshoot), (0, 5));
    }

    #[tokio::test]
    async fn reports_above_max_cost_are_consumed_in_chunks() {
        let backend = MemoryBackend::new(MemoryConfig::default());
        let p = policy(1000, 10);
        let s = SubjectDigest::from_bytes([4; 32]);
        let c = consume(&backend, &p, s, 35, later()).await.unwrap();
        assert_eq!((c.decision.remaining, c.overshoot), (965, 0));
        // Beyond MAX_CHUNKS calls the rest is counted, not consumed.
        let c = consume(&backend, &p, s, 100, later()).await.unwrap();
        assert_eq!((c.decision.remaining, c.overshoot), (925, 60));
    }
}
