//! Policies from an xDS management server, as Envoy Gateway serves them: a real
//! `RateLimitConfigDiscoveryService` written here with tonic and envoy-types on a loopback
//! port, and the real `edgelimit` binary subscribed to it. Initial push, update (counters of
//! unchanged limits kept), invalid push (NACK, last good set kept), management server restart
//! (reconnect, served meanwhile), node id, and starting without initial configuration.

mod common;

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use common::redis_server::free_port;
use common::server::{
    call, descriptor, request, wait_until, EdgelimitServer, ServerOptions, OK, OVER_LIMIT,
};
use common::topologies::Certs;
use edgelimit::bootstrap::xds::proto::{
    RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, RateLimitUnit,
    RATE_LIMIT_CONFIG_TYPE_URL, STREAM_RLS_CONFIGS_PATH,
};
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use envoy_types::pb::google::protobuf::Any;
use futures_util::Stream;
use prost::Message;
use tokio::sync::{mpsc, watch};
use tonic::codegen::{http, Service};
use tonic::server::NamedService;

/// One snapshot: version and resources.
type Snapshot = (String, Vec<RateLimitConfig>);

/// What the management server saw, shared across its restarts.
#[derive(Default)]
struct Seen {
    requests: Mutex<Vec<DiscoveryRequest>>,
}

impl Seen {
    fn requests(&self) -> Vec<DiscoveryRequest> {
        self.requests.lock().map(|r| r.clone()).unwrap_or_default()
    }

    /// The ACK of `version`: a request with that version and a nonce, and no error.
    fn acked(&self, version: &str) -> bool {
        self.requests().iter().any(|r| {
            r.version_info == version && !r.response_nonce.is_empty() && r.error_detail.is_none()
        })
    }

    fn nack(&self, nonce: &str) -> Option<DiscoveryRequest> {
        self.requests()
            .into_iter()
            .find(|r| r.response_nonce == nonce && r.error_detail.is_some())
    }
}

#[derive(Clone)]
struct Ads {
    seen: Arc<Seen>,
    snapshots: watch::Receiver<Snapshot>,
}

type ResponseStream = Pin<Box<dyn Stream<Item = Result<DiscoveryResponse, tonic::Status>> + Send>>;

#[tonic::async_trait]
impl AggregatedDiscoveryService for Ads {
    type StreamAggregatedResourcesStream = ResponseStream;
    type DeltaAggregatedResourcesStream =
        Pin<Box<dyn Stream<Item = Result<DeltaDiscoveryResponse, tonic::Status>> + Send>>;

    async fn stream_aggregated_resources(
        &self,
        request: tonic::Request<tonic::Streaming<DiscoveryRequest>>,
    ) -> Result<tonic::Response<ResponseStream>, tonic::Status> {
        let mut inbound = request.into_inner();
        let seen = self.seen.clone();
        let mut snapshots = self.snapshots.clone();
        let (tx, rx) = mpsc::channel(4);
        tokio::spawn(async move {
            let mut nonce = 0u32;
            let mut subscribed = false;
            loop {
                let send_now = tokio::select! {
                    message = inbound.message() => match message {
                        Ok(Some(r)) => {
                            let first = r.response_nonce.is_empty();
                            if let Ok(mut all) = seen.requests.lock() {
                                all.push(r);
                            }
                            // The snapshot goes out after the subscription, then on change.
                            let send = first && !subscribed;
                            subscribed = true;
                            send
                        }
                        _ => break,
                    },
                    changed = snapshots.changed(), if subscribed => {
                        if changed.is_err() {
                            break;
                        }
                        true
                    }
                };
                if send_now {
                    nonce += 1;
                    let (version, configs) = snapshots.borrow_and_update().clone();
                    let response = DiscoveryResponse {
                        version_info: version.clone(),
                        resources: configs
                            .iter()
                            .map(|c| Any {
                                type_url: RATE_LIMIT_CONFIG_TYPE_URL.into(),
                                value: c.encode_to_vec(),
                            })
                            .collect(),
                        type_url: RATE_LIMIT_CONFIG_TYPE_URL.into(),
                        nonce: format!("{version}-{nonce}"),
                        ..DiscoveryResponse::default()
                    };
                    if tx.send(Ok(response)).await.is_err() {
                        break;
                    }
                }
            }
        });
        Ok(tonic::Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }

    async fn delta_aggregated_resources(
        &self,
        _request: tonic::Request<tonic::Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<tonic::Response<Self::DeltaAggregatedResourcesStream>, tonic::Status> {
        Err(tonic::Status::unimplemented("state of the world only"))
    }
}

/// The ADS implementation served under the reference's service name: the two services have
/// the same message types, only the path differs.
#[derive(Clone)]
struct RlsConfigDs<S>(S);

impl<S> NamedService for RlsConfigDs<S> {
    const NAME: &'static str = "ratelimit.service.ratelimit.v3.RateLimitConfigDiscoveryService";
}

impl<S, B> Service<http::Request<B>> for RlsConfigDs<S>
where
    S: Service<http::Request<B>, Error = Infallible>,
{
    type Response = S::Response;
    type Error = Infallible;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, mut req: http::Request<B>) -> Self::Future {
        if req.uri().path() == STREAM_RLS_CONFIGS_PATH {
            *req.uri_mut() = http::Uri::from_static(
                "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources",
            );
        }
        self.0.call(req)
    }
}

/// A management server on its own runtime, so that stopping it closes every connection as a
/// crashed process would.
struct ManagementServer {
    runtime: Option<tokio::runtime::Runtime>,
}

/// A TLS connection accepted by the test's management server.
struct TlsConn(tokio_rustls::server::TlsStream<tokio::net::TcpStream>);

impl tonic::transport::server::Connected for TlsConn {
    type ConnectInfo = ();
    fn connect_info(&self) {}
}

impl tokio::io::AsyncRead for TlsConn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for TlsConn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

/// Server certificate from `certs`, and client certificates required and verified against
/// its CA (mTLS), as Envoy Gateway's xDS server does.
fn mtls_server_config(certs: &Certs) -> Arc<rustls::ServerConfig> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(&certs.ca).expect("ca") {
        roots.add(cert.expect("ca cert")).expect("add ca");
    }
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        provider.clone(),
    )
    .build()
    .expect("client verifier");
    let chain = CertificateDer::pem_file_iter(&certs.server_cert)
        .expect("server cert")
        .collect::<Result<Vec<_>, _>>()
        .expect("server chain");
    let key = PrivateKeyDer::from_pem_file(&certs.server_key).expect("server key");
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("protocol versions")
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)
        .expect("server config");
    config.alpn_protocols = vec![b"h2".to_vec()];
    Arc::new(config)
}

impl ManagementServer {
    fn start(port: u16, seen: Arc<Seen>, snapshots: watch::Receiver<Snapshot>) -> Self {
        Self::start_with(port, seen, snapshots, None)
    }

    fn start_with(
        port: u16,
        seen: Arc<Seen>,
        snapshots: watch::Receiver<Snapshot>,
        tls: Option<Arc<rustls::ServerConfig>>,
    ) -> Self {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("management server runtime");
        let (bound_tx, bound_rx) = std::sync::mpsc::channel();
        runtime.spawn(async move {
            let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
                .await
                .expect("bind the management server port");
            let _ = bound_tx.send(());
            let service = RlsConfigDs(AggregatedDiscoveryServiceServer::new(Ads {
                seen,
                snapshots,
            }));
            let server = tonic::transport::Server::builder().add_service(service);
            match tls {
                None => {
                    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
                    let _ = server.serve_with_incoming(incoming).await;
                }
                Some(config) => {
                    let acceptor = tokio_rustls::TlsAcceptor::from(config);
                    let (tx, rx) = mpsc::channel::<std::io::Result<TlsConn>>(8);
                    tokio::spawn(async move {
                        while let Ok((tcp, _)) = listener.accept().await {
                            let acceptor = acceptor.clone();
                            let tx = tx.clone();
                            // A failed handshake (untrusted client) is just dropped.
                            tokio::spawn(async move {
                                if let Ok(tls) = acceptor.accept(tcp).await {
                                    let _ = tx.send(Ok(TlsConn(tls))).await;
                                }
                            });
                        }
                    });
                    let incoming = tokio_stream::wrappers::ReceiverStream::new(rx);
                    let _ = server.serve_with_incoming(incoming).await;
                }
            }
        });
        bound_rx
            .recv_timeout(Duration::from_secs(10))
            .expect("management server bound");
        Self {
            runtime: Some(runtime),
        }
    }

    fn stop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

impl Drop for ManagementServer {
    fn drop(&mut self) {
        self.stop();
    }
}

fn limit(unit: RateLimitUnit, n: u32) -> Option<RateLimitPolicy> {
    Some(RateLimitPolicy {
        unit: unit as i32,
        requests_per_unit: n,
        ..RateLimitPolicy::default()
    })
}

fn entry(key: &str, value: &str, rate_limit: Option<RateLimitPolicy>) -> RateLimitDescriptor {
    RateLimitDescriptor {
        key: key.into(),
        value: value.into(),
        rate_limit,
        ..RateLimitDescriptor::default()
    }
}

/// What Envoy Gateway pushes for one route: a generic key per route, nested per client.
fn gateway_config(
    route_limit: Option<RateLimitPolicy>,
    extra: Vec<RateLimitDescriptor>,
) -> RateLimitConfig {
    let mut descriptors = vec![
        entry("route", "a", route_limit),
        entry("other", "", limit(RateLimitUnit::Minute, 5)),
    ];
    descriptors.extend(extra);
    RateLimitConfig {
        name: "default/eg/http".into(),
        domain: "gw".into(),
        descriptors,
    }
}

fn xds_yaml(port: u16, force_start: bool) -> String {
    format!(
        "xds:\n  server_url: http://127.0.0.1:{port}\n  node_id: edgelimit-test-node\n  \
         force_start_without_initial_config: {force_start}\n  backoff_initial: 100ms\n  backoff_max: 400ms\n"
    )
}

/// Codes of `n` successive single-hit calls for one descriptor of domain `gw`.
async fn codes(server: &EdgelimitServer, entries: &[(&str, &str)], n: usize) -> Vec<i32> {
    let mut client = server.client().await;
    let mut out = Vec::new();
    for _ in 0..n {
        let response = call(&mut client, request("gw", vec![descriptor(entries)]))
            .await
            .expect("ShouldRateLimit");
        out.push(response.overall_code);
    }
    out
}

async fn current_limit(server: &EdgelimitServer, entries: &[(&str, &str)]) -> Option<u32> {
    let mut client = server.client().await;
    let response = call(&mut client, request("gw", vec![descriptor(entries)]))
        .await
        .expect("ShouldRateLimit");
    response.statuses[0]
        .current_limit
        .as_ref()
        .map(|l| l.requests_per_unit)
}

const BOUND: Duration = Duration::from_secs(10);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pushes_are_served_acked_nacked_and_survive_a_management_server_restart() {
    let port = free_port();
    let seen = Arc::new(Seen::default());
    let (publish, snapshots) = watch::channel::<Snapshot>((
        "v1".into(),
        vec![gateway_config(limit(RateLimitUnit::Minute, 2), vec![])],
    ));
    let mut management = ManagementServer::start(port, seen.clone(), snapshots.clone());
    // Without force start, the listeners open only once the first snapshot is served.
    let server = EdgelimitServer::start(ServerOptions::memory(&[]).extra(&xds_yaml(port, false)));
    assert!(
        wait_until(BOUND, || seen.acked("v1")),
        "v1 ACKed:\n{}",
        server.log_text()
    );
    let first = &seen.requests()[0];
    assert_eq!(
        first.node.as_ref().map(|n| n.id.as_str()),
        Some("edgelimit-test-node"),
        "the configured node id is sent"
    );
    assert_eq!(first.type_url, RATE_LIMIT_CONFIG_TYPE_URL);

    // Initial push served.
    assert_eq!(
        codes(&server, &[("route", "a")], 3).await,
        [OK, OK, OVER_LIMIT]
    );
    assert_eq!(codes(&server, &[("other", "x")], 1).await, [OK]);

    // Update: the changed limit is served, the unchanged one keeps its count (1 of 5).
    publish
        .send((
            "v2".into(),
            vec![gateway_config(limit(RateLimitUnit::Minute, 3), vec![])],
        ))
        .expect("publish v2");
    assert!(
        wait_until(BOUND, || seen.acked("v2")),
        "v2 ACKed:\n{}",
        server.log_text()
    );
    assert_eq!(current_limit(&server, &[("route", "a")]).await, Some(3));
    assert_eq!(
        codes(&server, &[("other", "x")], 5).await,
        [OK, OK, OK, OK, OVER_LIMIT],
        "the counter of the unchanged limit survived the push"
    );

    // Invalid push: NACKed with the resource and field, last good set still served.
    publish
        .send((
            "v3".into(),
            vec![gateway_config(limit(RateLimitUnit::Unknown, 3), vec![])],
        ))
        .expect("publish v3");
    assert!(
        wait_until(BOUND, || seen.nack("v3-3").is_some()),
        "v3 NACKed: {:?}\n{}",
        seen.requests(),
        server.log_text()
    );
    let nack = seen.nack("v3-3").expect("NACK");
    assert_eq!(
        nack.version_info, "v2",
        "a NACK names the version still served"
    );
    let detail = nack.error_detail.expect("error_detail");
    assert!(
        detail.message.contains("xds:default/eg/http")
            && detail.message.contains("descriptors[0].rate_limit.unit"),
        "{}",
        detail.message
    );
    assert_eq!(current_limit(&server, &[("route", "a")]).await, Some(3));
    assert_eq!(codes(&server, &[("route", "a")], 1).await, [OVER_LIMIT]);

    // Management server gone: the last good set is still served.
    management.stop();
    let before = seen.requests().len();
    assert_eq!(codes(&server, &[("other", "x")], 1).await, [OVER_LIMIT]);
    assert_eq!(current_limit(&server, &[("route", "a")]).await, Some(3));

    // Back, with a new snapshot: edgelimit reconnects, subscribes again and serves it.
    publish
        .send((
            "v4".into(),
            vec![gateway_config(
                limit(RateLimitUnit::Minute, 3),
                vec![entry("new", "", limit(RateLimitUnit::Hour, 1))],
            )],
        ))
        .expect("publish v4");
    let _management = ManagementServer::start(port, seen.clone(), snapshots);
    assert!(
        wait_until(BOUND, || seen.acked("v4")),
        "v4 ACKed after reconnect:\n{}",
        server.log_text()
    );
    let resubscribe = &seen.requests()[before];
    assert_eq!(
        resubscribe.version_info, "v2",
        "the reconnected stream starts from the version served"
    );
    assert_eq!(codes(&server, &[("new", "n")], 2).await, [OK, OVER_LIMIT]);
    assert_eq!(
        codes(&server, &[("other", "x")], 1).await,
        [OVER_LIMIT],
        "counters survive the reconnect"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_start_serves_before_the_first_snapshot_and_picks_it_up_later() {
    let port = free_port();
    let server = EdgelimitServer::start(ServerOptions::memory(&[]).extra(&xds_yaml(port, true)));
    // Listening (start returned) and ready with no management server at all.
    assert!(wait_until(BOUND, || server.admin_get("/readyz").0 == 200));
    assert_eq!(current_limit(&server, &[("route", "a")]).await, None);

    let seen = Arc::new(Seen::default());
    let (_publish, snapshots) = watch::channel::<Snapshot>((
        "v1".into(),
        vec![gateway_config(limit(RateLimitUnit::Second, 7), vec![])],
    ));
    let _management = ManagementServer::start(port, seen.clone(), snapshots);
    assert!(
        wait_until(BOUND, || seen.acked("v1")),
        "v1 ACKed:\n{}",
        server.log_text()
    );
    assert_eq!(current_limit(&server, &[("route", "a")]).await, Some(7));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mtls_to_the_management_server_verifies_both_ends() {
    let dir = tempfile::tempdir().expect("cert dir");
    let certs = Certs::generate(dir.path());
    let port = free_port();
    let seen = Arc::new(Seen::default());
    let (_publish, snapshots) = watch::channel::<Snapshot>((
        "v1".into(),
        vec![gateway_config(limit(RateLimitUnit::Minute, 4), vec![])],
    ));
    let _management = ManagementServer::start_with(
        port,
        seen.clone(),
        snapshots,
        Some(mtls_server_config(&certs)),
    );
    let tls = |ca: &std::path::Path| {
        format!(
            "xds:\n  server_url: https://127.0.0.1:{port}\n  node_id: edgelimit-test-node\n  \
             force_start_without_initial_config: true\n  backoff_initial: 100ms\n  backoff_max: 400ms\n  \
             tls:\n    ca_file: {}\n    cert_file: {}\n    key_file: {}\n",
            ca.display(),
            certs.client_cert.display(),
            certs.client_key.display()
        )
    };

    // A server certificate from another CA is refused: nothing is received, nothing served.
    let untrusted = EdgelimitServer::start(ServerOptions::memory(&[]).extra(&tls(&certs.other_ca)));
    assert!(
        wait_until(BOUND, || untrusted.log_text().contains("xDS stream failed")),
        "{}",
        untrusted.log_text()
    );
    assert!(
        seen.requests().is_empty(),
        "no request reached the server over an untrusted TLS session"
    );
    assert_eq!(current_limit(&untrusted, &[("route", "a")]).await, None);

    // No client certificate: the management server refuses the session (mTLS).
    let no_identity = tls(&certs.ca)
        .lines()
        .filter(|l| !l.contains("cert_file") && !l.contains("key_file"))
        .collect::<Vec<_>>()
        .join("\n");
    let anonymous = EdgelimitServer::start(ServerOptions::memory(&[]).extra(&no_identity));
    assert!(
        wait_until(BOUND, || anonymous.log_text().contains("xDS stream failed")),
        "{}",
        anonymous.log_text()
    );
    assert!(seen.requests().is_empty(), "an anonymous client is refused");
    drop(anonymous);

    // Trusted CA and a client certificate the server verifies: subscribed and served.
    let server = EdgelimitServer::start(ServerOptions::memory(&[]).extra(&tls(&certs.ca)));
    assert!(
        wait_until(BOUND, || seen.acked("v1")),
        "v1 ACKed over mTLS:\n{}",
        server.log_text()
    );
    assert_eq!(current_limit(&server, &[("route", "a")]).await, Some(4));
}

/// The edgelimit binary in reference environment mode, killed when dropped.
struct ReferenceMode {
    child: std::process::Child,
    log: std::path::PathBuf,
}

impl ReferenceMode {
    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for ReferenceMode {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Started the way Envoy Gateway starts the reference (its rate-limit Deployment's
/// variables: xDS over mTLS from the gateway, TLS with a client CA on the gRPC listener,
/// Redis, force start), plus the HMAC secret; Envoy's side is an mTLS gRPC client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_gateway_environment_serves_pushed_limits_over_mtls() {
    use common::redis_server::RedisServer;
    use edgelimit::bootstrap::config::TlsConfig;
    use edgelimit::bootstrap::xds::tls::{client_config, connector};
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;

    let redis = RedisServer::start();
    let dir = tempfile::tempdir().expect("dir");
    let certs = Certs::generate(dir.path());
    let xds_port = free_port();
    let seen = Arc::new(Seen::default());
    let (_publish, snapshots) = watch::channel::<Snapshot>((
        "eg-1".into(),
        vec![gateway_config(limit(RateLimitUnit::Minute, 2), vec![])],
    ));
    let _gateway = ManagementServer::start_with(
        xds_port,
        seen.clone(),
        snapshots,
        Some(mtls_server_config(&certs)),
    );
    let (grpc_port, http_port) = (free_port(), free_port());
    let log = dir.path().join("server.log");
    let out = std::fs::File::create(&log).expect("log");
    let err = out.try_clone().expect("log");
    let path = |p: &std::path::Path| p.display().to_string();
    let env: Vec<(&str, String)> = vec![
        ("RUNTIME_ROOT", path(&dir.path().join("data"))),
        ("RUNTIME_SUBDIRECTORY", "ratelimit".into()),
        ("RUNTIME_IGNOREDOTFILES", "true".into()),
        ("RUNTIME_WATCH_ROOT", "false".into()),
        ("LOG_LEVEL", "info".into()),
        ("USE_STATSD", "false".into()),
        ("CONFIG_TYPE", "GRPC_XDS_SOTW".into()),
        (
            "CONFIG_GRPC_XDS_SERVER_URL",
            format!("127.0.0.1:{xds_port}"),
        ),
        ("CONFIG_GRPC_XDS_NODE_ID", "envoy-ratelimit".into()),
        ("FORCE_START_WITHOUT_INITIAL_CONFIG", "true".into()),
        ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true".into()),
        ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", path(&certs.client_cert)),
        ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", path(&certs.client_key)),
        ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", path(&certs.ca)),
        ("GRPC_SERVER_USE_TLS", "true".into()),
        ("GRPC_SERVER_TLS_CERT", path(&certs.server_cert)),
        ("GRPC_SERVER_TLS_KEY", path(&certs.server_key)),
        ("GRPC_CLIENT_TLS_CACERT", path(&certs.ca)),
        ("REDIS_SOCKET_TYPE", "tcp".into()),
        ("REDIS_URL", redis.addr()),
        ("REDIS_TIMEOUT", "2s".into()),
        ("GRPC_HOST", "127.0.0.1".into()),
        ("GRPC_PORT", grpc_port.to_string()),
        ("HOST", "127.0.0.1".into()),
        ("PORT", http_port.to_string()),
        ("EDGELIMIT_HMAC_SECRET", common::server::TEST_SECRET.into()),
        ("NO_COLOR", "1".into()),
    ];
    let binary = std::env::var_os("EDGELIMIT_TEST_BIN")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::PathBuf::from(env!("CARGO_BIN_EXE_edgelimit")));
    let child = std::process::Command::new(binary)
        .env_clear()
        .args(["serve", "--reference-env"])
        .envs(env)
        .stdout(out)
        .stderr(err)
        .spawn()
        .expect("spawn edgelimit");
    let server = ReferenceMode { child, log };
    assert!(
        wait_until(BOUND, || seen.acked("eg-1")),
        "ACKed over mTLS:\n{}",
        server.log_text()
    );
    assert_eq!(
        seen.requests()[0].node.as_ref().map(|n| n.id.as_str()),
        Some("envoy-ratelimit")
    );

    // Not a TCP probe: connecting to a port not yet bound can connect to itself.
    assert!(wait_until(BOUND, || server
        .log_text()
        .contains("serving Envoy RateLimitService")));
    let tls = TlsConfig {
        ca_file: Some(certs.ca.clone()),
        cert_file: Some(certs.client_cert.clone()),
        key_file: Some(certs.client_key.clone()),
    };
    let channel = tonic::transport::Endpoint::from_shared(format!("https://127.0.0.1:{grpc_port}"))
        .expect("endpoint")
        .connect_with_connector(connector(client_config(&tls).expect("client tls")))
        .await
        .unwrap_or_else(|e| panic!("connect over mTLS: {e}\n{}", server.log_text()));
    let mut envoy = RateLimitServiceClient::new(channel);
    let mut got = Vec::new();
    for _ in 0..3 {
        let r = call(
            &mut envoy,
            request("gw", vec![descriptor(&[("route", "a")])]),
        )
        .await
        .unwrap_or_else(|e| panic!("ShouldRateLimit: {e}\n{}", server.log_text()));
        got.push(r.overall_code);
    }
    assert_eq!(got, [OK, OK, OVER_LIMIT], "{}", server.log_text());
}
