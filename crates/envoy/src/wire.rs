//! Envoy's `RateLimitRequest` as it is read off the wire: the same field numbers and types as
//! `envoy.service.ratelimit.v3.RateLimitRequest`, except that the domain, keys and values are
//! `bytes`. Envoy fills values from request headers, which may carry any byte; decoded as
//! `string`, one non-UTF-8 byte fails the whole call, and Envoy's default
//! `failure_mode_deny: false` lets every failed call through. As bytes, every request decodes
//! and is matched, hashed and decided like any other.
//!
//! The bytes fields are [`Bytes`]: decoded from the call's message buffer they are slices of
//! it (a reference count each), not an allocation and a copy per key and value.

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::google::protobuf::UInt64Value;

use bytes::Bytes;

/// `envoy.service.ratelimit.v3.RateLimitRequest`, strings as bytes.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Request {
    #[prost(bytes = "bytes", tag = "1")]
    pub domain: Bytes,
    #[prost(message, repeated, tag = "2")]
    pub descriptors: Vec<Descriptor>,
    #[prost(uint32, tag = "3")]
    pub hits_addend: u32,
}

/// `envoy.extensions.common.ratelimit.v3.RateLimitDescriptor`, strings as bytes.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Descriptor {
    #[prost(message, repeated, tag = "1")]
    pub entries: Vec<Entry>,
    #[prost(message, optional, tag = "2")]
    pub limit: Option<RateLimitOverride>,
    #[prost(message, optional, tag = "3")]
    pub hits_addend: Option<UInt64Value>,
    #[prost(bool, tag = "4")]
    pub is_negative_hits: bool,
}

/// `RateLimitDescriptor.Entry`, strings as bytes.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Entry {
    #[prost(bytes = "bytes", tag = "1")]
    pub key: Bytes,
    #[prost(bytes = "bytes", tag = "2")]
    pub value: Bytes,
}

impl From<&RateLimitRequest> for Request {
    fn from(r: &RateLimitRequest) -> Self {
        Request {
            domain: Bytes::copy_from_slice(r.domain.as_bytes()),
            descriptors: r
                .descriptors
                .iter()
                .map(|d| Descriptor {
                    entries: d
                        .entries
                        .iter()
                        .map(|e| Entry {
                            key: Bytes::copy_from_slice(e.key.as_bytes()),
                            value: Bytes::copy_from_slice(e.value.as_bytes()),
                        })
                        .collect(),
                    limit: d.limit,
                    hits_addend: d.hits_addend,
                    is_negative_hits: d.is_negative_hits,
                })
                .collect(),
            hits_addend: r.hits_addend,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry as EnvoyEntry;
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
    use prost::Message;

    fn envoy_request() -> RateLimitRequest {
        RateLimitRequest {
            domain: "edge".into(),
            descriptors: vec![RateLimitDescriptor {
                entries: vec![EnvoyEntry {
                    key: "remote_address".into(),
                    value: "10.0.0.1".into(),
                }],
                limit: Some(RateLimitOverride {
                    requests_per_unit: 7,
                    unit: 2,
                }),
                hits_addend: Some(UInt64Value { value: 3 }),
                is_negative_hits: true,
            }],
            hits_addend: 5,
        }
    }

    #[test]
    fn decodes_what_envoy_types_encodes_and_back() {
        let envoy = envoy_request();
        let bytes = envoy.encode_to_vec();
        let wire = Request::decode(bytes.as_slice()).unwrap();
        assert_eq!(wire, Request::from(&envoy));
        assert_eq!(wire.encode_to_vec(), bytes, "same encoding both ways");
        assert_eq!(RateLimitRequest::decode(bytes.as_slice()).unwrap(), envoy);
    }

    #[test]
    fn values_decoded_from_a_message_buffer_are_slices_of_it() {
        let message = Bytes::from(envoy_request().encode_to_vec());
        let wire = Request::decode(message.clone()).unwrap();
        let inside = |field: &Bytes| message.as_ptr_range().contains(&field.as_ptr());
        let entry = &wire.descriptors[0].entries[0];
        assert_eq!(&entry.value[..], b"10.0.0.1");
        assert!(inside(&wire.domain) && inside(&entry.key) && inside(&entry.value));
    }

    #[test]
    fn decodes_bytes_that_are_not_utf8() {
        let mut wire = Request::from(&envoy_request());
        wire.domain = Bytes::from_static(b"d\xff");
        wire.descriptors[0].entries[0] = Entry {
            key: Bytes::from_static(b"k\xc3"),
            value: Bytes::from_static(b"\xfe\x00v"),
        };
        let bytes = wire.encode_to_vec();
        assert!(
            RateLimitRequest::decode(bytes.as_slice()).is_err(),
            "envoy-types refuses it (the reason this module exists)"
        );
        assert_eq!(Request::decode(bytes.as_slice()).unwrap(), wire);
    }
}
