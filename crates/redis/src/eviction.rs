//! Whether the Redis a new connection reached may evict our keys. Every key edgelimit writes
//! has a TTL, so `volatile-*` policies can evict them as well as `allkeys-*`: anything but
//! `noeviction` can drop a counter under memory pressure, and a dropped counter starts again
//! from zero (over-admission). Read from `INFO memory` because `CONFIG GET` is usually
//! forbidden to an application user; `+info` may be missing from the ACL too, and then the
//! policy is unknown (logged at debug level, the gauge is left as it is).

use std::time::Duration;

use redis::Value;

use super::connect::Link;

/// Reads the policy over `link` and reports it: a WARN line and the gauge at 1 if it evicts,
/// the gauge at 0 for `noeviction`. `node` names the server for the log (an address, never
/// a key or a credential).
pub(crate) async fn check(link: &Link, timeout: Duration, node: &str) {
    let mut link = link.clone();
    let mut info = redis::cmd("INFO");
    info.arg("memory");
    let policy = match tokio::time::timeout(timeout, link.send(&info)).await {
        Ok(Ok(value)) => match text(&value) {
            Some(text) => policy(&text),
            None => {
                tracing::debug!(
                    node,
                    "INFO memory refused or unreadable; eviction policy unknown"
                );
                return;
            }
        },
        Ok(Err(error)) => {
            tracing::debug!(node, %error, "INFO memory failed; eviction policy unknown");
            return;
        }
        Err(_) => {
            tracing::debug!(node, "INFO memory timed out; eviction policy unknown");
            return;
        }
    };
    let Some(policy) = policy else {
        tracing::debug!(
            node,
            "INFO memory names no maxmemory_policy; eviction policy unknown"
        );
        return;
    };
    let evicting = evicts(&policy);
    metrics::gauge!(edgelimit_metrics::REDIS_EVICTING_POLICY).set(if evicting { 1.0 } else { 0.0 });
    if evicting {
        tracing::warn!(
            node,
            maxmemory_policy = %policy,
            "Redis may evict rate-limit counters under memory pressure (maxmemory-policy is not \
             noeviction): an evicted counter restarts from zero, so more than the limit may be \
             allowed; set maxmemory-policy noeviction"
        );
    }
}

/// The reply's text; `None` for an error reply (NOPERM) or anything else.
fn text(value: &Value) -> Option<String> {
    match value {
        Value::BulkString(bytes) => Some(String::from_utf8_lossy(bytes).into_owned()),
        Value::VerbatimString { text, .. } => Some(text.clone()),
        Value::SimpleString(text) => Some(text.clone()),
        _ => None,
    }
}

fn policy(info: &str) -> Option<String> {
    info.lines()
        .find_map(|line| line.strip_prefix("maxmemory_policy:"))
        .map(|p| p.trim().to_owned())
        .filter(|p| !p.is_empty())
}

/// Every policy but `noeviction` may evict a key with a TTL, which all of ours have.
fn evicts(policy: &str) -> bool {
    !policy.eq_ignore_ascii_case("noeviction")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_policy_from_info_memory() {
        let info =
            "# Memory\r\nused_memory:1000\r\nmaxmemory:0\r\nmaxmemory_policy:allkeys-lru\r\n";
        assert_eq!(policy(info).as_deref(), Some("allkeys-lru"));
        assert_eq!(policy("# Memory\r\nused_memory:1\r\n"), None);
    }

    #[test]
    fn only_noeviction_keeps_every_counter() {
        assert!(!evicts("noeviction"));
        for p in [
            "allkeys-lru",
            "allkeys-lfu",
            "allkeys-random",
            "volatile-lru",
            "volatile-lfu",
            "volatile-random",
            "volatile-ttl",
        ] {
            assert!(evicts(p), "{p}");
        }
    }

    #[test]
    fn only_text_replies_are_read() {
        assert_eq!(text(&Value::Nil), None);
        assert_eq!(text(&Value::Int(1)), None);
        assert_eq!(
            text(&Value::BulkString(b"x".to_vec())).as_deref(),
            Some("x")
        );
    }
}
