//! Redis's clock as this host sees it, for the deadline each program call carries (a program
//! that starts past it does nothing, so a command that waited too long in Redis's queue costs
//! no quota). Learned with `TIME` as each connection comes up, so the first requests after a
//! start or reconnect carry a deadline too, and refreshed by every reply (each carries the
//! server's `now`). Not used on Cluster: the nodes' clocks differ.

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redis::Value;

use super::connect::Link;

/// Redis's clock minus this host's, in ms.
#[derive(Debug)]
pub struct RedisClock {
    /// `i64::MIN` while unknown. Learned from a reply's `now` read when the reply arrives, so
    /// biased early by the reply's transit: that only makes deadlines stricter.
    offset_ms: AtomicI64,
}

impl Default for RedisClock {
    fn default() -> Self {
        Self {
            offset_ms: AtomicI64::new(i64::MIN),
        }
    }
}

impl RedisClock {
    pub fn learn(&self, server_now_ms: u64) {
        let offset = server_now_ms as i64 - unix_ms() as i64;
        self.offset_ms.store(offset, Ordering::Relaxed);
    }

    pub fn is_known(&self) -> bool {
        self.offset_ms.load(Ordering::Relaxed) != i64::MIN
    }

    /// The deadline to hand a program, on Redis's clock: `usable` from now. None while the
    /// clock is unknown.
    pub fn deadline(&self, usable: Duration) -> Option<u64> {
        let offset = self.offset_ms.load(Ordering::Relaxed);
        if offset == i64::MIN {
            return None;
        }
        let local = unix_ms().checked_add(usable.as_millis() as u64)?;
        u64::try_from((local as i64).checked_add(offset)?).ok()
    }

    /// Reads Redis's clock over a new connection before it takes requests. A failure is
    /// logged; the first reply teaches the clock instead.
    pub async fn sync(&self, link: &Link, timeout: Duration) {
        let mut link = link.clone();
        match tokio::time::timeout(timeout, link.send(&redis::cmd("TIME"))).await {
            Ok(Ok(value)) => match time_ms(&value) {
                Some(ms) => self.learn(ms),
                None => tracing::warn!(
                    ?value,
                    "TIME reply unreadable; deadlines start with the first reply"
                ),
            },
            Ok(Err(error)) => {
                tracing::warn!(%error, "TIME failed; deadlines start with the first reply")
            }
            Err(_) => tracing::warn!("TIME timed out; deadlines start with the first reply"),
        }
    }
}

/// `TIME`'s reply (seconds and microseconds, as two bulk strings) in ms.
fn time_ms(value: &Value) -> Option<u64> {
    let Value::Array(parts) = value else {
        return None;
    };
    let [seconds, micros] = parts.as_slice() else {
        return None;
    };
    let number = |part: &Value| match part {
        Value::BulkString(bytes) => std::str::from_utf8(bytes).ok()?.parse::<u64>().ok(),
        Value::Int(n) => u64::try_from(*n).ok(),
        _ => None,
    };
    number(seconds)?
        .checked_mul(1000)?
        .checked_add(number(micros)? / 1000)
}

pub fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_reply_in_ms() {
        let reply = Value::Array(vec![
            Value::BulkString(b"1764800000".to_vec()),
            Value::BulkString(b"123456".to_vec()),
        ]);
        assert_eq!(time_ms(&reply), Some(1_764_800_000_123));
        assert_eq!(time_ms(&Value::Nil), None);
        assert_eq!(
            time_ms(&Value::Array(vec![Value::BulkString(b"x".to_vec())])),
            None
        );
        assert_eq!(
            time_ms(&Value::Array(vec![
                Value::BulkString(b"1".to_vec()),
                Value::BulkString(b"-5".to_vec()),
            ])),
            None
        );
    }

    #[test]
    fn no_deadline_until_the_clock_is_known() {
        let clock = RedisClock::default();
        assert!(!clock.is_known());
        assert_eq!(clock.deadline(Duration::from_millis(5)), None);
        // Redis a second ahead of this host.
        clock.learn(unix_ms() + 1000);
        assert!(clock.is_known());
        let deadline = clock.deadline(Duration::from_millis(5)).unwrap_or(0);
        let expected = unix_ms() + 1005;
        assert!(
            deadline.abs_diff(expected) <= 50,
            "{deadline} vs {expected}"
        );
    }
}
