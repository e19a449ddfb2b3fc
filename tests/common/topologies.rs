//! Real Redis topologies on loopback for the topology tests: a 3-master Cluster, a primary +
//! replica + 3 Sentinels, and a TLS-only Redis with an ACL user and client certificates.
//! Every process runs on free ports in its own temporary directory, is killed when its owner
//! is dropped, and every wait is bounded.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use super::redis_server::free_port;
use super::server::{descriptor, request, EdgelimitServer, OK, OVER_LIMIT};

const START_BOUND: Duration = Duration::from_secs(15);

fn binary(name: &str) -> PathBuf {
    PathBuf::from(std::env::var("EDGELIMIT_REDIS_BIN_DIR").unwrap_or_else(|_| "/usr/bin".into()))
        .join(name)
}

/// Polls `check` every 50 ms until it is true; panics with `what` after `bound`.
pub fn wait_for(what: &str, bound: Duration, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + bound;
    while !check() {
        assert!(
            Instant::now() < deadline,
            "timed out after {bound:?}: {what}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// One `redis-server` (or Sentinel) process, killed on drop.
pub struct Node {
    pub port: u16,
    child: Option<Child>,
    /// Extra `redis-cli` arguments needed to talk to it (TLS, user).
    cli_args: Vec<String>,
    pub log: PathBuf,
    /// How it was started, for `restart`.
    conf_path: PathBuf,
    extra: Vec<String>,
}

impl Node {
    /// Starts `redis-server <conf> [extra...]` and waits until it answers `PING`.
    fn start(dir: &Path, name: &str, port: u16, conf: &str, extra: &[&str]) -> Node {
        Self::start_with_cli(dir, name, port, conf, extra, Vec::new())
    }

    fn start_with_cli(
        dir: &Path,
        name: &str,
        port: u16,
        conf: &str,
        extra: &[&str],
        cli_args: Vec<String>,
    ) -> Node {
        let node_dir = dir.join(name);
        std::fs::create_dir_all(&node_dir).expect("node dir");
        let log = node_dir.join("redis.log");
        let conf_path = node_dir.join("redis.conf");
        let conf = format!(
            "bind 127.0.0.1\ndaemonize no\ndir {}\nlogfile {}\nsave \"\"\nappendonly no\n{conf}",
            node_dir.display(),
            log.display()
        );
        std::fs::write(&conf_path, conf).expect("write redis.conf");
        let mut node = Node {
            port,
            child: None,
            cli_args,
            log,
            conf_path,
            extra: extra.iter().map(|s| (*s).to_owned()).collect(),
        };
        node.spawn(name);
        node
    }

    /// Starts the process from its configuration and waits until it answers `PING`.
    fn spawn(&mut self, name: &str) {
        let child = Command::new(binary("redis-server"))
            .arg(&self.conf_path)
            .args(&self.extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn redis-server (is it installed?)");
        self.child = Some(child);
        let node = self;
        let deadline = Instant::now() + START_BOUND;
        loop {
            if node.cli(&["PING"]).trim() == "PONG" {
                return;
            }
            if let Some(Ok(Some(status))) = node.child.as_mut().map(|c| c.try_wait()) {
                panic!(
                    "{name} exited ({status}):\n{}",
                    std::fs::read_to_string(&node.log).unwrap_or_default()
                );
            }
            assert!(
                Instant::now() < deadline,
                "{name} did not answer PING:\n{}",
                std::fs::read_to_string(&node.log).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub fn cli_output(&self, args: &[&str]) -> Output {
        Command::new(binary("redis-cli"))
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(&self.cli_args)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("run redis-cli")
    }

    /// `redis-cli --raw ARGS` against this node: its stdout.
    pub fn cli(&self, args: &[&str]) -> String {
        let mut all = vec!["--raw"];
        all.extend_from_slice(args);
        String::from_utf8_lossy(&self.cli_output(&all).stdout).into_owned()
    }

    /// Keys matching `pattern` held by this node (not following cluster redirects).
    pub fn keys(&self, pattern: &str) -> Vec<String> {
        self.cli(&["KEYS", pattern])
            .lines()
            .filter(|l| !l.is_empty())
            .map(str::to_owned)
            .collect()
    }

    /// Whether `ROLE` says master.
    pub fn is_master(&self) -> bool {
        self.cli(&["ROLE"]).lines().next() == Some("master")
    }

    pub fn info_field(&self, section: &str, field: &str) -> Option<String> {
        let prefix = format!("{field}:");
        self.cli(&["INFO", section])
            .lines()
            .find_map(|l| l.strip_prefix(&prefix).map(|v| v.trim().to_owned()))
    }

    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the killed process again with the same configuration and directory (a Cluster
    /// node keeps its `nodes.conf`, so it rejoins as itself).
    pub fn restart(&mut self) {
        self.kill();
        let name = format!("node on port {}", self.port);
        self.spawn(&name);
    }

    /// SIGSTOP / SIGCONT: the process keeps its sockets (connects still complete in the
    /// kernel) but answers nothing.
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    pub fn resume(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, sig: &str) {
        if let Some(child) = &self.child {
            let _ = Command::new("kill")
                .args([sig, &child.id().to_string()])
                .status();
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A Redis Cluster of `masters` masters and no replicas, created with
/// `redis-cli --cluster create`.
pub struct Cluster {
    pub nodes: Vec<Node>,
    _dir: tempfile::TempDir,
}

impl Cluster {
    pub fn start(masters: usize) -> Cluster {
        Self::start_with_replicas(masters, 0)
    }

    /// `masters` masters with `replicas` replicas each (`nodes` holds all of them; which is
    /// which is `is_master`).
    pub fn start_with_replicas(masters: usize, replicas: usize) -> Cluster {
        let total = masters * (1 + replicas);
        let dir = tempfile::tempdir().expect("cluster dir");
        let nodes: Vec<Node> = (0..total)
            .map(|i| {
                let port = free_port();
                // The bus port is chosen explicitly: port + 10000 may be taken or out of range.
                let bus = free_port();
                Node::start(
                    dir.path(),
                    &format!("node{i}"),
                    port,
                    &format!(
                        "port {port}\ncluster-enabled yes\ncluster-port {bus}\ncluster-config-file nodes.conf\ncluster-node-timeout 3000\n"
                    ),
                    &[],
                )
            })
            .collect();
        let addrs: Vec<String> = nodes.iter().map(Node::addr).collect();
        let out = Command::new(binary("redis-cli"))
            .args(["--cluster", "create"])
            .args(&addrs)
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .expect("redis-cli --cluster create");
        assert!(
            out.status.success(),
            "cluster create failed:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let cluster = Cluster { nodes, _dir: dir };
        wait_for("cluster_state:ok on every node", START_BOUND, || {
            cluster.nodes.iter().all(|n| {
                let info = n.cli(&["CLUSTER", "INFO"]);
                info.contains("cluster_state:ok")
                    && info.contains(&format!("cluster_known_nodes:{total}"))
                    && info.contains("cluster_slots_assigned:16384")
            })
        });
        if replicas > 0 {
            wait_for("every replica in sync", START_BOUND, || {
                cluster
                    .nodes
                    .iter()
                    .filter(|n| !n.is_master())
                    .all(|n| n.info_field("replication", "master_link_status") == Some("up".into()))
            });
        }
        cluster
    }

    /// The index of the node replicating `master`'s node, if any.
    pub fn replica_of(&self, master: usize) -> Option<usize> {
        let port = self.nodes[master].port.to_string();
        self.nodes.iter().position(|n| {
            !n.is_master() && n.info_field("replication", "master_port") == Some(port.clone())
        })
    }

    pub fn urls(&self) -> Vec<String> {
        self.nodes
            .iter()
            .map(|n| format!("redis://{}", n.addr()))
            .collect()
    }

    /// The server's `redis:` section for this cluster (plus any `extra` settings lines).
    pub fn config(&self, extra: &str) -> String {
        format!(
            "backend: redis\nredis:\n  cluster_nodes: [{}]\n{extra}",
            self.urls().join(", ")
        )
    }
}

pub const MASTER_NAME: &str = "edgelimit-primary";

/// A primary, one replica and three Sentinels monitoring them as `MASTER_NAME`.
pub struct SentinelGroup {
    /// `[0]` starts as the primary, `[1]` as its replica.
    pub data: Vec<Node>,
    pub sentinels: Vec<Node>,
    /// Set when the group serves TLS only (`start_tls`).
    pub certs: Option<Certs>,
    _dir: tempfile::TempDir,
}

impl SentinelGroup {
    pub fn start() -> SentinelGroup {
        let dir = tempfile::tempdir().expect("sentinel dir");
        Self::start_in(dir, None)
    }

    /// Every node and every Sentinel serves TLS only (`port 0`), replication and the
    /// Sentinels' own links to the data nodes included; clients need no certificate.
    pub fn start_tls() -> SentinelGroup {
        let dir = tempfile::tempdir().expect("sentinel dir");
        let certs = Certs::generate(dir.path());
        Self::start_in(dir, Some(certs))
    }

    fn start_in(dir: tempfile::TempDir, certs: Option<Certs>) -> SentinelGroup {
        let (tls_conf, cli_args) = match &certs {
            Some(c) => (
                format!(
                    "tls-cert-file {}\ntls-key-file {}\ntls-ca-cert-file {}\n\
                     tls-auth-clients no\ntls-replication yes\n",
                    c.server_cert.display(),
                    c.server_key.display(),
                    c.ca.display()
                ),
                vec![
                    "--tls".into(),
                    "--cacert".into(),
                    c.ca.display().to_string(),
                ],
            ),
            None => (String::new(), Vec::new()),
        };
        let listen = |port: u16| {
            if certs.is_some() {
                format!("port 0\ntls-port {port}\n{tls_conf}")
            } else {
                format!("port {port}\n")
            }
        };
        let start = |name: &str, port: u16, conf: String, extra: &[&str]| {
            Node::start_with_cli(dir.path(), name, port, &conf, extra, cli_args.clone())
        };
        let primary_port = free_port();
        let primary = start("primary", primary_port, listen(primary_port), &[]);
        let replica_port = free_port();
        let replica = start(
            "replica",
            replica_port,
            format!(
                "{}replicaof 127.0.0.1 {primary_port}\n",
                listen(replica_port)
            ),
            &[],
        );
        wait_for("replica linked to primary", START_BOUND, || {
            replica.info_field("replication", "master_link_status") == Some("up".into())
        });
        let sentinels: Vec<Node> = (0..3)
            .map(|i| {
                let port = free_port();
                start(
                    &format!("sentinel{i}"),
                    port,
                    format!(
                        "{}\
                         sentinel monitor {MASTER_NAME} 127.0.0.1 {primary_port} 2\n\
                         sentinel down-after-milliseconds {MASTER_NAME} 2000\n\
                         sentinel failover-timeout {MASTER_NAME} 10000\n\
                         sentinel parallel-syncs {MASTER_NAME} 1\n",
                        listen(port)
                    ),
                    &["--sentinel"],
                )
            })
            .collect();
        let group = SentinelGroup {
            data: vec![primary, replica],
            sentinels,
            certs,
            _dir: dir,
        };
        // A forced failover needs a replica the Sentinel considers good; the others must know
        // each other to take over the new configuration.
        wait_for(
            "sentinels see the replica and each other",
            START_BOUND,
            || {
                group.sentinels.iter().all(|s| {
                    let replicas = s.cli(&["SENTINEL", "REPLICAS", MASTER_NAME]);
                    let peers = s.cli(&["SENTINEL", "SENTINELS", MASTER_NAME]);
                    replicas.contains(&replica_port.to_string())
                        && !replicas.contains("disconnected")
                        && peers.matches("127.0.0.1").count() >= 2
                })
            },
        );
        group
    }

    pub fn sentinel_urls(&self) -> Vec<String> {
        self.sentinels
            .iter()
            .map(|n| {
                let scheme = if self.certs.is_some() {
                    "rediss"
                } else {
                    "redis"
                };
                format!("{scheme}://{}", n.addr())
            })
            .collect()
    }

    /// The server's `redis:` section; with TLS, `tls.ca_file` trusts the test CA for the
    /// Sentinels and the primary alike.
    pub fn config(&self, extra: &str) -> String {
        let tls = match &self.certs {
            Some(c) => format!("  tls:\n    ca_file: {}\n", c.ca.display()),
            None => String::new(),
        };
        format!(
            "backend: redis\nredis:\n  sentinel:\n    master_name: {MASTER_NAME}\n    nodes: [{}]\n{tls}{extra}",
            self.sentinel_urls().join(", ")
        )
    }

    /// The primary's port as `sentinel` reports it.
    pub fn primary_port(&self, sentinel: usize) -> Option<u16> {
        let out =
            self.sentinels[sentinel].cli(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER_NAME]);
        out.lines().nth(1).and_then(|p| p.trim().parse().ok())
    }

    /// The data node listening on `port`.
    pub fn node(&self, port: u16) -> &Node {
        self.data
            .iter()
            .find(|n| n.port == port)
            .expect("a data node on that port")
    }

    /// `SENTINEL FAILOVER` through Sentinel 0 (retried while it finds no good replica yet).
    pub fn force_failover(&self) {
        wait_for("SENTINEL FAILOVER accepted", START_BOUND, || {
            self.sentinels[0]
                .cli(&["SENTINEL", "FAILOVER", MASTER_NAME])
                .trim()
                == "OK"
        });
    }
}

/// CA, server and client certificates made with `openssl` for 127.0.0.1.
pub struct Certs {
    pub ca: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
    /// A second CA that signed nothing here: trusting it must fail.
    pub other_ca: PathBuf,
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new(std::env::var("EDGELIMIT_OPENSSL").unwrap_or_else(|_| "openssl".into()))
        .current_dir(dir)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run openssl (is it installed?)");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The key parameters of every key made here.
const EC_KEY: [&str; 5] = [
    "-newkey",
    "ec",
    "-pkeyopt",
    "ec_paramgen_curve:prime256v1",
    "-nodes",
];

impl Certs {
    pub fn generate(dir: &Path) -> Certs {
        for ca in ["ca", "other-ca"] {
            let mut args = vec!["req", "-x509", "-days", "2", "-subj"];
            let subj = format!("/CN=edgelimit test {ca}");
            args.push(&subj);
            args.extend_from_slice(&EC_KEY);
            let (key, crt) = (format!("{ca}.key"), format!("{ca}.crt"));
            args.extend_from_slice(&["-keyout", &key, "-out", &crt]);
            openssl(dir, &args);
        }
        Self::issue(
            dir,
            "server",
            "localhost",
            "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n",
        );
        Self::issue(dir, "client", "edgelimit", "extendedKeyUsage=clientAuth\n");
        Certs {
            ca: dir.join("ca.crt"),
            server_cert: dir.join("server.crt"),
            server_key: dir.join("server.key"),
            client_cert: dir.join("client.crt"),
            client_key: dir.join("client.key"),
            other_ca: dir.join("other-ca.crt"),
        }
    }

    /// A certificate `name.crt` (key `name.key`) for `cn`, signed by the `ca` that
    /// [`Certs::generate`] made in `dir`, with the x509v3 extensions `ext` (one per line).
    pub fn issue(dir: &Path, name: &str, cn: &str, ext: &str) -> (PathBuf, PathBuf) {
        std::fs::write(dir.join(format!("{name}.ext")), ext).expect("write ext");
        let (key, csr, crt, extfile) = (
            format!("{name}.key"),
            format!("{name}.csr"),
            format!("{name}.crt"),
            format!("{name}.ext"),
        );
        let subj = format!("/CN={cn}");
        let mut args = vec!["req", "-subj", &subj];
        args.extend_from_slice(&EC_KEY);
        args.extend_from_slice(&["-keyout", &key, "-out", &csr]);
        openssl(dir, &args);
        openssl(
            dir,
            &[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-days",
                "2",
                "-extfile",
                &extfile,
                "-out",
                &crt,
            ],
        );
        (dir.join(crt), dir.join(key))
    }
}

pub const ACL_USER: &str = "edgelimit";
/// What edgelimit needs and nothing more: connection set-up, the scripts, and the commands
/// the scripts call, on its own keys only.
pub const ACL_RULES: &str = "~edgelimit:* resetchannels -@all +ping +auth +hello +client|setname +eval +evalsha +script|load +time +hgetall +hset +pexpire";

/// A TLS-only Redis (`port 0`) requiring client certificates, whose default user is off and
/// whose `edgelimit` user may only run what edgelimit needs on `edgelimit:*` keys.
pub struct TlsRedis {
    pub node: Node,
    pub certs: Certs,
    pub password: String,
    pub dir: tempfile::TempDir,
}

impl TlsRedis {
    pub fn start() -> TlsRedis {
        let dir = tempfile::tempdir().expect("tls dir");
        let certs = Certs::generate(dir.path());
        let password = "acl-p4ss-0123456789".to_owned();
        let admin = "admin-p4ss-0123456789";
        let port = free_port();
        let conf = format!(
            "port 0\ntls-port {port}\ntls-cert-file {}\ntls-key-file {}\ntls-ca-cert-file {}\n\
             tls-auth-clients yes\nuser default off\nuser {ACL_USER} on >{password} {ACL_RULES}\n\
             user admin on >{admin} ~* &* +@all\n",
            certs.server_cert.display(),
            certs.server_key.display(),
            certs.ca.display(),
        );
        let cli_args = vec![
            "--tls".into(),
            "--cacert".into(),
            certs.ca.display().to_string(),
            "--cert".into(),
            certs.client_cert.display().to_string(),
            "--key".into(),
            certs.client_key.display().to_string(),
            "--user".into(),
            "admin".into(),
            "--pass".into(),
            admin.into(),
            "--no-auth-warning".into(),
        ];
        let node = Node::start_with_cli(dir.path(), "tls", port, &conf, &[], cli_args);
        TlsRedis {
            node,
            certs,
            password,
            dir,
        }
    }

    pub fn url(&self) -> String {
        format!("rediss://127.0.0.1:{}/", self.node.port)
    }

    /// The server's `redis:` section: TLS with the test CA and client certificate, the ACL
    /// user, and the password read from `password_file`.
    pub fn config(&self, password_file: &Path, ca: &Path, client_cert: bool) -> String {
        let mut yaml = format!(
            "backend: redis\nredis:\n  url: {}\n  username: {ACL_USER}\n  password_file: {}\n  tls:\n    ca_file: {}\n",
            self.url(),
            password_file.display(),
            ca.display()
        );
        if client_cert {
            yaml.push_str(&format!(
                "    cert_file: {}\n    key_file: {}\n",
                self.certs.client_cert.display(),
                self.certs.client_key.display()
            ));
        }
        yaml
    }
}

/// Sends `calls` requests for each of `subjects` (under descriptor key `key`) from
/// `workers` concurrent tasks per server, all at once; returns the OK count per subject.
/// Every answer must be OK or OVER_LIMIT.
pub async fn storm(
    servers: &[EdgelimitServer],
    domain: &str,
    key: &str,
    subjects: &[String],
    workers: usize,
    calls: usize,
) -> Vec<u64> {
    let mut tasks = Vec::new();
    for server in servers {
        let client = server.client().await;
        for subject in subjects {
            for _ in 0..workers {
                let mut client = client.clone();
                let req = request(domain, vec![descriptor(&[(key, subject)])]);
                tasks.push(tokio::spawn(async move {
                    let mut ok = 0u64;
                    for _ in 0..calls {
                        let code = super::fault_load::call_with_timeout(
                            &mut client,
                            req.clone(),
                            Duration::from_secs(10),
                        )
                        .await;
                        match code {
                            Ok(OK) => ok += 1,
                            Ok(OVER_LIMIT) => {}
                            other => panic!("unexpected answer {other:?}"),
                        }
                    }
                    ok
                }));
            }
        }
    }
    let mut per_subject = vec![0u64; subjects.len()];
    let per_server = subjects.len() * workers;
    for (i, task) in tasks.into_iter().enumerate() {
        per_subject[(i % per_server) / workers] += task.await.expect("storm worker");
    }
    per_subject
}

/// A TLS-only 3-master Cluster (`tls-cluster yes`: the bus and `CLUSTER SLOTS` use the TLS
/// ports) requiring client certificates, with the `edgelimit` ACL user plus the Cluster
/// commands it needs.
pub struct TlsCluster {
    pub nodes: Vec<Node>,
    pub certs: Certs,
    pub password: String,
    pub dir: tempfile::TempDir,
}

impl TlsCluster {
    pub fn start(masters: usize) -> TlsCluster {
        let dir = tempfile::tempdir().expect("tls cluster dir");
        let certs = Certs::generate(dir.path());
        let password = "acl-p4ss-0123456789".to_owned();
        let admin = "admin-p4ss-0123456789";
        let cli_args: Vec<String> = vec![
            "--tls".into(),
            "--cacert".into(),
            certs.ca.display().to_string(),
            "--cert".into(),
            certs.client_cert.display().to_string(),
            "--key".into(),
            certs.client_key.display().to_string(),
            "--user".into(),
            "admin".into(),
            "--pass".into(),
            admin.into(),
            "--no-auth-warning".into(),
        ];
        let nodes: Vec<Node> = (0..masters)
            .map(|i| {
                let port = free_port();
                let bus = free_port();
                let conf = format!(
                    "port 0\ntls-port {port}\ntls-cluster yes\ntls-replication yes\n\
                     tls-cert-file {cert}\ntls-key-file {key}\ntls-ca-cert-file {ca}\n\
                     tls-client-cert-file {client_cert}\ntls-client-key-file {client_key}\n\
                     tls-auth-clients yes\ncluster-enabled yes\ncluster-port {bus}\n\
                     cluster-config-file nodes.conf\ncluster-node-timeout 3000\n\
                     user default off\nuser {ACL_USER} on >{password} {ACL_RULES} +cluster|slots +asking\n\
                     user admin on >{admin} ~* &* +@all\n",
                    cert = certs.server_cert.display(),
                    key = certs.server_key.display(),
                    ca = certs.ca.display(),
                    client_cert = certs.client_cert.display(),
                    client_key = certs.client_key.display(),
                );
                Node::start_with_cli(dir.path(), &format!("node{i}"), port, &conf, &[], cli_args.clone())
            })
            .collect();
        let addrs: Vec<String> = nodes.iter().map(Node::addr).collect();
        let out = Command::new(binary("redis-cli"))
            .args(&cli_args)
            .args(["--cluster", "create"])
            .args(&addrs)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .expect("redis-cli --cluster create");
        assert!(
            out.status.success(),
            "tls cluster create failed:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let cluster = TlsCluster {
            nodes,
            certs,
            password,
            dir,
        };
        wait_for("cluster_state:ok on every node", START_BOUND, || {
            cluster.nodes.iter().all(|n| {
                let info = n.cli(&["CLUSTER", "INFO"]);
                info.contains("cluster_state:ok")
                    && info.contains(&format!("cluster_known_nodes:{masters}"))
                    && info.contains("cluster_slots_assigned:16384")
            })
        });
        cluster
    }

    /// The server's `redis:` section: the nodes over TLS, the test CA and client certificate,
    /// the ACL user with the password read from `password_file`.
    pub fn config(&self, password_file: &Path) -> String {
        let urls: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("rediss://{}", n.addr()))
            .collect();
        format!(
            "backend: redis\nredis:\n  cluster_nodes: [{}]\n  username: {ACL_USER}\n  password_file: {}\n  tls:\n    ca_file: {}\n    cert_file: {}\n    key_file: {}\n",
            urls.join(", "),
            password_file.display(),
            self.certs.ca.display(),
            self.certs.client_cert.display(),
            self.certs.client_key.display()
        )
    }
}
