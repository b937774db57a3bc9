//! Throwaway `redis-server`s for tests: each on a free loopback port, with
//! no persistence, in its own fresh directory, killed (by PID, SIGKILL) and
//! reaped when dropped, also when the test panics.
//!
//! A machine without `redis-server` fails the test with a message that says
//! how to install it: these tests never skip silently.

#![allow(dead_code)] // each test file uses a part

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

pub const INSTALL_HINT: &str = "redis-server not found on PATH. Install it: \
    `apt-get update && apt-get install -y redis-server` (Debian/Ubuntu), \
    `brew install redis` (macOS); .ci/run does this in CI";

/// One running server.
pub struct RedisServer {
    child: Option<Child>,
    port: u16,
    dir: PathBuf,
    extra: Vec<String>,
    tls_port: Option<u16>,
}

/// What a TLS server is given: PEM files it reads at start.
pub struct TlsFiles<'a> {
    pub cert: &'a [u8],
    pub key: &'a [u8],
    pub ca: &'a [u8],
    /// `--tls-auth-clients yes`: clients must show a certificate the CA signed.
    pub clients_must_authenticate: bool,
}

impl TlsFiles<'_> {
    /// The server's TLS arguments: these files written into `dir`, served
    /// on `tls_port`.
    fn server_args(&self, dir: &std::path::Path, tls_port: u16) -> Vec<String> {
        let write = |name: &str, pem: &[u8]| {
            let path = dir.join(name);
            std::fs::write(&path, pem).expect("write a PEM file");
            path.to_string_lossy().into_owned()
        };
        let auth = if self.clients_must_authenticate {
            "yes"
        } else {
            "no"
        };
        vec![
            "--tls-port".to_string(),
            tls_port.to_string(),
            "--tls-cert-file".into(),
            write("server.crt", self.cert),
            "--tls-key-file".into(),
            write("server.key", self.key),
            "--tls-ca-cert-file".into(),
            write("ca.crt", self.ca),
            "--tls-auth-clients".into(),
            auth.into(),
        ]
    }
}

/// A port that was free a moment ago (bound to port 0, then released).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("bind a loopback port")
}

fn fresh_dir(port: u16) -> PathBuf {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "ratewall-redis-{}-{port}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create a server directory");
    dir
}

impl RedisServer {
    /// Starts a standalone server.
    pub fn start() -> RedisServer {
        Self::start_with(&[])
    }

    /// Starts a server with extra `--option value` arguments.
    pub fn start_with(extra: &[&str]) -> RedisServer {
        let port = free_port();
        let mut s = RedisServer {
            child: None,
            port,
            dir: fresh_dir(port),
            extra: extra.iter().map(|s| s.to_string()).collect(),
            tls_port: None,
        };
        s.spawn();
        s
    }

    /// Starts a server that also serves TLS on a port of its own
    /// ([`tls_url`](Self::tls_url)); the plain port stays for the tests'
    /// own commands. `extra` as for [`start_with`](Self::start_with).
    pub fn start_tls(files: &TlsFiles<'_>, extra: &[&str]) -> RedisServer {
        let port = free_port();
        let tls_port = free_port();
        let dir = fresh_dir(port);
        let mut args = files.server_args(&dir, tls_port);
        args.extend(extra.iter().map(|s| s.to_string()));
        let mut s = RedisServer {
            child: None,
            port,
            dir,
            extra: args,
            tls_port: Some(tls_port),
        };
        s.spawn();
        s
    }

    /// `rediss://127.0.0.1:<tls port>` of a server started by
    /// [`start_tls`](Self::start_tls).
    pub fn tls_url(&self) -> String {
        format!(
            "rediss://127.0.0.1:{}",
            self.tls_port.expect("a server started with start_tls")
        )
    }

    fn spawn(&mut self) {
        let mut cmd = Command::new("redis-server");
        cmd.arg("--port")
            .arg(self.port.to_string())
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(&self.dir)
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => panic!("{INSTALL_HINT}"),
            Err(e) => panic!("could not start redis-server: {e}"),
        };
        self.child = Some(child);
        self.wait_ready();
    }

    fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if ping(self.port) {
                return;
            }
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                panic!(
                    "redis-server on port {} exited at start: {status}",
                    self.port
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!(
            "redis-server on port {} did not answer PING within 10 s",
            self.port
        );
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// `kill -9` the server, and reap it.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill(); // SIGKILL, by PID
            let _ = c.wait();
        }
    }

    /// Starts the server again on the same port (empty: no persistence).
    pub fn restart(&mut self) {
        self.kill9();
        self.spawn();
    }

    /// Runs one command through `redis-cli`-free raw RESP and returns the
    /// raw reply text (enough for tests: PING, FLUSHALL, SCRIPT FLUSH,
    /// CLIENT PAUSE, DEBUG SLEEP, ...).
    pub fn cmd(&self, args: &[&str]) -> String {
        raw_command(self.port, args)
            .unwrap_or_else(|e| panic!("{args:?} on port {}: {e}", self.port))
    }

    /// Every key matching `pattern`, with its PTTL in ms (-1: no TTL). A
    /// key that expired between `KEYS` and `PTTL` is left out: it had a TTL.
    pub fn keys_with_pttl(&self, pattern: &str) -> Vec<(String, i64)> {
        let reply = self.cmd(&["KEYS", pattern]);
        let keys: Vec<String> = reply
            .lines()
            .filter(|l| !l.starts_with('*') && !l.starts_with('$'))
            .map(str::to_string)
            .collect();
        keys.into_iter()
            .map(|k| {
                let ttl = self.cmd(&["PTTL", &k]);
                let ttl: i64 = ttl.trim_start_matches(':').trim().parse().unwrap();
                (k, ttl)
            })
            // -2: the key expired between KEYS and PTTL.
            .filter(|&(_, ttl)| ttl != -2)
            .collect()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill9();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn ping(port: u16) -> bool {
    matches!(raw_command(port, &["PING"]), Ok(r) if r.starts_with("+PONG"))
}

/// Sends one RESP command and reads one reply (whatever arrives within
/// 2 s), as text.
pub fn raw_command(port: u16, args: &[&str]) -> std::io::Result<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(2)))?;
    let mut req = format!("*{}\r\n", args.len());
    for a in args {
        req.push_str(&format!("${}\r\n{a}\r\n", a.len()));
    }
    s.write_all(req.as_bytes())?;
    let mut buf = vec![0u8; 64 * 1024];
    let n = s.read(&mut buf)?;
    Ok(String::from_utf8_lossy(&buf[..n]).into_owned())
}

/// One Redis Sentinel (`redis-server sentinel.conf --sentinel`) watching
/// the master at `master_port` under `name`, with quick failure detection
/// (down after 500 ms, failover timeout 2 s). Killed by PID when dropped.
pub struct RedisSentinel {
    child: Option<Child>,
    port: u16,
    dir: PathBuf,
}

impl RedisSentinel {
    pub fn start(name: &str, master_port: u16) -> RedisSentinel {
        Self::start_with(name, master_port, &[])
    }

    /// With extra `sentinel.conf` lines (`sentinel auth-pass m secret`).
    pub fn start_with(name: &str, master_port: u16, extra: &[&str]) -> RedisSentinel {
        let port = free_port();
        let dir = fresh_dir(port);
        let conf = dir.join("sentinel.conf");
        std::fs::write(
            &conf,
            format!(
                "port {port}\nbind 127.0.0.1\ndir {}\n\
                 sentinel monitor {name} 127.0.0.1 {master_port} 1\n\
                 sentinel down-after-milliseconds {name} 500\n\
                 sentinel failover-timeout {name} 2000\n\
                 sentinel parallel-syncs {name} 1\n{}\n",
                dir.display(),
                extra.join("\n")
            ),
        )
        .expect("write sentinel.conf");
        let child = Command::new("redis-server")
            .arg(&conf)
            .arg("--sentinel")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| match e.kind() {
                std::io::ErrorKind::NotFound => panic!("{INSTALL_HINT}"),
                _ => panic!("could not start redis-server --sentinel: {e}"),
            });
        let mut s = RedisSentinel {
            child: Some(child),
            port,
            dir,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while !ping(port) {
            if let Some(status) = s.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                panic!("redis-sentinel on port {port} exited at start: {status}");
            }
            assert!(
                Instant::now() < deadline,
                "redis-sentinel on port {port} did not answer PING within 10 s"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        s
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The port of the master the sentinel names for `name` now.
    pub fn master_port(&self, name: &str) -> Option<u16> {
        let reply = raw_command(self.port, &["SENTINEL", "get-master-addr-by-name", name]).ok()?;
        // *2 $9 127.0.0.1 $4 6379: the port is the last line.
        reply.lines().rfind(|l| !l.is_empty())?.parse().ok()
    }
}

impl Drop for RedisSentinel {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill(); // SIGKILL, by PID
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A Redis Cluster of `masters` masters (no replicas), each a throwaway
/// server with its own fresh directory (a stale `nodes.conf` would refuse
/// to join) and its cluster bus port (port + 10000) free.
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

/// A port below 55,000 whose bus port (+ 10,000) is free too.
fn free_port_with_bus() -> u16 {
    loop {
        let port = free_port();
        if port < 55_000 && TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok() {
            return port;
        }
    }
}

impl RedisCluster {
    pub fn start(masters: usize) -> RedisCluster {
        Self::start_inner(masters, None)
    }

    /// A cluster whose nodes also serve TLS, the bus included
    /// (`--tls-cluster yes`): a TLS client learns the nodes' TLS ports.
    /// The plain ports stay for the tests' own commands.
    pub fn start_tls(masters: usize, files: &TlsFiles<'_>) -> RedisCluster {
        Self::start_inner(masters, Some(files))
    }

    /// The nodes' `rediss://` URLs (a cluster from `start_tls`).
    pub fn tls_urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::tls_url).collect()
    }

    fn start_inner(masters: usize, tls: Option<&TlsFiles<'_>>) -> RedisCluster {
        let mut nodes = Vec::new();
        while nodes.len() < masters {
            let port = free_port_with_bus();
            let dir = fresh_dir(port);
            let mut tls_args = Vec::new();
            let mut tls_port = None;
            if let Some(files) = tls {
                // The bus of a TLS cluster is on the TLS port + 10,000.
                let p = free_port_with_bus();
                tls_port = Some(p);
                tls_args = files.server_args(&dir, p);
                tls_args.extend(["--tls-cluster".into(), "yes".into()]);
            }
            let mut s = RedisServer {
                child: None,
                port,
                tls_port,
                dir,
                extra: [
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    "1000",
                    // Slots on live masters keep serving when one dies.
                    "--cluster-require-full-coverage",
                    "no",
                ]
                .iter()
                .map(|s| s.to_string())
                .chain(tls_args)
                .collect(),
            };
            s.spawn();
            nodes.push(s);
        }
        let mut cmd = Command::new("redis-cli");
        cmd.arg("--cluster").arg("create");
        for n in &nodes {
            cmd.arg(format!("127.0.0.1:{}", n.port));
        }
        cmd.args(["--cluster-replicas", "0", "--cluster-yes"])
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        match cmd.status() {
            Ok(s) if s.success() => {}
            Ok(s) => panic!("redis-cli --cluster create failed: {s}"),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => panic!(
                "redis-cli not found on PATH. Install it: `apt-get update && apt-get install -y redis-tools`"
            ),
            Err(e) => panic!("redis-cli: {e}"),
        }
        let deadline = Instant::now() + Duration::from_secs(15);
        for n in &nodes {
            while !n.cmd(&["CLUSTER", "INFO"]).contains("cluster_state:ok") {
                assert!(
                    Instant::now() < deadline,
                    "cluster did not come up on {}",
                    n.port
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        RedisCluster { nodes }
    }

    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// The node that serves `key`'s slot.
    pub fn owner(&self, key: &str) -> usize {
        // A GET of the key answers on the slot's owner; elsewhere it is MOVED.
        self.nodes
            .iter()
            .position(|n| !n.cmd(&["GET", key]).starts_with("-MOVED"))
            .unwrap_or_else(|| panic!("no owner for {key}"))
    }

    /// `key`'s slot.
    pub fn slot(&self, key: &str) -> u16 {
        self.nodes[0].cmd(&["CLUSTER", "KEYSLOT", key])[1..]
            .trim()
            .parse()
            .unwrap()
    }

    /// Each node's id.
    pub fn id(&self, i: usize) -> String {
        self.nodes[i]
            .cmd(&["CLUSTER", "MYID"])
            .lines()
            .nth(1)
            .unwrap()
            .to_string()
    }
}
