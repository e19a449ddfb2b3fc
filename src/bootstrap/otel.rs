//! `tracing:` — OpenTelemetry spans exported over OTLP, gRPC or HTTP (off unless configured). The
//! spans themselves are made in the gRPC crate (`edgelimit_envoy::trace`); this builds the
//! SDK pipeline: resource, sampler, a bounded batch queue and the exporter.

use std::sync::Arc;
use std::time::Duration;

use opentelemetry::global::BoxedTracer;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry::KeyValue;
use opentelemetry_otlp::{WithExportConfig as _, WithHttpConfig as _};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, Sampler, SdkTracerProvider,
};
use opentelemetry_sdk::Resource;
use serde::Deserialize;

use super::duration::serde_duration;
use crate::envoy::trace::RequestTracer;

/// `tracing:` in the server configuration. Present means on (unless `enabled: false`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TracingConfig {
    pub enabled: bool,
    /// The collector: `http://host:port` for gRPC (default `http://localhost:4317`); the URL
    /// spans are POSTed to for HTTP (default `http://localhost:4318/v1/traces`; a URL without
    /// a path gets `/v1/traces`).
    pub endpoint: Option<String>,
    /// `grpc` (OTLP/gRPC) or `http` (OTLP/HTTP, binary protobuf).
    pub protocol: OtlpProtocol,
    /// Resource attributes `service.name`, `service.namespace`, `service.instance.id`
    /// (a random id when unset, as the reference does).
    pub service_name: String,
    pub service_namespace: Option<String>,
    pub service_instance_id: Option<String>,
    /// Fraction of new traces sampled (0 to 1); a caller's sampled flag is followed.
    pub sampling_ratio: f64,
    /// Bound on one export call to the collector.
    #[serde(with = "serde_duration")]
    pub export_timeout: Duration,
    /// Finished spans waiting for export; beyond it spans are dropped, never the request
    /// held up.
    pub max_queue_size: usize,
    pub max_export_batch_size: usize,
    /// How long spans wait in the queue before an export.
    #[serde(with = "serde_duration")]
    pub scheduled_delay: Duration,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OtlpProtocol {
    Grpc,
    Http,
}

impl Default for TracingConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            endpoint: None,
            protocol: OtlpProtocol::Grpc,
            service_name: "edgelimit".into(),
            service_namespace: None,
            service_instance_id: None,
            sampling_ratio: 1.0,
            export_timeout: Duration::from_secs(10),
            max_queue_size: 2048,
            max_export_batch_size: 512,
            scheduled_delay: Duration::from_secs(5),
        }
    }
}

impl TracingConfig {
    /// The endpoint the exporter is given, with the protocol's default.
    pub fn endpoint(&self) -> String {
        match (&self.endpoint, self.protocol) {
            (Some(e), OtlpProtocol::Grpc) => e.clone(),
            (Some(e), OtlpProtocol::Http) => {
                let path_start = e.find("://").map_or(0, |i| i + 3);
                match e[path_start..].find('/') {
                    Some(slash) if e.len() > path_start + slash + 1 => e.clone(),
                    _ => format!("{}/v1/traces", e.trim_end_matches('/')),
                }
            }
            (None, OtlpProtocol::Grpc) => "http://localhost:4317".into(),
            (None, OtlpProtocol::Http) => "http://localhost:4318/v1/traces".into(),
        }
    }

    /// Checks what serde cannot; the message names the field.
    pub fn validate(&self) -> Result<(), String> {
        let endpoint = self.endpoint();
        let e = endpoint.as_str();
        if e.starts_with("https://") {
            return Err(format!(
                "tracing.endpoint: {e:?}: TLS to the collector is not supported; use http:// to a \
                 collector on the node or in the pod"
            ));
        }
        if !e.starts_with("http://") || e.len() <= "http://".len() {
            return Err(format!(
                "tracing.endpoint: expected http://host:port, got {e:?}"
            ));
        }
        if self.service_name.is_empty() {
            return Err("tracing.service_name: must not be empty".into());
        }
        if !(0.0..=1.0).contains(&self.sampling_ratio) {
            return Err(format!(
                "tracing.sampling_ratio: expected 0 to 1, got {}",
                self.sampling_ratio
            ));
        }
        if self.export_timeout.is_zero() {
            return Err("tracing.export_timeout: must be above zero".into());
        }
        if self.max_queue_size == 0 {
            return Err("tracing.max_queue_size: must be at least 1".into());
        }
        if self.max_export_batch_size == 0 || self.max_export_batch_size > self.max_queue_size {
            return Err(
                "tracing.max_export_batch_size: must be between 1 and tracing.max_queue_size"
                    .into(),
            );
        }
        if self.scheduled_delay.is_zero() {
            return Err("tracing.scheduled_delay: must be above zero".into());
        }
        Ok(())
    }
}

/// The running pipeline: the tracer the gRPC service uses, and the provider to flush on exit.
pub struct Tracing {
    pub tracer: Arc<RequestTracer>,
    provider: SdkTracerProvider,
}

/// Builds the pipeline; must run inside the Tokio runtime (the exporter's channel lives on it).
/// The collector is connected lazily: an absent collector delays nothing but the export.
pub fn start(config: &TracingConfig) -> anyhow::Result<Tracing> {
    config.validate().map_err(anyhow::Error::msg)?;
    let endpoint = config.endpoint();
    let built = match config.protocol {
        OtlpProtocol::Grpc => opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .with_endpoint(endpoint.clone())
            .with_timeout(config.export_timeout)
            .build(),
        OtlpProtocol::Http => opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
            .with_endpoint(endpoint.clone())
            .with_timeout(config.export_timeout)
            .with_http_client(OnRuntime {
                client: Arc::new(
                    opentelemetry_http::hyper::HyperClient::with_default_connector(
                        config.export_timeout,
                        None,
                    ),
                ),
                runtime: tokio::runtime::Handle::current(),
            })
            .build(),
    };
    let exporter = built.map_err(|e| anyhow::anyhow!("tracing.endpoint: {e}"))?;
    let batch = BatchConfigBuilder::default()
        .with_max_queue_size(config.max_queue_size)
        .with_max_export_batch_size(config.max_export_batch_size)
        .with_scheduled_delay(config.scheduled_delay)
        .build();
    let processor = BatchSpanProcessor::builder(exporter)
        .with_batch_config(batch)
        .build();
    let instance = config
        .service_instance_id
        .clone()
        .unwrap_or_else(random_instance_id);
    let mut attributes = vec![
        KeyValue::new("service.name", config.service_name.clone()),
        KeyValue::new("service.instance.id", instance),
        KeyValue::new("service.version", env!("CARGO_PKG_VERSION")),
    ];
    if let Some(namespace) = &config.service_namespace {
        attributes.push(KeyValue::new("service.namespace", namespace.clone()));
    }
    let resource = Resource::builder_empty()
        .with_attributes(attributes)
        .build();
    let provider = SdkTracerProvider::builder()
        .with_span_processor(processor)
        .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(
            config.sampling_ratio,
        ))))
        .with_resource(resource)
        .build();
    let tracer = BoxedTracer::new(Box::new(provider.tracer("edgelimit")));
    tracing::info!(
        %endpoint,
        protocol = ?config.protocol,
        service = %config.service_name,
        sampling_ratio = config.sampling_ratio,
        "tracing: exporting spans over OTLP"
    );
    Ok(Tracing {
        tracer: Arc::new(RequestTracer::new(
            tracer,
            Box::new(TraceContextPropagator::new()),
        )),
        provider,
    })
}

impl Tracing {
    /// Exports what is queued (within the export timeout) and stops the exporter thread.
    pub async fn shutdown(self) {
        let provider = self.provider;
        let done = tokio::task::spawn_blocking(move || provider.shutdown()).await;
        match done {
            Ok(Ok(())) => {}
            Ok(Err(error)) => tracing::warn!(%error, "tracing: final export failed"),
            Err(error) => tracing::warn!(%error, "tracing: final export failed"),
        }
    }
}

/// The HTTP client on our Tokio runtime: the batch processor exports from its own thread,
/// where hyper's I/O could not run, so each request is spawned onto the runtime and awaited.
#[derive(Debug)]
struct OnRuntime<C> {
    client: Arc<C>,
    runtime: tokio::runtime::Handle,
}

#[async_trait::async_trait]
impl<C: opentelemetry_http::HttpClient + 'static> opentelemetry_http::HttpClient for OnRuntime<C> {
    async fn send_bytes(
        &self,
        request: opentelemetry_http::Request<opentelemetry_http::Bytes>,
    ) -> Result<
        opentelemetry_http::Response<opentelemetry_http::Bytes>,
        opentelemetry_http::HttpError,
    > {
        let client = self.client.clone();
        self.runtime
            .spawn(async move { client.send_bytes(request).await })
            .await?
    }
}

/// A random UUID-shaped id (v4 layout) from the OS's random source.
fn random_instance_id() -> String {
    let mut bytes = [0u8; 16];
    if getrandom::fill(&mut bytes).is_err() {
        return "unknown".into();
    }
    bytes[6] = (bytes[6] & 0x0f) | 0x40;
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    let hex = hex::encode(bytes);
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_bad_values_name_their_field() {
        assert!(TracingConfig::default().validate().is_ok());
        for (change, field) in [
            (
                (|c: &mut TracingConfig| c.sampling_ratio = 1.5) as fn(&mut TracingConfig),
                "tracing.sampling_ratio",
            ),
            (
                |c| c.endpoint = Some("collector:4317".into()),
                "tracing.endpoint",
            ),
            (
                |c| c.endpoint = Some("https://c:4317".into()),
                "tracing.endpoint",
            ),
            (|c| c.max_queue_size = 0, "tracing.max_queue_size"),
            (
                |c| c.max_export_batch_size = 4096,
                "tracing.max_export_batch_size",
            ),
            (|c| c.service_name.clear(), "tracing.service_name"),
            (
                |c| c.export_timeout = Duration::ZERO,
                "tracing.export_timeout",
            ),
        ] {
            let mut c = TracingConfig::default();
            change(&mut c);
            let e = c.validate().unwrap_err();
            assert!(e.starts_with(field), "{field}: {e}");
        }
    }

    #[test]
    fn endpoints_default_per_protocol_and_http_gets_the_traces_path() {
        let mut c = TracingConfig::default();
        assert_eq!(c.endpoint(), "http://localhost:4317");
        c.protocol = OtlpProtocol::Http;
        assert_eq!(c.endpoint(), "http://localhost:4318/v1/traces");
        c.endpoint = Some("http://collector:4318".into());
        assert_eq!(c.endpoint(), "http://collector:4318/v1/traces");
        c.endpoint = Some("http://collector:4318/".into());
        assert_eq!(c.endpoint(), "http://collector:4318/v1/traces");
        c.endpoint = Some("http://collector:4318/custom/traces".into());
        assert_eq!(c.endpoint(), "http://collector:4318/custom/traces");
        c.protocol = OtlpProtocol::Grpc;
        c.endpoint = Some("http://collector:4317".into());
        assert_eq!(c.endpoint(), "http://collector:4317");
    }

    #[test]
    fn instance_ids_are_uuid_shaped_and_distinct() {
        let (a, b) = (random_instance_id(), random_instance_id());
        assert_eq!(a.len(), 36);
        assert_eq!(&a[14..15], "4");
        assert_ne!(a, b);
    }
}
