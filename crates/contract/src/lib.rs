//! Provider-neutral rate-limit contract: what a request, a policy, a decision and an outcome
//! are, and the port every backend implements. Knows nothing of Redis, gRPC or YAML.
#![forbid(unsafe_code)]

mod composite;
mod decision;
mod error;
mod outcome;
mod policy;
mod port;
mod request;

pub use composite::{CompositeOutcome, CompositeRequest, Enforcement, LimitCheck};
pub use decision::{Certainty, DecisionSource, RateLimitDecision};
pub use error::ContractError;
pub use outcome::{IncompatibleCause, IndeterminateCause, RateLimitOutcome, UnavailableCause};
pub use policy::{
    Algorithm, AlgorithmParams, FailurePolicy, PolicyId, RateLimitPolicy, Revision, MAX_PERIOD_MS,
    SLIDING_WEIGHT_SCALE,
};
pub use port::{BackendReadiness, RateLimitPort};
pub use request::{Cost, RateLimitRequest, SubjectDigest};

/// Largest integer every arithmetic step must stay within: Redis Lua numbers are IEEE doubles,
/// exact only up to 2^53 - 1.
pub const MAX_EXACT_INTEGER: u64 = (1 << 53) - 1;
