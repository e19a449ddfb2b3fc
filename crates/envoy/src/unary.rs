//! One unary gRPC call framed by hand: the request's message read from the HTTP/2 body and the
//! response written as one DATA frame and a `grpc-status: 0` trailer.
//!
//! tonic's generic path (`Grpc::unary`) runs a streaming decoder and encoder per call, each
//! with its own 8 KiB buffer, and boxes a stream state machine as the response body. A
//! `ShouldRateLimit` call is one small message each way, so this module does the same framing
//! with one buffer per direction and, in the usual case (the whole message in one DATA frame),
//! no copy of the request. The checks and their statuses are tonic's, word for word, so a
//! client sees the same answer either way: a compressed-flag without `grpc-encoding` or an
//! unknown flag is `INTERNAL`, a message over the limit `OUT_OF_RANGE` as soon as its header
//! is read (before it is buffered), a body that ends inside a message `INTERNAL`, a body
//! without one "Missing request message.", and a response over the encoding limit
//! `OUT_OF_RANGE` in the trailers.

use std::future::poll_fn;
use std::pin::{pin, Pin};
use std::task::{Context, Poll};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http::header::CONTENT_TYPE;
use http::{HeaderMap, HeaderName, HeaderValue};
use http_body::{Body, Frame, SizeHint};
use prost::Message;
use tonic::codegen::StdError;
use tonic::{Code, Status};

/// The gRPC message prefix: a compressed-flag byte and a 4-byte big-endian length.
const HEADER_SIZE: usize = 5;

/// tonic's default decoding limit, used when none is configured.
pub(crate) const DEFAULT_MAX_DECODING_MESSAGE_SIZE: usize = 4 * 1024 * 1024;

/// Reads `body` to its end and returns its first gRPC message. Later messages are checked like
/// the first and dropped, as tonic's unary path does. A body error whose status is `CANCELLED`
/// ends the body, as in tonic.
pub(crate) async fn read_message<B>(body: B, limit: usize) -> Result<Bytes, Status>
where
    B: Body,
    B::Error: Into<StdError>,
{
    let mut body = pin!(body);
    let mut reader = MessageReader::new(limit);
    loop {
        let frame = match poll_fn(|cx| body.as_mut().poll_frame(cx)).await {
            None => break,
            Some(Ok(frame)) => frame,
            Some(Err(error)) => {
                let status = Status::from_error(error.into());
                if status.code() == Code::Cancelled {
                    break;
                }
                return Err(status);
            }
        };
        match frame.into_data() {
            Ok(mut data) => reader.push(data.copy_to_bytes(data.remaining()))?,
            // Trailers end the request; a unary call has no use for them.
            Err(_) => break,
        }
    }
    reader.finish()
}

/// Splits DATA frames into gRPC messages, keeping the first.
struct MessageReader {
    limit: usize,
    /// Bytes of a message not yet complete.
    pending: BytesMut,
    first: Option<Bytes>,
}

impl MessageReader {
    fn new(limit: usize) -> Self {
        Self {
            limit,
            pending: BytesMut::new(),
            first: None,
        }
    }

    fn push(&mut self, mut data: Bytes) -> Result<(), Status> {
        if self.pending.is_empty() {
            // The usual case: whole messages in this frame, sliced without a copy.
            while let Some(len) = complete_message(&data, self.limit)? {
                data.advance(HEADER_SIZE);
                let message = data.split_to(len);
                self.keep(message);
            }
            self.pending.extend_from_slice(&data);
            return Ok(());
        }
        self.pending.extend_from_slice(&data);
        while let Some(len) = complete_message(&self.pending, self.limit)? {
            self.pending.advance(HEADER_SIZE);
            let message = self.pending.split_to(len).freeze();
            self.keep(message);
        }
        Ok(())
    }

    fn keep(&mut self, message: Bytes) {
        if self.first.is_none() {
            self.first = Some(message);
        }
    }

    fn finish(self) -> Result<Bytes, Status> {
        if !self.pending.is_empty() {
            return Err(Status::internal("Unexpected EOF decoding stream."));
        }
        self.first
            .ok_or_else(|| Status::internal("Missing request message."))
    }
}

/// The length of the message at the start of `buf` once all of it is there; an error as soon
/// as its header is (a compressed or unknown flag, a length over `limit`).
fn complete_message(buf: &[u8], limit: usize) -> Result<Option<usize>, Status> {
    let Some(header) = buf.get(..HEADER_SIZE) else {
        return Ok(None);
    };
    match header[0] {
        0 => {}
        // No compression is offered, so no `grpc-encoding` can apply (a request that names
        // one takes tonic's path, which refuses it).
        1 => {
            return Err(Status::internal(
                "protocol error: received message with compressed-flag but no grpc-encoding was specified",
            ))
        }
        flag => {
            return Err(Status::internal(format!(
                "protocol error: received message with invalid compression flag: {flag} (valid flags are 0 and 1), while sending request"
            )))
        }
    }
    let len = u32::from_be_bytes([header[1], header[2], header[3], header[4]]) as usize;
    if len > limit {
        return Err(Status::out_of_range(format!(
            "Error, decoded message length too large: found {len} bytes, the limit is: {limit} bytes"
        )));
    }
    Ok((buf.len() - HEADER_SIZE >= len).then_some(len))
}

/// The HTTP response of a call answered with `message`: headers, one DATA frame, and
/// `grpc-status: 0`; or, when the message is over `limit`, no data and `OUT_OF_RANGE` in the
/// trailers, as tonic's encoder answers.
pub(crate) fn response<M: Message>(
    message: &M,
    limit: Option<usize>,
) -> http::Response<tonic::body::Body> {
    let len = message.encoded_len();
    let body = match limit.filter(|&limit| len > limit) {
        Some(limit) => UnaryBody {
            data: None,
            trailers: status_trailers(&Status::out_of_range(format!(
                "Error, encoded message length too large: found {len} bytes, the limit is: {limit} bytes"
            ))),
        },
        None => UnaryBody {
            data: Some(frame(message, len)),
            trailers: Some(ok_trailers()),
        },
    };
    let mut response = http::Response::new(tonic::body::Body::new(body));
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    response
}

fn frame<M: Message>(message: &M, len: usize) -> Bytes {
    let mut buf = BytesMut::with_capacity(HEADER_SIZE + len);
    buf.put_u8(0);
    // A message over 4 GiB cannot be built from a request bounded far below that.
    buf.put_u32(u32::try_from(len).unwrap_or(u32::MAX));
    message.encode_raw(&mut buf);
    buf.freeze()
}

/// By name: inserting by `&str` parses and validates the name on every response.
static GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");

fn ok_trailers() -> HeaderMap {
    let mut trailers = HeaderMap::with_capacity(1);
    trailers.insert(&GRPC_STATUS, HeaderValue::from_static("0"));
    trailers
}

fn status_trailers(status: &Status) -> Option<HeaderMap> {
    let mut trailers = HeaderMap::with_capacity(2);
    // `add_header` fails only for a message that cannot be a header value, which the
    // percent-encoded text never is; the code alone is sent then.
    if status.add_header(&mut trailers).is_err() {
        trailers.insert(&GRPC_STATUS, HeaderValue::from(i32::from(status.code())));
    }
    Some(trailers)
}

/// A response body of at most one DATA frame and one trailer frame.
struct UnaryBody {
    data: Option<Bytes>,
    trailers: Option<HeaderMap>,
}

impl Body for UnaryBody {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        if let Some(data) = self.data.take() {
            return Poll::Ready(Some(Ok(Frame::data(data))));
        }
        Poll::Ready(self.trailers.take().map(|t| Ok(Frame::trailers(t))))
    }

    fn is_end_stream(&self) -> bool {
        self.data.is_none() && self.trailers.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.data.as_ref().map_or(0, |d| d.len() as u64))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::convert::Infallible;
    use std::future::Future;
    use std::task::Waker;

    /// A body that yields `chunks` as DATA frames, then ends.
    struct Chunks(Vec<Bytes>);

    impl Body for Chunks {
        type Data = Bytes;
        type Error = Infallible;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
            if self.0.is_empty() {
                return Poll::Ready(None);
            }
            Poll::Ready(Some(Ok(Frame::data(self.0.remove(0)))))
        }
    }

    /// Every future here is ready at once (the bodies never wait).
    fn now<F: Future>(future: F) -> F::Output {
        let mut future = pin!(future);
        match future
            .as_mut()
            .poll(&mut Context::from_waker(Waker::noop()))
        {
            Poll::Ready(output) => output,
            Poll::Pending => panic!("the future waited"),
        }
    }

    fn message(flag: u8, payload: &[u8]) -> Vec<u8> {
        let mut m = vec![flag];
        m.extend_from_slice(&(payload.len() as u32).to_be_bytes());
        m.extend_from_slice(payload);
        m
    }

    fn read(chunks: &[&[u8]], limit: usize) -> Result<Bytes, Status> {
        let body = Chunks(chunks.iter().map(|c| Bytes::copy_from_slice(c)).collect());
        now(read_message(body, limit))
    }

    #[test]
    fn a_message_in_one_frame_is_read() {
        let m = message(0, b"hello");
        assert_eq!(read(&[&m], 64).unwrap(), &b"hello"[..]);
    }

    #[test]
    fn a_message_split_at_every_byte_is_read() {
        let m = message(0, b"split across frames");
        let chunks: Vec<&[u8]> = m.chunks(1).collect();
        assert_eq!(read(&chunks, 64).unwrap(), &b"split across frames"[..]);
    }

    #[test]
    fn the_first_of_several_messages_is_kept() {
        let mut both = message(0, b"first");
        both.extend(message(0, b"second"));
        assert_eq!(read(&[&both[..7], &both[7..]], 64).unwrap(), &b"first"[..]);
    }

    #[test]
    fn an_empty_message_is_a_message() {
        assert_eq!(read(&[&message(0, b"")], 64).unwrap(), &b""[..]);
    }

    #[test]
    fn an_empty_body_is_missing_its_message() {
        let status = read(&[], 64).unwrap_err();
        assert_eq!(status.code(), Code::Internal);
        assert_eq!(status.message(), "Missing request message.");
    }

    #[test]
    fn a_body_ending_inside_a_message_is_an_error() {
        let m = message(0, b"truncated");
        let status = read(&[&m[..8]], 64).unwrap_err();
        assert_eq!(status.code(), Code::Internal);
        assert_eq!(status.message(), "Unexpected EOF decoding stream.");
        let status = read(&[&m[..3]], 64).unwrap_err();
        assert_eq!(status.message(), "Unexpected EOF decoding stream.");
    }

    #[test]
    fn an_oversize_message_is_refused_from_its_header_alone() {
        let header = &message(0, &[0; 100])[..HEADER_SIZE];
        let status = read(&[header], 99).unwrap_err();
        assert_eq!(status.code(), Code::OutOfRange);
        assert_eq!(
            status.message(),
            "Error, decoded message length too large: found 100 bytes, the limit is: 99 bytes"
        );
        assert_eq!(read(&[&message(0, &[7; 99])], 99).unwrap().len(), 99);
    }

    #[test]
    fn compressed_and_unknown_flags_are_refused() {
        let status = read(&[&message(1, b"x")], 64).unwrap_err();
        assert_eq!(status.code(), Code::Internal);
        assert!(status.message().contains("compressed-flag"), "{status:?}");
        let status = read(&[&message(2, b"x")], 64).unwrap_err();
        assert_eq!(status.code(), Code::Internal);
        assert!(status.message().contains("invalid compression flag: 2"));
    }

    fn collect(response: http::Response<tonic::body::Body>) -> (Vec<u8>, Option<HeaderMap>) {
        let mut body = response.into_body();
        let (mut data, mut trailers) = (Vec::new(), None);
        while let Some(frame) = now(poll_fn(|cx| Pin::new(&mut body).poll_frame(cx))) {
            let frame = frame.unwrap();
            match frame.into_data() {
                Ok(d) => data.extend_from_slice(&d),
                Err(frame) => trailers = frame.into_trailers().ok(),
            }
        }
        (data, trailers)
    }

    #[test]
    fn a_response_is_one_framed_message_and_status_ok() {
        let answer = envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse {
            overall_code: 1,
            ..Default::default()
        };
        let response = response(&answer, None);
        assert_eq!(response.headers()[CONTENT_TYPE], "application/grpc");
        let (data, trailers) = collect(response);
        assert_eq!(data, message(0, &answer.encode_to_vec()));
        assert_eq!(trailers.unwrap()["grpc-status"], "0");
    }

    #[test]
    fn a_response_over_the_limit_is_out_of_range_in_the_trailers() {
        let answer = envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse {
            overall_code: 1,
            ..Default::default()
        };
        let len = answer.encoded_len();
        let (data, trailers) = collect(response(&answer, Some(len - 1)));
        assert!(data.is_empty());
        let status = Status::from_header_map(&trailers.unwrap()).unwrap();
        assert_eq!(status.code(), Code::OutOfRange);
        assert!(status.message().contains(&format!("found {len} bytes")));
        assert!(!collect(response(&answer, Some(len))).0.is_empty());
    }
}
