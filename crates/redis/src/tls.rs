//! TLS material for `rediss://` connections (rustls with the ring provider; no OpenSSL).

use redis::{ClientTlsConfig, TlsCertificates};

use super::settings::{RedisSetupError, TlsFiles};

/// Makes ring the process-wide rustls provider. rustls refuses to guess when no provider is
/// installed; an earlier installation (by another component) is kept.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// Reads the PEM files named in `redis.tls`. The key's bytes only reach the TLS stack; errors
/// name the file, never its content.
pub fn certificates(files: &TlsFiles) -> Result<TlsCertificates, RedisSetupError> {
    let read = |field: &'static str, path: &std::path::PathBuf| {
        std::fs::read(path).map_err(|error| RedisSetupError::TlsFile {
            field,
            path: path.clone(),
            error,
        })
    };
    let root_cert = files
        .ca_file
        .as_ref()
        .map(|p| read("ca_file", p))
        .transpose()?;
    let client_tls = match (&files.cert_file, &files.key_file) {
        (Some(cert), Some(key)) => Some(ClientTlsConfig {
            client_cert: read("cert_file", cert)?,
            client_key: read("key_file", key)?,
        }),
        (None, None) => None,
        _ => return Err(RedisSetupError::HalfClientCert),
    };
    Ok(TlsCertificates {
        client_tls,
        root_cert,
    })
}
