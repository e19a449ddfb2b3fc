use thiserror::Error;

/// Why a contract value could not be constructed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ContractError {
    #[error("policy id must be 1..={max} bytes of [A-Za-z0-9._:-], got {len} bytes")]
    PolicyIdLength { len: usize, max: usize },
    #[error("policy id contains a character outside [A-Za-z0-9._:-]")]
    PolicyIdCharset,
    #[error("request cost must be positive")]
    ZeroCost,
    #[error("request cost {cost} exceeds the policy's maximum cost {max}")]
    CostAboveMaximum { cost: u64, max: u64 },
    #[error("{what} = {value} is outside the exact integer range (max {max})", max = super::MAX_EXACT_INTEGER)]
    BeyondExactRange { what: &'static str, value: u128 },
    #[error("{what} must be at least {min}, got {value}")]
    BelowMinimum {
        what: &'static str,
        value: u64,
        min: u64,
    },
    #[error("evaluation ids (request deduplication) are not supported by this revision")]
    EvaluationIdUnsupported,
    #[error("the caller deadline has already passed")]
    DeadlineExpired,
    #[error("a request must check at least one limit")]
    NoChecks,
    #[error("request checks {count} limits, at most {max} allowed")]
    TooManyChecks { count: usize, max: usize },
    #[error("request for policy {request} evaluated against policy {policy}")]
    PolicyMismatch { request: String, policy: String },
}
