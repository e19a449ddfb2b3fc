//! Validation of Envoy's request against documented bounds, before any lookup or backend call.

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use thiserror::Error;

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
    #[error("descriptors[{descriptor}] has no entries")]
    NoEntries { descriptor: usize },
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
    if descriptor.entries.is_empty() {
        return Err(RequestError::NoEntries { descriptor: index });
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
    use envoy_types::pb::google::protobuf::UInt64Value;

    fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
        RateLimitDescriptor {
            entries: entries
                .iter()
                .map(|(k, v)| Entry {
                    key: k.to_string(),
                    value: v.to_string(),
                })
                .collect(),
            ..Default::default()
        }
    }

    fn request(domain: &str, descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
        RateLimitRequest {
            domain: domain.into(),
            descriptors,
            hits_addend: 0,
        }
    }

    #[test]
    fn accepts_a_normal_request() {
        let r = request("edge", vec![descriptor(&[("remote_address", "10.0.0.1")])]);
        assert_eq!(validate(&r, &RequestBounds::default()), Ok(()));
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
                request("d", vec![ok(), descriptor(&[])]),
                RequestError::NoEntries { descriptor: 1 },
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
