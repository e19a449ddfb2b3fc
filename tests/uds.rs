//! gRPC on a Unix domain socket (`listen_uds`, the reference's `GRPC_UDS`), end to end with
//! the real binary: ShouldRateLimit over the socket, the socket's mode as configured, a stale
//! socket replaced, a regular file at the path left alone (and the start refused), the socket
//! removed on shutdown.

mod common;

use std::os::unix::fs::{FileTypeExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::redis_server::free_port;
use common::server::{call, descriptor, request, OK, OVER_LIMIT, TEST_SECRET};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use hyper_util::rt::TokioIo;
use tonic::transport::Endpoint;

const POLICY: &str =
    "domain: uds\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 2}\n";

struct Server {
    child: Child,
    dir: tempfile::TempDir,
    socket: PathBuf,
}

impl Server {
    fn config(dir: &Path, socket: &Path, mode: &str) -> PathBuf {
        let policies = dir.join("policies");
        std::fs::create_dir_all(&policies).unwrap();
        std::fs::write(policies.join("uds.yaml"), POLICY).unwrap();
        std::fs::write(dir.join("secret"), TEST_SECRET).unwrap();
        let config = dir.join("edgelimit.yaml");
        std::fs::write(
            &config,
            format!(
                "listen_uds:\n  path: {}\n  mode: \"{mode}\"\nadmin_listen: 127.0.0.1:{}\npolicy_dir: {}\nhmac_secret:\n  file: {}\n",
                socket.display(),
                free_port(),
                policies.display(),
                dir.join("secret").display()
            ),
        )
        .unwrap();
        config
    }

    fn spawn(config: &Path, dir: &Path) -> Child {
        let log = std::fs::File::create(dir.join("server.log")).unwrap();
        Command::new(env!("CARGO_BIN_EXE_edgelimit"))
            .args(["serve", "--config"])
            .arg(config)
            .env("EDGELIMIT_LOG", "edgelimit=debug,info")
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .stdin(Stdio::null())
            .spawn()
            .unwrap()
    }

    /// Starts a server and waits until its socket takes connections.
    fn start(dir: tempfile::TempDir, mode: &str) -> Server {
        let socket = dir.path().join("grpc.sock");
        let config = Self::config(dir.path(), &socket, mode);
        let child = Self::spawn(&config, dir.path());
        let mut server = Server { child, dir, socket };
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if std::os::unix::net::UnixStream::connect(&server.socket).is_ok() {
                return server;
            }
            if let Ok(Some(status)) = server.child.try_wait() {
                panic!("exited early ({status}):\n{}", server.log());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("socket not listening:\n{}", server.log());
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default()
    }

    async fn client(&self) -> RateLimitServiceClient<tonic::transport::Channel> {
        let path = self.socket.clone();
        // The URI is not used: every connection goes to the socket.
        let channel = Endpoint::from_static("http://uds.invalid")
            .connect_with_connector(tower::service_fn(move |_| {
                let path = path.clone();
                async move {
                    Ok::<_, std::io::Error>(TokioIo::new(
                        tokio::net::UnixStream::connect(path).await?,
                    ))
                }
            }))
            .await
            .expect("connect over the socket");
        RateLimitServiceClient::new(channel)
    }

    fn stop(&mut self) -> std::process::ExitStatus {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return status;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        panic!("did not stop:\n{}", self.log());
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn should_rate_limit_over_the_socket_with_its_mode_and_cleanup() {
    let dir = tempfile::tempdir().unwrap();
    // A socket left by a crashed server: replaced.
    drop(std::os::unix::net::UnixListener::bind(dir.path().join("grpc.sock")).unwrap());
    let mut server = Server::start(dir, "0660");
    let meta = std::fs::symlink_metadata(&server.socket).unwrap();
    assert!(meta.file_type().is_socket());
    assert_eq!(
        meta.permissions().mode() & 0o777,
        0o660,
        "mode as configured"
    );

    let mut client = server.client().await;
    let ask = || request("uds", vec![descriptor(&[("k", "v")])]);
    let mut codes = Vec::new();
    for _ in 0..3 {
        codes.push(call(&mut client, ask()).await.expect("call").overall_code);
    }
    assert_eq!(codes, vec![OK, OK, OVER_LIMIT], "{}", server.log());

    assert!(server.stop().success(), "{}", server.log());
    assert!(!server.socket.exists(), "socket removed on shutdown");
}

#[test]
fn a_regular_file_at_the_path_is_never_removed() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("grpc.sock");
    std::fs::write(&socket, "important").unwrap();
    let config = Server::config(dir.path(), &socket, "0600");
    let mut child = Server::spawn(&config, dir.path());
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "server did not refuse to start");
        std::thread::sleep(Duration::from_millis(20));
    };
    let log = std::fs::read_to_string(dir.path().join("server.log")).unwrap();
    assert!(!status.success());
    assert!(log.contains("not a socket"), "{log}");
    assert_eq!(std::fs::read_to_string(&socket).unwrap(), "important");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restrictive_mode_is_applied() {
    let server = Server::start(tempfile::tempdir().unwrap(), "0600");
    let mode = std::fs::metadata(&server.socket)
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o600);
    let mut client = server.client().await;
    let answer = call(&mut client, request("uds", vec![descriptor(&[("k", "w")])]))
        .await
        .unwrap();
    assert_eq!(answer.overall_code, OK);
}
