//! Resident memory of each server (`VmRSS` in `/proc/<pid>/status`), sampled on a thread.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// (time since the start, kB per server)
pub type Samples = Vec<(Duration, Vec<u64>)>;

pub struct Sampler {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<Samples>,
}

pub fn vm_rss_kb(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

impl Sampler {
    pub fn start(pids: Vec<u32>, every: Duration) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let started = Instant::now();
                let mut samples = Vec::new();
                while !stop.load(Ordering::SeqCst) {
                    let kb = pids.iter().map(|&p| vm_rss_kb(p).unwrap_or(0)).collect();
                    samples.push((started.elapsed(), kb));
                    std::thread::sleep(every);
                }
                samples
            })
        };
        Self { stop, thread }
    }

    pub fn finish(self) -> Samples {
        self.stop.store(true, Ordering::SeqCst);
        self.thread.join().expect("RSS sampler")
    }
}

#[derive(Debug)]
pub struct Memory {
    /// Median of the first three samples after the warm-up.
    pub warm_kb: u64,
    /// Median of the last three samples.
    pub end_kb: u64,
}

/// Growth allowed from the warm-up to the end: 25% plus 8 MiB (allocator and connection
/// churn under faults move RSS by a few MiB; a leak of one allocation per request — hundreds
/// of thousands of requests — does not fit in it).
const TOLERANCE_PERCENT: u64 = 25;
const TOLERANCE_KB: u64 = 8 * 1024;

impl Memory {
    pub fn is_flat(&self) -> bool {
        self.warm_kb > 0
            && self.end_kb <= self.warm_kb + self.warm_kb * TOLERANCE_PERCENT / 100 + TOLERANCE_KB
    }

    pub fn growth_percent(&self) -> f64 {
        (self.end_kb as f64 - self.warm_kb as f64) * 100.0 / self.warm_kb.max(1) as f64
    }
}

pub fn flat(samples: &Samples, warm_up: Duration) -> Vec<Memory> {
    let servers = samples.first().map_or(0, |(_, kb)| kb.len());
    let after: Vec<&Vec<u64>> = samples
        .iter()
        .filter(|(t, _)| *t >= warm_up)
        .map(|(_, kb)| kb)
        .collect();
    let median = |rows: &[&Vec<u64>], i: usize| {
        let mut v: Vec<u64> = rows.iter().map(|r| r[i]).collect();
        v.sort_unstable();
        v.get(v.len() / 2).copied().unwrap_or(0)
    };
    (0..servers)
        .map(|i| Memory {
            warm_kb: median(&after[..after.len().min(3)], i),
            end_kb: median(&after[after.len().saturating_sub(3)..], i),
        })
        .collect()
}
