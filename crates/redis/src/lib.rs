//! Redis backend: keys, the atomic Lua programs, reply parsing and failure certainty.
#![forbid(unsafe_code)]

mod classify;
mod connect;
mod connections;
mod keys;
mod programs;
mod reply;
mod settings;
mod tls;

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Semaphore;

use edgelimit_algorithm::outcome_from_reply;
use edgelimit_contract::{
    BackendReadiness, DecisionSource, IncompatibleCause, IndeterminateCause, RateLimitOutcome,
    RateLimitPolicy, RateLimitPort, RateLimitRequest, UnavailableCause,
};

pub use classify::{breaks_connection, classify, Failure};
pub use connections::ConnectionSettings;
pub use keys::KeyBuilder;
pub use programs::invocation;
pub use programs::{program_args, program_source, Program, Programs};
pub use reply::{parse as parse_reply, ReplyError};
pub use settings::{
    Redacted, RedisSettings, RedisSetupError, Secret, SentinelSettings, TlsFiles, Topology,
};

use connect::Connector;
use connections::Connections;

/// How often an idle connection is PINGed (and at once after a command timed out on it).
pub const HEALTH_CHECK_INTERVAL: Duration = Duration::from_secs(1);
/// Longest pause between reconnect attempts: Redis is used again at most this long (plus one
/// connect) after it is back.
pub const MAX_RECONNECT_BACKOFF: Duration = Duration::from_secs(2);

pub struct RedisBackend {
    connections: Connections,
    admission: Arc<Semaphore>,
    keys: KeyBuilder,
    programs: Programs,
    settings: RedisSettings,
}

impl RedisBackend {
    /// Validates the settings and starts connecting in the background; evaluations before the
    /// first connection is up are `Unavailable`.
    pub fn start(settings: RedisSettings) -> Result<Self, RedisSetupError> {
        settings.validate()?;
        let connector = Arc::new(Connector::build(&settings)?);
        let connections = Connections::start(
            connector,
            ConnectionSettings {
                count: settings.connections,
                connect_timeout: settings.connect_timeout,
                health_check_interval: HEALTH_CHECK_INTERVAL,
                health_check_timeout: settings.connect_timeout,
                max_backoff: MAX_RECONNECT_BACKOFF,
            },
        );
        Ok(Self {
            connections,
            admission: Arc::new(Semaphore::new(settings.max_in_flight.max(1))),
            keys: KeyBuilder::new(settings.key_prefix.clone()),
            programs: Programs::load(),
            settings,
        })
    }

    /// Waits until a connection is up, at most `bound`; returns whether one is.
    pub async fn wait_connected(&self, bound: Duration) -> bool {
        let deadline = Instant::now() + bound;
        while self.connections.live_count() == 0 {
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
        self.settings.max_in_flight.max(1) - self.admission.available_permits()
    }

    pub fn live_connections(&self) -> usize {
        self.connections.live_count()
    }

    fn unavailable(&self, policy: &RateLimitPolicy, cause: UnavailableCause) -> RateLimitOutcome {
        self.failure(policy, Failure::Unavailable(cause))
    }

    fn failure(&self, policy: &RateLimitPolicy, failure: Failure) -> RateLimitOutcome {
        let outcome = match failure {
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
        };
        counted(outcome)
    }

    async fn run(
        &self,
        policy: &RateLimitPolicy,
        request: &RateLimitRequest,
        deadline: Instant,
    ) -> RateLimitOutcome {
        // No live connection: nothing is sent, so nothing can have changed.
        let Some(live) = self.connections.pick() else {
            return self.unavailable(policy, UnavailableCause::ConnectFailed);
        };
        let program = self.programs.for_algorithm(policy.algorithm());
        let key = self.keys.state_key(policy, request.subject());
        let mut link = live.link.clone();
        let started = Instant::now();
        let mut sent_source = false;
        let result = loop {
            let cmd = programs::invocation(program, sent_source, &key, policy, request);
            // Server error replies arrive as values; `extract_error` makes them errors. The
            // EVALSHA and the one resend share the command deadline.
            let sent = tokio::time::timeout_at(deadline.into(), async {
                link.send(&cmd).await?.extract_error()
            })
            .await;
            match sent {
                Err(_) => {
                    // The command may sit in Redis's input buffer and run later: uncertain.
                    // A paused or half-open server is found by an immediate health check.
                    self.connections.suspect(&live);
                    break Err(Failure::Indeterminate(IndeterminateCause::Timeout));
                }
                Ok(Ok(value)) => break Ok(value),
                // Scripts are not replicated (Redis 7+) and vanish on restart or SCRIPT FLUSH:
                // resend the exact source once. NOSCRIPT proves nothing ran.
                Ok(Err(error))
                    if !sent_source
                        && error.kind()
                            == ::redis::ErrorKind::Server(::redis::ServerErrorKind::NoScript) =>
                {
                    metrics::counter!("edgelimit_redis_noscript_reloads_total", "program" => program.name).increment(1);
                    sent_source = true;
                }
                Ok(Err(error)) => {
                    let failure = classify(&error);
                    if live.link.broken_by(&error) {
                        self.connections.mark_broken(&live);
                    }
                    tracing::debug!(%error, ?failure, "redis command failed");
                    break Err(failure);
                }
            }
        };
        metrics::histogram!("edgelimit_redis_command_seconds", "program" => program.name)
            .record(started.elapsed().as_secs_f64());
        match result {
            Err(failure) => self.failure(policy, failure),
            Ok(value) => match reply::parse(&value, policy) {
                // Program statuses that are not decisions (CLOCK_UNSAFE, STATE_INCOMPATIBLE,
                // INVALID) are counted like any other failure.
                Ok(reply) => counted(outcome_from_reply(
                    &reply,
                    policy,
                    DecisionSource::GlobalRedis,
                    self.settings.retry_after,
                )),
                Err(error) => {
                    tracing::warn!(%error, policy = %policy.id(), ?value, "incompatible program reply");
                    self.failure(
                        policy,
                        Failure::Incompatible(IncompatibleCause::MalformedReply),
                    )
                }
            },
        }
    }
}

/// Counts an outcome that is not a decision under `edgelimit_backend_failures_total`
/// {category, cause}; decisions pass through uncounted (the service counts those).
fn counted(outcome: RateLimitOutcome) -> RateLimitOutcome {
    if !matches!(outcome, RateLimitOutcome::Evaluated(_)) {
        metrics::counter!(
            "edgelimit_backend_failures_total",
            "category" => outcome.category(),
            "cause" => outcome.cause()
        )
        .increment(1);
    }
    outcome
}

impl RateLimitPort for RedisBackend {
    async fn evaluate(
        &self,
        policy: &RateLimitPolicy,
        request: &RateLimitRequest,
    ) -> RateLimitOutcome {
        if request.check_policy(policy).is_err() {
            return self.failure(
                policy,
                Failure::Incompatible(IncompatibleCause::PolicyMismatch),
            );
        }
        // Admission precheck: a command that could outlive the caller is never sent.
        let now = Instant::now();
        let command_deadline = now + self.settings.command_timeout;
        if request.deadline() < command_deadline {
            return self.unavailable(policy, UnavailableCause::DeadlineTooShort);
        }
        let Ok(_permit) = self.admission.try_acquire() else {
            return self.unavailable(policy, UnavailableCause::AdmissionBoundReached);
        };
        self.run(policy, request, command_deadline).await
    }

    async fn readiness(&self) -> BackendReadiness {
        if self.connections.live_count() > 0 {
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
        format!(
            "redis {topology}{} ({} connections, command timeout {:?})",
            if self.settings.uses_tls() { " tls" } else { "" },
            self.settings.connections,
            self.settings.command_timeout
        )
    }
}
