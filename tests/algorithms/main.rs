//! The algorithms: boundaries and properties of the Rust functions, the Lua programs checked
//! against them (differential), and each algorithm end to end through the server. One test
//! binary (each links the whole server: fewer binaries build faster).

#[path = "../common/mod.rs"]
mod common;
#[path = "../support/programs.rs"]
mod programs;

mod boundaries;
mod differential;
mod end_to_end;
mod properties;
