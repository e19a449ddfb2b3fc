//! Response headers for the most restrictive limit: the IETF draft fields, the legacy
//! `X-RateLimit-*` trio, and `Retry-After` on denial. Names are policy names, never values.

use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeaderSettings {
    /// `RateLimit-Policy` and `RateLimit` (draft-ietf-httpapi-ratelimit-headers).
    pub draft: bool,
    /// `X-RateLimit-Limit`, `X-RateLimit-Remaining`, `X-RateLimit-Reset`.
    pub legacy: bool,
    /// `Retry-After` (seconds) when the request is denied.
    pub retry_after: bool,
    /// The reference's `LIMIT_RESPONSE_HEADERS_ENABLED` trio, with its configurable names.
    pub reference: Option<ReferenceHeaderNames>,
}

impl Default for HeaderSettings {
    fn default() -> Self {
        Self {
            draft: false,
            legacy: false,
            retry_after: true,
            reference: None,
        }
    }
}

/// Names of the reference's three headers (`LIMIT_LIMIT_HEADER`, `LIMIT_REMAINING_HEADER`,
/// `LIMIT_RESET_HEADER`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReferenceHeaderNames {
    pub limit: String,
    pub remaining: String,
    pub reset: String,
}

impl Default for ReferenceHeaderNames {
    fn default() -> Self {
        Self {
            limit: "RateLimit-Limit".into(),
            remaining: "RateLimit-Remaining".into(),
            reset: "RateLimit-Reset".into(),
        }
    }
}

/// The reference's headers, chosen as it chooses them: the status with a limit and the
/// fewest remaining, except that an over-limit normal (non-quota) descriptor always wins.
/// Nothing when no descriptor has a limit.
pub fn reference(
    names: &ReferenceHeaderNames,
    statuses: &[DescriptorStatus],
    quota: &[bool],
) -> Vec<HeaderValue> {
    let mut chosen: Option<&DescriptorStatus> = None;
    let mut least = u32::MAX;
    for (i, status) in statuses.iter().enumerate() {
        if status.current_limit.is_some() && status.limit_remaining < least {
            chosen = Some(status);
            least = status.limit_remaining;
        }
        let normal = !quota.get(i).copied().unwrap_or(false);
        if normal && status.code == Code::OverLimit as i32 {
            chosen = Some(status);
            least = 0;
        }
    }
    let Some(status) = chosen else {
        return Vec::new();
    };
    let limit = status
        .current_limit
        .as_ref()
        .map_or(0, |l| l.requests_per_unit);
    let reset = status.duration_until_reset.as_ref().map_or(0, |d| {
        let whole = u64::try_from(d.seconds).unwrap_or(0);
        whole + u64::from(d.nanos > 0)
    });
    [
        (&names.limit, limit.to_string()),
        (&names.remaining, status.limit_remaining.to_string()),
        (&names.reset, reset.to_string()),
    ]
    .into_iter()
    .map(|(key, value)| HeaderValue {
        key: key.clone(),
        value,
        raw_value: Vec::new(),
    })
    .collect()
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
            reference: None,
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

    fn status(code: Code, remaining: u32, limit: Option<u32>) -> DescriptorStatus {
        use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::RateLimit;
        use envoy_types::pb::google::protobuf::Duration as D;
        DescriptorStatus {
            code: code as i32,
            current_limit: limit.map(|n| RateLimit {
                name: String::new(),
                requests_per_unit: n,
                unit: 2,
            }),
            limit_remaining: remaining,
            duration_until_reset: Some(D {
                seconds: 41,
                nanos: 5,
            }),
            quota: None,
        }
    }

    #[test]
    fn reference_headers_pick_the_reference_descriptor() {
        let names = ReferenceHeaderNames {
            limit: "X-L".into(),
            ..ReferenceHeaderNames::default()
        };
        let statuses = [
            status(Code::Ok, 7, Some(10)),
            status(Code::Ok, 3, Some(5)),
            status(Code::Ok, 0, None),
        ];
        let got = pairs(reference(&names, &statuses, &[false; 3]));
        let want = [
            ("X-L", "5"),
            ("RateLimit-Remaining", "3"),
            ("RateLimit-Reset", "42"),
        ];
        assert_eq!(
            got,
            want.map(|(k, v)| (k.to_string(), v.to_string())).to_vec()
        );
        // An over-limit normal descriptor wins; an over-limit quota one does not force it.
        let statuses = [
            status(Code::Ok, 0, Some(9)),
            status(Code::OverLimit, 0, Some(4)),
        ];
        assert_eq!(
            pairs(reference(&names, &statuses, &[false, true]))[0].1,
            "9"
        );
        assert_eq!(
            pairs(reference(&names, &statuses, &[false, false]))[0].1,
            "4"
        );
        assert!(reference(&names, &[status(Code::Ok, 0, None)], &[false]).is_empty());
    }

    #[test]
    fn retry_after_only_when_denied_and_at_least_one_second() {
        let s = HeaderSettings::default();
        assert!(build(&s, &facts(None)).is_empty());
        let got = pairs(build(&s, &facts(Some(Duration::from_millis(1)))));
        assert_eq!(got, vec![("Retry-After".to_string(), "1".to_string())]);
    }
}
