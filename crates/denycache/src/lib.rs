//! Exact local denials in front of a shared backend.
//!
//! Every decision says what its subject has left and, when denied, the earliest moment the
//! denied cost could pass — assuming no other traffic. Other replicas only ever consume, so
//! the room a subject has can only be smaller than that bound until the moment passes. This
//! port keeps, per (policy, subject), the smallest cost known not to pass and until when, and
//! answers a request whose every limit it knows, and one of whose enforced limits cannot pass,
//! without asking the backend: denied, with the status fields and `Retry-After` of the last
//! answer. It never allows locally; a request it cannot answer exactly goes to the backend.
//!
//! What a decision tells, per algorithm:
//! - a denial (any algorithm): costs at least the denied one cannot pass before the decision's
//!   `retry_after` has elapsed (exact for all three: the programs compute the earliest moment
//!   on their own state, and other traffic only delays it);
//! - a fixed window with `r` left (allowed or denied): costs above `r` cannot pass before the
//!   window ends;
//! - anything else is kept only to report a status (never to deny) for a short while.
//!
//! A request's answers are kept only when one of its enforced limits would deny the same cost
//! again (the rest of its limits then for their status); otherwise only what is already held
//! is refreshed. Distinct subjects with room to spare, the bulk of the traffic, cost nothing.
//!
//! Times are measured from when the request was sent, which is before the backend decided, so
//! a bound never outlives its truth. Entries are keyed by policy id and revision and checked
//! against the policy's limit, so a reload that changes the limit invalidates them. Memory is
//! bounded: at most `max_entries` entries (about [`ENTRY_BYTES`] each), expired ones dropped
//! first.

#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use edgelimit_contract::{
    Algorithm, BackendReadiness, CompositeOutcome, CompositeRequest, LimitCheck, PolicyId,
    RateLimitDecision, RateLimitOutcome, RateLimitPort, SubjectDigest,
};

/// Approximate memory one entry holds (key, entry, map overhead).
pub const ENTRY_BYTES: usize = 160;
const SHARDS: usize = 16;
/// How long what a decision said about a limit that cannot deny locally (an allowed token
/// bucket or sliding window, a shadow limit) is kept to report its status.
const STATUS_TTL: Duration = Duration::from_secs(1);

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DenyCacheSettings {
    pub enabled: bool,
    /// Entries kept at most; beyond it, expired ones and then arbitrary ones are evicted.
    pub max_entries: usize,
}

impl Default for DenyCacheSettings {
    fn default() -> Self {
        Self {
            enabled: true,
            max_entries: 100_000,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Key {
    policy: PolicyId,
    revision: u64,
    subject: SubjectDigest,
}

#[derive(Debug, Clone)]
struct Entry {
    /// The policy's limit when this was learned: another limit invalidates it.
    limit: u64,
    /// Costs at least this cannot pass before `until` (`u64::MAX`: nothing known).
    denies_from: u64,
    until: Instant,
    remaining: u64,
    /// When the full quota is back, as the decision said.
    reset_at: Instant,
    certainty: edgelimit_contract::Certainty,
    source: edgelimit_contract::DecisionSource,
}

/// One lock's part of the cache.
#[derive(Default)]
struct Shard {
    map: HashMap<Key, Entry>,
    /// New keys since the last sweep for expired entries (see `insert`).
    inserts_since_sweep: usize,
}

/// A [`RateLimitPort`] that answers locally what it knows cannot pass, and asks `inner`
/// otherwise.
pub struct DenyCache<B> {
    inner: Arc<B>,
    settings: DenyCacheSettings,
    shards: Box<[Mutex<Shard>]>,
    entries: AtomicUsize,
    /// Handles taken when the cache is built (after the recorder is installed).
    hits: metrics::Counter,
    evictions: metrics::Counter,
    size: metrics::Gauge,
}

impl<B: RateLimitPort> DenyCache<B> {
    pub fn new(inner: Arc<B>, settings: DenyCacheSettings) -> Self {
        Self {
            inner,
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
            settings,
            entries: AtomicUsize::new(0),
            hits: metrics::counter!(edgelimit_metrics::DENY_CACHE_HITS),
            evictions: metrics::counter!(edgelimit_metrics::DENY_CACHE_EVICTIONS),
            size: metrics::gauge!(edgelimit_metrics::DENY_CACHE_ENTRIES),
        }
    }

    pub fn inner(&self) -> &Arc<B> {
        &self.inner
    }

    /// Entries held now (some may have expired and not been dropped yet).
    pub fn len(&self) -> usize {
        self.entries.load(Ordering::Relaxed)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn shard(&self, subject: &SubjectDigest) -> &Mutex<Shard> {
        let b = subject.as_bytes();
        &self.shards[usize::from(b[31]) % SHARDS]
    }

    fn key(check: &LimitCheck<'_>) -> Key {
        Key {
            policy: check.policy().id().clone(),
            revision: check.policy().revision(),
            subject: *check.subject(),
        }
    }

    /// The local answer, if every check is known and an enforced one cannot pass.
    fn local_answer(
        &self,
        request: &CompositeRequest<'_>,
        now: Instant,
    ) -> Option<CompositeOutcome> {
        if self.is_empty() {
            return None;
        }
        // Allocated only once an entry is found: most requests find none.
        let mut known = Vec::new();
        let mut denied = false;
        for check in request.checks() {
            let entry = {
                let shard = self
                    .shard(check.subject())
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                shard.map.get(&Self::key(check)).cloned()
            }?;
            if entry.until <= now || entry.limit != check.policy().params().limit() {
                return None;
            }
            // A peek asks whether one more unit would pass.
            let cost = check.cost().units().max(1);
            let cannot_pass = cost >= entry.denies_from;
            denied |= cannot_pass && !check.is_shadow();
            known.push((entry, cannot_pass));
        }
        if !denied {
            return None;
        }
        let unix_now = unix_ms();
        let outcomes = request
            .checks()
            .iter()
            .zip(known)
            .map(|(check, (entry, cannot_pass))| {
                let policy = check.policy();
                let reset_after = entry.reset_at.saturating_duration_since(now);
                RateLimitOutcome::Evaluated(RateLimitDecision {
                    allowed: !cannot_pass,
                    limit: entry.limit,
                    remaining: entry.remaining,
                    retry_after: if cannot_pass {
                        entry.until.saturating_duration_since(now)
                    } else {
                        Duration::ZERO
                    },
                    reset_at_ms: unix_now.saturating_add(reset_after.as_millis() as u64),
                    decided_at_ms: unix_now,
                    policy_id: policy.id().clone(),
                    policy_revision: policy.revision(),
                    source: entry.source,
                    certainty: entry.certainty,
                })
            })
            .collect();
        Some(CompositeOutcome::new(outcomes))
    }

    /// Learns from the backend's answer to a request sent at `sent`.
    ///
    /// What it learns is kept only when it lets the same request be answered here next time:
    /// an enforced limit of it would deny its cost again (then every limit's entry is kept,
    /// the others to report their status). A decision with room to spare proves nothing a
    /// local answer could use, and storing one per distinct subject filled the cache with
    /// entries that never deny. What is already held for the request's limits is refreshed
    /// all the same. Not keeping a bound is always safe: the backend is asked.
    fn learn(&self, request: &CompositeRequest<'_>, outcome: &CompositeOutcome, sent: Instant) {
        let now = Instant::now();
        let bounds =
            || {
                request.checks().iter().zip(outcome.outcomes()).filter_map(
                    move |(check, outcome)| match outcome {
                        RateLimitOutcome::Evaluated(d) => {
                            let (denies_from, until) = Self::bound(check, d, sent);
                            (until > now).then_some((check, d, denies_from, until))
                        }
                        _ => None,
                    },
                )
            };
        let useful = bounds().any(|(check, _, denies_from, _)| {
            !check.is_shadow() && check.cost().units().max(1) >= denies_from
        });
        if !useful && self.is_empty() {
            return;
        }
        for (check, d, denies_from, until) in bounds() {
            let entry = Entry {
                limit: d.limit,
                denies_from,
                until,
                remaining: d.remaining,
                reset_at: sent + d.reset_after(),
                certainty: d.certainty,
                source: d.source,
            };
            if useful {
                self.insert(Self::key(check), entry);
            } else {
                self.refresh(&Self::key(check), entry);
            }
        }
    }

    /// What a decision proves: costs at least the first number cannot pass before the instant.
    fn bound(check: &LimitCheck<'_>, d: &RateLimitDecision, sent: Instant) -> (u64, Instant) {
        if check.policy().algorithm() == Algorithm::FixedWindow {
            // Nothing comes back before the window ends: more than what is left cannot pass.
            (d.remaining.saturating_add(1), sent + d.reset_after())
        } else if !d.allowed {
            (check.cost().units().max(1), sent + d.retry_after)
        } else {
            (u64::MAX, sent + STATUS_TTL.min(d.reset_after()))
        }
    }

    /// Replaces what is held for `key`, if anything.
    fn refresh(&self, key: &Key, entry: Entry) {
        let mut shard = self
            .shard(&key.subject)
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(held) = shard.map.get_mut(key) {
            *held = entry;
        }
    }

    fn insert(&self, key: Key, entry: Entry) {
        let per_shard = (self.settings.max_entries / SHARDS).max(1);
        let mut shard = self
            .shard(&key.subject)
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if shard.map.len() >= per_shard {
            if let Some(held) = shard.map.get_mut(&key) {
                *held = entry;
                return;
            }
            let mut evicted = 0;
            // A sweep for expired entries visits the whole shard: at most once per quarter of
            // its size in new keys, so a new key in a full cache costs O(1) amortised (a sweep
            // on every one cost a full cache's server twice the CPU per request).
            if shard.inserts_since_sweep >= per_shard / 4 {
                let now = Instant::now();
                let before = shard.map.len();
                shard.map.retain(|_, e| e.until > now);
                evicted = before - shard.map.len();
                shard.inserts_since_sweep = 0;
            }
            if shard.map.len() >= per_shard {
                if let Some(victim) = shard.map.keys().next().cloned() {
                    shard.map.remove(&victim);
                    evicted += 1;
                }
            }
            self.entries.fetch_sub(evicted, Ordering::Relaxed);
            self.evictions.increment(evicted as u64);
        }
        if shard.map.insert(key, entry).is_none() {
            shard.inserts_since_sweep += 1;
            self.entries.fetch_add(1, Ordering::Relaxed);
        }
        self.size.set(self.entries.load(Ordering::Relaxed) as f64);
    }
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl<B: RateLimitPort> RateLimitPort for DenyCache<B> {
    async fn evaluate_all(&self, request: &CompositeRequest<'_>) -> CompositeOutcome {
        if !self.settings.enabled {
            return self.inner.evaluate_all(request).await;
        }
        let sent = Instant::now();
        if let Some(answer) = self.local_answer(request, sent) {
            self.hits.increment(1);
            return answer;
        }
        let outcome = self.inner.evaluate_all(request).await;
        self.learn(request, &outcome, sent);
        outcome
    }

    async fn readiness(&self) -> BackendReadiness {
        self.inner.readiness().await
    }

    fn describe(&self) -> String {
        if self.settings.enabled {
            format!(
                "{}, local denials for subjects that cannot pass (at most {} entries)",
                self.inner.describe(),
                self.settings.max_entries
            )
        } else {
            self.inner.describe()
        }
    }
}

#[cfg(test)]
mod tests;
