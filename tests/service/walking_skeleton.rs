//! End to end: Envoy request → policy → Redis fixed window (Lua) → Envoy response, against a
//! private redis-server and the real binary.

use crate::common;

use common::redis_server::RedisServer;
use common::server::{call, descriptor, request, EdgelimitServer, ServerOptions, OK, OVER_LIMIT};

const POLICY: &str = r#"
domain: skeleton
descriptors:
  - key: user
    rate_limit:
      unit: hour
      requests_per_unit: 3
"#;

#[tokio::test]
async fn fixed_window_counts_denies_without_consuming_and_keeps_keys_private() {
    let redis = RedisServer::start();
    let server = EdgelimitServer::start(ServerOptions::redis(
        &redis.url(),
        &[("skeleton.yaml", POLICY)],
    ));
    let mut client = server.client().await;
    let alice = || {
        request(
            "skeleton",
            vec![descriptor(&[("user", "alice-raw-identity")])],
        )
    };

    let mut remaining = Vec::new();
    for _ in 0..3 {
        let r = call(&mut client, alice()).await.expect("call");
        assert_eq!(r.overall_code, OK, "{r:?}\n{}", server.log_text());
        let status = &r.statuses[0];
        assert_eq!(status.code, OK);
        let limit = status.current_limit.as_ref().expect("current_limit");
        assert_eq!(limit.requests_per_unit, 3);
        assert_eq!(limit.unit, 3, "HOUR");
        assert!(status.duration_until_reset.as_ref().unwrap().seconds <= 3600);
        remaining.push(status.limit_remaining);
    }
    assert_eq!(remaining, vec![2, 1, 0]);

    for _ in 0..5 {
        let r = call(&mut client, alice()).await.expect("call");
        assert_eq!(r.overall_code, OVER_LIMIT);
        assert_eq!(r.statuses[0].code, OVER_LIMIT);
        assert_eq!(r.statuses[0].limit_remaining, 0);
        let retry = r
            .response_headers_to_add
            .iter()
            .find(|h| h.key == "Retry-After")
            .expect("Retry-After on denial");
        assert!(retry.value.parse::<u64>().unwrap() >= 1);
    }

    // Denied requests consumed nothing: the stored count is still the limit.
    let keys = redis.cli(&["--raw", "KEYS", "*"]);
    let keys: Vec<&str> = keys.lines().filter(|l| !l.is_empty()).collect();
    assert_eq!(keys.len(), 1, "{keys:?}");
    assert_eq!(redis.cli(&["--raw", "HGET", keys[0], "c"]).trim(), "3");
    let ttl: i64 = redis.cli(&["PTTL", keys[0]]).trim().parse().unwrap();
    assert!(ttl > 0, "state must expire, PTTL {ttl}");

    // No raw descriptor value, key or domain-value pair in any key or stored field.
    assert!(keys[0].starts_with("edgelimit:rate:"), "{}", keys[0]);
    for text in [
        keys[0].to_string(),
        redis.cli(&["--raw", "HGETALL", keys[0]]),
    ] {
        assert!(!text.contains("alice"), "raw value leaked: {text}");
    }

    // A different subject has its own counter.
    let bob = request("skeleton", vec![descriptor(&[("user", "bob")])]);
    let r = call(&mut client, bob).await.unwrap();
    assert_eq!((r.overall_code, r.statuses[0].limit_remaining), (OK, 2));

    // Losing the script cache (restart, failover, SCRIPT FLUSH) costs one resend, not a failure.
    assert_eq!(redis.cli(&["SCRIPT", "FLUSH"]).trim(), "OK");
    let carol = request("skeleton", vec![descriptor(&[("user", "carol")])]);
    let r = call(&mut client, carol).await.unwrap();
    assert_eq!((r.overall_code, r.statuses[0].limit_remaining), (OK, 2));
    let r = call(&mut client, alice()).await.unwrap();
    assert_eq!(
        r.overall_code, OVER_LIMIT,
        "state survives the script flush"
    );
}

#[tokio::test]
async fn unknown_domain_and_unmatched_descriptors_are_ok_without_a_limit() {
    let redis = RedisServer::start();
    let server = EdgelimitServer::start(ServerOptions::redis(
        &redis.url(),
        &[("skeleton.yaml", POLICY)],
    ));
    let mut client = server.client().await;
    let r = call(
        &mut client,
        request("nobody", vec![descriptor(&[("user", "x")])]),
    )
    .await
    .unwrap();
    assert_eq!(r.overall_code, OK);
    assert_eq!(r.statuses.len(), 1);
    assert!(r.statuses[0].current_limit.is_none());
    let r = call(
        &mut client,
        request("skeleton", vec![descriptor(&[("other", "x")])]),
    )
    .await
    .unwrap();
    assert_eq!(r.overall_code, OK);
    assert!(r.statuses[0].current_limit.is_none());
    assert_eq!(
        redis.cli(&["DBSIZE"]).trim(),
        "0",
        "nothing evaluated, nothing stored"
    );
}

#[tokio::test]
async fn redis_down_fails_closed_as_over_limit() {
    let mut redis = RedisServer::start();
    let server = EdgelimitServer::start(ServerOptions::redis(
        &redis.url(),
        &[("skeleton.yaml", POLICY)],
    ));
    let mut client = server.client().await;
    let r = call(
        &mut client,
        request("skeleton", vec![descriptor(&[("user", "a")])]),
    )
    .await
    .unwrap();
    assert_eq!(r.overall_code, OK);
    redis.stop();
    for _ in 0..5 {
        let r = call(
            &mut client,
            request("skeleton", vec![descriptor(&[("user", "a")])]),
        )
        .await
        .expect("fail closed is an answer, not an error");
        assert_eq!(r.overall_code, OVER_LIMIT, "{r:?}");
    }
}
