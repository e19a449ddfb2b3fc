//! Sliding-window counter: `limit` units per rolling `window_ms`, estimated from the previous
//! and the current epoch-aligned window (`lua/rate-sliding-counter-v1.lua`).
//!
//! estimate = ceil(previous * weight / SCALE) + current, with
//! weight = ceil((window - elapsed_in_current) * SCALE / window). Both ceilings round against
//! the client, so the estimate never under-counts the true rolling count under the usual
//! uniform-spread assumption; the result is still approximate.

use super::{
    ceil_div, effective_now, CommonArgs, Evaluation, ProgramReply, Status, Stored, Write, MAX,
};

/// Fixed-point scale of the previous window's weight (parts per million).
pub const SCALE: u64 = edgelimit_contract::SLIDING_WEIGHT_SCALE;

/// Largest window and limit: `x * SCALE` must stay at or below 2^53 - 1.
pub const MAX_SCALED: u64 = MAX / SCALE;

/// ARGV[7..=8].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Params {
    pub window_ms: u64,
    pub limit: u64,
}

/// Hash fields `o`, `pw`, `pc`, `cw`, `cc`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct State {
    pub last_observed_ms: u64,
    /// Counts only when it is the window right before the current one.
    pub previous_window_id: u64,
    pub previous_count: u64,
    pub current_window_id: u64,
    pub current_count: u64,
}

/// See [`super::evaluate`]; this is the program with raw arguments.
pub fn evaluate(
    params: &Params,
    args: &CommonArgs,
    stored: Stored<'_, State>,
    server_now: u64,
) -> Evaluation {
    let Params {
        window_ms: window,
        limit,
    } = *params;
    let refuse = |status, effective, limit| Evaluation {
        reply: ProgramReply::refusal(status, server_now, effective, limit),
        write: None,
    };
    if !args.is_valid(server_now) || !(1..=MAX_SCALED).contains(&window) || limit > MAX_SCALED {
        let limit = if limit <= MAX_SCALED { limit } else { 0 };
        return refuse(Status::Invalid, server_now, limit);
    }

    let mut now = server_now;
    let mut stored_windows = None;
    match stored {
        Stored::Incompatible => return refuse(Status::StateIncompatible, server_now, limit),
        Stored::Absent => {}
        Stored::Present(s) => {
            if s.last_observed_ms > MAX
                || s.previous_window_id > MAX
                || s.previous_count > MAX_SCALED
                || s.current_window_id > MAX
                || s.current_count > MAX_SCALED
            {
                return refuse(Status::StateIncompatible, server_now, limit);
            }
            match effective_now(server_now, s.last_observed_ms, args.max_clock_regression_ms) {
                Some(t) => now = t,
                None => return refuse(Status::ClockUnsafe, server_now, limit),
            }
            stored_windows = Some(*s);
        }
    }

    let current = now / window;
    let elapsed = now % window;
    // Roll forward; a previous window not adjacent to the current one counts as empty.
    let (prev_id, prev_count, mut cur_count) = match stored_windows {
        None => (current.saturating_sub(1), 0, 0),
        Some(s) if s.current_window_id > current => {
            return refuse(Status::StateIncompatible, now, limit);
        }
        Some(s) if s.current_window_id == current => {
            (s.previous_window_id, s.previous_count, s.current_count)
        }
        Some(s) if s.current_window_id + 1 == current => (s.current_window_id, s.current_count, 0),
        Some(_) => (current - 1, 0, 0),
    };
    let weighted_count = if prev_id.checked_add(1) == Some(current) {
        prev_count
    } else {
        0
    };
    let w = Window {
        window,
        limit,
        now,
        elapsed,
        end: (current + 1) * window,
        weighted_count,
    };

    let mut estimate = w.weighted(weighted_count, elapsed) + cur_count;
    let reply = |status, estimate: u64, retry, cur_count| ProgramReply {
        status,
        server_now_ms: server_now,
        effective_now_ms: now,
        limit,
        remaining: limit.saturating_sub(estimate),
        retry_after_ms: retry,
        reset_at_ms: w.reset_at(cur_count),
    };

    if args.cost == 0 {
        let reply = if estimate < limit {
            reply(Status::Allowed, estimate, 0, cur_count)
        } else {
            reply(Status::Denied, estimate, w.retry(1, cur_count), cur_count)
        };
        return Evaluation { reply, write: None };
    }

    let (status, retry) = if estimate <= limit && args.cost <= limit - estimate {
        cur_count += args.cost;
        estimate += args.cost;
        (Status::Allowed, 0)
    } else {
        (Status::Denied, w.retry(args.cost, cur_count))
    };
    Evaluation {
        reply: reply(status, estimate, retry, cur_count),
        write: Some(Write {
            state: super::State::SlidingWindow(State {
                last_observed_ms: now,
                previous_window_id: prev_id,
                previous_count: prev_count,
                current_window_id: current,
                current_count: cur_count,
            }),
            // After the next window ends both counts have rolled out: equal to absent.
            ttl_ms: w.end + window - now + args.cleanup_grace_ms,
            keeps_expiry: stored_windows.is_some_and(|s| s.current_window_id == current)
                && args.grace_covers_clamp(),
        }),
    }
}

/// The current window, after rolling.
struct Window {
    window: u64,
    limit: u64,
    now: u64,
    elapsed: u64,
    /// First millisecond of the next window.
    end: u64,
    /// The previous window's count if it is adjacent, else 0.
    weighted_count: u64,
}

impl Window {
    /// ceil(count * ceil((window - into_window) * SCALE / window) / SCALE). The products stay
    /// below window * SCALE and limit * SCALE, both validated to be exact.
    fn weighted(&self, count: u64, into_window: u64) -> u64 {
        if count == 0 {
            return 0;
        }
        let weight = ceil_div((self.window - into_window) * SCALE, self.window);
        ceil_div(count * weight, SCALE)
    }

    /// Earliest offset into a window at which `weighted(count, offset) <= allowance`, if any.
    /// Exact: weight <= floor(allowance * SCALE / count)
    /// <=> (window - e) * SCALE <= w_max * window <=> e >= window - floor(w_max * window / SCALE).
    fn earliest_offset(&self, count: u64, allowance: u64) -> Option<u64> {
        if count == 0 {
            return Some(0);
        }
        let w_max = allowance * SCALE / count;
        if w_max >= SCALE {
            return Some(0);
        }
        let offset = self.window - w_max * self.window / SCALE;
        (offset < self.window).then_some(offset)
    }

    /// Time until `need` more units would be admitted with no other traffic: later in this
    /// window, in the next (the current count becomes the previous) or when the one after
    /// starts (both empty). Never earlier than the true earliest millisecond; at most two
    /// windows.
    fn retry(&self, need: u64, cur_count: u64) -> u64 {
        let after_next = self.end + self.window - self.now;
        if need > self.limit {
            return after_next;
        }
        if cur_count + need <= self.limit {
            if let Some(offset) =
                self.earliest_offset(self.weighted_count, self.limit - cur_count - need)
            {
                if offset > self.elapsed {
                    return offset - self.elapsed;
                }
            }
        }
        match self.earliest_offset(cur_count, self.limit - need) {
            Some(offset) => self.end + offset - self.now,
            None => after_next,
        }
    }

    /// When the estimate is zero again (the full limit is available).
    fn reset_at(&self, cur_count: u64) -> u64 {
        if cur_count > 0 {
            self.end + self.window
        } else if self.weighted_count > 0 {
            self.end
        } else {
            self.now
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::State as AnyState;
    use super::*;
    use crate::test_support::{grace_covering_clamp, keeps_expiry};

    const W0: u64 = 1_700_000_000; // window id at T0 for a 1000 ms window
    const T0: u64 = W0 * 1000;

    fn args(cost: u64) -> CommonArgs {
        CommonArgs {
            cost,
            max_clock_regression_ms: 100,
            cleanup_grace_ms: 7,
        }
    }

    fn state(e: &Evaluation) -> State {
        match e.write.map(|w| w.state) {
            Some(AnyState::SlidingWindow(s)) => s,
            other => panic!("expected a sliding-window write, got {other:?}"),
        }
    }

    const P: Params = Params {
        window_ms: 1000,
        limit: 10,
    };

    #[test]
    fn expiry_is_set_once_per_current_window_when_the_grace_covers_a_clamp() {
        let covered = grace_covering_clamp(1);
        let first = evaluate(&P, &covered, Stored::Absent, T0 + 10);
        assert_eq!(
            keeps_expiry(&first),
            Some(false),
            "a new key sets its expiry"
        );
        let again = evaluate(&P, &covered, Stored::Present(&state(&first)), T0 + 999);
        assert_eq!(
            keeps_expiry(&again),
            Some(true),
            "the same current window keeps it"
        );
        let rolled = evaluate(&P, &covered, Stored::Present(&state(&again)), T0 + 1000);
        assert_eq!(
            keeps_expiry(&rolled),
            Some(false),
            "rolling forward sets it"
        );
        let short = evaluate(&P, &args(1), Stored::Present(&state(&first)), T0 + 20);
        assert_eq!(
            keeps_expiry(&short),
            Some(false),
            "a grace below the regression bound"
        );
    }

    fn with(prev: u64, cur: u64, at: u64) -> State {
        State {
            last_observed_ms: at,
            previous_window_id: W0 - 1,
            previous_count: prev,
            current_window_id: W0,
            current_count: cur,
        }
    }

    #[test]
    fn weights_the_previous_window_with_ceilings() {
        // 250 ms into the window: weight 0.75, 10 * 0.75 = 7.5 -> 8.
        let s = with(10, 1, T0);
        let e = evaluate(&P, &args(0), Stored::Present(&s), T0 + 250);
        assert_eq!(e.reply.remaining, 10 - 9);
        assert_eq!(e.reply.status, Status::Allowed);
        let e = evaluate(&P, &args(2), Stored::Present(&s), T0 + 250);
        assert_eq!(e.reply.status, Status::Denied);
        // 8 + 1 + 2 <= 10 needs ceil(10 * w) <= 7, w <= 0.7, offset >= 300: 50 ms more.
        assert_eq!(e.reply.retry_after_ms, 50);
        assert_eq!(state(&e).current_count, 1, "denial consumes nothing");
        let later = evaluate(&P, &args(2), Stored::Present(&state(&e)), T0 + 300);
        assert_eq!(
            later.reply.status,
            Status::Allowed,
            "admitted exactly at the retry point"
        );
        let early = evaluate(&P, &args(2), Stored::Present(&state(&e)), T0 + 299);
        assert_eq!(
            early.reply.status,
            Status::Denied,
            "and not a millisecond earlier"
        );
        assert_eq!(later.reply.reset_at_ms, T0 + 2000);
        assert_eq!(later.write.unwrap().ttl_ms, 1700 + 7);
    }

    #[test]
    fn retry_moves_to_the_next_window_and_is_bounded() {
        // Current count 10 blocks this window; in the next it weighs 10 * w.
        let s = with(0, 10, T0);
        let e = evaluate(&P, &args(4), Stored::Present(&s), T0 + 100);
        assert_eq!(e.reply.status, Status::Denied);
        // Need ceil(10 * w) <= 6: w <= 0.6, offset >= 400 in the next window.
        assert_eq!(e.reply.retry_after_ms, 900 + 400);
        let rolled = evaluate(&P, &args(4), Stored::Present(&state(&e)), T0 + 1400);
        assert_eq!(rolled.reply.status, Status::Allowed);
        let early = evaluate(&P, &args(4), Stored::Present(&state(&e)), T0 + 1399);
        assert_eq!(early.reply.status, Status::Denied);
        // Cost above the limit: the end of the next window.
        let e = evaluate(&P, &args(11), Stored::Present(&s), T0 + 100);
        assert_eq!(e.reply.retry_after_ms, 1900);
        // Full cost: only when both windows are empty.
        let e = evaluate(&P, &args(10), Stored::Present(&s), T0 + 100);
        assert_eq!(e.reply.retry_after_ms, 1900);
    }

    #[test]
    fn rolls_and_forgets_old_windows() {
        let s = with(5, 5, T0);
        let e = evaluate(&P, &args(1), Stored::Present(&s), T0 + 1000);
        let rolled = state(&e);
        assert_eq!(
            (
                rolled.previous_window_id,
                rolled.previous_count,
                rolled.current_count
            ),
            (W0, 5, 1)
        );
        // 5 * 1.0 + 1
        assert_eq!(e.reply.remaining, 4);
        let e = evaluate(&P, &args(1), Stored::Present(&s), T0 + 2000);
        let gone = state(&e);
        assert_eq!(
            (
                gone.previous_window_id,
                gone.previous_count,
                gone.current_window_id
            ),
            (W0 + 1, 0, W0 + 2)
        );
        assert_eq!(e.reply.remaining, 9);
        assert_eq!(e.reply.reset_at_ms, T0 + 4000);
    }

    #[test]
    fn reset_at_is_when_the_estimate_is_zero() {
        let e = evaluate(&P, &args(0), Stored::Absent, T0 + 5);
        assert_eq!(
            e.reply.reset_at_ms,
            T0 + 5,
            "nothing counted: available now"
        );
        let s = with(3, 0, T0);
        let e = evaluate(&P, &args(0), Stored::Present(&s), T0 + 5);
        assert_eq!(e.reply.reset_at_ms, T0 + 1000);
    }

    #[test]
    fn incompatible_states() {
        for s in [
            with(MAX_SCALED + 1, 0, T0),
            with(0, MAX_SCALED + 1, T0),
            State {
                current_window_id: W0 + 1,
                ..with(0, 0, T0)
            },
            State {
                last_observed_ms: MAX + 1,
                ..with(0, 0, T0)
            },
        ] {
            let e = evaluate(&P, &args(1), Stored::Present(&s), T0);
            assert_eq!(e.reply.status, Status::StateIncompatible, "{s:?}");
            assert!(e.write.is_none());
        }
    }

    #[test]
    fn largest_valid_window_and_limit_stay_exact() {
        let p = Params {
            window_ms: MAX_SCALED,
            limit: MAX_SCALED,
        };
        let now = 3 * MAX_SCALED + MAX_SCALED - 1; // last ms of window 3
        let s = State {
            last_observed_ms: now,
            previous_window_id: 2,
            previous_count: MAX_SCALED,
            current_window_id: 3,
            current_count: 0,
        };
        // weight = ceil(1 * SCALE / window) = 1 ppm: ceil(MAX_SCALED / SCALE) = 9008
        let e = evaluate(&p, &args(0), Stored::Present(&s), now);
        assert_eq!(e.reply.remaining, MAX_SCALED - 9008);
        let e = evaluate(&p, &args(MAX_SCALED - 9008), Stored::Present(&s), now);
        assert_eq!(e.reply.status, Status::Allowed);
        let e = evaluate(&p, &args(MAX_SCALED - 9007), Stored::Present(&s), now);
        assert_eq!(e.reply.status, Status::Denied);
        // The next window starts in 1 ms; the current count (0) weighs nothing there.
        assert_eq!(e.reply.retry_after_ms, 1);
        let e = evaluate(&p, &args(MAX), Stored::Present(&s), now);
        assert_eq!(e.reply.status, Status::Denied);
        assert_eq!(e.reply.retry_after_ms, 1 + MAX_SCALED);
        let bad = Params {
            window_ms: MAX_SCALED + 1,
            limit: 1,
        };
        assert_eq!(
            evaluate(&bad, &args(1), Stored::Absent, now).reply.status,
            Status::Invalid
        );
        let bad = Params {
            window_ms: 1,
            limit: MAX_SCALED + 1,
        };
        let e = evaluate(&bad, &args(1), Stored::Absent, now);
        assert_eq!((e.reply.status, e.reply.limit), (Status::Invalid, 0));
    }
}
