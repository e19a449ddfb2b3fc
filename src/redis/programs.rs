//! The versioned Lua programs, compiled into the binary so the exact source is always at hand
//! for the NOSCRIPT fallback.

use crate::algorithm::{revision_arg, SCHEMA_VERSION};
use crate::contract::{Algorithm, AlgorithmParams, RateLimitPolicy, RateLimitRequest};

/// The exact program source, compiled in so the binary and its programs cannot drift.
pub fn program_source(algorithm: Algorithm) -> &'static str {
    match algorithm {
        Algorithm::FixedWindow => include_str!("../../lua/rate-fixed-window-v1.lua"),
        Algorithm::SlidingWindow => include_str!("../../lua/rate-sliding-counter-v1.lua"),
        Algorithm::TokenBucket => include_str!("../../lua/rate-token-bucket-v1.lua"),
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
pub fn invocation(
    program: &Program,
    with_source: bool,
    key: &str,
    policy: &RateLimitPolicy,
    request: &RateLimitRequest,
) -> ::redis::Cmd {
    let mut cmd = if with_source {
        let mut cmd = ::redis::cmd("EVAL");
        cmd.arg(program.source);
        cmd
    } else {
        let mut cmd = ::redis::cmd("EVALSHA");
        cmd.arg(&program.sha);
        cmd
    };
    cmd.arg(1)
        .arg(key)
        .arg(program_args(policy, request.cost().units()));
    cmd
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::PolicyId;

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
