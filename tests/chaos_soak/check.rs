//! The checker: proves the limits and fail-closed from the recorded answers alone.
//!
//! Every decision is made at Redis's `TIME`, read on this machine's wall clock, so an answered
//! request was decided at some instant in `[sent, done]` (in ms: `[floor(sent), floor(done)]`).
//! Each check below holds for *every* placement of the decisions inside those intervals that
//! the bound allows, so a violation it reports cannot be a timing artefact:
//!
//! - **fixed window**: there is no way to place each OK in a window its interval touches with
//!   at most `limit` per window (earliest-deadline-first assignment, which finds one if any
//!   placement exists);
//! - **sliding-window counter**: the same per aligned window, and the estimator's own
//!   invariant: after the r-th OK of window k+1, decided at most `e` ms into it,
//!   `r + ceil(A * (W - e) / W) <= limit`, with `A` the OKs certainly in window k (the
//!   program's weight rounds up, so its estimate is at least this). It implies that any
//!   window-length interval starting a fraction `f` into an aligned window holding `A` OKs
//!   admits at most `limit + floor(f * A)` (≤ `limit + floor(f * limit)`, < 2 × limit);
//! - **token bucket**: any OKs decided within `[t0, t1]` number at most
//!   `capacity + rate * (t1 - t0) / period` (the level never exceeds the capacity and refills
//!   exactly; the clock is shared, so there is no clock slack), checked over every run of
//!   OKs in send order;
//! - **fail closed**: no OK for a request a server sent after a fault cut it off from Redis
//!   (plus `margin`, for a signal's delivery) and answered before the fault ended.
//!
//! A Redis restarted without its data forgets every counter (the documented loss): the limits
//! are checked separately before and after each such restart; an OK whose interval spans the
//! kill cannot be placed on either side and is left out (and counted).

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap};

use super::chaos::Fault;
use super::load::Sample;
use super::workload::{Algo, LIMITS};
use crate::common::server::{OK, OVER_LIMIT};

/// An OK's decision interval, in ms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    pub lo: u64,
    pub hi: u64,
}

#[derive(Debug, Default)]
pub struct Report {
    pub requests: usize,
    pub ok: usize,
    pub over_limit: usize,
    pub errors: BTreeMap<String, usize>,
    /// OKs left out because they span a restart that lost the counters.
    pub straddling_loss: usize,
    /// Requests answered inside an outage (checked: none OK).
    pub inside_outages: usize,
    /// Per limit: the largest count certainly in one window (or, token bucket: the peak of
    /// allowed − refill over any run) over the bound.
    pub peak_ratio: Vec<(String, f64)>,
    /// Sliding window: the most OKs answered within any window-length span, over the limit.
    pub sliding_rolling_ratio: f64,
    pub violations: Vec<String>,
}

/// `loss_at`: the instants (µs) of kills after which Redis came back empty.
pub fn check(samples: &[Sample], faults: &[Fault], loss_at: &[u64], margin_us: u64) -> Report {
    let mut report = Report {
        requests: samples.len(),
        ..Default::default()
    };
    for s in samples {
        match s.result {
            Ok(OK) => report.ok += 1,
            Ok(OVER_LIMIT) => report.over_limit += 1,
            Ok(other) => *report.errors.entry(format!("code {other}")).or_insert(0) += 1,
            Err(code) => *report.errors.entry(format!("{code:?}")).or_insert(0) += 1,
        }
    }
    check_fail_closed(samples, faults, margin_us, &mut report);

    // (limit, subject, epoch) -> spans of the OKs that consumed it.
    let mut groups: HashMap<(usize, u16, usize), Vec<Span>> = HashMap::new();
    for s in samples.iter().filter(|s| s.result == Ok(OK)) {
        let Some(epoch) = epoch(s.sent_us, s.done_us, loss_at) else {
            report.straddling_loss += 1;
            continue;
        };
        let span = Span {
            lo: s.sent_us / 1000,
            hi: s.done_us / 1000,
        };
        for (l, limit) in LIMITS.iter().enumerate() {
            if let Some(subject) = s.shape[limit.key] {
                groups.entry((l, subject, epoch)).or_default().push(span);
            }
        }
    }
    let mut peaks = vec![0.0f64; LIMITS.len()];
    let mut keys: Vec<_> = groups.keys().copied().collect();
    keys.sort_unstable();
    for key in keys {
        let (l, subject, epoch) = key;
        let spans = &groups[&key];
        let what = format!("{} subject {subject} epoch {epoch}", LIMITS[l].name);
        let result = match LIMITS[l].algo {
            Algo::Fixed { window_ms, limit } => aligned_windows(spans, window_ms, limit),
            Algo::Sliding { window_ms, limit } => {
                let rolling = rolling_max(spans, window_ms) as f64 / limit as f64;
                report.sliding_rolling_ratio = report.sliding_rolling_ratio.max(rolling);
                aligned_windows(spans, window_ms, limit)
                    .and_then(|peak| sliding_invariant(spans, window_ms, limit).map(|_| peak))
            }
            Algo::Bucket {
                period_ms,
                rate,
                capacity,
            } => bucket(spans, period_ms, rate, capacity),
        };
        match result {
            Ok(peak) => peaks[l] = peaks[l].max(peak),
            Err(e) => report.violations.push(format!("{what}: {e}")),
        }
    }
    report.peak_ratio = LIMITS
        .iter()
        .zip(peaks)
        .map(|(l, p)| (l.name.to_owned(), p))
        .collect();
    report
}

/// Which side of the data-losing restarts the decision was on; `None` if it cannot be told.
fn epoch(sent_us: u64, done_us: u64, loss_at: &[u64]) -> Option<usize> {
    if loss_at.iter().any(|&b| sent_us < b && b <= done_us) {
        return None;
    }
    Some(loss_at.iter().filter(|&&b| b <= sent_us).count())
}

fn check_fail_closed(samples: &[Sample], faults: &[Fault], margin_us: u64, report: &mut Report) {
    for f in faults.iter().filter(|f| !f.cut_off.is_empty()) {
        let from = f.start_us + margin_us;
        let first = samples.partition_point(|s| s.sent_us < from);
        for s in samples[first..]
            .iter()
            .take_while(|s| s.sent_us <= f.end_us)
        {
            if s.done_us > f.end_us || !f.cut_off.contains(&s.server) {
                continue;
            }
            report.inside_outages += 1;
            if s.result == Ok(OK) {
                report.violations.push(format!(
                    "OK while Redis was unreachable ({:?}): server {}, sent {} ms after the fault began",
                    f.kind,
                    s.server,
                    (s.sent_us - f.start_us) / 1000
                ));
            }
        }
    }
}

/// At most `limit` OKs per epoch-aligned window of `window_ms`, for some placement of each OK
/// in a window its span touches. Returns the largest count certainly in one window / limit.
pub fn aligned_windows(spans: &[Span], window_ms: u64, limit: u64) -> Result<f64, String> {
    let mut ranges: Vec<(u64, u64)> = spans
        .iter()
        .map(|s| (s.lo / window_ms, s.hi / window_ms))
        .collect();
    ranges.sort_unstable();
    let mut certain: HashMap<u64, u64> = HashMap::new();
    for &(lo, hi) in &ranges {
        if lo == hi {
            *certain.entry(lo).or_insert(0) += 1;
        }
    }
    let peak = certain.values().copied().max().unwrap_or(0);
    // Earliest deadline first: each window takes up to `limit` of the OKs that may fall in it,
    // those whose last possible window is nearest first; one left with no window is a proof.
    let mut pending: BinaryHeap<Reverse<u64>> = BinaryHeap::new();
    let mut next = 0;
    let mut window = 0;
    while next < ranges.len() || !pending.is_empty() {
        if pending.is_empty() {
            window = window.max(ranges[next].0);
        }
        while next < ranges.len() && ranges[next].0 <= window {
            pending.push(Reverse(ranges[next].1));
            next += 1;
        }
        for _ in 0..limit {
            if pending.pop().is_none() {
                break;
            }
        }
        if let Some(&Reverse(hi)) = pending.peek() {
            if hi <= window {
                return Err(format!(
                    "more than {limit} OKs in window {window} ({} ms from {}; {} certainly in it)",
                    window_ms,
                    window * window_ms,
                    certain.get(&window).copied().unwrap_or(0)
                ));
            }
        }
        window += 1;
    }
    Ok(peak as f64 / limit as f64)
}

/// The sliding-window counter's invariant (see the module comment), over the OKs certainly in
/// one window.
pub fn sliding_invariant(spans: &[Span], window_ms: u64, limit: u64) -> Result<(), String> {
    let mut by_window: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    for s in spans {
        if s.lo / window_ms == s.hi / window_ms {
            by_window.entry(s.lo / window_ms).or_default().push(s.hi);
        }
    }
    for (&k, dones) in &by_window {
        let previous = k
            .checked_sub(1)
            .and_then(|p| by_window.get(&p))
            .map_or(0, |v| v.len() as u64);
        let mut dones = dones.clone();
        dones.sort_unstable();
        for (rank, &done) in dones.iter().enumerate() {
            let elapsed = done - k * window_ms;
            let weighted = (previous * (window_ms - elapsed)).div_ceil(window_ms);
            let rank = rank as u64 + 1;
            if rank + weighted > limit {
                return Err(format!(
                    "{rank} OKs by {elapsed} ms into window {k} after {previous} in the previous one: \
                     the estimate ({rank} + {weighted}) exceeds {limit}"
                ));
            }
        }
    }
    Ok(())
}

/// The most OKs answered within any `window_ms` (by answer time), for the summary only.
fn rolling_max(spans: &[Span], window_ms: u64) -> usize {
    let mut dones: Vec<u64> = spans.iter().map(|s| s.hi).collect();
    dones.sort_unstable();
    let (mut best, mut first) = (0, 0);
    for (i, &d) in dones.iter().enumerate() {
        while d - dones[first] >= window_ms {
            first += 1;
        }
        best = best.max(i + 1 - first);
    }
    best
}

/// For every run of OKs in send order, `i..=j`, all decided within
/// `[sent_i, max done over 0..=j]`: `count * period <= capacity * period + rate * length`.
/// Returns the peak of (count − refill) / capacity.
pub fn bucket(spans: &[Span], period_ms: u64, rate: u64, capacity: u64) -> Result<f64, String> {
    let mut spans = spans.to_vec();
    spans.sort_unstable_by_key(|s| s.lo);
    let (p, r, c) = (period_ms as i128, rate as i128, capacity as i128);
    let mut latest = i128::MIN;
    // max over i <= j of (r * sent_i - i * p)
    let mut best_start = i128::MIN;
    let mut peak = i128::MIN;
    for (j, s) in spans.iter().enumerate() {
        let j = j as i128;
        latest = latest.max(s.hi as i128);
        best_start = best_start.max(r * s.lo as i128 - j * p);
        let excess = (j + 1) * p - r * latest + best_start;
        peak = peak.max(excess);
        if excess > c * p {
            return Err(format!(
                "{} tokens' worth more than capacity {capacity} + refill allowed by {} ms (excess {:.2} tokens)",
                (excess - c * p) as f64 / p as f64,
                latest,
                excess as f64 / p as f64
            ));
        }
    }
    Ok(peak as f64 / p as f64 / c as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: &[u64]) -> Vec<Span> {
        ms.iter().map(|&t| Span { lo: t, hi: t + 2 }).collect()
    }

    #[test]
    fn fixed_windows_accept_the_limit_and_reject_one_more() {
        // 5 in window 0, 5 in window 1.
        let ok = at(&[10, 100, 200, 300, 990, 1001, 1200, 1300, 1400, 1500]);
        assert_eq!(aligned_windows(&ok, 1000, 5), Ok(1.0));
        let mut over = ok.clone();
        over.push(Span { lo: 500, hi: 501 });
        assert!(aligned_windows(&over, 1000, 5).is_err());
        // An OK whose interval touches both windows may go to the one with room.
        let mut edge = at(&[10, 100, 200, 300, 1200, 1300, 1400, 1500]);
        edge.push(Span { lo: 998, hi: 1003 });
        edge.push(Span { lo: 997, hi: 1004 });
        assert!(aligned_windows(&edge, 1000, 5).is_ok());
        edge.push(Span { lo: 996, hi: 1005 });
        assert!(aligned_windows(&edge, 1000, 5).is_err());
    }

    #[test]
    fn sliding_invariant_catches_an_edge_burst() {
        // 8 at the end of window 0, then 8 right after the edge: the weighted previous window
        // (8 × ~100%) leaves no room.
        let mut spans = at(&[1990, 1991, 1992, 1993, 1994, 1995, 1996, 1997]);
        assert!(sliding_invariant(&spans, 2000, 8).is_ok());
        spans.extend(at(&[2010]));
        assert!(sliding_invariant(&spans, 2000, 8).is_err());
        // Half-way into the next window, half the previous count is still weighted in: 4 more.
        let mut half = at(&[1990, 1991, 1992, 1993, 1994, 1995, 1996, 1997]);
        half.extend(at(&[3000, 3001, 3002, 3003]));
        assert!(sliding_invariant(&half, 2000, 8).is_ok());
        half.extend(at(&[3004]));
        assert!(sliding_invariant(&half, 2000, 8).is_err());
    }

    #[test]
    fn bucket_allows_capacity_then_the_rate() {
        // Capacity 10, 4 per second: 10 at once, then one every 250 ms.
        let mut spans = at(&[0, 1, 2, 3, 4, 5, 6, 7, 8, 9]);
        spans.extend(at(&[260, 520, 780, 1040]));
        assert!(bucket(&spans, 1000, 4, 10).is_ok());
        // One more within the first 100 ms is beyond capacity + refill.
        spans.push(Span { lo: 50, hi: 52 });
        assert!(bucket(&spans, 1000, 4, 10).is_err());
        // A steady 5 per second for 20 s exceeds the rate after the burst is spent.
        let steady: Vec<u64> = (0..100).map(|i| i * 200).collect();
        assert!(bucket(&at(&steady), 1000, 4, 10).is_err());
        let steady: Vec<u64> = (0..100).map(|i| i * 250).collect();
        assert!(bucket(&at(&steady), 1000, 4, 10).is_ok());
    }

    #[test]
    fn an_ok_inside_an_outage_is_reported_and_restarts_split_the_epochs() {
        let sample = |sent_us, done_us, server, result| Sample {
            sent_us,
            done_us,
            server,
            shape: [Some(1), None, None],
            result,
        };
        let fault = Fault {
            kind: super::super::chaos::Kind::Pause,
            start_us: 1_000_000,
            end_us: 2_000_000,
            cut_off: vec![0],
        };
        let samples = vec![
            sample(1_050_000, 1_060_000, 0, Ok(OK)), // inside the margin: not judged
            sample(1_200_000, 1_300_000, 1, Ok(OK)), // another server
            sample(1_500_000, 1_600_000, 0, Ok(OVER_LIMIT)),
        ];
        let r = check(&samples, std::slice::from_ref(&fault), &[], 100_000);
        assert_eq!((r.inside_outages, r.violations.len()), (1, 0), "{r:?}");
        let mut bad = samples.clone();
        bad.push(sample(1_700_000, 1_800_000, 0, Ok(OK)));
        let r = check(&bad, &[fault], &[], 100_000);
        assert_eq!(r.violations.len(), 1, "{r:?}");

        // 6 OKs in one second for a 5/s limit: a violation, unless the counters were lost in
        // between.
        let oks: Vec<Sample> = (0..6)
            .map(|i| {
                sample(
                    10_000_000 + i * 100_000,
                    10_000_000 + i * 100_000 + 10,
                    0,
                    Ok(OK),
                )
            })
            .collect();
        assert!(!check(&oks, &[], &[], 0).violations.is_empty());
        let r = check(&oks, &[], &[10_250_000], 0);
        assert!(r.violations.is_empty(), "{r:?}");
        assert_eq!(epoch(10_200_000, 10_300_000, &[10_250_000]), None);
    }
}
