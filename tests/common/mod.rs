//! Shared harness for end-to-end tests against real processes.
#![allow(dead_code)]

pub mod backends;
pub mod bytes_client;
pub mod fault_load;
pub mod raw_h2;
pub mod redis_server;
pub mod server;
pub mod tcp_proxy;
pub mod topologies;
