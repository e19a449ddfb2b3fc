//! Bounded fuzzing with a fixed case budget (proptest): hostile replies, descriptors and
//! requests must produce an error or a well-formed answer — never a panic, never an allow
//! from a malformed reply. Failing cases are persisted by proptest under
//! `tests/fuzz_inputs.proptest-regressions` and replayed first on every run.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use edgelimit::contract::{AlgorithmParams, PolicyId, RateLimitPolicy};
use edgelimit::envoy::{RateLimiter, ServiceSettings};
use edgelimit::memory::{MemoryBackend, MemoryConfig};
use edgelimit::policy::{LoadOptions, PolicySet};
use edgelimit::redis::parse_reply;
use edgelimit::subject::SubjectHasher;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::google::protobuf::UInt64Value;
use proptest::prelude::*;
use redis::Value;

const CASES: u32 = 768;

const POLICY: &str = r#"
domain: fuzz
descriptors:
  - key: k
    rate_limit: { unit: second, requests_per_unit: 3 }
  - key: path
    value: /a/*
    rate_limit: { algorithm: sliding_window, unit: minute, requests_per_unit: 5 }
  - key: tier
    value: x
    descriptors:
      - key: user
        rate_limit: { algorithm: token_bucket, unit: second, requests_per_unit: 1, burst: 2, max_cost: 2 }
  - key: open
    rate_limit: { unlimited: true }
"#;

fn policies() -> PolicySet {
    PolicySet::from_sources(
        vec![(PathBuf::from("fuzz.yaml"), POLICY.to_string())],
        &LoadOptions::default(),
    )
    .expect("fuzz policy loads")
}

type Service = (tokio::runtime::Runtime, RateLimiter<MemoryBackend>);

/// One service for all cases: the subject cap keeps its memory bounded across cases.
fn service() -> &'static Service {
    static SERVICE: std::sync::OnceLock<Service> = std::sync::OnceLock::new();
    SERVICE.get_or_init(|| {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let limiter = RateLimiter::new(
            Arc::new(ArcSwap::from_pointee(policies())),
            Arc::new(MemoryBackend::new(MemoryConfig {
                max_subjects: 1000,
                ..MemoryConfig::default()
            })),
            Arc::new(SubjectHasher::new(zeroize::Zeroizing::new(vec![7u8; 32])).unwrap()),
            ServiceSettings::default(),
        );
        (runtime, limiter)
    })
}

fn reply_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Nil),
        any::<i64>().prop_map(Value::Int),
        prop::sample::select(vec![
            "ALLOWED",
            "DENIED",
            "CLOCK_UNSAFE",
            "STATE_INCOMPATIBLE",
            "INVALID",
            "allowed",
            "",
        ])
        .prop_map(|s| Value::BulkString(s.as_bytes().to_vec())),
        proptest::collection::vec(any::<u8>(), 0..12).prop_map(Value::BulkString),
        (0i64..10).prop_map(|n| Value::SimpleString(format!("{n}"))),
        Just(Value::Okay),
        any::<f64>().prop_map(Value::Double),
    ];
    leaf.prop_recursive(2, 24, 9, |inner| {
        proptest::collection::vec(inner, 0..9).prop_map(Value::Array)
    })
}

/// Replies shaped like the real thing, with numbers anywhere in i64.
fn plausible_reply() -> impl Strategy<Value = Value> {
    (
        prop::sample::select(vec!["ALLOWED", "DENIED", "CLOCK_UNSAFE", "X"]),
        proptest::collection::vec(
            prop_oneof![
                0i64..20,
                any::<i64>(),
                1_700_000_000_000i64..1_700_000_100_000
            ],
            6,
        ),
    )
        .prop_map(|(status, nums)| {
            let mut v = vec![Value::BulkString(status.as_bytes().to_vec())];
            v.extend(nums.into_iter().map(Value::Int));
            Value::Array(v)
        })
}

fn matching_set() -> &'static PolicySet {
    static SET: std::sync::OnceLock<PolicySet> = std::sync::OnceLock::new();
    SET.get_or_init(policies)
}

fn fw_policy() -> RateLimitPolicy {
    RateLimitPolicy::new(
        PolicyId::new("fuzz.p").unwrap(),
        1,
        AlgorithmParams::FixedWindow {
            limit: 10,
            window_ms: 1000,
        },
        10,
        0,
        2000,
    )
    .unwrap()
}

fn entry() -> impl Strategy<Value = (String, String)> {
    let key = prop_oneof![
        prop::sample::select(vec!["k", "path", "tier", "user", "open", ""]).prop_map(String::from),
        "[a-z]{0,6}",
        ".{0,12}",
        "k{300}",
    ];
    let value = prop_oneof![
        prop::sample::select(vec!["/a/b", "x", "", "*", "/a/*"]).prop_map(String::from),
        ".{0,12}",
        "[a-z/]{4090,4100}",
    ];
    (key, value)
}

fn descriptor() -> impl Strategy<Value = RateLimitDescriptor> {
    (
        proptest::collection::vec(entry(), 0..5),
        prop::option::of((0u32..10, 0i32..9)),
        prop::option::of(prop_oneof![Just(0u64), 1u64..5, Just(u64::MAX)]),
        any::<bool>(),
    )
        .prop_map(|(entries, limit, hits, negative)| RateLimitDescriptor {
            entries: entries
                .into_iter()
                .map(|(key, value)| Entry { key, value })
                .collect(),
            limit: limit.map(|(requests_per_unit, unit)| RateLimitOverride {
                requests_per_unit,
                unit,
            }),
            hits_addend: hits.map(|value| UInt64Value { value }),
            is_negative_hits: negative,
        })
}

fn rls_request() -> impl Strategy<Value = RateLimitRequest> {
    (
        prop_oneof![
            Just("fuzz".to_string()),
            Just(String::new()),
            ".{0,12}",
            "d{250,260}"
        ],
        prop_oneof![
            9 => proptest::collection::vec(descriptor(), 0..4),
            1 => proptest::collection::vec(descriptor(), 60..70),
        ],
        prop_oneof![Just(0u32), 1u32..4, Just(u32::MAX)],
    )
        .prop_map(|(domain, descriptors, hits_addend)| RateLimitRequest {
            domain,
            descriptors,
            hits_addend,
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: CASES, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_replies_never_parse_into_something_inconsistent(value in reply_value()) {
        let policy = fw_policy();
        if let Ok(reply) = parse_reply(&value, &policy) {
            // Whatever parses must be a complete, in-range seven-field reply.
            let Value::Array(fields) = &value else { panic!("non-array parsed") };
            prop_assert_eq!(fields.len(), 7);
            prop_assert!(reply.remaining <= reply.limit || !matches!(reply.status, edgelimit::algorithm::Status::Allowed | edgelimit::algorithm::Status::Denied));
        }
    }

    #[test]
    fn plausible_replies_are_checked_against_the_policy(value in plausible_reply()) {
        let policy = fw_policy();
        if let Ok(reply) = parse_reply(&value, &policy) {
            use edgelimit::algorithm::Status;
            if matches!(reply.status, Status::Allowed | Status::Denied) {
                prop_assert_eq!(reply.limit, 10);
                prop_assert!(reply.remaining <= 10);
                prop_assert!(reply.effective_now_ms >= reply.server_now_ms);
                prop_assert!(reply.reset_at_ms >= reply.effective_now_ms);
                if reply.status == Status::Allowed {
                    prop_assert_eq!(reply.retry_after_ms, 0);
                }
            }
        }
    }

    #[test]
    fn matching_arbitrary_entries_never_panics(
        domain in prop_oneof![Just("fuzz".to_string()), ".{0,12}"],
        entries in proptest::collection::vec(entry(), 0..8),
    ) {
        let set = matching_set();
        let rule = set.find(&domain, entries.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        if let Some(rule) = rule {
            prop_assert!(rule.has_limit());
            prop_assert_eq!(domain.as_str(), "fuzz");
        }
    }
}

proptest! {
    // Each case runs a whole request through the service; fewer cases, same idea.
    #![proptest_config(ProptestConfig { cases: CASES / 3, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_requests_get_an_error_or_a_well_formed_answer(request in rls_request()) {
        let (runtime, limiter) = service();
        let deadline = Instant::now() + Duration::from_secs(5);
        match runtime.block_on(limiter.decide(&request, deadline)) {
            Ok(response) => {
                prop_assert_eq!(response.statuses.len(), request.descriptors.len());
                let over = response.statuses.iter().any(|s| s.code == 2);
                prop_assert_eq!(response.overall_code, if over { 2 } else { 1 });
                for s in &response.statuses {
                    prop_assert!(s.code == 1 || s.code == 2);
                }
            }
            Err(status) => {
                prop_assert_eq!(status.code(), tonic::Code::InvalidArgument, "{}", status.message());
                prop_assert!(!status.message().is_empty());
            }
        }
    }
}
