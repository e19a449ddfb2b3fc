//! The Redis hash a state is stored as: the programs' field names and order, the header
//! (`v a p r`) that ties it to a schema, an algorithm, a policy and its state revision, and the
//! programs' decimal syntax. The programs write and read these hashes; this is how the Rust
//! side (tests, tools) reads and writes exactly the same ones.

use thiserror::Error;

use edgelimit_algorithm::{fixed_window, sliding_window, token_bucket, State, MAX};
use edgelimit_contract::{Algorithm, RateLimitPolicy, Revision};

/// Schema version stored in every state hash (field `v`) and passed as ARGV[1].
pub const SCHEMA_VERSION: &str = "1";

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

/// The hash a program writes for `state`, in the programs' field order.
pub fn state_to_hash(state: &State, policy: &RateLimitPolicy) -> Vec<(&'static str, String)> {
    let mut fields = vec![
        ("v", SCHEMA_VERSION.to_owned()),
        ("a", state.algorithm().as_str().to_owned()),
        ("p", policy.id().as_str().to_owned()),
        ("r", Revision(policy.revision()).to_string()),
        ("o", state.last_observed_ms().to_string()),
    ];
    match state {
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
pub fn state_from_hash<K: AsRef<[u8]>, V: AsRef<[u8]>>(
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
    let revision = Revision(policy.revision()).to_string();
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

/// The programs' `int_arg` syntax: 1..=16 ASCII digits, value at most 2^53 - 1.
pub fn parse_decimal(v: &[u8]) -> Option<u64> {
    if v.is_empty() || v.len() > 16 || !v.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let n = v.iter().fold(0u64, |n, d| n * 10 + u64::from(d - b'0'));
    (n <= MAX).then_some(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use edgelimit_contract::{AlgorithmParams, PolicyId};

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
        let hash = state_to_hash(&state, &p);
        assert_eq!(hash[3], ("r", "00000000000000ab".to_owned()));
        assert_eq!(state_from_hash(&p, &hash), Ok(state));

        let mut wrong_algo = hash.clone();
        wrong_algo[1].1 = "token_bucket".into();
        assert!(matches!(
            state_from_hash(&p, &wrong_algo),
            Err(StateError::HeaderMismatch { field: "a", .. })
        ));
        let mut malformed = hash.clone();
        malformed[6].1 = "1e3".into();
        assert_eq!(
            state_from_hash(&p, &malformed),
            Err(StateError::MalformedField("pc"))
        );
        let missing: Vec<_> = hash.iter().filter(|(k, _)| *k != "cc").cloned().collect();
        assert_eq!(
            state_from_hash(&p, &missing),
            Err(StateError::MalformedField("cc"))
        );
    }
}
