//! Operations end to end, against the real binary and private redis-server processes:
//! metrics, health endpoints, hot reload, graceful shutdown. Every wait is bounded; no test
//! asserts a wall-clock duration.

mod common;

use std::time::Duration;

use common::redis_server::RedisServer;
use common::server::{
    call, descriptor, metric, request, wait_until, EdgelimitServer, ServerOptions, OK, OVER_LIMIT,
};

const BOUND: Duration = Duration::from_secs(15);

fn limit_policy(domain: &str, name: &str, per_hour: u32) -> String {
    format!(
        "domain: {domain}\ndescriptors:\n  - key: user\n    rate_limit:\n      name: {name}\n      unit: hour\n      requests_per_unit: {per_hour}\n"
    )
}

/// The `limit` of the first row of `/admin/policies` whose policy id is `id`.
fn admin_limit(server: &EdgelimitServer, id: &str) -> Option<u64> {
    let (status, body) = server.admin_get("/admin/policies");
    assert_eq!(status, 200, "{body}");
    let view: serde_json::Value = serde_json::from_str(&body).expect("admin JSON");
    view["limits"]
        .as_array()?
        .iter()
        .find(|l| l["policy_id"] == id)?["limit"]
        .as_u64()
}

fn reloads(server: &EdgelimitServer, result: &str) -> f64 {
    metric(
        &server.metrics(),
        "edgelimit_config_reloads_total",
        &[("result", result)],
    )
    .unwrap_or(0.0)
}

async fn remaining(server: &EdgelimitServer, domain: &str, user: &str) -> (i32, u32, u32) {
    let mut client = server.client().await;
    let r = call(
        &mut client,
        request(domain, vec![descriptor(&[("user", user)])]),
    )
    .await
    .expect("call");
    let s = &r.statuses[0];
    let limit = s.current_limit.as_ref().map_or(0, |l| l.requests_per_unit);
    (r.overall_code, s.limit_remaining, limit)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_move_with_requests_and_labels_stay_bounded() {
    let redis = RedisServer::start();
    let server = EdgelimitServer::start(ServerOptions::redis(
        &redis.url(),
        &[("m.yaml", &limit_policy("metered", "five", 5))],
    ));
    let text = server.metrics();
    assert_eq!(
        metric(&text, "edgelimit_build_info", &[]),
        Some(1.0),
        "{text}"
    );
    assert!(metric(&text, "edgelimit_config_revision", &[]).is_some_and(|v| v > 0.0));
    assert_eq!(metric(&text, "edgelimit_config_rules", &[]), Some(1.0));

    let mut client = server.client().await;
    let raw = "alice-raw-identity-7f3a";
    for _ in 0..6 {
        call(
            &mut client,
            request("metered", vec![descriptor(&[("user", raw)])]),
        )
        .await
        .expect("call");
    }
    // An unconfigured domain must not create a label.
    call(
        &mut client,
        request("unconfigured-domain-x", vec![descriptor(&[("user", raw)])]),
    )
    .await
    .expect("call");

    let text = server.metrics();
    let id = "metered.five";
    let decisions = |result| {
        metric(
            &text,
            "edgelimit_decisions_total",
            &[("policy", id), ("result", result)],
        )
    };
    assert_eq!(decisions("allowed"), Some(5.0), "{text}");
    assert_eq!(decisions("denied"), Some(1.0), "{text}");
    // Remaining 1 and 0 of 5 are within 20% of the limit.
    assert_eq!(
        metric(&text, "edgelimit_near_limit_total", &[("policy", id)]),
        Some(2.0),
        "{text}"
    );
    assert!(
        metric(&text, "edgelimit_grpc_request_seconds_count", &[]).is_some_and(|n| n >= 7.0),
        "{text}"
    );
    assert!(
        text.contains("edgelimit_grpc_request_seconds_bucket{le=\"0.0001\"}"),
        "histograms have explicit buckets: {text}"
    );
    // Five reach Redis; the sixth is denied here: the fifth answer said nothing was left in
    // this window (the local deny cache).
    assert_eq!(
        metric(
            &text,
            "edgelimit_redis_command_seconds_count",
            &[("program", "rate-fixed-window-v1")]
        ),
        Some(5.0),
        "{text}"
    );
    assert_eq!(
        metric(&text, "edgelimit_deny_cache_hits_total", &[]),
        Some(1.0),
        "{text}"
    );
    assert!(!text.contains(raw) && !text.contains("unconfigured-domain-x"));
    assert!(wait_until(BOUND, || {
        metric(&server.metrics(), "edgelimit_redis_live_connections", &[]).is_some_and(|n| n >= 1.0)
    }));

    let (status, body) = server.admin_get("/admin/policies");
    assert_eq!(status, 200);
    assert!(body.contains("\"policy_id\": \"metered.five\""), "{body}");
    assert!(!body.contains(common::server::TEST_SECRET));
    assert!(!server.log_text().contains(raw), "raw value in the log");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_and_grpc_health_follow_redis() {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::health_client::HealthClient;
    use tonic_health::pb::HealthCheckRequest;

    let mut redis = RedisServer::start();
    let server = EdgelimitServer::start(ServerOptions::redis(
        &redis.url(),
        &[("r.yaml", &limit_policy("ready", "r", 5))],
    ));
    let channel =
        tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{}", server.grpc_port))
            .expect("endpoint")
            .connect()
            .await
            .expect("health channel");
    let mut health = HealthClient::new(channel);
    let grpc_status = |h: &mut HealthClient<tonic::transport::Channel>| {
        let mut h = h.clone();
        async move {
            h.check(HealthCheckRequest {
                service: String::new(),
            })
            .await
            .map(|r| r.into_inner().status)
            .unwrap_or(-1)
        }
    };
    assert_eq!(server.admin_get("/healthz").0, 200);
    assert!(
        wait_until(BOUND, || server.admin_get("/readyz").0 == 200),
        "{}",
        server.log_text()
    );
    assert_eq!(
        grpc_status(&mut health).await,
        ServingStatus::Serving as i32
    );

    redis.stop();
    assert!(wait_until(BOUND, || server.admin_get("/readyz").0 == 503));
    let (_, body) = server.admin_get("/readyz");
    assert!(body.starts_with("not ready: backend"), "{body}");
    assert_eq!(body.lines().count(), 1, "one-line reason: {body}");
    assert_eq!(
        grpc_status(&mut health).await,
        ServingStatus::NotServing as i32
    );
    assert_eq!(
        server.admin_get("/healthz").0,
        200,
        "liveness is unaffected"
    );

    redis.restart();
    assert!(
        wait_until(BOUND, || server.admin_get("/readyz").0 == 200),
        "{}",
        server.log_text()
    );
    assert_eq!(
        grpc_status(&mut health).await,
        ServingStatus::Serving as i32
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn edited_policy_takes_effect_and_unchanged_counters_survive() {
    let redis = RedisServer::start();
    let server = EdgelimitServer::start(ServerOptions::redis(
        &redis.url(),
        &[
            ("a.yaml", &limit_policy("a", "a-limit", 3)),
            ("b.yaml", &limit_policy("b", "b-limit", 10)),
        ],
    ));
    assert_eq!(remaining(&server, "a", "u").await, (OK, 2, 3));
    assert_eq!(remaining(&server, "b", "u").await, (OK, 9, 10));
    assert_eq!(remaining(&server, "b", "u").await, (OK, 8, 10));
    let keys_before = redis.cli(&["--raw", "KEYS", "*"]);

    server.write_policy("a.yaml", &limit_policy("a", "a-limit", 7));
    assert!(
        wait_until(BOUND, || admin_limit(&server, "a.a-limit") == Some(7)),
        "{}",
        server.log_text()
    );
    // A new number keeps `a`'s counter (one used, now of 7); `b` keeps its own.
    assert_eq!(remaining(&server, "a", "u").await, (OK, 5, 7));
    assert_eq!(remaining(&server, "b", "u").await, (OK, 7, 10));
    let keys_after = redis.cli(&["--raw", "KEYS", "*"]);
    for key in keys_before.lines().filter(|k| !k.is_empty()) {
        assert!(keys_after.contains(key), "{key} vanished: {keys_after}");
    }
    assert_eq!(keys_after.lines().filter(|k| !k.is_empty()).count(), 2);

    // SIGHUP reloads too (here: an unchanged set, which still counts as a success).
    let before = reloads(&server, "success");
    server.signal("-HUP");
    assert!(wait_until(BOUND, || reloads(&server, "success") > before));
    assert_eq!(remaining(&server, "b", "u").await, (OK, 6, 10));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broken_policy_keeps_the_old_set_and_counts_a_failure() {
    let redis = RedisServer::start();
    let server = EdgelimitServer::start(ServerOptions::redis(
        &redis.url(),
        &[("a.yaml", &limit_policy("a", "a-limit", 3))],
    ));
    assert_eq!(remaining(&server, "a", "u").await, (OK, 2, 3));
    server.write_policy(
        "a.yaml",
        "domain: a\ndescriptors:\n  - key: user\n    rate_limit:\n      unit: fortnight\n      requests_per_unit: 1\n",
    );
    assert!(
        wait_until(BOUND, || reloads(&server, "failure") >= 1.0),
        "{}",
        server.log_text()
    );
    let log = server.log_text();
    assert!(log.contains("a.yaml:5:"), "error with file:line: {log}");
    assert_eq!(admin_limit(&server, "a.a-limit"), Some(3));
    assert_eq!(remaining(&server, "a", "u").await, (OK, 1, 3));
    assert_eq!(server.admin_get("/readyz").0, 200, "still ready");

    server.write_policy("a.yaml", &limit_policy("a", "a-limit", 4));
    assert!(wait_until(BOUND, || admin_limit(&server, "a.a-limit") == Some(4)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn configmap_symlink_swap_takes_effect() {
    let redis = RedisServer::start();
    let server = EdgelimitServer::start(
        ServerOptions::redis(&redis.url(), &[("a.yaml", &limit_policy("a", "cm", 3))]).configmap(),
    );
    assert_eq!(remaining(&server, "a", "u").await, (OK, 2, 3));
    server.configmap_swap(&[("a.yaml", &limit_policy("a", "cm", 9))], 1);
    assert!(
        wait_until(BOUND, || admin_limit(&server, "a.cm") == Some(9)),
        "{}",
        server.log_text()
    );
    // The count survives the swap: only the number changed.
    assert_eq!(remaining(&server, "a", "u").await, (OK, 7, 9));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_reports_not_ready_finishes_in_flight_requests_and_exits_zero() {
    let redis = RedisServer::start();
    let mut server = EdgelimitServer::start(
        ServerOptions::redis(&redis.url(), &[("a.yaml", &limit_policy("a", "t", 3))])
            .redis_setting("command_timeout", "4s"),
    );
    assert!(wait_until(BOUND, || server.admin_get("/readyz").0 == 200));
    let mut client = server.client().await;
    // A stalled Redis holds the request in flight until it is resumed.
    redis.pause();
    let in_flight = tokio::spawn(async move {
        let mut r = tonic::Request::new(request("a", vec![descriptor(&[("user", "u")])]));
        r.set_timeout(Duration::from_secs(30));
        client.should_rate_limit(r).await.map(|r| r.into_inner())
    });
    let seen_in_flight = wait_until(BOUND, || {
        metric(&server.metrics(), "edgelimit_redis_in_flight", &[]).is_some_and(|n| n >= 1.0)
    });
    assert!(seen_in_flight, "{}", server.log_text());

    server.signal("-TERM");
    assert!(wait_until(BOUND, || {
        common::server::http_get(server.admin_port, "/readyz")
            .is_ok_and(|(s, b)| s == 503 && b.contains("shutting down"))
    }));
    redis.resume();
    let answer = in_flight
        .await
        .expect("join")
        .expect("the in-flight request is answered, not cut");
    assert!(
        answer.overall_code == OK || answer.overall_code == OVER_LIMIT,
        "{answer:?}"
    );
    let status = server.wait_exit(BOUND).expect("exits by itself");
    assert!(status.success(), "{status}\n{}", server.log_text());
}
