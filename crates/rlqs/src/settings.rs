//! What an operator sets for RLQS (`rlqs:` in `edgelimit.yaml`), with the defaults the
//! README documents.

use std::time::Duration;

/// Bounds and timings of the quota service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RlqsSettings {
    /// How long an assignment is valid (`assignment_time_to_live`). It is also how long a
    /// vanished instance's share stays reserved: its last assignment may still be in force.
    pub assignment_ttl: Duration,
    /// Streams open at once on this server; one more is refused `RESOURCE_EXHAUSTED`.
    pub max_streams: usize,
    /// Distinct buckets one stream may report; further ones are answered `deny_all`.
    pub max_buckets_per_stream: usize,
    /// Entries of one bucket id: every order of them is tried against the policy tree.
    pub max_bucket_entries: usize,
    /// Bytes of the domain, of a bucket key, of a bucket value.
    pub max_domain_bytes: usize,
    pub max_key_bytes: usize,
    pub max_value_bytes: usize,
    /// Time the backend has to answer one report's bucket.
    pub backend_timeout: Duration,
    /// Reports are expected this often until a stream has shown its own interval.
    pub assumed_report_interval: Duration,
    /// Global shadow mode: usage is still counted, every bucket is told `allow_all`.
    pub shadow_mode: bool,
}

impl Default for RlqsSettings {
    fn default() -> Self {
        Self {
            assignment_ttl: Duration::from_secs(5),
            max_streams: 1024,
            max_buckets_per_stream: 1024,
            max_bucket_entries: 5,
            max_domain_bytes: 256,
            max_key_bytes: 256,
            max_value_bytes: 4096,
            backend_timeout: Duration::from_secs(1),
            assumed_report_interval: Duration::from_secs(1),
            shadow_mode: false,
        }
    }
}
