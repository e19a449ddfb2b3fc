//! Structured reply validation. Anything this build does not fully understand — arity, status,
//! number syntax or range, a limit that is not the policy's — is incompatible, never an allow.

use ::redis::Value;
use thiserror::Error;

use edgelimit_algorithm::{ProgramReply, Status};
use edgelimit_contract::{RateLimitPolicy, MAX_EXACT_INTEGER};

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ReplyError {
    #[error("reply is not an array")]
    NotAnArray,
    #[error("composite reply has {got} replies, expected {expected}")]
    Count { got: usize, expected: usize },
    #[error("reply {index}: {error}")]
    Check {
        index: usize,
        error: Box<ReplyError>,
    },
    #[error("reply has {0} fields, expected 7")]
    Arity(usize),
    #[error("unknown status")]
    UnknownStatus,
    #[error("field {0} is not an integer in 0..=2^53-1")]
    Number(usize),
    #[error("reply limit {reply} differs from the policy limit {policy}")]
    LimitMismatch { reply: u64, policy: u64 },
    #[error("reply is internally inconsistent: {0}")]
    Inconsistent(&'static str),
}

/// A composite program's reply: one seven-field reply per check, each validated against its
/// check's policy.
pub fn parse_many(
    value: &Value,
    policies: &[&RateLimitPolicy],
) -> Result<Vec<ProgramReply>, ReplyError> {
    let replies = match value {
        Value::Array(replies) => replies,
        _ => return Err(ReplyError::NotAnArray),
    };
    if replies.len() != policies.len() {
        return Err(ReplyError::Count {
            got: replies.len(),
            expected: policies.len(),
        });
    }
    replies
        .iter()
        .zip(policies)
        .enumerate()
        .map(|(index, (reply, policy))| {
            parse(reply, policy).map_err(|error| ReplyError::Check {
                index,
                error: Box::new(error),
            })
        })
        .collect()
}

pub fn parse(value: &Value, policy: &RateLimitPolicy) -> Result<ProgramReply, ReplyError> {
    let fields = match value {
        Value::Array(fields) => fields,
        _ => return Err(ReplyError::NotAnArray),
    };
    if fields.len() != 7 {
        return Err(ReplyError::Arity(fields.len()));
    }
    let status = match &fields[0] {
        Value::BulkString(bytes) => Status::parse(bytes),
        Value::SimpleString(s) => Status::parse(s.as_bytes()),
        _ => None,
    }
    .ok_or(ReplyError::UnknownStatus)?;
    let number = |i: usize| match fields[i] {
        Value::Int(n) if (0..=MAX_EXACT_INTEGER as i64).contains(&n) => Ok(n as u64),
        _ => Err(ReplyError::Number(i)),
    };
    let reply = ProgramReply {
        status,
        server_now_ms: number(1)?,
        effective_now_ms: number(2)?,
        limit: number(3)?,
        remaining: number(4)?,
        retry_after_ms: number(5)?,
        reset_at_ms: number(6)?,
    };
    if !matches!(status, Status::Allowed | Status::Denied) {
        return Ok(reply);
    }
    let policy_limit = policy.params().limit();
    if reply.limit != policy_limit {
        return Err(ReplyError::LimitMismatch {
            reply: reply.limit,
            policy: policy_limit,
        });
    }
    if reply.remaining > reply.limit {
        return Err(ReplyError::Inconsistent("remaining above limit"));
    }
    if reply.effective_now_ms < reply.server_now_ms
        || reply.effective_now_ms - reply.server_now_ms > policy.max_clock_regression_ms()
    {
        return Err(ReplyError::Inconsistent("effective time outside the clamp"));
    }
    if reply.reset_at_ms < reply.effective_now_ms {
        return Err(ReplyError::Inconsistent("reset before now"));
    }
    if status == Status::Allowed && reply.retry_after_ms != 0 {
        return Err(ReplyError::Inconsistent("allowed with a retry delay"));
    }
    Ok(reply)
}

#[cfg(test)]
mod tests {
    use super::*;
    use edgelimit_contract::{AlgorithmParams, PolicyId};

    fn policy() -> RateLimitPolicy {
        RateLimitPolicy::new(
            PolicyId::new("p").unwrap(),
            1,
            AlgorithmParams::FixedWindow {
                limit: 10,
                window_ms: 1000,
            },
            1,
            0,
            2000,
        )
        .unwrap()
    }

    fn reply(status: &str, nums: [i64; 6]) -> Value {
        let mut v = vec![Value::BulkString(status.as_bytes().to_vec())];
        v.extend(nums.iter().map(|n| Value::Int(*n)));
        Value::Array(v)
    }

    const NOW: i64 = 1_700_000_000_000;

    #[test]
    fn parses_a_well_formed_reply() {
        let r = parse(
            &reply("ALLOWED", [NOW, NOW, 10, 9, 0, NOW + 500]),
            &policy(),
        )
        .unwrap();
        assert_eq!(r.status, Status::Allowed);
        assert_eq!(r.remaining, 9);
        let d = parse(
            &reply("DENIED", [NOW, NOW + 5, 10, 0, 495, NOW + 500]),
            &policy(),
        )
        .unwrap();
        assert_eq!(d.retry_after_ms, 495);
    }

    #[test]
    fn rejects_anything_unexpected() {
        let p = policy();
        let cases = [
            (Value::Nil, ReplyError::NotAnArray),
            (Value::Array(vec![]), ReplyError::Arity(0)),
            (
                reply("MAYBE", [NOW, NOW, 10, 9, 0, NOW]),
                ReplyError::UnknownStatus,
            ),
            (
                reply("ALLOWED", [NOW, NOW, 10, -1, 0, NOW]),
                ReplyError::Number(4),
            ),
            (
                reply("ALLOWED", [NOW, NOW, 1 << 53, 9, 0, NOW]),
                ReplyError::Number(3),
            ),
            (
                reply("ALLOWED", [NOW, NOW, 11, 9, 0, NOW]),
                ReplyError::LimitMismatch {
                    reply: 11,
                    policy: 10,
                },
            ),
            (
                reply("ALLOWED", [NOW, NOW, 10, 11, 0, NOW]),
                ReplyError::Inconsistent("remaining above limit"),
            ),
            (
                reply("ALLOWED", [NOW, NOW - 1, 10, 1, 0, NOW]),
                ReplyError::Inconsistent("effective time outside the clamp"),
            ),
            (
                reply("ALLOWED", [NOW, NOW, 10, 1, 5, NOW]),
                ReplyError::Inconsistent("allowed with a retry delay"),
            ),
        ];
        for (value, expected) in cases {
            assert_eq!(parse(&value, &p), Err(expected));
        }
        let mut eight = vec![Value::BulkString(b"ALLOWED".to_vec())];
        eight.extend((0..7).map(|_| Value::Int(NOW)));
        assert_eq!(parse(&Value::Array(eight), &p), Err(ReplyError::Arity(8)));
        let text_number = Value::Array(vec![
            Value::BulkString(b"ALLOWED".to_vec()),
            Value::BulkString(NOW.to_string().into_bytes()),
            Value::Int(NOW),
            Value::Int(10),
            Value::Int(9),
            Value::Int(0),
            Value::Int(NOW),
        ]);
        assert_eq!(parse(&text_number, &p), Err(ReplyError::Number(1)));
    }

    #[test]
    fn non_decisions_pass_through_for_classification() {
        let r = parse(&reply("CLOCK_UNSAFE", [NOW, NOW, 10, 0, 0, 0]), &policy()).unwrap();
        assert_eq!(r.status, Status::ClockUnsafe);
    }
}
