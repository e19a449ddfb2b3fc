//! Envoy's Rate Limit Quota Service (`envoy.service.rate_limit_quota.v3`), backed by the
//! same policies and backends as `ShouldRateLimit`. Envoy's `rate_limit_quota` filter
//! enforces locally and streams usage reports; the server answers each report with an
//! assignment per bucket.
//!
//! One file per job: [`bucket`] maps a bucket id to its policies and subject, [`share`]
//! computes an instance's assignment, [`demand`] keeps the live instances' demand, `quota`
//! consumes reported usage in the backend, `service` is the streaming endpoint.
#![forbid(unsafe_code)]

pub mod bucket;
pub mod demand;
mod metrics;
mod quota;
mod service;
mod settings;
pub mod share;

pub use service::QuotaService;
pub use settings::RlqsSettings;
