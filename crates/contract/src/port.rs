use std::future::Future;

use super::{
    CompositeOutcome, CompositeRequest, Enforcement, IncompatibleCause, LimitCheck,
    RateLimitOutcome, RateLimitPolicy, RateLimitRequest,
};

/// Whether a backend can currently take evaluations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BackendReadiness {
    Ready,
    NotReady(String),
}

/// The edge-enforcement port. Implementations must never turn an uncertain result into an
/// allow: anything but a decided outcome is reported as such, and the caller fails closed.
pub trait RateLimitPort: Send + Sync + 'static {
    /// Decides every limit of one request atomically (see [`CompositeRequest`]): either every
    /// check that admitted the request consumes its cost, or — when an enforced check denies
    /// or cannot be decided — none does. Returns one outcome per check, in order.
    fn evaluate_all(
        &self,
        request: &CompositeRequest<'_>,
    ) -> impl Future<Output = CompositeOutcome> + Send;

    /// One enforced limit for one subject: a request of one check.
    fn evaluate(
        &self,
        policy: &RateLimitPolicy,
        request: &RateLimitRequest,
    ) -> impl Future<Output = RateLimitOutcome> + Send {
        async move {
            let mismatch = || RateLimitOutcome::Incompatible {
                policy_id: policy.id().clone(),
                cause: IncompatibleCause::PolicyMismatch,
            };
            if request.check_policy(policy).is_err() {
                return mismatch();
            }
            let check = LimitCheck::new(
                policy,
                *request.subject(),
                request.cost(),
                Enforcement::Enforced,
            );
            let composite = check.and_then(|c| CompositeRequest::new(vec![c], request.deadline()));
            match composite {
                Ok(composite) => self
                    .evaluate_all(&composite)
                    .await
                    .into_outcomes()
                    .into_iter()
                    .next()
                    .unwrap_or_else(mismatch),
                // Built from a valid single request, so only an expired deadline gets here.
                Err(_) => RateLimitOutcome::Unavailable {
                    policy_id: policy.id().clone(),
                    retry_after: std::time::Duration::from_secs(1),
                    cause: super::UnavailableCause::DeadlineTooShort,
                },
            }
        }
    }

    fn readiness(&self) -> impl Future<Output = BackendReadiness> + Send;

    /// Short human label for logs (never secrets).
    fn describe(&self) -> String;
}
