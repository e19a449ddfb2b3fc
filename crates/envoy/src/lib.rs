//! Envoy's `RateLimitService`: translates requests into policy lookups and backend
//! evaluations, and answers with statuses and headers. Uncertain outcomes fail closed.
#![forbid(unsafe_code)]

mod deadline;
mod headers;
pub mod subject;
mod translate;

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    rate_limit::Unit as EnvoyUnit, Code, DescriptorStatus, RateLimit as EnvoyRateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::Duration as ProtoDuration;
use futures_util::future::join_all;
use tonic::{Request, Response, Status};

use crate::subject::SubjectHasher;
use edgelimit_contract::{
    ContractError, Cost, PolicyId, RateLimitDecision, RateLimitOutcome, RateLimitPolicy,
    RateLimitPort, RateLimitRequest as PortRequest, SubjectDigest,
};
use edgelimit_policy::{Limit, PolicySet, Unit};

pub use deadline::parse_grpc_timeout;
pub use headers::{HeaderFacts, HeaderSettings};
pub use translate::{RequestBounds, RequestError};

/// How an outcome that is not a decision reaches Envoy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FailureMode {
    /// Answer `OVER_LIMIT` (with `Retry-After`): denies even with Envoy's default
    /// `failure_mode_deny: false`.
    #[default]
    OverLimit,
    /// Answer gRPC `UNAVAILABLE`: denies only if Envoy sets `failure_mode_deny: true`.
    GrpcUnavailable,
}

#[derive(Debug, Clone)]
pub struct ServiceSettings {
    pub failure_mode: FailureMode,
    pub headers: HeaderSettings,
    /// Report every would-be denial as OK (counted as shadow_denied).
    pub shadow_mode: bool,
    /// Deadline for callers that send no `grpc-timeout`.
    pub default_timeout: Duration,
    pub bounds: RequestBounds,
}

impl Default for ServiceSettings {
    fn default() -> Self {
        Self {
            failure_mode: FailureMode::OverLimit,
            headers: HeaderSettings::default(),
            shadow_mode: false,
            default_timeout: Duration::from_secs(1),
            bounds: RequestBounds::default(),
        }
    }
}

/// The rate limiter behind the gRPC service; usable without gRPC (tests, tools).
pub struct RateLimiter<B> {
    policies: Arc<ArcSwap<PolicySet>>,
    backend: Arc<B>,
    hasher: Arc<SubjectHasher>,
    previous_hasher: Option<Arc<SubjectHasher>>,
    settings: ServiceSettings,
    counters: DecisionCounters,
}

/// A descriptor's subject digest, and its digest under the previous secret while rotating.
#[derive(Clone, Copy)]
struct Subjects {
    current: SubjectDigest,
    previous: Option<SubjectDigest>,
}

impl Subjects {
    fn iter(self) -> impl Iterator<Item = SubjectDigest> {
        std::iter::once(self.current).chain(self.previous)
    }
}

/// One limit to evaluate for one descriptor.
struct Applied<'p> {
    descriptor: usize,
    limit: Cow<'p, Limit>,
    shadow: bool,
}

/// What a limit came to.
struct Evaluated<'p> {
    applied: Applied<'p>,
    outcome: RateLimitOutcome,
}

impl<B: RateLimitPort> RateLimiter<B> {
    pub fn new(
        policies: Arc<ArcSwap<PolicySet>>,
        backend: Arc<B>,
        hasher: Arc<SubjectHasher>,
        settings: ServiceSettings,
    ) -> Self {
        Self {
            policies,
            backend,
            hasher,
            previous_hasher: None,
            settings,
            counters: DecisionCounters::default(),
        }
    }

    /// Also evaluates every subject under `previous` until it is removed, so rotating the
    /// HMAC secret does not hand every subject a fresh quota (see SECURITY.md).
    pub fn with_previous_secret(mut self, previous: Arc<SubjectHasher>) -> Self {
        self.previous_hasher = Some(previous);
        self
    }

    fn subjects(&self, domain: &str, descriptor: &RateLimitDescriptor) -> Subjects {
        let entries = || {
            descriptor
                .entries
                .iter()
                .map(|e| (e.key.as_str(), e.value.as_str()))
        };
        Subjects {
            current: self.hasher.digest(domain, entries()),
            previous: self
                .previous_hasher
                .as_ref()
                .map(|h| h.digest(domain, entries())),
        }
    }

    pub fn into_server(self) -> RateLimitServiceServer<Self> {
        RateLimitServiceServer::new(self)
    }

    pub async fn decide(
        &self,
        request: &RateLimitRequest,
        deadline: Instant,
    ) -> Result<RateLimitResponse, Status> {
        translate::validate(request, &self.settings.bounds)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        let policies = self.policies.load_full();
        let (applied, unlimited) = self.applicable_limits(&policies, request)?;

        // One digest per descriptor (two while a secret rotates), shared by its limits.
        let mut subjects: Vec<Option<Subjects>> = vec![None; request.descriptors.len()];
        let mut jobs = Vec::with_capacity(applied.len());
        for (index, item) in applied.iter().enumerate() {
            let descriptor = &request.descriptors[item.descriptor];
            let units = translate::descriptor_cost(request.hits_addend, descriptor);
            let cost = match units {
                0 => Cost::Peek,
                n => Cost::consume(n).map_err(|e| Status::invalid_argument(e.to_string()))?,
            };
            let policy = &item.limit.policy;
            if units > policy.max_cost() {
                return Err(Status::invalid_argument(
                    RequestError::CostAboveMaximum {
                        descriptor: item.descriptor,
                        cost: units,
                        max: policy.max_cost(),
                    }
                    .to_string(),
                ));
            }
            let subjects = *subjects[item.descriptor]
                .get_or_insert_with(|| self.subjects(&request.domain, descriptor));
            for subject in subjects.iter() {
                jobs.push((
                    index,
                    PortRequest::new(policy, subject, cost, None, deadline),
                ));
            }
        }

        if let [(_, port_request)] = jobs.as_slice() {
            // One limit and one subject, the common case: no join_all (two allocations) and
            // nothing to fold.
            let outcome = self.evaluate(&applied[0].limit.policy, port_request).await;
            let evaluated: Vec<Evaluated<'_>> = applied
                .into_iter()
                .zip(std::iter::once(outcome))
                .map(|(applied, outcome)| Evaluated { applied, outcome })
                .collect();
            return self.respond(request, &evaluated, &unlimited, policies.revision());
        }
        let evaluations = jobs
            .iter()
            .map(|(index, request)| self.evaluate(&applied[*index].limit.policy, request));
        let outcomes = join_all(evaluations).await;
        // During a rotation the old and the new subject must both allow: keep the worse.
        let mut folded: Vec<Option<RateLimitOutcome>> = vec![None; applied.len()];
        for ((index, _), outcome) in jobs.iter().zip(outcomes) {
            let slot = &mut folded[*index];
            let worse = slot
                .as_ref()
                .is_none_or(|kept| Restriction::of(&outcome) > Restriction::of(kept));
            if worse {
                *slot = Some(outcome);
            }
        }
        let evaluated: Vec<Evaluated<'_>> = applied
            .into_iter()
            .zip(folded)
            .filter_map(|(applied, outcome)| {
                Some(Evaluated {
                    applied,
                    outcome: outcome?,
                })
            })
            .collect();
        self.respond(request, &evaluated, &unlimited, policies.revision())
    }

    async fn evaluate(
        &self,
        policy: &RateLimitPolicy,
        request: &Result<PortRequest, ContractError>,
    ) -> RateLimitOutcome {
        match request {
            Ok(request) => self.backend.evaluate(policy, request).await,
            // Only an expired deadline can fail here (cost was checked above).
            Err(_) => RateLimitOutcome::Unavailable {
                policy_id: policy.id().clone(),
                retry_after: Duration::from_secs(1),
                cause: edgelimit_contract::UnavailableCause::DeadlineTooShort,
            },
        }
    }

    /// Limits that apply to each descriptor, after `replaces` across the whole request, and
    /// which descriptors matched an `unlimited` rule.
    fn applicable_limits<'p>(
        &self,
        policies: &'p PolicySet,
        request: &RateLimitRequest,
    ) -> Result<(Vec<Applied<'p>>, Vec<bool>), Status> {
        let mut applied = Vec::with_capacity(request.descriptors.len());
        let mut unlimited = vec![false; request.descriptors.len()];
        if !policies.has_domain(&request.domain) {
            return Ok((applied, unlimited));
        }
        let mut replaced: Vec<&str> = Vec::new();
        for (index, descriptor) in request.descriptors.iter().enumerate() {
            if let Some(limit) = override_limit(policies, &request.domain, index, descriptor)? {
                applied.push(Applied {
                    descriptor: index,
                    limit: Cow::Owned(limit),
                    shadow: self.settings.shadow_mode,
                });
                continue;
            }
            let entries = descriptor
                .entries
                .iter()
                .map(|e| (e.key.as_str(), e.value.as_str()));
            let Some(rule) = policies.find(&request.domain, entries) else {
                continue;
            };
            unlimited[index] = rule.unlimited;
            replaced.extend(rule.replaces.iter().map(String::as_str));
            for limit in &rule.limits {
                applied.push(Applied {
                    descriptor: index,
                    limit: Cow::Borrowed(limit),
                    shadow: rule.shadow_mode || self.settings.shadow_mode,
                });
            }
        }
        if !replaced.is_empty() {
            applied.retain(|a| {
                a.limit
                    .name
                    .as_deref()
                    .is_none_or(|name| !replaced.contains(&name))
            });
        }
        Ok((applied, unlimited))
    }

    fn respond(
        &self,
        request: &RateLimitRequest,
        evaluated: &[Evaluated<'_>],
        unlimited: &[bool],
        revision: u64,
    ) -> Result<RateLimitResponse, Status> {
        let mut statuses: Vec<DescriptorStatus> = Vec::with_capacity(request.descriptors.len());
        let mut headline: Option<(&Evaluated<'_>, Restriction)> = None;
        for (index, &unlimited) in unlimited.iter().enumerate() {
            let mine = evaluated.iter().filter(|e| e.applied.descriptor == index);
            let mut worst: Option<(&Evaluated<'_>, Restriction)> = None;
            for e in mine {
                self.counters.record(revision, e);
                let fails_the_call = self.settings.failure_mode == FailureMode::GrpcUnavailable
                    && !e.applied.shadow
                    && !matches!(e.outcome, RateLimitOutcome::Evaluated(_));
                if fails_the_call {
                    return Err(Status::unavailable(format!(
                        "rate limit backend outcome for policy {} is {} ({})",
                        e.applied.limit.policy.id(),
                        e.outcome.category(),
                        e.outcome.cause()
                    )));
                }
                let r = Restriction::of(&e.outcome);
                if worst.as_ref().is_none_or(|(_, w)| r > *w) {
                    worst = Some((e, r));
                }
            }
            let status = match &worst {
                Some((e, r)) => {
                    if headline.as_ref().is_none_or(|(_, h)| r > h) {
                        headline = Some((e, *r));
                    }
                    descriptor_status(e)
                }
                None if unlimited => DescriptorStatus {
                    code: Code::Ok as i32,
                    limit_remaining: u32::MAX,
                    ..Default::default()
                },
                None => DescriptorStatus {
                    code: Code::Ok as i32,
                    ..Default::default()
                },
            };
            statuses.push(status);
        }
        let over = statuses.iter().any(|s| s.code == Code::OverLimit as i32);
        let response_headers_to_add = headline
            .map(|(e, _)| headers::build(&self.settings.headers, &header_facts(e)))
            .unwrap_or_default();
        Ok(RateLimitResponse {
            overall_code: if over { Code::OverLimit } else { Code::Ok } as i32,
            statuses,
            response_headers_to_add,
            ..Default::default()
        })
    }
}

fn override_limit(
    policies: &PolicySet,
    domain: &str,
    index: usize,
    descriptor: &RateLimitDescriptor,
) -> Result<Option<Limit>, Status> {
    let Some(limit) = &descriptor.limit else {
        return Ok(None);
    };
    // envoy.type.v3.RateLimitUnit: the override has no WEEK.
    let unit = match limit.unit {
        1 => Unit::Second,
        2 => Unit::Minute,
        3 => Unit::Hour,
        4 => Unit::Day,
        5 => Unit::Month,
        6 => Unit::Year,
        other => {
            return Err(Status::invalid_argument(
                RequestError::OverrideUnit {
                    descriptor: index,
                    unit: other,
                }
                .to_string(),
            ))
        }
    };
    policies
        .override_limit(domain, u64::from(limit.requests_per_unit), unit)
        .map(Some)
        .map_err(|e| Status::invalid_argument(format!("descriptors[{index}].limit: {e}")))
}

/// Orders outcomes from least to most restrictive: allowed (more remaining is less
/// restrictive), denied (longer retry is more restrictive), failed (always most).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Restriction {
    Allowed { remaining_inverse: u64 },
    Denied { retry_after: Duration },
    Failed,
}

impl Restriction {
    fn of(outcome: &RateLimitOutcome) -> Self {
        match outcome {
            RateLimitOutcome::Evaluated(d) if d.allowed => Restriction::Allowed {
                remaining_inverse: u64::MAX - d.remaining,
            },
            RateLimitOutcome::Evaluated(d) => Restriction::Denied {
                retry_after: d.retry_after,
            },
            _ => Restriction::Failed,
        }
    }
}

fn envoy_unit(unit: Unit) -> EnvoyUnit {
    match unit {
        Unit::Second => EnvoyUnit::Second,
        Unit::Minute => EnvoyUnit::Minute,
        Unit::Hour => EnvoyUnit::Hour,
        Unit::Day => EnvoyUnit::Day,
        Unit::Week => EnvoyUnit::Week,
        Unit::Month => EnvoyUnit::Month,
        Unit::Year => EnvoyUnit::Year,
    }
}

fn proto_duration(d: Duration) -> ProtoDuration {
    ProtoDuration {
        seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        nanos: i32::try_from(d.subsec_nanos()).unwrap_or(0),
    }
}

fn current_limit(limit: &Limit) -> EnvoyRateLimit {
    EnvoyRateLimit {
        name: limit.name.clone().unwrap_or_default(),
        requests_per_unit: u32::try_from(limit.requests_per_unit).unwrap_or(u32::MAX),
        unit: envoy_unit(limit.unit) as i32,
    }
}

fn descriptor_status(e: &Evaluated<'_>) -> DescriptorStatus {
    let limit = &e.applied.limit;
    match &e.outcome {
        RateLimitOutcome::Evaluated(d) => DescriptorStatus {
            code: if d.allowed || e.applied.shadow {
                Code::Ok
            } else {
                Code::OverLimit
            } as i32,
            current_limit: Some(current_limit(limit)),
            limit_remaining: u32::try_from(d.remaining).unwrap_or(u32::MAX),
            duration_until_reset: Some(proto_duration(d.reset_after())),
            quota: None,
        },
        failed => DescriptorStatus {
            // Fail closed: unavailable, indeterminate and incompatible never become OK,
            // except for limits the operator runs in shadow mode.
            code: if e.applied.shadow {
                Code::Ok
            } else {
                Code::OverLimit
            } as i32,
            current_limit: Some(current_limit(limit)),
            limit_remaining: 0,
            duration_until_reset: Some(proto_duration(failure_retry_after(failed))),
            quota: None,
        },
    }
}

fn failure_retry_after(outcome: &RateLimitOutcome) -> Duration {
    match outcome {
        RateLimitOutcome::Unavailable { retry_after, .. }
        | RateLimitOutcome::Indeterminate { retry_after, .. } => *retry_after,
        _ => Duration::from_secs(1),
    }
}

fn header_facts<'a>(e: &'a Evaluated<'_>) -> HeaderFacts<'a> {
    let limit = &e.applied.limit;
    let name = limit
        .name
        .as_deref()
        .unwrap_or_else(|| limit.policy.id().as_str());
    let enforced_denial = |d: &RateLimitDecision| !d.allowed && !e.applied.shadow;
    match &e.outcome {
        RateLimitOutcome::Evaluated(d) => HeaderFacts {
            name,
            limit: d.limit,
            window_seconds: limit.window_seconds,
            remaining: d.remaining,
            reset_after: d.reset_after(),
            retry_after: enforced_denial(d).then_some(d.retry_after),
        },
        failed => HeaderFacts {
            name,
            limit: limit.policy.params().limit(),
            window_seconds: limit.window_seconds,
            remaining: 0,
            reset_after: failure_retry_after(failed),
            retry_after: (!e.applied.shadow).then(|| failure_retry_after(failed)),
        },
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

fn decision_result(e: &Evaluated<'_>) -> usize {
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
struct DecisionCounters {
    cache: RwLock<CounterCache>,
}

#[derive(Default)]
struct CounterCache {
    revision: Option<u64>,
    counters: HashMap<PolicyId, [Option<metrics::Counter>; NEAR_LIMIT + 1]>,
}

impl DecisionCounters {
    fn record(&self, revision: u64, e: &Evaluated<'_>) {
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
                    "edgelimit_decisions_total",
                    "policy" => policy.to_string(),
                    "result" => result
                ),
                None => {
                    metrics::counter!("edgelimit_near_limit_total", "policy" => policy.to_string())
                }
            })
            .increment(1);
    }
}

#[tonic::async_trait]
impl<B: RateLimitPort> RateLimitService for RateLimiter<B> {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let started = Instant::now();
        let timeout = request
            .metadata()
            .get("grpc-timeout")
            .and_then(|v| v.to_str().ok())
            .and_then(parse_grpc_timeout)
            .unwrap_or(self.settings.default_timeout);
        let deadline = started + timeout;
        let result = self.decide(request.get_ref(), deadline).await;
        metrics::histogram!("edgelimit_grpc_request_seconds")
            .record(started.elapsed().as_secs_f64());
        result.map(Response::new)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use edgelimit_contract::{AlgorithmParams, Certainty, DecisionSource, RateLimitPolicy};
    use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, SharedString};
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Mutex;

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

    fn evaluated(limit: &Limit, allowed: bool, shadow: bool) -> Evaluated<'_> {
        Evaluated {
            applied: Applied {
                descriptor: 0,
                limit: Cow::Borrowed(limit),
                shadow,
            },
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
        const DECISIONS: &str = "edgelimit_decisions_total";
        const NEAR: &str = "edgelimit_near_limit_total";
        let recorder = Recorder::default();
        let counters = DecisionCounters::default();
        let (a, b) = (limit("d.a"), limit("d.b"));
        let registrations = || recorder.registrations.load(Ordering::Relaxed);
        metrics::with_local_recorder(&recorder, || {
            // Allowed with nothing left: a decision and a near-limit event each.
            for _ in 0..3 {
                counters.record(7, &evaluated(&a, true, false));
            }
            assert_eq!(registrations(), 2);
            counters.record(7, &evaluated(&a, false, false));
            counters.record(7, &evaluated(&a, false, true));
            counters.record(7, &evaluated(&b, true, false));
            assert_eq!(registrations(), 6);
            // Another policy set: handles are taken again, counts keep adding up.
            counters.record(8, &evaluated(&a, true, false));
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
