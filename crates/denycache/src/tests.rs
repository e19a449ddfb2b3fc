//! The cache in front of the real embedded backend; a pass-through counts what reaches it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use edgelimit_contract::{
    AlgorithmParams, BackendReadiness, CompositeOutcome, CompositeRequest, Cost, Enforcement,
    LimitCheck, PolicyId, RateLimitPolicy, RateLimitPort, SubjectDigest,
};
use edgelimit_memory::MemoryBackend;
use futures_util::FutureExt;

use super::*;

/// The real embedded backend, counting the requests that reach it.
#[derive(Default)]
struct Counted {
    backend: MemoryBackend,
    calls: AtomicUsize,
}

impl RateLimitPort for Counted {
    async fn evaluate_all(&self, request: &CompositeRequest<'_>) -> CompositeOutcome {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.backend.evaluate_all(request).await
    }
    async fn readiness(&self) -> BackendReadiness {
        BackendReadiness::Ready
    }
    fn describe(&self) -> String {
        "memory, counted".into()
    }
}

fn policy(id: &str, params: AlgorithmParams) -> RateLimitPolicy {
    RateLimitPolicy::new(PolicyId::new(id).unwrap(), 1, params, 100, 60_000, 2_000).unwrap()
}

fn fixed(limit: u64) -> RateLimitPolicy {
    policy(
        "f",
        AlgorithmParams::FixedWindow {
            limit,
            window_ms: 3_600_000,
        },
    )
}

fn bucket(capacity: u64, period_ms: u64) -> RateLimitPolicy {
    policy(
        "t",
        AlgorithmParams::TokenBucket {
            capacity,
            refill_tokens: 1,
            refill_period_ms: period_ms,
        },
    )
}

fn cache(max_entries: usize) -> DenyCache<Counted> {
    DenyCache::new(
        Arc::new(Counted::default()),
        DenyCacheSettings {
            enabled: true,
            max_entries,
        },
    )
}

fn ask(
    c: &DenyCache<Counted>,
    checks: &[(&RateLimitPolicy, u8, u64, bool)],
) -> Vec<edgelimit_contract::RateLimitOutcome> {
    let checks = checks
        .iter()
        .map(|(p, subject, cost, shadow)| {
            let cost = if *cost == 0 {
                Cost::Peek
            } else {
                Cost::consume(*cost).unwrap()
            };
            let enforcement = if *shadow {
                Enforcement::Shadow
            } else {
                Enforcement::Enforced
            };
            LimitCheck::new(
                p,
                SubjectDigest::from_bytes([*subject; 32]),
                cost,
                enforcement,
            )
            .unwrap()
        })
        .collect();
    let request = CompositeRequest::new(checks, Instant::now() + Duration::from_secs(5)).unwrap();
    c.evaluate_all(&request)
        .now_or_never()
        .expect("memory answers at once")
        .into_outcomes()
}

fn calls(c: &DenyCache<Counted>) -> usize {
    c.inner().calls.load(Ordering::Relaxed)
}

#[test]
fn a_subject_over_its_limit_is_denied_locally_and_never_allowed_locally() {
    let c = cache(1000);
    let p = fixed(2);
    assert!(ask(&c, &[(&p, 1, 1, false)])[0].is_allowed());
    assert!(ask(&c, &[(&p, 1, 1, false)])[0].is_allowed());
    assert_eq!(calls(&c), 2);
    // Fixed window, 0 left: every further request is denied here until the window ends.
    for _ in 0..10 {
        let o = ask(&c, &[(&p, 1, 1, false)]);
        assert!(!o[0].is_allowed());
    }
    assert_eq!(calls(&c), 2, "no backend call after the bound said 0 left");
    // Another subject is asked.
    assert!(ask(&c, &[(&p, 2, 1, false)])[0].is_allowed());
    assert_eq!(calls(&c), 3);
}

#[test]
fn a_fixed_window_with_room_denies_only_costs_above_it() {
    let c = cache(1000);
    let p = fixed(10);
    assert!(ask(&c, &[(&p, 1, 7, false)])[0].is_allowed()); // 3 left
    assert!(
        !ask(&c, &[(&p, 1, 4, false)])[0].is_allowed(),
        "4 > 3: locally"
    );
    assert_eq!(calls(&c), 1);
    assert!(
        ask(&c, &[(&p, 1, 3, false)])[0].is_allowed(),
        "3 fits: asked"
    );
    assert_eq!(calls(&c), 2);
}

#[test]
fn a_token_bucket_denial_holds_until_its_retry_and_no_longer() {
    let c = cache(1000);
    let p = bucket(1, 50);
    assert!(ask(&c, &[(&p, 1, 1, false)])[0].is_allowed());
    let denied = ask(&c, &[(&p, 1, 1, false)]);
    assert!(!denied[0].is_allowed());
    assert_eq!(calls(&c), 2);
    assert!(!ask(&c, &[(&p, 1, 1, false)])[0].is_allowed());
    assert_eq!(calls(&c), 2, "denied locally within the retry");
    std::thread::sleep(Duration::from_millis(60));
    assert!(
        ask(&c, &[(&p, 1, 1, false)])[0].is_allowed(),
        "refilled: asked, allowed"
    );
    assert_eq!(calls(&c), 3);
}

#[test]
fn a_new_limit_invalidates_what_was_learned() {
    let c = cache(1000);
    let (two, five) = (fixed(2), fixed(5));
    ask(&c, &[(&two, 1, 1, false)]);
    ask(&c, &[(&two, 1, 1, false)]);
    assert!(!ask(&c, &[(&two, 1, 1, false)])[0].is_allowed());
    let before = calls(&c);
    // Same id and revision (a reload that only changed the number): the backend decides.
    assert!(ask(&c, &[(&five, 1, 1, false)])[0].is_allowed());
    assert_eq!(calls(&c), before + 1);
}

#[test]
fn shadow_limits_never_deny_locally_and_unknown_limits_are_asked() {
    let c = cache(1000);
    let (trial, other) = (
        fixed(1),
        policy(
            "g",
            AlgorithmParams::FixedWindow {
                limit: 5,
                window_ms: 3_600_000,
            },
        ),
    );
    ask(&c, &[(&trial, 1, 1, true)]);
    ask(&c, &[(&trial, 1, 1, true)]);
    ask(&c, &[(&trial, 1, 1, true)]);
    assert_eq!(
        calls(&c),
        3,
        "a shadow limit's denial is never answered locally"
    );
    // Enforced limit known to deny, another limit of the request unknown: asked.
    let full = fixed(1);
    ask(&c, &[(&full, 3, 1, false)]);
    let before = calls(&c);
    let o = ask(&c, &[(&full, 3, 1, false), (&other, 3, 1, false)]);
    assert!(!o[0].is_allowed());
    assert_eq!(calls(&c), before + 1);
    // Now both are known: locally, and the other limit reports what it had.
    let o = ask(&c, &[(&full, 3, 1, false), (&other, 3, 1, false)]);
    assert_eq!(calls(&c), before + 1);
    assert!(!o[0].is_allowed() && o[1].is_allowed());
}

#[test]
fn memory_is_bounded() {
    let c = cache(32);
    let p = fixed(1);
    for subject in 0..=255u8 {
        ask(&c, &[(&p, subject, 1, false)]);
    }
    assert!(c.len() <= 32, "{} entries", c.len());
}

#[test]
fn off_means_every_request_is_asked() {
    let c = DenyCache::new(
        Arc::new(Counted::default()),
        DenyCacheSettings {
            enabled: false,
            max_entries: 10,
        },
    );
    let p = fixed(1);
    for _ in 0..5 {
        ask(&c, &[(&p, 1, 1, false)]);
    }
    assert_eq!(calls(&c), 5);
}

#[test]
fn a_decision_with_room_to_spare_is_not_kept() {
    let c = cache(1000);
    let (window, bucket) = (fixed(10), bucket(10, 1_000));
    for subject in 0..50u8 {
        assert!(ask(&c, &[(&window, subject, 1, false)])[0].is_allowed());
        assert!(ask(&c, &[(&bucket, subject, 1, false)])[0].is_allowed());
    }
    assert_eq!(c.len(), 0, "nothing learned could deny the same request");
    // A request its limit would deny again is kept.
    assert!(ask(&c, &[(&window, 1, 9, false)])[0].is_allowed()); // 0 left
    assert_eq!(c.len(), 1);
}

#[test]
fn what_is_held_is_refreshed_by_a_later_answer() {
    let c = cache(1000);
    let p = fixed(10);
    assert!(ask(&c, &[(&p, 1, 7, false)])[0].is_allowed()); // 3 left: kept (denies 4+)
    assert!(ask(&c, &[(&p, 1, 1, false)])[0].is_allowed()); // 2 left: refreshes it
    assert_eq!(calls(&c), 2);
    let o = ask(&c, &[(&p, 1, 3, false)]);
    assert!(!o[0].is_allowed(), "3 > 2: locally");
    assert_eq!(calls(&c), 2);
    match &o[0] {
        edgelimit_contract::RateLimitOutcome::Evaluated(d) => assert_eq!(d.remaining, 2),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_full_cache_keeps_taking_new_subjects() {
    let c = cache(32);
    let p = fixed(1);
    for subject in 0..=255u8 {
        // Each subject exhausts its limit: kept, evicting another when full.
        assert!(ask(&c, &[(&p, subject, 1, false)])[0].is_allowed());
        let before = calls(&c);
        assert!(!ask(&c, &[(&p, subject, 1, false)])[0].is_allowed());
        assert_eq!(
            calls(&c),
            before,
            "subject {subject}: the newest entry is held"
        );
        assert!(c.len() <= 32, "{} entries", c.len());
    }
}
