//! RLQS metrics. Labels are policy ids (or `none`) and fixed enums, never bucket values.

use edgelimit_contract::PolicyId;

use crate::share::Strategy;

/// Label of a bucket governed by no limit.
pub(crate) const NO_POLICY: &str = "none";

pub(crate) fn stream_opened() {
    metrics::gauge!(edgelimit_metrics::RLQS_STREAMS).increment(1.0);
}

pub(crate) fn stream_closed() {
    metrics::gauge!(edgelimit_metrics::RLQS_STREAMS).decrement(1.0);
}

pub(crate) fn stream_refused() {
    metrics::counter!(edgelimit_metrics::RLQS_STREAMS_REFUSED).increment(1);
}

pub(crate) fn bucket_refused(reason: &'static str) {
    metrics::counter!(edgelimit_metrics::RLQS_BUCKETS_REFUSED, "reason" => reason).increment(1);
}

/// One action sent: a strategy's name, `abandon` or `fail_closed`.
pub(crate) fn assignment(policy: Option<&PolicyId>, action: &'static str) {
    let policy = policy.map_or(NO_POLICY.to_owned(), |p| p.as_str().to_owned());
    metrics::counter!(edgelimit_metrics::RLQS_ASSIGNMENTS, "policy" => policy, "action" => action)
        .increment(1);
}

pub(crate) fn strategy(policy: Option<&PolicyId>, strategy: &Strategy) {
    assignment(policy, strategy.as_str());
}

pub(crate) fn reported(policy: &PolicyId, allowed: u64, denied: u64) {
    for (result, count) in [("allowed", allowed), ("denied", denied)] {
        if count > 0 {
            metrics::counter!(
                edgelimit_metrics::RLQS_REPORTED_REQUESTS,
                "policy" => policy.as_str().to_owned(),
                "result" => result
            )
            .increment(count);
        }
    }
}

pub(crate) fn overshoot(policy: &PolicyId, units: u64) {
    if units > 0 {
        metrics::counter!(
            edgelimit_metrics::RLQS_OVERSHOOT_REQUESTS,
            "policy" => policy.as_str().to_owned()
        )
        .increment(units);
    }
}
