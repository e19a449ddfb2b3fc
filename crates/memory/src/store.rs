//! Sharded map of per-subject state with TTL-based eviction and a global cap.
//!
//! Each shard is a `std::sync::Mutex` over a hash table, held only for one synchronous
//! evaluation (no await while locked). A key is hashed once per request and looked up
//! borrowed ([`Lookup`]): the owned [`Key`] is built only when a new subject is inserted.
//! Entries past their expiry behave as absent on lookup, so eviction is only about memory and
//! the cap: a shard is swept (one `retain` pass) at most once per [`SWEEP_INTERVAL_MS`] when
//! something in it may have expired, and immediately when a new subject meets the cap.

use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use edgelimit_algorithm::State;
use edgelimit_contract::{PolicyId, SubjectDigest};
use hashbrown::HashTable;

/// Number of shards: a power of two, well above the core counts this runs on, so two
/// requests rarely wait for the same lock.
pub(crate) const SHARDS: usize = 64;

/// Minimum time between two routine sweeps of one shard.
pub(crate) const SWEEP_INTERVAL_MS: u64 = 1_000;

#[derive(Debug)]
pub(crate) struct Key {
    policy: PolicyId,
    revision: u64,
    subject: SubjectDigest,
}

/// A key borrowed from the request. Building an owned [`Key`] per lookup would clone the
/// policy id's `Arc`: an atomic write on a cache line every thread deciding that policy shares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct KeyRef<'a> {
    pub policy: &'a PolicyId,
    pub revision: u64,
    pub subject: &'a SubjectDigest,
}

impl KeyRef<'_> {
    fn matches(&self, key: &Key) -> bool {
        key.subject == *self.subject && key.revision == self.revision && key.policy == *self.policy
    }
}

/// A key with its hash, computed once for every step of one evaluation (lookup, cap check,
/// write).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Lookup<'a> {
    pub key: KeyRef<'a>,
    hash: u64,
}

impl Lookup<'_> {
    /// The shard: the digest is an HMAC output, uniformly distributed, so its first bytes do.
    pub fn shard(&self) -> usize {
        Store::shard_of(self.key.subject)
    }
}

/// One stored state with its key and hash (kept, so growing or shrinking a table rehashes
/// nothing).
#[derive(Debug)]
struct Record {
    key: Key,
    hash: u64,
    entry: Entry,
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
    table: HashTable<Record>,
    /// This shard's own copy of every policy id its entries hold ([`PolicyId::separate_copy`]).
    /// A new entry clones the copy, under this shard's lock: cloning the request's id instead
    /// would write a reference count that every thread deciding that policy shares.
    policies: HashTable<PolicyId>,
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
    /// Seeded per process. The digests are keyed HMACs a client cannot choose, so a fast
    /// hash (not SipHash) is safe here.
    hasher: foldhash::fast::RandomState,
}

/// A locked shard, with what it needs to keep the global count and its expiry bound right.
pub(crate) struct Locked<'a> {
    shard: MutexGuard<'a, Shard>,
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
            hasher: foldhash::fast::RandomState::default(),
        }
    }

    pub fn lookup<'a>(&self, key: KeyRef<'a>) -> Lookup<'a> {
        Lookup {
            key,
            hash: self.hasher.hash_one(key),
        }
    }

    /// The digest is an HMAC output, uniformly distributed: its first bytes pick the shard.
    fn shard_of(subject: &SubjectDigest) -> usize {
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
        let table = &mut self.shard.table;
        let before = table.len();
        let mut earliest = u64::MAX;
        table.retain(|r| {
            let keep = r.entry.expires_at_ms > now_ms;
            if keep {
                earliest = earliest.min(r.entry.expires_at_ms);
            }
            keep
        });
        let removed = before - table.len();
        // Give memory back after a burst of subjects has gone.
        if table.capacity() > 64 && table.len() < table.capacity() / 4 {
            table.shrink_to_fit(|r| r.hash);
        }
        if removed > 0 {
            // A copy that only this list holds belongs to no entry any more.
            self.shard.policies.retain(|p| !p.is_sole_holder());
        }
        self.shard.earliest_expiry = earliest;
        self.shard.next_sweep_at = now_ms.saturating_add(SWEEP_INTERVAL_MS);
        self.slot.earliest_expiry.store(earliest, Ordering::Relaxed);
        self.store.tracked.fetch_sub(removed, Ordering::AcqRel);
        removed
    }

    pub fn get(&self, at: &Lookup<'_>) -> Option<&Entry> {
        self.shard
            .table
            .find(at.hash, |r| at.key.matches(&r.key))
            .map(|r| &r.entry)
    }

    pub fn get_mut(&mut self, at: &Lookup<'_>) -> Option<&mut Entry> {
        self.shard
            .table
            .find_mut(at.hash, |r| at.key.matches(&r.key))
            .map(|r| &mut r.entry)
    }

    pub fn contains(&self, at: &Lookup<'_>) -> bool {
        self.get(at).is_some()
    }

    /// Adds an entry known to be absent.
    fn insert_absent(&mut self, at: &Lookup<'_>, entry: Entry) {
        self.note_expiry(entry.expires_at_ms);
        let key = Key {
            policy: self.shard_policy(at.key.policy),
            revision: at.key.revision,
            subject: *at.key.subject,
        };
        self.shard.table.insert_unique(
            at.hash,
            Record {
                key,
                hash: at.hash,
                entry,
            },
            |r| r.hash,
        );
    }

    /// A clone of this shard's copy of `policy`, made on first use.
    fn shard_policy(&mut self, policy: &PolicyId) -> PolicyId {
        let hasher = &self.store.hasher;
        self.shard
            .policies
            .entry(
                hasher.hash_one(policy),
                |p| p == policy,
                |p| hasher.hash_one(p),
            )
            .or_insert_with(|| policy.separate_copy())
            .get()
            .clone()
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
    pub fn put(&mut self, at: &Lookup<'_>, state: State, expires_at_ms: u64, keeps_expiry: bool) {
        match self.get_mut(at) {
            Some(entry) if keeps_expiry => entry.state = state,
            Some(entry) => {
                entry.state = state;
                entry.expires_at_ms = expires_at_ms;
                self.note_expiry(expires_at_ms);
            }
            None => self.insert_absent(
                at,
                Entry {
                    state,
                    expires_at_ms,
                },
            ),
        }
    }

    /// Inserts a new subject if the cap allows, reclaiming expired entries of this shard
    /// first when it does not. False: the cap is reached and nothing here is evictable.
    pub fn insert_new(&mut self, at: &Lookup<'_>, entry: Entry, now_ms: u64) -> bool {
        if !self.store.reserve() && (self.sweep(now_ms) == 0 || !self.store.reserve()) {
            return false;
        }
        self.insert_absent(at, entry);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use edgelimit_algorithm::fixed_window;

    fn state(consumed: u64) -> State {
        State::FixedWindow(fixed_window::State {
            last_observed_ms: 0,
            window_id: 0,
            consumed,
        })
    }

    fn consumed(entry: Option<&Entry>) -> Option<u64> {
        match entry?.state {
            State::FixedWindow(s) => Some(s.consumed),
            _ => None,
        }
    }

    /// One subject's key under `revision` (one shard for every revision).
    fn at_revision<'a>(
        store: &Store,
        policy: &'a PolicyId,
        subject: &'a SubjectDigest,
        revision: u64,
    ) -> Lookup<'a> {
        store.lookup(KeyRef {
            policy,
            revision,
            subject,
        })
    }

    #[test]
    fn a_key_is_found_only_under_its_own_policy_revision_and_subject() {
        let store = Store::new(100);
        let (a, b) = (PolicyId::new("a").unwrap(), PolicyId::new("b").unwrap());
        let (s1, s2) = (
            SubjectDigest::from_bytes([1; 32]),
            SubjectDigest::from_bytes([2; 32]),
        );
        let key = |policy, revision, subject| KeyRef {
            policy,
            revision,
            subject,
        };
        let at = store.lookup(key(&a, 1, &s1));
        let mut locked = store.lock(at.shard());
        locked.put(&at, state(7), 1_000, false);
        assert_eq!(consumed(locked.get(&at)), Some(7));
        // A lookup built afresh (its own borrow of an equal id) finds the same entry.
        let same_id = PolicyId::new("a").unwrap();
        assert_eq!(
            consumed(locked.get(&store.lookup(key(&same_id, 1, &s1)))),
            Some(7)
        );
        for other in [key(&b, 1, &s1), key(&a, 2, &s1)] {
            assert!(!locked.contains(&store.lookup(other)));
        }
        drop(locked);
        let elsewhere = store.lookup(key(&a, 1, &s2));
        assert!(!store.lock(elsewhere.shard()).contains(&elsewhere));
    }

    #[test]
    fn entries_hold_the_shards_copy_of_a_policy_id_until_they_are_swept() {
        let store = Store::new(100);
        let policy = PolicyId::new("p").unwrap();
        let subject = SubjectDigest::from_bytes([3; 32]);
        let at = |revision| at_revision(&store, &policy, &subject, revision);
        let mut locked = store.lock(at(0).shard());
        for (revision, expires_at_ms) in [(0, 10), (1, 1_000)] {
            let entry = Entry {
                state: state(revision),
                expires_at_ms,
            };
            assert!(locked.insert_new(&at(revision), entry, 0));
        }
        assert!(
            policy.is_sole_holder(),
            "entries must not clone the request's id"
        );
        assert_eq!(locked.shard.policies.len(), 1, "one copy for both entries");
        assert_eq!(locked.sweep(20), 1);
        assert_eq!(locked.shard.policies.len(), 1, "revision 1 still holds it");
        assert_eq!(consumed(locked.get(&at(1))), Some(1));
        assert_eq!(locked.sweep(2_000), 1);
        assert!(
            locked.shard.policies.is_empty(),
            "no entry holds it any more"
        );
    }

    #[test]
    fn entries_survive_growth_and_shrinking_and_expired_ones_are_swept() {
        let store = Store::new(10_000);
        let policy = PolicyId::new("p").unwrap();
        let subject = SubjectDigest::from_bytes([0; 32]);
        let at = |revision| at_revision(&store, &policy, &subject, revision);
        // One shard (one subject), many revisions: the table grows well past 64 slots.
        let mut locked = store.lock(at(0).shard());
        for revision in 0..1_000 {
            let expires = if revision < 990 { 10 } else { 1_000 };
            assert!(locked.insert_new(
                &at(revision),
                Entry {
                    state: state(revision),
                    expires_at_ms: expires,
                },
                0
            ));
        }
        assert_eq!(locked.sweep(20), 990);
        assert_eq!(store.tracked(), 10);
        // The sweep shrank the table; what is left is found by its stored hash.
        for revision in 990..1_000 {
            assert_eq!(consumed(locked.get(&at(revision))), Some(revision));
        }
        assert!(!locked.contains(&at(0)));
    }
}
