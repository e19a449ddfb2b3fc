//! Pushed `RateLimitConfig` resources → a [`PolicySet`], through the same loader as policy
//! files: each resource is written out as the reference's YAML (one "file" named
//! `xds:<resource name>`), so validation, ids, revisions and error messages are exactly
//! those of files, and counters of unchanged limits survive a push as they survive a reload.

use std::fmt::Write as _;
use std::path::PathBuf;

use prost::Message as _;

use super::proto::{
    RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, RateLimitUnit,
    RATE_LIMIT_CONFIG_TYPE_URL,
};
use crate::policy::{ConfigError, ConfigErrors, LoadOptions, PolicySet};

/// Decodes and validates a whole snapshot; every error of every resource is reported.
pub fn snapshot(
    resources: &[envoy_types::pb::google::protobuf::Any],
    options: &LoadOptions,
) -> Result<PolicySet, ConfigErrors> {
    let mut errors = Vec::new();
    let mut sources = Vec::with_capacity(resources.len());
    for (i, any) in resources.iter().enumerate() {
        let fallback = PathBuf::from(format!("xds:resources[{i}]"));
        if any.type_url != RATE_LIMIT_CONFIG_TYPE_URL {
            errors.push(ConfigError::new(
                &fallback,
                0,
                0,
                "(resource).type_url",
                format!(
                    "expected {RATE_LIMIT_CONFIG_TYPE_URL}, got {:?}",
                    any.type_url
                ),
            ));
            continue;
        }
        match RateLimitConfig::decode(any.value.as_slice()) {
            Ok(config) => {
                let path = if config.name.is_empty() {
                    fallback
                } else {
                    PathBuf::from(format!("xds:{}", config.name))
                };
                sources.push((path, to_yaml(&config)));
            }
            Err(e) => errors.push(ConfigError::new(
                &fallback,
                0,
                0,
                "(resource)",
                format!("not a valid RateLimitConfig: {e}"),
            )),
        }
    }
    let built = PolicySet::from_sources(sources, options);
    match built {
        Ok(set) if errors.is_empty() => Ok(set),
        Ok(_) => Err(ConfigErrors(errors)),
        Err(ConfigErrors(more)) => {
            errors.extend(more);
            Err(ConfigErrors(errors))
        }
    }
}

/// The reference's YAML for one resource. Strings are JSON-quoted, which YAML reads as
/// double-quoted scalars, so no pushed text can change the document's structure.
pub fn to_yaml(config: &RateLimitConfig) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "domain: {}", quote(&config.domain));
    if !config.descriptors.is_empty() {
        out.push_str("descriptors:\n");
        for d in &config.descriptors {
            descriptor(&mut out, d, 1);
        }
    }
    out
}

fn descriptor(out: &mut String, d: &RateLimitDescriptor, depth: usize) {
    let pad = "  ".repeat(depth);
    let _ = writeln!(out, "{pad}- key: {}", quote(&d.key));
    // proto3 has no absent string: empty means "no value", as in the reference.
    if !d.value.is_empty() {
        let _ = writeln!(out, "{pad}  value: {}", quote(&d.value));
    }
    if let Some(limit) = &d.rate_limit {
        policy(out, limit, &format!("{pad}  "));
    }
    for (flag, name) in [
        (d.shadow_mode, "shadow_mode"),
        (d.detailed_metric, "detailed_metric"),
        (d.quota_mode, "quota_mode"),
    ] {
        if flag {
            let _ = writeln!(out, "{pad}  {name}: true");
        }
    }
    if !d.descriptors.is_empty() {
        let _ = writeln!(out, "{pad}  descriptors:");
        for child in &d.descriptors {
            descriptor(out, child, depth + 2);
        }
    }
}

fn policy(out: &mut String, p: &RateLimitPolicy, pad: &str) {
    let _ = writeln!(out, "{pad}rate_limit:");
    if !p.name.is_empty() {
        let _ = writeln!(out, "{pad}  name: {}", quote(&p.name));
    }
    let unit = RateLimitUnit::try_from(p.unit).ok();
    if p.unlimited {
        let _ = writeln!(out, "{pad}  unlimited: true");
        // UNKNOWN is proto3's "not set"; a set unit is reported as on files.
        if let Some(unit) = unit.filter(|u| *u != RateLimitUnit::Unknown) {
            let _ = writeln!(out, "{pad}  unit: {}", unit_name(Some(unit), p.unit));
        }
    } else {
        let _ = writeln!(out, "{pad}  unit: {}", unit_name(unit, p.unit));
        let _ = writeln!(out, "{pad}  requests_per_unit: {}", p.requests_per_unit);
    }
    if !p.replaces.is_empty() {
        let _ = writeln!(out, "{pad}  replaces:");
        for r in &p.replaces {
            let _ = writeln!(out, "{pad}    - name: {}", quote(&r.name));
        }
    }
}

fn unit_name(unit: Option<RateLimitUnit>, raw: i32) -> String {
    match unit {
        Some(RateLimitUnit::Second) => "second".into(),
        Some(RateLimitUnit::Minute) => "minute".into(),
        Some(RateLimitUnit::Hour) => "hour".into(),
        Some(RateLimitUnit::Day) => "day".into(),
        Some(RateLimitUnit::Week) => "week".into(),
        Some(RateLimitUnit::Month) => "month".into(),
        Some(RateLimitUnit::Year) => "year".into(),
        // Left for the loader to reject with its usual message and location.
        Some(RateLimitUnit::Unknown) => quote("UNKNOWN"),
        None => quote(&format!("unit enum value {raw}")),
    }
}

fn quote(s: &str) -> String {
    serde_json::Value::from(s).to_string()
}

#[cfg(test)]
mod tests {
    use super::super::proto::RateLimitReplace;
    use super::*;

    fn any(config: &RateLimitConfig) -> envoy_types::pb::google::protobuf::Any {
        envoy_types::pb::google::protobuf::Any {
            type_url: RATE_LIMIT_CONFIG_TYPE_URL.into(),
            value: config.encode_to_vec(),
        }
    }

    fn limit(unit: RateLimitUnit, n: u32) -> Option<RateLimitPolicy> {
        Some(RateLimitPolicy {
            unit: unit as i32,
            requests_per_unit: n,
            ..RateLimitPolicy::default()
        })
    }

    fn sample() -> RateLimitConfig {
        RateLimitConfig {
            name: "gw".into(),
            domain: "envoy-gateway".into(),
            descriptors: vec![RateLimitDescriptor {
                key: "route".into(),
                value: "a\"b: [c]\n".into(),
                rate_limit: limit(RateLimitUnit::Minute, 3),
                shadow_mode: true,
                descriptors: vec![RateLimitDescriptor {
                    key: "user".into(),
                    rate_limit: Some(RateLimitPolicy {
                        unit: RateLimitUnit::Week as i32,
                        requests_per_unit: 9,
                        name: "per-user".into(),
                        replaces: vec![RateLimitReplace { name: "x".into() }],
                        ..RateLimitPolicy::default()
                    }),
                    ..RateLimitDescriptor::default()
                }],
                ..RateLimitDescriptor::default()
            }],
        }
    }

    #[test]
    fn a_resource_loads_like_the_equivalent_file() {
        let set = snapshot(&[any(&sample())], &LoadOptions::default()).unwrap();
        let rule = set
            .find("envoy-gateway", [("route", "a\"b: [c]\n")])
            .unwrap();
        assert_eq!(rule.limits[0].requests_per_unit, 3);
        assert!(rule.shadow_mode);
        let nested = set
            .find(
                "envoy-gateway",
                [("route", "a\"b: [c]\n"), ("user", "anyone")],
            )
            .unwrap();
        assert_eq!(nested.limits[0].unit, crate::policy::Unit::Week);
        assert_eq!(
            nested.limits[0].policy.id().to_string(),
            "envoy-gateway.per-user"
        );
    }

    #[test]
    fn errors_name_the_resource_and_the_field() {
        let mut bad = sample();
        bad.descriptors[0].rate_limit = limit(RateLimitUnit::Unknown, 3);
        let errors = snapshot(&[any(&bad)], &LoadOptions::default()).unwrap_err();
        let text = errors.to_string();
        assert!(text.contains("xds:gw:"), "{text}");
        assert!(text.contains("descriptors[0].rate_limit.unit"), "{text}");

        let wrong = envoy_types::pb::google::protobuf::Any {
            type_url: "type.googleapis.com/other".into(),
            value: vec![],
        };
        let text = snapshot(&[wrong], &LoadOptions::default())
            .unwrap_err()
            .to_string();
        assert!(
            text.contains("xds:resources[0]") && text.contains("type_url"),
            "{text}"
        );
    }

    #[test]
    fn unchanged_limits_keep_their_revision_across_pushes() {
        let options = LoadOptions::default();
        let first = snapshot(&[any(&sample())], &options).unwrap();
        let mut changed = sample();
        changed.descriptors[0].rate_limit = limit(RateLimitUnit::Minute, 4);
        let second = snapshot(&[any(&changed)], &options).unwrap();
        let key = [("route", "a\"b: [c]\n"), ("user", "u")];
        let revision = |s: &PolicySet| {
            s.find("envoy-gateway", key).unwrap().limits[0]
                .policy
                .revision()
        };
        assert_eq!(revision(&first), revision(&second));
        assert_ne!(first.revision(), second.revision());
    }
}
