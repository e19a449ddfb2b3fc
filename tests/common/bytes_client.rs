//! A gRPC client that sends `ShouldRateLimit` bodies as given bytes, so tests can send what
//! envoy-types' client cannot encode: strings that are not UTF-8, or no message at all.

use std::time::Duration;

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use prost::Message;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::transport::Channel;

use super::raw_h2::RLS_PATH;

pub struct BytesClient {
    grpc: tonic::client::Grpc<Channel>,
}

impl BytesClient {
    pub async fn connect(port: u16) -> Self {
        let channel = Channel::from_shared(format!("http://127.0.0.1:{port}"))
            .expect("endpoint")
            .connect()
            .await
            .expect("connect to edgelimit");
        Self {
            grpc: tonic::client::Grpc::new(channel),
        }
    }

    /// One call whose message is exactly `body`.
    pub async fn call(&mut self, body: Vec<u8>) -> Result<RateLimitResponse, tonic::Status> {
        self.grpc
            .ready()
            .await
            .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
        let mut request = tonic::Request::new(body);
        request.set_timeout(Duration::from_secs(5));
        let path = tonic::codegen::http::uri::PathAndQuery::from_static(RLS_PATH);
        self.grpc
            .unary(request, path, RawCodec)
            .await
            .map(|r| r.into_inner())
    }
}

struct RawCodec;

impl Codec for RawCodec {
    type Encode = Vec<u8>;
    type Decode = RateLimitResponse;
    type Encoder = RawEncoder;
    type Decoder = ResponseDecoder;

    fn encoder(&mut self) -> RawEncoder {
        RawEncoder
    }

    fn decoder(&mut self) -> ResponseDecoder {
        ResponseDecoder
    }
}

struct RawEncoder;

impl Encoder for RawEncoder {
    type Item = Vec<u8>;
    type Error = tonic::Status;

    fn encode(&mut self, item: Vec<u8>, dst: &mut EncodeBuf<'_>) -> Result<(), tonic::Status> {
        use prost::bytes::BufMut;
        dst.put_slice(&item);
        Ok(())
    }
}

struct ResponseDecoder;

impl Decoder for ResponseDecoder {
    type Item = RateLimitResponse;
    type Error = tonic::Status;

    fn decode(
        &mut self,
        src: &mut DecodeBuf<'_>,
    ) -> Result<Option<RateLimitResponse>, tonic::Status> {
        RateLimitResponse::decode(src)
            .map(Some)
            .map_err(|e| tonic::Status::internal(e.to_string()))
    }
}
