//! The backend's I/O thread: every Redis connection, its driver and its supervision run on
//! one dedicated single-threaded runtime, which reads replies as they arrive.
//!
//! The request threads may be busy with a burst of requests for longer than the command
//! timeout while a reply already sits in the socket. Had they to read it, such a command
//! would look timed out — indeterminate, its quota consumed for a request that is denied —
//! and a burst would turn into under-admission. Here the driver reads it on time and hands it
//! over; a request thread that gets to it late looks at the reply before the deadline
//! (`select!` in `biased` order), so a reply that has arrived is never judged timed out.

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

    /// Sends `cmd` on `link` (its driver on the I/O thread writes it and reads the reply) and
    /// waits for the reply until `deadline`; also returns when the wait ended.
    ///
    /// Awaited on the request thread itself: a task on the I/O thread per command would add
    /// a spawn and a hand-over without saving a wake-up (A/B in README Performance).
    pub async fn send(&self, mut link: Link, cmd: Cmd, deadline: Instant) -> (Sent, Instant) {
        let sent = tokio::select! {
            // Reply first: one delivered by the driver before a late poll still counts.
            biased;
            reply = link.send(&cmd) => Sent::Reply(reply.and_then(|value| value.extract_error())),
            () = tokio::time::sleep_until(deadline.into()) => Sent::TimedOut,
        };
        (sent, Instant::now())
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
