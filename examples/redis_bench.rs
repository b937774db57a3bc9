//! Redis backend throughput against the seed token-bucket script
//! (docs/distributed.md), same server, same run, loopback:
//! `cargo run --release --example redis_bench --features redis`.
//!
//! Also: every algorithm at 1, 16 and 128 callers, and 7 alternating
//! rounds at 128 callers with the median ratio.
//!
//! For 1, 16 and 128 concurrent callers: checks/s and p50/p99 latency of
//! ratewall's GCRA script through `RedisLimiter` ("ratewall"), the same
//! script on the seed's plain connection ("raw"), and the seed script, on uniform keys (all
//! allowed) and on one hot key (mostly denied). A harness, not a test:
//! read the ratios, not the absolute numbers, on a shared machine.

use ratewall::redis::{FailurePolicy, RedisBackend, RedisLimiter};
use ratewall::{Policy, Rate};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const SEED: &str = r#"
local key = KEYS[1]
local capacity = tonumber(ARGV[1])
local refill_rate = tonumber(ARGV[2])
local now = tonumber(ARGV[3])
local bucket = redis.call('HMGET', key, 'tokens', 'last_refill')
local tokens = tonumber(bucket[1]) or capacity
local last_refill = tonumber(bucket[2]) or now
local elapsed = now - last_refill
tokens = math.min(capacity, tokens + elapsed * refill_rate)
if tokens < 1 then return 0 end
tokens = tokens - 1
redis.call('HMSET', key, 'tokens', tokens, 'last_refill', now)
redis.call('EXPIRE', key, 3600)
return 1
"#;

/// ratewall's GCRA script, sent over the same plain connection as the
/// seed: separates the script's cost from the client stack's.
const OURS_RAW: &str = concat!(
    include_str!("../src/redis/lua/prelude.lua"),
    include_str!("../src/redis/lua/gcra.lua"),
    "local step, refund = gcra_step, gcra_refund\n",
    include_str!("../src/redis/lua/check.lua"),
);

const RUN: Duration = Duration::from_millis(1500);

#[tokio::main]
async fn main() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut server = Command::new("redis-server")
        .args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .stdout(Stdio::null())
        .spawn()
        .expect("redis-server (apt-get install redis-server)");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let url = format!("redis://127.0.0.1:{port}");
    let backend = RedisBackend::builder(url.clone())
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    let ours = Arc::new(
        RedisLimiter::builder(
            Policy::token_bucket(Rate::per_second(100).burst(100)),
            &backend,
        )
        .name("bench")
        .on_failure(FailurePolicy::Closed)
        .build()
        .unwrap(),
    );
    let cached = Arc::new(
        RedisLimiter::builder(
            Policy::token_bucket(Rate::per_second(100).burst(100)),
            &backend,
        )
        .name("bench-dc")
        .on_failure(FailurePolicy::Closed)
        .deny_cache(100_000)
        .build()
        .unwrap(),
    );
    let client = redis::Client::open(url.as_str()).unwrap();
    let conn = client.get_multiplexed_async_connection().await.unwrap();
    let seed = Arc::new(redis::Script::new(SEED));
    let raw = Arc::new(redis::Script::new(OURS_RAW));
    per_algorithm(&backend).await;
    println!();
    println!(
        "{:<10} {:<8} {:>7} {:>12} {:>9} {:>9} {:>8}",
        "workload", "script", "callers", "checks/s", "p50 us", "p99 us", "allowed"
    );
    let ctx = Ctx {
        ours,
        cached,
        seed,
        raw,
        conn,
    };
    for hot in [false, true] {
        for callers in [1usize, 16, 128] {
            let variants: &[&str] = if hot {
                &["seed", "raw", "ratewall", "rw+cache"]
            } else {
                &["seed", "raw", "ratewall"]
            };
            for &which in variants {
                let (rate, lat, allowed) = ctx.run(which, callers, hot, RUN).await;
                let n = lat.len();
                println!(
                    "{:<10} {:<8} {:>7} {:>12.0} {:>9} {:>9} {:>7.0}%",
                    if hot { "hot key" } else { "uniform" },
                    which,
                    callers,
                    rate,
                    lat[n / 2].as_micros(),
                    lat[n * 99 / 100].as_micros(),
                    100.0 * allowed as f64 / n as f64
                );
            }
        }
    }
    // Alternating rounds at 128 callers, uniform keys: the ratio per round,
    // then the median and the spread (single points move by 30% here).
    let mut ratios = Vec::new();
    for _ in 0..7 {
        let (seed_rate, _, _) = ctx
            .run("seed", 128, false, Duration::from_millis(600))
            .await;
        let (ours_rate, _, _) = ctx
            .run("ratewall", 128, false, Duration::from_millis(600))
            .await;
        ratios.push(ours_rate / seed_rate);
    }
    ratios.sort_by(f64::total_cmp);
    println!(
        "\nratewall / seed, 128 callers, uniform, 7 alternating rounds: median {:.2}x (min {:.2}x, max {:.2}x)",
        ratios[3], ratios[0], ratios[6]
    );
    let _ = server.kill();
    let _ = server.wait();
}

struct Ctx {
    ours: Arc<RedisLimiter>,
    cached: Arc<RedisLimiter>,
    seed: Arc<redis::Script>,
    raw: Arc<redis::Script>,
    conn: redis::aio::MultiplexedConnection,
}

impl Ctx {
    /// One point: `callers` tasks for `run`; checks/s, latencies, allowed.
    async fn run(
        &self,
        which: &'static str,
        callers: usize,
        hot: bool,
        run: Duration,
    ) -> (f64, Vec<Duration>, u64) {
        let stop = Instant::now() + run;
        let mut tasks = Vec::new();
        for c in 0..callers {
            let ours = if which == "rw+cache" {
                self.cached.clone()
            } else {
                self.ours.clone()
            };
            let seed = self.seed.clone();
            let raw = self.raw.clone();
            let mut conn = self.conn.clone();
            tasks.push(tokio::spawn(async move {
                let mut lat = Vec::new();
                let mut allowed = 0u64;
                let mut i = c as u64 * 7919;
                while Instant::now() < stop {
                    i += 1;
                    let key = if hot {
                        "hot".to_string()
                    } else {
                        format!("k{}", i % 100_000)
                    };
                    let t = Instant::now();
                    let ok = if which == "seed" {
                        let now = SystemTime::now()
                            .duration_since(UNIX_EPOCH)
                            .unwrap()
                            .as_secs_f64();
                        let v: i64 = seed
                            .key(format!("seed:{key}"))
                            .arg(100)
                            .arg(100)
                            .arg(now)
                            .invoke_async(&mut conn)
                            .await
                            .unwrap();
                        v == 1
                    } else if which == "raw" {
                        let v: Vec<i64> = raw
                            .key(format!("raw:{key}"))
                            .arg("c")
                            .arg(1)
                            .arg(10_000)
                            .arg(1_000_000)
                            .arg(100)
                            .arg("")
                            .invoke_async(&mut conn)
                            .await
                            .unwrap();
                        v[0] == 1
                    } else {
                        ours.check(key.as_bytes()).await.unwrap().is_allowed()
                    };
                    lat.push(t.elapsed());
                    allowed += u64::from(ok);
                }
                (lat, allowed)
            }));
        }
        let mut lat = Vec::new();
        let mut allowed = 0;
        for t in tasks {
            let (l, a) = t.await.unwrap();
            lat.extend(l);
            allowed += a;
        }
        lat.sort();
        (lat.len() as f64 / run.as_secs_f64(), lat, allowed)
    }
}

/// Every algorithm through `RedisLimiter`, uniform keys, limits far above
/// the load (all allowed): checks/s and p50/p99 at 1, 16 and 128 callers.
async fn per_algorithm(backend: &RedisBackend) {
    use ratewall::Window;
    println!(
        "{:<24} {:>7} {:>12} {:>9} {:>9}",
        "algorithm", "callers", "checks/s", "p50 us", "p99 us"
    );
    let hour = Duration::from_secs(3600);
    let policies = [
        Policy::token_bucket(Rate::new(1000, hour)),
        Policy::leaky_bucket(Rate::new(1000, hour)),
        Policy::fixed_window(Window::new(1000, hour)),
        Policy::sliding_window_counter(Window::new(1000, hour)),
        Policy::sliding_window_log(Window::new(1000, hour)),
    ];
    for (i, policy) in policies.into_iter().enumerate() {
        let l = Arc::new(
            RedisLimiter::builder(policy, backend)
                .name(format!("alg{i}"))
                .on_failure(FailurePolicy::Closed)
                .build()
                .unwrap(),
        );
        for callers in [1usize, 16, 128] {
            let stop = Instant::now() + Duration::from_millis(800);
            let mut tasks = Vec::new();
            for c in 0..callers {
                let l = l.clone();
                tasks.push(tokio::spawn(async move {
                    let mut lat = Vec::new();
                    let mut k = c as u64 * 7919;
                    while Instant::now() < stop {
                        k += 1;
                        let t = Instant::now();
                        let _ = l
                            .check(format!("k{}", k % 100_000).as_bytes())
                            .await
                            .unwrap();
                        lat.push(t.elapsed());
                    }
                    lat
                }));
            }
            let mut lat = Vec::new();
            for t in tasks {
                lat.extend(t.await.unwrap());
            }
            lat.sort();
            let n = lat.len();
            println!(
                "{:<24} {:>7} {:>12.0} {:>9} {:>9}",
                policy.algorithm().name(),
                callers,
                n as f64 / 0.8,
                lat[n / 2].as_micros(),
                lat[n * 99 / 100].as_micros()
            );
        }
    }
}
