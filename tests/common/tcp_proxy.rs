//! A loopback TCP proxy for fault injection between edgelimit and a private redis-server.
//!
//! Runs on plain threads (independent of any test runtime). The mode is switched at any time
//! and applies to every connection, old and new:
//!
//! - `PassThrough`: bytes flow both ways.
//! - `Delay(d)`: client → Redis bytes are forwarded `d` after they arrived (in order).
//! - `DropAfterWrite`: the next client bytes are forwarded to Redis, then — after a short
//!   pause that lets Redis execute them — both sides are closed; the reply is never forwarded.
//!   The command may therefore have run while the client sees a broken connection.
//! - `Blackhole`: connections are accepted and read, nothing is forwarded either way.
//! - `Refuse`: the listening socket is closed (connects get ECONNREFUSED) and every open
//!   connection is reset, as if the server process were gone.
//!
//! `set_mode` is a barrier: when it returns, no chunk is still being forwarded under the
//! previous mode, so a test can date the start of a fault exactly.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, RwLock};
use std::thread;
use std::time::{Duration, Instant};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    PassThrough,
    Delay(Duration),
    DropAfterWrite,
    Blackhole,
    Refuse,
}

/// How long a dropped connection waits after forwarding, so Redis reads and runs the command
/// before it sees the connection close.
const DROP_PAUSE: Duration = Duration::from_millis(30);
const POLL: Duration = Duration::from_millis(20);

struct Shared {
    upstream: SocketAddr,
    mode: RwLock<Mode>,
    stop: AtomicBool,
    /// Whether the listening socket is open (false while refusing).
    listening: AtomicBool,
    /// Every socket of every connection, to reset them on `Refuse` and on drop.
    sockets: Mutex<Vec<TcpStream>>,
    accepted: AtomicU64,
    dropped_after_write: AtomicU64,
}

pub struct TcpProxy {
    pub port: u16,
    shared: Arc<Shared>,
    acceptor: Option<thread::JoinHandle<()>>,
}

impl TcpProxy {
    /// Listens on a free loopback port and forwards to `upstream` (e.g. `redis.addr()`).
    pub fn start(upstream: &str) -> Self {
        let upstream: SocketAddr = upstream.parse().expect("upstream address");
        assert!(
            upstream.ip().is_loopback(),
            "the proxy only forwards to loopback"
        );
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind proxy");
        let port = listener.local_addr().expect("proxy addr").port();
        let shared = Arc::new(Shared {
            upstream,
            mode: RwLock::new(Mode::PassThrough),
            stop: AtomicBool::new(false),
            listening: AtomicBool::new(true),
            sockets: Mutex::new(Vec::new()),
            accepted: AtomicU64::new(0),
            dropped_after_write: AtomicU64::new(0),
        });
        let acceptor = {
            let shared = shared.clone();
            thread::spawn(move || accept_loop(listener, port, shared))
        };
        Self {
            port,
            shared,
            acceptor: Some(acceptor),
        }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    pub fn mode(&self) -> Mode {
        *self.shared.mode.read().expect("mode lock")
    }

    /// Switches the mode; returns once nothing is forwarded under the old mode any more and
    /// the listening socket is closed (`Refuse`) or open again (any other mode).
    pub fn set_mode(&self, mode: Mode) {
        {
            let mut current = self.shared.mode.write().expect("mode lock");
            *current = mode;
            if mode == Mode::Refuse {
                reset_all(&self.shared);
            }
        }
        let want_listening = mode != Mode::Refuse;
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.shared.listening.load(Ordering::SeqCst) != want_listening {
            assert!(
                Instant::now() < deadline,
                "proxy did not switch to {mode:?}"
            );
            thread::sleep(Duration::from_millis(2));
        }
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> u64 {
        self.shared.accepted.load(Ordering::SeqCst)
    }

    /// Connections closed by `DropAfterWrite` after forwarding client bytes.
    pub fn dropped_after_write(&self) -> u64 {
        self.shared.dropped_after_write.load(Ordering::SeqCst)
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        reset_all(&self.shared);
        if let Some(acceptor) = self.acceptor.take() {
            let _ = acceptor.join();
        }
    }
}

fn reset_all(shared: &Shared) {
    let sockets = std::mem::take(&mut *shared.sockets.lock().expect("sockets lock"));
    for socket in sockets {
        let _ = socket.shutdown(Shutdown::Both);
    }
}

fn current(shared: &Shared) -> Mode {
    *shared.mode.read().expect("mode lock")
}

fn accept_loop(listener: TcpListener, port: u16, shared: Arc<Shared>) {
    let mut listener = Some(listener);
    while !shared.stop.load(Ordering::SeqCst) {
        let refusing = current(&shared) == Mode::Refuse;
        match (&listener, refusing) {
            (Some(_), true) => {
                listener = None; // closes the port: connects are refused
                shared.listening.store(false, Ordering::SeqCst);
            }
            (None, false) => {
                listener = rebind(port);
                shared.listening.store(true, Ordering::SeqCst);
            }
            _ => {}
        }
        let Some(l) = &listener else {
            thread::sleep(POLL);
            continue;
        };
        l.set_nonblocking(true).expect("nonblocking listener");
        match l.accept() {
            Ok((client, _)) => {
                shared.accepted.fetch_add(1, Ordering::SeqCst);
                start_connection(client, shared.clone());
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => thread::sleep(Duration::from_millis(5)),
            Err(_) => thread::sleep(POLL),
        }
    }
}

fn rebind(port: u16) -> Option<TcpListener> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match TcpListener::bind(("127.0.0.1", port)) {
            Ok(l) => return Some(l),
            Err(e) if Instant::now() > deadline => panic!("proxy cannot re-listen on {port}: {e}"),
            Err(_) => thread::sleep(POLL),
        }
    }
}

/// What the client → Redis writer does with one chunk.
enum Action {
    Forward { due: Instant, bytes: Vec<u8> },
    ForwardThenDrop(Vec<u8>),
}

fn start_connection(client: TcpStream, shared: Arc<Shared>) {
    let _ = client.set_nonblocking(false);
    let upstream = match TcpStream::connect_timeout(&shared.upstream, Duration::from_secs(2)) {
        Ok(s) => s,
        Err(_) => {
            // Nothing to forward to: behave like the server, close.
            let _ = client.shutdown(Shutdown::Both);
            return;
        }
    };
    let _ = client.set_nodelay(true);
    let _ = upstream.set_nodelay(true);
    for s in [&client, &upstream] {
        let _ = s.set_read_timeout(Some(Duration::from_millis(100)));
    }
    {
        let mut sockets = shared.sockets.lock().expect("sockets lock");
        for s in [&client, &upstream] {
            if let Ok(clone) = s.try_clone() {
                sockets.push(clone);
            }
        }
    }
    let (tx, rx) = mpsc::channel::<Action>();
    let (Ok(client_r), Ok(client_w), Ok(upstream_r), Ok(upstream_w)) = (
        client.try_clone(),
        client.try_clone(),
        upstream.try_clone(),
        upstream.try_clone(),
    ) else {
        return;
    };

    // client → channel: decides per chunk, by the mode at the time the bytes arrived. Ends at
    // the client's EOF (or a reset), which closes the channel.
    {
        let shared = shared.clone();
        thread::spawn(move || {
            let mut client_r = client_r;
            let mut buf = vec![0u8; 64 * 1024];
            while !shared.stop.load(Ordering::SeqCst) {
                let n = match client_r.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => n,
                    Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                        continue
                    }
                    Err(_) => break,
                };
                let bytes = buf[..n].to_vec();
                let action = match current(&shared) {
                    Mode::PassThrough => Action::Forward {
                        due: Instant::now(),
                        bytes,
                    },
                    Mode::Delay(d) => Action::Forward {
                        due: Instant::now() + d,
                        bytes,
                    },
                    Mode::DropAfterWrite => Action::ForwardThenDrop(bytes),
                    Mode::Blackhole | Mode::Refuse => continue,
                };
                if tx.send(action).is_err() {
                    break;
                }
            }
        });
    }

    // channel → Redis: honours delays (bytes the client sent before closing still arrive,
    // as over a slow network), then passes the client's EOF on; drops when told to.
    {
        let shared = shared.clone();
        thread::spawn(move || {
            let mut upstream_w = upstream_w;
            while let Ok(action) = rx.recv() {
                match action {
                    Action::Forward { due, bytes } => {
                        let now = Instant::now();
                        if due > now {
                            thread::sleep(due - now);
                        }
                        // Re-check under the mode lock: a fault switched on while the chunk
                        // waited applies to it (blackhole swallows, refuse has reset).
                        let mode = shared.mode.read().expect("mode lock");
                        if matches!(*mode, Mode::Blackhole | Mode::Refuse) {
                            continue;
                        }
                        if upstream_w.write_all(&bytes).is_err() {
                            break;
                        }
                    }
                    Action::ForwardThenDrop(bytes) => {
                        let _ = upstream_w.write_all(&bytes);
                        let _ = upstream_w.flush();
                        thread::sleep(DROP_PAUSE);
                        shared.dropped_after_write.fetch_add(1, Ordering::SeqCst);
                        let _ = client.shutdown(Shutdown::Both);
                        let _ = upstream_w.shutdown(Shutdown::Both);
                        return;
                    }
                }
            }
            let _ = upstream_w.shutdown(Shutdown::Write);
        });
    }

    // Redis → client: forwards replies only while passing through (or delaying requests).
    // Redis closing (or a reset) ends the whole connection.
    thread::spawn(move || {
        let mut upstream_r = upstream_r;
        let mut client_w = client_w;
        let mut buf = vec![0u8; 64 * 1024];
        while !shared.stop.load(Ordering::SeqCst) {
            let n = match upstream_r.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    continue
                }
                Err(_) => break,
            };
            let mode = shared.mode.read().expect("mode lock");
            if !matches!(*mode, Mode::PassThrough | Mode::Delay(_)) {
                continue;
            }
            if client_w.write_all(&buf[..n]).is_err() {
                break;
            }
        }
        let _ = client_w.shutdown(Shutdown::Both);
        let _ = upstream_r.shutdown(Shutdown::Both);
    });
}
