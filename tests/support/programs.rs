//! Runs the Lua programs in a private Redis and checks each run against the Rust functions:
//! same reply, same stored state, a TTL after every write, nothing touched otherwise.
#![allow(dead_code)]

use edgelimit::algorithm::composite::{self, Decided, Held, Mode};
use edgelimit::algorithm::{self, Evaluation, ProgramReply, State, Status, Stored, Write};
use edgelimit::contract::RateLimitPolicy;
use redis::{Connection, Script, Value};

/// Time a PTTL read may lag the program run (a loaded two-core machine).
const TTL_SLACK_MS: u64 = 500;

pub fn connect(url: &str) -> Connection {
    redis::Client::open(url).unwrap().get_connection().unwrap()
}

/// The programs, loaded once per connection (EVALSHA, NOSCRIPT falls back to the source).
pub struct Programs {
    pub con: Connection,
    fixed: Script,
    sliding: Script,
    bucket: Script,
    composite: Script,
    batch: Script,
}

/// One check of a composite run: a policy on a key, a cost (0 = peek), shadow or enforced.
#[derive(Debug, Clone, Copy)]
pub struct CompositeCheck<'a> {
    pub policy: &'a RateLimitPolicy,
    pub key: &'a str,
    pub cost: u64,
    pub shadow: bool,
}

/// What a key held before a run, owned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Before {
    Absent,
    Present(State),
    Incompatible,
}

impl Before {
    pub fn stored(&self) -> Stored<'_, State> {
        match self {
            Before::Absent => Stored::Absent,
            Before::Present(s) => Stored::Present(s),
            Before::Incompatible => Stored::Incompatible,
        }
    }
}

pub fn parse_reply(v: Value) -> ProgramReply {
    let Value::Array(items) = v else {
        panic!("reply is not an array: {v:?}")
    };
    assert_eq!(items.len(), 7, "seven fields: {items:?}");
    let status = match &items[0] {
        Value::BulkString(b) => Status::parse(b),
        Value::SimpleString(s) => Status::parse(s.as_bytes()),
        other => panic!("status {other:?}"),
    }
    .expect("known status");
    let n = |i: usize| match items[i] {
        Value::Int(n) => u64::try_from(n).expect("non-negative"),
        ref other => panic!("field {i} is not an integer: {other:?}"),
    };
    ProgramReply {
        status,
        server_now_ms: n(1),
        effective_now_ms: n(2),
        limit: n(3),
        remaining: n(4),
        retry_after_ms: n(5),
        reset_at_ms: n(6),
    }
}

impl Programs {
    pub fn new(url: &str) -> Self {
        use edgelimit::contract::Algorithm::*;
        Self {
            con: connect(url),
            fixed: Script::new(edgelimit::redis::program_source(FixedWindow)),
            sliding: Script::new(edgelimit::redis::program_source(SlidingWindow)),
            bucket: Script::new(edgelimit::redis::program_source(TokenBucket)),
            composite: Script::new(edgelimit::redis::composite_source()),
            batch: Script::new(edgelimit::redis::batch_source()),
        }
    }

    /// Runs a program with raw ARGV.
    pub fn run_raw(
        &mut self,
        algorithm: edgelimit::contract::Algorithm,
        key: &str,
        args: &[String],
    ) -> ProgramReply {
        use edgelimit::contract::Algorithm::*;
        // field by field, so the script and the connection are borrowed separately
        let script = match algorithm {
            FixedWindow => &self.fixed,
            SlidingWindow => &self.sliding,
            TokenBucket => &self.bucket,
        };
        let mut inv = script.key(key);
        for a in args {
            inv.arg(a);
        }
        parse_reply(inv.invoke::<Value>(&mut self.con).unwrap())
    }

    pub fn run(&mut self, policy: &RateLimitPolicy, key: &str, cost: u64) -> ProgramReply {
        let args = edgelimit::redis::program_args(policy, cost);
        self.run_raw(policy.algorithm(), key, &args)
    }

    /// Runs the composite program; the keys are numbered in order of first use.
    pub fn run_composite(
        &mut self,
        checks: &[CompositeCheck<'_>],
        mode: Mode,
    ) -> Vec<ProgramReply> {
        let keys = distinct_keys(checks);
        let mut inv = self.composite.prepare_invoke();
        for key in &keys {
            inv.key(*key);
        }
        inv.arg("1").arg(mode.as_str()).arg(checks.len()).arg("");
        check_args(&mut inv, checks, &keys);
        let Value::Array(replies) = inv.invoke::<Value>(&mut self.con).unwrap() else {
            panic!("composite reply is not an array")
        };
        replies.into_iter().map(parse_reply).collect()
    }

    /// Runs the batch program: each member's keys numbered in order of first use, as in
    /// [`Programs::run_composite`]; one reply list per member.
    pub fn run_batch(
        &mut self,
        members: &[(Vec<CompositeCheck<'_>>, Mode)],
    ) -> Vec<Vec<ProgramReply>> {
        let mut inv = self.batch.prepare_invoke();
        for (checks, _) in members {
            for key in distinct_keys(checks) {
                inv.key(key);
            }
        }
        inv.arg("1").arg(members.len());
        for (checks, mode) in members {
            let keys = distinct_keys(checks);
            inv.arg(keys.len())
                .arg(mode.as_str())
                .arg(checks.len())
                .arg("");
            check_args(&mut inv, checks, &keys);
        }
        let Value::Array(per_member) = inv.invoke::<Value>(&mut self.con).unwrap() else {
            panic!("batch reply is not an array")
        };
        per_member
            .into_iter()
            .map(|replies| {
                let Value::Array(replies) = replies else {
                    panic!("member reply is not an array: {replies:?}")
                };
                replies.into_iter().map(parse_reply).collect()
            })
            .collect()
    }

    /// One differential step of the batch program: the members decided by the Rust composite
    /// one after the other, each on the state the previous ones left, at the batch's server
    /// time, must give the same replies and leave the same state in every key.
    pub fn step_batch(
        &mut self,
        members: &[(Vec<CompositeCheck<'_>>, Mode)],
        policy_of: impl Fn(&str) -> RateLimitPolicy,
    ) {
        let mut keys: Vec<&str> = Vec::new();
        for (checks, _) in members {
            for key in distinct_keys(checks) {
                if !keys.contains(&key) {
                    keys.push(key);
                }
            }
        }
        let mut held: Vec<Held> = keys
            .iter()
            .map(|key| match self.before(&policy_of(key), key) {
                Before::Absent => Held::Absent,
                Before::Present(s) => Held::Present(s),
                Before::Incompatible => Held::Incompatible,
            })
            .collect();
        let replies = self.run_batch(members);
        assert_eq!(replies.len(), members.len());
        let server_now = replies[0].first().map_or(0, |r| r.server_now_ms);
        for ((checks, mode), lua) in members.iter().zip(&replies) {
            let own = distinct_keys(checks);
            let rust_checks: Vec<composite::Check<'_>> = checks
                .iter()
                .map(|c| composite::Check {
                    policy: c.policy,
                    key: own.iter().position(|k| k == &c.key).unwrap(),
                    cost: c.cost,
                    shadow: c.shadow,
                })
                .collect();
            let own_held: Vec<Held> = own
                .iter()
                .map(|k| held[keys.iter().position(|g| g == k).unwrap()])
                .collect();
            let decided = composite::decide(&rust_checks, &own_held, server_now, *mode);
            assert_eq!(
                lua.as_slice(),
                decided.replies.as_slice(),
                "Lua batch vs Rust composite, {checks:?}"
            );
            for (i, key) in own.iter().enumerate() {
                if let Some(w) = decided.writes[i] {
                    held[keys.iter().position(|g| g == key).unwrap()] = Held::Present(w.state);
                }
            }
        }
        for (key, expected) in keys.iter().zip(&held) {
            let stored = match self.before(&policy_of(key), key) {
                Before::Absent => Held::Absent,
                Before::Present(s) => Held::Present(s),
                Before::Incompatible => Held::Incompatible,
            };
            assert_eq!(&stored, expected, "state of {key} after the batch");
        }
    }

    /// One differential step of the composite program: runs it, decides the same checks with
    /// the Rust composite on the same stored states at the program's server time, and asserts
    /// identical replies and, key by key, identical stored state (or an untouched key).
    pub fn step_composite(&mut self, checks: &[CompositeCheck<'_>], mode: Mode) -> Decided {
        let keys = distinct_keys(checks);
        // A key's state is read with the policy of the first check naming it.
        let held: Vec<Held> = keys
            .iter()
            .map(|key| {
                let policy = checks.iter().find(|c| c.key == *key).unwrap().policy;
                match self.before(policy, key) {
                    Before::Absent => Held::Absent,
                    Before::Present(s) => Held::Present(s),
                    Before::Incompatible => Held::Incompatible,
                }
            })
            .collect();
        let before: Vec<KeySnapshot> = keys
            .iter()
            .map(|key| {
                let hash = match self.key_type(key).as_str() {
                    "hash" => self.hash(key),
                    _ => Vec::new(),
                };
                (self.dump(key), self.expire_time(key), hash)
            })
            .collect();
        let replies = self.run_composite(checks, mode);
        let server_now = replies.first().map_or(0, |r| r.server_now_ms);
        let rust_checks: Vec<composite::Check<'_>> = checks
            .iter()
            .map(|c| composite::Check {
                policy: c.policy,
                key: keys.iter().position(|k| k == &c.key).unwrap(),
                cost: c.cost,
                shadow: c.shadow,
            })
            .collect();
        let decided = composite::decide(&rust_checks, &held, server_now, mode);
        assert_eq!(
            replies,
            decided.replies.as_slice(),
            "Lua vs Rust composite replies, {checks:?}"
        );
        for (i, key) in keys.iter().enumerate() {
            let (dump_before, expiry_before, hash_before) = &before[i];
            match decided.writes[i] {
                Some(w) => {
                    let policy = checks.iter().find(|c| c.key == *key).unwrap().policy;
                    let mut expected: Vec<(String, String)> =
                        edgelimit::redis::state_to_hash(&w.state, policy)
                            .into_iter()
                            .map(|(k, v)| (k.to_owned(), v))
                            .collect();
                    for (k, v) in hash_before {
                        if !expected.iter().any(|(e, _)| e == k) {
                            expected.push((k.clone(), v.clone()));
                        }
                    }
                    expected.sort();
                    assert_eq!(self.hash(key), expected, "stored state of {key}");
                    self.assert_expiry(key, &w, *expiry_before);
                }
                None => {
                    assert_eq!(&self.dump(key), dump_before, "{key} untouched");
                    assert_eq!(&self.expire_time(key), expiry_before, "{key} TTL untouched");
                }
            }
        }
        decided
    }

    pub fn cmd<T: redis::FromRedisValue>(&mut self, args: &[&str]) -> T {
        let mut c = redis::cmd(args[0]);
        for a in &args[1..] {
            c.arg(*a);
        }
        c.query(&mut self.con).unwrap()
    }

    pub fn key_type(&mut self, key: &str) -> String {
        self.cmd(&["TYPE", key])
    }

    pub fn hash(&mut self, key: &str) -> Vec<(String, String)> {
        let mut h: Vec<(String, String)> = self.cmd(&["HGETALL", key]);
        h.sort();
        h
    }

    pub fn dump(&mut self, key: &str) -> Option<Vec<u8>> {
        self.cmd(&["DUMP", key])
    }

    /// Absolute expiry in Unix ms (-1 none, -2 no key).
    pub fn expire_time(&mut self, key: &str) -> i64 {
        self.cmd(&["PEXPIRETIME", key])
    }

    /// After a write: the expiry the window's first write set, when the Rust mirror keeps it;
    /// otherwise the Rust TTL from now (less what a PTTL read lags).
    fn assert_expiry(&mut self, key: &str, w: &Write, expiry_before: i64) {
        if w.keeps_expiry {
            assert_eq!(self.expire_time(key), expiry_before, "{key}: expiry kept");
            return;
        }
        let pttl = self.pttl(key);
        assert!(w.ttl_ms >= 1);
        assert!(
            pttl > 0 && pttl as u64 <= w.ttl_ms && pttl as u64 + TTL_SLACK_MS >= w.ttl_ms,
            "PTTL {pttl} vs Rust TTL {} of {key}",
            w.ttl_ms
        );
    }

    pub fn pttl(&mut self, key: &str) -> i64 {
        self.cmd(&["PTTL", key])
    }

    pub fn server_time_ms(&mut self) -> u64 {
        let (s, us): (u64, u64) = self.cmd(&["TIME"]);
        s * 1000 + us / 1000
    }

    /// Replaces the key with exactly the hash a program would write for `state`.
    pub fn put_state(&mut self, policy: &RateLimitPolicy, key: &str, state: &State, ttl_ms: u64) {
        self.put_fields(key, &edgelimit::redis::state_to_hash(state, policy), ttl_ms);
    }

    pub fn put_fields<V: AsRef<str>>(&mut self, key: &str, fields: &[(&str, V)], ttl_ms: u64) {
        let _: () = self.cmd(&["DEL", key]);
        let mut c = redis::cmd("HSET");
        c.arg(key);
        for (k, v) in fields {
            c.arg(*k).arg(v.as_ref());
        }
        let _: () = c.query(&mut self.con).unwrap();
        let _: () = self.cmd(&["PEXPIRE", key, &ttl_ms.to_string()]);
    }

    /// How the program classifies the key, read the Rust way (TYPE + HGETALL + from_hash).
    pub fn before(&mut self, policy: &RateLimitPolicy, key: &str) -> Before {
        match self.key_type(key).as_str() {
            "none" => Before::Absent,
            "hash" => match edgelimit::redis::state_from_hash(policy, &self.hash(key)) {
                Ok(s) => Before::Present(s),
                Err(_) => Before::Incompatible,
            },
            _ => Before::Incompatible,
        }
    }

    /// One differential step: runs the program, evaluates the Rust function on the same
    /// stored state at the program's server time, and asserts identical replies and state.
    pub fn step(
        &mut self,
        policy: &RateLimitPolicy,
        key: &str,
        cost: u64,
    ) -> (ProgramReply, Evaluation) {
        let before = self.before(policy, key);
        let dump_before = self.dump(key);
        let expiry_before = self.expire_time(key);
        let hash_before = match self.key_type(key).as_str() {
            "hash" => self.hash(key),
            _ => Vec::new(),
        };

        let reply = self.run(policy, key, cost);
        let rust = algorithm::evaluate(policy, before.stored(), reply.server_now_ms, cost);
        assert_eq!(
            reply, rust.reply,
            "Lua vs Rust reply, cost {cost}, before {before:?}, policy {policy:?}"
        );
        match rust.write {
            Some(w) => {
                let mut expected: Vec<(String, String)> =
                    edgelimit::redis::state_to_hash(&w.state, policy)
                        .into_iter()
                        .map(|(k, v)| (k.to_owned(), v))
                        .collect();
                // Fields the program does not know survive HSET.
                for (k, v) in &hash_before {
                    if !expected.iter().any(|(e, _)| e == k) {
                        expected.push((k.clone(), v.clone()));
                    }
                }
                expected.sort();
                assert_eq!(self.key_type(key), "hash");
                assert_eq!(
                    self.hash(key),
                    expected,
                    "stored state after cost {cost}, before {before:?}"
                );
                self.assert_expiry(key, &w, expiry_before);
            }
            None => {
                assert_eq!(
                    self.dump(key),
                    dump_before,
                    "nothing written (cost {cost}, {:?})",
                    reply.status
                );
                assert_eq!(self.expire_time(key), expiry_before, "TTL untouched");
            }
        }
        (reply, rust)
    }
}

/// A key before a run: its DUMP, its absolute expiry, its hash fields.
type KeySnapshot = (Option<Vec<u8>>, i64, Vec<(String, String)>);

/// Each check's arguments as the composite and batch programs take them: key index (1-based
/// into `keys`), algorithm letter, shadow flag, then the single-key programs' arguments.
fn check_args(inv: &mut redis::ScriptInvocation<'_>, checks: &[CompositeCheck<'_>], keys: &[&str]) {
    for c in checks {
        let index = keys.iter().position(|k| k == &c.key).unwrap() + 1;
        let letter = match c.policy.algorithm() {
            edgelimit::contract::Algorithm::FixedWindow => "f",
            edgelimit::contract::Algorithm::SlidingWindow => "s",
            edgelimit::contract::Algorithm::TokenBucket => "t",
        };
        inv.arg(index)
            .arg(letter)
            .arg(if c.shadow { "1" } else { "0" });
        for a in edgelimit::redis::program_args(c.policy, c.cost) {
            inv.arg(a);
        }
    }
}

fn distinct_keys<'a>(checks: &[CompositeCheck<'a>]) -> Vec<&'a str> {
    let mut keys: Vec<&str> = Vec::new();
    for c in checks {
        if !keys.contains(&c.key) {
            keys.push(c.key);
        }
    }
    keys
}
