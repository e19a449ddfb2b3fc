//! One behavioural suite over every backend (embedded, Redis standalone, Redis Cluster): the
//! real binary, driven over gRPC. Every limit a request touches is decided together: a
//! request is admitted only if every enforced limit admits it, and then every limit consumes;
//! otherwise none does.

use crate::common;
use crate::on_every_backend;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::backends::{Backend, Deployment};
use common::server::{descriptor, request, OK, OVER_LIMIT};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;

const RELOAD_BOUND: Duration = Duration::from_secs(10);

/// Sleeps until just after the next whole second (windows are aligned to the epoch), so a
/// burst of requests falls inside one one-second window.
async fn next_second() {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    let into = now.subsec_millis() as u64;
    tokio::time::sleep(Duration::from_millis(1000 - into + 20)).await;
}

fn codes(r: &RateLimitResponse) -> Vec<i32> {
    r.statuses.iter().map(|s| s.code).collect()
}

fn remaining(r: &RateLimitResponse) -> Vec<u32> {
    r.statuses.iter().map(|s| s.limit_remaining).collect()
}

/// The shape of the shipped `policies/01-per-ip.yaml`: one rule, a per-second and a per-day
/// limit.
const SEVERAL_LIMITS: &str = r#"
domain: multi
descriptors:
  - key: ip
    rate_limits:
      - { unit: second, requests_per_unit: 3, name: per-second }
      - { unit: day, requests_per_unit: 10, name: per-day }
  - key: burst
    rate_limit: { unit: second, requests_per_unit: 3 }
  - key: daily
    rate_limit: { unit: day, requests_per_unit: 10 }
"#;

/// 10 requests in each of three consecutive seconds against [3/second, 10/day]: 3, 3, 3 are
/// allowed (the denials consume nothing, also not from the day), and the day has 1 left.
async fn denials_consume_no_limit_of_the_rule(backend: Backend) {
    let d = Deployment::start(backend, &[("multi.yaml", SEVERAL_LIMITS)]);
    let mut allowed = Vec::new();
    for _ in 0..3 {
        next_second().await;
        let mut ok = 0;
        for _ in 0..10 {
            let r = d
                .ask(request(
                    "multi",
                    vec![descriptor(&[("ip", "198.51.100.7")])],
                ))
                .await;
            if r.overall_code == OK {
                ok += 1;
            }
        }
        allowed.push(ok);
    }
    assert_eq!(allowed, vec![3, 3, 3], "{backend:?}");
    let r = d
        .ask(request(
            "multi",
            vec![descriptor(&[("ip", "198.51.100.7")])],
        ))
        .await;
    assert_eq!(r.overall_code, OVER_LIMIT, "the second's 3 are used");
    assert_eq!(r.statuses[0].limit_remaining, 0);
    if backend != Backend::Memory {
        let days: Vec<String> = d
            .stored()
            .into_iter()
            .filter(|(_, h)| h.iter().any(|(k, v)| k == "p" && v.ends_with("per-day")))
            .filter_map(|(_, h)| h.into_iter().find(|(k, _)| k == "c").map(|(_, v)| v))
            .collect();
        assert_eq!(
            days,
            vec!["9".to_owned()],
            "the day counted the 9 allowed only"
        );
    }
}
on_every_backend!(
    several_limits_of_one_rule,
    denials_consume_no_limit_of_the_rule
);

/// The same with the two limits on two descriptors of one request (on Cluster their keys are
/// on different slots: checked on every slot, then committed).
async fn denials_consume_no_limit_of_the_request(backend: Backend) {
    let d = Deployment::start(backend, &[("multi.yaml", SEVERAL_LIMITS)]);
    let both = || {
        request(
            "multi",
            vec![
                descriptor(&[("daily", "client-1")]),
                descriptor(&[("burst", "client-1")]),
            ],
        )
    };
    let mut allowed = Vec::new();
    for _ in 0..3 {
        next_second().await;
        let mut ok = 0;
        for _ in 0..10 {
            let r = d.ask(both()).await;
            if r.overall_code == OK {
                ok += 1;
            } else {
                // The per-second limit denies; the day admitted and reports what it has now.
                assert_eq!(codes(&r), vec![OK, OVER_LIMIT]);
            }
        }
        allowed.push(ok);
    }
    assert_eq!(allowed, vec![3, 3, 3], "{backend:?}");
    next_second().await;
    let r = d.ask(both()).await;
    assert_eq!(
        (r.overall_code, remaining(&r)),
        (OK, vec![0, 2]),
        "9 + 1 of the day used"
    );
    let r = d.ask(both()).await;
    assert_eq!(codes(&r), vec![OVER_LIMIT, OK], "the day denies now");
    assert_eq!(remaining(&r), vec![0, 2], "and the second consumed nothing");
}
on_every_backend!(
    several_descriptors_of_one_request,
    denials_consume_no_limit_of_the_request
);

/// The same descriptor twice in one request is counted in request order, every time.
async fn the_same_descriptor_twice_is_counted_in_order(backend: Backend) {
    let d = Deployment::start(backend, &[("multi.yaml", SEVERAL_LIMITS)]);
    let twice = || {
        request(
            "multi",
            vec![
                descriptor(&[("daily", "twice")]),
                descriptor(&[("daily", "twice")]),
            ],
        )
    };
    for i in 0..5u32 {
        let r = d.ask(twice()).await;
        assert_eq!(r.overall_code, OK);
        assert_eq!(remaining(&r), vec![9 - 2 * i, 8 - 2 * i], "request {i}");
    }
    // 0 left: the first takes the last unit, the second finds none; nothing is consumed.
    let r = d.ask(twice()).await;
    assert_eq!(codes(&r), vec![OVER_LIMIT, OVER_LIMIT]);
    let one = d
        .ask(request("multi", vec![descriptor(&[("daily", "twice")])]))
        .await;
    assert_eq!((one.overall_code, remaining(&one)), (OVER_LIMIT, vec![0]));
}
on_every_backend!(
    the_same_descriptor_twice,
    the_same_descriptor_twice_is_counted_in_order
);

const SHADOW: &str = r#"
domain: shadow
descriptors:
  - key: enforced
    rate_limit: { unit: day, requests_per_unit: 3 }
  - key: trial
    shadow_mode: true
    rate_limit: { unit: day, requests_per_unit: 1 }
"#;

/// A shadow limit never changes the decision. It counts the requests that are admitted and
/// that it would itself admit; its would-be denials, and requests denied by an enforced
/// limit, cost it nothing.
async fn shadow_limits_count_only_what_they_would_admit(backend: Backend) {
    let d = Deployment::start(backend, &[("shadow.yaml", SHADOW)]);
    let ask = || {
        d.ask(request(
            "shadow",
            vec![
                descriptor(&[("enforced", "u")]),
                descriptor(&[("trial", "u")]),
            ],
        ))
    };
    let r = ask().await;
    assert_eq!(
        (r.overall_code, remaining(&r)),
        (OK, vec![2, 0]),
        "the trial counted it"
    );
    let r = ask().await;
    assert_eq!(r.overall_code, OK, "a shadow denial does not deny");
    assert_eq!(codes(&r), vec![OK, OK], "shadow statuses are OK");
    let r = ask().await;
    assert_eq!((r.overall_code, remaining(&r)), (OK, vec![0, 0]));
    let r = ask().await;
    assert_eq!(codes(&r), vec![OVER_LIMIT, OK], "the enforced limit denies");
    assert_eq!(
        d.metric("edgelimit_decisions_total", &[("result", "shadow_denied")]),
        3.0
    );
}
on_every_backend!(
    shadow_limits,
    shadow_limits_count_only_what_they_would_admit
);

fn limits_policy(fixed: u64, bucket_rate: u64, burst: u64, unit: &str) -> String {
    format!(
        "domain: reload\ndescriptors:\n  - key: fixed\n    rate_limit: {{ unit: {unit}, requests_per_unit: {fixed} }}\n  - key: bucket\n    rate_limit: {{ algorithm: token_bucket, unit: hour, requests_per_unit: {bucket_rate}, burst: {burst} }}\n  - key: sliding\n    rate_limit: {{ algorithm: sliding_window, unit: hour, requests_per_unit: {fixed} }}\n"
    )
}

async fn left(d: &Deployment, key: &str) -> (i32, u32, u32) {
    let r = d
        .ask(request("reload", vec![descriptor(&[(key, "u")])]))
        .await;
    let s = &r.statuses[0];
    (
        r.overall_code,
        s.limit_remaining,
        s.current_limit.as_ref().map_or(0, |l| l.requests_per_unit),
    )
}

/// Writes the policy and waits until a peek (`hits_addend: 0`, consumes nothing) at `fixed`
/// reports the new limit and unit.
async fn reload(d: &Deployment, text: &str, expect: (u32, i32)) {
    d.server.write_policy("reload.yaml", text);
    let deadline = std::time::Instant::now() + RELOAD_BOUND;
    loop {
        let mut peek = descriptor(&[("fixed", "u")]);
        peek.hits_addend = Some(envoy_types::pb::google::protobuf::UInt64Value { value: 0 });
        let r = d.ask(request("reload", vec![peek])).await;
        let now = r.statuses[0]
            .current_limit
            .as_ref()
            .map(|l| (l.requests_per_unit, l.unit));
        if now == Some(expect) {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "reload not applied ({now:?}):\n{}",
            d.server.log_text()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

const HOUR: i32 = 3;
const MINUTE: i32 = 2;

/// A new number keeps the counter (fixed and sliding windows: the count; token bucket: the
/// tokens, clamped to a lowered burst); a new window length or algorithm starts afresh.
async fn counters_survive_number_changes(backend: Backend) {
    let d = Deployment::start(backend, &[("reload.yaml", &limits_policy(2, 5, 5, "hour"))]);
    assert_eq!(left(&d, "fixed").await, (OK, 1, 2));
    assert_eq!(left(&d, "fixed").await, (OK, 0, 2));
    assert_eq!(left(&d, "sliding").await, (OK, 1, 2));
    for _ in 0..2 {
        left(&d, "bucket").await;
    }
    // 2/hour -> 5/hour: 2 used, so the next leaves 2; the bucket keeps its 3 tokens.
    reload(&d, &limits_policy(5, 7, 5, "hour"), (5, HOUR)).await;
    assert_eq!(left(&d, "fixed").await, (OK, 2, 5));
    assert_eq!(left(&d, "sliding").await, (OK, 3, 5));
    assert_eq!(
        left(&d, "bucket").await,
        (OK, 2, 7),
        "3 tokens kept, one taken"
    );
    // A lower limit than what was used: denied until the window ends, nothing lost.
    reload(&d, &limits_policy(2, 7, 1, "hour"), (2, HOUR)).await;
    assert_eq!(left(&d, "fixed").await, (OVER_LIMIT, 0, 2));
    assert_eq!(
        left(&d, "bucket").await,
        (OK, 0, 7),
        "2 tokens clamped to a burst of 1"
    );
    // A new window length: a fresh counter.
    reload(&d, &limits_policy(2, 7, 1, "minute"), (2, MINUTE)).await;
    assert_eq!(left(&d, "fixed").await, (OK, 1, 2));
}
on_every_backend!(counters_across_reloads, counters_survive_number_changes);
