//! The mixed load: workers send random requests to random servers until told to stop, and
//! record each answer with its send and answer times on the wall clock (the clock Redis's
//! `TIME` reads on this machine, so each decision happened between the two).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use tonic::transport::Channel;

use super::rng::Rng;
use super::workload::{random_shape, to_request, Shape};
use crate::common::fault_load::call_with_timeout;

/// Microseconds since the Unix epoch.
pub fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

#[derive(Debug, Clone)]
pub struct Sample {
    pub sent_us: u64,
    pub done_us: u64,
    pub server: usize,
    pub shape: Shape,
    /// `overall_code`, or the gRPC status code of a failed call.
    pub result: Result<i32, tonic::Code>,
}

/// The caller's deadline (`grpc-timeout`): above the servers' command timeout, so answers are
/// the servers' decisions, not the caller giving up.
pub const CALLER_TIMEOUT: Duration = Duration::from_secs(1);
/// Bounds the memory of a long run.
const MAX_PER_WORKER: usize = 1_000_000;

pub struct Load {
    stop: Arc<AtomicBool>,
    workers: Vec<tokio::task::JoinHandle<Vec<Sample>>>,
}

impl Load {
    pub fn start(
        clients: Vec<RateLimitServiceClient<Channel>>,
        workers: usize,
        pause: Duration,
        seed: u64,
    ) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let workers = (0..workers)
            .map(|w| {
                let (mut clients, stop) = (clients.clone(), stop.clone());
                let mut rng = Rng::new(seed ^ (0xA5A5_0000 + w as u64));
                tokio::spawn(async move {
                    let mut samples = Vec::new();
                    while !stop.load(Ordering::SeqCst) && samples.len() < MAX_PER_WORKER {
                        let server = rng.below(clients.len() as u64) as usize;
                        let shape = random_shape(&mut rng);
                        let req = to_request(&shape, &mut rng);
                        let sent_us = now_us();
                        let result =
                            call_with_timeout(&mut clients[server], req, CALLER_TIMEOUT).await;
                        samples.push(Sample {
                            sent_us,
                            done_us: now_us(),
                            server,
                            shape,
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
        all.sort_by_key(|s| s.sent_us);
        all
    }
}
