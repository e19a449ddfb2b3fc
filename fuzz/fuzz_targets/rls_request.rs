//! Bytes as a `RateLimitRequest` off the wire (bytes-valued domain, keys, values), then the
//! service's validation and planning against a small fixed policy set. No backend, no network:
//! every input is either a plan or a typed `RequestError`, never a panic.
#![no_main]

use std::path::PathBuf;
use std::sync::OnceLock;

use edgelimit::envoy::wire::Request;
use edgelimit::envoy::{plan_checks, RequestBounds};
use edgelimit::policy::{LoadOptions, PolicySet};
use edgelimit::subject::SubjectHasher;
use libfuzzer_sys::fuzz_target;
use prost::Message;
use zeroize::Zeroizing;

/// Exercises wildcards, nesting, unlimited, shadow mode, replaces and per-second limits.
const POLICIES: &str = "\
domain: d
descriptors:
  - key: k
    rate_limit: {unit: second, requests_per_unit: 5}
  - key: path
    value: /api/*
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: user
    descriptors:
      - key: path
        rate_limit: {unit: hour, requests_per_unit: 100}
  - key: free
    rate_limit: {unlimited: true}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: day, requests_per_unit: 1}
";

struct Fixture {
    policies: PolicySet,
    hasher: SubjectHasher,
    bounds: RequestBounds,
}

fn fixture() -> &'static Fixture {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let policies = PolicySet::from_sources(
            vec![(PathBuf::from("fuzz.yaml"), POLICIES.to_owned())],
            &LoadOptions::default(),
        )
        .unwrap_or_else(|e| panic!("fixed policy set is invalid: {e}"));
        let hasher = SubjectHasher::new(Zeroizing::new(vec![7u8; 32]))
            .unwrap_or_else(|e| panic!("fixed secret refused: {e}"));
        Fixture {
            policies,
            hasher,
            bounds: RequestBounds::default(),
        }
    })
}

fuzz_target!(|data: &[u8]| {
    let Ok(request) = Request::decode(data) else {
        return;
    };
    let f = fixture();
    if let Ok(checks) = plan_checks(&f.policies, &request, &f.bounds, &f.hasher) {
        // One check per applied limit per subject: bounded by the request's shape.
        assert!(checks <= request.descriptors.len() * 8, "{checks} checks");
    }
});
