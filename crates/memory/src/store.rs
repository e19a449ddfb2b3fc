//! Sharded map of per-subject state with TTL-based eviction and a global cap.
//!
//! Each shard is a `std::sync::Mutex<HashMap>` held only for one synchronous evaluation (no
//! await while locked). Entries past their expiry behave as absent on lookup, so eviction
//! is only about memory and the cap: a shard is swept (one `retain` pass) at most once per
//! [`SWEEP_INTERVAL_MS`] when something in it may have expired, and immediately when a new
//! subject meets the cap.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use edgelimit_algorithm::State;
use edgelimit_contract::{PolicyId, SubjectDigest};

/// Number of shards: a power of two, well above the core counts this runs on, so two
/// requests rarely wait for the same lock.
pub(crate) const SHARDS: usize = 64;

/// Minimum time between two routine sweeps of one shard.
pub(crate) const SWEEP_INTERVAL_MS: u64 = 1_000;

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Key {
    pub policy: PolicyId,
    pub revision: u64,
    pub subject: SubjectDigest,
}

#[derive(Debug)]
pub(crate) struct Entry {
    pub state: State,
    /// Unix ms after which the entry is equivalent to an absent key.
    pub expires_at_ms: u64,
}

impl Entry {
    pub fn live(&self, now_ms: u64) -> Option<&State> {
        (self.expires_at_ms > now_ms).then_some(&self.state)
    }
}

#[derive(Debug, Default)]
pub(crate) struct Shard {
    pub map: HashMap<Key, Entry>,
    /// Lower bound of every entry's expiry (`u64::MAX` when empty).
    earliest_expiry: u64,
    next_sweep_at: u64,
}

/// One shard and the lock-free copy of its earliest expiry, on its own cache line.
#[repr(align(64))]
#[derive(Debug)]
struct Slot {
    shard: Mutex<Shard>,
    earliest_expiry: AtomicU64,
}

#[derive(Debug)]
pub(crate) struct Store {
    slots: Box<[Slot]>,
    tracked: AtomicUsize,
    max_subjects: usize,
}

/// A locked shard, with what it needs to keep the global count and its expiry bound right.
pub(crate) struct Locked<'a> {
    pub shard: MutexGuard<'a, Shard>,
    slot: &'a Slot,
    store: &'a Store,
}

impl Store {
    pub fn new(max_subjects: usize) -> Self {
        let slots = (0..SHARDS)
            .map(|_| Slot {
                shard: Mutex::new(Shard {
                    earliest_expiry: u64::MAX,
                    ..Shard::default()
                }),
                earliest_expiry: AtomicU64::new(u64::MAX),
            })
            .collect();
        Self {
            slots,
            tracked: AtomicUsize::new(0),
            max_subjects,
        }
    }

    /// The digest is an HMAC output, uniformly distributed: its first bytes pick the shard.
    pub fn shard_of(subject: &SubjectDigest) -> usize {
        let b = subject.as_bytes();
        let n = u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]);
        (n % SHARDS as u64) as usize
    }

    /// Locks a shard. A poisoned lock (a panic elsewhere while holding it) still holds plain,
    /// consistent data, so it is used rather than turned into a panic here.
    pub fn lock(&self, index: usize) -> Locked<'_> {
        let slot = &self.slots[index % SHARDS];
        Locked {
            shard: slot.shard.lock().unwrap_or_else(PoisonError::into_inner),
            slot,
            store: self,
        }
    }

    pub fn tracked(&self) -> usize {
        self.tracked.load(Ordering::Relaxed)
    }

    /// Takes one unit of the global cap; false when it is reached.
    fn reserve(&self) -> bool {
        self.tracked
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |n| {
                (n < self.max_subjects).then_some(n + 1)
            })
            .is_ok()
    }

    /// Takes `n` units of the global cap at once, or none; false when they do not fit.
    pub fn reserve_many(&self, n: usize) -> bool {
        n == 0
            || self
                .tracked
                .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |t| {
                    (t.checked_add(n)? <= self.max_subjects).then_some(t + n)
                })
                .is_ok()
    }

    /// Sweeps every shard except `skip` that may hold expired entries. Never called with a
    /// shard locked, so shard locks are never nested.
    pub fn sweep_others(&self, now_ms: u64, skip: Option<usize>) -> usize {
        let mut removed = 0;
        for (i, slot) in self.slots.iter().enumerate() {
            if Some(i) == skip || slot.earliest_expiry.load(Ordering::Relaxed) > now_ms {
                continue;
            }
            removed += self.lock(i).sweep(now_ms);
        }
        removed
    }
}

impl Locked<'_> {
    /// Routine, rate-limited sweep.
    pub fn maybe_sweep(&mut self, now_ms: u64) {
        if now_ms >= self.shard.earliest_expiry && now_ms >= self.shard.next_sweep_at {
            self.sweep(now_ms);
        }
    }

    /// Removes every expired entry; returns how many.
    pub fn sweep(&mut self, now_ms: u64) -> usize {
        if now_ms < self.shard.earliest_expiry {
            return 0;
        }
        let before = self.shard.map.len();
        let mut earliest = u64::MAX;
        self.shard.map.retain(|_, e| {
            let keep = e.expires_at_ms > now_ms;
            if keep {
                earliest = earliest.min(e.expires_at_ms);
            }
            keep
        });
        let removed = before - self.shard.map.len();
        // Give memory back after a burst of subjects has gone.
        if self.shard.map.capacity() > 64 && self.shard.map.len() < self.shard.map.capacity() / 4 {
            self.shard.map.shrink_to_fit();
        }
        self.shard.earliest_expiry = earliest;
        self.shard.next_sweep_at = now_ms.saturating_add(SWEEP_INTERVAL_MS);
        self.slot.earliest_expiry.store(earliest, Ordering::Relaxed);
        self.store.tracked.fetch_sub(removed, Ordering::AcqRel);
        removed
    }

    /// Notes a (new or changed) expiry so sweeps know when to look.
    pub fn note_expiry(&mut self, expires_at_ms: u64) {
        if expires_at_ms < self.shard.earliest_expiry {
            self.shard.earliest_expiry = expires_at_ms;
            self.slot
                .earliest_expiry
                .store(expires_at_ms, Ordering::Relaxed);
        }
    }

    /// Stores `state` under `key`, whose place in the cap was already taken when it is new
    /// ([`Store::reserve_many`]). With `keeps_expiry` a present entry keeps its expiry, as the
    /// Redis programs leave a key's (`algorithm::Write::keeps_expiry`).
    pub fn put(&mut self, key: Key, state: State, expires_at_ms: u64, keeps_expiry: bool) {
        match self.shard.map.get_mut(&key) {
            Some(entry) if keeps_expiry => entry.state = state,
            Some(entry) => {
                entry.state = state;
                entry.expires_at_ms = expires_at_ms;
                self.note_expiry(expires_at_ms);
            }
            None => {
                self.note_expiry(expires_at_ms);
                self.shard.map.insert(
                    key,
                    Entry {
                        state,
                        expires_at_ms,
                    },
                );
            }
        }
    }

    /// Inserts a new subject if the cap allows, reclaiming expired entries of this shard
    /// first when it does not. False: the cap is reached and nothing here is evictable.
    pub fn insert_new(&mut self, key: Key, entry: Entry, now_ms: u64) -> bool {
        if !self.store.reserve() && (self.sweep(now_ms) == 0 || !self.store.reserve()) {
            return false;
        }
        self.note_expiry(entry.expires_at_ms);
        self.shard.map.insert(key, entry);
        true
    }
}
