//! The gRPC listener's HTTP/2 server: hyper serving each accepted connection, with
//! `ShouldRateLimit` dispatched by path straight to its service and every other gRPC service
//! (health, reflection, RLQS) through tonic's router.
//!
//! tonic's own server wraps every request in tower layers (connect info, error recovery, a
//! `grpc-timeout` timer, the axum router); on the embedded backend those were about 8 % of the
//! server's CPU per decision, and the hot path needs none of them: the limiter bounds its own
//! work by the caller's deadline. What the timer did bound — a request whose body has not
//! arrived — is bounded here by [`DeadlineBody`], which arms a timer only when the body is
//! late, so the usual request (headers and body in one read) costs none.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::pin::{pin, Pin};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use http_body::{Body, Frame};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::watch;
use tokio::time::Sleep;
use tokio_stream::{Stream, StreamExt};
use tonic::service::Routes;
use tower::Service as _;

use crate::contract::RateLimitPort;
use crate::envoy::{grpc_timeout, RateLimitServer};

/// HTTP/2 settings of the gRPC listener (from `limits`).
#[derive(Debug, Clone)]
pub struct Http2Settings {
    pub max_concurrent_streams: u32,
    pub keepalive_interval: Duration,
    pub keepalive_timeout: Duration,
}

/// Every request of one listener: `ShouldRateLimit` to the limiter, the rest to `routes`.
pub struct Dispatch<B> {
    rls: RateLimitServer<B>,
    routes: Routes,
    default_timeout: Duration,
}

impl<B> Clone for Dispatch<B> {
    fn clone(&self) -> Self {
        Self {
            rls: self.rls.clone(),
            routes: self.routes.clone(),
            default_timeout: self.default_timeout,
        }
    }
}

type ResponseFuture =
    Pin<Box<dyn Future<Output = Result<http::Response<tonic::body::Body>, Infallible>> + Send>>;

impl<B: RateLimitPort> Dispatch<B> {
    pub fn new(rls: RateLimitServer<B>, routes: Routes, default_timeout: Duration) -> Self {
        Self {
            rls,
            routes: routes.prepare(),
            default_timeout,
        }
    }
}

impl<B: RateLimitPort> hyper::service::Service<http::Request<Incoming>> for Dispatch<B> {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = ResponseFuture;

    fn call(&self, request: http::Request<Incoming>) -> Self::Future {
        if request.uri().path() == RateLimitServer::<B>::PATH {
            let timeout = grpc_timeout(request.headers()).unwrap_or(self.default_timeout);
            let deadline = Instant::now() + timeout;
            return self
                .rls
                .handle(request.map(|body| DeadlineBody::new(body, deadline)));
        }
        let mut routes = self.routes.clone();
        Box::pin(async move {
            routes
                .call(request.map(tonic::body::Body::new))
                .await
                .map(|response| response.map(tonic::body::Body::new))
        })
    }
}

/// The request body never arrived in full before the caller's deadline.
#[derive(Debug, thiserror::Error)]
#[error("the request body did not arrive before the caller's deadline")]
pub struct BodyTimedOut;

/// A request body that fails with [`BodyTimedOut`] once `deadline` passes while it is still
/// awaited. The timer is created only when the body is not ready at once.
pub struct DeadlineBody<B> {
    inner: B,
    deadline: Instant,
    timer: Option<Pin<Box<Sleep>>>,
}

impl<B> DeadlineBody<B> {
    pub fn new(inner: B, deadline: Instant) -> Self {
        Self {
            inner,
            deadline,
            timer: None,
        }
    }
}

impl<B> Body for DeadlineBody<B>
where
    B: Body + Unpin,
    B::Error: Into<tonic::codegen::StdError>,
{
    type Data = B::Data;
    type Error = tonic::codegen::StdError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = &mut *self;
        if let Poll::Ready(frame) = Pin::new(&mut this.inner).poll_frame(cx) {
            return Poll::Ready(frame.map(|f| f.map_err(Into::into)));
        }
        let deadline = this.deadline;
        let timer = this
            .timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline.into())));
        match timer.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Some(Err(BodyTimedOut.into()))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// Serves every connection `incoming` yields until `shutdown` resolves; then stops accepting
/// (the listener is dropped at once, so new clients are refused rather than left hanging),
/// asks every open connection to finish its requests and close (HTTP/2 GOAWAY), and returns
/// when all have closed. The caller bounds that wait.
pub async fn serve<I, IO, B>(
    incoming: I,
    dispatch: Dispatch<B>,
    settings: &Http2Settings,
    shutdown: impl Future<Output = ()>,
) where
    I: Stream<Item = io::Result<IO>>,
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    B: RateLimitPort,
{
    let mut builder = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
    builder
        .timer(TokioTimer::new())
        .max_concurrent_streams(settings.max_concurrent_streams)
        .keep_alive_interval(settings.keepalive_interval)
        .keep_alive_timeout(settings.keepalive_timeout)
        // gRPC has no use for a `date` header on every response.
        .auto_date_header(false);
    let (stop, stopping) = watch::channel(());
    {
        let mut incoming = pin!(incoming);
        let mut shutdown = pin!(shutdown);
        loop {
            let io = tokio::select! {
                () = &mut shutdown => break,
                io = incoming.next() => match io {
                    Some(Ok(io)) => io,
                    // The listeners count and log their own accept errors.
                    Some(Err(error)) => {
                        tracing::debug!(%error, "accepting a gRPC connection failed");
                        continue;
                    }
                    None => break,
                },
            };
            let connection = builder.serve_connection(TokioIo::new(io), dispatch.clone());
            let mut stopping = stopping.clone();
            tokio::spawn(async move {
                let mut connection = pin!(connection);
                let result = tokio::select! {
                    biased;
                    result = connection.as_mut() => result,
                    _ = stopping.changed() => {
                        connection.as_mut().graceful_shutdown();
                        connection.await
                    }
                };
                if let Err(error) = result {
                    tracing::debug!(%error, "gRPC connection ended with an error");
                }
                // `stopping` is dropped here: the drain counts this connection closed.
            });
        }
    }
    let _ = stop.send(());
    drop(stopping);
    // Every connection task holds a receiver until its connection has closed.
    stop.closed().await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use http_body_util::BodyExt;

    /// A body whose data never comes.
    struct Stalled;

    impl Body for Stalled {
        type Data = Bytes;
        type Error = Infallible;

        fn poll_frame(
            self: Pin<&mut Self>,
            _cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
            Poll::Pending
        }
    }

    #[tokio::test]
    async fn a_body_that_does_not_arrive_fails_at_the_deadline() {
        let deadline = Instant::now() + Duration::from_millis(20);
        let result = DeadlineBody::new(Stalled, deadline).collect().await;
        let error = result.err().map(|e| e.to_string());
        assert_eq!(error.as_deref(), Some(BodyTimedOut.to_string().as_str()));
        assert!(
            Instant::now() >= deadline,
            "failed only once the deadline had passed"
        );
    }

    #[tokio::test]
    async fn a_body_that_is_ready_passes_through_without_a_timer() {
        let deadline = Instant::now();
        let mut body = DeadlineBody::new(
            http_body_util::Full::new(Bytes::from_static(b"abc")),
            deadline,
        );
        let frame = Pin::new(&mut body).frame().await;
        let data = frame.and_then(|f| f.ok()).and_then(|f| f.into_data().ok());
        assert_eq!(data.as_deref(), Some(&b"abc"[..]));
        assert!(body.timer.is_none(), "no timer for a body that was ready");
    }
}
