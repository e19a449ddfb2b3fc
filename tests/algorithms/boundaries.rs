//! Hand-written boundary vectors for the three programs, each run against a private Redis AND
//! the Rust function (every `step` asserts identical replies and stored state, a TTL after
//! every write, and an untouched key otherwise).

use crate::common;
use crate::programs;

use common::redis_server::RedisServer;
use edgelimit::algorithm::{
    self, fixed_window, sliding_window, sliding_window::MAX_SCALED, token_bucket, CommonArgs,
    ProgramReply, State, Status, Stored, MAX, MAX_PERIOD_MS, MAX_SAFETY_MS,
};
use edgelimit::contract::{Algorithm, AlgorithmParams, PolicyId, RateLimitPolicy};
use programs::Programs;

const HOUR: u64 = 3_600_000;
const K: &str = "rl:vec";

fn policy(params: AlgorithmParams, regression: u64, grace: u64) -> RateLimitPolicy {
    RateLimitPolicy::new(
        PolicyId::new("vectors").unwrap(),
        0x0123_4567_89ab_cdef,
        params,
        MAX,
        grace,
        regression,
    )
    .unwrap()
}

fn fixed(limit: u64, window_ms: u64) -> AlgorithmParams {
    AlgorithmParams::FixedWindow { limit, window_ms }
}
fn sliding(limit: u64, window_ms: u64) -> AlgorithmParams {
    AlgorithmParams::SlidingWindow { limit, window_ms }
}
fn bucket(capacity: u64, refill_tokens: u64, refill_period_ms: u64) -> AlgorithmParams {
    AlgorithmParams::TokenBucket {
        capacity,
        refill_tokens,
        refill_period_ms,
    }
}

fn start() -> (RedisServer, Programs) {
    let redis = RedisServer::start();
    let p = Programs::new(&redis.url());
    (redis, p)
}

/// A valid state for `policy` with its last observation at `o`, the quota partly used.
fn some_state(policy: &RateLimitPolicy, o: u64) -> State {
    match *policy.params() {
        AlgorithmParams::FixedWindow { window_ms, limit } => {
            State::FixedWindow(fixed_window::State {
                last_observed_ms: o,
                window_id: o / window_ms,
                consumed: limit / 2,
            })
        }
        AlgorithmParams::SlidingWindow { window_ms, limit } => {
            State::SlidingWindow(sliding_window::State {
                last_observed_ms: o,
                previous_window_id: o / window_ms - 1,
                previous_count: limit / 3,
                current_window_id: o / window_ms,
                current_count: limit / 3,
            })
        }
        AlgorithmParams::TokenBucket {
            capacity,
            refill_period_ms,
            ..
        } => State::TokenBucket(token_bucket::State {
            last_observed_ms: o,
            tokens: capacity / 2,
            remainder: refill_period_ms / 2,
        }),
    }
}

fn all_three(limit: u64) -> [RateLimitPolicy; 3] {
    [
        policy(fixed(limit, MAX_PERIOD_MS), 1_000, 60_000),
        policy(sliding(limit, MAX_SCALED), 1_000, 60_000),
        policy(bucket(limit, 1, HOUR), 1_000, 60_000),
    ]
}

#[test]
fn exact_boundary_admission_after_a_denied_non_consuming_request() {
    let (_redis, mut p) = start();
    for policy in all_three(3) {
        let _: () = p.cmd(&["DEL", K]);
        let name = policy.algorithm().as_str();
        let (r, _) = p.step(&policy, K, 2);
        assert_eq!((r.status, r.remaining), (Status::Allowed, 1), "{name}");
        let (r, e) = p.step(&policy, K, 2);
        assert_eq!((r.status, r.remaining), (Status::Denied, 1), "{name}");
        assert!(r.retry_after_ms > 0, "{name}");
        assert!(
            e.write.is_some(),
            "{name}: a denial stores the normalized state"
        );
        let (r, _) = p.step(&policy, K, 0);
        assert_eq!(r.status, Status::Allowed, "{name}: one more unit fits");
        let (r, _) = p.step(&policy, K, 1);
        assert_eq!((r.status, r.remaining), (Status::Allowed, 0), "{name}");
        let (r, _) = p.step(&policy, K, 0);
        assert_eq!(r.status, Status::Denied, "{name}: peek at zero");
        let (r, _) = p.step(&policy, K, 1);
        assert_eq!(r.status, Status::Denied, "{name}");
    }
}

#[test]
fn sliding_retry_point_is_exact_in_redis() {
    let (_redis, mut p) = start();
    let policy = policy(sliding(10, 10_000), 0, 60_000);
    // Previous window full, current holds 1: denied now, admitted exactly at the retry point.
    let now = p.server_time_ms();
    let cw = now / 10_000;
    let state = State::SlidingWindow(sliding_window::State {
        last_observed_ms: now,
        previous_window_id: cw - 1,
        previous_count: 10,
        current_window_id: cw,
        current_count: 1,
    });
    p.put_state(&policy, K, &state, HOUR);
    let (r, e) = p.step(&policy, K, 2);
    if r.status == Status::Denied {
        let Some(w) = e.write else { unreachable!() };
        let at = r.effective_now_ms + r.retry_after_ms;
        let early = algorithm::evaluate(&policy, Stored::Present(&w.state), at - 1, 2);
        let exact = algorithm::evaluate(&policy, Stored::Present(&w.state), at, 2);
        assert_eq!(early.reply.status, Status::Denied);
        assert_eq!(exact.reply.status, Status::Allowed);
    }
}

#[test]
fn token_refill_carry_many_small_steps_equals_one_large_step() {
    let (_redis, mut p) = start();
    let (period, rate, capacity) = (7, 3, 1_000_000);
    let policy = policy(bucket(capacity, rate, period), 0, 60_000);
    let empty = |o| {
        State::TokenBucket(token_bucket::State {
            last_observed_ms: o,
            tokens: 0,
            remainder: 0,
        })
    };
    let closed_form = |elapsed: u64| (elapsed * rate / period, elapsed * rate % period);
    let read = |p: &mut Programs| match p.before(&policy, K) {
        programs::Before::Present(State::TokenBucket(s)) => s,
        other => panic!("{other:?}"),
    };

    // Many small steps: age the stored state by 1..=5 ms, then a denied over-capacity request
    // stores the refill (a peek would store nothing).
    let start = p.server_time_ms();
    p.put_state(&policy, K, &empty(start), HOUR);
    let mut elapsed = 0;
    for i in 0..200u64 {
        let mut s = read(&mut p);
        s.last_observed_ms -= 1 + i % 5;
        let aged_from = s.last_observed_ms;
        p.put_state(&policy, K, &State::TokenBucket(s), HOUR);
        let (r, _) = p.step(&policy, K, capacity + 1);
        assert_eq!(r.status, Status::Denied);
        elapsed += r.effective_now_ms - aged_from;
    }
    let many = read(&mut p);
    assert_eq!((many.tokens, many.remainder), closed_form(elapsed));

    // One large step over about the same span.
    let _: () = p.cmd(&["DEL", K]);
    let from = p.server_time_ms() - elapsed;
    p.put_state(&policy, K, &empty(from), HOUR);
    let (r, _) = p.step(&policy, K, capacity + 1);
    let one = read(&mut p);
    assert_eq!(
        (one.tokens, one.remainder),
        closed_form(r.effective_now_ms - from)
    );
    // And the Rust function in one step over exactly the many-step span.
    let e = algorithm::evaluate(
        &policy,
        Stored::Present(&empty(1_000)),
        1_000 + elapsed,
        capacity + 1,
    );
    let Some(State::TokenBucket(rust)) = e.write.map(|w| w.state) else {
        panic!("bucket state expected")
    };
    assert_eq!((rust.tokens, rust.remainder), (many.tokens, many.remainder));
}

#[test]
fn clock_regression_is_clamped_within_the_threshold_and_unsafe_beyond() {
    let (_redis, mut p) = start();
    for policy in all_three(10) {
        let name = policy.algorithm().as_str();
        // 500 ms ahead of the server with a 1000 ms tolerance: clamped to the stored time.
        let ahead = p.server_time_ms() + 500;
        p.put_state(&policy, K, &some_state(&policy, ahead), HOUR);
        let (r, _) = p.step(&policy, K, 1);
        assert_eq!(r.status, Status::Allowed, "{name}");
        assert_eq!(r.effective_now_ms, ahead, "{name}: clamped");
        assert!(r.server_now_ms < ahead, "{name}");

        // 5 s ahead: CLOCK_UNSAFE, state byte for byte and TTL unchanged (asserted in step).
        let far = p.server_time_ms() + 5_000;
        p.put_state(&policy, K, &some_state(&policy, far), HOUR);
        let dump = p.dump(K);
        let expiry = p.expire_time(K);
        for cost in [1, 0, 3] {
            let (r, e) = p.step(&policy, K, cost);
            assert_eq!(
                r,
                ProgramReply {
                    status: Status::ClockUnsafe,
                    server_now_ms: r.server_now_ms,
                    effective_now_ms: r.server_now_ms,
                    limit: 10,
                    remaining: 0,
                    retry_after_ms: 0,
                    reset_at_ms: 0,
                },
                "{name}"
            );
            assert!(e.write.is_none());
        }
        assert_eq!(p.dump(K), dump, "{name}");
        assert_eq!(p.expire_time(K), expiry, "{name}");
    }
}

/// Valid hash for `policy`, then one field replaced (`Some`) or removed (`None`).
fn mutated(
    policy: &RateLimitPolicy,
    o: u64,
    field: &str,
    value: Option<&str>,
) -> Vec<(&'static str, String)> {
    let mut h = edgelimit::redis::state_to_hash(&some_state(policy, o), policy);
    h.retain(|(k, _)| *k != field);
    if let Some(v) = value {
        let name = h
            .iter()
            .map(|(k, _)| *k)
            .chain([
                "v", "a", "p", "r", "o", "w", "c", "pw", "pc", "cw", "cc", "t", "m",
            ])
            .find(|k| *k == field)
            .unwrap();
        h.push((name, v.to_owned()));
    }
    h
}

#[test]
fn malformed_hash_state_is_incompatible_and_left_alone() {
    let (_redis, mut p) = start();
    let bad_numbers = [
        "1e3",
        " 5",
        "5 ",
        "-1",
        "0x10",
        "",
        "+1",
        "1.0",
        "9007199254740992",
        "12345678901234567",
    ];
    for policy in all_three(10) {
        let name = policy.algorithm().as_str();
        let numeric: &[&str] = match policy.algorithm() {
            Algorithm::FixedWindow => &["o", "w", "c"],
            Algorithm::SlidingWindow => &["o", "pw", "pc", "cw", "cc"],
            Algorithm::TokenBucket => &["o", "t", "m"],
        };
        let now = p.server_time_ms();
        let mut cases: Vec<(String, Vec<(&'static str, String)>)> = Vec::new();
        for field in numeric.iter().chain(&["v", "a", "p", "r"]) {
            cases.push((
                format!("{field} missing"),
                mutated(&policy, now, field, None),
            ));
        }
        for field in numeric {
            for bad in bad_numbers {
                cases.push((
                    format!("{field}={bad:?}"),
                    mutated(&policy, now, field, Some(bad)),
                ));
            }
        }
        for (field, value) in [
            ("v", "2"),
            ("a", "fixed_window"),
            ("a", "token_bucket"),
            ("p", "other"),
            ("r", "0123456789abcdee"),
            ("r", "0123456789ABCDEF"),
        ] {
            if policy.algorithm().as_str() != value {
                cases.push((
                    format!("{field}={value}"),
                    mutated(&policy, now, field, Some(value)),
                ));
            }
        }
        // Beyond what the arithmetic can hold (a count above the limit, or tokens above the
        // capacity, are not corruption: the limit may have been lowered; see
        // `a_lowered_limit_keeps_the_count`).
        let over: &[(&str, &str)] = match policy.algorithm() {
            Algorithm::FixedWindow => &[("c", "9007199254740992")],
            Algorithm::SlidingWindow => &[("pc", "9007199255"), ("cc", "9007199255")],
            Algorithm::TokenBucket => &[("t", "9007199254740992"), ("m", "3600000")],
        };
        for (field, value) in over {
            cases.push((
                format!("{field}={value}"),
                mutated(&policy, now, field, Some(value)),
            ));
        }
        match policy.algorithm() {
            Algorithm::TokenBucket => {}
            _ => {
                let window = policy.params().period_ms();
                let field = if policy.algorithm() == Algorithm::FixedWindow {
                    "w"
                } else {
                    "cw"
                };
                let future = (now / window + 5).to_string();
                cases.push((
                    "window ahead of the clock".into(),
                    mutated(&policy, now, field, Some(&future)),
                ));
            }
        }
        for (what, fields) in cases {
            p.put_fields(K, &fields, HOUR);
            for cost in [1, 0] {
                let (r, e) = p.step(&policy, K, cost);
                assert_eq!(r.status, Status::StateIncompatible, "{name}: {what}");
                assert_eq!((r.limit, r.remaining, r.reset_at_ms), (10, 0, 0));
                assert!(e.write.is_none());
            }
        }
    }
}

#[test]
fn a_key_of_another_type_is_incompatible_and_left_alone() {
    let (_redis, mut p) = start();
    for policy in all_three(10) {
        for setup in [
            &["SET", K, "5"][..],
            &["RPUSH", K, "a", "b"],
            &["SADD", K, "a"],
            &["ZADD", K, "1", "a"],
        ] {
            let _: () = p.cmd(&["DEL", K]);
            let _: () = p.cmd(setup);
            let _: () = p.cmd(&["PEXPIRE", K, "3600000"]);
            for cost in [1, 0] {
                let (r, _) = p.step(&policy, K, cost);
                assert_eq!(r.status, Status::StateIncompatible, "{setup:?}");
            }
        }
    }
}

#[test]
fn extra_hash_fields_are_ignored_and_kept() {
    let (_redis, mut p) = start();
    for policy in all_three(10) {
        let mut h =
            edgelimit::redis::state_to_hash(&some_state(&policy, p.server_time_ms()), &policy);
        h.push(("x", "anything".into()));
        p.put_fields(K, &h, HOUR);
        let (r, _) = p.step(&policy, K, 1);
        assert_eq!(r.status, Status::Allowed);
    }
}

#[test]
fn every_write_sets_a_ttl_and_peeks_write_nothing() {
    let (_redis, mut p) = start();
    // Zero grace: the TTL is exactly the time until the state equals an absent key.
    let policies = [
        policy(fixed(3, HOUR), 0, 0),
        policy(sliding(3, HOUR), 0, 0),
        policy(bucket(3, 1, HOUR), 0, 0),
    ];
    for policy in policies {
        let _: () = p.cmd(&["DEL", K]);
        let (_, e) = p.step(&policy, K, 0);
        assert!(e.write.is_none());
        assert_eq!(p.key_type(K), "none", "a peek creates nothing");
        for cost in [1, 5, 1, 1, 1, 0, 2] {
            let (r, e) = p.step(&policy, K, cost);
            if cost > 0 {
                let ttl = e.write.unwrap().ttl_ms;
                assert!(ttl > 0);
                if policy.algorithm() == Algorithm::FixedWindow {
                    assert_eq!(ttl, r.reset_at_ms - r.effective_now_ms);
                }
            }
        }
    }
}

#[test]
fn arithmetic_at_the_exact_integer_limit() {
    let (_redis, mut p) = start();

    // Fixed window: limit and cost 2^53 - 1; consumed + cost beyond 2^53 stays a denial.
    let policy_f = policy(fixed(MAX, MAX_PERIOD_MS), 1_000, MAX_SAFETY_MS);
    let (r, _) = p.step(&policy_f, K, MAX);
    assert_eq!((r.status, r.remaining), (Status::Allowed, 0));
    assert_eq!(p.step(&policy_f, K, 1).0.status, Status::Denied);
    for consumed in [1, MAX - 1] {
        let now = p.server_time_ms();
        let s = State::FixedWindow(fixed_window::State {
            last_observed_ms: now,
            window_id: now / MAX_PERIOD_MS,
            consumed,
        });
        p.put_state(&policy_f, K, &s, HOUR);
        let (r, _) = p.step(&policy_f, K, MAX);
        assert_eq!((r.status, r.remaining), (Status::Denied, MAX - consumed));
        let (r, _) = p.step(&policy_f, K, MAX - consumed);
        assert_eq!((r.status, r.remaining), (Status::Allowed, 0));
    }

    // Sliding window: window and limit at floor((2^53 - 1) / 10^6).
    let _: () = p.cmd(&["DEL", K]);
    let policy_s = policy(sliding(MAX_SCALED, MAX_SCALED), 1_000, MAX_SAFETY_MS);
    let now = p.server_time_ms();
    let cw = now / MAX_SCALED;
    for (pc, cc) in [
        (MAX_SCALED, 0),
        (MAX_SCALED, MAX_SCALED),
        (MAX_SCALED - 1, 1),
        (1, 0),
    ] {
        let s = State::SlidingWindow(sliding_window::State {
            last_observed_ms: now,
            previous_window_id: cw - 1,
            previous_count: pc,
            current_window_id: cw,
            current_count: cc,
        });
        for cost in [0, 1, MAX_SCALED / 2, MAX_SCALED, MAX_SCALED + 1, MAX] {
            p.put_state(&policy_s, K, &s, HOUR);
            p.step(&policy_s, K, cost);
        }
    }

    // Token bucket: capacity * period = 2^53 - 1 with one token per period.
    let _: () = p.cmd(&["DEL", K]);
    let (period, capacity) = (6361 * 69431, 20_394_401);
    let policy_b = policy(bucket(capacity, 1, period), 1_000, 0);
    let (r, e) = p.step(&policy_b, K, capacity);
    assert_eq!(
        (r.status, r.remaining, r.reset_at_ms),
        (Status::Allowed, 0, MAX)
    );
    assert_eq!(e.write.unwrap().ttl_ms, MAX);
    let (r, _) = p.step(&policy_b, K, 1);
    assert_eq!(r.status, Status::Denied);
    let now = p.server_time_ms();
    let s = State::TokenBucket(token_bucket::State {
        last_observed_ms: now - (3 * period - 1),
        tokens: capacity - 5,
        remainder: period - 1,
    });
    p.put_state(&policy_b, K, &s, HOUR);
    let (r, _) = p.step(&policy_b, K, 0);
    assert_eq!(r.remaining, capacity - 5 + 3);

    // Token bucket: period 1, refill 2^53 - 2 per ms, capacity 2^53 - 1.
    let _: () = p.cmd(&["DEL", K]);
    let policy_b = policy(bucket(MAX, MAX - 1, 1), 1_000, 1_000);
    let (r, _) = p.step(&policy_b, K, MAX);
    assert_eq!(r.status, Status::Allowed);
    let now = p.server_time_ms();
    for (tokens, ago) in [(0, 1), (0, 0), (1, 1), (MAX - 1, 5), (MAX - 1, 0)] {
        let s = State::TokenBucket(token_bucket::State {
            last_observed_ms: now - ago,
            tokens,
            remainder: 0,
        });
        for cost in [0, 1, MAX - 1, MAX] {
            p.put_state(&policy_b, K, &s, HOUR);
            p.step(&policy_b, K, cost);
        }
    }

    // Largest refill period with the largest rate it allows.
    let _: () = p.cmd(&["DEL", K]);
    let bound = MAX / MAX_PERIOD_MS;
    let policy_b = policy(bucket(bound, bound - 1, MAX_PERIOD_MS), 1_000, 1_000);
    let now = p.server_time_ms();
    for (tokens, remainder, ago) in [
        (0, MAX_PERIOD_MS - 1, MAX_PERIOD_MS - 1),
        (0, 0, 2 * MAX_PERIOD_MS),
        (bound - 1, 1, 1),
    ] {
        let s = State::TokenBucket(token_bucket::State {
            last_observed_ms: now - ago,
            tokens,
            remainder,
        });
        for cost in [0, 1, bound, bound + 1] {
            p.put_state(&policy_b, K, &s, HOUR);
            p.step(&policy_b, K, cost);
        }
    }
}

/// Arguments outside the validated bounds: the program answers INVALID, as the Rust function
/// does for the same raw arguments.
#[test]
fn invalid_arguments_are_refused_identically() {
    let (_redis, mut p) = start();
    let common = |cost: u64, regression: u64, grace: u64| CommonArgs {
        cost,
        max_clock_regression_ms: regression,
        cleanup_grace_ms: grace,
    };
    let argv = |c: &CommonArgs, tail: &[u64]| {
        let mut a = vec![
            "1".to_owned(),
            "vectors".to_owned(),
            "0123456789abcdef".to_owned(),
            c.cost.to_string(),
            c.max_clock_regression_ms.to_string(),
            c.cleanup_grace_ms.to_string(),
        ];
        a.extend(tail.iter().map(u64::to_string));
        a
    };
    let ok = common(1, 0, 0);
    let commons = [
        ok,
        common(MAX + 1, 0, 0),
        common(1, MAX_SAFETY_MS + 1, 0),
        common(1, 0, MAX_SAFETY_MS + 1),
    ];
    for c in commons {
        for (window_ms, limit) in [
            (1000, 5),
            (0, 5),
            (MAX_PERIOD_MS + 1, 5),
            (1000, MAX + 1),
            (MAX_SCALED + 1, 5),
            (1000, MAX_SCALED + 1),
        ] {
            let r = p.run_raw(Algorithm::FixedWindow, K, &argv(&c, &[window_ms, limit]));
            let params = fixed_window::Params { window_ms, limit };
            let e = fixed_window::evaluate(&params, &c, Stored::Absent, r.server_now_ms);
            assert_eq!(r, e.reply, "fixed {c:?} {params:?}");
            let _: () = p.cmd(&["DEL", K]);

            let r = p.run_raw(Algorithm::SlidingWindow, K, &argv(&c, &[window_ms, limit]));
            let params = sliding_window::Params { window_ms, limit };
            let e = sliding_window::evaluate(&params, &c, Stored::Absent, r.server_now_ms);
            assert_eq!(r, e.reply, "sliding {c:?} {params:?}");
            let _: () = p.cmd(&["DEL", K]);
        }
        let bound = MAX / 1000;
        for (refill_period_ms, refill_tokens, capacity) in [
            (1000, 1, 5),
            (0, 1, 5),
            (MAX_PERIOD_MS + 1, 1, 5),
            (1000, 0, 5),
            (1000, bound, 5),
            (1000, bound - 1, bound),
            (1000, 1, bound + 1),
            (1, MAX, 1),
            (1, 1, MAX + 1),
        ] {
            let r = p.run_raw(
                Algorithm::TokenBucket,
                K,
                &argv(&c, &[refill_period_ms, refill_tokens, capacity]),
            );
            let params = token_bucket::Params {
                refill_period_ms,
                refill_tokens,
                capacity,
            };
            let e = token_bucket::evaluate(&params, &c, Stored::Absent, r.server_now_ms);
            assert_eq!(r, e.reply, "bucket {c:?} {params:?}");
            let _: () = p.cmd(&["DEL", K]);
        }
    }
    // Syntax the Rust types cannot even express.
    for algorithm in [
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
        Algorithm::TokenBucket,
    ] {
        for (i, bad) in [
            (0, "2"),
            (1, ""),
            (2, ""),
            (3, "1e3"),
            (3, "-1"),
            (6, "1.5"),
        ] {
            let mut a = argv(&ok, &[1000, 5, 5]);
            a[i] = bad.to_owned();
            let r = p.run_raw(algorithm, K, &a);
            assert_eq!(
                r.status,
                Status::Invalid,
                "{algorithm:?} ARGV[{}]={bad:?}",
                i + 1
            );
            assert_eq!(p.key_type(K), "none");
        }
        let r = p.run_raw(algorithm, K, &argv(&ok, &[]));
        assert_eq!(r.status, Status::Invalid, "missing parameters");
    }
}

/// `PEXPIRE` calls Redis has counted (commands a script makes are counted too).
fn pexpire_calls(p: &mut Programs) -> u64 {
    let info: String = p.cmd(&["INFO", "commandstats"]);
    info.lines()
        .find_map(|l| l.strip_prefix("cmdstat_pexpire:calls="))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |n| n.parse().unwrap())
}

#[test]
fn a_window_sets_its_expiry_once_and_a_bucket_at_every_write() {
    let (_redis, mut p) = start();
    // Windows of an hour (the decisions below share one unless the test straddles an edge,
    // which the expected counts allow for), the default grace and regression bound.
    let defaults = (
        RateLimitPolicy::DEFAULT_MAX_CLOCK_REGRESSION_MS,
        RateLimitPolicy::DEFAULT_CLEANUP_GRACE_MS,
    );
    for (params, once) in [
        (fixed(1_000, HOUR), true),
        (sliding(1_000, HOUR), true),
        (bucket(1_000, 1, 1_000), false),
    ] {
        let policy = policy(params, defaults.0, defaults.1);
        let key = "rl:expiry";
        p.cmd::<()>(&["DEL", key]);
        p.cmd::<()>(&["CONFIG", "RESETSTAT"]);
        let first_window = p.server_time_ms() / HOUR;
        for _ in 0..10 {
            // Each step asserts the stored state and the expiry against the Rust mirror.
            let (reply, _) = p.step(&policy, key, 1);
            assert_eq!(reply.status, Status::Allowed, "{params:?}");
        }
        let windows = p.server_time_ms() / HOUR - first_window + 1;
        let calls = pexpire_calls(&mut p);
        if once {
            assert!(
                calls <= windows,
                "{params:?}: {calls} PEXPIRE in {windows} window(s)"
            );
            assert!(calls >= 1, "{params:?}: a new key gets an expiry");
        } else {
            assert_eq!(calls, 10, "{params:?}: every write");
        }
        assert!(p.pttl(key) > 0, "{params:?}: the key expires");
    }
    // A grace below the regression bound: a clamped first write could have set the expiry
    // early by more than the grace, so every write refreshes it.
    let short = policy(fixed(1_000, HOUR), 2_000, 1_000);
    p.cmd::<()>(&["DEL", "rl:short"]);
    p.cmd::<()>(&["CONFIG", "RESETSTAT"]);
    for _ in 0..10 {
        p.step(&short, "rl:short", 1);
    }
    assert_eq!(
        pexpire_calls(&mut p),
        10,
        "grace 1s below a 2s regression bound"
    );
}
