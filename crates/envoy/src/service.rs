//! The tonic service: the caller's deadline from `grpc-timeout`, the latency histogram, and
//! the limiter's answer.

use std::time::Instant;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tonic::{Request, Response, Status};

use edgelimit_contract::RateLimitPort;

use crate::deadline::parse_grpc_timeout;
use crate::limiter::RateLimiter;
use crate::metrics::record_request_seconds;

impl<B: RateLimitPort> RateLimiter<B> {
    pub fn into_server(self) -> RateLimitServiceServer<Self> {
        RateLimitServiceServer::new(self)
    }
}

#[tonic::async_trait]
impl<B: RateLimitPort> RateLimitService for RateLimiter<B> {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let started = Instant::now();
        let timeout = request
            .metadata()
            .get("grpc-timeout")
            .and_then(|v| v.to_str().ok())
            .and_then(parse_grpc_timeout)
            .unwrap_or(self.settings().default_timeout);
        let result = self.decide(request.get_ref(), started + timeout).await;
        record_request_seconds(started.elapsed().as_secs_f64());
        result.map(Response::new)
    }
}
