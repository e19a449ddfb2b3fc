//! The three algorithms as pure integer state machines. The Lua programs in `lua/` and these
//! functions implement the same rules; differential tests keep them identical: for the same
//! stored state, server time and arguments, [`evaluate`] returns the reply the program returns
//! and the state it writes.
//!
//! Every function here is total: invalid arguments, malformed state and overflow-prone inputs
//! become a status (`INVALID`, `STATE_INCOMPATIBLE`), never a panic. All arithmetic stays below
//! 2^53 - 1, like the programs' (Lua numbers are doubles).
#![forbid(unsafe_code)]

pub mod composite;
pub mod fixed_window;
pub mod sliding_window;
pub mod token_bucket;

use std::fmt;

use edgelimit_contract::{Algorithm, AlgorithmParams, RateLimitPolicy, MAX_EXACT_INTEGER};

/// Status field of a program reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Status {
    Allowed,
    Denied,
    ClockUnsafe,
    StateIncompatible,
    Invalid,
    /// The program ran after the deadline its caller gave it (it waited in Redis's queue):
    /// it did nothing. Only the Redis programs answer it; the Rust mirror has no deadline.
    Expired,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Allowed => "ALLOWED",
            Status::Denied => "DENIED",
            Status::ClockUnsafe => "CLOCK_UNSAFE",
            Status::StateIncompatible => "STATE_INCOMPATIBLE",
            Status::Invalid => "INVALID",
            Status::Expired => "EXPIRED",
        }
    }

    pub fn parse(s: &[u8]) -> Option<Self> {
        Some(match s {
            b"ALLOWED" => Status::Allowed,
            b"DENIED" => Status::Denied,
            b"CLOCK_UNSAFE" => Status::ClockUnsafe,
            b"STATE_INCOMPATIBLE" => Status::StateIncompatible,
            b"INVALID" => Status::Invalid,
            b"EXPIRED" => Status::Expired,
            _ => return None,
        })
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The seven-field reply every program returns, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ProgramReply {
    pub status: Status,
    pub server_now_ms: u64,
    pub effective_now_ms: u64,
    pub limit: u64,
    pub remaining: u64,
    pub retry_after_ms: u64,
    pub reset_at_ms: u64,
}

impl ProgramReply {
    /// A reply that is not a decision (`CLOCK_UNSAFE`, `STATE_INCOMPATIBLE`, `INVALID`): the
    /// last three numbers are 0.
    pub(crate) fn refusal(
        status: Status,
        server_now_ms: u64,
        effective_now_ms: u64,
        limit: u64,
    ) -> Self {
        Self {
            status,
            server_now_ms,
            effective_now_ms,
            limit,
            remaining: 0,
            retry_after_ms: 0,
            reset_at_ms: 0,
        }
    }
}

/// Largest exact integer (2^53 - 1); every intermediate stays at or below it.
pub const MAX: u64 = MAX_EXACT_INTEGER;

/// Upper bound of ARGV[5] (maximum clock regression) and ARGV[6] (cleanup grace), in ms.
pub const MAX_SAFETY_MS: u64 = RateLimitPolicy::MAX_SAFETY_MS;

/// Upper bound of a fixed window or a refill period (400 days), as the contract validates.
pub const MAX_PERIOD_MS: u64 = edgelimit_contract::MAX_PERIOD_MS;

/// Arguments every program takes (ARGV[4..=6]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CommonArgs {
    /// Units to consume; 0 is a peek ("would one more unit pass?") that writes nothing.
    pub cost: u64,
    /// Backward clock movement clamped to the stored last observation; more is `CLOCK_UNSAFE`.
    pub max_clock_regression_ms: u64,
    /// Added to every TTL so state outlives the moment it becomes equivalent to absent.
    pub cleanup_grace_ms: u64,
}

impl CommonArgs {
    /// Whether the cleanup grace covers the largest clamp of a backward clock step (see
    /// [`Write::keeps_expiry`]).
    pub(crate) fn grace_covers_clamp(&self) -> bool {
        self.cleanup_grace_ms >= self.max_clock_regression_ms
    }

    pub fn for_policy(policy: &RateLimitPolicy, cost: u64) -> Self {
        Self {
            cost,
            max_clock_regression_ms: policy.max_clock_regression_ms(),
            cleanup_grace_ms: policy.cleanup_grace_ms(),
        }
    }

    /// The programs' own argument check (the contract validates the same bounds earlier).
    pub(crate) fn is_valid(&self, server_now_ms: u64) -> bool {
        self.cost <= MAX
            && self.max_clock_regression_ms <= MAX_SAFETY_MS
            && self.cleanup_grace_ms <= MAX_SAFETY_MS
            // Redis TIME cannot get there before the year 287,000; guards the Rust arithmetic.
            && server_now_ms <= MAX
    }
}

/// What the key held before the evaluation, as the programs classify it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stored<'a, S> {
    /// No key (or, in memory, an entry past its TTL): a fresh window / a full bucket.
    Absent,
    Present(&'a S),
    /// A key of another type, or a hash of another schema, algorithm, policy or revision, or
    /// with a malformed field.
    Incompatible,
}

impl<'a, S> From<Option<&'a S>> for Stored<'a, S> {
    fn from(state: Option<&'a S>) -> Self {
        match state {
            Some(s) => Stored::Present(s),
            None => Stored::Absent,
        }
    }
}

/// The algorithm-specific state one subject keeps. Its storage encoding belongs to each backend
/// (the Redis hash codec lives in the `redis` crate).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum State {
    FixedWindow(fixed_window::State),
    SlidingWindow(sliding_window::State),
    TokenBucket(token_bucket::State),
}

/// What to store after an evaluation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Write {
    pub state: State,
    /// Time to live from the evaluation, in ms, always >= 1: after it the state is equivalent
    /// to an absent key (plus the cleanup grace).
    pub ttl_ms: u64,
    /// The key's expiry may stay as the window's first write set it (no PEXPIRE): the held
    /// state is in the written state's window, and a window's expiry is a function of the
    /// window alone (its end, plus the grace). A clamped first write set it up to the clamp
    /// earlier, so this holds only with a grace of at least the largest clamp: the key then
    /// outlives its window. Token buckets (expiry moves with the level) always refresh it.
    pub keeps_expiry: bool,
}

/// The result of one evaluation: the reply, and the state to store (`None`: store nothing,
/// for peeks and refusals).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Evaluation {
    pub reply: ProgramReply,
    pub write: Option<Write>,
}

/// Evaluates `policy` for one subject at `server_now_ms` (Unix ms), `cost` 0 being a peek.
/// State of another algorithm than the policy's is `STATE_INCOMPATIBLE`.
pub fn evaluate(
    policy: &RateLimitPolicy,
    stored: Stored<'_, State>,
    server_now_ms: u64,
    cost: u64,
) -> Evaluation {
    let args = CommonArgs::for_policy(policy, cost);
    match *policy.params() {
        AlgorithmParams::FixedWindow { limit, window_ms } => {
            let stored = narrow(stored, |s| match s {
                State::FixedWindow(s) => Some(s),
                _ => None,
            });
            fixed_window::evaluate(
                &fixed_window::Params { window_ms, limit },
                &args,
                stored,
                server_now_ms,
            )
        }
        AlgorithmParams::SlidingWindow { limit, window_ms } => {
            let stored = narrow(stored, |s| match s {
                State::SlidingWindow(s) => Some(s),
                _ => None,
            });
            sliding_window::evaluate(
                &sliding_window::Params { window_ms, limit },
                &args,
                stored,
                server_now_ms,
            )
        }
        AlgorithmParams::TokenBucket {
            capacity,
            refill_tokens,
            refill_period_ms,
        } => {
            let stored = narrow(stored, |s| match s {
                State::TokenBucket(s) => Some(s),
                _ => None,
            });
            token_bucket::evaluate(
                &token_bucket::Params {
                    refill_period_ms,
                    refill_tokens,
                    capacity,
                },
                &args,
                stored,
                server_now_ms,
            )
        }
    }
}

fn narrow<'a, S>(
    stored: Stored<'a, State>,
    pick: impl Fn(&'a State) -> Option<&'a S>,
) -> Stored<'a, S> {
    match stored {
        Stored::Absent => Stored::Absent,
        Stored::Incompatible => Stored::Incompatible,
        Stored::Present(s) => pick(s).map_or(Stored::Incompatible, Stored::Present),
    }
}

/// Resolves the time a decision is made at: the server time, or the stored last observation
/// when the server clock moved back by at most `max_regression`. `None` is `CLOCK_UNSAFE`.
pub(crate) fn effective_now(
    server_now: u64,
    last_observed: u64,
    max_regression: u64,
) -> Option<u64> {
    if server_now >= last_observed {
        Some(server_now)
    } else if last_observed - server_now > max_regression {
        None
    } else {
        Some(last_observed)
    }
}

/// Exact `ceil(n / d)` without an `n + d - 1` intermediate; `d` must be positive.
pub(crate) fn ceil_div(n: u64, d: u64) -> u64 {
    let q = n / d;
    if n % d > 0 {
        q + 1
    } else {
        q
    }
}

impl State {
    pub fn algorithm(&self) -> Algorithm {
        match self {
            State::FixedWindow(_) => Algorithm::FixedWindow,
            State::SlidingWindow(_) => Algorithm::SlidingWindow,
            State::TokenBucket(_) => Algorithm::TokenBucket,
        }
    }

    /// Field `o`: the (clamped) time of the last write.
    pub fn last_observed_ms(&self) -> u64 {
        match self {
            State::FixedWindow(s) => s.last_observed_ms,
            State::SlidingWindow(s) => s.last_observed_ms,
            State::TokenBucket(s) => s.last_observed_ms,
        }
    }
}

/// Helpers the algorithms' unit tests share.
#[cfg(test)]
pub(crate) mod test_support {
    use super::{CommonArgs, Evaluation};

    /// Arguments whose grace (100 ms) covers the largest clamp (100 ms): a write in the held
    /// window may keep the key's expiry.
    pub fn grace_covering_clamp(cost: u64) -> CommonArgs {
        CommonArgs {
            cost,
            max_clock_regression_ms: 100,
            cleanup_grace_ms: 100,
        }
    }

    /// Whether the evaluation's write keeps the expiry (`None`: nothing written).
    pub fn keeps_expiry(e: &Evaluation) -> Option<bool> {
        e.write.map(|w| w.keeps_expiry)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use edgelimit_contract::PolicyId;

    fn policy(params: AlgorithmParams) -> RateLimitPolicy {
        RateLimitPolicy::new(PolicyId::new("p.1").unwrap(), 0xab, params, 10, 100, 50).unwrap()
    }

    #[test]
    fn state_of_another_algorithm_is_incompatible() {
        let p = policy(AlgorithmParams::FixedWindow {
            limit: 5,
            window_ms: 1000,
        });
        let bucket = State::TokenBucket(token_bucket::State {
            last_observed_ms: 1,
            tokens: 1,
            remainder: 0,
        });
        let e = evaluate(&p, Stored::Present(&bucket), 1_700_000_000_000, 1);
        assert_eq!(e.reply.status, Status::StateIncompatible);
        assert_eq!(e.reply.limit, 5);
        assert!(e.write.is_none());
    }

    #[test]
    fn local_bounds_match_the_contract() {
        let ok = AlgorithmParams::FixedWindow {
            limit: MAX,
            window_ms: MAX_PERIOD_MS,
        };
        assert!(ok.validate().is_ok());
        let too_long = AlgorithmParams::FixedWindow {
            limit: 1,
            window_ms: MAX_PERIOD_MS + 1,
        };
        assert!(too_long.validate().is_err());
        assert!(RateLimitPolicy::new(
            PolicyId::new("p").unwrap(),
            0,
            ok,
            1,
            MAX_SAFETY_MS,
            MAX_SAFETY_MS
        )
        .is_ok());
    }

    #[test]
    fn ceil_div_is_exact_at_the_top_of_the_range() {
        assert_eq!(ceil_div(MAX, 1), MAX);
        assert_eq!(ceil_div(MAX, 2), MAX / 2 + 1);
        assert_eq!(ceil_div(MAX - 1, MAX), 1);
        assert_eq!(ceil_div(0, 7), 0);
    }
}
mod verdict;
pub use verdict::outcome_from_reply;
