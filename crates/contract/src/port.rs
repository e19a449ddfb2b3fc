use std::future::Future;

use super::{RateLimitOutcome, RateLimitPolicy, RateLimitRequest};

/// Whether a backend can currently take evaluations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BackendReadiness {
    Ready,
    NotReady(String),
}

/// The edge-enforcement port. Implementations must never turn an uncertain result into an
/// allow: anything but a decided outcome is reported as such, and the caller fails closed.
pub trait RateLimitPort: Send + Sync + 'static {
    fn evaluate(
        &self,
        policy: &RateLimitPolicy,
        request: &RateLimitRequest,
    ) -> impl Future<Output = RateLimitOutcome> + Send;

    fn readiness(&self) -> impl Future<Output = BackendReadiness> + Send;

    /// Short human label for logs (never secrets).
    fn describe(&self) -> String;
}
