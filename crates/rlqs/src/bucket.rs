//! From an RLQS bucket id to the policies it is subject to.
//!
//! A bucket id is an unordered map (`{name: "api", tenant: "t1"}`); a descriptor is an
//! ordered list of entries, matched one tree level per entry. A bucket is matched as the
//! descriptor made of all its entries, in the first order (trying key orders
//! lexicographically, starting from sorted keys) whose path reaches a rule with a limit. So
//! the YAML rules are written as for `ShouldRateLimit`, and a bucket `{a: 1, b: 2}` matches
//! the rule `a: 1 / b: 2` (or `b: 2 / a: 1`, whichever is declared). The subject is the same
//! HMAC as that descriptor's under `ShouldRateLimit`, so both APIs share one counter; raw
//! values never leave this module.

use std::sync::Arc;

use edgelimit_contract::{RateLimitPolicy, SubjectDigest, MAX_EXACT_INTEGER};
use edgelimit_envoy::subject::SubjectHasher;
use edgelimit_policy::PolicySet;

use crate::settings::RlqsSettings;

/// A bucket id in canonical form (entries sorted by key): equal ids compare equal whatever
/// order Envoy sent them in.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct BucketKey(Vec<(String, String)>);

/// Why a bucket id is refused (answered `deny_all`). Bounded: it is a metric label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BucketError {
    Empty,
    TooManyEntries,
    EmptyKey,
    KeyTooLong,
    ValueTooLong,
}

impl BucketError {
    pub fn as_str(self) -> &'static str {
        match self {
            BucketError::Empty => "empty_bucket_id",
            BucketError::TooManyEntries => "too_many_entries",
            BucketError::EmptyKey => "empty_key",
            BucketError::KeyTooLong => "key_too_long",
            BucketError::ValueTooLong => "value_too_long",
        }
    }
}

impl BucketKey {
    pub fn new<'a>(
        entries: impl ExactSizeIterator<Item = (&'a String, &'a String)>,
        settings: &RlqsSettings,
    ) -> Result<Self, BucketError> {
        if entries.len() == 0 {
            return Err(BucketError::Empty);
        }
        if entries.len() > settings.max_bucket_entries {
            return Err(BucketError::TooManyEntries);
        }
        let mut out = Vec::with_capacity(entries.len());
        for (key, value) in entries {
            if key.is_empty() {
                return Err(BucketError::EmptyKey);
            }
            if key.len() > settings.max_key_bytes {
                return Err(BucketError::KeyTooLong);
            }
            if value.len() > settings.max_value_bytes {
                return Err(BucketError::ValueTooLong);
            }
            out.push((key.clone(), value.clone()));
        }
        out.sort();
        Ok(Self(out))
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// One limit a bucket is subject to, and the subject it counts against.
#[derive(Debug, Clone)]
pub struct Target {
    pub policy: Arc<RateLimitPolicy>,
    pub subject: SubjectDigest,
}

/// What a bucket maps to under one policy set.
#[derive(Debug, Clone)]
pub enum Resolution {
    /// No rule: nothing limits it (as an unmatched descriptor under `ShouldRateLimit`).
    Unmatched,
    /// An `unlimited` rule.
    Unlimited,
    /// A rule with limits; `shadow` is the rule's `shadow_mode`.
    Limited { shadow: bool, targets: Vec<Target> },
}

impl Resolution {
    /// Whether a policy governs the bucket (its removal is answered `abandon_action`).
    pub fn has_policy(&self) -> bool {
        !matches!(self, Resolution::Unmatched)
    }
}

/// The rule `key` reaches in `domain`, trying entry orders as the module describes.
pub fn resolve(
    policies: &PolicySet,
    domain: &str,
    key: &BucketKey,
    hasher: &SubjectHasher,
) -> Resolution {
    if !policies.has_domain(domain) {
        return Resolution::Unmatched;
    }
    let entries = &key.0;
    let mut order: Vec<usize> = (0..entries.len()).collect();
    loop {
        let ordered = || order.iter().map(|&i| (&entries[i].0, &entries[i].1));
        if let Some(rule) = policies.find(domain, ordered()) {
            if rule.unlimited {
                return Resolution::Unlimited;
            }
            let subject = hasher.digest(
                domain.as_bytes(),
                ordered()
                    .enumerate()
                    .map(|(level, (k, v))| (k.as_bytes(), rule.subject_value(level, v.as_bytes()))),
            );
            return Resolution::Limited {
                shadow: rule.shadow_mode,
                targets: rule
                    .limits
                    .iter()
                    .map(|limit| Target {
                        policy: for_reports(&limit.policy),
                        subject,
                    })
                    .collect(),
            };
        }
        if !next_permutation(&mut order) {
            return Resolution::Unmatched;
        }
    }
}

/// The policy a report is consumed under: the same state (id, revision, algorithm), but
/// `max_cost` is one request's bound under `ShouldRateLimit`, while a report carries many
/// requests, so it is raised to the exact-arithmetic bound. Backends never read `max_cost`.
fn for_reports(policy: &Arc<RateLimitPolicy>) -> Arc<RateLimitPolicy> {
    RateLimitPolicy::new(
        policy.id().clone(),
        policy.revision(),
        *policy.params(),
        MAX_EXACT_INTEGER,
        policy.cleanup_grace_ms(),
        policy.max_clock_regression_ms(),
    )
    .map(Arc::new)
    .unwrap_or_else(|_| Arc::clone(policy))
}

/// Advances `order` to the next permutation in lexicographic order; false after the last.
fn next_permutation(order: &mut [usize]) -> bool {
    let Some(pivot) = order.windows(2).rposition(|w| w[0] < w[1]) else {
        return false;
    };
    let Some(successor) = order.iter().rposition(|&x| x > order[pivot]) else {
        return false;
    };
    order.swap(pivot, successor);
    order[pivot + 1..].reverse();
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use edgelimit_policy::LoadOptions;
    use std::collections::HashMap;
    use std::path::PathBuf;
    use zeroize::Zeroizing;

    fn policies(text: &str) -> PolicySet {
        PolicySet::from_sources(
            vec![(PathBuf::from("p.yaml"), text.to_owned())],
            &LoadOptions::default(),
        )
        .unwrap()
    }

    fn hasher() -> SubjectHasher {
        SubjectHasher::new(Zeroizing::new(vec![7; 32])).unwrap()
    }

    fn key(entries: &[(&str, &str)]) -> BucketKey {
        let map: HashMap<String, String> = entries
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        BucketKey::new(map.iter(), &RlqsSettings::default()).unwrap()
    }

    const POLICY: &str = "domain: edge\ndescriptors:\n  - key: tenant\n    descriptors:\n      - key: api\n        value: search\n        rate_limit: {unit: second, requests_per_unit: 10}\n  - key: open\n    rate_limit: {unlimited: true}\n";

    #[test]
    fn permutations_are_lexicographic_and_complete() {
        let mut order = vec![0, 1, 2];
        let mut seen = vec![order.clone()];
        while next_permutation(&mut order) {
            seen.push(order.clone());
        }
        assert_eq!(seen.len(), 6);
        assert_eq!(seen[1], vec![0, 2, 1]);
        assert_eq!(seen[5], vec![2, 1, 0]);
    }

    #[test]
    fn a_bucket_matches_the_declared_order_and_hashes_like_that_descriptor() {
        let set = policies(POLICY);
        let h = hasher();
        let Resolution::Limited { targets, shadow } = resolve(
            &set,
            "edge",
            &key(&[("api", "search"), ("tenant", "t1")]),
            &h,
        ) else {
            panic!("the rule tenant/api matches whatever the map order");
        };
        assert!(!shadow);
        assert_eq!(targets.len(), 1);
        let as_descriptor = h.digest(b"edge", [("tenant", "t1"), ("api", "search")].into_iter());
        assert_eq!(targets[0].subject, as_descriptor);
        let other = resolve(
            &set,
            "edge",
            &key(&[("api", "search"), ("tenant", "t2")]),
            &h,
        );
        let Resolution::Limited { targets: t2, .. } = other else {
            panic!("matches")
        };
        assert_ne!(t2[0].subject, as_descriptor, "one subject per tenant");
    }

    #[test]
    fn unlimited_unmatched_and_unknown_domains() {
        let set = policies(POLICY);
        let h = hasher();
        assert!(matches!(
            resolve(&set, "edge", &key(&[("open", "x")]), &h),
            Resolution::Unlimited
        ));
        assert!(matches!(
            resolve(&set, "edge", &key(&[("api", "other"), ("tenant", "t")]), &h),
            Resolution::Unmatched
        ));
        assert!(matches!(
            resolve(&set, "elsewhere", &key(&[("open", "x")]), &h),
            Resolution::Unmatched
        ));
    }

    #[test]
    fn bucket_ids_are_bounded() {
        let s = RlqsSettings {
            max_bucket_entries: 2,
            max_value_bytes: 3,
            ..RlqsSettings::default()
        };
        let build = |entries: &[(&str, &str)]| {
            let map: HashMap<String, String> = entries
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            BucketKey::new(map.iter(), &s)
        };
        assert_eq!(build(&[]), Err(BucketError::Empty));
        assert_eq!(
            build(&[("a", ""), ("b", ""), ("c", "")]),
            Err(BucketError::TooManyEntries)
        );
        assert_eq!(build(&[("", "x")]), Err(BucketError::EmptyKey));
        assert_eq!(build(&[("a", "long")]), Err(BucketError::ValueTooLong));
        assert_eq!(
            build(&[("b", "1"), ("a", "2")]),
            build(&[("a", "2"), ("b", "1")])
        );
    }
}
