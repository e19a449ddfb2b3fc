//! edgelimit: an Envoy-compatible external rate-limit server.
//!
//! The layers are separate crates, so a dependency can only point inwards (see README,
//! "Architecture"): `edgelimit-contract` (provider-neutral port) ← `edgelimit-algorithm` (pure
//! rules) ← `edgelimit-memory` / `edgelimit-redis` (backends); `edgelimit-policy` (YAML,
//! matching) ← `edgelimit-envoy` (gRPC); this crate's [`bootstrap`] composes them. The
//! re-exports below keep one path per layer for the binary, the tests and the benchmarks.
#![forbid(unsafe_code)]

pub mod bootstrap;

pub use edgelimit_algorithm as algorithm;
pub use edgelimit_contract as contract;
pub use edgelimit_envoy as envoy;
pub use edgelimit_envoy::subject;
pub use edgelimit_memory as memory;
pub use edgelimit_policy as policy;
pub use edgelimit_policy::duration;
pub use edgelimit_redis as redis;
pub use edgelimit_rlqs as rlqs;
