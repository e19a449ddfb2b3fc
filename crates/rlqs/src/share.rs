//! The assignment one instance gets for one limit: pure arithmetic, no I/O.
//!
//! The quota left (`remaining`, from the backend after the instance's reported usage was
//! consumed) is paced over the time until it is renewed: for a window, until the window
//! resets; for a token bucket, the stock over one report interval plus the refill rate. The
//! instance gets `weight` of that rate (its share of the recent demand of every live
//! instance), as a token bucket Envoy refills continuously, with a burst of one report
//! interval of its rate. Nothing left means `deny_all`.

use std::time::Duration;

use edgelimit_contract::AlgorithmParams;

/// What Envoy is told to do with a bucket's requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strategy {
    AllowAll,
    DenyAll,
    /// Envoy's `TokenBucket`: starts full at `max_tokens`, refills `tokens_per_fill` every
    /// `fill_interval_secs` (continuously; Envoy reads whole seconds only).
    TokenBucket {
        max_tokens: u32,
        tokens_per_fill: u32,
        fill_interval_secs: u32,
    },
}

impl Strategy {
    /// Tokens per second a token bucket admits in the long run (0 for deny, infinite for allow).
    pub fn rate(&self) -> f64 {
        match *self {
            Strategy::AllowAll => f64::INFINITY,
            Strategy::DenyAll => 0.0,
            Strategy::TokenBucket {
                tokens_per_fill,
                fill_interval_secs,
                ..
            } => f64::from(tokens_per_fill) / f64::from(fill_interval_secs.max(1)),
        }
    }

    /// Bounded label for metrics.
    pub fn as_str(&self) -> &'static str {
        match self {
            Strategy::AllowAll => "allow_all",
            Strategy::DenyAll => "deny_all",
            Strategy::TokenBucket { .. } => "token_bucket",
        }
    }

    /// The stricter of two assignments (a bucket under several limits must meet them all).
    pub fn stricter(self, other: Strategy) -> Strategy {
        match (self, other) {
            (Strategy::DenyAll, _) | (_, Strategy::DenyAll) => Strategy::DenyAll,
            (Strategy::AllowAll, s) | (s, Strategy::AllowAll) => s,
            (
                Strategy::TokenBucket { max_tokens: a, .. },
                Strategy::TokenBucket { max_tokens: b, .. },
            ) => {
                let slower = if self.rate() <= other.rate() {
                    self
                } else {
                    other
                };
                match slower {
                    Strategy::TokenBucket {
                        tokens_per_fill,
                        fill_interval_secs,
                        ..
                    } => Strategy::TokenBucket {
                        max_tokens: a.min(b),
                        tokens_per_fill,
                        fill_interval_secs,
                    },
                    other => other,
                }
            }
        }
    }

    /// Whether `self` (sent last time) may be sent again instead of `new`: Envoy keeps the
    /// running bucket of an unchanged assignment, while a changed one starts a full bucket.
    /// Kept only when never more than 5% more permissive and at most 15% stricter.
    pub fn can_stand_for(&self, new: &Strategy) -> bool {
        match (self, new) {
            (Strategy::TokenBucket { .. }, Strategy::TokenBucket { .. }) => {
                let (old, new) = (self.rate(), new.rate());
                old <= new * 1.05 && old >= new * 0.85
            }
            (a, b) => a == b,
        }
    }
}

/// What one instance's assignment for one limit is computed from.
#[derive(Debug, Clone, Copy)]
pub struct Inputs {
    pub params: AlgorithmParams,
    /// Units left, after this instance's reported usage.
    pub remaining: u64,
    /// Until the full quota is back (a window's reset).
    pub reset_after: Duration,
    /// This instance's share of the live demand, in (0, 1].
    pub weight: f64,
    /// This instance's report interval.
    pub interval: Duration,
}

/// Fill intervals considered: the shortest one whose tokens per fill rounds the rate down by
/// at most 10%, and never past an hour.
const MAX_FILL_SECS: u32 = 3600;
const PRECISE_TOKENS: f64 = 10.0;

pub fn assign(inputs: &Inputs) -> Strategy {
    let weight = inputs.weight.clamp(0.0, 1.0);
    let interval = inputs.interval.as_secs_f64().max(0.001);
    let remaining = inputs.remaining as f64;
    let rate = match inputs.params {
        AlgorithmParams::FixedWindow { .. } | AlgorithmParams::SlidingWindow { .. } => {
            if inputs.remaining == 0 {
                return Strategy::DenyAll;
            }
            let horizon = inputs.reset_after.as_secs_f64().max(interval);
            weight * remaining / horizon
        }
        AlgorithmParams::TokenBucket {
            capacity,
            refill_tokens,
            refill_period_ms,
        } => {
            if capacity == 0 {
                return Strategy::DenyAll;
            }
            let refill = refill_tokens as f64 * 1000.0 / refill_period_ms.max(1) as f64;
            weight * (refill + remaining / interval)
        }
    };
    if rate.is_nan() || rate <= 0.0 {
        return Strategy::DenyAll;
    }
    // Burst: one interval at the rate, never more than the instance's share of what is left,
    // never below one token (Envoy refuses a bucket of 0: that is `deny_all`).
    let share_left = (weight * remaining).floor();
    let burst = (rate * interval).ceil().min(share_left).max(1.0);
    let fill_interval_secs = (1..=MAX_FILL_SECS)
        .find(|&secs| rate * f64::from(secs) >= PRECISE_TOKENS)
        .unwrap_or(MAX_FILL_SECS);
    let tokens_per_fill = (rate * f64::from(fill_interval_secs)).floor().max(1.0);
    Strategy::TokenBucket {
        max_tokens: to_u32(burst),
        tokens_per_fill: to_u32(tokens_per_fill),
        fill_interval_secs,
    }
}

fn to_u32(value: f64) -> u32 {
    if value >= f64::from(u32::MAX) {
        u32::MAX
    } else {
        value as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(remaining: u64, reset_ms: u64, weight: f64) -> Strategy {
        assign(&Inputs {
            params: AlgorithmParams::FixedWindow {
                limit: 1000,
                window_ms: 10_000,
            },
            remaining,
            reset_after: Duration::from_millis(reset_ms),
            weight,
            interval: Duration::from_millis(200),
        })
    }

    #[test]
    fn nothing_left_is_deny_all() {
        assert_eq!(window(0, 5000, 1.0), Strategy::DenyAll);
        let zero = assign(&Inputs {
            params: AlgorithmParams::TokenBucket {
                capacity: 0,
                refill_tokens: 1,
                refill_period_ms: 1000,
            },
            remaining: 0,
            reset_after: Duration::ZERO,
            weight: 1.0,
            interval: Duration::from_secs(1),
        });
        assert_eq!(zero, Strategy::DenyAll);
    }

    #[test]
    fn the_remaining_quota_is_paced_until_the_reset_and_split_by_weight() {
        // 1000 left over 10 s: 100/s in all; a quarter of the demand gets 25/s.
        let quarter = window(1000, 10_000, 0.25);
        assert!((quarter.rate() - 25.0).abs() < 2.5, "{quarter:?}");
        let Strategy::TokenBucket { max_tokens, .. } = quarter else {
            panic!("{quarter:?}")
        };
        assert_eq!(max_tokens, 5, "one 200 ms interval of 25/s");
        // Near the reset the horizon is one interval: what is left may all be used.
        let last = window(40, 50, 1.0);
        let Strategy::TokenBucket { max_tokens, .. } = last else {
            panic!("{last:?}")
        };
        assert_eq!(max_tokens, 40);
    }

    #[test]
    fn the_sum_of_rates_never_exceeds_the_paced_rate() {
        for weights in [[0.5, 0.3, 0.2], [0.9, 0.05, 0.05], [1.0 / 3.0; 3]] {
            let total: f64 = weights.iter().map(|&w| window(600, 6000, w).rate()).sum();
            assert!(total <= 100.0 + 1e-9, "{weights:?}: {total}");
            assert!(total >= 90.0 - 1e-9, "rounding costs at most 10%: {total}");
        }
    }

    #[test]
    fn a_token_bucket_policy_shares_its_refill_rate() {
        let s = assign(&Inputs {
            params: AlgorithmParams::TokenBucket {
                capacity: 100,
                refill_tokens: 50,
                refill_period_ms: 1000,
            },
            remaining: 0,
            reset_after: Duration::from_secs(2),
            weight: 0.5,
            interval: Duration::from_millis(100),
        });
        assert!((s.rate() - 25.0).abs() < 2.5, "{s:?}");
    }

    #[test]
    fn slow_rates_use_long_fill_intervals() {
        let s = window(10, 10_000, 0.1);
        let Strategy::TokenBucket {
            tokens_per_fill,
            fill_interval_secs,
            max_tokens,
        } = s
        else {
            panic!("{s:?}")
        };
        // 0.1/s: 10 tokens per 100 s.
        assert_eq!(
            (tokens_per_fill, fill_interval_secs, max_tokens),
            (10, 100, 1)
        );
    }

    #[test]
    fn stricter_and_reuse() {
        let fast = window(1000, 1000, 1.0);
        let slow = window(100, 1000, 1.0);
        assert_eq!(fast.stricter(slow).rate(), slow.rate());
        assert_eq!(fast.stricter(Strategy::DenyAll), Strategy::DenyAll);
        assert_eq!(Strategy::AllowAll.stricter(slow), slow);
        assert!(fast.can_stand_for(&window(990, 1000, 1.0)));
        assert!(!fast.can_stand_for(&slow), "never more permissive");
        assert!(!slow.can_stand_for(&fast), "not far stricter either");
        assert!(!Strategy::DenyAll.can_stand_for(&fast));
    }
}
