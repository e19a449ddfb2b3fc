//! TLS, and mTLS with a client CA, on the gRPC listener: each connection accepted (and
//! bounded) by the guarded listener is handshaken on its own task within the handshake
//! timeout, so a slow or hostile client never holds up the accept loop.

use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use arc_swap::ArcSwap;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use serde::Deserialize;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::mpsc;
use tokio_stream::StreamExt;
use tonic::transport::server::Connected;

use super::listener::{GuardedIncoming, GuardedStream};

/// `tls:` in the server configuration.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListenerTlsConfig {
    /// PEM certificate chain and key the gRPC listener presents.
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
    /// PEM CA bundle: when set, clients must present a certificate it signed (mTLS).
    #[serde(default)]
    pub client_ca_file: Option<PathBuf>,
}

#[derive(Debug, thiserror::Error)]
#[error("tls.{field}: {path}: {message}")]
pub struct TlsFileError {
    field: &'static str,
    path: String,
    message: String,
}

fn file_error(field: &'static str, path: &Path, message: impl ToString) -> TlsFileError {
    TlsFileError {
        field,
        path: path.display().to_string(),
        message: message.to_string(),
    }
}

fn chain(field: &'static str, path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsFileError> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| file_error(field, path, e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| file_error(field, path, e))?;
    if certs.is_empty() {
        return Err(file_error(field, path, "no PEM certificate in the file"));
    }
    Ok(certs)
}

/// How often the certificate and key files are checked for a rotation.
const ROTATION_CHECK: Duration = Duration::from_secs(1);

/// The certificate new handshakes get; swapped whole when the files change, so established
/// connections keep theirs and are not dropped.
#[derive(Debug)]
struct RotatingCert {
    current: ArcSwap<CertifiedKey>,
}

impl ResolvesServerCert for RotatingCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.load_full())
    }
}

/// The listener's TLS: the rustls configuration and the certificate it rotates.
pub struct ListenerTls {
    pub config: Arc<rustls::ServerConfig>,
    cert: Arc<RotatingCert>,
    files: ListenerTlsConfig,
    provider: Arc<rustls::crypto::CryptoProvider>,
}

fn certified_key(
    tls: &ListenerTlsConfig,
    provider: &rustls::crypto::CryptoProvider,
) -> Result<CertifiedKey, TlsFileError> {
    let key = PrivateKeyDer::from_pem_file(&tls.key_file)
        .map_err(|e| file_error("key_file", &tls.key_file, e))?;
    CertifiedKey::from_der(chain("cert_file", &tls.cert_file)?, key, provider)
        .map_err(|e| file_error("key_file", &tls.key_file, e))
}

/// Modification time and length of both files: what a rotation changes (Kubernetes swaps a
/// symlink; metadata follows it).
fn stamp(tls: &ListenerTlsConfig) -> Option<[(std::time::SystemTime, u64); 2]> {
    let one = |p: &Path| {
        std::fs::metadata(p)
            .and_then(|m| Ok((m.modified()?, m.len())))
            .ok()
    };
    Some([one(&tls.cert_file)?, one(&tls.key_file)?])
}

impl ListenerTls {
    /// Loads the files; every problem names the field and the file.
    pub fn load(tls: &ListenerTlsConfig) -> Result<Self, TlsFileError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| file_error("cert_file", &tls.cert_file, e))?;
        let builder = match &tls.client_ca_file {
            Some(ca) => {
                let mut roots = rustls::RootCertStore::empty();
                for cert in chain("client_ca_file", ca)? {
                    roots
                        .add(cert)
                        .map_err(|e| file_error("client_ca_file", ca, e))?;
                }
                let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                    Arc::new(roots),
                    provider.clone(),
                )
                .build()
                .map_err(|e| file_error("client_ca_file", ca, e))?;
                builder.with_client_cert_verifier(verifier)
            }
            None => builder.with_no_client_auth(),
        };
        let cert = Arc::new(RotatingCert {
            current: ArcSwap::from_pointee(certified_key(tls, &provider)?),
        });
        let mut config = builder.with_cert_resolver(cert.clone());
        config.alpn_protocols = vec![b"h2".to_vec()];
        Ok(Self {
            config: Arc::new(config),
            cert,
            files: tls.clone(),
            provider,
        })
    }

    /// Polls the certificate and key files and serves a changed pair to new handshakes; an
    /// invalid pair (e.g. caught half-written) is logged and the current one kept.
    pub fn spawn_rotation(&self) -> tokio::task::JoinHandle<()> {
        let (cert, files, provider) =
            (self.cert.clone(), self.files.clone(), self.provider.clone());
        tokio::spawn(async move {
            let mut last = stamp(&files);
            let mut ticks = tokio::time::interval(ROTATION_CHECK);
            loop {
                ticks.tick().await;
                let now = stamp(&files);
                if now == last {
                    continue;
                }
                match certified_key(&files, &provider) {
                    Ok(key) => {
                        cert.current.store(Arc::new(key));
                        last = now;
                        tracing::info!(
                            cert = %files.cert_file.display(),
                            "gRPC listener certificate reloaded"
                        );
                    }
                    Err(error) => tracing::warn!(
                        %error,
                        "gRPC listener certificate not reloaded; still serving the previous one"
                    ),
                }
            }
        })
    }
}

/// A TLS connection on the gRPC listener (still holding its connection slot).
pub struct TlsConnection(tokio_rustls::server::TlsStream<GuardedStream>);

impl Connected for TlsConnection {
    type ConnectInfo = <GuardedStream as Connected>::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.0.get_ref().0.connect_info()
    }
}

impl AsyncRead for TlsConnection {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for TlsConnection {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

/// Handshakes every accepted connection; failed or slow handshakes are dropped (their slot
/// freed) and logged at debug, since a scan would otherwise flood the log. The task ends when
/// the server stops taking connections; abort it on shutdown to close the listener.
pub fn incoming(
    mut accepted: GuardedIncoming,
    config: Arc<rustls::ServerConfig>,
    handshake_timeout: Duration,
) -> (
    tokio_stream::wrappers::ReceiverStream<io::Result<TlsConnection>>,
    tokio::task::JoinHandle<()>,
) {
    for reason in ["refused", "timeout"] {
        metrics::counter!(edgelimit_metrics::GRPC_TLS_HANDSHAKE_FAILURES, "reason" => reason)
            .increment(0);
    }
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    // Bounded: connections beyond it wait in their handshake task, each holding a slot.
    let (tx, rx) = mpsc::channel(64);
    let task = tokio::spawn(async move {
        while let Some(next) = accepted.next().await {
            let stream = match next {
                Ok(stream) => stream,
                Err(error) => {
                    if tx.send(Err(error)).await.is_err() {
                        break;
                    }
                    continue;
                }
            };
            let acceptor = acceptor.clone();
            let tx = tx.clone();
            tokio::spawn(async move {
                match tokio::time::timeout(handshake_timeout, acceptor.accept(stream)).await {
                    Ok(Ok(tls)) => {
                        let _ = tx.send(Ok(TlsConnection(tls))).await;
                    }
                    Ok(Err(error)) => {
                        refused("refused");
                        tracing::debug!(%error, "gRPC TLS handshake failed");
                    }
                    Err(_) => {
                        refused("timeout");
                        tracing::debug!("gRPC TLS handshake timed out");
                    }
                }
            });
        }
    });
    (tokio_stream::wrappers::ReceiverStream::new(rx), task)
}

fn refused(reason: &'static str) {
    metrics::counter!(edgelimit_metrics::GRPC_TLS_HANDSHAKE_FAILURES, "reason" => reason)
        .increment(1);
}
