//! Steady request load against an edgelimit server, recorded per request, and the checks the
//! fault tests make on it: inside a fault window nothing is OK, nothing misses its deadline.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use tonic::transport::Channel;

use super::server::{OK, OVER_LIMIT};

#[derive(Debug, Clone)]
pub struct Sample {
    pub sent: Instant,
    pub done: Instant,
    /// `overall_code`, or the gRPC status code of a failed call.
    pub result: Result<i32, tonic::Code>,
}

pub struct Load {
    stop: Arc<AtomicBool>,
    workers: Vec<tokio::task::JoinHandle<Vec<Sample>>>,
}

/// Most requests one worker sends (bounds every test).
const MAX_PER_WORKER: usize = 20_000;

/// One call with `timeout` as the gRPC deadline (sent as `grpc-timeout`).
pub async fn call_with_timeout(
    client: &mut RateLimitServiceClient<Channel>,
    req: RateLimitRequest,
    timeout: Duration,
) -> Result<i32, tonic::Code> {
    let mut r = tonic::Request::new(req);
    r.set_timeout(timeout);
    client
        .should_rate_limit(r)
        .await
        .map(|r| r.into_inner().overall_code)
        .map_err(|s| s.code())
}

impl Load {
    /// `workers` loops sending `req`, each waiting `pause` between its calls.
    pub fn start(
        client: RateLimitServiceClient<Channel>,
        req: RateLimitRequest,
        workers: usize,
        timeout: Duration,
        pause: Duration,
    ) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let workers = (0..workers)
            .map(|_| {
                let (mut client, req, stop) = (client.clone(), req.clone(), stop.clone());
                tokio::spawn(async move {
                    let mut samples = Vec::new();
                    while !stop.load(Ordering::SeqCst) && samples.len() < MAX_PER_WORKER {
                        let sent = Instant::now();
                        let result = call_with_timeout(&mut client, req.clone(), timeout).await;
                        samples.push(Sample {
                            sent,
                            done: Instant::now(),
                            result,
                        });
                        tokio::time::sleep(pause).await;
                    }
                    samples
                })
            })
            .collect();
        Self { stop, workers }
    }

    pub async fn finish(self) -> Vec<Sample> {
        self.stop.store(true, Ordering::SeqCst);
        let mut all = Vec::new();
        for w in self.workers {
            all.extend(w.await.expect("load worker"));
        }
        all.sort_by_key(|s| s.sent);
        all
    }
}

/// Every request sent at or after `start` and answered before `end` was refused: OVER_LIMIT,
/// or gRPC UNAVAILABLE when `grpc_unavailable`. Returns how many there were (must be > 0).
pub fn assert_fail_closed_in(
    samples: &[Sample],
    start: Instant,
    end: Instant,
    grpc_unavailable: bool,
    what: &str,
) -> usize {
    let inside: Vec<&Sample> = samples
        .iter()
        .filter(|s| s.sent >= start && s.done < end)
        .collect();
    let expected = if grpc_unavailable {
        Err(tonic::Code::Unavailable)
    } else {
        Ok(OVER_LIMIT)
    };
    for s in &inside {
        assert_eq!(
            s.result,
            expected,
            "{what}: answer {:?} {:?} after the fault began",
            s.result,
            s.sent - start
        );
    }
    assert!(
        !inside.is_empty(),
        "{what}: no request inside the fault window"
    );
    inside.len()
}

/// No call ended in a deadline miss or cancellation: every answer beat the caller deadline.
pub fn assert_all_answered_in_time(samples: &[Sample], what: &str) {
    for s in samples {
        assert!(
            !matches!(
                s.result,
                Err(tonic::Code::DeadlineExceeded) | Err(tonic::Code::Cancelled)
            ),
            "{what}: {:?} after {:?}",
            s.result,
            s.done - s.sent
        );
    }
}

pub fn oks(samples: &[Sample]) -> u64 {
    samples.iter().filter(|s| s.result == Ok(OK)).count() as u64
}

/// Calls until OK, at most `bound`; returns how long it took.
pub async fn recovers(
    client: &mut RateLimitServiceClient<Channel>,
    req: &RateLimitRequest,
    timeout: Duration,
    bound: Duration,
) -> Duration {
    let started = Instant::now();
    loop {
        let r = call_with_timeout(client, req.clone(), timeout).await;
        if r == Ok(OK) {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < bound,
            "no OK within {bound:?} after the fault ended; last {r:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
