//! The real `ratewall-server` binary, started on free loopback ports with
//! a configuration directory of the test's own, and stopped (by PID) when
//! dropped; a gRPC client from Envoy's published protos and an HTTP/1.1
//! client.
#![allow(dead_code)] // each test file uses a part

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tonic::transport::Channel;

/// A configuration directory removed when dropped.
pub struct ConfigDir {
    pub path: PathBuf,
}

impl ConfigDir {
    /// A fresh directory holding `files` (name, YAML).
    pub fn new(files: &[(&str, &str)]) -> ConfigDir {
        static N: AtomicUsize = AtomicUsize::new(0);
        let path = std::env::temp_dir().join(format!(
            "ratewall-server-test-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).unwrap();
        let dir = ConfigDir { path };
        for (name, text) in files {
            dir.write(name, text);
        }
        dir
    }

    /// Writes a file whole: into a temporary file beside the directory (the
    /// server reads every file in it), then renamed in, as a deployment
    /// replaces it.
    pub fn write(&self, name: &str, text: &str) {
        let tmp = self.path.with_extension(format!("{name}.tmp"));
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, self.path.join(name)).unwrap();
    }
}

impl Drop for ConfigDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// The running binary.
pub struct Server {
    pub child: Child,
    pub grpc: SocketAddr,
    pub http: SocketAddr,
    /// Its log (stderr) so far, one entry per line.
    pub log: Arc<Mutex<Vec<String>>>,
}

/// The binary's stderr and exit status when it refused to start.
#[derive(Debug)]
pub struct Refused {
    pub code: Option<i32>,
    pub stderr: String,
}

fn binary() -> Command {
    Command::new(env!("CARGO_BIN_EXE_ratewall-server"))
}

impl Server {
    /// Starts the binary on `dir` with extra flags, on free loopback ports.
    pub fn start(dir: &Path, flags: &[&str]) -> Server {
        Server::try_start(dir, flags).unwrap_or_else(|r| panic!("the server did not start: {r:?}"))
    }

    /// Starts the binary; `Err` when it exits instead of serving.
    pub fn try_start(dir: &Path, flags: &[&str]) -> Result<Server, Refused> {
        let mut child = binary()
            .arg("--config-dir")
            .arg(dir)
            .args([
                "--grpc-addr",
                "127.0.0.1:0",
                "--http-addr",
                "127.0.0.1:0",
                "--reload-ms",
                "100",
            ])
            .args(flags)
            .env(
                "RATEWALL_LOG",
                std::env::var("TEST_SERVER_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let stderr = child.stderr.take().unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let lines = Arc::clone(&log);
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                lines.lock().unwrap().push(line);
            }
        });
        let mut stdout = BufReader::new(stdout);
        let mut line = String::new();
        // The first stdout line names both addresses; EOF means it exited.
        stdout.read_line(&mut line).unwrap();
        if line.is_empty() {
            let status = child.wait().unwrap();
            let _ = reader.join();
            let stderr = log.lock().unwrap().join("\n");
            return Err(Refused {
                code: status.code(),
                stderr,
            });
        }
        // Keep draining stdout so the server never blocks on it.
        std::thread::spawn(move || {
            let mut sink = String::new();
            while stdout.read_line(&mut sink).is_ok_and(|n| n > 0) {
                sink.clear();
            }
        });
        let addr = |tag: &str| -> SocketAddr {
            line.split_whitespace()
                .find_map(|w| w.strip_prefix(tag))
                .unwrap_or_else(|| panic!("no {tag} in {line:?}"))
                .parse()
                .unwrap()
        };
        Ok(Server {
            grpc: addr("grpc="),
            http: addr("http="),
            child,
            log,
        })
    }

    /// The log lines so far that contain `needle`.
    pub fn log_lines(&self, needle: &str) -> Vec<String> {
        self.log
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.contains(needle))
            .cloned()
            .collect()
    }

    /// A gRPC client of the server.
    pub async fn client(&self) -> RateLimitServiceClient<Channel> {
        RateLimitServiceClient::connect(format!("http://{}", self.grpc))
            .await
            .unwrap()
    }

    /// Sends SIGTERM and waits (at most `within`) for the exit status,
    /// leaving the test's runtime free to run its clients meanwhile.
    pub async fn terminate(&mut self, within: Duration) -> Option<std::process::ExitStatus> {
        let deadline = self.sigterm(within);
        loop {
            match self.exited(deadline) {
                Ok(status) => return status,
                Err(()) => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
    }

    /// [`terminate`](Self::terminate), blocking this thread: a client on
    /// this thread's runtime cannot answer the server meanwhile.
    pub fn terminate_blocking(&mut self, within: Duration) -> Option<std::process::ExitStatus> {
        let deadline = self.sigterm(within);
        loop {
            match self.exited(deadline) {
                Ok(status) => return status,
                Err(()) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    }

    /// Sends SIGTERM; the deadline `within` from now.
    fn sigterm(&self, within: Duration) -> Instant {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        Instant::now() + within
    }

    /// `Ok`: the exit status, or `None` once past `deadline`; `Err`: still
    /// running, wait and ask again.
    fn exited(&mut self, deadline: Instant) -> Result<Option<std::process::ExitStatus>, ()> {
        match self.child.try_wait() {
            Ok(Some(status)) => Ok(Some(status)),
            _ if Instant::now() >= deadline => Ok(None),
            _ => Err(()),
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs the binary with `args` and returns (exit code, stderr) once it
/// exits (a configuration it refuses).
pub fn refused(dir: &Path) -> Refused {
    match Server::try_start(dir, &[]) {
        Ok(_) => panic!("the server started"),
        Err(r) => r,
    }
}

/// A request of one domain, each descriptor a list of (key, value).
#[allow(unused_imports)] // each test file uses a part
pub use ratewall_server::request;

/// One call; panics on a transport error.
pub async fn call(
    client: &mut RateLimitServiceClient<Channel>,
    request: RateLimitRequest,
) -> RateLimitResponse {
    client
        .should_rate_limit(request)
        .await
        .unwrap()
        .into_inner()
}

/// An HTTP/1.1 response: status and body.
#[derive(Debug)]
pub struct HttpGot {
    pub status: u16,
    pub body: String,
    /// The `content-type` header, if any.
    pub content_type: Option<String>,
}

/// One HTTP/1.1 request over a fresh connection.
pub async fn http(addr: SocketAddr, method: &str, path: &str, body: &str) -> HttpGot {
    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    let req = hyper::Request::builder()
        .method(method)
        .uri(path)
        .header("host", addr.to_string())
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_owned())))
        .unwrap();
    let res = sender.send_request(req).await.unwrap();
    let status = res.status().as_u16();
    let content_type = res
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let body = res.into_body().collect().await.unwrap().to_bytes();
    HttpGot {
        status,
        body: String::from_utf8_lossy(&body).into_owned(),
        content_type,
    }
}

/// The value of one counter in `/metrics`: `series` is the text before the
/// value (`name{label="…"}`); `None` when the server does not list it.
pub async fn metric(addr: SocketAddr, series: &str) -> Option<u64> {
    let got = http(addr, "GET", "/metrics", "").await;
    assert_eq!(got.status, 200, "{}", got.body);
    let prefix = format!("{series} ");
    got.body.lines().find_map(|l| {
        l.strip_prefix(&prefix)
            .map(|v| v.trim().parse().unwrap_or_else(|_| panic!("{l:?}")))
    })
}

/// Polls `probe` (every 20 ms) until it returns `true` or `within` passes;
/// whether it did.
pub async fn eventually<F, Fut>(within: Duration, mut probe: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + within;
    loop {
        if probe().await {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
