//! Runs the real `edgelimit` binary as a child process with a generated configuration, and
//! gives tests a gRPC client built from envoy-types.

use std::io::Write;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tonic::transport::Channel;

use super::redis_server::free_port;

/// How long a started server may take to report ready (`wait_ready`).
pub const READY_BOUND: Duration = Duration::from_secs(20);

pub const TEST_SECRET: &str = "test-secret-0123456789abcdef-0123456789";

pub struct EdgelimitServer {
    pub grpc_port: u16,
    pub admin_port: u16,
    child: Option<Child>,
    pub dir: tempfile::TempDir,
    pub policy_dir: PathBuf,
    log: PathBuf,
}

/// Builder for a server configuration; `extra` is appended verbatim to the YAML.
pub struct ServerOptions {
    pub redis_url: Option<String>,
    pub policies: Vec<(String, String)>,
    pub extra: String,
    /// Lay the policies out as a Kubernetes ConfigMap volume (`..data` symlink).
    pub configmap: bool,
    /// HMAC secret (default `TEST_SECRET`) and, during a rotation, the previous one.
    pub secret: String,
    pub previous_secret: Option<String>,
    /// Settings under `redis:` (`command_timeout`, ...); replace the defaults of the same name.
    pub redis_settings: Vec<(String, String)>,
    /// Configure `policy_dir` as a symlink (`current` -> `policies`), as git-sync lays it out.
    pub linked: bool,
}

impl ServerOptions {
    pub fn redis(url: &str, policies: &[(&str, &str)]) -> Self {
        Self {
            redis_url: Some(url.to_owned()),
            policies: policies
                .iter()
                .map(|(n, t)| (n.to_string(), t.to_string()))
                .collect(),
            extra: String::new(),
            configmap: false,
            secret: TEST_SECRET.to_owned(),
            previous_secret: None,
            redis_settings: vec![
                ("command_timeout".into(), "2s".into()),
                ("connect_timeout".into(), "500ms".into()),
            ],
            linked: false,
        }
    }

    pub fn secrets(mut self, current: &str, previous: Option<&str>) -> Self {
        self.secret = current.to_owned();
        self.previous_secret = previous.map(str::to_owned);
        self
    }

    /// Sets one `redis:` setting, e.g. `.redis_setting("command_timeout", "300ms")`.
    /// Redis with the server's own defaults (the harness otherwise raises the command
    /// timeout to 2 s so that slow test machines do not time out).
    pub fn redis_defaults(url: &str, policies: &[(&str, &str)]) -> Self {
        let mut options = Self::redis(url, policies);
        options.redis_settings.clear();
        options
    }

    pub fn redis_setting(mut self, name: &str, value: &str) -> Self {
        self.redis_settings.retain(|(n, _)| n != name);
        self.redis_settings.push((name.into(), value.into()));
        self
    }

    pub fn memory(policies: &[(&str, &str)]) -> Self {
        Self {
            redis_url: None,
            ..Self::redis("", policies)
        }
    }

    pub fn linked(mut self) -> Self {
        self.linked = true;
        self
    }

    pub fn configmap(mut self) -> Self {
        self.configmap = true;
        self
    }

    pub fn extra(mut self, yaml: &str) -> Self {
        self.extra.push_str(yaml);
        self.extra.push('\n');
        self
    }
}

impl EdgelimitServer {
    pub fn start(options: ServerOptions) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let policy_dir = dir.path().join("policies");
        std::fs::create_dir(&policy_dir).expect("policy dir");
        if options.configmap {
            configmap_publish(&policy_dir, &options.policies, 0);
        } else {
            for (name, text) in &options.policies {
                std::fs::write(policy_dir.join(name), text).expect("write policy");
            }
        }
        let policy_dir = if options.linked {
            let link = dir.path().join("current");
            std::os::unix::fs::symlink("policies", &link).expect("policy dir symlink");
            link
        } else {
            policy_dir
        };
        let secret = dir.path().join("secret");
        std::fs::write(&secret, &options.secret).expect("write secret");
        let mut server = EdgelimitServer {
            grpc_port: 0,
            admin_port: 0,
            child: None,
            log: dir.path().join("server.log"),
            dir,
            policy_dir,
        };
        // A port found free can be taken before the server binds it (by any connection's
        // ephemeral port): then the server exits at once, and it is started on new ports.
        for _ in 0..5 {
            server.grpc_port = free_port();
            server.admin_port = free_port();
            let config = server.write_config(&options);
            if server.spawn(&config) {
                return server;
            }
        }
        panic!(
            "edgelimit could not listen on free ports after 5 attempts:\n{}",
            server.log_text()
        );
    }

    fn write_config(&self, options: &ServerOptions) -> PathBuf {
        let dir = self.dir.path();
        let secret = dir.join("secret");
        let mut yaml = format!(
            "listen: 127.0.0.1:{}\nadmin_listen: 127.0.0.1:{}\npolicy_dir: {}\nhmac_secret:\n  file: {}\n",
            self.grpc_port,
            self.admin_port,
            self.policy_dir.display(),
            secret.display()
        );
        if let Some(previous) = &options.previous_secret {
            let path = dir.join("previous-secret");
            std::fs::write(&path, previous).expect("write previous secret");
            yaml.push_str(&format!("  previous_file: {}\n", path.display()));
        }
        if let Some(url) = &options.redis_url {
            yaml.push_str(&format!("redis:\n  url: {url}\n"));
            for (name, value) in &options.redis_settings {
                yaml.push_str(&format!("  {name}: {value}\n"));
            }
        }
        yaml.push_str(&options.extra);
        let config = dir.join("edgelimit.yaml");
        std::fs::write(&config, yaml).expect("write config");
        config
    }

    /// Starts the server and waits until both listeners accept; false when it exited because
    /// a port was taken (any other early exit panics with the server's log).
    fn spawn(&mut self, config: &Path) -> bool {
        let log = std::fs::File::create(&self.log).expect("log file");
        let log_err = log.try_clone().expect("log file");
        // EDGELIMIT_TEST_BIN runs the tests against another build (e.g. the release binary).
        let binary = std::env::var_os("EDGELIMIT_TEST_BIN")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_edgelimit")));
        let child = Command::new(binary)
            .args(["serve", "--config"])
            .arg(config)
            .env("EDGELIMIT_LOG", "edgelimit=debug,info")
            .env("NO_COLOR", "1")
            .stdout(log)
            .stderr(log_err)
            .spawn()
            .expect("spawn edgelimit");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if listening(self.grpc_port) && listening(self.admin_port) {
                return true;
            }
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                self.child = None;
                let log = self.log_text();
                if log.contains("Address already in use") {
                    return false;
                }
                panic!("edgelimit exited early ({status}):\n{log}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("edgelimit did not listen in time:\n{}", self.log_text());
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn write_policy(&self, name: &str, text: &str) {
        let tmp = self.policy_dir.join(format!(".{name}.tmp"));
        let mut f = std::fs::File::create(&tmp).expect("create policy");
        f.write_all(text.as_bytes()).expect("write policy");
        f.sync_all().ok();
        std::fs::rename(&tmp, self.policy_dir.join(name)).expect("rename policy");
    }

    /// Publishes a new ConfigMap generation: a fresh `..<n>` directory, then an atomic
    /// rename of `..data_tmp` over `..data`, as the kubelet does.
    pub fn configmap_swap(&self, policies: &[(&str, &str)], generation: u32) {
        let owned: Vec<(String, String)> = policies
            .iter()
            .map(|(n, t)| (n.to_string(), t.to_string()))
            .collect();
        configmap_publish(&self.policy_dir, &owned, generation);
    }

    /// Waits until `/readyz` answers 200, as Envoy's traffic waits for the pod's readiness
    /// probe. `start` returns once the ports listen, which can be before the backend is up
    /// (Redis connections, Sentinel discovery, Cluster slots): a storm started then has its
    /// first calls answered fail-closed, which an exact count would take for an
    /// under-admission. Panics with the server's log if it is not ready within `READY_BOUND`.
    pub fn wait_ready(&self) {
        let ready = wait_until(READY_BOUND, || {
            http_get(self.admin_port, "/readyz").is_ok_and(|(status, _)| status == 200)
        });
        assert!(
            ready,
            "edgelimit not ready (/readyz 200) within {READY_BOUND:?}:\n{}",
            self.log_text()
        );
    }

    /// `GET path` on the admin listener: (status, body).
    pub fn admin_get(&self, path: &str) -> (u16, String) {
        http_get(self.admin_port, path).unwrap_or_else(|e| panic!("GET {path}: {e}"))
    }

    /// The admin `/metrics` text.
    pub fn metrics(&self) -> String {
        let (status, body) = self.admin_get("/metrics");
        assert_eq!(status, 200, "{body}");
        body
    }

    /// Sends a signal (`-HUP`, `-TERM`, ...) to the server process.
    pub fn signal(&self, sig: &str) {
        if let Some(pid) = self.pid() {
            let _ = Command::new("kill").args([sig, &pid.to_string()]).status();
        }
    }

    /// Waits for the process to exit by itself, at most `bound`.
    pub fn wait_exit(&mut self, bound: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + bound;
        while Instant::now() < deadline {
            if let Some(Ok(Some(status))) = self.child.as_mut().map(|c| c.try_wait()) {
                self.child = None;
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    /// The exit status if the process has exited (without waiting).
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    pub async fn client(&self) -> RateLimitServiceClient<Channel> {
        let endpoint = format!("http://127.0.0.1:{}", self.grpc_port);
        RateLimitServiceClient::connect(endpoint)
            .await
            .expect("connect to edgelimit")
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// Sends SIGTERM and waits for the exit status.
    pub fn terminate(&mut self) -> Option<std::process::ExitStatus> {
        let mut child = self.child.take()?;
        let _ = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(status)) = child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        child.wait().ok()
    }
}

impl Drop for EdgelimitServer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

pub fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(k, v)| Entry {
                key: k.to_string(),
                value: v.to_string(),
            })
            .collect(),
        ..Default::default()
    }
}

pub fn request(domain: &str, descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.into(),
        descriptors,
        hits_addend: 0,
    }
}

/// One call with Envoy's usual grpc-timeout.
pub async fn call(
    client: &mut RateLimitServiceClient<Channel>,
    req: RateLimitRequest,
) -> Result<RateLimitResponse, tonic::Status> {
    let mut r = tonic::Request::new(req);
    r.set_timeout(Duration::from_secs(5));
    client.should_rate_limit(r).await.map(|r| r.into_inner())
}

pub const OK: i32 = 1;
pub const OVER_LIMIT: i32 = 2;

fn configmap_publish(policy_dir: &Path, policies: &[(String, String)], generation: u32) {
    use std::os::unix::fs::symlink;
    let data_dir = format!("..2026_01_01_00_00_{generation:02}.000000001");
    std::fs::create_dir(policy_dir.join(&data_dir)).expect("configmap generation dir");
    for (name, text) in policies {
        std::fs::write(policy_dir.join(&data_dir).join(name), text).expect("write policy");
    }
    let tmp = policy_dir.join("..data_tmp");
    symlink(&data_dir, &tmp).expect("..data_tmp symlink");
    std::fs::rename(&tmp, policy_dir.join("..data")).expect("swap ..data");
    for (name, _) in policies {
        let link = policy_dir.join(name);
        if std::fs::symlink_metadata(&link).is_err() {
            symlink(format!("..data/{name}"), &link).expect("key symlink");
        }
    }
}

/// A minimal HTTP/1.1 GET (Connection: close) so tests need no HTTP client crate.
pub fn http_get(port: u16, path: &str) -> std::io::Result<(u16, String)> {
    use std::io::Read;
    let mut stream = TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let status = response
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("bad response: {response}")))?;
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    Ok((status, body))
}

/// Sum of the samples of `name` whose labels include every `labels` pair.
pub fn metric(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let mut found = None;
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let (series_name, series_labels) = match series.split_once('{') {
            Some((n, l)) => (n, l),
            None => (series, ""),
        };
        if series_name != name {
            continue;
        }
        if labels
            .iter()
            .all(|(k, v)| series_labels.contains(&format!("{k}=\"{v}\"")))
        {
            let v: f64 = value.parse().ok()?;
            found = Some(found.unwrap_or(0.0) + v);
        }
    }
    found
}

/// Polls `check` every 50 ms until it returns true, at most `bound`; returns whether it did.
pub fn wait_until(bound: Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + bound;
    loop {
        if check() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Whether something listens on the loopback port. A connection from an ephemeral port to the
/// same port number connects to itself (TCP simultaneous open) before the server binds it, and
/// would then keep the server from binding: such a self-connection does not count.
fn listening(port: u16) -> bool {
    match TcpStream::connect(("127.0.0.1", port)) {
        Ok(stream) => match (stream.local_addr(), stream.peer_addr()) {
            (Ok(local), Ok(peer)) => local != peer,
            _ => false,
        },
        Err(_) => false,
    }
}
