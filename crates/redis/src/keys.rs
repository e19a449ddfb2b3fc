//! Physical state keys. The canonical form is
//! `<prefix>rate:<policyId>:state:{<subject tag>}<digest>` where digest = SHA-256 over the
//! length-prefixed (policyId, state revision, algorithm, subjectDigest), truncated to 128 bits,
//! and the subject tag = SHA-256 over the length-prefixed ("slot", subjectDigest), truncated to
//! 64 bits. The subject digest is already an HMAC, so no raw descriptor value can reach a key;
//! the state revision rolls keys when a change alters what the state means.
//!
//! The braces make the subject tag the Redis Cluster hash tag: subjects spread over slots,
//! while every limit of one subject (a rule's `rate_limits`, the same descriptor twice) shares
//! one slot, so the composite program decides them in one atomic call on Cluster too.

use sha2::{Digest, Sha256};

use edgelimit_contract::{RateLimitPolicy, SubjectDigest};

const HEX: &[u8; 16] = b"0123456789abcdef";

#[derive(Debug, Clone)]
pub struct KeyBuilder {
    prefix: String,
}

impl KeyBuilder {
    pub const DEFAULT_PREFIX: &'static str = "edgelimit:";

    pub fn new(prefix: impl Into<String>) -> Self {
        Self {
            prefix: prefix.into(),
        }
    }

    pub fn state_key(&self, policy: &RateLimitPolicy, subject: &SubjectDigest) -> String {
        let mut hasher = Sha256::new();
        for part in [
            policy.id().as_str().as_bytes(),
            &policy.revision().to_be_bytes(),
            policy.algorithm().as_str().as_bytes(),
            subject.as_bytes(),
        ] {
            hasher.update((part.len() as u64).to_be_bytes());
            hasher.update(part);
        }
        let digest = hasher.finalize();
        let mut key = String::with_capacity(self.prefix.len() + policy.id().as_str().len() + 64);
        key.push_str(&self.prefix);
        key.push_str("rate:");
        key.push_str(policy.id().as_str());
        key.push_str(":state:{");
        push_hex(&mut key, &subject_tag(subject));
        key.push('}');
        push_hex(&mut key, &digest[..16]);
        key
    }
}

/// 64 bits identifying the subject alone: the Cluster hash tag of all its keys.
fn subject_tag(subject: &SubjectDigest) -> [u8; 8] {
    let mut hasher = Sha256::new();
    for part in [&b"slot"[..], subject.as_bytes()] {
        hasher.update((part.len() as u64).to_be_bytes());
        hasher.update(part);
    }
    let mut tag = [0u8; 8];
    tag.copy_from_slice(&hasher.finalize()[..8]);
    tag
}

fn push_hex(out: &mut String, bytes: &[u8]) {
    for byte in bytes {
        out.push(char::from(HEX[usize::from(byte >> 4)]));
        out.push(char::from(HEX[usize::from(byte & 0xf)]));
    }
}

impl Default for KeyBuilder {
    fn default() -> Self {
        Self::new(Self::DEFAULT_PREFIX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use edgelimit_contract::{AlgorithmParams, PolicyId};

    fn policy(revision: u64, params: AlgorithmParams) -> RateLimitPolicy {
        RateLimitPolicy::new(PolicyId::new("edge.r1").unwrap(), revision, params, 1, 0, 0).unwrap()
    }

    const FW: AlgorithmParams = AlgorithmParams::FixedWindow {
        limit: 5,
        window_ms: 1000,
    };

    #[test]
    fn key_is_the_documented_digest_in_lowercase_hex() {
        let p = policy(0x0102_0304_0506_0708, FW);
        let subject = SubjectDigest::from_bytes([0xfe; 32]);
        let mut hasher = Sha256::new();
        for part in [
            &b"edge.r1"[..],
            &0x0102_0304_0506_0708u64.to_be_bytes(),
            b"fixed_window",
            &[0xfe; 32],
        ] {
            hasher.update((part.len() as u64).to_be_bytes());
            hasher.update(part);
        }
        let digest = hex::encode(&hasher.finalize()[..16]);
        let mut tag = Sha256::new();
        for part in [&b"slot"[..], &[0xfe; 32]] {
            tag.update((part.len() as u64).to_be_bytes());
            tag.update(part);
        }
        let tag = hex::encode(&tag.finalize()[..8]);
        let expected = format!("x:rate:edge.r1:state:{{{tag}}}{digest}");
        assert_eq!(KeyBuilder::new("x:").state_key(&p, &subject), expected);
    }

    #[test]
    fn key_has_canonical_shape_and_no_raw_subject() {
        let subject = SubjectDigest::from_bytes([0x41; 32]);
        let key = KeyBuilder::default().state_key(&policy(1, FW), &subject);
        assert!(key.starts_with("edgelimit:rate:edge.r1:state:{"), "{key}");
        let (open, close) = (key.find('{').unwrap(), key.find('}').unwrap());
        let tag = &key[open + 1..close];
        assert_eq!(tag.len(), 16);
        let digest = &key[close + 1..];
        assert_eq!(digest.len(), 32);
        assert!(tag
            .bytes()
            .chain(digest.bytes())
            .all(|b| b.is_ascii_hexdigit()));
        assert!(!key.contains(&hex::encode(subject.as_bytes())));
    }

    #[test]
    fn revision_algorithm_and_subject_each_change_the_key() {
        let keys = KeyBuilder::new("p:");
        let s1 = SubjectDigest::from_bytes([1; 32]);
        let s2 = SubjectDigest::from_bytes([2; 32]);
        let base = keys.state_key(&policy(1, FW), &s1);
        assert!(base.starts_with("p:rate:"));
        assert_ne!(base, keys.state_key(&policy(2, FW), &s1));
        assert_ne!(base, keys.state_key(&policy(1, FW), &s2));
        let sliding = AlgorithmParams::SlidingWindow {
            limit: 5,
            window_ms: 1000,
        };
        assert_ne!(base, keys.state_key(&policy(1, sliding), &s1));
        assert_eq!(base, keys.state_key(&policy(1, FW), &s1), "deterministic");
    }

    #[test]
    fn every_limit_of_a_subject_shares_its_slot() {
        let keys = KeyBuilder::default();
        let s1 = SubjectDigest::from_bytes([1; 32]);
        let other =
            RateLimitPolicy::new(PolicyId::new("edge.r2").unwrap(), 9, FW, 1, 0, 0).unwrap();
        let a = keys.state_key(&policy(1, FW), &s1);
        let b = keys.state_key(&other, &s1);
        assert_ne!(a, b);
        assert_eq!(crate::key_slot(a.as_bytes()), crate::key_slot(b.as_bytes()));
        let s2 = SubjectDigest::from_bytes([2; 32]);
        let c = keys.state_key(&policy(1, FW), &s2);
        assert_ne!(crate::key_slot(a.as_bytes()), crate::key_slot(c.as_bytes()));
    }
}
