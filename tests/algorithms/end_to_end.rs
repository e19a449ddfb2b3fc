//! Every algorithm selected from YAML, through the real binary, on both backends: the same
//! requests get the same answers from Redis and from the embedded backend.

use crate::common;

use common::redis_server::RedisServer;
use common::server::{call, descriptor, request, EdgelimitServer, ServerOptions, OK, OVER_LIMIT};

const POLICY: &str = r#"
domain: algos
descriptors:
  - key: fixed
    rate_limit: { unit: hour, requests_per_unit: 3 }
  - key: sliding
    rate_limit: { algorithm: sliding_window, unit: hour, requests_per_unit: 3 }
  - key: bucket
    rate_limit: { algorithm: token_bucket, unit: hour, requests_per_unit: 1, burst: 3 }
"#;

/// (overall code, limit_remaining, seconds until reset) for 5 requests on one subject.
async fn sequence(server: &EdgelimitServer, key: &str) -> Vec<(i32, u32)> {
    let mut client = server.client().await;
    let mut out = Vec::new();
    for _ in 0..5 {
        let r = call(
            &mut client,
            request("algos", vec![descriptor(&[(key, "s1")])]),
        )
        .await
        .expect("call");
        let status = &r.statuses[0];
        assert!(status.current_limit.is_some());
        let reset = status.duration_until_reset.as_ref().expect("reset");
        // Token bucket: time to full is 3 tokens at 1 per hour.
        assert!(reset.seconds <= 3 * 3600, "{key}: {reset:?}");
        out.push((r.overall_code, status.limit_remaining));
    }
    out
}

const EXPECTED: [(i32, u32); 5] = [(OK, 2), (OK, 1), (OK, 0), (OVER_LIMIT, 0), (OVER_LIMIT, 0)];

#[tokio::test]
async fn redis_and_memory_backends_agree_for_every_algorithm() {
    let redis = RedisServer::start();
    let on_redis =
        EdgelimitServer::start(ServerOptions::redis(&redis.url(), &[("a.yaml", POLICY)]));
    let in_memory = EdgelimitServer::start(ServerOptions::memory(&[("a.yaml", POLICY)]));
    for key in ["fixed", "sliding", "bucket"] {
        let a = sequence(&on_redis, key).await;
        let b = sequence(&in_memory, key).await;
        assert_eq!(a, EXPECTED, "redis, {key}");
        assert_eq!(b, EXPECTED, "memory, {key}");
    }
    // One hash per algorithm and subject, each with a TTL.
    let keys = redis.cli(&["--raw", "KEYS", "*"]);
    let keys: Vec<&str> = keys.lines().filter(|l| !l.is_empty()).collect();
    assert_eq!(keys.len(), 3, "{keys:?}");
    for key in keys {
        let ttl: i64 = redis.cli(&["PTTL", key]).trim().parse().unwrap();
        assert!(ttl > 0, "{key} has no TTL");
        let algorithm = redis.cli(&["--raw", "HGET", key, "a"]);
        assert!(
            ["fixed_window", "sliding_window", "token_bucket"].contains(&algorithm.trim()),
            "{algorithm}"
        );
    }
}

#[tokio::test]
async fn the_quick_start_command_serves_the_example_policies_in_memory() {
    // README: `edgelimit serve --policy-dir policies` — no Redis, the shipped policies.
    let policies_dir = concat!(env!("CARGO_MANIFEST_DIR"), "/policies");
    let mut policies = Vec::new();
    for entry in std::fs::read_dir(policies_dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        policies.push((name, std::fs::read_to_string(&path).unwrap()));
    }
    let refs: Vec<(&str, &str)> = policies
        .iter()
        .map(|(n, t)| (n.as_str(), t.as_str()))
        .collect();
    let server = EdgelimitServer::start(ServerOptions::memory(&refs));
    assert!(
        server.log_text().contains("local to this process"),
        "the embedded backend says its limits are local:\n{}",
        server.log_text()
    );
    let mut client = server.client().await;
    let ask = || {
        request(
            "edge",
            vec![descriptor(&[("remote_address", "203.0.113.7")])],
        )
    };
    let r = call(&mut client, ask()).await.unwrap();
    assert_eq!(r.overall_code, OK);
    let limit = r.statuses[0].current_limit.as_ref().unwrap();
    assert_eq!(limit.name, "edge-ip-per-second");
    let mut over = 0;
    for _ in 0..40 {
        if call(&mut client, ask()).await.unwrap().overall_code == OVER_LIMIT {
            over += 1;
        }
    }
    assert!(
        over > 0,
        "20 per second must deny some of 41 quick requests"
    );
}
