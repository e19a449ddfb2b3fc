//! The three algorithms as pure integer state machines. The Lua programs in `lua/` and these
//! functions implement the same rules; differential tests keep them identical.

use std::fmt;

/// Status field of a program reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Status {
    Allowed,
    Denied,
    ClockUnsafe,
    StateIncompatible,
    Invalid,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Allowed => "ALLOWED",
            Status::Denied => "DENIED",
            Status::ClockUnsafe => "CLOCK_UNSAFE",
            Status::StateIncompatible => "STATE_INCOMPATIBLE",
            Status::Invalid => "INVALID",
        }
    }

    pub fn parse(s: &[u8]) -> Option<Self> {
        Some(match s {
            b"ALLOWED" => Status::Allowed,
            b"DENIED" => Status::Denied,
            b"CLOCK_UNSAFE" => Status::ClockUnsafe,
            b"STATE_INCOMPATIBLE" => Status::StateIncompatible,
            b"INVALID" => Status::Invalid,
            _ => return None,
        })
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The seven-field reply every program returns, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ProgramReply {
    pub status: Status,
    pub server_now_ms: u64,
    pub effective_now_ms: u64,
    pub limit: u64,
    pub remaining: u64,
    pub retry_after_ms: u64,
    pub reset_at_ms: u64,
}

/// Schema version stored in every state hash (field `v`) and passed as ARGV[1].
pub const SCHEMA_VERSION: &str = "1";

mod verdict;
pub use verdict::outcome_from_reply;
