use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use arc_swap::ArcSwap;
use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;

use super::config::{BackendKind, FailureModeConfig, ServerConfig};
use super::secret;
use crate::contract::{BackendReadiness, RateLimitPort};
use crate::envoy::{FailureMode, HeaderSettings, RateLimiter, ServiceSettings};
use crate::memory::{MemoryBackend, MemoryConfig};
use crate::policy::{LoadOptions, PolicySet};
use crate::redis::{RedisBackend, RedisSettings};

/// Descriptors of `rls.proto` and its imports, for gRPC reflection (`grpcurl`); regenerate
/// with `examples/trim_descriptors.rs`.
const RLS_DESCRIPTORS: &[u8] = include_bytes!("../../proto/rls_descriptors.bin");

/// What a running server exposes to its caller (tests, `main`).
#[derive(Debug, Clone)]
pub struct ServeHandle {
    pub grpc_addr: SocketAddr,
}

pub fn load_options(config: &ServerConfig) -> LoadOptions {
    LoadOptions {
        merge_domains: config.policies.merge_domains,
        default_max_cost: config.policies.default_max_cost,
        cleanup_grace_ms: duration_ms(config.policies.cleanup_grace),
        max_clock_regression_ms: duration_ms(config.policies.max_clock_regression),
        ..LoadOptions::default()
    }
}

fn duration_ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

pub fn load_policies(config: &ServerConfig) -> anyhow::Result<PolicySet> {
    PolicySet::load_dir(&config.policy_dir, &load_options(config)).map_err(|errors| {
        anyhow::anyhow!(
            "policy directory {} is invalid:\n{errors}",
            config.policy_dir.display()
        )
    })
}

fn service_settings(config: &ServerConfig) -> ServiceSettings {
    ServiceSettings {
        failure_mode: match config.failure_mode {
            FailureModeConfig::OverLimit => FailureMode::OverLimit,
            FailureModeConfig::GrpcUnavailable => FailureMode::GrpcUnavailable,
        },
        headers: HeaderSettings {
            draft: config.headers.draft,
            legacy: config.headers.legacy,
            retry_after: config.headers.retry_after,
        },
        shadow_mode: config.shadow_mode,
        default_timeout: config.default_timeout,
        ..ServiceSettings::default()
    }
}

/// Runs the server until `shutdown` resolves. `ready` receives the bound addresses once the
/// listeners are open (ports may be 0 in the configuration).
pub async fn serve(
    config: ServerConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
    ready: Option<tokio::sync::oneshot::Sender<ServeHandle>>,
) -> anyhow::Result<()> {
    let policies = load_policies(&config)?;
    tracing::info!(
        dir = %config.policy_dir.display(),
        domains = policies.domains().count(),
        "policies loaded"
    );
    let policies = Arc::new(ArcSwap::from_pointee(policies));
    match config.backend_kind() {
        BackendKind::Memory => {
            let (hasher, _) = secret::hasher(&config.hmac_secret, false)?;
            let backend = MemoryBackend::new(MemoryConfig {
                max_subjects: config.memory.max_subjects,
                ..MemoryConfig::default()
            });
            tracing::warn!(
                "memory backend: limits are local to this process and are not shared with other replicas"
            );
            run(config, policies, Arc::new(backend), hasher, shutdown, ready).await
        }
        BackendKind::Redis => {
            let (hasher, _) = secret::hasher(&config.hmac_secret, true)?;
            let url = config
                .redis
                .url
                .clone()
                .context("backend: redis needs redis.url")?;
            let backend = RedisBackend::start(RedisSettings {
                url,
                key_prefix: config.redis.key_prefix.clone(),
                command_timeout: config.redis.command_timeout,
                connect_timeout: config.redis.connect_timeout,
                connections: config.redis.connections,
                max_in_flight: config.redis.max_in_flight,
                retry_after: config.redis.retry_after,
            })?;
            // Serving before the first connection would deny every early request.
            let bound = config.redis.connect_timeout * 2;
            if !backend.wait_connected(bound).await {
                tracing::error!(
                    waited = ?bound,
                    "Redis is not reachable; serving anyway and failing closed until it is"
                );
            }
            run(config, policies, Arc::new(backend), hasher, shutdown, ready).await
        }
    }
}

async fn run<B: RateLimitPort>(
    config: ServerConfig,
    policies: Arc<ArcSwap<PolicySet>>,
    backend: Arc<B>,
    hasher: crate::subject::SubjectHasher,
    shutdown: impl Future<Output = ()> + Send + 'static,
    ready: Option<tokio::sync::oneshot::Sender<ServeHandle>>,
) -> anyhow::Result<()> {
    tracing::info!(backend = %backend.describe(), "backend configured");
    let mut limiter = RateLimiter::new(
        policies.clone(),
        backend.clone(),
        Arc::new(hasher),
        service_settings(&config),
    );
    if let Some(previous) = secret::previous_hasher(&config.hmac_secret)? {
        tracing::warn!(
            "HMAC secret rotation in progress: every limit is also enforced under the previous secret"
        );
        limiter = limiter.with_previous_secret(Arc::new(previous));
    }
    let (health_reporter, health_service) = tonic_health::server::health_reporter();
    let readiness_task = tokio::spawn(track_readiness(backend.clone(), health_reporter));

    let listener = TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("cannot listen on {}", config.listen))?;
    let grpc_addr = listener.local_addr()?;
    tracing::info!(%grpc_addr, "serving Envoy RateLimitService");
    if let Some(ready) = ready {
        let _ = ready.send(ServeHandle { grpc_addr });
    }
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(RLS_DESCRIPTORS)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()
        .context("building the gRPC reflection service")?;
    let result = tonic::transport::Server::builder()
        .add_service(health_service)
        .add_service(reflection)
        .add_service(limiter.into_server())
        .serve_with_incoming_shutdown(TcpListenerStream::new(listener), shutdown)
        .await
        .context("gRPC server failed");
    readiness_task.abort();
    result
}

/// Keeps gRPC health in step with the backend: NOT_SERVING while it cannot decide.
async fn track_readiness<B: RateLimitPort>(
    backend: Arc<B>,
    reporter: tonic_health::server::HealthReporter,
) {
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::SERVICE_NAME;
    let mut last = None;
    loop {
        let ready = backend.readiness().await == BackendReadiness::Ready;
        if last != Some(ready) {
            let status = if ready {
                tonic_health::ServingStatus::Serving
            } else {
                tonic_health::ServingStatus::NotServing
            };
            reporter.set_service_status(SERVICE_NAME, status).await;
            reporter.set_service_status("", status).await;
            last = Some(ready);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
