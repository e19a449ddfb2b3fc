//! The versioned Lua programs, compiled into the binary so the exact source is always at hand
//! for the NOSCRIPT fallback.

use crate::contract::{Algorithm, AlgorithmParams, RateLimitPolicy, RateLimitRequest};

use super::keys::revision_arg;
use crate::algorithm::SCHEMA_VERSION;

#[derive(Debug)]
pub struct Program {
    pub name: &'static str,
    pub source: &'static str,
    /// SHA1 of `source`, as EVALSHA expects.
    pub sha: String,
}

impl Program {
    fn new(name: &'static str, source: &'static str) -> Self {
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
            fixed_window: Program::new(
                "rate-fixed-window-v1",
                include_str!("../../lua/rate-fixed-window-v1.lua"),
            ),
            sliding_window: Program::new(
                "rate-sliding-counter-v1",
                include_str!("../../lua/rate-sliding-counter-v1.lua"),
            ),
            token_bucket: Program::new(
                "rate-token-bucket-v1",
                include_str!("../../lua/rate-token-bucket-v1.lua"),
            ),
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
        .arg(SCHEMA_VERSION)
        .arg(policy.id().as_str())
        .arg(revision_arg(policy.revision()))
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
