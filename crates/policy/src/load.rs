//! Reading a policy directory and turning its files into a [`PolicySet`]: file discovery
//! (Kubernetes ConfigMap layout aware), per-file decoding, domain merging, identity, and the
//! contract policies. Every error in the whole set is collected before rejecting it.

use std::collections::HashMap;
use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::error::{ConfigError, ConfigErrors};
use super::identity::{self, Canon, PathLevel, RevisionInput};
use super::matcher::{Matcher, NodeId};
use super::model::{Limit, Rule};
use super::schema::{self, DescriptorConfig, DomainConfig, LimitConfig};
use super::{yaml, DomainInfo, PolicySet};
use edgelimit_contract::{
    Algorithm, AlgorithmParams, PolicyId, RateLimitPolicy, MAX_EXACT_INTEGER,
};

/// How a policy set is loaded and which defaults its limits get.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadOptions {
    /// Whether several files may define the same domain (their descriptors are combined;
    /// the same top-level key+value in two files is still an error).
    pub merge_domains: bool,
    /// `max_cost` of limits that do not set one (largest accepted `hits_addend`).
    pub default_max_cost: u64,
    pub cleanup_grace_ms: u64,
    pub max_clock_regression_ms: u64,
    /// Largest policy file accepted, in bytes.
    pub max_file_bytes: u64,
    /// Most descriptors (rules) one domain may hold, over all its files.
    pub max_rules_per_domain: usize,
    /// Deepest descriptor nesting accepted.
    pub max_depth: usize,
}

impl Default for LoadOptions {
    fn default() -> Self {
        Self {
            merge_domains: false,
            default_max_cost: 1_000_000,
            cleanup_grace_ms: RateLimitPolicy::DEFAULT_CLEANUP_GRACE_MS,
            max_clock_regression_ms: RateLimitPolicy::DEFAULT_MAX_CLOCK_REGRESSION_MS,
            max_file_bytes: 1024 * 1024,
            max_rules_per_domain: 10_000,
            max_depth: 16,
        }
    }
}

impl LoadOptions {
    fn validate(&self, origin: &Path) -> Vec<ConfigError> {
        let mut errors = Vec::new();
        let mut bad = |field: &str, message: String| {
            errors.push(ConfigError::new(
                origin,
                0,
                0,
                format!("(options).{field}"),
                message,
            ))
        };
        if self.default_max_cost == 0 || self.default_max_cost > MAX_EXACT_INTEGER {
            bad(
                "default_max_cost",
                format!(
                    "must be between 1 and {MAX_EXACT_INTEGER}, got {}",
                    self.default_max_cost
                ),
            );
        }
        for (field, value) in [
            ("cleanup_grace_ms", self.cleanup_grace_ms),
            ("max_clock_regression_ms", self.max_clock_regression_ms),
        ] {
            if value > RateLimitPolicy::MAX_SAFETY_MS {
                bad(
                    field,
                    format!(
                        "must be at most {}, got {value}",
                        RateLimitPolicy::MAX_SAFETY_MS
                    ),
                );
            }
        }
        if self.max_depth == 0 {
            bad("max_depth", "must be at least 1".into());
        }
        errors
    }

    /// YAML nesting needed for `max_depth` descriptor levels: each level is a list and a
    /// mapping, plus the top mapping, a `rate_limits` list of mappings holding a `replaces`
    /// list of mappings, and room for a shallow `metadata` map.
    fn yaml_depth(&self) -> usize {
        self.max_depth.saturating_mul(2).saturating_add(6)
    }
}

fn is_policy_file(name: &str) -> bool {
    // Dotfiles include Kubernetes' `..data` and `..<timestamp>` ConfigMap directories.
    if name.starts_with('.') {
        return false;
    }
    match name.rsplit_once('.') {
        Some((_, ext)) => ext.eq_ignore_ascii_case("yaml") || ext.eq_ignore_ascii_case("yml"),
        None => false,
    }
}

fn read_bounded(path: &Path, max: u64) -> Result<String, ConfigError> {
    let too_large = || {
        ConfigError::file(
            path,
            format!("policy file is larger than the limit of {max} bytes"),
        )
    };
    let file = fs::File::open(path)
        .map_err(|e| ConfigError::file(path, format!("cannot open policy file: {e}")))?;
    let mut bytes = Vec::new();
    // Read one byte past the limit so growth between stat and read is still caught.
    file.take(max.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(|e| ConfigError::file(path, format!("cannot read policy file: {e}")))?;
    if bytes.len() as u64 > max {
        return Err(too_large());
    }
    String::from_utf8(bytes)
        .map_err(|e| ConfigError::file(path, format!("policy file is not valid UTF-8: {e}")))
}

impl PolicySet {
    /// Loads every `*.yaml`/`*.yml` file directly in `dir` (symlinks followed, dotfiles and
    /// dot-directories ignored), in file-name order.
    pub fn load_dir(dir: impl AsRef<Path>, options: &LoadOptions) -> Result<Self, ConfigErrors> {
        let dir = dir.as_ref();
        let entries = fs::read_dir(dir).map_err(|e| {
            ConfigErrors(vec![ConfigError::file(
                dir,
                format!("cannot read policy directory: {e}"),
            )])
        })?;
        let mut errors = Vec::new();
        let mut paths = Vec::new();
        for entry in entries {
            let entry = match entry {
                Ok(entry) => entry,
                Err(e) => {
                    errors.push(ConfigError::file(
                        dir,
                        format!("cannot list policy directory: {e}"),
                    ));
                    continue;
                }
            };
            if !is_policy_file(&entry.file_name().to_string_lossy()) {
                continue;
            }
            let path = entry.path();
            // `fs::metadata` follows symlinks: ConfigMap files are links into `..data/`.
            match fs::metadata(&path) {
                Ok(meta) if meta.is_file() => paths.push(path),
                Ok(_) => {}
                Err(e) => errors.push(ConfigError::file(
                    &path,
                    format!("cannot read policy file (broken symlink?): {e}"),
                )),
            }
        }
        paths.sort();
        let mut sources = Vec::with_capacity(paths.len());
        for path in paths {
            match read_bounded(&path, options.max_file_bytes) {
                Ok(text) => sources.push((path, text)),
                Err(e) => errors.push(e),
            }
        }
        build(dir, sources, options, errors)
    }

    /// Builds a set from in-memory files, in the given order.
    pub fn from_sources(
        sources: Vec<(PathBuf, String)>,
        options: &LoadOptions,
    ) -> Result<Self, ConfigErrors> {
        build(Path::new("(sources)"), sources, options, Vec::new())
    }
}

struct DomainBuild {
    config: DomainConfig,
    file: usize,
    /// Top-level descriptors with the file each came from.
    tops: Vec<(usize, DescriptorConfig)>,
}

fn build(
    origin: &Path,
    sources: Vec<(PathBuf, String)>,
    options: &LoadOptions,
    mut errors: Vec<ConfigError>,
) -> Result<PolicySet, ConfigErrors> {
    let option_errors = options.validate(origin);
    if !option_errors.is_empty() {
        return Err(ConfigErrors(option_errors));
    }

    let mut set_hash = Canon::new("edgelimit.policy-set.v1");
    set_hash.str(&format!("{options:?}"));
    let mut ordered: Vec<&(PathBuf, String)> = sources.iter().collect();
    ordered.sort_by(|a, b| a.0.cmp(&b.0));
    for (path, text) in ordered {
        set_hash.bytes(path.as_os_str().as_encoded_bytes());
        set_hash.str(text);
    }

    let mut domains: Vec<DomainBuild> = Vec::new();
    let mut by_name: HashMap<String, usize> = HashMap::new();
    for (file, (path, text)) in sources.iter().enumerate() {
        if text.len() as u64 > options.max_file_bytes {
            errors.push(ConfigError::file(
                path,
                format!(
                    "policy file is larger than the limit of {} bytes",
                    options.max_file_bytes
                ),
            ));
            continue;
        }
        let root =
            match yaml::parse(text, options.yaml_depth()) {
                Ok(root) => root,
                Err(yaml_errors) => {
                    errors.extend(yaml_errors.into_iter().map(|e| {
                        ConfigError::new(path, e.pos.line, e.pos.column, e.field, e.message)
                    }));
                    continue;
                }
            };
        let Some(mut config) = schema::decode(path, &root, options.max_depth, &mut errors) else {
            continue;
        };
        match by_name.get(&config.domain) {
            Some(&first) if !options.merge_domains => {
                let other = domains
                    .get(first)
                    .and_then(|d| sources.get(d.file))
                    .map(|(p, _)| p.display().to_string())
                    .unwrap_or_default();
                errors.push(ConfigError::new(
                    path,
                    config.pos.line,
                    config.pos.column,
                    "domain",
                    format!(
                        "domain `{}` is already defined in {other}; put it in one file or enable merging of domains",
                        config.domain
                    ),
                ));
            }
            Some(&first) => {
                if let Some(d) = domains.get_mut(first) {
                    d.tops
                        .extend(config.descriptors.drain(..).map(|desc| (file, desc)));
                }
            }
            None => {
                by_name.insert(config.domain.clone(), domains.len());
                let tops = config
                    .descriptors
                    .drain(..)
                    .map(|desc| (file, desc))
                    .collect();
                domains.push(DomainBuild { config, file, tops });
            }
        }
    }

    let mut builder = SetBuilder {
        sources: &sources,
        options,
        errors,
        rules: Vec::new(),
        matcher: Matcher::default(),
        ids: HashMap::new(),
    };
    let mut infos = std::collections::BTreeMap::new();
    for domain in &domains {
        let info = builder.domain(domain);
        infos.insert(domain.config.domain.clone(), info);
    }
    if !builder.errors.is_empty() {
        return Err(ConfigErrors(builder.errors));
    }
    Ok(PolicySet {
        rules: builder.rules,
        matcher: builder.matcher,
        domains: infos,
        revision: set_hash.finish_u64(),
        options: options.clone(),
    })
}

struct SetBuilder<'a> {
    sources: &'a [(PathBuf, String)],
    options: &'a LoadOptions,
    errors: Vec<ConfigError>,
    rules: Vec<Rule>,
    matcher: Matcher,
    /// Policy id → where it was first defined, to reject collisions.
    ids: HashMap<String, (usize, usize)>,
}

/// A descriptor's place in the tree while walking it.
struct Walk<'p> {
    domain: &'p str,
    domain_slug: &'p str,
    file: usize,
    parent: Option<NodeId>,
    path: Vec<PathLevel<'p>>,
    /// Per level: the wildcard pattern when that level has `share_threshold: true`.
    shared: Vec<Option<&'p str>>,
}

impl SetBuilder<'_> {
    fn path_of(&self, file: usize) -> &Path {
        self.sources
            .get(file)
            .map_or(Path::new("(unknown)"), |(p, _)| p.as_path())
    }

    fn err(&mut self, file: usize, line: usize, column: usize, field: &str, message: String) {
        let path = self.path_of(file).to_path_buf();
        self.errors
            .push(ConfigError::new(&path, line, column, field, message));
    }

    fn domain(&mut self, domain: &DomainBuild) -> DomainInfo {
        let name = domain.config.domain.as_str();
        let slug = identity::slug(name);
        let override_id = PolicyId::new(&format!("{slug}.override")).ok();
        let mut count = 0usize;
        for (file, descriptor) in &domain.tops {
            let walk = Walk {
                domain: name,
                domain_slug: &slug,
                file: *file,
                parent: None,
                path: Vec::new(),
                shared: Vec::new(),
            };
            if !self.descriptor(&walk, descriptor, &mut count) {
                break;
            }
        }
        DomainInfo { slug, override_id }
    }

    /// Adds a descriptor and its children; `false` once the domain's rule budget is spent.
    fn descriptor<'p>(
        &mut self,
        walk: &Walk<'p>,
        d: &'p DescriptorConfig,
        count: &mut usize,
    ) -> bool {
        *count += 1;
        if *count > self.options.max_rules_per_domain {
            self.err(
                walk.file,
                d.pos.line,
                d.pos.column,
                &d.field,
                format!(
                    "domain `{}` has more than {} descriptors",
                    walk.domain, self.options.max_rules_per_domain
                ),
            );
            return false;
        }
        let mut path = walk.path.clone();
        path.push((d.key.as_str(), d.value.as_deref()));
        let mut shared = walk.shared.clone();
        shared.push(d.value.as_deref().filter(|_| d.share_threshold));
        // Insert first: a descriptor that collides with another file's gets no rule, so the
        // collision is reported once rather than again as a policy id clash.
        let index = self.rules.len();
        let node = match self.matcher.insert(
            walk.domain,
            walk.parent,
            &d.key,
            d.value.as_deref(),
            index,
        ) {
            Ok(node) => node,
            Err(_) => {
                // Within a file the schema already rejects these; this is two merged files.
                self.err(
                    walk.file,
                    d.pos.line,
                    d.pos.column,
                    &d.field,
                    format!(
                        "duplicate descriptor: key `{}` {} is already defined for domain `{}` in another file",
                        d.key,
                        d.value.as_deref().map_or("without a value".to_string(), |v| format!("with value `{v}`")),
                        walk.domain
                    ),
                );
                return true;
            }
        };
        let mut rule = self.rule(walk, &path, d);
        if shared.iter().any(Option::is_some) {
            rule.share_patterns = shared.iter().map(|p| p.map(str::to_owned)).collect();
        }
        self.rules.push(rule);
        let child_walk = Walk {
            domain: walk.domain,
            domain_slug: walk.domain_slug,
            file: walk.file,
            parent: Some(node),
            path,
            shared,
        };
        d.children
            .iter()
            .all(|child| self.descriptor(&child_walk, child, count))
    }

    fn rule(&mut self, walk: &Walk<'_>, path: &[PathLevel<'_>], d: &DescriptorConfig) -> Rule {
        let hashed = identity::path_slug(walk.domain, path);
        let rule_slug = match (d.limits.as_slice(), &d.unlimited_name) {
            ([only], _) if only.name.is_some() => only.name.as_deref().map(identity::slug),
            ([], Some(name)) => Some(identity::slug(name)),
            _ => None,
        }
        .unwrap_or_else(|| hashed.clone());
        let several = d.limits.len() > 1;
        let limits = d
            .limits
            .iter()
            .enumerate()
            .filter_map(|(i, limit)| {
                // Named limits keep their id when the list is reordered; unnamed ones are
                // told apart by position.
                let limit_slug = match &limit.name {
                    Some(name) => identity::slug(name),
                    None if several => format!("{hashed}.{i}"),
                    None => hashed.clone(),
                };
                self.limit(walk, path, limit, &limit_slug)
            })
            .collect();
        let mut display_path = format!("domain={}", walk.domain);
        for (key, value) in path {
            display_path.push_str(" / key=");
            display_path.push_str(key);
            if let Some(v) = value {
                display_path.push_str(",value=");
                display_path.push_str(v);
            }
        }
        Rule {
            metric_name: format!("{}.{rule_slug}", walk.domain_slug),
            display_path,
            limits,
            unlimited: d.unlimited,
            shadow_mode: d.shadow_mode,
            quota_mode: d.quota_mode,
            detailed_metric: d.detailed_metric,
            value_to_metric: d.value_to_metric,
            replaces: d.replaces.clone(),
            share_patterns: Vec::new(),
        }
    }

    fn limit(
        &mut self,
        walk: &Walk<'_>,
        path: &[PathLevel<'_>],
        limit: &LimitConfig,
        limit_slug: &str,
    ) -> Option<Limit> {
        let (line, column, field) = (limit.pos.line, limit.pos.column, limit.field.as_str());
        if limit_slug == "override" {
            let at = limit.name_pos.unwrap_or(limit.pos);
            self.err(
                walk.file,
                at.line,
                at.column,
                &format!("{field}.name"),
                "the name `override` is reserved for descriptor limit overrides".into(),
            );
            return None;
        }
        let id_text = format!("{}.{limit_slug}", walk.domain_slug);
        if let Some(&(file, first_line)) = self.ids.get(&id_text) {
            let other = self.path_of(file).display().to_string();
            self.err(
                walk.file,
                line,
                column,
                field,
                format!(
                    "policy id `{id_text}` is already used by the limit at {other}:{first_line}; give the limits distinct names"
                ),
            );
            return None;
        }
        self.ids.insert(id_text.clone(), (walk.file, line));
        let id = match PolicyId::new(&id_text) {
            Ok(id) => id,
            Err(e) => {
                self.err(
                    walk.file,
                    line,
                    column,
                    field,
                    format!("invalid policy id: {e}"),
                );
                return None;
            }
        };
        let params = match limit.algorithm {
            Algorithm::FixedWindow => AlgorithmParams::FixedWindow {
                limit: limit.requests_per_unit,
                window_ms: limit.window_ms,
            },
            Algorithm::SlidingWindow => AlgorithmParams::SlidingWindow {
                limit: limit.requests_per_unit,
                window_ms: limit.window_ms,
            },
            Algorithm::TokenBucket => AlgorithmParams::TokenBucket {
                capacity: limit.burst.unwrap_or(limit.requests_per_unit),
                refill_tokens: limit.requests_per_unit,
                refill_period_ms: limit.window_ms,
            },
        };
        let max_cost = limit.max_cost.unwrap_or(self.options.default_max_cost);
        let revision = identity::revision(&RevisionInput {
            id: &id_text,
            domain: walk.domain,
            path,
            params: &params,
        });
        let policy = match RateLimitPolicy::new(
            id,
            revision,
            params,
            max_cost,
            self.options.cleanup_grace_ms,
            self.options.max_clock_regression_ms,
        ) {
            Ok(policy) => policy,
            Err(e) => {
                self.err(
                    walk.file,
                    line,
                    column,
                    field,
                    format!("invalid limit parameters: {e}"),
                );
                return None;
            }
        };
        Some(Limit {
            name: limit.name.clone(),
            requests_per_unit: limit.requests_per_unit,
            unit: limit.unit,
            window_seconds: (limit.window_ms / 1000).max(1),
            policy: Arc::new(policy),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policy_file_names() {
        assert!(is_policy_file("a.yaml"));
        assert!(is_policy_file("a.YML"));
        assert!(!is_policy_file(".hidden.yaml"));
        assert!(!is_policy_file("..data"));
        assert!(!is_policy_file("README.md"));
        assert!(!is_policy_file("yaml"));
    }
}
