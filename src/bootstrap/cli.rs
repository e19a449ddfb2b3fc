//! Offline tools behind `edgelimit check` and `edgelimit explain`: they read policy files only,
//! never contact a backend and never read the HMAC secret.

use std::fmt::Write as _;
use std::path::Path;

use crate::contract::AlgorithmParams;
use crate::contract::Revision;
use crate::policy::{ConfigError, Limit, LoadOptions, PolicySet};

/// `check`: a one-line summary of a valid directory, or every error, one per line, as
/// `file:line:column: field: message`.
pub fn check(dir: &Path, options: &LoadOptions) -> Result<String, Vec<String>> {
    match PolicySet::load_dir(dir, options) {
        Ok(set) => {
            let limits: usize = set.rules().map(|r| r.limits.len()).sum();
            Ok(format!(
                "ok: {} domain(s), {} rule(s), {} limit(s) in {} (revision {})",
                set.domains().count(),
                set.len(),
                limits,
                dir.display(),
                Revision(set.revision())
            ))
        }
        Err(errors) => Err(errors.errors().iter().map(ConfigError::to_string).collect()),
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum EntryError {
    #[error("descriptor entry `{0}` is not written as key=value")]
    NoEquals(String),
    #[error("descriptor entry `{0}` has an empty key")]
    EmptyKey(String),
}

/// Parses `key=value` arguments (the value may be empty or contain `=`).
pub fn parse_entries(args: &[String]) -> Result<Vec<(String, String)>, EntryError> {
    args.iter()
        .map(|arg| match arg.split_once('=') {
            None => Err(EntryError::NoEquals(arg.clone())),
            Some(("", _)) => Err(EntryError::EmptyKey(arg.clone())),
            Some((k, v)) => Ok((k.to_owned(), v.to_owned())),
        })
        .collect()
}

/// `explain`: which rule a request's descriptor would match, and what it would enforce.
pub fn explain(set: &PolicySet, domain: &str, entries: &[(String, String)]) -> String {
    let mut out = String::new();
    if !set.has_domain(domain) {
        let _ = writeln!(
            out,
            "no match: domain `{domain}` is not configured (Envoy is answered OK without a limit)"
        );
        return out;
    }
    let pairs = entries.iter().map(|(k, v)| (k.as_str(), v.as_str()));
    let Some(rule) = set.find(domain, pairs) else {
        let keys: Vec<&str> = entries.iter().map(|(k, _)| k.as_str()).collect();
        let _ = writeln!(
            out,
            "no match: no rule of domain `{domain}` applies to entries [{}] (Envoy is answered OK without a limit)",
            keys.join(", ")
        );
        return out;
    };
    let _ = writeln!(out, "match: {}", rule.display_path);
    let _ = writeln!(out, "  rule: {}", rule.metric_name);
    let _ = writeln!(out, "  shadow: {}", yes_no(rule.shadow_mode));
    let _ = writeln!(out, "  unlimited: {}", yes_no(rule.unlimited));
    if !rule.replaces.is_empty() {
        let _ = writeln!(out, "  replaces: {}", rule.replaces.join(", "));
    }
    for limit in &rule.limits {
        let _ = writeln!(out, "  {}", describe_limit(limit));
    }
    out
}

fn yes_no(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "no"
    }
}

fn describe_limit(limit: &Limit) -> String {
    let policy = &limit.policy;
    let what = match *policy.params() {
        AlgorithmParams::FixedWindow { limit, window_ms }
        | AlgorithmParams::SlidingWindow { limit, window_ms } => {
            format!("{limit} per {} window", human_ms(window_ms))
        }
        AlgorithmParams::TokenBucket {
            capacity,
            refill_tokens,
            refill_period_ms,
        } => format!(
            "capacity {capacity}, refills {refill_tokens} per {}",
            human_ms(refill_period_ms)
        ),
    };
    let name = limit
        .name
        .as_deref()
        .map(|n| format!(" name={n}"))
        .unwrap_or_default();
    format!(
        "limit {}{name}: {} {what}; Envoy sees {} per {}; max_cost {}; revision {}",
        policy.id(),
        policy.algorithm().as_str(),
        limit.requests_per_unit,
        limit.unit.as_str(),
        policy.max_cost(),
        Revision(policy.revision()),
    )
}

/// `90000` → `90s`, `300000` → `5m`: the largest unit that divides exactly.
pub fn human_ms(ms: u64) -> String {
    const UNITS: [(u64, &str); 4] = [
        (86_400_000, "d"),
        (3_600_000, "h"),
        (60_000, "m"),
        (1000, "s"),
    ];
    for (size, suffix) in UNITS {
        if ms >= size && ms % size == 0 {
            return format!("{}{suffix}", ms / size);
        }
    }
    format!("{ms}ms")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(text: &str) -> (tempfile::TempDir, PolicySet) {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("p.yaml"), text).unwrap();
        let set = PolicySet::load_dir(dir.path(), &LoadOptions::default()).unwrap();
        (dir, set)
    }

    #[test]
    fn human_durations() {
        assert_eq!(human_ms(1000), "1s");
        assert_eq!(human_ms(300_000), "5m");
        assert_eq!(human_ms(90_000), "90s");
        assert_eq!(human_ms(86_400_000 * 30), "30d");
        assert_eq!(human_ms(250), "250ms");
    }

    #[test]
    fn entries_parse_as_key_value() {
        let args = vec!["a=1".to_owned(), "b==x".to_owned(), "c=".to_owned()];
        assert_eq!(
            parse_entries(&args).unwrap(),
            vec![
                ("a".into(), "1".into()),
                ("b".into(), "=x".into()),
                ("c".into(), "".into())
            ]
        );
        assert!(matches!(
            parse_entries(&["x".into()]),
            Err(EntryError::NoEquals(_))
        ));
        assert!(matches!(
            parse_entries(&["=x".into()]),
            Err(EntryError::EmptyKey(_))
        ));
    }

    #[test]
    fn explain_reports_the_rule_or_no_match() {
        let (_dir, set) = set("domain: api\ndescriptors:\n  - key: path\n    value: /login\n    shadow_mode: true\n    rate_limit: {name: login, algorithm: sliding_window, unit: minute, requests_per_unit: 5}\n");
        let out = explain(&set, "api", &[("path".into(), "/login".into())]);
        assert!(
            out.contains("match: domain=api / key=path,value=/login"),
            "{out}"
        );
        assert!(out.contains("sliding_window 5 per 1m window"), "{out}");
        assert!(out.contains("shadow: yes"), "{out}");
        let out = explain(&set, "api", &[("path".into(), "/other".into())]);
        assert!(out.starts_with("no match"), "{out}");
        assert!(!out.contains("/other"), "{out}");
        assert!(explain(&set, "nope", &[]).contains("not configured"));
    }

    #[test]
    fn check_summarises_or_lists_located_errors() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("p.yaml"),
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n",
        )
        .unwrap();
        let errors = check(dir.path(), &LoadOptions::default()).unwrap_err();
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(errors[0].contains("p.yaml:4:"), "{}", errors[0]);
        std::fs::write(
            dir.path().join("p.yaml"),
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
        )
        .unwrap();
        let summary = check(dir.path(), &LoadOptions::default()).unwrap();
        assert!(
            summary.starts_with("ok: 1 domain(s), 1 rule(s), 1 limit(s)"),
            "{summary}"
        );
    }
}
