//! `edgelimit top --admin ADDR`: a terminal view of a running server, refreshed from its
//! admin endpoint (`/metrics`, `/readyz`). It shows what the metrics show — policies,
//! results, failure categories, latency — so it never sees a descriptor value or a subject.
//! Rates are the difference of two scrapes over the time between them.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

/// Policies shown at most: the busiest first, the rest summed on one line.
pub const DEFAULT_ROWS: usize = 20;
/// Largest admin answer read: `/metrics` grows with policies, bounded by their count.
const MAX_BODY: u64 = 16 * 1024 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum TopError {
    #[error("admin endpoint {addr}: {source}")]
    Io {
        addr: String,
        source: std::io::Error,
    },
    #[error("admin endpoint {addr}{path}: {message}")]
    Http {
        addr: String,
        path: &'static str,
        message: String,
    },
}

/// One sample: its labels and value.
type Sample = (BTreeMap<String, String>, f64);

/// One scrape: every sample by name, with its labels.
#[derive(Debug, Default, Clone)]
pub struct Snapshot {
    samples: BTreeMap<String, Vec<Sample>>,
}

impl Snapshot {
    /// Parses the Prometheus text format; lines it cannot read are skipped.
    pub fn parse(text: &str) -> Self {
        let mut snapshot = Self::default();
        for line in text.lines() {
            if line.starts_with('#') || line.trim().is_empty() {
                continue;
            }
            if let Some((name, labels, value)) = parse_sample(line) {
                snapshot
                    .samples
                    .entry(name)
                    .or_default()
                    .push((labels, value));
            }
        }
        snapshot
    }

    fn series(&self, name: &str) -> &[Sample] {
        self.samples.get(name).map_or(&[], Vec::as_slice)
    }

    /// Sum of `name` grouped by the values of `labels`.
    fn by(&self, name: &str, labels: &[&str]) -> BTreeMap<Vec<String>, f64> {
        let mut out = BTreeMap::new();
        for (series, value) in self.series(name) {
            let key = labels
                .iter()
                .map(|l| series.get(*l).cloned().unwrap_or_default())
                .collect();
            *out.entry(key).or_insert(0.0) += value;
        }
        out
    }

    fn total(&self, name: &str) -> Option<f64> {
        let series = self.series(name);
        (!series.is_empty()).then(|| series.iter().map(|(_, v)| v).sum())
    }

    /// Cumulative bucket counts of histogram `name`, summed over its other labels.
    fn buckets(&self, name: &str) -> Vec<(f64, f64)> {
        let mut out: Vec<(f64, f64)> = Vec::new();
        for (series, value) in self.series(&format!("{name}_bucket")) {
            let le = match series.get("le").map(String::as_str) {
                Some("+Inf") => f64::INFINITY,
                Some(le) => match le.parse() {
                    Ok(le) => le,
                    Err(_) => continue,
                },
                None => continue,
            };
            match out.iter_mut().find(|(b, _)| *b == le) {
                Some((_, count)) => *count += value,
                None => out.push((le, *value)),
            }
        }
        out.sort_by(|a, b| a.0.total_cmp(&b.0));
        out
    }
}

/// `name{a="x",b="y"} value` (a timestamp after the value is ignored).
fn parse_sample(line: &str) -> Option<(String, BTreeMap<String, String>, f64)> {
    let mut labels = BTreeMap::new();
    let (name, rest) = match line.find(['{', ' ']) {
        Some(i) if line.as_bytes()[i] == b'{' => {
            let mut chars = line[i + 1..].char_indices();
            let end = loop {
                // Label name up to `=`, then a quoted value with `\\`, `\"`, `\n` escapes.
                let mut key = String::new();
                let mut closed = false;
                for (_, c) in chars.by_ref() {
                    match c {
                        '=' => break,
                        '}' => {
                            closed = true;
                            break;
                        }
                        ',' | ' ' => {}
                        c => key.push(c),
                    }
                }
                if closed {
                    break chars.next().map_or(line.len(), |(j, _)| i + 1 + j);
                }
                if chars.next().map(|(_, c)| c) != Some('"') {
                    return None;
                }
                let mut value = String::new();
                loop {
                    match chars.next()?.1 {
                        '"' => break,
                        '\\' => match chars.next()?.1 {
                            'n' => value.push('\n'),
                            c => value.push(c),
                        },
                        c => value.push(c),
                    }
                }
                labels.insert(key, value);
            };
            (&line[..i], &line[end..])
        }
        Some(i) => (&line[..i], &line[i..]),
        None => return None,
    };
    let value = rest.split_whitespace().next()?;
    let value = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse().ok()?,
    };
    Some((name.to_owned(), labels, value))
}

/// The `q` quantile of the observations between two cumulative bucket lists, interpolated
/// linearly inside a bucket as Prometheus' `histogram_quantile` does. `None` without
/// observations; the largest finite bound when it falls in the `+Inf` bucket.
pub fn quantile(q: f64, before: &[(f64, f64)], after: &[(f64, f64)]) -> Option<f64> {
    let delta: Vec<(f64, f64)> = after
        .iter()
        .map(|(le, count)| {
            let old = before
                .iter()
                .find(|(b, _)| b == le)
                .map_or(0.0, |(_, c)| *c);
            (*le, (count - old).max(0.0))
        })
        .collect();
    let total = delta.last()?.1;
    if total <= 0.0 {
        return None;
    }
    let rank = q * total;
    let mut lower = (0.0, 0.0);
    for &(le, count) in &delta {
        if count >= rank {
            if le.is_infinite() {
                return Some(lower.0);
            }
            let inside = count - lower.1;
            let fraction = if inside > 0.0 {
                (rank - lower.1) / inside
            } else {
                1.0
            };
            return Some(lower.0 + (le - lower.0) * fraction);
        }
        lower = (le, count);
    }
    Some(lower.0)
}

/// One policy's rates (per second) over the interval.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct PolicyRow {
    pub policy: String,
    pub allowed: f64,
    pub denied: f64,
    pub shadow_denied: f64,
    pub failed: f64,
    pub near_limit: f64,
}

impl PolicyRow {
    fn total(&self) -> f64 {
        self.allowed + self.denied + self.shadow_denied + self.failed
    }

    /// Enforced denials (limits and fail-closed) over all evaluations.
    fn denial_ratio(&self) -> Option<f64> {
        let total = self.total();
        (total > 0.0).then(|| (self.denied + self.failed) / total)
    }
}

/// What one refresh shows.
#[derive(Debug, Default, Clone)]
pub struct Frame {
    pub ready: String,
    pub seconds: f64,
    pub requests: Option<f64>,
    pub grpc_p50: Option<f64>,
    pub grpc_p99: Option<f64>,
    pub redis_p99: Option<f64>,
    pub redis_connections: Option<f64>,
    pub redis_in_flight: Option<f64>,
    pub memory_subjects: Option<f64>,
    pub deny_cache_hits: Option<f64>,
    pub revision: Option<f64>,
    pub rules: Option<f64>,
    pub reload_failures: f64,
    /// `(category/cause, per second)`, only those that moved.
    pub failures: Vec<(String, f64)>,
    pub policies: Vec<PolicyRow>,
}

fn rate(before: Option<f64>, after: Option<f64>, seconds: f64) -> Option<f64> {
    // A counter that went down was reset (a restart): count from zero.
    let after = after?;
    let before = before.unwrap_or(0.0);
    let delta = if after >= before {
        after - before
    } else {
        after
    };
    Some(delta / seconds)
}

impl Frame {
    /// Rates between `before` and `after` (taken `seconds` apart); without `before`, the
    /// totals since the server started stand in, divided by nothing (`seconds` = 0 shows
    /// none).
    pub fn between(
        before: Option<&Snapshot>,
        after: &Snapshot,
        seconds: f64,
        ready: String,
    ) -> Frame {
        let empty = Snapshot::default();
        let prev = before.unwrap_or(&empty);
        let seconds = seconds.max(f64::EPSILON);
        let has_rates = before.is_some();
        let per_second = |name: &str| {
            has_rates
                .then(|| rate(prev.total(name), after.total(name), seconds))
                .flatten()
        };
        let mut frame = Frame {
            ready,
            seconds,
            requests: per_second("edgelimit_grpc_request_seconds_count"),
            redis_connections: after.total(edgelimit_metrics::REDIS_LIVE_CONNECTIONS),
            redis_in_flight: after.total(edgelimit_metrics::REDIS_IN_FLIGHT),
            memory_subjects: after.total(edgelimit_metrics::MEMORY_SUBJECTS),
            deny_cache_hits: per_second(edgelimit_metrics::DENY_CACHE_HITS),
            revision: after.total(edgelimit_metrics::CONFIG_REVISION),
            rules: after.total(edgelimit_metrics::CONFIG_RULES),
            ..Frame::default()
        };
        frame.reload_failures = after
            .by(edgelimit_metrics::CONFIG_RELOADS, &["result"])
            .get(&vec!["failure".to_owned()])
            .copied()
            .unwrap_or(0.0);
        if has_rates {
            let grpc = edgelimit_metrics::GRPC_REQUEST_SECONDS;
            frame.grpc_p50 = quantile(0.5, &prev.buckets(grpc), &after.buckets(grpc));
            frame.grpc_p99 = quantile(0.99, &prev.buckets(grpc), &after.buckets(grpc));
            let redis = edgelimit_metrics::REDIS_COMMAND_SECONDS;
            frame.redis_p99 = quantile(0.99, &prev.buckets(redis), &after.buckets(redis));
        }
        let failures = edgelimit_metrics::BACKEND_FAILURES;
        let old = prev.by(failures, &["category", "cause"]);
        for (key, value) in after.by(failures, &["category", "cause"]) {
            let r = if has_rates {
                rate(old.get(&key).copied(), Some(value), seconds).unwrap_or(0.0)
            } else {
                0.0
            };
            if r > 0.0 {
                frame.failures.push((key.join("/"), r));
            }
        }
        let decisions = edgelimit_metrics::DECISIONS;
        let old = prev.by(decisions, &["policy", "result"]);
        let near_old = prev.by(edgelimit_metrics::NEAR_LIMIT, &["policy"]);
        let near = after.by(edgelimit_metrics::NEAR_LIMIT, &["policy"]);
        let mut rows: BTreeMap<String, PolicyRow> = BTreeMap::new();
        for (key, value) in after.by(decisions, &["policy", "result"]) {
            let (policy, result) = (&key[0], key[1].as_str());
            let row = rows.entry(policy.clone()).or_insert_with(|| PolicyRow {
                policy: policy.clone(),
                ..PolicyRow::default()
            });
            let r = if has_rates {
                rate(old.get(&key).copied(), Some(value), seconds).unwrap_or(0.0)
            } else {
                0.0
            };
            match result {
                "allowed" => row.allowed += r,
                "denied" => row.denied += r,
                "shadow_denied" | "shadow_failed" => row.shadow_denied += r,
                _ => row.failed += r,
            }
        }
        for row in rows.values_mut() {
            let key = vec![row.policy.clone()];
            if has_rates {
                row.near_limit = rate(
                    near_old.get(&key).copied(),
                    near.get(&key).copied(),
                    seconds,
                )
                .unwrap_or(0.0);
            }
        }
        frame.policies = rows.into_values().collect();
        // Busiest first; ties by name so the order is stable between refreshes.
        frame.policies.sort_by(|a, b| {
            b.total()
                .total_cmp(&a.total())
                .then_with(|| a.policy.cmp(&b.policy))
        });
        frame
    }

    /// The frame as text, `rows` policies at most.
    pub fn render(&self, addr: &str, rows: usize) -> String {
        let mut out = String::new();
        let opt = |v: Option<f64>, f: &dyn Fn(f64) -> String| v.map_or("-".to_owned(), f);
        let ms = |v: f64| format!("{:.2}ms", v * 1000.0);
        let num = |v: f64| format!("{v:.0}");
        let rps = |v: f64| format!("{v:.1}/s");
        let _ = writeln!(
            out,
            "edgelimit top  {addr}  {}  revision {}  rules {}  every {:.1}s",
            self.ready,
            opt(self.revision, &|v| format!("{:x}", v as u64)),
            opt(self.rules, &num),
            self.seconds
        );
        let _ = writeln!(
            out,
            "requests {}  latency p50 {}  p99 {}  (Envoy's default timeout: 20ms)",
            opt(self.requests, &rps),
            opt(self.grpc_p50, &ms),
            opt(self.grpc_p99, &ms),
        );
        let mut backend = Vec::new();
        if self.redis_connections.is_some() {
            backend.push(format!(
                "redis connections {}  in flight {}  p99 {}  local denials {}",
                opt(self.redis_connections, &num),
                opt(self.redis_in_flight, &num),
                opt(self.redis_p99, &ms),
                opt(self.deny_cache_hits, &rps)
            ));
        }
        if let Some(subjects) = self.memory_subjects {
            backend.push(format!("memory subjects {subjects:.0}"));
        }
        if backend.is_empty() {
            backend.push("no backend figures yet".into());
        }
        let _ = writeln!(out, "backend {}", backend.join("  "));
        if self.failures.is_empty() {
            let _ = writeln!(out, "backend failures none");
        } else {
            let list: Vec<String> = self
                .failures
                .iter()
                .map(|(kind, r)| format!("{kind} {r:.1}/s"))
                .collect();
            let _ = writeln!(out, "backend failures {}", list.join("  "));
        }
        if self.reload_failures > 0.0 {
            let _ = writeln!(
                out,
                "config reloads rejected since start: {:.0} (the previous set keeps serving)",
                self.reload_failures
            );
        }
        let _ = writeln!(out);
        let _ = writeln!(
            out,
            "{:<40} {:>10} {:>10} {:>10} {:>10} {:>8} {:>10}",
            "POLICY", "ALLOWED/s", "DENIED/s", "SHADOW/s", "FAILED/s", "DENIAL", "NEAR/s"
        );
        let line = |out: &mut String, row: &PolicyRow| {
            let ratio = row
                .denial_ratio()
                .map_or("-".to_owned(), |r| format!("{:.1}%", r * 100.0));
            let _ = writeln!(
                out,
                "{:<40} {:>10.1} {:>10.1} {:>10.1} {:>10.1} {:>8} {:>10.1}",
                truncate(&row.policy, 40),
                row.allowed,
                row.denied,
                row.shadow_denied,
                row.failed,
                ratio,
                row.near_limit
            );
        };
        for row in self.policies.iter().take(rows) {
            line(&mut out, row);
        }
        if self.policies.len() > rows {
            let mut rest = PolicyRow {
                policy: format!("({} more)", self.policies.len() - rows),
                ..PolicyRow::default()
            };
            for row in &self.policies[rows..] {
                rest.allowed += row.allowed;
                rest.denied += row.denied;
                rest.shadow_denied += row.shadow_denied;
                rest.failed += row.failed;
                rest.near_limit += row.near_limit;
            }
            line(&mut out, &rest);
        }
        if self.policies.is_empty() {
            let _ = writeln!(out, "(no decisions yet)");
        }
        out
    }
}

fn truncate(s: &str, width: usize) -> String {
    if s.chars().count() <= width {
        s.to_owned()
    } else {
        let mut t: String = s.chars().take(width - 1).collect();
        t.push('~');
        t
    }
}

/// `GET path` over HTTP/1.1 with `Connection: close`: (status, body).
fn get(addr: &str, path: &'static str, timeout: Duration) -> Result<(u16, String), TopError> {
    let io = |source| TopError::Io {
        addr: addr.to_owned(),
        source,
    };
    let http = |message: String| TopError::Http {
        addr: addr.to_owned(),
        path,
        message,
    };
    let target = addr
        .to_socket_addrs()
        .map_err(io)?
        .next()
        .ok_or_else(|| http("the address resolves to nothing".into()))?;
    let mut stream = TcpStream::connect_timeout(&target, timeout).map_err(io)?;
    stream.set_read_timeout(Some(timeout)).map_err(io)?;
    stream.set_write_timeout(Some(timeout)).map_err(io)?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .map_err(io)?;
    let mut raw = Vec::new();
    stream.take(MAX_BODY).read_to_end(&mut raw).map_err(io)?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| http("no HTTP header".into()))?;
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| {
            http(format!(
                "bad status line `{}`",
                head.lines().next().unwrap_or("")
            ))
        })?;
    let chunked = head.lines().any(|l| {
        l.to_ascii_lowercase()
            .replace(' ', "")
            .starts_with("transfer-encoding:chunked")
    });
    let body = if chunked {
        dechunk(body).ok_or_else(|| http("bad chunked body".into()))?
    } else {
        body.to_owned()
    };
    Ok((status, body))
}

fn dechunk(mut body: &str) -> Option<String> {
    let mut out = String::new();
    loop {
        let (size, rest) = body.split_once("\r\n")?;
        let size = usize::from_str_radix(size.split(';').next()?.trim(), 16).ok()?;
        if size == 0 {
            return Some(out);
        }
        out.push_str(rest.get(..size)?);
        body = rest.get(size..)?.strip_prefix("\r\n")?;
    }
}

/// What `top` does: refresh every `interval`, `iterations` times (forever when `None`),
/// writing frames to `out`; on a terminal each frame replaces the last.
pub struct TopOptions {
    pub addr: String,
    pub interval: Duration,
    pub iterations: Option<u64>,
    pub rows: usize,
    pub clear: bool,
}

pub fn run(options: &TopOptions, out: &mut dyn Write) -> Result<(), TopError> {
    let timeout = options
        .interval
        .clamp(Duration::from_millis(500), Duration::from_secs(5));
    let mut previous: Option<(Snapshot, Instant)> = None;
    let mut done = 0u64;
    loop {
        let started = Instant::now();
        let (status, text) = get(&options.addr, "/metrics", timeout)?;
        if status != 200 {
            return Err(TopError::Http {
                addr: options.addr.clone(),
                path: "/metrics",
                message: format!("status {status}"),
            });
        }
        let snapshot = Snapshot::parse(&text);
        let ready = match get(&options.addr, "/readyz", timeout) {
            Ok((200, _)) => "READY".to_owned(),
            Ok((_, body)) => format!("NOT READY ({})", body.trim()),
            Err(e) => format!("readiness unknown ({e})"),
        };
        let frame = match &previous {
            Some((before, at)) => Frame::between(
                Some(before),
                &snapshot,
                started.duration_since(*at).as_secs_f64(),
                ready,
            ),
            None => Frame::between(None, &snapshot, options.interval.as_secs_f64(), ready),
        };
        let mut text = frame.render(&options.addr, options.rows);
        if previous.is_none() {
            text.push_str("(rates from the next refresh)\n");
        }
        let io = |source| TopError::Io {
            addr: "stdout".into(),
            source,
        };
        if options.clear {
            // Home, clear screen: each frame replaces the last.
            out.write_all(b"\x1b[H\x1b[2J").map_err(io)?;
        } else if previous.is_some() {
            out.write_all(b"\n").map_err(io)?;
        }
        out.write_all(text.as_bytes()).map_err(io)?;
        out.flush().map_err(io)?;
        previous = Some((snapshot, started));
        done += 1;
        if options.iterations.is_some_and(|n| done >= n) {
            return Ok(());
        }
        std::thread::sleep(options.interval.saturating_sub(started.elapsed()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BEFORE: &str = r#"# TYPE edgelimit_decisions_total counter
edgelimit_decisions_total{policy="web.a",result="allowed"} 10
edgelimit_decisions_total{policy="web.a",result="denied"} 0
edgelimit_decisions_total{policy="web.b",result="allowed"} 5
edgelimit_near_limit_total{policy="web.a"} 1
edgelimit_backend_failures_total{category="unavailable",cause="connect_failed"} 2
edgelimit_grpc_request_seconds_bucket{le="0.001"} 10
edgelimit_grpc_request_seconds_bucket{le="0.01"} 15
edgelimit_grpc_request_seconds_bucket{le="+Inf"} 15
edgelimit_grpc_request_seconds_count 15
edgelimit_redis_live_connections 2
edgelimit_config_revision 255
"#;

    const AFTER: &str = r#"edgelimit_decisions_total{policy="web.a",result="allowed"} 30
edgelimit_decisions_total{policy="web.a",result="denied"} 20
edgelimit_decisions_total{policy="web.a",result="failed_closed"} 0
edgelimit_decisions_total{policy="web.b",result="allowed"} 7
edgelimit_decisions_total{policy="we\"ird\\",result="shadow_denied"} 4
edgelimit_near_limit_total{policy="web.a"} 11
edgelimit_backend_failures_total{category="unavailable",cause="connect_failed"} 2
edgelimit_grpc_request_seconds_bucket{le="0.001"} 20
edgelimit_grpc_request_seconds_bucket{le="0.01"} 65
edgelimit_grpc_request_seconds_bucket{le="+Inf"} 65
edgelimit_grpc_request_seconds_count 65
edgelimit_redis_live_connections 2
edgelimit_config_revision 255
"#;

    #[test]
    fn samples_parse_with_escaped_labels() {
        let s = Snapshot::parse(AFTER);
        let weird = &s.series(edgelimit_metrics::DECISIONS)[4];
        assert_eq!(weird.0["policy"], "we\"ird\\");
        assert_eq!(weird.1, 4.0);
        assert_eq!(
            s.total(edgelimit_metrics::REDIS_LIVE_CONNECTIONS),
            Some(2.0)
        );
        assert_eq!(s.total("absent"), None);
        assert!(parse_sample("x{a=1} 2").is_none());
        assert_eq!(parse_sample("x 2 1700000000").map(|s| s.2), Some(2.0));
    }

    #[test]
    fn quantiles_interpolate_inside_buckets() {
        let before = [(0.001, 10.0), (0.01, 15.0), (f64::INFINITY, 15.0)];
        let after = [(0.001, 20.0), (0.01, 65.0), (f64::INFINITY, 65.0)];
        // 50 new observations: 10 under 1 ms, 40 in (1 ms, 10 ms].
        let p50 = quantile(0.5, &before, &after).unwrap();
        assert!((p50 - (0.001 + 0.009 * 15.0 / 40.0)).abs() < 1e-12, "{p50}");
        assert!((quantile(0.1, &before, &after).unwrap() - 0.0005).abs() < 1e-12);
        assert_eq!(quantile(0.5, &after, &after), None);
        let slow = [(0.001, 0.0), (0.01, 0.0), (f64::INFINITY, 3.0)];
        assert_eq!(quantile(0.99, &[], &slow), Some(0.01));
    }

    #[test]
    fn frames_show_rates_per_policy_busiest_first() {
        let (before, after) = (Snapshot::parse(BEFORE), Snapshot::parse(AFTER));
        let frame = Frame::between(Some(&before), &after, 2.0, "READY".into());
        assert_eq!(frame.requests, Some(25.0));
        assert_eq!(frame.policies[0].policy, "web.a");
        assert_eq!(frame.policies[0].allowed, 10.0);
        assert_eq!(frame.policies[0].denied, 10.0);
        assert_eq!(frame.policies[0].near_limit, 5.0);
        assert_eq!(frame.policies[0].denial_ratio(), Some(0.5));
        assert!(frame.failures.is_empty(), "a counter that did not move");
        let text = frame.render("127.0.0.1:9090", 2);
        assert!(text.contains("READY  revision ff"), "{text}");
        assert!(text.contains("requests 25.0/s"), "{text}");
        assert!(text.contains("redis connections 2"), "{text}");
        let row = text.lines().find(|l| l.starts_with("web.a")).unwrap();
        assert!(row.contains("50.0%"), "{row}");
        assert!(text.contains("(1 more)"), "{text}");
        // The first frame has no rates.
        let first = Frame::between(None, &after, 1.0, "READY".into());
        assert_eq!(first.requests, None);
        assert!(first.policies.iter().all(|p| p.total() == 0.0));
    }

    #[test]
    fn counter_resets_count_from_zero() {
        assert_eq!(rate(Some(100.0), Some(30.0), 1.0), Some(30.0));
        assert_eq!(rate(None, Some(4.0), 2.0), Some(2.0));
        assert_eq!(rate(Some(1.0), None, 1.0), None);
    }

    #[test]
    fn chunked_bodies_are_joined() {
        assert_eq!(
            dechunk("4\r\nabcd\r\n2;x=y\r\nef\r\n0\r\n\r\n").as_deref(),
            Some("abcdef")
        );
        assert_eq!(dechunk("9\r\nab\r\n"), None);
    }
}
