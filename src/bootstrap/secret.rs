//! Loading the HMAC secret. The secret's bytes never reach a log line or an error message.

use std::path::PathBuf;

use zeroize::Zeroizing;

use super::config::SecretSource;
use edgelimit_envoy::subject::{SubjectHasher, MIN_SECRET_LEN};

#[derive(Debug, thiserror::Error)]
pub enum SecretLoadError {
    #[error("hmac_secret: set exactly one of `file` and `env`")]
    Ambiguous,
    #[error("hmac_secret: cannot read the secret file {path}: {source}")]
    File {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("hmac_secret: environment variable {0} is not set")]
    Env(String),
    #[error("hmac_secret: the secret is {len} bytes; at least {MIN_SECRET_LEN} are required")]
    TooShort { len: usize },
    #[error("hmac_secret is required with the Redis backend (keys are shared and must be stable across replicas)")]
    Required,
    #[error("could not generate a random secret: {0}")]
    Random(String),
}

/// Reads the configured secret; `None` if none is configured.
pub fn load(source: &SecretSource) -> Result<Option<Zeroizing<Vec<u8>>>, SecretLoadError> {
    let mut bytes = match (&source.file, &source.env) {
        (Some(_), Some(_)) => return Err(SecretLoadError::Ambiguous),
        (None, None) => return Ok(None),
        (Some(path), None) => {
            Zeroizing::new(std::fs::read(path).map_err(|source| SecretLoadError::File {
                path: path.clone(),
                source,
            })?)
        }
        (None, Some(var)) => Zeroizing::new(
            std::env::var_os(var)
                .ok_or_else(|| SecretLoadError::Env(var.clone()))?
                .into_encoded_bytes(),
        ),
    };
    // Files written by editors and `echo` end with a newline that is not part of the secret.
    while bytes.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
        bytes.pop();
    }
    if bytes.len() < MIN_SECRET_LEN {
        return Err(SecretLoadError::TooShort { len: bytes.len() });
    }
    Ok(Some(bytes))
}

/// The hasher for this process: the configured secret, or — only where keys never leave the
/// process — a random one.
pub fn hasher(
    source: &SecretSource,
    required: bool,
) -> Result<(SubjectHasher, bool), SecretLoadError> {
    let (secret, generated) = match load(source)? {
        Some(secret) => (secret, false),
        None if required => return Err(SecretLoadError::Required),
        None => {
            let mut random = Zeroizing::new(vec![0u8; MIN_SECRET_LEN]);
            getrandom::fill(&mut random).map_err(|e| SecretLoadError::Random(e.to_string()))?;
            (random, true)
        }
    };
    let len = secret.len();
    let hasher = SubjectHasher::new(secret).map_err(|_| SecretLoadError::TooShort { len })?;
    Ok((hasher, generated))
}

/// The hasher of the secret being rotated out, if `previous_*` is configured.
pub fn previous_hasher(source: &SecretSource) -> Result<Option<SubjectHasher>, SecretLoadError> {
    let Some(previous) = source.previous() else {
        return Ok(None);
    };
    let Some(secret) = load(&previous)? else {
        return Ok(None);
    };
    let len = secret.len();
    SubjectHasher::new(secret)
        .map(Some)
        .map_err(|_| SecretLoadError::TooShort { len })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_secret_is_trimmed_and_checked() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("secret");
        std::fs::write(&path, format!("{}\n", "s".repeat(32))).unwrap();
        let src = SecretSource {
            file: Some(path.clone()),
            ..SecretSource::default()
        };
        assert_eq!(load(&src).unwrap().unwrap().len(), 32);
        std::fs::write(&path, "short-secret-value\n").unwrap();
        let err = load(&src).unwrap_err().to_string();
        assert!(err.contains("18 bytes"), "{err}");
        assert!(!err.contains("short-secret-value"), "never echo the secret");
    }

    #[test]
    fn redis_requires_a_secret_memory_generates_one() {
        let none = SecretSource::default();
        assert!(matches!(
            hasher(&none, true),
            Err(SecretLoadError::Required)
        ));
        let (_, generated) = hasher(&none, false).unwrap();
        assert!(generated);
        let both = SecretSource {
            file: Some("x".into()),
            env: Some("Y".into()),
            ..SecretSource::default()
        };
        assert!(matches!(load(&both), Err(SecretLoadError::Ambiguous)));
        let missing = SecretSource {
            env: Some("EDGELIMIT_TEST_SURELY_UNSET_VARIABLE".into()),
            ..SecretSource::default()
        };
        assert!(matches!(load(&missing), Err(SecretLoadError::Env(_))));
    }
}
