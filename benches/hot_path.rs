//! Micro-benchmarks of the per-request CPU path (no I/O): descriptor matching over a
//! generated 1,000-rule policy set, the HMAC subject digest, Redis key and command building,
//! reply parsing, protobuf decode/encode and the whole `RateLimiter::decide`.
//!
//!     cargo bench --bench hot_path              # everything
//!     cargo bench --bench hot_path -- decide    # a filter
//!
//! Before criterion runs, a table of heap allocations per call is printed (a counting global
//! allocator in this bench binary only). The Prometheus recorder the server installs is
//! installed here too, so metric registration costs what it costs in production; set
//! `EDGELIMIT_BENCH_RECORDER=none` to measure without a recorder.
//!
//! Benchmarks report times; nothing here asserts on them.

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use bytes::Bytes;
use criterion::Criterion;
use edgelimit::algorithm::composite::Mode;
use edgelimit::algorithm::outcome_from_reply;
use edgelimit::contract::{
    BackendReadiness, Certainty, CompositeOutcome, CompositeRequest, DecisionSource,
    RateLimitDecision, RateLimitOutcome, RateLimitPolicy, RateLimitPort, SubjectDigest,
};
use edgelimit::envoy::{wire, RateLimiter, ServiceSettings};
use edgelimit::policy::{LoadOptions, PolicySet};
use edgelimit::redis::{
    composite_invocation, invocation, parse_replies, parse_reply, CompositeCheck, KeyBuilder,
    Programs,
};
use edgelimit::subject::SubjectHasher;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use futures_util::FutureExt;
use prost::Message;
use zeroize::Zeroizing;

// ------------------------------------------------------------------ allocation counting --

/// Counts allocations, then forwards to the system allocator. Lives in this bench binary
/// only: the library keeps `#![forbid(unsafe_code)]`, and `GlobalAlloc` is an unsafe trait.
struct CountingAllocator;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

// SAFETY: every method forwards unchanged to `System`, which upholds the GlobalAlloc
// contract; the counter is a relaxed atomic with no effect on the allocation itself.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: CountingAllocator = CountingAllocator;

/// Average allocations per call of `f` (after one warm-up call).
fn allocations_per_call(mut f: impl FnMut()) -> f64 {
    f();
    const N: u64 = 2_000;
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    for _ in 0..N {
        f();
    }
    (ALLOCATIONS.load(Ordering::Relaxed) - before) as f64 / N as f64
}

// ------------------------------------------------------------------------------ fixtures --

/// A generated policy set of exactly 1,000 rules in domain `big`: 400 exact values, 300
/// wildcards (prefix, suffix and infix), key-only fallbacks, and 2-level nested rules;
/// plus the `bench/policies` files.
fn big_policy_set() -> PolicySet {
    let mut yaml = String::from("domain: big\ndescriptors:\n");
    let mut rules = 0;
    let mut push = |yaml: &mut String, text: String, count: usize| {
        yaml.push_str(&text);
        rules += count;
    };
    for i in 0..400 {
        push(
            &mut yaml,
            format!(
                "  - key: path\n    value: /api/v1/resource{i}\n    rate_limit: {{ unit: second, requests_per_unit: {} }}\n",
                1000 + i
            ),
            1,
        );
    }
    for i in 0..300 {
        let pattern = match i % 3 {
            0 => format!("/static/s{i}/*"),
            1 => format!("*.ext{i}"),
            _ => format!("/files/f{i}/*/raw"),
        };
        push(
            &mut yaml,
            format!(
                "  - key: path\n    value: \"{pattern}\"\n    rate_limit: {{ unit: minute, requests_per_unit: {} }}\n",
                100 + i
            ),
            1,
        );
    }
    push(
        &mut yaml,
        "  - key: path\n    rate_limit: { unit: second, requests_per_unit: 1000000000 }\n".into(),
        1,
    );
    push(
        &mut yaml,
        "  - key: client\n    rate_limit: { unit: second, requests_per_unit: 1000000000 }\n".into(),
        1,
    );
    for i in 0..149 {
        push(
            &mut yaml,
            format!(
                "  - key: tenant\n    value: t{i}\n    descriptors:\n      - key: route\n        rate_limit: {{ unit: second, requests_per_unit: {} }}\n",
                500 + i
            ),
            2,
        );
    }
    assert_eq!(rules, 1000, "fixture must hold exactly 1,000 rules");
    let mut sources = vec![(PathBuf::from("big.yaml"), yaml)];
    let bench_dir = concat!(env!("CARGO_MANIFEST_DIR"), "/bench/policies");
    for entry in std::fs::read_dir(bench_dir).expect("bench/policies") {
        let path = entry.expect("dir entry").path();
        if path.extension().is_some_and(|e| e == "yaml") {
            let text = std::fs::read_to_string(&path).expect("read policy");
            sources.push((path, text));
        }
    }
    let set = PolicySet::from_sources(sources, &LoadOptions::default())
        .unwrap_or_else(|e| panic!("bench policies must load:\n{e}"));
    assert!(set.len() >= 1000);
    set
}

fn hasher() -> SubjectHasher {
    SubjectHasher::new(Zeroizing::new(vec![7; 48])).expect("secret")
}

fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(k, v)| Entry {
                key: (*k).to_owned(),
                value: (*v).to_owned(),
            })
            .collect(),
        ..Default::default()
    }
}

fn request(domain: &str, descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.to_owned(),
        descriptors,
        hits_addend: 0,
    }
}

/// Benchmark fixture, not a product mock: a port that answers every evaluation with the same
/// allowed decision, so `decide` is measured without any backend work or I/O.
struct FixedDecision {
    allowed: bool,
}

impl FixedDecision {
    fn decision(&self, policy: &RateLimitPolicy) -> RateLimitOutcome {
        RateLimitOutcome::Evaluated(RateLimitDecision {
            allowed: self.allowed,
            limit: policy.params().limit(),
            remaining: if self.allowed {
                policy.params().limit() / 2
            } else {
                0
            },
            retry_after: if self.allowed {
                Duration::ZERO
            } else {
                Duration::from_millis(400)
            },
            reset_at_ms: 1_700_000_000_600,
            decided_at_ms: 1_700_000_000_200,
            policy_id: policy.id().clone(),
            policy_revision: policy.revision(),
            source: DecisionSource::GlobalRedis,
            certainty: Certainty::Certain,
        })
    }
}

impl RateLimitPort for FixedDecision {
    async fn evaluate_all(&self, request: &CompositeRequest<'_>) -> CompositeOutcome {
        CompositeOutcome::uniform(request, |policy| self.decision(policy))
    }

    async fn readiness(&self) -> BackendReadiness {
        BackendReadiness::Ready
    }

    fn describe(&self) -> String {
        "fixed decision (benchmark fixture)".into()
    }
}

/// Benchmark fixture: does every CPU step of the Redis backend except the socket — state key,
/// EVALSHA command, RESP packing, parsing a canned reply and turning it into an outcome.
struct RedisCpuOnly {
    keys: KeyBuilder,
    programs: Programs,
}

fn canned_reply(limit: u64) -> ::redis::Value {
    use ::redis::Value;
    let now = 1_700_000_000_200i64;
    Value::Array(vec![
        Value::BulkString(b"ALLOWED".to_vec()),
        Value::Int(now),
        Value::Int(now),
        Value::Int(limit as i64),
        Value::Int(limit as i64 / 2),
        Value::Int(0),
        Value::Int(now + 800),
    ])
}

impl RateLimitPort for RedisCpuOnly {
    async fn evaluate_all(&self, request: &CompositeRequest<'_>) -> CompositeOutcome {
        let checks = request.checks();
        let keys: Vec<String> = checks
            .iter()
            .map(|c| self.keys.state_key(c.policy(), c.subject()))
            .collect();
        let policies: Vec<&RateLimitPolicy> = checks.iter().map(|c| c.policy()).collect();
        let replies = if let [check] = checks {
            let program = self.programs.for_algorithm(check.policy().algorithm());
            let cmd = invocation(
                program,
                false,
                &keys[0],
                check.policy(),
                check.cost().units(),
                None,
            );
            black_box(cmd.get_packed_command());
            let value = canned_reply(check.policy().params().limit());
            vec![parse_reply(&value, check.policy()).expect("canned reply parses")]
        } else {
            let calls: Vec<CompositeCheck<'_>> = checks
                .iter()
                .enumerate()
                .map(|(key, c)| CompositeCheck {
                    key,
                    policy: c.policy(),
                    cost: c.cost().units(),
                    shadow: c.is_shadow(),
                })
                .collect();
            let key_refs: Vec<&str> = keys.iter().map(String::as_str).collect();
            let cmd = composite_invocation(
                self.programs.composite(),
                false,
                Mode::Commit,
                &key_refs,
                &calls,
                None,
            );
            black_box(cmd.get_packed_command());
            let value = ::redis::Value::Array(
                policies
                    .iter()
                    .map(|p| canned_reply(p.params().limit()))
                    .collect(),
            );
            parse_replies(&value, &policies).expect("canned replies parse")
        };
        CompositeOutcome::new(
            policies
                .iter()
                .zip(replies)
                .map(|(policy, reply)| {
                    outcome_from_reply(
                        &reply,
                        policy,
                        DecisionSource::GlobalRedis,
                        Duration::from_secs(1),
                    )
                })
                .collect(),
        )
    }

    async fn readiness(&self) -> BackendReadiness {
        BackendReadiness::Ready
    }

    fn describe(&self) -> String {
        "redis CPU only (benchmark fixture)".into()
    }
}

fn limiter<B: RateLimitPort>(policies: &Arc<ArcSwap<PolicySet>>, backend: B) -> RateLimiter<B> {
    RateLimiter::new(
        policies.clone(),
        Arc::new(backend),
        Arc::new(hasher()),
        ServiceSettings::default(),
    )
}

fn decide_now<B: RateLimitPort>(
    limiter: &RateLimiter<B>,
    req: &RateLimitRequest,
) -> RateLimitResponse {
    decide_wire_now(limiter, &wire::Request::from(req))
}

fn decide_wire_now<B: RateLimitPort>(
    limiter: &RateLimiter<B>,
    req: &wire::Request,
) -> RateLimitResponse {
    limiter
        .decide_wire(req, Instant::now() + Duration::from_secs(1))
        .now_or_never()
        .expect("fixture ports answer without waiting")
        .expect("valid request")
}

/// The whole per-request CPU path as the server runs it, minus the network and HTTP/2:
/// decode the protobuf request as the service does (`wire::Request` from the call's message
/// buffer, its bytes fields slices of it), decide, encode the protobuf response.
fn wire_round<B: RateLimitPort>(limiter: &RateLimiter<B>, message: &Bytes) -> Vec<u8> {
    let req = wire::Request::decode(message.clone()).expect("decodes");
    decide_wire_now(limiter, &req).encode_to_vec()
}

struct Cases {
    hot: RateLimitRequest,
    multi: RateLimitRequest,
    big_exact: RateLimitRequest,
    big_wildcard: RateLimitRequest,
    big_fallback: RateLimitRequest,
    big_nested: RateLimitRequest,
}

fn cases() -> Cases {
    Cases {
        hot: request(
            "bench_fixed_window",
            vec![descriptor(&[("client", "203.0.113.7")])],
        ),
        multi: request(
            "bench_fixed_window",
            vec![
                descriptor(&[("client", "203.0.113.7")]),
                descriptor(&[("route", "/api/v1/orders")]),
                descriptor(&[("user", "u-0123456789")]),
            ],
        ),
        big_exact: request("big", vec![descriptor(&[("path", "/api/v1/resource250")])]),
        big_wildcard: request("big", vec![descriptor(&[("path", "/files/f296/x/raw")])]),
        // Matches no exact value and no wildcard: every wildcard of the key is tried.
        big_fallback: request(
            "big",
            vec![descriptor(&[("path", "/nothing/matches/this")])],
        ),
        big_nested: request(
            "big",
            vec![descriptor(&[("tenant", "t140"), ("route", "/checkout")])],
        ),
    }
}

// ---------------------------------------------------------------------------- benchmarks --

fn report_allocations(policies: &Arc<ArcSwap<PolicySet>>) {
    let c = cases();
    let fixed = limiter(policies, FixedDecision { allowed: true });
    let denied = limiter(policies, FixedDecision { allowed: false });
    let redis_cpu = limiter(
        policies,
        RedisCpuOnly {
            keys: KeyBuilder::default(),
            programs: Programs::load(),
        },
    );
    let h = hasher();
    let set = policies.load_full();
    let hot_bytes = Bytes::from(c.hot.encode_to_vec());
    let big_bytes = Bytes::from(c.big_fallback.encode_to_vec());
    let rows: Vec<(&str, f64)> = vec![
        (
            "match 1,000 rules, key-only fallback",
            allocations_per_call(|| {
                black_box(set.find("big", [("path", "/nothing/matches/this")]));
            }),
        ),
        (
            "hmac subject digest",
            allocations_per_call(|| {
                black_box(h.digest(b"bench", [("client", "203.0.113.7")].into_iter()));
            }),
        ),
        (
            "decide, fixed port, 1 descriptor",
            allocations_per_call(|| {
                black_box(decide_now(&fixed, &c.hot));
            }),
        ),
        (
            "decide, fixed port, denied",
            allocations_per_call(|| {
                black_box(decide_now(&denied, &c.hot));
            }),
        ),
        (
            "decide, fixed port, 3 descriptors",
            allocations_per_call(|| {
                black_box(decide_now(&fixed, &c.multi));
            }),
        ),
        (
            "decide, redis CPU path, 1 descriptor",
            allocations_per_call(|| {
                black_box(decide_now(&redis_cpu, &c.hot));
            }),
        ),
        (
            "wire: decode + decide + encode (hot)",
            allocations_per_call(|| {
                black_box(wire_round(&fixed, &hot_bytes));
            }),
        ),
        (
            "wire: decode + decide + encode (1,000 rules)",
            allocations_per_call(|| {
                black_box(wire_round(&redis_cpu, &big_bytes));
            }),
        ),
    ];
    println!("heap allocations per call:");
    for (name, n) in rows {
        println!("  {name:<48} {n:>6.1}");
    }
}

fn benches(c: &mut Criterion, policies: &Arc<ArcSwap<PolicySet>>) {
    let k = cases();
    let set = policies.load_full();

    let mut g = c.benchmark_group("match_1000_rules");
    let entries = |d: &RateLimitRequest| -> Vec<(String, String)> {
        d.descriptors[0]
            .entries
            .iter()
            .map(|e| (e.key.clone(), e.value.clone()))
            .collect()
    };
    for (name, req) in [
        ("exact", &k.big_exact),
        ("wildcard", &k.big_wildcard),
        ("key_only_fallback", &k.big_fallback),
        ("nested_2_levels", &k.big_nested),
    ] {
        let e = entries(req);
        g.bench_function(name, |b| {
            b.iter(|| {
                black_box(set.find(
                    black_box("big"),
                    e.iter().map(|(k, v)| (k.as_str(), v.as_str())),
                ))
            })
        });
    }
    g.finish();

    let h = hasher();
    c.bench_function("hmac_subject_digest", |b| {
        b.iter(|| {
            black_box(h.digest(
                black_box(&b"bench"[..]),
                [("client", "203.0.113.7")].into_iter(),
            ))
        })
    });

    let rule = set
        .find("bench_fixed_window", [("client", "x")])
        .expect("bench rule");
    let policy = rule.limits[0].policy.clone();
    let subject = SubjectDigest::from_bytes([0x5a; 32]);
    let keys = KeyBuilder::default();
    let programs = Programs::load();
    c.bench_function("redis_state_key", |b| {
        b.iter(|| black_box(keys.state_key(black_box(&policy), black_box(&subject))))
    });
    let key = keys.state_key(&policy, &subject);
    c.bench_function("redis_evalsha_build_and_pack", |b| {
        b.iter(|| {
            let program = programs.for_algorithm(policy.algorithm());
            black_box(
                invocation(
                    program,
                    false,
                    &key,
                    &policy,
                    black_box(1),
                    Some(1_700_000_000_000),
                )
                .get_packed_command(),
            )
        })
    });
    let reply = canned_reply(policy.params().limit());
    c.bench_function("redis_reply_parse", |b| {
        b.iter(|| black_box(parse_reply(black_box(&reply), &policy)))
    });

    let fixed = limiter(policies, FixedDecision { allowed: true });
    let denied = limiter(policies, FixedDecision { allowed: false });
    let redis_cpu = limiter(
        policies,
        RedisCpuOnly {
            keys: KeyBuilder::default(),
            programs: Programs::load(),
        },
    );
    let response = decide_now(&fixed, &k.multi);
    c.bench_function("response_encode_3_statuses", |b| {
        b.iter(|| black_box(black_box(&response).encode_to_vec()))
    });

    let mut g = c.benchmark_group("decide");
    g.bench_function("fixed_port_hot", |b| {
        b.iter(|| black_box(decide_now(&fixed, &k.hot)))
    });
    g.bench_function("fixed_port_denied", |b| {
        b.iter(|| black_box(decide_now(&denied, &k.hot)))
    });
    g.bench_function("fixed_port_3_descriptors", |b| {
        b.iter(|| black_box(decide_now(&fixed, &k.multi)))
    });
    g.bench_function("fixed_port_1000_rules_fallback", |b| {
        b.iter(|| black_box(decide_now(&fixed, &k.big_fallback)))
    });
    g.bench_function("redis_cpu_hot", |b| {
        b.iter(|| black_box(decide_now(&redis_cpu, &k.hot)))
    });
    g.bench_function("redis_cpu_3_descriptors", |b| {
        b.iter(|| black_box(decide_now(&redis_cpu, &k.multi)))
    });
    g.finish();

    // Headline: the whole per-request CPU path without I/O, with 1,000 rules loaded.
    let mut g = c.benchmark_group("per_request_cpu");
    for (name, req) in [
        ("hot", &k.hot),
        ("1000_rules_exact", &k.big_exact),
        ("1000_rules_wildcard", &k.big_wildcard),
        ("1000_rules_fallback", &k.big_fallback),
        ("3_descriptors", &k.multi),
    ] {
        let bytes = Bytes::from(req.encode_to_vec());
        g.bench_function(name, |b| {
            b.iter(|| black_box(wire_round(&redis_cpu, &bytes)))
        });
    }
    g.finish();
}

fn main() {
    if std::env::var("EDGELIMIT_BENCH_RECORDER").as_deref() != Ok("none") {
        metrics_exporter_prometheus::PrometheusBuilder::new()
            .install_recorder()
            .expect("install the Prometheus recorder");
    }
    let policies = Arc::new(ArcSwap::from_pointee(big_policy_set()));
    report_allocations(&policies);
    let mut c = Criterion::default().configure_from_args();
    benches(&mut c, &policies);
    c.final_summary();
}
