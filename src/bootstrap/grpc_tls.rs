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
use rustls::client::danger::HandshakeSignatureValid;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ClientHello, ParsedCertificate, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::{DigitallySignedStruct, DistinguishedName, SignatureScheme};
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
    /// Reloaded on rotation, like the certificate.
    #[serde(default)]
    pub client_ca_file: Option<PathBuf>,
    /// With `client_ca_file`: the client certificate must also be valid for this DNS name
    /// (or IP address) in its subjectAltName, as the reference's `GRPC_CLIENT_TLS_SAN`.
    #[serde(default)]
    pub client_san: Option<String>,
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
    client: Option<Arc<RotatingClientVerifier>>,
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

type Stamp = Option<(std::time::SystemTime, u64)>;

/// Modification time and length of a file: what a rotation changes (Kubernetes swaps a
/// symlink; metadata follows it).
fn stamp(path: &Path) -> Stamp {
    std::fs::metadata(path)
        .and_then(|m| Ok((m.modified()?, m.len())))
        .ok()
}

fn key_stamp(tls: &ListenerTlsConfig) -> [Stamp; 2] {
    [stamp(&tls.cert_file), stamp(&tls.key_file)]
}

/// The client verifier for `client_ca_file` (and `client_san`).
fn client_verifier(
    tls: &ListenerTlsConfig,
    provider: &Arc<rustls::crypto::CryptoProvider>,
) -> Result<Arc<dyn ClientCertVerifier>, TlsFileError> {
    let Some(ca) = &tls.client_ca_file else {
        return Err(file_error("client_ca_file", &tls.cert_file, "not set"));
    };
    let mut roots = rustls::RootCertStore::empty();
    for cert in chain("client_ca_file", ca)? {
        roots
            .add(cert)
            .map_err(|e| file_error("client_ca_file", ca, e))?;
    }
    let webpki = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        provider.clone(),
    )
    .build()
    .map_err(|e| file_error("client_ca_file", ca, e))?;
    Ok(match &tls.client_san {
        None => webpki,
        Some(san) => {
            let name = ServerName::try_from(san.clone()).map_err(|_| TlsFileError {
                field: "client_san",
                path: san.clone(),
                message: "not a DNS name or IP address".into(),
            })?;
            Arc::new(SanVerifier {
                inner: webpki,
                name,
            })
        }
    })
}

/// The CA chain check, then the subjectAltName: the reference verifies the client
/// certificate as a server certificate for that name would be.
#[derive(Debug)]
struct SanVerifier {
    inner: Arc<dyn ClientCertVerifier>,
    name: ServerName<'static>,
}

impl ClientCertVerifier for SanVerifier {
    fn offer_client_auth(&self) -> bool {
        self.inner.offer_client_auth()
    }
    fn client_auth_mandatory(&self) -> bool {
        self.inner.client_auth_mandatory()
    }
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.inner.root_hint_subjects()
    }
    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let verified = self
            .inner
            .verify_client_cert(end_entity, intermediates, now)?;
        let parsed = ParsedCertificate::try_from(end_entity)?;
        rustls::client::verify_server_name(&parsed, &self.name)?;
        Ok(verified)
    }
    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }
    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }
    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// The client verifier new handshakes get; swapped whole when the client CA file changes.
#[derive(Debug)]
struct RotatingClientVerifier {
    current: ArcSwap<Arc<dyn ClientCertVerifier>>,
}

impl ClientCertVerifier for RotatingClientVerifier {
    fn offer_client_auth(&self) -> bool {
        true
    }
    fn client_auth_mandatory(&self) -> bool {
        true
    }
    /// No CA names are sent (they would have to outlive a rotation); clients with one
    /// certificate, as Envoy has, present it anyway.
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }
    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        self.current
            .load()
            .verify_client_cert(end_entity, intermediates, now)
    }
    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.current
            .load()
            .verify_tls12_signature(message, cert, dss)
    }
    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.current
            .load()
            .verify_tls13_signature(message, cert, dss)
    }
    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.current.load().supported_verify_schemes()
    }
}

impl ListenerTls {
    /// Loads the files; every problem names the field and the file.
    pub fn load(tls: &ListenerTlsConfig) -> Result<Self, TlsFileError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| file_error("cert_file", &tls.cert_file, e))?;
        let client = match &tls.client_ca_file {
            Some(_) => Some(Arc::new(RotatingClientVerifier {
                current: ArcSwap::from_pointee(client_verifier(tls, &provider)?),
            })),
            None => {
                if tls.client_san.is_some() {
                    return Err(file_error(
                        "client_san",
                        &tls.cert_file,
                        "needs tls.client_ca_file (the SAN is checked on verified client certificates)",
                    ));
                }
                None
            }
        };
        let builder = match &client {
            Some(verifier) => builder.with_client_cert_verifier(verifier.clone()),
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
            client,
            files: tls.clone(),
            provider,
        })
    }

    /// Polls the certificate, key and client CA files and serves what changed to new
    /// handshakes; an invalid file (e.g. caught half-written) is logged and the current one
    /// kept.
    pub fn spawn_rotation(&self) -> tokio::task::JoinHandle<()> {
        let (cert, client, files, provider) = (
            self.cert.clone(),
            self.client.clone(),
            self.files.clone(),
            self.provider.clone(),
        );
        tokio::spawn(async move {
            let mut last = key_stamp(&files);
            let mut last_ca = files.client_ca_file.as_deref().map(stamp);
            let mut ticks = tokio::time::interval(ROTATION_CHECK);
            loop {
                ticks.tick().await;
                let now = key_stamp(&files);
                if now != last {
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
                let (Some(client), Some(ca)) = (&client, &files.client_ca_file) else {
                    continue;
                };
                let now_ca = Some(stamp(ca));
                if now_ca == last_ca {
                    continue;
                }
                match client_verifier(&files, &provider) {
                    Ok(verifier) => {
                        client.current.store(Arc::new(verifier));
                        last_ca = now_ca;
                        tracing::info!(ca = %ca.display(), "gRPC listener client CA reloaded");
                    }
                    Err(error) => tracing::warn!(
                        %error,
                        "gRPC listener client CA not reloaded; still verifying against the previous one"
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
