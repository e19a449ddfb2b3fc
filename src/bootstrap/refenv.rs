//! Reference environment mode: a [`ServerConfig`] from envoyproxy/ratelimit's environment
//! variables, so a deployment written for it (image, Helm values, manifests) runs unchanged.
//! The HMAC secret is the one addition. Variables that have no meaning here are named in one
//! startup warning; those whose meaning cannot be honoured (a behaviour would silently
//! change, e.g. TLS off) are errors.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use super::config::{
    BackendKind, ConfigOrigin, SecretSource, SentinelConfig, ServerConfig, TlsConfig,
};
use super::grpc_tls::ListenerTlsConfig;
use super::otel::{OtlpProtocol, TracingConfig};
use super::xds::XdsConfig;

/// The variables naming the HMAC secret, the one addition to the reference's environment.
pub const SECRET_FILE_VAR: &str = "EDGELIMIT_HMAC_SECRET_FILE";
pub const SECRET_VAR: &str = "EDGELIMIT_HMAC_SECRET";

/// Reference variables read and honoured here.
const HONOURED: &[&str] = &[
    "RUNTIME_ROOT",
    "RUNTIME_SUBDIRECTORY",
    "RUNTIME_APPDIRECTORY",
    "RUNTIME_WATCH_ROOT",
    "RUNTIME_IGNOREDOTFILES",
    "GRPC_HOST",
    "GRPC_PORT",
    "HOST",
    "PORT",
    "BACKEND_TYPE",
    "REDIS_SOCKET_TYPE",
    "REDIS_URL",
    "REDIS_TYPE",
    "REDIS_AUTH",
    "REDIS_SENTINEL_AUTH",
    "REDIS_TLS",
    "REDIS_TLS_CLIENT_CERT",
    "REDIS_TLS_CLIENT_KEY",
    "REDIS_TLS_CACERT",
    "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION",
    "REDIS_TIMEOUT",
    "REDIS_POOL_SIZE",
    "CACHE_KEY_PREFIX",
    "LOG_LEVEL",
    "LOG_FORMAT",
    "SHADOW_MODE",
    "QUOTA_MODE",
    "LIMIT_RESPONSE_HEADERS_ENABLED",
    "LIMIT_LIMIT_HEADER",
    "LIMIT_REMAINING_HEADER",
    "LIMIT_RESET_HEADER",
    "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED",
    "MERGE_DOMAIN_CONFIG",
    "LOCAL_CACHE_SIZE_IN_BYTES",
    "CONFIG_TYPE",
    "CONFIG_GRPC_XDS_SERVER_URL",
    "CONFIG_GRPC_XDS_NODE_ID",
    "CONFIG_GRPC_XDS_SERVER_USE_TLS",
    "CONFIG_GRPC_XDS_SERVER_TLS_CACERT",
    "CONFIG_GRPC_XDS_CLIENT_TLS_CERT",
    "CONFIG_GRPC_XDS_CLIENT_TLS_KEY",
    "CONFIG_GRPC_XDS_SERVER_TLS_SAN",
    "FORCE_START_WITHOUT_INITIAL_CONFIG",
    "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL",
    "XDS_CLIENT_BACKOFF_MAX_INTERVAL",
    "XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES",
    "GRPC_SERVER_USE_TLS",
    "GRPC_SERVER_TLS_CERT",
    "GRPC_SERVER_TLS_KEY",
    "GRPC_CLIENT_TLS_CACERT",
    "GRPC_CLIENT_TLS_SAN",
    "GRPC_UDS",
    "REDIS_PERSECOND",
    "TRACING_ENABLED",
    "TRACING_SERVICE_NAME",
    "TRACING_SERVICE_NAMESPACE",
    "TRACING_SERVICE_INSTANCE_ID",
    "TRACING_EXPORTER_PROTOCOL",
    "TRACING_SAMPLING_RATE",
];

/// Reference variables with no meaning here, and why (the startup warning says it).
const MEANINGLESS: &[(&str, &str)] = &[
    ("DEBUG_HOST", "no separate debug listener: the loaded config is at /rlconfig and /admin/policies on HOST:PORT"),
    ("DEBUG_PORT", "no separate debug listener: the loaded config is at /rlconfig and /admin/policies on HOST:PORT"),
    ("USE_PROMETHEUS", "Prometheus metrics are always served, at /metrics on HOST:PORT"),
    ("PROMETHEUS_ADDR", "Prometheus metrics are served at /metrics on HOST:PORT"),
    ("PROMETHEUS_PATH", "Prometheus metrics are served at /metrics"),
    ("PROMETHEUS_MAPPER_YAML", "metric names are edgelimit's own (README, Metrics)"),
    ("PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS", "latency is a histogram in seconds"),
    ("USE_STATSD", "no statsd: metrics are Prometheus"),
    ("STATSD_HOST", "no statsd"),
    ("STATSD_PORT", "no statsd"),
    ("USE_DOG_STATSD", "no statsd"),
    ("USE_DOG_STATSD_MOGRIFIERS", "no statsd"),
    ("EXTRA_TAGS", "no statsd"),
    ("STATS_FLUSH_INTERVAL", "no statsd"),
    ("DISABLE_STATS", "metrics cannot be turned off"),
    ("NEAR_LIMIT_RATIO", "edgelimit_near_limit_total uses a fixed ratio of 0.8"),
    ("EXPIRATION_JITTER_MAX_SECONDS", "keys expire exactly when their window (plus a grace) ends"),
    ("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "a denied request never consumes here"),
    ("REDIS_PIPELINE_WINDOW", "requests are pipelined on dedicated I/O connections"),
    ("REDIS_PIPELINE_LIMIT", "requests are pipelined on dedicated I/O connections"),
    ("REDIS_POOL_ON_EMPTY_BEHAVIOR", "admission is bounded by redis.max_in_flight"),
    ("REDIS_HEALTH_CHECK_ACTIVE_CONNECTION", "readiness always tracks the Redis connection"),
    ("REDIS_STARTUP_INITIAL_INTERVAL", "the server starts without Redis and fails closed until it connects"),
    ("REDIS_STARTUP_MAX_INTERVAL", "the server starts without Redis and fails closed until it connects"),
    ("REDIS_STARTUP_MAX_ELAPSED_TIME", "the server starts without Redis and fails closed until it connects"),
    ("REDIS_CLUSTER_PIPELINE_PARALLELISM", "cluster calls are routed per slot"),
    ("RESPONSE_DYNAMIC_METADATA", "dynamic metadata is not returned"),
    ("GRPC_MAX_CONNECTION_AGE", "connections are bounded by limits.max_connections and keepalives"),
    ("GRPC_MAX_CONNECTION_AGE_GRACE", "connections are bounded by limits.max_connections and keepalives"),
    ("XDS_CLIENT_BACKOFF_RANDOM_FACTOR", "back-off doubles without jitter"),
    ("XDS_CLIENT_BACKOFF_JITTER", "back-off doubles without jitter"),
    ("CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", "reconnects follow XDS_CLIENT_BACKOFF_*"),
];

/// A setting the operator relies on that cannot be honoured here, or a malformed value.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RefEnvError {
    #[error(
        "reference environment mode needs one addition to the reference's variables: the HMAC \
         secret that keys subject digests. Set {SECRET_FILE_VAR} (a file holding at least 32 \
         bytes) or {SECRET_VAR} (the secret itself)"
    )]
    NoSecret,
    #[error("{var}={value:?}: {problem}")]
    Invalid {
        var: &'static str,
        value: String,
        problem: String,
    },
    #[error("{var}: {problem}")]
    Unsupported {
        var: &'static str,
        problem: &'static str,
    },
}

/// The configuration, and the one warning (if any) to log at startup.
#[derive(Debug)]
pub struct RefEnv {
    pub config: ServerConfig,
    pub warning: Option<String>,
}

struct Vars(BTreeMap<String, String>);

impl Vars {
    fn get(&self, name: &str) -> Option<&str> {
        self.0.get(name).map(String::as_str)
    }

    fn or<'a>(&'a self, name: &str, default: &'a str) -> &'a str {
        self.get(name).unwrap_or(default)
    }

    fn invalid(var: &'static str, value: &str, problem: impl Into<String>) -> RefEnvError {
        RefEnvError::Invalid {
            var,
            value: value.to_owned(),
            problem: problem.into(),
        }
    }

    /// Go's `strconv.ParseBool`, which the reference's settings use.
    fn flag(&self, var: &'static str, default: bool) -> Result<bool, RefEnvError> {
        match self.get(var) {
            None => Ok(default),
            Some("1" | "t" | "T" | "true" | "TRUE" | "True") => Ok(true),
            Some("0" | "f" | "F" | "false" | "FALSE" | "False") => Ok(false),
            Some(other) => Err(Self::invalid(var, other, "expected true or false")),
        }
    }

    fn port(&self, var: &'static str, default: u16) -> Result<u16, RefEnvError> {
        match self.get(var) {
            None => Ok(default),
            Some(v) => v
                .parse()
                .map_err(|_| Self::invalid(var, v, "expected a port number")),
        }
    }

    fn addr(
        &self,
        host_var: &'static str,
        port_var: &'static str,
        default_port: u16,
    ) -> Result<SocketAddr, RefEnvError> {
        let host = self.or(host_var, "0.0.0.0");
        let ip: IpAddr = host.parse().map_err(|_| {
            Self::invalid(
                host_var,
                host,
                "expected an IP address (host names are not resolved)",
            )
        })?;
        Ok(SocketAddr::new(ip, self.port(port_var, default_port)?))
    }
}

/// Go's `time.ParseDuration` for the forms deployments use (`10s`, `250ms`, `1m30s`).
fn go_duration(var: &'static str, text: &str) -> Result<Duration, RefEnvError> {
    let err = || Vars::invalid(var, text, "expected a duration such as 10s or 250ms");
    let mut rest = text;
    let mut total = Duration::ZERO;
    if rest.is_empty() {
        return Err(err());
    }
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(|b| b.is_ascii_digit()).count();
        let (number, tail) = rest.split_at(digits);
        let n: u64 = number.parse().map_err(|_| err())?;
        let unit_len = tail.bytes().take_while(|b| b.is_ascii_alphabetic()).count();
        let (unit, tail) = tail.split_at(unit_len);
        let part = match unit {
            "ms" => Duration::from_millis(n),
            "s" => Duration::from_secs(n),
            "m" => Duration::from_secs(n.saturating_mul(60)),
            "h" => Duration::from_secs(n.saturating_mul(3600)),
            _ => return Err(err()),
        };
        total = total.saturating_add(part);
        rest = tail;
    }
    Ok(total)
}

/// Builds the configuration from `vars` (the process environment in production).
pub fn from_vars(vars: impl IntoIterator<Item = (String, String)>) -> Result<RefEnv, RefEnvError> {
    let vars = Vars(vars.into_iter().collect());
    let mut c = ServerConfig {
        origin: ConfigOrigin::ReferenceEnv,
        ..ServerConfig::default()
    };

    // Files under <RUNTIME_ROOT>/<RUNTIME_SUBDIRECTORY>/<RUNTIME_APPDIRECTORY>/.
    let mut dir = PathBuf::from(vars.or("RUNTIME_ROOT", "/srv/runtime_data/current"));
    if let Some(sub) = vars.get("RUNTIME_SUBDIRECTORY").filter(|s| !s.is_empty()) {
        dir.push(sub);
    }
    dir.push(vars.or("RUNTIME_APPDIRECTORY", "config"));
    c.policy_dir = dir;
    // Dotfiles are always ignored and the directory is always watched, which is what these
    // mean when true; parse them so a typo is still reported.
    vars.flag("RUNTIME_WATCH_ROOT", true)?;
    vars.flag("RUNTIME_IGNOREDOTFILES", false)?;

    c.listen = vars.addr("GRPC_HOST", "GRPC_PORT", 8081)?;
    c.admin_listen = vars.addr("HOST", "PORT", 8080)?;
    if let Some(path) = vars.get("GRPC_UDS").filter(|v| !v.is_empty()) {
        // As the reference: the socket replaces GRPC_HOST:GRPC_PORT. Mode 0660: Envoy runs
        // as another user of the same group, never as anyone on the host.
        c.listen_uds = Some(super::uds::UdsConfig::new(PathBuf::from(path)));
        if vars.flag("GRPC_SERVER_USE_TLS", false)? {
            return Err(RefEnvError::Unsupported {
                var: "GRPC_UDS",
                problem:
                    "TLS on the unix socket is not supported; unset GRPC_SERVER_USE_TLS or GRPC_UDS",
            });
        }
    }
    if vars.flag("GRPC_SERVER_USE_TLS", false)? {
        let file = |var: &'static str| {
            vars.get(var)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
                .ok_or(RefEnvError::Unsupported {
                    var,
                    problem: "required with GRPC_SERVER_USE_TLS=true",
                })
        };
        let client_ca_file = file("GRPC_CLIENT_TLS_CACERT").ok();
        let client_san = vars
            .get("GRPC_CLIENT_TLS_SAN")
            .filter(|v| !v.is_empty())
            .map(str::to_owned);
        // Accepting any client when a SAN was asked for would widen access.
        if client_san.is_some() && client_ca_file.is_none() {
            return Err(RefEnvError::Unsupported {
                var: "GRPC_CLIENT_TLS_SAN",
                problem: "needs GRPC_CLIENT_TLS_CACERT: the SAN is checked on client certificates verified against it",
            });
        }
        c.tls = Some(ListenerTlsConfig {
            cert_file: file("GRPC_SERVER_TLS_CERT")?,
            key_file: file("GRPC_SERVER_TLS_KEY")?,
            client_ca_file,
            client_san,
        });
    }
    match vars.or("CONFIG_TYPE", "FILE").to_ascii_uppercase().as_str() {
        "FILE" => {}
        "GRPC_XDS_SOTW" => c.xds = Some(xds(&vars)?),
        other => {
            return Err(Vars::invalid(
                "CONFIG_TYPE",
                other,
                "expected FILE or GRPC_XDS_SOTW",
            ))
        }
    }

    match vars
        .or("BACKEND_TYPE", "redis")
        .to_ascii_lowercase()
        .as_str()
    {
        "redis" => c.backend = Some(BackendKind::Redis),
        other => {
            return Err(Vars::invalid(
                "BACKEND_TYPE",
                other,
                "only redis is supported",
            ))
        }
    }
    if vars.flag("REDIS_PERSECOND", false)? {
        return Err(RefEnvError::Unsupported {
            var: "REDIS_PERSECOND",
            problem: "one Redis deployment holds every limit; unset REDIS_PERSECOND and its REDIS_PERSECOND_* variables",
        });
    }
    redis(&vars, &mut c)?;
    c.tracing = tracing(&vars)?;

    c.log.level = match vars.or("LOG_LEVEL", "WARN").to_ascii_lowercase().as_str() {
        // Debug detail for edgelimit itself; its HTTP/2 and Redis libraries stay at info.
        l @ ("trace" | "debug") => format!("info,edgelimit={l}"),
        l @ ("info" | "warn" | "error") => l.to_owned(),
        "warning" => "warn".to_owned(),
        "fatal" | "panic" => "error".to_owned(),
        other => {
            return Err(Vars::invalid(
                "LOG_LEVEL",
                other,
                "expected debug, info, warn or error",
            ))
        }
    };
    c.log.json = match vars.or("LOG_FORMAT", "text").to_ascii_lowercase().as_str() {
        "json" => true,
        "text" => false,
        other => return Err(Vars::invalid("LOG_FORMAT", other, "expected text or json")),
    };

    c.shadow_mode = vars.flag("SHADOW_MODE", false)?;
    c.quota_mode = vars.flag("QUOTA_MODE", false)?;
    c.policies.merge_domains = vars.flag("MERGE_DOMAIN_CONFIG", false)?;
    // The reference's default (off) holds in its environment mode, whatever the backend.
    c.readiness.require_policies =
        Some(vars.flag("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", false)?);
    // The reference's headers are its only ones: edgelimit's own stay off, `Retry-After`
    // (which Envoy's retry back-off reads) with them.
    c.headers.retry_after = false;
    c.headers.reference = vars.flag("LIMIT_RESPONSE_HEADERS_ENABLED", false)?;
    let names = &mut c.headers.reference_names;
    for (var, slot) in [
        ("LIMIT_LIMIT_HEADER", &mut names.limit),
        ("LIMIT_REMAINING_HEADER", &mut names.remaining),
        ("LIMIT_RESET_HEADER", &mut names.reset),
    ] {
        if let Some(v) = vars.get(var) {
            *slot = v.to_owned();
        }
    }
    // The reference's local cache remembers over-limit keys, as the deny cache does.
    if let Some(v) = vars.get("LOCAL_CACHE_SIZE_IN_BYTES") {
        let bytes: u64 = v.parse().map_err(|_| {
            Vars::invalid("LOCAL_CACHE_SIZE_IN_BYTES", v, "expected a number of bytes")
        })?;
        c.deny_cache.enabled = bytes > 0;
    } else {
        c.deny_cache.enabled = false;
    }

    c.hmac_secret = if vars.get(SECRET_FILE_VAR).is_some() {
        SecretSource {
            file: vars.get(SECRET_FILE_VAR).map(PathBuf::from),
            ..SecretSource::default()
        }
    } else if vars.get(SECRET_VAR).is_some() {
        SecretSource {
            env: Some(SECRET_VAR.to_owned()),
            ..SecretSource::default()
        }
    } else {
        return Err(RefEnvError::NoSecret);
    };

    let mut ignored: Vec<String> = Vec::new();
    for (var, why) in MEANINGLESS {
        if vars.get(var).is_some() {
            ignored.push(format!("{var} ({why})"));
        }
    }
    for var in vars.0.keys() {
        let known = HONOURED.contains(&var.as_str()) || MEANINGLESS.iter().any(|(v, _)| v == var);
        // Other REDIS_PERSECOND_*, MEMCACHE_*, CONFIG_GRPC_XDS_* and XDS_* belong to features
        // that are refused above or absent here.
        let family = [
            "REDIS_PERSECOND_",
            "MEMCACHE_",
            "CONFIG_GRPC_XDS_",
            "XDS_CLIENT_",
            "GRPC_CLIENT_TLS_",
            "GRPC_SERVER_TLS_",
        ]
        .iter()
        .any(|p| var.starts_with(p));
        if !known && family {
            ignored.push(format!("{var} (its feature is not available here)"));
        }
    }
    let warning = (!ignored.is_empty()).then(|| {
        format!(
            "reference environment: these variables have no effect here: {}",
            ignored.join("; ")
        )
    });
    Ok(RefEnv { config: c, warning })
}

/// `CONFIG_TYPE=GRPC_XDS_SOTW`: the management server, as Envoy Gateway sets it.
fn xds(vars: &Vars) -> Result<XdsConfig, RefEnvError> {
    let use_tls = vars.flag("CONFIG_GRPC_XDS_SERVER_USE_TLS", false)?;
    // The reference takes `host:port` (gRPC's target syntax); a URL is accepted as well.
    let url = vars.or("CONFIG_GRPC_XDS_SERVER_URL", "localhost:18000");
    let url = if url.contains("://") {
        url.to_owned()
    } else if use_tls {
        format!("https://{url}")
    } else {
        format!("http://{url}")
    };
    let mut x = XdsConfig::new(
        url,
        vars.or("CONFIG_GRPC_XDS_NODE_ID", "default").to_owned(),
    );
    if use_tls {
        let file = |var: &str| vars.get(var).filter(|v| !v.is_empty()).map(PathBuf::from);
        let tls = TlsConfig {
            ca_file: file("CONFIG_GRPC_XDS_SERVER_TLS_CACERT"),
            cert_file: file("CONFIG_GRPC_XDS_CLIENT_TLS_CERT"),
            key_file: file("CONFIG_GRPC_XDS_CLIENT_TLS_KEY"),
        };
        x.tls = Some(tls);
        x.tls_server_name = vars
            .get("CONFIG_GRPC_XDS_SERVER_TLS_SAN")
            .filter(|v| !v.is_empty())
            .map(str::to_owned);
    }
    x.force_start_without_initial_config =
        vars.flag("FORCE_START_WITHOUT_INITIAL_CONFIG", false)?;
    // The reference's defaults: 10 s, doubling up to 60 s.
    x.backoff_initial = Duration::from_secs(10);
    x.backoff_max = Duration::from_secs(60);
    if let Some(v) = vars.get("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL") {
        x.backoff_initial = go_duration("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", v)?;
    }
    if let Some(v) = vars.get("XDS_CLIENT_BACKOFF_MAX_INTERVAL") {
        x.backoff_max = go_duration("XDS_CLIENT_BACKOFF_MAX_INTERVAL", v)?;
    }
    if let Some(v) = vars
        .get("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES")
        .filter(|v| !v.is_empty())
    {
        x.max_message_bytes = v.parse().map_err(|_| {
            Vars::invalid(
                "XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES",
                v,
                "expected a number of bytes",
            )
        })?;
    }
    x.validate()
        .map_err(|problem| Vars::invalid("CONFIG_GRPC_XDS_SERVER_URL", &x.server_url, problem))?;
    Ok(x)
}

/// `TRACING_*`, with the reference's fallbacks to the standard `OTEL_*` variables when a
/// `TRACING_*` one is unset, and the exporter's own `OTEL_EXPORTER_OTLP_*` / `OTEL_BSP_*`.
fn tracing(vars: &Vars) -> Result<Option<TracingConfig>, RefEnvError> {
    let set = |var: &str| vars.get(var).map(str::trim).filter(|v| !v.is_empty());
    let enabled = match vars.get("TRACING_ENABLED") {
        Some(_) => vars.flag("TRACING_ENABLED", false)?,
        None if set("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true")) => false,
        None => vars
            .get("OTEL_TRACES_EXPORTER")
            .is_some_and(|v| !v.trim().eq_ignore_ascii_case("none")),
    };
    if !enabled {
        return Ok(None);
    }
    let mut t = TracingConfig::default();
    let (protocol_var, protocol) = match vars.get("TRACING_EXPORTER_PROTOCOL") {
        Some(p) => ("TRACING_EXPORTER_PROTOCOL", p.trim().to_ascii_lowercase()),
        None => match set("OTEL_EXPORTER_OTLP_PROTOCOL") {
            Some(p) => ("OTEL_EXPORTER_OTLP_PROTOCOL", p.to_ascii_lowercase()),
            // The reference's default.
            None => ("TRACING_EXPORTER_PROTOCOL", "http".to_owned()),
        },
    };
    t.protocol = match protocol.as_str() {
        "grpc" => OtlpProtocol::Grpc,
        // Binary protobuf, as the reference's exporter sends (JSON is not offered).
        "http" | "http/protobuf" => OtlpProtocol::Http,
        _ => {
            return Err(Vars::invalid(
                protocol_var,
                &protocol,
                "expected grpc, http or http/protobuf",
            ))
        }
    };
    // Envoy Gateway always writes a scheme; a bare host:port means plaintext, as in Go's.
    let with_scheme = |e: &str| {
        if e.contains("://") {
            e.to_owned()
        } else {
            format!("http://{e}")
        }
    };
    let endpoint_var = match set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") {
        // The signal's own endpoint is used as given.
        Some(e) => {
            t.endpoint = Some(with_scheme(e));
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
        }
        None => {
            // The base endpoint: over HTTP, traces go to its /v1/traces.
            t.endpoint = set("OTEL_EXPORTER_OTLP_ENDPOINT").map(|e| match t.protocol {
                OtlpProtocol::Grpc => with_scheme(e),
                OtlpProtocol::Http => {
                    format!("{}/v1/traces", with_scheme(e).trim_end_matches('/'))
                }
            });
            "OTEL_EXPORTER_OTLP_ENDPOINT"
        }
    };
    if let Some(name) = vars.get("TRACING_SERVICE_NAME") {
        t.service_name = name.to_owned();
    } else {
        t.service_name = set("OTEL_SERVICE_NAME").unwrap_or("RateLimit").to_owned();
    }
    let resource: BTreeMap<&str, &str> = vars
        .or("OTEL_RESOURCE_ATTRIBUTES", "")
        .split(',')
        .filter_map(|pair| pair.split_once('='))
        .map(|(k, v)| (k.trim(), v.trim()))
        .filter(|(_, v)| !v.is_empty())
        .collect();
    t.service_namespace = match vars.get("TRACING_SERVICE_NAMESPACE") {
        Some(ns) => Some(ns.to_owned()),
        None => resource.get("service.namespace").map(|v| v.to_string()),
    }
    .filter(|ns| !ns.is_empty());
    t.service_instance_id = match vars.get("TRACING_SERVICE_INSTANCE_ID") {
        Some(id) => Some(id.to_owned()),
        None => resource.get("service.instance.id").map(|v| v.to_string()),
    }
    .filter(|id| !id.is_empty());
    let ratio = |var: &'static str, v: &str| {
        v.trim()
            .parse::<f64>()
            .ok()
            .filter(|r| (0.0..=1.0).contains(r))
            .ok_or_else(|| Vars::invalid(var, v, "expected a rate from 0 to 1"))
    };
    t.sampling_ratio = match vars.get("TRACING_SAMPLING_RATE") {
        Some(v) => ratio("TRACING_SAMPLING_RATE", v)?,
        None => match set("OTEL_TRACES_SAMPLER")
            .map(str::to_ascii_lowercase)
            .as_deref()
        {
            Some("always_on" | "parentbased_always_on") => 1.0,
            Some("always_off" | "parentbased_always_off") => 0.0,
            Some("traceidratio" | "parentbased_traceidratio") => {
                match set("OTEL_TRACES_SAMPLER_ARG") {
                    Some(v) => ratio("OTEL_TRACES_SAMPLER_ARG", v)?,
                    None => 1.0,
                }
            }
            _ => 1.0,
        },
    };
    let millis = |var: &'static str| -> Result<Option<u64>, RefEnvError> {
        set(var)
            .map(|v| {
                v.parse::<u64>()
                    .map_err(|_| Vars::invalid(var, v, "expected a number of milliseconds"))
            })
            .transpose()
    };
    let count = |var: &'static str| -> Result<Option<usize>, RefEnvError> {
        set(var)
            .map(|v| {
                v.parse::<usize>()
                    .map_err(|_| Vars::invalid(var, v, "expected a number"))
            })
            .transpose()
    };
    let timeout = match millis("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT")? {
        Some(ms) => Some(ms),
        None => millis("OTEL_EXPORTER_OTLP_TIMEOUT")?,
    };
    if let Some(ms) = timeout {
        t.export_timeout = Duration::from_millis(ms);
    }
    if let Some(ms) = millis("OTEL_BSP_SCHEDULE_DELAY")? {
        t.scheduled_delay = Duration::from_millis(ms);
    }
    if let Some(n) = count("OTEL_BSP_MAX_QUEUE_SIZE")? {
        t.max_queue_size = n;
    }
    if let Some(n) = count("OTEL_BSP_MAX_EXPORT_BATCH_SIZE")? {
        t.max_export_batch_size = n;
    }
    t.validate().map_err(|problem| {
        let var = [
            ("tracing.endpoint", endpoint_var),
            ("tracing.service_name", "TRACING_SERVICE_NAME"),
            ("tracing.export_timeout", "OTEL_EXPORTER_OTLP_TIMEOUT"),
            ("tracing.max_queue_size", "OTEL_BSP_MAX_QUEUE_SIZE"),
            (
                "tracing.max_export_batch_size",
                "OTEL_BSP_MAX_EXPORT_BATCH_SIZE",
            ),
            ("tracing.scheduled_delay", "OTEL_BSP_SCHEDULE_DELAY"),
        ]
        .iter()
        .find(|(field, _)| problem.starts_with(field))
        .map_or("TRACING_ENABLED", |(_, var)| *var);
        RefEnvError::Invalid {
            var,
            value: vars.get(var).unwrap_or_default().to_owned(),
            problem,
        }
    })?;
    Ok(Some(t))
}

fn redis(vars: &Vars, c: &mut ServerConfig) -> Result<(), RefEnvError> {
    let socket = vars.or("REDIS_SOCKET_TYPE", "unix").to_ascii_lowercase();
    if socket != "tcp" {
        return Err(Vars::invalid(
            "REDIS_SOCKET_TYPE",
            &socket,
            "only tcp is supported (the reference's default, unix, is not)",
        ));
    }
    let tls = vars.flag("REDIS_TLS", false)?;
    if vars.flag("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", false)? {
        return Err(RefEnvError::Unsupported {
            var: "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION",
            problem: "certificates are always verified; give the CA with REDIS_TLS_CACERT",
        });
    }
    let scheme = if tls { "rediss" } else { "redis" };
    let url = vars
        .get("REDIS_URL")
        .filter(|u| !u.is_empty())
        .ok_or(RefEnvError::Unsupported {
            var: "REDIS_URL",
            problem: "must be set to host:port (the reference's default is a unix socket path)",
        })?;
    let hosts: Vec<&str> = url.split(',').map(str::trim).collect();
    let as_url = |host: &str| {
        if host.contains("://") {
            host.to_owned()
        } else {
            format!("{scheme}://{host}")
        }
    };
    match vars
        .or("REDIS_TYPE", "SINGLE")
        .to_ascii_uppercase()
        .as_str()
    {
        "SINGLE" => {
            let [host] = hosts.as_slice() else {
                return Err(Vars::invalid(
                    "REDIS_URL",
                    url,
                    "REDIS_TYPE=single takes one host:port",
                ));
            };
            c.redis.url = Some(as_url(host));
        }
        "CLUSTER" => c.redis.cluster_nodes = Some(hosts.iter().map(|h| as_url(h)).collect()),
        "SENTINEL" => {
            let Some((master, nodes)) = hosts.split_first().filter(|(_, n)| !n.is_empty()) else {
                return Err(Vars::invalid(
                    "REDIS_URL",
                    url,
                    "REDIS_TYPE=sentinel takes master_name,host:port[,host:port...]",
                ));
            };
            c.redis.sentinel = Some(SentinelConfig {
                master_name: (*master).to_owned(),
                nodes: nodes.iter().map(|h| as_url(h)).collect(),
                username: None,
                password_file: None,
                password_env: vars
                    .get("REDIS_SENTINEL_AUTH")
                    .map(|_| "REDIS_SENTINEL_AUTH".to_owned()),
                db: 0,
            });
        }
        other => {
            return Err(Vars::invalid(
                "REDIS_TYPE",
                other,
                "expected single, sentinel or cluster",
            ))
        }
    }
    if let Some(auth) = vars.get("REDIS_AUTH").filter(|a| !a.is_empty()) {
        // `user:password` names an ACL user, as in the reference.
        match auth.split_once(':') {
            Some((user, _)) => {
                c.redis.username = Some(user.to_owned());
                c.redis.password_env = Some("REDIS_AUTH".to_owned());
                c.redis.password_after_colon = true;
            }
            None => c.redis.password_env = Some("REDIS_AUTH".to_owned()),
        }
    }
    if tls {
        let file = |var: &str| vars.get(var).filter(|v| !v.is_empty()).map(PathBuf::from);
        c.redis.tls = Some(TlsConfig {
            ca_file: file("REDIS_TLS_CACERT"),
            cert_file: file("REDIS_TLS_CLIENT_CERT"),
            key_file: file("REDIS_TLS_CLIENT_KEY"),
        });
    }
    if let Some(t) = vars.get("REDIS_TIMEOUT") {
        c.redis.command_timeout = go_duration("REDIS_TIMEOUT", t)?;
    }
    if let Some(p) = vars.get("REDIS_POOL_SIZE") {
        let n: usize = p
            .parse()
            .ok()
            .filter(|n| (1..=64).contains(n))
            .ok_or_else(|| Vars::invalid("REDIS_POOL_SIZE", p, "expected 1 to 64"))?;
        c.redis.connections = n.min(c.redis.connections.max(1));
    }
    c.redis.key_prefix = vars.or("CACHE_KEY_PREFIX", &c.redis.key_prefix).to_owned();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Result<RefEnv, RefEnvError> {
        from_vars(pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())))
    }

    const BASE: &[(&str, &str)] = &[
        ("REDIS_SOCKET_TYPE", "tcp"),
        ("REDIS_URL", "redis.ns:6379"),
        ("EDGELIMIT_HMAC_SECRET_FILE", "/run/secrets/hmac"),
    ];

    fn with(extra: &[(&'static str, &'static str)]) -> Vec<(&'static str, &'static str)> {
        BASE.iter().chain(extra).copied().collect()
    }

    #[test]
    fn a_typical_deployment_maps_onto_the_config() {
        let r = env(&with(&[
            ("RUNTIME_ROOT", "/data"),
            ("RUNTIME_SUBDIRECTORY", "ratelimit"),
            ("GRPC_PORT", "9001"),
            ("PORT", "9002"),
            ("LOG_LEVEL", "DEBUG"),
            ("LOG_FORMAT", "json"),
            ("SHADOW_MODE", "true"),
            ("LIMIT_RESPONSE_HEADERS_ENABLED", "true"),
            ("LIMIT_RESET_HEADER", "X-Reset"),
            ("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", "true"),
            ("REDIS_TIMEOUT", "1s500ms"),
            ("CACHE_KEY_PREFIX", "rl:"),
        ]))
        .unwrap();
        let c = &r.config;
        assert_eq!(c.policy_dir, PathBuf::from("/data/ratelimit/config"));
        assert_eq!(c.listen, "0.0.0.0:9001".parse().unwrap());
        assert_eq!(c.admin_listen, "0.0.0.0:9002".parse().unwrap());
        assert_eq!(c.redis.url.as_deref(), Some("redis://redis.ns:6379"));
        assert_eq!(c.redis.command_timeout, Duration::from_millis(1500));
        assert_eq!(c.redis.key_prefix, "rl:");
        assert_eq!(
            (c.log.level.as_str(), c.log.json),
            ("info,edgelimit=debug", true)
        );
        assert!(c.shadow_mode && c.headers.reference && c.readiness.require_policies == Some(true));
        assert_eq!(c.headers.reference_names.reset, "X-Reset");
        assert_eq!(c.headers.reference_names.limit, "RateLimit-Limit");
        assert!(r.warning.is_none());
    }

    #[test]
    fn topologies_and_auth() {
        let r = env(&with(&[
            ("REDIS_TYPE", "cluster"),
            ("REDIS_URL", "a:1,b:2"),
            ("REDIS_TLS", "true"),
        ]))
        .unwrap();
        assert_eq!(
            r.config.redis.cluster_nodes,
            Some(vec!["rediss://a:1".to_string(), "rediss://b:2".to_string()])
        );
        let r = env(&with(&[
            ("REDIS_TYPE", "SENTINEL"),
            ("REDIS_URL", "mymaster,s1:26379,s2:26379"),
        ]))
        .unwrap();
        let s = r.config.redis.sentinel.unwrap();
        assert_eq!((s.master_name.as_str(), s.nodes.len()), ("mymaster", 2));
        let r = env(&with(&[("REDIS_AUTH", "app:pw")])).unwrap();
        assert_eq!(r.config.redis.username.as_deref(), Some("app"));
        assert!(r.config.redis.password_after_colon);
    }

    #[test]
    fn meaningless_variables_are_named_in_one_warning() {
        let r = env(&with(&[
            ("USE_STATSD", "true"),
            ("NEAR_LIMIT_RATIO", "0.9"),
            ("MEMCACHE_HOST_PORT", "x"),
        ]))
        .unwrap();
        let w = r.warning.unwrap();
        for var in ["USE_STATSD", "NEAR_LIMIT_RATIO", "MEMCACHE_HOST_PORT"] {
            assert!(w.contains(var), "{w}");
        }
    }

    #[test]
    fn what_cannot_be_honoured_is_an_error_naming_the_variable() {
        assert_eq!(
            env(&[("REDIS_SOCKET_TYPE", "tcp"), ("REDIS_URL", "r:6379")]).unwrap_err(),
            RefEnvError::NoSecret
        );
        assert!(RefEnvError::NoSecret.to_string().contains("one addition"));
        for (var, value) in [
            ("GRPC_SERVER_USE_TLS", "true"),
            ("CONFIG_TYPE", "GRPC_XDS_DELTA"),
            ("REDIS_SOCKET_TYPE", "unix"),
            ("REDIS_TYPE", "ring"),
            ("SHADOW_MODE", "yes"),
            ("REDIS_TIMEOUT", "10"),
            ("BACKEND_TYPE", "memcache"),
            ("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", "true"),
        ] {
            let mut vars = with(&[]);
            vars.retain(|(k, _)| *k != var);
            vars.push((var, value));
            let e = env(&vars).unwrap_err().to_string();
            assert!(e.contains(var), "{var}: {e}");
        }
    }

    #[test]
    fn grpc_server_tls_variables_map_onto_the_listener_tls() {
        let r = env(&with(&[
            ("GRPC_SERVER_USE_TLS", "true"),
            ("GRPC_SERVER_TLS_CERT", "/certs/tls.crt"),
            ("GRPC_SERVER_TLS_KEY", "/certs/tls.key"),
            ("GRPC_CLIENT_TLS_CACERT", "/certs/ca.crt"),
        ]))
        .unwrap();
        let tls = r.config.tls.unwrap();
        assert_eq!(tls.cert_file, PathBuf::from("/certs/tls.crt"));
        assert_eq!(tls.client_ca_file, Some(PathBuf::from("/certs/ca.crt")));
        assert!(r.warning.is_none(), "{:?}", r.warning);
        let san = env(&with(&[
            ("GRPC_SERVER_USE_TLS", "true"),
            ("GRPC_SERVER_TLS_CERT", "/certs/tls.crt"),
            ("GRPC_SERVER_TLS_KEY", "/certs/tls.key"),
            ("GRPC_CLIENT_TLS_SAN", "envoy"),
        ]))
        .unwrap_err()
        .to_string();
        assert!(san.contains("GRPC_CLIENT_TLS_CACERT"), "{san}");
        let r = env(&with(&[
            ("GRPC_SERVER_USE_TLS", "true"),
            ("GRPC_SERVER_TLS_CERT", "/certs/tls.crt"),
            ("GRPC_SERVER_TLS_KEY", "/certs/tls.key"),
            ("GRPC_CLIENT_TLS_CACERT", "/certs/ca.crt"),
            ("GRPC_CLIENT_TLS_SAN", "envoy.gateway"),
        ]))
        .unwrap();
        let tls = r.config.tls.unwrap();
        assert_eq!(tls.client_san.as_deref(), Some("envoy.gateway"));
        assert!(r.warning.is_none(), "{:?}", r.warning);
    }

    #[test]
    fn envoy_gateway_variables_select_the_xds_source() {
        let r = env(&with(&[
            ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
            ("CONFIG_GRPC_XDS_SERVER_URL", "envoy-gateway:18001"),
            ("CONFIG_GRPC_XDS_NODE_ID", "envoy-ratelimit"),
            ("FORCE_START_WITHOUT_INITIAL_CONFIG", "true"),
            ("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "250ms"),
        ]))
        .unwrap();
        let x = r.config.xds.unwrap();
        assert_eq!(x.server_url, "http://envoy-gateway:18001");
        assert_eq!(x.node_id, "envoy-ratelimit");
        assert!(x.force_start_without_initial_config);
        assert_eq!(x.backoff_initial, Duration::from_millis(250));
        assert_eq!(x.backoff_max, Duration::from_secs(60));
        assert!(r.warning.is_none(), "{:?}", r.warning);
        let defaults = env(&with(&[("CONFIG_TYPE", "grpc_xds_sotw")])).unwrap();
        let x = defaults.config.xds.unwrap();
        assert_eq!(
            (x.server_url.as_str(), x.node_id.as_str()),
            ("http://localhost:18000", "default")
        );
        assert!(!x.force_start_without_initial_config);
        // No CA: Mozilla's roots, as the reference falls back to the system's.
        let no_ca = env(&with(&[
            ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
            ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true"),
            ("CONFIG_GRPC_XDS_SERVER_TLS_SAN", "xds.internal"),
        ]))
        .unwrap();
        let x = no_ca.config.xds.unwrap();
        assert_eq!(x.tls.unwrap().ca_file, None);
        assert_eq!(x.tls_server_name.as_deref(), Some("xds.internal"));
        let r = env(&with(&[
            ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
            ("CONFIG_GRPC_XDS_SERVER_URL", "envoy-gateway:18001"),
            ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true"),
            ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "/certs/ca.crt"),
            ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "/certs/tls.crt"),
            ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "/certs/tls.key"),
        ]))
        .unwrap();
        let x = r.config.xds.unwrap();
        assert_eq!(x.server_url, "https://envoy-gateway:18001");
        let tls = x.tls.unwrap();
        assert_eq!(tls.ca_file, Some(PathBuf::from("/certs/ca.crt")));
        assert_eq!(tls.key_file, Some(PathBuf::from("/certs/tls.key")));
        assert!(r.warning.is_none(), "{:?}", r.warning);
    }

    #[test]
    fn tracing_variables_as_envoy_gateway_sets_them_with_the_grpc_protocol() {
        assert!(
            env(&with(&[])).unwrap().config.tracing.is_none(),
            "off by default"
        );
        let r = env(&with(&[
            ("TRACING_ENABLED", "true"),
            ("TRACING_SERVICE_NAME", "envoy-ratelimit"),
            ("TRACING_SERVICE_NAMESPACE", "envoy-gateway-system"),
            ("TRACING_SERVICE_INSTANCE_ID", "envoy-ratelimit-5d8f-abc"),
            ("TRACING_SAMPLING_RATE", "0.5"),
            ("TRACING_EXPORTER_PROTOCOL", "grpc"),
            (
                "OTEL_EXPORTER_OTLP_ENDPOINT",
                "http://otel-collector.monitoring:4317",
            ),
        ]))
        .unwrap();
        assert!(r.warning.is_none(), "{:?}", r.warning);
        let t = r.config.tracing.unwrap();
        assert_eq!(t.endpoint(), "http://otel-collector.monitoring:4317");
        assert_eq!(t.service_name, "envoy-ratelimit");
        assert_eq!(t.service_namespace.as_deref(), Some("envoy-gateway-system"));
        assert_eq!(
            t.service_instance_id.as_deref(),
            Some("envoy-ratelimit-5d8f-abc")
        );
        assert_eq!(t.sampling_ratio, 0.5);

        // The standard OTEL_* variables stand in for unset TRACING_* ones, as in the reference.
        let r = env(&with(&[
            ("OTEL_TRACES_EXPORTER", "otlp"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
            ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "collector:4317"),
            ("OTEL_SERVICE_NAME", "rl"),
            (
                "OTEL_RESOURCE_ATTRIBUTES",
                "service.namespace=ns, service.instance.id=pod-1",
            ),
            ("OTEL_TRACES_SAMPLER", "parentbased_traceidratio"),
            ("OTEL_TRACES_SAMPLER_ARG", "0.25"),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "2500"),
            ("OTEL_BSP_MAX_QUEUE_SIZE", "100"),
            ("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "10"),
        ]))
        .unwrap();
        let t = r.config.tracing.unwrap();
        assert_eq!(t.endpoint(), "http://collector:4317");
        assert_eq!(
            (t.service_name.as_str(), t.service_namespace.as_deref()),
            ("rl", Some("ns"))
        );
        assert_eq!(t.service_instance_id.as_deref(), Some("pod-1"));
        assert_eq!(t.sampling_ratio, 0.25);
        assert_eq!(t.export_timeout, Duration::from_millis(2500));
        assert_eq!((t.max_queue_size, t.max_export_batch_size), (100, 10));
        assert!(env(&with(&[
            ("OTEL_SDK_DISABLED", "true"),
            ("OTEL_TRACES_EXPORTER", "otlp")
        ]))
        .unwrap()
        .config
        .tracing
        .is_none());
        assert_eq!(
            env(&with(&[
                ("TRACING_ENABLED", "true"),
                ("TRACING_EXPORTER_PROTOCOL", "grpc")
            ]))
            .unwrap()
            .config
            .tracing
            .unwrap()
            .service_name,
            "RateLimit",
            "the reference's default service name"
        );
    }

    #[test]
    fn envoy_gateways_tracing_variables_select_otlp_http_as_in_the_reference() {
        // What Envoy Gateway sets: no protocol, so the reference's default, http.
        let r = env(&with(&[
            ("TRACING_ENABLED", "true"),
            ("TRACING_SERVICE_NAME", "envoy-ratelimit"),
            ("TRACING_SAMPLING_RATE", "1.0"),
            (
                "OTEL_EXPORTER_OTLP_ENDPOINT",
                "http://otel-collector.monitoring:4318",
            ),
        ]))
        .unwrap();
        let t = r.config.tracing.unwrap();
        assert_eq!(t.protocol, OtlpProtocol::Http);
        assert_eq!(
            t.endpoint(),
            "http://otel-collector.monitoring:4318/v1/traces"
        );
        let t = env(&with(&[("TRACING_ENABLED", "true")]))
            .unwrap()
            .config
            .tracing
            .unwrap();
        assert_eq!(t.endpoint(), "http://localhost:4318/v1/traces");
        let t = env(&with(&[
            ("TRACING_ENABLED", "true"),
            ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://c:4318/custom"),
        ]))
        .unwrap()
        .config
        .tracing
        .unwrap();
        assert_eq!(t.endpoint(), "http://c:4318/custom");
    }

    #[test]
    fn tracing_errors_name_the_variable() {
        for (var, value) in [
            ("TRACING_SAMPLING_RATE", "2"),
            ("TRACING_EXPORTER_PROTOCOL", "thrift"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "https://collector:4317"),
            ("OTEL_BSP_MAX_QUEUE_SIZE", "0"),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "5s"),
        ] {
            let mut vars = with(&[("TRACING_ENABLED", "true")]);
            if var != "TRACING_EXPORTER_PROTOCOL" {
                vars.push(("TRACING_EXPORTER_PROTOCOL", "grpc"));
            }
            vars.push((var, value));
            let e = env(&vars).unwrap_err().to_string();
            assert!(e.contains(var), "{var}: {e}");
        }
    }

    #[test]
    fn grpc_uds_replaces_the_tcp_listener() {
        let r = env(&with(&[("GRPC_UDS", "/var/run/ratelimit/grpc.sock")])).unwrap();
        let uds = r.config.listen_uds.unwrap();
        assert_eq!(uds.path, PathBuf::from("/var/run/ratelimit/grpc.sock"));
        assert_eq!(uds.mode_bits(), Ok(0o660));
        let e = env(&with(&[
            ("GRPC_UDS", "/tmp/rl.sock"),
            ("GRPC_SERVER_USE_TLS", "true"),
            ("GRPC_SERVER_TLS_CERT", "/c"),
            ("GRPC_SERVER_TLS_KEY", "/k"),
        ]))
        .unwrap_err()
        .to_string();
        assert!(e.contains("GRPC_UDS"), "{e}");
    }
}
