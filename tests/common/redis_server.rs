//! Starts private `redis-server` processes on free loopback ports so tests can kill, pause or
//! flush them without touching any shared Redis. Each is stopped when dropped.

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

pub struct RedisServer {
    pub port: u16,
    child: Option<Child>,
    dir: tempfile::TempDir,
    extra_args: Vec<String>,
}

/// A port that was free a moment ago. Redis binds it right after; a clash is retried.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("bind an ephemeral loopback port")
}

fn redis_binary(name: &str) -> PathBuf {
    PathBuf::from(std::env::var("EDGELIMIT_REDIS_BIN_DIR").unwrap_or_else(|_| "/usr/bin".into()))
        .join(name)
}

impl RedisServer {
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// Starts redis-server with extra command-line options (e.g. `["--maxmemory", "1mb"]`).
    pub fn start_with(extra: &[&str]) -> Self {
        let mut dir = tempfile::tempdir().expect("temp dir for redis");
        let extra_args: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        for _ in 0..5 {
            let port = free_port();
            let mut server = RedisServer {
                port,
                child: None,
                dir,
                extra_args: extra_args.clone(),
            };
            if server.spawn() {
                return server;
            }
            dir = server.take_dir();
        }
        panic!("could not start redis-server on a free port after 5 attempts");
    }

    fn take_dir(mut self) -> tempfile::TempDir {
        self.stop();
        std::mem::replace(&mut self.dir, tempfile::tempdir().expect("temp dir"))
    }

    fn spawn(&mut self) -> bool {
        let mut cmd = Command::new(redis_binary("redis-server"));
        cmd.args([
            "--port",
            &self.port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--protected-mode",
            "yes",
            "--dir",
        ])
        .arg(self.dir.path())
        .args(&self.extra_args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
        let mut child = cmd.spawn().expect("spawn redis-server (is it installed?)");
        let stdout = child.stdout.take().expect("redis stdout");
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut ready = false;
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if line.contains("Ready to accept connections") {
                ready = true;
                break;
            }
            if Instant::now() > deadline {
                break;
            }
        }
        self.child = Some(child);
        if !ready {
            self.stop();
        }
        ready
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Runs `redis-cli` against this server and returns its stdout.
    pub fn cli(&self, args: &[&str]) -> String {
        let out = self.cli_output(args);
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    pub fn cli_output(&self, args: &[&str]) -> Output {
        Command::new(redis_binary("redis-cli"))
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(args)
            .output()
            .expect("run redis-cli")
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// SIGSTOP / SIGCONT: the process keeps its sockets but stops answering.
    pub fn pause(&self) {
        self.signal("-STOP");
    }
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, sig: &str) {
        if let Some(pid) = self.pid() {
            let _ = Command::new("kill").args([sig, &pid.to_string()]).status();
        }
    }

    /// Kills the process (SIGKILL) and waits for it.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Kills the process and starts it again on the same port with nothing persisted: the
    /// AOF and RDB files are deleted first, so every key is lost (a Redis without persistence).
    pub fn restart_empty(&mut self) {
        self.stop();
        for name in ["appendonlydir", "dump.rdb"] {
            let path = self.dir.path().join(name);
            let _ = std::fs::remove_dir_all(&path);
            let _ = std::fs::remove_file(&path);
        }
        self.restart();
    }

    /// Starts the server again on the same port and directory (after `stop`): with
    /// `--appendonly yes` the AOF is replayed, otherwise it starts empty.
    pub fn restart(&mut self) {
        self.stop();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if self.spawn() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("redis-server did not restart on port {}", self.port);
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.resume();
        self.stop();
    }
}
