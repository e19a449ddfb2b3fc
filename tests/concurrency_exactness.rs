//! Exactness under contention: three edgelimit processes share one Redis; 600 concurrent
//! requests for one subject against a limit of 100 are allowed exactly 100 times (fixed
//! window, token bucket), and never more than 100 times (sliding window, approximate).

mod common;

use std::time::Duration;

use common::fault_load::call_with_timeout;
use common::redis_server::RedisServer;
use common::server::{descriptor, request, EdgelimitServer, ServerOptions, OK, OVER_LIMIT};

const LIMIT: u64 = 100;
const SERVERS: usize = 3;
const WORKERS_PER_SERVER: usize = 10;
const CALLS_PER_WORKER: usize = 20; // 3 × 10 × 20 = 600 requests

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

/// Fires every request at once across all servers; returns (OK, OVER_LIMIT) counts.
async fn storm(servers: &[EdgelimitServer], key: &str) -> (u64, u64) {
    let mut tasks = Vec::new();
    for server in servers {
        let client = server.client().await;
        for _ in 0..WORKERS_PER_SERVER {
            let mut client = client.clone();
            let key = key.to_owned();
            tasks.push(tokio::spawn(async move {
                let mut codes = Vec::with_capacity(CALLS_PER_WORKER);
                for _ in 0..CALLS_PER_WORKER {
                    let req = request("exact", vec![descriptor(&[(&key, "same-subject")])]);
                    codes.push(call_with_timeout(&mut client, req, Duration::from_secs(10)).await);
                }
                codes
            }));
        }
    }
    let (mut ok, mut over) = (0, 0);
    for t in tasks {
        for code in t.await.expect("worker") {
            match code {
                Ok(OK) => ok += 1,
                Ok(OVER_LIMIT) => over += 1,
                other => panic!("{key}: unexpected answer {other:?}"),
            }
        }
    }
    assert_eq!(
        ok + over,
        (SERVERS * WORKERS_PER_SERVER * CALLS_PER_WORKER) as u64
    );
    (ok, over)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_servers_one_redis_allow_exactly_the_limit() {
    let redis = RedisServer::start();
    let servers: Vec<EdgelimitServer> = (0..SERVERS)
        .map(|_| {
            EdgelimitServer::start(ServerOptions::redis(
                &redis.url(),
                &[("exact.yaml", POLICY)],
            ))
        })
        .collect();

    let (ok, over) = storm(&servers, "fixed").await;
    assert_eq!((ok, over), (LIMIT, 600 - LIMIT), "fixed window");

    let (ok, over) = storm(&servers, "bucket").await;
    assert_eq!((ok, over), (LIMIT, 600 - LIMIT), "token bucket");

    let (ok, _) = storm(&servers, "sliding").await;
    assert!(
        (1..=LIMIT).contains(&ok),
        "sliding window allowed {ok} of {LIMIT}"
    );

    // The fixed-window count in Redis is exactly what was granted (denials consume nothing).
    let keys = redis.cli(&["--raw", "KEYS", "edgelimit:rate:*"]);
    let counts: Vec<String> = keys
        .lines()
        .filter(|k| !k.is_empty())
        .filter(|k| redis.cli(&["--raw", "HGET", k, "a"]).trim() == "fixed_window")
        .map(|k| redis.cli(&["--raw", "HGET", k, "c"]).trim().to_owned())
        .collect();
    assert_eq!(counts, vec![LIMIT.to_string()]);
}
