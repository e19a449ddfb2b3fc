//! edgelimit: an Envoy-compatible external rate-limit server.
//!
//! Layers, inner to outer: [`contract`] (provider-neutral port) ← [`algorithm`] (pure rules) ←
//! [`memory`] / [`redis`] (backends) ← [`policy`] (YAML, matching) ← [`envoy`] (gRPC) ←
//! [`bootstrap`] (composition).
#![forbid(unsafe_code)]

pub mod algorithm;
pub mod bootstrap;
pub mod contract;
pub mod duration;
pub mod envoy;
pub mod memory;
pub mod policy;
pub mod redis;
pub mod subject;
