//! Fixed window: `limit` units per epoch-aligned window of `window_ms`
//! (`lua/rate-fixed-window-v1.lua`).

use super::{
    effective_now, CommonArgs, Evaluation, ProgramReply, Status, Stored, Write, MAX, MAX_PERIOD_MS,
};

/// ARGV[7..=8].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Params {
    pub window_ms: u64,
    pub limit: u64,
}

/// Hash fields `o`, `w`, `c`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct State {
    pub last_observed_ms: u64,
    /// `floor(time / window_ms)` of the window `consumed` belongs to.
    pub window_id: u64,
    pub consumed: u64,
}

/// See [`super::evaluate`]; this is the program with raw arguments.
pub fn evaluate(
    params: &Params,
    args: &CommonArgs,
    stored: Stored<'_, State>,
    server_now: u64,
) -> Evaluation {
    let Params { window_ms, limit } = *params;
    let refuse = |status, effective, limit| Evaluation {
        reply: ProgramReply::refusal(status, server_now, effective, limit),
        write: None,
    };
    if !args.is_valid(server_now) || !(1..=MAX_PERIOD_MS).contains(&window_ms) || limit > MAX {
        let limit = if limit <= MAX { limit } else { 0 };
        return refuse(Status::Invalid, server_now, limit);
    }

    let (mut now, mut window_id, mut consumed) = (server_now, None, 0);
    match stored {
        Stored::Incompatible => return refuse(Status::StateIncompatible, server_now, limit),
        Stored::Absent => {}
        Stored::Present(s) => {
            // A count above the limit (the limit was lowered) is kept: nothing passes until
            // the window ends.
            if s.last_observed_ms > MAX || s.window_id > MAX || s.consumed > MAX {
                return refuse(Status::StateIncompatible, server_now, limit);
            }
            match effective_now(server_now, s.last_observed_ms, args.max_clock_regression_ms) {
                Some(t) => now = t,
                None => return refuse(Status::ClockUnsafe, server_now, limit),
            }
            window_id = Some(s.window_id);
            consumed = s.consumed;
        }
    }

    let current = now / window_ms;
    if window_id.is_some_and(|w| w > current) {
        return refuse(Status::StateIncompatible, now, limit);
    }
    if window_id != Some(current) {
        consumed = 0;
    }
    let reset_at = (current + 1) * window_ms;
    let reply = |status, consumed: u64, retry| ProgramReply {
        status,
        server_now_ms: server_now,
        effective_now_ms: now,
        limit,
        remaining: limit.saturating_sub(consumed),
        retry_after_ms: retry,
        reset_at_ms: reset_at,
    };

    if args.cost == 0 {
        let reply = if consumed < limit {
            reply(Status::Allowed, consumed, 0)
        } else {
            reply(Status::Denied, consumed, reset_at - now)
        };
        return Evaluation { reply, write: None };
    }

    let (status, retry) = if consumed <= limit && args.cost <= limit - consumed {
        consumed += args.cost;
        (Status::Allowed, 0)
    } else {
        (Status::Denied, reset_at - now)
    };
    Evaluation {
        reply: reply(status, consumed, retry),
        write: Some(Write {
            state: super::State::FixedWindow(State {
                last_observed_ms: now,
                window_id: current,
                consumed,
            }),
            ttl_ms: reset_at - now + args.cleanup_grace_ms,
            keeps_expiry: window_id == Some(current) && args.grace_covers_clamp(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::{grace_covering_clamp, keeps_expiry};

    const T0: u64 = 1_700_000_000_000; // a multiple of 1000

    fn args(cost: u64) -> CommonArgs {
        CommonArgs {
            cost,
            max_clock_regression_ms: 100,
            cleanup_grace_ms: 10,
        }
    }

    fn state(e: &Evaluation) -> State {
        match e.write.map(|w| w.state) {
            Some(super::super::State::FixedWindow(s)) => s,
            other => panic!("expected a fixed-window write, got {other:?}"),
        }
    }

    const P: Params = Params {
        window_ms: 1000,
        limit: 3,
    };

    #[test]
    fn expiry_is_set_once_per_window_when_the_grace_covers_a_clamp() {
        let covered = grace_covering_clamp(1);
        let first = evaluate(&P, &covered, Stored::Absent, T0 + 10);
        assert_eq!(
            keeps_expiry(&first),
            Some(false),
            "a new key sets its expiry"
        );
        let again = evaluate(&P, &covered, Stored::Present(&state(&first)), T0 + 20);
        assert_eq!(keeps_expiry(&again), Some(true), "the same window keeps it");
        let over = CommonArgs { cost: 9, ..covered };
        let denied = evaluate(&P, &over, Stored::Present(&state(&again)), T0 + 30);
        assert_eq!(denied.reply.status, Status::Denied);
        assert_eq!(
            keeps_expiry(&denied),
            Some(true),
            "a denial in the window keeps it"
        );
        let next = evaluate(&P, &covered, Stored::Present(&state(&again)), T0 + 1000);
        assert_eq!(keeps_expiry(&next), Some(false), "a new window sets it");
        let short = evaluate(&P, &args(1), Stored::Present(&state(&first)), T0 + 20);
        assert_eq!(
            keeps_expiry(&short),
            Some(false),
            "a grace below the regression bound refreshes it on every write"
        );
    }

    #[test]
    fn counts_within_a_window_and_denies_without_consuming() {
        let e = evaluate(&P, &args(2), Stored::Absent, T0 + 10);
        assert_eq!(e.reply.status, Status::Allowed);
        assert_eq!(e.reply.remaining, 1);
        assert_eq!(e.reply.reset_at_ms, T0 + 1000);
        assert_eq!(e.write.unwrap().ttl_ms, 990 + 10);
        let s = state(&e);
        let denied = evaluate(&P, &args(2), Stored::Present(&s), T0 + 20);
        assert_eq!(denied.reply.status, Status::Denied);
        assert_eq!(denied.reply.retry_after_ms, 980);
        assert_eq!(state(&denied).consumed, 2, "denial consumes nothing");
        let exact = evaluate(&P, &args(1), Stored::Present(&state(&denied)), T0 + 30);
        assert_eq!(exact.reply.status, Status::Allowed, "exact boundary admits");
        assert_eq!(exact.reply.remaining, 0);
        let next = evaluate(&P, &args(3), Stored::Present(&state(&exact)), T0 + 1000);
        assert_eq!(next.reply.status, Status::Allowed, "new window");
    }

    #[test]
    fn peek_reports_one_more_unit_and_writes_nothing() {
        let full = State {
            last_observed_ms: T0,
            window_id: T0 / 1000,
            consumed: 3,
        };
        let e = evaluate(&P, &args(0), Stored::Present(&full), T0 + 1);
        assert_eq!(
            (e.reply.status, e.reply.retry_after_ms),
            (Status::Denied, 999)
        );
        assert!(e.write.is_none());
        let e = evaluate(&P, &args(0), Stored::Absent, T0 + 1);
        assert_eq!((e.reply.status, e.reply.remaining), (Status::Allowed, 3));
        assert!(e.write.is_none());
    }

    #[test]
    fn clock_regression() {
        let s = State {
            last_observed_ms: T0 + 500,
            window_id: T0 / 1000,
            consumed: 1,
        };
        let clamped = evaluate(&P, &args(1), Stored::Present(&s), T0 + 400);
        assert_eq!(clamped.reply.effective_now_ms, T0 + 500);
        assert_eq!(state(&clamped).consumed, 2);
        let unsafe_ = evaluate(&P, &args(1), Stored::Present(&s), T0 + 399);
        assert_eq!(
            unsafe_.reply,
            ProgramReply::refusal(Status::ClockUnsafe, T0 + 399, T0 + 399, 3)
        );
        assert!(unsafe_.write.is_none());
    }

    #[test]
    fn incompatible_and_invalid() {
        let beyond = State {
            last_observed_ms: T0,
            window_id: T0 / 1000,
            consumed: MAX + 1,
        };
        let e = evaluate(&P, &args(1), Stored::Present(&beyond), T0);
        assert_eq!(e.reply.status, Status::StateIncompatible);
        // Above the limit (the limit was lowered): kept, nothing passes this window.
        let over = State {
            consumed: 4,
            ..beyond
        };
        let e = evaluate(&P, &args(1), Stored::Present(&over), T0);
        assert_eq!((e.reply.status, e.reply.remaining), (Status::Denied, 0));
        let peek = evaluate(&P, &args(0), Stored::Present(&over), T0);
        assert_eq!(
            (peek.reply.status, peek.reply.remaining),
            (Status::Denied, 0)
        );
        let next = evaluate(&P, &args(1), Stored::Present(&over), T0 + 1000);
        assert_eq!(
            (next.reply.status, next.reply.remaining),
            (Status::Allowed, 2)
        );
        let future = State {
            last_observed_ms: T0,
            window_id: T0 / 1000 + 1,
            consumed: 0,
        };
        assert_eq!(
            evaluate(&P, &args(1), Stored::Present(&future), T0)
                .reply
                .status,
            Status::StateIncompatible
        );
        let bad = Params {
            window_ms: 0,
            limit: 3,
        };
        assert_eq!(
            evaluate(&bad, &args(1), Stored::Absent, T0).reply,
            ProgramReply::refusal(Status::Invalid, T0, T0, 3)
        );
        let bad = Params {
            window_ms: 1,
            limit: MAX + 1,
        };
        assert_eq!(evaluate(&bad, &args(1), Stored::Absent, T0).reply.limit, 0);
    }

    #[test]
    fn exact_at_the_largest_limit_and_cost() {
        let p = Params {
            window_ms: MAX_PERIOD_MS,
            limit: MAX,
        };
        let e = evaluate(&p, &args(MAX), Stored::Absent, T0);
        assert_eq!((e.reply.status, e.reply.remaining), (Status::Allowed, 0));
        let s = state(&e);
        let e = evaluate(&p, &args(MAX), Stored::Present(&s), T0 + 1);
        assert_eq!(e.reply.status, Status::Denied);
        let e = evaluate(&p, &args(1), Stored::Present(&s), T0 + 1);
        assert_eq!(e.reply.status, Status::Denied);
    }
}
