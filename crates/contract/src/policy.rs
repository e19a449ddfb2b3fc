use std::fmt;
use std::sync::Arc;

use super::{ContractError, MAX_EXACT_INTEGER};

/// Fixed-point scale of the sliding-window weight (parts per million).
pub const SLIDING_WEIGHT_SCALE: u64 = 1_000_000;

/// A bounded, key-safe policy identifier. It appears in Redis keys and metric labels, so it
/// is restricted to a small charset and never carries a request value.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PolicyId(Arc<str>);

impl PolicyId {
    pub const MAX_LEN: usize = 128;

    pub fn new(id: &str) -> Result<Self, ContractError> {
        if id.is_empty() || id.len() > Self::MAX_LEN {
            return Err(ContractError::PolicyIdLength {
                len: id.len(),
                max: Self::MAX_LEN,
            });
        }
        let key_safe = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-');
        if !id.bytes().all(key_safe) {
            return Err(ContractError::PolicyIdCharset);
        }
        Ok(Self(Arc::from(id)))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// An equal id that shares no reference count with this one. A store that clones an id
    /// into many entries from several threads keeps its own copy per lock, so those clones do
    /// not all write one shared cache line.
    pub fn separate_copy(&self) -> Self {
        Self(Arc::from(&*self.0))
    }

    /// True when no other clone of this copy exists (a store may then drop its copy).
    pub fn is_sole_holder(&self) -> bool {
        Arc::strong_count(&self.0) == 1
    }
}

impl fmt::Debug for PolicyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PolicyId({})", self.0)
    }
}

impl fmt::Display for PolicyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Algorithm {
    FixedWindow,
    SlidingWindow,
    TokenBucket,
}

impl Algorithm {
    /// Stable name: stored in state, used in configuration and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Algorithm::FixedWindow => "fixed_window",
            Algorithm::SlidingWindow => "sliding_window",
            Algorithm::TokenBucket => "token_bucket",
        }
    }
}

/// Algorithm-specific parameters. One enum variant per algorithm makes a mismatch between
/// the algorithm and its parameters unrepresentable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AlgorithmParams {
    /// `limit` units per epoch-aligned window of `window_ms`.
    FixedWindow { limit: u64, window_ms: u64 },
    /// `limit` units per rolling `window_ms`, estimated from the previous and current window.
    SlidingWindow { limit: u64, window_ms: u64 },
    /// Bucket of `capacity` tokens refilled with `refill_tokens` every `refill_period_ms`,
    /// continuously (sub-token remainders are carried).
    TokenBucket {
        capacity: u64,
        refill_tokens: u64,
        refill_period_ms: u64,
    },
}

impl AlgorithmParams {
    pub fn algorithm(&self) -> Algorithm {
        match self {
            AlgorithmParams::FixedWindow { .. } => Algorithm::FixedWindow,
            AlgorithmParams::SlidingWindow { .. } => Algorithm::SlidingWindow,
            AlgorithmParams::TokenBucket { .. } => Algorithm::TokenBucket,
        }
    }

    /// The quota a client sees: window limit, or bucket capacity.
    pub fn limit(&self) -> u64 {
        match *self {
            AlgorithmParams::FixedWindow { limit, .. }
            | AlgorithmParams::SlidingWindow { limit, .. } => limit,
            AlgorithmParams::TokenBucket { capacity, .. } => capacity,
        }
    }

    /// The period the quota refers to, for headers (`w=`) and Envoy's `unit`.
    pub fn period_ms(&self) -> u64 {
        match *self {
            AlgorithmParams::FixedWindow { window_ms, .. }
            | AlgorithmParams::SlidingWindow { window_ms, .. } => window_ms,
            AlgorithmParams::TokenBucket {
                refill_period_ms, ..
            } => refill_period_ms,
        }
    }

    /// Checks that every intermediate the Lua programs compute stays below 2^53 - 1.
    pub fn validate(&self) -> Result<(), ContractError> {
        match *self {
            AlgorithmParams::FixedWindow { limit, window_ms } => {
                exact("limit", limit as u128)?;
                window("window_ms", window_ms)
            }
            AlgorithmParams::SlidingWindow { limit, window_ms } => {
                window("window_ms", window_ms)?;
                // weighted previous count: count * weight, weight <= SCALE
                exact(
                    "limit * weight scale",
                    limit as u128 * SLIDING_WEIGHT_SCALE as u128,
                )?;
                // weight = ceil((window - elapsed) * SCALE / window)
                exact(
                    "window_ms * weight scale",
                    window_ms as u128 * SLIDING_WEIGHT_SCALE as u128,
                )
            }
            AlgorithmParams::TokenBucket {
                capacity,
                refill_tokens,
                refill_period_ms,
            } => {
                at_least("refill_tokens", refill_tokens, 1)?;
                window("refill_period_ms", refill_period_ms)?;
                // refill: (elapsed mod period) * tokens + remainder < period * (tokens + 1)
                exact(
                    "refill_period_ms * (refill_tokens + 1)",
                    refill_period_ms as u128 * (refill_tokens as u128 + 1),
                )?;
                // time to refill a bucket: missing tokens * period
                exact(
                    "capacity * refill_period_ms",
                    capacity as u128 * refill_period_ms as u128,
                )
            }
        }
    }
}

/// Upper bound on any window or refill period: 400 days keeps every timestamp sum exact.
pub const MAX_PERIOD_MS: u64 = 400 * 24 * 3600 * 1000;

fn exact(what: &'static str, value: u128) -> Result<(), ContractError> {
    if value > MAX_EXACT_INTEGER as u128 {
        return Err(ContractError::BeyondExactRange { what, value });
    }
    Ok(())
}

fn at_least(what: &'static str, value: u64, min: u64) -> Result<(), ContractError> {
    if value < min {
        return Err(ContractError::BelowMinimum { what, value, min });
    }
    Ok(())
}

fn window(what: &'static str, value: u64) -> Result<(), ContractError> {
    at_least(what, value, 1)?;
    if value > MAX_PERIOD_MS {
        return Err(ContractError::BeyondExactRange {
            what,
            value: value as u128,
        });
    }
    Ok(())
}

/// A revision (of a limit's state, or of a policy set), shown as 16 lowercase hex digits: the
/// form stored in Redis (field `r`), passed to the programs and printed by the admin tools.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Revision(pub u64);

impl fmt::Display for Revision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

/// The only failure policy this revision supports: uncertainty never allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum FailurePolicy {
    #[default]
    FailClosed,
}

/// A frozen, validated policy: what is limited, how, and with which safety bounds.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RateLimitPolicy {
    id: PolicyId,
    revision: u64,
    params: AlgorithmParams,
    max_cost: u64,
    cleanup_grace_ms: u64,
    max_clock_regression_ms: u64,
    failure_policy: FailurePolicy,
}

impl RateLimitPolicy {
    pub const DEFAULT_CLEANUP_GRACE_MS: u64 = 60_000;
    pub const DEFAULT_MAX_CLOCK_REGRESSION_MS: u64 = 2_000;
    /// Bounds the grace and regression settings so TTL and clamp sums stay exact.
    pub const MAX_SAFETY_MS: u64 = 24 * 3600 * 1000;

    pub fn new(
        id: PolicyId,
        revision: u64,
        params: AlgorithmParams,
        max_cost: u64,
        cleanup_grace_ms: u64,
        max_clock_regression_ms: u64,
    ) -> Result<Self, ContractError> {
        params.validate()?;
        at_least("max_cost", max_cost, 1)?;
        exact("max_cost", max_cost as u128)?;
        for (what, value) in [
            ("cleanup_grace_ms", cleanup_grace_ms),
            ("max_clock_regression_ms", max_clock_regression_ms),
        ] {
            if value > Self::MAX_SAFETY_MS {
                return Err(ContractError::BeyondExactRange {
                    what,
                    value: value as u128,
                });
            }
        }
        Ok(Self {
            id,
            revision,
            params,
            max_cost,
            cleanup_grace_ms,
            max_clock_regression_ms,
            failure_policy: FailurePolicy::FailClosed,
        })
    }

    pub fn id(&self) -> &PolicyId {
        &self.id
    }
    pub fn revision(&self) -> u64 {
        self.revision
    }
    pub fn params(&self) -> &AlgorithmParams {
        &self.params
    }
    pub fn algorithm(&self) -> Algorithm {
        self.params.algorithm()
    }
    pub fn max_cost(&self) -> u64 {
        self.max_cost
    }
    pub fn cleanup_grace_ms(&self) -> u64 {
        self.cleanup_grace_ms
    }
    pub fn max_clock_regression_ms(&self) -> u64 {
        self.max_clock_regression_ms
    }
    pub fn failure_policy(&self) -> FailurePolicy {
        self.failure_policy
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id() -> PolicyId {
        PolicyId::new("api.login").unwrap()
    }

    #[test]
    fn policy_id_is_bounded_and_key_safe() {
        assert!(PolicyId::new("").is_err());
        assert!(PolicyId::new(&"a".repeat(129)).is_err());
        assert!(PolicyId::new(&"a".repeat(128)).is_ok());
        assert_eq!(
            PolicyId::new("a b"),
            Err(ContractError::PolicyIdCharset),
            "spaces would let raw values leak into keys"
        );
        assert!(
            PolicyId::new("x{y}").is_err(),
            "braces would change cluster slots"
        );
    }

    #[test]
    fn a_separate_copy_is_equal_but_counts_its_holders_alone() {
        let original = id();
        let copy = original.separate_copy();
        assert_eq!(copy, original);
        assert!(copy.is_sole_holder());
        let held = copy.clone();
        assert!(!copy.is_sole_holder(), "a clone of the copy holds it too");
        assert!(
            original.is_sole_holder(),
            "the original is not shared with the copy"
        );
        drop(held);
        assert!(copy.is_sole_holder());
    }

    #[test]
    fn rejects_arithmetic_beyond_exact_range() {
        let too_big = AlgorithmParams::FixedWindow {
            limit: MAX_EXACT_INTEGER + 1,
            window_ms: 1000,
        };
        assert!(matches!(
            RateLimitPolicy::new(id(), 1, too_big, 1, 0, 0),
            Err(ContractError::BeyondExactRange { what: "limit", .. })
        ));
        let sliding = AlgorithmParams::SlidingWindow {
            limit: MAX_EXACT_INTEGER / SLIDING_WEIGHT_SCALE + 1,
            window_ms: 1000,
        };
        assert!(sliding.validate().is_err());
        let bucket = AlgorithmParams::TokenBucket {
            capacity: 1,
            refill_tokens: MAX_EXACT_INTEGER / 1000,
            refill_period_ms: 1000,
        };
        assert!(bucket.validate().is_err());
    }

    #[test]
    fn rejects_zero_windows_and_costs() {
        let zero_window = AlgorithmParams::FixedWindow {
            limit: 1,
            window_ms: 0,
        };
        assert!(zero_window.validate().is_err());
        let ok = AlgorithmParams::FixedWindow {
            limit: 0,
            window_ms: 1,
        };
        assert!(ok.validate().is_ok(), "limit 0 is a valid block rule");
        assert!(matches!(
            RateLimitPolicy::new(id(), 1, ok, 0, 0, 0),
            Err(ContractError::BelowMinimum {
                what: "max_cost",
                ..
            })
        ));
        assert!(
            RateLimitPolicy::new(id(), 1, ok, 1, RateLimitPolicy::MAX_SAFETY_MS + 1, 0).is_err()
        );
    }
}
