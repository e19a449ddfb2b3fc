//! Redis persistence and memory pressure, against real redis-server processes: counters kept
//! across a killed and restarted Redis with AOF, and a Redis at `maxmemory` with
//! `noeviction` refusing writes (fails closed, nothing lost). Every wait is bounded.

mod common;

use std::time::Duration;

use common::redis_server::RedisServer;
use common::server::{
    call, descriptor, request, wait_until, EdgelimitServer, ServerOptions, OK, OVER_LIMIT,
};

const BOUND: Duration = Duration::from_secs(20);
const POLICY: &str = "domain: p\ndescriptors:\n  - key: user\n    rate_limit: { unit: hour, requests_per_unit: 5 }\n";

async fn code(server: &EdgelimitServer, user: &str) -> i32 {
    let mut client = server.client().await;
    call(
        &mut client,
        request("p", vec![descriptor(&[("user", user)])]),
    )
    .await
    .map(|r| r.overall_code)
    .unwrap_or(-1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counters_survive_a_killed_redis_with_aof() {
    let mut redis = RedisServer::start_with(&["--appendonly", "yes", "--appendfsync", "always"]);
    let server = EdgelimitServer::start(ServerOptions::redis(&redis.url(), &[("p.yaml", POLICY)]));
    for _ in 0..3 {
        assert_eq!(code(&server, "u").await, OK);
    }
    redis.restart(); // SIGKILL, then the same port and directory: the AOF is replayed.
                     // No OK while Redis is away or reconnecting; once back, exactly the 2 units left.
    let mut answers = Vec::new();
    assert!(
        wait_until(BOUND, || {
            let c = futures_block(code(&server, "u"));
            answers.push(c);
            c == OK
        }),
        "{}",
        server.log_text()
    );
    assert!(answers[..answers.len() - 1].iter().all(|&c| c != OK));
    assert_eq!(code(&server, "u").await, OK, "the 5th unit");
    assert_eq!(
        code(&server, "u").await,
        OVER_LIMIT,
        "3 before the kill were kept"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn noeviction_at_maxmemory_fails_closed_and_loses_nothing() {
    let redis = RedisServer::start_with(&[
        "--maxmemory",
        "4mb",
        "--maxmemory-policy",
        "noeviction",
        "--enable-debug-command",
        "yes",
    ]);
    let server = EdgelimitServer::start(ServerOptions::redis(&redis.url(), &[("p.yaml", POLICY)]));
    for _ in 0..2 {
        assert_eq!(code(&server, "kept").await, OK);
    }
    // Fill memory past maxmemory with data that is not the server's.
    let populated = redis.cli(&["DEBUG", "POPULATE", "200000", "filler", "64"]);
    assert!(populated.contains("OK"), "{populated}");
    let refused = redis.cli(&["SET", "probe", "x"]);
    assert!(
        refused.contains("OOM"),
        "Redis must be refusing writes: {refused}"
    );
    // A new subject needs a write Redis refuses: never OK.
    for i in 0..5 {
        assert_ne!(
            code(&server, &format!("new{i}")).await,
            OK,
            "{}",
            server.log_text()
        );
    }
    // Nothing was evicted: once the limit is lifted, the old subject has exactly 3 left.
    redis.cli(&["CONFIG", "SET", "maxmemory", "0"]);
    let mut after = Vec::new();
    for _ in 0..4 {
        after.push(code(&server, "kept").await);
    }
    assert_eq!(after, [OK, OK, OK, OVER_LIMIT], "{}", server.log_text());
}

fn futures_block<F: std::future::Future>(f: F) -> F::Output {
    tokio::task::block_in_place(|| tokio::runtime::Handle::current().block_on(f))
}
