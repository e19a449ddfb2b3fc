//! The gRPC listener with connection-level bounds: at most `max_connections` open at once
//! (further ones are accepted and closed at once, so the kernel backlog never fills with
//! clients that hang), a deadline for the HTTP/2 preface (idle or half-open sockets cannot
//! hold a slot forever), and TCP keepalive / nodelay on every accepted socket (tonic ignores
//! its own socket settings for a caller-supplied listener).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use socket2::{SockRef, TcpKeepalive};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Sleep;
use tokio_stream::Stream;
use tonic::transport::server::{Connected, TcpConnectInfo};

/// Length of the HTTP/2 client connection preface (`PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n`).
const PREFACE_LEN: usize = 24;
/// Pause after an accept error (e.g. out of file descriptors) so the loop does not spin.
const ACCEPT_ERROR_BACKOFF: Duration = Duration::from_millis(50);

#[derive(Debug, Clone)]
pub struct ConnectionLimits {
    pub max_connections: usize,
    pub handshake_timeout: Duration,
    pub tcp_keepalive: Duration,
    pub tcp_nodelay: bool,
}

/// The admission both gRPC listeners (TCP here, the Unix socket in `uds`) apply to what they
/// accept: at most `max_connections` open at once — one more is closed at once and counted,
/// not logged, since a flood would flood the log too — and a pause after an accept error
/// (e.g. out of file descriptors) rather than a spinning loop.
pub(super) struct AcceptGate {
    slots: Arc<Semaphore>,
    backoff: Option<Pin<Box<Sleep>>>,
    /// Names the listener in the accept-error warning.
    listener: &'static str,
}

impl AcceptGate {
    pub(super) fn new(max_connections: usize, listener: &'static str) -> Self {
        Self {
            slots: Arc::new(Semaphore::new(max_connections)),
            backoff: None,
            listener,
        }
    }

    /// Polls `accept` until a connection gets a slot (counted in the open-connections gauge
    /// until its permit is dropped).
    pub(super) fn poll_admit<S>(
        &mut self,
        cx: &mut Context<'_>,
        mut accept: impl FnMut(&mut Context<'_>) -> Poll<io::Result<S>>,
    ) -> Poll<(S, OwnedSemaphorePermit)> {
        if let Some(backoff) = self.backoff.as_mut() {
            if backoff.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            self.backoff = None;
        }
        loop {
            match accept(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(error)) => {
                    tracing::warn!(%error, listener = self.listener, "accepting a gRPC connection failed");
                    let mut sleep = Box::pin(tokio::time::sleep(ACCEPT_ERROR_BACKOFF));
                    // Registers the waker; the sleep has only just started.
                    let _ = sleep.as_mut().poll(cx);
                    self.backoff = Some(sleep);
                    return Poll::Pending;
                }
                Poll::Ready(Ok(stream)) => {
                    let Ok(permit) = self.slots.clone().try_acquire_owned() else {
                        metrics::counter!(edgelimit_metrics::GRPC_CONNECTIONS_REFUSED).increment(1);
                        drop(stream);
                        continue;
                    };
                    metrics::gauge!(edgelimit_metrics::GRPC_CONNECTIONS).increment(1.0);
                    return Poll::Ready((stream, permit));
                }
            }
        }
    }
}

/// Accepted connections, each holding one of `max_connections` slots until it is dropped.
pub struct GuardedIncoming {
    listener: TcpListener,
    gate: AcceptGate,
    limits: ConnectionLimits,
    keepalive: TcpKeepalive,
}

impl GuardedIncoming {
    pub fn new(listener: TcpListener, limits: ConnectionLimits) -> Self {
        metrics::describe_gauge!(
            edgelimit_metrics::GRPC_CONNECTIONS,
            "Open gRPC connections (at most limits.max_connections)"
        );
        metrics::describe_counter!(
            edgelimit_metrics::GRPC_CONNECTIONS_REFUSED,
            "gRPC connections closed at accept because limits.max_connections were open"
        );
        metrics::describe_counter!(
            edgelimit_metrics::GRPC_HANDSHAKE_TIMEOUTS,
            "gRPC connections closed for sending no HTTP/2 preface within limits.handshake_timeout"
        );
        metrics::gauge!(edgelimit_metrics::GRPC_CONNECTIONS).set(0.0);
        metrics::counter!(edgelimit_metrics::GRPC_CONNECTIONS_REFUSED).increment(0);
        metrics::counter!(edgelimit_metrics::GRPC_HANDSHAKE_TIMEOUTS).increment(0);
        let keepalive = TcpKeepalive::new().with_time(limits.tcp_keepalive);
        Self {
            listener,
            gate: AcceptGate::new(limits.max_connections, "tcp"),
            limits,
            keepalive,
        }
    }

    fn configure(&self, stream: &TcpStream) {
        // Socket options are best effort: a connection without them still works.
        if let Err(error) = stream.set_nodelay(self.limits.tcp_nodelay) {
            tracing::debug!(%error, "cannot set TCP_NODELAY");
        }
        if let Err(error) = SockRef::from(stream).set_tcp_keepalive(&self.keepalive) {
            tracing::debug!(%error, "cannot set TCP keepalive");
        }
    }
}

impl Stream for GuardedIncoming {
    type Item = io::Result<GuardedStream>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        let listener = &this.listener;
        let (stream, permit) = std::task::ready!(this.gate.poll_admit(cx, |cx| listener
            .poll_accept(cx)
            .map_ok(|(stream, _peer)| stream)));
        this.configure(&stream);
        let deadline = Box::pin(tokio::time::sleep(this.limits.handshake_timeout));
        Poll::Ready(Some(Ok(GuardedStream {
            stream,
            _permit: permit,
            preface_left: PREFACE_LEN,
            handshake_deadline: Some(deadline),
        })))
    }
}

/// One accepted connection. Reading fails with `TimedOut` if the first `PREFACE_LEN` bytes
/// have not arrived by the handshake deadline, which makes hyper close the connection.
pub struct GuardedStream {
    stream: TcpStream,
    _permit: OwnedSemaphorePermit,
    preface_left: usize,
    handshake_deadline: Option<Pin<Box<Sleep>>>,
}

impl Drop for GuardedStream {
    fn drop(&mut self) {
        metrics::gauge!(edgelimit_metrics::GRPC_CONNECTIONS).decrement(1.0);
    }
}

impl AsyncRead for GuardedStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        match Pin::new(&mut self.stream).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if self.handshake_deadline.is_some() {
                    let read = buf.filled().len().saturating_sub(before);
                    self.preface_left = self.preface_left.saturating_sub(read);
                    if self.preface_left == 0 {
                        self.handshake_deadline = None;
                    }
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(error)) => Poll::Ready(Err(error)),
            Poll::Pending => {
                let expired = self
                    .handshake_deadline
                    .as_mut()
                    .is_some_and(|deadline| deadline.as_mut().poll(cx).is_ready());
                if expired {
                    self.handshake_deadline = None;
                    metrics::counter!(edgelimit_metrics::GRPC_HANDSHAKE_TIMEOUTS).increment(1);
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "no HTTP/2 preface within limits.handshake_timeout",
                    )));
                }
                Poll::Pending
            }
        }
    }
}

impl AsyncWrite for GuardedStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

impl Connected for GuardedStream {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.stream.connect_info()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio_stream::StreamExt;

    fn limits(max_connections: usize, handshake: Duration) -> ConnectionLimits {
        ConnectionLimits {
            max_connections,
            handshake_timeout: handshake,
            tcp_keepalive: Duration::from_secs(42),
            tcp_nodelay: true,
        }
    }

    async fn incoming(l: ConnectionLimits) -> (GuardedIncoming, std::net::SocketAddr) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        (GuardedIncoming::new(listener, l), addr)
    }

    #[tokio::test]
    async fn socket_options_are_applied_to_accepted_connections() {
        let (mut incoming, addr) = incoming(limits(4, Duration::from_secs(5))).await;
        let _client = TcpStream::connect(addr).await.unwrap();
        let accepted = incoming.next().await.unwrap().unwrap();
        let sock = SockRef::from(&accepted.stream);
        assert!(sock.keepalive().unwrap());
        assert_eq!(sock.tcp_keepalive_time().unwrap(), Duration::from_secs(42));
        assert!(accepted.stream.nodelay().unwrap());
    }

    #[tokio::test]
    async fn connections_beyond_the_cap_are_closed_and_a_freed_slot_is_reused() {
        let (mut incoming, addr) = incoming(limits(2, Duration::from_secs(5))).await;
        let _c1 = TcpStream::connect(addr).await.unwrap();
        let _c2 = TcpStream::connect(addr).await.unwrap();
        let a1 = incoming.next().await.unwrap().unwrap();
        let _a2 = incoming.next().await.unwrap().unwrap();
        let mut c3 = TcpStream::connect(addr).await.unwrap();
        // Polling accepts c3 and closes it; nothing is yielded while the cap is reached.
        let yielded = tokio::time::timeout(Duration::from_millis(300), incoming.next()).await;
        assert!(yielded.is_err(), "a third connection must not be yielded");
        let mut byte = [0u8; 1];
        let read = tokio::time::timeout(Duration::from_secs(5), c3.read(&mut byte)).await;
        assert!(
            matches!(read, Ok(Ok(0)) | Ok(Err(_))),
            "refused connection is closed: {read:?}"
        );
        drop(a1);
        let _c4 = TcpStream::connect(addr).await.unwrap();
        let a4 = tokio::time::timeout(Duration::from_secs(5), incoming.next()).await;
        assert!(matches!(a4, Ok(Some(Ok(_)))), "a freed slot is reused");
    }

    #[tokio::test]
    async fn reading_fails_without_a_preface_and_not_after_one() {
        let (mut incoming, addr) = incoming(limits(4, Duration::from_millis(200))).await;
        let _silent = TcpStream::connect(addr).await.unwrap();
        let mut accepted = incoming.next().await.unwrap().unwrap();
        let mut buf = [0u8; 64];
        let err = tokio::time::timeout(Duration::from_secs(5), accepted.read(&mut buf))
            .await
            .unwrap()
            .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);

        let mut talker = TcpStream::connect(addr).await.unwrap();
        let mut accepted = incoming.next().await.unwrap().unwrap();
        talker
            .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
            .await
            .unwrap();
        let mut got = 0;
        while got < PREFACE_LEN {
            got += accepted.read(&mut buf).await.unwrap();
        }
        // Past the deadline, a silent but greeted connection is left to HTTP/2 keepalive.
        let idle = tokio::time::timeout(Duration::from_millis(500), accepted.read(&mut buf)).await;
        assert!(
            idle.is_err(),
            "no handshake error after the preface: {idle:?}"
        );
    }
}
