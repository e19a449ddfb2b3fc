//! A subject that cannot pass is denied by the server itself, with no Redis call, until the
//! last answer's bound allows one — and is never allowed locally.

use crate::common;

use std::time::Duration;

use common::redis_server::RedisServer;
use common::server::{
    call, descriptor, metric, request, EdgelimitServer, ServerOptions, OK, OVER_LIMIT,
};

const POLICY: &str = r#"
domain: hot
descriptors:
  - key: bucket
    rate_limit: { algorithm: token_bucket, unit: second, requests_per_unit: 2, burst: 1 }
  - key: window
    rate_limit: { unit: hour, requests_per_unit: 3 }
"#;

/// Program calls Redis has run (EVALSHA and EVAL).
fn program_calls(redis: &RedisServer) -> u64 {
    let stats = redis.cli(&["INFO", "commandstats"]);
    stats
        .lines()
        .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:"))
        .filter_map(|l| {
            l.split(',')
                .find_map(|f| f.split_once("calls=").map(|(_, n)| n.parse::<u64>().ok()))
                .flatten()
        })
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hot_subject_over_its_limit_costs_no_redis_call_until_its_bound_allows_one() {
    let redis = RedisServer::start();
    let server =
        EdgelimitServer::start(ServerOptions::redis(&redis.url(), &[("hot.yaml", POLICY)]));
    let mut client = server.client().await;
    let ask = |key: &'static str| request("hot", vec![descriptor(&[(key, "abuser")])]);

    // Fixed window of 3 per hour: three allowed, then nothing reaches Redis.
    for _ in 0..3 {
        assert_eq!(
            call(&mut client, ask("window")).await.unwrap().overall_code,
            OK
        );
    }
    let before = program_calls(&redis);
    for _ in 0..50 {
        let r = call(&mut client, ask("window")).await.unwrap();
        assert_eq!(r.overall_code, OVER_LIMIT);
        assert_eq!(r.statuses[0].limit_remaining, 0);
        let reset = r.statuses[0].duration_until_reset.unwrap();
        assert!(
            (0..=3600).contains(&reset.seconds),
            "the window end: {reset:?}"
        );
        assert!(
            r.response_headers_to_add
                .iter()
                .any(|h| h.key == "Retry-After"),
            "the same headers"
        );
    }
    assert_eq!(
        program_calls(&redis),
        before,
        "no Redis call for a subject that cannot pass"
    );

    // Token bucket of 1 refilled at 2 per second: denied locally for the ~500 ms the refill
    // takes, then asked again and allowed.
    assert_eq!(
        call(&mut client, ask("bucket")).await.unwrap().overall_code,
        OK
    );
    assert_eq!(
        call(&mut client, ask("bucket")).await.unwrap().overall_code,
        OVER_LIMIT
    );
    let before = program_calls(&redis);
    for _ in 0..20 {
        assert_eq!(
            call(&mut client, ask("bucket")).await.unwrap().overall_code,
            OVER_LIMIT
        );
    }
    assert_eq!(program_calls(&redis), before);
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(
        call(&mut client, ask("bucket")).await.unwrap().overall_code,
        OK
    );
    assert_eq!(
        program_calls(&redis),
        before + 1,
        "asked once the bound allowed it"
    );

    let hits = metric(&server.metrics(), "edgelimit_deny_cache_hits_total", &[]).unwrap_or(0.0);
    assert!(hits >= 70.0, "{hits} local denials");
}
