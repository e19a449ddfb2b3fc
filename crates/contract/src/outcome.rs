use std::time::Duration;

use super::{PolicyId, RateLimitDecision};

/// The result of asking a port. Only `Evaluated` may ever allow a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RateLimitOutcome {
    Evaluated(RateLimitDecision),
    /// Known not to have mutated anything (failed before sending, or refused by the program).
    Unavailable {
        policy_id: PolicyId,
        retry_after: Duration,
        cause: UnavailableCause,
    },
    /// Sent, but the reply was lost: the quota may or may not have been consumed.
    Indeterminate {
        policy_id: PolicyId,
        retry_after: Duration,
        cause: IndeterminateCause,
    },
    /// State, program or reply do not match what this build expects.
    Incompatible {
        policy_id: PolicyId,
        cause: IncompatibleCause,
    },
}

impl RateLimitOutcome {
    pub fn is_allowed(&self) -> bool {
        matches!(self, RateLimitOutcome::Evaluated(d) if d.allowed)
    }

    pub fn category(&self) -> &'static str {
        match self {
            RateLimitOutcome::Evaluated(_) => "evaluated",
            RateLimitOutcome::Unavailable { .. } => "unavailable",
            RateLimitOutcome::Indeterminate { .. } => "indeterminate",
            RateLimitOutcome::Incompatible { .. } => "incompatible",
        }
    }

    /// Bounded label describing why an outcome is not a decision.
    pub fn cause(&self) -> &'static str {
        match self {
            RateLimitOutcome::Evaluated(_) => "none",
            RateLimitOutcome::Unavailable { cause, .. } => cause.as_str(),
            RateLimitOutcome::Indeterminate { cause, .. } => cause.as_str(),
            RateLimitOutcome::Incompatible { cause, .. } => cause.as_str(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum UnavailableCause {
    /// Too many commands in flight; the request was never sent.
    AdmissionBoundReached,
    /// The caller's deadline leaves too little time for the backend to answer.
    DeadlineTooShort,
    /// The commands already waiting would not let this one be answered within its budget.
    Overloaded,
    /// The command reached Redis after its deadline and did nothing.
    ExpiredInQueue,
    /// Could not connect (refused, DNS, TLS handshake) before sending.
    ConnectFailed,
    /// The server refused the command before running it (LOADING, READONLY, BUSY, OOM, ...).
    ServerRefused,
    /// The server's clock moved backwards beyond the policy's tolerance.
    ClockUnsafe,
    /// The embedded backend tracks its maximum number of subjects.
    CapacityExhausted,
}

impl UnavailableCause {
    pub fn as_str(self) -> &'static str {
        match self {
            UnavailableCause::AdmissionBoundReached => "admission_bound",
            UnavailableCause::DeadlineTooShort => "deadline_too_short",
            UnavailableCause::Overloaded => "overloaded",
            UnavailableCause::ExpiredInQueue => "expired_in_queue",
            UnavailableCause::ConnectFailed => "connect_failed",
            UnavailableCause::ServerRefused => "server_refused",
            UnavailableCause::ClockUnsafe => "clock_unsafe",
            UnavailableCause::CapacityExhausted => "capacity_exhausted",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IndeterminateCause {
    /// No reply within the command timeout after the command was written.
    Timeout,
    /// The connection broke after the command may have been written.
    ConnectionLost,
    /// Any other error after dispatch whose effect on state is unknown.
    AfterDispatch,
}

impl IndeterminateCause {
    pub fn as_str(self) -> &'static str {
        match self {
            IndeterminateCause::Timeout => "timeout",
            IndeterminateCause::ConnectionLost => "connection_lost",
            IndeterminateCause::AfterDispatch => "after_dispatch",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IncompatibleCause {
    /// Stored state has another schema, algorithm, policy or revision, or is malformed.
    StateIncompatible,
    /// The key holds a value of another Redis type.
    WrongType,
    /// The program rejected its arguments.
    InvalidArguments,
    /// The reply's arity, status or numbers are not what this build understands.
    MalformedReply,
    /// The program could not be loaded or failed while running.
    ProgramError,
    /// The request was built for another policy.
    PolicyMismatch,
}

impl IncompatibleCause {
    pub fn as_str(self) -> &'static str {
        match self {
            IncompatibleCause::StateIncompatible => "state_incompatible",
            IncompatibleCause::WrongType => "wrong_type",
            IncompatibleCause::InvalidArguments => "invalid_arguments",
            IncompatibleCause::MalformedReply => "malformed_reply",
            IncompatibleCause::ProgramError => "program_error",
            IncompatibleCause::PolicyMismatch => "policy_mismatch",
        }
    }
}
