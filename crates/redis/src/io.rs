//! The backend's I/O thread: every Redis connection, its driver, its supervision and every
//! command's wait for its reply run on one dedicated single-threaded runtime.
//!
//! Whether a command timed out is decided here, where replies are read as they arrive, not
//! on the request threads: those may be busy with a burst of requests for longer than the
//! command timeout while the reply already sits in the socket. Judged there, such a command
//! would be indeterminate — its quota consumed for a request that is denied — and a burst
//! would turn into under-admission.

use std::time::Instant;

use redis::{Cmd, RedisResult, Value};
use tokio::runtime::{Builder, Handle};
use tokio::sync::oneshot;

use super::cluster::{Routed, Router};
use super::connect::Link;

/// How a command sent from the I/O thread ended.
pub enum Sent {
    Reply(RedisResult<Value>),
    /// No reply by the deadline (it may still run).
    TimedOut,
    /// The I/O thread is gone (the backend is shutting down): the command may have been sent.
    Lost,
    /// Refused before sending: the Cluster master for its slot is not up.
    Refused,
}

pub struct IoThread {
    handle: Handle,
    /// Dropping it stops the thread, and with it every connection.
    _stop: oneshot::Sender<()>,
}

impl IoThread {
    pub fn start() -> std::io::Result<Self> {
        let runtime = Builder::new_current_thread().enable_all().build()?;
        let handle = runtime.handle().clone();
        let (stop, stopped) = oneshot::channel::<()>();
        std::thread::Builder::new()
            .name("edgelimit-redis-io".into())
            .spawn(move || {
                runtime.block_on(async {
                    let _ = stopped.await;
                })
            })?;
        Ok(Self {
            handle,
            _stop: stop,
        })
    }

    pub fn handle(&self) -> &Handle {
        &self.handle
    }

    /// Sends `cmd` on `link` from the I/O thread and waits for the reply until `deadline`;
    /// also returns when the reply arrived (or the wait ended) on that thread.
    pub async fn send(&self, mut link: Link, cmd: Cmd, deadline: Instant) -> (Sent, Instant) {
        let (done, result) = oneshot::channel();
        self.handle.spawn(async move {
            let sent = tokio::time::timeout_at(deadline.into(), async {
                link.send(&cmd).await?.extract_error()
            })
            .await;
            let sent = match sent {
                Ok(reply) => Sent::Reply(reply),
                Err(_) => Sent::TimedOut,
            };
            let _ = done.send((sent, Instant::now()));
        });
        result.await.unwrap_or((Sent::Lost, Instant::now()))
    }

    /// Sends `cmd` to the Cluster master owning `slot` (following redirects) from the I/O
    /// thread, as `send` does.
    pub async fn route(
        &self,
        router: Router,
        slot: u16,
        cmd: Cmd,
        deadline: Instant,
    ) -> (Sent, Instant) {
        let (done, result) = oneshot::channel();
        self.handle.spawn(async move {
            let sent = match router.send(slot, &cmd, deadline).await {
                Routed::Reply(reply) => Sent::Reply(reply),
                Routed::TimedOut => Sent::TimedOut,
                Routed::NotSent => Sent::Refused,
            };
            let _ = done.send((sent, Instant::now()));
        });
        result.await.unwrap_or((Sent::Lost, Instant::now()))
    }
}
