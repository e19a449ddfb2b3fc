//! Prometheus metrics: the process-wide recorder, its histogram buckets, and the gauges that
//! are not tied to one request (build info, loaded configuration, Redis connections).
//!
//! Every label is bounded: policy ids and domains come from configuration, everything else
//! is a fixed enum. No request value ever becomes a label.

use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

use crate::memory::MemoryBackend;
use crate::policy::PolicySet;
use crate::redis::RedisBackend;

/// Histogram buckets in seconds: sub-millisecond (a local Redis answers in ~100 µs) to one
/// second (far past Envoy's default 20 ms filter timeout).
pub const LATENCY_BUCKETS: &[f64] = &[
    0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0,
];

/// Buckets of the batch-size histogram: requests per batch call, up to `redis::MAX_BATCH`.
pub const BATCH_BUCKETS: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0];

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
                .set_buckets_for_metric(
                    Matcher::Full(edgelimit_metrics::REDIS_BATCH_REQUESTS.to_owned()),
                    BATCH_BUCKETS,
                )
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
    edgelimit_metrics::describe_all();
}

fn build_info() {
    metrics::gauge!(edgelimit_metrics::BUILD_INFO, "version" => env!("CARGO_PKG_VERSION")).set(1.0);
}

/// The revision as a gauge value: Prometheus samples are doubles, exact up to 2^53.
pub fn revision_gauge_value(revision: u64) -> u64 {
    revision & ((1u64 << 53) - 1)
}

/// Records the set now being served.
pub fn record_loaded(set: &PolicySet) {
    metrics::gauge!(edgelimit_metrics::CONFIG_REVISION)
        .set(revision_gauge_value(set.revision()) as f64);
    metrics::gauge!(edgelimit_metrics::CONFIG_RULES).set(set.len() as f64);
    let domains = set.domains().count();
    metrics::gauge!(edgelimit_metrics::CONFIG_DOMAINS).set(domains as f64);
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
    metrics::gauge!(edgelimit_metrics::CONFIG_LAST_RELOAD_SUCCESS).set(now);
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
    metrics::counter!(edgelimit_metrics::CONFIG_RELOADS, "result" => label).increment(1);
}

/// Samples the Redis backend's gauges; they are cheap atomics, so once a second is plenty.
pub fn spawn_redis_sampler(backend: Arc<RedisBackend>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut interval = tokio::time::interval(Duration::from_secs(1));
        loop {
            interval.tick().await;
            metrics::gauge!(edgelimit_metrics::REDIS_IN_FLIGHT).set(backend.in_flight() as f64);
            metrics::gauge!(edgelimit_metrics::REDIS_LIVE_CONNECTIONS)
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
            metrics::gauge!(edgelimit_metrics::MEMORY_SUBJECTS)
                .set(backend.tracked_subjects() as f64);
            metrics::counter!(edgelimit_metrics::MEMORY_CAPACITY_REJECTIONS)
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

    /// The README's metrics table and the catalogue name the same metrics, with the same kind.
    #[test]
    fn readme_documents_exactly_the_catalogue() {
        let readme = include_str!("../../README.md");
        let section = readme
            .split("\n### Metrics")
            .nth(1)
            .and_then(|rest| rest.split("\n### ").next())
            .expect("README has a Metrics section");
        let mut documented: Vec<(String, String)> = Vec::new();
        for row in section.lines().filter(|l| l.starts_with("| `edgelimit_")) {
            let cells: Vec<&str> = row.split(" | ").collect();
            let names: Vec<&str> = cells[0].split(" / ").collect();
            let kinds: Vec<&str> = cells[1].split(" / ").collect();
            for (i, name) in names.iter().enumerate() {
                let name = name.trim_start_matches("| ").trim_matches('`').to_owned();
                let kind = kinds
                    .get(i)
                    .or(kinds.last())
                    .expect("a kind")
                    .trim()
                    .to_owned();
                documented.push((name, kind));
            }
        }
        let mut catalogue: Vec<(String, String)> = edgelimit_metrics::ALL
            .iter()
            .map(|m| {
                let kind = match m.kind {
                    edgelimit_metrics::Kind::Counter => "counter",
                    edgelimit_metrics::Kind::Gauge => "gauge",
                    edgelimit_metrics::Kind::Histogram => "histogram",
                };
                (m.name.to_owned(), kind.to_owned())
            })
            .collect();
        documented.sort();
        catalogue.sort();
        assert_eq!(documented, catalogue);
    }
}
