//! Policy files: YAML in the envoyproxy/ratelimit format with edgelimit extensions, loaded
//! into an immutable [`PolicySet`] that the gRPC layer matches requests against.
//!
//! Files are parsed into a spanned tree ([`yaml`]), decoded and validated ([`schema`]),
//! given stable ids and revisions ([`identity`]), compiled into lookup tables ([`matcher`]),
//! and assembled per directory ([`load`]). See [`matcher`] for the matching rules.
#![forbid(unsafe_code)]

pub mod duration;
mod error;
mod identity;
mod load;
mod matcher;
mod model;
mod schema;
mod yaml;

#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::sync::Arc;

pub use error::{ConfigError, ConfigErrors};
pub use load::LoadOptions;
pub use model::{Limit, Rule, Unit};

use edgelimit_contract::{AlgorithmParams, ContractError, PolicyId, RateLimitPolicy};
use matcher::Matcher;

/// A loaded, validated, immutable set of policies. Swap whole sets to reload.
#[derive(Debug)]
pub struct PolicySet {
    /// Every descriptor of every domain, in declaration order (depth first).
    rules: Vec<Rule>,
    matcher: Matcher,
    domains: BTreeMap<String, DomainInfo>,
    revision: u64,
    options: LoadOptions,
}

#[derive(Debug)]
struct DomainInfo {
    slug: String,
    /// Precomputed so overrides for known domains do not hash on the request path.
    override_id: Option<PolicyId>,
}

impl PolicySet {
    /// The rule for a request's descriptor entries: one tree level per entry, and only if
    /// the rule reached at the last entry has a limit or is unlimited. Case-sensitive.
    /// Neither allocates nor locks.
    /// The rule for `entries` (keys and values as bytes, compared byte for byte).
    pub fn find<K: AsRef<[u8]>, V: AsRef<[u8]>>(
        &self,
        domain: &str,
        entries: impl IntoIterator<Item = (K, V)>,
    ) -> Option<&Rule> {
        let index = self.matcher.find(domain, entries)?;
        self.rules.get(index).filter(|rule| rule.has_limit())
    }

    pub fn has_domain(&self, domain: &str) -> bool {
        self.domains.contains_key(domain)
    }

    /// Domain names, sorted.
    pub fn domains(&self) -> impl Iterator<Item = &str> {
        self.domains.keys().map(String::as_str)
    }

    /// Every rule (descriptor) of every domain, including those that only group nested
    /// descriptors (`has_limit() == false`), for admin and explain views.
    pub fn rules(&self) -> impl Iterator<Item = &Rule> {
        self.rules.iter()
    }

    /// Number of rules (descriptors), as counted by [`PolicySet::rules`].
    pub fn len(&self) -> usize {
        self.rules.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// Hash of the load options and every file's path and content.
    pub fn revision(&self) -> u64 {
        self.revision
    }

    pub fn options(&self) -> &LoadOptions {
        &self.options
    }

    /// Envoy's per-descriptor `limit` override as a fixed-window limit with policy id
    /// `<domain slug>.override`. Its revision derives from the requested count and unit, so
    /// descriptors asking for different limits do not share a revision.
    pub fn override_limit(
        &self,
        domain: &str,
        requests_per_unit: u64,
        unit: Unit,
    ) -> Result<Limit, ContractError> {
        let id = match self.domains.get(domain).and_then(|d| d.override_id.clone()) {
            Some(id) => id,
            None => PolicyId::new(&format!("{}.override", identity::slug(domain)))?,
        };
        let o = &self.options;
        let revision = identity::override_revision(
            requests_per_unit,
            unit,
            o.default_max_cost,
            o.cleanup_grace_ms,
            o.max_clock_regression_ms,
        );
        let policy = RateLimitPolicy::new(
            id,
            revision,
            AlgorithmParams::FixedWindow {
                limit: requests_per_unit,
                window_ms: unit.millis(),
            },
            o.default_max_cost,
            o.cleanup_grace_ms,
            o.max_clock_regression_ms,
        )?;
        Ok(Limit {
            name: None,
            requests_per_unit,
            unit,
            window_seconds: unit.millis() / 1000,
            policy: Arc::new(policy),
        })
    }

    /// The slug used for `domain` in policy ids and metric names.
    pub fn domain_slug(&self, domain: &str) -> Option<&str> {
        self.domains.get(domain).map(|d| d.slug.as_str())
    }
}
