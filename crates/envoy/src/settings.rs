//! What the operator sets for the gRPC layer.

use std::time::Duration;

use crate::headers::HeaderSettings;
use crate::translate::RequestBounds;

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
    /// Global shadow mode: nothing is enforced (counted as shadow_denied); statuses stay as
    /// computed and only an `OVER_LIMIT` overall code is rewritten to `OK`, as the reference's
    /// `SHADOW_MODE` does.
    pub shadow_mode: bool,
    /// The reference's `QUOTA_MODE`: every descriptor is a quota descriptor.
    pub quota_mode: bool,
    /// Deadline for callers that send no `grpc-timeout`.
    pub default_timeout: Duration,
    /// Kept back from the caller's deadline for answering: the backend must be done this long
    /// before it, so the answer arrives in time.
    pub deadline_margin: Duration,
    pub bounds: RequestBounds,
}

impl ServiceSettings {
    pub const DEFAULT_DEADLINE_MARGIN: Duration = Duration::from_millis(2);
}

impl Default for ServiceSettings {
    fn default() -> Self {
        Self {
            failure_mode: FailureMode::OverLimit,
            headers: HeaderSettings::default(),
            shadow_mode: false,
            quota_mode: false,
            default_timeout: Duration::from_secs(1),
            deadline_margin: Self::DEFAULT_DEADLINE_MARGIN,
            bounds: RequestBounds::default(),
        }
    }
}
