//! ratewall's main job, in process and with no set-up:
//! `cargo run --release -p ratewall-demo`.
//!
//! It plays a scripted burst through each limiter on the real clock, prints
//! what each request got, and ends with checks per second on this machine.
//! It also shows three instances sharing one limit in a throwaway
//! `redis-server` (started on a free port when installed), the HTTP layer
//! (`examples/server.rs` and a real client), locally and then as two server
//! instances on one Redis limit, the client pacing layer calling an
//! in-process server, and the gateway (`ratewall-server`, in-process) asked
//! over gRPC until a limit says OVER_LIMIT.
//!
//! A workspace member of its own (`demo/`), with every library feature it
//! shows always on; it includes `examples/server.rs` and
//! `tests/support/backend_sim.rs` by path.

use ratewall::{
    check_all, FixedWindow, KeyedTokenBucket, LeakyBucket, ManualClock, Policy, Rate,
    SlidingWindowCounter, SlidingWindowLog, TokenBucket, Window,
};
use std::hint::black_box;
use std::thread::sleep;
use std::time::{Duration, Instant};

/// The script: (pause before the group, requests in the group).
const SCRIPT: &[(u64, usize)] = &[(0, 8), (250, 3), (500, 4)];

// Two rows in files of their own (they use this file's helpers).
mod gateway;
mod pacing;

fn main() {
    println!("ratewall demo: a scripted burst on the real clock\n");
    token_bucket();
    leaky_bucket();
    side_by_side();
    multi_limit();
    distributed();
    hostile_clock();
    throughput();
    coarse_clock();
    keyed_million();
    soft_and_elastic();
    concurrency();
    http_layer();
    http_on_redis();
    pacing::client_pacing();
    gateway::gateway();
}

fn header(title: &str) {
    println!("{title}");
    println!(
        "  {:>7}  {:>3}  {:>7}  {:>9}  {:>11}  {:>11}",
        "t (ms)", "#", "allowed", "remaining", "retry_after", "reset_after"
    );
}

fn row(start: Instant, i: usize, d: &ratewall::Decision) {
    println!(
        "  {:>7.1}  {:>3}  {:>7}  {:>9}  {:>11}  {:>11}",
        start.elapsed().as_secs_f64() * 1e3,
        i,
        if d.is_allowed() { "yes" } else { "NO" },
        d.remaining(),
        fmt_ms(d.retry_after()),
        fmt_ms(d.reset_after()),
    );
}

/// Plays `SCRIPT` on the real clock, one table row per request.
fn play_script(check: impl Fn() -> ratewall::Decision) {
    let start = Instant::now();
    let mut n = 0;
    for &(pause, count) in SCRIPT {
        sleep(Duration::from_millis(pause));
        for _ in 0..count {
            n += 1;
            row(start, n, &check());
        }
    }
}

fn fmt_ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}

fn token_bucket() {
    let bucket = TokenBucket::new(Rate::per_second(10).burst(5)).expect("valid rate");
    header("Token bucket: 10/s, burst 5 (8 at once, 3 after 250 ms, 4 after 500 ms more)");
    play_script(|| bucket.check());
    let d = loop {
        let d = bucket.check();
        if !d.is_allowed() {
            break d;
        }
    };
    println!(
        "  a denied client is told: Retry-After: {}   RateLimit: {}\n",
        d.retry_after_secs(),
        d.ratelimit_header(
            "default",
            &Policy::token_bucket(Rate::per_second(10).burst(5))
        )
        .expect("a printable policy name")
    );
}

fn leaky_bucket() {
    let leaky = LeakyBucket::new(Rate::per_second(10).burst(5)).expect("valid rate");
    println!("Leaky bucket as a meter: 10/s, capacity 5 (same script)");
    header("");
    play_script(|| leaky.check());
    let shaper = LeakyBucket::new(Rate::per_second(20).burst(4)).expect("valid rate");
    println!("\nLeaky bucket as a shaper: 20/s, queue of 4; 6 requests arrive at once");
    let start = Instant::now();
    for i in 1..=6 {
        match shaper.reserve() {
            Ok(slot) => println!("  #{i}: queued, departs after {:>6}", fmt_ms(slot.delay())),
            Err(full) => println!(
                "  #{i}: queue full, retry in {}",
                fmt_ms(full.retry_after())
            ),
        }
    }
    let waited = shaper.pace_blocking();
    println!(
        "  acquire() blocked {} for the next place ({:.0} ms since the burst)\n",
        fmt_ms(waited),
        start.elapsed().as_secs_f64() * 1e3
    );
}

/// Checks per second on one thread: the allow path (a rate too high to ever
/// deny) and the deny path (an exhausted bucket).
fn throughput() {
    let run = Duration::from_millis(400);
    let allow = TokenBucket::new(Rate::per_second(1_000_000_000)).expect("valid rate");
    let deny = TokenBucket::new(Rate::per_day(1).burst(1)).expect("valid rate");
    let _ = deny.check();
    println!(
        "Checks per second, one thread ({} clock):",
        clock_name(allow.clock())
    );
    for (name, bucket) in [("allow path", &allow), ("deny path", &deny)] {
        let (ops, elapsed) = measure(run, || bucket.check().is_allowed());
        println!(
            "  {name:<11} {:>6.1} M checks/s  ({:.1} ns/check)",
            ops as f64 / elapsed.as_secs_f64() / 1e6,
            elapsed.as_nanos() as f64 / ops as f64
        );
    }
}

fn measure(run: Duration, mut f: impl FnMut() -> bool) -> (u64, Duration) {
    let start = Instant::now();
    let mut ops = 0u64;
    while start.elapsed() < run {
        for _ in 0..1024 {
            black_box(f());
        }
        ops += 1024;
    }
    (ops, start.elapsed())
}

fn clock_name(c: &ratewall::QuantaClock) -> String {
    format!("QuantaClock, source {}", c.source())
}

/// The five algorithms on the same adversarial traffic, in simulated time (a
/// `ManualClock`): 5 per second each, and bursts that straddle the boundary
/// of the aligned one-second windows.
fn side_by_side() {
    const BURSTS: &[(u64, usize)] = &[(900, 6), (1000, 6), (1500, 6), (2100, 6)];
    println!("All five, limit 5 per second, bursts of 6 at 0.9 s, 1.0 s, 1.5 s and 2.1 s (simulated time):");
    println!(
        "  {:<24} {:>6} {:>6} {:>6} {:>6}   {:>22}",
        "algorithm", "0.9 s", "1.0 s", "1.5 s", "2.1 s", "most in any rolling 1 s"
    );
    let rate = Rate::per_second(5);
    let window = Window::per_second(5);
    let run = |name: &str, check: &mut dyn FnMut() -> bool, clock: &ManualClock| {
        let mut admitted_at = Vec::new();
        let mut per_burst = Vec::new();
        for &(at_ms, count) in BURSTS {
            clock.set(Duration::from_millis(at_ms));
            let ok = (0..count).filter(|_| check()).count();
            admitted_at.extend(std::iter::repeat_n(at_ms, ok));
            per_burst.push(ok);
        }
        let worst = admitted_at
            .iter()
            .map(|&start| {
                admitted_at
                    .iter()
                    .filter(|&&t| t >= start && t < start + 1000)
                    .count()
            })
            .max()
            .unwrap_or(0);
        println!(
            "  {name:<24} {:>6} {:>6} {:>6} {:>6}   {worst:>22}",
            per_burst[0], per_burst[1], per_burst[2], per_burst[3]
        );
    };
    // One simulated clock for all five; each limiter guards its own time,
    // so replaying the script from 0.9 s for the next one is harmless.
    let c = ManualClock::new();
    let tb = TokenBucket::with_clock(rate, c.clone()).expect("valid");
    let lb = LeakyBucket::with_clock(rate, c.clone()).expect("valid");
    let fw = FixedWindow::with_clock(window, c.clone()).expect("valid");
    let sc = SlidingWindowCounter::with_clock(window, c.clone()).expect("valid");
    let sl = SlidingWindowLog::with_clock(window, c.clone()).expect("valid");
    let checks: [(&str, &dyn Fn() -> bool); 5] = [
        ("token bucket (GCRA)", &|| tb.check().is_allowed()),
        ("leaky bucket (meter)", &|| lb.check().is_allowed()),
        ("fixed window", &|| fw.check().is_allowed()),
        ("sliding-window counter", &|| sc.check().is_allowed()),
        ("sliding-window log", &|| sl.check().is_allowed()),
    ];
    for (name, check) in checks {
        run(name, &mut || check(), &c);
    }
    println!("  (the fixed window lets 10 through within 0.1 s of its boundary; the log never exceeds 5)\n");
}

/// Per-IP, per-user and global limits checked together, all or nothing.
fn multi_limit() {
    let clock = ManualClock::new();
    let per_ip = KeyedTokenBucket::<[u8; 4]>::builder(Rate::per_second(10).burst(3))
        .clock(clock.clone())
        .build()
        .expect("valid");
    let per_user = KeyedTokenBucket::<&str>::builder(Rate::per_second(1).burst(2))
        .clock(clock.clone())
        .build()
        .expect("valid");
    let global = TokenBucket::with_clock(Rate::per_second(1000), clock.clone()).expect("valid");
    println!("Multi-limit: per-IP (burst 3) + per-user (burst 2) + global, all or nothing:");
    let ip = [10, 0, 0, 7];
    for i in 1..=3 {
        let d = check_all(&[&per_ip.with_key(&ip), &per_user.with_key(&"alice"), &global]);
        println!(
            "  request {i}: {:<7} remaining {}  (per-IP has {} left, global {})",
            if d.is_allowed() { "allowed" } else { "DENIED" },
            d.remaining(),
            per_ip.peek_key(&ip).remaining() + 1,
            global.peek().remaining() + 1,
        );
    }
    println!("  the third was denied by per-user, and per-IP and global got their unit back\n");
}

/// A throwaway `redis-server` on a free loopback port, with no
/// persistence, in its own directory; killed by its PID (and the directory
/// removed) however the demo ends.
struct ThrowawayRedis {
    child: std::process::Child,
    port: u16,
    dir: std::path::PathBuf,
}

impl ThrowawayRedis {
    /// `None` when `redis-server` is not installed.
    fn start() -> Option<ThrowawayRedis> {
        use std::process::{Command, Stdio};
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("a free loopback port");
        let dir = std::env::temp_dir().join(format!("ratewall-demo-{port}"));
        let _ = std::fs::create_dir_all(&dir);
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--dir"])
            .arg(&dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .ok()?;
        let server = ThrowawayRedis { child, port, dir };
        // Wait (up to 5 s) until it accepts connections.
        let start = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err()
            && start.elapsed() < Duration::from_secs(5)
        {
            sleep(Duration::from_millis(10));
        }
        Some(server)
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// `kill -9` now (the demo of the fallback).
    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for ThrowawayRedis {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

const NO_REDIS_SERVER: &str =
    "  (redis-server is not installed: `apt-get install redis-server` to see this part)\n";

/// Three instances behind a load balancer: with local limits they admit
/// 3 x L, sharing the limit in Redis they admit L.
fn distributed() {
    use ratewall::redis::{DecisionSource, FailurePolicy, RedisBackend, RedisLimiter};
    use ratewall::{KeyedPolicyLimiter, Policy};

    println!(
        "Distributed: 3 instances, one client, limit L = 10 per minute, 45 requests round-robin"
    );
    let Some(mut server) = ThrowawayRedis::start() else {
        println!("{NO_REDIS_SERVER}");
        return;
    };
    let policy = Policy::token_bucket(Rate::per_minute(10));
    let rt = tokio::runtime::Runtime::new().expect("a tokio runtime");
    rt.block_on(async {
        let url = server.url();
        // Wait for the server to accept connections.
        let probe = RedisBackend::builder(url.clone()).build().expect("valid URL");
        let ping = RedisLimiter::builder(policy, &probe).name("ping").on_failure(FailurePolicy::Closed).build().expect("valid");
        let start = Instant::now();
        while ping.peek_key(b"x").await.is_err() && start.elapsed() < Duration::from_secs(5) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let locals: Vec<_> = (0..3)
            .map(|_| KeyedPolicyLimiter::<&str>::new(policy).expect("valid"))
            .collect();
        // Each instance has its own connection; all share the limit.
        let shared: Vec<_> = (0..3)
            .map(|_| {
                let backend = RedisBackend::builder(url.clone()).build().expect("valid URL");
                RedisLimiter::builder(policy, &backend)
                    .name("demo")
                    .on_failure(FailurePolicy::FallbackShare { instances: 3 })
                    .build()
                    .expect("valid")
            })
            .collect();
        let (mut local_ok, mut shared_ok, mut from_redis) = (0, 0, 0);
        for i in 0..45 {
            local_ok += u32::from(locals[i % 3].check_key("alice").is_allowed());
            let d = shared[i % 3].check_key(b"alice").await.expect("an answer");
            shared_ok += u32::from(d.is_allowed());
            from_redis += u32::from(d.source() == DecisionSource::Redis);
        }
        println!("  local limits on each instance: {local_ok:>2} admitted  (3 x L: the N x L problem)");
        println!("  one limit shared in Redis:     {shared_ok:>2} admitted  (L; {from_redis} of 45 decided by the script)");
        // Redis goes away: each instance falls back to its third of L.
        server.kill();
        let (mut ok, mut fallback) = (0, 0);
        for i in 0..45 {
            let d = shared[i % 3].check_key(b"bob").await.expect("an answer");
            ok += u32::from(d.is_allowed());
            fallback += u32::from(d.source() == DecisionSource::Fallback);
        }
        println!("  Redis killed (kill -9), local fallback with each instance's share: {ok:>2} admitted ({fallback} of 45 from the fallback)\n");
    });
}

/// A keyed limiter over one million distinct keys: memory and speed.
fn keyed_million() {
    const KEYS: u64 = 1_000_000;
    let before = rss_bytes();
    // An hourly rate keeps every key active (not reclaimable) for the run,
    // so the table really is full.
    let limiter = KeyedTokenBucket::<u64>::builder(Rate::per_hour(100).burst(5))
        .max_keys(KEYS as usize)
        .build()
        .expect("valid");
    let start = Instant::now();
    let mut admitted = 0u64;
    let mut not_tracked = 0u64;
    for key in 0..KEYS {
        let d = limiter.check_key(&key);
        admitted += u64::from(d.is_allowed());
        not_tracked += u64::from(d.tracking() != ratewall::Tracking::Tracked);
    }
    let insert = start.elapsed();
    let used = rss_bytes()
        .zip(before)
        .map(|(after, before)| after.saturating_sub(before));
    println!("Keyed token bucket, {KEYS} distinct u64 keys (max_keys {KEYS}):");
    println!(
        "  first check of each key: {:.1} M/s; {} tracked, {} admitted, {} not tracked (max_keys is a promise)",
        KEYS as f64 / insert.as_secs_f64() / 1e6,
        limiter.len(),
        admitted,
        not_tracked
    );
    if let Some(used) = used {
        println!(
            "  memory: {:.1} MiB, {:.1} bytes per key",
            used as f64 / (1 << 20) as f64,
            used as f64 / KEYS as f64
        );
    }
    // Known keys in a scattered order (a multiplicative hash of a counter).
    let mut i = 0u64;
    let (ops, elapsed) = measure(Duration::from_millis(400), || {
        i = i.wrapping_add(1);
        limiter
            .check_key(&(i.wrapping_mul(0x9E37_79B9_7F4A_7C15) % KEYS))
            .is_allowed()
    });
    println!(
        "  checks of known keys, one thread: {:.1} M checks/s ({:.1} ns/check)",
        ops as f64 / elapsed.as_secs_f64() / 1e6,
        elapsed.as_nanos() as f64 / ops as f64
    );
}

/// Resident memory of this process, from /proc (Linux); `None` elsewhere.
fn rss_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

/// The same allow path on `CoarseClock`: a cached reading (about 1 ns, 1 ms
/// granularity) instead of the TSC (about 10 ns).
fn coarse_clock() {
    use ratewall::{Clock, CoarseClock, QuantaClock};
    let run = Duration::from_millis(400);
    let clock = CoarseClock::new();
    let allow =
        TokenBucket::with_clock(Rate::per_second(1_000_000_000), clock).expect("valid rate");
    let (ops, elapsed) = measure(run, || allow.check().is_allowed());
    let lag = QuantaClock::new().now().saturating_sub(clock.now());
    println!(
        "  allow path, CoarseClock ({:?} granularity, {:.0} µs behind now): {:>6.1} M checks/s  ({:.1} ns/check)\n",
        clock.interval(),
        lag as f64 / 1e3,
        ops as f64 / elapsed.as_secs_f64() / 1e6,
        elapsed.as_nanos() as f64 / ops as f64
    );
}

/// A clock that jumps backwards, and an absurd instant: neither causes a
/// wrong decision nor a panic.
fn hostile_clock() {
    let clock = ManualClock::new();
    let bucket =
        TokenBucket::with_clock(Rate::per_second(10).burst(2), clock.clone()).expect("valid rate");
    clock.set(Duration::from_secs(100));
    let _ = bucket.check_n(2).expect("cost within the burst");
    clock.step_back(Duration::from_secs(50));
    let d = bucket.check();
    println!("A hostile clock (simulated):");
    println!(
        "  after a 50 s backward step: allowed={} retry_after={:?} (time stood still; it did not run back)",
        d.is_allowed(),
        d.retry_after()
    );
    clock.set_nanos(u64::MAX);
    println!(
        "  at u64::MAX ns: peek={} check={} (clamped at the 292-year horizon; they agree, nothing overflows)\n",
        bucket.peek().is_allowed(),
        bucket.check().is_allowed()
    );
}

/// Soft and elastic limits (issue 14), on a manual clock so the rows repeat.
fn soft_and_elastic() {
    let clock = ManualClock::new();
    let policy: ratewall::Policy = "5/min fixed-window soft 40%".parse().expect("valid");
    let soft = ratewall::KeyedPolicyLimiter::<&str, _>::builder(policy)
        .clock(clock.clone())
        .build()
        .expect("valid");
    println!("Soft limit \"{policy}\": 8 requests at once; limit and remaining stay nominal:");
    println!(
        "  {:>3}  {:>7}  {:>5}  {:>9}  {:>11}  {:>11}",
        "#", "allowed", "limit", "remaining", "above limit", "retry_after"
    );
    for i in 1..=8 {
        let d = soft.check_key("alice");
        println!(
            "  {:>3}  {:>7}  {:>5}  {:>9}  {:>11}  {:>11}",
            i,
            if d.is_allowed() { "yes" } else { "NO" },
            d.limit(),
            d.remaining(),
            if d.is_above_limit() { "YES" } else { "no" },
            fmt_ms(d.retry_after()),
        );
    }

    let p = |s: &str| s.parse::<ratewall::Policy>().expect("valid");
    let elastic = ratewall::ElasticLimiter::<&str, _>::builder(
        p("2/min fixed-window"),
        p("4/min fixed-window"),
        p("2/min fixed-window"),
    )
    .clock(clock)
    .build()
    .expect("valid");
    println!(
        "\nElastic limit: guarantee {}, ceiling {}, shared pool {}:",
        elastic.guarantee(),
        elastic.ceiling(),
        elastic.pool()
    );
    println!(
        "  {:>5}  {:>3}  {:>17}  {:>5}  {:>9}  {:>9}",
        "key", "#", "outcome", "limit", "remaining", "pool left"
    );
    let mut n = std::collections::HashMap::new();
    let mut send = |key: &'static str| {
        let i = n.entry(key).or_insert(0);
        *i += 1;
        let d = elastic.check_key(&key);
        let outcome = match (d.is_allowed(), d.is_above_limit()) {
            (true, false) => "guaranteed",
            (true, true) => "from the pool",
            _ => "DENIED",
        };
        let pool = elastic.peek_pool();
        let left = if pool.is_allowed() {
            pool.remaining() + 1
        } else {
            0
        };
        println!(
            "  {key:>5}  {i:>3}  {outcome:>17}  {:>5}  {:>9}  {left:>9}",
            d.limit(),
            d.remaining()
        );
    };
    for _ in 0..5 {
        send("alice");
    }
    for _ in 0..3 {
        send("bob");
    }
    elastic
        .set_pool(p("4/min fixed-window"))
        .expect("same algorithm");
    println!(
        "  (spare capacity rises: the pool becomes {})",
        elastic.pool()
    );
    send("bob");
    println!("  alice drained the pool and reached her ceiling; bob still got his guarantee,");
    println!("  and went above it once the pool grew\n");
}

#[path = "../../examples/server.rs"]
#[allow(dead_code)]
mod server;

/// One request over a fresh HTTP/1.1 connection (hyper's client); returns
/// the response head and body.
async fn fetch(
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> (http::response::Parts, bytes::Bytes) {
    use http_body_util::BodyExt;
    let stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .expect("handshake");
    tokio::spawn(conn);
    let mut req = http::Request::builder()
        .method(method)
        .uri(path)
        .header("host", addr.to_string());
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let req = req
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .expect("request");
    let res = sender.send_request(req).await.expect("response");
    let (parts, body) = res.into_parts();
    (parts, body.collect().await.expect("body").to_bytes())
}

/// Prints a request (`label` names the instance, if any) and its answer:
/// status, the retry and rate-limit headers, the body.
fn show(
    label: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    res: &(http::response::Parts, bytes::Bytes),
) {
    let (parts, body) = res;
    let shown: Vec<String> = headers.iter().map(|(k, v)| format!("{k}: {v}")).collect();
    println!("  {label}{method} {path} {}", shown.join(" "));
    println!("    -> {}", parts.status);
    for name in [
        "retry-after",
        "ratelimit-policy",
        "ratelimit",
        "content-type",
    ] {
        if let Some(v) = parts.headers.get(name) {
            println!("       {name}: {}", v.to_str().unwrap_or("<binary>"));
        }
    }
    if !body.is_empty() {
        println!("       body: {}", String::from_utf8_lossy(body).trim_end());
    }
}

/// The examples' tokio runtime: two workers, I/O and time.
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

/// Serves `app` on a free port of 127.0.0.1 until the sender is dropped.
async fn serve(
    app: axum::Router,
) -> (
    std::net::SocketAddr,
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<()>,
) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind 127.0.0.1:0");
    let addr = listener.local_addr().expect("local addr");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let serving = tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<std::net::SocketAddr>(),
        )
        .with_graceful_shutdown(async {
            let _ = stopped.await;
        })
        .await
        .expect("server");
    });
    (addr, stop, serving)
}

/// The tower layer over real HTTP: `examples/server.rs` on a free port on
/// 127.0.0.1, driven by a real HTTP/1.1 client (hyper). Shows allowed
/// responses with their `RateLimit` fields, then failed logins until a 429.
fn http_layer() {
    async fn send(addr: std::net::SocketAddr, method: &str, path: &str, headers: &[(&str, &str)]) {
        let res = fetch(addr, method, path, headers).await;
        show("", method, path, headers, &res);
    }

    println!("The HTTP layer: examples/server.rs on 127.0.0.1, a real client");
    println!("  rules: ip 60/min burst 20, key 600/min (x-api-key), login 5 failures/min (hidden)");
    let rt = runtime();
    rt.block_on(async {
        let app = server::router(server::limits(ratewall::DefaultClock::default()));
        let (addr, stop, serving) = serve(app).await;
        send(addr, "GET", "/", &[]).await;
        send(addr, "GET", "/items", &[("x-api-key", "demo-key")]).await;
        send(addr, "POST", "/login", &[("x-password", "hunter2")]).await;
        for _ in 0..5 {
            send(addr, "POST", "/login", &[("x-password", "guess")]).await;
        }
        for _ in 0..2 {
            send(addr, "POST", "/login", &[("x-password", "hunter2")]).await;
        }
        println!(
            "  the two 429s took nothing from the per-IP rule (r is one less, for this request):"
        );
        send(addr, "GET", "/", &[]).await;
        drop(stop);
        serving.await.expect("server task");
    });
    println!();
}

/// The same server with its per-IP and per-API-key limits in a throwaway
/// Redis: two instances on two ports, one client alternating between them,
/// spends one shared budget (bursts of 20 for the fleet, not 20 each).
fn http_on_redis() {
    println!(
        "The HTTP layer on Redis: two instances of examples/server.rs, one throwaway redis-server"
    );
    let Some(redis) = ThrowawayRedis::start() else {
        println!("{NO_REDIS_SERVER}");
        return;
    };
    let url = redis.url();
    let rt = runtime();
    rt.block_on(async {
        // The limits of examples/http_limits_redis.toml (`store = "redis"`
        // rules).
        let (layer, from) = (
            || {
                let file = concat!(
                    env!("CARGO_MANIFEST_DIR"),
                    "/../examples/http_limits_redis.toml"
                );
                server::limits_from_file_on_redis(std::path::Path::new(file), &url)
            },
            "examples/http_limits_redis.toml",
        );
        let mut instances = Vec::new();
        for _ in 0..2 {
            match layer() {
                Ok(l) => instances.push(serve(server::router(l)).await),
                Err(e) => {
                    println!("  (cannot build the Redis limits: {e})\n");
                    return;
                }
            }
        }
        let (a, b) = (instances[0].0, instances[1].0);
        println!("  limits from {from}: ip 60/min burst 20 and key 600/min in Redis at {url}");
        println!("  instance A on {a}, instance B on {b}; one client alternates between them");
        let key = [("x-api-key", "demo-key")];
        let mut last = None;
        let mut quiet = Vec::new();
        for i in 0..21 {
            let (label, addr) = if i % 2 == 0 { ("A ", a) } else { ("B ", b) };
            let res = fetch(addr, "GET", "/", &key).await;
            if !(2..19).contains(&i) {
                if !quiet.is_empty() {
                    let ok = quiet.iter().filter(|s| **s == 200).count();
                    println!("  ... {} more, alternating: {ok} x 200", quiet.len());
                    quiet.clear();
                }
                show(label, "GET", "/", &key, &res);
            } else {
                quiet.push(res.0.status.as_u16());
            }
            last = Some((label.trim(), res.0.status));
        }
        if let Some((label, status)) = last {
            println!(
                "  the 21st request, on {label}, got {status}: the burst of 20 is the fleet's, in Redis\n"
            );
        }
        for (_, stop, serving) in instances {
            drop(stop);
            serving.await.expect("server task");
        }
    });
    drop(redis);
}

#[path = "../../tests/support/backend_sim.rs"]
#[allow(dead_code)]
mod backend_sim;

/// A slow resource behind a fixed concurrency limit and an adaptive one:
/// what each served and shed (simulated time: deterministic, and instant).
fn concurrency() {
    use backend_sim::{run, Phase, BASE};
    use ratewall::{Adaptive, ConcurrencyLimiter, ManualClock};
    println!("concurrency: a slow resource (20 at once at 10 ms, shared above), 250 callers, 5 s simulated");
    let phases = [Phase {
        until_ms: 5_000,
        knee: 20,
    }];
    let limits = [
        ("fixed limit 60", ConcurrencyLimiter::builder(60)),
        (
            "adaptive (Vegas 2..200, from 60)",
            ConcurrencyLimiter::builder(60),
        ),
    ];
    for (i, (name, builder)) in limits.into_iter().enumerate() {
        let clock = ManualClock::new();
        let builder = if i == 1 {
            builder.adaptive(Adaptive::vegas(2, 200))
        } else {
            builder
        };
        let l = builder.clock(clock.clone()).build().expect("valid limit");
        let points = run(&l, &clock, &phases, 250, BASE, 100);
        let served: u64 = points.iter().map(|p| p.served).sum();
        let shed: u64 = points.iter().map(|p| p.shed).sum();
        let (limit, latency) = backend_sim::settled(&points, 4_000, 5_000);
        println!(
            "  {name:<38} served {served:>6}, shed {shed:>7} attempts, last second: limit {limit:>5.1}, latency {latency:>5.1} ms"
        );
    }
    // The same callers waiting for a permit (up to 100 ms) instead of
    // being shed: a release hands its permit to a waiter.
    for adaptive in [false, true] {
        let clock = ManualClock::new();
        let builder = ConcurrencyLimiter::builder(60).clock(clock.clone());
        let l = if adaptive {
            builder.adaptive(Adaptive::vegas(2, 200))
        } else {
            builder
        }
        .build()
        .expect("valid limit");
        let w = waiting_run(&l, &clock, 20, 250, Duration::from_millis(100), 5_000);
        let name = if adaptive {
            "adaptive, callers wait <= 100 ms"
        } else {
            "fixed limit 60, callers wait <= 100 ms"
        };
        println!(
            "  {name:<38} served {:>6}, {:>5} waits timed out; waits: longest {:>3} ms, mean {:>5.1} ms; latency {:>5.1} ms",
            w.served,
            w.timed_out,
            w.longest.as_millis(),
            w.mean_wait_ms,
            w.mean_latency_ms
        );
    }
    println!();
}

/// What the waiting variant saw.
struct Waited {
    served: u64,
    timed_out: u64,
    longest: Duration,
    mean_wait_ms: f64,
    mean_latency_ms: f64,
}

/// `clients` callers in a closed loop on the simulated backend (knee
/// `knee`, 10 ms base), each **waiting** for a permit up to `deadline`
/// (then it gives up, and sends its next request)
/// (`ConcurrencyLimiter::acquire`, polled when its waker fires, as an
/// executor would), for `ms` simulated milliseconds.
fn waiting_run(
    l: &ratewall::ConcurrencyLimiter<ratewall::ManualClock>,
    clock: &ratewall::ManualClock,
    knee: u64,
    clients: usize,
    deadline: Duration,
    ms: u64,
) -> Waited {
    use ratewall::{Acquire, ManualClock, Permit};
    use std::future::Future;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::task::{Context, Poll, Wake, Waker};

    struct Flag(AtomicBool);
    impl Wake for Flag {
        fn wake(self: Arc<Self>) {
            self.0.store(true, Ordering::Relaxed);
        }
    }
    enum Caller<'a> {
        Idle,
        Waiting(Acquire<'a, ManualClock>, Duration),
        /// Until when, and the permit it holds (released when replaced).
        Running(Duration, #[allow(dead_code)] Permit<'a, ManualClock>),
    }
    let flags: Vec<Arc<Flag>> = (0..clients)
        .map(|_| Arc::new(Flag(AtomicBool::new(false))))
        .collect();
    let wakers: Vec<Waker> = flags.iter().map(|f| Waker::from(Arc::clone(f))).collect();
    let mut callers: Vec<Caller<'_>> = (0..clients).map(|_| Caller::Idle).collect();
    let base_ns = backend_sim::BASE.as_nanos() as u64;
    let mut w = Waited {
        served: 0,
        timed_out: 0,
        longest: Duration::ZERO,
        mean_wait_ms: 0.0,
        mean_latency_ms: 0.0,
    };
    let mut latency_sum = 0u64;
    let (mut wait_sum, mut admitted) = (Duration::ZERO, 0u64);
    for t in 0..ms {
        let now = Duration::from_millis(t);
        // Requests that end now give their permits back (to waiters).
        for c in callers.iter_mut() {
            if matches!(c, Caller::Running(end, _) if *end <= now) {
                *c = Caller::Idle;
                w.served += 1;
            }
        }
        for (i, c) in callers.iter_mut().enumerate() {
            if let Caller::Idle = c {
                *c = Caller::Waiting(l.acquire(), now);
                flags[i].0.store(true, Ordering::Relaxed);
            }
            let Caller::Waiting(acquire, since) = c else {
                continue;
            };
            let since = *since;
            if flags[i].0.swap(false, Ordering::Relaxed) {
                let mut cx = Context::from_waker(&wakers[i]);
                if let Poll::Ready(permit) = std::pin::Pin::new(acquire).poll(&mut cx) {
                    let permit = permit.expect("a cost of 1 fits");
                    let waited = now - since;
                    w.longest = w.longest.max(waited);
                    wait_sum += waited;
                    admitted += 1;
                    let latency = backend_sim::latency_ns(base_ns, l.in_flight(), knee);
                    latency_sum += latency;
                    *c = Caller::Running(now + Duration::from_nanos(latency), permit);
                    continue;
                }
            }
            if now - since >= deadline {
                *c = Caller::Idle; // gives up: the dropped wait takes nothing
                w.timed_out += 1;
            }
        }
        clock.advance(backend_sim::TICK);
    }
    w.mean_wait_ms = wait_sum.as_secs_f64() * 1e3 / (admitted.max(1) as f64);
    w.mean_latency_ms = latency_sum as f64 / 1e6 / (admitted.max(1) as f64);
    w
}
