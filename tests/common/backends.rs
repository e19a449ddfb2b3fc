//! One behavioural suite, every backend: a deployment of the real binary on the embedded
//! backend, on a private standalone Redis, or on a private 3-master Redis Cluster, and the
//! `on_every_backend!` macro that stamps a scenario out once per backend.

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tonic::transport::Channel;

use super::redis_server::RedisServer;
use super::server::{call, metric, EdgelimitServer, ServerOptions};
use super::topologies::Cluster;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Memory,
    Redis,
    Cluster,
}

/// A running server and what it stores into.
pub struct Deployment {
    pub backend: Backend,
    pub server: EdgelimitServer,
    pub redis: Option<RedisServer>,
    pub cluster: Option<Cluster>,
}

impl Deployment {
    pub fn start(backend: Backend, policies: &[(&str, &str)]) -> Self {
        Self::start_with(backend, policies, "")
    }

    /// `extra` is appended to the server's configuration (top-level YAML).
    /// Returns once the server reports ready (`EdgelimitServer::wait_ready`).
    pub fn start_with(backend: Backend, policies: &[(&str, &str)], extra: &str) -> Self {
        let deployment = Self::launch(backend, policies, extra);
        deployment.server.wait_ready();
        deployment
    }

    fn launch(backend: Backend, policies: &[(&str, &str)], extra: &str) -> Self {
        match backend {
            Backend::Memory => Deployment {
                backend,
                server: EdgelimitServer::start(ServerOptions::memory(policies).extra(extra)),
                redis: None,
                cluster: None,
            },
            Backend::Redis => {
                let redis = RedisServer::start();
                let server = EdgelimitServer::start(
                    ServerOptions::redis(&redis.url(), policies).extra(extra),
                );
                Deployment {
                    backend,
                    server,
                    redis: Some(redis),
                    cluster: None,
                }
            }
            Backend::Cluster => {
                let cluster = Cluster::start(3);
                let server = EdgelimitServer::start(
                    ServerOptions::memory(policies)
                        .extra(&cluster.config("  command_timeout: 2s\n  connect_timeout: 500ms\n"))
                        .extra(extra),
                );
                Deployment {
                    backend,
                    server,
                    redis: None,
                    cluster: Some(cluster),
                }
            }
        }
    }

    pub async fn client(&self) -> RateLimitServiceClient<Channel> {
        self.server.client().await
    }

    pub async fn ask(&self, request: RateLimitRequest) -> RateLimitResponse {
        let mut client = self.client().await;
        call(&mut client, request).await.expect("answered")
    }

    /// Every `edgelimit:rate:*` key with its hash, from whichever Redis holds them (none for
    /// the embedded backend).
    pub fn stored(&self) -> Vec<StoredKey> {
        let mut out = Vec::new();
        if let Some(redis) = &self.redis {
            scan(|args| redis.cli(args), &mut out);
        }
        if let Some(cluster) = &self.cluster {
            for node in &cluster.nodes {
                scan(|args| node.cli(args), &mut out);
            }
        }
        out.sort();
        out
    }

    /// A counter of the server's metrics, 0 when absent.
    pub fn metric(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        metric(&self.server.metrics(), name, labels).unwrap_or(0.0)
    }
}

/// A state key and its hash fields.
pub type StoredKey = (String, Vec<(String, String)>);

fn scan(cli: impl Fn(&[&str]) -> String, out: &mut Vec<StoredKey>) {
    for key in cli(&["--raw", "KEYS", "edgelimit:rate:*"])
        .lines()
        .filter(|k| !k.is_empty())
    {
        let raw = cli(&["--raw", "HGETALL", key]);
        let lines: Vec<&str> = raw.lines().collect();
        let fields = lines
            .chunks(2)
            .filter(|c| c.len() == 2)
            .map(|c| (c[0].to_owned(), c[1].to_owned()))
            .collect();
        out.push((key.to_owned(), fields));
    }
}

/// `on_every_backend!(name, scenario)` defines a module `name` with one test per backend,
/// each running `scenario(Backend::...)`; `scenario` is an `async fn(Backend)`.
#[macro_export]
macro_rules! on_every_backend {
    ($name:ident, $scenario:path) => {
        mod $name {
            use super::*;
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn memory() {
                $scenario($crate::common::backends::Backend::Memory).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn redis() {
                $scenario($crate::common::backends::Backend::Redis).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn cluster() {
                $scenario($crate::common::backends::Backend::Cluster).await
            }
        }
    };
}
