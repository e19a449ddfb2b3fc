//! Sentinel: two edgelimit processes find the primary through three Sentinels, allow exactly
//! the limit, and live through a forced `SENTINEL FAILOVER` under load: a subject that had
//! used up its quota is answered OVER_LIMIT before, during and after the failover (nothing
//! uncertain is ever answered OK, and every OK is one the new primary holds); service
//! resumes against the new primary within a bounded time, with the programs resent there
//! (NOSCRIPT: scripts are not replicated), and the new primary is exact again.

mod common;

use std::time::{Duration, Instant};

use common::fault_load::{assert_all_answered_in_time, oks, Load, Sample};
use common::server::{descriptor, metric, request, EdgelimitServer, ServerOptions, OK, OVER_LIMIT};
use common::topologies::{storm, wait_for, SentinelGroup};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;

const LIMIT: u64 = 50;
const CALLER_TIMEOUT: Duration = Duration::from_secs(4);
/// From `SENTINEL FAILOVER` until the new primary counts this load's requests.
const RESUME_BOUND: Duration = Duration::from_secs(20);

const POLICY: &str = r#"
domain: failover
descriptors:
  - key: exhausted
    rate_limit:
      name: exhausted
      unit: day
      requests_per_unit: 50
  - key: open
    rate_limit:
      name: open
      unit: day
      requests_per_unit: 1000000
  - key: fresh
    rate_limit:
      name: fresh
      unit: day
      requests_per_unit: 50
"#;

fn server(group: &SentinelGroup) -> EdgelimitServer {
    let server = EdgelimitServer::start(
        ServerOptions::memory(&[("failover.yaml", POLICY)])
            .extra(&group.config("  command_timeout: 500ms\n  connect_timeout: 500ms\n")),
    );
    server.wait_ready();
    server
}

fn req(key: &str) -> RateLimitRequest {
    request("failover", vec![descriptor(&[(key, "subject")])])
}

fn noscript_reloads(servers: &[EdgelimitServer]) -> f64 {
    servers
        .iter()
        .filter_map(|s| metric(&s.metrics(), "edgelimit_redis_noscript_reloads_total", &[]))
        .sum()
}

/// The `c` (consumed) field of the one key matching `pattern` on `node`, if there is one.
fn count(node: &common::topologies::Node, pattern: &str) -> Option<u64> {
    let keys = node.keys(pattern);
    let key = keys.first()?;
    node.cli(&["HGET", key, "c"]).trim().parse().ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forced_failover_under_load_fails_closed_and_resumes_on_the_new_primary() {
    let started = Instant::now();
    let group = tokio::task::block_in_place(SentinelGroup::start);
    let (old_port, new_port) = (group.data[0].port, group.data[1].port);
    assert_eq!(group.primary_port(0), Some(old_port));
    let servers = [server(&group), server(&group)];

    // Exact through Sentinel: 2 servers × 5 workers × 20 calls = 200 requests, limit 50.
    let allowed = storm(
        &servers,
        "failover",
        "exhausted",
        &["subject".into()],
        5,
        20,
    )
    .await;
    assert_eq!(allowed, vec![LIMIT]);
    // The used-up state is on the replica before the failover starts.
    let acked = tokio::task::block_in_place(|| group.data[0].cli(&["WAIT", "1", "2000"]));
    assert_eq!(acked.trim(), "1", "replica acknowledged the writes");
    let reloads_before = noscript_reloads(&servers);

    let mut loads = Vec::new();
    for server in &servers {
        let client = server.client().await;
        for key in ["exhausted", "open"] {
            let load = Load::start(
                client.clone(),
                req(key),
                2,
                CALLER_TIMEOUT,
                Duration::from_millis(5),
            );
            loads.push((key, load));
        }
    }
    tokio::time::sleep(Duration::from_millis(500)).await;

    let failover_at = Instant::now();
    tokio::task::block_in_place(|| {
        group.force_failover();
        wait_for("Sentinel names the new primary", RESUME_BOUND, || {
            group.primary_port(0) == Some(new_port)
        });
    });
    let switched_at = Instant::now();
    let new_primary = group.node(new_port);
    // Replication stopped at the promotion: growth from here is this load reaching it.
    let promoted = count(new_primary, "edgelimit:rate:*open*").unwrap_or(0);
    tokio::task::block_in_place(|| {
        wait_for("the new primary counts requests", RESUME_BOUND, || {
            count(new_primary, "edgelimit:rate:*open*").is_some_and(|c| c > promoted)
        })
    });
    let resumed_at = Instant::now();
    tokio::time::sleep(Duration::from_millis(1000)).await;

    let mut exhausted: Vec<Sample> = Vec::new();
    let mut open: Vec<Sample> = Vec::new();
    for (key, load) in loads {
        let samples = load.finish().await;
        match key {
            "exhausted" => exhausted.extend(samples),
            _ => open.extend(samples),
        }
    }

    // Nothing was ever granted beyond the limit: before, during and after the failover.
    for s in &exhausted {
        assert_eq!(
            s.result,
            Ok(OVER_LIMIT),
            "exhausted subject answered {:?} {:?} after the failover began",
            s.result,
            s.sent.checked_duration_since(failover_at)
        );
    }
    let during = exhausted
        .iter()
        .filter(|s| s.sent >= failover_at && s.done <= resumed_at)
        .count();
    assert!(during > 0, "no request inside the failover window");
    assert_all_answered_in_time(&exhausted, "failover");
    assert_all_answered_in_time(&open, "failover");
    // Every OK for the used-up subject is one the new primary holds.
    assert_eq!(
        count(new_primary, "edgelimit:rate:*exhausted*"),
        Some(LIMIT)
    );

    // Service resumed on the new primary: OKs after it took over, and the programs are in
    // its script cache (it had none: scripts are not replicated; each new connection loads
    // them, and a NOSCRIPT resend covers any request that got there first).
    let after: Vec<Sample> = open
        .iter()
        .filter(|s| s.sent >= resumed_at)
        .cloned()
        .collect();
    assert!(oks(&after) > 0, "no OK after the failover");
    for program in edgelimit::redis::Programs::load().all() {
        assert_eq!(
            new_primary.cli(&["SCRIPT", "EXISTS", &program.sha]).trim(),
            "1",
            "{} on the new primary",
            program.name
        );
    }
    eprintln!(
        "{} NOSCRIPT resends during the failover",
        noscript_reloads(&servers) - reloads_before
    );

    // Each server left the old primary because the Sentinels named another one (the old
    // primary still accepted writes: nothing else would have moved it).
    for server in &servers {
        let log = server.log_text();
        assert!(
            log.contains("the Sentinels name another primary"),
            "no re-resolution:\n{log}"
        );
    }

    // And it is exact: a fresh subject gets exactly the limit, counted on the new primary.
    let allowed = storm(&servers, "failover", "fresh", &["subject".into()], 5, 20).await;
    assert_eq!(allowed, vec![LIMIT], "exactness on the new primary");
    assert_eq!(count(new_primary, "edgelimit:rate:*fresh*"), Some(LIMIT));

    // Async replication's known cost (README, Topologies): OKs the old primary granted after
    // the promotion are not on the new one. They are bounded by the grants inside the window
    // from the failover until every connection has moved (one health-check interval after
    // the first did); the slack covers writes still in the replication stream at promotion.
    let kept = count(new_primary, "edgelimit:rate:*open*").unwrap_or(0);
    let lost = oks(&open).saturating_sub(kept);
    let window_end = resumed_at + Duration::from_secs(1);
    let in_window = open
        .iter()
        .filter(|s| s.sent >= failover_at && s.sent <= window_end && s.result == Ok(OK))
        .count() as u64;
    eprintln!(
        "open subject: {} OKs granted, {kept} held by the new primary: {lost} lost, \
         {in_window} granted in the failover window",
        oks(&open)
    );
    assert!(
        lost <= in_window + 5,
        "{lost} increments lost, more than the {in_window} granted in the failover window"
    );
    eprintln!(
        "failover: sentinel switched after {:?}, new primary counting after {:?}; \
         {during} requests for the used-up subject inside the window, all OVER_LIMIT; \
         test took {:?}",
        switched_at - failover_at,
        resumed_at - failover_at,
        started.elapsed()
    );
}

/// A primary that hangs (SIGSTOP: connects complete in the kernel, nothing is answered)
/// rather than dies, at default settings with callers at Envoy's 20 ms deadline. Until the
/// Sentinels promote the replica every request fails closed, answered in time, the used-up
/// subject never allowed; service resumes on the new primary by itself, and stays there
/// when the old primary wakes up (the Sentinels demote it). Times are printed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_primary_fails_closed_until_the_sentinels_promote_the_replica() {
    const ENVOY_DEADLINE: Duration = Duration::from_millis(20);
    let group = tokio::task::block_in_place(SentinelGroup::start);
    let new_port = group.data[1].port;
    let server = EdgelimitServer::start(
        ServerOptions::memory(&[("failover.yaml", POLICY)]).extra(&group.config("")),
    );
    tokio::task::block_in_place(|| server.wait_ready());
    let allowed = storm(
        std::slice::from_ref(&server),
        "failover",
        "exhausted",
        &["subject".into()],
        2,
        30,
    )
    .await;
    assert_eq!(allowed, vec![LIMIT]);
    let acked = tokio::task::block_in_place(|| group.data[0].cli(&["WAIT", "1", "2000"]));
    assert_eq!(acked.trim(), "1", "replica acknowledged the writes");

    let client = server.client().await;
    let pace = Duration::from_millis(10);
    let exhausted = Load::start(client.clone(), req("exhausted"), 1, ENVOY_DEADLINE, pace);
    let open = Load::start(client.clone(), req("open"), 2, ENVOY_DEADLINE, pace);
    tokio::time::sleep(Duration::from_millis(500)).await;

    group.data[0].pause();
    let paused = Instant::now();
    tokio::task::block_in_place(|| {
        wait_for("Sentinel names the replica", RESUME_BOUND, || {
            group.primary_port(0) == Some(new_port)
        })
    });
    let promoted = Instant::now();
    let new_primary = group.node(new_port);
    tokio::task::block_in_place(|| {
        wait_for("the new primary counts requests", RESUME_BOUND, || {
            count(new_primary, "edgelimit:rate:*open*").is_some()
        })
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    group.data[0].resume();
    let woke = Instant::now();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let exhausted = exhausted.finish().await;
    let open = open.finish().await;

    // Never allowed, whatever the timing. Answered in time is a wall-clock property: on a
    // loaded machine a debug build can miss Envoy's 20 ms at the caller (a client-side
    // timeout, which Envoy treats per its failure mode, never an admission), so misses are
    // counted and bounded rather than forbidden.
    let late = exhausted
        .iter()
        .filter(|s| {
            matches!(
                s.result,
                Err(tonic::Code::DeadlineExceeded | tonic::Code::Cancelled)
            )
        })
        .count();
    for s in &exhausted {
        assert!(
            s.result == Ok(OVER_LIMIT)
                || matches!(
                    s.result,
                    Err(tonic::Code::DeadlineExceeded | tonic::Code::Cancelled)
                ),
            "the used-up subject: {:?}",
            s.result
        );
    }
    eprintln!(
        "used-up subject: {} requests, all OVER_LIMIT but {late} the caller gave up on",
        exhausted.len()
    );
    assert!(
        late * 100 <= exhausted.len() * 5,
        "{late} of {} requests for the used-up subject missed the caller's deadline",
        exhausted.len()
    );
    let in_time = |samples: &[Sample]| {
        samples
            .iter()
            .filter(|s| s.sent >= paused && s.sent < promoted)
            .map(|s| {
                !matches!(
                    s.result,
                    Err(tonic::Code::DeadlineExceeded | tonic::Code::Cancelled)
                )
            })
            .fold((0, 0), |(yes, all), ok| (yes + usize::from(ok), all + 1))
    };
    let (answered, all) = in_time(&open);
    let first_ok = open
        .iter()
        .find(|s| s.sent >= paused + Duration::from_millis(50) && s.result == Ok(OK))
        .map(|s| s.done - paused);
    let after_wake = open.iter().filter(|s| s.sent >= woke).collect::<Vec<_>>();
    let ok_after_wake = after_wake.iter().filter(|s| s.result == Ok(OK)).count();
    eprintln!(
        "hung primary: Sentinels promoted after {:?}; first OK after {first_ok:?}; \
         {answered}/{all} requests before the promotion answered within the caller deadline; \
         after SIGCONT {ok_after_wake}/{} OK",
        promoted - paused,
        after_wake.len()
    );
    assert!(first_ok.is_some(), "service resumed on the new primary");
    // Had the woken primary taken traffic back, nearly nothing would be OK (a demoted
    // replica refuses writes); the rest are requests failed closed at the caller's 20 ms on
    // a loaded machine.
    assert!(
        ok_after_wake * 100 >= after_wake.len() * 80,
        "the woken old primary took traffic back: {ok_after_wake}/{} OK",
        after_wake.len()
    );
    // Nothing uncertain was allowed: every OK after the pause is on the new primary (the
    // paused one answered nothing, so none can have been granted there).
    let kept = count(new_primary, "edgelimit:rate:*open*").unwrap_or(0);
    let granted_after = open
        .iter()
        .filter(|s| s.sent >= paused + Duration::from_millis(50) && s.result == Ok(OK))
        .count() as u64;
    assert!(
        kept >= granted_after,
        "{granted_after} granted after the pause, {kept} on the new primary"
    );
}

/// TLS everywhere: the primary, the replica and the Sentinels listen on TLS ports only, and
/// edgelimit reaches the Sentinels through `rediss://` URLs and the primary they name over
/// TLS. It decides exactly the limit, follows a forced `SENTINEL FAILOVER` (learned over TLS),
/// and is exact again on the new primary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_sentinels_decide_exactly_and_follow_a_forced_failover() {
    let group = tokio::task::block_in_place(SentinelGroup::start_tls);
    assert!(group
        .sentinel_urls()
        .iter()
        .all(|u| u.starts_with("rediss://")));
    let (old_port, new_port) = (group.data[0].port, group.data[1].port);
    assert_eq!(group.primary_port(0), Some(old_port));
    let servers = [server(&group)];

    // 1 server × 5 workers × 20 calls = 100 requests, limit 50.
    let allowed = storm(
        &servers,
        "failover",
        "exhausted",
        &["subject".into()],
        5,
        20,
    )
    .await;
    assert_eq!(allowed, vec![LIMIT], "{}", servers[0].log_text());
    assert_eq!(
        count(&group.data[0], "edgelimit:rate:*exhausted*"),
        Some(LIMIT)
    );
    let acked = tokio::task::block_in_place(|| group.data[0].cli(&["WAIT", "1", "2000"]));
    assert_eq!(
        acked.trim(),
        "1",
        "replica acknowledged the writes over TLS"
    );

    tokio::task::block_in_place(|| {
        group.force_failover();
        wait_for("Sentinel names the new primary", RESUME_BOUND, || {
            group.primary_port(0) == Some(new_port)
        });
    });
    // Service moves to the new primary: a fresh subject is counted there, exactly.
    let new_primary = group.node(new_port);
    let mut client = servers[0].client().await;
    let deadline = Instant::now() + RESUME_BOUND;
    loop {
        let answered = common::server::call(&mut client, req("open")).await;
        if answered.is_ok_and(|r| r.overall_code == OK)
            && count(new_primary, "edgelimit:rate:*open*").is_some()
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "never resumed on the new primary:\n{}",
            servers[0].log_text()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let allowed = storm(&servers, "failover", "fresh", &["subject".into()], 5, 20).await;
    assert_eq!(allowed, vec![LIMIT]);
    assert_eq!(count(new_primary, "edgelimit:rate:*fresh*"), Some(LIMIT));
    // The used-up subject stayed used up: it replicated before the promotion.
    let mut client = servers[0].client().await;
    let answered = common::server::call(&mut client, req("exhausted")).await;
    assert_eq!(answered.map(|r| r.overall_code).ok(), Some(OVER_LIMIT));
}
