//! Rotating the HMAC secret with `previous_file` keeps enforcing what subjects already used;
//! without it every subject would start with a full quota.

use crate::common;

use common::redis_server::RedisServer;
use common::server::{call, descriptor, request, EdgelimitServer, ServerOptions, OK, OVER_LIMIT};

const POLICY: &str = "domain: rot\ndescriptors:\n  - key: user\n    rate_limit: { unit: hour, requests_per_unit: 3 }\n";
const OLD: &str = "old-secret-0123456789abcdef-0123456789";
const NEW: &str = "new-secret-0123456789abcdef-0123456789";

async fn codes(server: &EdgelimitServer, user: &str, n: usize) -> Vec<i32> {
    let mut client = server.client().await;
    let mut out = Vec::new();
    for _ in 0..n {
        let r = call(
            &mut client,
            request("rot", vec![descriptor(&[("user", user)])]),
        )
        .await
        .unwrap();
        out.push(r.overall_code);
    }
    out
}

#[tokio::test]
async fn rotation_with_the_previous_secret_keeps_used_quota() {
    let redis = RedisServer::start();
    let policies = [("rot.yaml", POLICY)];
    {
        let before = EdgelimitServer::start(
            ServerOptions::redis(&redis.url(), &policies).secrets(OLD, None),
        );
        assert_eq!(codes(&before, "alice", 2).await, vec![OK, OK]);
        assert_eq!(codes(&before, "bob", 2).await, vec![OK, OK]);
    }
    let rotating = EdgelimitServer::start(
        ServerOptions::redis(&redis.url(), &policies).secrets(NEW, Some(OLD)),
    );
    assert!(rotating.log_text().contains("rotation in progress"));
    // One unit was left under the old secret: that still binds.
    assert_eq!(
        codes(&rotating, "alice", 3).await,
        vec![OK, OVER_LIMIT, OVER_LIMIT]
    );
    drop(rotating);

    // The same restart without `previous_file` hands out a fresh quota.
    let reset =
        EdgelimitServer::start(ServerOptions::redis(&redis.url(), &policies).secrets(NEW, None));
    assert_eq!(codes(&reset, "bob", 3).await, vec![OK, OK, OK]);
}
