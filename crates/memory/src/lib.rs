//! Embedded backend: the same three algorithms as the Redis programs ([`edgelimit_algorithm`]),
//! with state in this process. Limits are therefore local to one replica.
//!
//! - State is keyed by (policy id, policy revision, subject digest); a new revision starts
//!   fresh and the old state expires.
//! - The clock is the Unix time captured once at start plus a monotonic [`Instant`] offset,
//!   so it never goes backwards (clock regression cannot happen here).
//! - Every write carries the algorithm's TTL; an entry past it is treated exactly like an
//!   absent key and is evicted by incremental sweeps.
//! - At most [`MemoryConfig::max_subjects`] states are tracked. When the cap is reached and
//!   nothing has expired, a request that would create state for a new subject fails closed
//!   (`Unavailable` / `CapacityExhausted`); subjects already tracked keep working.
#![forbid(unsafe_code)]

mod store;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use edgelimit_algorithm::composite::{self, Held, Mode, PerCheck};
use edgelimit_algorithm::{self as algorithm, outcome_from_reply, ProgramReply, Stored};
use edgelimit_contract::{
    BackendReadiness, CompositeOutcome, CompositeRequest, DecisionSource, IncompatibleCause,
    RateLimitOutcome, RateLimitPolicy, RateLimitPort, RateLimitRequest, UnavailableCause,
};
use store::{Entry, KeyRef, Lookup, Store};

/// Settings of the embedded backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryConfig {
    /// Most (policy, revision, subject) states kept at once; bounds memory (roughly 150 bytes
    /// per state). When reached, expired states are evicted first; if none, a new subject is
    /// refused with `CapacityExhausted` rather than allowed. Default 1,000,000.
    pub max_subjects: usize,
    /// `retry_after` reported with `Unavailable` outcomes (capacity exhausted, unsafe clock).
    /// Default 1 s.
    pub retry_after: Duration,
}

impl MemoryConfig {
    pub const DEFAULT_MAX_SUBJECTS: usize = 1_000_000;
    pub const DEFAULT_RETRY_AFTER: Duration = Duration::from_secs(1);
}

impl Default for MemoryConfig {
    fn default() -> Self {
        Self {
            max_subjects: Self::DEFAULT_MAX_SUBJECTS,
            retry_after: Self::DEFAULT_RETRY_AFTER,
        }
    }
}

/// Wall-clock milliseconds that never go backwards: Unix time read once, then a monotonic
/// offset.
#[derive(Debug, Clone, Copy)]
struct Clock {
    unix_at_start_ms: u64,
    start: Instant,
}

impl Clock {
    fn new() -> Self {
        let unix = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or(Duration::ZERO);
        Self {
            unix_at_start_ms: u64::try_from(unix.as_millis()).unwrap_or(u64::MAX),
            start: Instant::now(),
        }
    }

    fn now_ms(&self) -> u64 {
        let offset = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.unix_at_start_ms.saturating_add(offset)
    }
}

/// The in-process [`RateLimitPort`].
#[derive(Debug)]
pub struct MemoryBackend {
    config: MemoryConfig,
    clock: Clock,
    store: Store,
    capacity_rejections: AtomicU64,
}

impl Default for MemoryBackend {
    fn default() -> Self {
        Self::new(MemoryConfig::default())
    }
}

impl MemoryBackend {
    pub fn new(config: MemoryConfig) -> Self {
        Self {
            store: Store::new(config.max_subjects),
            config,
            clock: Clock::new(),
            capacity_rejections: AtomicU64::new(0),
        }
    }

    pub fn config(&self) -> &MemoryConfig {
        &self.config
    }

    /// How many new subjects were refused because the cap was reached (for metrics).
    pub fn capacity_rejections(&self) -> u64 {
        self.capacity_rejections.load(Ordering::Relaxed)
    }

    /// States currently held, including expired ones not swept yet.
    pub fn tracked_subjects(&self) -> usize {
        self.store.tracked()
    }

    /// Evicts every expired state now; returns how many. Optional: evaluations sweep
    /// incrementally by themselves.
    pub fn sweep_expired(&self) -> usize {
        self.store.sweep_others(self.clock.now_ms(), None)
    }

    /// The port's evaluation, synchronously (it never waits on anything but a shard lock).
    pub fn decide(&self, policy: &RateLimitPolicy, request: &RateLimitRequest) -> RateLimitOutcome {
        if request.check_policy(policy).is_err() {
            return RateLimitOutcome::Incompatible {
                policy_id: policy.id().clone(),
                cause: IncompatibleCause::PolicyMismatch,
            };
        }
        let cost = request.cost().units();
        let at = self.store.lookup(KeyRef {
            policy: policy.id(),
            revision: policy.revision(),
            subject: request.subject(),
        });
        let index = at.shard();
        // The second attempt follows a sweep of the other shards when the cap was reached.
        for attempt in 0..2 {
            let mut locked = self.store.lock(index);
            // Read under the lock: evaluations of one shard then see non-decreasing times,
            // so a request that waited for the lock never looks like clock regression.
            let now = self.clock.now_ms();
            locked.maybe_sweep(now);
            if let Some(entry) = locked.get_mut(&at) {
                let e = algorithm::evaluate(policy, entry.live(now).into(), now, cost);
                if let Some(w) = e.write {
                    entry.state = w.state;
                    // As the Redis programs: a write in the held window leaves the expiry.
                    if !w.keeps_expiry {
                        entry.expires_at_ms = now.saturating_add(w.ttl_ms);
                        let expires = entry.expires_at_ms;
                        locked.note_expiry(expires);
                    }
                }
                return self.outcome(policy, e.reply);
            }
            let e = algorithm::evaluate(policy, Stored::Absent, now, cost);
            let Some(w) = e.write else {
                return self.outcome(policy, e.reply);
            };
            let entry = Entry {
                state: w.state,
                expires_at_ms: now.saturating_add(w.ttl_ms),
            };
            if locked.insert_new(&at, entry, now) {
                return self.outcome(policy, e.reply);
            }
            drop(locked);
            if attempt > 0 || self.store.sweep_others(now, Some(index)) == 0 {
                break;
            }
        }
        self.capacity_rejections.fetch_add(1, Ordering::Relaxed);
        self.capacity_exhausted(policy)
    }

    fn outcome(&self, policy: &RateLimitPolicy, reply: ProgramReply) -> RateLimitOutcome {
        outcome_from_reply(
            &reply,
            policy,
            DecisionSource::LocalMemory,
            self.config.retry_after,
        )
    }

    fn capacity_exhausted(&self, policy: &RateLimitPolicy) -> RateLimitOutcome {
        RateLimitOutcome::Unavailable {
            policy_id: policy.id().clone(),
            retry_after: self.config.retry_after,
            cause: UnavailableCause::CapacityExhausted,
        }
    }

    /// Every limit of one request, decided together (`algorithm::composite`): the shards of
    /// its keys are locked in ascending order (never nested otherwise, so never a deadlock),
    /// the states read, decided, and — when admitted — written back, all under the locks.
    pub fn decide_all(&self, request: &CompositeRequest<'_>) -> CompositeOutcome {
        let checks = request.checks();
        let mut keys: PerCheck<Lookup<'_>> = PerCheck::with_capacity(checks.len());
        let mut key_of: PerCheck<usize> = PerCheck::with_capacity(checks.len());
        for check in checks {
            let key = KeyRef {
                policy: check.policy().id(),
                revision: check.policy().revision(),
                subject: check.subject(),
            };
            let index = keys.iter().position(|k| k.key == key).unwrap_or_else(|| {
                keys.push(self.store.lookup(key));
                keys.len() - 1
            });
            key_of.push(index);
        }
        let mut shards: PerCheck<usize> = keys.iter().map(Lookup::shard).collect();
        shards.sort_unstable();
        shards.dedup();
        let program_checks: PerCheck<composite::Check<'_>> = checks
            .iter()
            .zip(&key_of)
            .map(|(check, &key)| composite::Check {
                policy: check.policy(),
                key,
                cost: check.cost().units(),
                shadow: check.is_shadow(),
            })
            .collect();

        // The second attempt follows a sweep of every shard when the cap was reached.
        for attempt in 0..2 {
            let mut locked: PerCheck<_> = shards.iter().map(|&i| self.store.lock(i)).collect();
            let shard_slot = |key: &Lookup<'_>| {
                let shard = key.shard();
                shards.iter().position(|&s| s == shard).unwrap_or(0)
            };
            // Read under the locks: see `decide`.
            let now = self.clock.now_ms();
            for l in locked.iter_mut() {
                l.maybe_sweep(now);
            }
            let held: PerCheck<Held> = keys
                .iter()
                .map(
                    |key| match locked[shard_slot(key)].get(key).and_then(|e| e.live(now)) {
                        Some(state) => Held::Present(*state),
                        None => Held::Absent,
                    },
                )
                .collect();
            let decided = composite::decide(&program_checks, &held, now, Mode::Commit);
            // Keys not in the map take a place in the cap (an expired entry still holds one).
            let new_subjects = decided
                .writes
                .iter()
                .zip(&keys)
                .filter(|(w, key)| w.is_some() && !locked[shard_slot(key)].contains(key))
                .count();
            if self.store.reserve_many(new_subjects) {
                for (key, write) in keys.iter().zip(&decided.writes) {
                    let Some(w) = write else { continue };
                    let l = &mut locked[shard_slot(key)];
                    let expires_at_ms = now.saturating_add(w.ttl_ms);
                    l.put(key, w.state, expires_at_ms, w.keeps_expiry);
                }
                return CompositeOutcome::new(
                    checks
                        .iter()
                        .zip(decided.replies)
                        .map(|(check, reply)| self.outcome(check.policy(), reply))
                        .collect(),
                );
            }
            drop(locked);
            if attempt > 0 || self.store.sweep_others(now, None) == 0 {
                break;
            }
        }
        self.capacity_rejections.fetch_add(1, Ordering::Relaxed);
        CompositeOutcome::uniform(request, |policy| self.capacity_exhausted(policy))
    }
}

impl RateLimitPort for MemoryBackend {
    fn evaluate_all(
        &self,
        request: &CompositeRequest<'_>,
    ) -> impl std::future::Future<Output = CompositeOutcome> + Send {
        // Nothing to wait for: decide now, hand back a ready future.
        std::future::ready(self.decide_all(request))
    }

    fn evaluate(
        &self,
        policy: &RateLimitPolicy,
        request: &RateLimitRequest,
    ) -> impl std::future::Future<Output = RateLimitOutcome> + Send {
        std::future::ready(self.decide(policy, request))
    }

    fn readiness(&self) -> impl std::future::Future<Output = BackendReadiness> + Send {
        std::future::ready(BackendReadiness::Ready)
    }

    fn describe(&self) -> String {
        format!(
            "memory (in-process; limits are local to this process, not shared between replicas; \
             at most {} subjects)",
            self.config.max_subjects
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use edgelimit_contract::{AlgorithmParams, Cost, PolicyId, SubjectDigest};

    fn policy(params: AlgorithmParams, revision: u64) -> RateLimitPolicy {
        RateLimitPolicy::new(PolicyId::new("mem").unwrap(), revision, params, 100, 0, 0).unwrap()
    }

    fn request(p: &RateLimitPolicy, subject: u8, cost: u64) -> RateLimitRequest {
        let cost = if cost == 0 {
            Cost::Peek
        } else {
            Cost::consume(cost).unwrap()
        };
        RateLimitRequest::new(
            p,
            SubjectDigest::from_bytes([subject; 32]),
            cost,
            None,
            Instant::now() + Duration::from_secs(5),
        )
        .unwrap()
    }

    #[test]
    fn clock_is_unix_ms_and_monotonic() {
        let c = Clock::new();
        let a = c.now_ms();
        assert!(a > 1_600_000_000_000);
        assert!(c.now_ms() >= a);
    }

    #[test]
    fn a_new_revision_starts_fresh() {
        let params = AlgorithmParams::FixedWindow {
            limit: 1,
            window_ms: 3_600_000,
        };
        let m = MemoryBackend::default();
        let (r1, r2) = (policy(params, 1), policy(params, 2));
        assert!(m.decide(&r1, &request(&r1, 1, 1)).is_allowed());
        assert!(!m.decide(&r1, &request(&r1, 1, 1)).is_allowed());
        assert!(m.decide(&r2, &request(&r2, 1, 1)).is_allowed());
        assert_eq!(m.tracked_subjects(), 2);
    }

    #[test]
    fn another_algorithm_under_the_same_revision_fails_closed() {
        let m = MemoryBackend::default();
        let fixed = policy(
            AlgorithmParams::FixedWindow {
                limit: 5,
                window_ms: 3_600_000,
            },
            1,
        );
        let bucket = policy(
            AlgorithmParams::TokenBucket {
                capacity: 5,
                refill_tokens: 1,
                refill_period_ms: 1000,
            },
            1,
        );
        assert!(m.decide(&fixed, &request(&fixed, 3, 1)).is_allowed());
        assert_eq!(
            m.decide(&bucket, &request(&bucket, 3, 1)),
            RateLimitOutcome::Incompatible {
                policy_id: bucket.id().clone(),
                cause: IncompatibleCause::StateIncompatible,
            }
        );
    }

    #[test]
    fn sweep_reclaims_expired_states() {
        let m = MemoryBackend::default();
        let p = policy(
            AlgorithmParams::FixedWindow {
                limit: 5,
                window_ms: 1,
            },
            1,
        );
        for s in 0..50 {
            assert!(m.decide(&p, &request(&p, s, 1)).is_allowed());
        }
        assert_eq!(m.tracked_subjects(), 50);
        std::thread::sleep(Duration::from_millis(5));
        assert_eq!(m.sweep_expired(), 50);
        assert_eq!(m.tracked_subjects(), 0);
    }
}
