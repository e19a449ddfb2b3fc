//! The rate limiter behind the gRPC service, usable without gRPC (tests, tools, `/json`):
//! translate the request, decide every limit it touches in one backend call, answer.

use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tonic::Status;

use edgelimit_contract::{
    CompositeRequest, ContractError, RateLimitOutcome, RateLimitPort, UnavailableCause,
};
use edgelimit_policy::PolicySet;

use crate::metrics::{record_backend_failures, DecisionCounters, RequestSeconds};
use crate::response::{self, Evaluated, Restriction};
use crate::settings::ServiceSettings;
use crate::subject::SubjectHasher;
use crate::translate::{self, Hashers, Modes};
use crate::wire;
use crate::PerLimit;

pub struct RateLimiter<B> {
    policies: Arc<ArcSwap<PolicySet>>,
    backend: Arc<B>,
    hasher: Arc<SubjectHasher>,
    previous_hasher: Option<Arc<SubjectHasher>>,
    settings: ServiceSettings,
    counters: DecisionCounters,
    request_seconds: RequestSeconds,
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
            request_seconds: RequestSeconds::default(),
        }
    }

    /// Also evaluates every subject under `previous` until it is removed, so rotating the
    /// HMAC secret does not hand every subject a fresh quota (see SECURITY.md).
    pub fn with_previous_secret(mut self, previous: Arc<SubjectHasher>) -> Self {
        self.previous_hasher = Some(previous);
        self
    }

    pub fn settings(&self) -> &ServiceSettings {
        &self.settings
    }

    /// Records the time from a request's arrival to its answer.
    pub(crate) fn record_request_seconds(&self, seconds: f64) {
        self.request_seconds.record(seconds);
    }

    /// Decides `request` for a caller whose deadline is `deadline` (see [`Self::decide_wire`]).
    pub async fn decide(
        &self,
        request: &RateLimitRequest,
        deadline: Instant,
    ) -> Result<RateLimitResponse, Status> {
        self.decide_wire(&wire::Request::from(request), deadline)
            .await
    }

    /// Decides `request` (as read off the wire: values are bytes) for a caller whose deadline
    /// is `deadline`. The backend must be done `deadline_margin` before it, so the answer
    /// still arrives in time.
    pub async fn decide_wire(
        &self,
        request: &wire::Request,
        deadline: Instant,
    ) -> Result<RateLimitResponse, Status> {
        translate::validate(request, &self.settings.bounds)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        let policies = self.policies.load_full();
        let hashers = Hashers {
            current: &self.hasher,
            previous: self.previous_hasher.as_deref(),
        };
        let modes = Modes {
            global_shadow: self.settings.shadow_mode,
            global_quota: self.settings.quota_mode,
        };
        let plan = translate::plan(&policies, request, &hashers, modes)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;

        let (checks, owner) = plan
            .checks()
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        let outcomes = if checks.is_empty() {
            Vec::new()
        } else {
            let backend_deadline = deadline
                .checked_sub(self.settings.deadline_margin)
                .unwrap_or(deadline);
            match CompositeRequest::new(checks, backend_deadline) {
                Ok(composite) => self.backend.evaluate_all(&composite).await.into_outcomes(),
                // The deadline (less the margin) has already passed: nothing was asked.
                Err(ContractError::DeadlineExpired) => owner
                    .iter()
                    .map(|&i| RateLimitOutcome::Unavailable {
                        policy_id: plan.applied[i].limit.policy.id().clone(),
                        retry_after: Duration::from_secs(1),
                        cause: UnavailableCause::DeadlineTooShort,
                    })
                    .collect(),
                Err(e) => return Err(Status::invalid_argument(e.to_string())),
            }
        };

        record_backend_failures(&outcomes);
        // During a rotation the old and the new subject of a limit both had to allow: report
        // the worse of the two.
        let mut folded: PerLimit<Option<RateLimitOutcome>> =
            PerLimit::from_elem(None, plan.applied.len());
        for (&owner, outcome) in owner.iter().zip(outcomes) {
            let slot = &mut folded[owner];
            if slot
                .as_ref()
                .is_none_or(|kept| Restriction::of(&outcome) > Restriction::of(kept))
            {
                *slot = Some(outcome);
            }
        }
        let evaluated: PerLimit<Evaluated<'_, '_>> = plan
            .applied
            .iter()
            .zip(folded)
            .filter_map(|(applied, outcome)| {
                Some(Evaluated {
                    applied,
                    outcome: outcome?,
                })
            })
            .collect();
        for e in &evaluated {
            self.counters.record(policies.revision(), e);
        }
        response::build(
            request.descriptors.len(),
            &evaluated,
            &response::Shape {
                unlimited: &plan.unlimited,
                quota: &plan.quota,
                global_shadow: self.settings.shadow_mode,
            },
            self.settings.failure_mode,
            &self.settings.headers,
        )
    }
}
