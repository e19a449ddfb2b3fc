//! TLS (and mTLS) to the management server: a rustls client over our own connector, so the
//! stream verifies the server against the configured CA and presents the client certificate.

use std::path::Path;
use std::sync::Arc;

use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tonic::codegen::http::Uri;

use crate::bootstrap::config::TlsConfig;

#[derive(Debug, thiserror::Error)]
pub enum XdsTlsError {
    #[error("xds.tls.{field}: {path}: {message}")]
    File {
        field: &'static str,
        path: String,
        message: String,
    },
    #[error("xds.tls: {0}")]
    Config(String),
}

fn certs(field: &'static str, path: &Path) -> Result<Vec<CertificateDer<'static>>, XdsTlsError> {
    let err = |message: String| XdsTlsError::File {
        field,
        path: path.display().to_string(),
        message,
    };
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| err(e.to_string()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| err(e.to_string()))?;
    if certs.is_empty() {
        return Err(err("no PEM certificate in the file".into()));
    }
    Ok(certs)
}

/// The rustls client configuration for `tls`: the server is verified against `ca_file`, or
/// Mozilla's roots (compiled in: the image has no CA bundle) when it is unset, as the
/// reference falls back to the system's; the client certificate is optional (mTLS).
pub fn client_config(tls: &TlsConfig) -> Result<Arc<rustls::ClientConfig>, XdsTlsError> {
    let mut roots = rustls::RootCertStore::empty();
    match tls.ca_file.as_deref() {
        Some(ca) => {
            for cert in certs("ca_file", ca)? {
                roots.add(cert).map_err(|e| XdsTlsError::File {
                    field: "ca_file",
                    path: ca.display().to_string(),
                    message: e.to_string(),
                })?;
            }
        }
        None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| XdsTlsError::Config(e.to_string()))?
        .with_root_certificates(roots);
    let mut config = match (&tls.cert_file, &tls.key_file) {
        (Some(cert), Some(key)) => {
            let chain = certs("cert_file", cert)?;
            let key = PrivateKeyDer::from_pem_file(key).map_err(|e| XdsTlsError::File {
                field: "key_file",
                path: key.display().to_string(),
                message: e.to_string(),
            })?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| XdsTlsError::Config(format!("client certificate and key: {e}")))?
        }
        (None, None) => builder.with_no_client_auth(),
        _ => {
            return Err(XdsTlsError::Config(
                "cert_file and key_file go together".into(),
            ))
        }
    };
    // gRPC needs HTTP/2, negotiated by ALPN.
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
}

/// Connects TCP then TLS to the URI's host, verifying the certificate against that name.
pub fn connector(
    config: Arc<rustls::ClientConfig>,
) -> impl tower::Service<
    Uri,
    Response = TokioIo<tokio_rustls::client::TlsStream<tokio::net::TcpStream>>,
    Error = std::io::Error,
    Future = impl Send,
> + Clone
       + Send
       + 'static {
    connector_named(config, None)
}

/// As [`connector`], verifying the certificate against `server_name` when given.
pub fn connector_named(
    config: Arc<rustls::ClientConfig>,
    server_name: Option<String>,
) -> impl tower::Service<
    Uri,
    Response = TokioIo<tokio_rustls::client::TlsStream<tokio::net::TcpStream>>,
    Error = std::io::Error,
    Future = impl Send,
> + Clone
       + Send
       + 'static {
    let connector = tokio_rustls::TlsConnector::from(config);
    tower::service_fn(move |uri: Uri| {
        let connector = connector.clone();
        let server_name = server_name.clone();
        async move {
            let invalid =
                |m: &str| std::io::Error::new(std::io::ErrorKind::InvalidInput, m.to_owned());
            let host = uri
                .host()
                .ok_or_else(|| invalid("xds.server_url has no host"))?;
            let host = host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_owned();
            let port = uri.port_u16().unwrap_or(443);
            let name = ServerName::try_from(server_name.unwrap_or_else(|| host.clone()))
                .map_err(|_| invalid("xds.server_url host is not a valid TLS server name"))?;
            let tcp = tokio::net::TcpStream::connect((host.as_str(), port)).await?;
            let _ = tcp.set_nodelay(true);
            let tls = connector.connect(name, tcp).await?;
            Ok(TokioIo::new(tls))
        }
    })
}
