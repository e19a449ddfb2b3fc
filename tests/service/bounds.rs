//! Every documented bound, crossed end to end against the real binary: at the bound the
//! request (connection, file) is served; one past it, it is refused with the documented
//! code and a message naming what was exceeded. Timeouts are generous and no assertion is
//! about wall-clock speed.

use crate::common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::raw_h2::{
    frame, grpc_request_headers, RawConn, END_HEADERS, END_STREAM, HEADERS, NO_ERROR,
    REFUSED_STREAM, RLS_PATH, RST_STREAM, SETTINGS,
};
use common::server::{
    call, descriptor, metric, request, wait_until, EdgelimitServer, ServerOptions, OK,
};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use prost::Message;
use tonic::Code;

const BOUND: Duration = Duration::from_secs(15);
const POLICY: &str = "domain: edge\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 1000000}\n";

fn server(limits: &str) -> EdgelimitServer {
    EdgelimitServer::start(
        ServerOptions::memory(&[("edge.yaml", POLICY)]).extra(&format!("limits:\n{limits}")),
    )
}

fn entries(n: usize) -> Vec<(String, String)> {
    (0..n).map(|i| (format!("k{i}"), "v".to_string())).collect()
}

fn req_with(
    domain: &str,
    descriptors: usize,
    entries_each: &[(String, String)],
) -> RateLimitRequest {
    let refs: Vec<(&str, &str)> = entries_each
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    request(
        domain,
        (0..descriptors).map(|_| descriptor(&refs)).collect(),
    )
}

/// Asserts `INVALID_ARGUMENT` with every `needles` in the message.
fn assert_invalid(result: Result<impl std::fmt::Debug, tonic::Status>, needles: &[&str]) {
    let status = result.expect_err("beyond the bound the call must fail");
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    for needle in needles {
        assert!(
            status.message().contains(needle),
            "{needle:?} in {status:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_request_bounds_accept_at_the_bound_and_name_the_field_beyond_it() {
    let s = server(
        "  max_domain_bytes: 16\n  max_descriptors: 4\n  max_entries_per_descriptor: 3\n  max_key_bytes: 8\n  max_value_bytes: 32\n",
    );
    let mut c = s.client().await;
    let one = |k: &str, v: &str| vec![(k.to_string(), v.to_string())];

    // Domain: 16 bytes pass (unknown domain: OK without a limit), 17 fail.
    let r = call(&mut c, req_with(&"d".repeat(16), 1, &one("k", "v"))).await;
    assert_eq!(r.expect("16-byte domain").overall_code, OK);
    assert_invalid(
        call(&mut c, req_with(&"d".repeat(17), 1, &one("k", "v"))).await,
        &["domain is 17 bytes", "at most 16"],
    );

    // Descriptors: 4 pass, 5 fail.
    let r = call(&mut c, req_with("edge", 4, &one("k", "a"))).await;
    assert_eq!(r.expect("4 descriptors").statuses.len(), 4);
    assert_invalid(
        call(&mut c, req_with("edge", 5, &one("k", "a"))).await,
        &["request has 5 descriptors", "at most 4"],
    );

    // Entries per descriptor: 3 pass, 4 fail, naming the descriptor.
    let r = call(&mut c, req_with("edge", 1, &entries(3))).await;
    assert_eq!(r.expect("3 entries").overall_code, OK);
    assert_invalid(
        call(&mut c, req_with("edge", 1, &entries(4))).await,
        &["descriptors[0] has 4 entries", "at most 3"],
    );

    // Key bytes: 8 pass, 9 fail, naming the entry.
    let r = call(&mut c, req_with("edge", 1, &one(&"k".repeat(8), "v"))).await;
    assert_eq!(r.expect("8-byte key").overall_code, OK);
    assert_invalid(
        call(&mut c, req_with("edge", 1, &one(&"k".repeat(9), "v"))).await,
        &["descriptors[0].entries[0].key is 9 bytes", "at most 8"],
    );

    // Value bytes: 32 pass (and are counted by the limit), 33 fail.
    let r = call(&mut c, req_with("edge", 1, &one("k", &"v".repeat(32)))).await;
    let r = r.expect("32-byte value");
    assert_eq!(r.overall_code, OK);
    assert!(
        r.statuses[0].current_limit.is_some(),
        "the rule applied: {r:?}"
    );
    assert_invalid(
        call(&mut c, req_with("edge", 1, &one("k", &"v".repeat(33)))).await,
        &["descriptors[0].entries[0].value is 33 bytes", "at most 32"],
    );

    // Still serving after every refusal.
    let r = call(&mut c, req_with("edge", 1, &one("k", "after"))).await;
    assert_eq!(r.expect("served").overall_code, OK);
}

/// A request whose encoded size is exactly `size` bytes (one entry, value padded). Sizes
/// used here are far from a varint boundary, so the value length converges in two steps.
fn request_of_size(size: usize) -> RateLimitRequest {
    let mut value_len = size;
    for _ in 0..8 {
        let r = req_with("edge", 1, &[("k".into(), "v".repeat(value_len))]);
        let len = r.encoded_len();
        if len == size {
            return r;
        }
        if len < size {
            value_len += size - len;
        } else {
            value_len -= len - size;
        }
    }
    panic!("no request of exactly {size} bytes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_size_is_bounded_by_the_codec() {
    let s = server("  max_request_bytes: 4096\n  max_value_bytes: 8192\n");
    let mut c = s.client().await;
    let at = request_of_size(4096);
    assert_eq!(at.encoded_len(), 4096);
    let r = call(&mut c, at).await.expect("4096-byte request is served");
    assert_eq!(r.overall_code, OK);

    let over = request_of_size(4097);
    assert_eq!(over.encoded_len(), 4097);
    let status = call(&mut c, over)
        .await
        .expect_err("4097 bytes are refused");
    // tonic 0.14 reports an oversize message as OUT_OF_RANGE, naming size and limit.
    assert_eq!(status.code(), Code::OutOfRange, "{status:?}");
    assert!(
        status.message().contains("found 4097 bytes") && status.message().contains("4096"),
        "{status:?}"
    );
    let r = call(&mut c, req_with("edge", 1, &[("k".into(), "after".into())])).await;
    assert_eq!(r.expect("still served").overall_code, OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn response_size_is_bounded_by_the_codec() {
    // An unknown domain answers one `{code: OK}` status per descriptor: 2 + 4n bytes.
    let s = server("  max_response_bytes: 18\n");
    let mut c = s.client().await;
    let r = call(&mut c, req_with("nowhere", 4, &[("k".into(), "v".into())]))
        .await
        .expect("an 18-byte response is sent");
    assert_eq!(r.encoded_len(), 18);
    let status = call(&mut c, req_with("nowhere", 5, &[("k".into(), "v".into())]))
        .await
        .expect_err("a 22-byte response is not");
    assert_eq!(status.code(), Code::OutOfRange, "{status:?}");
    assert!(status.message().contains("found 22 bytes"), "{status:?}");
}

/// Opens `count` streams on one raw connection without ever sending their bodies; returns the
/// ids the server refused with `RST_STREAM(REFUSED_STREAM)`. Every stream it did not refuse
/// must be answered within the wait (trailers-only, `END_STREAM`) once the caller's deadline
/// (the server's `default_timeout`, 1 s here) passes without a body, and may be reset with
/// `NO_ERROR` after its answer; any other reset fails the test.
fn open_streams(port: u16, count: u32) -> Vec<u32> {
    let mut conn = RawConn::connect(port).expect("connect");
    conn.greet().expect("greet");
    // Acknowledge the server's SETTINGS so its limits are in force on both sides.
    let settings = conn
        .wait_for(BOUND, |f| f.kind == SETTINGS && f.flags == 0)
        .expect("server SETTINGS");
    assert_eq!(settings.stream, 0);
    conn.send(&frame(SETTINGS, 1, 0, &[])).expect("ack");
    let headers = grpc_request_headers(RLS_PATH);
    let opened: Vec<u32> = (0..count).map(|i| 1 + 2 * i).collect();
    for &id in &opened {
        conn.send(&frame(HEADERS, END_HEADERS, id, &headers))
            .expect("headers");
    }
    let mut refused = Vec::new();
    let mut answered = Vec::new();
    let until = Instant::now() + Duration::from_secs(3);
    while refused.len() + answered.len() < opened.len() {
        let left = until.saturating_duration_since(Instant::now());
        let Ok(f) = conn.wait_for(left, |f| matches!(f.kind, RST_STREAM | HEADERS)) else {
            break;
        };
        if f.kind == HEADERS {
            assert_ne!(
                f.flags & END_STREAM,
                0,
                "a late body is answered trailers-only: {f:?}"
            );
            answered.push(f.stream);
            continue;
        }
        let code = u32::from_be_bytes([f.payload[0], f.payload[1], f.payload[2], f.payload[3]]);
        if code == NO_ERROR && answered.contains(&f.stream) {
            continue;
        }
        assert_eq!(code, REFUSED_STREAM, "{f:?}");
        refused.push(f.stream);
    }
    let mut settled: Vec<u32> = refused.iter().chain(&answered).copied().collect();
    settled.sort_unstable();
    assert_eq!(
        settled, opened,
        "every stream is refused or answered at its deadline (refused {refused:?}, answered {answered:?})"
    );
    refused
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_streams_per_connection_are_bounded() {
    let s = server("  max_concurrent_streams: 2\n");
    let port = s.grpc_port;
    let refused = tokio::task::spawn_blocking(move || open_streams(port, 2))
        .await
        .unwrap();
    assert!(
        refused.is_empty(),
        "2 open streams are allowed: {refused:?}"
    );
    let refused = tokio::task::spawn_blocking(move || open_streams(port, 3))
        .await
        .unwrap();
    assert_eq!(refused, vec![5], "the third stream is refused");

    // A well-behaved client queues beyond the limit instead: every call is answered. It
    // can only do so once it has the server's SETTINGS: streams opened in the very first
    // round trip may be refused (REFUSED_STREAM, safe to retry), so warm up first.
    let mut c = s.client().await;
    let r = call(&mut c, req_with("edge", 1, &[("k".into(), "warm".into())])).await;
    assert_eq!(r.expect("warm-up").overall_code, OK);
    let calls = (0..12).map(|i| {
        let mut c = c.clone();
        async move {
            call(
                &mut c,
                req_with("edge", 1, &[("k".into(), format!("q{i}"))]),
            )
            .await
        }
    });
    for r in futures_util::future::join_all(calls).await {
        assert_eq!(r.expect("answered").overall_code, OK);
    }
}

fn connections(s: &EdgelimitServer) -> f64 {
    metric(&s.metrics(), "edgelimit_grpc_connections", &[]).unwrap_or(-1.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_connections_are_capped_and_a_freed_slot_is_reused() {
    let s = server("  max_connections: 3\n  handshake_timeout: 60s\n");
    let port = s.grpc_port;
    // The harness's readiness probe is a connection too and may still hold a slot for a
    // moment: a connection closed at accept is retried, a bounded number of times.
    let mut held: Vec<RawConn> = Vec::new();
    for _ in 0..10 {
        if held.len() == 3 {
            break;
        }
        let mut c = RawConn::connect(port).expect("connect");
        c.greet().expect("greet");
        if c.wait_for(BOUND, |f| f.kind == SETTINGS).is_ok() {
            held.push(c);
        }
    }
    assert_eq!(held.len(), 3, "3 connections are served");
    assert!(
        wait_until(BOUND, || connections(&s) == 3.0),
        "3 connections are held: {}",
        connections(&s)
    );
    let mut fourth = RawConn::connect(port).expect("the kernel accepts");
    let _ = fourth.greet();
    assert!(fourth.closed_within(BOUND), "the 4th connection is closed");
    let refused = metric(
        &s.metrics(),
        "edgelimit_grpc_connections_refused_total",
        &[],
    );
    assert!(refused.is_some_and(|v| v >= 1.0), "{refused:?}");

    held.pop();
    assert!(wait_until(BOUND, || connections(&s) == 2.0), "slot freed");
    let mut c = s.client().await;
    let r = call(&mut c, req_with("edge", 1, &[("k".into(), "v".into())])).await;
    assert_eq!(r.expect("a new client is served").overall_code, OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_connections_are_closed_after_the_handshake_timeout() {
    let s = server("  handshake_timeout: 1s\n");
    let port = s.grpc_port;
    let (silent_closed, partial_closed, greeted) = tokio::task::spawn_blocking(move || {
        let mut silent = RawConn::connect(port).expect("connect");
        let mut partial = RawConn::connect(port).expect("connect");
        partial
            .send(&common::raw_h2::PREFACE[..10])
            .expect("partial");
        let mut greeted = RawConn::connect(port).expect("connect");
        greeted.greet().expect("greet");
        let silent_closed = silent.closed_within(BOUND);
        let partial_closed = partial.closed_within(BOUND);
        // The greeted connection outlives the handshake timeout (keepalive is 30 s).
        let greeted_closed = greeted.closed_within(Duration::from_secs(3));
        (silent_closed, partial_closed, !greeted_closed)
    })
    .await
    .unwrap();
    assert!(silent_closed, "a silent connection is closed");
    assert!(partial_closed, "a partial preface is closed");
    assert!(greeted, "a connection that sent the preface stays open");
    let timeouts = metric(&s.metrics(), "edgelimit_grpc_handshake_timeouts_total", &[]);
    assert!(timeouts.is_some_and(|v| v >= 2.0), "{timeouts:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peers_that_ignore_keepalive_pings_are_reaped_and_live_ones_kept() {
    let s = server("  http2_keepalive_interval: 500ms\n  http2_keepalive_timeout: 500ms\n");
    let port = s.grpc_port;
    // A live client answers PINGs (the HTTP/2 library does it) and keeps its connection.
    let mut c = s.client().await;
    let r = call(&mut c, req_with("edge", 1, &[("k".into(), "v".into())])).await;
    assert_eq!(r.expect("served").overall_code, OK);
    let (pinged, closed) = tokio::task::spawn_blocking(move || {
        let mut dead = RawConn::connect(port).expect("connect");
        dead.greet().expect("greet");
        let mut pinged = false;
        let closed = matches!(
            dead.wait_for(BOUND, |f| {
                pinged |= f.kind == common::raw_h2::PING && f.flags & 1 == 0;
                false
            }),
            Err(true)
        );
        (pinged, closed)
    })
    .await
    .unwrap();
    assert!(pinged, "the server pings a silent peer");
    assert!(closed, "and closes it when the PING goes unanswered");
    assert!(
        wait_until(BOUND, || connections(&s) == 1.0),
        "only the live client's connection remains: {}",
        connections(&s)
    );
    let r = call(&mut c, req_with("edge", 1, &[("k".into(), "v".into())])).await;
    assert_eq!(r.expect("still served").overall_code, OK);
    assert_eq!(connections(&s), 1.0, "on the same connection");
}

fn check(dir: &std::path::Path, policies: &str) -> (i32, String) {
    let config = dir.join("edgelimit.yaml");
    std::fs::write(&config, format!("policies:\n{policies}")).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_edgelimit"))
        .arg("check")
        .arg(dir.join("p"))
        .arg("--config")
        .arg(&config)
        .env("NO_COLOR", "1")
        .output()
        .expect("run edgelimit check");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.code().unwrap_or(-1), text)
}

fn policy_dir(text: &str) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("p")).unwrap();
    let file = dir.path().join("p").join("edge.yaml");
    std::fs::write(&file, text).unwrap();
    (dir, file)
}

#[test]
fn policy_file_size_is_bounded_and_the_error_names_the_file() {
    let (dir, file) = policy_dir(POLICY);
    let len = POLICY.len();
    let (code, text) = check(dir.path(), &format!("  max_file_bytes: {len}\n"));
    assert_eq!(code, 0, "{text}");
    let (code, text) = check(dir.path(), &format!("  max_file_bytes: {}\n", len - 1));
    assert_eq!(code, 1, "{text}");
    assert!(text.contains(&file.display().to_string()), "{text}");
    assert!(
        text.contains(&format!("larger than the limit of {} bytes", len - 1)),
        "{text}"
    );
}

#[test]
fn rules_per_domain_are_bounded() {
    let text = "domain: edge\ndescriptors:\n  - key: a\n    rate_limit: {unit: hour, requests_per_unit: 1}\n  - key: b\n    rate_limit: {unit: hour, requests_per_unit: 1}\n  - key: c\n    rate_limit: {unit: hour, requests_per_unit: 1}\n";
    let (dir, file) = policy_dir(text);
    let (code, out) = check(dir.path(), "  max_rules_per_domain: 3\n");
    assert_eq!(code, 0, "{out}");
    let (code, out) = check(dir.path(), "  max_rules_per_domain: 2\n");
    assert_eq!(code, 1, "{out}");
    assert!(out.contains(&file.display().to_string()), "{out}");
    assert!(out.contains("descriptors[2]"), "names the rule: {out}");
    assert!(out.contains("more than 2 descriptors"), "{out}");
}

#[test]
fn descriptor_nesting_is_bounded() {
    let text = "domain: edge\ndescriptors:\n  - key: a\n    descriptors:\n      - key: b\n        descriptors:\n          - key: c\n            rate_limit: {unit: hour, requests_per_unit: 1}\n";
    let (dir, file) = policy_dir(text);
    let (code, out) = check(dir.path(), "  max_depth: 3\n");
    assert_eq!(code, 0, "{out}");
    let (code, out) = check(dir.path(), "  max_depth: 2\n");
    assert_eq!(code, 1, "{out}");
    assert!(out.contains(&file.display().to_string()), "{out}");
    assert!(out.contains("nested deeper than 2 levels"), "{out}");
}

#[test]
fn the_server_refuses_to_start_on_a_policy_file_beyond_its_bound() {
    let (dir, file) = policy_dir(POLICY);
    let config = dir.path().join("edgelimit.yaml");
    std::fs::write(
        &config,
        format!(
            "listen: 127.0.0.1:0\nadmin_listen: 127.0.0.1:0\npolicy_dir: {}\npolicies:\n  max_file_bytes: 10\n",
            dir.path().join("p").display()
        ),
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_edgelimit"))
        .args(["serve", "--config"])
        .arg(&config)
        .env("NO_COLOR", "1")
        .output()
        .expect("run edgelimit serve");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{text}");
    assert!(text.contains(&file.display().to_string()), "{text}");
    assert!(text.contains("larger than the limit of 10 bytes"), "{text}");
}

#[test]
fn a_zero_limit_is_a_configuration_error() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("edgelimit.yaml");
    std::fs::write(&config, "limits:\n  max_descriptors: 0\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_edgelimit"))
        .args(["serve", "--config"])
        .arg(&config)
        .output()
        .expect("run edgelimit serve");
    let text =
        String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{text}");
    assert!(text.contains("limits.max_descriptors"), "{text}");
}
