//! The embedded backend through its port: exactness under concurrency, the subject cap
//! (fail closed for new subjects only), eviction of expired state, and outcome mapping.

use std::sync::Arc;
use std::time::{Duration, Instant};

use edgelimit::contract::{
    AlgorithmParams, BackendReadiness, Certainty, Cost, DecisionSource, IncompatibleCause,
    PolicyId, RateLimitOutcome, RateLimitPolicy, RateLimitPort, RateLimitRequest, SubjectDigest,
    UnavailableCause,
};
use edgelimit::memory::{MemoryBackend, MemoryConfig};

const HOUR: u64 = 3_600_000;
// Long windows so nothing rolls over while a test runs.
const LONG: u64 = 100 * 24 * HOUR;

fn policy(id: &str, params: AlgorithmParams, grace: u64) -> RateLimitPolicy {
    RateLimitPolicy::new(PolicyId::new(id).unwrap(), 1, params, 1_000, grace, 0).unwrap()
}

fn subject(n: u64) -> SubjectDigest {
    let mut b = [0u8; 32];
    b[..8].copy_from_slice(&n.to_le_bytes());
    b[8..16].copy_from_slice(&n.wrapping_mul(0x9e37_79b9_7f4a_7c15).to_le_bytes());
    SubjectDigest::from_bytes(b)
}

fn request(p: &RateLimitPolicy, s: u64, cost: u64) -> RateLimitRequest {
    let cost = match cost {
        0 => Cost::Peek,
        n => Cost::consume(n).unwrap(),
    };
    RateLimitRequest::new(
        p,
        subject(s),
        cost,
        None,
        Instant::now() + Duration::from_secs(30),
    )
    .unwrap()
}

fn three(limit: u64) -> [RateLimitPolicy; 3] {
    [
        policy(
            "fixed",
            AlgorithmParams::FixedWindow {
                limit,
                window_ms: LONG,
            },
            0,
        ),
        policy(
            "sliding",
            AlgorithmParams::SlidingWindow {
                limit,
                window_ms: LONG,
            },
            0,
        ),
        // one token per 100 days: nothing refills during the test
        policy(
            "bucket",
            AlgorithmParams::TokenBucket {
                capacity: limit,
                refill_tokens: 1,
                refill_period_ms: LONG,
            },
            0,
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_requests_admit_exactly_the_limit() {
    const LIMIT: u64 = 1_000;
    const TASKS: u64 = 50;
    const PER_TASK: u64 = 60; // 3,000 attempts for 1,000 units
    let backend = Arc::new(MemoryBackend::default());
    for p in three(LIMIT) {
        let p = Arc::new(p);
        let mut tasks = Vec::new();
        for _ in 0..TASKS {
            let (backend, p) = (backend.clone(), p.clone());
            tasks.push(tokio::spawn(async move {
                let mut allowed = 0u64;
                for _ in 0..PER_TASK {
                    let outcome = backend.evaluate(&p, &request(&p, 7, 1)).await;
                    assert!(matches!(outcome, RateLimitOutcome::Evaluated(_)));
                    allowed += u64::from(outcome.is_allowed());
                    tokio::task::yield_now().await;
                }
                allowed
            }));
        }
        let mut total = 0;
        for t in tasks {
            total += t.await.unwrap();
        }
        assert_eq!(total, LIMIT, "{}", p.id());
    }
}

#[test]
fn threads_hammering_many_subjects_stay_exact() {
    const LIMIT: u64 = 40;
    const SUBJECTS: u64 = 200;
    let backend = Arc::new(MemoryBackend::default());
    let p = Arc::new(three(LIMIT)[2].clone());
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let (backend, p) = (backend.clone(), p.clone());
            std::thread::spawn(move || {
                let mut per_subject = vec![0u64; SUBJECTS as usize];
                for i in 0..SUBJECTS * 30 {
                    let s = (i * 7 + t) % SUBJECTS;
                    if backend.decide(&p, &request(&p, s, 1)).is_allowed() {
                        per_subject[s as usize] += 1;
                    }
                }
                per_subject
            })
        })
        .collect();
    let mut totals = vec![0u64; SUBJECTS as usize];
    for t in threads {
        for (s, n) in t.join().unwrap().into_iter().enumerate() {
            totals[s] += n;
        }
    }
    assert!(totals.iter().all(|&n| n == LIMIT), "{totals:?}");
    assert_eq!(backend.tracked_subjects(), SUBJECTS as usize);
}

#[tokio::test]
async fn decisions_carry_source_certainty_and_quota() {
    let backend = MemoryBackend::default();
    for p in three(3) {
        let RateLimitOutcome::Evaluated(d) = backend.evaluate(&p, &request(&p, 1, 2)).await else {
            panic!("evaluated expected")
        };
        assert!(d.allowed);
        assert_eq!((d.limit, d.remaining), (3, 1));
        assert_eq!(d.source, DecisionSource::LocalMemory);
        assert_eq!(d.policy_id, *p.id());
        assert_eq!(d.policy_revision, 1);
        let expected = if p.id().as_str() == "sliding" {
            Certainty::ApproximateAlgorithm
        } else {
            Certainty::Certain
        };
        assert_eq!(d.certainty, expected);
        let RateLimitOutcome::Evaluated(d) = backend.evaluate(&p, &request(&p, 1, 2)).await else {
            panic!("evaluated expected")
        };
        assert!(!d.allowed, "denied without consuming");
        assert_eq!(d.remaining, 1);
        assert!(d.retry_after > Duration::ZERO);
        assert!(backend.evaluate(&p, &request(&p, 1, 1)).await.is_allowed());
    }
    assert_eq!(backend.readiness().await, BackendReadiness::Ready);
    assert!(backend.describe().contains("local to this process"));
}

#[tokio::test]
async fn a_request_for_another_policy_is_incompatible() {
    let backend = MemoryBackend::default();
    let [a, b, _] = three(3);
    let outcome = backend.evaluate(&a, &request(&b, 1, 1)).await;
    assert_eq!(
        outcome,
        RateLimitOutcome::Incompatible {
            policy_id: a.id().clone(),
            cause: IncompatibleCause::PolicyMismatch,
        }
    );
}

#[test]
fn at_the_cap_new_subjects_fail_closed_and_tracked_ones_keep_working() {
    let backend = MemoryBackend::new(MemoryConfig {
        max_subjects: 10,
        retry_after: Duration::from_millis(250),
    });
    let p = three(5)[0].clone();
    for s in 0..10 {
        assert!(backend.decide(&p, &request(&p, s, 1)).is_allowed());
    }
    assert_eq!(backend.tracked_subjects(), 10);
    for attempt in 1..=3 {
        assert_eq!(
            backend.decide(&p, &request(&p, 100 + attempt, 1)),
            RateLimitOutcome::Unavailable {
                policy_id: p.id().clone(),
                retry_after: Duration::from_millis(250),
                cause: UnavailableCause::CapacityExhausted,
            }
        );
        assert_eq!(backend.capacity_rejections(), attempt);
    }
    // Tracked subjects are unaffected, a peek needs no state, and the count did not move.
    assert!(backend.decide(&p, &request(&p, 3, 4)).is_allowed());
    assert!(!backend.decide(&p, &request(&p, 3, 1)).is_allowed());
    assert!(backend.decide(&p, &request(&p, 200, 0)).is_allowed());
    assert_eq!(backend.tracked_subjects(), 10);
    assert_eq!(backend.capacity_rejections(), 3);
}

#[test]
fn expired_state_is_evicted_to_make_room_and_behaves_as_absent() {
    let backend = MemoryBackend::new(MemoryConfig {
        max_subjects: 20,
        ..MemoryConfig::default()
    });
    // 30 ms windows, no grace: every state is gone within 60 ms.
    let short = policy(
        "short",
        AlgorithmParams::FixedWindow {
            limit: 1,
            window_ms: 30,
        },
        0,
    );
    for s in 0..20 {
        assert!(backend.decide(&short, &request(&short, s, 1)).is_allowed());
    }
    assert!(matches!(
        backend.decide(&short, &request(&short, 99, 1)),
        RateLimitOutcome::Unavailable {
            cause: UnavailableCause::CapacityExhausted,
            ..
        }
    ));
    std::thread::sleep(Duration::from_millis(70));
    // Room is made by evicting expired states, across shards.
    assert!(backend.decide(&short, &request(&short, 99, 1)).is_allowed());
    assert!(backend.tracked_subjects() <= 20);
    // An expired subject starts over, as if absent.
    assert!(backend.decide(&short, &request(&short, 5, 1)).is_allowed());
    std::thread::sleep(Duration::from_millis(70));
    assert!(backend.sweep_expired() > 0);
    assert_eq!(backend.tracked_subjects(), 0);
}

#[test]
fn long_lived_state_is_not_evicted() {
    let backend = MemoryBackend::new(MemoryConfig {
        max_subjects: 4,
        ..MemoryConfig::default()
    });
    let p = three(1)[1].clone();
    for s in 0..4 {
        assert!(backend.decide(&p, &request(&p, s, 1)).is_allowed());
    }
    assert_eq!(backend.sweep_expired(), 0);
    for s in 0..4 {
        assert!(!backend.decide(&p, &request(&p, s, 1)).is_allowed());
    }
}

/// Rough throughput on this machine: `cargo test --release --test memory_backend -- --ignored`.
#[test]
#[ignore]
fn throughput() {
    let backend = Arc::new(MemoryBackend::default());
    let p = Arc::new(three(1_000_000)[2].clone());
    let threads = 2;
    let per_thread = 1_000_000u64;
    let start = Instant::now();
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let (backend, p) = (backend.clone(), p.clone());
            std::thread::spawn(move || {
                let requests: Vec<_> = (0..10_000).map(|s| request(&p, s * 2 + t, 1)).collect();
                for i in 0..per_thread {
                    std::hint::black_box(backend.decide(&p, &requests[(i % 10_000) as usize]));
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let rate = (threads * per_thread) as f64 / start.elapsed().as_secs_f64();
    println!("{rate:.0} decisions/s on {threads} threads");
}
