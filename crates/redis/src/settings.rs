//! What the Redis backend is configured with: where Redis is (one server, a Sentinel-managed
//! primary, or a Cluster), how to authenticate and encrypt, and the request-path bounds.
//! Secrets are zeroized on drop and never printed: `Debug` redacts passwords, including any
//! `user:password@` inside a URL.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use zeroize::Zeroizing;

use super::keys::KeyBuilder;

/// A password. Its `Debug` prints `<redacted>`; its bytes are wiped when dropped.
#[derive(Clone)]
pub struct Secret(Zeroizing<String>);

impl Secret {
    pub fn new(value: String) -> Self {
        Self(Zeroizing::new(value))
    }

    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// A URL whose `Debug` / `Display` hide the `user:password@` part.
pub struct Redacted<'a>(pub &'a str);

impl fmt::Display for Redacted<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let url = self.0;
        let authority_start = url.find("://").map_or(0, |i| i + 3);
        let authority_end = url[authority_start..]
            .find(['/', '?', '#'])
            .map_or(url.len(), |i| authority_start + i);
        match url[authority_start..authority_end].rfind('@') {
            Some(at) => write!(
                f,
                "{}<redacted>@{}",
                &url[..authority_start],
                &url[authority_start + at + 1..]
            ),
            None => f.write_str(url),
        }
    }
}

impl fmt::Debug for Redacted<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "\"{self}\"")
    }
}

struct RedactedList<'a>(&'a [String]);

impl fmt::Debug for RedactedList<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.0.iter().map(|u| Redacted(u)))
            .finish()
    }
}

/// Where Redis is.
#[derive(Clone)]
pub enum Topology {
    /// One server: `redis://` or `rediss://host:port/db`.
    Standalone { url: String },
    /// A Redis Cluster, discovered from any of these nodes.
    Cluster { nodes: Vec<String> },
    /// A primary found by asking these Sentinels for `master_name`.
    Sentinel(SentinelSettings),
}

impl fmt::Debug for Topology {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Standalone { url } => f
                .debug_struct("Standalone")
                .field("url", &Redacted(url))
                .finish(),
            Self::Cluster { nodes } => f
                .debug_struct("Cluster")
                .field("nodes", &RedactedList(nodes))
                .finish(),
            Self::Sentinel(s) => s.fmt(f),
        }
    }
}

#[derive(Clone)]
pub struct SentinelSettings {
    pub master_name: String,
    /// Sentinel addresses, `redis://host:port` (`rediss://` for TLS to the Sentinels).
    pub nodes: Vec<String>,
    /// Credentials for the Sentinels themselves (`requirepass` / ACL on the Sentinels).
    pub username: Option<String>,
    pub password: Option<Secret>,
    /// Database on the primary.
    pub db: i64,
}

impl fmt::Debug for SentinelSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sentinel")
            .field("master_name", &self.master_name)
            .field("nodes", &RedactedList(&self.nodes))
            .field("username", &self.username)
            .field("password", &self.password)
            .field("db", &self.db)
            .finish()
    }
}

/// PEM files for TLS: a CA to trust instead of the built-in roots, and an optional client
/// certificate and key (Redis `tls-auth-clients`).
#[derive(Debug, Clone, Default)]
pub struct TlsFiles {
    pub ca_file: Option<PathBuf>,
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
}

#[derive(Debug, Clone)]
pub struct RedisSettings {
    pub topology: Topology,
    /// ACL user for the data nodes; overrides a user in the URLs.
    pub username: Option<String>,
    /// Password for the data nodes; overrides a password in the URLs.
    pub password: Option<Secret>,
    /// Custom CA / client certificate; TLS itself is chosen by `rediss://`.
    pub tls: Option<TlsFiles>,
    pub key_prefix: String,
    /// Fixed per-command budget; a request whose deadline is closer is refused before sending.
    pub command_timeout: Duration,
    pub connect_timeout: Duration,
    /// Multiplexed connections shared by all requests (Cluster: one per master instead).
    pub connections: usize,
    /// Commands in flight at most; more are refused before sending.
    pub max_in_flight: usize,
    /// Most requests decided by one batch program call (1: no batching). Requests are batched
    /// only while earlier calls are in flight: an idle pipe sends each request at once.
    pub batch_max: usize,
    /// Advised back-off for unavailable / indeterminate outcomes.
    pub retry_after: Duration,
}

/// Requests one batch program call decides at most (the program's own bound).
pub const MAX_BATCH: usize = 256;

impl Default for RedisSettings {
    fn default() -> Self {
        Self {
            topology: Topology::Standalone {
                url: "redis://127.0.0.1:6379/".into(),
            },
            username: None,
            password: None,
            tls: None,
            key_prefix: KeyBuilder::DEFAULT_PREFIX.into(),
            command_timeout: Duration::from_millis(10),
            connect_timeout: Duration::from_secs(1),
            connections: 2,
            max_in_flight: 1024,
            batch_max: 32,
            retry_after: Duration::from_secs(1),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RedisSetupError {
    /// The URL is printed redacted; the parser's reason names no part of it.
    #[error("{field}: invalid Redis URL {url}: {reason}")]
    Url {
        field: &'static str,
        url: String,
        reason: String,
    },
    #[error("redis.{name} = {value:?} is outside {min:?}..={max:?}")]
    OutOfRange {
        name: &'static str,
        value: Duration,
        min: Duration,
        max: Duration,
    },
    #[error("redis.{name} must be at least 1")]
    Zero { name: &'static str },
    #[error("redis.batch_max = {value} is above {max}, the batch program's bound")]
    BatchTooLarge { value: usize, max: usize },
    #[error("redis.{0} must list at least one node")]
    NoNodes(&'static str),
    #[error("redis.sentinel.master_name must not be empty")]
    NoMasterName,
    #[error("redis.tls: cert_file and key_file go together")]
    HalfClientCert,
    #[error("redis.tls is set but {url} is not a rediss:// URL")]
    TlsWithoutRediss { url: String },
    // `error` is not a `#[source]`: printed here once, not again by an error chain.
    #[error("redis.tls.{field}: cannot read {path}: {error}")]
    TlsFile {
        field: &'static str,
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("redis.tls: {0}")]
    Tls(String),
    #[error("redis: {0}")]
    Client(String),
}

impl RedisSetupError {
    pub(crate) fn url(field: &'static str, url: &str, error: &::redis::RedisError) -> Self {
        Self::Url {
            field,
            url: Redacted(url).to_string(),
            // `kind` and the static description only: the detail may quote the URL.
            reason: format!("{:?}", error.kind()),
        }
    }
}

impl RedisSettings {
    /// Bounds for `retry_after`: what a denied client is told to wait while Redis cannot decide.
    pub const RETRY_AFTER_RANGE: (Duration, Duration) =
        (Duration::from_millis(100), Duration::from_secs(3600));
    /// Bounds for `command_timeout` and `connect_timeout`.
    pub const TIMEOUT_RANGE: (Duration, Duration) =
        (Duration::from_millis(1), Duration::from_secs(60));

    /// Standalone settings for `url` with every other field at its default.
    pub fn standalone(url: impl Into<String>) -> Self {
        Self {
            topology: Topology::Standalone { url: url.into() },
            ..Self::default()
        }
    }

    pub fn validate(&self) -> Result<(), RedisSetupError> {
        for (name, value, (min, max)) in [
            ("retry_after", self.retry_after, Self::RETRY_AFTER_RANGE),
            ("command_timeout", self.command_timeout, Self::TIMEOUT_RANGE),
            ("connect_timeout", self.connect_timeout, Self::TIMEOUT_RANGE),
        ] {
            if value < min || value > max {
                return Err(RedisSetupError::OutOfRange {
                    name,
                    value,
                    min,
                    max,
                });
            }
        }
        for (name, value) in [
            ("connections", self.connections),
            ("max_in_flight", self.max_in_flight),
            ("batch_max", self.batch_max),
        ] {
            if value == 0 {
                return Err(RedisSetupError::Zero { name });
            }
        }
        if self.batch_max > MAX_BATCH {
            return Err(RedisSetupError::BatchTooLarge {
                value: self.batch_max,
                max: MAX_BATCH,
            });
        }
        let data_urls: &[String] = match &self.topology {
            Topology::Standalone { url } => std::slice::from_ref(url),
            Topology::Cluster { nodes } if nodes.is_empty() => {
                return Err(RedisSetupError::NoNodes("cluster_nodes"))
            }
            Topology::Cluster { nodes } => nodes,
            Topology::Sentinel(s) if s.nodes.is_empty() => {
                return Err(RedisSetupError::NoNodes("sentinel.nodes"))
            }
            Topology::Sentinel(s) if s.master_name.trim().is_empty() => {
                return Err(RedisSetupError::NoMasterName)
            }
            // The primary's address comes from the Sentinels; `tls` decides TLS to it.
            Topology::Sentinel(_) => &[],
        };
        if let Some(tls) = &self.tls {
            if tls.cert_file.is_some() != tls.key_file.is_some() {
                return Err(RedisSetupError::HalfClientCert);
            }
            if let Some(url) = data_urls.iter().find(|u| !is_tls_url(u)) {
                return Err(RedisSetupError::TlsWithoutRediss {
                    url: Redacted(url).to_string(),
                });
            }
        }
        Ok(())
    }

    /// Whether connections to the data nodes use TLS.
    pub fn uses_tls(&self) -> bool {
        match &self.topology {
            Topology::Standalone { url } => is_tls_url(url),
            Topology::Cluster { nodes } => nodes.iter().any(|u| is_tls_url(u)),
            Topology::Sentinel(_) => self.tls.is_some(),
        }
    }
}

pub(crate) fn is_tls_url(url: &str) -> bool {
    url.trim_start()
        .to_ascii_lowercase()
        .starts_with("rediss://")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_redacted() {
        assert_eq!(
            Redacted("redis://u:s3cret@h:1/0").to_string(),
            "redis://<redacted>@h:1/0"
        );
        assert_eq!(
            Redacted("rediss://:p@ss@h:1").to_string(),
            "rediss://<redacted>@h:1"
        );
        assert_eq!(Redacted("redis://h:1/").to_string(), "redis://h:1/");
    }

    #[test]
    fn debug_never_prints_passwords() {
        let settings = RedisSettings {
            topology: Topology::Sentinel(SentinelSettings {
                master_name: "m".into(),
                nodes: vec!["redis://su:sentinelpw@h:26379".into()],
                username: Some("sentinel-user".into()),
                password: Some(Secret::new("sentinelpw2".into())),
                db: 0,
            }),
            username: Some("edgelimit".into()),
            password: Some(Secret::new("datapw".into())),
            ..RedisSettings::default()
        };
        let text = format!("{settings:?}");
        for secret in ["sentinelpw", "sentinelpw2", "datapw"] {
            assert!(!text.contains(secret), "{secret} in {text}");
        }
        assert!(
            text.contains("edgelimit") && text.contains("<redacted>"),
            "{text}"
        );
        let cluster = Topology::Cluster {
            nodes: vec!["redis://:clusterpw@h:7000".into()],
        };
        assert!(!format!("{cluster:?}").contains("clusterpw"));
    }

    #[test]
    fn validation_names_the_problem() {
        let mut s = RedisSettings {
            topology: Topology::Cluster { nodes: vec![] },
            ..RedisSettings::default()
        };
        assert!(matches!(
            s.validate(),
            Err(RedisSetupError::NoNodes("cluster_nodes"))
        ));
        s.topology = Topology::Standalone {
            url: "redis://u:pw@h:1/".into(),
        };
        s.tls = Some(TlsFiles {
            ca_file: Some("/ca.pem".into()),
            ..TlsFiles::default()
        });
        let err = s.validate().unwrap_err().to_string();
        assert!(err.contains("rediss://") && !err.contains("pw@"), "{err}");
        s.topology = Topology::Standalone {
            url: "rediss://h:1/".into(),
        };
        s.tls = Some(TlsFiles {
            cert_file: Some("/c.pem".into()),
            ..TlsFiles::default()
        });
        assert!(matches!(s.validate(), Err(RedisSetupError::HalfClientCert)));
        s.tls = None;
        assert!(s.validate().is_ok());
        assert!(s.uses_tls());
    }
}
