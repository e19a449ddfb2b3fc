//! From Envoy's request to what the backend decides, in one place: validation against the
//! documented bounds, the limits each descriptor is subject to (matching, overrides,
//! `replaces`), their costs and their subjects.

use std::borrow::Cow;

use thiserror::Error;

use edgelimit_contract::{ContractError, Cost, Enforcement, LimitCheck, SubjectDigest};
use edgelimit_policy::{Limit, PolicySet, Rule, Unit};

use crate::subject::SubjectHasher;
use crate::wire::{Descriptor as RateLimitDescriptor, Request as RateLimitRequest};
use crate::PerLimit;

/// Limits on what one request may carry. Beyond them the call is `INVALID_ARGUMENT`.
#[derive(Debug, Clone)]
pub struct RequestBounds {
    pub max_domain_bytes: usize,
    pub max_descriptors: usize,
    pub max_entries_per_descriptor: usize,
    pub max_key_bytes: usize,
    pub max_value_bytes: usize,
}

impl Default for RequestBounds {
    fn default() -> Self {
        Self {
            max_domain_bytes: 256,
            max_descriptors: 64,
            max_entries_per_descriptor: 32,
            max_key_bytes: 256,
            max_value_bytes: 4096,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum RequestError {
    #[error("domain must not be empty")]
    EmptyDomain,
    #[error("domain is {len} bytes, at most {max} allowed")]
    DomainTooLong { len: usize, max: usize },
    #[error("request has no descriptors")]
    NoDescriptors,
    #[error("request has {count} descriptors, at most {max} allowed")]
    TooManyDescriptors { count: usize, max: usize },
    #[error("descriptors[{descriptor}] has {count} entries, at most {max} allowed")]
    TooManyEntries {
        descriptor: usize,
        count: usize,
        max: usize,
    },
    #[error("descriptors[{descriptor}].entries[{entry}].key must not be empty")]
    EmptyKey { descriptor: usize, entry: usize },
    #[error(
        "descriptors[{descriptor}].entries[{entry}].key is {len} bytes, at most {max} allowed"
    )]
    KeyTooLong {
        descriptor: usize,
        entry: usize,
        len: usize,
        max: usize,
    },
    #[error(
        "descriptors[{descriptor}].entries[{entry}].value is {len} bytes, at most {max} allowed"
    )]
    ValueTooLong {
        descriptor: usize,
        entry: usize,
        len: usize,
        max: usize,
    },
    #[error("descriptors[{descriptor}]: negative hits (refunds) are not supported")]
    NegativeHits { descriptor: usize },
    #[error("descriptors[{descriptor}].limit has unknown unit {unit}")]
    OverrideUnit { descriptor: usize, unit: i32 },
    #[error("descriptors[{descriptor}]: cost {cost} exceeds the limit's maximum cost {max}")]
    CostAboveMaximum {
        descriptor: usize,
        cost: u64,
        max: u64,
    },
    #[error("descriptors[{descriptor}].limit: {error}")]
    Override {
        descriptor: usize,
        error: ContractError,
    },
    #[error("descriptors[{descriptor}]: {error}")]
    Cost {
        descriptor: usize,
        error: ContractError,
    },
}

pub fn validate(request: &RateLimitRequest, bounds: &RequestBounds) -> Result<(), RequestError> {
    if request.domain.is_empty() {
        return Err(RequestError::EmptyDomain);
    }
    if request.domain.len() > bounds.max_domain_bytes {
        return Err(RequestError::DomainTooLong {
            len: request.domain.len(),
            max: bounds.max_domain_bytes,
        });
    }
    if request.descriptors.is_empty() {
        return Err(RequestError::NoDescriptors);
    }
    if request.descriptors.len() > bounds.max_descriptors {
        return Err(RequestError::TooManyDescriptors {
            count: request.descriptors.len(),
            max: bounds.max_descriptors,
        });
    }
    for (index, descriptor) in request.descriptors.iter().enumerate() {
        validate_descriptor(index, descriptor, bounds)?;
    }
    Ok(())
}

fn validate_descriptor(
    index: usize,
    descriptor: &RateLimitDescriptor,
    bounds: &RequestBounds,
) -> Result<(), RequestError> {
    // A descriptor without entries matches nothing (as in the reference): it is answered OK
    // without a limit and the rest of the request is decided.
    if descriptor.entries.len() > bounds.max_entries_per_descriptor {
        return Err(RequestError::TooManyEntries {
            descriptor: index,
            count: descriptor.entries.len(),
            max: bounds.max_entries_per_descriptor,
        });
    }
    if descriptor.is_negative_hits {
        return Err(RequestError::NegativeHits { descriptor: index });
    }
    for (entry_index, entry) in descriptor.entries.iter().enumerate() {
        if entry.key.is_empty() {
            return Err(RequestError::EmptyKey {
                descriptor: index,
                entry: entry_index,
            });
        }
        if entry.key.len() > bounds.max_key_bytes {
            return Err(RequestError::KeyTooLong {
                descriptor: index,
                entry: entry_index,
                len: entry.key.len(),
                max: bounds.max_key_bytes,
            });
        }
        if entry.value.len() > bounds.max_value_bytes {
            return Err(RequestError::ValueTooLong {
                descriptor: index,
                entry: entry_index,
                len: entry.value.len(),
                max: bounds.max_value_bytes,
            });
        }
    }
    Ok(())
}

/// Units of quota a descriptor takes: its own `hits_addend` when set (0 = peek), else the
/// request's (`0`/unset = 1), as Envoy defines them.
pub fn descriptor_cost(request_hits: u32, descriptor: &RateLimitDescriptor) -> u64 {
    match &descriptor.hits_addend {
        Some(hits) => hits.value,
        None => u64::from(request_hits.max(1)),
    }
}

/// One limit a descriptor is subject to.
#[derive(Debug, Clone)]
pub(crate) struct Applied<'p> {
    pub descriptor: usize,
    pub limit: Cow<'p, Limit>,
    /// Not enforced: its rule's `shadow_mode`, or the global shadow mode.
    pub shadow: bool,
    /// The rule's own `shadow_mode`: its status reads OK even when over limit. Under the
    /// global shadow mode alone, statuses stay as computed and only the overall code is OK.
    pub rule_shadow: bool,
    pub cost: Cost,
}

/// What a request asks of the backend.
#[derive(Debug)]
pub(crate) struct Plan<'p> {
    /// Every limit that applies, descriptor by descriptor, limit by limit, after `replaces`.
    pub applied: Vec<Applied<'p>>,
    /// Per descriptor: whether it matched an `unlimited` rule.
    pub unlimited: Vec<bool>,
    /// Per descriptor: whether it counts as a quota descriptor (`quota_mode` of its rule, or
    /// the global quota mode).
    pub quota: Vec<bool>,
    /// Per applied limit: its subject, and its subject under the previous secret while one
    /// rotates.
    subjects: Vec<(SubjectDigest, Option<SubjectDigest>)>,
}

impl Plan<'_> {
    /// The checks to decide together, in request order: each applied limit once per subject
    /// (twice while an HMAC secret rotates), with the index of the applied limit of each.
    pub fn checks(&self) -> Result<(Vec<LimitCheck<'_>>, Vec<usize>), RequestError> {
        let mut checks = Vec::with_capacity(self.applied.len());
        let mut owner = Vec::with_capacity(self.applied.len());
        for (index, (item, &(current, previous))) in
            self.applied.iter().zip(&self.subjects).enumerate()
        {
            let enforcement = if item.shadow {
                Enforcement::Shadow
            } else {
                Enforcement::Enforced
            };
            for subject in std::iter::once(current).chain(previous) {
                let check = LimitCheck::new(&item.limit.policy, subject, item.cost, enforcement)
                    .map_err(|_| RequestError::CostAboveMaximum {
                        descriptor: item.descriptor,
                        cost: item.cost.units(),
                        max: item.limit.policy.max_cost(),
                    })?;
                checks.push(check);
                owner.push(index);
            }
        }
        Ok((checks, owner))
    }
}

/// The hashers of the current and, while rotating, the previous HMAC secret.
pub(crate) struct Hashers<'a> {
    pub current: &'a SubjectHasher,
    pub previous: Option<&'a SubjectHasher>,
}

/// Request-wide modes set by the operator.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Modes {
    pub global_shadow: bool,
    pub global_quota: bool,
}

/// Builds the plan of a validated request against `policies`.
pub(crate) fn plan<'p>(
    policies: &'p PolicySet,
    request: &RateLimitRequest,
    hashers: &Hashers<'_>,
    modes: Modes,
) -> Result<Plan<'p>, RequestError> {
    let Matched {
        applied,
        unlimited,
        quota,
        rules,
    } = applicable_limits(policies, request, modes)?;
    // One digest per descriptor (two while a secret rotates), shared by its limits.
    let mut per_descriptor: PerLimit<Option<(SubjectDigest, Option<SubjectDigest>)>> =
        PerLimit::from_elem(None, request.descriptors.len());
    let subjects = applied
        .iter()
        .map(|item| {
            *per_descriptor[item.descriptor].get_or_insert_with(|| {
                digests(
                    hashers,
                    &request.domain,
                    &request.descriptors[item.descriptor],
                    rules[item.descriptor],
                )
            })
        })
        .collect();
    Ok(Plan {
        applied,
        unlimited,
        quota,
        subjects,
    })
}

/// Validates `request` and plans it against `policies` as the service does, up to the checks
/// it would hand the backend, and returns how many. No backend and no I/O: the entry the
/// `rls_request` fuzz target drives, so the fuzzed path is the served one.
pub fn plan_checks(
    policies: &PolicySet,
    request: &RateLimitRequest,
    bounds: &RequestBounds,
    hasher: &SubjectHasher,
) -> Result<usize, RequestError> {
    validate(request, bounds)?;
    let hashers = Hashers {
        current: hasher,
        previous: None,
    };
    let plan = plan(policies, request, &hashers, Modes::default())?;
    let (checks, _) = plan.checks()?;
    Ok(checks.len())
}

/// The subject digests of a descriptor; `share_threshold` levels of its rule contribute
/// their wildcard pattern instead of the value, so all matching values share a counter.
fn digests(
    hashers: &Hashers<'_>,
    domain: &[u8],
    descriptor: &RateLimitDescriptor,
    rule: Option<&Rule>,
) -> (SubjectDigest, Option<SubjectDigest>) {
    let entries = || {
        descriptor.entries.iter().enumerate().map(move |(i, e)| {
            let value = match rule {
                Some(rule) => rule.subject_value(i, &e.value),
                None => &e.value[..],
            };
            (&e.key[..], value)
        })
    };
    (
        hashers.current.digest(domain, entries()),
        hashers.previous.map(|h| h.digest(domain, entries())),
    )
}

/// What matching a request's descriptors found.
struct Matched<'p> {
    applied: Vec<Applied<'p>>,
    unlimited: Vec<bool>,
    quota: Vec<bool>,
    /// Per descriptor: the rule it matched, if any (for `share_threshold` subjects).
    rules: Vec<Option<&'p Rule>>,
}

/// Limits that apply to each descriptor, after `replaces` across the whole request, and
/// which descriptors matched an `unlimited` rule.
fn applicable_limits<'p>(
    policies: &'p PolicySet,
    request: &RateLimitRequest,
    modes: Modes,
) -> Result<Matched<'p>, RequestError> {
    let global_shadow = modes.global_shadow;
    let count = request.descriptors.len();
    let mut applied = Vec::with_capacity(count);
    let mut unlimited = vec![false; count];
    // As in the reference, the global quota mode makes every descriptor but unlimited ones
    // a quota descriptor, matched or not.
    let mut quota = vec![modes.global_quota; count];
    let mut rules: Vec<Option<&'p Rule>> = vec![None; count];
    // Policy domains are UTF-8: a domain that is not is like any other unknown domain.
    let Some(domain) = std::str::from_utf8(&request.domain)
        .ok()
        .filter(|d| policies.has_domain(d))
    else {
        return Ok(Matched {
            applied,
            unlimited,
            quota,
            rules,
        });
    };
    let mut replaced: Vec<&str> = Vec::new();
    for (index, descriptor) in request.descriptors.iter().enumerate() {
        let cost = || descriptor_cost_checked(index, request.hits_addend, descriptor);
        if let Some(limit) = override_limit(policies, domain, index, descriptor)? {
            applied.push(Applied {
                descriptor: index,
                limit: Cow::Owned(limit),
                shadow: global_shadow,
                rule_shadow: false,
                cost: cost()?,
            });
            continue;
        }
        if descriptor.entries.is_empty() {
            continue;
        }
        let entries = descriptor
            .entries
            .iter()
            .map(|e| (&e.key[..], &e.value[..]));
        let Some(rule) = policies.find(domain, entries) else {
            continue;
        };
        rules[index] = Some(rule);
        unlimited[index] = rule.unlimited;
        if let Some(q) = quota.get_mut(index) {
            *q = !rule.unlimited && (*q || rule.quota_mode);
        }
        replaced.extend(rule.replaces.iter().map(String::as_str));
        if rule.limits.is_empty() {
            continue;
        }
        let cost = cost()?;
        for limit in &rule.limits {
            applied.push(Applied {
                descriptor: index,
                limit: Cow::Borrowed(limit),
                shadow: rule.shadow_mode || global_shadow,
                rule_shadow: rule.shadow_mode,
                cost,
            });
        }
    }
    if !replaced.is_empty() {
        applied.retain(|a| {
            a.limit
                .name
                .as_deref()
                .is_none_or(|name| !replaced.contains(&name))
        });
    }
    // Quota descriptors deny the request only when all of them are over limit. With one, that
    // is its own answer (enforced as usual); with several, each is decided without blocking
    // the others, and the response derives the overall code from their statuses.
    let quota_descriptors = quota
        .iter()
        .zip(&unlimited)
        .filter(|(q, u)| **q && !**u)
        .count();
    if quota_descriptors > 1 {
        for a in applied.iter_mut() {
            if quota.get(a.descriptor).copied().unwrap_or(false) {
                a.shadow = true;
            }
        }
    }
    // A cost the limit does not accept is the caller's error, named for its descriptor.
    for a in &applied {
        let max = a.limit.policy.max_cost();
        if a.cost.units() > max {
            return Err(RequestError::CostAboveMaximum {
                descriptor: a.descriptor,
                cost: a.cost.units(),
                max,
            });
        }
    }
    Ok(Matched {
        applied,
        unlimited,
        quota,
        rules,
    })
}

fn descriptor_cost_checked(
    index: usize,
    request_hits: u32,
    descriptor: &RateLimitDescriptor,
) -> Result<Cost, RequestError> {
    match descriptor_cost(request_hits, descriptor) {
        0 => Ok(Cost::Peek),
        n => Cost::consume(n).map_err(|error| RequestError::Cost {
            descriptor: index,
            error,
        }),
    }
}

fn override_limit(
    policies: &PolicySet,
    domain: &str,
    index: usize,
    descriptor: &RateLimitDescriptor,
) -> Result<Option<Limit>, RequestError> {
    let Some(limit) = &descriptor.limit else {
        return Ok(None);
    };
    // envoy.type.v3.RateLimitUnit: the override has no WEEK.
    let unit = match limit.unit {
        1 => Unit::Second,
        2 => Unit::Minute,
        3 => Unit::Hour,
        4 => Unit::Day,
        5 => Unit::Month,
        6 => Unit::Year,
        other => {
            return Err(RequestError::OverrideUnit {
                descriptor: index,
                unit: other,
            })
        }
    };
    policies
        .override_limit(domain, u64::from(limit.requests_per_unit), unit)
        .map(Some)
        .map_err(|error| RequestError::Override {
            descriptor: index,
            error,
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::Entry;
    use bytes::Bytes;
    use envoy_types::pb::google::protobuf::UInt64Value;

    fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
        RateLimitDescriptor {
            entries: entries
                .iter()
                .map(|(k, v)| Entry {
                    key: Bytes::copy_from_slice(k.as_bytes()),
                    value: Bytes::copy_from_slice(v.as_bytes()),
                })
                .collect(),
            ..Default::default()
        }
    }

    fn request(domain: &str, descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
        RateLimitRequest {
            domain: Bytes::copy_from_slice(domain.as_bytes()),
            descriptors,
            hits_addend: 0,
        }
    }

    #[test]
    fn accepts_a_normal_request() {
        let r = request("edge", vec![descriptor(&[("remote_address", "10.0.0.1")])]);
        assert_eq!(validate(&r, &RequestBounds::default()), Ok(()));
        let with_empty = request("edge", vec![descriptor(&[("k", "v")]), descriptor(&[])]);
        assert_eq!(
            validate(&with_empty, &RequestBounds::default()),
            Ok(()),
            "a descriptor without entries is a no-match, as in the reference"
        );
    }

    #[test]
    fn every_bound_is_enforced_with_a_precise_error() {
        let b = RequestBounds {
            max_domain_bytes: 4,
            max_descriptors: 2,
            max_entries_per_descriptor: 2,
            max_key_bytes: 3,
            max_value_bytes: 3,
        };
        let ok = || descriptor(&[("k", "v")]);
        let cases = [
            (request("", vec![ok()]), RequestError::EmptyDomain),
            (
                request("abcde", vec![ok()]),
                RequestError::DomainTooLong { len: 5, max: 4 },
            ),
            (request("d", vec![]), RequestError::NoDescriptors),
            (
                request("d", vec![ok(), ok(), ok()]),
                RequestError::TooManyDescriptors { count: 3, max: 2 },
            ),
            (
                request("d", vec![descriptor(&[("a", ""), ("b", ""), ("c", "")])]),
                RequestError::TooManyEntries {
                    descriptor: 0,
                    count: 3,
                    max: 2,
                },
            ),
            (
                request("d", vec![descriptor(&[("k", "v"), ("", "v")])]),
                RequestError::EmptyKey {
                    descriptor: 0,
                    entry: 1,
                },
            ),
            (
                request("d", vec![descriptor(&[("keys", "v")])]),
                RequestError::KeyTooLong {
                    descriptor: 0,
                    entry: 0,
                    len: 4,
                    max: 3,
                },
            ),
            (
                request("d", vec![descriptor(&[("k", "long")])]),
                RequestError::ValueTooLong {
                    descriptor: 0,
                    entry: 0,
                    len: 4,
                    max: 3,
                },
            ),
        ];
        for (req, expected) in cases {
            assert_eq!(validate(&req, &b), Err(expected));
        }
        let mut negative = ok();
        negative.is_negative_hits = true;
        assert_eq!(
            validate(&request("d", vec![negative]), &b),
            Err(RequestError::NegativeHits { descriptor: 0 })
        );
    }

    #[test]
    fn costs_follow_envoy_hits_addend_rules() {
        let mut d = descriptor(&[("k", "v")]);
        assert_eq!(descriptor_cost(0, &d), 1, "unset request hits mean 1");
        assert_eq!(descriptor_cost(5, &d), 5);
        d.hits_addend = Some(UInt64Value { value: 0 });
        assert_eq!(descriptor_cost(5, &d), 0, "explicit 0 is a peek");
        d.hits_addend = Some(UInt64Value { value: 7 });
        assert_eq!(descriptor_cost(5, &d), 7);
    }
}
