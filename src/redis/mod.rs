//! Redis backend: keys, the atomic Lua programs, reply parsing and failure certainty.

mod classify;
mod connections;
mod keys;
mod programs;
mod reply;

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Semaphore;

use crate::algorithm::outcome_from_reply;
use crate::contract::{
    BackendReadiness, DecisionSource, IncompatibleCause, IndeterminateCause, RateLimitOutcome,
    RateLimitPolicy, RateLimitPort, RateLimitRequest, UnavailableCause,
};

pub use classify::{breaks_connection, classify, Failure};
pub use connections::ConnectionSettings;
pub use keys::KeyBuilder;
pub use programs::invocation;
pub use programs::{program_args, program_source, Program, Programs};
pub use reply::{parse as parse_reply, ReplyError};

use connections::Connections;

/// How often an idle connection is PINGed (and at once after a command timed out on it).
pub const HEALTH_CHECK_INTERVAL: Duration = Duration::from_secs(1);
/// Longest pause between reconnect attempts: Redis is used again at most this long (plus one
/// connect) after it is back.
pub const MAX_RECONNECT_BACKOFF: Duration = Duration::from_secs(2);

#[derive(Debug, Clone)]
pub struct RedisSettings {
    /// `redis://[user:pass@]host:port/db`.
    pub url: String,
    pub key_prefix: String,
    /// Fixed per-command budget; a request whose deadline is closer is refused before sending.
    pub command_timeout: Duration,
    pub connect_timeout: Duration,
    /// Multiplexed connections shared by all requests.
    pub connections: usize,
    /// Commands in flight at most; more are refused before sending.
    pub max_in_flight: usize,
    /// Advised back-off for unavailable / indeterminate outcomes.
    pub retry_after: Duration,
}

impl Default for RedisSettings {
    fn default() -> Self {
        Self {
            url: "redis://127.0.0.1:6379/".into(),
            key_prefix: KeyBuilder::DEFAULT_PREFIX.into(),
            command_timeout: Duration::from_millis(10),
            connect_timeout: Duration::from_secs(1),
            connections: 2,
            max_in_flight: 1024,
            retry_after: Duration::from_secs(1),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RedisSetupError {
    #[error("invalid Redis URL: {0}")]
    Url(#[source] ::redis::RedisError),
    #[error("redis.{name} = {value:?} is outside {min:?}..={max:?}")]
    OutOfRange {
        name: &'static str,
        value: Duration,
        min: Duration,
        max: Duration,
    },
    #[error("redis.{name} must be at least 1")]
    Zero { name: &'static str },
}

impl RedisSettings {
    /// Bounds for `retry_after`: what a denied client is told to wait while Redis cannot decide.
    pub const RETRY_AFTER_RANGE: (Duration, Duration) =
        (Duration::from_millis(100), Duration::from_secs(3600));
    /// Bounds for `command_timeout` and `connect_timeout`.
    pub const TIMEOUT_RANGE: (Duration, Duration) =
        (Duration::from_millis(1), Duration::from_secs(60));

    pub fn validate(&self) -> Result<(), RedisSetupError> {
        for (name, value, (min, max)) in [
            ("retry_after", self.retry_after, Self::RETRY_AFTER_RANGE),
            ("command_timeout", self.command_timeout, Self::TIMEOUT_RANGE),
            ("connect_timeout", self.connect_timeout, Self::TIMEOUT_RANGE),
        ] {
            if value < min || value > max {
                return Err(RedisSetupError::OutOfRange {
                    name,
                    value,
                    min,
                    max,
                });
            }
        }
        for (name, value) in [
            ("connections", self.connections),
            ("max_in_flight", self.max_in_flight),
        ] {
            if value == 0 {
                return Err(RedisSetupError::Zero { name });
            }
        }
        Ok(())
    }
}

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
        let client = ::redis::Client::open(settings.url.as_str()).map_err(RedisSetupError::Url)?;
        let connections = Connections::start(
            client,
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
        let mut connection = live.connection.clone();
        let started = Instant::now();
        let mut sent_source = false;
        let result = loop {
            let cmd = programs::invocation(program, sent_source, &key, policy, request);
            // Server error replies arrive as values; `extract_error` makes them errors. The
            // EVALSHA and the one resend share the command deadline.
            let sent = tokio::time::timeout_at(deadline.into(), async {
                connection.send_packed_command(&cmd).await?.extract_error()
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
                    if breaks_connection(&error) {
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
        format!(
            "redis ({} connections, command timeout {:?})",
            self.settings.connections, self.settings.command_timeout
        )
    }
}
