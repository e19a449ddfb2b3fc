//! The reload watch follows the configured policy path, whatever replaces what it points to:
//! a git-sync style symlink swap, a directory renamed in place, a directory deleted then
//! recreated. Each is picked up by file events (or, at worst, the once-a-second check of the
//! path), every time, with no SIGHUP. Every wait is bounded; no wall-clock assertion.

mod common;

use std::path::Path;
use std::time::Duration;

use common::server::{call, descriptor, request, wait_until, EdgelimitServer, ServerOptions};

const BOUND: Duration = Duration::from_secs(15);

fn policy(per_hour: u32) -> String {
    format!(
        "domain: a\ndescriptors:\n  - key: user\n    rate_limit:\n      name: l\n      unit: hour\n      requests_per_unit: {per_hour}\n"
    )
}

async fn limit(server: &EdgelimitServer) -> Option<u32> {
    let mut client = server.client().await;
    let r = call(
        &mut client,
        request("a", vec![descriptor(&[("user", "u")])]),
    )
    .await
    .ok()?;
    r.statuses[0]
        .current_limit
        .as_ref()
        .map(|l| l.requests_per_unit)
}

async fn wait_limit(server: &EdgelimitServer, expected: u32) {
    let deadline = std::time::Instant::now() + BOUND;
    while std::time::Instant::now() < deadline {
        if limit(server).await == Some(expected) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("limit {expected} never served:\n{}", server.log_text());
}

fn write_dir(dir: &Path, per_hour: u32) {
    std::fs::create_dir(dir).expect("create policy dir");
    std::fs::write(dir.join("a.yaml"), policy(per_hour)).expect("write policy");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn git_sync_symlink_swaps_are_followed_every_time() {
    let server = EdgelimitServer::start(ServerOptions::memory(&[("a.yaml", &policy(3))]).linked());
    wait_limit(&server, 3).await;
    let root = server.dir.path();
    // git-sync: a new worktree, a new symlink beside the old one, renamed over it.
    for (generation, per_hour) in [(1, 5), (2, 8), (3, 13)] {
        let rev = root.join(format!("rev-{generation}"));
        write_dir(&rev, per_hour);
        let tmp = root.join("current.tmp");
        std::os::unix::fs::symlink(&rev, &tmp).expect("new symlink");
        std::fs::rename(&tmp, root.join("current")).expect("swap symlink");
        wait_limit(&server, per_hour).await;
        // The old worktree goes away, as git-sync prunes it.
        if generation > 1 {
            std::fs::remove_dir_all(root.join(format!("rev-{}", generation - 1))).ok();
        }
    }
    // Edits inside the directory now served are still seen.
    std::fs::write(root.join("rev-3").join("a.yaml"), policy(21)).expect("edit");
    wait_limit(&server, 21).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_directory_renamed_in_place_is_followed() {
    let server = EdgelimitServer::start(ServerOptions::memory(&[("a.yaml", &policy(3))]));
    wait_limit(&server, 3).await;
    let dir = server.policy_dir.clone();
    let root = server.dir.path();
    for (round, per_hour) in [(1, 6), (2, 9)] {
        let staged = root.join(format!("policies.new{round}"));
        write_dir(&staged, per_hour);
        std::fs::rename(&dir, root.join(format!("policies.old{round}"))).expect("move old");
        std::fs::rename(&staged, &dir).expect("move new in place");
        wait_limit(&server, per_hour).await;
    }
    server.write_policy("a.yaml", &policy(11));
    wait_limit(&server, 11).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_directory_deleted_then_recreated_is_followed() {
    let server = EdgelimitServer::start(ServerOptions::memory(&[("a.yaml", &policy(3))]));
    wait_limit(&server, 3).await;
    let dir = server.policy_dir.clone();
    for per_hour in [4, 7] {
        std::fs::remove_dir_all(&dir).expect("delete policy dir");
        // While it is gone the previous set is still served (a missing directory is an error,
        // never an empty set).
        assert!(
            wait_until(BOUND, || server
                .log_text()
                .contains("policy directory is missing")),
            "{}",
            server.log_text()
        );
        assert_eq!(
            limit(&server).await,
            Some(if per_hour == 4 { 3 } else { 4 })
        );
        write_dir(&dir, per_hour);
        wait_limit(&server, per_hour).await;
    }
    server.write_policy("a.yaml", &policy(12));
    wait_limit(&server, 12).await;
}

/// An empty policy set answers every request OK: it is a loud warning and a gauge, and with
/// `readiness.require_policies` (the default with Redis) `/readyz` fails until a domain loads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_policy_set_is_not_ready_with_redis_and_loudly_reported() {
    let redis = common::redis_server::RedisServer::start();
    let server = EdgelimitServer::start(ServerOptions::redis(&redis.url(), &[]));
    let not_ready = || {
        let (status, body) = server.admin_get("/readyz");
        status == 503 && body.contains("no policy domain")
    };
    assert!(wait_until(BOUND, not_ready), "{}", server.log_text());
    assert!(server.log_text().contains("the policy set has no domains"));
    let domains = || common::server::metric(&server.metrics(), "edgelimit_config_domains", &[]);
    assert_eq!(domains(), Some(0.0));

    server.write_policy("a.yaml", &policy(3));
    assert!(
        wait_until(BOUND, || server.admin_get("/readyz").0 == 200),
        "{}",
        server.log_text()
    );
    assert_eq!(domains(), Some(1.0));
    std::fs::remove_file(server.policy_dir.join("a.yaml")).expect("delete the only policy");
    assert!(wait_until(BOUND, not_ready), "{}", server.log_text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn require_policies_is_off_by_default_on_memory_and_can_be_set() {
    let default = EdgelimitServer::start(ServerOptions::memory(&[]));
    assert!(wait_until(BOUND, || default.admin_get("/readyz").0 == 200));
    assert!(default.log_text().contains("the policy set has no domains"));
    let required = EdgelimitServer::start(
        ServerOptions::memory(&[]).extra("readiness:\n  require_policies: true"),
    );
    let (status, body) = required.admin_get("/readyz");
    assert_eq!(
        (status, body.contains("no policy domain")),
        (503, true),
        "{body}"
    );
}
