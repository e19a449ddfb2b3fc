//! Behaviour of whole policy sets: the reference's matching and config rules, edgelimit's
//! extensions, every located error, directory loading, identity and revisions.

use std::path::{Path, PathBuf};

use proptest::prelude::*;

use super::*;
use edgelimit_contract::{Algorithm, AlgorithmParams};

fn opts() -> LoadOptions {
    LoadOptions::default()
}

fn load(yaml: &str) -> Result<PolicySet, ConfigErrors> {
    PolicySet::from_sources(vec![(PathBuf::from("t.yaml"), yaml.to_string())], &opts())
}

fn ok(yaml: &str) -> PolicySet {
    match load(yaml) {
        Ok(set) => set,
        Err(e) => panic!("expected a valid set, got:\n{e}"),
    }
}

fn errors(yaml: &str) -> Vec<ConfigError> {
    match load(yaml) {
        Ok(_) => panic!("expected errors for:\n{yaml}"),
        Err(e) => e.0,
    }
}

/// The single error, checked for line, field and a message fragment.
fn one_error(yaml: &str, line: usize, field: &str, fragment: &str) -> ConfigError {
    let errs = errors(yaml);
    assert_eq!(errs.len(), 1, "{errs:#?}");
    let e = errs.into_iter().next().unwrap();
    assert_eq!(e.line, line, "{e}");
    assert_eq!(e.field, field, "{e}");
    assert!(e.message.contains(fragment), "`{fragment}` not in: {e}");
    e
}

fn rpu(set: &PolicySet, domain: &str, entries: &[(&str, &str)]) -> Option<u64> {
    set.find(domain, entries.iter().copied())
        .and_then(|r| r.limits.first())
        .map(|l| l.requests_per_unit)
}

const REFERENCE: &str = "\
domain: api
descriptors:
  - key: path
    value: /login
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: path
    value: /api/*
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: path
    value: /api/admin/*
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: path
    rate_limit: {unit: minute, requests_per_unit: 4}
  - key: remote_address
    descriptors:
      - key: path
        value: /upload
        rate_limit: {unit: hour, requests_per_unit: 5}
  - key: user
    value: Admin
    rate_limit:
      unlimited: true
  - key: blocked
    rate_limit:
      unit: second
";

#[test]
fn exact_beats_wildcard_beats_key_only() {
    let set = ok(REFERENCE);
    assert_eq!(rpu(&set, "api", &[("path", "/login")]), Some(1));
    assert_eq!(rpu(&set, "api", &[("path", "/api/users")]), Some(2));
    assert_eq!(
        rpu(&set, "api", &[("path", "/api/admin/x")]),
        Some(3),
        "longest literal prefix wins among wildcards"
    );
    assert_eq!(rpu(&set, "api", &[("path", "/other")]), Some(4));
    assert_eq!(rpu(&set, "api", &[("path", "")]), Some(4));
}

#[test]
fn depth_must_equal_entry_count() {
    let set = ok(REFERENCE);
    assert_eq!(
        rpu(
            &set,
            "api",
            &[("remote_address", "1.2.3.4"), ("path", "/upload")]
        ),
        Some(5)
    );
    assert!(
        set.find("api", [("remote_address", "1.2.3.4")]).is_none(),
        "a rule that only groups nested descriptors answers nothing"
    );
    assert!(set
        .find("api", [("path", "/login"), ("extra", "x")])
        .is_none());
    assert!(set
        .find("api", [("remote_address", "1.2.3.4"), ("path", "/x")])
        .is_none());
    assert!(set.find("api", [] as [(&str, &str); 0]).is_none());
}

#[test]
fn matching_is_case_sensitive_and_scoped_to_the_domain() {
    let set = ok(REFERENCE);
    assert!(set.find("api", [("user", "admin")]).is_none());
    assert!(set.find("api", [("User", "Admin")]).is_none());
    assert!(set.find("API", [("path", "/login")]).is_none());
    assert!(set.find("other", [("path", "/login")]).is_none());
    assert!(set.has_domain("api") && !set.has_domain("other"));
    assert_eq!(set.domains().collect::<Vec<_>>(), vec!["api"]);
}

#[test]
fn unlimited_and_block_rules() {
    let set = ok(REFERENCE);
    let admin = set.find("api", [("user", "Admin")]).unwrap();
    assert!(admin.unlimited && admin.limits.is_empty() && admin.has_limit());
    let blocked = set.find("api", [("blocked", "x")]).unwrap();
    assert_eq!(
        blocked.limits[0].requests_per_unit, 0,
        "missing count is a block rule"
    );
    assert_eq!(
        *blocked.limits[0].policy.params(),
        AlgorithmParams::FixedWindow {
            limit: 0,
            window_ms: 1000
        }
    );
}

#[test]
fn values_are_raw_strings_and_units_case_insensitive() {
    let set = ok("domain: d\ndescriptors:\n  - key: k\n    value: 123\n    rate_limit: {unit: SECOND, requests_per_unit: 7}\n  - key: b\n    value: true\n    rate_limit: {unit: Month, requests_per_unit: 1}\n");
    assert_eq!(rpu(&set, "d", &[("k", "123")]), Some(7));
    let month = set.find("d", [("b", "true")]).unwrap();
    assert_eq!(month.limits[0].unit, Unit::Month);
    assert_eq!(month.limits[0].window_seconds, 30 * 86_400);
}

#[test]
fn empty_value_means_key_only_as_in_the_reference() {
    let set = ok("domain: d\ndescriptors:\n  - key: k\n    value: \"\"\n    rate_limit: {unit: second, requests_per_unit: 1}\n");
    assert!(set.find("d", [("k", "anything")]).is_some());
}

// ---- located errors -------------------------------------------------------------------

#[test]
fn error_display_names_file_line_column_and_field() {
    let e = one_error(
        "domain: d\ndescriptors:\n  - key: k\n  - key: j\n    rate_limit:\n      unit: fortnight\n",
        6,
        "descriptors[1].rate_limit.unit",
        "expected second, minute, hour, day, week, month or year",
    );
    assert_eq!(e.column, 13);
    assert_eq!(
        e.to_string(),
        "t.yaml:6:13: descriptors[1].rate_limit.unit: invalid unit `fortnight`; expected second, minute, hour, day, week, month or year"
    );
}

#[test]
fn top_level_errors() {
    one_error(
        "descriptors: []\n",
        1,
        "domain",
        "missing required field `domain`",
    );
    one_error("domain: \"\"\n", 1, "domain", "must not be empty");
    one_error("domain: d\nextra: 1\n", 2, "extra", "unknown field `extra`");
    one_error("- a\n", 1, "(document)", "expected a mapping");
    one_error(
        "domain: d\ndescriptors: {}\n",
        2,
        "descriptors",
        "expected a list",
    );
    one_error("", 1, "(document)", "empty");
    one_error("domain: [a]\n", 1, "domain", "expected a string");
}

#[test]
fn descriptor_errors() {
    one_error(
        "domain: d\ndescriptors:\n  - value: v\n",
        3,
        "descriptors[0]",
        "missing required field `key`",
    );
    one_error(
        "domain: d\ndescriptors:\n  - key: k\n    rate_limt: {}\n",
        4,
        "descriptors[0].rate_limt",
        "unknown field",
    );
    one_error(
        "domain: d\ndescriptors:\n  - key: k\n    value: v\n  - key: x\n  - key: k\n    value: v\n",
        6,
        "descriptors[2]",
        "already defined at line 3",
    );
    one_error(
        "domain: d\ndescriptors:\n  - key: k\n    shadow_mode: yes\n",
        4,
        "descriptors[0].shadow_mode",
        "expected true or false",
    );
    let e = errors("domain: d\ndescriptors:\n  - key: k\n    replaces:\n      - nam: x\n");
    assert_eq!(
        (e[0].line, e[0].field.as_str()),
        (5, "descriptors[0].replaces[0].nam")
    );
    assert!(e[0].message.contains("unknown field"), "{e:?}");
    assert_eq!(
        (e[1].line, e[1].field.as_str()),
        (5, "descriptors[0].replaces[0]")
    );
    assert!(
        e[1].message.contains("missing required field `name`"),
        "{e:?}"
    );
}

#[test]
fn limit_errors() {
    let base = "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n";
    let case = |body: &str, line: usize, field: &str, fragment: &str| {
        one_error(&format!("{base}{body}"), line, field, fragment);
    };
    let rl = "descriptors[0].rate_limit";
    case(
        "      unit: second\n      unlimited: true\n",
        5,
        &format!("{rl}.unit"),
        "must not have a `unit`",
    );
    case("      requests_per_unit: 5\n", 5, rl, "missing `unit`");
    case(
        "      unit: second\n      requests_per_unit: abc\n",
        6,
        &format!("{rl}.requests_per_unit"),
        "found `abc`",
    );
    case(
        "      unit: second\n      requests_per_unit: \"5\"\n",
        6,
        &format!("{rl}.requests_per_unit"),
        "quoted",
    );
    case(
        "      unit: second\n      requests_per_unit: -1\n",
        6,
        &format!("{rl}.requests_per_unit"),
        "non-negative",
    );
    case(
        "      unit: second\n      requests_per_unit: 99999999999999999999\n",
        6,
        &format!("{rl}.requests_per_unit"),
        "at most",
    );
    case(
        "      unit: second\n      algorithm: leaky\n",
        6,
        &format!("{rl}.algorithm"),
        "unknown algorithm `leaky`",
    );
    case(
        "      unit: second\n      burst: 5\n",
        6,
        &format!("{rl}.burst"),
        "only applies to `algorithm: token_bucket`",
    );
    case(
        "      unit: second\n      window: 30s\n",
        6,
        &format!("{rl}.window"),
        "cannot be combined",
    );
    case(
        "      window: 30x\n",
        5,
        &format!("{rl}.window"),
        "invalid window `30x`",
    );
    case(
        "      unit: second\n      unit_multiplier: 0\n",
        6,
        &format!("{rl}.unit_multiplier"),
        "at least 1",
    );
    case(
        "      unit: second\n      max_cost: 0\n",
        6,
        &format!("{rl}.max_cost"),
        "at least 1",
    );
    case(
        "      unlimited: true\n      algorithm: token_bucket\n",
        6,
        &format!("{rl}.algorithm"),
        "cannot be combined with `unlimited: true`",
    );
    case(
        "      unit: second\n      name: override\n",
        6,
        &format!("{rl}.name"),
        "reserved",
    );
}

#[test]
fn contract_range_errors_are_located() {
    // limit * 10^6 must stay below 2^53 for the sliding window's weighting.
    one_error(
        "domain: d\ndescriptors:\n  - key: a\n  - key: k\n    rate_limit:\n      algorithm: sliding_window\n      unit: second\n      requests_per_unit: 10000000000\n",
        // A block mapping starts at its first key.
        6,
        "descriptors[1].rate_limit",
        "outside the exact integer range",
    );
    one_error(
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, algorithm: token_bucket}\n",
        4,
        "descriptors[0].rate_limit",
        "refill_tokens must be at least 1",
    );
    one_error(
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: year, unit_multiplier: 2, requests_per_unit: 1}\n",
        4,
        "descriptors[0].rate_limit",
        "window_ms",
    );
}

#[test]
fn rate_limit_and_rate_limits_are_exclusive() {
    one_error(
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second}\n    rate_limits:\n      - {unit: day}\n",
        6,
        "descriptors[0].rate_limits",
        "cannot be combined with `rate_limit`",
    );
    one_error(
        "domain: d\ndescriptors:\n  - key: k\n    rate_limits:\n      - {unit: day}\n      - {unlimited: true}\n",
        6,
        "descriptors[0].rate_limits[1]",
        "cannot be combined with other limits",
    );
    one_error(
        "domain: d\ndescriptors:\n  - key: k\n    rate_limits: []\n",
        4,
        "descriptors[0].rate_limits",
        "at least one",
    );
}

#[test]
fn yaml_level_errors_are_located() {
    one_error(
        "domain: d\ndescriptors:\n  - key: k\n    key: j\n",
        4,
        "descriptors[0].key",
        "duplicate key `key`",
    );
    one_error("domain: &d d\n", 1, "domain", "anchors");
    one_error(
        "domain: d\n---\ndomain: e\n",
        2,
        "(document)",
        "one YAML document",
    );
    one_error("domain: !env d\n", 1, "domain", "tag");
    let e = errors("domain: d\ndescriptors:\n  - key: [\n");
    assert!(e[0].message.starts_with("invalid YAML"), "{e:?}");
}

#[test]
fn all_errors_of_all_files_are_collected() {
    let sources = vec![
        (
            PathBuf::from("a.yaml"),
            "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: eon}\n  - value: x\n"
                .to_string(),
        ),
        (PathBuf::from("b.yaml"), "domain: [\n".to_string()),
        (PathBuf::from("c.yaml"), "domain: c\nbogus: 1\n".to_string()),
    ];
    let errs = PolicySet::from_sources(sources, &opts()).unwrap_err();
    let places: Vec<(String, usize)> = errs
        .0
        .iter()
        .map(|e| (e.file.display().to_string(), e.line))
        .collect();
    assert_eq!(
        places,
        vec![
            ("a.yaml".to_string(), 4),
            ("a.yaml".to_string(), 5),
            ("b.yaml".to_string(), 2),
            ("c.yaml".to_string(), 2),
        ],
        "{errs}"
    );
    let shown = errs.to_string();
    assert!(
        shown.starts_with("4 policy configuration error(s)"),
        "{shown}"
    );
    assert!(
        shown.contains("\n  c.yaml:2:1: bogus: unknown field"),
        "{shown}"
    );
}

#[test]
fn schema_and_contract_errors_are_reported_together() {
    let errs = errors(
        "\
domain: api
descriptors:
  - key: a
    rate_limit: {unit: minute, requests_per_unit: 1.5}
  - key: b
    rate_limit: {unit: second, algorithm: token_bucket}
  - key: c
    rate_limit: {unit: second, name: dup}
  - key: d
    rate_limit: {unit: second, name: dup}
",
    );
    let lines: Vec<usize> = errs.iter().map(|e| e.line).collect();
    assert_eq!(lines, vec![4, 6, 10], "{errs:#?}");
}

#[test]
fn nesting_and_size_are_bounded() {
    let mut yaml = String::from("domain: d\ndescriptors:\n");
    for depth in 0..20 {
        let pad = "  ".repeat(depth * 2);
        yaml.push_str(&format!("{pad}  - key: k{depth}\n{pad}    descriptors:\n"));
    }
    let errs = errors(&yaml);
    assert!(
        errs.iter().any(|e| e.message.contains("deeper than")),
        "{errs:?}"
    );
    let small = LoadOptions {
        max_file_bytes: 10,
        ..opts()
    };
    let e = PolicySet::from_sources(
        vec![(PathBuf::from("big.yaml"), "domain: big\n".into())],
        &small,
    )
    .unwrap_err();
    assert_eq!(e.0[0].file, PathBuf::from("big.yaml"));
    assert!(e.0[0].message.contains("larger than"), "{e}");
}

#[test]
fn rules_per_domain_are_bounded() {
    let small = LoadOptions {
        max_rules_per_domain: 2,
        ..opts()
    };
    let yaml = "domain: d\ndescriptors:\n  - key: a\n  - key: b\n  - key: c\n";
    let e =
        PolicySet::from_sources(vec![(PathBuf::from("t.yaml"), yaml.into())], &small).unwrap_err();
    assert_eq!(e.0.len(), 1, "{e}");
    assert_eq!(e.0[0].line, 5);
}

#[test]
fn invalid_options_are_rejected() {
    let bad = LoadOptions {
        default_max_cost: 0,
        ..opts()
    };
    let e = PolicySet::from_sources(Vec::new(), &bad).unwrap_err();
    assert!(e.0[0].field.contains("default_max_cost"), "{e}");
}

// ---- extensions -----------------------------------------------------------------------

#[test]
fn extension_parameters() {
    let set = ok("\
domain: x
descriptors:
  - key: tb
    rate_limit: {algorithm: token_bucket, unit: minute, requests_per_unit: 60, burst: 5, max_cost: 3}
  - key: tb_default
    rate_limit: {algorithm: token_bucket, unit: second, requests_per_unit: 4}
  - key: sw
    rate_limit: {algorithm: sliding_window, unit: hour, unit_multiplier: 6, requests_per_unit: 9}
  - key: w30
    rate_limit: {window: 30s, requests_per_unit: 1}
  - key: w2h
    rate_limit: {window: 2h, requests_per_unit: 1}
  - key: multi
    rate_limits:
      - {unit: second, requests_per_unit: 1}
      - {unit: day, requests_per_unit: 2, name: daily}
");
    let limit = |k: &str| set.find("x", [(k, "v")]).unwrap().limits[0].clone();
    let tb = limit("tb");
    assert_eq!(
        *tb.policy.params(),
        AlgorithmParams::TokenBucket {
            capacity: 5,
            refill_tokens: 60,
            refill_period_ms: 60_000
        }
    );
    assert_eq!(tb.policy.max_cost(), 3);
    assert_eq!((tb.unit, tb.window_seconds), (Unit::Minute, 60));
    assert_eq!(
        *limit("tb_default").policy.params(),
        AlgorithmParams::TokenBucket {
            capacity: 4,
            refill_tokens: 4,
            refill_period_ms: 1000
        }
    );
    assert_eq!(limit("tb_default").policy.max_cost(), 1_000_000);
    let sw = limit("sw");
    assert_eq!(sw.policy.algorithm(), Algorithm::SlidingWindow);
    assert_eq!((sw.unit, sw.window_seconds), (Unit::Hour, 6 * 3600));
    assert_eq!(
        (limit("w30").unit, limit("w30").window_seconds),
        (Unit::Second, 30)
    );
    assert_eq!(
        (limit("w2h").unit, limit("w2h").window_seconds),
        (Unit::Hour, 7200)
    );
    let multi = set.find("x", [("multi", "v")]).unwrap();
    assert_eq!(multi.limits.len(), 2);
    let ids: Vec<&str> = multi
        .limits
        .iter()
        .map(|l| l.policy.id().as_str())
        .collect();
    assert!(
        ids[0].starts_with("x.r") && ids[0].ends_with(".0"),
        "{ids:?}"
    );
    assert_eq!(ids[1], "x.daily");
    assert_eq!(multi.limits[1].name.as_deref(), Some("daily"));
}

// ---- identity -------------------------------------------------------------------------

#[test]
fn ids_metric_names_and_display_paths() {
    let set = ok("\
domain: my api/v1
descriptors:
  - key: user
    value: alice@example.com
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: path
    descriptors:
      - key: method
        value: POST
        rate_limit: {unit: second, requests_per_unit: 1, name: Post Limit}
");
    let alice = set
        .find("my api/v1", [("user", "alice@example.com")])
        .unwrap();
    let id = alice.limits[0].policy.id().as_str();
    assert!(id.starts_with("my_api_v1-"), "{id}");
    assert!(
        !id.contains("alice") && !alice.metric_name.contains("alice"),
        "{id}"
    );
    assert_eq!(
        alice.metric_name, id,
        "single unnamed limit: metric name = id"
    );
    let rule_slug = id.rsplit('.').next().unwrap();
    assert!(rule_slug.starts_with('r') && rule_slug.len() == 13, "{id}");
    let post = set
        .find("my api/v1", [("path", "/x"), ("method", "POST")])
        .unwrap();
    let post_id = post.limits[0].policy.id().as_str();
    assert!(
        post_id.ends_with(".Post_Limit-") || post_id.contains(".Post_Limit-"),
        "{post_id}"
    );
    assert_eq!(
        post.display_path,
        "domain=my api/v1 / key=path / key=method,value=POST"
    );
    assert_eq!(set.domain_slug("my api/v1"), id.split('.').next());
    assert_eq!(set.len(), 3);
    assert_eq!(set.rules().filter(|r| r.has_limit()).count(), 2);
}

#[test]
fn ids_must_be_unique() {
    one_error(
        "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, name: same}\n  - key: b\n    rate_limit: {unit: second, name: same}\n",
        6,
        "descriptors[1].rate_limit",
        "already used by the limit at t.yaml:4",
    );
    // Same name in two domains is fine: ids are domain-scoped.
    let sources = vec![
        (
            PathBuf::from("a.yaml"),
            "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, name: same}\n"
                .to_string(),
        ),
        (
            PathBuf::from("b.yaml"),
            "domain: b\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, name: same}\n"
                .to_string(),
        ),
    ];
    assert!(PolicySet::from_sources(sources, &opts()).is_ok());
}

fn revision_of(yaml: &str, entries: &[(&str, &str)]) -> u64 {
    ok(yaml).find("d", entries.iter().copied()).unwrap().limits[0]
        .policy
        .revision()
}

#[test]
fn revisions_roll_when_the_state_changes_meaning_and_keep_when_only_a_number_changes() {
    let base = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 5}\n  - key: other\n    rate_limit: {unit: second, requests_per_unit: 1}\n";
    let r0 = revision_of(base, &[("k", "v")]);
    assert_eq!(
        r0,
        revision_of(base, &[("k", "v")]),
        "stable across reloads"
    );
    assert_eq!(ok(base).revision(), ok(base).revision());
    // A new window length or algorithm: the old counts mean something else, start fresh.
    let new_meaning = [
        base.replacen("unit: second", "unit: minute", 1),
        base.replace(
            "requests_per_unit: 5}",
            "requests_per_unit: 5, algorithm: sliding_window}",
        ),
        base.replace(
            "requests_per_unit: 5}",
            "requests_per_unit: 5, unit_multiplier: 2}",
        ),
    ];
    for changed in &new_meaning {
        assert_ne!(r0, revision_of(changed, &[("k", "v")]), "{changed}");
        assert_ne!(ok(base).revision(), ok(changed).revision());
    }
    // A new number or bound: same state, the counter is kept (the set's revision moves).
    let same_meaning = [
        base.replace("requests_per_unit: 5", "requests_per_unit: 6"),
        base.replace(
            "requests_per_unit: 5}",
            "requests_per_unit: 5, max_cost: 7}",
        ),
    ];
    for changed in &same_meaning {
        assert_eq!(r0, revision_of(changed, &[("k", "v")]), "{changed}");
        assert_ne!(ok(base).revision(), ok(changed).revision());
    }
    let tb = base.replace(
        "requests_per_unit: 5}",
        "requests_per_unit: 5, algorithm: token_bucket}",
    );
    let tb_burst = base.replace(
        "requests_per_unit: 5}",
        "requests_per_unit: 9, algorithm: token_bucket, burst: 9}",
    );
    assert_eq!(
        revision_of(&tb, &[("k", "v")]),
        revision_of(&tb_burst, &[("k", "v")]),
        "a new rate or burst keeps the bucket"
    );
    assert_ne!(revision_of(&tb, &[("k", "v")]), r0, "another algorithm");
    // Changing another rule, comments or order leaves this rule's revision alone.
    let other_changed = base.replace("requests_per_unit: 1", "requests_per_unit: 2");
    assert_eq!(r0, revision_of(&other_changed, &[("k", "v")]));
    let commented = format!("# comment\n{base}");
    assert_eq!(r0, revision_of(&commented, &[("k", "v")]));
    // Load options bound the evaluation, they do not change what the state means.
    let graceful = LoadOptions {
        cleanup_grace_ms: 1,
        ..opts()
    };
    let set =
        PolicySet::from_sources(vec![(PathBuf::from("t.yaml"), base.into())], &graceful).unwrap();
    assert_eq!(
        r0,
        set.find("d", [("k", "v")]).unwrap().limits[0]
            .policy
            .revision()
    );
}

#[test]
fn override_limit_is_a_bounded_fixed_window() {
    let set = ok(REFERENCE);
    let a = set.override_limit("api", 10, Unit::Minute).unwrap();
    assert_eq!(a.policy.id().as_str(), "api.override");
    assert_eq!(
        *a.policy.params(),
        AlgorithmParams::FixedWindow {
            limit: 10,
            window_ms: 60_000
        }
    );
    assert_eq!(
        (a.requests_per_unit, a.unit, a.window_seconds),
        (10, Unit::Minute, 60)
    );
    let b = set.override_limit("api", 10, Unit::Minute).unwrap();
    assert_eq!(a.policy.revision(), b.policy.revision());
    let c = set.override_limit("api", 11, Unit::Minute).unwrap();
    assert_ne!(a.policy.revision(), c.policy.revision());
    let d = set.override_limit("api", 10, Unit::Hour).unwrap();
    assert_ne!(a.policy.revision(), d.policy.revision());
    let unknown = set.override_limit("un known", 1, Unit::Second).unwrap();
    assert!(unknown.policy.id().as_str().starts_with("un_known-"));
    assert!(set.override_limit("api", u64::MAX, Unit::Second).is_err());
}

// ---- directories ----------------------------------------------------------------------

const SMALL: &str =
    "domain: {D}\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n";

fn small(domain: &str) -> String {
    SMALL.replace("{D}", domain)
}

fn write(dir: &Path, name: &str, text: &str) {
    std::fs::write(dir.join(name), text).unwrap();
}

#[test]
fn load_dir_follows_symlinks_and_ignores_dotfiles() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    // Kubernetes ConfigMap layout: ..2024_01_01/real files, ..data -> ..2024_01_01, and
    // top-level symlinks into ..data.
    std::fs::create_dir(root.join("..2024_01_01")).unwrap();
    write(&root.join("..2024_01_01"), "edge.yaml", &small("edge"));
    std::os::unix::fs::symlink("..2024_01_01", root.join("..data")).unwrap();
    std::os::unix::fs::symlink("..data/edge.yaml", root.join("edge.yaml")).unwrap();
    write(root, "api.yml", &small("api"));
    write(root, ".hidden.yaml", "not: [valid");
    write(root, "README.md", "not: [valid");
    std::fs::create_dir(root.join("dir.yaml")).unwrap();
    let set = PolicySet::load_dir(root, &opts()).unwrap();
    assert_eq!(set.domains().collect::<Vec<_>>(), vec!["api", "edge"]);
    assert!(set.find("edge", [("k", "v")]).is_some());
    let again = PolicySet::load_dir(root, &opts()).unwrap();
    assert_eq!(set.revision(), again.revision());
}

#[test]
fn load_dir_reports_io_problems_by_file() {
    let dir = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink("missing.yaml", dir.path().join("broken.yaml")).unwrap();
    write(dir.path(), "bin.yaml", "");
    std::fs::write(dir.path().join("bin.yaml"), [0xff, 0xfe]).unwrap();
    let e = PolicySet::load_dir(dir.path(), &opts()).unwrap_err();
    assert_eq!(e.0.len(), 2, "{e}");
    assert!(e.0.iter().any(|e| e.file.ends_with("broken.yaml")), "{e}");
    assert!(e.0.iter().any(|e| e.message.contains("UTF-8")), "{e}");
    let missing = PolicySet::load_dir(dir.path().join("nope"), &opts()).unwrap_err();
    assert!(missing.0[0]
        .message
        .contains("cannot read policy directory"));
    let big = LoadOptions {
        max_file_bytes: 8,
        ..opts()
    };
    let dir2 = tempfile::tempdir().unwrap();
    write(dir2.path(), "a.yaml", &small("a"));
    let e = PolicySet::load_dir(dir2.path(), &big).unwrap_err();
    assert!(
        e.0[0].file.ends_with("a.yaml") && e.0[0].message.contains("larger"),
        "{e}"
    );
}

#[test]
fn duplicate_domains_need_merging() {
    let two = || {
        vec![
            (PathBuf::from("a.yaml"), small("d")),
            (
                PathBuf::from("b.yaml"),
                "domain: d\ndescriptors:\n  - key: j\n    rate_limit: {unit: second, requests_per_unit: 2}\n".to_string(),
            ),
        ]
    };
    let e = PolicySet::from_sources(two(), &opts()).unwrap_err();
    assert_eq!(e.0.len(), 1);
    assert_eq!(
        (e.0[0].file.to_str(), e.0[0].line, e.0[0].field.as_str()),
        (Some("b.yaml"), 1, "domain")
    );
    assert!(e.0[0].message.contains("already defined in a.yaml"), "{e}");

    let merge = LoadOptions {
        merge_domains: true,
        ..opts()
    };
    let set = PolicySet::from_sources(two(), &merge).unwrap();
    assert!(set.find("d", [("k", "v")]).is_some() && set.find("d", [("j", "v")]).is_some());

    let conflict = vec![
        (PathBuf::from("a.yaml"), small("d")),
        (PathBuf::from("b.yaml"), format!("# x\n{}", small("d"))),
    ];
    let e = PolicySet::from_sources(conflict, &merge).unwrap_err();
    assert_eq!(
        (e.0[0].file.to_str(), e.0[0].line),
        (Some("b.yaml"), 4),
        "{e}"
    );
    assert!(e.0[0].message.contains("another file"), "{e}");
}

#[test]
fn shipped_policies_load() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../policies");
    let set = match PolicySet::load_dir(&dir, &opts()) {
        Ok(set) => set,
        Err(e) => panic!("{e}"),
    };
    assert_eq!(
        set.domains().collect::<Vec<_>>(),
        vec!["api", "edge", "web"]
    );
    let ip = set.find("edge", [("remote_address", "192.0.2.1")]).unwrap();
    assert_eq!(ip.limits.len(), 2);
    let key = set.find("api", [("api_key", "k-123")]).unwrap();
    assert_eq!(key.limits[0].policy.algorithm(), Algorithm::TokenBucket);
    let export = set.find("api", [("path", "/v1/export")]).unwrap();
    assert_eq!(export.limits[0].window_seconds, 30);
    assert!(set.find("api", [("path", "/v1/other")]).is_none());
    let probe = set
        .find("web", [("remote_address", "10.20.0.5"), ("path", "/x")])
        .unwrap();
    assert!(probe.unlimited);
    let asset = set
        .find(
            "web",
            [("remote_address", "192.0.2.1"), ("path", "/static/app.js")],
        )
        .unwrap();
    assert!(asset.shadow_mode);
    assert_eq!(asset.limits[0].name.as_deref(), Some("web-static-shadow"));
    let login = set
        .find("web", [("remote_address", "192.0.2.1"), ("path", "/login")])
        .unwrap();
    assert_eq!(login.replaces, vec!["web-pages-shadow".to_string()]);
    assert!(login.detailed_metric);
}

// ---- robustness -----------------------------------------------------------------------

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_yamlish_input_never_panics(text in "[a-z_:{}\\[\\],&*!|>'\" \n#~0-9.-]{0,200}") {
        let _ = load(&text);
    }

    #[test]
    fn mutated_valid_files_never_panic(cut in 0usize..600, insert in "[ :\\-\\[{}*&!\n]{0,4}") {
        let mut text = REFERENCE.to_string();
        let at = cut.min(text.len());
        text.insert_str(at, &insert);
        if let Err(errs) = load(&text) {
            for e in errs.0 {
                prop_assert!(e.line >= 1 || e.field == "(file)");
            }
        }
    }
}

// ---- the reference's newer fields -------------------------------------------------------

/// Every field the reference's format knows, written the way its documentation writes them.
const REFERENCE_FULL: &str = "\
domain: full
descriptors:
  - key: user
    quota_mode: true
    detailed_metric: true
    value_to_metric: true
    metadata:
      tier: {name: gold}
    rate_limit:
      name: per-user
      unit: week
      requests_per_unit: 70
  - key: user
    value: vip
    rate_limit:
      name: vip
      unit: DAY
      requests_per_unit: 1000
      replaces:
        - name: per-user
  - key: path
    value: /files/*
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: path
    value: /shared/*/raw
    share_threshold: true
    descriptors:
      - key: method
        rate_limit: {unit: second, requests_per_unit: 2}
  - key: path
    value: /own/*
    rate_limit: {unit: year, requests_per_unit: 9}
";

#[test]
fn the_whole_reference_format_loads() {
    let set = ok(REFERENCE_FULL);
    let user = set.find("full", [("user", "u1")]).unwrap();
    assert!(user.quota_mode && user.detailed_metric && user.value_to_metric);
    assert_eq!(user.limits[0].unit, Unit::Week);
    assert_eq!(user.limits[0].window_seconds, 7 * 86_400);
    let vip = set.find("full", [("user", "vip")]).unwrap();
    assert_eq!(vip.replaces, vec!["per-user".to_string()]);
    assert_eq!(vip.limits[0].unit, Unit::Day);
    let files = set.find("full", [("path", "/files/a")]).unwrap();
    assert_eq!(files.share_patterns, vec![Some("/files/*".to_string())]);
    assert_eq!(files.subject_value(0, b"/files/a"), b"/files/*");
    let nested = set
        .find("full", [("path", "/shared/x/raw"), ("method", "GET")])
        .unwrap();
    assert_eq!(
        nested.share_patterns,
        vec![Some("/shared/*/raw".into()), None]
    );
    assert_eq!(nested.subject_value(1, b"GET"), b"GET");
    let own = set.find("full", [("path", "/own/a")]).unwrap();
    assert!(own.share_patterns.is_empty(), "no sharing unless asked");
    assert_eq!(own.subject_value(0, b"/own/a"), b"/own/a");
    assert_eq!(own.limits[0].unit, Unit::Year);
}

#[test]
fn replaces_is_read_in_both_places() {
    let set = ok("domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      replaces: [{name: x}]\n    replaces: [{name: y}]\n");
    let rule = set.find("d", [("a", "1")]).unwrap();
    assert_eq!(rule.replaces, vec!["x".to_string(), "y".to_string()]);
    let set = ok("domain: d\ndescriptors:\n  - key: a\n    rate_limits:\n      - {unit: second, requests_per_unit: 1, replaces: [{name: x}]}\n");
    let rule = set.find("d", [("a", "1")]).unwrap();
    assert_eq!(rule.replaces, vec!["x".to_string()]);
}

#[test]
fn self_replacement_and_empty_replaces_are_located_errors() {
    one_error(
        "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      name: me\n      unit: second\n      requests_per_unit: 1\n      replaces:\n        - name: me\n",
        9,
        "descriptors[0].rate_limit.replaces[0].name",
        "cannot replace itself",
    );
    one_error(
        "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {name: me, unlimited: true}\n    replaces:\n      - name: me\n",
        6,
        "descriptors[0].replaces[0].name",
        "cannot replace itself",
    );
    one_error(
        "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      replaces:\n        - name: \"\"\n",
        7,
        "descriptors[0].rate_limit.replaces[0].name",
        "must not be empty",
    );
}

#[test]
fn share_threshold_needs_a_wildcard_and_new_flags_are_booleans() {
    one_error(
        "domain: d\ndescriptors:\n  - key: a\n    value: exact\n    share_threshold: true\n    rate_limit: {unit: second}\n",
        5,
        "descriptors[0].share_threshold",
        "wildcard",
    );
    one_error(
        "domain: d\ndescriptors:\n  - key: a\n    share_threshold: true\n    rate_limit: {unit: second}\n",
        4,
        "descriptors[0].share_threshold",
        "wildcard",
    );
    one_error(
        "domain: d\ndescriptors:\n  - key: a\n    quota_mode: often\n",
        4,
        "descriptors[0].quota_mode",
        "expected true or false",
    );
    one_error(
        "domain: d\ndescriptors:\n  - key: a\n    metadata: [1]\n",
        4,
        "descriptors[0].metadata",
        "expected a mapping",
    );
    one_error(
        "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: fortnight}\n",
        4,
        "descriptors[0].rate_limit.unit",
        "invalid unit",
    );
}
