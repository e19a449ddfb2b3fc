//! The streaming endpoint `RateLimitQuotaService/StreamRateLimitQuotas`: one task per
//! stream reads Envoy's usage reports in order and answers each with an action per bucket.
//!
//! Bounds: `max_streams` streams at once (one more is refused `RESOURCE_EXHAUSTED`),
//! `max_buckets_per_stream` buckets per stream (further ones are answered `deny_all`),
//! bucket ids bounded in entries and bytes. Every failure to decide is answered `deny_all`
//! for one TTL, never with an allowance.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use envoy_types::pb::envoy::r#type::v3::rate_limit_strategy::{BlanketRule, Strategy as PbStrategy};
use envoy_types::pb::envoy::r#type::v3::{RateLimitStrategy, TokenBucket};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::{
    AbandonAction, BucketAction as Action, QuotaAssignmentAction,
};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::BucketAction;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_server::{
    RateLimitQuotaService, RateLimitQuotaServiceServer,
};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
    BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use envoy_types::pb::google::protobuf::{Duration as PbDuration, UInt32Value};
use tokio::sync::{mpsc, Semaphore};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use edgelimit_contract::{PolicyId, RateLimitPort};
use edgelimit_envoy::subject::SubjectHasher;
use edgelimit_policy::PolicySet;

use crate::bucket::{self, BucketKey, Resolution};
use crate::demand::DemandPools;
use crate::metrics;
use crate::quota;
use crate::settings::RlqsSettings;
use crate::share::{self, Strategy};

/// The quota service over one backend. Cheap to clone (shared state).
pub struct QuotaService<B> {
    inner: Arc<Inner<B>>,
}

impl<B> Clone for QuotaService<B> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

struct Inner<B> {
    policies: Arc<ArcSwap<PolicySet>>,
    backend: Arc<B>,
    hasher: Arc<SubjectHasher>,
    settings: RlqsSettings,
    pools: DemandPools,
    streams: Arc<Semaphore>,
    next_stream: AtomicU64,
}

impl<B: RateLimitPort> QuotaService<B> {
    pub fn new(
        policies: Arc<ArcSwap<PolicySet>>,
        backend: Arc<B>,
        hasher: Arc<SubjectHasher>,
        settings: RlqsSettings,
    ) -> Self {
        let streams = Arc::new(Semaphore::new(settings.max_streams));
        Self {
            inner: Arc::new(Inner {
                policies,
                backend,
                hasher,
                settings,
                pools: DemandPools::default(),
                streams,
                next_stream: AtomicU64::new(1),
            }),
        }
    }

    /// The tonic service, with the same message size bounds as `ShouldRateLimit`.
    pub fn into_server(
        self,
        max_decoding_message_size: usize,
        max_encoding_message_size: usize,
    ) -> RateLimitQuotaServiceServer<Self> {
        RateLimitQuotaServiceServer::new(self)
            .max_decoding_message_size(max_decoding_message_size)
            .max_encoding_message_size(max_encoding_message_size)
    }
}

#[tonic::async_trait]
impl<B: RateLimitPort> RateLimitQuotaService for QuotaService<B> {
    type StreamRateLimitQuotasStream = ReceiverStream<Result<RateLimitQuotaResponse, Status>>;

    async fn stream_rate_limit_quotas(
        &self,
        request: Request<Streaming<RateLimitQuotaUsageReports>>,
    ) -> Result<Response<Self::StreamRateLimitQuotasStream>, Status> {
        let Ok(permit) = Arc::clone(&self.inner.streams).try_acquire_owned() else {
            metrics::stream_refused();
            return Err(Status::resource_exhausted(
                "rlqs.max_streams streams are open on this server",
            ));
        };
        let inner = Arc::clone(&self.inner);
        let mut incoming = request.into_inner();
        // One answer in flight per report: Envoy reads them as they come.
        let (tx, rx) = mpsc::channel(4);
        tokio::spawn(async move {
            let _permit = permit;
            let _gauge = StreamGauge::open();
            let id = inner.next_stream.fetch_add(1, Ordering::Relaxed);
            let mut stream = StreamState::new(id);
            loop {
                let message = tokio::select! {
                    message = incoming.message() => message,
                    () = tx.closed() => break,
                };
                match message {
                    Ok(Some(reports)) => {
                        let answer = inner.answer(&mut stream, reports).await;
                        if tx.send(Ok(answer)).await.is_err() {
                            break;
                        }
                    }
                    Ok(None) => break,
                    Err(status) => {
                        tracing::debug!(%status, "RLQS stream ended with an error");
                        break;
                    }
                }
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

/// Counts a stream open for as long as its task runs.
struct StreamGauge;

impl StreamGauge {
    fn open() -> Self {
        metrics::stream_opened();
        StreamGauge
    }
}

impl Drop for StreamGauge {
    fn drop(&mut self) {
        metrics::stream_closed();
    }
}

/// One Envoy instance's stream.
struct StreamState {
    id: u64,
    domain: Option<String>,
    buckets: HashMap<BucketKey, BucketState>,
}

impl StreamState {
    fn new(id: u64) -> Self {
        Self {
            id,
            domain: None,
            buckets: HashMap::new(),
        }
    }
}

/// What a stream remembers of one bucket.
struct BucketState {
    /// The resolution and the policy set revision it was made under.
    resolved: Option<(u64, Resolution)>,
    /// Whether a policy governed it when it was last resolved (its removal is `abandon`).
    had_policy: bool,
    last_report: Option<Instant>,
    /// Smoothed demand, requests per second.
    demand: Option<f64>,
    interval: Option<Duration>,
    last_sent: Option<Strategy>,
}

impl BucketState {
    fn new() -> Self {
        Self {
            resolved: None,
            had_policy: false,
            last_report: None,
            demand: None,
            interval: None,
            last_sent: None,
        }
    }
}

/// What one bucket is answered.
enum Answer {
    Assign(Strategy),
    Abandon,
}

impl<B: RateLimitPort> Inner<B> {
    async fn answer(
        &self,
        stream: &mut StreamState,
        reports: RateLimitQuotaUsageReports,
    ) -> RateLimitQuotaResponse {
        // The first domain sent names the stream's domain; a stream never changes it.
        let domain_error = match (&stream.domain, reports.domain.as_str()) {
            (None, "") => Some("no_domain"),
            (None, d) if d.len() > self.settings.max_domain_bytes => Some("domain_too_long"),
            (None, d) => {
                stream.domain = Some(d.to_owned());
                None
            }
            (Some(_), "") => None,
            (Some(known), d) if known != d => Some("domain_changed"),
            (Some(_), _) => None,
        };
        let mut actions = Vec::with_capacity(reports.bucket_quota_usages.len());
        for usage in reports.bucket_quota_usages {
            // Without an id there is nothing to answer to.
            let Some(id) = usage.bucket_id.clone() else {
                metrics::bucket_refused("no_bucket_id");
                continue;
            };
            let answer = match (domain_error, stream.domain.clone()) {
                (None, Some(domain)) => self.bucket(stream, &domain, &id, &usage).await,
                (reason, _) => {
                    metrics::bucket_refused(reason.unwrap_or("no_domain"));
                    Answer::Assign(Strategy::DenyAll)
                }
            };
            actions.push(self.action(id, answer));
        }
        RateLimitQuotaResponse {
            bucket_action: actions,
        }
    }

    fn action(&self, id: BucketId, answer: Answer) -> BucketAction {
        let action = match answer {
            Answer::Abandon => Action::AbandonAction(AbandonAction {}),
            Answer::Assign(strategy) => Action::QuotaAssignmentAction(QuotaAssignmentAction {
                assignment_time_to_live: Some(pb_duration(self.settings.assignment_ttl)),
                rate_limit_strategy: Some(pb_strategy(strategy)),
            }),
        };
        BucketAction {
            bucket_id: Some(id),
            bucket_action: Some(action),
        }
    }

    async fn bucket(
        &self,
        stream: &mut StreamState,
        domain: &str,
        id: &BucketId,
        usage: &BucketQuotaUsage,
    ) -> Answer {
        let key = match BucketKey::new(id.bucket.iter(), &self.settings) {
            Ok(key) => key,
            Err(error) => {
                metrics::bucket_refused(error.as_str());
                return Answer::Assign(Strategy::DenyAll);
            }
        };
        if !stream.buckets.contains_key(&key)
            && stream.buckets.len() >= self.settings.max_buckets_per_stream
        {
            metrics::bucket_refused("max_buckets_per_stream");
            return Answer::Assign(Strategy::DenyAll);
        }
        let state = stream
            .buckets
            .entry(key.clone())
            .or_insert_with(BucketState::new);
        // Resolved once per policy set revision; the guard is not held across awaits.
        let resolution = {
            let policies = self.policies.load();
            let revision = policies.revision();
            match &state.resolved {
                Some((r, resolution)) if *r == revision => resolution.clone(),
                _ => {
                    let resolution = bucket::resolve(&policies, domain, &key, &self.hasher);
                    state.resolved = Some((revision, resolution.clone()));
                    resolution
                }
            }
        };

        let now = Instant::now();
        let elapsed = state.last_report.map(|t| now.saturating_duration_since(t));
        state.last_report = Some(now);
        // Envoy's own `time_elapsed` is whole seconds: the server's clock is finer.
        let interval = elapsed
            .unwrap_or(self.settings.assumed_report_interval)
            .min(self.settings.assignment_ttl)
            .max(Duration::from_millis(10));
        state.interval = Some(interval);
        let asked = usage
            .num_requests_allowed
            .saturating_add(usage.num_requests_denied) as f64;
        let measured = asked / interval.as_secs_f64();
        let demand = state.demand.map_or(measured, |d| (d + measured) / 2.0);
        state.demand = Some(demand);

        let targets = match resolution {
            Resolution::Unmatched => {
                let had = state.had_policy;
                if had {
                    // The policy was removed: Envoy drops the bucket (and its assignment).
                    stream.buckets.remove(&key);
                    metrics::assignment(None, "abandon");
                    return Answer::Abandon;
                }
                metrics::assignment(None, Strategy::AllowAll.as_str());
                return Answer::Assign(Strategy::AllowAll);
            }
            Resolution::Unlimited => {
                state.had_policy = true;
                metrics::assignment(None, Strategy::AllowAll.as_str());
                return Answer::Assign(Strategy::AllowAll);
            }
            Resolution::Limited { shadow, targets } => {
                state.had_policy = true;
                (shadow, targets)
            }
        };
        let (shadow, targets) = targets;
        let deadline = now + self.settings.backend_timeout;
        let mut strategy = Strategy::AllowAll;
        let mut first_policy: Option<PolicyId> = None;
        let mut failed = false;
        for target in &targets {
            let policy = &target.policy;
            first_policy.get_or_insert_with(|| policy.id().clone());
            metrics::reported(
                policy.id(),
                usage.num_requests_allowed,
                usage.num_requests_denied,
            );
            let Some(consumed) = quota::consume(
                self.backend.as_ref(),
                policy,
                target.subject,
                usage.num_requests_allowed,
                deadline,
            )
            .await
            else {
                failed = true;
                strategy = Strategy::DenyAll;
                continue;
            };
            metrics::overshoot(policy.id(), consumed.overshoot);
            let weight = self.pools.weigh(
                policy.id(),
                &target.subject,
                stream.id,
                demand,
                now,
                self.settings.assignment_ttl,
            );
            let this = share::assign(&share::Inputs {
                params: *policy.params(),
                remaining: consumed.decision.remaining,
                reset_after: consumed.decision.reset_after(),
                weight,
                interval,
            });
            strategy = strategy.stricter(this);
        }
        let Some(state) = stream.buckets.get_mut(&key) else {
            return Answer::Assign(Strategy::DenyAll);
        };
        if failed {
            // The failure policy (fail closed, the only one) answers deny for one TTL.
            metrics::assignment(first_policy.as_ref(), "fail_closed");
            state.last_sent = Some(Strategy::DenyAll);
            return Answer::Assign(Strategy::DenyAll);
        }
        if shadow || self.settings.shadow_mode {
            strategy = Strategy::AllowAll;
        }
        if let Some(previous) = state.last_sent.filter(|p| p.can_stand_for(&strategy)) {
            strategy = previous;
        }
        state.last_sent = Some(strategy);
        metrics::strategy(first_policy.as_ref(), &strategy);
        Answer::Assign(strategy)
    }
}

fn pb_duration(d: Duration) -> PbDuration {
    PbDuration {
        seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        nanos: i32::try_from(d.subsec_nanos()).unwrap_or(0),
    }
}

fn pb_strategy(strategy: Strategy) -> RateLimitStrategy {
    let strategy = match strategy {
        Strategy::AllowAll => PbStrategy::BlanketRule(BlanketRule::AllowAll as i32),
        Strategy::DenyAll => PbStrategy::BlanketRule(BlanketRule::DenyAll as i32),
        Strategy::TokenBucket {
            max_tokens,
            tokens_per_fill,
            fill_interval_secs,
        } => PbStrategy::TokenBucket(TokenBucket {
            max_tokens,
            tokens_per_fill: Some(UInt32Value {
                value: tokens_per_fill,
            }),
            fill_interval: Some(PbDuration {
                seconds: i64::from(fill_interval_secs),
                nanos: 0,
            }),
        }),
    };
    RateLimitStrategy {
        strategy: Some(strategy),
    }
}
