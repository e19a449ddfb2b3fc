//! Tracing end to end: the real binary exports OTLP/gRPC to a TraceService receiver run here
//! (opentelemetry-proto's generated server on a loopback port). A ShouldRateLimit carrying
//! Envoy's `traceparent` yields a server span in that trace, under that parent, and a backend
//! span under it, with the documented attributes and no descriptor value anywhere in the
//! exported bytes. With tracing off nothing is exported; bad settings stop the start naming
//! the field.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::redis_server::RedisServer;
use common::server::{descriptor, request, EdgelimitServer, ServerOptions, OK};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;

const POLICY: &str =
    "domain: traced\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 100}\n";
/// A descriptor value: it must never be exported.
const SECRET_VALUE: &str = "user-4711-secret-value";
const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT_ID: &str = "00f067aa0ba902b7";

#[derive(Clone, Default)]
struct Receiver(Arc<Mutex<Vec<ExportTraceServiceRequest>>>);

#[tonic::async_trait]
impl TraceService for Receiver {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        self.0.lock().unwrap().push(request.into_inner());
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

impl Receiver {
    /// Starts the receiver on a free loopback port.
    async fn start() -> (Self, u16) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let receiver = Receiver::default();
        let service = TraceServiceServer::new(receiver.clone());
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
        );
        (receiver, port)
    }

    fn spans(&self) -> Vec<Span> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .flat_map(|r| r.resource_spans.iter())
            .flat_map(|r| r.scope_spans.iter())
            .flat_map(|s| s.spans.iter().cloned())
            .collect()
    }

    fn bytes(&self) -> Vec<u8> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .flat_map(|r| r.encode_to_vec())
            .collect()
    }

    async fn wait_for(&self, names: &[&str]) -> Vec<Span> {
        for _ in 0..100 {
            let spans = self.spans();
            if names.iter().all(|n| spans.iter().any(|s| s.name == *n)) {
                return spans;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("spans {names:?} not exported; got {:?}", self.spans());
    }
}

fn attr<'a>(attributes: &'a [KeyValue], key: &str) -> Option<&'a Value> {
    attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref())
        .and_then(|v| v.value.as_ref())
}

fn string(attributes: &[KeyValue], key: &str) -> Option<String> {
    match attr(attributes, key) {
        Some(Value::StringValue(s)) => Some(s.clone()),
        _ => None,
    }
}

fn int(attributes: &[KeyValue], key: &str) -> Option<i64> {
    match attr(attributes, key) {
        Some(Value::IntValue(n)) => Some(*n),
        _ => None,
    }
}

fn tracing_yaml(port: u16, extra: &str) -> String {
    format!(
        "tracing:\n  endpoint: http://127.0.0.1:{port}\n  service_name: edgelimit-test\n  service_namespace: tests\n  scheduled_delay: 100ms\n  export_timeout: 2s\n{extra}"
    )
}

/// One ShouldRateLimit with Envoy's trace context in its metadata.
async fn traced_call(server: &EdgelimitServer) -> i32 {
    let mut client = server.client().await;
    let mut r = tonic::Request::new(request(
        "traced",
        vec![descriptor(&[("user", SECRET_VALUE)])],
    ));
    r.set_timeout(Duration::from_secs(5));
    let metadata = r.metadata_mut();
    metadata.insert(
        "traceparent",
        format!("00-{TRACE_ID}-{PARENT_ID}-01").parse().unwrap(),
    );
    metadata.insert("tracestate", "envoy=t61rcWkgMzE".parse().unwrap());
    client
        .should_rate_limit(r)
        .await
        .expect("ShouldRateLimit")
        .into_inner()
        .overall_code
}

/// The server and backend spans of one traced call, checked against Envoy's context.
fn check_spans(receiver: &Receiver, spans: &[Span], backend: &str) {
    let server = spans
        .iter()
        .find(|s| s.name == "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit")
        .unwrap();
    assert_eq!(hex::encode(&server.trace_id), TRACE_ID, "Envoy's trace");
    assert_eq!(
        hex::encode(&server.parent_span_id),
        PARENT_ID,
        "Envoy's span is the parent"
    );
    assert_eq!(
        server.trace_state, "envoy=t61rcWkgMzE",
        "tracestate carried"
    );
    assert_eq!(server.kind, 2, "SPAN_KIND_SERVER");
    let a = &server.attributes;
    assert_eq!(string(a, "edgelimit.domain").as_deref(), Some("traced"));
    assert_eq!(string(a, "edgelimit.overall_code").as_deref(), Some("OK"));
    assert_eq!(int(a, "edgelimit.descriptors"), Some(1));
    assert_eq!(string(a, "rpc.system").as_deref(), Some("grpc"));

    let call = spans
        .iter()
        .find(|s| s.name == "edgelimit.backend.evaluate_all")
        .unwrap();
    assert_eq!(call.trace_id, server.trace_id);
    assert_eq!(
        call.parent_span_id, server.span_id,
        "child of the server span"
    );
    let a = &call.attributes;
    assert_eq!(string(a, "edgelimit.backend").as_deref(), Some(backend));
    assert_eq!(int(a, "edgelimit.batch_size"), Some(1));
    assert_eq!(string(a, "edgelimit.outcome").as_deref(), Some("evaluated"));
    match attr(a, "edgelimit.policy_ids") {
        Some(Value::ArrayValue(ids)) => assert_eq!(ids.values.len(), 1, "{ids:?}"),
        other => panic!("policy ids: {other:?}"),
    }

    let resource = receiver.0.lock().unwrap()[0].resource_spans[0]
        .resource
        .clone()
        .unwrap();
    assert_eq!(
        string(&resource.attributes, "service.name").as_deref(),
        Some("edgelimit-test")
    );
    assert_eq!(
        string(&resource.attributes, "service.namespace").as_deref(),
        Some("tests")
    );
    assert!(string(&resource.attributes, "service.instance.id").is_some());

    let bytes = receiver.bytes();
    assert!(
        !bytes
            .windows(SECRET_VALUE.len())
            .any(|w| w == SECRET_VALUE.as_bytes()),
        "a descriptor value was exported"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_backend_spans_follow_envoys_traceparent() {
    let (receiver, port) = Receiver::start().await;
    let server = EdgelimitServer::start(
        ServerOptions::memory(&[("traced.yaml", POLICY)]).extra(&tracing_yaml(port, "")),
    );
    assert_eq!(traced_call(&server).await, OK, "{}", server.log_text());
    let spans = receiver
        .wait_for(&[
            "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
            "edgelimit.backend.evaluate_all",
        ])
        .await;
    check_spans(&receiver, &spans, "memory");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_backend_call_is_a_client_span() {
    let redis = RedisServer::start();
    let (receiver, port) = Receiver::start().await;
    let server = EdgelimitServer::start(
        ServerOptions::redis(&redis.url(), &[("traced.yaml", POLICY)])
            .extra(&tracing_yaml(port, "")),
    );
    assert_eq!(traced_call(&server).await, OK, "{}", server.log_text());
    let spans = receiver
        .wait_for(&[
            "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
            "edgelimit.backend.evaluate_all",
        ])
        .await;
    check_spans(&receiver, &spans, "redis");
    let call = spans
        .iter()
        .find(|s| s.name == "edgelimit.backend.evaluate_all")
        .unwrap();
    assert_eq!(call.kind, 3, "SPAN_KIND_CLIENT");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_tracing_off_nothing_is_exported() {
    let (receiver, port) = Receiver::start().await;
    let server = EdgelimitServer::start(
        ServerOptions::memory(&[("traced.yaml", POLICY)])
            .extra(&tracing_yaml(port, "  enabled: false\n")),
    );
    for _ in 0..5 {
        assert_eq!(traced_call(&server).await, OK);
    }
    // Ten scheduled delays: anything queued would have been exported by now.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(receiver.spans().is_empty(), "{:?}", receiver.spans());
    // Untraced requests are served as before.
    let mut client = server.client().await;
    let answer = common::server::call(
        &mut client,
        request("traced", vec![descriptor(&[("user", "x")])]),
    )
    .await
    .unwrap();
    assert_eq!(answer.overall_code, OK);
}

/// `serve --config` with `yaml`: the exit code and what it printed.
fn serve_with(yaml: &str) -> (Option<i32>, String) {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("edgelimit.yaml");
    std::fs::write(&config, yaml).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_edgelimit"))
        .args(["serve", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code(), text)
}

#[test]
fn tracing_config_errors_are_located_and_stop_the_start() {
    for (yaml, expected) in [
        (
            "tracing:\n  endpoint: http://127.0.0.1:4317\n  sampling_ratio: 1.5\n",
            "tracing.sampling_ratio",
        ),
        ("tracing:\n  endpoint: collector:4317\n", "tracing.endpoint"),
        (
            "tracing:\n  protocol: http\n  endpoint: https://c:4318\n",
            "tracing.endpoint",
        ),
        ("tracing:\n  protocol: thrift\n", "thrift"),
        ("tracing:\n  max_queue_size: 0\n", "tracing.max_queue_size"),
        // serde: the unknown field and its line.
        (
            "listen: 127.0.0.1:0\ntracing:\n  sampling_rate: 0.5\n",
            "sampling_rate",
        ),
    ] {
        let (code, text) = serve_with(yaml);
        assert_eq!(code, Some(2), "{yaml}: {text}");
        assert!(text.contains(expected), "{yaml}: {expected} not in {text}");
        assert!(text.contains("edgelimit.yaml"), "the file is named: {text}");
    }
}

impl Receiver {
    /// An OTLP/HTTP receiver (`POST /v1/traces`, binary protobuf) on a free loopback port.
    async fn start_http() -> (Self, u16) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let receiver = Receiver::default();
        let store = receiver.clone();
        let app = axum::Router::new().route(
            "/v1/traces",
            axum::routing::post(move |body: axum::body::Bytes| {
                let store = store.clone();
                async move {
                    match ExportTraceServiceRequest::decode(body) {
                        Ok(request) => {
                            store.0.lock().unwrap().push(request);
                            (
                                axum::http::StatusCode::OK,
                                [("content-type", "application/x-protobuf")],
                                ExportTraceServiceResponse::default().encode_to_vec(),
                            )
                        }
                        Err(_) => (
                            axum::http::StatusCode::BAD_REQUEST,
                            [("content-type", "text/plain")],
                            b"not an ExportTraceServiceRequest".to_vec(),
                        ),
                    }
                }
            }),
        );
        tokio::spawn(async move { axum::serve(listener, app).await });
        (receiver, port)
    }
}

/// Started in reference environment mode with the variables Envoy Gateway gives the
/// reference when `rateLimit.telemetry.tracing` is set (no protocol: OTLP/HTTP).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_gateways_tracing_variables_export_otlp_http() {
    let redis = RedisServer::start();
    let (receiver, otlp_port) = Receiver::start_http().await;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("data");
    let config = root.join("ratelimit/config");
    std::fs::create_dir_all(&config).unwrap();
    std::fs::write(config.join("traced.yaml"), POLICY).unwrap();
    let (grpc_port, http_port) = (
        common::redis_server::free_port(),
        common::redis_server::free_port(),
    );
    let log_path = dir.path().join("server.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_edgelimit"))
        .env_clear()
        .args(["serve", "--reference-env"])
        .env("RUNTIME_ROOT", &root)
        .env("RUNTIME_SUBDIRECTORY", "ratelimit")
        .env("GRPC_HOST", "127.0.0.1")
        .env("GRPC_PORT", grpc_port.to_string())
        .env("HOST", "127.0.0.1")
        .env("PORT", http_port.to_string())
        .env("REDIS_SOCKET_TYPE", "tcp")
        .env("REDIS_URL", redis.addr())
        .env("EDGELIMIT_HMAC_SECRET", common::server::TEST_SECRET)
        .env("TRACING_ENABLED", "true")
        .env("TRACING_SERVICE_NAME", "envoy-ratelimit")
        .env("TRACING_SERVICE_NAMESPACE", "envoy-gateway-system")
        .env("TRACING_SERVICE_INSTANCE_ID", "envoy-ratelimit-7d9c-x2")
        .env("TRACING_SAMPLING_RATE", "1.0")
        .env(
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            format!("http://127.0.0.1:{otlp_port}"),
        )
        .env("OTEL_BSP_SCHEDULE_DELAY", "100")
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    let up = common::server::wait_until(Duration::from_secs(30), || {
        std::net::TcpStream::connect(("127.0.0.1", grpc_port)).is_ok()
    });
    let log_text = || std::fs::read_to_string(&log_path).unwrap_or_default();
    assert!(up, "not listening:\n{}", log_text());

    let channel = tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{grpc_port}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient::new(channel);
    let mut r = tonic::Request::new(request(
        "traced",
        vec![descriptor(&[("user", SECRET_VALUE)])],
    ));
    r.set_timeout(Duration::from_secs(5));
    r.metadata_mut().insert(
        "traceparent",
        format!("00-{TRACE_ID}-{PARENT_ID}-01").parse().unwrap(),
    );
    let answer = client.should_rate_limit(r).await.expect("answered");
    assert_eq!(answer.into_inner().overall_code, OK, "{}", log_text());

    let spans = receiver
        .wait_for(&[
            "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
            "edgelimit.backend.evaluate_all",
        ])
        .await;
    let server = spans
        .iter()
        .find(|s| s.name.ends_with("/ShouldRateLimit"))
        .unwrap();
    assert_eq!(hex::encode(&server.trace_id), TRACE_ID);
    assert_eq!(hex::encode(&server.parent_span_id), PARENT_ID);
    let resource = receiver.0.lock().unwrap()[0].resource_spans[0]
        .resource
        .clone()
        .unwrap();
    let a = &resource.attributes;
    assert_eq!(
        string(a, "service.name").as_deref(),
        Some("envoy-ratelimit")
    );
    assert_eq!(
        string(a, "service.namespace").as_deref(),
        Some("envoy-gateway-system")
    );
    assert_eq!(
        string(a, "service.instance.id").as_deref(),
        Some("envoy-ratelimit-7d9c-x2")
    );
    let bytes = receiver.bytes();
    assert!(!bytes
        .windows(SECRET_VALUE.len())
        .any(|w| w == SECRET_VALUE.as_bytes()));
    let _ = child.kill();
    let _ = child.wait();
}
