//! Soak under chaos: three servers (the real binary; two reach Redis through the fault proxy,
//! one directly) share one real Redis (AOF, `appendfsync always`) under a mixed load — many
//! subjects, all three algorithms, one to three descriptors per request, a descriptor with two
//! limits — while a seeded driver injects faults at random: SIGSTOP/SIGCONT, SIGKILL and a
//! restart with the AOF (counters kept) or without it (counters lost: the documented loss),
//! `SCRIPT FLUSH`, connection resets, drops and a blackhole at the proxy, policy rewrites and
//! SIGHUP. Then `check` proves from the answers that no limit admitted more than it may
//! (separately on each side of a data-losing restart) and that no server answered OK while
//! cut off from Redis; every server's RSS stayed flat; no panic; every server alive, ready
//! and deciding at the end; Redis holds no more keys than (limit, subject) pairs.
//!
//! `EDGELIMIT_SOAK_SECONDS` (default 60) sets the length, `EDGELIMIT_SOAK_SEED` the seed
//! (printed either way). Nothing here asserts on speed.

#[path = "../common/mod.rs"]
mod common;

mod chaos;
mod check;
mod load;
mod rng;
mod rss;
mod workload;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::redis_server::RedisServer;
use common::server::{call, EdgelimitServer, ServerOptions, OK};
use common::tcp_proxy::TcpProxy;

use chaos::{count_by_kind, Chaos, Kind};
use load::Load;
use rng::Rng;
use workload::{policy, LIMITS, POLICY_FILE, SUBJECTS};

const SERVERS: usize = 3;
/// Servers `0..PROXIED` reach Redis through the proxy.
const PROXIED: usize = 2;
const WORKERS: usize = 6;
const PAUSE: Duration = Duration::from_millis(2);
/// The last stretch runs without faults, so every server has recovered by the end.
const QUIET_TAIL: Duration = Duration::from_secs(8);
/// A signal's delivery: requests sent this soon after a fault began are not judged.
const MARGIN_US: u64 = 100_000;
const RECOVERY: Duration = Duration::from_secs(30);

fn soak_seconds() -> u64 {
    std::env::var("EDGELIMIT_SOAK_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .filter(|&s| s >= 20)
        .unwrap_or(60)
}

fn seed() -> u64 {
    std::env::var("EDGELIMIT_SOAK_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| load::now_us() ^ u64::from(std::process::id()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soak_under_chaos() {
    let seconds = soak_seconds();
    let seed = seed();
    println!(
        "chaos soak: {seconds} s, seed {seed} (EDGELIMIT_SOAK_SEED={seed} repeats the schedule)"
    );
    let redis = RedisServer::start_with(&["--appendonly", "yes", "--appendfsync", "always"]);
    let proxy = Arc::new(TcpProxy::start(&redis.addr()));
    let text = policy(1);
    let servers: Vec<EdgelimitServer> = (0..SERVERS)
        .map(|i| {
            let url = if i < PROXIED {
                proxy.url()
            } else {
                redis.url()
            };
            EdgelimitServer::start(
                ServerOptions::redis(&url, &[(POLICY_FILE, &text)])
                    .redis_setting("command_timeout", "250ms")
                    .redis_setting("connect_timeout", "500ms"),
            )
        })
        .collect();
    for s in &servers {
        let ready = tokio::task::block_in_place(|| ready(s));
        assert!(ready, "not ready at the start:\n{}", s.log_text());
    }
    let servers = Arc::new(servers);
    let mut clients = Vec::new();
    for s in servers.iter() {
        clients.push(s.client().await);
    }

    let started = Instant::now();
    let end = started + Duration::from_secs(seconds);
    let rss = rss::Sampler::start(
        servers
            .iter()
            .map(|s| s.pid().expect("server pid"))
            .collect(),
        Duration::from_secs(1),
    );
    let load = Load::start(clients, WORKERS, PAUSE, seed);
    let driver = {
        let chaos = Chaos {
            redis,
            proxy: proxy.clone(),
            servers: servers.clone(),
            proxied: (0..PROXIED).collect(),
            rng: Rng::new(seed),
        };
        let until = end - QUIET_TAIL;
        std::thread::spawn(move || chaos.run(until))
    };
    tokio::time::sleep_until(end.into()).await;
    let samples = load.finish().await;
    let (redis, faults) = tokio::task::block_in_place(|| driver.join().expect("fault driver"));
    let rss = rss.finish();

    // The end: every server alive, ready and deciding.
    let mut servers = Arc::try_unwrap(servers).unwrap_or_else(|_| panic!("servers still shared"));
    for (i, s) in servers.iter_mut().enumerate() {
        assert!(s.exited().is_none(), "server {i} exited:\n{}", s.log_text());
        let ready = tokio::task::block_in_place(|| ready(s));
        assert!(ready, "server {i} not ready at the end:\n{}", s.log_text());
        assert!(
            decides(s, i).await,
            "server {i} not deciding at the end:\n{}",
            s.log_text()
        );
        let log = s.log_text();
        assert!(!log.contains("panicked"), "server {i} panicked:\n{log}");
    }

    let loss_at: Vec<u64> = faults
        .iter()
        .filter(|f| f.kind == Kind::KillRestartEmpty)
        .map(|f| f.start_us)
        .collect();
    let report = check::check(&samples, &faults, &loss_at, MARGIN_US);
    let warm_up = Duration::from_secs((seconds / 5).clamp(10, 60));
    let memory = rss::flat(&rss, warm_up);
    let keys: u64 = redis.cli(&["DBSIZE"]).trim().parse().expect("DBSIZE");
    // One key per (limit, subject), plus the end's probe subjects.
    let key_bound = (LIMITS.len() * (SUBJECTS as usize + SERVERS)) as u64;

    println!("chaos soak summary ({seconds} s, seed {seed}, {SERVERS} servers, {PROXIED} through the proxy)");
    println!(
        "  requests {}: OK {}, OVER_LIMIT {}, errors {:?}",
        report.requests, report.ok, report.over_limit, report.errors
    );
    println!("  faults {}: {:?}", faults.len(), count_by_kind(&faults));
    println!(
        "  answered inside an outage: {} (OK: none allowed); OKs spanning a data-losing restart, left out: {}",
        report.inside_outages, report.straddling_loss
    );
    for (name, ratio) in &report.peak_ratio {
        println!("  peak / limit {name}: {ratio:.3}");
    }
    println!(
        "  sliding window: most OKs answered within one window length / limit: {:.3} (bound: limit + floor(f x previous window) < 2)",
        report.sliding_rolling_ratio
    );
    for (i, m) in memory.iter().enumerate() {
        println!(
            "  server {i} VmRSS: {} kB after warm-up ({} s), {} kB at the end ({:+.1}%)",
            m.warm_kb,
            warm_up.as_secs(),
            m.end_kb,
            m.growth_percent()
        );
    }
    println!("  Redis keys at the end: {keys} (bound {key_bound})");
    println!("  violations: {}", report.violations.len());

    assert!(
        report.violations.is_empty(),
        "violations (seed {seed}):\n{}",
        report.violations.join("\n")
    );
    assert!(
        report.ok > 0 && report.over_limit > 0,
        "the load must both pass and hit limits"
    );
    assert!(
        report.inside_outages > 0,
        "no request was judged inside an outage"
    );
    assert!(
        keys <= key_bound,
        "Redis holds {keys} keys, more than {key_bound}"
    );
    for (i, m) in memory.iter().enumerate() {
        assert!(m.is_flat(), "server {i} RSS grew: {m:?}");
    }
}

/// `/readyz` answers 200 within `RECOVERY`.
fn ready(server: &EdgelimitServer) -> bool {
    common::server::wait_until(RECOVERY, || {
        common::server::http_get(server.admin_port, "/readyz")
            .is_ok_and(|(status, _)| status == 200)
    })
}

/// A fresh subject is allowed within `RECOVERY`.
async fn decides(server: &EdgelimitServer, i: usize) -> bool {
    let mut client = server.client().await;
    let shape = [Some(SUBJECTS + i as u16), None, None];
    let req = workload::to_request(&shape, &mut Rng::new(0));
    let deadline = Instant::now() + RECOVERY;
    while Instant::now() < deadline {
        if call(&mut client, req.clone())
            .await
            .is_ok_and(|r| r.overall_code == OK)
        {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}
