//! Admission control: a command is sent only if its answer can be expected within its budget.
//!
//! A command that waits behind others in Redis (or in the connection's pipeline) and times
//! out after dispatch is indeterminate: it may still run and consume quota for a request that
//! was denied. Under a burst, sending everything and timing out the tail therefore turns
//! overload into under-admission. Instead, each command's latency is predicted from the
//! commands already in flight and the recent cost of one command; a command is sent only
//! when it would be answered within half its budget. Until then it waits here — nothing sent,
//! nothing consumed — for as long as the caller's deadline still leaves a whole command budget
//! after the wait; past that it is refused (`Unavailable`).
//!
//! The model is Little's law per process: a command sent behind `n` others completes after
//! about `(n + 1) × s`, where `s` is the time one command occupies the pipe — the observed
//! latency divided by the number in flight when the command was sent, averaged over recent
//! commands. It sees other replicas' load as a larger `s`. A command that times out reports
//! its whole budget as its latency, so the estimate rises at once when Redis stalls.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::{Notify, Semaphore, SemaphorePermit};

use edgelimit_contract::UnavailableCause;

/// Estimate before the first command completes: about five times a Lua program's cost on a
/// loaded Redis, so a cold burst is sent in moderation.
const INITIAL_PER_COMMAND: Duration = Duration::from_micros(100);
/// Smallest estimate kept: the loop-back round trip never costs less.
const MIN_PER_COMMAND_NS: u64 = 5_000;
/// Weight of a new sample in the moving average (1/8).
const SAMPLE_SHIFT: u32 = 3;
/// Only this share of the budget is planned for: the prediction is an average, the reply must
/// still be read, and other replicas' bursts reach Redis at the same time without this
/// process seeing them until their latency comes back.
const BUDGET_SHARE: (u32, u32) = (1, 4);

pub struct Admission {
    /// Commands in flight, at most `max_in_flight`.
    permits: Semaphore,
    max_in_flight: usize,
    /// Requests waiting for their turn, at most `max_in_flight` too.
    waiting: AtomicUsize,
    /// Signalled whenever a command completes (a turn may be free).
    released: Notify,
    per_command_ns: AtomicU64,
}

/// A command allowed on its way with `budget` to be answered in; report its completion with
/// [`Ticket::finish`] (dropping it without counts as no information).
pub struct Ticket<'a> {
    permit: Option<SemaphorePermit<'a>>,
    admission: &'a Admission,
    in_flight: u64,
    pub budget: Duration,
    /// Whether the budget is the caller's remaining time rather than the command timeout.
    pub limited_by_caller: bool,
}

impl Admission {
    pub fn new(max_in_flight: usize) -> Self {
        let max_in_flight = max_in_flight.max(1);
        Self {
            permits: Semaphore::new(max_in_flight),
            max_in_flight,
            waiting: AtomicUsize::new(0),
            released: Notify::new(),
            per_command_ns: AtomicU64::new(INITIAL_PER_COMMAND.as_nanos() as u64),
        }
    }

    pub fn in_flight(&self) -> usize {
        self.max_in_flight - self.permits.available_permits()
    }

    /// The time one command currently occupies the pipe, as estimated.
    pub fn per_command(&self) -> Duration {
        Duration::from_nanos(self.per_command_ns.load(Ordering::Relaxed))
    }

    /// Admits a command for a caller whose deadline is `deadline`; each command may take at
    /// most `command_timeout`. Waits for its turn while the deadline leaves a whole command
    /// timeout after the wait, and is refused otherwise.
    pub async fn admit(
        &self,
        deadline: Instant,
        command_timeout: Duration,
    ) -> Result<Ticket<'_>, UnavailableCause> {
        if let Some(ticket) = self.try_admit(deadline, command_timeout)? {
            return Ok(ticket);
        }
        let wait_until = deadline.checked_sub(command_timeout);
        let Some(wait_until) = wait_until.filter(|&t| t > Instant::now()) else {
            return Err(self.refusal(deadline, command_timeout));
        };
        if self.waiting.fetch_add(1, Ordering::AcqRel) >= self.max_in_flight {
            self.waiting.fetch_sub(1, Ordering::AcqRel);
            return Err(UnavailableCause::AdmissionBoundReached);
        }
        let result = loop {
            let released = self.released.notified();
            tokio::pin!(released);
            // Registered before the check, so a completion in between is not missed.
            released.as_mut().enable();
            match self.try_admit(deadline, command_timeout) {
                Ok(Some(ticket)) => break Ok(ticket),
                Ok(None) => {}
                Err(cause) => break Err(cause),
            }
            if tokio::time::timeout_at(wait_until.into(), released)
                .await
                .is_err()
            {
                // No turn came in time: every turn taken, or too much already queued in Redis.
                break Err(if self.permits.available_permits() == 0 {
                    UnavailableCause::AdmissionBoundReached
                } else {
                    UnavailableCause::Overloaded
                });
            }
        };
        self.waiting.fetch_sub(1, Ordering::AcqRel);
        if result.is_ok() {
            // There may be room for more than one: pass the turn on.
            if self.room(command_timeout) {
                self.released.notify_one();
            }
        }
        result
    }

    /// A ticket if the command can go now; `None` if it must wait for room.
    fn try_admit(
        &self,
        deadline: Instant,
        command_timeout: Duration,
    ) -> Result<Option<Ticket<'_>>, UnavailableCause> {
        let left = deadline.saturating_duration_since(Instant::now());
        let (budget, limited_by_caller) = if left < command_timeout {
            (left, true)
        } else {
            (command_timeout, false)
        };
        if budget.is_zero() {
            return Err(UnavailableCause::DeadlineTooShort);
        }
        let Ok(permit) = self.permits.try_acquire() else {
            return Ok(None);
        };
        let in_flight = self.in_flight() as u64;
        let predicted = self.per_command().saturating_mul(in_flight as u32);
        if in_flight <= 1 {
            // Nothing ahead of it: it is sent with the command timeout whatever the estimate
            // (its latency is the health check's concern, and it is what brings the estimate
            // back down after a stall) — unless the caller leaves less than one command takes.
            if limited_by_caller && predicted > budget {
                return Err(UnavailableCause::DeadlineTooShort);
            }
        } else if predicted * BUDGET_SHARE.1 > budget * BUDGET_SHARE.0 {
            return Ok(None);
        }
        Ok(Some(Ticket {
            permit: Some(permit),
            admission: self,
            in_flight,
            budget,
            limited_by_caller,
        }))
    }

    /// Whether one more command would be sent now with a full command budget.
    fn room(&self, command_timeout: Duration) -> bool {
        let next = self.in_flight() as u32 + 1;
        self.permits.available_permits() > 0
            && self.per_command().saturating_mul(next) * BUDGET_SHARE.1
                <= command_timeout * BUDGET_SHARE.0
    }

    fn refusal(&self, deadline: Instant, command_timeout: Duration) -> UnavailableCause {
        if deadline.saturating_duration_since(Instant::now()) < command_timeout {
            UnavailableCause::DeadlineTooShort
        } else {
            UnavailableCause::Overloaded
        }
    }

    fn record(&self, latency: Duration, in_flight: u64) {
        let sample = (latency.as_nanos() as u64 / in_flight.max(1)).max(MIN_PER_COMMAND_NS);
        // A lost update between two completions only drops one sample.
        let old = self.per_command_ns.load(Ordering::Relaxed);
        let new = old - (old >> SAMPLE_SHIFT) + (sample >> SAMPLE_SHIFT);
        self.per_command_ns
            .store(new.max(MIN_PER_COMMAND_NS), Ordering::Relaxed);
    }
}

impl Ticket<'_> {
    /// Reports the command answered after `latency` (timed out: its whole budget), as
    /// measured where the reply was read.
    pub fn finish(self, latency: Duration) {
        self.admission.record(latency, self.in_flight);
    }
}

/// How long a command that was sent is waited for: past its budget (`send_by`), by half a
/// command timeout at most, and by no more than half the time left before the caller's
/// deadline (the other half stays for timers that fire late and for the answer to travel:
/// Envoy lets traffic through when its own timeout fires first).
///
/// A reply is a decision. Given up on, a command that Redis ran is indeterminate — quota
/// consumed for a request that is denied — and on a loaded host a reply can be read several
/// milliseconds after Redis wrote it (the threads that read it wait for a core). The budget
/// still sets when the command may start in Redis (half of it, `redis_deadline`); this grace
/// only lets an answer that Redis already gave reach the caller.
pub fn reply_deadline(send_by: Instant, caller: Instant, command_timeout: Duration) -> Instant {
    let slack = caller.saturating_duration_since(send_by);
    send_by + (command_timeout / 2).min(slack / 2)
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        // Release the turn first, then wake one waiter to take it.
        drop(self.permit.take());
        self.admission.released.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TIMEOUT: Duration = Duration::from_millis(10);

    fn soon() -> Instant {
        // A whole command budget, and barely any time to wait on top.
        Instant::now() + TIMEOUT + Duration::from_micros(500)
    }

    #[test]
    fn a_sent_command_is_awaited_past_its_budget_while_the_caller_can_still_be_answered() {
        let now = Instant::now();
        let send_by = now + TIMEOUT;
        let ms = Duration::from_millis;
        // Envoy's 20 ms less the margin: half the 8 ms left after the budget.
        assert_eq!(reply_deadline(send_by, now + ms(18), TIMEOUT), now + ms(14));
        // A distant caller deadline: half a command timeout at most.
        assert_eq!(
            reply_deadline(send_by, now + ms(1000), TIMEOUT),
            now + ms(15)
        );
        // The caller's deadline set the budget: no grace beyond it.
        assert_eq!(
            reply_deadline(now + ms(4), now + ms(4), TIMEOUT),
            now + ms(4)
        );
    }

    #[tokio::test]
    async fn refuses_what_cannot_be_answered_in_time_when_there_is_no_time_to_wait() {
        let a = Admission::new(1000);
        // 100 µs per command, a quarter of a 10 ms budget: 25 commands fit.
        let mut tickets = Vec::new();
        for _ in 0..25 {
            tickets.push(a.admit(soon(), TIMEOUT).await.unwrap());
        }
        let later = Instant::now() + Duration::from_millis(15);
        assert!(
            matches!(
                a.admit(later, TIMEOUT).await,
                Err(UnavailableCause::Overloaded)
            ),
            "it waited 5 ms for room, none came"
        );
        assert!(matches!(
            a.admit(Instant::now() + Duration::from_millis(5), TIMEOUT)
                .await,
            Err(UnavailableCause::DeadlineTooShort)
        ));
        drop(tickets);
        assert_eq!(a.in_flight(), 0, "refusals hold no turn");
        assert!(a.admit(soon(), TIMEOUT).await.is_ok());
    }

    #[tokio::test]
    async fn a_command_waits_for_its_turn_while_the_deadline_allows() {
        let a = std::sync::Arc::new(Admission::new(1000));
        let mut tickets = Vec::new();
        for _ in 0..25 {
            tickets.push(a.admit(soon(), TIMEOUT).await.unwrap());
        }
        let waiter = {
            let a = a.clone();
            tokio::spawn(async move {
                let t = a
                    .admit(Instant::now() + Duration::from_secs(5), TIMEOUT)
                    .await;
                t.map(|t| t.budget)
            })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiter.is_finished(), "no room yet");
        tickets.pop();
        assert_eq!(
            waiter.await.unwrap(),
            Ok(TIMEOUT),
            "sent with a whole budget"
        );
    }

    #[test]
    fn the_estimate_follows_observed_latency() {
        let a = Admission::new(10);
        for _ in 0..64 {
            a.record(Duration::from_micros(200), 10);
        }
        let per = a.per_command().as_micros();
        assert!((19..=21).contains(&per), "{per} µs");
        // A stall (a timed-out command reports its whole budget) raises it quickly.
        for _ in 0..8 {
            a.record(Duration::from_millis(10), 1);
        }
        assert!(a.per_command() > Duration::from_millis(5));
    }

    #[tokio::test]
    async fn a_lone_command_is_always_sent_so_the_estimate_recovers() {
        let a = Admission::new(10);
        for _ in 0..8 {
            a.record(Duration::from_millis(10), 1);
        }
        let ticket = a.admit(soon(), TIMEOUT).await.expect("nothing ahead");
        assert!(a.admit(soon(), TIMEOUT).await.is_err(), "one ahead");
        drop(ticket);
        for _ in 0..64 {
            a.record(Duration::from_micros(30), 1);
        }
        assert!(a.per_command() < Duration::from_micros(100));
    }

    #[tokio::test]
    async fn the_in_flight_bound_still_holds() {
        let a = Admission::new(1);
        let _held = a.admit(soon(), TIMEOUT).await.unwrap();
        assert!(a.admit(soon(), TIMEOUT).await.is_err());
    }
}
