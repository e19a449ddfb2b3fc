//! Recent demand of every live instance, per limit and subject: the weights the remaining
//! quota is split by. An instance's entry lives one assignment TTL past its last report, so
//! an instance that vanishes keeps its share reserved exactly as long as its last assignment
//! may still be enforced, and then its share returns to the pool.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use edgelimit_contract::{PolicyId, SubjectDigest};

type PoolKey = (PolicyId, SubjectDigest);

#[derive(Debug, Clone, Copy)]
struct Entry {
    /// Requests per second (allowed and denied: what the instance's clients asked for).
    rate: f64,
    expires: Instant,
}

/// Pools of demand. Bounded by what is live: one entry per (stream, bucket, limit) reported
/// within a TTL, and each stream's buckets are bounded.
#[derive(Debug, Default)]
pub struct DemandPools {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    pools: HashMap<PoolKey, HashMap<u64, Entry>>,
    updates: u64,
}

/// Expired pools are swept every this many updates.
const SWEEP_EVERY: u64 = 256;

impl DemandPools {
    /// Records `instance`'s demand `rate` for the limit and subject, and returns its weight:
    /// its rate over the live instances' total (an equal split when nobody asks for anything).
    pub fn weigh(
        &self,
        policy: &PolicyId,
        subject: &SubjectDigest,
        instance: u64,
        rate: f64,
        now: Instant,
        ttl: Duration,
    ) -> f64 {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.updates = state.updates.wrapping_add(1);
        if state.updates % SWEEP_EVERY == 0 {
            state.pools.retain(|_, pool| {
                pool.retain(|_, e| e.expires > now);
                !pool.is_empty()
            });
        }
        let pool = state.pools.entry((policy.clone(), *subject)).or_default();
        pool.retain(|_, e| e.expires > now);
        let rate = if rate.is_finite() { rate.max(0.0) } else { 0.0 };
        pool.insert(
            instance,
            Entry {
                rate,
                expires: now + ttl,
            },
        );
        let total: f64 = pool.values().map(|e| e.rate).sum();
        if total > 0.0 {
            rate / total
        } else {
            1.0 / pool.len() as f64
        }
    }

    /// Pools with at least one live instance (for tests and the bound).
    pub fn pools(&self) -> usize {
        self.state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pools
            .len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> (PolicyId, SubjectDigest) {
        (
            PolicyId::new("p").unwrap(),
            SubjectDigest::from_bytes([1; 32]),
        )
    }

    #[test]
    fn weights_follow_demand_and_vanished_instances_return_their_share() {
        let pools = DemandPools::default();
        let (p, s) = key();
        let t0 = Instant::now();
        let ttl = Duration::from_secs(1);
        assert_eq!(pools.weigh(&p, &s, 1, 30.0, t0, ttl), 1.0);
        let w2 = pools.weigh(&p, &s, 2, 10.0, t0, ttl);
        assert!((w2 - 0.25).abs() < 1e-9);
        let w1 = pools.weigh(&p, &s, 1, 30.0, t0, ttl);
        assert!((w1 - 0.75).abs() < 1e-9);
        // Instance 2 stops reporting: after one TTL its share is back.
        let later = t0 + Duration::from_millis(1500);
        assert_eq!(pools.weigh(&p, &s, 1, 30.0, later, ttl), 1.0);
    }

    #[test]
    fn no_demand_splits_evenly_and_bad_rates_count_as_none() {
        let pools = DemandPools::default();
        let (p, s) = key();
        let t0 = Instant::now();
        let ttl = Duration::from_secs(1);
        pools.weigh(&p, &s, 1, 0.0, t0, ttl);
        assert_eq!(pools.weigh(&p, &s, 2, f64::NAN, t0, ttl), 0.5);
    }

    #[test]
    fn expired_pools_are_swept() {
        let pools = DemandPools::default();
        let (p, _) = key();
        let t0 = Instant::now();
        let ttl = Duration::from_millis(10);
        for i in 0..SWEEP_EVERY - 1 {
            let s = SubjectDigest::from_bytes([(i % 200) as u8; 32]);
            pools.weigh(&p, &s, 1, 1.0, t0, ttl);
        }
        let s = SubjectDigest::from_bytes([250; 32]);
        pools.weigh(&p, &s, 1, 1.0, t0 + Duration::from_secs(1), ttl);
        assert_eq!(pools.pools(), 1);
    }
}
