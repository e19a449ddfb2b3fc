//! Bytes as a RESP reply (the redis crate's own parser), then edgelimit's reply validation,
//! single and composite. Never a panic, and nothing malformed is ever accepted: an accepted
//! reply is a seven-field array of a status and six integers in range, and an ALLOWED one is
//! consistent with its policy.
#![no_main]

use edgelimit::algorithm::Status;
use edgelimit::contract::{AlgorithmParams, PolicyId, RateLimitPolicy, MAX_EXACT_INTEGER};
use edgelimit::redis::{parse_replies, parse_reply};
use libfuzzer_sys::fuzz_target;
use redis::Value;

fn policy(id: &str, limit: u64) -> RateLimitPolicy {
    let id = PolicyId::new(id).unwrap_or_else(|e| panic!("fixed id refused: {e}"));
    RateLimitPolicy::new(
        id,
        1,
        AlgorithmParams::FixedWindow {
            limit,
            window_ms: 1000,
        },
        1,
        0,
        2000,
    )
    .unwrap_or_else(|e| panic!("fixed policy refused: {e}"))
}

/// Independent of the parser: the shape a reply must have to be accepted at all.
fn well_shaped(value: &Value) -> bool {
    let Value::Array(fields) = value else {
        return false;
    };
    fields.len() == 7
        && matches!(fields[0], Value::BulkString(_) | Value::SimpleString(_))
        && fields[1..]
            .iter()
            .all(|f| matches!(f, Value::Int(n) if (0..=MAX_EXACT_INTEGER as i64).contains(n)))
}

fn check_one(value: &Value, policy: &RateLimitPolicy, limit: u64) {
    if let Ok(reply) = parse_reply(value, policy) {
        assert!(well_shaped(value), "accepted a malformed reply: {value:?}");
        if reply.status == Status::Allowed {
            assert_eq!(reply.limit, limit);
            assert!(reply.remaining <= reply.limit);
            assert_eq!(reply.retry_after_ms, 0);
            assert!(reply.effective_now_ms >= reply.server_now_ms);
            assert!(reply.reset_at_ms >= reply.effective_now_ms);
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(value) = redis::parse_redis_value(data) else {
        return;
    };
    let a = policy("a", 10);
    let b = policy("b", 3);
    check_one(&value, &a, 10);
    match parse_replies(&value, &[&a, &b]) {
        Ok(replies) => {
            let Value::Array(items) = &value else {
                panic!("accepted a composite that is not an array: {value:?}");
            };
            assert_eq!(replies.len(), 2);
            check_one(&items[0], &a, 10);
            check_one(&items[1], &b, 3);
        }
        Err(_) => {}
    }
});
