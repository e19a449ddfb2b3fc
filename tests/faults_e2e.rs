//! Fail closed end to end: the real binary under steady load while Redis is killed, paused,
//! put to sleep, flushed, corrupted, or cut off by the fault proxy. Inside every fault window
//! each answer is OVER_LIMIT (or gRPC UNAVAILABLE in that mode), every answer beats the
//! caller's deadline, no OK is granted that Redis did not count, and service comes back on
//! its own within a bounded time.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::fault_load::{
    assert_all_answered_in_time, assert_fail_closed_in, call_with_timeout, oks, recovers, Load,
};
use common::redis_server::RedisServer;
use common::server::{descriptor, request, EdgelimitServer, ServerOptions, OK, OVER_LIMIT};
use common::tcp_proxy::{Mode, TcpProxy};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;

const POLICY: &str = r#"
domain: faults
descriptors:
  - key: user
    rate_limit:
      unit: day
      requests_per_unit: 1000000
"#;

/// Caller deadline (grpc-timeout): above every command timeout used here.
const CALLER_TIMEOUT: Duration = Duration::from_secs(4);
const RECOVERY_BOUND: Duration = Duration::from_secs(15);
const WORKERS: usize = 4;
const PAUSE: Duration = Duration::from_millis(5);

fn req(user: &str) -> RateLimitRequest {
    request("faults", vec![descriptor(&[("user", user)])])
}

fn stored_count(redis: &RedisServer) -> u64 {
    let keys = redis.cli(&["--raw", "KEYS", "edgelimit:*"]);
    let keys: Vec<&str> = keys.lines().filter(|l| !l.is_empty()).collect();
    assert_eq!(keys.len(), 1, "{keys:?}");
    redis
        .cli(&["--raw", "HGET", keys[0], "c"])
        .trim()
        .parse()
        .expect("count")
}

fn state_key(redis: &RedisServer) -> String {
    let keys = redis.cli(&["--raw", "KEYS", "edgelimit:*"]);
    let keys: Vec<&str> = keys.lines().filter(|l| !l.is_empty()).collect();
    assert_eq!(keys.len(), 1, "{keys:?}");
    keys[0].to_owned()
}

async fn settle(d: Duration) {
    tokio::time::sleep(d).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_redis_fails_closed_and_an_empty_restart_recovers() {
    let mut redis = RedisServer::start();
    let server = EdgelimitServer::start(ServerOptions::redis(
        &redis.url(),
        &[("faults.yaml", POLICY)],
    ));
    let mut client = server.client().await;
    recovers(&mut client, &req("k"), CALLER_TIMEOUT, RECOVERY_BOUND).await;
    let load = Load::start(client.clone(), req("k"), WORKERS, CALLER_TIMEOUT, PAUSE);
    settle(Duration::from_millis(300)).await;

    tokio::task::block_in_place(|| redis.stop());
    let start = Instant::now();
    settle(Duration::from_millis(1500)).await;
    let end = Instant::now();
    tokio::task::block_in_place(|| redis.restart());
    let took = recovers(&mut client, &req("k"), CALLER_TIMEOUT, RECOVERY_BOUND).await;
    settle(Duration::from_millis(300)).await;
    let samples = load.finish().await;

    assert_fail_closed_in(&samples, start, end, false, "redis killed");
    assert_all_answered_in_time(&samples, "redis killed");
    // After the empty restart the count started over; nothing after it was allowed uncounted.
    let after: Vec<_> = samples.iter().filter(|s| s.sent >= end).cloned().collect();
    // (`recovers` was granted one OK too.)
    assert!(
        oks(&after) < stored_count(&redis),
        "OKs Redis did not count"
    );
    eprintln!(
        "recovered {took:?} after restart; {} requests",
        samples.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_redis_past_the_command_timeout_fails_closed() {
    let redis = RedisServer::start();
    let server = EdgelimitServer::start(
        ServerOptions::redis(&redis.url(), &[("faults.yaml", POLICY)])
            .redis_setting("command_timeout", "300ms"),
    );
    let mut client = server.client().await;
    recovers(&mut client, &req("p"), CALLER_TIMEOUT, RECOVERY_BOUND).await;
    let load = Load::start(client.clone(), req("p"), WORKERS, CALLER_TIMEOUT, PAUSE);
    settle(Duration::from_millis(300)).await;

    redis.pause();
    // SIGSTOP is asynchronous; give it a moment before dating the fault.
    settle(Duration::from_millis(100)).await;
    let start = Instant::now();
    settle(Duration::from_millis(2000)).await;
    let end = Instant::now();
    redis.resume();
    recovers(&mut client, &req("p"), CALLER_TIMEOUT, RECOVERY_BOUND).await;
    settle(Duration::from_millis(300)).await;
    let samples = load.finish().await;

    assert_fail_closed_in(&samples, start, end, false, "redis paused");
    assert_all_answered_in_time(&samples, "redis paused");
    let granted = oks(&samples) + 2;
    assert!(granted <= stored_count(&redis), "OKs Redis did not count");
}

/// Whether Redis leaves a PING unanswered for `wait` (it is blocked).
fn redis_blocked(addr: &str, wait: Duration) -> bool {
    let Ok(mut s) = TcpStream::connect(addr) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(wait));
    if s.write_all(b"PING\r\n").is_err() {
        return false;
    }
    let mut buf = [0u8; 16];
    matches!(s.read(&mut buf), Err(ref e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn debug_sleep_past_the_command_timeout_fails_closed() {
    let redis = Arc::new(RedisServer::start_with(&[
        "--enable-debug-command",
        "local",
    ]));
    let server = EdgelimitServer::start(
        ServerOptions::redis(&redis.url(), &[("faults.yaml", POLICY)])
            .redis_setting("command_timeout", "300ms"),
    );
    let mut client = server.client().await;
    recovers(&mut client, &req("d"), CALLER_TIMEOUT, RECOVERY_BOUND).await;
    let load = Load::start(client.clone(), req("d"), WORKERS, CALLER_TIMEOUT, PAUSE);
    settle(Duration::from_millis(300)).await;

    let asked = Instant::now();
    let sleeper = {
        let redis = redis.clone();
        std::thread::spawn(move || redis.cli(&["DEBUG", "SLEEP", "3"]))
    };
    // The sleep started once a PING goes unanswered; it cannot end before asked + 3 s.
    let addr = redis.addr();
    let deadline = Instant::now() + Duration::from_secs(2);
    while !tokio::task::block_in_place(|| redis_blocked(&addr, Duration::from_millis(150))) {
        assert!(Instant::now() < deadline, "DEBUG SLEEP did not take effect");
    }
    let start = Instant::now();
    let end = asked + Duration::from_secs(3);
    tokio::task::block_in_place(|| sleeper.join().expect("sleeper"));
    recovers(&mut client, &req("d"), CALLER_TIMEOUT, RECOVERY_BOUND).await;
    settle(Duration::from_millis(300)).await;
    let samples = load.finish().await;

    assert_fail_closed_in(&samples, start, end, false, "DEBUG SLEEP");
    assert_all_answered_in_time(&samples, "DEBUG SLEEP");
    let granted = oks(&samples) + 2;
    assert!(granted <= stored_count(&redis), "OKs Redis did not count");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_faults_fail_closed_and_recover() {
    let redis = RedisServer::start();
    let proxy = TcpProxy::start(&redis.addr());
    let server = EdgelimitServer::start(
        ServerOptions::redis(&proxy.url(), &[("faults.yaml", POLICY)])
            .redis_setting("command_timeout", "300ms"),
    );
    let mut client = server.client().await;
    let mut granted = 0;
    recovers(&mut client, &req("x"), CALLER_TIMEOUT, RECOVERY_BOUND).await;
    granted += 1;
    let load = Load::start(client.clone(), req("x"), WORKERS, CALLER_TIMEOUT, PAUSE);
    settle(Duration::from_millis(300)).await;

    let mut windows = Vec::new();
    for mode in [
        Mode::Delay(Duration::from_millis(1000)),
        Mode::DropAfterWrite,
        Mode::Blackhole,
        Mode::Refuse,
    ] {
        tokio::task::block_in_place(|| proxy.set_mode(mode));
        let start = Instant::now();
        settle(Duration::from_millis(1200)).await;
        let end = Instant::now();
        tokio::task::block_in_place(|| proxy.set_mode(Mode::PassThrough));
        recovers(&mut client, &req("x"), CALLER_TIMEOUT, RECOVERY_BOUND).await;
        granted += 1;
        windows.push((mode, start, end));
        settle(Duration::from_millis(300)).await;
    }
    let samples = load.finish().await;
    for (mode, start, end) in windows {
        let n = assert_fail_closed_in(&samples, start, end, false, &format!("{mode:?}"));
        eprintln!("{mode:?}: {n} requests refused inside the window");
    }
    assert_all_answered_in_time(&samples, "proxy faults");
    assert!(proxy.dropped_after_write() >= 1);
    // Delayed commands may still be arriving; they only raise the count.
    settle(Duration::from_millis(1200)).await;
    granted += oks(&samples);
    assert!(granted <= stored_count(&redis), "OKs Redis did not count");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_unavailable_mode_answers_unavailable_before_the_deadline() {
    let redis = RedisServer::start();
    let proxy = TcpProxy::start(&redis.addr());
    let server = EdgelimitServer::start(
        ServerOptions::redis(&proxy.url(), &[("faults.yaml", POLICY)])
            .redis_setting("command_timeout", "300ms")
            .extra("failure_mode: grpc_unavailable"),
    );
    let mut client = server.client().await;
    recovers(&mut client, &req("g"), CALLER_TIMEOUT, RECOVERY_BOUND).await;
    let load = Load::start(client.clone(), req("g"), WORKERS, CALLER_TIMEOUT, PAUSE);
    settle(Duration::from_millis(300)).await;
    tokio::task::block_in_place(|| proxy.set_mode(Mode::Blackhole));
    let start = Instant::now();
    settle(Duration::from_millis(1500)).await;
    let end = Instant::now();
    tokio::task::block_in_place(|| proxy.set_mode(Mode::PassThrough));
    recovers(&mut client, &req("g"), CALLER_TIMEOUT, RECOVERY_BOUND).await;
    let samples = load.finish().await;
    assert_fail_closed_in(&samples, start, end, true, "blackhole, grpc_unavailable");
    assert_all_answered_in_time(&samples, "blackhole, grpc_unavailable");
    for s in &samples {
        assert!(
            matches!(s.result, Ok(OK) | Err(tonic::Code::Unavailable)),
            "{:?}",
            s.result
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn script_flush_under_load_never_fails_a_request() {
    let redis = Arc::new(RedisServer::start());
    let server = EdgelimitServer::start(ServerOptions::redis(
        &redis.url(),
        &[("faults.yaml", POLICY)],
    ));
    let mut client = server.client().await;
    recovers(&mut client, &req("f"), CALLER_TIMEOUT, RECOVERY_BOUND).await;
    let load = Load::start(client.clone(), req("f"), WORKERS, CALLER_TIMEOUT, PAUSE);
    let flusher = {
        let redis = redis.clone();
        std::thread::spawn(move || {
            for _ in 0..50 {
                assert_eq!(redis.cli(&["SCRIPT", "FLUSH"]).trim(), "OK");
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };
    tokio::task::block_in_place(|| flusher.join().expect("flusher"));
    let samples = load.finish().await;
    assert!(samples.len() > 50);
    for s in &samples {
        assert_eq!(
            s.result,
            Ok(OK),
            "a lost script cache must cost a resend only"
        );
    }
    assert_eq!(
        oks(&samples) + 1,
        stored_count(&redis),
        "each OK counted once"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_typed_and_corrupted_state_fail_closed() {
    let redis = RedisServer::start();
    let server = EdgelimitServer::start(ServerOptions::redis(
        &redis.url(),
        &[("faults.yaml", POLICY)],
    ));
    let mut client = server.client().await;
    recovers(&mut client, &req("w"), CALLER_TIMEOUT, RECOVERY_BOUND).await;
    let key = state_key(&redis);
    let corruptions: [&[&str]; 4] = [
        &["SET", &key, "not-a-hash"],
        &["HSET", &key, "c", "garbage"],
        &["HSET", &key, "a", "token_bucket"],
        &["HSET", &key, "v", "9"],
    ];
    for corrupt in corruptions {
        redis.cli(&["DEL", &key]);
        recovers(&mut client, &req("w"), CALLER_TIMEOUT, RECOVERY_BOUND).await;
        redis.cli(corrupt);
        for _ in 0..3 {
            let r = call_with_timeout(&mut client, req("w"), CALLER_TIMEOUT).await;
            assert_eq!(r, Ok(OVER_LIMIT), "{corrupt:?}");
        }
    }
    redis.cli(&["DEL", &key]);
    let r = call_with_timeout(&mut client, req("w"), CALLER_TIMEOUT).await;
    assert_eq!(r, Ok(OK), "service resumes once the bad key is gone");
}
