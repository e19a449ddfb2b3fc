//! What a loaded policy set is made of: rules reached by descriptor paths, each carrying zero
//! or more limits that map onto contract policies.

use std::sync::Arc;

use edgelimit_contract::RateLimitPolicy;

/// Envoy's `RateLimitResponse.RateLimit.Unit`, plus the config units it cannot express.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Unit {
    Second,
    Minute,
    Hour,
    Day,
    Week,
    /// 30 days, as the reference defines it.
    Month,
    /// 365 days, as the reference defines it.
    Year,
}

impl Unit {
    pub fn millis(self) -> u64 {
        const S: u64 = 1000;
        match self {
            Unit::Second => S,
            Unit::Minute => 60 * S,
            Unit::Hour => 3600 * S,
            Unit::Day => 86_400 * S,
            Unit::Week => 7 * 86_400 * S,
            Unit::Month => 30 * 86_400 * S,
            Unit::Year => 365 * 86_400 * S,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Unit::Second => "second",
            Unit::Minute => "minute",
            Unit::Hour => "hour",
            Unit::Day => "day",
            Unit::Week => "week",
            Unit::Month => "month",
            Unit::Year => "year",
        }
    }

    /// Case-insensitive, as the reference accepts `SECOND` and `second`.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s.to_ascii_lowercase().as_str() {
            "second" => Unit::Second,
            "minute" => Unit::Minute,
            "hour" => Unit::Hour,
            "day" => Unit::Day,
            "week" => Unit::Week,
            "month" => Unit::Month,
            "year" => Unit::Year,
            _ => return None,
        })
    }
}

/// One limit of a rule, as Envoy will be told about it and as the backend evaluates it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limit {
    /// `rate_limit.name`, reported in `current_limit.name` and used by `replaces`.
    pub name: Option<String>,
    /// Envoy's view: `requests_per_unit` per `unit` (the closest unit for custom windows).
    pub requests_per_unit: u64,
    pub unit: Unit,
    /// Window or refill period in seconds, for the `RateLimit-Policy` header's `w=`.
    pub window_seconds: u64,
    /// The contract policy the backend evaluates.
    pub policy: Arc<RateLimitPolicy>,
}

/// A descriptor path's configuration, reached by matching request entries level by level.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// Bounded label for metrics and logs: the domain's id and the rule's index path.
    /// Never a request value; config values are not included either (they may be routes).
    pub metric_name: String,
    /// Human-readable path for `explain` and the admin endpoint (config values only).
    pub display_path: String,
    /// Empty for `unlimited` rules and for rules that only hold nested descriptors.
    pub limits: Vec<Limit>,
    pub unlimited: bool,
    pub shadow_mode: bool,
    /// The reference's `quota_mode`: an over-limit status of this rule makes the request
    /// over limit only when every quota-mode descriptor of the request is over limit.
    pub quota_mode: bool,
    /// Accepted for compatibility. Metrics are labelled by policy id, which already names
    /// the exact rule reached; request values never become labels.
    pub detailed_metric: bool,
    /// Accepted for compatibility; as `detailed_metric`, it never puts values in metrics.
    pub value_to_metric: bool,
    /// Names of limits this rule replaces when both apply to one request.
    pub replaces: Vec<String>,
    /// Empty unless a level of this rule's path has `share_threshold: true`; then one entry
    /// per level, the wildcard pattern for shared levels. The subject of such a request is
    /// computed over the pattern at those levels, so every matching value shares a counter.
    pub share_patterns: Vec<Option<String>>,
}

impl Rule {
    /// The value that identifies the subject at `level`: the wildcard pattern for a
    /// `share_threshold` level, the request's own value otherwise.
    pub fn subject_value<'a>(&'a self, level: usize, value: &'a [u8]) -> &'a [u8] {
        match self.share_patterns.get(level) {
            Some(Some(pattern)) => pattern.as_bytes(),
            _ => value,
        }
    }

    /// Whether this rule answers anything: rules that merely group nested descriptors do not.
    pub fn has_limit(&self) -> bool {
        self.unlimited || !self.limits.is_empty()
    }
}
