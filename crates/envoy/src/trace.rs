//! OpenTelemetry spans for `ShouldRateLimit` and for each backend call, parented on the W3C
//! `traceparent` / `tracestate` Envoy sends as gRPC metadata.
//!
//! Only built when tracing is configured: with it off the service holds `None` and the
//! request path takes one branch, builds no span and allocates nothing for it.
//!
//! Attributes are bounded and never carry a descriptor key's value, a subject or an address:
//! the domain, the number of descriptors, the overall code, the backend, the batch size, the
//! policy ids and the outcome categories.

use std::future::Future;
use std::sync::Arc;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use opentelemetry::context::FutureExt as _;
use opentelemetry::global::BoxedTracer;
use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry::trace::{Span as _, SpanKind, Status, TraceContextExt as _, Tracer as _};
use opentelemetry::{Array, Context, KeyValue, StringValue, Value};

use edgelimit_contract::{BackendReadiness, CompositeOutcome, CompositeRequest, RateLimitPort};

/// Longest domain recorded; a longer (or non-UTF-8) one is recorded as `<invalid>`.
const MAX_DOMAIN_LEN: usize = 128;
/// At most this many distinct policy ids on a backend span (a request is bounded anyway).
const MAX_POLICY_IDS: usize = 32;

pub const SERVER_SPAN: &str = "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";
pub const BACKEND_SPAN: &str = "edgelimit.backend.evaluate_all";

/// The tracer and the propagator that reads the caller's context.
pub struct RequestTracer {
    tracer: BoxedTracer,
    propagator: Box<dyn TextMapPropagator + Send + Sync>,
}

impl RequestTracer {
    pub fn new(tracer: BoxedTracer, propagator: Box<dyn TextMapPropagator + Send + Sync>) -> Self {
        Self { tracer, propagator }
    }

    /// Starts the server span of one call, child of the caller's `traceparent` if any.
    pub(crate) fn start(
        &self,
        metadata: &tonic::metadata::MetadataMap,
        domain: Option<&[u8]>,
        descriptors: usize,
    ) -> Context {
        let parent = self.propagator.extract(&Metadata(metadata));
        let mut attributes = vec![
            KeyValue::new("rpc.system", "grpc"),
            KeyValue::new("rpc.service", "envoy.service.ratelimit.v3.RateLimitService"),
            KeyValue::new("rpc.method", "ShouldRateLimit"),
            KeyValue::new("edgelimit.descriptors", descriptors as i64),
        ];
        if let Some(domain) = domain {
            attributes.push(KeyValue::new("edgelimit.domain", domain_value(domain)));
        }
        let span = self
            .tracer
            .span_builder(SERVER_SPAN)
            .with_kind(SpanKind::Server)
            .with_attributes(attributes)
            .start_with_context(&self.tracer, &parent);
        parent.with_span(span)
    }

    /// Runs `call` inside the server span `cx` and ends it with the answer's code.
    pub(crate) async fn run<F>(cx: Context, call: F) -> Result<RateLimitResponse, tonic::Status>
    where
        F: Future<Output = Result<RateLimitResponse, tonic::Status>>,
    {
        let result = call.with_context(cx.clone()).await;
        let span = cx.span();
        match &result {
            Ok(response) => {
                let code = Code::try_from(response.overall_code)
                    .map(|c| c.as_str_name())
                    .unwrap_or("UNKNOWN");
                span.set_attribute(KeyValue::new("edgelimit.overall_code", code));
                span.set_attribute(KeyValue::new("rpc.grpc.status_code", 0_i64));
            }
            Err(status) => {
                span.set_attribute(KeyValue::new(
                    "rpc.grpc.status_code",
                    i64::from(i32::from(status.code())),
                ));
                span.set_status(Status::error(status.code().description()));
            }
        }
        span.end();
        result
    }
}

fn domain_value(domain: &[u8]) -> Value {
    match std::str::from_utf8(domain) {
        Ok(d) if d.len() <= MAX_DOMAIN_LEN => Value::from(d.to_owned()),
        _ => Value::from("<invalid>"),
    }
}

/// gRPC metadata as the propagator's carrier (ASCII values only; others are ignored).
struct Metadata<'a>(&'a tonic::metadata::MetadataMap);

impl Extractor for Metadata<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0
            .keys()
            .filter_map(|k| match k {
                tonic::metadata::KeyRef::Ascii(k) => Some(k.as_str()),
                tonic::metadata::KeyRef::Binary(_) => None,
            })
            .collect()
    }
}

/// A backend whose calls are spans, children of the server span in scope. Calls made outside
/// one (the admin `/json` endpoint) are not traced; without a tracer it only delegates.
pub struct TracedPort<B> {
    inner: Arc<B>,
    tracer: Option<Arc<RequestTracer>>,
    /// `redis` or `memory`: the `edgelimit.backend` attribute and the span kind.
    backend: &'static str,
}

impl<B> TracedPort<B> {
    pub fn new(inner: Arc<B>, tracer: Option<Arc<RequestTracer>>, backend: &'static str) -> Self {
        Self {
            inner,
            tracer,
            backend,
        }
    }
}

impl<B: RateLimitPort> RateLimitPort for TracedPort<B> {
    async fn evaluate_all(&self, request: &CompositeRequest<'_>) -> CompositeOutcome {
        // The one branch tracing costs when it is off.
        let Some(tracer) = &self.tracer else {
            return self.inner.evaluate_all(request).await;
        };
        let parent = Context::current();
        if !parent.has_active_span() {
            return self.inner.evaluate_all(request).await;
        }
        let mut ids: Vec<StringValue> = Vec::new();
        for check in request.checks() {
            let id = check.policy().id().as_str();
            if ids.len() < MAX_POLICY_IDS && !ids.iter().any(|v| v.as_str() == id) {
                ids.push(StringValue::from(id.to_owned()));
            }
        }
        let kind = if self.backend == "redis" {
            SpanKind::Client
        } else {
            SpanKind::Internal
        };
        let tracer = &tracer.tracer;
        let mut span = tracer
            .span_builder(BACKEND_SPAN)
            .with_kind(kind)
            .with_attributes([
                KeyValue::new("edgelimit.backend", self.backend),
                KeyValue::new("edgelimit.batch_size", request.len() as i64),
                KeyValue::new("edgelimit.policy_ids", Value::Array(Array::String(ids))),
            ])
            .start_with_context(tracer, &parent);
        let outcome = self.inner.evaluate_all(request).await;
        let admitted = outcome.admitted(request);
        let undecided = outcome
            .outcomes()
            .iter()
            .find(|o| o.category() != "evaluated")
            .map(|o| o.category());
        span.set_attribute(KeyValue::new("edgelimit.admitted", admitted));
        span.set_attribute(KeyValue::new(
            "edgelimit.outcome",
            undecided.unwrap_or("evaluated"),
        ));
        if let Some(category) = undecided {
            span.set_status(Status::error(category));
        }
        span.end();
        outcome
    }

    async fn readiness(&self) -> BackendReadiness {
        self.inner.readiness().await
    }

    fn describe(&self) -> String {
        self.inner.describe()
    }
}
