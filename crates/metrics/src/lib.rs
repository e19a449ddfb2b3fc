//! Every metric edgelimit exports, in one place: its name (the constant each layer records
//! under), kind, unit and description (registered with the recorder by [`describe_all`]).
//! A test in the server holds this catalogue and the README's metrics table equal.
//!
//! Labels stay bounded everywhere: policy ids and domains come from configuration, every other
//! label is a fixed enum; no request value ever becomes a label.
#![forbid(unsafe_code)]

use metrics::Unit;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

#[derive(Debug, Clone, Copy)]
pub struct Metric {
    pub name: &'static str,
    pub kind: Kind,
    pub unit: Option<Unit>,
    pub help: &'static str,
}

macro_rules! catalogue {
    ($($konst:ident = $name:literal, $kind:ident, $unit:expr, $help:literal;)+) => {
        $(pub const $konst: &str = $name;)+
        /// Every metric, in the README's order.
        pub const ALL: &[Metric] = &[
            $(Metric { name: $name, kind: Kind::$kind, unit: $unit, help: $help },)+
        ];
    };
}

catalogue! {
    DECISIONS = "edgelimit_decisions_total", Counter, None,
        "Limit evaluations by policy id and result";
    NEAR_LIMIT = "edgelimit_near_limit_total", Counter, None,
        "Allowed evaluations that left at most 20% of the limit, by policy id";
    GRPC_REQUEST_SECONDS = "edgelimit_grpc_request_seconds", Histogram, Some(Unit::Seconds),
        "ShouldRateLimit handling time";
    MALFORMED_REQUESTS = "edgelimit_malformed_requests_total", Counter, None,
        "Request bodies that are not a RateLimitRequest, answered under the failure mode";
    BACKEND_FAILURES = "edgelimit_backend_failures_total", Counter, None,
        "Backend outcomes that were not decisions, by category and cause";
    REDIS_COMMAND_SECONDS = "edgelimit_redis_command_seconds", Histogram, Some(Unit::Seconds),
        "Redis program round trip by program";
    REDIS_NOSCRIPT_RELOADS = "edgelimit_redis_noscript_reloads_total", Counter, None,
        "NOSCRIPT replies answered by resending a program's source";
    DENY_CACHE_HITS = "edgelimit_deny_cache_hits_total", Counter, None,
        "Requests denied locally from the last answers' bounds, with no backend call";
    DENY_CACHE_ENTRIES = "edgelimit_deny_cache_entries", Gauge, None,
        "Bounds the deny cache holds";
    DENY_CACHE_EVICTIONS = "edgelimit_deny_cache_evictions_total", Counter, None,
        "Bounds evicted at deny_cache.max_entries";
    REDIS_BATCH_REQUESTS = "edgelimit_redis_batch_requests", Histogram, None,
        "Requests decided by one batch program call";
    REDIS_PARTIAL_COMMITS = "edgelimit_redis_partial_commits_total", Counter, None,
        "Cluster slot groups that committed for a request another group then denied at commit";
    REDIS_IN_FLIGHT = "edgelimit_redis_in_flight", Gauge, None,
        "Redis commands in flight (sampled)";
    REDIS_LIVE_CONNECTIONS = "edgelimit_redis_live_connections", Gauge, None,
        "Live Redis connections (sampled)";
    REDIS_EVICTING_POLICY = "edgelimit_redis_evicting_policy", Gauge, None,
        "1 if the last Redis connected to has a maxmemory-policy that may evict counters, 0 for noeviction";
    MEMORY_SUBJECTS = "edgelimit_memory_subjects", Gauge, None,
        "States the embedded backend tracks (sampled)";
    MEMORY_CAPACITY_REJECTIONS = "edgelimit_memory_capacity_rejections_total", Counter, None,
        "New subjects the embedded backend refused at memory.max_subjects (sampled)";
    GRPC_CONNECTIONS = "edgelimit_grpc_connections", Gauge, None,
        "Open gRPC connections";
    GRPC_CONNECTIONS_REFUSED = "edgelimit_grpc_connections_refused_total", Counter, None,
        "Connections closed at accept because limits.max_connections were open";
    GRPC_HANDSHAKE_TIMEOUTS = "edgelimit_grpc_handshake_timeouts_total", Counter, None,
        "Connections closed for sending no HTTP/2 preface within limits.handshake_timeout";
    GRPC_TLS_HANDSHAKE_FAILURES = "edgelimit_grpc_tls_handshake_failures_total", Counter, None,
        "TLS connections to the gRPC listener refused during the handshake, by reason";
    CONFIG_RELOADS = "edgelimit_config_reloads_total", Counter, None,
        "Policy reload attempts by result";
    CONFIG_REVISION = "edgelimit_config_revision", Gauge, None,
        "Low 53 bits of the loaded policy set's revision";
    CONFIG_RULES = "edgelimit_config_rules", Gauge, None,
        "Descriptors (rules) in the loaded policy set";
    CONFIG_DOMAINS = "edgelimit_config_domains", Gauge, None,
        "Domains in the loaded policy set; 0 means every request is answered OK";
    CONFIG_LAST_RELOAD_SUCCESS = "edgelimit_config_last_reload_success_timestamp_seconds", Gauge,
        Some(Unit::Seconds), "When the loaded policy set was loaded";
    RLQS_STREAMS = "edgelimit_rlqs_streams", Gauge, None,
        "Open RLQS (StreamRateLimitQuotas) streams";
    RLQS_STREAMS_REFUSED = "edgelimit_rlqs_streams_refused_total", Counter, None,
        "RLQS streams refused RESOURCE_EXHAUSTED because rlqs.max_streams were open";
    RLQS_BUCKETS_REFUSED = "edgelimit_rlqs_buckets_refused_total", Counter, None,
        "RLQS buckets answered deny_all without evaluation, by reason (bounds, missing domain)";
    RLQS_ASSIGNMENTS = "edgelimit_rlqs_assignments_total", Counter, None,
        "RLQS bucket actions sent, by policy id and action";
    RLQS_REPORTED_REQUESTS = "edgelimit_rlqs_reported_requests_total", Counter, None,
        "Requests Envoy reported for RLQS buckets, by policy id and result (allowed or denied)";
    RLQS_OVERSHOOT_REQUESTS = "edgelimit_rlqs_overshoot_requests_total", Counter, None,
        "Reported allowed requests beyond the quota left when they were reported, by policy id";
    BUILD_INFO = "edgelimit_build_info", Gauge, None,
        "Always 1; labels carry the version";
}

/// Registers every metric's description (and unit) with the installed recorder.
pub fn describe_all() {
    for metric in ALL {
        match (metric.kind, metric.unit) {
            (Kind::Counter, Some(unit)) => {
                metrics::describe_counter!(metric.name, unit, metric.help)
            }
            (Kind::Counter, None) => metrics::describe_counter!(metric.name, metric.help),
            (Kind::Gauge, Some(unit)) => metrics::describe_gauge!(metric.name, unit, metric.help),
            (Kind::Gauge, None) => metrics::describe_gauge!(metric.name, metric.help),
            (Kind::Histogram, Some(unit)) => {
                metrics::describe_histogram!(metric.name, unit, metric.help)
            }
            (Kind::Histogram, None) => metrics::describe_histogram!(metric.name, metric.help),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_prefixed_and_suffixed_by_kind() {
        for (i, m) in ALL.iter().enumerate() {
            assert!(m.name.starts_with("edgelimit_"), "{}", m.name);
            assert!(
                ALL[..i].iter().all(|o| o.name != m.name),
                "{} twice",
                m.name
            );
            // Prometheus conventions: counters end in _total, nothing else does.
            assert_eq!(
                m.kind == Kind::Counter,
                m.name.ends_with("_total"),
                "{}",
                m.name
            );
            if m.unit == Some(Unit::Seconds) {
                assert!(m.name.ends_with("_seconds"), "{}", m.name);
            }
        }
    }
}
