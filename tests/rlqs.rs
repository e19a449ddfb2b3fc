//! Envoy's Rate Limit Quota Service end to end, against the real binary: simulated Envoy
//! instances written here behave like the `rate_limit_quota` filter (an initial report when
//! a bucket is created, a report every interval with the requests allowed and denied since
//! the last, assignments enforced locally with Envoy's token bucket: a changed assignment
//! starts a full bucket, an unchanged one keeps the running bucket, an expired one denies).
//!
//! Measured, per backend: N instances with skewed demand against one global limit; what they
//! admit in every full window (client clocks, the figure that matters) stays within the
//! limit plus the documented bound, and shares follow demand. Also: stream and bucket
//! bounds, abandon on policy removal (hot reload), deny when the backend is down, and a
//! vanished instance's share returning to the pool. Every run is a few seconds.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use envoy_types::pb::envoy::r#type::v3::rate_limit_strategy::{BlanketRule, Strategy as PbStrategy};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::BucketAction as Action;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::BucketAction;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_client::RateLimitQuotaServiceClient;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
    BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Streaming;

use common::backends::{Backend, Deployment};
use common::server::{wait_until, EdgelimitServer, ServerOptions};

const DOMAIN: &str = "quota";
/// A value that must never reach Redis, logs or metrics.
const SECRET_TENANT: &str = "tenant-secret-value-7f3a";
const LIMIT: u64 = 200;

fn policy(limit: u64) -> String {
    format!(
        "domain: {DOMAIN}\ndescriptors:\n  - key: tenant\n    descriptors:\n      - key: api\n        value: search\n        rate_limit:\n          unit: second\n          requests_per_unit: {limit}\n  - key: bucket\n    rate_limit:\n      algorithm: token_bucket\n      unit: second\n      requests_per_unit: 10\n      burst: 50\n"
    )
}

const RLQS_CONFIG: &str = "rlqs:\n  assignment_ttl: 1s\n";

fn bucket(entries: &[(&str, &str)]) -> BucketId {
    BucketId {
        bucket: entries
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    }
}

fn search_bucket() -> BucketId {
    // Keys in the other order than the policy tree: the map order does not matter.
    bucket(&[("api", "search"), ("tenant", SECRET_TENANT)])
}

fn report(buckets: &[(&BucketId, u64, u64)]) -> RateLimitQuotaUsageReports {
    RateLimitQuotaUsageReports {
        domain: DOMAIN.into(),
        bucket_quota_usages: buckets
            .iter()
            .map(|(id, allowed, denied)| BucketQuotaUsage {
                bucket_id: Some((*id).clone()),
                // Envoy sends whole seconds; the server measures intervals itself.
                time_elapsed: Some(Default::default()),
                num_requests_allowed: *allowed,
                num_requests_denied: *denied,
            })
            .collect(),
    }
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// What the filter enforces locally for one bucket.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Local {
    /// Before the first assignment: the example's `no_assignment_behavior` is deny.
    Unassigned,
    Allow,
    Deny,
    Bucket {
        max: u32,
        per_fill: u32,
        fill_secs: u32,
    },
}

/// Envoy's local enforcement of one bucket's assignment.
struct Enforcer {
    local: Local,
    tokens: f64,
    refilled: Instant,
    expires: Option<Instant>,
    allowed: u64,
    denied: u64,
    assignments: u64,
    abandoned: bool,
}

impl Enforcer {
    fn new() -> Self {
        Self {
            local: Local::Unassigned,
            tokens: 0.0,
            refilled: Instant::now(),
            expires: None,
            allowed: 0,
            denied: 0,
            assignments: 0,
            abandoned: false,
        }
    }

    fn apply(&mut self, action: &BucketAction) {
        let now = Instant::now();
        match &action.bucket_action {
            Some(Action::AbandonAction(_)) => {
                self.abandoned = true;
                self.local = Local::Unassigned;
                self.expires = None;
            }
            Some(Action::QuotaAssignmentAction(assignment)) => {
                self.assignments += 1;
                let ttl = assignment
                    .assignment_time_to_live
                    .map(|d| Duration::new(d.seconds as u64, d.nanos as u32))
                    .unwrap_or_default();
                self.expires = Some(now + ttl);
                let new = match assignment
                    .rate_limit_strategy
                    .as_ref()
                    .and_then(|s| s.strategy)
                {
                    Some(PbStrategy::BlanketRule(r)) if r == BlanketRule::AllowAll as i32 => {
                        Local::Allow
                    }
                    Some(PbStrategy::TokenBucket(tb)) => Local::Bucket {
                        max: tb.max_tokens,
                        per_fill: tb.tokens_per_fill.map_or(1, |v| v.value),
                        fill_secs: tb.fill_interval.map_or(1, |d| d.seconds.max(1) as u32),
                    },
                    _ => Local::Deny,
                };
                // Envoy keeps the running token bucket of an unchanged assignment.
                if new != self.local {
                    if let Local::Bucket { max, .. } = new {
                        self.tokens = f64::from(max);
                        self.refilled = now;
                    }
                    self.local = new;
                }
            }
            None => {}
        }
    }

    fn admit(&mut self) -> bool {
        let now = Instant::now();
        // The example's `expired_assignment_behavior` is deny.
        let expired = self.expires.is_some_and(|e| now >= e);
        let ok = !expired
            && match self.local {
                Local::Unassigned | Local::Deny => false,
                Local::Allow => true,
                Local::Bucket {
                    max,
                    per_fill,
                    fill_secs,
                } => {
                    let rate = f64::from(per_fill) / f64::from(fill_secs.max(1));
                    let elapsed = now.duration_since(self.refilled).as_secs_f64();
                    self.tokens = (self.tokens + rate * elapsed).min(f64::from(max));
                    self.refilled = now;
                    if self.tokens >= 1.0 {
                        self.tokens -= 1.0;
                        true
                    } else {
                        false
                    }
                }
            };
        if ok {
            self.allowed += 1;
        } else {
            self.denied += 1;
        }
        ok
    }

    fn take_usage(&mut self) -> (u64, u64) {
        (
            std::mem::take(&mut self.allowed),
            std::mem::take(&mut self.denied),
        )
    }
}

/// An RLQS stream, as the filter opens it: the first report goes out with the stream.
struct QuotaStream {
    tx: mpsc::Sender<RateLimitQuotaUsageReports>,
    responses: Streaming<RateLimitQuotaResponse>,
}

impl QuotaStream {
    async fn open(
        port: u16,
        first: RateLimitQuotaUsageReports,
    ) -> Result<QuotaStream, tonic::Status> {
        let mut client = RateLimitQuotaServiceClient::connect(format!("http://127.0.0.1:{port}"))
            .await
            .expect("connect");
        let (tx, rx) = mpsc::channel(16);
        tx.send(first).await.expect("queue the first report");
        let responses = client
            .stream_rate_limit_quotas(ReceiverStream::new(rx))
            .await?
            .into_inner();
        Ok(QuotaStream { tx, responses })
    }

    async fn next(&mut self) -> RateLimitQuotaResponse {
        tokio::time::timeout(Duration::from_secs(5), self.responses.message())
            .await
            .expect("an answer within 5 s")
            .expect("stream ok")
            .expect("stream open")
    }

    async fn exchange(&mut self, reports: RateLimitQuotaUsageReports) -> RateLimitQuotaResponse {
        self.tx.send(reports).await.expect("send report");
        self.next().await
    }
}

fn only_action(response: &RateLimitQuotaResponse) -> &Action {
    assert_eq!(response.bucket_action.len(), 1, "{response:?}");
    response.bucket_action[0]
        .bucket_action
        .as_ref()
        .expect("an action")
}

fn strategy_of(action: &Action) -> Option<PbStrategy> {
    match action {
        Action::QuotaAssignmentAction(a) => a.rate_limit_strategy.and_then(|s| s.strategy),
        Action::AbandonAction(_) => None,
    }
}

fn is_deny_all(action: &Action) -> bool {
    strategy_of(action) == Some(PbStrategy::BlanketRule(BlanketRule::DenyAll as i32))
}

fn is_allow_all(action: &Action) -> bool {
    strategy_of(action) == Some(PbStrategy::BlanketRule(BlanketRule::AllowAll as i32))
}

fn token_rate(action: &Action) -> Option<f64> {
    match strategy_of(action)? {
        PbStrategy::TokenBucket(tb) => {
            let secs = tb.fill_interval.map_or(1, |d| d.seconds.max(1));
            Some(f64::from(tb.tokens_per_fill.map_or(1, |v| v.value)) / secs as f64)
        }
        _ => None,
    }
}

/// What one simulated instance did.
struct InstanceRun {
    demand: f64,
    admitted: u64,
    denied: u64,
    assignments: u64,
}

/// One simulated Envoy: `demand` requests per second into one bucket for `run_for`,
/// reporting every `interval`; each admission's Unix millisecond goes into `log`.
async fn simulate(
    port: u16,
    id: BucketId,
    demand: f64,
    interval: Duration,
    run_for: Duration,
    log: Arc<Mutex<Vec<u64>>>,
) -> InstanceRun {
    let enforcer = Arc::new(Mutex::new(Enforcer::new()));
    let QuotaStream { tx, mut responses } = QuotaStream::open(port, report(&[(&id, 0, 0)]))
        .await
        .expect("stream opens");
    let reader_enforcer = Arc::clone(&enforcer);
    let reader = tokio::spawn(async move {
        while let Ok(Some(response)) = responses.message().await {
            let mut e = reader_enforcer.lock().unwrap();
            for action in &response.bucket_action {
                e.apply(action);
            }
        }
    });
    let started = Instant::now();
    let mut last_report = started;
    let mut last_tick = started;
    let mut owed = 0.0;
    let mut admitted = 0;
    let mut denied = 0;
    let mut tick = tokio::time::interval(Duration::from_millis(5));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    while started.elapsed() < run_for {
        tick.tick().await;
        let now = Instant::now();
        owed += demand * now.duration_since(last_tick).as_secs_f64();
        last_tick = now;
        {
            let mut e = enforcer.lock().unwrap();
            while owed >= 1.0 {
                owed -= 1.0;
                if e.admit() {
                    admitted += 1;
                    log.lock().unwrap().push(unix_ms());
                } else {
                    denied += 1;
                }
            }
        }
        if now.duration_since(last_report) >= interval {
            last_report = now;
            let (a, d) = enforcer.lock().unwrap().take_usage();
            if tx.send(report(&[(&id, a, d)])).await.is_err() {
                break;
            }
        }
    }
    drop(tx);
    let _ = tokio::time::timeout(Duration::from_secs(2), reader).await;
    let assignments = enforcer.lock().unwrap().assignments;
    InstanceRun {
        demand,
        admitted,
        denied,
        assignments,
    }
}

/// What a run of N instances measured.
#[derive(Debug)]
struct Measured {
    /// Admissions per full window (client clocks).
    windows: Vec<u64>,
    /// Each instance's fraction of all admissions and of all demand.
    shares: Vec<(f64, f64)>,
}

async fn run_instances(port: u16, demands: &[f64], interval: Duration, seconds: u64) -> Measured {
    let log = Arc::new(Mutex::new(Vec::new()));
    let run_for = Duration::from_secs(seconds) + Duration::from_millis(300);
    let runs: Vec<_> = demands
        .iter()
        .map(|&demand| {
            tokio::spawn(simulate(
                port,
                search_bucket(),
                demand,
                interval,
                run_for,
                Arc::clone(&log),
            ))
        })
        .collect();
    let mut results = Vec::new();
    for run in runs {
        results.push(run.await.expect("instance task"));
    }
    let log = log.lock().unwrap().clone();
    let (first, last) = (
        log.iter().min().copied().unwrap_or(0) / 1000,
        log.iter().max().copied().unwrap_or(0) / 1000,
    );
    let mut per_window: BTreeMap<u64, u64> = BTreeMap::new();
    for ms in &log {
        *per_window.entry(ms / 1000).or_default() += 1;
    }
    // Full windows only: the first (start-up) and the last (cut short) are partial.
    let windows = (first + 1..last)
        .map(|w| per_window.get(&w).copied().unwrap_or(0))
        .collect();
    let total_admitted: u64 = results.iter().map(|r| r.admitted).sum();
    let total_demand: f64 = results.iter().map(|r| r.demand).sum();
    let shares = results
        .iter()
        .map(|r| {
            (
                r.admitted as f64 / total_admitted.max(1) as f64,
                r.demand / total_demand,
            )
        })
        .collect();
    for r in &results {
        assert!(r.assignments > 0, "every instance got assignments");
        assert!(r.admitted + r.denied > 0);
    }
    Measured { windows, shares }
}

/// Over-admission allowed per window, as documented in the README: one report interval of
/// the limit's rate (admissions reported in the next window) plus one token per instance,
/// with a margin for the shared 2-core test machines.
fn bound(interval: Duration, instances: usize) -> u64 {
    let lag = (LIMIT as f64 * interval.as_secs_f64()).ceil() as u64;
    LIMIT + 2 * lag + instances as u64
}

async fn global_limit_holds(backend: Backend) {
    let name = "p.yaml";
    let deployment = Deployment::start_with(backend, &[(name, &policy(LIMIT))], RLQS_CONFIG);
    let port = deployment.server.grpc_port;
    let interval = Duration::from_millis(100);
    // Skewed: 3:2:1:... of 500 req/s in all against 200/s.
    let demands = [250.0, 150.0, 60.0, 40.0];
    let measured = run_instances(port, &demands, interval, 4).await;
    let max = measured.windows.iter().copied().max().unwrap_or(0);
    let mean = measured.windows.iter().sum::<u64>() as f64 / measured.windows.len().max(1) as f64;
    eprintln!(
        "RLQS {backend:?} interval {interval:?}: admitted per full window {:?} (limit {LIMIT}, max {max}, mean {mean:.1}); shares (admitted, demand) {:?}; overshoot counted {}",
        measured.windows,
        measured.shares,
        deployment.metric("edgelimit_rlqs_overshoot_requests_total", &[]),
    );
    assert!(measured.windows.len() >= 2, "{measured:?}");
    let allowed = bound(interval, demands.len());
    for &w in &measured.windows {
        assert!(
            w <= allowed,
            "a window admitted {w} > {allowed}: {measured:?}"
        );
    }
    assert!(
        mean >= LIMIT as f64 * 0.6,
        "the quota is used, not starved: mean {mean}"
    );
    for &(admitted, demand) in &measured.shares {
        assert!(
            (admitted - demand).abs() <= 0.1,
            "shares follow demand: {measured:?}"
        );
    }
    // Privacy: the bucket's values never reach Redis, logs or metrics.
    for (key, fields) in deployment.stored() {
        assert!(!key.contains(SECRET_TENANT), "{key}");
        assert!(fields
            .iter()
            .all(|(f, v)| !f.contains(SECRET_TENANT) && !v.contains(SECRET_TENANT)));
    }
    assert!(!deployment.server.log_text().contains(SECRET_TENANT));
    assert!(!deployment.server.metrics().contains(SECRET_TENANT));
    let sent = deployment.metric(
        "edgelimit_rlqs_assignments_total",
        &[("action", "token_bucket")],
    );
    assert!(sent > 0.0, "assignments are counted");
}

on_every_backend!(global_limit, global_limit_holds);

/// The same on Redis with Envoy's reports every 200 ms: the bound grows with the interval.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn global_limit_holds_with_200ms_reports() {
    let deployment =
        Deployment::start_with(Backend::Redis, &[("p.yaml", &policy(LIMIT))], RLQS_CONFIG);
    let interval = Duration::from_millis(200);
    let demands = [300.0, 100.0, 100.0];
    let measured = run_instances(deployment.server.grpc_port, &demands, interval, 4).await;
    let max = measured.windows.iter().copied().max().unwrap_or(0);
    eprintln!(
        "RLQS Redis interval {interval:?}: admitted per full window {:?} (limit {LIMIT}, max {max}); shares {:?}",
        measured.windows, measured.shares
    );
    let allowed = bound(interval, demands.len());
    for &w in &measured.windows {
        assert!(
            w <= allowed,
            "a window admitted {w} > {allowed}: {measured:?}"
        );
    }
    for &(admitted, demand) in &measured.shares {
        assert!((admitted - demand).abs() <= 0.12, "{measured:?}");
    }
}

fn memory_server(extra: &str) -> EdgelimitServer {
    EdgelimitServer::start(
        ServerOptions::memory(&[("p.yaml", &policy(LIMIT))])
            .extra(RLQS_CONFIG)
            .extra(extra),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_and_buckets_per_stream_are_bounded() {
    let server = memory_server("  max_streams: 2\n  max_buckets_per_stream: 2\n");
    let port = server.grpc_port;
    let a = bucket(&[("tenant", "a"), ("api", "search")]);
    let b = bucket(&[("tenant", "b"), ("api", "search")]);
    let c = bucket(&[("tenant", "c"), ("api", "search")]);
    let mut first = QuotaStream::open(port, report(&[(&a, 1, 0), (&b, 1, 0), (&c, 1, 0)]))
        .await
        .expect("first stream");
    let answer = first.next().await;
    assert_eq!(answer.bucket_action.len(), 3);
    let actions: Vec<&Action> = answer
        .bucket_action
        .iter()
        .map(|a| a.bucket_action.as_ref().unwrap())
        .collect();
    assert!(token_rate(actions[0]).is_some() && token_rate(actions[1]).is_some());
    assert!(
        is_deny_all(actions[2]),
        "the third bucket is over the bound"
    );
    // Known buckets are still answered once the stream is full.
    let again = first.exchange(report(&[(&b, 1, 0)])).await;
    assert!(token_rate(only_action(&again)).is_some());

    let mut second = QuotaStream::open(port, report(&[(&a, 0, 0)]))
        .await
        .expect("second stream");
    second.next().await;
    let third = QuotaStream::open(port, report(&[(&a, 0, 0)])).await;
    let refused = match third {
        Err(status) => status,
        Ok(mut s) => {
            let r = tokio::time::timeout(Duration::from_secs(5), s.responses.message())
                .await
                .expect("answered");
            r.expect_err("the third stream is refused")
        }
    };
    assert_eq!(
        refused.code(),
        tonic::Code::ResourceExhausted,
        "{refused:?}"
    );
    let metrics = server.metrics();
    assert_eq!(
        common::server::metric(&metrics, "edgelimit_rlqs_streams_refused_total", &[]),
        Some(1.0)
    );
    assert_eq!(
        common::server::metric(
            &metrics,
            "edgelimit_rlqs_buckets_refused_total",
            &[("reason", "max_buckets_per_stream")]
        ),
        Some(1.0)
    );
    assert_eq!(
        common::server::metric(&metrics, "edgelimit_rlqs_streams", &[]),
        Some(2.0)
    );
    // A closed stream frees its place.
    drop(first);
    assert!(
        wait_until(Duration::from_secs(5), || common::server::metric(
            &server.metrics(),
            "edgelimit_rlqs_streams",
            &[]
        ) == Some(1.0)),
        "the closed stream is counted out"
    );
    let mut fourth = QuotaStream::open(port, report(&[(&c, 0, 0)]))
        .await
        .expect("a place is free again");
    assert!(token_rate(only_action(&fourth.next().await)).is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_policy_abandons_its_buckets() {
    let server = memory_server("");
    let id = search_bucket();
    let mut stream = QuotaStream::open(server.grpc_port, report(&[(&id, 0, 0)]))
        .await
        .expect("stream");
    assert!(token_rate(only_action(&stream.next().await)).is_some());
    let unmatched = bucket(&[("nothing", "here")]);
    let open = stream.exchange(report(&[(&unmatched, 3, 0)])).await;
    assert!(
        is_allow_all(only_action(&open)),
        "no rule, no limit: {open:?}"
    );

    // Hot reload without the rule: the next report is answered abandon.
    server.write_policy(
        "p.yaml",
        &format!("domain: {DOMAIN}\ndescriptors:\n  - key: other\n    rate_limit:\n      unit: second\n      requests_per_unit: 1\n"),
    );
    let deadline = Instant::now() + Duration::from_secs(15);
    let abandoned = loop {
        let answer = stream.exchange(report(&[(&id, 1, 0)])).await;
        if matches!(only_action(&answer), Action::AbandonAction(_)) {
            break true;
        }
        assert!(token_rate(only_action(&answer)).is_some(), "{answer:?}");
        if Instant::now() > deadline {
            break false;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(abandoned, "the removed policy's bucket was abandoned");
    // Envoy recreates the bucket on its next request: nothing limits it now.
    let after = stream.exchange(report(&[(&id, 1, 0)])).await;
    assert!(is_allow_all(only_action(&after)), "{after:?}");
    assert!(
        common::server::metric(
            &server.metrics(),
            "edgelimit_rlqs_assignments_total",
            &[("action", "abandon")]
        )
        .unwrap_or(0.0)
            >= 1.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_that_cannot_decide_is_answered_deny_all() {
    let mut deployment =
        Deployment::start_with(Backend::Redis, &[("p.yaml", &policy(LIMIT))], RLQS_CONFIG);
    let id = search_bucket();
    let mut stream = QuotaStream::open(deployment.server.grpc_port, report(&[(&id, 1, 0)]))
        .await
        .expect("stream");
    assert!(token_rate(only_action(&stream.next().await)).is_some());
    deployment.redis.as_mut().expect("redis").stop();
    let answer = stream.exchange(report(&[(&id, 5, 0)])).await;
    let action = only_action(&answer);
    assert!(is_deny_all(action), "fail closed: {answer:?}");
    let Action::QuotaAssignmentAction(a) = action else {
        unreachable!()
    };
    assert_eq!(
        a.assignment_time_to_live.map(|d| d.seconds),
        Some(1),
        "for one assignment TTL"
    );
    assert!(
        deployment.metric(
            "edgelimit_rlqs_assignments_total",
            &[("action", "fail_closed")]
        ) >= 1.0
    );
    // Back: assignments resume.
    deployment.redis.as_mut().expect("redis").restart();
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let answer = stream.exchange(report(&[(&id, 0, 0)])).await;
        if token_rate(only_action(&answer)).is_some() {
            break;
        }
        assert!(is_deny_all(only_action(&answer)));
        assert!(
            Instant::now() < deadline,
            "assignments resume after Redis is back"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vanished_instance_returns_its_share_after_one_ttl() {
    let server = memory_server("");
    // A token bucket (10/s, burst 50): shares of its refill and stock, whatever the time.
    let id = bucket(&[("bucket", "x")]);
    let port = server.grpc_port;
    let mut a = QuotaStream::open(port, report(&[(&id, 0, 0)]))
        .await
        .expect("a");
    a.next().await;
    let mut b = QuotaStream::open(port, report(&[(&id, 0, 0)]))
        .await
        .expect("b");
    b.next().await;
    let mut shared = HashMap::new();
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let ra = a.exchange(report(&[(&id, 0, 10)])).await;
        let rb = b.exchange(report(&[(&id, 0, 10)])).await;
        shared.insert("a", token_rate(only_action(&ra)).expect("a token bucket"));
        shared.insert("b", token_rate(only_action(&rb)).expect("b token bucket"));
    }
    let half = shared["a"];
    assert!(
        (shared["a"] / shared["b"] - 1.0).abs() < 0.3,
        "equal demand, equal shares: {shared:?}"
    );
    drop(b);
    // Within one TTL (1 s) plus a report, a's share grows to the whole rate.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let mut alone = 0.0;
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let ra = a.exchange(report(&[(&id, 0, 10)])).await;
        alone = token_rate(only_action(&ra)).expect("a token bucket");
    }
    assert!(
        alone > half * 1.6,
        "the vanished instance's share returned: {half} -> {alone}"
    );
}
