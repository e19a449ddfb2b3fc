//! The server's own configuration file (`edgelimit.yaml`). Every field has a default, so an
//! empty file — or none — runs the embedded backend with `policies/`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use super::duration::serde_duration;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// gRPC listener for Envoy.
    pub listen: SocketAddr,
    /// HTTP listener for `/metrics`, `/healthz`, `/readyz` and `/admin/policies`.
    pub admin_listen: SocketAddr,
    pub policy_dir: PathBuf,
    /// Policies from an xDS management server instead of `policy_dir`.
    pub xds: Option<super::xds::XdsConfig>,
    /// TLS (mTLS with `client_ca_file`) on the gRPC listener.
    pub tls: Option<super::grpc_tls::ListenerTlsConfig>,
    /// gRPC on a Unix domain socket instead of `listen` (the reference's `GRPC_UDS`).
    pub listen_uds: Option<super::uds::UdsConfig>,
    /// OpenTelemetry spans over OTLP/gRPC; off when absent.
    pub tracing: Option<super::otel::TracingConfig>,
    /// `memory` (default without a `redis` topology) or `redis`.
    pub backend: Option<BackendKind>,
    pub redis: RedisConfig,
    pub memory: MemoryConfig,
    pub hmac_secret: SecretSource,
    /// Exact local denials for subjects that cannot pass (Redis backend).
    pub deny_cache: DenyCacheConfig,
    /// `over_limit` (default) or `grpc_unavailable`.
    pub failure_mode: FailureModeConfig,
    /// Global shadow mode (the reference's `SHADOW_MODE`): statuses as computed, the overall
    /// code never `OVER_LIMIT`.
    pub shadow_mode: bool,
    /// Global quota mode (the reference's `QUOTA_MODE`): every descriptor is a quota one.
    pub quota_mode: bool,
    /// Deadline for callers that send no `grpc-timeout`.
    #[serde(with = "serde_duration")]
    pub default_timeout: Duration,
    /// Kept back from the caller's deadline: the backend must be done this long before it.
    #[serde(with = "serde_duration")]
    pub deadline_margin: Duration,
    pub headers: HeadersConfig,
    pub policies: PolicyDefaults,
    /// Bounds on what clients may send and hold open (requests, connections, streams).
    pub limits: LimitsConfig,
    pub log: LogConfig,
    /// How long a shutdown waits for in-flight requests before exiting anyway.
    #[serde(with = "serde_duration")]
    pub shutdown_grace: Duration,
    pub readiness: ReadinessConfig,
    /// Envoy's Rate Limit Quota Service on the gRPC listener.
    pub rlqs: RlqsConfig,
    /// Where the settings came from, to locate errors found after parsing.
    #[serde(skip)]
    pub origin: ConfigOrigin,
}

/// `rlqs:`: the quota service's bounds and assignment lifetime (see README, RLQS).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RlqsConfig {
    pub enabled: bool,
    /// `assignment_time_to_live` of every assignment; also how long a vanished instance's
    /// share stays reserved.
    #[serde(with = "serde_duration")]
    pub assignment_ttl: Duration,
    pub max_streams: usize,
    pub max_buckets_per_stream: usize,
    pub max_bucket_entries: usize,
}

impl Default for RlqsConfig {
    fn default() -> Self {
        let d = edgelimit_rlqs::RlqsSettings::default();
        Self {
            enabled: true,
            assignment_ttl: d.assignment_ttl,
            max_streams: d.max_streams,
            max_buckets_per_stream: d.max_buckets_per_stream,
            max_bucket_entries: d.max_bucket_entries,
        }
    }
}

impl RlqsConfig {
    fn validate(&self) -> Result<(), String> {
        for (field, value) in [
            ("max_streams", self.max_streams),
            ("max_buckets_per_stream", self.max_buckets_per_stream),
            ("max_bucket_entries", self.max_bucket_entries),
        ] {
            if value == 0 {
                return Err(format!("rlqs.{field}: must be at least 1"));
            }
        }
        // Every order of a bucket's entries may be tried: 8! lookups is the most allowed.
        if self.max_bucket_entries > 8 {
            return Err("rlqs.max_bucket_entries: at most 8".into());
        }
        if self.assignment_ttl < Duration::from_secs(1) {
            return Err("rlqs.assignment_ttl: at least 1s (Envoy reads whole seconds)".into());
        }
        Ok(())
    }
}

/// The source of a [`ServerConfig`], named by every error found once it is parsed (a secret
/// file that cannot be read, a bad Redis URL, a TLS file) as parse errors name their line.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum ConfigOrigin {
    /// No configuration file: the defaults and command-line flags.
    #[default]
    Defaults,
    File(PathBuf),
    /// envoyproxy/ratelimit's environment variables (`serve --reference-env`).
    ReferenceEnv,
}

impl ConfigOrigin {
    /// `"<file>: "`, `"reference environment: "`, or nothing for the defaults.
    pub fn prefix(&self) -> String {
        match self {
            ConfigOrigin::Defaults => String::new(),
            ConfigOrigin::File(path) => format!("{}: ", path.display()),
            ConfigOrigin::ReferenceEnv => "reference environment: ".into(),
        }
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ReadinessConfig {
    /// Not ready while the loaded policy set has no domain (the reference's
    /// `HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED`). Unset: on with the Redis backend (a shared
    /// deployment, where an empty set would allow everything behind every replica), off with
    /// the embedded one.
    pub require_policies: Option<bool>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([0, 0, 0, 0], 8081)),
            admin_listen: SocketAddr::from(([0, 0, 0, 0], 9090)),
            policy_dir: PathBuf::from("policies"),
            xds: None,
            tls: None,
            listen_uds: None,
            tracing: None,
            backend: None,
            redis: RedisConfig::default(),
            memory: MemoryConfig::default(),
            hmac_secret: SecretSource::default(),
            deny_cache: DenyCacheConfig::default(),
            failure_mode: FailureModeConfig::OverLimit,
            shadow_mode: false,
            quota_mode: false,
            default_timeout: Duration::from_secs(1),
            deadline_margin: Duration::from_millis(2),
            headers: HeadersConfig::default(),
            policies: PolicyDefaults::default(),
            limits: LimitsConfig::default(),
            log: LogConfig::default(),
            shutdown_grace: Duration::from_secs(10),
            readiness: ReadinessConfig::default(),
            rlqs: RlqsConfig::default(),
            origin: ConfigOrigin::Defaults,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DenyCacheConfig {
    pub enabled: bool,
    pub max_entries: usize,
}

impl Default for DenyCacheConfig {
    fn default() -> Self {
        let d = edgelimit_deny_cache::DenyCacheSettings::default();
        Self {
            enabled: d.enabled,
            max_entries: d.max_entries,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BackendKind {
    Memory,
    Redis,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureModeConfig {
    OverLimit,
    GrpcUnavailable,
}

/// `Debug` is written out by hand: URLs may carry `user:password@`.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RedisConfig {
    /// One server: `redis://` / `rediss://[user:password@]host:port/db`. Exactly one of
    /// `url`, `cluster_nodes` and `sentinel` selects the Redis backend and its topology.
    pub url: Option<String>,
    /// Redis Cluster seed nodes (`redis://host:port` or `rediss://`).
    pub cluster_nodes: Option<Vec<String>>,
    /// A primary found through Redis Sentinel.
    pub sentinel: Option<SentinelConfig>,
    /// ACL user on the data nodes.
    pub username: Option<String>,
    /// Password (ACL user's, or `requirepass`) read from a file or an environment variable.
    pub password_file: Option<PathBuf>,
    pub password_env: Option<String>,
    /// Custom CA and client certificate for `rediss://`.
    pub tls: Option<TlsConfig>,
    pub key_prefix: String,
    #[serde(with = "serde_duration")]
    pub command_timeout: Duration,
    #[serde(with = "serde_duration")]
    pub connect_timeout: Duration,
    pub connections: usize,
    pub max_in_flight: usize,
    /// Most requests decided by one batch program call; 1 turns batching off.
    pub batch_max: usize,
    /// Back-off advised to clients when Redis cannot decide.
    #[serde(with = "serde_duration")]
    pub retry_after: Duration,
    /// Reference environment mode: `REDIS_AUTH` is `user:password`; the password is what
    /// follows the first colon.
    #[serde(skip)]
    pub password_after_colon: bool,
}

#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SentinelConfig {
    pub master_name: String,
    /// Sentinel addresses: `redis://host:26379` (`rediss://` for TLS to the Sentinels).
    pub nodes: Vec<String>,
    /// Credentials of the Sentinels themselves, when they require them.
    #[serde(default)]
    pub username: Option<String>,
    #[serde(default)]
    pub password_file: Option<PathBuf>,
    #[serde(default)]
    pub password_env: Option<String>,
    /// Database number on the primary.
    #[serde(default)]
    pub db: i64,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TlsConfig {
    /// PEM CA bundle to trust instead of the built-in (Mozilla) roots.
    pub ca_file: Option<PathBuf>,
    /// PEM client certificate and key, for Redis `tls-auth-clients`.
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
}

impl Default for RedisConfig {
    fn default() -> Self {
        let d = crate::redis::RedisSettings::default();
        Self {
            url: None,
            cluster_nodes: None,
            sentinel: None,
            username: None,
            password_file: None,
            password_env: None,
            tls: None,
            key_prefix: d.key_prefix,
            command_timeout: d.command_timeout,
            connect_timeout: d.connect_timeout,
            connections: d.connections,
            max_in_flight: d.max_in_flight,
            batch_max: d.batch_max,
            retry_after: d.retry_after,
            password_after_colon: false,
        }
    }
}

impl std::fmt::Debug for RedisConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use crate::redis::Redacted;
        let nodes = |list: &Option<Vec<String>>| {
            list.as_ref().map(|l| {
                l.iter()
                    .map(|u| Redacted(u).to_string())
                    .collect::<Vec<_>>()
            })
        };
        f.debug_struct("RedisConfig")
            .field("url", &self.url.as_deref().map(Redacted))
            .field("cluster_nodes", &nodes(&self.cluster_nodes))
            .field("sentinel", &self.sentinel)
            .field("username", &self.username)
            .field("password_file", &self.password_file)
            .field("password_env", &self.password_env)
            .field("tls", &self.tls)
            .field("key_prefix", &self.key_prefix)
            .field("command_timeout", &self.command_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("connections", &self.connections)
            .field("max_in_flight", &self.max_in_flight)
            .field("batch_max", &self.batch_max)
            .field("retry_after", &self.retry_after)
            .finish()
    }
}

impl std::fmt::Debug for SentinelConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use crate::redis::Redacted;
        let nodes: Vec<String> = self.nodes.iter().map(|u| Redacted(u).to_string()).collect();
        f.debug_struct("SentinelConfig")
            .field("master_name", &self.master_name)
            .field("nodes", &nodes)
            .field("username", &self.username)
            .field("password_file", &self.password_file)
            .field("password_env", &self.password_env)
            .field("db", &self.db)
            .finish()
    }
}

/// Problems turning `redis:` into backend settings. None quotes a password or a URL's
/// credentials.
#[derive(Debug, thiserror::Error)]
pub enum RedisConfigError {
    #[error("redis: set exactly one of `url`, `cluster_nodes` and `sentinel` (found {0})")]
    Topology(&'static str),
    #[error("{0}: set at most one of `password_file` and `password_env`")]
    PasswordAmbiguous(&'static str),
    // `error` is not a `#[source]`: printed here once, not again by an error chain.
    #[error("{field}.password_file: cannot read {path}: {error}")]
    PasswordFile {
        field: &'static str,
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("{field}.password_env: environment variable {var} is not set or not UTF-8")]
    PasswordEnv { field: &'static str, var: String },
}

impl RedisConfig {
    /// Whether any topology is configured (which selects the Redis backend by default).
    pub fn configured(&self) -> bool {
        self.url.is_some() || self.cluster_nodes.is_some() || self.sentinel.is_some()
    }

    /// The backend settings, with passwords read from their files / environment variables.
    pub fn settings(&self) -> Result<crate::redis::RedisSettings, RedisConfigError> {
        use crate::redis::{RedisSettings, SentinelSettings, TlsFiles, Topology};
        let topology = match (&self.url, &self.cluster_nodes, &self.sentinel) {
            (Some(url), None, None) => Topology::Standalone { url: url.clone() },
            (None, Some(nodes), None) => Topology::Cluster {
                nodes: nodes.clone(),
            },
            (None, None, Some(s)) => Topology::Sentinel(SentinelSettings {
                master_name: s.master_name.clone(),
                nodes: s.nodes.clone(),
                username: s.username.clone(),
                password: read_password(
                    "redis.sentinel",
                    s.password_file.as_deref(),
                    s.password_env.as_deref(),
                )?,
                db: s.db,
            }),
            (None, None, None) => return Err(RedisConfigError::Topology("none")),
            _ => return Err(RedisConfigError::Topology("several")),
        };
        Ok(RedisSettings {
            topology,
            username: self.username.clone(),
            password: read_password(
                "redis",
                self.password_file.as_deref(),
                self.password_env.as_deref(),
            )?
            .map(|p| match p.expose().split_once(':') {
                Some((_, password)) if self.password_after_colon => {
                    crate::redis::Secret::new(password.to_owned())
                }
                _ => p,
            }),
            tls: self.tls.as_ref().map(|t| TlsFiles {
                ca_file: t.ca_file.clone(),
                cert_file: t.cert_file.clone(),
                key_file: t.key_file.clone(),
            }),
            key_prefix: self.key_prefix.clone(),
            command_timeout: self.command_timeout,
            connect_timeout: self.connect_timeout,
            connections: self.connections,
            max_in_flight: self.max_in_flight,
            batch_max: self.batch_max,
            retry_after: self.retry_after,
        })
    }
}

fn read_password(
    field: &'static str,
    file: Option<&Path>,
    env: Option<&str>,
) -> Result<Option<crate::redis::Secret>, RedisConfigError> {
    let mut value = match (file, env) {
        (None, None) => return Ok(None),
        (Some(_), Some(_)) => return Err(RedisConfigError::PasswordAmbiguous(field)),
        (Some(path), None) => {
            std::fs::read_to_string(path).map_err(|error| RedisConfigError::PasswordFile {
                field,
                path: path.to_owned(),
                error,
            })?
        }
        (None, Some(var)) => std::env::var(var).map_err(|_| RedisConfigError::PasswordEnv {
            field,
            var: var.to_owned(),
        })?,
    };
    // Files written by editors and `echo` end with a newline that is not part of the password.
    while value.ends_with(['\n', '\r']) {
        value.pop();
    }
    Ok(Some(crate::redis::Secret::new(value)))
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MemoryConfig {
    /// Subjects tracked at most; new subjects beyond it are denied (fail closed).
    pub max_subjects: usize,
}

impl Default for MemoryConfig {
    fn default() -> Self {
        Self {
            max_subjects: 1_000_000,
        }
    }
}

/// Where the HMAC secret comes from. Exactly one of `file` / `env`; the value is never logged.
/// `previous_file` / `previous_env` name the secret being rotated out (see SECURITY.md).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SecretSource {
    pub file: Option<PathBuf>,
    pub env: Option<String>,
    pub previous_file: Option<PathBuf>,
    pub previous_env: Option<String>,
}

impl SecretSource {
    /// The source of the secret being rotated out, if one is configured.
    pub fn previous(&self) -> Option<SecretSource> {
        (self.previous_file.is_some() || self.previous_env.is_some()).then(|| SecretSource {
            file: self.previous_file.clone(),
            env: self.previous_env.clone(),
            previous_file: None,
            previous_env: None,
        })
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HeadersConfig {
    pub draft: bool,
    pub legacy: bool,
    pub retry_after: bool,
    /// The reference's `RateLimit-Limit` / `-Remaining` / `-Reset` trio
    /// (`LIMIT_RESPONSE_HEADERS_ENABLED`).
    pub reference: bool,
    pub reference_names: ReferenceHeaderNamesConfig,
}

impl Default for HeadersConfig {
    fn default() -> Self {
        let d = crate::envoy::HeaderSettings::default();
        Self {
            draft: d.draft,
            legacy: d.legacy,
            retry_after: d.retry_after,
            reference: d.reference.is_some(),
            reference_names: ReferenceHeaderNamesConfig::default(),
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ReferenceHeaderNamesConfig {
    pub limit: String,
    pub remaining: String,
    pub reset: String,
}

impl Default for ReferenceHeaderNamesConfig {
    fn default() -> Self {
        let d = crate::envoy::ReferenceHeaderNames::default();
        Self {
            limit: d.limit,
            remaining: d.remaining,
            reset: d.reset,
        }
    }
}

impl ReferenceHeaderNamesConfig {
    /// Header names must be valid HTTP field names (token characters), or Envoy drops them.
    fn validate(&self) -> Result<(), String> {
        for (field, name) in [
            ("limit", &self.limit),
            ("remaining", &self.remaining),
            ("reset", &self.reset),
        ] {
            let token = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
            if name.is_empty() || !name.bytes().all(token) {
                return Err(format!(
                    "headers.reference_names.{field}: `{name}` is not a valid HTTP header name"
                ));
            }
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PolicyDefaults {
    /// Allow one domain to span several files.
    pub merge_domains: bool,
    /// Largest cost (hits_addend) a single request may ask for, unless a limit sets its own.
    pub default_max_cost: u64,
    #[serde(with = "serde_duration")]
    pub cleanup_grace: Duration,
    #[serde(with = "serde_duration")]
    pub max_clock_regression: Duration,
    /// Largest policy file accepted, in bytes.
    pub max_file_bytes: u64,
    /// Most descriptors (rules) one domain may hold, over all its files.
    pub max_rules_per_domain: usize,
    /// Deepest descriptor nesting accepted.
    pub max_depth: usize,
}

impl Default for PolicyDefaults {
    fn default() -> Self {
        let d = crate::policy::LoadOptions::default();
        Self {
            merge_domains: d.merge_domains,
            default_max_cost: d.default_max_cost,
            cleanup_grace: Duration::from_secs(60),
            max_clock_regression: Duration::from_secs(2),
            max_file_bytes: d.max_file_bytes,
            max_rules_per_domain: d.max_rules_per_domain,
            max_depth: d.max_depth,
        }
    }
}

/// What one client may send and hold open. Requests beyond the per-request bounds are
/// answered `INVALID_ARGUMENT`; messages beyond `max_request_bytes` are refused by the gRPC
/// codec before they are buffered; connections beyond `max_connections` are closed at once.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LimitsConfig {
    pub max_domain_bytes: usize,
    pub max_descriptors: usize,
    pub max_entries_per_descriptor: usize,
    pub max_key_bytes: usize,
    pub max_value_bytes: usize,
    /// Largest encoded `ShouldRateLimit` request (gRPC message), in bytes.
    pub max_request_bytes: usize,
    /// Largest encoded response; far above what the request bounds can produce.
    pub max_response_bytes: usize,
    /// HTTP/2 `SETTINGS_MAX_CONCURRENT_STREAMS`: requests in flight per connection.
    pub max_concurrent_streams: u32,
    /// Open gRPC connections at most; further ones are accepted and closed immediately.
    pub max_connections: usize,
    /// Time a new connection has to send the HTTP/2 preface before it is closed.
    #[serde(with = "serde_duration")]
    pub handshake_timeout: Duration,
    /// HTTP/2 PING sent after this much silence; an unanswered one closes the connection.
    #[serde(with = "serde_duration")]
    pub http2_keepalive_interval: Duration,
    #[serde(with = "serde_duration")]
    pub http2_keepalive_timeout: Duration,
    /// TCP keepalive idle time before the kernel probes a silent peer.
    #[serde(with = "serde_duration")]
    pub tcp_keepalive: Duration,
    pub tcp_nodelay: bool,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        let b = crate::envoy::RequestBounds::default();
        Self {
            max_domain_bytes: b.max_domain_bytes,
            max_descriptors: b.max_descriptors,
            max_entries_per_descriptor: b.max_entries_per_descriptor,
            max_key_bytes: b.max_key_bytes,
            max_value_bytes: b.max_value_bytes,
            max_request_bytes: 64 * 1024,
            max_response_bytes: 1024 * 1024,
            max_concurrent_streams: 100,
            max_connections: 1024,
            handshake_timeout: Duration::from_secs(10),
            http2_keepalive_interval: Duration::from_secs(30),
            http2_keepalive_timeout: Duration::from_secs(10),
            tcp_keepalive: Duration::from_secs(60),
            tcp_nodelay: true,
        }
    }
}

impl LimitsConfig {
    /// A zero bound would refuse every request or connection: reject it when loading.
    fn validate(&self) -> Result<(), String> {
        let counts = [
            ("max_domain_bytes", self.max_domain_bytes),
            ("max_descriptors", self.max_descriptors),
            (
                "max_entries_per_descriptor",
                self.max_entries_per_descriptor,
            ),
            ("max_key_bytes", self.max_key_bytes),
            ("max_value_bytes", self.max_value_bytes),
            ("max_request_bytes", self.max_request_bytes),
            ("max_response_bytes", self.max_response_bytes),
            ("max_connections", self.max_connections),
            (
                "max_concurrent_streams",
                usize::try_from(self.max_concurrent_streams).unwrap_or(usize::MAX),
            ),
        ];
        for (field, value) in counts {
            if value == 0 {
                return Err(format!("limits.{field}: must be at least 1"));
            }
        }
        let durations = [
            ("handshake_timeout", self.handshake_timeout),
            ("http2_keepalive_interval", self.http2_keepalive_interval),
            ("http2_keepalive_timeout", self.http2_keepalive_timeout),
            ("tcp_keepalive", self.tcp_keepalive),
        ];
        for (field, value) in durations {
            if value.is_zero() {
                return Err(format!("limits.{field}: must be longer than 0"));
            }
        }
        Ok(())
    }

    /// The per-request bounds the service checks before any lookup.
    pub fn request_bounds(&self) -> crate::envoy::RequestBounds {
        crate::envoy::RequestBounds {
            max_domain_bytes: self.max_domain_bytes,
            max_descriptors: self.max_descriptors,
            max_entries_per_descriptor: self.max_entries_per_descriptor,
            max_key_bytes: self.max_key_bytes,
            max_value_bytes: self.max_value_bytes,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    pub json: bool,
    /// `tracing` filter, e.g. `info` or `warn,edgelimit=debug`; validated at load (a typo
    /// would otherwise silence every log line).
    #[serde(deserialize_with = "deserialize_log_level")]
    pub level: String,
}

fn deserialize_log_level<'de, D: serde::Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    let level = String::deserialize(d)?;
    super::log_filter::validate(&level).map_err(serde::de::Error::custom)?;
    Ok(level)
}

impl Default for LogConfig {
    fn default() -> Self {
        Self {
            json: false,
            level: "info".into(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigFileError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Parse { path: PathBuf, message: String },
}

impl ServerConfig {
    pub fn load(path: &Path) -> Result<Self, ConfigFileError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigFileError::Read {
            path: path.to_owned(),
            source,
        })?;
        let mut config = Self::parse(&text).map_err(|message| ConfigFileError::Parse {
            path: path.to_owned(),
            message,
        })?;
        config.origin = ConfigOrigin::File(path.to_owned());
        Ok(config)
    }

    pub fn parse(text: &str) -> Result<Self, String> {
        if text.trim().is_empty() {
            return Ok(Self::default());
        }
        // No source snippet: the lines around an error may hold a Redis URL with a password.
        let config: Self =
            serde_saphyr::from_str(text).map_err(|e| e.without_snippet().to_string())?;
        config.limits.validate()?;
        config.rlqs.validate()?;
        if let Some(xds) = &config.xds {
            xds.validate()?;
        }
        if let Some(uds) = &config.listen_uds {
            uds.validate()?;
            if config.tls.is_some() {
                return Err(
                    "listen_uds: TLS on the unix socket is not supported; unset tls or listen_uds"
                        .into(),
                );
            }
        }
        if let Some(tracing) = config.tracing.as_ref().filter(|t| t.enabled) {
            tracing.validate()?;
        }
        config.headers.reference_names.validate()?;
        if config.deny_cache.enabled && config.deny_cache.max_entries == 0 {
            return Err(
                "deny_cache.max_entries: must be at least 1 (or set deny_cache.enabled: false)"
                    .into(),
            );
        }
        Ok(config)
    }

    /// `readiness.require_policies`, or its default for the backend.
    pub fn require_policies(&self) -> bool {
        self.readiness
            .require_policies
            .unwrap_or(self.backend_kind() == BackendKind::Redis)
    }

    pub fn backend_kind(&self) -> BackendKind {
        self.backend.unwrap_or(if self.redis.configured() {
            BackendKind::Redis
        } else {
            BackendKind::Memory
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_file_is_all_defaults_on_memory() {
        let c = ServerConfig::parse("").unwrap();
        assert_eq!(c.listen.port(), 8081);
        assert_eq!(c.backend_kind(), BackendKind::Memory);
    }

    #[test]
    fn redis_url_selects_redis_and_durations_parse() {
        let c = ServerConfig::parse(
            "redis:\n  url: redis://127.0.0.1:6380/\n  command_timeout: 15ms\nfailure_mode: grpc_unavailable\n",
        )
        .unwrap();
        assert_eq!(c.backend_kind(), BackendKind::Redis);
        assert_eq!(c.redis.command_timeout, Duration::from_millis(15));
        assert_eq!(c.failure_mode, FailureModeConfig::GrpcUnavailable);
    }

    #[test]
    fn unknown_fields_and_bad_values_name_the_line() {
        let err = ServerConfig::parse("listen: 0.0.0.0:1\nredis:\n  urll: x\n").unwrap_err();
        assert!(err.contains("urll"), "{err}");
        assert!(err.contains('3'), "line number expected: {err}");
        let err = ServerConfig::parse("default_timeout: 10\n").unwrap_err();
        assert!(err.contains("no unit"), "{err}");
    }

    #[test]
    fn limits_and_policy_bounds_parse_and_zero_is_refused() {
        let c = ServerConfig::parse(
            "limits:\n  max_descriptors: 3\n  max_request_bytes: 1024\n  handshake_timeout: 250ms\npolicies:\n  max_depth: 4\n  max_file_bytes: 2048\n",
        )
        .unwrap();
        assert_eq!(c.limits.max_descriptors, 3);
        assert_eq!(c.limits.request_bounds().max_descriptors, 3);
        assert_eq!(c.limits.max_request_bytes, 1024);
        assert_eq!(c.limits.handshake_timeout, Duration::from_millis(250));
        assert_eq!(
            c.limits.max_key_bytes,
            LimitsConfig::default().max_key_bytes
        );
        assert_eq!((c.policies.max_depth, c.policies.max_file_bytes), (4, 2048));
        let err = ServerConfig::parse("limits:\n  max_connections: 0\n").unwrap_err();
        assert!(err.contains("limits.max_connections"), "{err}");
        let err = ServerConfig::parse("limits:\n  tcp_keepalive: 0s\n").unwrap_err();
        assert!(err.contains("limits.tcp_keepalive"), "{err}");
        let err = ServerConfig::parse("limits:\n  max_streams: 1\n").unwrap_err();
        assert!(err.contains("max_streams"), "{err}");
    }

    #[test]
    fn a_bad_log_level_is_refused_with_its_line() {
        let err = ServerConfig::parse("listen: 127.0.0.1:1\nlog:\n  level: warning\n").unwrap_err();
        assert!(err.contains("warning") && err.contains('3'), "{err}");
        assert!(ServerConfig::parse("log:\n  level: \"\"\n").is_err());
        let ok = ServerConfig::parse("log:\n  level: warn,edgelimit=debug\n").unwrap();
        assert_eq!(ok.log.level, "warn,edgelimit=debug");
    }

    #[test]
    fn errors_never_quote_neighbouring_lines() {
        let err =
            ServerConfig::parse("redis:\n  url: redis://u:s3cretpw@h:1/\n  urll: x\n").unwrap_err();
        assert!(err.contains("urll") && err.contains('3'), "{err}");
        assert!(!err.contains("s3cretpw"), "{err}");
    }

    #[test]
    fn topologies_select_redis_and_are_exclusive() {
        let c = ServerConfig::parse(
            "redis:\n  cluster_nodes: [redis://127.0.0.1:7000, redis://127.0.0.1:7001]\n",
        )
        .unwrap();
        assert_eq!(c.backend_kind(), BackendKind::Redis);
        assert!(matches!(
            c.redis.settings().unwrap().topology,
            crate::redis::Topology::Cluster { ref nodes } if nodes.len() == 2
        ));
        let c = ServerConfig::parse(
            "redis:\n  sentinel:\n    master_name: mymaster\n    nodes: [redis://127.0.0.1:26379]\n",
        )
        .unwrap();
        assert_eq!(c.backend_kind(), BackendKind::Redis);
        let c =
            ServerConfig::parse("redis:\n  url: redis://h:1/\n  cluster_nodes: [redis://h:2]\n")
                .unwrap();
        let err = c.redis.settings().unwrap_err().to_string();
        assert!(err.contains("exactly one"), "{err}");
    }

    #[test]
    fn passwords_come_from_files_or_env_and_are_never_echoed() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("pw");
        std::fs::write(&file, "f1le-secret\n").unwrap();
        let c = ServerConfig::parse(&format!(
            "redis:\n  url: rediss://127.0.0.1:1/\n  username: edgelimit\n  password_file: {}\n  tls:\n    ca_file: /ca.pem\n",
            file.display()
        ))
        .unwrap();
        let settings = c.redis.settings().unwrap();
        assert_eq!(settings.password.as_ref().unwrap().expose(), "f1le-secret");
        assert!(!format!("{settings:?}").contains("f1le-secret"));
        assert!(!format!("{c:?}").contains("f1le-secret"));
        let c = ServerConfig::parse("redis:\n  url: redis://u:urlpw123@h:1/\n").unwrap();
        assert!(!format!("{c:?}").contains("urlpw123"));

        std::env::set_var("EDGELIMIT_TEST_REDIS_PW_1", "env-secret");
        let c = ServerConfig::parse(
            "redis:\n  url: redis://127.0.0.1:1/\n  password_env: EDGELIMIT_TEST_REDIS_PW_1\n",
        )
        .unwrap();
        let settings = c.redis.settings().unwrap();
        assert_eq!(settings.password.as_ref().unwrap().expose(), "env-secret");
        assert!(!format!("{settings:?}").contains("env-secret"));

        let c = ServerConfig::parse(
            "redis:\n  url: redis://127.0.0.1:1/\n  password_env: EDGELIMIT_TEST_REDIS_PW_UNSET\n",
        )
        .unwrap();
        let err = c.redis.settings().unwrap_err().to_string();
        assert!(err.contains("EDGELIMIT_TEST_REDIS_PW_UNSET"), "{err}");
        let err =
            ServerConfig::parse("redis:\n  url: redis://u:urlpw123@h:1/\n  tls:\n    ca_flie: x\n")
                .unwrap_err();
        assert!(
            err.contains("ca_flie") && !err.contains("urlpw123"),
            "{err}"
        );
    }
}
