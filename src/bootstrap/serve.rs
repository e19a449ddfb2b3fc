use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use arc_swap::ArcSwap;
use edgelimit_deny_cache::{DenyCache, DenyCacheSettings};
use tokio::net::TcpListener;

use tokio::task::JoinHandle;

use super::admin::{self, AdminState};
use super::config::{BackendKind, FailureModeConfig, LimitsConfig, ServerConfig};
use super::grpc_server::{self, Dispatch, Http2Settings};
use super::listener::{ConnectionLimits, GuardedIncoming};
use super::readiness::{self, Readiness};
use super::reload::{self, Reloader};
use super::{secret, telemetry};
use crate::contract::RateLimitPort;
use crate::envoy::trace::TracedPort;
use crate::envoy::{FailureMode, HeaderSettings, RateLimiter, ServiceSettings};
use crate::memory::{MemoryBackend, MemoryConfig};
use crate::policy::{LoadOptions, PolicySet};
use crate::redis::RedisBackend;

/// Descriptors of `rls.proto` and its imports, for gRPC reflection (`grpcurl`); regenerate
/// with `examples/trim_descriptors.rs`.
const RLS_DESCRIPTORS: &[u8] = include_bytes!("../../proto/rls_descriptors.bin");

/// What a running server exposes to its caller (tests, `main`).
#[derive(Debug, Clone)]
pub struct ServeHandle {
    /// The TCP listener's address; `None` with `listen_uds`.
    pub grpc_addr: Option<SocketAddr>,
    pub grpc_uds: Option<std::path::PathBuf>,
    pub admin_addr: SocketAddr,
}

pub fn load_options(config: &ServerConfig) -> LoadOptions {
    LoadOptions {
        merge_domains: config.policies.merge_domains,
        default_max_cost: config.policies.default_max_cost,
        cleanup_grace_ms: duration_ms(config.policies.cleanup_grace),
        max_clock_regression_ms: duration_ms(config.policies.max_clock_regression),
        max_file_bytes: config.policies.max_file_bytes,
        max_rules_per_domain: config.policies.max_rules_per_domain,
        max_depth: config.policies.max_depth,
    }
}

fn duration_ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// An error in a setting found after parsing, prefixed with where the setting came from (the
/// configuration file, or the reference environment), as parse errors are. The error's own
/// text names the field; it is printed as one message, not as a chain that would repeat it.
fn located(config: &ServerConfig, error: impl std::fmt::Display) -> anyhow::Error {
    anyhow::anyhow!("{}{error}", config.origin.prefix())
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
            reference: config
                .headers
                .reference
                .then(|| crate::envoy::ReferenceHeaderNames {
                    limit: config.headers.reference_names.limit.clone(),
                    remaining: config.headers.reference_names.remaining.clone(),
                    reset: config.headers.reference_names.reset.clone(),
                }),
        },
        shadow_mode: config.shadow_mode,
        quota_mode: config.quota_mode,
        default_timeout: config.default_timeout,
        deadline_margin: config.deadline_margin,
        bounds: config.limits.request_bounds(),
    }
}

fn rlqs_settings(config: &ServerConfig) -> crate::rlqs::RlqsSettings {
    let limits = &config.limits;
    crate::rlqs::RlqsSettings {
        assignment_ttl: config.rlqs.assignment_ttl,
        max_streams: config.rlqs.max_streams,
        max_buckets_per_stream: config.rlqs.max_buckets_per_stream,
        max_bucket_entries: config.rlqs.max_bucket_entries,
        max_domain_bytes: limits.max_domain_bytes,
        max_key_bytes: limits.max_key_bytes,
        max_value_bytes: limits.max_value_bytes,
        backend_timeout: config.default_timeout,
        shadow_mode: config.shadow_mode,
        ..crate::rlqs::RlqsSettings::default()
    }
}

/// Runs the server until `shutdown` resolves, then drains: reports not ready, stops
/// accepting, and lets in-flight requests finish within `shutdown_grace`. `ready` receives
/// the bound addresses once the listeners are open (ports may be 0 in the configuration).
pub async fn serve(
    config: ServerConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
    ready: Option<tokio::sync::oneshot::Sender<ServeHandle>>,
) -> anyhow::Result<()> {
    let metrics = telemetry::install()?;
    let otel = match config.tracing.as_ref().filter(|t| t.enabled) {
        Some(t) => Some(super::otel::start(t)?),
        None => None,
    };
    let tracer = otel.as_ref().map(|t| t.tracer.clone());
    let policies = match &config.xds {
        // Empty until the management server's first snapshot.
        Some(_) => PolicySet::from_sources(Vec::new(), &load_options(&config))
            .map_err(|errors| anyhow::anyhow!("policy options are invalid:\n{errors}"))?,
        None => {
            let policies = load_policies(&config)?;
            tracing::info!(
                dir = %config.policy_dir.display(),
                revision = %crate::contract::Revision(policies.revision()),
                domains = policies.domains().count(),
                "policies loaded"
            );
            policies
        }
    };
    telemetry::record_loaded(&policies);
    let policies = Arc::new(ArcSwap::from_pointee(policies));
    match config.backend_kind() {
        BackendKind::Memory => {
            let (hasher, _) =
                secret::hasher(&config.hmac_secret, false).map_err(|e| located(&config, e))?;
            let backend = MemoryBackend::new(MemoryConfig {
                max_subjects: config.memory.max_subjects,
                ..MemoryConfig::default()
            });
            tracing::warn!(
                "memory backend: limits are local to this process and are not shared with other replicas"
            );
            let backend = Arc::new(backend);
            let sampler = telemetry::spawn_memory_sampler(backend.clone());
            let ops = Ops {
                metrics,
                tasks: vec![sampler],
                otel,
            };
            let port = Arc::new(TracedPort::new(backend, tracer, "memory"));
            run(config, policies, port, hasher, ops, shutdown, ready).await
        }
        BackendKind::Redis => {
            let (hasher, _) =
                secret::hasher(&config.hmac_secret, true).map_err(|e| located(&config, e))?;
            let settings = config.redis.settings().map_err(|e| located(&config, e))?;
            let backend = RedisBackend::start(settings).map_err(|e| located(&config, e))?;
            // Serving before the first connection would deny every early request.
            let bound = config.redis.connect_timeout * 2;
            if !backend.wait_connected(bound).await {
                tracing::error!(
                    waited = ?bound,
                    "Redis is not reachable; serving anyway and failing closed until it is"
                );
            }
            let backend = Arc::new(backend);
            let sampler = telemetry::spawn_redis_sampler(backend.clone());
            let ops = Ops {
                metrics,
                tasks: vec![sampler],
                otel,
            };
            // Inside the deny cache: a local denial is not a backend call.
            let cached = Arc::new(DenyCache::new(
                Arc::new(TracedPort::new(backend, tracer, "redis")),
                DenyCacheSettings {
                    enabled: config.deny_cache.enabled,
                    max_entries: config.deny_cache.max_entries,
                },
            ));
            run(config, policies, cached, hasher, ops, shutdown, ready).await
        }
    }
}

/// Operational pieces `run` serves next to the limiter, whatever the backend.
struct Ops {
    metrics: metrics_exporter_prometheus::PrometheusHandle,
    /// Backend-specific background tasks, stopped when the server stops.
    tasks: Vec<JoinHandle<()>>,
    /// The span exporter, flushed when the server stops.
    otel: Option<super::otel::Tracing>,
}

async fn run<B: RateLimitPort>(
    config: ServerConfig,
    policies: Arc<ArcSwap<PolicySet>>,
    backend: Arc<B>,
    hasher: edgelimit_envoy::subject::SubjectHasher,
    ops: Ops,
    shutdown: impl Future<Output = ()> + Send + 'static,
    ready: Option<tokio::sync::oneshot::Sender<ServeHandle>>,
) -> anyhow::Result<()> {
    tracing::info!(backend = %backend.describe(), "backend configured");
    let mut tasks = ops.tasks;
    let readiness = Readiness::new();
    readiness.set_policies_loaded();
    if config.require_policies() {
        readiness.require_policies(policies.clone());
    }
    let hasher = Arc::new(hasher);
    let mut limiter = RateLimiter::new(
        policies.clone(),
        backend.clone(),
        hasher.clone(),
        service_settings(&config),
    );
    // The quota service counts against the same subjects and backend as ShouldRateLimit.
    let rlqs = config.rlqs.enabled.then(|| {
        crate::rlqs::QuotaService::new(
            policies.clone(),
            backend.clone(),
            hasher.clone(),
            rlqs_settings(&config),
        )
        .into_server(
            config.limits.max_request_bytes,
            config.limits.max_response_bytes,
        )
    });
    if let Some(previous) =
        secret::previous_hasher(&config.hmac_secret).map_err(|e| located(&config, e))?
    {
        tracing::warn!(
            "HMAC secret rotation in progress: every limit is also enforced under the previous secret"
        );
        limiter = limiter.with_previous_secret(Arc::new(previous));
    }
    let (health_reporter, health_service) = tonic_health::server::health_reporter();
    tasks.push(tokio::spawn(readiness::track(
        readiness.clone(),
        backend.clone(),
        health_reporter.clone(),
    )));
    tasks.push(telemetry::spawn_upkeep(ops.metrics.clone()));
    match &config.xds {
        Some(xds) => {
            // The files are read again on every connection (rotation); unusable ones at start
            // stop it with one located error, as the listener's certificates do, instead of a
            // stream error repeated on every retry.
            if let Some(tls) = &xds.tls {
                super::xds::tls::client_config(tls).map_err(|e| located(&config, e))?;
            }
            tasks.push(super::xds::start(xds, load_options(&config), policies.clone()).await)
        }
        None => tasks.push(reload::spawn(Reloader::new(
            config.policy_dir.clone(),
            load_options(&config),
            policies.clone(),
        ))),
    }

    // Certificate problems stop the start, before anything listens.
    let listener_tls = match &config.tls {
        Some(tls) => {
            Some(super::grpc_tls::ListenerTls::load(tls).map_err(|e| located(&config, e))?)
        }
        None => None,
    };
    let (listener, uds) = match &config.listen_uds {
        Some(uds) => (None, Some(Arc::new(super::uds::bind(uds)?))),
        None => {
            let listener = TcpListener::bind(config.listen)
                .await
                .with_context(|| format!("cannot listen on {}", config.listen))?;
            (Some(listener), None)
        }
    };
    let grpc_addr = listener.as_ref().map(TcpListener::local_addr).transpose()?;
    let admin_listener = TcpListener::bind(config.admin_listen)
        .await
        .with_context(|| format!("cannot listen on {} (admin)", config.admin_listen))?;
    let admin_addr = admin_listener.local_addr()?;
    // Shared by gRPC and `/json`: one limiter, one set of counters.
    let limiter = Arc::new(limiter);
    let default_timeout = config.default_timeout;
    let json_limiter = limiter.clone();
    let decide: admin::Decide = Arc::new(move |request| {
        let limiter = json_limiter.clone();
        Box::pin(async move {
            let started = std::time::Instant::now();
            limiter.decide(&request, started + default_timeout).await
        })
    });
    let admin_router = admin::router(AdminState {
        readiness: readiness.clone(),
        policies: policies.clone(),
        metrics: ops.metrics,
        decide,
        max_json_bytes: config.limits.max_request_bytes,
    });
    // The admin listener outlives the gRPC drain, so `/readyz` answers 503 throughout it.
    tasks.push(tokio::spawn(async move {
        if let Err(error) = axum::serve(admin_listener, admin_router).await {
            tracing::error!(%error, "admin listener failed");
        }
    }));
    let grpc_uds = config.listen_uds.as_ref().map(|u| u.path.clone());
    // Plain `grpc_addr=127.0.0.1:8081` (bench/run.sh and operators' scripts read it); a
    // listener that is not configured is left out.
    tracing::info!(
        grpc_addr = grpc_addr.map(tracing::field::display),
        grpc_uds = grpc_uds.as_ref().map(|p| tracing::field::display(p.display())),
        %admin_addr,
        tls = listener_tls.is_some(),
        "serving Envoy RateLimitService and admin HTTP"
    );
    if let Some(ready) = ready {
        let _ = ready.send(ServeHandle {
            grpc_addr,
            grpc_uds,
            admin_addr,
        });
    }
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(RLS_DESCRIPTORS)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()
        .context("building the gRPC reflection service")?;
    let limits = &config.limits;
    let mut rls = edgelimit_envoy::RateLimitServer::from_arc(limiter)
        .max_decoding_message_size(limits.max_request_bytes)
        .max_encoding_message_size(limits.max_response_bytes);
    if let Some(otel) = &ops.otel {
        rls = rls.with_tracer(otel.tracer.clone());
    }
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let mut routes = tonic::service::Routes::builder();
    routes.add_service(health_service).add_service(reflection);
    if let Some(rlqs) = rlqs {
        routes.add_service(rlqs);
    }
    let dispatch = Dispatch::new(rls, routes.routes(), config.default_timeout);
    let http2 = Http2Settings {
        max_concurrent_streams: limits.max_concurrent_streams,
        keepalive_interval: limits.http2_keepalive_interval,
        keepalive_timeout: limits.http2_keepalive_timeout,
    };
    let stopped = async {
        let _ = stopped.await;
    };
    type ServerFuture<'a> = std::pin::Pin<Box<dyn Future<Output = ()> + Send + 'a>>;
    let server: ServerFuture<'_> = match (listener, &uds, listener_tls) {
        (Some(listener), _, Some(tls)) => {
            let incoming = GuardedIncoming::new(listener, connection_limits(limits));
            tasks.push(tls.spawn_rotation());
            let (incoming, handshakes) =
                super::grpc_tls::incoming(incoming, tls.config, limits.handshake_timeout);
            tasks.push(handshakes);
            Box::pin(grpc_server::serve(incoming, dispatch, &http2, stopped))
        }
        (Some(listener), _, None) => {
            let incoming = GuardedIncoming::new(listener, connection_limits(limits));
            Box::pin(grpc_server::serve(incoming, dispatch, &http2, stopped))
        }
        (None, Some(uds), _) => {
            let incoming = super::uds::UdsIncoming::new(uds.clone(), limits.max_connections);
            Box::pin(grpc_server::serve(incoming, dispatch, &http2, stopped))
        }
        (None, None, _) => anyhow::bail!("no gRPC listener"),
    };
    tokio::pin!(server);
    let result = tokio::select! {
        () = &mut server => Ok(()),
        () = shutdown => {
            drain(&readiness, &health_reporter, stop, server, config.shutdown_grace).await
        }
    };
    for task in tasks {
        task.abort();
    }
    if let Some(otel) = ops.otel {
        otel.shutdown().await;
    }
    // The socket file goes with the listener (the server, which held the other handle, is
    // done).
    drop(uds);
    result
}

fn connection_limits(limits: &LimitsConfig) -> ConnectionLimits {
    ConnectionLimits {
        max_connections: limits.max_connections,
        handshake_timeout: limits.handshake_timeout,
        tcp_keepalive: limits.tcp_keepalive,
        tcp_nodelay: limits.tcp_nodelay,
    }
}

/// Not ready first (so health checkers stop sending), then stop accepting and wait for
/// in-flight requests, at most `grace`.
async fn drain(
    readiness: &Readiness,
    health: &tonic_health::server::HealthReporter,
    stop: tokio::sync::oneshot::Sender<()>,
    server: impl Future<Output = ()>,
    grace: Duration,
) -> anyhow::Result<()> {
    readiness.begin_shutdown();
    readiness::set_health(health, false).await;
    tracing::info!(
        ?grace,
        "shutting down: not ready, no new connections, draining"
    );
    let _ = stop.send(());
    match tokio::time::timeout(grace, server).await {
        Ok(()) => tracing::info!("drained; exiting"),
        Err(_) => tracing::warn!(
            ?grace,
            "shutdown grace elapsed; abandoning requests still in flight"
        ),
    }
    Ok(())
}
