//! A fixed set of multiplexed connections, each kept alive by its own background task.
//! Requests pipeline onto a shared connection instead of checking one out; a slot without a
//! live connection fails fast (nothing was sent) while its task reconnects with back-off.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ::redis::aio::MultiplexedConnection;
use ::redis::{AsyncConnectionConfig, Client};
use arc_swap::ArcSwapOption;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

/// One live connection. Identity (`Arc::ptr_eq`) tells generations apart, so an error from an
/// old connection cannot tear down its replacement.
pub struct Live {
    pub connection: MultiplexedConnection,
}

struct Slot {
    current: ArcSwapOption<Live>,
    broken: Notify,
}

pub struct Connections {
    slots: Vec<Arc<Slot>>,
    next: AtomicUsize,
    tasks: Vec<JoinHandle<()>>,
}

#[derive(Debug, Clone)]
pub struct ConnectionSettings {
    pub count: usize,
    pub connect_timeout: Duration,
    pub health_check_interval: Duration,
    pub max_backoff: Duration,
}

impl Connections {
    /// Starts the slots' tasks; connections come up in the background.
    pub fn start(client: Client, settings: ConnectionSettings) -> Self {
        let slots: Vec<Arc<Slot>> = (0..settings.count.max(1))
            .map(|_| {
                Arc::new(Slot {
                    current: ArcSwapOption::empty(),
                    broken: Notify::new(),
                })
            })
            .collect();
        let tasks = slots
            .iter()
            .map(|slot| tokio::spawn(maintain(client.clone(), slot.clone(), settings.clone())))
            .collect();
        Self {
            slots,
            next: AtomicUsize::new(0),
            tasks,
        }
    }

    /// A live connection, round-robin; `None` if the chosen slot is down and no other is up.
    pub fn pick(&self) -> Option<Arc<Live>> {
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        (0..self.slots.len()).find_map(|i| {
            let slot = &self.slots[(start + i) % self.slots.len()];
            slot.current.load_full()
        })
    }

    pub fn live_count(&self) -> usize {
        self.slots
            .iter()
            .filter(|s| s.current.load().is_some())
            .count()
    }

    /// Reports `live` as broken; its slot reconnects unless it was already replaced.
    pub fn mark_broken(&self, live: &Arc<Live>) {
        for slot in &self.slots {
            let current = slot.current.load();
            if current.as_ref().is_some_and(|c| Arc::ptr_eq(c, live)) {
                slot.current.store(None);
                slot.broken.notify_one();
            }
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

async fn maintain(client: Client, slot: Arc<Slot>, settings: ConnectionSettings) {
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(settings.connect_timeout))
        .set_response_timeout(None);
    let mut backoff = Duration::from_millis(50);
    loop {
        match client
            .get_multiplexed_async_connection_with_config(&config)
            .await
        {
            Ok(connection) => {
                backoff = Duration::from_millis(50);
                let live = Arc::new(Live { connection });
                slot.current.store(Some(live.clone()));
                tracing::info!("redis connection established");
                supervise(&slot, &live, &settings).await;
                slot.current.store(None);
                tracing::warn!("redis connection lost; reconnecting");
            }
            Err(error) => {
                tracing::warn!(%error, retry_in = ?backoff, "redis connection failed");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(settings.max_backoff);
            }
        }
    }
}

/// Returns when the connection is reported broken or stops answering health checks.
async fn supervise(slot: &Slot, live: &Arc<Live>, settings: &ConnectionSettings) {
    let mut interval = tokio::time::interval(settings.health_check_interval);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = slot.broken.notified() => {
                // A stale notification for an earlier generation is ignored.
                if slot.current.load().as_ref().is_none_or(|c| Arc::ptr_eq(c, live)) {
                    return;
                }
            }
            _ = interval.tick() => {
                let mut connection = live.connection.clone();
                let ping = ::redis::cmd("PING");
                let healthy = matches!(
                    tokio::time::timeout(settings.connect_timeout, connection.send_packed_command(&ping)).await,
                    Ok(Ok(_))
                );
                if !healthy {
                    return;
                }
            }
        }
    }
}
