//! Loading the HMAC secret. The secret's bytes never reach a log line or an error message.

use std::path::PathBuf;

use zeroize::Zeroizing;

use super::config::SecretSource;
use edgelimit_envoy::subject::{SubjectHasher, MIN_SECRET_LEN};

#[derive(Debug, thiserror::Error)]
pub enum SecretLoadError {
    #[error("{file} and {env} are both set; set at most one")]
    Ambiguous {
        file: &'static str,
        env: &'static str,
    },
    // `error` is not a `#[source]`: printed here once, not again by an error chain.
    #[error("{field}: cannot read the secret file {path}: {error}")]
    File {
        field: &'static str,
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("{field}: environment variable {var} is not set")]
    Env { field: &'static str, var: String },
    #[error(
        "{field}: the secret in {origin} is {len} bytes; at least {MIN_SECRET_LEN} are required"
    )]
    TooShort {
        field: &'static str,
        origin: String,
        len: usize,
    },
    #[error("hmac_secret is required with the Redis backend (keys are shared and must be stable across replicas)")]
    Required,
    #[error("could not generate a random secret: {0}")]
    Random(String),
}

/// The configuration fields one secret is read from, named by its errors.
#[derive(Debug, Clone, Copy)]
struct Fields {
    file: &'static str,
    env: &'static str,
}

const CURRENT: Fields = Fields {
    file: "hmac_secret.file",
    env: "hmac_secret.env",
};
const PREVIOUS: Fields = Fields {
    file: "hmac_secret.previous_file",
    env: "hmac_secret.previous_env",
};

/// Reads the configured secret; `None` if none is configured.
pub fn load(source: &SecretSource) -> Result<Option<Zeroizing<Vec<u8>>>, SecretLoadError> {
    load_from(source, CURRENT)
}

fn load_from(
    source: &SecretSource,
    fields: Fields,
) -> Result<Option<Zeroizing<Vec<u8>>>, SecretLoadError> {
    let mut bytes = match (&source.file, &source.env) {
        (Some(_), Some(_)) => {
            return Err(SecretLoadError::Ambiguous {
                file: fields.file,
                env: fields.env,
            })
        }
        (None, None) => return Ok(None),
        (Some(path), None) => {
            Zeroizing::new(std::fs::read(path).map_err(|error| SecretLoadError::File {
                field: fields.file,
                path: path.clone(),
                error,
            })?)
        }
        (None, Some(var)) => Zeroizing::new(
            std::env::var_os(var)
                .ok_or_else(|| SecretLoadError::Env {
                    field: fields.env,
                    var: var.clone(),
                })?
                .into_encoded_bytes(),
        ),
    };
    // Files written by editors and `echo` end with a newline that is not part of the secret.
    while bytes.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
        bytes.pop();
    }
    if bytes.len() < MIN_SECRET_LEN {
        return Err(too_short(source, fields, bytes.len()));
    }
    Ok(Some(bytes))
}

/// Names the field, and the file's path or the variable's name (never the secret).
fn too_short(source: &SecretSource, fields: Fields, len: usize) -> SecretLoadError {
    let (field, origin) = match (&source.file, &source.env) {
        (Some(path), _) => (fields.file, format!("file {}", path.display())),
        (None, Some(var)) => (fields.env, format!("environment variable {var}")),
        (None, None) => ("hmac_secret", "the generated secret".into()),
    };
    SecretLoadError::TooShort { field, origin, len }
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
    let hasher = SubjectHasher::new(secret).map_err(|_| too_short(source, CURRENT, len))?;
    Ok((hasher, generated))
}

/// The hasher of the secret being rotated out, if `previous_*` is configured.
pub fn previous_hasher(source: &SecretSource) -> Result<Option<SubjectHasher>, SecretLoadError> {
    let Some(previous) = source.previous() else {
        return Ok(None);
    };
    let Some(secret) = load_from(&previous, PREVIOUS)? else {
        return Ok(None);
    };
    let len = secret.len();
    SubjectHasher::new(secret)
        .map(Some)
        .map_err(|_| too_short(&previous, PREVIOUS, len))
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
        assert!(
            err.starts_with("hmac_secret.file: "),
            "names the field: {err}"
        );
        assert!(
            err.contains(&path.display().to_string()),
            "names the file: {err}"
        );
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
        assert!(matches!(
            load(&both),
            Err(SecretLoadError::Ambiguous { .. })
        ));
        let missing = SecretSource {
            env: Some("EDGELIMIT_TEST_SURELY_UNSET_VARIABLE".into()),
            ..SecretSource::default()
        };
        assert!(matches!(load(&missing), Err(SecretLoadError::Env { .. })));
    }

    #[test]
    fn a_missing_file_prints_its_os_error_once() {
        let src = SecretSource {
            file: Some("/nonexistent/edgelimit-secret".into()),
            ..SecretSource::default()
        };
        let err = anyhow::Error::from(load(&src).unwrap_err());
        let text = format!("{err:#}");
        assert!(text.contains("/nonexistent/edgelimit-secret"), "{text}");
        assert_eq!(text.matches("No such file").count(), 1, "{text}");
    }

    #[test]
    fn the_previous_secret_names_its_own_field() {
        let dir = tempfile::tempdir().unwrap();
        let current = dir.path().join("current");
        let previous = dir.path().join("previous");
        std::fs::write(&current, "c".repeat(32)).unwrap();
        std::fs::write(&previous, "short").unwrap();
        let src = SecretSource {
            file: Some(current),
            previous_file: Some(previous.clone()),
            ..SecretSource::default()
        };
        let err = previous_hasher(&src).expect_err("too short").to_string();
        assert!(err.starts_with("hmac_secret.previous_file: "), "{err}");
        assert!(err.contains(&previous.display().to_string()), "{err}");
        let src = SecretSource {
            previous_env: Some("EDGELIMIT_TEST_SURELY_UNSET_VARIABLE".into()),
            ..src
        };
        let err = previous_hasher(&src).expect_err("ambiguous").to_string();
        assert!(
            err.starts_with("hmac_secret.previous_file and hmac_secret.previous_env"),
            "{err}"
        );
    }
}
