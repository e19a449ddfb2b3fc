use std::fmt;
use std::num::NonZeroU64;
use std::time::Instant;

use super::{ContractError, PolicyId, RateLimitPolicy, MAX_EXACT_INTEGER};

/// A pseudonymous subject: an HMAC of the matched descriptor values, never the values.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct SubjectDigest([u8; 32]);

impl SubjectDigest {
    pub fn from_bytes(bytes: [u8; 32]) -> Self {
        Self(bytes)
    }
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

impl fmt::Debug for SubjectDigest {
    // A prefix is enough to correlate in a debugger without printing a stable identifier.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SubjectDigest({:02x}{:02x}..)", self.0[0], self.0[1])
    }
}

/// How much of the quota a request takes. `Peek` asks "would one more unit be admitted?"
/// without changing any state (Envoy's explicit `hits_addend: 0`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Cost {
    Consume(NonZeroU64),
    Peek,
}

impl Cost {
    pub fn consume(units: u64) -> Result<Self, ContractError> {
        let units = NonZeroU64::new(units).ok_or(ContractError::ZeroCost)?;
        if units.get() > MAX_EXACT_INTEGER {
            return Err(ContractError::BeyondExactRange {
                what: "cost",
                value: units.get() as u128,
            });
        }
        Ok(Cost::Consume(units))
    }

    /// The wire value the atomic programs take: units, or 0 for a peek.
    pub fn units(self) -> u64 {
        match self {
            Cost::Consume(units) => units.get(),
            Cost::Peek => 0,
        }
    }
}

/// One evaluation of one policy for one subject.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RateLimitRequest {
    policy_id: PolicyId,
    subject: SubjectDigest,
    cost: Cost,
    deadline: Instant,
}

impl RateLimitRequest {
    /// `evaluation_id` exists in the contract for deduplicating retries; this revision does
    /// not deduplicate, so any id is rejected rather than silently ignored.
    pub fn new(
        policy: &RateLimitPolicy,
        subject: SubjectDigest,
        cost: Cost,
        evaluation_id: Option<&str>,
        deadline: Instant,
    ) -> Result<Self, ContractError> {
        if evaluation_id.is_some() {
            return Err(ContractError::EvaluationIdUnsupported);
        }
        if cost.units() > policy.max_cost() {
            return Err(ContractError::CostAboveMaximum {
                cost: cost.units(),
                max: policy.max_cost(),
            });
        }
        if deadline <= Instant::now() {
            return Err(ContractError::DeadlineExpired);
        }
        Ok(Self {
            policy_id: policy.id().clone(),
            subject,
            cost,
            deadline,
        })
    }

    pub fn policy_id(&self) -> &PolicyId {
        &self.policy_id
    }
    pub fn subject(&self) -> &SubjectDigest {
        &self.subject
    }
    pub fn cost(&self) -> Cost {
        self.cost
    }
    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// Guards a port against being handed a request built for another policy.
    pub fn check_policy(&self, policy: &RateLimitPolicy) -> Result<(), ContractError> {
        if &self.policy_id != policy.id() {
            return Err(ContractError::PolicyMismatch {
                request: self.policy_id.to_string(),
                policy: policy.id().to_string(),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::AlgorithmParams;
    use std::time::Duration;

    fn policy() -> RateLimitPolicy {
        RateLimitPolicy::new(
            PolicyId::new("p").unwrap(),
            1,
            AlgorithmParams::FixedWindow {
                limit: 10,
                window_ms: 1000,
            },
            5,
            0,
            0,
        )
        .unwrap()
    }

    fn later() -> Instant {
        Instant::now() + Duration::from_secs(1)
    }

    #[test]
    fn cost_must_be_positive_and_exact() {
        assert_eq!(Cost::consume(0), Err(ContractError::ZeroCost));
        assert!(Cost::consume(MAX_EXACT_INTEGER + 1).is_err());
        assert_eq!(Cost::consume(3).unwrap().units(), 3);
        assert_eq!(Cost::Peek.units(), 0);
    }

    #[test]
    fn request_bounds() {
        let p = policy();
        let s = SubjectDigest::from_bytes([7; 32]);
        assert!(RateLimitRequest::new(&p, s, Cost::consume(5).unwrap(), None, later()).is_ok());
        assert_eq!(
            RateLimitRequest::new(&p, s, Cost::consume(6).unwrap(), None, later()),
            Err(ContractError::CostAboveMaximum { cost: 6, max: 5 })
        );
        assert_eq!(
            RateLimitRequest::new(&p, s, Cost::Peek, Some("retry-1"), later()),
            Err(ContractError::EvaluationIdUnsupported)
        );
        assert_eq!(
            RateLimitRequest::new(&p, s, Cost::Peek, None, Instant::now()),
            Err(ContractError::DeadlineExpired)
        );
    }

    #[test]
    fn digest_debug_does_not_print_the_whole_digest() {
        let s = SubjectDigest::from_bytes([0xab; 32]);
        assert_eq!(format!("{s:?}"), "SubjectDigest(abab..)");
    }
}
