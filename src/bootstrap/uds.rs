//! The gRPC listener on a Unix domain socket (the reference's `GRPC_UDS`), for an Envoy in the
//! same pod or host. Access is the socket file's: its mode is set before the socket is
//! reachable under its name, a stale socket left by a crash is replaced, anything else at the
//! path (a regular file, a directory, a live server's socket) stops the start, and the file is
//! removed on shutdown if it is still ours.

use std::io;
use std::os::unix::fs::{FileTypeExt as _, MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use serde::Deserialize;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::OwnedSemaphorePermit;

use super::listener::AcceptGate;
use tokio_stream::Stream;
use tonic::transport::server::Connected;

/// `listen_uds:` in the server configuration: gRPC on this socket instead of `listen`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UdsConfig {
    pub path: PathBuf,
    /// Octal file mode of the socket, e.g. `"0660"` (owner and group may connect).
    #[serde(default = "default_mode")]
    pub mode: String,
}

fn default_mode() -> String {
    "0660".into()
}

impl UdsConfig {
    pub fn new(path: PathBuf) -> Self {
        Self {
            path,
            mode: default_mode(),
        }
    }

    /// The mode as a number; the message names the field.
    pub fn mode_bits(&self) -> Result<u32, String> {
        let digits = self.mode.trim_start_matches("0o");
        u32::from_str_radix(digits, 8)
            .ok()
            .filter(|m| *m <= 0o777 && !digits.is_empty())
            .ok_or_else(|| {
                format!(
                    "listen_uds.mode: expected an octal mode such as \"0660\", got {:?}",
                    self.mode
                )
            })
    }

    pub fn validate(&self) -> Result<(), String> {
        if self.path.as_os_str().is_empty() {
            return Err("listen_uds.path: must not be empty".into());
        }
        self.mode_bits().map(|_| ())
    }
}

/// The bound socket; removes its file when dropped (if the path still names it).
pub struct UdsListener {
    pub listener: UnixListener,
    path: PathBuf,
    identity: (u64, u64),
}

/// Binds `config.path` with `config.mode`. The socket is bound under a temporary name in the
/// same directory, given its mode, then renamed over the path, so it is never reachable with
/// the process's default (umask) permissions.
pub fn bind(config: &UdsConfig) -> anyhow::Result<UdsListener> {
    let mode = config.mode_bits().map_err(anyhow::Error::msg)?;
    let path = &config.path;
    clear_stale(path)?;
    let file_name = path
        .file_name()
        .ok_or_else(|| anyhow::anyhow!("listen_uds.path: {} has no file name", path.display()))?;
    let mut temp_name = std::ffi::OsString::from(".");
    temp_name.push(file_name);
    temp_name.push(format!(".{}.tmp", std::process::id()));
    let temp = path.with_file_name(temp_name);
    // Ours from an earlier crash with the same pid, if anything: only a socket is removed.
    clear_stale(&temp)?;
    let listener = UnixListener::bind(&temp)
        .map_err(|e| anyhow::anyhow!("listen_uds.path: cannot bind {}: {e}", temp.display()))?;
    let placed = std::fs::set_permissions(&temp, std::fs::Permissions::from_mode(mode))
        .and_then(|()| std::fs::rename(&temp, path));
    if let Err(e) = placed {
        let _ = std::fs::remove_file(&temp);
        anyhow::bail!("listen_uds.path: cannot place {}: {e}", path.display());
    }
    let meta = std::fs::symlink_metadata(path)?;
    Ok(UdsListener {
        listener,
        path: path.clone(),
        identity: (meta.dev(), meta.ino()),
    })
}

/// Removes a socket nobody listens on; refuses anything else at the path.
fn clear_stale(path: &Path) -> anyhow::Result<()> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => anyhow::bail!("listen_uds.path: {}: {e}", path.display()),
    };
    if !meta.file_type().is_socket() {
        anyhow::bail!(
            "listen_uds.path: {} exists and is not a socket; not removing it",
            path.display()
        );
    }
    match std::os::unix::net::UnixStream::connect(path) {
        Ok(_) => anyhow::bail!(
            "listen_uds.path: {} is in use by a running server",
            path.display()
        ),
        Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
            tracing::info!(path = %path.display(), "removing a stale gRPC socket");
            std::fs::remove_file(path)
                .map_err(|e| anyhow::anyhow!("listen_uds.path: {}: {e}", path.display()))
        }
        Err(e) => anyhow::bail!("listen_uds.path: {}: {e}", path.display()),
    }
}

impl Drop for UdsListener {
    fn drop(&mut self) {
        // Only our socket: another process may have replaced it since.
        let ours = std::fs::symlink_metadata(&self.path)
            .is_ok_and(|m| (m.dev(), m.ino()) == self.identity);
        if ours {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Accepted connections, each holding one of `max_connections` slots until dropped (beyond
/// it, a connection is closed at once, as on TCP).
pub struct UdsIncoming {
    listener: Arc<UdsListener>,
    gate: AcceptGate,
}

impl UdsIncoming {
    pub fn new(listener: Arc<UdsListener>, max_connections: usize) -> Self {
        Self {
            listener,
            gate: AcceptGate::new(max_connections, "unix socket"),
        }
    }
}

impl Stream for UdsIncoming {
    type Item = io::Result<UdsConnection>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        let listener = &this.listener.listener;
        let (stream, permit) = std::task::ready!(this.gate.poll_admit(cx, |cx| listener
            .poll_accept(cx)
            .map_ok(|(stream, _)| stream)));
        Poll::Ready(Some(Ok(UdsConnection {
            stream,
            _permit: permit,
        })))
    }
}

/// One accepted unix-socket connection.
pub struct UdsConnection {
    stream: UnixStream,
    _permit: OwnedSemaphorePermit,
}

impl Drop for UdsConnection {
    fn drop(&mut self) {
        metrics::gauge!(edgelimit_metrics::GRPC_CONNECTIONS).decrement(1.0);
    }
}

impl Connected for UdsConnection {
    type ConnectInfo = <UnixStream as Connected>::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.stream.connect_info()
    }
}

impl AsyncRead for UdsConnection {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for UdsConnection {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_are_octal_and_bounded() {
        let mode = |m: &str| UdsConfig {
            path: "/tmp/x.sock".into(),
            mode: m.into(),
        };
        assert_eq!(mode("0660").mode_bits(), Ok(0o660));
        assert_eq!(mode("600").mode_bits(), Ok(0o600));
        assert_eq!(mode("0o666").mode_bits(), Ok(0o666));
        for bad in ["", "0999", "rw-rw----", "1777"] {
            let e = mode(bad).mode_bits().unwrap_err();
            assert!(e.starts_with("listen_uds.mode"), "{bad}: {e}");
        }
    }

    #[tokio::test]
    async fn binds_with_the_mode_replaces_a_stale_socket_and_refuses_anything_else() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rl.sock");
        let config = UdsConfig {
            path: path.clone(),
            mode: "0600".into(),
        };
        // A stale socket: bound, then its listener gone without removing the file.
        drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
        let listener = bind(&config).unwrap();
        let meta = std::fs::symlink_metadata(&path).unwrap();
        assert!(meta.file_type().is_socket());
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        // A second server on the same path is refused while the first listens.
        let busy = bind(&config).err().unwrap().to_string();
        assert!(busy.contains("in use"), "{busy}");
        drop(listener);
        assert!(!path.exists(), "removed on shutdown");

        std::fs::write(&path, "not a socket").unwrap();
        let e = bind(&config).err().unwrap().to_string();
        assert!(e.contains("not a socket"), "{e}");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "not a socket");
    }
}
