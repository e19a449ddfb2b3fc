//! Failure certainty at the provider level: the real `RedisBackend`, driven through the
//! `RateLimitPort` trait, against private redis-server processes (directly or through the
//! fault proxy). Each fault must yield the category the design assigns it, never an allow,
//! within the caller's deadline, and the backend must recover on its own once Redis is back.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::redis_server::RedisServer;
use common::tcp_proxy::{Mode, TcpProxy};
use edgelimit::contract::{
    AlgorithmParams, Cost, IncompatibleCause, IndeterminateCause, PolicyId, RateLimitOutcome,
    RateLimitPolicy, RateLimitPort, RateLimitRequest, SubjectDigest, UnavailableCause,
};
use edgelimit::redis::{RedisBackend, RedisSettings, Topology};

const DAY_MS: u64 = 86_400_000;
/// Caller deadline for every evaluation: well above any command timeout used here.
const CALLER_TIMEOUT: Duration = Duration::from_secs(3);
/// Bound for the backend to be usable again once Redis is (reconnect back-off ≤ 2 s).
const RECOVERY_BOUND: Duration = Duration::from_secs(15);

fn policy(limit: u64) -> RateLimitPolicy {
    RateLimitPolicy::new(
        PolicyId::new("faults").unwrap(),
        1,
        AlgorithmParams::FixedWindow {
            limit,
            window_ms: DAY_MS,
        },
        1,
        60_000,
        2_000,
    )
    .unwrap()
}

fn backend(
    url: &str,
    command_timeout: Duration,
    configure: impl FnOnce(&mut RedisSettings),
) -> RedisBackend {
    let mut settings = RedisSettings {
        topology: Topology::Standalone {
            url: url.to_owned(),
        },
        command_timeout,
        connect_timeout: Duration::from_millis(300),
        connections: 1,
        ..RedisSettings::default()
    };
    configure(&mut settings);
    RedisBackend::start(settings).expect("backend settings")
}

async fn connected(url: &str, command_timeout: Duration) -> RedisBackend {
    connected_with(url, command_timeout, |_| {}).await
}

async fn connected_with(
    url: &str,
    command_timeout: Duration,
    configure: impl FnOnce(&mut RedisSettings),
) -> RedisBackend {
    let b = backend(url, command_timeout, configure);
    assert!(
        b.wait_connected(Duration::from_secs(10)).await,
        "no connection to {url}"
    );
    b
}

fn subject(n: u8) -> SubjectDigest {
    SubjectDigest::from_bytes([n; 32])
}

/// One evaluation with the usual caller deadline; checks it came back before the deadline.
async fn eval(b: &RedisBackend, p: &RateLimitPolicy, s: u8) -> RateLimitOutcome {
    eval_within(b, p, s, CALLER_TIMEOUT).await
}

async fn eval_within(
    b: &RedisBackend,
    p: &RateLimitPolicy,
    s: u8,
    timeout: Duration,
) -> RateLimitOutcome {
    let started = Instant::now();
    let deadline = started + timeout;
    let request = RateLimitRequest::new(p, subject(s), Cost::consume(1).unwrap(), None, deadline)
        .expect("request");
    let outcome = b.evaluate(p, &request).await;
    assert!(
        Instant::now() <= deadline,
        "answered {:?} after the caller deadline: {outcome:?}",
        Instant::now() - deadline
    );
    outcome
}

fn allowed(o: &RateLimitOutcome) -> bool {
    o.is_allowed()
}

fn unavailable(cause: UnavailableCause) -> impl Fn(&RateLimitOutcome) -> bool {
    move |o| matches!(o, RateLimitOutcome::Unavailable { cause: c, .. } if *c == cause)
}

fn indeterminate(cause: IndeterminateCause) -> impl Fn(&RateLimitOutcome) -> bool {
    move |o| matches!(o, RateLimitOutcome::Indeterminate { cause: c, .. } if *c == cause)
}

fn incompatible(cause: IncompatibleCause) -> impl Fn(&RateLimitOutcome) -> bool {
    move |o| matches!(o, RateLimitOutcome::Incompatible { cause: c, .. } if *c == cause)
}

/// Evaluates until `want` holds (at most `tries` times, pausing between). Every outcome on the
/// way must satisfy `allowed_meanwhile`; returns all outcomes seen.
async fn until(
    b: &RedisBackend,
    p: &RateLimitPolicy,
    s: u8,
    tries: usize,
    want: impl Fn(&RateLimitOutcome) -> bool,
    allowed_meanwhile: impl Fn(&RateLimitOutcome) -> bool,
) -> Vec<RateLimitOutcome> {
    let mut seen = Vec::new();
    for _ in 0..tries {
        let o = eval(b, p, s).await;
        let done = want(&o);
        assert!(
            done || allowed_meanwhile(&o),
            "unexpected outcome {o:?} after {seen:?}"
        );
        seen.push(o);
        if done {
            return seen;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("wanted outcome not seen in {tries} tries: {seen:?}");
}

/// Polls until an evaluation is allowed again; fails after `RECOVERY_BOUND`. Everything before
/// must be a failure (never a denial: the limit is far away).
async fn recovers(b: &RedisBackend, p: &RateLimitPolicy, s: u8) -> Duration {
    let started = Instant::now();
    loop {
        let o = eval(b, p, s).await;
        if allowed(&o) {
            return started.elapsed();
        }
        assert!(
            !matches!(o, RateLimitOutcome::Evaluated(_)),
            "denied while recovering: {o:?}"
        );
        assert!(
            started.elapsed() < RECOVERY_BOUND,
            "no recovery within {RECOVERY_BOUND:?}; last {o:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn pre_send_or_lost(o: &RateLimitOutcome) -> bool {
    unavailable(UnavailableCause::ConnectFailed)(o)
        || indeterminate(IndeterminateCause::ConnectionLost)(o)
}

fn keys(redis: &RedisServer) -> Vec<String> {
    redis
        .cli(&["--raw", "KEYS", "edgelimit:*"])
        .lines()
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect()
}

fn stored_count(redis: &RedisServer) -> u64 {
    let keys = keys(redis);
    assert_eq!(keys.len(), 1, "{keys:?}");
    redis
        .cli(&["--raw", "HGET", &keys[0], "c"])
        .trim()
        .parse()
        .expect("count field")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_redis_is_lost_or_unavailable_and_an_empty_restart_recovers() {
    let mut redis = RedisServer::start();
    let b = connected(&redis.url(), Duration::from_millis(500)).await;
    let p = policy(1000);
    assert!(allowed(&eval(&b, &p, 1).await));
    tokio::task::block_in_place(|| redis.stop());
    // The first command on the dead connection may have been written: indeterminate. Once the
    // slot is empty nothing is sent: unavailable.
    until(
        &b,
        &p,
        1,
        100,
        unavailable(UnavailableCause::ConnectFailed),
        pre_send_or_lost,
    )
    .await;
    for _ in 0..5 {
        assert!(unavailable(UnavailableCause::ConnectFailed)(
            &eval(&b, &p, 1).await
        ));
    }
    assert_eq!(b.live_connections(), 0);
    tokio::task::block_in_place(|| redis.restart());
    recovers(&b, &p, 1).await;
    // Restarted empty: the script cache was empty (one resend) and the count started over.
    assert_eq!(stored_count(&redis), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_redis_times_out_indeterminate_then_is_detected_and_recovers() {
    let redis = RedisServer::start();
    let b = connected(&redis.url(), Duration::from_millis(300)).await;
    let p = policy(1000);
    let mut oks = u64::from(allowed(&eval(&b, &p, 1).await));
    redis.pause();
    let o = eval(&b, &p, 1).await;
    assert!(indeterminate(IndeterminateCause::Timeout)(&o), "{o:?}");
    // The timeout triggers a health check; the failed PING empties the slot, after which
    // requests are refused before sending (reconnecting cannot complete the handshake).
    until(
        &b,
        &p,
        1,
        60,
        unavailable(UnavailableCause::ConnectFailed),
        indeterminate(IndeterminateCause::Timeout),
    )
    .await;
    redis.resume();
    recovers(&b, &p, 1).await;
    oks += 1;
    // Timed-out commands ran once Redis resumed: they consumed quota nobody was granted.
    let stored = stored_count(&redis);
    assert!(oks <= stored, "allowed {oks} but only {stored} counted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn debug_sleep_past_the_command_timeout_is_indeterminate() {
    // Redis 7 disables DEBUG unless asked.
    let redis = Arc::new(RedisServer::start_with(&[
        "--enable-debug-command",
        "local",
    ]));
    let b = connected(&redis.url(), Duration::from_millis(300)).await;
    let p = policy(1000);
    assert!(allowed(&eval(&b, &p, 1).await));
    let sleeper = {
        let redis = redis.clone();
        std::thread::spawn(move || redis.cli(&["DEBUG", "SLEEP", "2"]))
    };
    // Until redis-cli's DEBUG SLEEP lands, requests may still be allowed.
    let seen = until(
        &b,
        &p,
        1,
        40,
        indeterminate(IndeterminateCause::Timeout),
        allowed,
    )
    .await;
    let oks = seen.iter().filter(|o| allowed(o)).count() as u64 + 1;
    tokio::task::block_in_place(|| sleeper.join().expect("sleeper"));
    recovers(&b, &p, 1).await;
    let stored = stored_count(&redis);
    assert!(oks < stored, "allowed {oks}+1, counted {stored}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_after_write_is_indeterminate_and_may_have_counted() {
    let redis = RedisServer::start();
    let proxy = TcpProxy::start(&redis.addr());
    let b = connected(&proxy.url(), Duration::from_secs(2)).await;
    let p = policy(1000);
    assert!(allowed(&eval(&b, &p, 1).await));
    tokio::task::block_in_place(|| proxy.set_mode(Mode::DropAfterWrite));
    let o = eval(&b, &p, 1).await;
    assert!(
        indeterminate(IndeterminateCause::ConnectionLost)(&o),
        "{o:?}"
    );
    assert!(proxy.dropped_after_write() >= 1);
    // The command reached Redis: it may well have run (it usually has, on loopback).
    let stored = stored_count(&redis);
    assert!((1..=2).contains(&stored), "{stored}");
    // Reconnecting fails too (the handshake is dropped): refused before sending.
    until(
        &b,
        &p,
        1,
        60,
        unavailable(UnavailableCause::ConnectFailed),
        pre_send_or_lost,
    )
    .await;
    tokio::task::block_in_place(|| proxy.set_mode(Mode::PassThrough));
    recovers(&b, &p, 1).await;
    assert!(stored_count(&redis) >= 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blackholed_connection_times_out_then_is_replaced() {
    let redis = RedisServer::start();
    let proxy = TcpProxy::start(&redis.addr());
    let b = connected(&proxy.url(), Duration::from_millis(300)).await;
    let p = policy(1000);
    assert!(allowed(&eval(&b, &p, 1).await));
    tokio::task::block_in_place(|| proxy.set_mode(Mode::Blackhole));
    let o = eval(&b, &p, 1).await;
    assert!(indeterminate(IndeterminateCause::Timeout)(&o), "{o:?}");
    until(
        &b,
        &p,
        1,
        60,
        unavailable(UnavailableCause::ConnectFailed),
        indeterminate(IndeterminateCause::Timeout),
    )
    .await;
    tokio::task::block_in_place(|| proxy.set_mode(Mode::PassThrough));
    recovers(&b, &p, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_connections_are_unavailable_and_send_nothing() {
    let redis = RedisServer::start();
    let proxy = TcpProxy::start(&redis.addr());
    let b = connected(&proxy.url(), Duration::from_secs(2)).await;
    let p = policy(1000);
    assert!(allowed(&eval(&b, &p, 1).await));
    tokio::task::block_in_place(|| proxy.set_mode(Mode::Refuse));
    until(
        &b,
        &p,
        1,
        60,
        unavailable(UnavailableCause::ConnectFailed),
        pre_send_or_lost,
    )
    .await;
    for _ in 0..5 {
        assert!(unavailable(UnavailableCause::ConnectFailed)(
            &eval(&b, &p, 1).await
        ));
    }
    assert_eq!(stored_count(&redis), 1, "nothing reached Redis");
    tokio::task::block_in_place(|| proxy.set_mode(Mode::PassThrough));
    recovers(&b, &p, 1).await;
    assert_eq!(stored_count(&redis), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delays_below_the_command_timeout_decide_and_above_it_are_indeterminate() {
    let redis = RedisServer::start();
    let proxy = TcpProxy::start(&redis.addr());
    let b = connected(&proxy.url(), Duration::from_millis(500)).await;
    let p = policy(1000);
    tokio::task::block_in_place(|| proxy.set_mode(Mode::Delay(Duration::from_millis(50))));
    assert!(allowed(&eval(&b, &p, 1).await));
    tokio::task::block_in_place(|| proxy.set_mode(Mode::Delay(Duration::from_millis(1500))));
    let o = eval(&b, &p, 1).await;
    assert!(indeterminate(IndeterminateCause::Timeout)(&o), "{o:?}");
    tokio::task::block_in_place(|| proxy.set_mode(Mode::PassThrough));
    recovers(&b, &p, 1).await;
    // The delayed command reached Redis after the deadline it carried: it did nothing (it
    // would otherwise have been counted for a request that was denied).
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let stored = stored_count(&redis);
    assert_eq!(stored, 2, "2 allowed, {stored} counted");
}

/// Redis's clock is read as the connection comes up, so even the first command carries its
/// deadline to Redis: one that times out in a paused Redis and runs once it resumes does
/// nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_command_after_connecting_carries_its_deadline_to_redis() {
    let redis = RedisServer::start();
    let b = connected(&redis.url(), Duration::from_millis(300)).await;
    let p = policy(1000);
    redis.pause();
    let o = eval(&b, &p, 1).await;
    assert!(indeterminate(IndeterminateCause::Timeout)(&o), "{o:?}");
    redis.resume();
    recovers(&b, &p, 1).await;
    let stored = stored_count(&redis);
    assert_eq!(stored, 1, "1 allowed, {stored} counted");
}

/// A batch's reply is awaited until its last member's deadline. Timeline (command timeout
/// 4 s, so each member's Redis deadline is 2 s after it was sent): A and B fill the window of
/// calls in flight and reach Redis at 3.3 s, past their Redis deadline (answered, nothing
/// done); C (queued at 0.1 s) and D (at 3.0 s) go together at 3.3 s and reach Redis at
/// 4.55 s, past C's Redis deadline but before D's. C, whose caller leaves it 100 ms past its
/// budget, has timed out at 4.15 s; D is answered, allowed and counted, rather than reported
/// undecided with the batch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_answers_its_later_members_after_an_earlier_one_timed_out() {
    let redis = RedisServer::start();
    let proxy = TcpProxy::start(&redis.addr());
    // Health checks must outlast the delays, or they would replace the connection.
    let b = Arc::new(
        connected_with(&proxy.url(), Duration::from_secs(4), |s| {
            s.connect_timeout = Duration::from_secs(10)
        })
        .await,
    );
    let p = policy(1000);
    assert!(allowed(&eval(&b, &p, 1).await));
    tokio::task::block_in_place(|| proxy.set_mode(Mode::Delay(Duration::from_millis(3300))));
    let start = Instant::now();
    let ask = |at_ms: u64, within_ms: u64| {
        let (b, p) = (b.clone(), p.clone());
        tokio::spawn(async move {
            tokio::time::sleep_until((start + Duration::from_millis(at_ms)).into()).await;
            eval_within(&b, &p, 1, Duration::from_millis(within_ms)).await
        })
    };
    // The third caller leaves 100 ms past its budget, so its reply is awaited 50 ms longer
    // (the others would wait for it).
    let (a, b2, c, d) = (ask(0, 6000), ask(0, 6000), ask(100, 4100), ask(3000, 6000));
    tokio::time::sleep_until((start + Duration::from_millis(3150)).into()).await;
    tokio::task::block_in_place(|| proxy.set_mode(Mode::Delay(Duration::from_millis(1250))));
    for early in [a, b2] {
        let o = early.await.unwrap();
        assert!(unavailable(UnavailableCause::ExpiredInQueue)(&o), "{o:?}");
    }
    let c = c.await.unwrap();
    assert!(indeterminate(IndeterminateCause::Timeout)(&c), "{c:?}");
    let d = d.await.unwrap();
    assert!(allowed(&d), "{d:?}");
    let stored = stored_count(&redis);
    assert_eq!(stored, 2, "2 allowed, {stored} counted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadline_too_short_to_be_answered_sends_nothing() {
    let redis = RedisServer::start();
    let b = connected(&redis.url(), Duration::from_millis(500)).await;
    let p = policy(1000);
    // No command is answered in 20 µs: refused before sending.
    let deadline = Instant::now() + Duration::from_micros(20);
    let o = match RateLimitRequest::new(&p, subject(1), Cost::consume(1).unwrap(), None, deadline) {
        Ok(request) => b.evaluate(&p, &request).await,
        // Already past by the time the request was built: nothing to send either.
        Err(_) => RateLimitOutcome::Unavailable {
            policy_id: p.id().clone(),
            retry_after: Duration::ZERO,
            cause: UnavailableCause::DeadlineTooShort,
        },
    };
    assert!(unavailable(UnavailableCause::DeadlineTooShort)(&o), "{o:?}");
    assert!(keys(&redis).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadline_shorter_than_the_command_timeout_bounds_the_command() {
    let redis = RedisServer::start();
    let b = connected(&redis.url(), Duration::from_millis(500)).await;
    let p = policy(1000);
    // The caller's 100 ms is the budget (not the 500 ms command timeout): decided in time.
    let o = eval_within(&b, &p, 1, Duration::from_millis(100)).await;
    assert!(allowed(&o), "{o:?}");
    assert_eq!(stored_count(&redis), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admission_bound_refuses_before_sending() {
    let redis = RedisServer::start();
    let proxy = TcpProxy::start(&redis.addr());
    let b = Arc::new(
        connected_with(&proxy.url(), Duration::from_millis(800), |s| {
            s.max_in_flight = 1
        })
        .await,
    );
    let p = policy(1000);
    tokio::task::block_in_place(|| proxy.set_mode(Mode::Blackhole));
    let hanging = {
        let (b, p) = (b.clone(), p.clone());
        tokio::spawn(async move { eval(&b, &p, 1).await })
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    while b.in_flight() == 0 {
        assert!(Instant::now() < deadline, "first command never in flight");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    // A caller whose deadline leaves 100 ms beyond a command budget waits that long for a
    // turn, then is refused without anything sent.
    let o = eval_within(&b, &p, 2, Duration::from_millis(900)).await;
    assert!(
        unavailable(UnavailableCause::AdmissionBoundReached)(&o),
        "{o:?}"
    );
    let first = hanging.await.unwrap();
    assert!(
        indeterminate(IndeterminateCause::Timeout)(&first),
        "{first:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_refusals_are_unavailable_and_change_nothing() {
    let redis = RedisServer::start();
    let b = connected(&redis.url(), Duration::from_secs(2)).await;
    let p = policy(1000);
    assert!(allowed(&eval(&b, &p, 1).await));
    let refused = unavailable(UnavailableCause::ServerRefused);

    // OOM: the program's first write is refused.
    redis.cli(&["CONFIG", "SET", "maxmemory", "1"]);
    let o = eval(&b, &p, 1).await;
    assert!(refused(&o), "OOM: {o:?}");
    redis.cli(&["CONFIG", "SET", "maxmemory", "0"]);

    // READONLY: a replica (of a master that does not exist) refuses the write.
    redis.cli(&["REPLICAOF", "127.0.0.1", "1"]);
    let o = eval(&b, &p, 1).await;
    assert!(refused(&o), "READONLY: {o:?}");
    // MASTERDOWN: a replica that does not serve stale data refuses the command.
    redis.cli(&["CONFIG", "SET", "replica-serve-stale-data", "no"]);
    let o = eval(&b, &p, 1).await;
    assert!(refused(&o), "MASTERDOWN: {o:?}");
    redis.cli(&["CONFIG", "SET", "replica-serve-stale-data", "yes"]);
    redis.cli(&["REPLICAOF", "NO", "ONE"]);

    // NOPERM: a user that may not run scripts.
    redis.cli(&[
        "ACL", "SETUSER", "limited", "on", ">pw", "~*", "&*", "+@all", "-evalsha", "-eval",
    ]);
    let limited = connected(
        &format!("redis://limited:pw@{}/", redis.addr()),
        Duration::from_secs(2),
    )
    .await;
    let o = eval(&limited, &p, 1).await;
    assert!(refused(&o), "NOPERM: {o:?}");

    // BUSY: another client's script runs past busy-reply-threshold.
    redis.cli(&["CONFIG", "SET", "busy-reply-threshold", "50"]);
    let busy = {
        let port = redis.port;
        std::thread::spawn(move || {
            std::process::Command::new("redis-cli")
                .args(["-p", &port.to_string(), "EVAL", "while true do end", "0"])
                .output()
        })
    };
    let seen = until(&b, &p, 1, 100, &refused, allowed).await;
    assert!(refused(seen.last().unwrap()));
    let oks = seen.iter().filter(|o| allowed(o)).count() as u64;
    let deadline = Instant::now() + Duration::from_secs(10);
    while !redis.cli(&["SCRIPT", "KILL"]).contains("OK") {
        assert!(Instant::now() < deadline, "could not kill the busy script");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = tokio::task::block_in_place(|| busy.join());

    // None of the refusals touched the state: one count from the first call, plus the
    // evaluations allowed before the busy script started.
    assert_eq!(stored_count(&redis), 1 + oks);
    recovers(&b, &p, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clock_regression_beyond_tolerance_is_unavailable_and_changes_nothing() {
    let redis = RedisServer::start();
    let b = connected(&redis.url(), Duration::from_secs(2)).await;
    let p = policy(1000);
    assert!(allowed(&eval(&b, &p, 1).await));
    let key = keys(&redis).remove(0);
    // The last observed time lies an hour ahead: the server clock went back an hour.
    let ahead = (std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis()
        + 3_600_000)
        .to_string();
    redis.cli(&["HSET", &key, "o", &ahead]);
    let o = eval(&b, &p, 1).await;
    assert!(unavailable(UnavailableCause::ClockUnsafe)(&o), "{o:?}");
    assert_eq!(redis.cli(&["--raw", "HGET", &key, "o"]).trim(), ahead);
    assert_eq!(stored_count(&redis), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_types_and_corrupted_state_are_incompatible_and_left_alone() {
    let redis = RedisServer::start();
    let b = connected(&redis.url(), Duration::from_secs(2)).await;
    let p = policy(1000);
    assert!(allowed(&eval(&b, &p, 1).await));
    let key = keys(&redis).remove(0);
    let state = |o: &RateLimitOutcome| incompatible(IncompatibleCause::StateIncompatible)(o);

    for (field, value) in [
        ("c", "not-a-number"),
        ("c", "9007199254740992"), // beyond the exact range (above the limit is a lowered limit)
        ("c", "-1"),
        ("v", "2"),                // another schema
        ("a", "token_bucket"),     // another algorithm
        ("r", "00000000000000ff"), // another revision
    ] {
        redis.cli(&["DEL", &key]);
        assert!(allowed(&eval(&b, &p, 1).await));
        redis.cli(&["HSET", &key, field, value]);
        let o = eval(&b, &p, 1).await;
        assert!(state(&o), "{field}={value}: {o:?}");
        assert_eq!(
            redis.cli(&["--raw", "HGET", &key, field]).trim(),
            value,
            "state left as found"
        );
    }
    for (kind, args) in [
        ("string", vec!["SET", &key, "x"]),
        ("list", vec!["RPUSH", &key, "x"]),
        ("set", vec!["SADD", &key, "x"]),
    ] {
        redis.cli(&["DEL", &key]);
        redis.cli(&args);
        let o = eval(&b, &p, 1).await;
        assert!(state(&o), "{kind}: {o:?}");
        assert_eq!(redis.cli(&["--raw", "TYPE", &key]).trim(), kind);
    }
    // Removing the bad key is the operator's fix; service resumes at once.
    redis.cli(&["DEL", &key]);
    assert!(allowed(&eval(&b, &p, 1).await));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn script_flush_under_load_costs_one_resend_and_never_a_failure() {
    let redis = Arc::new(RedisServer::start());
    let b =
        Arc::new(connected_with(&redis.url(), Duration::from_secs(2), |s| s.connections = 2).await);
    let p = policy(100_000);
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flusher = {
        let (redis, stop) = (redis.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut flushes = 0;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) && flushes < 200 {
                assert_eq!(redis.cli(&["SCRIPT", "FLUSH"]).trim(), "OK");
                flushes += 1;
                std::thread::sleep(Duration::from_millis(10));
            }
            flushes
        })
    };
    let workers: Vec<_> = (0..8)
        .map(|_| {
            let (b, p) = (b.clone(), p.clone());
            tokio::spawn(async move {
                let mut outcomes = Vec::new();
                for _ in 0..60 {
                    outcomes.push(eval(&b, &p, 1).await);
                }
                outcomes
            })
        })
        .collect();
    let mut oks = 0u64;
    for w in workers {
        for o in w.await.unwrap() {
            assert!(allowed(&o), "{o:?}");
            oks += 1;
        }
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let flushes = tokio::task::block_in_place(|| flusher.join().unwrap());
    assert!(flushes > 1, "the flusher ran");
    assert_eq!(oks, 480);
    assert_eq!(
        stored_count(&redis),
        oks,
        "every allow counted exactly once"
    );
}

#[test]
fn settings_are_bounded() {
    let ok = RedisSettings::default();
    assert!(ok.validate().is_ok());
    for bad in [
        RedisSettings {
            retry_after: Duration::ZERO,
            ..RedisSettings::default()
        },
        RedisSettings {
            retry_after: Duration::from_secs(7200),
            ..RedisSettings::default()
        },
        RedisSettings {
            command_timeout: Duration::ZERO,
            ..RedisSettings::default()
        },
        RedisSettings {
            max_in_flight: 0,
            ..RedisSettings::default()
        },
    ] {
        assert!(RedisBackend::start(bad).is_err());
    }
}
