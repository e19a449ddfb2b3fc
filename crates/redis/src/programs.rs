//! The versioned Lua programs, compiled into the binary so the exact source is always at hand
//! for the NOSCRIPT fallback.

use edgelimit_algorithm::{revision_arg, SCHEMA_VERSION};
use edgelimit_contract::{Algorithm, AlgorithmParams, RateLimitPolicy, RateLimitRequest};

/// The exact program source, compiled in so the binary and its programs cannot drift.
pub fn program_source(algorithm: Algorithm) -> &'static str {
    match algorithm {
        Algorithm::FixedWindow => include_str!("../../../lua/rate-fixed-window-v1.lua"),
        Algorithm::SlidingWindow => include_str!("../../../lua/rate-sliding-counter-v1.lua"),
        Algorithm::TokenBucket => include_str!("../../../lua/rate-token-bucket-v1.lua"),
    }
}

/// The program's ARGV for `policy` and `cost` (0 = peek), as `lua/README.md` specifies.
pub fn program_args(policy: &RateLimitPolicy, cost: u64) -> Vec<String> {
    let mut args = vec![
        SCHEMA_VERSION.to_owned(),
        policy.id().as_str().to_owned(),
        revision_arg(policy.revision()),
        cost.to_string(),
        policy.max_clock_regression_ms().to_string(),
        policy.cleanup_grace_ms().to_string(),
    ];
    match *policy.params() {
        AlgorithmParams::FixedWindow { limit, window_ms }
        | AlgorithmParams::SlidingWindow { limit, window_ms } => {
            args.push(window_ms.to_string());
            args.push(limit.to_string());
        }
        AlgorithmParams::TokenBucket {
            capacity,
            refill_tokens,
            refill_period_ms,
        } => {
            args.push(refill_period_ms.to_string());
            args.push(refill_tokens.to_string());
            args.push(capacity.to_string());
        }
    }
    args
}

#[derive(Debug)]
pub struct Program {
    pub name: &'static str,
    pub source: &'static str,
    /// SHA1 of `source`, as EVALSHA expects.
    pub sha: String,
}

impl Program {
    fn new(name: &'static str, algorithm: Algorithm) -> Self {
        let source = program_source(algorithm);
        let sha = ::redis::Script::new(source).get_hash().to_owned();
        Self { name, source, sha }
    }
}

#[derive(Debug)]
pub struct Programs {
    fixed_window: Program,
    sliding_window: Program,
    token_bucket: Program,
}

impl Programs {
    pub fn load() -> Self {
        Self {
            fixed_window: Program::new("rate-fixed-window-v1", Algorithm::FixedWindow),
            sliding_window: Program::new("rate-sliding-counter-v1", Algorithm::SlidingWindow),
            token_bucket: Program::new("rate-token-bucket-v1", Algorithm::TokenBucket),
        }
    }

    pub fn for_algorithm(&self, algorithm: Algorithm) -> &Program {
        match algorithm {
            Algorithm::FixedWindow => &self.fixed_window,
            Algorithm::SlidingWindow => &self.sliding_window,
            Algorithm::TokenBucket => &self.token_bucket,
        }
    }

    pub fn all(&self) -> [&Program; 3] {
        [&self.fixed_window, &self.sliding_window, &self.token_bucket]
    }
}

/// Builds `EVALSHA sha 1 key ARGV...` or, for the NOSCRIPT fallback, `EVAL source 1 key ARGV...`.
///
/// The same ARGV as [`program_args`] (a test holds them equal), written straight into one
/// pre-sized command buffer: this runs for every Redis evaluation, and building nine `String`s
/// first cost ten allocations.
pub fn invocation(
    program: &Program,
    with_source: bool,
    key: &str,
    policy: &RateLimitPolicy,
    request: &RateLimitRequest,
) -> ::redis::Cmd {
    let (name, body) = if with_source {
        ("EVAL", program.source)
    } else {
        ("EVALSHA", program.sha.as_str())
    };
    // 13 arguments at most; numbers take at most 20 digits.
    let mut cmd = ::redis::Cmd::with_capacity(
        13,
        name.len() + body.len() + key.len() + policy.id().as_str().len() + 9 * 20,
    );
    cmd.arg(name).arg(body).arg(1).arg(key);
    let mut revision = [0u8; 16];
    cmd.arg(SCHEMA_VERSION)
        .arg(policy.id().as_str())
        .arg(&hex_u64(policy.revision(), &mut revision)[..])
        .arg(request.cost().units())
        .arg(policy.max_clock_regression_ms())
        .arg(policy.cleanup_grace_ms());
    match *policy.params() {
        AlgorithmParams::FixedWindow { limit, window_ms }
        | AlgorithmParams::SlidingWindow { limit, window_ms } => {
            cmd.arg(window_ms).arg(limit);
        }
        AlgorithmParams::TokenBucket {
            capacity,
            refill_tokens,
            refill_period_ms,
        } => {
            cmd.arg(refill_period_ms).arg(refill_tokens).arg(capacity);
        }
    }
    cmd
}

/// `revision_arg` without the `String`: 16 lowercase hex digits.
fn hex_u64(value: u64, out: &mut [u8; 16]) -> &[u8; 16] {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = DIGITS[((value >> (60 - 4 * i)) & 0xf) as usize];
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use edgelimit_contract::{Cost, PolicyId, SubjectDigest};

    #[test]
    fn invocation_sends_exactly_program_args() {
        let programs = Programs::load();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        for (params, revision) in [
            (
                AlgorithmParams::FixedWindow {
                    limit: 5,
                    window_ms: 1000,
                },
                0,
            ),
            (
                AlgorithmParams::SlidingWindow {
                    limit: 1_000_000_000,
                    window_ms: 86_400_000,
                },
                0x0123_4567_89ab_cdef,
            ),
            (
                AlgorithmParams::TokenBucket {
                    capacity: 7,
                    refill_tokens: 2,
                    refill_period_ms: 1000,
                },
                u64::MAX,
            ),
        ] {
            let p = RateLimitPolicy::new(
                PolicyId::new("d.r-1").unwrap(),
                revision,
                params,
                10,
                60_000,
                2_000,
            )
            .unwrap();
            for cost in [Cost::Peek, Cost::consume(3).unwrap()] {
                let request = RateLimitRequest::new(
                    &p,
                    SubjectDigest::from_bytes([1; 32]),
                    cost,
                    None,
                    deadline,
                )
                .unwrap();
                let program = programs.for_algorithm(p.algorithm());
                for with_source in [false, true] {
                    let cmd = invocation(program, with_source, "k{x}", &p, &request);
                    let sent: Vec<Vec<u8>> = cmd
                        .args_iter()
                        .map(|a| match a {
                            ::redis::Arg::Simple(bytes) => bytes.to_vec(),
                            _ => panic!("only simple arguments"),
                        })
                        .collect();
                    let mut expected: Vec<Vec<u8>> = vec![
                        if with_source {
                            b"EVAL".to_vec()
                        } else {
                            b"EVALSHA".to_vec()
                        },
                        if with_source {
                            program.source.as_bytes().to_vec()
                        } else {
                            program.sha.as_bytes().to_vec()
                        },
                        b"1".to_vec(),
                        b"k{x}".to_vec(),
                    ];
                    expected.extend(
                        program_args(&p, cost.units())
                            .into_iter()
                            .map(String::into_bytes),
                    );
                    assert_eq!(sent, expected);
                }
            }
        }
    }

    fn policy(params: AlgorithmParams) -> RateLimitPolicy {
        RateLimitPolicy::new(PolicyId::new("p.1").unwrap(), 0xab, params, 10, 100, 50).unwrap()
    }

    #[test]
    fn program_args_follow_the_readme() {
        let p = policy(AlgorithmParams::TokenBucket {
            capacity: 7,
            refill_tokens: 2,
            refill_period_ms: 1000,
        });
        assert_eq!(
            program_args(&p, 3),
            [
                "1",
                "p.1",
                "00000000000000ab",
                "3",
                "50",
                "100",
                "1000",
                "2",
                "7"
            ]
        );
    }
}
