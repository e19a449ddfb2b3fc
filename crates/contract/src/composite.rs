//! Every limit a request touches, decided together: the request is admitted only if every
//! enforced limit admits it; then every limit that admitted it consumes its cost, otherwise
//! none does.

use std::time::Instant;

use super::{ContractError, Cost, RateLimitOutcome, RateLimitPolicy, SubjectDigest};

/// Whether a limit's answer decides the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Enforcement {
    /// A denial (or a failure) denies the whole request.
    Enforced,
    /// Never changes the decision. It counts the requests that the enforced limits admit and
    /// that it would itself admit; its would-be denials consume nothing.
    Shadow,
}

/// One limit, evaluated for one subject, as part of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimitCheck<'p> {
    policy: &'p RateLimitPolicy,
    subject: SubjectDigest,
    cost: Cost,
    enforcement: Enforcement,
}

impl<'p> LimitCheck<'p> {
    pub fn new(
        policy: &'p RateLimitPolicy,
        subject: SubjectDigest,
        cost: Cost,
        enforcement: Enforcement,
    ) -> Result<Self, ContractError> {
        if cost.units() > policy.max_cost() {
            return Err(ContractError::CostAboveMaximum {
                cost: cost.units(),
                max: policy.max_cost(),
            });
        }
        Ok(Self {
            policy,
            subject,
            cost,
            enforcement,
        })
    }

    pub fn policy(&self) -> &'p RateLimitPolicy {
        self.policy
    }
    pub fn subject(&self) -> &SubjectDigest {
        &self.subject
    }
    pub fn cost(&self) -> Cost {
        self.cost
    }
    pub fn enforcement(&self) -> Enforcement {
        self.enforcement
    }
    pub fn is_shadow(&self) -> bool {
        self.enforcement == Enforcement::Shadow
    }
}

/// The limits of one request, in request order (descriptor by descriptor, limit by limit),
/// with the caller's deadline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompositeRequest<'p> {
    checks: Vec<LimitCheck<'p>>,
    deadline: Instant,
}

impl<'p> CompositeRequest<'p> {
    /// Most limits one request may touch: 64 descriptors with several limits each, doubled
    /// while an HMAC secret rotates, stays well below it.
    pub const MAX_CHECKS: usize = 1024;

    pub fn new(checks: Vec<LimitCheck<'p>>, deadline: Instant) -> Result<Self, ContractError> {
        if checks.is_empty() {
            return Err(ContractError::NoChecks);
        }
        if checks.len() > Self::MAX_CHECKS {
            return Err(ContractError::TooManyChecks {
                count: checks.len(),
                max: Self::MAX_CHECKS,
            });
        }
        if deadline <= Instant::now() {
            return Err(ContractError::DeadlineExpired);
        }
        Ok(Self { checks, deadline })
    }

    pub fn checks(&self) -> &[LimitCheck<'p>] {
        &self.checks
    }
    pub fn deadline(&self) -> Instant {
        self.deadline
    }
    pub fn len(&self) -> usize {
        self.checks.len()
    }
    pub fn is_empty(&self) -> bool {
        self.checks.is_empty()
    }
}

/// One outcome per check, in the request's order.
///
/// For a check that admitted its cost: when the request was admitted, `remaining` is what is
/// left after consuming; when another limit denied the request, nothing was consumed and
/// `remaining` is what is left now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompositeOutcome {
    outcomes: Vec<RateLimitOutcome>,
}

impl CompositeOutcome {
    pub fn new(outcomes: Vec<RateLimitOutcome>) -> Self {
        Self { outcomes }
    }

    /// The same outcome for every check: a failure of the whole call.
    pub fn uniform(
        request: &CompositeRequest<'_>,
        outcome: impl Fn(&RateLimitPolicy) -> RateLimitOutcome,
    ) -> Self {
        Self::new(
            request
                .checks()
                .iter()
                .map(|c| outcome(c.policy()))
                .collect(),
        )
    }

    pub fn outcomes(&self) -> &[RateLimitOutcome] {
        &self.outcomes
    }

    pub fn into_outcomes(self) -> Vec<RateLimitOutcome> {
        self.outcomes
    }

    /// Whether the request is admitted: every enforced check was decided and allowed.
    pub fn admitted(&self, request: &CompositeRequest<'_>) -> bool {
        request
            .checks()
            .iter()
            .zip(&self.outcomes)
            .all(|(check, outcome)| check.is_shadow() || outcome.is_allowed())
    }
}
