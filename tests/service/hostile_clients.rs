//! Hostile clients against the real binary, loopback only, bounded in count and time:
//! floods of distinct subjects, oversize and malformed frames, slowloris connections. A
//! well-formed client keeps being answered throughout. No assertion is about speed.

use crate::common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::raw_h2::{
    frame, grpc_message, grpc_request_headers, RawConn, DATA, END_HEADERS, END_STREAM, HEADERS,
    PREFACE, RLS_PATH, RST_STREAM, SETTINGS,
};
use common::redis_server::RedisServer;
use common::server::{
    call, descriptor, metric, request, wait_until, EdgelimitServer, ServerOptions, OK, OVER_LIMIT,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use tonic::transport::Channel;

const BOUND: Duration = Duration::from_secs(20);
const POLICY: &str = "domain: edge\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 1000000}\n";
/// Flood: for this long, and at least `FLOOD_MIN` requests (a loaded CI machine may be slow)
/// but never more than `FLOOD_MAX` requests or `FLOOD_HARD_STOP`.
const FLOOD_FOR: Duration = Duration::from_secs(3);
const FLOOD_MIN: usize = 3_000;
const FLOOD_MAX: usize = 30_000;
const FLOOD_HARD_STOP: Duration = Duration::from_secs(60);
const FLOOD_TASKS: usize = 32;

#[derive(Debug, Default)]
struct Tally {
    ok: AtomicUsize,
    over: AtomicUsize,
    errors: AtomicUsize,
}

/// Sends requests for distinct subjects (`flood-<task>-<n>`) from `FLOOD_TASKS` tasks.
async fn flood(client: &RateLimitServiceClient<Channel>) -> Arc<Tally> {
    let tally = Arc::new(Tally::default());
    let sent = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let tasks: Vec<_> = (0..FLOOD_TASKS)
        .map(|task| {
            let mut client = client.clone();
            let (tally, sent) = (tally.clone(), sent.clone());
            tokio::spawn(async move {
                for n in 0.. {
                    let total = sent.fetch_add(1, Ordering::Relaxed);
                    let elapsed = started.elapsed();
                    let enough = elapsed >= FLOOD_FOR && total >= FLOOD_MIN;
                    if enough || total >= FLOOD_MAX || elapsed >= FLOOD_HARD_STOP {
                        break;
                    }
                    let subject = format!("flood-{task}-{n}");
                    let r = call(
                        &mut client,
                        request("edge", vec![descriptor(&[("k", &subject)])]),
                    );
                    match r.await {
                        Ok(r) if r.overall_code == OK => tally.ok.fetch_add(1, Ordering::Relaxed),
                        Ok(_) => tally.over.fetch_add(1, Ordering::Relaxed),
                        Err(_) => tally.errors.fetch_add(1, Ordering::Relaxed),
                    };
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("flood task");
    }
    tally
}

async fn code_for(client: &mut RateLimitServiceClient<Channel>, subject: &str) -> i32 {
    call(client, request("edge", vec![descriptor(&[("k", subject)])]))
        .await
        .expect("answered")
        .overall_code
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_new_subjects_stays_within_the_memory_cap() {
    let server = EdgelimitServer::start(
        ServerOptions::memory(&[("edge.yaml", POLICY)]).extra("memory:\n  max_subjects: 1000\n"),
    );
    let mut client = server.client().await;
    assert_eq!(code_for(&mut client, "known").await, OK);

    let tally = flood(&client).await;
    let (ok, over, errors) = (
        tally.ok.load(Ordering::Relaxed),
        tally.over.load(Ordering::Relaxed),
        tally.errors.load(Ordering::Relaxed),
    );
    assert_eq!(errors, 0, "every flood request is answered: {tally:?}");
    assert!(ok + over > 1000, "the flood crossed the cap: {tally:?}");
    assert!(ok <= 1000, "at most the cap was admitted: {tally:?}");
    assert!(
        over > 0,
        "new subjects beyond the cap fail closed: {tally:?}"
    );

    // The sampler publishes every second.
    let rejections = || {
        metric(
            &server.metrics(),
            "edgelimit_memory_capacity_rejections_total",
            &[],
        )
        .unwrap_or(0.0)
    };
    assert!(
        wait_until(BOUND, || rejections() > 0.0),
        "rejections counted"
    );
    let subjects = metric(&server.metrics(), "edgelimit_memory_subjects", &[]);
    assert!(
        subjects.is_some_and(|s| s <= 1000.0),
        "within the cap: {subjects:?}"
    );
    assert_eq!(
        code_for(&mut client, "known").await,
        OK,
        "known subjects still work"
    );
    assert_eq!(
        code_for(&mut client, "brand-new").await,
        OVER_LIMIT,
        "new subjects are denied at the cap"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_new_subjects_leaves_only_expiring_keys_in_redis() {
    let redis = RedisServer::start();
    let server =
        EdgelimitServer::start(ServerOptions::redis(&redis.url(), &[("edge.yaml", POLICY)]));
    let client = server.client().await;
    let tally = flood(&client).await;
    assert_eq!(
        tally.errors.load(Ordering::Relaxed),
        0,
        "every flood request is answered: {tally:?}"
    );
    assert!(tally.ok.load(Ordering::Relaxed) > 0, "{tally:?}");

    let keys: Vec<String> = redis
        .cli(&["--scan", "--pattern", "edgelimit:*"])
        .lines()
        .map(str::to_owned)
        .collect();
    assert!(!keys.is_empty(), "the flood wrote keys");
    // Sampled, evenly over the key space: every key must expire (no PTTL of -1).
    let step = (keys.len() / 200).max(1);
    for key in keys.iter().step_by(step) {
        let pttl: i64 = redis
            .cli(&["PTTL", key])
            .trim()
            .parse()
            .expect("PTTL is an integer");
        assert!(pttl > 0, "{key} has PTTL {pttl}");
    }
}

/// Well-formed requests on their own connection every 25 ms until stopped; each result.
fn spawn_prober(
    mut client: RateLimitServiceClient<Channel>,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<Vec<Result<i32, tonic::Status>>> {
    tokio::spawn(async move {
        let mut results = Vec::new();
        while !stop.load(Ordering::Relaxed) && results.len() < 10_000 {
            let r = call(
                &mut client,
                request("edge", vec![descriptor(&[("k", "prober")])]),
            )
            .await;
            results.push(r.map(|r| r.overall_code));
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        results
    })
}

fn connections(s: &EdgelimitServer) -> f64 {
    metric(&s.metrics(), "edgelimit_grpc_connections", &[]).unwrap_or(-1.0)
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f).await.expect("blocking task")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_frames_and_slowloris_never_disturb_well_formed_requests() {
    let server = EdgelimitServer::start(
        ServerOptions::memory(&[("edge.yaml", POLICY)]).extra(
            "limits:\n  max_connections: 200\n  handshake_timeout: 2s\n  http2_keepalive_interval: 1s\n  http2_keepalive_timeout: 1s\n",
        ),
    );
    let port = server.grpc_port;
    let mut prober_client = server.client().await;
    assert_eq!(code_for(&mut prober_client, "prober").await, OK);
    let stop = Arc::new(AtomicBool::new(false));
    let prober = spawn_prober(prober_client, stop.clone());

    // (b) A 1 MiB request: refused by the codec before it is buffered.
    let mut big_client = server.client().await;
    let huge = "x".repeat(1024 * 1024);
    let status = call(
        &mut big_client,
        request("edge", vec![descriptor(&[("k", &huge)])]),
    )
    .await
    .expect_err("1 MiB is refused");
    assert_eq!(status.code(), tonic::Code::OutOfRange, "{status:?}");
    assert!(status.message().contains("65536"), "{status:?}");

    // Garbage instead of HTTP/2.
    let closed = blocking(move || {
        let mut c = RawConn::connect(port).expect("connect");
        let garbage: Vec<u8> = (0..4096u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        let _ = c.send(&garbage);
        c.closed_within(BOUND)
    })
    .await;
    assert!(closed, "garbage is answered by closing the connection");

    // A valid preface, then junk.
    let closed = blocking(move || {
        let mut c = RawConn::connect(port).expect("connect");
        let mut bytes = PREFACE.to_vec();
        bytes.extend_from_slice(b"\xff\xff\xff\xffthis is not a frame at all, not even close");
        let _ = c.send(&bytes);
        c.closed_within(BOUND)
    })
    .await;
    assert!(closed, "junk after the preface closes the connection");

    // A frame cut short, then the write side closed.
    let closed = blocking(move || {
        let mut c = RawConn::connect(port).expect("connect");
        c.greet().expect("greet");
        let mut cut = frame(HEADERS, END_HEADERS, 1, &grpc_request_headers(RLS_PATH));
        cut.truncate(12);
        let _ = c.send(&cut);
        let _ = c.stream.shutdown(std::net::Shutdown::Write);
        c.closed_within(BOUND)
    })
    .await;
    assert!(closed, "a truncated frame closes the connection");

    // A gRPC message that announces 1000 bytes and ends after 10: the stream is answered
    // (an error status or a reset), not left hanging.
    let answered = blocking(move || {
        let mut c = RawConn::connect(port).expect("connect");
        c.greet().expect("greet");
        c.send(&frame(SETTINGS, 1, 0, &[])).expect("ack");
        c.send(&frame(
            HEADERS,
            END_HEADERS,
            1,
            &grpc_request_headers(RLS_PATH),
        ))
        .expect("headers");
        let mut body = grpc_message(&[0u8; 1000]);
        body.truncate(15);
        c.send(&frame(DATA, END_STREAM, 1, &body)).expect("data");
        c.wait_for(BOUND, |f| {
            f.stream == 1 && (f.kind == HEADERS || f.kind == RST_STREAM)
        })
        .is_ok()
    })
    .await;
    assert!(answered, "a truncated message is answered");

    // (c) Slowloris: 300 connections that send nothing or a partial preface, beyond the
    // 200-connection cap. Those over the cap are closed at once; the rest by the handshake
    // timeout. Memory stays bounded by the cap meanwhile.
    let all_closed = blocking(move || {
        let mut conns: Vec<RawConn> = (0..300)
            .filter_map(|i| {
                let mut c = RawConn::connect(port).ok()?;
                if i % 2 == 1 {
                    let _ = c.send(&PREFACE[..10]);
                }
                Some(c)
            })
            .collect();
        let opened = conns.len();
        let closed = conns
            .iter_mut()
            .map(|c| c.closed_within(BOUND))
            .filter(|&closed| closed)
            .count();
        (opened, closed)
    })
    .await;
    assert_eq!(all_closed.0, 300, "the kernel accepted every connection");
    assert_eq!(all_closed.1, 300, "every idle connection was closed");
    let metrics = server.metrics();
    let refused = metric(&metrics, "edgelimit_grpc_connections_refused_total", &[]);
    assert!(refused.is_some_and(|v| v >= 1.0), "{refused:?}");
    let timeouts = metric(&metrics, "edgelimit_grpc_handshake_timeouts_total", &[]);
    assert!(timeouts.is_some_and(|v| v >= 1.0), "{timeouts:?}");

    // Afterwards: only the real clients' connections remain, and a new client is served.
    assert!(
        wait_until(BOUND, || connections(&server) <= 2.0),
        "slots released: {}",
        connections(&server)
    );
    let mut fresh = server.client().await;
    assert_eq!(code_for(&mut fresh, "fresh").await, OK);

    stop.store(true, Ordering::Relaxed);
    let results = prober.await.expect("prober");
    assert!(
        results.len() >= 10,
        "the prober ran throughout: {}",
        results.len()
    );
    for (i, r) in results.iter().enumerate() {
        match r {
            Ok(code) => assert_eq!(*code, OK, "probe {i}"),
            Err(status) => panic!("probe {i} failed: {status:?}"),
        }
    }
}
