//! Shared harness for end-to-end tests against real processes.
#![allow(dead_code)]

pub mod redis_server;
pub mod server;
pub mod tcp_proxy;
