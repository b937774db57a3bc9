//! Stores that answer but cannot do their job, for tests: a real
//! `redis-server` filled until it answers `OOM`, and a fake server on a
//! free loopback port that speaks enough RESP for the client's handshake
//! and answers every script call with the bytes a test chooses (a status,
//! an array of the wrong length, garbage, an error reply).

#![allow(dead_code)] // each test file uses a part

use super::redis_server::RedisServer;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// Puts `server` out of memory until its junk goes: 1 MiB of junk keys,
/// then `noeviction` (Redis' default) and a `maxmemory` half a MiB below
/// what it uses. Every write then fails with `OOM`, until `FLUSHALL` (or a
/// higher `maxmemory`) makes room. (Filling up to a fixed `maxmemory` alone
/// is not stable: the connection that wrote the last key frees its buffers
/// when it closes, and writes fit again.)
pub fn fill_until_oom(server: &RedisServer) {
    let junk = "x".repeat(64 * 1024);
    for i in 0..16 {
        let reply = server.cmd(&["SET", &format!("junk:{i}"), &junk]);
        assert!(reply.starts_with("+OK"), "SET junk:{i}: {reply}");
    }
    let info = server.cmd(&["INFO", "memory"]);
    let used: u64 = info
        .lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no used_memory in {info}"));
    let limit = (used - 512 * 1024).to_string();
    for set in [
        ["maxmemory-policy", "noeviction"],
        ["maxmemory", limit.as_str()],
    ] {
        let reply = server.cmd(&["CONFIG", "SET", set[0], set[1]]);
        assert!(reply.starts_with("+OK"), "CONFIG SET {set:?}: {reply}");
    }
    let reply = server.cmd(&["SET", "probe", "1"]);
    assert!(reply.starts_with("-OOM"), "a write still fits: {reply}");
}

/// A server that speaks RESP to the client's handshake (`+OK` to
/// everything, `+PONG` to `PING`) and answers each `EVALSHA`/`EVAL` with
/// the reply set last. Stopped when dropped.
pub struct FakeRedis {
    port: u16,
    reply: Arc<Mutex<Vec<u8>>>,
    scripts: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl FakeRedis {
    /// Starts it on a free loopback port, answering script calls with
    /// `reply` (raw RESP, `\r\n` included).
    pub async fn start(reply: &[u8]) -> FakeRedis {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind loopback");
        let port = listener.local_addr().unwrap().port();
        let reply = Arc::new(Mutex::new(reply.to_vec()));
        let scripts = Arc::new(AtomicUsize::new(0));
        let (r, s) = (reply.clone(), scripts.clone());
        let task = tokio::spawn(async move {
            loop {
                let Ok((conn, _)) = listener.accept().await else {
                    return;
                };
                tokio::spawn(serve(conn, r.clone(), s.clone()));
            }
        });
        FakeRedis {
            port,
            reply,
            scripts,
            task,
        }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Answers script calls with `reply` from now on.
    pub fn set_reply(&self, reply: &[u8]) {
        *self.reply.lock().unwrap() = reply.to_vec();
    }

    /// How many script calls it answered.
    pub fn script_calls(&self) -> usize {
        self.scripts.load(Ordering::SeqCst)
    }
}

impl Drop for FakeRedis {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// One connection: reads commands (arrays of bulk strings, pipelined or
/// not) and answers each.
async fn serve(
    mut conn: tokio::net::TcpStream,
    reply: Arc<Mutex<Vec<u8>>>,
    scripts: Arc<AtomicUsize>,
) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    loop {
        while let Some((name, used)) = command(&buf) {
            buf.drain(..used);
            let answer = match name.as_str() {
                "EVALSHA" | "EVAL" => {
                    scripts.fetch_add(1, Ordering::SeqCst);
                    reply.lock().unwrap().clone()
                }
                "PING" => b"+PONG\r\n".to_vec(),
                _ => b"+OK\r\n".to_vec(),
            };
            if conn.write_all(&answer).await.is_err() {
                return;
            }
        }
        match conn.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// The first complete command in `buf`: its name (upper case) and the
/// bytes it takes; `None` until a whole one has arrived.
fn command(buf: &[u8]) -> Option<(String, usize)> {
    let (count, mut at) = number(buf, 0, b'*')?;
    let mut name = String::new();
    for i in 0..count {
        let (len, start) = number(buf, at, b'$')?;
        let end = start + len;
        if buf.len() < end + 2 {
            return None;
        }
        if i == 0 {
            name = String::from_utf8_lossy(&buf[start..end]).to_uppercase();
        }
        at = end + 2;
    }
    Some((name, at))
}

/// `<tag><digits>\r\n` at `at`: the number and where the line ends.
fn number(buf: &[u8], at: usize, tag: u8) -> Option<(usize, usize)> {
    if *buf.get(at)? != tag {
        return None;
    }
    let line_end = at + buf[at..].windows(2).position(|w| w == b"\r\n")?;
    let n = std::str::from_utf8(&buf[at + 1..line_end])
        .ok()?
        .parse()
        .ok()?;
    Some((n, line_end + 2))
}
