//! One Cluster master: its multiplexed connection, kept by its own task, and its state as
//! commands and health checks find it. Nothing here knows about other nodes, so one node's
//! failure can never tear down another's connection.
//!
//! States: `connecting` (never up yet, or reconnecting), `up`, `suspect` (a command timed out;
//! a `PING` bounded by the health-check timeout is on its way) and `down` (the connection
//! failed or the `PING` went unanswered). Commands are only sent in `up`: a node that is
//! anything else is refused before sending (`connect_failed`), answered at once instead of
//! after the command timeout. A working node that was merely slow is `up` again as soon as
//! its `PING` answers.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Client, Value};
use tokio::sync::Notify;

use crate::connect::Link;
use crate::connections::{preload, ConnectionSettings};

const INITIAL_BACKOFF: Duration = Duration::from_millis(50);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum State {
    Connecting = 0,
    Up = 1,
    Suspect = 2,
    Down = 3,
}

impl State {
    fn from_u8(v: u8) -> State {
        match v {
            1 => State::Up,
            2 => State::Suspect,
            3 => State::Down,
            _ => State::Connecting,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            State::Connecting => "connecting",
            State::Up => "up",
            State::Suspect => "suspect",
            State::Down => "down",
        }
    }
}

/// One connection generation: reports about an old one never touch its replacement.
pub struct Live {
    pub connection: MultiplexedConnection,
    broken: AtomicBool,
    suspect: AtomicBool,
}

pub struct Node {
    /// `host:port`, as the slot map names it.
    pub addr: String,
    current: arc_swap::ArcSwapOption<Live>,
    state: AtomicU8,
    /// Wakes the node's task: its connection was reported broken or suspect.
    wake: Notify,
    /// Requests refused because this node was not up, since the last summary.
    refused: AtomicU64,
}

impl Node {
    pub fn new(addr: String) -> Self {
        Self {
            addr,
            current: arc_swap::ArcSwapOption::empty(),
            state: AtomicU8::new(State::Connecting as u8),
            wake: Notify::new(),
            refused: AtomicU64::new(0),
        }
    }

    pub fn state(&self) -> State {
        State::from_u8(self.state.load(Ordering::Acquire))
    }

    /// The connection to send on, if the node is up; otherwise the refusal is counted.
    pub fn connection(&self) -> Option<Arc<Live>> {
        let live = (self.state() == State::Up)
            .then(|| self.current.load_full())
            .flatten()
            .filter(|live| !live.broken.load(Ordering::Acquire));
        if live.is_none() {
            self.refused.fetch_add(1, Ordering::Relaxed);
        }
        live
    }

    /// Whether a command would be sent now (nothing counted).
    pub fn is_up(&self) -> bool {
        self.state() == State::Up
    }

    pub fn take_refused(&self) -> u64 {
        self.refused.swap(0, Ordering::Relaxed)
    }

    /// A command on `live` timed out: refuse further commands until a `PING` answers.
    pub fn suspect(&self, live: &Live) {
        if live.broken.load(Ordering::Acquire) || live.suspect.swap(true, Ordering::AcqRel) {
            return;
        }
        let _ = self.state.compare_exchange(
            State::Up as u8,
            State::Suspect as u8,
            Ordering::AcqRel,
            Ordering::Acquire,
        );
        self.wake.notify_one();
    }

    /// A command on `live` failed at the transport level: replace the connection.
    pub fn broken(&self, live: &Live) {
        if live.broken.swap(true, Ordering::AcqRel) {
            return;
        }
        self.wake.notify_one();
    }

    /// Records a state change; logs it (once per change, never per request).
    fn set_state(&self, new: State, reason: &str) {
        let old = State::from_u8(self.state.swap(new as u8, Ordering::AcqRel));
        if old == new {
            return;
        }
        match new {
            // A slow command and the PING that cleared it: not worth a line each time.
            State::Up if old == State::Suspect => {
                tracing::debug!(node = %self.addr, "redis cluster node answered its check")
            }
            State::Up => {
                tracing::info!(node = %self.addr, was = old.name(), "redis cluster node up")
            }
            State::Down => tracing::warn!(
                node = %self.addr,
                was = old.name(),
                reason,
                "redis cluster node down; its slots fail closed until it answers again"
            ),
            State::Suspect | State::Connecting => {
                tracing::debug!(node = %self.addr, was = old.name(), state = new.name(), reason)
            }
        }
    }
}

/// Keeps `node` connected for as long as the task runs. `changed` is notified whenever the
/// node comes up or goes down, so the slot map is looked at again.
pub async fn maintain(
    node: Arc<Node>,
    client: Client,
    settings: ConnectionSettings,
    changed: Arc<Notify>,
) {
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(settings.connect_timeout))
        // Each command is bounded by the caller's deadline instead.
        .set_response_timeout(None);
    let mut backoff = INITIAL_BACKOFF;
    loop {
        // A paused node accepts TCP connects in the kernel and then answers nothing: the
        // handshake is bounded too.
        let connected = tokio::time::timeout(
            settings.connect_timeout,
            client.get_multiplexed_async_connection_with_config(&config),
        )
        .await;
        let connection = match connected {
            Ok(Ok(connection)) => connection,
            Ok(Err(error)) => {
                tracing::debug!(node = %node.addr, %error, retry_in = ?backoff, "redis cluster connect failed");
                node.set_state(State::Down, "connect failed");
                changed.notify_one();
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(settings.max_backoff);
                continue;
            }
            Err(_) => {
                node.set_state(State::Down, "connect timed out");
                changed.notify_one();
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(settings.max_backoff);
                continue;
            }
        };
        preload(
            &Link::Standalone(connection.clone()),
            &settings.preload,
            settings.connect_timeout,
        )
        .await;
        let live = Arc::new(Live {
            connection,
            broken: AtomicBool::new(false),
            suspect: AtomicBool::new(false),
        });
        node.current.store(Some(live.clone()));
        node.set_state(State::Up, "connected");
        changed.notify_one();
        let since = Instant::now();
        let reason = watch(&node, &live, &settings).await;
        live.broken.store(true, Ordering::Release);
        let _ = node
            .current
            .compare_and_swap(&Some(live.clone()), None::<Arc<Live>>);
        node.set_state(State::Down, reason);
        changed.notify_one();
        // A connection that dies young must not become a reconnect loop.
        if since.elapsed() >= settings.health_check_interval {
            backoff = INITIAL_BACKOFF;
        } else {
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(settings.max_backoff);
        }
    }
}

/// Health-checks `live` every interval, and at once when it is reported suspect; returns why
/// it must be replaced.
async fn watch(node: &Node, live: &Live, settings: &ConnectionSettings) -> &'static str {
    let mut interval = tokio::time::interval(settings.health_check_interval);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    interval.tick().await; // immediate: the connection was just made
    loop {
        tokio::select! {
            _ = node.wake.notified() => {
                if live.broken.load(Ordering::Acquire) {
                    return "command failed on the connection";
                }
                // A stale wake-up (an earlier generation) finds no flag set.
                if !live.suspect.load(Ordering::Acquire) {
                    continue;
                }
            }
            _ = interval.tick() => {}
        }
        if live.broken.load(Ordering::Acquire) {
            return "command failed on the connection";
        }
        let mut connection = live.connection.clone();
        let ping = redis::cmd("PING");
        match tokio::time::timeout(
            settings.health_check_timeout,
            connection.send_packed_command(&ping),
        )
        .await
        {
            Ok(Ok(Value::SimpleString(ref s))) if s == "PONG" => {
                if live.suspect.swap(false, Ordering::AcqRel) {
                    node.set_state(State::Up, "answered PING");
                }
            }
            Ok(Ok(_)) => return "health check refused",
            Ok(Err(_)) => return "health check failed",
            Err(_) => return "health check timed out",
        }
    }
}
