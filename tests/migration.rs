//! Migrating from envoyproxy/ratelimit: realistic reference deployments — its environment
//! variables only (plus the HMAC secret), its runtime directory layout including the
//! Kubernetes ConfigMap one, its policy files — started as the reference would be and driven
//! over gRPC and `/json`, expecting the answers the reference gives.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use common::redis_server::{free_port, RedisServer};
use common::server::{
    call, descriptor, http_get, request, wait_until, OK, OVER_LIMIT, TEST_SECRET,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;

/// Written the way the reference's README writes its examples: `replaces` inside
/// `rate_limit`, `share_threshold`, `quota_mode`, `detailed_metric`, `unlimited`, wildcards.
const REFERENCE_CONFIG: &str = r#"
domain: migration
descriptors:
  - key: user
    detailed_metric: true
    rate_limit:
      name: per-user
      unit: minute
      requests_per_unit: 2
  - key: user
    value: vip
    rate_limit:
      name: vip
      unit: minute
      requests_per_unit: 5
      replaces:
        - name: per-user
  - key: path
    value: /files/*
    share_threshold: true
    rate_limit:
      unit: hour
      requests_per_unit: 3
  - key: quota_a
    quota_mode: true
    rate_limit: {unit: day, requests_per_unit: 1}
  - key: quota_b
    quota_mode: true
    rate_limit: {unit: day, requests_per_unit: 1}
  - key: health
    rate_limit:
      unlimited: true
  - key: blocked
    rate_limit:
      unit: second
      requests_per_unit: 0
"#;

/// The reference's runtime layout, `<root>/<subdirectory>/config/`, published the way a
/// Kubernetes ConfigMap volume is: files are symlinks into `..data`, itself a symlink to a
/// timestamped directory.
fn publish_configmap(config_dir: &Path, files: &[(&str, &str)]) {
    use std::os::unix::fs::symlink;
    std::fs::create_dir_all(config_dir).expect("config dir");
    let generation = "..2026_12_03_00_00_00.000000001";
    std::fs::create_dir(config_dir.join(generation)).expect("generation dir");
    for (name, text) in files {
        std::fs::write(config_dir.join(generation).join(name), text).expect("write config");
    }
    symlink(generation, config_dir.join("..data")).expect("..data");
    for (name, _) in files {
        symlink(format!("..data/{name}"), config_dir.join(name)).expect("key symlink");
    }
}

/// The edgelimit binary started with nothing but environment variables.
struct Reference {
    child: Option<Child>,
    grpc_port: u16,
    http_port: u16,
    log: PathBuf,
    _dir: tempfile::TempDir,
    root: PathBuf,
}

fn binary() -> PathBuf {
    std::env::var_os("EDGELIMIT_TEST_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_edgelimit")))
}

impl Reference {
    /// `configure` writes the runtime directory under the given root; `env` are the
    /// deployment's variables besides ports, Redis and the secret.
    fn start(redis: &RedisServer, env: &[(&str, &str)], configure: impl FnOnce(&Path)) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let root = dir.path().join("srv/runtime_data/current");
        configure(&root);
        let (grpc_port, http_port) = (free_port(), free_port());
        let log = dir.path().join("server.log");
        let out = std::fs::File::create(&log).expect("log");
        let err = out.try_clone().expect("log");
        let mut cmd = Command::new(binary());
        cmd.env_clear()
            .args(["serve", "--reference-env"])
            .env("RUNTIME_ROOT", &root)
            .env("GRPC_HOST", "127.0.0.1")
            .env("GRPC_PORT", grpc_port.to_string())
            .env("HOST", "127.0.0.1")
            .env("PORT", http_port.to_string())
            .env("REDIS_SOCKET_TYPE", "tcp")
            .env("REDIS_URL", redis.addr())
            .env("EDGELIMIT_HMAC_SECRET", TEST_SECRET)
            .env("NO_COLOR", "1");
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child = cmd.stdout(out).stderr(err).spawn().expect("spawn");
        let mut server = Reference {
            child: Some(child),
            grpc_port,
            http_port,
            log,
            _dir: dir,
            root,
        };
        let up = wait_until(Duration::from_secs(30), || {
            TcpStream::connect(("127.0.0.1", grpc_port)).is_ok()
                && TcpStream::connect(("127.0.0.1", http_port)).is_ok()
        });
        if !up {
            let exited = server
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten());
            panic!("not listening ({exited:?}):\n{}", server.log_text());
        }
        server
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    async fn ask(&self, descriptors: &[&[(&str, &str)]]) -> RateLimitResponse {
        let mut client =
            RateLimitServiceClient::connect(format!("http://127.0.0.1:{}", self.grpc_port))
                .await
                .expect("connect");
        let req = request(
            "migration",
            descriptors.iter().map(|d| descriptor(d)).collect(),
        );
        call(&mut client, req).await.expect("answered")
    }

    fn post_json(&self, body: &str) -> (u16, String) {
        let mut stream = TcpStream::connect(("127.0.0.1", self.http_port)).expect("connect");
        stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        write!(
            stream,
            "POST /json HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).unwrap();
        let status = response
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        let body = response
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.to_owned())
            .unwrap_or_default();
        (status, body)
    }
}

impl Drop for Reference {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn header<'a>(r: &'a RateLimitResponse, key: &str) -> Option<&'a str> {
    r.response_headers_to_add
        .iter()
        .find(|h| h.key == key)
        .map(|h| h.value.as_str())
}

#[tokio::test]
async fn a_kubernetes_deployment_of_the_reference_runs_unchanged() {
    let redis = RedisServer::start();
    let server = Reference::start(
        &redis,
        &[
            ("RUNTIME_SUBDIRECTORY", "ratelimit"),
            ("RUNTIME_WATCH_ROOT", "false"),
            ("RUNTIME_IGNOREDOTFILES", "true"),
            ("USE_STATSD", "false"),
            ("DEBUG_PORT", "6070"),
            ("LOG_LEVEL", "debug"),
            ("LOG_FORMAT", "json"),
            ("REDIS_TYPE", "single"),
            ("REDIS_TIMEOUT", "2s"),
            ("LIMIT_RESPONSE_HEADERS_ENABLED", "true"),
            ("LIMIT_REMAINING_HEADER", "X-Left"),
        ],
        |root| {
            publish_configmap(
                &root.join("ratelimit/config"),
                &[("config.yaml", REFERENCE_CONFIG)],
            )
        },
    );
    assert!(server.root.join("ratelimit/config/..data").exists());

    // A key-only limit with the reference's headers, names configurable.
    let first = server.ask(&[&[("user", "alice")]]).await;
    assert_eq!(first.overall_code, OK);
    assert_eq!(header(&first, "RateLimit-Limit"), Some("2"));
    assert_eq!(header(&first, "X-Left"), Some("1"));
    assert!(header(&first, "RateLimit-Reset").is_some_and(|s| s.parse::<u64>().unwrap() <= 60));
    assert!(
        header(&first, "Retry-After").is_none(),
        "only the reference's headers"
    );
    server.ask(&[&[("user", "alice")]]).await;
    let third = server.ask(&[&[("user", "alice")]]).await;
    assert_eq!(
        (third.overall_code, third.statuses[0].code),
        (OVER_LIMIT, OVER_LIMIT)
    );
    assert_eq!(header(&third, "X-Left"), Some("0"));

    // `replaces` inside `rate_limit`: the vip limit replaces per-user in the same request.
    let both = server.ask(&[&[("user", "bob")], &[("user", "vip")]]).await;
    assert!(
        both.statuses[0].current_limit.is_none(),
        "per-user replaced: {both:?}"
    );
    assert_eq!(both.statuses[1].current_limit.as_ref().unwrap().name, "vip");

    // `share_threshold`: every value matching `/files/*` shares one counter of 3.
    for path in ["/files/a", "/files/b", "/files/c"] {
        assert_eq!(
            server.ask(&[&[("path", path)]]).await.overall_code,
            OK,
            "{path}"
        );
    }
    let shared = server.ask(&[&[("path", "/files/d")]]).await;
    assert_eq!(
        shared.overall_code, OVER_LIMIT,
        "the fourth distinct value shares the count"
    );

    // `quota_mode`: over limit only when every quota descriptor is.
    let fresh = server
        .ask(&[&[("quota_a", "t")], &[("quota_b", "t")]])
        .await;
    assert_eq!(fresh.overall_code, OK);
    let one_over = server
        .ask(&[&[("quota_a", "t")], &[("quota_b", "u")]])
        .await;
    assert_eq!(
        one_over.statuses[0].code, OVER_LIMIT,
        "the status stays as computed"
    );
    assert_eq!(
        one_over.overall_code, OK,
        "another quota descriptor still has quota"
    );
    let all_over = server
        .ask(&[&[("quota_a", "t")], &[("quota_b", "t")]])
        .await;
    assert_eq!(all_over.overall_code, OVER_LIMIT);

    // Unlimited, no match, and a descriptor without entries.
    let mixed = server
        .ask(&[&[("health", "x")], &[("nothing", "x")], &[]])
        .await;
    assert_eq!(mixed.overall_code, OK);
    assert_eq!(mixed.statuses[0].limit_remaining, u32::MAX);
    assert!(mixed.statuses[1].current_limit.is_none() && mixed.statuses[2].current_limit.is_none());

    // The reference's HTTP endpoints on PORT.
    assert_eq!(
        http_get(server.http_port, "/healthcheck").unwrap(),
        (200, "OK".into())
    );
    let (status, body) = server.post_json(
        r#"{"domain":"migration","descriptors":[{"entries":[{"key":"user","value":"carol"}]}]}"#,
    );
    assert_eq!(status, 200, "{body}");
    assert!(body.contains(r#""overallCode":"OK""#), "{body}");
    assert!(
        body.contains(r#""requestsPerUnit":2"#) && body.contains(r#""unit":"MINUTE""#),
        "{body}"
    );
    let (status, body) = server.post_json(
        r#"{"domain":"migration","descriptors":[{"entries":[{"key":"blocked","value":"x"}]}]}"#,
    );
    assert_eq!(status, 429, "{body}");
    assert!(body.contains(r#""overallCode":"OVER_LIMIT""#), "{body}");
    assert_eq!(server.post_json("{not json").0, 400);
    assert_eq!(server.post_json(r#"{"domain":"","descriptors":[]}"#).0, 400);
    let (status, rlconfig) = http_get(server.http_port, "/rlconfig").unwrap();
    assert_eq!(status, 200);
    assert!(
        rlconfig.contains("domain=migration / key=user"),
        "{rlconfig}"
    );

    // One warning names what has no effect; the deployment's other variables are honoured.
    let log = server.log_text();
    let warnings: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("have no effect here"))
        .collect();
    assert_eq!(warnings.len(), 1, "{log}");
    assert!(
        warnings[0].contains("DEBUG_PORT") && warnings[0].contains("USE_STATSD"),
        "{log}"
    );
    assert!(
        log.lines().any(|l| l.starts_with('{')),
        "LOG_FORMAT=json: {log}"
    );
    // Privacy: no request value reached Redis.
    let keys = redis.cli(&["KEYS", "*"]);
    for value in ["alice", "/files/", "carol"] {
        assert!(!keys.contains(value), "{keys}");
    }
}

#[tokio::test]
async fn global_shadow_mode_and_health_with_at_least_one_config() {
    let redis = RedisServer::start();
    let server = Reference::start(
        &redis,
        &[
            ("SHADOW_MODE", "true"),
            ("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", "true"),
        ],
        |root| std::fs::create_dir_all(root.join("config")).expect("config dir"),
    );
    // No configuration yet: unhealthy, as the reference with this variable.
    assert_eq!(http_get(server.http_port, "/healthcheck").unwrap().0, 500);
    std::fs::write(server.root.join("config/config.yaml"), REFERENCE_CONFIG).unwrap();
    let healthy = wait_until(Duration::from_secs(20), || {
        http_get(server.http_port, "/healthcheck").is_ok_and(|(s, _)| s == 200)
    });
    assert!(
        healthy,
        "healthy once a config is loaded:\n{}",
        server.log_text()
    );

    // Shadow mode: the status keeps OVER_LIMIT, only the overall code becomes OK.
    let r = server.ask(&[&[("blocked", "x")]]).await;
    assert_eq!((r.overall_code, r.statuses[0].code), (OK, OVER_LIMIT));
    let (status, body) = server.post_json(
        r#"{"domain":"migration","descriptors":[{"entries":[{"key":"blocked","value":"x"}]}]}"#,
    );
    assert_eq!(status, 200, "{body}");
}

fn run_to_exit(env: &[(&str, &str)]) -> (Option<i32>, String) {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let file = std::fs::File::create(&out).unwrap();
    let mut cmd = Command::new(binary());
    cmd.env_clear().args(["serve", "--reference-env"]);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd
        .stdout(file.try_clone().unwrap())
        .stderr(file)
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let code = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status.code();
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    (code, std::fs::read_to_string(out).unwrap_or_default())
}

#[test]
fn the_secret_is_the_one_addition_and_unhonourable_settings_are_refused() {
    let base = [("REDIS_SOCKET_TYPE", "tcp"), ("REDIS_URL", "127.0.0.1:1")];
    let (code, out) = run_to_exit(&base);
    assert_eq!(code, Some(2), "{out}");
    assert!(
        out.contains("one addition") && out.contains("EDGELIMIT_HMAC_SECRET"),
        "{out}"
    );
    let mut tls = base.to_vec();
    tls.extend([
        ("EDGELIMIT_HMAC_SECRET", TEST_SECRET),
        ("GRPC_SERVER_USE_TLS", "true"),
    ]);
    let (code, out) = run_to_exit(&tls);
    assert_eq!(code, Some(2), "{out}");
    assert!(out.contains("GRPC_SERVER_USE_TLS"), "{out}");
    // The reference's default socket type is a unix socket: named, not silently changed.
    let (code, out) = run_to_exit(&[
        ("REDIS_URL", "/var/run/nutcracker/ratelimit.sock"),
        ("EDGELIMIT_HMAC_SECRET", TEST_SECRET),
    ]);
    assert_eq!(code, Some(2), "{out}");
    assert!(out.contains("REDIS_SOCKET_TYPE"), "{out}");
}

/// Started under the reference's name (`/bin/ratelimit` in the image), the binary is in the
/// reference environment mode without any argument: it asks for the one addition.
#[test]
fn started_as_ratelimit_it_reads_the_reference_environment() {
    let dir = tempfile::tempdir().unwrap();
    let link = dir.path().join("ratelimit");
    std::os::unix::fs::symlink(binary(), &link).unwrap();
    let out = dir.path().join("out");
    let file = std::fs::File::create(&out).unwrap();
    let mut child = Command::new(&link)
        .env_clear()
        .env("REDIS_SOCKET_TYPE", "tcp")
        .env("REDIS_URL", "127.0.0.1:1")
        .stdout(file.try_clone().unwrap())
        .stderr(file)
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "still running");
        std::thread::sleep(Duration::from_millis(20));
    };
    let text = std::fs::read_to_string(out).unwrap_or_default();
    assert_eq!(status.code(), Some(2), "{text}");
    assert!(
        text.contains("one addition") && text.contains("EDGELIMIT_HMAC_SECRET"),
        "{text}"
    );
}
