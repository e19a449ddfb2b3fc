//! `edgelimit-load`: a bounded load generator for edgelimit's `ShouldRateLimit`.
//!
//! Drives the RLS over HTTP/2 (tonic) from `--concurrency` workers sharing `--connections`
//! channels, for `--duration` after a `--warmup` (and at most `--requests` calls), then prints
//! requests/s, OK / OVER_LIMIT / error counts and latency percentiles (exact: every sample is
//! kept and sorted). Without `--rate` the load is closed-loop (each worker sends its next
//! request when the previous one is answered); with `--rate` each worker sends on a fixed
//! schedule; a request that is due while its worker still waits for an answer is timed from
//! its *scheduled* send time, so a server that falls behind shows its queueing delay (no
//! coordinated omission), while one sent on time is timed from when it was sent.
//!
//! Scenarios:
//! - `hot`: every request carries one descriptor with the same value (one subject);
//! - `distinct`: one descriptor per request, values cycling over `--subjects` subjects;
//! - `multi`: `--descriptors` descriptors per request, each a distinct subject, keys taken
//!   from `--keys` in turn.
//!
//! With `--in-process` no server is involved: the workers call `RateLimiter::decide` of an
//! embedded (memory) backend built from `--policy-dir`, measuring decisions/s of the whole
//! request path minus gRPC. Its workers never wait, so use as many as `--threads`.
//!
//! Only loopback targets are accepted: this tool is for benchmarking a server you run here.
//! The last line is machine-readable (`RESULT key=value ...`) for `bench/run.sh`.
#![forbid(unsafe_code)]

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use clap::{Parser, ValueEnum};
use edgelimit::envoy::{RateLimiter, ServiceSettings};
use edgelimit::memory::{MemoryBackend, MemoryConfig};
use edgelimit::policy::{LoadOptions, PolicySet};
use edgelimit::subject::SubjectHasher;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use tonic::transport::{Channel, Endpoint};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Scenario {
    /// One subject for every request.
    Hot,
    /// One descriptor per request, a different subject each time (cycling over --subjects).
    Distinct,
    /// Several descriptors per request (--descriptors), each a distinct subject.
    Multi,
}

#[derive(Debug, Parser)]
#[command(
    name = "edgelimit-load",
    about = "Bounded ShouldRateLimit load generator (loopback targets only)"
)]
struct Args {
    /// Server address (host:port); must resolve to loopback addresses only.
    #[arg(long, default_value = "127.0.0.1:8081")]
    addr: String,
    /// Requests in flight at once (one worker task each).
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    /// Measured duration, after the warm-up (e.g. 10s, 500ms, 1m).
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    duration: Duration,
    /// Unmeasured warm-up before the measured duration.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    warmup: Duration,
    /// Stop after this many requests in total (warm-up included), even before --duration.
    #[arg(long)]
    requests: Option<u64>,
    #[arg(long, value_enum, default_value_t = Scenario::Hot)]
    scenario: Scenario,
    /// RateLimitRequest.domain.
    #[arg(long, default_value = "bench")]
    domain: String,
    /// Descriptor entry keys, comma-separated; descriptor i uses key i mod len.
    #[arg(long, value_delimiter = ',', default_value = "client")]
    keys: Vec<String>,
    /// Descriptors per request in the `multi` scenario.
    #[arg(long, default_value_t = 3)]
    descriptors: usize,
    /// Distinct subjects the `distinct` and `multi` scenarios cycle over.
    #[arg(long, default_value_t = 1_000_000)]
    subjects: u64,
    /// HTTP/2 connections (tonic channels) the workers share, round-robin.
    #[arg(long, default_value_t = 1)]
    connections: usize,
    /// Client runtime threads (1 = current-thread runtime; the client shares the CPU with
    /// the server, so keep it small).
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Target total requests/s (paced, open-loop schedule); unset = as fast as answered.
    #[arg(long)]
    rate: Option<f64>,
    /// grpc-timeout sent with each call (Envoy's filter default is 20ms).
    #[arg(long, default_value = "20ms", value_parser = parse_duration)]
    grpc_timeout: Duration,
    /// Label echoed in the RESULT line.
    #[arg(long, default_value = "")]
    label: String,
    /// No server: call the embedded (memory) backend's RateLimiter::decide directly.
    #[arg(long)]
    in_process: bool,
    /// Policy directory for --in-process.
    #[arg(long, default_value = "bench/policies")]
    policy_dir: std::path::PathBuf,
}

fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .ok_or_else(|| format!("{text:?} has no unit (ms, s, m)"))?;
    let (number, unit) = text.split_at(split);
    let value: f64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration"))?;
    let seconds = match unit {
        "ms" => value / 1000.0,
        "s" => value,
        "m" => value * 60.0,
        _ => return Err(format!("{text:?}: unknown unit {unit:?} (ms, s, m)")),
    };
    if !(seconds.is_finite() && (0.0..=3600.0).contains(&seconds)) {
        return Err(format!("{text:?} is outside 0..=1h"));
    }
    Ok(Duration::from_secs_f64(seconds))
}

/// Resolves `addr` and refuses anything that is not loopback.
async fn loopback_target(addr: &str) -> Result<SocketAddr, String> {
    let resolved: Vec<SocketAddr> = tokio::net::lookup_host(addr)
        .await
        .map_err(|e| format!("cannot resolve {addr}: {e}"))?
        .collect();
    if resolved.is_empty() {
        return Err(format!("{addr} resolves to nothing"));
    }
    if let Some(bad) = resolved.iter().find(|a| !a.ip().is_loopback()) {
        return Err(format!(
            "refusing {addr}: it resolves to {bad}, which is not a loopback address \
             (this tool only loads servers on this machine)"
        ));
    }
    Ok(resolved[0])
}

/// Builds requests for a scenario; values are formatted per call (cheap, and the same work
/// Envoy's own client would do).
struct RequestFactory {
    scenario: Scenario,
    domain: String,
    keys: Vec<String>,
    descriptors: usize,
    subjects: u64,
}

impl RequestFactory {
    fn descriptor(key: &str, value: String) -> RateLimitDescriptor {
        RateLimitDescriptor {
            entries: vec![Entry {
                key: key.to_owned(),
                value,
            }],
            ..Default::default()
        }
    }

    fn build(&self, sequence: u64) -> RateLimitRequest {
        let descriptors = match self.scenario {
            Scenario::Hot => vec![Self::descriptor(&self.keys[0], "hot".to_owned())],
            Scenario::Distinct => vec![Self::descriptor(
                &self.keys[0],
                format!("s{}", sequence % self.subjects),
            )],
            Scenario::Multi => (0..self.descriptors)
                .map(|i| {
                    let key = &self.keys[i % self.keys.len()];
                    let subject = (sequence * self.descriptors as u64 + i as u64) % self.subjects;
                    Self::descriptor(key, format!("m{subject}"))
                })
                .collect(),
        };
        RateLimitRequest {
            domain: self.domain.clone(),
            descriptors,
            hits_addend: 0,
        }
    }
}

/// Where calls go: a server over gRPC, or the request path in this process.
#[derive(Clone)]
enum Target {
    Grpc(RateLimitServiceClient<Channel>),
    InProcess(Arc<RateLimiter<MemoryBackend>>),
}

impl Target {
    /// The response's overall code, or the error.
    async fn call(&mut self, request: RateLimitRequest, timeout: Duration) -> Result<i32, String> {
        match self {
            Target::Grpc(client) => {
                let mut request = tonic::Request::new(request);
                request.set_timeout(timeout);
                client
                    .should_rate_limit(request)
                    .await
                    .map(|r| r.get_ref().overall_code)
                    .map_err(|s| format!("{:?}: {}", s.code(), s.message()))
            }
            Target::InProcess(limiter) => limiter
                .decide(&request, Instant::now() + timeout)
                .await
                .map(|r| r.overall_code)
                .map_err(|s| format!("{:?}: {}", s.code(), s.message())),
        }
    }
}

#[derive(Default)]
struct Tally {
    ok: u64,
    over_limit: u64,
    other_code: u64,
    errors: u64,
    /// Every answered call, warm-up included (for CPU-per-request accounting).
    answered: u64,
    first_error: Option<String>,
    /// Latency of every measured call, nanoseconds.
    latencies: Vec<u64>,
}

impl Tally {
    fn merge(&mut self, other: Tally) {
        self.ok += other.ok;
        self.over_limit += other.over_limit;
        self.other_code += other.other_code;
        self.errors += other.errors;
        self.answered += other.answered;
        if self.first_error.is_none() {
            self.first_error = other.first_error;
        }
        self.latencies.extend(other.latencies);
    }

    fn total(&self) -> u64 {
        self.ok + self.over_limit + self.other_code + self.errors
    }
}

struct Plan {
    measure_from: Instant,
    end: Instant,
    /// Per-worker send interval when paced.
    interval: Option<Duration>,
    max_requests: Option<u64>,
    grpc_timeout: Duration,
}

const OK: i32 = 1;
const OVER_LIMIT: i32 = 2;

async fn worker(
    index: usize,
    mut target: Target,
    factory: Arc<RequestFactory>,
    plan: Arc<Plan>,
    issued: Arc<AtomicU64>,
    concurrency: usize,
) -> Tally {
    let mut tally = Tally::default();
    let start = Instant::now();
    // Stagger paced workers evenly over one interval.
    let mut next = plan
        .interval
        .map(|i| start + i.mul_f64(index as f64 / concurrency as f64));
    loop {
        let sequence = issued.fetch_add(1, Ordering::Relaxed);
        if plan.max_requests.is_some_and(|max| sequence >= max) {
            break;
        }
        let intended = match (&mut next, plan.interval) {
            (Some(at), Some(interval)) => {
                let scheduled = *at;
                *at += interval;
                if scheduled >= plan.end {
                    break;
                }
                if scheduled > Instant::now() {
                    // On time: the clock starts when the timer fires (tokio timers are
                    // millisecond-grained; their lateness is the client's, not the server's).
                    tokio::time::sleep_until(scheduled.into()).await;
                    Instant::now()
                } else {
                    // Behind schedule because answers came late: count from the schedule.
                    scheduled
                }
            }
            _ => Instant::now(),
        };
        if intended >= plan.end {
            break;
        }
        let result = target
            .call(factory.build(sequence), plan.grpc_timeout)
            .await;
        let done = Instant::now();
        tally.answered += 1;
        if intended < plan.measure_from {
            continue;
        }
        tally
            .latencies
            .push(u64::try_from((done - intended).as_nanos()).unwrap_or(u64::MAX));
        match result {
            Ok(OK) => tally.ok += 1,
            Ok(OVER_LIMIT) => tally.over_limit += 1,
            Ok(_) => tally.other_code += 1,
            Err(error) => {
                tally.errors += 1;
                if tally.first_error.is_none() {
                    tally.first_error = Some(error);
                }
            }
        }
    }
    tally
}

fn percentile(sorted: &[u64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1] as f64 / 1e6
}

async fn run(args: Args) -> Result<(), String> {
    if args.concurrency == 0 || args.connections == 0 || args.keys.is_empty() {
        return Err("--concurrency, --connections and --keys must be non-empty".into());
    }
    if args.subjects == 0 || args.descriptors == 0 {
        return Err("--subjects and --descriptors must be at least 1".into());
    }
    let (targets, target_name) = if args.in_process {
        let policies = PolicySet::load_dir(&args.policy_dir, &LoadOptions::default())
            .map_err(|e| format!("{}:\n{e}", args.policy_dir.display()))?;
        // A fixed secret: this is a benchmark, nothing it digests is real.
        let hasher = SubjectHasher::new(zeroize::Zeroizing::new(vec![0x42; 48]))
            .map_err(|e| e.to_string())?;
        let limiter = RateLimiter::new(
            Arc::new(ArcSwap::from_pointee(policies)),
            Arc::new(MemoryBackend::new(MemoryConfig::default())),
            Arc::new(hasher),
            ServiceSettings::default(),
        );
        (
            vec![Target::InProcess(Arc::new(limiter))],
            format!("in-process memory backend ({})", args.policy_dir.display()),
        )
    } else {
        let target = loopback_target(&args.addr).await?;
        let mut targets = Vec::with_capacity(args.connections);
        for _ in 0..args.connections {
            // Each `connect` opens its own HTTP/2 connection.
            let channel = Endpoint::from_shared(format!("http://{target}"))
                .map_err(|e| e.to_string())?
                .tcp_nodelay(true)
                .connect_timeout(Duration::from_secs(2))
                .connect()
                .await
                .map_err(|e| format!("cannot connect to {target}: {e}"))?;
            targets.push(Target::Grpc(RateLimitServiceClient::new(channel)));
        }
        (targets, target.to_string())
    };
    let factory = Arc::new(RequestFactory {
        scenario: args.scenario,
        domain: args.domain.clone(),
        keys: args.keys.clone(),
        descriptors: if args.scenario == Scenario::Multi {
            args.descriptors
        } else {
            1
        },
        subjects: args.subjects,
    });
    let interval = match args.rate {
        Some(rate) if rate > 0.0 && rate.is_finite() => {
            Some(Duration::from_secs_f64(args.concurrency as f64 / rate))
        }
        Some(_) => return Err("--rate must be a positive number".into()),
        None => None,
    };
    let started = Instant::now();
    let measure_from = started + args.warmup;
    let plan = Arc::new(Plan {
        measure_from,
        end: measure_from + args.duration,
        interval,
        max_requests: args.requests,
        grpc_timeout: args.grpc_timeout,
    });
    let issued = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..args.concurrency)
        .map(|i| {
            tokio::spawn(worker(
                i,
                targets[i % targets.len()].clone(),
                factory.clone(),
                plan.clone(),
                issued.clone(),
                args.concurrency,
            ))
        })
        .collect();
    let mut tally = Tally::default();
    for task in tasks {
        tally.merge(task.await.map_err(|e| format!("worker failed: {e}"))?);
    }
    let finished = Instant::now();
    // Measured window: from the end of the warm-up to the planned end (or the last answer,
    // when --requests stopped the run early).
    let window = finished
        .min(plan.end)
        .saturating_duration_since(measure_from)
        .as_secs_f64()
        .max(1e-9);
    tally.latencies.sort_unstable();
    let n = tally.total();
    let rps = n as f64 / window;
    let lat = &tally.latencies;
    let (p50, p99, p999) = (
        percentile(lat, 0.50),
        percentile(lat, 0.99),
        percentile(lat, 0.999),
    );
    let max = lat.last().map_or(f64::NAN, |m| *m as f64 / 1e6);
    println!(
        "edgelimit-load: scenario={:?} target={target_name} concurrency={} connections={} threads={} rate={}",
        args.scenario,
        args.concurrency,
        args.connections,
        args.threads,
        args.rate.map_or("max".to_string(), |r| format!("{r:.0}/s"))
    );
    println!(
        "requests/s: {rps:.0} ({n} requests in {window:.2} s, after {:?} warm-up)",
        args.warmup
    );
    println!(
        "ok: {}  over_limit: {}  other_code: {}  errors: {}",
        tally.ok, tally.over_limit, tally.other_code, tally.errors
    );
    if let Some(e) = &tally.first_error {
        println!("first error: {e}");
    }
    println!("latency ms: p50 {p50:.3}  p99 {p99:.3}  p999 {p999:.3}  max {max:.3}");
    println!(
        "RESULT label={} scenario={:?} rps={rps:.0} requests={n} ok={} over_limit={} other_code={} errors={} p50_ms={p50:.3} p99_ms={p99:.3} p999_ms={p999:.3} max_ms={max:.3} answered={}",
        if args.label.is_empty() { "-" } else { &args.label },
        args.scenario,
        tally.ok,
        tally.over_limit,
        tally.other_code,
        tally.errors,
        tally.answered
    );
    Ok(())
}

fn main() -> ExitCode {
    let args = Args::parse();
    let runtime = if args.threads <= 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(args.threads)
            .enable_all()
            .build()
    };
    let runtime = match runtime {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert!(parse_duration("10").is_err());
        assert!(parse_duration("2h").is_err());
        assert!(parse_duration("61m").is_err());
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let samples: Vec<u64> = (1..=1000).map(|n| n * 1_000_000).collect();
        assert_eq!(percentile(&samples, 0.5), 500.0);
        assert_eq!(percentile(&samples, 0.99), 990.0);
        assert_eq!(percentile(&samples, 0.999), 999.0);
        assert_eq!(percentile(&samples[..1], 0.999), 1.0);
        assert!(percentile(&[], 0.5).is_nan());
    }

    #[tokio::test]
    async fn only_loopback_targets() {
        assert!(loopback_target("127.0.0.1:1").await.is_ok());
        assert!(loopback_target("[::1]:1").await.is_ok());
        assert!(loopback_target("192.0.2.1:8081").await.is_err());
        assert!(loopback_target("10.0.0.1:8081").await.is_err());
    }
}
