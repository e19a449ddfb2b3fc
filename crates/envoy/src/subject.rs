//! Pseudonymous subject digests: HMAC-SHA256 over a canonical, length-prefixed encoding of the
//! domain and the matched descriptor entries. Raw values never leave this function.

use hmac::{Hmac, Mac};
use sha2::Sha256;
use thiserror::Error;
use zeroize::Zeroizing;

use edgelimit_contract::SubjectDigest;

/// Minimum secret length: an HMAC-SHA256 key shorter than its output weakens it.
pub const MIN_SECRET_LEN: usize = 32;
/// Separates this use of the secret from any other use of the same secret.
const CONTEXT: &[u8] = b"edgelimit/subject/v1";

#[derive(Debug, Error, PartialEq, Eq)]
pub enum SecretError {
    #[error("the HMAC secret must be at least {MIN_SECRET_LEN} bytes, got {0}")]
    TooShort(usize),
}

/// The HMAC secret. Zeroized on drop; `Debug` never prints it.
pub struct SubjectHasher {
    mac: Hmac<Sha256>,
    _secret: Zeroizing<Vec<u8>>,
}

impl std::fmt::Debug for SubjectHasher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SubjectHasher(<secret>)")
    }
}

impl SubjectHasher {
    pub fn new(secret: Zeroizing<Vec<u8>>) -> Result<Self, SecretError> {
        if secret.len() < MIN_SECRET_LEN {
            return Err(SecretError::TooShort(secret.len()));
        }
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&secret)
            .map_err(|_| SecretError::TooShort(secret.len()))?;
        mac.update(CONTEXT);
        Ok(Self {
            mac,
            _secret: secret,
        })
    }

    /// Digest of `domain` and the `(key, value)` entries, in request order. Each part is
    /// length-prefixed so that no two different entry lists share an encoding. Parts are bytes
    /// (any value Envoy sends, UTF-8 or not); a UTF-8 text hashes as its bytes.
    pub fn digest<K: AsRef<[u8]>, V: AsRef<[u8]>>(
        &self,
        domain: &[u8],
        entries: impl ExactSizeIterator<Item = (K, V)>,
    ) -> SubjectDigest {
        let mut mac = self.mac.clone();
        update_prefixed(&mut mac, domain);
        mac.update(&(entries.len() as u64).to_be_bytes());
        for (key, value) in entries {
            update_prefixed(&mut mac, key.as_ref());
            update_prefixed(&mut mac, value.as_ref());
        }
        SubjectDigest::from_bytes(mac.finalize().into_bytes().into())
    }
}

fn update_prefixed(mac: &mut Hmac<Sha256>, bytes: &[u8]) {
    mac.update(&(bytes.len() as u64).to_be_bytes());
    mac.update(bytes);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hasher(byte: u8) -> SubjectHasher {
        SubjectHasher::new(Zeroizing::new(vec![byte; 32])).unwrap()
    }

    #[test]
    fn rejects_short_secrets() {
        let err = SubjectHasher::new(Zeroizing::new(vec![1; 31])).unwrap_err();
        assert_eq!(err, SecretError::TooShort(31));
        assert!(!format!("{err}").contains('\u{1}'));
    }

    #[test]
    fn encoding_is_unambiguous() {
        let h = hasher(9);
        let a = h.digest(b"d", [("ab", "c")].into_iter());
        let b = h.digest(b"d", [("a", "bc")].into_iter());
        let c = h.digest(b"d", [("a", "b"), ("c", "")].into_iter());
        let d = h.digest(b"da", [("b", "c")].into_iter());
        assert_ne!(a, b);
        assert_ne!(a, c);
        assert_ne!(a, d);
        assert_eq!(a, h.digest(b"d", [("ab", "c")].into_iter()));
    }

    #[test]
    fn bytes_that_are_not_utf8_have_their_own_digest() {
        let h = hasher(3);
        let text = h.digest(b"d", [("k", "v")].into_iter());
        assert_eq!(text, h.digest(b"d", [(&b"k"[..], &b"v"[..])].into_iter()));
        let a = h.digest(b"d", [(&b"k"[..], &b"\xff"[..])].into_iter());
        let b = h.digest(b"d", [(&b"k"[..], &b"\xfe"[..])].into_iter());
        let c = h.digest(b"\xff", [(&b"k"[..], &b"\xff"[..])].into_iter());
        assert!(a != b && a != c && a != text);
    }

    #[test]
    fn secret_changes_the_digest_and_is_not_printed() {
        let one = hasher(1).digest(b"d", [("ip", "10.0.0.1")].into_iter());
        let two = hasher(2).digest(b"d", [("ip", "10.0.0.1")].into_iter());
        assert_ne!(one, two);
        assert_eq!(format!("{:?}", hasher(1)), "SubjectHasher(<secret>)");
    }
}
