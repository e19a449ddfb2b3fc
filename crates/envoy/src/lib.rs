//! Envoy's `RateLimitService` over gRPC. One file per job: [`translate`] turns a request into
//! the limits it touches (validation, matching, costs, subjects), the limiter decides them in
//! one backend call, [`response`] maps the outcomes to statuses and headers (uncertain
//! outcomes fail closed), `metrics` counts decisions, `service` is the tonic endpoint.
#![forbid(unsafe_code)]

mod deadline;
mod headers;
mod limiter;
mod metrics;
mod response;
mod service;
mod settings;
pub mod subject;
pub mod trace;
mod translate;
mod unary;
pub mod wire;

/// A request's per-limit (or per-descriptor) list: most requests have a few, kept on the
/// stack rather than in one heap allocation each.
pub(crate) type PerLimit<T> = smallvec::SmallVec<[T; 4]>;

pub use deadline::{grpc_timeout, parse_grpc_timeout};
pub use headers::{HeaderFacts, HeaderSettings, ReferenceHeaderNames};
pub use limiter::RateLimiter;
pub use service::RateLimitServer;
pub use settings::{FailureMode, ServiceSettings};
pub use translate::{plan_checks, RequestBounds, RequestError};
