//! Regenerates `proto/rls_descriptors.bin`, the descriptor set gRPC reflection serves.
//!
//! envoy-types ships all ~500 Envoy proto files in one set; serving them all would advertise
//! every Envoy service. This keeps the transitive closure of `rls.proto` only.
//!
//! Usage: cargo run --example trim_descriptors -- <envoy-types>/src/generated/types.bin
use std::collections::{BTreeSet, HashMap};

use prost::Message;
use prost_types::FileDescriptorSet;

const ROOT: &str = "envoy/service/ratelimit/v3/rls.proto";

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let input = std::env::args()
        .nth(1)
        .ok_or("usage: trim_descriptors <path to envoy-types types.bin>")?;
    let all = FileDescriptorSet::decode(std::fs::read(input)?.as_slice())?;
    let by_name: HashMap<&str, &prost_types::FileDescriptorProto> =
        all.file.iter().map(|f| (f.name(), f)).collect();
    let mut keep = BTreeSet::new();
    let mut stack = vec![ROOT];
    while let Some(name) = stack.pop() {
        if !keep.insert(name) {
            continue;
        }
        let file = by_name
            .get(name)
            .ok_or(format!("{name} missing from the set"))?;
        stack.extend(file.dependency.iter().map(String::as_str));
    }
    // Dependencies first, as protoc orders them.
    let trimmed = FileDescriptorSet {
        file: all
            .file
            .iter()
            .filter(|f| keep.contains(f.name()))
            .map(|f| prost_types::FileDescriptorProto {
                // Comments and spans are not needed to describe services; they triple the size.
                source_code_info: None,
                ..f.clone()
            })
            .collect(),
    };
    std::fs::write("proto/rls_descriptors.bin", trimmed.encode_to_vec())?;
    println!("kept {} of {} files", trimmed.file.len(), all.file.len());
    Ok(())
}
