//! How one connection is made for each topology, what it is (`Link`), and how its health is
//! judged. The supervision around it (slots, back-off, health-check timing) is topology-blind
//! and lives in `connections.rs`. Cluster nodes are connected one by one (`NodeClients`,
//! supervised in `cluster/`).

use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{
    AsyncConnectionConfig, Client, Cmd, ConnectionAddr, ConnectionInfo, ErrorKind,
    IntoConnectionInfo, RedisError, RedisResult, TlsCertificates, TlsMode, Value,
};
use tokio::sync::Mutex;

use super::classify::breaks_connection;
use super::settings::{RedisSettings, RedisSetupError, SentinelSettings, Topology};
use super::tls;

/// Health-check verdict for a Sentinel connection whose node is no longer the primary.
pub const PRIMARY_MOVED: &str = "the Sentinels name another primary";

/// Makes connections for one configured topology (Cluster: see `NodeClients`).
pub enum Connector {
    Standalone(Client),
    Sentinel(SentinelResolver),
}

/// One live connection of any topology. Cloning is cheap (a handle onto a shared multiplexer).
#[derive(Clone)]
pub enum Link {
    Standalone(MultiplexedConnection),
    /// A primary found through Sentinel, with the address it had when it was resolved.
    Sentinel {
        connection: MultiplexedConnection,
        primary: String,
    },
}

impl Link {
    /// Sends one command; server error replies come back as `Value::ServerError`, or as an
    /// error once a cluster connection gave up retrying them.
    pub async fn send(&mut self, cmd: &Cmd) -> RedisResult<Value> {
        match self {
            Link::Standalone(connection) | Link::Sentinel { connection, .. } => {
                connection.send_packed_command(cmd).await
            }
        }
    }

    /// Whether `error` means this link must be replaced. Behind Sentinel, `READONLY` means the node was demoted: reconnecting
    /// re-resolves the primary instead of sending more commands to a replica (a standalone
    /// URL would only lead back to the same node).
    pub fn broken_by(&self, error: &RedisError) -> bool {
        match self {
            Link::Standalone(_) => breaks_connection(error),
            Link::Sentinel { .. } => {
                breaks_connection(error)
                    || error.kind() == ErrorKind::Server(redis::ServerErrorKind::ReadOnly)
            }
        }
    }

    pub fn kind(&self) -> &'static str {
        match self {
            Link::Standalone(_) => "standalone",
            Link::Sentinel { .. } => "sentinel",
        }
    }
}

/// Finds the current primary through the Sentinels. One lookup at a time: the client keeps
/// one cached connection per Sentinel.
pub struct SentinelResolver {
    client: Mutex<SentinelClient>,
}

impl SentinelResolver {
    /// A client for the primary the Sentinels name now (checked with `ROLE` by the lookup).
    async fn primary(&self) -> RedisResult<Client> {
        self.client.lock().await.async_get_client().await
    }
}

impl Connector {
    pub fn build(settings: &RedisSettings) -> Result<Self, RedisSetupError> {
        if settings.uses_tls() || settings.tls.is_some() {
            tls::install_crypto_provider();
        }
        let certs = settings.tls.as_ref().map(tls::certificates).transpose()?;
        let client_error = |e: RedisError| RedisSetupError::Client(format!("{:?}", e.kind()));
        match &settings.topology {
            Topology::Standalone { url } => {
                let info = with_credentials(parse("redis.url", url)?, settings);
                let client = match certs {
                    Some(certs) => Client::build_with_tls(info, certs),
                    None => Client::open(info),
                }
                .map_err(client_error)?;
                Ok(Self::Standalone(client))
            }
            Topology::Cluster { .. } => Err(RedisSetupError::Client(
                "a cluster is connected node by node".into(),
            )),
            Topology::Sentinel(sentinel) => {
                // Located errors for the Sentinels' URLs (the client's own name no field).
                for url in &sentinel.nodes {
                    parse("redis.sentinel.nodes", url)?;
                }
                let client = sentinel_client(sentinel, settings, certs).map_err(client_error)?;
                Ok(Self::Sentinel(SentinelResolver {
                    client: Mutex::new(client),
                }))
            }
        }
    }

    /// Connects once, bounded by `connect_timeout` per step (Sentinel: lookup, then connect).
    pub async fn connect(&self, connect_timeout: Duration) -> RedisResult<Link> {
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(connect_timeout))
            // Each command is bounded by the caller's deadline instead (see `run`).
            .set_response_timeout(None);
        let bounded = |what: &'static str| {
            move |_| RedisError::from((ErrorKind::Io, "connect timed out", what.to_owned()))
        };
        match self {
            Connector::Standalone(client) => client
                .get_multiplexed_async_connection_with_config(&config)
                .await
                .map(Link::Standalone),
            Connector::Sentinel(resolver) => {
                let client = tokio::time::timeout(connect_timeout, resolver.primary())
                    .await
                    .map_err(bounded("sentinel lookup"))??;
                let primary = client.get_connection_info().addr().to_string();
                let connection = client
                    .get_multiplexed_async_connection_with_config(&config)
                    .await?;
                Ok(Link::Sentinel {
                    connection,
                    primary,
                })
            }
        }
    }

    /// `Ok` if `link` answers `PING` within `timeout` and, for
    /// Sentinel, is still the primary the Sentinels name. The reason is for the log.
    pub async fn check(&self, link: &Link, timeout: Duration) -> Result<(), &'static str> {
        let mut pinged = link.clone();
        let ping = redis::cmd("PING");
        match tokio::time::timeout(timeout, pinged.send(&ping)).await {
            Ok(Ok(Value::SimpleString(ref s))) if s == "PONG" => {}
            _ => return Err("health check failed"),
        }
        if let (Connector::Sentinel(resolver), Link::Sentinel { primary, .. }) = (self, link) {
            // The old primary keeps accepting writes until the Sentinels reconfigure it, so a
            // failover is noticed here rather than by errors. An unreachable Sentinel says
            // nothing about the primary: keep the connection.
            if let Ok(Ok(current)) = tokio::time::timeout(timeout, resolver.primary()).await {
                if current.get_connection_info().addr().to_string() != *primary {
                    return Err(PRIMARY_MOVED);
                }
            }
        }
        Ok(())
    }
}

/// Makes a client for any Cluster node: the seeds' scheme (TLS or not), credentials and
/// certificates, with the address the slot map names.
pub struct NodeClients {
    template: ConnectionInfo,
    certs: Option<TlsCertificates>,
    seeds: Vec<String>,
}

impl NodeClients {
    pub fn build(settings: &RedisSettings) -> Result<Self, RedisSetupError> {
        let Topology::Cluster { nodes } = &settings.topology else {
            return Err(RedisSetupError::NoNodes("cluster_nodes"));
        };
        if settings.uses_tls() || settings.tls.is_some() {
            tls::install_crypto_provider();
        }
        let certs = settings.tls.as_ref().map(tls::certificates).transpose()?;
        let mut seeds = Vec::with_capacity(nodes.len());
        let mut template = None;
        for url in nodes {
            let info = with_credentials(parse("redis.cluster_nodes", url)?, settings);
            let addr = match info.addr() {
                ConnectionAddr::Tcp(host, port) | ConnectionAddr::TcpTls { host, port, .. } => {
                    format!("{host}:{port}")
                }
                _ => {
                    return Err(RedisSetupError::url(
                        "redis.cluster_nodes",
                        url,
                        &RedisError::from((
                            ErrorKind::InvalidClientConfig,
                            "a cluster node needs a host and port",
                        )),
                    ))
                }
            };
            seeds.push(addr);
            template.get_or_insert(info);
        }
        let template = template.ok_or(RedisSetupError::NoNodes("cluster_nodes"))?;
        let clients = Self {
            template,
            certs,
            seeds,
        };
        // Fails here, at start, rather than on the first node the map names.
        let (host, port) = clients.seeds[0]
            .rsplit_once(':')
            .and_then(|(h, p)| Some((h.to_owned(), p.parse::<u16>().ok()?)))
            .ok_or(RedisSetupError::NoNodes("cluster_nodes"))?;
        clients
            .client(&host, port)
            .map_err(|e| RedisSetupError::Client(format!("{:?}", e.kind())))?;
        Ok(clients)
    }

    /// The seed nodes' `host:port`.
    pub fn seeds(&self) -> &[String] {
        &self.seeds
    }

    pub fn client(&self, host: &str, port: u16) -> RedisResult<Client> {
        let addr = match self.template.addr() {
            ConnectionAddr::TcpTls { insecure, .. } => ConnectionAddr::TcpTls {
                host: host.to_owned(),
                port,
                insecure: *insecure,
                tls_params: None,
            },
            _ => ConnectionAddr::Tcp(host.to_owned(), port),
        };
        let info = self.template.clone().set_addr(addr);
        match &self.certs {
            Some(certs) => Client::build_with_tls(info, certs.clone()),
            None => Client::open(info),
        }
    }
}

fn parse(field: &'static str, url: &str) -> Result<ConnectionInfo, RedisSetupError> {
    url.into_connection_info()
        .map_err(|e| RedisSetupError::url(field, url, &e))
}

/// `redis.username` / `redis.password` win over credentials in the URL.
fn with_credentials(info: ConnectionInfo, settings: &RedisSettings) -> ConnectionInfo {
    let mut redis = info.redis_settings().clone();
    if let Some(username) = &settings.username {
        redis = redis.set_username(username);
    }
    if let Some(password) = &settings.password {
        redis = redis.set_password(password.expose());
    }
    info.set_redis_settings(redis)
}

fn sentinel_client(
    sentinel: &SentinelSettings,
    settings: &RedisSettings,
    certs: Option<TlsCertificates>,
) -> RedisResult<SentinelClient> {
    let mut addrs = Vec::with_capacity(sentinel.nodes.len());
    let mut sentinels_use_tls = false;
    for url in &sentinel.nodes {
        let info = url.as_str().into_connection_info()?;
        sentinels_use_tls |= super::settings::is_tls_url(url);
        addrs.push(info.addr().clone());
    }
    let mut builder = SentinelClientBuilder::new(
        addrs,
        sentinel.master_name.clone(),
        SentinelServerType::Master,
    )?
    .set_client_to_redis_db(sentinel.db);
    if let Some(username) = &sentinel.username {
        builder = builder.set_client_to_sentinel_username(username);
    }
    if let Some(password) = &sentinel.password {
        builder = builder.set_client_to_sentinel_password(password.expose());
    }
    if let Some(username) = &settings.username {
        builder = builder.set_client_to_redis_username(username);
    }
    if let Some(password) = &settings.password {
        builder = builder.set_client_to_redis_password(password.expose());
    }
    if let Some(certs) = certs {
        if sentinels_use_tls {
            builder = builder.set_client_to_sentinel_certificates(certs.clone());
        }
        builder = builder
            .set_client_to_redis_tls_mode(TlsMode::Secure)
            .set_client_to_redis_certificates(certs);
    }
    builder.build()
}
