//! Several limits of one request decided together, the rule the composite program
//! (`lua/lib/composite.lua`) implements and the embedded backend uses: the checks are evaluated in order against the
//! keys' states, each seeing what the checks before it tentatively consumed (the same key may
//! appear twice); the request is admitted only if every enforced check is `ALLOWED`; then the
//! states of the admitting checks are written, otherwise nothing is.
//!
//! - A check that is not `ALLOWED` (denied, or a refusal status) writes nothing: denials
//!   consume nothing, also for shadow checks, which never affect admission.
//! - When the request is not admitted, a check that was `ALLOWED` reports a peek of its key's
//!   state as it was before the request (nothing consumed, `remaining` is what is left now).
//! - Only the final state of each key is written, with the TTL of its last evaluation.

use super::{evaluate, ProgramReply, State, Status, Stored, Write};
use edgelimit_contract::RateLimitPolicy;
use smallvec::SmallVec;

/// Checks a request usually carries at most: lists of one entry per check or per key stay on
/// the stack up to this many (a decision is otherwise several small heap allocations).
pub const INLINE_CHECKS: usize = 4;

/// A per-check (or per-key) list of one request.
pub type PerCheck<T> = SmallVec<[T; INLINE_CHECKS]>;

/// Whether a decision may store anything (the composite program's ARGV[2]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mode {
    /// Store the admitting checks' states when the request is admitted.
    Commit,
    /// Never store, and reply as for a request that is not admitted: a read-only check,
    /// the first phase of a decision across Redis Cluster slots.
    Check,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Commit => "commit",
            Mode::Check => "check",
        }
    }
}

/// One check: a policy evaluated on the state `key` (an index into the request's keys).
#[derive(Debug, Clone, Copy)]
pub struct Check<'a> {
    pub policy: &'a RateLimitPolicy,
    pub key: usize,
    /// Units to consume; 0 is a peek.
    pub cost: u64,
    pub shadow: bool,
}

/// What a key held before the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Held {
    Absent,
    Present(State),
    Incompatible,
}

impl Held {
    fn stored(&self) -> Stored<'_, State> {
        match self {
            Held::Absent => Stored::Absent,
            Held::Present(s) => Stored::Present(s),
            Held::Incompatible => Stored::Incompatible,
        }
    }
}

/// The result of deciding one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decided {
    /// One reply per check, in order.
    pub replies: PerCheck<ProgramReply>,
    /// Whether every enforced check was `ALLOWED` (in [`Mode::Check`]: would be).
    pub admitted: bool,
    /// Per key: the state to store (`None`: leave the key as it is). All `None` when the
    /// request was not admitted.
    pub writes: PerCheck<Option<Write>>,
}

/// Decides `checks` against `held` (one entry per key) at `server_now_ms`.
pub fn decide(checks: &[Check<'_>], held: &[Held], server_now_ms: u64, mode: Mode) -> Decided {
    let mut working: PerCheck<Held> = held.iter().copied().collect();
    let mut writes: PerCheck<Option<Write>> = SmallVec::from_elem(None, held.len());
    let mut replies = PerCheck::with_capacity(checks.len());
    let mut admitted = true;
    for check in checks {
        let Some(state) = working.get(check.key) else {
            // A check naming no key cannot be decided: it is refused, never allowed.
            replies.push(ProgramReply::refusal(
                Status::Invalid,
                server_now_ms,
                server_now_ms,
                0,
            ));
            admitted &= check.shadow;
            continue;
        };
        let e = evaluate(check.policy, state.stored(), server_now_ms, check.cost);
        let allowed = e.reply.status == Status::Allowed;
        admitted &= allowed || check.shadow;
        if let (true, Some(mut write)) = (allowed, e.write) {
            // The expiry stays only if every write since the held state kept it: the first
            // write over an absent key, or into a new window, sets it.
            if let Some(earlier) = writes[check.key] {
                write.keeps_expiry &= earlier.keeps_expiry;
            }
            working[check.key] = Held::Present(write.state);
            writes[check.key] = Some(write);
        }
        replies.push(e.reply);
    }
    if admitted && mode == Mode::Commit {
        return Decided {
            replies,
            admitted,
            writes,
        };
    }
    // Nothing is consumed: what an admitting check reports is what its key holds now.
    for (check, reply) in checks.iter().zip(replies.iter_mut()) {
        if reply.status == Status::Allowed {
            if let Some(original) = held.get(check.key) {
                *reply = evaluate(check.policy, original.stored(), server_now_ms, 0).reply;
            }
        }
    }
    Decided {
        replies,
        admitted,
        writes: SmallVec::from_elem(None, held.len()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{fixed_window, token_bucket};
    use edgelimit_contract::{AlgorithmParams, PolicyId};

    const NOW: u64 = 1_700_000_000_500;

    fn policy(id: &str, params: AlgorithmParams) -> RateLimitPolicy {
        RateLimitPolicy::new(PolicyId::new(id).unwrap(), 1, params, 100, 0, 0).unwrap()
    }

    fn fixed(id: &str, limit: u64, window_ms: u64) -> RateLimitPolicy {
        policy(id, AlgorithmParams::FixedWindow { limit, window_ms })
    }

    fn consumed(write: &Option<Write>) -> Option<u64> {
        match write.map(|w| w.state) {
            Some(State::FixedWindow(s)) => Some(s.consumed),
            _ => None,
        }
    }

    fn check(policy: &RateLimitPolicy, key: usize, cost: u64, shadow: bool) -> Check<'_> {
        Check {
            policy,
            key,
            cost,
            shadow,
        }
    }

    #[test]
    fn all_admit_then_all_consume() {
        let (second, day) = (fixed("s", 3, 1000), fixed("d", 10, 86_400_000));
        let checks = [check(&second, 0, 1, false), check(&day, 1, 1, false)];
        let d = decide(&checks, &[Held::Absent, Held::Absent], NOW, Mode::Commit);
        assert!(d.admitted);
        assert_eq!(d.replies[0].remaining, 2);
        assert_eq!(d.replies[1].remaining, 9);
        assert_eq!(consumed(&d.writes[0]), Some(1));
        assert_eq!(consumed(&d.writes[1]), Some(1));
    }

    #[test]
    fn a_key_keeps_its_expiry_only_if_every_write_to_it_does() {
        // Grace 0 covers a regression bound of 0 (the test policies).
        let second = fixed("s", 5, 1000);
        let twice = [check(&second, 0, 1, false), check(&second, 0, 1, false)];
        let d = decide(&twice, &[Held::Absent], NOW, Mode::Commit);
        assert_eq!(consumed(&d.writes[0]), Some(2));
        assert_eq!(
            d.writes[0].map(|w| w.keeps_expiry),
            Some(false),
            "the first write over an absent key sets it, whatever a later check says"
        );
        let held = [Held::Present(d.writes[0].unwrap().state)];
        let d = decide(&twice, &held, NOW + 1, Mode::Commit);
        assert_eq!(consumed(&d.writes[0]), Some(4));
        assert_eq!(d.writes[0].map(|w| w.keeps_expiry), Some(true));
    }

    #[test]
    fn one_denial_consumes_nothing_and_reports_what_is_left() {
        let (second, day) = (fixed("s", 3, 1000), fixed("d", 10, 86_400_000));
        let full = Held::Present(State::FixedWindow(fixed_window::State {
            last_observed_ms: NOW,
            window_id: NOW / 1000,
            consumed: 3,
        }));
        let day_state = Held::Present(State::FixedWindow(fixed_window::State {
            last_observed_ms: NOW,
            window_id: NOW / 86_400_000,
            consumed: 4,
        }));
        // The day limit comes first and admits; the second limit denies.
        let checks = [check(&day, 1, 1, false), check(&second, 0, 1, false)];
        let d = decide(&checks, &[full, day_state], NOW, Mode::Commit);
        assert!(!d.admitted);
        assert!(d.writes.iter().all(Option::is_none), "nothing consumed");
        assert_eq!(d.replies[0].status, Status::Allowed);
        assert_eq!(d.replies[0].remaining, 6, "what is left, not 5");
        assert_eq!(d.replies[1].status, Status::Denied);
    }

    #[test]
    fn the_same_key_twice_sees_the_first_consumption() {
        let p = fixed("p", 3, 1000);
        let two = Held::Present(State::FixedWindow(fixed_window::State {
            last_observed_ms: NOW,
            window_id: NOW / 1000,
            consumed: 1,
        }));
        let checks = [check(&p, 0, 1, false), check(&p, 0, 1, false)];
        let d = decide(&checks, &[two], NOW, Mode::Commit);
        assert!(d.admitted);
        assert_eq!(
            (d.replies[0].remaining, d.replies[1].remaining),
            (1, 0),
            "request order is evaluation order"
        );
        assert_eq!(consumed(&d.writes[0]), Some(3));
        // One more unit than is left: the second check denies, nothing is consumed.
        let checks = [check(&p, 0, 1, false), check(&p, 0, 2, false)];
        let d = decide(&checks, &[two], NOW, Mode::Commit);
        assert!(!d.admitted);
        assert_eq!(d.replies[0].remaining, 2);
        assert_eq!(d.replies[1].status, Status::Denied);
        assert!(d.writes[0].is_none());
    }

    #[test]
    fn shadow_checks_never_decide_and_count_only_what_passes() {
        let (enforced, shadow) = (fixed("e", 5, 1000), fixed("s", 0, 1000));
        let checks = [check(&enforced, 0, 1, false), check(&shadow, 1, 1, true)];
        let d = decide(&checks, &[Held::Absent, Held::Absent], NOW, Mode::Commit);
        assert!(d.admitted, "a shadow denial does not deny");
        assert_eq!(d.replies[1].status, Status::Denied);
        assert_eq!(consumed(&d.writes[0]), Some(1));
        assert!(
            d.writes[1].is_none(),
            "its would-be denial consumes nothing"
        );

        let roomy = fixed("r", 5, 1000);
        let blocked = fixed("b", 0, 1000);
        let checks = [check(&roomy, 0, 1, true), check(&blocked, 1, 1, false)];
        let d = decide(&checks, &[Held::Absent, Held::Absent], NOW, Mode::Commit);
        assert!(!d.admitted);
        assert!(
            d.writes.iter().all(Option::is_none),
            "a denied request counts nowhere"
        );
    }

    #[test]
    fn an_undecidable_enforced_check_admits_nothing() {
        let (a, b) = (fixed("a", 5, 1000), fixed("b", 5, 1000));
        let checks = [check(&a, 0, 1, false), check(&b, 1, 1, false)];
        let d = decide(
            &checks,
            &[Held::Absent, Held::Incompatible],
            NOW,
            Mode::Commit,
        );
        assert!(!d.admitted);
        assert_eq!(d.replies[1].status, Status::StateIncompatible);
        assert!(d.writes.iter().all(Option::is_none));
        // In shadow it is reported but does not block the rest.
        let checks = [check(&a, 0, 1, false), check(&b, 1, 1, true)];
        let d = decide(
            &checks,
            &[Held::Absent, Held::Incompatible],
            NOW,
            Mode::Commit,
        );
        assert!(d.admitted);
        assert_eq!(consumed(&d.writes[0]), Some(1));
        // A check naming no key is refused.
        let d = decide(
            &[check(&a, 3, 1, false)],
            &[Held::Absent],
            NOW,
            Mode::Commit,
        );
        assert!(!d.admitted);
        assert_eq!(d.replies[0].status, Status::Invalid);
    }

    #[test]
    fn check_mode_decides_but_stores_nothing_and_reports_what_is_left() {
        let (second, day) = (fixed("s", 3, 1000), fixed("d", 10, 86_400_000));
        let checks = [check(&second, 0, 2, false), check(&day, 1, 1, false)];
        let d = decide(&checks, &[Held::Absent, Held::Absent], NOW, Mode::Check);
        assert!(d.admitted, "it would be admitted");
        assert!(d.writes.iter().all(Option::is_none));
        assert_eq!(d.replies[0].status, Status::Allowed);
        assert_eq!((d.replies[0].remaining, d.replies[1].remaining), (3, 10));
    }

    #[test]
    fn peeks_decide_but_never_write() {
        let bucket = policy(
            "t",
            AlgorithmParams::TokenBucket {
                capacity: 2,
                refill_tokens: 1,
                refill_period_ms: 1000,
            },
        );
        let empty = Held::Present(State::TokenBucket(token_bucket::State {
            last_observed_ms: NOW,
            tokens: 0,
            remainder: 0,
        }));
        let other = fixed("f", 5, 1000);
        let checks = [check(&other, 0, 1, false), check(&bucket, 1, 0, false)];
        let d = decide(&checks, &[Held::Absent, empty], NOW, Mode::Commit);
        assert!(!d.admitted, "a denying peek denies the request");
        let d = decide(&checks, &[Held::Absent, Held::Absent], NOW, Mode::Commit);
        assert!(d.admitted);
        assert!(d.writes[1].is_none(), "a peek writes nothing");
        assert_eq!(consumed(&d.writes[0]), Some(1));
    }
}
