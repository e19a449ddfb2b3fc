use std::time::Duration;

use super::PolicyId;

/// Where the decision was made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DecisionSource {
    /// Shared by every replica through Redis.
    GlobalRedis,
    /// Local to this process (embedded backend).
    LocalMemory,
}

/// How exact the decision is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Certainty {
    Certain,
    /// Sliding-window counter: the previous window is weighted, not replayed.
    ApproximateAlgorithm,
}

/// An evaluated decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RateLimitDecision {
    pub allowed: bool,
    pub limit: u64,
    pub remaining: u64,
    pub retry_after: Duration,
    /// Unix milliseconds at which the full quota is available again.
    pub reset_at_ms: u64,
    /// The (clamped) time the decision was made at, in Unix milliseconds.
    pub decided_at_ms: u64,
    pub policy_id: PolicyId,
    pub policy_revision: u64,
    pub source: DecisionSource,
    pub certainty: Certainty,
}

impl RateLimitDecision {
    /// Time until the full quota is back, as seen at decision time.
    pub fn reset_after(&self) -> Duration {
        Duration::from_millis(self.reset_at_ms.saturating_sub(self.decided_at_ms))
    }
}
