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
    /// `memory` (default without `redis.url`) or `redis`.
    pub backend: Option<BackendKind>,
    pub redis: RedisConfig,
    pub memory: MemoryConfig,
    pub hmac_secret: SecretSource,
    /// `over_limit` (default) or `grpc_unavailable`.
    pub failure_mode: FailureModeConfig,
    pub shadow_mode: bool,
    /// Deadline for callers that send no `grpc-timeout`.
    #[serde(with = "serde_duration")]
    pub default_timeout: Duration,
    pub headers: HeadersConfig,
    pub policies: PolicyDefaults,
    pub log: LogConfig,
    /// How long a shutdown waits for in-flight requests before exiting anyway.
    #[serde(with = "serde_duration")]
    pub shutdown_grace: Duration,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([0, 0, 0, 0], 8081)),
            admin_listen: SocketAddr::from(([0, 0, 0, 0], 9090)),
            policy_dir: PathBuf::from("policies"),
            backend: None,
            redis: RedisConfig::default(),
            memory: MemoryConfig::default(),
            hmac_secret: SecretSource::default(),
            failure_mode: FailureModeConfig::OverLimit,
            shadow_mode: false,
            default_timeout: Duration::from_secs(1),
            headers: HeadersConfig::default(),
            policies: PolicyDefaults::default(),
            log: LogConfig::default(),
            shutdown_grace: Duration::from_secs(10),
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

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RedisConfig {
    /// `redis://[user:password@]host:port/db`; setting it selects the Redis backend.
    pub url: Option<String>,
    pub key_prefix: String,
    #[serde(with = "serde_duration")]
    pub command_timeout: Duration,
    #[serde(with = "serde_duration")]
    pub connect_timeout: Duration,
    pub connections: usize,
    pub max_in_flight: usize,
    /// Back-off advised to clients when Redis cannot decide.
    #[serde(with = "serde_duration")]
    pub retry_after: Duration,
}

impl Default for RedisConfig {
    fn default() -> Self {
        let d = crate::redis::RedisSettings::default();
        Self {
            url: None,
            key_prefix: d.key_prefix,
            command_timeout: d.command_timeout,
            connect_timeout: d.connect_timeout,
            connections: d.connections,
            max_in_flight: d.max_in_flight,
            retry_after: d.retry_after,
        }
    }
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
}

impl Default for HeadersConfig {
    fn default() -> Self {
        let d = crate::envoy::HeaderSettings::default();
        Self {
            draft: d.draft,
            legacy: d.legacy,
            retry_after: d.retry_after,
        }
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
}

impl Default for PolicyDefaults {
    fn default() -> Self {
        Self {
            merge_domains: false,
            default_max_cost: 1_000_000,
            cleanup_grace: Duration::from_secs(60),
            max_clock_regression: Duration::from_secs(2),
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    pub json: bool,
    /// `tracing` filter, e.g. `info` or `edgelimit=debug`.
    pub level: String,
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
        Self::parse(&text).map_err(|message| ConfigFileError::Parse {
            path: path.to_owned(),
            message,
        })
    }

    pub fn parse(text: &str) -> Result<Self, String> {
        if text.trim().is_empty() {
            return Ok(Self::default());
        }
        // No source snippet: the lines around an error may hold a Redis URL with a password.
        serde_saphyr::from_str(text).map_err(|e| e.without_snippet().to_string())
    }

    pub fn backend_kind(&self) -> BackendKind {
        self.backend.unwrap_or(if self.redis.url.is_some() {
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
    fn errors_never_quote_neighbouring_lines() {
        let err =
            ServerConfig::parse("redis:\n  url: redis://u:s3cretpw@h:1/\n  urll: x\n").unwrap_err();
        assert!(err.contains("urll") && err.contains('3'), "{err}");
        assert!(!err.contains("s3cretpw"), "{err}");
    }
}
