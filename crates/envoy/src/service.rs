//! The gRPC endpoint `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`: the
//! caller's deadline from `grpc-timeout`, the latency histogram, and the limiter's answer.
//!
//! Written out rather than generated so that the request is read as [`wire::Request`]
//! (strings as bytes) and a body that is not a request at all still gets an answer under the
//! failure mode instead of a gRPC error, which Envoy's default `failure_mode_deny: false`
//! would turn into an allow. The call's gRPC framing is done by hand ([`crate::unary`]): one
//! small message each way needs none of tonic's streaming codec; only a request that names a
//! `grpc-encoding` takes tonic's path, whose negotiation refuses it.

use std::convert::Infallible;
use std::marker::PhantomData;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use http::HeaderName;
use prost::Message;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::codegen::{http, Body, BoxFuture, Service, StdError};
use tonic::metadata::MetadataMap;
use tonic::server::{Grpc, NamedService, UnaryService};
use tonic::{Request, Response, Status};

use edgelimit_contract::RateLimitPort;

use crate::deadline::grpc_timeout;
use crate::limiter::RateLimiter;
use crate::metrics::record_malformed_request;
use crate::settings::FailureMode;
use crate::trace::RequestTracer;
use crate::unary;
use crate::wire;

const SHOULD_RATE_LIMIT: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

/// The tonic service of a [`RateLimiter`].
pub struct RateLimitServer<B> {
    limiter: Arc<RateLimiter<B>>,
    max_decoding_message_size: Option<usize>,
    max_encoding_message_size: Option<usize>,
    /// Set only when tracing is configured.
    tracer: Option<Arc<RequestTracer>>,
}

impl<B> Clone for RateLimitServer<B> {
    fn clone(&self) -> Self {
        Self {
            limiter: Arc::clone(&self.limiter),
            max_decoding_message_size: self.max_decoding_message_size,
            max_encoding_message_size: self.max_encoding_message_size,
            tracer: self.tracer.clone(),
        }
    }
}

impl<B: RateLimitPort> RateLimiter<B> {
    pub fn into_server(self) -> RateLimitServer<B> {
        RateLimitServer::from_arc(Arc::new(self))
    }
}

impl<B> RateLimitServer<B> {
    /// The service of a limiter that is shared (with the admin `/json` endpoint).
    pub fn from_arc(limiter: Arc<RateLimiter<B>>) -> Self {
        Self {
            limiter,
            max_decoding_message_size: None,
            max_encoding_message_size: None,
            tracer: None,
        }
    }

    /// Traces every call (see [`crate::trace`]).
    #[must_use]
    pub fn with_tracer(mut self, tracer: Arc<RequestTracer>) -> Self {
        self.tracer = Some(tracer);
        self
    }

    #[must_use]
    pub fn max_decoding_message_size(mut self, limit: usize) -> Self {
        self.max_decoding_message_size = Some(limit);
        self
    }

    #[must_use]
    pub fn max_encoding_message_size(mut self, limit: usize) -> Self {
        self.max_encoding_message_size = Some(limit);
        self
    }
}

impl<B> NamedService for RateLimitServer<B> {
    const NAME: &'static str = "envoy.service.ratelimit.v3.RateLimitService";
}

impl<B, Req> Service<http::Request<Req>> for RateLimitServer<B>
where
    B: RateLimitPort,
    Req: Body + Send + 'static,
    Req::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<Req>) -> Self::Future {
        self.handle(request)
    }
}

impl<B: RateLimitPort> RateLimitServer<B> {
    /// The gRPC path this service answers.
    pub const PATH: &'static str = SHOULD_RATE_LIMIT;

    /// Answers one HTTP/2 request: [`Self::PATH`] with the limiter's decision, any other path
    /// with `UNIMPLEMENTED`. Takes `&self` so a server that dispatches by path itself (the
    /// binary's gRPC listener) calls it without tower's per-request layers.
    pub fn handle<Req>(
        &self,
        request: http::Request<Req>,
    ) -> BoxFuture<http::Response<tonic::body::Body>, Infallible>
    where
        Req: Body + Send + 'static,
        Req::Error: Into<StdError> + Send + 'static,
    {
        if request.uri().path() != SHOULD_RATE_LIMIT {
            return Box::pin(async { Ok(Status::unimplemented("").into_http()) });
        }
        let (decoding, encoding) = (
            self.max_decoding_message_size,
            self.max_encoding_message_size,
        );
        if request.headers().contains_key(&GRPC_ENCODING) {
            // No compression is offered: tonic negotiates and refuses it.
            let method = ShouldRateLimit(Arc::clone(&self.limiter), self.tracer.clone());
            return Box::pin(async move {
                let mut grpc =
                    Grpc::new(RequestCodec).apply_max_message_size_config(decoding, encoding);
                Ok(grpc.unary(method, request).await)
            });
        }
        let limiter = Arc::clone(&self.limiter);
        let tracer = self.tracer.clone();
        Box::pin(async move {
            let (parts, body) = request.into_parts();
            let limit = decoding.unwrap_or(unary::DEFAULT_MAX_DECODING_MESSAGE_SIZE);
            let decoded = match unary::read_message(body, limit).await {
                Ok(message) => Decoded::from_message(message),
                Err(status) => return Ok(status.into_http()),
            };
            let metadata = MetadataMap::from_headers(parts.headers);
            Ok(
                match answer(limiter, tracer.as_deref(), &metadata, decoded).await {
                    Ok(response) => unary::response(&response, encoding),
                    Err(status) => status.into_http(),
                },
            )
        })
    }
}

static GRPC_ENCODING: HeaderName = HeaderName::from_static("grpc-encoding");

/// The limiter's answer to one decoded call, traced when tracing is configured.
async fn answer<B: RateLimitPort>(
    limiter: Arc<RateLimiter<B>>,
    tracer: Option<&RequestTracer>,
    metadata: &MetadataMap,
    request: Decoded,
) -> Result<RateLimitResponse, Status> {
    // The one branch tracing costs when it is off.
    let span = tracer.map(|tracer| match &request {
        Decoded::Request(r) => tracer.start(metadata, Some(&r.domain), r.descriptors.len()),
        Decoded::Malformed(_) => tracer.start(metadata, None, 0),
    });
    let started = Instant::now();
    let timeout = grpc_timeout(metadata.as_ref()).unwrap_or(limiter.settings().default_timeout);
    let call = async move {
        let result = match &request {
            Decoded::Request(r) => limiter.decide_wire(r, started + timeout).await,
            Decoded::Malformed(error) => {
                record_malformed_request();
                tracing::debug!(%error, "request body is not a RateLimitRequest");
                malformed_answer(limiter.settings().failure_mode)
            }
        };
        limiter.record_request_seconds(started.elapsed().as_secs_f64());
        result
    };
    match span {
        None => call.await,
        Some(cx) => RequestTracer::run(cx, call).await,
    }
}

struct ShouldRateLimit<B>(Arc<RateLimiter<B>>, Option<Arc<RequestTracer>>);

impl<B: RateLimitPort> UnaryService<Decoded> for ShouldRateLimit<B> {
    type Response = RateLimitResponse;
    type Future = BoxFuture<Response<RateLimitResponse>, Status>;

    fn call(&mut self, request: Request<Decoded>) -> Self::Future {
        let limiter = Arc::clone(&self.0);
        let tracer = self.1.clone();
        let (metadata, _, decoded) = request.into_parts();
        Box::pin(async move {
            answer(limiter, tracer.as_deref(), &metadata, decoded)
                .await
                .map(Response::new)
        })
    }
}

/// A body that is not a `RateLimitRequest` cannot be decided: it gets the failure mode's
/// answer, like any request whose limits could not be decided.
fn malformed_answer(mode: FailureMode) -> Result<RateLimitResponse, Status> {
    match mode {
        FailureMode::OverLimit => Ok(RateLimitResponse {
            overall_code: Code::OverLimit as i32,
            ..Default::default()
        }),
        FailureMode::GrpcUnavailable => Err(Status::unavailable(
            "the request body is not a RateLimitRequest",
        )),
    }
}

/// What the decoder read: a request, or why the body is not one (never a decoding error,
/// which tonic would answer with a gRPC status).
enum Decoded {
    Request(wire::Request),
    Malformed(prost::DecodeError),
}

impl Decoded {
    fn from_message(message: prost::bytes::Bytes) -> Self {
        match wire::Request::decode(message) {
            Ok(request) => Decoded::Request(request),
            Err(error) => Decoded::Malformed(error),
        }
    }
}

#[derive(Default)]
struct RequestCodec;

impl Codec for RequestCodec {
    type Encode = RateLimitResponse;
    type Decode = Decoded;
    type Encoder = ResponseEncoder;
    type Decoder = RequestDecoder;

    fn encoder(&mut self) -> Self::Encoder {
        ResponseEncoder(PhantomData)
    }

    fn decoder(&mut self) -> Self::Decoder {
        RequestDecoder
    }
}

struct ResponseEncoder(PhantomData<RateLimitResponse>);

impl Encoder for ResponseEncoder {
    type Item = RateLimitResponse;
    type Error = Status;

    fn encode(&mut self, item: Self::Item, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        item.encode(dst)
            .map_err(|e| Status::internal(format!("encoding the response: {e}")))
    }
}

struct RequestDecoder;

impl Decoder for RequestDecoder {
    type Item = Decoded;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Decoded>, Status> {
        use prost::bytes::Buf;
        Ok(Some(match wire::Request::decode(&mut *src) {
            Ok(request) => Decoded::Request(request),
            Err(error) => {
                // What prost left unread would be taken for the next message's header.
                let rest = src.remaining();
                src.advance(rest);
                Decoded::Malformed(error)
            }
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_malformed_body_fails_closed_under_each_mode() {
        let answer = malformed_answer(FailureMode::OverLimit).unwrap();
        assert_eq!(answer.overall_code, Code::OverLimit as i32);
        let status = malformed_answer(FailureMode::GrpcUnavailable).unwrap_err();
        assert_eq!(status.code(), tonic::Code::Unavailable);
    }
}
