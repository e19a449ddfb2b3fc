//! `edgelimit check` and `edgelimit explain` as a CI pipeline or an operator runs them.

use std::path::Path;
use std::process::{Command, Output};

fn edgelimit(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_edgelimit"))
        .args(args)
        .env("NO_COLOR", "1")
        .output()
        .expect("run edgelimit")
}

fn text(out: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn repo_policies() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("policies")
        .display()
        .to_string()
}

#[test]
fn check_prints_each_error_with_file_line_column_and_exits_1() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("good.yaml"),
        "domain: good\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("bad.yaml"),
        "domain: bad\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: fortnight\n      requests_per_unit: 1\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 2}\n",
    )
    .unwrap();
    let out = edgelimit(&["check", &dir.path().display().to_string()]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stdout}{stderr}");
    let bad = dir.path().join("bad.yaml").display().to_string();
    let lines: Vec<&str> = stdout.lines().collect();
    assert!(lines.len() >= 2, "every error reported: {stdout}");
    for line in &lines {
        // file:line:column: field: message
        let rest = line.strip_prefix(&format!("{bad}:")).unwrap_or_else(|| {
            panic!("{line}");
        });
        let mut parts = rest.splitn(3, ':');
        assert!(
            parts.next().unwrap().parse::<usize>().unwrap() > 0,
            "{line}"
        );
        assert!(
            parts.next().unwrap().parse::<usize>().unwrap() > 0,
            "{line}"
        );
        assert!(parts.next().unwrap().contains(": "), "{line}");
    }
    assert!(stdout.contains(&format!("{bad}:5:")), "{stdout}");
    assert!(stderr.contains("error(s)"), "{stderr}");
}

#[test]
fn check_accepts_the_example_policies_with_a_summary() {
    let out = edgelimit(&["check", &repo_policies()]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}{stderr}");
    assert_eq!(stdout.lines().count(), 1, "{stdout}");
    assert!(stdout.starts_with("ok: 3 domain(s)"), "{stdout}");
}

#[test]
fn explain_shows_the_matching_rule_without_any_backend() {
    let out = edgelimit(&[
        "explain",
        "--policy-dir",
        &repo_policies(),
        "--domain",
        "edge",
        "remote_address=203.0.113.7",
    ]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(
        stdout.contains("match: domain=edge / key=remote_address"),
        "{stdout}"
    );
    assert!(stdout.contains("limit edge.edge-ip-per-second"), "{stdout}");
    assert!(stdout.contains("fixed_window 20 per 1s window"), "{stdout}");
    assert!(
        stdout.contains("fixed_window 200000 per 1d window"),
        "{stdout}"
    );
    assert!(stdout.contains("shadow: no"), "{stdout}");

    let out = edgelimit(&[
        "explain",
        "--policy-dir",
        &repo_policies(),
        "--domain",
        "web",
        "remote_address=10.20.0.5",
        "path=/anything",
    ]);
    let (stdout, _) = text(&out);
    assert!(stdout.contains("unlimited: yes"), "{stdout}");

    let out = edgelimit(&[
        "explain",
        "--policy-dir",
        &repo_policies(),
        "--domain",
        "edge",
        "user=x",
    ]);
    let (stdout, _) = text(&out);
    assert!(out.status.success());
    assert!(stdout.starts_with("no match"), "{stdout}");

    let out = edgelimit(&["explain", "--domain", "edge", "novalue"]);
    assert_eq!(out.status.code(), Some(2));
}
