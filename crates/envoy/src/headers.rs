//! Response headers for the most restrictive limit: the IETF draft fields, the legacy
//! `X-RateLimit-*` trio, and `Retry-After` on denial. Names are policy names, never values.

use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::HeaderValue;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeaderSettings {
    /// `RateLimit-Policy` and `RateLimit` (draft-ietf-httpapi-ratelimit-headers).
    pub draft: bool,
    /// `X-RateLimit-Limit`, `X-RateLimit-Remaining`, `X-RateLimit-Reset`.
    pub legacy: bool,
    /// `Retry-After` (seconds) when the request is denied.
    pub retry_after: bool,
}

impl Default for HeaderSettings {
    fn default() -> Self {
        Self {
            draft: false,
            legacy: false,
            retry_after: true,
        }
    }
}

/// What the headers describe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeaderFacts<'a> {
    pub name: &'a str,
    pub limit: u64,
    pub window_seconds: u64,
    pub remaining: u64,
    pub reset_after: Duration,
    /// Set when denied.
    pub retry_after: Option<Duration>,
}

/// Whole seconds, rounded up so a client never retries early.
fn ceil_seconds(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

pub fn build(settings: &HeaderSettings, facts: &HeaderFacts<'_>) -> Vec<HeaderValue> {
    let mut headers = Vec::new();
    let mut push = |key: &str, value: String| {
        headers.push(HeaderValue {
            key: key.to_owned(),
            value,
            raw_value: Vec::new(),
        })
    };
    let reset = ceil_seconds(facts.reset_after);
    if settings.draft {
        push(
            "RateLimit-Policy",
            format!(
                "\"{}\";q={};w={}",
                facts.name, facts.limit, facts.window_seconds
            ),
        );
        push(
            "RateLimit",
            format!("\"{}\";r={};t={}", facts.name, facts.remaining, reset),
        );
    }
    if settings.legacy {
        push("X-RateLimit-Limit", facts.limit.to_string());
        push("X-RateLimit-Remaining", facts.remaining.to_string());
        push("X-RateLimit-Reset", reset.to_string());
    }
    if settings.retry_after {
        if let Some(retry) = facts.retry_after {
            push("Retry-After", ceil_seconds(retry).max(1).to_string());
        }
    }
    headers
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(retry: Option<Duration>) -> HeaderFacts<'static> {
        HeaderFacts {
            name: "edge.per_ip",
            limit: 100,
            window_seconds: 60,
            remaining: 0,
            reset_after: Duration::from_millis(12_300),
            retry_after: retry,
        }
    }

    fn pairs(h: Vec<HeaderValue>) -> Vec<(String, String)> {
        h.into_iter().map(|h| (h.key, h.value)).collect()
    }

    #[test]
    fn all_header_families() {
        let all = HeaderSettings {
            draft: true,
            legacy: true,
            retry_after: true,
        };
        let got = pairs(build(&all, &facts(Some(Duration::from_millis(12_300)))));
        let want = [
            ("RateLimit-Policy", "\"edge.per_ip\";q=100;w=60"),
            ("RateLimit", "\"edge.per_ip\";r=0;t=13"),
            ("X-RateLimit-Limit", "100"),
            ("X-RateLimit-Remaining", "0"),
            ("X-RateLimit-Reset", "13"),
            ("Retry-After", "13"),
        ];
        assert_eq!(
            got,
            want.map(|(k, v)| (k.to_string(), v.to_string())).to_vec()
        );
    }

    #[test]
    fn retry_after_only_when_denied_and_at_least_one_second() {
        let s = HeaderSettings::default();
        assert!(build(&s, &facts(None)).is_empty());
        let got = pairs(build(&s, &facts(Some(Duration::from_millis(1)))));
        assert_eq!(got, vec![("Retry-After".to_string(), "1".to_string())]);
    }
}
