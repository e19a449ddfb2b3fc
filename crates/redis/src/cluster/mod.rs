//! Redis Cluster, one supervised connection per master (`node.rs`), routed by slot.
//!
//! Why not the redis crate's cluster connection: it health-checks and rebuilds as one unit,
//! so a single paused master (SIGSTOP, a stuck fork, a network stall to one host) failed the
//! whole connection's `PING`, and every rebuild then waited on that master: the subjects of
//! every healthy master were denied too (14% decided in `tests/topology_cluster.rs` with one
//! of three masters paused). Here each master has its own connection, state and task; the slot
//! map is swapped atomically, never rebuilt with the connections.
//!
//! The slot map comes from `CLUSTER SLOTS` (any master that is up, else any seed), at start,
//! whenever a node comes up or goes down, on `MOVED`, and every `REFRESH_INTERVAL` (every
//! `DEGRADED_REFRESH_INTERVAL` while a master is not up, so a promoted replica is found
//! without a redirect). Refreshes never touch a working connection.
//!
//! The interface is [`Router::send`]: a command for a slot, with a deadline; `MOVED` and
//! `ASK` are followed within it (a redirect proves nothing ran), and a slot whose master is
//! not up is refused before anything is sent.

mod node;
mod slots;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use redis::aio::MultiplexedConnection;
use redis::{Cmd, ErrorKind, RedisError, RedisResult, ServerErrorKind, Value};
use tokio::runtime::Handle;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use crate::classify::breaks_connection;
use crate::connect::NodeClients;
use crate::connections::ConnectionSettings;
use node::{Node, State};
use slots::{parse_cluster_slots, split_addr, Ranges, SLOTS};

/// How often the slot map is read again when every master is up.
const REFRESH_INTERVAL: Duration = Duration::from_secs(10);
/// ... and while some master is not: a replica promoted in its place is found this soon.
const DEGRADED_REFRESH_INTERVAL: Duration = Duration::from_secs(1);
/// Refreshes asked for in a burst (a `MOVED` per request during a migration) become one.
const MIN_REFRESH_GAP: Duration = Duration::from_millis(100);
/// While a master is not up, one summary line this often (state changes log on their own).
const SUMMARY_INTERVAL: Duration = Duration::from_secs(30);
/// Redirects one command follows (a migration needs one `ASK` or one `MOVED`).
const MAX_REDIRECTS: usize = 2;
const UNOWNED: u16 = u16::MAX;

/// How a command routed to a slot ended.
pub enum Routed {
    Reply(RedisResult<Value>),
    /// No reply by the deadline: the command may still run.
    TimedOut,
    /// Not sent: the slot's master is not up (or unknown yet). Nothing can have changed.
    NotSent,
}

/// Which node serves each slot. Indices into `nodes`; `UNOWNED` for a slot no map covered.
struct SlotMap {
    owners: Box<[u16]>,
    nodes: Vec<Arc<Node>>,
}

impl SlotMap {
    fn empty() -> Self {
        Self {
            owners: vec![UNOWNED; SLOTS].into_boxed_slice(),
            nodes: Vec::new(),
        }
    }

    fn owner(&self, slot: u16) -> Option<&Arc<Node>> {
        let index = *self.owners.get(usize::from(slot))?;
        self.nodes.get(usize::from(index))
    }
}

/// A node and the task keeping it connected.
type Supervised = (Arc<Node>, JoinHandle<()>);

struct Inner {
    map: ArcSwap<SlotMap>,
    /// Every node with a task: the map's masters and the seeds. Touched only on refreshes
    /// and redirects, never per request.
    nodes: Mutex<HashMap<String, Supervised>>,
    seeds: Vec<String>,
    clients: NodeClients,
    settings: ConnectionSettings,
    runtime: Handle,
    /// Asks the refresher for a new map (a node changed state, a `MOVED`).
    refresh: Arc<Notify>,
}

/// Owns the supervision: dropping it stops every node's task and the refresher.
pub struct Cluster {
    inner: Arc<Inner>,
    refresher: JoinHandle<()>,
}

/// Cheap handle for sending; valid while its `Cluster` lives.
#[derive(Clone)]
pub struct Router(Arc<Inner>);

impl Cluster {
    pub fn start(clients: NodeClients, settings: ConnectionSettings, runtime: &Handle) -> Self {
        let seeds = clients.seeds().to_vec();
        let inner = Arc::new(Inner {
            map: ArcSwap::from_pointee(SlotMap::empty()),
            nodes: Mutex::new(HashMap::new()),
            seeds: seeds.clone(),
            clients,
            settings,
            runtime: runtime.clone(),
            refresh: Arc::new(Notify::new()),
        });
        for seed in &seeds {
            inner.node(seed);
        }
        let refresher = runtime.spawn(refresh_loop(inner.clone()));
        Self { inner, refresher }
    }

    pub fn router(&self) -> Router {
        Router(self.inner.clone())
    }

    /// Masters in the slot map that are up (seeds that are not masters do not count).
    pub fn masters_up(&self) -> usize {
        self.inner
            .map
            .load()
            .nodes
            .iter()
            .filter(|n| n.is_up())
            .count()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.refresher.abort();
        let mut nodes = self.inner.nodes.lock().unwrap_or_else(|p| p.into_inner());
        for (_, (_, task)) in nodes.drain() {
            task.abort();
        }
    }
}

impl Router {
    /// Whether a command for `slot` would be sent now. A `false` is counted as a refusal
    /// for the periodic summary.
    pub fn available(&self, slot: u16) -> bool {
        self.0
            .map
            .load()
            .owner(slot)
            .is_some_and(|node| node.connection().is_some())
    }

    /// Sends `cmd` (whose keys are all in `slot`) to the slot's master and waits for its reply
    /// until `deadline`, following `MOVED`/`ASK`.
    pub async fn send(&self, slot: u16, cmd: &Cmd, deadline: Instant) -> Routed {
        let inner = &self.0;
        let mut target = inner.map.load().owner(slot).cloned();
        let mut asking = false;
        let mut last_redirect = None;
        for _ in 0..=MAX_REDIRECTS {
            let Some(node) = target.take() else {
                return Routed::NotSent;
            };
            // Not up (also after a redirect: a redirect proves nothing ran anywhere).
            let Some(live) = node.connection() else {
                return Routed::NotSent;
            };
            let reply = tokio::time::timeout_at(
                deadline.into(),
                send_one(live.connection.clone(), cmd, asking),
            )
            .await;
            let error = match reply {
                Err(_) => {
                    node.suspect(&live);
                    return Routed::TimedOut;
                }
                Ok(Ok(value)) => return Routed::Reply(Ok(value)),
                Ok(Err(error)) => error,
            };
            let redirect = error
                .redirect_node()
                .map(|(addr, to_slot)| (addr.to_owned(), to_slot));
            match (error.kind(), redirect) {
                (ErrorKind::Server(ServerErrorKind::Moved), Some((addr, moved_slot))) => {
                    target = Some(inner.moved(moved_slot, &addr));
                    asking = false;
                    inner.refresh.notify_one();
                }
                (ErrorKind::Server(ServerErrorKind::Ask), Some((addr, _))) => {
                    target = Some(inner.node(&addr));
                    asking = true;
                }
                _ => {
                    if breaks_connection(&error) {
                        node.broken(&live);
                    }
                    return Routed::Reply(Err(error));
                }
            }
            last_redirect = Some(error);
        }
        // Redirected more often than a migration explains: refused (nothing ran).
        match last_redirect {
            Some(error) => Routed::Reply(Err(error)),
            None => Routed::NotSent,
        }
    }
}

/// One command, preceded by `ASKING` after an `ASK` redirect. Server errors come back as
/// errors.
async fn send_one(
    mut connection: MultiplexedConnection,
    cmd: &Cmd,
    asking: bool,
) -> RedisResult<Value> {
    if !asking {
        return connection.send_packed_command(cmd).await?.extract_error();
    }
    let mut pipe = redis::pipe();
    pipe.cmd("ASKING").add_command(cmd.clone());
    let mut replies = connection.send_packed_commands(&pipe, 0, 2).await?;
    match replies.pop() {
        Some(value) => value.extract_error(),
        None => Err(RedisError::from((
            ErrorKind::Parse,
            "no reply after ASKING",
        ))),
    }
}

impl Inner {
    /// The node at `addr`, started (its task connecting) if it is new.
    fn node(&self, addr: &str) -> Arc<Node> {
        let mut nodes = self.nodes.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((node, _)) = nodes.get(addr) {
            return node.clone();
        }
        let node = Arc::new(Node::new(addr.to_owned()));
        let client = match split_addr(addr).map(|(host, port)| self.clients.client(host, port)) {
            Some(Ok(client)) => client,
            _ => {
                // A node without a task is never up: its slots fail closed.
                tracing::warn!(node = %addr, "redis cluster node address not usable; its slots fail closed");
                return node;
            }
        };
        let task = self.runtime.spawn(node::maintain(
            node.clone(),
            client,
            self.settings.clone(),
            self.refresh.clone(),
        ));
        nodes.insert(addr.to_owned(), (node.clone(), task));
        node
    }

    /// A `MOVED` says `slot` is served by `addr`: route it there now, before the refresh.
    fn moved(&self, slot: u16, addr: &str) -> Arc<Node> {
        let node = self.node(addr);
        let map = self.map.load();
        if map.owner(slot).is_some_and(|n| Arc::ptr_eq(n, &node)) {
            return node;
        }
        let mut nodes = map.nodes.clone();
        let index = match nodes.iter().position(|n| Arc::ptr_eq(n, &node)) {
            Some(i) => i,
            None => {
                nodes.push(node.clone());
                nodes.len() - 1
            }
        };
        let mut owners = map.owners.clone();
        if let (Some(owner), Ok(index)) = (owners.get_mut(usize::from(slot)), u16::try_from(index))
        {
            *owner = index;
        }
        self.map.store(Arc::new(SlotMap { owners, nodes }));
        node
    }

    /// Installs the map `ranges` describe; stops the tasks of nodes that are neither in it
    /// nor seeds.
    fn apply(&self, ranges: &Ranges) {
        let mut nodes: Vec<Arc<Node>> = Vec::new();
        let mut owners = vec![UNOWNED; SLOTS].into_boxed_slice();
        for (start, end, addr) in &ranges.0 {
            let node = self.node(addr);
            let index = match nodes.iter().position(|n| Arc::ptr_eq(n, &node)) {
                Some(i) => i,
                None => {
                    nodes.push(node);
                    nodes.len() - 1
                }
            };
            let index = u16::try_from(index).unwrap_or(UNOWNED);
            for owner in &mut owners[usize::from(*start)..=usize::from(*end)] {
                *owner = index;
            }
        }
        let keep: Vec<String> = nodes.iter().map(|n| n.addr.clone()).collect();
        self.map.store(Arc::new(SlotMap { owners, nodes }));
        let mut registry = self.nodes.lock().unwrap_or_else(|p| p.into_inner());
        registry.retain(|addr, (_, task)| {
            let kept = keep.contains(addr) || self.seeds.contains(addr);
            if !kept {
                task.abort();
            }
            kept
        });
    }

    /// `CLUSTER SLOTS` from the first node that answers: masters that are up, then seeds.
    async fn fetch(&self) -> Option<Ranges> {
        let mut candidates: Vec<Arc<Node>> = self.map.load().nodes.clone();
        {
            let registry = self.nodes.lock().unwrap_or_else(|p| p.into_inner());
            for seed in &self.seeds {
                if let Some((node, _)) = registry.get(seed) {
                    if !candidates.iter().any(|c| Arc::ptr_eq(c, node)) {
                        candidates.push(node.clone());
                    }
                }
            }
        }
        for node in candidates.iter().filter(|n| n.is_up()) {
            let Some(live) = node.connection() else {
                continue;
            };
            let mut connection = live.connection.clone();
            let mut cmd = redis::cmd("CLUSTER");
            cmd.arg("SLOTS");
            let reply = tokio::time::timeout(
                self.settings.health_check_timeout,
                connection.send_packed_command(&cmd),
            )
            .await;
            let host = split_addr(&node.addr).map_or("", |(h, _)| h);
            match reply {
                Ok(Ok(value)) => match parse_cluster_slots(&value, host) {
                    Some(ranges) if !ranges.0.is_empty() => return Some(ranges),
                    _ => tracing::debug!(node = %node.addr, "unusable CLUSTER SLOTS reply"),
                },
                Ok(Err(error)) => {
                    tracing::debug!(node = %node.addr, %error, "CLUSTER SLOTS failed")
                }
                Err(_) => tracing::debug!(node = %node.addr, "CLUSTER SLOTS timed out"),
            }
        }
        None
    }

    fn degraded(&self) -> bool {
        let map = self.map.load();
        map.nodes.is_empty() || map.nodes.iter().any(|n| !n.is_up())
    }

    /// One line while some master is not up: who, and how many requests that cost.
    fn summarize(&self) {
        let map = self.map.load();
        let down: Vec<String> = map
            .nodes
            .iter()
            .filter(|n| n.state() != State::Up)
            .map(|n| {
                format!(
                    "{} {} ({} refused)",
                    n.addr,
                    n.state().name(),
                    n.take_refused()
                )
            })
            .collect();
        for node in map.nodes.iter().filter(|n| n.state() == State::Up) {
            node.take_refused();
        }
        if !down.is_empty() {
            tracing::warn!(
                masters = map.nodes.len(),
                not_up = %down.join(", "),
                "redis cluster degraded: requests for these masters' slots fail closed"
            );
        }
    }
}

async fn refresh_loop(inner: Arc<Inner>) {
    let mut last: Option<Ranges> = None;
    let mut summary = Instant::now();
    loop {
        let wait = if inner.degraded() || last.is_none() {
            DEGRADED_REFRESH_INTERVAL
        } else {
            REFRESH_INTERVAL
        };
        let _ = tokio::time::timeout(wait, inner.refresh.notified()).await;
        if let Some(ranges) = inner.fetch().await {
            // Applied even when unchanged: it also undoes a stale `MOVED` and retires nodes.
            inner.apply(&ranges);
            if last.as_ref() != Some(&ranges) {
                tracing::info!(
                    ranges = ranges.0.len(),
                    masters = {
                        let mut m: Vec<&String> = ranges.0.iter().map(|r| &r.2).collect();
                        m.sort();
                        m.dedup();
                        m.len()
                    },
                    "redis cluster slot map"
                );
                last = Some(ranges);
            }
        }
        if summary.elapsed() >= SUMMARY_INTERVAL {
            summary = Instant::now();
            inner.summarize();
        }
        tokio::time::sleep(MIN_REFRESH_GAP).await;
    }
}
