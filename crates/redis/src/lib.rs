//! Redis backend: keys, the atomic Lua programs, reply parsing, admission and failure
//! certainty.
//!
//! Every limit of one request is decided by one program call where its keys share a Cluster
//! slot (always, outside Cluster): the single-key program for a request of one limit, the
//! composite program otherwise. On Cluster, keys of several slots are decided in two phases:
//! a read-only check of every slot group, then one atomic commit per group (see README,
//! Guarantees).
#![forbid(unsafe_code)]

mod admission;
mod batch;
mod classify;
mod clock;
mod cluster;
mod codec;
mod connect;
mod connections;
mod eviction;
mod io;
mod keys;
mod programs;
mod reply;
mod settings;
mod slot;
mod tls;

use std::sync::Arc;
use std::time::{Duration, Instant};

use ::redis::Value;
use futures_util::future::join_all;

use edgelimit_algorithm::composite::Mode;
use edgelimit_algorithm::{outcome_from_reply, ProgramReply};
use edgelimit_contract::{
    BackendReadiness, CompositeOutcome, CompositeRequest, DecisionSource, IncompatibleCause,
    IndeterminateCause, LimitCheck, RateLimitOutcome, RateLimitPolicy, RateLimitPort,
    UnavailableCause,
};

pub use admission::Admission;
pub use classify::{breaks_connection, classify, Failure};
pub use codec::{parse_decimal, state_from_hash, state_to_hash, StateError, SCHEMA_VERSION};
pub use connections::ConnectionSettings;
pub use keys::KeyBuilder;
pub use programs::{
    batch_invocation, batch_source, composite_invocation, composite_source, invocation,
    program_args, program_source, BatchMember, CompositeCheck, Program, Programs,
};
pub use reply::{parse as parse_reply, parse_many as parse_replies, ReplyError};
pub use settings::{
    Redacted, RedisSettings, RedisSetupError, Secret, SentinelSettings, TlsFiles, Topology,
    MAX_BATCH,
};
pub use slot::key_slot;

use batch::Batcher;
use clock::RedisClock;
use cluster::{Cluster, Router};
use connect::{Connector, NodeClients};
use connections::Connections;
use io::{IoThread, Sent};

/// How often an idle connection is PINGed (and at once after a command timed out on it).
pub const HEALTH_CHECK_INTERVAL: Duration = Duration::from_secs(1);
/// Longest pause between reconnect attempts: Redis is used again at most this long (plus one
/// connect) after it is back.
pub const MAX_RECONNECT_BACKOFF: Duration = Duration::from_secs(2);

/// Where commands go: a pool of interchangeable connections (standalone, Sentinel), or the
/// Cluster master owning each command's slot.
enum Pool {
    Shared(Arc<Connections>),
    Cluster(Cluster),
}

/// Where one call goes.
enum Route {
    Link(Arc<connections::Live>),
    Slot(Router, u16),
}

pub struct RedisBackend {
    pool: Pool,
    /// Requests queue for a batch call while the window of calls in flight is full; none on
    /// Cluster (each request's keys are routed to their own node) or with `batch_max` 1.
    batcher: Option<Arc<Batcher>>,
    io: IoThread,
    /// Redis's clock (standalone, Sentinel), learned as connections come up and from replies.
    clock: Arc<RedisClock>,
    admission: Admission,
    keys: KeyBuilder,
    programs: Arc<Programs>,
    settings: RedisSettings,
}

/// What one program call carries.
enum Call<'a> {
    /// One limit: the algorithm's single-key program.
    Single {
        key: &'a str,
        policy: &'a RateLimitPolicy,
        cost: u64,
        shadow: bool,
    },
    /// Several limits whose keys share one slot: the composite program.
    Composite {
        mode: Mode,
        keys: Vec<&'a str>,
        checks: Vec<CompositeCheck<'a>>,
    },
}

impl Call<'_> {
    /// The key that picks the Cluster slot (every key of a call shares it).
    fn first_key(&self) -> &str {
        match self {
            Call::Single { key, .. } => key,
            Call::Composite { keys, .. } => keys.first().copied().unwrap_or_default(),
        }
    }

    fn program<'p>(&self, programs: &'p Programs) -> &'p Program {
        match self {
            Call::Single { policy, .. } => programs.for_algorithm(policy.algorithm()),
            Call::Composite { .. } => programs.composite(),
        }
    }

    fn command(
        &self,
        program: &Program,
        with_source: bool,
        deadline_ms: Option<u64>,
    ) -> ::redis::Cmd {
        match self {
            Call::Single {
                key, policy, cost, ..
            } => invocation(program, with_source, key, policy, *cost, deadline_ms),
            Call::Composite { mode, keys, checks } => {
                composite_invocation(program, with_source, *mode, keys, checks, deadline_ms)
            }
        }
    }

    /// The same decision as a member of a batch call.
    fn member(&self, deadline_ms: Option<u64>) -> BatchMember {
        match self {
            Call::Single {
                key,
                policy,
                cost,
                shadow,
            } => BatchMember::new(
                Mode::Commit,
                &[key],
                &[CompositeCheck {
                    key: 0,
                    policy,
                    cost: *cost,
                    shadow: *shadow,
                }],
                deadline_ms,
            ),
            Call::Composite { mode, keys, checks } => {
                BatchMember::new(*mode, keys, checks, deadline_ms)
            }
        }
    }

    fn is_single(&self) -> bool {
        matches!(self, Call::Single { .. })
    }

    fn parse(&self, value: &Value) -> Result<Vec<ProgramReply>, ReplyError> {
        match self {
            Call::Single { policy, .. } => reply::parse(value, policy).map(|r| vec![r]),
            Call::Composite { checks, .. } => {
                let policies: Vec<&RateLimitPolicy> = checks.iter().map(|c| c.policy).collect();
                reply::parse_many(value, &policies)
            }
        }
    }
}

/// A request's keys, and how its checks are grouped into calls: one group per Cluster slot
/// (one group outside Cluster).
struct Plan {
    keys: Vec<String>,
    /// Per check, the index of its key.
    key_of: Vec<usize>,
    /// Per group, the indices of its checks, in request order.
    groups: Vec<Vec<usize>>,
}

impl Plan {
    fn new(keys: &KeyBuilder, checks: &[LimitCheck<'_>], by_slot: bool) -> Self {
        let mut plan = Plan {
            keys: Vec::with_capacity(checks.len()),
            key_of: Vec::with_capacity(checks.len()),
            groups: Vec::new(),
        };
        let mut group_slots: Vec<u16> = Vec::new();
        for (index, check) in checks.iter().enumerate() {
            let key = keys.state_key(check.policy(), check.subject());
            let key_index = match plan.keys.iter().position(|k| *k == key) {
                Some(i) => i,
                None => {
                    plan.keys.push(key);
                    plan.keys.len() - 1
                }
            };
            plan.key_of.push(key_index);
            let slot = if by_slot {
                key_slot(plan.keys[key_index].as_bytes())
            } else {
                0
            };
            match group_slots.iter().position(|&s| s == slot) {
                Some(g) => plan.groups[g].push(index),
                None => {
                    group_slots.push(slot);
                    plan.groups.push(vec![index]);
                }
            }
        }
        plan
    }

    /// The program call deciding one group's checks.
    fn call<'a>(&'a self, checks: &'a [LimitCheck<'a>], group: &[usize], mode: Mode) -> Call<'a> {
        // One limit alone: the single-key program decides it the same way (a shadow limit
        // consumes exactly when it allows, as in the composite program).
        if let ([only], Mode::Commit) = (group, mode) {
            let check = &checks[*only];
            return Call::Single {
                key: &self.keys[self.key_of[*only]],
                policy: check.policy(),
                cost: check.cost().units(),
                shadow: check.is_shadow(),
            };
        }
        // The group's keys, numbered in order of first use.
        let mut keys: Vec<&str> = Vec::new();
        let mut local: Vec<(usize, usize)> = Vec::new();
        let calls = group
            .iter()
            .map(|&i| {
                let global = self.key_of[i];
                let key = match local.iter().find(|(g, _)| *g == global) {
                    Some(&(_, l)) => l,
                    None => {
                        keys.push(&self.keys[global]);
                        local.push((global, keys.len() - 1));
                        keys.len() - 1
                    }
                };
                let check = &checks[i];
                CompositeCheck {
                    key,
                    policy: check.policy(),
                    cost: check.cost().units(),
                    shadow: check.is_shadow(),
                }
            })
            .collect();
        Call::Composite {
            mode,
            keys,
            checks: calls,
        }
    }
}

impl RedisBackend {
    /// Validates the settings and starts connecting in the background; evaluations before the
    /// first connection is up are `Unavailable`.
    pub fn start(settings: RedisSettings) -> Result<Self, RedisSetupError> {
        settings.validate()?;
        let io =
            IoThread::start().map_err(|e| RedisSetupError::Client(format!("I/O thread: {e}")))?;
        let programs = Arc::new(Programs::load());
        let connection_settings = ConnectionSettings {
            count: settings.connections,
            connect_timeout: settings.connect_timeout,
            health_check_interval: HEALTH_CHECK_INTERVAL,
            health_check_timeout: settings.connect_timeout,
            max_backoff: MAX_RECONNECT_BACKOFF,
            preload: programs.all().iter().map(|p| p.source).collect(),
            clock: None,
        };
        let clock = Arc::new(RedisClock::default());
        let (pool, batcher) = match &settings.topology {
            Topology::Cluster { .. } => (
                Pool::Cluster(Cluster::start(
                    NodeClients::build(&settings)?,
                    connection_settings,
                    io.handle(),
                )),
                None,
            ),
            _ => {
                let connections = Arc::new(Connections::start(
                    Arc::new(Connector::build(&settings)?),
                    ConnectionSettings {
                        clock: Some(clock.clone()),
                        ..connection_settings
                    },
                    io.handle(),
                ));
                let batcher = (settings.batch_max > 1).then(|| {
                    // About two calls in flight per connection: one being answered while the
                    // next is on its way, the rest of the requests gathered into the calls
                    // that follow.
                    Batcher::new(
                        settings.connections * 2,
                        settings.batch_max,
                        connections.clone(),
                        programs.clone(),
                        io.handle().clone(),
                    )
                });
                (Pool::Shared(connections), batcher)
            }
        };
        Ok(Self {
            pool,
            batcher,
            io,
            clock,
            admission: Admission::new(settings.max_in_flight),
            keys: KeyBuilder::new(settings.key_prefix.clone()),
            programs,
            settings,
        })
    }

    /// Waits until a connection is up, at most `bound`; returns whether one is.
    pub async fn wait_connected(&self, bound: Duration) -> bool {
        let deadline = Instant::now() + bound;
        while self.live_connections() == 0 {
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        true
    }

    pub fn settings(&self) -> &RedisSettings {
        &self.settings
    }

    pub fn in_flight(&self) -> usize {
        self.admission.in_flight()
    }

    /// Live connections (Cluster: masters that are up, one connection each).
    pub fn live_connections(&self) -> usize {
        match &self.pool {
            Pool::Shared(connections) => connections.live_count(),
            Pool::Cluster(cluster) => cluster.masters_up(),
        }
    }

    fn is_cluster(&self) -> bool {
        matches!(self.settings.topology, Topology::Cluster { .. })
    }

    fn failure_outcome(&self, policy: &RateLimitPolicy, failure: Failure) -> RateLimitOutcome {
        match failure {
            Failure::Unavailable(cause) => RateLimitOutcome::Unavailable {
                policy_id: policy.id().clone(),
                retry_after: self.settings.retry_after,
                cause,
            },
            Failure::Indeterminate(cause) => RateLimitOutcome::Indeterminate {
                policy_id: policy.id().clone(),
                retry_after: self.settings.retry_after,
                cause,
            },
            Failure::Incompatible(cause) => RateLimitOutcome::Incompatible {
                policy_id: policy.id().clone(),
                cause,
            },
        }
    }

    /// Sends one program call and parses its replies, within `deadline` (the caller's, which
    /// the command timeout may shorten). Refused before sending when it could not be answered
    /// in time.
    async fn dispatch(
        &self,
        call: &Call<'_>,
        deadline: Instant,
    ) -> Result<Vec<ProgramReply>, Failure> {
        // No live connection (Cluster: the slot's master is not up): nothing is sent, so
        // nothing can have changed; answered at once.
        let cluster_route = match &self.pool {
            Pool::Shared(_) => None,
            Pool::Cluster(cluster) => {
                let router = cluster.router();
                let slot = key_slot(call.first_key().as_bytes());
                if !router.available(slot) {
                    return Err(Failure::Unavailable(UnavailableCause::ConnectFailed));
                }
                Some(Route::Slot(router, slot))
            }
        };
        let ticket = self
            .admission
            .admit(deadline, self.settings.command_timeout)
            .await
            .map_err(Failure::Unavailable)?;
        let budget = ticket.budget;
        let program = call.program(&self.programs);
        let started = Instant::now();
        let send_by = started + budget;
        let reply_by = admission::reply_deadline(send_by, deadline, self.settings.command_timeout);
        let deadline_ms = self.redis_deadline(budget);
        // With the window of calls in flight full, the request joins the next batch call.
        let turn = match &self.batcher {
            None => None,
            Some(batcher) => match Batcher::try_alone(batcher) {
                Some(turn) => Some(turn),
                None => {
                    let member = call.member(deadline_ms);
                    let (result, finished) =
                        Batcher::queue(batcher, member, call.is_single(), send_by, reply_by).await;
                    ticket.finish(finished.saturating_duration_since(started));
                    return self.replies(call, program, result?);
                }
            },
        };
        let route = match (cluster_route, &self.pool) {
            (Some(route), _) => route,
            (None, Pool::Shared(connections)) => Route::Link(
                connections
                    .pick()
                    .ok_or(Failure::Unavailable(UnavailableCause::ConnectFailed))?,
            ),
            (None, Pool::Cluster(_)) => {
                return Err(Failure::Unavailable(UnavailableCause::ConnectFailed))
            }
        };
        let mut sent_source = false;
        let (result, finished) = loop {
            // The EVALSHA and the one resend share the reply deadline.
            let cmd = call.command(program, sent_source, deadline_ms);
            let (sent, finished) = match &route {
                Route::Link(live) => self.io.send(live.link.clone(), cmd, reply_by).await,
                Route::Slot(router, slot) => {
                    self.io.route(router.clone(), *slot, cmd, reply_by).await
                }
            };
            match sent {
                Sent::TimedOut => {
                    // The command may sit in Redis's input buffer and run later: uncertain.
                    // A paused or half-open server is found by an immediate health check
                    // (the router does it for its node).
                    if let (Route::Link(live), Pool::Shared(connections)) = (&route, &self.pool) {
                        connections.suspect(live);
                    }
                    break (
                        Err(Failure::Indeterminate(IndeterminateCause::Timeout)),
                        finished,
                    );
                }
                Sent::Lost => {
                    break (
                        Err(Failure::Indeterminate(IndeterminateCause::ConnectionLost)),
                        finished,
                    )
                }
                Sent::Refused => {
                    break (
                        Err(Failure::Unavailable(UnavailableCause::ConnectFailed)),
                        finished,
                    )
                }
                Sent::Reply(Ok(value)) => break (Ok(value), finished),
                // Scripts are not replicated (Redis 7+) and vanish on restart or SCRIPT FLUSH:
                // resend the exact source once. NOSCRIPT proves nothing ran.
                Sent::Reply(Err(error))
                    if !sent_source
                        && error.kind()
                            == ::redis::ErrorKind::Server(::redis::ServerErrorKind::NoScript) =>
                {
                    program.noscript_resends().increment(1);
                    sent_source = true;
                }
                Sent::Reply(Err(error)) => {
                    let failure = classify(&error);
                    if let (Route::Link(live), Pool::Shared(connections)) = (&route, &self.pool) {
                        if live.link.broken_by(&error) {
                            connections.mark_broken(live);
                        }
                    }
                    tracing::debug!(%error, ?failure, "redis command failed");
                    break (Err(failure), finished);
                }
            }
        };
        drop(turn);
        let latency = finished.saturating_duration_since(started);
        ticket.finish(latency);
        program.latency().record(latency.as_secs_f64());
        self.replies(call, program, result?)
    }

    /// Parses a call's reply into one reply per check (and learns Redis's clock from it).
    fn replies(
        &self,
        call: &Call<'_>,
        program: &Program,
        value: Value,
    ) -> Result<Vec<ProgramReply>, Failure> {
        let replies = call.parse(&value).map_err(|error| {
            tracing::warn!(%error, program = program.name, ?value, "incompatible program reply");
            Failure::Incompatible(IncompatibleCause::MalformedReply)
        })?;
        if let Some(reply) = replies.first() {
            self.clock.learn(reply.server_now_ms);
        }
        Ok(replies)
    }

    /// The deadline to hand the program, on Redis's clock: the middle of the budget (the
    /// admission plans for commands answered within half of it), leaving the other half for
    /// the reply to travel back and be read. A program that waited in Redis's queue past it
    /// does nothing, so a command that timed out while queued costs no quota. None on Cluster
    /// (nodes' clocks differ) and while Redis's clock is unknown (`TIME` failed on connect
    /// and no reply came yet).
    fn redis_deadline(&self, budget: Duration) -> Option<u64> {
        if self.is_cluster() {
            return None;
        }
        self.clock.deadline(budget / 2)
    }

    /// Decides one group of checks with one call; `outcomes` receives one outcome per check.
    async fn decide_group(
        &self,
        plan: &Plan,
        checks: &[LimitCheck<'_>],
        group: &[usize],
        mode: Mode,
        deadline: Instant,
    ) -> Vec<RateLimitOutcome> {
        let call = plan.call(checks, group, mode);
        match self.dispatch(&call, deadline).await {
            Ok(replies) => group
                .iter()
                .zip(replies)
                .map(|(&i, reply)| self.outcome(checks[i].policy(), &reply))
                .collect(),
            Err(failure) => group
                .iter()
                .map(|&i| self.failure_outcome(checks[i].policy(), failure))
                .collect(),
        }
    }

    fn outcome(&self, policy: &RateLimitPolicy, reply: &ProgramReply) -> RateLimitOutcome {
        outcome_from_reply(
            reply,
            policy,
            DecisionSource::GlobalRedis,
            self.settings.retry_after,
        )
    }

    /// Several slot groups (Cluster only): every group is checked read-only, in parallel;
    /// only when every enforced check would admit the request do the groups commit, one at a
    /// time, tightest first (the group whose limits have the least room left is the likeliest
    /// to have been taken by a concurrent request), each atomically on its own. The first
    /// group that denies at commit stops the rest: nothing further is consumed. Groups that
    /// committed before it keep their consumption (counted, per group, in
    /// `edgelimit_redis_partial_commits_total`) — under-admission, never over-admission.
    async fn decide_across_slots(
        &self,
        plan: &Plan,
        request: &CompositeRequest<'_>,
    ) -> CompositeOutcome {
        let checks = request.checks();
        let mut outcomes: Vec<Option<RateLimitOutcome>> = vec![None; checks.len()];
        let checked =
            join_all(plan.groups.iter().map(|group| {
                self.decide_group(plan, checks, group, Mode::Check, request.deadline())
            }))
            .await;
        let mut room = Vec::with_capacity(plan.groups.len());
        for (g, (group, results)) in plan.groups.iter().zip(checked).enumerate() {
            room.push((tightness(checks, group, &results), g));
            for (&i, outcome) in group.iter().zip(results) {
                outcomes[i] = Some(outcome);
            }
        }
        let admitted = |outcomes: &[Option<RateLimitOutcome>], group: &[usize]| {
            group.iter().all(|&i| {
                checks[i].is_shadow()
                    || outcomes[i]
                        .as_ref()
                        .is_some_and(RateLimitOutcome::is_allowed)
            })
        };
        if plan.groups.iter().all(|group| admitted(&outcomes, group)) {
            room.sort_unstable();
            for (committed, &(_, g)) in room.iter().enumerate() {
                let group = &plan.groups[g];
                let results = self
                    .decide_group(plan, checks, group, Mode::Commit, request.deadline())
                    .await;
                for (&i, outcome) in group.iter().zip(results) {
                    outcomes[i] = Some(outcome);
                }
                if !admitted(&outcomes, group) {
                    if committed > 0 {
                        metrics::counter!(edgelimit_metrics::REDIS_PARTIAL_COMMITS)
                            .increment(committed as u64);
                    }
                    break;
                }
            }
        }
        CompositeOutcome::new(outcomes.into_iter().flatten().collect())
    }
}

/// How little room a group's enforced limits have left, as the smallest remaining share of
/// a limit in millionths (a denied or failed check: 0): groups are committed in this order.
fn tightness(checks: &[LimitCheck<'_>], group: &[usize], outcomes: &[RateLimitOutcome]) -> u64 {
    group
        .iter()
        .zip(outcomes)
        .filter(|(&i, _)| !checks[i].is_shadow())
        .map(|(_, outcome)| match outcome {
            RateLimitOutcome::Evaluated(d) if d.allowed && d.limit > 0 => {
                (u128::from(d.remaining) * 1_000_000 / u128::from(d.limit)) as u64
            }
            _ => 0,
        })
        .min()
        .unwrap_or(u64::MAX)
}

impl RateLimitPort for RedisBackend {
    async fn evaluate_all(&self, request: &CompositeRequest<'_>) -> CompositeOutcome {
        let plan = Plan::new(&self.keys, request.checks(), self.is_cluster());
        if let [group] = plan.groups.as_slice() {
            return CompositeOutcome::new(
                self.decide_group(
                    &plan,
                    request.checks(),
                    group,
                    Mode::Commit,
                    request.deadline(),
                )
                .await,
            );
        }
        self.decide_across_slots(&plan, request).await
    }

    async fn readiness(&self) -> BackendReadiness {
        if self.live_connections() > 0 {
            BackendReadiness::Ready
        } else {
            BackendReadiness::NotReady("no live Redis connection".into())
        }
    }

    fn describe(&self) -> String {
        let topology = match &self.settings.topology {
            Topology::Standalone { .. } => "standalone",
            Topology::Sentinel(_) => "sentinel",
            Topology::Cluster { .. } => "cluster",
        };
        let connections = match self.pool {
            Pool::Shared(_) => format!("{} connections", self.settings.connections),
            Pool::Cluster(_) => "one connection per master".to_owned(),
        };
        format!(
            "redis {topology}{} ({connections}, command timeout {:?})",
            if self.settings.uses_tls() { " tls" } else { "" },
            self.settings.command_timeout
        )
    }
}
