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

use thiserror::Error;

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

/// Schema version stored in every state hash (field `v`) and passed as ARGV[1].
pub const SCHEMA_VERSION: &str = "1";

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

/// The algorithm-specific state one subject keeps, field for field the Redis hash without its
/// header (`v a p r`, which the key and [`State::from_hash`] account for).
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

/// Why a stored hash cannot be read as this policy's state.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum StateError {
    #[error("stored {field} does not match this policy ({expected})")]
    HeaderMismatch {
        field: &'static str,
        expected: &'static str,
    },
    #[error("stored field {0} is missing or not a plain decimal integer below 2^53")]
    MalformedField(&'static str),
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

    /// The hash a program writes for this state, in the programs' field order.
    pub fn to_hash(&self, policy: &RateLimitPolicy) -> Vec<(&'static str, String)> {
        let mut fields = vec![
            ("v", SCHEMA_VERSION.to_owned()),
            ("a", self.algorithm().as_str().to_owned()),
            ("p", policy.id().as_str().to_owned()),
            ("r", revision_arg(policy.revision())),
            ("o", self.last_observed_ms().to_string()),
        ];
        match self {
            State::FixedWindow(s) => {
                fields.push(("w", s.window_id.to_string()));
                fields.push(("c", s.consumed.to_string()));
            }
            State::SlidingWindow(s) => {
                fields.push(("pw", s.previous_window_id.to_string()));
                fields.push(("pc", s.previous_count.to_string()));
                fields.push(("cw", s.current_window_id.to_string()));
                fields.push(("cc", s.current_count.to_string()));
            }
            State::TokenBucket(s) => {
                fields.push(("t", s.tokens.to_string()));
                fields.push(("m", s.remainder.to_string()));
            }
        }
        fields
    }

    /// Reads a stored hash (field, value pairs as `HGETALL` returns them) the way the program
    /// of `policy`'s algorithm does: header equal to this policy, every field plain decimal
    /// digits (at most 16) not above 2^53 - 1. Ranges that depend on the parameters (count <=
    /// limit, ...) are checked by `evaluate`. Extra fields are ignored, as in the programs.
    pub fn from_hash<K: AsRef<[u8]>, V: AsRef<[u8]>>(
        policy: &RateLimitPolicy,
        fields: &[(K, V)],
    ) -> Result<State, StateError> {
        let get = |name: &str| {
            fields
                .iter()
                .find(|(k, _)| k.as_ref() == name.as_bytes())
                .map(|(_, v)| v.as_ref())
        };
        let algorithm = policy.algorithm();
        let revision = revision_arg(policy.revision());
        let header: [(&'static str, &[u8], &'static str); 4] = [
            ("v", SCHEMA_VERSION.as_bytes(), "schema version"),
            ("a", algorithm.as_str().as_bytes(), "algorithm"),
            ("p", policy.id().as_str().as_bytes(), "policy id"),
            ("r", revision.as_bytes(), "policy revision"),
        ];
        for (field, expected, what) in header {
            if get(field) != Some(expected) {
                return Err(StateError::HeaderMismatch {
                    field,
                    expected: what,
                });
            }
        }
        let int = |field: &'static str| {
            get(field)
                .and_then(parse_decimal)
                .ok_or(StateError::MalformedField(field))
        };
        let last_observed_ms = int("o")?;
        Ok(match algorithm {
            Algorithm::FixedWindow => State::FixedWindow(fixed_window::State {
                last_observed_ms,
                window_id: int("w")?,
                consumed: int("c")?,
            }),
            Algorithm::SlidingWindow => State::SlidingWindow(sliding_window::State {
                last_observed_ms,
                previous_window_id: int("pw")?,
                previous_count: int("pc")?,
                current_window_id: int("cw")?,
                current_count: int("cc")?,
            }),
            Algorithm::TokenBucket => State::TokenBucket(token_bucket::State {
                last_observed_ms,
                tokens: int("t")?,
                remainder: int("m")?,
            }),
        })
    }
}

/// The programs' `int_arg` syntax: 1..=16 ASCII digits, value at most 2^53 - 1.
pub fn parse_decimal(v: &[u8]) -> Option<u64> {
    if v.is_empty() || v.len() > 16 || !v.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let n = v.iter().fold(0u64, |n, d| n * 10 + u64::from(d - b'0'));
    (n <= MAX).then_some(n)
}

/// ARGV[3]: the policy revision as 16 lowercase hex digits (also stored as field `r`).
pub fn revision_arg(revision: u64) -> String {
    format!("{revision:016x}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use edgelimit_contract::PolicyId;

    fn policy(params: AlgorithmParams) -> RateLimitPolicy {
        RateLimitPolicy::new(PolicyId::new("p.1").unwrap(), 0xab, params, 10, 100, 50).unwrap()
    }

    #[test]
    fn decimal_syntax_matches_the_programs() {
        assert_eq!(parse_decimal(b"0"), Some(0));
        assert_eq!(parse_decimal(b"007"), Some(7));
        assert_eq!(parse_decimal(b"9007199254740991"), Some(MAX));
        assert_eq!(parse_decimal(b"9007199254740992"), None);
        assert_eq!(parse_decimal(b"09007199254740991"), None, "17 digits");
        for bad in [&b""[..], b"1e3", b"-1", b" 5", b"0x10", b"+1", b"1.0"] {
            assert_eq!(parse_decimal(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn hash_round_trip_and_header_checks() {
        let p = policy(AlgorithmParams::SlidingWindow {
            limit: 5,
            window_ms: 1000,
        });
        let state = State::SlidingWindow(sliding_window::State {
            last_observed_ms: 1_700_000_000_123,
            previous_window_id: 1_699_999_999,
            previous_count: 3,
            current_window_id: 1_700_000_000,
            current_count: 1,
        });
        let hash = state.to_hash(&p);
        assert_eq!(hash[3], ("r", "00000000000000ab".to_owned()));
        assert_eq!(State::from_hash(&p, &hash), Ok(state));

        let mut wrong_algo = hash.clone();
        wrong_algo[1].1 = "token_bucket".into();
        assert!(matches!(
            State::from_hash(&p, &wrong_algo),
            Err(StateError::HeaderMismatch { field: "a", .. })
        ));
        let mut malformed = hash.clone();
        malformed[6].1 = "1e3".into();
        assert_eq!(
            State::from_hash(&p, &malformed),
            Err(StateError::MalformedField("pc"))
        );
        let missing: Vec<_> = hash.iter().filter(|(k, _)| *k != "cc").cloned().collect();
        assert_eq!(
            State::from_hash(&p, &missing),
            Err(StateError::MalformedField("cc"))
        );
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
