//! Prometheus metrics: the process-wide recorder, its histogram buckets, and the gauges that
//! are not tied to one request (build info, loaded configuration, Redis connections).
//!
//! Every label is bounded: policy ids and domains come from configuration, everything else
//! is a fixed enum. No request value ever becomes a label.

use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

use crate::memory::MemoryBackend;
use crate::policy::PolicySet;
use crate::redis::RedisBackend;

/// Histogram buckets in seconds: sub-millisecond (a local Redis answers in ~100 µs) to one
/// second (far past Envoy's default 20 ms filter timeout).
pub const LATENCY_BUCKETS: &[f64] = &[
    0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0,
];

#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error("cannot install the Prometheus recorder: {0}")]
    Install(String),
}

static HANDLE: OnceLock<Result<PrometheusHandle, String>> = OnceLock::new();

/// Installs the global recorder once per process and returns the handle that renders it.
/// Later calls (several servers in one test process) share the first recorder.
pub fn install() -> Result<PrometheusHandle, TelemetryError> {
    HANDLE
        .get_or_init(|| {
            let handle = PrometheusBuilder::new()
                .set_buckets(LATENCY_BUCKETS)
                .map_err(|e| e.to_string())?
                .install_recorder()
                .map_err(|e| e.to_string())?;
            describe();
            build_info();
            Ok(handle)
        })
        .clone()
        .map_err(TelemetryError::Install)
}

/// Histograms are kept in windows that only `run_upkeep` drains; without this task their
/// memory grows with traffic.
pub fn spawn_upkeep(handle: PrometheusHandle) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut interval = tokio::time::interval(Duration::from_secs(5));
        loop {
            interval.tick().await;
            handle.run_upkeep();
        }
    })
}

fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_counter!(
        "edgelimit_decisions_total",
        "Limit evaluations by policy id and result"
    );
    describe_counter!(
        "edgelimit_near_limit_total",
        "Allowed evaluations that left at most 20% of the limit, by policy id"
    );
    describe_histogram!(
        "edgelimit_grpc_request_seconds",
        Unit::Seconds,
        "ShouldRateLimit handling time"
    );
    describe_counter!(
        "edgelimit_backend_failures_total",
        "Backend outcomes that were not decisions, by category and cause"
    );
    describe_counter!(
        "edgelimit_redis_noscript_reloads_total",
        "NOSCRIPT replies answered by resending a program's source"
    );
    describe_histogram!(
        "edgelimit_redis_command_seconds",
        Unit::Seconds,
        "Redis program round trip by program"
    );
    describe_gauge!(
        "edgelimit_redis_in_flight",
        "Redis commands in flight (sampled)"
    );
    describe_gauge!(
        "edgelimit_redis_live_connections",
        "Live Redis connections (sampled)"
    );
    describe_gauge!(
        "edgelimit_memory_subjects",
        "States the embedded backend tracks (sampled)"
    );
    describe_counter!(
        "edgelimit_memory_capacity_rejections_total",
        "New subjects the embedded backend refused at memory.max_subjects (sampled)"
    );
    describe_counter!(
        "edgelimit_config_reloads_total",
        "Policy reload attempts by result"
    );
    describe_gauge!(
        "edgelimit_config_revision",
        "Low 53 bits of the loaded policy set's revision"
    );
    describe_gauge!(
        "edgelimit_config_rules",
        "Descriptors (rules) in the loaded policy set"
    );
    describe_gauge!(
        "edgelimit_config_last_reload_success_timestamp_seconds",
        Unit::Seconds,
        "When the loaded policy set was loaded"
    );
    describe_gauge!("edgelimit_build_info", "Always 1; labels carry the version");
}

fn build_info() {
    metrics::gauge!("edgelimit_build_info", "version" => env!("CARGO_PKG_VERSION")).set(1.0);
}

/// The revision as a gauge value: Prometheus samples are doubles, exact up to 2^53.
pub fn revision_gauge_value(revision: u64) -> u64 {
    revision & ((1u64 << 53) - 1)
}

/// Records the set now being served.
pub fn record_loaded(set: &PolicySet) {
    metrics::gauge!("edgelimit_config_revision").set(revision_gauge_value(set.revision()) as f64);
    metrics::gauge!("edgelimit_config_rules").set(set.len() as f64);
    let domains = set.domains().count();
    metrics::gauge!("edgelimit_config_domains").set(domains as f64);
    if domains == 0 {
        // Every request is then answered OK: say it loudly, once per load.
        tracing::warn!(
            "the policy set has no domains (no policy files, or the wrong policy_dir): every \
             request is answered OK with no limit; readiness.require_policies makes /readyz fail meanwhile"
        );
    }
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0);
    metrics::gauge!("edgelimit_config_last_reload_success_timestamp_seconds").set(now);
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReloadResult {
    Success,
    Failure,
}

pub fn record_reload(result: ReloadResult) {
    let label = match result {
        ReloadResult::Success => "success",
        ReloadResult::Failure => "failure",
    };
    metrics::counter!("edgelimit_config_reloads_total", "result" => label).increment(1);
}

/// Samples the Redis backend's gauges; they are cheap atomics, so once a second is plenty.
pub fn spawn_redis_sampler(backend: Arc<RedisBackend>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut interval = tokio::time::interval(Duration::from_secs(1));
        loop {
            interval.tick().await;
            metrics::gauge!("edgelimit_redis_in_flight").set(backend.in_flight() as f64);
            metrics::gauge!("edgelimit_redis_live_connections")
                .set(backend.live_connections() as f64);
        }
    })
}

/// Samples the embedded backend's size and refusals.
pub fn spawn_memory_sampler(backend: Arc<MemoryBackend>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut interval = tokio::time::interval(Duration::from_secs(1));
        loop {
            interval.tick().await;
            metrics::gauge!("edgelimit_memory_subjects").set(backend.tracked_subjects() as f64);
            metrics::counter!("edgelimit_memory_capacity_rejections_total")
                .absolute(backend.capacity_rejections());
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_sorted_and_span_sub_millisecond_to_a_second() {
        assert!(LATENCY_BUCKETS.windows(2).all(|w| w[0] < w[1]));
        assert!(LATENCY_BUCKETS[0] < 0.001);
        assert_eq!(LATENCY_BUCKETS.last(), Some(&1.0));
    }

    #[test]
    fn revision_gauge_is_exact_as_a_double() {
        let v = revision_gauge_value(u64::MAX);
        assert_eq!(v as f64 as u64, v);
        assert_eq!(revision_gauge_value(42), 42);
    }
}
