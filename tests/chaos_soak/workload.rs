//! What the soak asks for: one policy with all three algorithms (and a descriptor with two
//! limits), and random requests of one to three descriptors over a pool of subjects.

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;

use super::rng::Rng;
use crate::common::server::{descriptor, request};

pub const DOMAIN: &str = "soak";
pub const POLICY_FILE: &str = "soak.yaml";
/// Distinct values per descriptor key: few enough that every limit is exceeded often.
pub const SUBJECTS: u16 = 12;

#[derive(Debug, Clone, Copy)]
pub enum Algo {
    /// At most `limit` per epoch-aligned window of `window_ms`.
    Fixed { window_ms: u64, limit: u64 },
    /// The sliding-window counter over epoch-aligned windows of `window_ms`.
    Sliding { window_ms: u64, limit: u64 },
    /// `rate` tokens per `period_ms`, at most `capacity`.
    Bucket {
        period_ms: u64,
        rate: u64,
        capacity: u64,
    },
}

#[derive(Debug, Clone, Copy)]
pub struct Limit {
    pub name: &'static str,
    /// Index into `KEYS`: the descriptor key this limit applies to.
    pub key: usize,
    pub algo: Algo,
}

pub const KEYS: [&str; 3] = ["fw", "sw", "tb"];

/// Must match `policy()`.
pub const LIMITS: [Limit; 4] = [
    Limit {
        name: "soak-fw-1s",
        key: 0,
        algo: Algo::Fixed {
            window_ms: 1000,
            limit: 5,
        },
    },
    Limit {
        name: "soak-fw-3s",
        key: 0,
        algo: Algo::Fixed {
            window_ms: 3000,
            limit: 11,
        },
    },
    Limit {
        name: "soak-sw-2s",
        key: 1,
        algo: Algo::Sliding {
            window_ms: 2000,
            limit: 8,
        },
    },
    Limit {
        name: "soak-tb",
        key: 2,
        algo: Algo::Bucket {
            period_ms: 1000,
            rate: 4,
            capacity: 10,
        },
    },
];

/// The policy file; `generation` only changes a comment, so a rewrite reloads the same limits
/// (and, by the reload rules, keeps every counter).
pub fn policy(generation: u64) -> String {
    format!(
        r#"# soak policy, generation {generation}
domain: {DOMAIN}
descriptors:
  - key: fw
    rate_limits:
      - {{ name: soak-fw-1s, unit: second, requests_per_unit: 5 }}
      - {{ name: soak-fw-3s, window: 3s, requests_per_unit: 11 }}
  - key: sw
    rate_limit: {{ name: soak-sw-2s, algorithm: sliding_window, window: 2s, requests_per_unit: 8 }}
  - key: tb
    rate_limit: {{ name: soak-tb, algorithm: token_bucket, unit: second, requests_per_unit: 4, burst: 10 }}
"#
    )
}

/// The subject per descriptor key (`None`: the key is not in the request).
pub type Shape = [Option<u16>; 3];

/// One to three distinct keys, each with a random subject, in a random order.
pub fn random_shape(rng: &mut Rng) -> Shape {
    loop {
        let mut shape = [None; 3];
        for slot in shape.iter_mut() {
            if rng.below(3) < 2 {
                *slot = Some(rng.below(SUBJECTS as u64) as u16);
            }
        }
        if shape.iter().any(Option::is_some) {
            return shape;
        }
    }
}

pub fn subject(id: u16) -> String {
    format!("subject-{id}")
}

pub fn to_request(shape: &Shape, rng: &mut Rng) -> RateLimitRequest {
    let mut descriptors: Vec<_> = KEYS
        .iter()
        .zip(shape)
        .filter_map(|(key, s)| s.map(|s| descriptor(&[(key, &subject(s))])))
        .collect();
    if descriptors.len() > 1 && rng.below(2) == 0 {
        descriptors.reverse();
    }
    request(DOMAIN, descriptors)
}
