//! TLS and ACL: a TLS-only Redis that requires client certificates and whose only usable
//! user may run just what edgelimit needs on `edgelimit:*` keys. Three edgelimit processes
//! connect with a custom CA, a client certificate and a password read from a file, and allow
//! exactly the limit. Wrong credentials or an untrusted server certificate fail closed, and
//! the password never appears in the log.

mod common;

use std::time::Duration;

use common::fault_load::call_with_timeout;
use common::server::{descriptor, request, EdgelimitServer, ServerOptions, OVER_LIMIT};
use common::topologies::{storm, TlsRedis};

const LIMIT: u64 = 50;

const POLICY: &str = r#"
domain: tls
descriptors:
  - key: user
    rate_limit:
      unit: day
      requests_per_unit: 50
"#;

const TIMEOUTS: &str = "  command_timeout: 2s\n  connect_timeout: 1s\n";

fn server(redis: &TlsRedis, password: &str, ca: &std::path::Path, cert: bool) -> EdgelimitServer {
    let file = tempfile::NamedTempFile::new_in(redis.dir.path()).expect("password file");
    std::fs::write(file.path(), format!("{password}\n")).expect("write password");
    let (_, path) = file.keep().expect("keep password file");
    EdgelimitServer::start(
        ServerOptions::memory(&[("tls.yaml", POLICY)])
            .extra(&format!("{}{TIMEOUTS}", redis.config(&path, ca, cert))),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_servers_over_tls_with_an_acl_user_allow_exactly_the_limit() {
    let redis = tokio::task::block_in_place(TlsRedis::start);
    let servers: Vec<EdgelimitServer> = (0..3)
        .map(|_| server(&redis, &redis.password, &redis.certs.ca, true))
        .collect();
    let subjects = vec!["alice".to_owned(), "bob".to_owned()];
    // 3 servers × 2 workers × 25 calls = 150 requests per subject.
    let allowed = storm(&servers, "tls", "user", &subjects, 2, 25).await;
    assert_eq!(allowed, vec![LIMIT, LIMIT]);

    let keys = redis.node.keys("edgelimit:rate:*");
    assert_eq!(keys.len(), 2, "{keys:?}");
    for key in &keys {
        assert_eq!(
            redis.node.cli(&["HGET", key, "c"]).trim(),
            LIMIT.to_string()
        );
    }
    // The connections really are the ACL user's, over TLS.
    let clients = redis.node.cli(&["CLIENT", "LIST"]);
    assert!(clients.contains("user=edgelimit"), "{clients}");
    for server in &servers {
        assert!(
            !server.log_text().contains(&redis.password),
            "the password reached the log"
        );
    }
}

/// Each misconfiguration is refused at connect time: every request is OVER_LIMIT, readiness
/// reports not ready, and the log names the failure without the password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_password_untrusted_server_or_missing_client_cert_fail_closed() {
    let redis = tokio::task::block_in_place(TlsRedis::start);
    let cases = [
        (
            "wrong password",
            server(&redis, "not-the-password-42", &redis.certs.ca, true),
        ),
        (
            "untrusted CA",
            server(&redis, &redis.password, &redis.certs.other_ca, true),
        ),
        (
            "no client certificate",
            server(&redis, &redis.password, &redis.certs.ca, false),
        ),
    ];
    for (what, server) in &cases {
        let mut client = server.client().await;
        for _ in 0..5 {
            let req = request("tls", vec![descriptor(&[("user", "mallory")])]);
            let code = call_with_timeout(&mut client, req, Duration::from_secs(4)).await;
            assert_eq!(code, Ok(OVER_LIMIT), "{what}");
        }
        let (status, _) = server.admin_get("/readyz");
        assert_eq!(status, 503, "{what}: ready without a Redis connection");
        let log = server.log_text();
        assert!(log.contains("redis connection failed"), "{what}:\n{log}");
        assert!(!log.contains(&redis.password) && !log.contains("not-the-password-42"));
    }
    assert!(redis.node.keys("edgelimit:*").is_empty());
}

/// A TLS-only Cluster with client certificates and the ACL user (plus `cluster|slots` and
/// `asking`): the slot map is read and every master is connected over TLS as that user, and
/// each subject is allowed exactly its limit on whichever master holds it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_cluster_with_an_acl_user_allows_exactly_the_limit_on_every_master() {
    let cluster = tokio::task::block_in_place(|| common::topologies::TlsCluster::start(3));
    let file = tempfile::NamedTempFile::new_in(cluster.dir.path()).expect("password file");
    std::fs::write(file.path(), format!("{}\n", cluster.password)).expect("write password");
    let (_, path) = file.keep().expect("keep password file");
    let servers: Vec<EdgelimitServer> = (0..2)
        .map(|_| {
            EdgelimitServer::start(
                ServerOptions::memory(&[("tls.yaml", POLICY)])
                    .extra(&format!("{}{TIMEOUTS}", cluster.config(&path))),
            )
        })
        .collect();
    let subjects: Vec<String> = (0..6).map(|i| format!("subject-{i}")).collect();
    // 2 servers × 2 workers × 20 calls = 80 requests per subject.
    let allowed = storm(&servers, "tls", "user", &subjects, 2, 20).await;
    assert_eq!(allowed, vec![LIMIT; subjects.len()]);
    let mut with_keys = 0;
    for node in &cluster.nodes {
        let keys = node.keys("edgelimit:rate:*");
        with_keys += usize::from(!keys.is_empty());
        for key in &keys {
            assert_eq!(node.cli(&["HGET", key, "c"]).trim(), LIMIT.to_string());
        }
        let clients = node.cli(&["CLIENT", "LIST"]);
        assert!(clients.contains("user=edgelimit"), "{clients}");
    }
    assert!(with_keys > 1, "the subjects spread over several masters");
    for server in &servers {
        assert!(
            !server.log_text().contains(&cluster.password),
            "the password reached the log"
        );
    }
}
