//! Differential tests: random timelines run through each Lua program in a private Redis and
//! through the Rust function on the same stored state and server time must give identical
//! seven-field replies and identical stored state.
//!
//! Time is exercised without long sleeps: small real sleeps for tiny windows, and by editing
//! the stored hash (aging it by whole windows / milliseconds, moving `o` into the future to
//! simulate clock regression, or replacing it by a random valid state).

use crate::common;
use crate::programs;

use std::time::Duration;

use common::redis_server::RedisServer;
use edgelimit::algorithm::{
    fixed_window, sliding_window, sliding_window::MAX_SCALED, token_bucket, State, MAX,
    MAX_PERIOD_MS, MAX_SAFETY_MS,
};
use edgelimit::contract::{AlgorithmParams, PolicyId, RateLimitPolicy};
use programs::Programs;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

const KEY: &str = "rl:diff";
const CASES: u32 = 96;

/// One step of a timeline; raw numbers are reduced at run time to ranges that depend on the
/// policy and the server clock.
#[derive(Debug, Clone)]
enum Step {
    /// Evaluate with a cost chosen by `kind` (peek, 1, small, limit, limit + 1, any).
    Call {
        kind: u8,
        raw: u64,
    },
    Sleep(u64),
    /// Pretend time passed: whole windows for the window algorithms, ms for the bucket.
    Age(u64),
    /// Move the stored last observation forward: the server clock appears to go back.
    Regress(u64),
    /// Replace the state by a random valid one near the current time.
    Put([u64; 4]),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        8 => (0u8..6, any::<u64>()).prop_map(|(kind, raw)| Step::Call { kind, raw }),
        1 => (0u64..=3).prop_map(Step::Sleep),
        2 => (1u64..=3_000).prop_map(Step::Age),
        1 => prop_oneof![0u64..=300, any::<u64>()].prop_map(Step::Regress),
        2 => any::<[u64; 4]>().prop_map(Step::Put),
    ]
}

fn safety() -> impl Strategy<Value = (u64, u64)> {
    (
        prop_oneof![0u64..=200, Just(MAX_SAFETY_MS)],
        // at least a second of grace: nothing expires between the reads around a run
        prop_oneof![1_000u64..=2_000, Just(MAX_SAFETY_MS)],
    )
}

fn window(max: u64) -> impl Strategy<Value = u64> {
    prop_oneof![1u64..=20, 1u64..=5_000, Just(max), 1..=max]
}

fn count(max: u64) -> impl Strategy<Value = u64> {
    prop_oneof![0u64..=5, 0u64..=1_000, Just(max), 0..=max]
}

fn fixed_params() -> impl Strategy<Value = AlgorithmParams> {
    (window(MAX_PERIOD_MS), count(MAX))
        .prop_map(|(window_ms, limit)| AlgorithmParams::FixedWindow { limit, window_ms })
}

fn sliding_params() -> impl Strategy<Value = AlgorithmParams> {
    (window(MAX_SCALED), count(MAX_SCALED))
        .prop_map(|(window_ms, limit)| AlgorithmParams::SlidingWindow { limit, window_ms })
}

fn bucket_params() -> impl Strategy<Value = AlgorithmParams> {
    window(MAX_PERIOD_MS).prop_flat_map(|period| {
        let bound = MAX / period; // rate < bound, capacity <= bound
        (
            prop_oneof![1u64..=5, 1..bound],
            prop_oneof![0u64..=10, Just(bound), 0..=bound],
        )
            .prop_map(
                move |(refill_tokens, capacity)| AlgorithmParams::TokenBucket {
                    capacity,
                    refill_tokens,
                    refill_period_ms: period,
                },
            )
    })
}

fn policy(
    params: AlgorithmParams,
    revision: u64,
    (regression, grace): (u64, u64),
) -> RateLimitPolicy {
    RateLimitPolicy::new(
        PolicyId::new("diff.policy").unwrap(),
        revision,
        params,
        MAX,
        grace,
        regression,
    )
    .unwrap()
}

fn cost(kind: u8, raw: u64, limit: u64) -> u64 {
    match kind {
        0 => 0,
        1 => 1,
        2 => 1 + raw % 3,
        3 => limit.max(1),
        4 => (limit + 1).min(MAX),
        _ => raw % (MAX + 1),
    }
}

/// Applies a state-editing step to the stored hash, if the key holds valid state.
fn edit(p: &mut Programs, policy: &RateLimitPolicy, step: &Step) {
    edit_on(p, policy, KEY, step)
}

fn edit_on(p: &mut Programs, policy: &RateLimitPolicy, key: &str, step: &Step) {
    let now = p.server_time_ms();
    let before = match p.before(policy, key) {
        programs::Before::Present(s) => Some(s),
        _ => None,
    };
    let window = policy.params().period_ms();
    let limit = policy.params().limit();
    let edited = match (step, before) {
        (Step::Age(n), Some(State::FixedWindow(s))) => {
            let k = (*n % 4).min(s.window_id).min(s.last_observed_ms / window);
            Some(State::FixedWindow(fixed_window::State {
                last_observed_ms: s.last_observed_ms - k * window,
                window_id: s.window_id - k,
                ..s
            }))
        }
        (Step::Age(n), Some(State::SlidingWindow(s))) => {
            let k = (*n % 4)
                .min(s.previous_window_id)
                .min(s.last_observed_ms / window);
            Some(State::SlidingWindow(sliding_window::State {
                last_observed_ms: s.last_observed_ms - k * window,
                previous_window_id: s.previous_window_id - k,
                current_window_id: s.current_window_id - k,
                ..s
            }))
        }
        (Step::Age(ms), Some(State::TokenBucket(s))) => {
            let ms = if ms % 7 == 0 { ms * window / 3 } else { *ms };
            Some(State::TokenBucket(token_bucket::State {
                last_observed_ms: s.last_observed_ms.saturating_sub(ms),
                ..s
            }))
        }
        (Step::Regress(d), Some(mut s)) => {
            let o = (s.last_observed_ms() + d % 1_000_000).min(MAX);
            match &mut s {
                State::FixedWindow(s) => s.last_observed_ms = o,
                State::SlidingWindow(s) => s.last_observed_ms = o,
                State::TokenBucket(s) => s.last_observed_ms = o,
            }
            Some(s)
        }
        (Step::Put([a, b, c, d]), _) => {
            // near now: up to three windows back, or slightly ahead (clamped or unsafe)
            let o = if a % 5 == 0 {
                now + a % 400
            } else {
                now - a % (3 * window.min(now / 4) + 1)
            };
            Some(match *policy.params() {
                AlgorithmParams::FixedWindow { .. } => {
                    let w = o / window;
                    State::FixedWindow(fixed_window::State {
                        last_observed_ms: o,
                        window_id: w - (b % 3).min(w),
                        // Sometimes above the limit: a limit lowered by a reload.
                        consumed: c % (over(limit, *b) + 1),
                    })
                }
                AlgorithmParams::SlidingWindow { .. } => {
                    let cw = o / window - (b % 3).min(o / window);
                    let pw = if d % 4 == 0 {
                        cw.saturating_sub(2 + d % 5)
                    } else {
                        cw.saturating_sub(1)
                    };
                    State::SlidingWindow(sliding_window::State {
                        last_observed_ms: o,
                        previous_window_id: pw,
                        previous_count: d % (over(limit, *b).min(MAX_SCALED) + 1),
                        current_window_id: cw,
                        current_count: if b % 2 == 0 {
                            c % (over(limit, *b).min(MAX_SCALED) + 1)
                        } else {
                            c % 4 % (limit + 1)
                        },
                    })
                }
                AlgorithmParams::TokenBucket {
                    capacity,
                    refill_period_ms,
                    ..
                } => {
                    let t = if b % 3 == 0 {
                        capacity
                    } else {
                        // Sometimes above the capacity: a burst lowered by a reload.
                        c % (over(capacity, *b) + 1)
                    };
                    let m = if t >= capacity && b % 5 != 0 {
                        0
                    } else {
                        d % refill_period_ms
                    };
                    State::TokenBucket(token_bucket::State {
                        last_observed_ms: o,
                        tokens: t,
                        remainder: m,
                    })
                }
            })
        }
        _ => None,
    };
    if let Some(s) = edited {
        p.put_state(policy, key, &s, 3_600_000);
    }
}

/// The range of a stored count: up to the limit, or (one time in seven) up to twice it, as
/// after a reload that lowered the limit.
fn over(limit: u64, salt: u64) -> u64 {
    if salt % 7 == 3 {
        limit.saturating_mul(2).saturating_add(1).min(MAX - 1)
    } else {
        limit
    }
}

fn run_timelines(params: impl Strategy<Value = AlgorithmParams>) {
    let redis = RedisServer::start();
    let p = std::cell::RefCell::new(Programs::new(&redis.url()));
    let strategy = (
        params,
        any::<u64>(),
        safety(),
        prop::collection::vec(step(), 1..25),
    );
    let mut runner = TestRunner::new(Config {
        cases: CASES,
        failure_persistence: None,
        ..Config::default()
    });
    runner
        .run(&strategy, |(params, revision, safety, steps)| {
            let policy = policy(params, revision, safety);
            let mut p = p.borrow_mut();
            let _: () = p.cmd(&["DEL", KEY]);
            let limit = policy.params().limit();
            for s in &steps {
                match s {
                    Step::Call { kind, raw } => {
                        p.step(&policy, KEY, cost(*kind, *raw, limit));
                    }
                    Step::Sleep(ms) => std::thread::sleep(Duration::from_millis(*ms)),
                    _ => edit(&mut p, &policy, s),
                }
            }
            // Always end with a consuming call and a peek.
            p.step(&policy, KEY, 1);
            p.step(&policy, KEY, 0);
            Ok(())
        })
        .unwrap();
}

#[test]
fn fixed_window_lua_and_rust_agree() {
    run_timelines(fixed_params());
}

#[test]
fn sliding_window_lua_and_rust_agree() {
    run_timelines(sliding_params());
}

#[test]
fn token_bucket_lua_and_rust_agree() {
    run_timelines(bucket_params());
}

/// A composite request: up to six checks over up to three keys, each key with its own policy
/// of any algorithm, costs of every kind, some checks in shadow mode.
#[derive(Debug, Clone)]
struct CompositeStep {
    checks: Vec<(usize, u8, u64, bool)>,
    check_mode: bool,
}

fn composite_step() -> impl Strategy<Value = CompositeStep> {
    (
        prop::collection::vec(
            (0usize..3, 0u8..6, any::<u64>(), prop::bool::weighted(0.2)),
            1..7,
        ),
        prop::bool::weighted(0.2),
    )
        .prop_map(|(checks, check_mode)| CompositeStep { checks, check_mode })
}

fn any_params() -> impl Strategy<Value = AlgorithmParams> {
    prop_oneof![fixed_params(), sliding_params(), bucket_params()]
}

const COMPOSITE_KEYS: [&str; 3] = ["rl:c{t}a", "rl:c{t}b", "rl:c{t}c"];

#[test]
fn composite_requests_of_mixed_algorithms_lua_and_rust_agree() {
    use edgelimit::algorithm::composite::Mode;
    let redis = RedisServer::start();
    let p = std::cell::RefCell::new(Programs::new(&redis.url()));
    let strategy = (
        [any_params(), any_params(), any_params()],
        any::<u64>(),
        safety(),
        prop::collection::vec(
            prop_oneof![
                6 => composite_step().prop_map(Ok),
                2 => step().prop_map(Err),
            ],
            1..16,
        ),
    );
    let mut runner = TestRunner::new(Config {
        cases: CASES,
        failure_persistence: None,
        ..Config::default()
    });
    runner
        .run(&strategy, |(params, revision, safety, steps)| {
            let policies: Vec<RateLimitPolicy> = params
                .iter()
                .enumerate()
                .map(|(i, params)| {
                    let mut p = policy(*params, revision.wrapping_add(i as u64), safety);
                    if i > 0 {
                        p = RateLimitPolicy::new(
                            PolicyId::new(&format!("diff.policy{i}")).unwrap(),
                            p.revision(),
                            *p.params(),
                            p.max_cost(),
                            p.cleanup_grace_ms(),
                            p.max_clock_regression_ms(),
                        )
                        .unwrap();
                    }
                    p
                })
                .collect();
            let mut p = p.borrow_mut();
            for key in COMPOSITE_KEYS {
                let _: () = p.cmd(&["DEL", key]);
            }
            for step in &steps {
                match step {
                    Ok(c) => {
                        let checks: Vec<programs::CompositeCheck<'_>> = c
                            .checks
                            .iter()
                            .map(|&(key, kind, raw, shadow)| programs::CompositeCheck {
                                policy: &policies[key],
                                key: COMPOSITE_KEYS[key],
                                cost: cost(kind, raw, policies[key].params().limit()),
                                shadow,
                            })
                            .collect();
                        let mode = if c.check_mode {
                            Mode::Check
                        } else {
                            Mode::Commit
                        };
                        p.step_composite(&checks, mode);
                    }
                    Err(Step::Sleep(ms)) => std::thread::sleep(Duration::from_millis(*ms)),
                    // Edits act on the first key, with its policy.
                    Err(edit_step) => edit_on(&mut p, &policies[0], COMPOSITE_KEYS[0], edit_step),
                }
            }
            Ok(())
        })
        .unwrap();
}

/// Batches of composite requests over shared keys: the batch program decides each request on
/// its own, in order, exactly as the Rust composite does one request after the other.
#[test]
fn batches_of_requests_lua_and_rust_agree() {
    use edgelimit::algorithm::composite::Mode;
    let redis = RedisServer::start();
    let p = std::cell::RefCell::new(Programs::new(&redis.url()));
    let strategy = (
        [any_params(), any_params(), any_params()],
        any::<u64>(),
        safety(),
        prop::collection::vec(prop::collection::vec(composite_step(), 1..6), 1..6),
    );
    let mut runner = TestRunner::new(Config {
        cases: CASES,
        failure_persistence: None,
        ..Config::default()
    });
    runner
        .run(&strategy, |(params, revision, safety, batches)| {
            let policies: Vec<RateLimitPolicy> = params
                .iter()
                .enumerate()
                .map(|(i, params)| {
                    let p = policy(*params, revision.wrapping_add(i as u64), safety);
                    RateLimitPolicy::new(
                        PolicyId::new(&format!("diff.batch{i}")).unwrap(),
                        p.revision(),
                        *p.params(),
                        p.max_cost(),
                        p.cleanup_grace_ms(),
                        p.max_clock_regression_ms(),
                    )
                    .unwrap()
                })
                .collect();
            let mut p = p.borrow_mut();
            for key in COMPOSITE_KEYS {
                let _: () = p.cmd(&["DEL", key]);
            }
            let policy_of = |key: &str| {
                let i = COMPOSITE_KEYS.iter().position(|k| *k == key).unwrap();
                policies[i].clone()
            };
            for batch in &batches {
                let members: Vec<(Vec<programs::CompositeCheck<'_>>, Mode)> = batch
                    .iter()
                    .map(|c| {
                        let checks = c
                            .checks
                            .iter()
                            .map(|&(key, kind, raw, shadow)| programs::CompositeCheck {
                                policy: &policies[key],
                                key: COMPOSITE_KEYS[key],
                                cost: cost(kind, raw, policies[key].params().limit()),
                                shadow,
                            })
                            .collect();
                        let mode = if c.check_mode {
                            Mode::Check
                        } else {
                            Mode::Commit
                        };
                        (checks, mode)
                    })
                    .collect();
                p.step_batch(&members, policy_of);
            }
            Ok(())
        })
        .unwrap();
}
