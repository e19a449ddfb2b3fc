//! The gRPC layer's metrics: decision counters per policy and result, and the request
//! latency histogram. Labels are policy ids, never request values.

use std::collections::HashMap;
use std::sync::{OnceLock, PoisonError, RwLock};

use edgelimit_contract::{PolicyId, RateLimitOutcome};

use crate::response::Evaluated;

/// Counts, once per request, each kind of backend outcome that was not a decision under
/// `edgelimit_backend_failures_total{category, cause}` — here, above every backend, so each
/// backend's failures are counted the same way.
pub(crate) fn record_backend_failures(outcomes: &[RateLimitOutcome]) {
    let mut seen: Vec<(&'static str, &'static str)> = Vec::new();
    for outcome in outcomes {
        if matches!(outcome, RateLimitOutcome::Evaluated(_)) {
            continue;
        }
        let kind = (outcome.category(), outcome.cause());
        if !seen.contains(&kind) {
            seen.push(kind);
            metrics::counter!(
                edgelimit_metrics::BACKEND_FAILURES,
                "category" => kind.0,
                "cause" => kind.1
            )
            .increment(1);
        }
    }
}

/// A request body that is not a `RateLimitRequest` (answered under the failure mode).
pub(crate) fn record_malformed_request() {
    metrics::counter!(edgelimit_metrics::MALFORMED_REQUESTS).increment(1);
}

/// Time from a request's arrival to its answer, `edgelimit_grpc_request_seconds`: the handle
/// taken on first use (after the server installed its recorder), not looked up in the
/// recorder's registry on every request.
#[derive(Default)]
pub(crate) struct RequestSeconds(OnceLock<metrics::Histogram>);

impl RequestSeconds {
    pub fn record(&self, seconds: f64) {
        self.0
            .get_or_init(|| metrics::histogram!(edgelimit_metrics::GRPC_REQUEST_SECONDS))
            .record(seconds);
    }
}

/// Values of the `result` label of `edgelimit_decisions_total`.
const DECISION_RESULTS: [&str; 5] = [
    "allowed",
    "shadow_denied",
    "denied",
    "shadow_failed",
    "failed_closed",
];

fn decision_result(e: &Evaluated<'_, '_>) -> usize {
    match &e.outcome {
        RateLimitOutcome::Evaluated(d) if d.allowed => 0,
        RateLimitOutcome::Evaluated(_) if e.applied.shadow => 1,
        RateLimitOutcome::Evaluated(_) => 2,
        _ if e.applied.shadow => 3,
        _ => 4,
    }
}

/// Slot of `edgelimit_near_limit_total` next to the decision results.
const NEAR_LIMIT: usize = DECISION_RESULTS.len();

/// `edgelimit_decisions_total` (per policy and result) and `edgelimit_near_limit_total` (per
/// policy) handles, registered on first use.
///
/// `counter!` with a label built at run time clones and hashes its whole key on every call
/// (five allocations per decision with the Prometheus recorder); a cached handle costs one
/// atomic add. The cache belongs to one policy set (by revision) and is emptied when another
/// one is in use, so it only ever holds current policy ids. Handles are taken from the
/// recorder installed when they are first used: the server installs it before serving.
#[derive(Default)]
pub(crate) struct DecisionCounters {
    cache: RwLock<CounterCache>,
}

#[derive(Default)]
struct CounterCache {
    revision: Option<u64>,
    counters: HashMap<PolicyId, [Option<metrics::Counter>; NEAR_LIMIT + 1]>,
}

impl DecisionCounters {
    pub fn record(&self, revision: u64, e: &Evaluated<'_, '_>) {
        let policy = e.applied.limit.policy.id();
        // Near limit: allowed, with at most 20% of the limit left (`remaining * 5 <= limit`).
        if let RateLimitOutcome::Evaluated(d) = &e.outcome {
            if d.allowed && d.limit > 0 && d.remaining.saturating_mul(5) <= d.limit {
                self.increment(revision, policy, NEAR_LIMIT);
            }
        }
        self.increment(revision, policy, decision_result(e));
    }

    fn increment(&self, revision: u64, policy: &PolicyId, slot: usize) {
        {
            let cache = self.cache.read().unwrap_or_else(PoisonError::into_inner);
            if cache.revision == Some(revision) {
                if let Some(counter) = cache.counters.get(policy).and_then(|c| c[slot].as_ref()) {
                    counter.increment(1);
                    return;
                }
            }
        }
        let mut cache = self.cache.write().unwrap_or_else(PoisonError::into_inner);
        if cache.revision != Some(revision) {
            cache.counters.clear();
            cache.revision = Some(revision);
        }
        cache.counters.entry(policy.clone()).or_default()[slot]
            .get_or_insert_with(|| match DECISION_RESULTS.get(slot) {
                Some(&result) => metrics::counter!(
                    edgelimit_metrics::DECISIONS,
                    "policy" => policy.to_string(),
                    "result" => result
                ),
                None => {
                    metrics::counter!(edgelimit_metrics::NEAR_LIMIT, "policy" => policy.to_string())
                }
            })
            .increment(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::translate::Applied;
    use edgelimit_contract::{
        AlgorithmParams, Certainty, Cost, DecisionSource, RateLimitDecision, RateLimitPolicy,
    };
    use edgelimit_policy::{Limit, Unit};
    use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, SharedString};
    use std::borrow::Cow;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;
    use std::sync::Mutex;
    use std::time::Duration;

    /// Records registrations and shares one atomic per distinct key.
    #[derive(Default)]
    struct Recorder {
        registrations: AtomicU64,
        counters: Mutex<HashMap<String, Arc<AtomicU64>>>,
    }

    impl Recorder {
        fn value(&self, name: &str, labels: &str) -> u64 {
            let name = format!("{name}{{{labels}}}");
            self.counters
                .lock()
                .unwrap()
                .get(&name)
                .map_or(0, |c| c.load(Ordering::Relaxed))
        }
    }

    impl metrics::Recorder for Recorder {
        fn describe_counter(&self, _: KeyName, _: Option<metrics::Unit>, _: SharedString) {}
        fn describe_gauge(&self, _: KeyName, _: Option<metrics::Unit>, _: SharedString) {}
        fn describe_histogram(&self, _: KeyName, _: Option<metrics::Unit>, _: SharedString) {}
        fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
            self.registrations.fetch_add(1, Ordering::Relaxed);
            let labels = key
                .labels()
                .map(|l| format!("{}={}", l.key(), l.value()))
                .collect::<Vec<_>>()
                .join(",");
            let name = format!("{}{{{labels}}}", key.name());
            let counter = self
                .counters
                .lock()
                .unwrap()
                .entry(name)
                .or_default()
                .clone();
            Counter::from_arc(counter)
        }
        fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> Gauge {
            Gauge::noop()
        }
        fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
            Histogram::noop()
        }
    }

    fn limit(id: &str) -> Limit {
        let policy = RateLimitPolicy::new(
            PolicyId::new(id).unwrap(),
            1,
            AlgorithmParams::FixedWindow {
                limit: 10,
                window_ms: 1000,
            },
            1,
            0,
            0,
        )
        .unwrap();
        Limit {
            name: None,
            requests_per_unit: 10,
            unit: Unit::Second,
            window_seconds: 1,
            policy: Arc::new(policy),
        }
    }

    fn applied(limit: &Limit, shadow: bool) -> Applied<'_> {
        Applied {
            descriptor: 0,
            limit: Cow::Borrowed(limit),
            shadow,
            rule_shadow: shadow,
            cost: Cost::Peek,
        }
    }

    fn evaluated<'a, 'p>(applied: &'a Applied<'p>, allowed: bool) -> Evaluated<'a, 'p> {
        let limit = &applied.limit;
        Evaluated {
            applied,
            outcome: RateLimitOutcome::Evaluated(RateLimitDecision {
                allowed,
                limit: 10,
                remaining: 0,
                retry_after: Duration::ZERO,
                reset_at_ms: 0,
                decided_at_ms: 0,
                policy_id: limit.policy.id().clone(),
                policy_revision: 1,
                source: DecisionSource::LocalMemory,
                certainty: Certainty::Certain,
            }),
        }
    }

    #[test]
    fn decision_counters_register_once_per_policy_result_and_set() {
        const DECISIONS: &str = edgelimit_metrics::DECISIONS;
        const NEAR: &str = edgelimit_metrics::NEAR_LIMIT;
        let recorder = Recorder::default();
        let counters = DecisionCounters::default();
        let (a, b) = (limit("d.a"), limit("d.b"));
        let (a_enforced, a_shadow, b_enforced) =
            (applied(&a, false), applied(&a, true), applied(&b, false));
        let registrations = || recorder.registrations.load(Ordering::Relaxed);
        metrics::with_local_recorder(&recorder, || {
            // Allowed with nothing left: a decision and a near-limit event each.
            for _ in 0..3 {
                counters.record(7, &evaluated(&a_enforced, true));
            }
            assert_eq!(registrations(), 2);
            counters.record(7, &evaluated(&a_enforced, false));
            counters.record(7, &evaluated(&a_shadow, false));
            counters.record(7, &evaluated(&b_enforced, true));
            assert_eq!(registrations(), 6);
            // Another policy set: handles are taken again, counts keep adding up.
            counters.record(8, &evaluated(&a_enforced, true));
            assert_eq!(registrations(), 8);
        });
        assert_eq!(recorder.value(DECISIONS, "policy=d.a,result=allowed"), 4);
        assert_eq!(recorder.value(NEAR, "policy=d.a"), 4);
        assert_eq!(recorder.value(DECISIONS, "policy=d.a,result=denied"), 1);
        assert_eq!(
            recorder.value(DECISIONS, "policy=d.a,result=shadow_denied"),
            1
        );
        assert_eq!(recorder.value(DECISIONS, "policy=d.b,result=allowed"), 1);
        assert_eq!(recorder.value(NEAR, "policy=d.b"), 1);
        assert_eq!(recorder.value(DECISIONS, "policy=d.b,result=denied"), 0);
    }
}
