//! Redis backend throughput against the seed token-bucket script
//! (docs/distributed.md), same server, same run, loopback:
//! `cargo run --release --example redis_bench --features redis [-- --rounds 7 --quick]`.
//!
//! Contenders, each on its own connection to one `redis-server` that the
//! harness starts: the seed script (a hash, the client's clock,
//! `HMGET`/`HMSET`/`EXPIRE`); "raw", ratewall's GCRA script sent over the
//! seed's plain connection (separates the script from the client stack);
//! `RedisLimiter` (GCRA) batched (the default) and unbatched
//! (`max_batch(1)`); and `RedisLimiter` with the deny cache.
//!
//! Workloads: uniform keys (100k, all allowed); mixed (Zipf keys, s = 1,
//! over 10k keys, 20 per second each, about half the requests over their
//! limit); one hot key (mostly denied). For 1, 16 and 128 concurrent
//! callers: checks/s and p50/p99 latency. Each point starts on an empty
//! server (`FLUSHALL`). Then every algorithm, and
//! alternating rounds at 128 callers (seed, then ratewall, fresh keys each
//! round) with the median ratio and its spread. A harness, not a test:
//! read the ratios, not the absolute numbers, on a shared machine.
//!
//! Flags: `--rounds N`; `--quick` (the alternating rounds only); `--alt
//! uniform:ratewall` (one alternating series); `--only WORKLOAD:CONTENDER
//! [--callers N] [--secs S]` (one point, with CPU per check of the server
//! and the client, and the server's command statistics); `--in-flight N`,
//! `--max-batch N` (the batched backend's settings); `--verbose`.

#[path = "../tests/support/redis_server.rs"]
mod redis_server;

use ratewall::redis::{FailurePolicy, RedisBackend, RedisLimiter};
use ratewall::{Policy, Rate};
use redis_server::RedisServer;
use std::sync::atomic::{AtomicU64, Ordering};
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
/// One side of one alternating round.
const ROUND: Duration = Duration::from_millis(1500);
/// Keys of the uniform workload.
const UNIFORM_KEYS: u64 = 100_000;
/// Keys of the mixed workload, drawn from a Zipf distribution.
const ZIPF_KEYS: usize = 10_000;
/// The limit of the uniform and hot-key workloads: 100 per second, burst 100.
const RATE: u64 = 100;
/// The mixed workload's limit per key: 20 per second, burst 20.
const MIXED_RATE: u64 = 20;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Workload {
    Uniform,
    Mixed,
    Hot,
}

impl Workload {
    fn name(self) -> &'static str {
        match self {
            Workload::Uniform => "uniform",
            Workload::Mixed => "mixed",
            Workload::Hot => "hot key",
        }
    }

    fn rate(self) -> u64 {
        if self == Workload::Mixed {
            MIXED_RATE
        } else {
            RATE
        }
    }
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let rounds: usize = args
        .iter()
        .position(|a| a == "--rounds")
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(7);
    let quick = args.iter().any(|a| a == "--quick");
    let verbose = args.iter().any(|a| a == "--verbose");
    let flag = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let in_flight: usize = flag("--in-flight")
        .and_then(|v| v.parse().ok())
        .unwrap_or(ratewall::redis::DEFAULT_IN_FLIGHT);
    let max_batch: usize = flag("--max-batch")
        .and_then(|v| v.parse().ok())
        .unwrap_or(ratewall::redis::DEFAULT_MAX_BATCH);
    // `--only uniform:ratewall [--callers N]` runs that point alone for 3 s
    // (to profile; 128 callers unless given).
    let only = flag("--only");
    // A throwaway server on a free port, killed (by PID) however the
    // harness ends, a panic included.
    let server = RedisServer::start();
    let url = server.url();
    let backend = |max_batch: usize| {
        RedisBackend::builder(url.clone())
            .timeout(Duration::from_secs(2))
            .max_batch(max_batch)
            .batches_in_flight(in_flight)
            .build()
            .unwrap()
    };
    let (batched, unbatched) = (backend(max_batch), backend(1));
    let limiter = |b: &RedisBackend, name: &str, rate: u64, cache: bool| {
        let mut l =
            RedisLimiter::builder(Policy::token_bucket(Rate::per_second(rate).burst(rate)), b)
                .name(name)
                .on_failure(FailurePolicy::Closed);
        if cache {
            l = l.deny_cache(100_000);
        }
        Arc::new(l.build().unwrap())
    };
    let client = redis::Client::open(url.as_str()).unwrap();
    let ctx = Ctx {
        ratewall: [RATE, MIXED_RATE].map(|r| limiter(&batched, &format!("b{r}"), r, false)),
        unbatched: [RATE, MIXED_RATE].map(|r| limiter(&unbatched, &format!("u{r}"), r, false)),
        cached: [RATE, MIXED_RATE].map(|r| limiter(&batched, &format!("c{r}"), r, true)),
        seed: Arc::new(redis::Script::new(SEED)),
        raw: Arc::new(redis::Script::new(OURS_RAW)),
        conn: client.get_multiplexed_async_connection().await.unwrap(),
        zipf: Arc::new(zipf_sequence(ZIPF_KEYS, 1 << 20)),
        round: AtomicU64::new(0),
    };
    if let Some(only) = only {
        let (w, which) = only.split_once(':').expect("--only WORKLOAD:CONTENDER");
        let workload = match w {
            "uniform" => Workload::Uniform,
            "mixed" => Workload::Mixed,
            _ => Workload::Hot,
        };
        let which: &'static str = Box::leak(which.to_string().into_boxed_str());
        let callers = flag("--callers")
            .and_then(|v| v.parse().ok())
            .unwrap_or(128);
        // `--secs S` (default 3; 0 measures the harness's own start-up, to
        // subtract from an instruction count under callgrind).
        let secs: f64 = flag("--secs").and_then(|v| v.parse().ok()).unwrap_or(3.0);
        let mut conn = ctx.conn.clone();
        let cpu_before = (server_cpu(&mut conn).await, own_cpu());
        let p = ctx
            .run(which, callers, workload, Duration::from_secs_f64(secs))
            .await;
        let cpu_after = (server_cpu(&mut conn).await, own_cpu());
        println!(
            "{only}: {:.0} checks/s ({} checks), p50 {} us, p99 {} us, {:.0}% allowed",
            p.rate,
            p.checks,
            p.p50.as_micros(),
            p.p99.as_micros(),
            p.allowed_pct
        );
        // CPU time per check (steadier than checks/s on a shared machine):
        // the server's (`INFO cpu`) and this process's (`/proc/self/stat`).
        let per_check = |a: f64, b: f64| (b - a) * 1e6 / p.checks.max(1) as f64;
        println!(
            "  cpu per check: server {:.2} us, client {:.2} us",
            per_check(cpu_before.0, cpu_after.0),
            per_check(cpu_before.1, cpu_after.1)
        );
        // The server's own accounting: calls and time per script call.
        let stats: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut conn)
            .await
            .unwrap();
        for line in stats.lines().filter(|l| {
            l.contains("evalsha")
                || l.contains("cmdstat_get")
                || l.contains("cmdstat_set")
                || l.contains("cmdstat_hmget")
        }) {
            println!("  {line}");
        }
        return;
    }
    if !quick {
        per_algorithm(&batched).await;
        println!();
        println!(
            "{:<10} {:<10} {:>7} {:>12} {:>9} {:>9} {:>8}",
            "workload", "contender", "callers", "checks/s", "p50 us", "p99 us", "allowed"
        );
        for workload in [Workload::Uniform, Workload::Mixed, Workload::Hot] {
            for callers in [1usize, 16, 128] {
                let mut variants = vec!["seed", "raw", "ratewall", "unbatched"];
                if workload != Workload::Uniform {
                    variants.push("rw+cache");
                }
                for which in variants {
                    let p = ctx.run(which, callers, workload, RUN).await;
                    println!(
                        "{:<10} {:<10} {:>7} {:>12.0} {:>9} {:>9} {:>7.0}%",
                        workload.name(),
                        which,
                        callers,
                        p.rate,
                        p.p50.as_micros(),
                        p.p99.as_micros(),
                        p.allowed_pct
                    );
                }
            }
        }
    }
    // Alternating rounds at 128 callers, fresh keys each round: the ratio
    // per round, then the median and the spread (single points move by 30%
    // on a shared machine).
    println!(
        "\nAlternating rounds, 128 callers, {rounds} rounds of {:.1} s per side (median, min-max):",
        ROUND.as_secs_f64()
    );
    // `--alt uniform:ratewall` runs that series alone.
    let alt = flag("--alt");
    for (workload, which) in [
        (Workload::Uniform, "ratewall"),
        (Workload::Uniform, "unbatched"),
        (Workload::Mixed, "ratewall"),
        (Workload::Mixed, "unbatched"),
        (Workload::Mixed, "rw+cache"),
    ] {
        if alt
            .as_ref()
            .is_some_and(|a| *a != format!("{}:{which}", workload.name()))
        {
            continue;
        }
        let mut ratios = Vec::new();
        let (mut allowed_seed, mut allowed_ours) = (Vec::new(), Vec::new());
        for _ in 0..rounds {
            let seed = ctx.run("seed", 128, workload, ROUND).await;
            let ours = ctx.run(which, 128, workload, ROUND).await;
            ratios.push(ours.rate / seed.rate);
            if verbose {
                println!("    seed {:.0}/s, {which} {:.0}/s", seed.rate, ours.rate);
            }
            allowed_seed.push(seed.allowed_pct);
            allowed_ours.push(ours.allowed_pct);
        }
        ratios.sort_by(f64::total_cmp);
        let mid = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        println!(
            "  {:<8} {:<10} / seed: {:.2}x ({:.2}-{:.2}x)   allowed: seed {:.0}%, ours {:.0}%",
            workload.name(),
            which,
            ratios[ratios.len() / 2],
            ratios[0],
            ratios[ratios.len() - 1],
            mid(&mut allowed_seed),
            mid(&mut allowed_ours),
        );
    }
}

/// The server's CPU time so far, in seconds (`INFO cpu`).
async fn server_cpu(conn: &mut redis::aio::MultiplexedConnection) -> f64 {
    let info: String = redis::cmd("INFO")
        .arg("cpu")
        .query_async(conn)
        .await
        .unwrap();
    info.lines()
        .filter(|l| l.starts_with("used_cpu_sys:") || l.starts_with("used_cpu_user:"))
        .filter_map(|l| l.split_once(':')?.1.trim().parse::<f64>().ok())
        .sum()
}

/// This process's CPU time so far, in seconds (`/proc/self/stat`, in
/// clock ticks of 10 ms; 0 where there is no `/proc`).
fn own_cpu() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // The fields after the command name (which is in parentheses).
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime: fields 14 and 15 of the line, 11 and 12 here.
    let ticks: u64 = [11, 12]
        .iter()
        .filter_map(|&i| f.get(i)?.parse::<u64>().ok())
        .sum();
    ticks as f64 / 100.0
}

/// `len` key indexes in `0..keys`, Zipf-distributed with s = 1 (key `i`
/// drawn with probability proportional to `1 / (i + 1)`), from a fixed
/// seed so every contender sees the same sequence.
fn zipf_sequence(keys: usize, len: usize) -> Vec<u32> {
    let mut cdf = Vec::with_capacity(keys);
    let mut sum = 0.0;
    for i in 0..keys {
        sum += 1.0 / (i + 1) as f64;
        cdf.push(sum);
    }
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    (0..len)
        .map(|_| {
            // splitmix64
            state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^= z >> 31;
            let u = (z >> 11) as f64 / (1u64 << 53) as f64 * sum;
            cdf.partition_point(|&c| c < u) as u32
        })
        .collect()
}

struct Ctx {
    /// Batched `RedisLimiter`s for the uniform/hot rate and the mixed rate.
    ratewall: [Arc<RedisLimiter>; 2],
    unbatched: [Arc<RedisLimiter>; 2],
    cached: [Arc<RedisLimiter>; 2],
    seed: Arc<redis::Script>,
    raw: Arc<redis::Script>,
    conn: redis::aio::MultiplexedConnection,
    zipf: Arc<Vec<u32>>,
    /// Each run's keys are fresh: a per-run tag in every key.
    round: AtomicU64,
}

struct Point {
    rate: f64,
    checks: usize,
    p50: Duration,
    p99: Duration,
    allowed_pct: f64,
}

impl Ctx {
    /// One point: `callers` tasks for `run`.
    async fn run(
        &self,
        which: &'static str,
        callers: usize,
        workload: Workload,
        run: Duration,
    ) -> Point {
        let tag = self.round.fetch_add(1, Ordering::Relaxed);
        // Each point starts on an empty server, so no contender pays for
        // expiring or rehashing the keys of the one before.
        let _: () = redis::cmd("FLUSHALL")
            .arg("SYNC")
            .query_async(&mut self.conn.clone())
            .await
            .unwrap();
        let slot = usize::from(workload == Workload::Mixed);
        let ours = match which {
            "rw+cache" => self.cached[slot].clone(),
            "unbatched" => self.unbatched[slot].clone(),
            _ => self.ratewall[slot].clone(),
        };
        let rate = workload.rate();
        let stop = Instant::now() + run;
        let mut tasks = Vec::new();
        for c in 0..callers {
            let ours = ours.clone();
            let seed = self.seed.clone();
            let raw = self.raw.clone();
            let zipf = self.zipf.clone();
            let mut conn = self.conn.clone();
            tasks.push(tokio::spawn(async move {
                let mut lat = Vec::new();
                let mut allowed = 0u64;
                let mut i = c as u64 * 7919;
                while Instant::now() < stop {
                    i += 1;
                    let key = match workload {
                        Workload::Hot => format!("{tag}:hot"),
                        Workload::Uniform => format!("{tag}:{}", i % UNIFORM_KEYS),
                        Workload::Mixed => format!("{tag}:{}", zipf[i as usize % zipf.len()]),
                    };
                    let t = Instant::now();
                    let ok = match which {
                        "seed" => {
                            let now = SystemTime::now()
                                .duration_since(UNIX_EPOCH)
                                .unwrap()
                                .as_secs_f64();
                            let v: i64 = seed
                                .key(format!("seed:{key}"))
                                .arg(rate)
                                .arg(rate)
                                .arg(now)
                                .invoke_async(&mut conn)
                                .await
                                .unwrap();
                            v == 1
                        }
                        "raw" => {
                            let t_us = 1_000_000 / rate;
                            let v: Vec<i64> = raw
                                .key(format!("raw:{key}"))
                                .arg("c")
                                .arg(1)
                                .arg(t_us)
                                .arg(t_us * rate)
                                .arg(rate)
                                .arg("")
                                .invoke_async(&mut conn)
                                .await
                                .unwrap();
                            v[0] == 1
                        }
                        _ => ours.check_key(key.as_bytes()).await.unwrap().is_allowed(),
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
        let n = lat.len().max(1);
        Point {
            rate: lat.len() as f64 / run.as_secs_f64().max(1e-9),
            checks: lat.len(),
            p50: lat.get(n / 2).copied().unwrap_or_default(),
            p99: lat.get(n * 99 / 100).copied().unwrap_or_default(),
            allowed_pct: 100.0 * allowed as f64 / n as f64,
        }
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
                            .check_key(format!("k{}", k % 100_000).as_bytes())
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
