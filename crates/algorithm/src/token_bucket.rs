//! Token bucket: `capacity` tokens, refilled with `refill_tokens` every `refill_period_ms`,
//! continuously (`lua/rate-token-bucket-v1.lua`).
//!
//! The level is `tokens + remainder / period`: the sub-token part of a refill is carried, so
//! refilling in many small steps gives exactly what one large step gives. A full bucket
//! accumulates nothing (the remainder is 0 at capacity), which keeps the level independent of
//! how often the bucket is evaluated. An absent key is a full bucket.

use super::{
    ceil_div, effective_now, CommonArgs, Evaluation, ProgramReply, Status, Stored, Write, MAX,
    MAX_PERIOD_MS,
};

/// ARGV[7..=9].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Params {
    pub refill_period_ms: u64,
    pub refill_tokens: u64,
    pub capacity: u64,
}

impl Params {
    /// The program's check: period in 1..=400 days, at least one token per period,
    /// `period * (tokens + 1)` and `capacity * period` at most 2^53 - 1.
    pub fn is_valid(&self) -> bool {
        if !(1..=MAX_PERIOD_MS).contains(&self.refill_period_ms)
            || !(1..=MAX).contains(&self.refill_tokens)
            || self.capacity > MAX
        {
            return false;
        }
        let bound = MAX / self.refill_period_ms;
        self.refill_tokens < bound && self.capacity <= bound
    }
}

/// Hash fields `o`, `t`, `m`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct State {
    /// Last observation, which is also the last refill.
    pub last_observed_ms: u64,
    /// Whole tokens, at most the capacity.
    pub tokens: u64,
    /// Sub-token part in 1/period units, below the period; 0 when `tokens` is the capacity.
    pub remainder: u64,
}

/// See [`super::evaluate`]; this is the program with raw arguments.
pub fn evaluate(
    params: &Params,
    args: &CommonArgs,
    stored: Stored<'_, State>,
    server_now: u64,
) -> Evaluation {
    let Params {
        refill_period_ms: period,
        refill_tokens: rate,
        capacity,
    } = *params;
    let refuse = |status, limit| Evaluation {
        reply: ProgramReply::refusal(status, server_now, server_now, limit),
        write: None,
    };
    if !args.is_valid(server_now) || !params.is_valid() {
        let limit = if capacity <= MAX { capacity } else { 0 };
        return refuse(Status::Invalid, limit);
    }

    let (mut tokens, mut rem, mut last, mut now) = (capacity, 0, server_now, server_now);
    match stored {
        Stored::Incompatible => return refuse(Status::StateIncompatible, capacity),
        Stored::Absent => {}
        Stored::Present(s) => {
            if s.last_observed_ms > MAX || s.tokens > MAX || s.remainder >= period {
                return refuse(Status::StateIncompatible, capacity);
            }
            match effective_now(server_now, s.last_observed_ms, args.max_clock_regression_ms) {
                Some(t) => now = t,
                None => return refuse(Status::ClockUnsafe, capacity),
            }
            (tokens, rem, last) = (s.tokens, s.remainder, s.last_observed_ms);
            // More tokens than the capacity (the capacity was lowered): a full bucket.
            if tokens >= capacity {
                (tokens, rem) = (capacity, 0);
            }
        }
    }

    // Refill over the elapsed time: q whole periods give q * rate tokens, the partial period
    // r gives (r * rate + rem) / period more. Saturate before q * rate could leave the range.
    if tokens < capacity {
        let missing = capacity - tokens;
        let elapsed = now - last;
        let (q, r) = (elapsed / period, elapsed % period);
        if q >= ceil_div(missing, rate) {
            (tokens, rem) = (capacity, 0);
        } else {
            // q * rate < missing; r * rate + rem < period * (rate + 1) <= MAX
            let partial = r * rate + rem;
            let (whole, carry) = (partial / period, partial % period);
            if whole >= missing - q * rate {
                (tokens, rem) = (capacity, 0);
            } else {
                (tokens, rem) = (tokens + q * rate + whole, carry);
            }
        }
    }

    let b = Bucket {
        period,
        rate,
        capacity,
    };
    let reset_at = |tokens, rem| {
        let ttf = b.time_to(capacity, tokens, rem);
        if ttf > MAX - now {
            // ~285,000 years away: saturate rather than leave the exact range.
            MAX
        } else {
            now + ttf
        }
    };
    let reply = |status, tokens, retry| ProgramReply {
        status,
        server_now_ms: server_now,
        effective_now_ms: now,
        limit: capacity,
        remaining: tokens,
        retry_after_ms: retry,
        reset_at_ms: reset_at(tokens, rem),
    };

    if args.cost == 0 {
        let reply = if tokens >= 1 {
            reply(Status::Allowed, tokens, 0)
        } else {
            reply(Status::Denied, tokens, b.retry(1, tokens, rem))
        };
        return Evaluation { reply, write: None };
    }

    let (status, retry) = if tokens >= args.cost {
        tokens -= args.cost;
        (Status::Allowed, 0)
    } else {
        (Status::Denied, b.retry(args.cost, tokens, rem))
    };
    // A full bucket equals an absent key; at least 1 ms so the write is never a delete.
    let ttl = b
        .time_to(capacity, tokens, rem)
        .min(MAX - args.cleanup_grace_ms)
        + args.cleanup_grace_ms;
    Evaluation {
        reply: reply(status, tokens, retry),
        write: Some(Write {
            state: super::State::TokenBucket(State {
                last_observed_ms: now,
                tokens,
                remainder: rem,
            }),
            ttl_ms: ttl.max(1),
            keeps_expiry: false,
        }),
    }
}

struct Bucket {
    period: u64,
    rate: u64,
    capacity: u64,
}

impl Bucket {
    /// Milliseconds until the bucket holds `want <= capacity` whole tokens:
    /// ceil(((want - tokens) * period - rem) / rate); `(want - tokens) * period` is at most
    /// `capacity * period`, validated to be exact.
    fn time_to(&self, want: u64, tokens: u64, rem: u64) -> u64 {
        if tokens >= want {
            return 0;
        }
        ceil_div((want - tokens) * self.period - rem, self.rate)
    }

    /// A cost above capacity can never pass: point at the full bucket, at least a period away.
    fn retry(&self, need: u64, tokens: u64, rem: u64) -> u64 {
        if need > self.capacity {
            return self.time_to(self.capacity, tokens, rem).max(self.period);
        }
        self.time_to(need, tokens, rem)
    }
}

#[cfg(test)]
mod tests {
    use super::super::State as AnyState;
    use super::*;
    use crate::test_support::{grace_covering_clamp, keeps_expiry};

    const T0: u64 = 1_700_000_000_000;

    fn args(cost: u64) -> CommonArgs {
        CommonArgs {
            cost,
            max_clock_regression_ms: 100,
            cleanup_grace_ms: 5,
        }
    }

    fn state(e: &Evaluation) -> State {
        match e.write.map(|w| w.state) {
            Some(AnyState::TokenBucket(s)) => s,
            other => panic!("expected a token-bucket write, got {other:?}"),
        }
    }

    // 3 tokens per 1000 ms, capacity 5.
    const P: Params = Params {
        refill_period_ms: 1000,
        refill_tokens: 3,
        capacity: 5,
    };

    #[test]
    fn every_write_refreshes_the_expiry() {
        let covered = grace_covering_clamp(1);
        let first = evaluate(&P, &covered, Stored::Absent, T0);
        let again = evaluate(&P, &covered, Stored::Present(&state(&first)), T0 + 1);
        assert_eq!(
            keeps_expiry(&again),
            Some(false),
            "the expiry moves with the level"
        );
    }

    #[test]
    fn absent_is_full_and_denial_consumes_nothing() {
        let e = evaluate(&P, &args(5), Stored::Absent, T0);
        assert_eq!((e.reply.status, e.reply.remaining), (Status::Allowed, 0));
        // 5 tokens * 1000 / 3 = 1666.67 -> 1667
        assert_eq!(e.reply.reset_at_ms, T0 + 1667);
        assert_eq!(e.write.unwrap().ttl_ms, 1667 + 5);
        let empty = state(&e);
        let d = evaluate(&P, &args(2), Stored::Present(&empty), T0 + 100);
        assert_eq!(d.reply.status, Status::Denied);
        // level 0.3 -> need 1.7 more -> 566.67 -> 567 ms
        assert_eq!(d.reply.retry_after_ms, 567);
        let after_denial = state(&d);
        assert_eq!((after_denial.tokens, after_denial.remainder), (0, 300));
        assert_eq!(
            evaluate(&P, &args(2), Stored::Present(&after_denial), T0 + 666)
                .reply
                .status,
            Status::Denied
        );
        assert_eq!(
            evaluate(&P, &args(2), Stored::Present(&after_denial), T0 + 667)
                .reply
                .status,
            Status::Allowed,
            "exact boundary after a non-consuming denial"
        );
    }

    #[test]
    fn refill_carry_is_independent_of_step_size() {
        let p = Params {
            refill_period_ms: 7,
            refill_tokens: 3,
            capacity: 1_000,
        };
        let empty = State {
            last_observed_ms: T0,
            tokens: 0,
            remainder: 0,
        };
        let mut s = empty;
        for step in 1..=300u64 {
            let e = evaluate(&p, &args(0), Stored::Present(&s), T0 + step);
            // a peek writes nothing, so use a denied over-capacity cost to store the refill
            assert!(e.write.is_none());
            let e = evaluate(&p, &args(1_001), Stored::Present(&s), T0 + step);
            s = state(&e);
        }
        let one = evaluate(&p, &args(1_001), Stored::Present(&empty), T0 + 300);
        assert_eq!(state(&one), s);
        // 300 ms * 3 / 7 = 128.57: 128 tokens, remainder 4 (in 1/7)
        assert_eq!((s.tokens, s.remainder), (128, 4));
    }

    #[test]
    fn saturates_at_capacity_and_drops_the_remainder() {
        let s = State {
            last_observed_ms: T0,
            tokens: 4,
            remainder: 999,
        };
        let e = evaluate(&P, &args(6), Stored::Present(&s), T0 + 1);
        let full = state(&e);
        assert_eq!((full.tokens, full.remainder), (5, 0));
        assert_eq!(
            e.reply.retry_after_ms, 1000,
            "cost above capacity: at least a period"
        );
        assert_eq!(e.write.unwrap().ttl_ms, 5, "full: only the grace");
        let zero_grace = CommonArgs {
            cleanup_grace_ms: 0,
            ..args(6)
        };
        let e = evaluate(&P, &zero_grace, Stored::Present(&s), T0 + 1);
        assert_eq!(e.write.unwrap().ttl_ms, 1, "never a delete");
        // Long idle: saturation before any product leaves the range.
        let e = evaluate(&P, &args(0), Stored::Present(&s), MAX);
        assert_eq!(e.reply.remaining, 5);
    }

    #[test]
    fn state_checks_and_clock() {
        // More tokens than the capacity (it was lowered), or a remainder at capacity: a full
        // bucket.
        for full in [(6, 0), (5, 1), (MAX, 999)] {
            let s = State {
                last_observed_ms: T0,
                tokens: full.0,
                remainder: full.1,
            };
            let e = evaluate(&P, &args(1), Stored::Present(&s), T0);
            assert_eq!(
                (e.reply.status, e.reply.remaining),
                (Status::Allowed, 4),
                "{s:?}"
            );
        }
        for bad in [
            State {
                last_observed_ms: T0,
                tokens: MAX + 1,
                remainder: 0,
            },
            State {
                last_observed_ms: T0,
                tokens: 1,
                remainder: 1000,
            },
        ] {
            let e = evaluate(&P, &args(1), Stored::Present(&bad), T0);
            assert_eq!(
                e.reply,
                ProgramReply::refusal(Status::StateIncompatible, T0, T0, 5)
            );
        }
        let s = State {
            last_observed_ms: T0 + 100,
            tokens: 1,
            remainder: 0,
        };
        let e = evaluate(&P, &args(1), Stored::Present(&s), T0);
        assert_eq!(
            (e.reply.status, e.reply.effective_now_ms),
            (Status::Allowed, T0 + 100)
        );
        let e = evaluate(&P, &args(1), Stored::Present(&s), T0 - 1);
        assert_eq!(
            e.reply,
            ProgramReply::refusal(Status::ClockUnsafe, T0 - 1, T0 - 1, 5)
        );
    }

    #[test]
    fn validation_bounds_are_the_largest_exact_products() {
        // period * (rate + 1) = MAX exactly for period 1.
        assert!(Params {
            refill_period_ms: 1,
            refill_tokens: MAX - 1,
            capacity: MAX,
        }
        .is_valid());
        assert!(!Params {
            refill_period_ms: 1,
            refill_tokens: MAX,
            capacity: 1,
        }
        .is_valid());
        // MAX = 9007199254740991 = 6361 * 69431 * 20394401
        let period = 6361 * 69431;
        let capacity = 20_394_401;
        assert_eq!(period * capacity, MAX);
        let p = Params {
            refill_period_ms: period,
            refill_tokens: 1,
            capacity,
        };
        assert!(p.is_valid());
        assert!(!Params {
            capacity: capacity + 1,
            ..p
        }
        .is_valid());
        let e = evaluate(&p, &args(capacity), Stored::Absent, T0);
        assert_eq!(e.reply.status, Status::Allowed);
        // time to full = capacity * period / 1 = MAX: reset saturates, TTL stays exact.
        assert_eq!(e.reply.reset_at_ms, MAX);
        assert_eq!(e.write.unwrap().ttl_ms, MAX);
        let s = state(&e);
        let e = evaluate(&p, &args(1), Stored::Present(&s), T0 + period - 1);
        assert_eq!(
            (e.reply.status, e.reply.retry_after_ms),
            (Status::Denied, 1)
        );
        let e = evaluate(&p, &args(1), Stored::Present(&s), T0 + period);
        assert_eq!((e.reply.status, e.reply.remaining), (Status::Allowed, 0));

        let p = Params {
            refill_period_ms: 1,
            refill_tokens: MAX - 1,
            capacity: MAX,
        };
        let e = evaluate(&p, &args(MAX), Stored::Absent, T0);
        let s = state(&e);
        let e = evaluate(&p, &args(MAX), Stored::Present(&s), T0 + 1);
        assert_eq!(
            (e.reply.status, e.reply.retry_after_ms),
            (Status::Denied, 1)
        );
        let e = evaluate(&p, &args(MAX), Stored::Present(&s), T0 + 2);
        assert_eq!(e.reply.status, Status::Allowed);
    }
}
