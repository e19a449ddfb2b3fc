//! Properties of the Rust algorithms (pure, no Redis): the retry point is exact (never too
//! early, and for admissible costs not later than needed), `resetAt` is when the full quota is
//! back, state past its TTL behaves exactly like an absent key, and token refill does not
//! depend on how often the bucket is evaluated.

use edgelimit::algorithm::{
    evaluate, sliding_window::MAX_SCALED, State, Status, Stored, MAX, MAX_PERIOD_MS,
};
use edgelimit::contract::{AlgorithmParams, PolicyId, RateLimitPolicy};
use proptest::prelude::*;

const NOW: u64 = 1_796_000_000_000;

fn policy(params: AlgorithmParams, grace: u64) -> RateLimitPolicy {
    RateLimitPolicy::new(PolicyId::new("prop").unwrap(), 9, params, MAX, grace, 0).unwrap()
}

fn period(max: u64) -> impl Strategy<Value = u64> {
    prop_oneof![1u64..=10, 1u64..=100_000, 1..=max]
}

fn amount(max: u64) -> impl Strategy<Value = u64> {
    prop_oneof![0u64..=10, 0u64..=1_000_000, 0..=max]
}

fn params() -> impl Strategy<Value = AlgorithmParams> {
    prop_oneof![
        (period(MAX_PERIOD_MS), amount(MAX))
            .prop_map(|(window_ms, limit)| AlgorithmParams::FixedWindow { limit, window_ms }),
        (period(MAX_SCALED), amount(MAX_SCALED))
            .prop_map(|(window_ms, limit)| AlgorithmParams::SlidingWindow { limit, window_ms }),
        period(MAX_PERIOD_MS).prop_flat_map(|p| {
            let bound = MAX / p;
            (
                prop_oneof![1u64..=5, 1..bound],
                prop_oneof![0u64..=10, 0..=bound],
            )
                .prop_map(move |(refill_tokens, capacity)| {
                    AlgorithmParams::TokenBucket {
                        capacity,
                        refill_tokens,
                        refill_period_ms: p,
                    }
                })
        }),
    ]
}

/// Builds some reachable state by running a few requests from an absent key.
fn history(policy: &RateLimitPolicy, costs: &[(u64, u64)]) -> (Option<State>, u64) {
    let mut state = None;
    let mut now = NOW;
    for &(gap, raw) in costs {
        now += gap;
        let cost = raw % (policy.params().limit() + 2);
        let e = evaluate(policy, state.as_ref().into(), now, cost);
        if let Some(w) = e.write {
            state = Some(w.state);
        }
    }
    (state, now)
}

fn gaps() -> impl Strategy<Value = Vec<(u64, u64)>> {
    prop::collection::vec((prop_oneof![0u64..=5, 0u64..=100_000], any::<u64>()), 0..8)
}

fn cost_for(raw: u64, limit: u64) -> u64 {
    match raw % 4 {
        0 => 0,
        1 => 1,
        2 => raw % (limit + 1),
        _ => limit.saturating_add(1 + raw % 3).min(MAX),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 3_000, max_global_rejects: 100_000, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn retry_point_is_exact(params in params(), h in gaps(), raw in any::<u64>(), gap in 0u64..50) {
        let policy = policy(params, 0);
        let limit = params.limit();
        let (state, last) = history(&policy, &h);
        let cost = cost_for(raw, limit);
        let e = evaluate(&policy, state.as_ref().into(), last + gap, cost);
        prop_assume!(e.reply.status == Status::Denied);
        let now = e.reply.effective_now_ms;
        let retry = e.reply.retry_after_ms;
        prop_assert!(retry > 0);
        let after = e.write.map(|w| w.state).or(state);
        let at = |t: u64| evaluate(&policy, after.as_ref().into(), t, cost).reply.status;
        prop_assert_eq!(at(now + retry - 1), Status::Denied, "never too early");
        // a peek asks about one unit
        if cost.max(1) <= limit {
            prop_assert_eq!(at(now + retry), Status::Allowed, "admitted at the retry point");
        } else {
            // Bounded: at most two windows, or a full bucket / one period.
            let bound = match params {
                AlgorithmParams::FixedWindow { window_ms, .. } => window_ms,
                AlgorithmParams::SlidingWindow { window_ms, .. } => 2 * window_ms,
                AlgorithmParams::TokenBucket { capacity, refill_period_ms, refill_tokens } =>
                    (capacity * refill_period_ms).div_ceil(refill_tokens).max(refill_period_ms),
            };
            prop_assert!(retry <= bound);
        }
    }

    #[test]
    fn reset_at_is_when_the_full_quota_is_back(params in params(), h in gaps(), raw in any::<u64>()) {
        let policy = policy(params, 0);
        let limit = params.limit();
        let (state, last) = history(&policy, &h);
        let cost = cost_for(raw, limit);
        let e = evaluate(&policy, state.as_ref().into(), last + 1, cost);
        prop_assert!(matches!(e.reply.status, Status::Allowed | Status::Denied));
        let reset = e.reply.reset_at_ms;
        prop_assume!(reset < MAX);
        let after = e.write.map(|w| w.state).or(state);
        let peek = |t: u64| evaluate(&policy, after.as_ref().into(), t, 0).reply;
        prop_assert_eq!(peek(reset).remaining, limit);
        let now = e.reply.effective_now_ms;
        if reset > now && !matches!(params, AlgorithmParams::FixedWindow { .. }) {
            prop_assert!(peek(reset - 1).remaining < limit, "not earlier");
        }
    }

    #[test]
    fn state_past_its_ttl_is_an_absent_key(params in params(), h in gaps(), grace in 0u64..1_000, later in 0u64..10_000) {
        let policy = policy(params, grace);
        let (state, last) = history(&policy, &h);
        let e = evaluate(&policy, state.as_ref().into(), last + 1, 1);
        let Some(w) = e.write else { return Ok(()) };
        let free_at = e.reply.effective_now_ms + w.ttl_ms.saturating_sub(grace).max(1);
        prop_assume!(free_at < MAX - 20_000);
        for cost in [0, 1, params.limit()] {
            let t = free_at + later;
            prop_assert_eq!(
                evaluate(&policy, Stored::Present(&w.state), t, cost),
                evaluate(&policy, Stored::Absent, t, cost)
            );
        }
    }

    #[test]
    fn refill_does_not_depend_on_evaluation_frequency(
        p in period(1_000),
        r in 1u64..50,
        c in 0u64..10_000,
        steps in prop::collection::vec(0u64..3_000, 1..40),
        start_tokens in any::<u64>(),
        start_rem in any::<u64>(),
    ) {
        let policy = policy(AlgorithmParams::TokenBucket { capacity: c, refill_tokens: r, refill_period_ms: p }, 0);
        let tokens = start_tokens % (c + 1);
        let remainder = if tokens == c { 0 } else { start_rem % p };
        let start = State::TokenBucket(edgelimit::algorithm::token_bucket::State {
            last_observed_ms: NOW, tokens, remainder,
        });
        // A denied over-capacity request stores the refill without consuming.
        let mut s = start;
        let mut now = NOW;
        for gap in &steps {
            now += gap;
            let e = evaluate(&policy, Stored::Present(&s), now, c + 1);
            prop_assert_eq!(e.reply.status, Status::Denied);
            s = e.write.map(|w| w.state).unwrap_or(s);
        }
        let one = evaluate(&policy, Stored::Present(&start), now, c + 1);
        prop_assert_eq!(one.write.map(|w| w.state), Some(s));
    }
}
