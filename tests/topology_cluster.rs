//! Redis Cluster: three edgelimit processes against a 3-master cluster. Subjects hash to
//! different slots (the key's `{subject tag}` is its hash tag), so their state lands on
//! several masters; each subject is still allowed exactly its limit, and the programs are
//! loaded on every master. A request whose limits are on several slots is checked on every
//! slot, then committed slot by slot: never more than any limit, and what a denied request
//! left behind in other slots is counted.

mod common;

use std::time::{Duration, Instant};

use common::fault_load::{
    assert_all_answered_in_time, assert_fail_closed_in, oks, recovers, Load, Sample,
};
use common::server::{descriptor, metric, request, EdgelimitServer, ServerOptions, OK};
use common::topologies::{storm, wait_for, Cluster, Node};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use tonic::transport::Channel;

const LIMIT: u64 = 40;
const SERVERS: usize = 3;
const WORKERS: usize = 2;
const CALLS: usize = 20; // 3 servers × 2 workers × 20 = 120 requests per subject
const SUBJECTS: usize = 8;
const CALLER_TIMEOUT: Duration = Duration::from_secs(4);

const POLICY: &str = r#"
domain: cluster
descriptors:
  - key: user
    rate_limit:
      unit: day
      requests_per_unit: 40
  - key: shared
    rate_limit:
      name: shared
      unit: day
      requests_per_unit: 50
  - key: each
    rate_limit:
      name: each
      unit: day
      requests_per_unit: 1000
"#;

/// The tests here run one cluster at a time: the fault tests judge answers against Envoy's
/// 20 ms deadline, and two clusters under load on two cores starve each other's servers, so
/// what they measured would be the machine, not the fault.
static ONE_CLUSTER_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn server(cluster: &Cluster) -> EdgelimitServer {
    let server = EdgelimitServer::start(
        ServerOptions::memory(&[("cluster.yaml", POLICY)])
            .extra(&cluster.config("  command_timeout: 2s\n  connect_timeout: 500ms\n")),
    );
    server.wait_ready();
    server
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_servers_on_a_cluster_allow_exactly_the_limit_on_every_master() {
    let _one_at_a_time = ONE_CLUSTER_AT_A_TIME.lock().await;
    let started = Instant::now();
    let cluster = tokio::task::block_in_place(|| Cluster::start(3));
    let servers: Vec<EdgelimitServer> = (0..SERVERS).map(|_| server(&cluster)).collect();
    let subjects: Vec<String> = (0..SUBJECTS).map(|i| format!("subject-{i}")).collect();

    let allowed = storm(&servers, "cluster", "user", &subjects, WORKERS, CALLS).await;
    assert_eq!(allowed, vec![LIMIT; SUBJECTS], "fixed window per subject");
    // Each master connection read the policy (`INFO memory`): the default, noeviction.
    for server in &servers {
        assert_eq!(
            metric(&server.metrics(), "edgelimit_redis_evicting_policy", &[]),
            Some(0.0)
        );
    }

    // Each subject's state is one key, on the master owning its slot, holding exactly LIMIT.
    let mut masters_with_keys = 0;
    let mut total_keys = 0;
    for node in &cluster.nodes {
        let keys = node.keys("edgelimit:rate:*");
        if !keys.is_empty() {
            masters_with_keys += 1;
        }
        for key in &keys {
            assert!(key.contains(":state:{"), "hash-tagged key {key}");
            assert_eq!(
                node.cli(&["HGET", key, "c"]).trim(),
                LIMIT.to_string(),
                "{key}"
            );
        }
        total_keys += keys.len();
    }
    assert_eq!(total_keys, SUBJECTS);
    assert!(
        masters_with_keys > 1,
        "all subjects landed on one master; the hash tag does not spread them"
    );

    // Every program is loaded on every master when the connection comes up (SCRIPT LOAD),
    // so no request pays a NOSCRIPT resend of the whole source.
    let programs = edgelimit::redis::Programs::load();
    for node in &cluster.nodes {
        for program in programs.all() {
            assert_eq!(
                node.cli(&["SCRIPT", "EXISTS", &program.sha]).trim(),
                "1",
                "{} on a master",
                program.name
            );
        }
    }
    let reloads: f64 = servers
        .iter()
        .filter_map(|s| metric(&s.metrics(), "edgelimit_redis_noscript_reloads_total", &[]))
        .sum();
    eprintln!("{reloads} NOSCRIPT resends");
    eprintln!("cluster exactness took {:?}", started.elapsed());
}

/// A master that dies takes its slots with it: requests for a subject on it fail closed
/// (OVER_LIMIT, within the caller's deadline) while it is down, never OK.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_master_fails_closed_for_its_slots() {
    let _one_at_a_time = ONE_CLUSTER_AT_A_TIME.lock().await;
    let mut cluster = tokio::task::block_in_place(|| Cluster::start(3));
    let server = server(&cluster);
    let mut client = server.client().await;

    // The first subject whose key lands on node 0.
    let mut victim = None;
    for i in 0..64 {
        let req = request(
            "cluster",
            vec![descriptor(&[("user", &format!("probe-{i}"))])],
        );
        recovers(&mut client, &req, CALLER_TIMEOUT, Duration::from_secs(10)).await;
        if !cluster.nodes[0].keys("edgelimit:rate:*").is_empty() {
            victim = Some(req);
            break;
        }
    }
    let req = victim.expect("some subject hashes to node 0");
    let load = Load::start(
        client.clone(),
        req,
        2,
        CALLER_TIMEOUT,
        Duration::from_millis(5),
    );
    tokio::time::sleep(Duration::from_millis(300)).await;

    tokio::task::block_in_place(|| cluster.nodes[0].kill());
    let start = Instant::now();
    tokio::time::sleep(Duration::from_millis(2000)).await;
    let end = Instant::now();
    let samples = load.finish().await;
    let inside = assert_fail_closed_in(&samples, start, end, false, "master killed");
    assert_all_answered_in_time(&samples, "master killed");
    assert!(oks(&samples) > 0, "the subject was served before the kill");
    eprintln!("{inside} requests answered OVER_LIMIT while the master was down");
}

/// 300 concurrent requests, each with a descriptor shared by all (50/day) and one of its own
/// (1000/day), on different slots. Exactly 50 are allowed: no limit is ever exceeded. A request
/// that passed the read-only check everywhere but lost at commit time was denied; any slot
/// that had committed before keeps that consumption — the documented cost of spanning slots,
/// every unit of it counted in `edgelimit_redis_partial_commits_total`. The tightest slot
/// commits first, so here (the shared limit is the one that runs out) there is none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_on_several_slots_never_over_admit_and_partial_commits_are_counted() {
    let _one_at_a_time = ONE_CLUSTER_AT_A_TIME.lock().await;
    const REQUESTS: usize = 300;
    let cluster = tokio::task::block_in_place(|| Cluster::start(3));
    let server = server(&cluster);
    let mut clients = Vec::new();
    for _ in 0..4 {
        clients.push(server.client().await);
    }
    let mut tasks = Vec::new();
    for i in 0..REQUESTS {
        let mut client = clients[i % clients.len()].clone();
        tasks.push(tokio::spawn(async move {
            let req = request(
                "cluster",
                vec![
                    descriptor(&[("shared", "everyone")]),
                    descriptor(&[("each", &format!("caller-{i}"))]),
                ],
            );
            common::server::call(&mut client, req)
                .await
                .map(|r| r.overall_code)
        }));
    }
    let mut allowed = 0u64;
    for t in tasks {
        if t.await.expect("caller").expect("answered") == common::server::OK {
            allowed += 1;
        }
    }
    // The counts of the limit named `name`, wherever its keys are.
    let count = |name: &str| -> u64 {
        let mut total = 0;
        for n in &cluster.nodes {
            for key in n.keys("edgelimit:rate:*") {
                if n.cli(&["HGET", &key, "p"]).trim().ends_with(name) {
                    total += n
                        .cli(&["HGET", &key, "c"])
                        .trim()
                        .parse::<u64>()
                        .unwrap_or(0);
                }
            }
        }
        total
    };
    let shared = count("shared");
    let own = count("each");
    let partial = metric(
        &server.metrics(),
        "edgelimit_redis_partial_commits_total",
        &[],
    )
    .unwrap_or(0.0) as u64;
    eprintln!(
        "{allowed} allowed, shared count {shared}, own counts {own}, partial commits {partial}"
    );
    assert_eq!(allowed, 50, "exactly the shared limit");
    assert_eq!(
        shared, 50,
        "the shared limit holds exactly what was granted"
    );
    assert_eq!(
        own,
        allowed + partial,
        "every other unit is a counted partial commit"
    );
    assert_eq!(partial, 0, "the tight shared limit is committed first");
}

/// How much a fault may lower the healthy masters' decided share below the same run's clean
/// windows before it counts as costing them.
const FAULT_COST_MARGIN: f64 = 0.05;
/// While a slot is being redirected (`ASK`), each request for it takes two round trips
/// (`ASK`, then `ASKING` + the program on the importing master) against Envoy's 20 ms
/// deadline: on a starved machine a few more miss it than in the clean windows. Not following
/// the redirect would leave none decided.
const REDIRECT_COST_MARGIN: f64 = 0.15;

/// The subjects stay decided through a fault: ≥ 95%, or — when the machine itself leaves
/// requests undecided at Envoy's 20 ms deadline (a CPU-starved debug build) — no more than
/// `margin` below the same run's clean windows. A sick master that held up the others
/// (head-of-line waits, admission filled by its requests) costs far more.
fn assert_unaffected(
    what: &str,
    samples: &[Sample],
    (from, to): (Instant, Instant),
    clean: (usize, f64),
    margin: f64,
) {
    let (n, share) = decided_share(samples, from, to);
    let (clean_n, clean_share) = clean;
    eprintln!(
        "{what}: {n} requests, {:.1}% decided (clean windows: {:.1}% of {clean_n})",
        share * 100.0,
        clean_share * 100.0
    );
    assert!(n > 0, "{what}: no requests sent in the window");
    assert!(
        share >= 0.95 || share >= clean_share - margin,
        "{what}: only {:.1}% of {n} decided, against {:.1}% of {clean_n} in the clean windows; \
         undecided (answer, ms to answer): {:?}",
        share * 100.0,
        clean_share * 100.0,
        samples
            .iter()
            .filter(|s| s.sent >= from && s.sent < to && s.result != Ok(OK))
            .map(|s| (s.result, (s.done - s.sent).as_millis()))
            .collect::<Vec<_>>()
    );
}

/// `decided_share` over several windows together.
fn decided_share_in(samples: &[Sample], windows: &[(Instant, Instant)]) -> (usize, f64) {
    let (mut n, mut ok) = (0usize, 0.0f64);
    for &(from, to) in windows {
        let (count, share) = decided_share(samples, from, to);
        n += count;
        ok += share * count as f64;
    }
    (n, ok / n.max(1) as f64)
}

/// Envoy's default `rate_limit_service` timeout: the callers in the fault tests use it.
const ENVOY_DEADLINE: Duration = Duration::from_millis(20);
/// How often each subject's caller asks.
const PACE: Duration = Duration::from_millis(10);

const WIDE_POLICY: &str = r#"
domain: cluster
descriptors:
  - key: user
    rate_limit:
      unit: day
      requests_per_unit: 100000000
"#;

/// A server at default settings (only the cluster nodes configured).
fn default_server(cluster: &Cluster) -> EdgelimitServer {
    let server = EdgelimitServer::start(
        ServerOptions::memory(&[("cluster.yaml", WIDE_POLICY)]).extra(&cluster.config("")),
    );
    server.wait_ready();
    server
}

/// `per_node` subjects whose keys live on each master, found by sending one request per probe
/// subject and seeing which master got its key: `subjects[node]`.
async fn subjects_per_node(
    cluster: &Cluster,
    client: &mut RateLimitServiceClient<Channel>,
    per_node: usize,
) -> Vec<Vec<String>> {
    let nodes: Vec<&Node> = cluster.nodes.iter().collect();
    subjects_on(&nodes, client, per_node).await
}

/// As `subjects_per_node`, on these masters only (a replica holds its master's keys too).
async fn subjects_on(
    nodes: &[&Node],
    client: &mut RateLimitServiceClient<Channel>,
    per_node: usize,
) -> Vec<Vec<String>> {
    let mut found = vec![Vec::new(); nodes.len()];
    let mut counts = vec![0; nodes.len()];
    for i in 0..200 {
        if found.iter().all(|f: &Vec<String>| f.len() >= per_node) {
            return found;
        }
        let subject = format!("probe-{i}");
        let req = request("cluster", vec![descriptor(&[("user", &subject)])]);
        recovers(client, &req, CALLER_TIMEOUT, Duration::from_secs(10)).await;
        for (n, node) in nodes.iter().enumerate() {
            let now = node.keys("edgelimit:rate:*").len();
            if now > counts[n] {
                counts[n] = now;
                if found[n].len() < per_node {
                    found[n].push(subject.clone());
                }
            }
        }
    }
    panic!("no {per_node} subjects on every master among 200 probes: {found:?}");
}

fn subject_request(subject: &str) -> RateLimitRequest {
    request("cluster", vec![descriptor(&[("user", subject)])])
}

/// One load per subject, each its own caller at Envoy's deadline.
fn load_on(client: &RateLimitServiceClient<Channel>, subjects: &[String]) -> Vec<Load> {
    subjects
        .iter()
        .map(|s| Load::start(client.clone(), subject_request(s), 1, ENVOY_DEADLINE, PACE))
        .collect()
}

async fn finish_all(loads: Vec<Load>) -> Vec<Sample> {
    let mut all = Vec::new();
    for load in loads {
        all.extend(load.finish().await);
    }
    all.sort_by_key(|s| s.sent);
    all
}

/// Of the requests sent in `[from, to)`: how many, and the share answered OK (a decision:
/// every limit here is far from exhausted).
fn decided_share(samples: &[Sample], from: Instant, to: Instant) -> (usize, f64) {
    let inside: Vec<&Sample> = samples
        .iter()
        .filter(|s| s.sent >= from && s.sent < to)
        .collect();
    let ok = inside.iter().filter(|s| s.result == Ok(OK)).count();
    (inside.len(), ok as f64 / inside.len().max(1) as f64)
}

/// Time from `from` to the first OK sent after it, if any.
fn recovery(samples: &[Sample], from: Instant) -> Option<Duration> {
    samples
        .iter()
        .find(|s| s.sent >= from && s.result == Ok(OK))
        .map(|s| s.done - from)
}

fn failures(metrics: &str, category: &str, cause: &str) -> u64 {
    metric(
        metrics,
        "edgelimit_backend_failures_total",
        &[("category", category), ("cause", cause)],
    )
    .unwrap_or(0.0) as u64
}

/// A sick master costs its own slots only. Under load at default settings, one master is
/// paused (SIGSTOP: connects still complete in the kernel, nothing is answered), then resumed,
/// then killed and restarted. Throughout, the subjects of the two healthy masters are decided
/// (≥ 95%), those of the sick one never allowed; requests for a master known to be down are
/// refused before sending (`connect_failed`, nothing consumed) rather than waiting for the
/// command timeout. Recovery times are printed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_or_dead_master_costs_only_its_own_slots() {
    let _one_at_a_time = ONE_CLUSTER_AT_A_TIME.lock().await;
    let mut cluster = tokio::task::block_in_place(|| Cluster::start(3));
    let server = default_server(&cluster);
    let mut client = server.client().await;
    let subjects = subjects_per_node(&cluster, &mut client, 2).await;
    let sick: Vec<String> = subjects[0].clone();
    let healthy: Vec<String> = subjects[1..].concat();
    let sick_load = load_on(&client, &sick);
    let healthy_load = load_on(&client, &healthy);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let warm = Instant::now() - Duration::from_millis(400);

    // Paused.
    let before = server.metrics();
    cluster.nodes[0].pause();
    let paused = Instant::now();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let during_pause = server.metrics();
    cluster.nodes[0].resume();
    let resumed = Instant::now();
    tokio::time::sleep(Duration::from_millis(1500)).await;

    // Killed, then restarted (empty: no persistence).
    tokio::task::block_in_place(|| cluster.nodes[0].kill());
    let killed = Instant::now();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let during_kill = server.metrics();
    tokio::task::block_in_place(|| cluster.nodes[0].restart());
    let restarted = Instant::now();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let end = Instant::now();

    let healthy_samples = finish_all(healthy_load).await;
    let sick_samples = finish_all(sick_load).await;

    // Clean: before the pause, and between the resume (plus recovery) and the kill.
    let clean = decided_share_in(
        &healthy_samples,
        &[
            (warm, paused),
            (resumed + Duration::from_millis(500), killed),
        ],
    );
    for (what, from, to) in [
        ("paused", paused, resumed),
        ("killed", killed, restarted),
        ("restarted", restarted, end),
    ] {
        assert_unaffected(
            &format!("healthy masters, master {what}"),
            &healthy_samples,
            (from, to),
            clean,
            FAULT_COST_MARGIN,
        );
    }
    // Nothing for the sick master is allowed while it is paused or dead (SIGSTOP is
    // asynchronous: give it a moment before dating the fault).
    let settle = Duration::from_millis(50);
    for (what, from, to) in [
        ("paused", paused + settle, resumed),
        ("killed", killed + settle, restarted),
    ] {
        let allowed = sick_samples
            .iter()
            .filter(|s| s.sent >= from && s.done < to && s.result == Ok(OK))
            .count();
        assert_eq!(allowed, 0, "a request for the {what} master was allowed");
    }
    assert!(
        sick_samples
            .iter()
            .any(|s| s.sent < paused && s.result == Ok(OK)),
        "the sick master's subjects were served before the fault"
    );
    let after_resume = recovery(&sick_samples, resumed).expect("served again after SIGCONT");
    let after_restart = recovery(&sick_samples, restarted).expect("served again after restart");
    eprintln!(
        "sick master served again {after_resume:?} after SIGCONT, {after_restart:?} after restart"
    );

    // Known down: refused before sending, at once.
    let refused = |m: &str| failures(m, "unavailable", "connect_failed");
    let timeouts = |m: &str| failures(m, "indeterminate", "timeout");
    eprintln!(
        "paused: {} connect_failed, {} timeout; killed: {} connect_failed, {} timeout, {} connection_lost",
        refused(&during_pause) - refused(&before),
        timeouts(&during_pause) - timeouts(&before),
        refused(&during_kill) - refused(&during_pause),
        timeouts(&during_kill) - timeouts(&during_pause),
        failures(&during_kill, "indeterminate", "connection_lost")
            - failures(&during_pause, "indeterminate", "connection_lost"),
    );
    assert!(
        refused(&during_pause) > refused(&before),
        "requests for the paused master refused before sending once it is known down"
    );
    assert!(
        refused(&during_kill) > refused(&during_pause),
        "requests for the dead master refused before sending"
    );
    // Never a log line per request: one per state change, and a periodic summary.
    // (The test servers log at debug level; operators see info and above.)
    let log = server.log_text();
    let redis_lines: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("redis") && !l.contains(" DEBUG ") && !l.contains(" TRACE "))
        .collect();
    eprintln!("{} info/warn log lines mention redis", redis_lines.len());
    assert!(
        redis_lines.len() < 20,
        "{} redis log lines for {} requests:\n{}",
        redis_lines.len(),
        sick_samples.len() + healthy_samples.len(),
        redis_lines.join("\n")
    );
}

/// A slot migrates under load: the slot's master answers `ASK` once the key has moved and
/// `MOVED` once the slot is reassigned; both are followed (`ASKING` to the importing master),
/// so the subject stays decided, and its count on the new master is exactly what was granted
/// (plus at most the requests that ended undecided).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_migrating_under_load_is_followed() {
    let _one_at_a_time = ONE_CLUSTER_AT_A_TIME.lock().await;
    let cluster = tokio::task::block_in_place(|| Cluster::start(3));
    let server = default_server(&cluster);
    let mut client = server.client().await;
    let subject = subjects_per_node(&cluster, &mut client, 1).await[0][0].clone();
    let (from, to) = (&cluster.nodes[0], &cluster.nodes[1]);
    // Its key: the one with a count of its own (the other probes have 1).
    const EXTRA: u64 = 4;
    for _ in 0..EXTRA {
        recovers(
            &mut client,
            &subject_request(&subject),
            CALLER_TIMEOUT,
            Duration::from_secs(5),
        )
        .await;
    }
    let key = from
        .keys("edgelimit:rate:*")
        .into_iter()
        .find(|k| from.cli(&["HGET", k, "c"]).trim() == (EXTRA + 1).to_string())
        .expect("the subject's key on its master");
    let slot = from.cli(&["CLUSTER", "KEYSLOT", &key]).trim().to_owned();
    let id = |n: &Node| n.cli(&["CLUSTER", "MYID"]).trim().to_owned();
    let (from_id, to_id) = (id(from), id(to));

    let loads = load_on(&client, &[subject.clone(), subject.clone()]);
    let loaded = Instant::now();
    tokio::time::sleep(Duration::from_millis(400)).await;
    let started = Instant::now();
    tokio::task::block_in_place(|| {
        assert_eq!(
            to.cli(&["CLUSTER", "SETSLOT", &slot, "IMPORTING", &from_id])
                .trim(),
            "OK"
        );
        assert_eq!(
            from.cli(&["CLUSTER", "SETSLOT", &slot, "MIGRATING", &to_id])
                .trim(),
            "OK"
        );
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    // The key moves: its old master answers ASK from now on.
    let migrated = tokio::task::block_in_place(|| {
        from.cli(&[
            "MIGRATE",
            "127.0.0.1",
            &to.port.to_string(),
            "",
            "0",
            "5000",
            "KEYS",
            &key,
        ])
    });
    assert_eq!(migrated.trim(), "OK", "MIGRATE");
    let asked = Instant::now();
    tokio::time::sleep(Duration::from_millis(600)).await;
    // The slot is reassigned: MOVED from the old master.
    tokio::task::block_in_place(|| {
        for node in [to, from, &cluster.nodes[2]] {
            assert_eq!(
                node.cli(&["CLUSTER", "SETSLOT", &slot, "NODE", &to_id])
                    .trim(),
                "OK"
            );
        }
    });
    let moved = Instant::now();
    tokio::time::sleep(Duration::from_millis(600)).await;
    let end = Instant::now();
    let samples = finish_all(loads).await;

    // Clean: the load before the migration began (after its first 100 ms).
    let clean = decided_share(&samples, loaded + Duration::from_millis(100), started);
    for (what, a, b, margin) in [
        ("migrating", started, asked, FAULT_COST_MARGIN),
        ("ASK", asked, moved, REDIRECT_COST_MARGIN),
        ("MOVED", moved, end, FAULT_COST_MARGIN),
    ] {
        assert_unaffected(
            &format!("slot migration, {what}"),
            &samples,
            (a, b),
            clean,
            margin,
        );
    }
    assert!(
        from.keys("edgelimit:rate:*").iter().all(|k| *k != key),
        "the key left"
    );
    let count: u64 = to
        .cli(&["HGET", &key, "c"])
        .trim()
        .parse()
        .expect("count on the new master");
    let granted = oks(&samples) + EXTRA + 1;
    let undecided = samples.iter().filter(|s| s.result != Ok(OK)).count() as u64;
    eprintln!("count {count}, granted {granted}, undecided {undecided}");
    assert!(
        count >= granted && count <= granted + undecided,
        "count {count} on the new master, {granted} granted, {undecided} undecided"
    );
}

/// Replicas take over under load: a `CLUSTER FAILOVER` on a replica (its old master answers
/// `MOVED` from then on: followed), then the new master is killed and the cluster promotes
/// its replica (the old master) by itself; the slot map is read again every second while a
/// master is not up, so its subjects are served again without a redirect. The other
/// masters' subjects stay decided throughout; times are printed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_promoted_under_load_take_over_their_slots() {
    let _one_at_a_time = ONE_CLUSTER_AT_A_TIME.lock().await;
    let mut cluster = tokio::task::block_in_place(|| Cluster::start_with_replicas(3, 1));
    let server = default_server(&cluster);
    let mut client = server.client().await;
    let masters: Vec<usize> = (0..cluster.nodes.len())
        .filter(|&i| cluster.nodes[i].is_master())
        .collect();
    assert_eq!(masters.len(), 3);
    let on: Vec<&Node> = masters.iter().map(|&i| &cluster.nodes[i]).collect();
    let subjects = subjects_on(&on, &mut client, 2).await;
    let (first, replica) = (
        masters[0],
        cluster
            .replica_of(masters[0])
            .expect("a replica of the first master"),
    );
    let moving_load = load_on(&client, &subjects[0]);
    let healthy_load = load_on(&client, &subjects[1..].concat());
    let loaded = Instant::now();
    tokio::time::sleep(Duration::from_millis(500)).await;

    // A manual failover: the replica becomes master, its master a replica.
    let failover = Instant::now();
    tokio::task::block_in_place(|| {
        assert_eq!(
            cluster.nodes[replica].cli(&["CLUSTER", "FAILOVER"]).trim(),
            "OK"
        );
        wait_for("the replica is master", Duration::from_secs(10), || {
            cluster.nodes[replica].is_master() && !cluster.nodes[first].is_master()
        });
    });
    let switched = Instant::now();
    tokio::time::sleep(Duration::from_millis(1500)).await;

    // The new master dies: the cluster promotes the old one (cluster-node-timeout 3 s).
    tokio::task::block_in_place(|| cluster.nodes[replica].kill());
    let killed = Instant::now();
    tokio::task::block_in_place(|| {
        wait_for(
            "the old master is promoted back",
            Duration::from_secs(15),
            || cluster.nodes[first].is_master(),
        )
    });
    let promoted = Instant::now();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let end = Instant::now();
    let moving = finish_all(moving_load).await;
    let healthy = finish_all(healthy_load).await;

    let m = server.metrics();
    for line in m
        .lines()
        .filter(|l| l.starts_with("edgelimit_backend_failures_total"))
    {
        eprintln!("{line}");
    }
    // When the undecided requests of the other masters fell, relative to the kill.
    let mut buckets = std::collections::BTreeMap::new();
    for s in healthy
        .iter()
        .filter(|s| s.sent >= killed && s.result != Ok(OK))
    {
        *buckets
            .entry(((s.sent - killed).as_millis() / 250) * 250)
            .or_insert(0) += 1;
    }
    eprintln!(
        "other masters' undecided requests by ms after the kill: {buckets:?}; promoted at {:?}",
        promoted - killed
    );
    // Between the cluster marking the dead master failed (after cluster-node-timeout, 3 s
    // here) and the replica's election, Redis itself answers CLUSTERDOWN on every master
    // (`cluster-require-full-coverage yes`, its default): reported, not asserted.
    let marked = killed + Duration::from_secs(3);
    // Clean: the load before the manual failover (after its first 100 ms).
    let clean = decided_share(&healthy, loaded + Duration::from_millis(100), failover);
    for (what, from, to) in [
        ("manual failover", failover, killed),
        ("new master killed, not yet marked failed", killed, marked),
        ("after the promotion", promoted, end),
    ] {
        assert_unaffected(
            &format!("other masters, {what}"),
            &healthy,
            (from, to),
            clean,
            FAULT_COST_MARGIN,
        );
    }
    let (n, share) = decided_share(&healthy, marked, promoted);
    eprintln!(
        "marked failed until the promotion (Redis answers CLUSTERDOWN): {n} other-master \
         requests, {:.1}% decided",
        share * 100.0
    );
    let (n, share) = decided_share(&moving, failover, killed);
    eprintln!(
        "manual failover: the moving master's subjects {:.1}% decided of {n} (switched after {:?})",
        share * 100.0,
        switched - failover
    );
    let back = recovery(&moving, promoted).expect("served after the automatic promotion");
    eprintln!(
        "new master killed: cluster promoted its replica after {:?}; its subjects served {:?} \
         after that",
        promoted - killed,
        back
    );
    let after_switch = recovery(&moving, switched).expect("served after the manual failover");
    eprintln!("manual failover: first OK {after_switch:?} after the switch");
}
