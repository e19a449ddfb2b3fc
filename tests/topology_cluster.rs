//! Redis Cluster: three edgelimit processes against a 3-master cluster. Subjects hash to
//! different slots (the key's `{subject tag}` is its hash tag), so their state lands on
//! several masters; each subject is still allowed exactly its limit, and the programs are
//! loaded on every master. A request whose limits are on several slots is checked on every
//! slot, then committed slot by slot: never more than any limit, and what a denied request
//! left behind in other slots is counted.

mod common;

use std::time::{Duration, Instant};

use common::fault_load::{assert_all_answered_in_time, assert_fail_closed_in, oks, recovers, Load};
use common::server::{descriptor, metric, request, EdgelimitServer, ServerOptions};
use common::topologies::{storm, Cluster};

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

fn server(cluster: &Cluster) -> EdgelimitServer {
    EdgelimitServer::start(
        ServerOptions::memory(&[("cluster.yaml", POLICY)])
            .extra(&cluster.config("  command_timeout: 2s\n  connect_timeout: 500ms\n")),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_servers_on_a_cluster_allow_exactly_the_limit_on_every_master() {
    let started = Instant::now();
    let cluster = tokio::task::block_in_place(|| Cluster::start(3));
    let servers: Vec<EdgelimitServer> = (0..SERVERS).map(|_| server(&cluster)).collect();
    let subjects: Vec<String> = (0..SUBJECTS).map(|i| format!("subject-{i}")).collect();

    let allowed = storm(&servers, "cluster", "user", &subjects, WORKERS, CALLS).await;
    assert_eq!(allowed, vec![LIMIT; SUBJECTS], "fixed window per subject");

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
