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

/// `serve` with `config` (YAML) written to a file next to `files`: exit code and stderr.
fn serve_with(config: &str, files: &[(&str, &str)]) -> (Option<i32>, String, String, String) {
    let dir = tempfile::tempdir().unwrap();
    for (name, text) in files {
        std::fs::write(dir.path().join(name), text).unwrap();
    }
    std::fs::create_dir(dir.path().join("policies")).unwrap();
    let path = dir.path().join("edgelimit.yaml");
    let base = format!(
        "listen: 127.0.0.1:0\nadmin_listen: 127.0.0.1:0\npolicy_dir: {}\n",
        dir.path().join("policies").display()
    );
    let yaml = (base + config).replace("$DIR", &dir.path().display().to_string());
    std::fs::write(&path, yaml).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_edgelimit"))
        .args(["serve", "--config"])
        .arg(&path)
        .env("NO_COLOR", "1")
        .env_remove("EDGELIMIT_LOG")
        .output()
        .expect("run edgelimit");
    let (stdout, stderr) = text(&out);
    (
        out.status.code(),
        stdout,
        stderr,
        path.display().to_string(),
    )
}

/// Errors found after the configuration file parsed (a secret, a password, a TLS file, a
/// Redis URL or setting) name the file and the field, and are printed once: the OS error is
/// not repeated by an error chain, and the message is one line of stderr.
#[test]
fn serve_errors_after_parsing_name_the_file_and_the_field_once() {
    const SECRET: &str = "a-secret-of-at-least-thirty-two-bytes!!";
    let secret = "hmac_secret:\n  file: $DIR/secret\n";
    // (config, files next to it, the field that must lead the message, a detail printed once)
    type Case<'a> = (&'a str, &'a [(&'a str, &'a str)], &'a str, &'a str);
    let cases: &[Case] = &[
        (
            "hmac_secret:\n  file: $DIR/missing\nredis:\n  url: redis://127.0.0.1:1/\n",
            &[],
            "hmac_secret.file: cannot read the secret file",
            "No such file",
        ),
        (
            "hmac_secret:\n  file: $DIR/secret\nredis:\n  url: redis://127.0.0.1:1/\n",
            &[("secret", "short")],
            "hmac_secret.file: the secret in file",
            "5 bytes",
        ),
        (
            "hmac_secret:\n  file: $DIR/secret\n  previous_file: $DIR/previous\n",
            &[("secret", SECRET), ("previous", "short")],
            "hmac_secret.previous_file: the secret in file",
            "5 bytes",
        ),
        (
            "redis:\n  url: redis://127.0.0.1:1/\n  password_file: $DIR/missing\n",
            &[("secret", SECRET)],
            "redis.password_file: cannot read",
            "No such file",
        ),
        (
            "redis:\n  url: rediss://127.0.0.1:1/\n  tls:\n    ca_file: $DIR/missing-ca.pem\n",
            &[("secret", SECRET)],
            "redis.tls.ca_file: cannot read",
            "No such file",
        ),
        (
            "redis:\n  url: 'notascheme://'\n",
            &[("secret", SECRET)],
            "redis.url: invalid Redis URL",
            "InvalidClientConfig",
        ),
        (
            "redis:\n  url: redis://127.0.0.1:1/\n  command_timeout: 2m\n",
            &[("secret", SECRET)],
            "redis.command_timeout",
            "outside",
        ),
        (
            "redis:\n  sentinel:\n    master_name: m\n    nodes: ['notascheme://']\n",
            &[("secret", SECRET)],
            "redis.sentinel.nodes: invalid Redis URL",
            "InvalidClientConfig",
        ),
        (
            "xds:\n  server_url: https://127.0.0.1:1\n  node_id: n\n  tls:\n    ca_file: $DIR/missing-ca.pem\n",
            &[("secret", SECRET)],
            "xds.tls.ca_file:",
            "No such file",
        ),
        (
            "tls:\n  cert_file: $DIR/missing-cert.pem\n  key_file: $DIR/missing-key.pem\n",
            &[("secret", SECRET)],
            "tls.key_file:",
            "No such file",
        ),
    ];
    for (config, files, field, detail) in cases {
        let full = if config.contains("hmac_secret") {
            config.to_string()
        } else {
            format!("{secret}{config}")
        };
        let (code, stdout, stderr, path) = serve_with(&full, files);
        let context = format!("config:\n{config}\nstdout:\n{stdout}\nstderr:\n{stderr}");
        assert_ne!(code, Some(0), "{context}");
        let lines: Vec<&str> = stderr.lines().filter(|l| l.contains(field)).collect();
        assert_eq!(lines.len(), 1, "printed once on stderr: {context}");
        let line = lines[0];
        assert!(
            line.starts_with(&format!("error: {path}: {field}")),
            "names the file, then the field: {context}"
        );
        assert_eq!(line.matches(detail).count(), 1, "detail once: {context}");
        assert!(
            !stdout.contains(field),
            "not printed again in the log: {context}"
        );
    }
}
