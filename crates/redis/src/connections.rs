//! A fixed set of connections, each kept alive by its own background task. Requests pipeline
//! onto a shared connection instead of checking one out; a slot without a live connection
//! fails fast (nothing was sent) while its task reconnects with back-off. What a connection
//! is (one server, a Sentinel-resolved primary) is `connect.rs`'s business; a Cluster's
//! masters are supervised one by one in `cluster/`.
//!
//! A connection leaves its slot when a command on it fails at the transport level, or when a
//! health check (`PING`, bounded by `health_check_timeout`) fails. Health checks run every
//! `health_check_interval`, and at once after a command timed out on the connection, so a
//! paused or half-open Redis (no RST, no FIN: SIGSTOP, a blackholing middlebox) is noticed
//! within one health-check timeout of the first command that waited on it.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwapOption;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use super::clock::RedisClock;
use super::connect::{Connector, Link, PRIMARY_MOVED};

/// One live connection. Its flags are per generation, so a report about an old connection
/// can never tear down its replacement.
pub struct Live {
    pub link: Link,
    slot: usize,
    broken: AtomicBool,
    suspect: AtomicBool,
}

struct Slot {
    current: ArcSwapOption<Live>,
    /// Wakes the slot's task: its connection was reported broken or suspect.
    wake: Notify,
}

pub struct Connections {
    slots: Arc<[Arc<Slot>]>,
    next: AtomicUsize,
    tasks: Vec<JoinHandle<()>>,
}

#[derive(Debug, Clone)]
pub struct ConnectionSettings {
    pub count: usize,
    pub connect_timeout: Duration,
    pub health_check_interval: Duration,
    pub health_check_timeout: Duration,
    pub max_backoff: Duration,
    /// Program sources loaded (`SCRIPT LOAD`) on every new connection before it is used, so
    /// a burst after a start, restart or failover does not become a storm of NOSCRIPT resends
    /// of the whole source. A failure here is logged; the NOSCRIPT fallback still applies.
    pub preload: Vec<&'static str>,
    /// Read (`TIME`) on every new connection before it is used, so that the first commands
    /// after a start or reconnect carry a Redis-side deadline too. None on Cluster.
    pub clock: Option<Arc<RedisClock>>,
}

const INITIAL_BACKOFF: Duration = Duration::from_millis(50);

impl Connections {
    /// Starts the slots' tasks on `runtime` (the backend's I/O thread); connections come up
    /// in the background, and their drivers run there too.
    pub fn start(
        connector: Arc<Connector>,
        settings: ConnectionSettings,
        runtime: &tokio::runtime::Handle,
    ) -> Self {
        let slots: Arc<[Arc<Slot>]> = (0..settings.count.max(1))
            .map(|_| {
                Arc::new(Slot {
                    current: ArcSwapOption::empty(),
                    wake: Notify::new(),
                })
            })
            .collect();
        let tasks = (0..slots.len())
            .map(|index| {
                runtime.spawn(maintain(
                    connector.clone(),
                    index,
                    slots.clone(),
                    settings.clone(),
                ))
            })
            .collect();
        Self {
            slots,
            next: AtomicUsize::new(0),
            tasks,
        }
    }

    /// A live connection, round-robin; `None` if no slot has one.
    pub fn pick(&self) -> Option<Arc<Live>> {
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        (0..self.slots.len()).find_map(|i| {
            let slot = &self.slots[(start + i) % self.slots.len()];
            slot.current
                .load_full()
                .filter(|live| !live.broken.load(Ordering::Acquire))
        })
    }

    pub fn live_count(&self) -> usize {
        self.slots
            .iter()
            .filter(|s| s.current.load().is_some())
            .count()
    }

    /// Reports `live` as broken: it leaves its slot at once and the slot reconnects.
    pub fn mark_broken(&self, live: &Arc<Live>) {
        if live.broken.swap(true, Ordering::AcqRel) {
            return;
        }
        if let Some(slot) = self.slots.get(live.slot) {
            let _ = slot
                .current
                .compare_and_swap(&Some(live.clone()), None::<Arc<Live>>);
            slot.wake.notify_one();
        }
    }

    /// Reports that a command on `live` timed out: health-check it now rather than at the
    /// next interval. A slow but working Redis keeps its connection.
    pub fn suspect(&self, live: &Arc<Live>) {
        if live.broken.load(Ordering::Acquire) || live.suspect.swap(true, Ordering::AcqRel) {
            return;
        }
        if let Some(slot) = self.slots.get(live.slot) {
            slot.wake.notify_one();
        }
    }
}

impl Drop for Connections {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

async fn maintain(
    connector: Arc<Connector>,
    index: usize,
    slots: Arc<[Arc<Slot>]>,
    settings: ConnectionSettings,
) {
    let slot = slots[index].clone();
    let mut backoff = INITIAL_BACKOFF;
    loop {
        match connector.connect(settings.connect_timeout).await {
            Ok(link) => {
                preload(&link, &settings.preload, settings.connect_timeout).await;
                if let Some(clock) = &settings.clock {
                    clock.sync(&link, settings.connect_timeout).await;
                }
                super::eviction::check(&link, settings.connect_timeout, link.kind()).await;
                let live = Arc::new(Live {
                    link,
                    slot: index,
                    broken: AtomicBool::new(false),
                    suspect: AtomicBool::new(false),
                });
                slot.current.store(Some(live.clone()));
                let since = Instant::now();
                tracing::info!(
                    slot = index,
                    kind = live.link.kind(),
                    "redis connection established"
                );
                let reason = supervise(&connector, &slot, &live, &settings).await;
                live.broken.store(true, Ordering::Release);
                let _ = slot
                    .current
                    .compare_and_swap(&Some(live.clone()), None::<Arc<Live>>);
                tracing::warn!(slot = index, reason, "redis connection lost; reconnecting");
                if reason == PRIMARY_MOVED {
                    // The other slots are most likely on the old primary too, which still
                    // accepts writes that the new one will never see: check them now rather
                    // than at their next interval.
                    for other in slots.iter().filter(|s| !Arc::ptr_eq(s, &slot)) {
                        if let Some(live) = other.current.load_full() {
                            live.suspect.store(true, Ordering::Release);
                            other.wake.notify_one();
                        }
                    }
                }
                // A connection that dies young (Redis accepting and dropping, a proxy that
                // resets) must not turn into a reconnect loop: back off as for a failed connect.
                if since.elapsed() >= settings.health_check_interval {
                    backoff = INITIAL_BACKOFF;
                } else {
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(settings.max_backoff);
                }
            }
            Err(error) => {
                tracing::warn!(slot = index, %error, retry_in = ?backoff, "redis connection failed");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(settings.max_backoff);
            }
        }
    }
}

pub(crate) async fn preload(link: &Link, sources: &[&'static str], timeout: Duration) {
    for source in sources {
        let mut link = link.clone();
        let mut load = ::redis::cmd("SCRIPT");
        load.arg("LOAD").arg(*source);
        match tokio::time::timeout(timeout, link.send(&load)).await {
            Ok(Ok(::redis::Value::ServerError(error))) => {
                tracing::warn!(?error, "SCRIPT LOAD refused; programs load on first use")
            }
            Ok(Ok(_)) => {}
            Ok(Err(error)) => {
                tracing::warn!(%error, "SCRIPT LOAD failed; programs load on first use")
            }
            Err(_) => tracing::warn!("SCRIPT LOAD timed out; programs load on first use"),
        }
    }
}

/// Returns (with a reason for the log) when the connection was reported broken or failed a
/// health check.
async fn supervise(
    connector: &Connector,
    slot: &Slot,
    live: &Live,
    settings: &ConnectionSettings,
) -> &'static str {
    let mut interval = tokio::time::interval(settings.health_check_interval);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    interval.tick().await; // the first tick is immediate; the connection was just checked
    loop {
        tokio::select! {
            _ = slot.wake.notified() => {
                if live.broken.load(Ordering::Acquire) {
                    return "command failed on the connection";
                }
                // A stale wake-up for an earlier generation finds no flag set: nothing to do.
                if !live.suspect.swap(false, Ordering::AcqRel) {
                    continue;
                }
            }
            _ = interval.tick() => {}
        }
        if live.broken.load(Ordering::Acquire) {
            return "command failed on the connection";
        }
        if let Err(reason) = connector
            .check(&live.link, settings.health_check_timeout)
            .await
        {
            return reason;
        }
    }
}
