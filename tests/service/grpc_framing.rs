//! `ShouldRateLimit` framed by hand (crates/envoy/src/unary.rs) answers as tonic's codec did:
//! a message split over any number of DATA frames is one request, and each malformed framing
//! gets tonic's status. Spoken with hyper's HTTP/2 client, whose body sends every chunk as its
//! own DATA frame, to the real binary.

use crate::common;

use bytes::Bytes;
use common::server::{descriptor, request, EdgelimitServer, ServerOptions, OK};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use http::{HeaderMap, StatusCode};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use hyper_util::rt::{TokioExecutor, TokioIo};
use prost::Message;
use tonic::Code;

const POLICY: &str = "domain: edge\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 1000000}\n";
const PATH: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

struct Answer {
    headers: HeaderMap,
    data: Vec<u8>,
    trailers: Option<HeaderMap>,
}

impl Answer {
    /// The gRPC status: from the trailers, or from the headers of a trailers-only answer.
    fn status(&self) -> tonic::Status {
        let map = self.trailers.as_ref().unwrap_or(&self.headers);
        tonic::Status::from_header_map(map).expect("a grpc-status")
    }

    fn response(&self) -> RateLimitResponse {
        assert_eq!(self.data[0], 0, "uncompressed");
        let len = u32::from_be_bytes([self.data[1], self.data[2], self.data[3], self.data[4]]);
        assert_eq!(self.data.len(), 5 + len as usize, "one whole message");
        RateLimitResponse::decode(&self.data[5..]).expect("a RateLimitResponse")
    }
}

/// One call with `extra` headers whose body is `chunks`, each its own DATA frame.
async fn call_with(port: u16, extra: &[(&str, &str)], chunks: Vec<Vec<u8>>) -> Answer {
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect");
    let (mut sender, connection) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
            .await
            .expect("HTTP/2 handshake");
    tokio::spawn(connection);
    let frames = chunks
        .into_iter()
        .map(|c| Ok::<_, std::convert::Infallible>(Frame::data(Bytes::from(c))));
    let body = StreamBody::new(tokio_stream::iter(frames));
    let mut builder = http::Request::post(format!("http://127.0.0.1:{port}{PATH}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers");
    for (name, value) in extra {
        builder = builder.header(*name, *value);
    }
    let response = sender
        .send_request(builder.body(body).expect("request"))
        .await
        .expect("an answer");
    assert_eq!(response.status(), StatusCode::OK);
    let (parts, body) = response.into_parts();
    let collected = body.collect().await.expect("the whole body");
    Answer {
        headers: parts.headers,
        trailers: collected.trailers().cloned(),
        data: collected.to_bytes().to_vec(),
    }
}

fn framed(flag: u8, message: &[u8]) -> Vec<u8> {
    let mut out = vec![flag];
    out.extend_from_slice(&(message.len() as u32).to_be_bytes());
    out.extend_from_slice(message);
    out
}

fn edge_request() -> Vec<u8> {
    request("edge", vec![descriptor(&[("k", "framing")])]).encode_to_vec()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_in_one_frame_or_split_over_many_is_answered_alike() {
    let s = EdgelimitServer::start(ServerOptions::memory(&[("edge.yaml", POLICY)]));
    let whole = framed(0, &edge_request());

    let one = call_with(s.grpc_port, &[], vec![whole.clone()]).await;
    assert_eq!(one.headers["content-type"], "application/grpc");
    assert_eq!(one.status().code(), Code::Ok);
    assert_eq!(one.response().overall_code, OK);

    // The prefix itself cut in two, then the rest a byte at a time.
    let mut chunks = vec![whole[..2].to_vec(), whole[2..7].to_vec()];
    chunks.extend(whole[7..].chunks(1).map(<[u8]>::to_vec));
    let split = call_with(s.grpc_port, &[], chunks).await;
    assert_eq!(split.status().code(), Code::Ok);
    assert_eq!(split.response().overall_code, OK);

    // A second message after the first is read and dropped, as tonic's unary path does.
    let mut two = whole.clone();
    two.extend(framed(0, b"ignored"));
    let answer = call_with(s.grpc_port, &[], vec![two]).await;
    assert_eq!(answer.response().overall_code, OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_framing_gets_the_codecs_status() {
    let s = EdgelimitServer::start(ServerOptions::memory(&[("edge.yaml", POLICY)]));
    let port = s.grpc_port;

    let empty = call_with(port, &[], vec![]).await;
    assert_eq!(empty.status().code(), Code::Internal);
    assert_eq!(empty.status().message(), "Missing request message.");

    let mut cut = framed(0, &edge_request());
    cut.truncate(cut.len() - 1);
    let truncated = call_with(port, &[], vec![cut]).await;
    assert_eq!(truncated.status().code(), Code::Internal);
    assert_eq!(
        truncated.status().message(),
        "Unexpected EOF decoding stream."
    );

    let compressed = call_with(port, &[], vec![framed(1, &edge_request())]).await;
    assert_eq!(compressed.status().code(), Code::Internal);
    assert!(compressed.status().message().contains("compressed-flag"));

    let flagged = call_with(port, &[], vec![framed(7, &edge_request())]).await;
    assert_eq!(flagged.status().code(), Code::Internal);
    assert!(flagged
        .status()
        .message()
        .contains("invalid compression flag: 7"));

    // No compression is offered: naming one is refused by tonic's negotiation.
    let gzip = call_with(
        port,
        &[("grpc-encoding", "gzip")],
        vec![framed(1, &edge_request())],
    )
    .await;
    assert_eq!(
        gzip.status().code(),
        Code::Unimplemented,
        "{:?}",
        gzip.status()
    );

    // Each of those left the server serving.
    let after = call_with(port, &[], vec![framed(0, &edge_request())]).await;
    assert_eq!(after.response().overall_code, OK);
}
