//! Descriptor domains, keys and values are opaque bytes: whatever Envoy copies from a header
//! (obs-text, any byte) is matched byte for byte, hashed and decided like any other value, and
//! a body that is not a request at all is answered under the failure mode. Before, one
//! non-UTF-8 byte made the call fail with `INTERNAL`, which Envoy's default
//! `failure_mode_deny: false` turns into an allow: a bypass for whoever controls a header.

use crate::common::bytes_client::BytesClient;
use crate::common::server::{metric, EdgelimitServer, ServerOptions, OK, OVER_LIMIT};
use bytes::Bytes;
use edgelimit::envoy::wire::{Descriptor, Entry, Request};
use prost::Message;

const POLICY: &str = r#"
domain: bytes
descriptors:
  - key: k
    rate_limit: { unit: hour, requests_per_unit: 2 }
  - key: path
    value: /a/*
    rate_limit: { unit: hour, requests_per_unit: 1 }
"#;

fn body(domain: &[u8], entries: &[(&[u8], &[u8])]) -> Vec<u8> {
    Request {
        domain: Bytes::copy_from_slice(domain),
        descriptors: vec![Descriptor {
            entries: entries
                .iter()
                .map(|(k, v)| Entry {
                    key: Bytes::copy_from_slice(k),
                    value: Bytes::copy_from_slice(v),
                })
                .collect(),
            ..Default::default()
        }],
        hits_addend: 0,
    }
    .encode_to_vec()
}

async fn codes(client: &mut BytesClient, body: &[u8], n: usize) -> Vec<i32> {
    let mut out = Vec::new();
    for _ in 0..n {
        let r = client
            .call(body.to_vec())
            .await
            .expect("an answer, not an error");
        out.push(r.overall_code);
    }
    out
}

#[tokio::test]
async fn values_that_are_not_utf8_are_limited_like_any_other() {
    let server = EdgelimitServer::start(ServerOptions::memory(&[("bytes.yaml", POLICY)]));
    let mut client = BytesClient::connect(server.grpc_port).await;

    // Key-only rule: each distinct byte string is its own subject with the full quota.
    let ff = body(b"bytes", &[(b"k", b"\xff\xfe")]);
    assert_eq!(codes(&mut client, &ff, 3).await, [OK, OK, OVER_LIMIT]);
    let fd = body(b"bytes", &[(b"k", b"\xff\xfd")]);
    assert_eq!(codes(&mut client, &fd, 3).await, [OK, OK, OVER_LIMIT]);
    // A lone continuation byte, a truncated sequence, NUL and an overlong encoding.
    for value in [&b"\x80"[..], b"\xc3", b"a\x00b", b"\xc0\xaf"] {
        let b = body(b"bytes", &[(b"k", value)]);
        assert_eq!(
            codes(&mut client, &b, 3).await,
            [OK, OK, OVER_LIMIT],
            "{value:?}"
        );
    }

    // A wildcard's literal prefix matches the bytes before the invalid ones.
    let path = body(b"bytes", &[(b"path", b"/a/\xff")]);
    assert_eq!(codes(&mut client, &path, 2).await, [OK, OVER_LIMIT]);

    // The digest hashes bytes: a valid value with the same characters is another subject
    // only when its bytes differ, and the UTF-8 value "é" is the bytes C3 A9.
    let e_text = crate::common::server::request(
        "bytes",
        vec![crate::common::server::descriptor(&[("k", "é")])],
    );
    let mut envoy_client = server.client().await;
    for expected in [OK, OK] {
        let r = crate::common::server::call(&mut envoy_client, e_text.clone())
            .await
            .unwrap();
        assert_eq!(r.overall_code, expected);
    }
    let e_bytes = body(b"bytes", &[(b"k", b"\xc3\xa9")]);
    assert_eq!(
        codes(&mut client, &e_bytes, 1).await,
        [OVER_LIMIT],
        "same bytes, same subject"
    );

    let metrics = server.metrics();
    assert_eq!(
        metric(&metrics, "edgelimit_malformed_requests_total", &[]),
        None
    );
    let log = server.log_text();
    assert!(!log.contains("\u{fffd}"), "no raw (lossy) value in the log");
}

#[tokio::test]
async fn keys_and_domains_that_are_not_utf8_match_nothing_and_are_answered() {
    let server = EdgelimitServer::start(ServerOptions::memory(&[("bytes.yaml", POLICY)]));
    let mut client = BytesClient::connect(server.grpc_port).await;

    // No policy key or domain can equal bytes that are not UTF-8 (policy files are UTF-8):
    // the answer is the one for any unknown key or domain.
    let unknown_key = client
        .call(body(b"bytes", &[(b"other", b"v")]))
        .await
        .unwrap();
    let bad_key = client
        .call(body(b"bytes", &[(b"k\xff", b"v")]))
        .await
        .unwrap();
    assert_eq!(bad_key, unknown_key);
    assert_eq!(bad_key.overall_code, OK);

    let unknown_domain = client
        .call(body(b"nowhere", &[(b"k", b"v")]))
        .await
        .unwrap();
    let bad_domain = client
        .call(body(b"by\xfftes", &[(b"k", b"\xff")]))
        .await
        .unwrap();
    assert_eq!(bad_domain, unknown_domain);
}

#[tokio::test]
async fn a_body_that_is_not_a_request_is_over_limit_not_a_grpc_error() {
    let server = EdgelimitServer::start(ServerOptions::memory(&[("bytes.yaml", POLICY)]));
    let mut client = BytesClient::connect(server.grpc_port).await;
    let garbage: [&[u8]; 4] = [
        b"\x0a\xff\xff\xff\xff\x0f",     // domain with a length past the end
        b"\xff\xff\xff\xff\xff\xff\xff", // an unterminated varint tag
        b"\x12\x03\x0a\x05k",            // a descriptor cut in the middle
        b"\x0f",                         // wire type 7 does not exist
    ];
    for body in garbage {
        let r = client
            .call(body.to_vec())
            .await
            .expect("an answer, not a gRPC error");
        assert_eq!(r.overall_code, OVER_LIMIT, "{body:?}");
    }
    let metrics = server.metrics();
    assert_eq!(
        metric(&metrics, "edgelimit_malformed_requests_total", &[]),
        Some(4.0)
    );
}

#[tokio::test]
async fn under_grpc_unavailable_a_malformed_body_is_unavailable() {
    let server = EdgelimitServer::start(
        ServerOptions::memory(&[("bytes.yaml", POLICY)]).extra("failure_mode: grpc_unavailable"),
    );
    let mut client = BytesClient::connect(server.grpc_port).await;
    let status = client.call(b"\x0f".to_vec()).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unavailable);
    // And a request that decodes is still decided.
    let ok = client
        .call(body(b"bytes", &[(b"k", b"\xff")]))
        .await
        .unwrap();
    assert_eq!(ok.overall_code, OK);
}
