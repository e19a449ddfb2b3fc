//! The versioned Lua programs, composed at build time from `lua/lib/` (one prologue, one
//! module per algorithm, one driver) and compiled into the binary, so each program is
//! self-contained for EVALSHA and its exact source is always at hand for the NOSCRIPT fallback.

use std::sync::OnceLock;

use edgelimit_algorithm::composite::Mode;
use edgelimit_contract::{Algorithm, AlgorithmParams, RateLimitPolicy, Revision};

use crate::codec::SCHEMA_VERSION;

/// Composes one program: a name line, whether it memoises number conversions (`MEMOISE`, see
/// the prologue: it pays where many members repeat the same strings), the shared prologue, the
/// algorithm modules, the driver.
///
/// A single-key program runs its one module's definitions inline. A program that may use any
/// of the algorithms wraps each module in a loader, `<NAME>_MODULE()`, which `decide.lua` calls
/// the first time a check names that algorithm: Lua builds a closure for every function a
/// chunk defines each time the chunk runs, and a call of one algorithm would otherwise build
/// the other two modules' (about 20 functions and two tables) for nothing.
macro_rules! program {
    ($name:literal, memoise: $memoise:literal, [$module:literal], $bind:literal, $driver:literal) => {
        concat!(
            "-- edgelimit ", $name, " (composed from lua/lib; see lua/README.md)\n",
            "local MEMOISE = ", $memoise, "\n",
            include_str!("../../../lua/lib/prologue.lua"),
            include_str!(concat!("../../../lua/lib/", $module, ".lua")),
            $bind,
            include_str!(concat!("../../../lua/lib/", $driver, ".lua"))
        )
    };
    ($name:literal, memoise: $memoise:literal, lazy [$(($module:literal, $table:literal)),+], $driver:literal) => {
        concat!(
            "-- edgelimit ", $name, " (composed from lua/lib; see lua/README.md)\n",
            "local MEMOISE = ", $memoise, "\n",
            include_str!("../../../lua/lib/prologue.lua"),
            $(
                "local function ", $table, "_MODULE()\n",
                include_str!(concat!("../../../lua/lib/", $module, ".lua")),
                "return ", $table, "\nend\n",
            )+
            include_str!("../../../lua/lib/decide.lua"),
            include_str!(concat!("../../../lua/lib/", $driver, ".lua"))
        )
    };
}

const FIXED_WINDOW_SOURCE: &str = program!(
    "rate-fixed-window-v1",
    memoise: "false",
    ["fixed-window"],
    "local ALGORITHM = FIXED_WINDOW\n",
    "single"
);
const SLIDING_COUNTER_SOURCE: &str = program!(
    "rate-sliding-counter-v1",
    memoise: "false",
    ["sliding-counter"],
    "local ALGORITHM = SLIDING_COUNTER\n",
    "single"
);
const TOKEN_BUCKET_SOURCE: &str = program!(
    "rate-token-bucket-v1",
    memoise: "false",
    ["token-bucket"],
    "local ALGORITHM = TOKEN_BUCKET\n",
    "single"
);
const COMPOSITE_SOURCE: &str = program!(
    "rate-composite-v1",
    memoise: "true",
    lazy [
        ("fixed-window", "FIXED_WINDOW"),
        ("sliding-counter", "SLIDING_COUNTER"),
        ("token-bucket", "TOKEN_BUCKET")
    ],
    "composite"
);
const BATCH_SOURCE: &str = program!(
    "rate-batch-v1",
    memoise: "true",
    lazy [
        ("fixed-window", "FIXED_WINDOW"),
        ("sliding-counter", "SLIDING_COUNTER"),
        ("token-bucket", "TOKEN_BUCKET")
    ],
    "batch"
);

/// The exact source of an algorithm's single-key program.
pub fn program_source(algorithm: Algorithm) -> &'static str {
    match algorithm {
        Algorithm::FixedWindow => FIXED_WINDOW_SOURCE,
        Algorithm::SlidingWindow => SLIDING_COUNTER_SOURCE,
        Algorithm::TokenBucket => TOKEN_BUCKET_SOURCE,
    }
}

/// The exact source of the composite program (every limit of a request in one call).
pub fn composite_source() -> &'static str {
    COMPOSITE_SOURCE
}

/// The exact source of the batch program (several requests, each decided on its own).
pub fn batch_source() -> &'static str {
    BATCH_SOURCE
}

/// The program's ARGV for `policy` and `cost` (0 = peek), as `lua/README.md` specifies.
pub fn program_args(policy: &RateLimitPolicy, cost: u64) -> Vec<String> {
    let mut args = vec![
        SCHEMA_VERSION.to_owned(),
        policy.id().as_str().to_owned(),
        Revision(policy.revision()).to_string(),
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

pub struct Program {
    pub name: &'static str,
    pub source: &'static str,
    /// SHA1 of `source`, as EVALSHA expects.
    pub sha: String,
    /// Metric handles, taken from the recorder at first use (a labelled `histogram!` builds
    /// and hashes its key on every call).
    latency: OnceLock<metrics::Histogram>,
    noscript: OnceLock<metrics::Counter>,
}

impl std::fmt::Debug for Program {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Program")
            .field("name", &self.name)
            .field("sha", &self.sha)
            .finish_non_exhaustive()
    }
}

impl Program {
    fn new(name: &'static str, source: &'static str) -> Self {
        let sha = ::redis::Script::new(source).get_hash().to_owned();
        Self {
            name,
            source,
            sha,
            latency: OnceLock::new(),
            noscript: OnceLock::new(),
        }
    }

    /// `edgelimit_redis_command_seconds{program}`.
    pub fn latency(&self) -> &metrics::Histogram {
        self.latency.get_or_init(
            || metrics::histogram!(edgelimit_metrics::REDIS_COMMAND_SECONDS, "program" => self.name),
        )
    }

    /// `edgelimit_redis_noscript_reloads_total{program}`.
    pub fn noscript_resends(&self) -> &metrics::Counter {
        self.noscript.get_or_init(
            || metrics::counter!(edgelimit_metrics::REDIS_NOSCRIPT_RELOADS, "program" => self.name),
        )
    }
}

#[derive(Debug)]
pub struct Programs {
    fixed_window: Program,
    sliding_window: Program,
    token_bucket: Program,
    composite: Program,
    batch: Program,
}

impl Programs {
    pub fn load() -> Self {
        Self {
            fixed_window: Program::new("rate-fixed-window-v1", FIXED_WINDOW_SOURCE),
            sliding_window: Program::new("rate-sliding-counter-v1", SLIDING_COUNTER_SOURCE),
            token_bucket: Program::new("rate-token-bucket-v1", TOKEN_BUCKET_SOURCE),
            composite: Program::new("rate-composite-v1", COMPOSITE_SOURCE),
            batch: Program::new("rate-batch-v1", BATCH_SOURCE),
        }
    }

    pub fn for_algorithm(&self, algorithm: Algorithm) -> &Program {
        match algorithm {
            Algorithm::FixedWindow => &self.fixed_window,
            Algorithm::SlidingWindow => &self.sliding_window,
            Algorithm::TokenBucket => &self.token_bucket,
        }
    }

    pub fn composite(&self) -> &Program {
        &self.composite
    }

    pub fn batch(&self) -> &Program {
        &self.batch
    }

    pub fn all(&self) -> [&Program; 5] {
        [
            &self.fixed_window,
            &self.sliding_window,
            &self.token_bucket,
            &self.composite,
            &self.batch,
        ]
    }
}

/// One check of a composite call: `key` indexes the call's keys (0-based here, 1-based in
/// the program).
#[derive(Debug, Clone, Copy)]
pub struct CompositeCheck<'a> {
    pub key: usize,
    pub policy: &'a RateLimitPolicy,
    /// Units to consume; 0 is a peek.
    pub cost: u64,
    pub shadow: bool,
}

/// Builds `EVALSHA sha <keys> KEYS... 1 mode n deadline (check)...` (or `EVAL source ...` for
/// the NOSCRIPT fallback) for the composite program. `deadline_ms` is the caller's deadline on
/// Redis's clock: the program does nothing once it has passed.
pub fn composite_invocation(
    program: &Program,
    with_source: bool,
    mode: Mode,
    keys: &[&str],
    checks: &[CompositeCheck<'_>],
    deadline_ms: Option<u64>,
) -> ::redis::Cmd {
    let (name, body) = if with_source {
        ("EVAL", program.source)
    } else {
        ("EVALSHA", program.sha.as_str())
    };
    let key_bytes: usize = keys.iter().map(|k| k.len()).sum();
    let arity = 3 + keys.len() + 3 + checks.len() * 12;
    let mut cmd = ::redis::Cmd::with_capacity(
        arity,
        name.len() + body.len() + key_bytes + checks.len() * (64 + 9 * 20),
    );
    cmd.arg(name).arg(body).arg(keys.len());
    for key in keys {
        cmd.arg(*key);
    }
    cmd.arg("1").arg(mode.as_str()).arg(checks.len());
    match deadline_ms {
        Some(deadline) => cmd.arg(deadline),
        None => cmd.arg(""),
    };
    check_args(&mut cmd, checks);
    cmd
}

/// Each check's arguments: key index (1-based), algorithm letter, shadow, common arguments.
fn check_args(cmd: &mut ::redis::Cmd, checks: &[CompositeCheck<'_>]) {
    let mut revision = [0u8; 16];
    for check in checks {
        let policy = check.policy;
        let letter = match policy.algorithm() {
            Algorithm::FixedWindow => "f",
            Algorithm::SlidingWindow => "s",
            Algorithm::TokenBucket => "t",
        };
        cmd.arg(check.key + 1)
            .arg(letter)
            .arg(if check.shadow { "1" } else { "0" });
        common_args(cmd, policy, check.cost, &mut revision);
    }
}

/// One request's part of a batch call, owned so it can wait for its turn on the I/O thread:
/// its keys and its framing (`nkeys mode n deadline`, then its checks as in the composite
/// program).
#[derive(Debug)]
pub struct BatchMember {
    pub keys: Vec<String>,
    args: ::redis::Cmd,
}

impl BatchMember {
    pub fn new(
        mode: Mode,
        keys: &[&str],
        checks: &[CompositeCheck<'_>],
        deadline_ms: Option<u64>,
    ) -> Self {
        let mut args = ::redis::Cmd::with_capacity(4 + checks.len() * 12, checks.len() * 200);
        args.arg(keys.len()).arg(mode.as_str()).arg(checks.len());
        match deadline_ms {
            Some(deadline) => args.arg(deadline),
            None => args.arg(""),
        };
        check_args(&mut args, checks);
        Self {
            keys: keys.iter().map(|k| (*k).to_owned()).collect(),
            args,
        }
    }
}

/// Builds `EVALSHA sha <keys> KEYS... 1 m (member)...` (or `EVAL source ...`) for the batch
/// program: each member is decided on its own, in order.
pub fn batch_invocation(
    program: &Program,
    with_source: bool,
    members: &[&BatchMember],
) -> ::redis::Cmd {
    let (name, body) = if with_source {
        ("EVAL", program.source)
    } else {
        ("EVALSHA", program.sha.as_str())
    };
    let keys: usize = members.iter().map(|m| m.keys.len()).sum();
    let arity: usize = 5
        + keys
        + members
            .iter()
            .map(|m| m.args.args_iter().count())
            .sum::<usize>();
    let mut cmd = ::redis::Cmd::with_capacity(arity, name.len() + body.len() + members.len() * 512);
    cmd.arg(name).arg(body).arg(keys);
    for member in members {
        for key in &member.keys {
            cmd.arg(key.as_str());
        }
    }
    cmd.arg("1").arg(members.len());
    for member in members {
        for arg in member.args.args_iter() {
            if let ::redis::Arg::Simple(bytes) = arg {
                cmd.arg(bytes);
            }
        }
    }
    cmd
}

/// ARGV of one evaluation after the framing: schema, policy, revision, cost, max clock
/// regression, cleanup grace, then the algorithm's parameters.
fn common_args(
    cmd: &mut ::redis::Cmd,
    policy: &RateLimitPolicy,
    cost: u64,
    revision: &mut [u8; 16],
) {
    cmd.arg(SCHEMA_VERSION)
        .arg(policy.id().as_str())
        .arg(&hex_u64(policy.revision(), revision)[..])
        .arg(cost)
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
    cost: u64,
    deadline_ms: Option<u64>,
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
    common_args(&mut cmd, policy, cost, &mut revision);
    if let Some(deadline) = deadline_ms {
        cmd.arg(deadline);
    }
    cmd
}

/// [`Revision`]'s form without the `String`: 16 lowercase hex digits.
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

    /// The constants both sides hold, pinned: the Lua literal must be the Rust value.
    #[test]
    fn lua_and_rust_share_every_constant() {
        use edgelimit_algorithm::{sliding_window, MAX, MAX_PERIOD_MS, MAX_SAFETY_MS};
        let composite = composite_source();
        for (lua, rust) in [
            ("local MAX = ", MAX.to_string()),
            ("local MAX_SAFETY = ", MAX_SAFETY_MS.to_string()),
            ("local MAX_PERIOD = ", MAX_PERIOD_MS.to_string()),
            ("local SCALE = ", sliding_window::SCALE.to_string()),
            (
                "local MAX_SCALED = ",
                sliding_window::MAX_SCALED.to_string(),
            ),
            ("local SCHEMA = ", format!("'{SCHEMA_VERSION}'")),
        ] {
            let line = composite
                .lines()
                .find(|l| l.starts_with(lua))
                .unwrap_or_else(|| panic!("{lua} is defined in the programs"));
            assert_eq!(&line[lua.len()..], rust, "{lua}");
            assert_eq!(composite.matches(lua).count(), 1, "{lua} is defined once");
        }
    }
    use edgelimit_contract::{Cost, PolicyId};

    #[test]
    fn invocation_sends_exactly_program_args() {
        let programs = Programs::load();
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
                let program = programs.for_algorithm(p.algorithm());
                for with_source in [false, true] {
                    let cmd = invocation(program, with_source, "k{x}", &p, cost.units(), None);
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
