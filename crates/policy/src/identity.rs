//! Stable, bounded, key-safe names for rules and limits, and the revisions that tell the
//! backend when a limit's parameters changed. Descriptor values never reach an id unless the
//! operator wrote them as a `name`; the path is hashed instead.

use sha2::{Digest, Sha256};

use super::model::Unit;
use edgelimit_contract::AlgorithmParams;

/// Longest slug kept verbatim; longer ones are cut and tagged with a hash.
pub(crate) const SLUG_MAX: usize = 48;

/// Reduces `raw` to `[A-Za-z0-9._-]`. When anything was replaced or cut, a 6-hex hash of the
/// original is appended so distinct inputs stay distinct.
pub(crate) fn slug(raw: &str) -> String {
    let reduced: String = raw
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect();
    // `reduced` is ASCII, so byte truncation stays on a char boundary.
    let changed = reduced != raw || reduced.len() > SLUG_MAX;
    let mut out: String = reduced.chars().take(SLUG_MAX).collect();
    if changed {
        let digest = Sha256::digest(raw.as_bytes());
        out.push('-');
        out.push_str(&hex::encode(&digest[..3]));
    }
    out
}

/// One level of a rule's path: key and (absent for key-only) value.
pub(crate) type PathLevel<'a> = (&'a str, Option<&'a str>);

/// `r` + 12 hex of SHA-256 over the canonical path: identifies unnamed rules without
/// exposing configured values (which may be routes or customer identifiers).
pub(crate) fn path_slug(domain: &str, path: &[PathLevel<'_>]) -> String {
    let mut c = Canon::new("edgelimit.rule-path.v1");
    c.path(domain, path);
    let digest = c.finish();
    format!("r{}", hex::encode(&digest[..6]))
}

/// What a limit's stored state *means*: the rule it belongs to, its algorithm and the period
/// its counts or refills refer to. A change of any of these yields a new revision, so the
/// limit starts from a fresh key; a new number (requests per window, refill rate, burst) or a
/// new bound (`max_cost`, cleanup grace, clock regression) keeps the revision and the counter
/// (the programs clamp a count above a lowered limit, or tokens above a lowered capacity).
pub(crate) struct RevisionInput<'a> {
    pub id: &'a str,
    pub domain: &'a str,
    pub path: &'a [PathLevel<'a>],
    pub params: &'a AlgorithmParams,
}

pub(crate) fn revision(input: &RevisionInput<'_>) -> u64 {
    let mut c = Canon::new("edgelimit.state-revision.v1");
    c.str(input.id);
    c.path(input.domain, input.path);
    c.str(input.params.algorithm().as_str());
    c.u64(input.params.period_ms());
    first_u64(&c.finish())
}

/// Revision of a descriptor's `limit` override: derived only from what the request and the
/// load options say, so equal overrides share state and a changed one starts fresh.
pub(crate) fn override_revision(
    requests_per_unit: u64,
    unit: Unit,
    max_cost: u64,
    cleanup_grace_ms: u64,
    max_clock_regression_ms: u64,
) -> u64 {
    let mut c = Canon::new("edgelimit.override-revision.v1");
    c.u64(requests_per_unit);
    c.str(unit.as_str());
    c.u64(max_cost);
    c.u64(cleanup_grace_ms);
    c.u64(max_clock_regression_ms);
    first_u64(&c.finish())
}

fn first_u64(digest: &[u8; 32]) -> u64 {
    let mut bytes = [0u8; 8];
    bytes.copy_from_slice(&digest[..8]);
    u64::from_be_bytes(bytes)
}

/// Length-prefixed, tagged encoding: no two distinct inputs share an encoding.
pub(crate) struct Canon(Sha256);

impl Canon {
    pub(crate) fn new(context: &str) -> Self {
        let mut c = Canon(Sha256::new());
        c.str(context);
        c
    }

    pub(crate) fn u64(&mut self, v: u64) {
        self.0.update(v.to_be_bytes());
    }

    pub(crate) fn str(&mut self, s: &str) {
        self.bytes(s.as_bytes());
    }

    pub(crate) fn bytes(&mut self, b: &[u8]) {
        self.u64(b.len() as u64);
        self.0.update(b);
    }

    fn path(&mut self, domain: &str, path: &[PathLevel<'_>]) {
        self.str(domain);
        self.u64(path.len() as u64);
        for (key, value) in path {
            self.str(key);
            match value {
                Some(v) => {
                    self.0.update([1]);
                    self.str(v);
                }
                None => self.0.update([0]),
            }
        }
    }

    pub(crate) fn finish(self) -> [u8; 32] {
        self.0.finalize().into()
    }

    pub(crate) fn finish_u64(self) -> u64 {
        first_u64(&self.finish())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slugs_are_bounded_and_tagged_when_changed() {
        assert_eq!(slug("api.v1_x-y"), "api.v1_x-y");
        let s = slug("my domain/é");
        assert!(s.starts_with("my_domain__-"), "{s}");
        assert_eq!(s.len(), "my_domain__".len() + 7);
        assert_ne!(slug("a b"), slug("a/b"), "distinct inputs stay distinct");
        let long = slug(&"a".repeat(100));
        assert_eq!(long.len(), SLUG_MAX + 7);
        assert_eq!(slug(&"a".repeat(48)), "a".repeat(48));
    }

    #[test]
    fn path_slug_hides_values_and_depends_on_every_level() {
        let a = path_slug("api", &[("path", Some("/login"))]);
        assert!(a.starts_with('r') && a.len() == 13, "{a}");
        assert!(!a.contains("login"));
        assert_ne!(a, path_slug("api", &[("path", None)]));
        assert_ne!(a, path_slug("api", &[("path", Some("/logout"))]));
        assert_ne!(a, path_slug("edge", &[("path", Some("/login"))]));
        assert_ne!(
            path_slug("d", &[("ab", Some("c"))]),
            path_slug("d", &[("a", Some("bc"))])
        );
    }
}
