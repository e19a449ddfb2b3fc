//! The fault driver: on its own thread, at random (seeded) moments, one fault at a time, each
//! recorded with when it held on the wall clock and which servers it cut off from Redis.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::load::now_us;
use super::rng::Rng;
use super::workload::{policy, POLICY_FILE};
use crate::common::redis_server::RedisServer;
use crate::common::server::EdgelimitServer;
use crate::common::tcp_proxy::{Mode, TcpProxy};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    /// SIGSTOP, then SIGCONT.
    Pause,
    /// SIGKILL, then a restart on the same port that replays the AOF: counters kept.
    KillRestartAof,
    /// SIGKILL, then a restart with the AOF deleted: every counter lost (the documented loss).
    KillRestartEmpty,
    /// `SCRIPT FLUSH`: every connection's loaded programs are gone.
    ScriptFlush,
    /// The proxy resets every connection and refuses new ones.
    ProxyRefuse,
    /// The proxy forwards the next bytes, then closes the connection (replies lost).
    ProxyDropAfterWrite,
    /// The proxy swallows bytes both ways.
    ProxyBlackhole,
    /// The policy file rewritten (same limits) in a server's watched directory.
    ReloadFile,
    /// SIGHUP to a server.
    ReloadSignal,
}

#[derive(Debug, Clone)]
pub struct Fault {
    pub kind: Kind,
    pub start_us: u64,
    pub end_us: u64,
    /// The servers that cannot reach Redis from `start_us` to `end_us`.
    pub cut_off: Vec<usize>,
}

pub struct Chaos {
    pub redis: RedisServer,
    pub proxy: Arc<TcpProxy>,
    pub servers: Arc<Vec<EdgelimitServer>>,
    /// The servers connected through the proxy.
    pub proxied: Vec<usize>,
    pub rng: Rng,
}

impl Chaos {
    /// Injects faults until `until`; returns Redis (to read its final state) and the record.
    pub fn run(mut self, until: Instant) -> (RedisServer, Vec<Fault>) {
        let mut faults = Vec::new();
        let mut generation = 1;
        let all: Vec<usize> = (0..self.servers.len()).collect();
        loop {
            let gap = self.rng.millis(800, 3000);
            if Instant::now() + gap >= until {
                break;
            }
            std::thread::sleep(gap);
            let kind = match self.rng.below(11) {
                0 | 1 => Kind::Pause,
                2 => Kind::KillRestartAof,
                3 => Kind::KillRestartEmpty,
                4 => Kind::ScriptFlush,
                5 => Kind::ProxyRefuse,
                6 => Kind::ProxyDropAfterWrite,
                7 => Kind::ProxyBlackhole,
                8 | 9 => Kind::ReloadFile,
                _ => Kind::ReloadSignal,
            };
            let outage = self.rng.millis(300, 1500);
            let fault = match kind {
                Kind::Pause => {
                    self.redis.pause();
                    self.hold(kind, outage, all.clone(), |c| c.redis.resume())
                }
                Kind::KillRestartAof | Kind::KillRestartEmpty => {
                    self.redis.stop();
                    self.hold(kind, outage, all.clone(), |c| {
                        if kind == Kind::KillRestartAof {
                            c.redis.restart();
                        } else {
                            c.redis.restart_empty();
                        }
                    })
                }
                Kind::ProxyRefuse | Kind::ProxyDropAfterWrite | Kind::ProxyBlackhole => {
                    self.proxy.set_mode(match kind {
                        Kind::ProxyRefuse => Mode::Refuse,
                        Kind::ProxyDropAfterWrite => Mode::DropAfterWrite,
                        _ => Mode::Blackhole,
                    });
                    let cut_off = self.proxied.clone();
                    self.hold(kind, outage, cut_off, |c| {
                        c.proxy.set_mode(Mode::PassThrough)
                    })
                }
                Kind::ScriptFlush => {
                    let reply = self.redis.cli(&["SCRIPT", "FLUSH"]);
                    assert!(reply.contains("OK"), "SCRIPT FLUSH: {reply}");
                    self.instant(kind)
                }
                Kind::ReloadFile => {
                    let server = self.rng.below(self.servers.len() as u64) as usize;
                    generation += 1;
                    self.servers[server].write_policy(POLICY_FILE, &policy(generation));
                    self.instant(kind)
                }
                Kind::ReloadSignal => {
                    let server = self.rng.below(self.servers.len() as u64) as usize;
                    self.servers[server].signal("-HUP");
                    self.instant(kind)
                }
            };
            faults.push(fault);
        }
        (self.redis, faults)
    }

    /// The fault has just begun: holds it for `outage`, dates it, then ends it.
    fn hold(
        &mut self,
        kind: Kind,
        outage: Duration,
        cut_off: Vec<usize>,
        end: impl FnOnce(&mut Self),
    ) -> Fault {
        let start_us = now_us();
        std::thread::sleep(outage);
        let end_us = now_us();
        end(self);
        Fault {
            kind,
            start_us,
            end_us,
            cut_off,
        }
    }

    fn instant(&self, kind: Kind) -> Fault {
        let at = now_us();
        Fault {
            kind,
            start_us: at,
            end_us: at,
            cut_off: Vec::new(),
        }
    }
}

pub fn count_by_kind(faults: &[Fault]) -> BTreeMap<Kind, usize> {
    let mut counts = BTreeMap::new();
    for f in faults {
        *counts.entry(f.kind).or_insert(0) += 1;
    }
    counts
}
