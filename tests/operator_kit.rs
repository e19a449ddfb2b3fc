//! The operator kit in `deploy/` checked against the real server and the real tools: every
//! metric the Grafana dashboard and the Prometheus rules name is one a running server exports
//! (scraped after traffic that makes each one appear); the dashboard is a well-formed
//! dashboard; the rules pass `promtool check rules` and their unit tests; the Kubernetes
//! manifests validate against the Kubernetes schemas (`kubernetes-validate`).
//!
//! A missing tool skips its test with a message on the terminal; with
//! `EDGELIMIT_REQUIRE_TOOLS=1` (set by `.ci/run`) it fails instead.

mod common;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use common::redis_server::RedisServer;
use common::server::{
    call, descriptor, metric, request, wait_until, EdgelimitServer, ServerOptions,
};

const BOUND: Duration = Duration::from_secs(15);

fn deploy(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("deploy")
        .join(path)
}

// ---------------------------------------------------------------------------------------------
// PromQL: the metric names an expression selects.

const KEYWORDS: [&str; 8] = [
    "and", "or", "unless", "bool", "offset", "inf", "nan", "atan2",
];
const LABEL_LISTS: [&str; 6] = [
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
];

/// Metric names selected by a PromQL expression: identifiers that are not functions,
/// aggregations, keywords, label lists (`by (...)`, `on (...)`), label matchers (`{...}`),
/// ranges (`[5m]`), strings, numbers or Grafana variables (`$job`).
fn metric_names(expr: &str) -> Result<BTreeSet<String>, String> {
    let chars: Vec<char> = expr.chars().collect();
    let mut names = BTreeSet::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        match c {
            '"' | '\'' | '`' => i = skip_string(&chars, i)?,
            '{' => i = skip_group(&chars, i, '{', '}')?,
            '[' => i = skip_group(&chars, i, '[', ']')?,
            '$' => {
                i += 1;
                while i < chars.len() && is_ident(chars[i]) {
                    i += 1;
                }
            }
            c if c.is_ascii_digit() || c == '.' => {
                while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '.') {
                    i += 1;
                }
            }
            c if is_ident_start(c) => {
                let start = i;
                while i < chars.len() && is_ident(chars[i]) {
                    i += 1;
                }
                let word: String = chars[start..i].iter().collect();
                let mut next = i;
                while next < chars.len() && chars[next].is_whitespace() {
                    next += 1;
                }
                // `sum by (..) (..)`: an aggregation whose label list comes first.
                let rest: String = chars[next..].iter().take(16).collect();
                let call = chars.get(next) == Some(&'(')
                    || ["by", "without"].iter().any(|k| {
                        rest.strip_prefix(k)
                            .is_some_and(|r| r.trim_start().starts_with('('))
                    });
                if LABEL_LISTS.contains(&word.as_str()) {
                    if call {
                        i = skip_group(&chars, next, '(', ')')?;
                    }
                } else if !call && !KEYWORDS.contains(&word.as_str()) {
                    names.insert(word);
                }
            }
            _ => i += 1,
        }
    }
    Ok(names)
}

fn is_ident_start(c: char) -> bool {
    c.is_ascii_alphabetic() || c == '_' || c == ':'
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == ':'
}

/// Index just past the string literal that starts at `start`.
fn skip_string(chars: &[char], start: usize) -> Result<usize, String> {
    let quote = chars[start];
    let mut i = start + 1;
    while i < chars.len() {
        match chars[i] {
            '\\' if quote != '`' => i += 2,
            c if c == quote => return Ok(i + 1),
            _ => i += 1,
        }
    }
    Err(format!("unterminated string at {start}"))
}

/// Index just past the group that opens at `start`, skipping strings inside it.
fn skip_group(chars: &[char], start: usize, open: char, close: char) -> Result<usize, String> {
    let mut depth = 0;
    let mut i = start;
    while i < chars.len() {
        match chars[i] {
            '"' | '\'' | '`' => {
                i = skip_string(chars, i)?;
                continue;
            }
            c if c == open => depth += 1,
            c if c == close => {
                depth -= 1;
                if depth == 0 {
                    return Ok(i + 1);
                }
            }
            _ => {}
        }
        i += 1;
    }
    Err(format!("unbalanced `{open}` at {start}"))
}

#[test]
fn promql_metric_names_are_parsed_out_of_expressions() {
    let names = |e: &str| metric_names(e).unwrap().into_iter().collect::<Vec<_>>();
    assert_eq!(
        names(
            r#"histogram_quantile(0.99, sum by (le, program) (rate(a_bucket{job=~"$job", x="by (y)"}[$__rate_interval])))"#
        ),
        ["a_bucket"]
    );
    assert_eq!(
        names(
            r#"sum(rate(a_total{r="denied"}[5m])) / clamp_min(sum without (instance) (rate(a_total[5m])), 1e-9) > bool 0.5"#
        ),
        ["a_total"]
    );
    assert_eq!(
        names(r#"count(count_values("revision", b)) > 1 and on (job) c offset 5m or vector(0)"#),
        ["b", "c"]
    );
    assert_eq!(names("time() - d{a='}'} unless e"), ["d", "e"]);
    assert_eq!(names("x * on (a) group_left (b) y"), ["x", "y"]);
    assert!(metric_names("sum(a{b=\"c)").is_err());
}

// ---------------------------------------------------------------------------------------------
// What a running server exports.

struct Exported {
    /// Sample names (histograms as `_bucket`, `_sum`, `_count`) to their family's type.
    samples: BTreeMap<String, String>,
}

impl Exported {
    fn parse(&mut self, text: &str) {
        let mut types = HashMap::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                if let Some((name, kind)) = rest.split_once(' ') {
                    types.insert(name.to_owned(), kind.to_owned());
                }
            }
        }
        for line in text
            .lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
        {
            let name = line.split(['{', ' ']).next().unwrap_or_default();
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| name.strip_suffix(s).filter(|f| types.contains_key(*f)))
                .unwrap_or(name);
            let kind = types
                .get(family)
                .cloned()
                .unwrap_or_else(|| "untyped".into());
            self.samples.insert(name.to_owned(), kind);
        }
    }

    /// Names of `expr` that no server exported, with the expression for the message.
    fn missing(&self, expr: &str) -> Vec<String> {
        let names = metric_names(expr).unwrap_or_else(|e| panic!("{e} in `{expr}`"));
        assert!(!names.is_empty(), "no metric in `{expr}`");
        names
            .into_iter()
            .filter(|n| !self.samples.contains_key(n))
            .map(|n| format!("{n} (in `{expr}`)"))
            .collect()
    }
}

fn policy(limit: u32) -> String {
    format!(
        "domain: kit\ndescriptors:\n  - key: user\n    rate_limit: {{name: per-user, unit: hour, requests_per_unit: {limit}}}\n  - key: shadow\n    shadow_mode: true\n    rate_limit: {{unit: hour, requests_per_unit: 1}}\n"
    )
}

/// Scrapes a Redis-backed server and an embedded-backend server after traffic that makes
/// every metric appear: allowed, near-limit, denied (then denied locally), shadow denials, a
/// NOSCRIPT reload, a policy reload, the sampled gauges, and a fail-closed answer once Redis
/// is gone. Done once for all the tests of this file.
fn exported() -> &'static Exported {
    static EXPORTED: OnceLock<Exported> = OnceLock::new();
    EXPORTED.get_or_init(|| {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        let mut exported = Exported {
            samples: BTreeMap::new(),
        };
        runtime.block_on(async {
            let mut redis = RedisServer::start();
            let server = EdgelimitServer::start(ServerOptions::redis(
                &redis.url(),
                &[("kit.yaml", &policy(5))],
            ));
            let mut client = server.client().await;
            let send = |user: &'static str, key: &'static str| {
                request("kit", vec![descriptor(&[(key, user)])])
            };
            for _ in 0..8 {
                call(&mut client, send("a", "user")).await.expect("call");
            }
            call(&mut client, send("s", "shadow")).await.expect("call");
            call(&mut client, send("s", "shadow")).await.expect("call");
            redis.cli(&["SCRIPT", "FLUSH"]);
            call(&mut client, send("b", "user")).await.expect("call");
            server.write_policy("kit.yaml", &policy(6));
            assert!(
                wait_until(BOUND, || {
                    let text = server.metrics();
                    metric(&text, "edgelimit_config_reloads_total", &[]).is_some()
                        && metric(&text, "edgelimit_redis_live_connections", &[]).is_some()
                        && metric(&text, "edgelimit_redis_noscript_reloads_total", &[]).is_some()
                }),
                "reload, sampled gauges or NOSCRIPT reload not seen:\n{}",
                server.metrics()
            );
            redis.stop();
            call(&mut client, send("c", "user")).await.expect("call");
            let text = server.metrics();
            assert!(
                metric(&text, "edgelimit_backend_failures_total", &[]).is_some(),
                "{text}"
            );
            exported.parse(&text);

            let memory = EdgelimitServer::start(ServerOptions::memory(&[("kit.yaml", &policy(5))]));
            let mut client = memory.client().await;
            call(&mut client, send("a", "user")).await.expect("call");
            assert!(
                wait_until(BOUND, || metric(
                    &memory.metrics(),
                    "edgelimit_memory_subjects",
                    &[]
                )
                .is_some()),
                "{}",
                memory.metrics()
            );
            exported.parse(&memory.metrics());
        });
        exported
    })
}

// ---------------------------------------------------------------------------------------------
// Grafana dashboard.

fn dashboard() -> serde_json::Value {
    let path = deploy("grafana/edgelimit.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every PromQL expression of the dashboard: panel targets and query variables.
fn dashboard_queries(dash: &serde_json::Value) -> Vec<String> {
    let mut queries = Vec::new();
    for panel in dash["panels"].as_array().into_iter().flatten() {
        for target in panel["targets"].as_array().into_iter().flatten() {
            if let Some(expr) = target["expr"].as_str() {
                queries.push(expr.to_owned());
            }
        }
    }
    for var in dash["templating"]["list"].as_array().into_iter().flatten() {
        if var["type"] == "query" {
            let query = var["query"]["query"]
                .as_str()
                .or(var["query"].as_str())
                .unwrap_or_default();
            // `label_values(selector, label)`: the selector is PromQL, the label is not.
            let inner = query
                .strip_prefix("label_values(")
                .and_then(|q| q.strip_suffix(')'))
                .and_then(|q| q.rsplit_once(','))
                .map_or(query, |(selector, _)| selector);
            queries.push(inner.to_owned());
        }
    }
    queries
}

#[test]
fn dashboard_is_a_well_formed_grafana_dashboard() {
    let dash = dashboard();
    assert!(dash["uid"]
        .as_str()
        .is_some_and(|u| !u.is_empty() && u.len() <= 40));
    assert!(dash["title"].as_str().is_some_and(|t| !t.is_empty()));
    assert!(dash["schemaVersion"].as_u64().is_some_and(|v| v >= 36));
    let vars: Vec<&serde_json::Value> = dash["templating"]["list"]
        .as_array()
        .expect("templating")
        .iter()
        .collect();
    let var_names: BTreeSet<&str> = vars.iter().filter_map(|v| v["name"].as_str()).collect();
    let datasource_vars: BTreeSet<String> = vars
        .iter()
        .filter(|v| v["type"] == "datasource" && v["query"] == "prometheus")
        .filter_map(|v| v["name"].as_str().map(|n| format!("${{{n}}}")))
        .collect();
    assert!(
        !datasource_vars.is_empty(),
        "no Prometheus data source variable"
    );

    let panels = dash["panels"].as_array().expect("panels");
    assert!(panels.len() > 10);
    let mut ids = BTreeSet::new();
    let mut cells: Vec<(String, [u64; 4])> = Vec::new();
    for panel in panels {
        let title = panel["title"]
            .as_str()
            .expect("every panel has a title")
            .to_owned();
        assert!(
            ids.insert(panel["id"].as_u64().expect("integer id")),
            "duplicate id at {title}"
        );
        let grid = &panel["gridPos"];
        let pos = ["x", "y", "w", "h"].map(|k| {
            grid[k]
                .as_u64()
                .unwrap_or_else(|| panic!("{title}: gridPos.{k}"))
        });
        assert!(
            pos[0] + pos[2] <= 24 && pos[2] > 0 && pos[3] > 0,
            "{title}: {grid}"
        );
        for (other, o) in &cells {
            let apart = pos[0] + pos[2] <= o[0]
                || o[0] + o[2] <= pos[0]
                || pos[1] + pos[3] <= o[1]
                || o[1] + o[3] <= pos[1];
            assert!(apart, "`{title}` overlaps `{other}`");
        }
        cells.push((title.clone(), pos));
        let kind = panel["type"].as_str().expect("panel type");
        if kind == "row" {
            continue;
        }
        assert!(
            ["timeseries", "stat", "table", "gauge", "bargauge"].contains(&kind),
            "{title}: {kind}"
        );
        assert!(
            panel["description"].as_str().is_some_and(|d| !d.is_empty()),
            "{title}: description"
        );
        let ds = panel["datasource"]["uid"].as_str().unwrap_or_default();
        assert!(datasource_vars.contains(ds), "{title}: datasource {ds}");
        let targets = panel["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "{title}: no targets");
        let mut refs = BTreeSet::new();
        for target in targets {
            assert!(
                refs.insert(target["refId"].as_str().expect("refId")),
                "{title}: refId"
            );
            assert_eq!(target["datasource"]["uid"].as_str(), Some(ds), "{title}");
            let expr = target["expr"].as_str().expect("expr");
            for var in expr.split('$').skip(1) {
                let name: String = var
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                assert!(
                    name.starts_with("__") || var_names.contains(name.as_str()),
                    "{title}: unknown variable ${name}"
                );
            }
        }
    }
}

#[test]
fn dashboard_queries_name_only_exported_metrics() {
    let queries = dashboard_queries(&dashboard());
    let exported = exported();
    let missing: Vec<String> = queries.iter().flat_map(|q| exported.missing(q)).collect();
    assert!(
        missing.is_empty(),
        "not exported: {missing:#?}\nexported: {:#?}",
        exported.samples.keys()
    );
    // What the issue asks the dashboard to show.
    let named: BTreeSet<String> = queries
        .iter()
        .flat_map(|q| metric_names(q).unwrap())
        .collect();
    for wanted in [
        "edgelimit_decisions_total",
        "edgelimit_near_limit_total",
        "edgelimit_backend_failures_total",
        "edgelimit_grpc_request_seconds_bucket",
        "edgelimit_redis_command_seconds_bucket",
        "edgelimit_redis_live_connections",
        "edgelimit_redis_in_flight",
        "edgelimit_config_reloads_total",
        "edgelimit_config_revision",
        "edgelimit_memory_subjects",
    ] {
        assert!(
            named.contains(wanted),
            "the dashboard does not show {wanted}"
        );
    }
    // Rates only over counters and histogram series.
    for name in &named {
        let kind = &exported.samples[name];
        if name.ends_with("_total") {
            assert_eq!(kind, "counter", "{name}");
        }
        if name.ends_with("_bucket") {
            assert_eq!(kind, "histogram", "{name}");
        }
    }
}

// ---------------------------------------------------------------------------------------------
// External tools: skipped locally when absent, required in CI.

/// The tool on `PATH`, or `None` after saying on the terminal that the test is skipped.
/// With `EDGELIMIT_REQUIRE_TOOLS=1` a missing tool fails the test.
fn tool(name: &str, install: &str, test: &str) -> Option<PathBuf> {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(name))
            .find(|p| p.is_file())
    });
    if found.is_none() {
        let message = format!("`{name}` is not on PATH ({install})");
        if std::env::var("EDGELIMIT_REQUIRE_TOOLS").is_ok_and(|v| v == "1") {
            panic!("{message}; EDGELIMIT_REQUIRE_TOOLS=1 requires it");
        }
        // Written past the test harness's capture, so a passing run still shows the skip.
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED {test}: {message}; set EDGELIMIT_REQUIRE_TOOLS=1 to fail instead"
        );
    }
    found
}

fn run(command: &mut Command) -> String {
    let output = command
        .output()
        .unwrap_or_else(|e| panic!("{command:?}: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "{command:?} failed:\n{text}");
    text
}

#[derive(serde::Deserialize)]
struct RuleFile {
    groups: Vec<RuleGroup>,
}

#[derive(serde::Deserialize)]
struct RuleGroup {
    rules: Vec<AlertRule>,
}

#[derive(serde::Deserialize)]
struct AlertRule {
    alert: String,
    expr: String,
    labels: BTreeMap<String, String>,
    annotations: BTreeMap<String, String>,
}

fn alert_rules() -> Vec<AlertRule> {
    let path = deploy("prometheus/edgelimit-rules.yaml");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let file: RuleFile =
        serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    file.groups.into_iter().flat_map(|g| g.rules).collect()
}

#[test]
fn alert_rules_name_exported_metrics_and_carry_a_runbook() {
    let rules = alert_rules();
    let exported = exported();
    let mut missing = Vec::new();
    for rule in &rules {
        missing.extend(exported.missing(&rule.expr));
        assert!(
            ["critical", "warning"]
                .contains(&rule.labels.get("severity").map_or("", String::as_str)),
            "{}: severity",
            rule.alert
        );
        for annotation in ["summary", "runbook"] {
            assert!(
                rule.annotations
                    .get(annotation)
                    .is_some_and(|t| t.len() > 20),
                "{}: {annotation}",
                rule.alert
            );
        }
    }
    assert!(missing.is_empty(), "not exported: {missing:#?}");
    // The alerts the issue asks for.
    let names: BTreeSet<&str> = rules.iter().map(|r| r.alert.as_str()).collect();
    for wanted in [
        "EdgelimitFailingClosed",
        "EdgelimitBackendUnavailable",
        "EdgelimitConfigReloadFailing",
        "EdgelimitConfigRevisionMismatch",
        "EdgelimitLatencyNearEnvoyTimeout",
        "EdgelimitMemoryBackendAtCapacity",
    ] {
        assert!(names.contains(wanted), "missing alert {wanted}");
    }
}

#[test]
fn promtool_checks_and_unit_tests_the_rules_and_parses_the_dashboard_queries() {
    let test = "promtool_checks_and_unit_tests_the_rules_and_parses_the_dashboard_queries";
    let Some(promtool) = tool("promtool", "Debian package `prometheus`", test) else {
        return;
    };
    let dir = deploy("prometheus");
    let checked = run(Command::new(&promtool).current_dir(&dir).args([
        "check",
        "rules",
        "edgelimit-rules.yaml",
    ]));
    assert!(checked.contains("SUCCESS"), "{checked}");
    let tested = run(Command::new(&promtool).current_dir(&dir).args([
        "test",
        "rules",
        "edgelimit-rules.test.yaml",
    ]));
    assert!(tested.contains("SUCCESS"), "{tested}");

    // The dashboard's queries as recording rules, Grafana variables replaced by what they
    // expand to: promtool then parses each one as PromQL.
    let queries = dashboard_queries(&dashboard());
    let mut yaml = String::from("groups:\n  - name: dashboard\n    rules:\n");
    for (i, query) in queries.iter().enumerate() {
        let expr = query
            .replace("$__rate_interval", "5m")
            .replace("$job", ".+");
        yaml.push_str(&format!(
            "      - record: dashboard:query{i}\n        expr: {}\n",
            serde_json::to_string(&expr).expect("JSON string")
        ));
    }
    let tmp = tempfile::tempdir().expect("temp dir");
    std::fs::write(tmp.path().join("dashboard.yaml"), yaml).expect("write");
    let parsed = run(Command::new(&promtool).current_dir(tmp.path()).args([
        "check",
        "rules",
        "dashboard.yaml",
    ]));
    assert!(
        parsed.contains(&format!("SUCCESS: {} rules found", queries.len())),
        "{parsed}"
    );
}

// ---------------------------------------------------------------------------------------------
// Kubernetes manifests.

use serde_json::Value;

/// Every object of `deploy/kubernetes` (one file may hold several), with its file name.
fn manifests() -> Vec<(String, Value)> {
    let mut objects = Vec::new();
    for dir in ["kubernetes", "kubernetes/redis-example"] {
        let mut files: Vec<PathBuf> = std::fs::read_dir(deploy(dir))
            .expect("deploy/kubernetes")
            .map(|e| e.expect("entry").path())
            .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
            .collect();
        files.sort();
        for path in files {
            let text = std::fs::read_to_string(&path).expect("read manifest");
            let docs: Vec<Value> = serde_saphyr::from_multiple(&text)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            let name = path
                .file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned();
            objects.extend(docs.into_iter().map(|d| (name.clone(), d)));
        }
    }
    objects
}

fn find<'a>(objects: &'a [(String, Value)], kind: &str, name: &str) -> &'a Value {
    objects
        .iter()
        .map(|(_, o)| o)
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name}"))
}

/// Whether every `matchLabels`-style pair of `selector` is among `labels`.
fn selects(selector: &Value, labels: &Value) -> bool {
    let pairs = selector.as_object().expect("selector labels");
    !pairs.is_empty() && pairs.iter().all(|(k, v)| &labels[k] == v)
}

#[test]
fn kubernetes_manifests_fit_together_and_the_server_accepts_their_configuration() {
    let objects = manifests();
    let deployment = find(&objects, "Deployment", "edgelimit");
    let pod = &deployment["spec"]["template"];
    let pod_labels = &pod["metadata"]["labels"];
    assert!(selects(
        &deployment["spec"]["selector"]["matchLabels"],
        pod_labels
    ));
    let spec = &pod["spec"];
    assert_eq!(spec["securityContext"]["runAsNonRoot"], true);
    let container = &spec["containers"][0];
    let security = &container["securityContext"];
    assert_eq!(security["readOnlyRootFilesystem"], true);
    assert_eq!(security["allowPrivilegeEscalation"], false);
    assert_eq!(security["capabilities"]["drop"][0], "ALL");
    assert!(container["resources"]["requests"]["cpu"].is_string());
    assert!(container["resources"]["limits"]["memory"].is_string());
    let ports: BTreeSet<&str> = container["ports"]
        .as_array()
        .expect("ports")
        .iter()
        .filter_map(|p| p["name"].as_str())
        .collect();
    for (probe, path) in [("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")] {
        assert_eq!(container[probe]["httpGet"]["path"], path, "{probe}");
        let port = container[probe]["httpGet"]["port"]
            .as_str()
            .expect("named port");
        assert!(ports.contains(port), "{probe} port {port}");
    }

    // The server configuration and the policies, loaded by the server's own code.
    let config_map = find(&objects, "ConfigMap", "edgelimit-config");
    let config_text = config_map["data"]["edgelimit.yaml"]
        .as_str()
        .expect("edgelimit.yaml");
    let config = edgelimit::bootstrap::ServerConfig::parse(config_text)
        .unwrap_or_else(|e| panic!("configmap-config.yaml: {e}"));
    let mounts: BTreeMap<&str, &str> = container["volumeMounts"]
        .as_array()
        .expect("mounts")
        .iter()
        .map(|m| {
            (
                m["mountPath"].as_str().expect("path"),
                m["name"].as_str().expect("name"),
            )
        })
        .collect();
    let volumes: BTreeMap<&str, &Value> = spec["volumes"]
        .as_array()
        .expect("volumes")
        .iter()
        .map(|v| (v["name"].as_str().expect("name"), v))
        .collect();
    let volume_at = |path: &Path| {
        let dir = path.to_str().expect("utf-8");
        volumes[mounts
            .get(dir)
            .unwrap_or_else(|| panic!("nothing mounted at {dir}"))]
    };
    let policies = volume_at(&config.policy_dir)["configMap"]["name"]
        .as_str()
        .expect("configMap");
    let policy_map = find(&objects, "ConfigMap", policies);
    let dir = tempfile::tempdir().expect("temp dir");
    for (name, text) in policy_map["data"].as_object().expect("data") {
        std::fs::write(dir.path().join(name), text.as_str().expect("text")).expect("write");
    }
    let options = edgelimit::bootstrap::load_options(&config);
    if let Err(errors) = edgelimit::bootstrap::cli::check(dir.path(), &options) {
        panic!("configmap-policies.yaml: {errors:#?}");
    }
    let secret_file = config.hmac_secret.file.clone().expect("hmac_secret.file");
    let secret_volume = volume_at(secret_file.parent().expect("dir"));
    let secret = find(
        &objects,
        "Secret",
        secret_volume["secret"]["secretName"]
            .as_str()
            .expect("secret"),
    );
    let key = secret_file
        .file_name()
        .and_then(|k| k.to_str())
        .expect("key");
    assert!(
        secret["stringData"][key]
            .as_str()
            .is_some_and(|s| s.len() >= 32),
        "HMAC secret key {key}"
    );
    for env in container["env"].as_array().into_iter().flatten() {
        let from = &env["valueFrom"]["secretKeyRef"];
        let secret = find(
            &objects,
            "Secret",
            from["name"].as_str().expect("secret name"),
        );
        assert!(secret["stringData"][from["key"].as_str().expect("key")].is_string());
    }
    // Termination: the preStop sleep, then the server's own drain, within the grace period.
    let pre_stop = &container["lifecycle"]["preStop"]["exec"]["command"];
    assert_eq!(pre_stop[0], "sleep");
    let sleep: u64 = pre_stop[1]
        .as_str()
        .and_then(|s| s.parse().ok())
        .expect("sleep seconds");
    let grace = spec["terminationGracePeriodSeconds"]
        .as_u64()
        .expect("grace");
    assert!(
        grace > sleep + config.shutdown_grace.as_secs(),
        "terminationGracePeriodSeconds {grace} <= preStop {sleep}s + shutdown_grace {:?}",
        config.shutdown_grace
    );

    let service = find(&objects, "Service", "edgelimit");
    assert!(selects(&service["spec"]["selector"], pod_labels));
    let service_ports: BTreeSet<&str> = service["spec"]["ports"]
        .as_array()
        .expect("ports")
        .iter()
        .map(|p| {
            assert!(ports.contains(p["targetPort"].as_str().expect("named targetPort")));
            p["name"].as_str().expect("port name")
        })
        .collect();
    assert_eq!(config.listen.port(), 8081);
    assert_eq!(config.admin_listen.port(), 9090);

    // A CRD, so not in the Kubernetes schemas: its structure is checked here instead.
    let monitor = find(&objects, "ServiceMonitor", "edgelimit");
    assert_eq!(monitor["apiVersion"], "monitoring.coreos.com/v1");
    assert!(selects(
        &monitor["spec"]["selector"]["matchLabels"],
        &service["metadata"]["labels"]
    ));
    let endpoints = monitor["spec"]["endpoints"].as_array().expect("endpoints");
    assert!(!endpoints.is_empty());
    for endpoint in endpoints {
        assert!(service_ports.contains(endpoint["port"].as_str().expect("port name")));
        assert_eq!(endpoint["path"], "/metrics");
    }

    let pdb = find(&objects, "PodDisruptionBudget", "edgelimit");
    assert!(selects(&pdb["spec"]["selector"]["matchLabels"], pod_labels));
    let hpa = find(&objects, "HorizontalPodAutoscaler", "edgelimit");
    assert_eq!(hpa["spec"]["scaleTargetRef"]["kind"], "Deployment");
    assert_eq!(hpa["spec"]["scaleTargetRef"]["name"], "edgelimit");
    assert!(hpa["spec"]["minReplicas"].as_u64().is_some_and(|n| n >= 2));
    let policy = find(&objects, "NetworkPolicy", "edgelimit");
    assert!(selects(
        &policy["spec"]["podSelector"]["matchLabels"],
        pod_labels
    ));
    for rule in policy["spec"]["ingress"].as_array().expect("ingress") {
        for port in rule["ports"].as_array().expect("ports") {
            assert!(ports.contains(port["port"].as_str().expect("named port")));
        }
    }
    // The Redis example is labelled as such.
    for (file, object) in &objects {
        if file == "redis.yaml" {
            assert_eq!(
                object["metadata"]["labels"]["app.kubernetes.io/part-of"],
                "edgelimit-example"
            );
        }
    }
}

#[test]
fn kubernetes_manifests_validate_against_the_kubernetes_schemas() {
    let test = "kubernetes_manifests_validate_against_the_kubernetes_schemas";
    let Some(validate) = tool(
        "kubernetes-validate",
        "PyPI `kubernetes-validate`; .ci/run installs it in a venv",
        test,
    ) else {
        return;
    };
    // Not Kubernetes API objects: kustomization.yaml is read by kustomize; the
    // ServiceMonitor is a CRD with no schema here (checked structurally above).
    let skipped = ["kustomization.yaml", "servicemonitor.yaml"];
    let mut files = Vec::new();
    for dir in ["kubernetes", "kubernetes/redis-example"] {
        for entry in std::fs::read_dir(deploy(dir)).expect("deploy/kubernetes") {
            let path = entry.expect("entry").path();
            let name = path
                .file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned();
            if name.ends_with(".yaml") && !skipped.contains(&name.as_str()) {
                files.push(path);
            }
        }
    }
    let expected = manifests()
        .iter()
        .filter(|(file, _)| !skipped.contains(&file.as_str()))
        .count();
    // The oldest Kubernetes still commonly run, and the newest the tool knows.
    for version in ["1.29.0", "1.37.0"] {
        let out = run(Command::new(&validate)
            .args(["--strict", "--kubernetes-version", version])
            .args(&files));
        assert_eq!(
            out.matches(" passed for resource ").count(),
            expected,
            "{version}:\n{out}"
        );
        assert!(
            !out.contains("ERROR") && !out.contains("WARN"),
            "{version}:\n{out}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// `edgelimit top`: the live view, driven in a pseudo-terminal against a running server.

fn binary() -> PathBuf {
    std::env::var_os("EDGELIMIT_TEST_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_edgelimit")))
}

/// Waits at most `bound` for the child, killing it after that.
fn wait_output(mut child: std::process::Child, bound: Duration) -> (bool, String) {
    let deadline = std::time::Instant::now() + bound;
    while std::time::Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let output = child.wait_with_output().expect("child output");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.success(), text)
}

fn strip_ansi(text: &str) -> String {
    let mut out = String::new();
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            // CSI: ESC [ parameters final-byte.
            if chars.next() == Some('[') {
                for c in chars.by_ref() {
                    if c.is_ascii_alphabetic() {
                        break;
                    }
                }
            }
        } else if c != '\r' {
            out.push(c);
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn top_shows_live_figures_from_a_running_server_in_a_terminal() {
    let test = "top_shows_live_figures_from_a_running_server_in_a_terminal";
    // util-linux `script` runs the command in a pseudo-terminal.
    let Some(script) = tool("script", "util-linux, Debian package bsdutils", test) else {
        return;
    };
    let redis = RedisServer::start();
    let server = EdgelimitServer::start(ServerOptions::redis(
        &redis.url(),
        &[("kit.yaml", &policy(5))],
    ));
    let (status, body) = server.admin_get("/admin/policies");
    assert_eq!(status, 200, "{body}");
    let view: Value = serde_json::from_str(&body).expect("admin JSON");
    let policy_id = view["limits"]
        .as_array()
        .and_then(|l| l.iter().find(|l| l["name"] == "per-user"))
        .and_then(|l| l["policy_id"].as_str())
        .expect("per-user policy id")
        .to_owned();

    // Traffic for the whole run: each subject passes 5 times, then is denied.
    let mut client = server.client().await;
    let traffic = tokio::spawn(async move {
        for round in 0..120u32 {
            for i in 0..8 {
                let user = format!("raw-subject-{}", round / 10 * 8 + i);
                let req = request("kit", vec![descriptor(&[("user", &user)])]);
                call(&mut client, req).await.expect("call");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });

    let admin = format!("127.0.0.1:{}", server.admin_port);
    let command = format!(
        "{} top --admin {admin} --interval 1s --iterations 4",
        binary().display()
    );
    let child = Command::new(&script)
        .args(["-qefc", &command, "/dev/null"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn script");
    let (ok, raw) =
        tokio::task::spawn_blocking(move || wait_output(child, Duration::from_secs(30)))
            .await
            .expect("join");
    assert!(ok, "top failed:\n{raw}");
    // On a terminal every frame redraws the screen.
    let frames: Vec<String> = raw.split("\x1b[2J").skip(1).map(strip_ansi).collect();
    assert_eq!(frames.len(), 4, "{raw}");
    assert!(
        frames[0].contains("(rates from the next refresh)"),
        "{}",
        frames[0]
    );
    let last = &frames[3];
    assert!(last.contains("READY"), "{last}");
    let figure = |line_start: &str, field: usize| -> f64 {
        let line = last
            .lines()
            .find(|l| l.starts_with(line_start))
            .unwrap_or_else(|| panic!("no `{line_start}` line:\n{last}"));
        let token = line.split_whitespace().nth(field).unwrap_or_default();
        token
            .trim_end_matches("/s")
            .trim_end_matches("ms")
            .trim_end_matches('%')
            .parse()
            .unwrap_or_else(|_| panic!("`{token}` in `{line}`"))
    };
    assert!(figure("requests", 1) > 0.0, "{last}");
    assert!(figure("requests", 6) > 0.0, "p99 {last}");
    assert!(figure("backend redis connections", 3) >= 1.0, "{last}");
    let (allowed, denied, ratio) = (
        figure(&policy_id, 1),
        figure(&policy_id, 2),
        figure(&policy_id, 5),
    );
    assert!(allowed > 0.0 && denied > 0.0, "{last}");
    assert!(ratio > 0.0 && ratio < 100.0, "{last}");
    assert!(
        !raw.contains("raw-subject"),
        "a descriptor value reached the view"
    );

    // Piped: frames one after another, no escape codes.
    let piped = Command::new(binary())
        .args([
            "top",
            "--admin",
            &admin,
            "--interval",
            "200ms",
            "--iterations",
            "2",
        ])
        .output()
        .expect("run top");
    let text = String::from_utf8_lossy(&piped.stdout);
    assert!(piped.status.success(), "{text}");
    assert!(!text.contains('\x1b'), "{text}");
    assert_eq!(text.matches("edgelimit top").count(), 2, "{text}");
    traffic.abort();

    // Nothing listening: a clear error, exit 1.
    let closed = common::redis_server::free_port();
    let failed = Command::new(binary())
        .args([
            "top",
            "--admin",
            &format!("127.0.0.1:{closed}"),
            "--iterations",
            "1",
        ])
        .output()
        .expect("run top");
    assert_eq!(failed.status.code(), Some(1));
    let err = String::from_utf8_lossy(&failed.stderr);
    assert!(
        err.contains(&format!("error: admin endpoint 127.0.0.1:{closed}")),
        "{err}"
    );
}
