//! From the decided limits to Envoy's answer: one status per descriptor, the overall code,
//! and the headers of the most restrictive limit. Outcomes that are not decisions fail closed.

use std::time::Duration;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    rate_limit::Unit as EnvoyUnit, Code, DescriptorStatus, RateLimit as EnvoyRateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use envoy_types::pb::google::protobuf::Duration as ProtoDuration;
use tonic::Status;

use edgelimit_contract::{RateLimitDecision, RateLimitOutcome};
use edgelimit_policy::{Limit, Unit};

use crate::headers::{self, HeaderFacts, HeaderSettings};
use crate::settings::FailureMode;
use crate::translate::Applied;

/// What one applied limit came to.
pub(crate) struct Evaluated<'a, 'p> {
    pub applied: &'a Applied<'p>,
    pub outcome: RateLimitOutcome,
}

/// Orders outcomes from least to most restrictive: allowed (more remaining is less
/// restrictive), denied (longer retry is more restrictive), failed (always most).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Restriction {
    Allowed { remaining_inverse: u64 },
    Denied { retry_after: Duration },
    Failed,
}

impl Restriction {
    pub fn of(outcome: &RateLimitOutcome) -> Self {
        match outcome {
            RateLimitOutcome::Evaluated(d) if d.allowed => Restriction::Allowed {
                remaining_inverse: u64::MAX - d.remaining,
            },
            RateLimitOutcome::Evaluated(d) => Restriction::Denied {
                retry_after: d.retry_after,
            },
            _ => Restriction::Failed,
        }
    }
}

/// Per-descriptor facts of the request that shape the answer beyond the outcomes.
pub(crate) struct Shape<'a> {
    pub unlimited: &'a [bool],
    /// Quota descriptors make the request over limit only when all of them are.
    pub quota: &'a [bool],
    /// Global shadow mode: statuses as computed, overall `OVER_LIMIT` rewritten to `OK`.
    pub global_shadow: bool,
}

/// The overall code from the statuses, as the reference decides it: over limit when a
/// normal descriptor is, or when every quota descriptor is (and there is at least one).
fn overall_over(statuses: &[DescriptorStatus], shape: &Shape<'_>) -> bool {
    let (mut failed_normal, mut failed_quota, mut total_quota) = (0usize, 0usize, 0usize);
    for (i, status) in statuses.iter().enumerate() {
        if shape.unlimited.get(i).copied().unwrap_or(false) {
            continue;
        }
        let quota = shape.quota.get(i).copied().unwrap_or(false);
        let over = status.code == Code::OverLimit as i32;
        total_quota += usize::from(quota);
        if over && quota {
            failed_quota += 1;
        } else if over {
            failed_normal += 1;
        }
    }
    failed_normal > 0 || (total_quota > 0 && total_quota == failed_quota)
}

/// Builds the answer for `descriptors` descriptors. With `FailureMode::GrpcUnavailable`, an
/// enforced limit that was not decided fails the whole call instead.
pub(crate) fn build(
    descriptors: usize,
    evaluated: &[Evaluated<'_, '_>],
    shape: &Shape<'_>,
    failure_mode: FailureMode,
    header_settings: &HeaderSettings,
) -> Result<RateLimitResponse, Status> {
    let unlimited = shape.unlimited;
    if failure_mode == FailureMode::GrpcUnavailable {
        let failed = evaluated
            .iter()
            .find(|e| !e.applied.shadow && !matches!(e.outcome, RateLimitOutcome::Evaluated(_)));
        if let Some(e) = failed {
            return Err(Status::unavailable(format!(
                "rate limit backend outcome for policy {} is {} ({})",
                e.applied.limit.policy.id(),
                e.outcome.category(),
                e.outcome.cause()
            )));
        }
    }
    let mut statuses: Vec<DescriptorStatus> = Vec::with_capacity(descriptors);
    let mut headline: Option<(&Evaluated<'_, '_>, Restriction)> = None;
    for (index, &unlimited) in unlimited.iter().enumerate().take(descriptors) {
        let mut worst: Option<(&Evaluated<'_, '_>, Restriction)> = None;
        for e in evaluated.iter().filter(|e| e.applied.descriptor == index) {
            let r = Restriction::of(&e.outcome);
            if worst.as_ref().is_none_or(|(_, w)| r > *w) {
                worst = Some((e, r));
            }
        }
        let status = match &worst {
            Some((e, r)) => {
                if headline.as_ref().is_none_or(|(_, h)| r > h) {
                    headline = Some((e, *r));
                }
                descriptor_status(e)
            }
            None if unlimited => DescriptorStatus {
                code: Code::Ok as i32,
                limit_remaining: u32::MAX,
                ..Default::default()
            },
            None => DescriptorStatus {
                code: Code::Ok as i32,
                ..Default::default()
            },
        };
        statuses.push(status);
    }
    let over = overall_over(&statuses, shape) && !shape.global_shadow;
    let mut response_headers_to_add = headline
        .map(|(e, _)| headers::build(header_settings, &header_facts(e)))
        .unwrap_or_default();
    if let Some(names) = &header_settings.reference {
        response_headers_to_add.extend(headers::reference(names, &statuses, shape.quota));
    }
    Ok(RateLimitResponse {
        overall_code: if over { Code::OverLimit } else { Code::Ok } as i32,
        statuses,
        response_headers_to_add,
        ..Default::default()
    })
}

fn envoy_unit(unit: Unit) -> EnvoyUnit {
    match unit {
        Unit::Second => EnvoyUnit::Second,
        Unit::Minute => EnvoyUnit::Minute,
        Unit::Hour => EnvoyUnit::Hour,
        Unit::Day => EnvoyUnit::Day,
        Unit::Week => EnvoyUnit::Week,
        Unit::Month => EnvoyUnit::Month,
        Unit::Year => EnvoyUnit::Year,
    }
}

fn proto_duration(d: Duration) -> ProtoDuration {
    ProtoDuration {
        seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        nanos: i32::try_from(d.subsec_nanos()).unwrap_or(0),
    }
}

fn current_limit(limit: &Limit) -> EnvoyRateLimit {
    EnvoyRateLimit {
        name: limit.name.clone().unwrap_or_default(),
        requests_per_unit: u32::try_from(limit.requests_per_unit).unwrap_or(u32::MAX),
        unit: envoy_unit(limit.unit) as i32,
    }
}

fn descriptor_status(e: &Evaluated<'_, '_>) -> DescriptorStatus {
    let limit = &e.applied.limit;
    match &e.outcome {
        RateLimitOutcome::Evaluated(d) => DescriptorStatus {
            code: if d.allowed || e.applied.rule_shadow {
                Code::Ok
            } else {
                Code::OverLimit
            } as i32,
            current_limit: Some(current_limit(limit)),
            limit_remaining: u32::try_from(d.remaining).unwrap_or(u32::MAX),
            duration_until_reset: Some(proto_duration(d.reset_after())),
            quota: None,
        },
        failed => DescriptorStatus {
            // Fail closed: unavailable, indeterminate and incompatible never become OK,
            // except for rules the operator runs in shadow mode.
            code: if e.applied.rule_shadow {
                Code::Ok
            } else {
                Code::OverLimit
            } as i32,
            current_limit: Some(current_limit(limit)),
            limit_remaining: 0,
            duration_until_reset: Some(proto_duration(failure_retry_after(failed))),
            quota: None,
        },
    }
}

fn failure_retry_after(outcome: &RateLimitOutcome) -> Duration {
    match outcome {
        RateLimitOutcome::Unavailable { retry_after, .. }
        | RateLimitOutcome::Indeterminate { retry_after, .. } => *retry_after,
        _ => Duration::from_secs(1),
    }
}

fn header_facts<'a>(e: &'a Evaluated<'_, '_>) -> HeaderFacts<'a> {
    let limit = &e.applied.limit;
    let name = limit
        .name
        .as_deref()
        .unwrap_or_else(|| limit.policy.id().as_str());
    let enforced_denial = |d: &RateLimitDecision| !d.allowed && !e.applied.shadow;
    match &e.outcome {
        RateLimitOutcome::Evaluated(d) => HeaderFacts {
            name,
            limit: d.limit,
            window_seconds: limit.window_seconds,
            remaining: d.remaining,
            reset_after: d.reset_after(),
            retry_after: enforced_denial(d).then_some(d.retry_after),
        },
        failed => HeaderFacts {
            name,
            limit: limit.policy.params().limit(),
            window_seconds: limit.window_seconds,
            remaining: 0,
            reset_after: failure_retry_after(failed),
            retry_after: (!e.applied.shadow).then(|| failure_retry_after(failed)),
        },
    }
}
