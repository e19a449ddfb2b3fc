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
//!
//! A connection's streams run inside the connection's own task ([`StreamExecutor`],
//! [`drive`]), not as tasks of their own, and their answers are written a few at a time:
//! on the embedded backend's benchmark that took the server from about 12.5 to 7.5-9 µs of
//! CPU per request and from about 70k to 105-112k requests/s.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::panic::AssertUnwindSafe;
use std::pin::{pin, Pin};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures_util::stream::FuturesUnordered;
use futures_util::FutureExt as _;
use http_body::{Body, Frame};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{mpsc, watch};
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

/// One connection's HTTP/2 settings, with `executor` for the streams hyper starts on it.
fn connection_builder(
    settings: &Http2Settings,
    executor: StreamExecutor,
) -> hyper::server::conn::http2::Builder<StreamExecutor> {
    let mut builder = hyper::server::conn::http2::Builder::new(executor);
    builder
        .timer(TokioTimer::new())
        .max_concurrent_streams(settings.max_concurrent_streams)
        .keep_alive_interval(settings.keepalive_interval)
        .keep_alive_timeout(settings.keepalive_timeout)
        // gRPC has no use for a `date` header on every response.
        .auto_date_header(false);
    builder
}

/// A stream's future, as hyper hands it over to be run.
type StreamFuture = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Runs the streams hyper starts on one connection inside that connection's own task (see
/// [`drive`]) instead of as tasks of their own.
///
/// Spawned, each stream was a task any runtime worker could run, and the stream tasks and the
/// connection task then contended for h2's per-connection lock from different threads (futex
/// waits, cross-thread wake-ups, a spawn per request). In the connection's task a connection
/// is served by one thread at a time, without contention; connections still spread over the
/// workers (Envoy opens one per worker thread and upstream host).
#[derive(Clone)]
struct StreamExecutor {
    streams: mpsc::UnboundedSender<StreamFuture>,
}

impl StreamExecutor {
    /// The executor for one connection and the receiver its task takes the streams from.
    /// Unbounded, but it never holds more than the connection's open streams (at most
    /// `max_concurrent_streams`): the task drains it on every poll.
    fn new() -> (Self, mpsc::UnboundedReceiver<StreamFuture>) {
        let (streams, spawned) = mpsc::unbounded_channel();
        (Self { streams }, spawned)
    }
}

impl<F> hyper::rt::Executor<F> for StreamExecutor
where
    F: Future<Output = ()> + Send + 'static,
{
    fn execute(&self, stream: F) {
        // A panic ends its own stream only (dropped, the stream is reset), as when each stream
        // was a task, not the connection's other streams.
        let stream: StreamFuture = Box::pin(AssertUnwindSafe(stream).catch_unwind().map(drop));
        // hyper starts streams only from the connection's own poll, so the receiver is alive;
        // should it not be, the stream still runs, as a task of its own.
        if let Err(mpsc::error::SendError(stream)) = self.streams.send(stream) {
            tokio::spawn(stream);
        }
    }
}

/// Answers a connection's task produces before it lets the connection write them (and read
/// what has arrived since). Writing all the answers of a read at once left the client idle
/// while the server worked through them, then the server idle while the client replied
/// (about 65k req/s on the benchmark); writing each alone cost a write per answer (84k); a
/// few at a time overlaps both sides and still writes once for several (4, 8 and 16 all
/// reached 105-112k).
const ANSWERS_PER_WRITE: usize = 16;

/// Passes (connection, then streams) in one poll of a busy connection before its task yields
/// to the worker's other tasks.
const PASSES_PER_POLL: usize = 64;

/// Drives `connection` and, in the same task, the streams it starts (`spawned`), until the
/// connection has closed; when `stopping` changes, asks it to finish its requests and close.
/// Streams still open when the connection has closed are dropped: their answer has nowhere
/// to go.
async fn drive<IO, B>(
    connection: hyper::server::conn::http2::Connection<TokioIo<IO>, Dispatch<B>, StreamExecutor>,
    mut spawned: mpsc::UnboundedReceiver<StreamFuture>,
    mut stopping: watch::Receiver<()>,
) -> Result<(), hyper::Error>
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    B: RateLimitPort,
{
    let mut connection = pin!(connection);
    let mut streams: FuturesUnordered<StreamFuture> = FuturesUnordered::new();
    let mut stop = pin!(stopping.changed());
    let mut draining = false;
    std::future::poll_fn(|cx| {
        if !draining && stop.as_mut().poll(cx).is_ready() {
            draining = true;
            connection.as_mut().graceful_shutdown();
        }
        for _ in 0..PASSES_PER_POLL {
            if let Poll::Ready(result) = connection.as_mut().poll(cx) {
                return Poll::Ready(result);
            }
            let mut progressed = false;
            while let Poll::Ready(Some(stream)) = spawned.poll_recv(cx) {
                streams.push(stream);
                progressed = true;
            }
            let mut done = 0;
            while done < ANSWERS_PER_WRITE {
                match Pin::new(&mut streams).poll_next(cx) {
                    Poll::Ready(Some(())) => done += 1,
                    _ => break,
                }
            }
            progressed |= done > 0;
            if !progressed {
                // Every part waits on a waker of this task.
                return Poll::Pending;
            }
        }
        // Still busy: let the worker run other tasks first.
        cx.waker().wake_by_ref();
        Poll::Pending
    })
    .await
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
            let (executor, spawned) = StreamExecutor::new();
            let connection = connection_builder(settings, executor)
                .serve_connection(TokioIo::new(io), dispatch.clone());
            let stopping = stopping.clone();
            tokio::spawn(async move {
                let result = drive(connection, spawned, stopping).await;
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
    async fn a_stream_that_panics_ends_alone() {
        let (executor, mut spawned) = StreamExecutor::new();
        hyper::rt::Executor::execute(&executor, async { panic!("a stream's bug") });
        let (done, mut finished) = mpsc::unbounded_channel();
        hyper::rt::Executor::execute(&executor, async move {
            let _ = done.send(());
        });
        let mut streams = FuturesUnordered::new();
        while let Ok(stream) = spawned.try_recv() {
            streams.push(stream);
        }
        assert_eq!(
            streams.len(),
            2,
            "both streams handed to the connection's task"
        );
        // The panicking stream completes (as a dropped stream) and the other still runs.
        while streams.next().await.is_some() {}
        assert_eq!(
            finished.try_recv().ok(),
            Some(()),
            "the other stream ran to its end"
        );
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
