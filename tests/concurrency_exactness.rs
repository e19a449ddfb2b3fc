//! Exactness under contention, at default settings: three edgelimit processes share one
//! Redis; 600 concurrent requests for one subject against a limit of 100 are allowed exactly
//! 100 times (fixed window, token bucket), and never more than 100 times (sliding window,
//! approximate). Overload is shed before sending (nothing consumed), never after: a command
//! that timed out after dispatch would consume quota for a denied request.

mod common;

use std::time::Duration;

use common::fault_load::call_with_timeout;
use common::redis_server::RedisServer;
use common::server::{descriptor, metric, request, EdgelimitServer, ServerOptions, OK, OVER_LIMIT};

const LIMIT: u64 = 100;
const SERVERS: usize = 3;
const CONCURRENT_PER_SERVER: usize = 200; // 3 × 200 = 600 requests in flight at once
/// Client connections per server: HTTP/2 allows 100 streams on each.
const CHANNELS_PER_SERVER: usize = 4;
const ROUNDS: usize = 3;

const POLICY: &str = r#"
domain: exact
descriptors:
  - key: fixed
    rate_limit:
      unit: day
      requests_per_unit: 100
  - key: bucket
    rate_limit:
      algorithm: token_bucket
      unit: day
      requests_per_unit: 1
      burst: 100
  - key: sliding
    rate_limit:
      algorithm: sliding_window
      unit: day
      requests_per_unit: 100
"#;

/// What the servers counted as failures so far (printed when a round misses).
fn failures(servers: &[EdgelimitServer]) -> String {
    let mut out = String::new();
    for (i, server) in servers.iter().enumerate() {
        for line in server.metrics().lines() {
            if line.starts_with("edgelimit_backend_failures_total") {
                out.push_str(&format!("server {i}: {line}\n"));
            }
        }
    }
    out
}

/// Fires every request at once across all servers; returns (OK, OVER_LIMIT) counts.
async fn storm(servers: &[EdgelimitServer], key: &str, subject: &str) -> (u64, u64) {
    let mut tasks = Vec::new();
    for server in servers {
        let mut clients = Vec::new();
        for _ in 0..CHANNELS_PER_SERVER {
            clients.push(server.client().await);
        }
        for i in 0..CONCURRENT_PER_SERVER {
            let mut client = clients[i % CHANNELS_PER_SERVER].clone();
            let req = request("exact", vec![descriptor(&[(key, subject)])]);
            tasks.push(tokio::spawn(async move {
                call_with_timeout(&mut client, req, Duration::from_secs(10)).await
            }));
        }
    }
    let (mut ok, mut over) = (0, 0);
    for t in tasks {
        match t.await.expect("caller") {
            Ok(OK) => ok += 1,
            Ok(OVER_LIMIT) => over += 1,
            other => panic!("{key}: unexpected answer {other:?}"),
        }
    }
    assert_eq!(ok + over, (SERVERS * CONCURRENT_PER_SERVER) as u64);
    (ok, over)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_servers_one_redis_allow_exactly_the_limit_at_default_settings() {
    let redis = RedisServer::start();
    let servers: Vec<EdgelimitServer> = (0..SERVERS)
        .map(|_| {
            let server = EdgelimitServer::start(ServerOptions::redis_defaults(
                &redis.url(),
                &[("exact.yaml", POLICY)],
            ));
            server.wait_ready();
            server
        })
        .collect();
    let total = (SERVERS * CONCURRENT_PER_SERVER) as u64;

    for round in 0..ROUNDS {
        let subject = format!("subject-{round}");
        let (ok, over) = storm(&servers, "fixed", &subject).await;
        assert_eq!(
            (ok, over),
            (LIMIT, total - LIMIT),
            "fixed window, round {round}\n{}",
            failures(&servers)
        );

        let (ok, over) = storm(&servers, "bucket", &subject).await;
        assert_eq!(
            (ok, over),
            (LIMIT, total - LIMIT),
            "token bucket, round {round}\n{}",
            failures(&servers)
        );

        let (ok, _) = storm(&servers, "sliding", &subject).await;
        assert!(
            (1..=LIMIT).contains(&ok),
            "sliding window allowed {ok} of {LIMIT}, round {round}"
        );
    }

    // Each fixed-window count in Redis is exactly what was granted (denials consume nothing).
    let keys = redis.cli(&["--raw", "KEYS", "edgelimit:rate:*"]);
    let counts: Vec<String> = keys
        .lines()
        .filter(|k| !k.is_empty())
        .filter(|k| redis.cli(&["--raw", "HGET", k, "a"]).trim() == "fixed_window")
        .map(|k| redis.cli(&["--raw", "HGET", k, "c"]).trim().to_owned())
        .collect();
    assert_eq!(counts, vec![LIMIT.to_string(); ROUNDS]);
    // The bursts went to Redis in batches (the window of calls in flight filled up).
    let (mut batches, mut batched) = (0.0, 0.0);
    for server in &servers {
        let text = server.metrics();
        batches += metric(&text, "edgelimit_redis_batch_requests_count", &[]).unwrap_or(0.0);
        batched += metric(&text, "edgelimit_redis_batch_requests_sum", &[]).unwrap_or(0.0);
    }
    assert!(batches > 0.0, "no batch call under a burst of {total}");
    println!("{batched} requests in {batches} batch calls");
    // What overload cost: shed before sending (overloaded, expired_in_queue).
    println!("{}", failures(&servers));
}
