//! Composition: reads configuration, builds the backend, policies and services, and runs
//! them. Holds no rate-limit logic of its own.

pub mod admin;
pub mod cli;
pub mod config;
pub mod grpc_tls;
mod json;
pub use edgelimit_policy::duration;
mod grpc_server;
mod listener;
pub mod log_filter;
pub mod otel;
pub mod readiness;
pub mod refenv;
pub mod reload;
pub mod secret;
mod serve;
pub mod telemetry;
pub mod top;
pub mod uds;
pub mod xds;

pub use config::{BackendKind, ServerConfig};
pub use serve::{load_options, load_policies, serve, ServeHandle};
