//! The request path end to end: the walking skeleton, multi-limit scenarios on every
//! backend, the deny cache, the embedded backend through its port, secret rotation, request
//! bounds and hostile clients. One test binary (each links the whole server: fewer binaries
//! build faster).

#[path = "../common/mod.rs"]
mod common;

mod bounds;
mod deny_cache;
mod grpc_framing;
mod harness;
mod hostile_clients;
mod memory_backend;
mod opaque_bytes;
mod scenarios;
mod secret_rotation;
mod walking_skeleton;
