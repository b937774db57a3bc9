//! Redis leases: round trips per admitted request and checks/s of one hot
//! key from 4 client instances (each its own `RedisBackend`, so its own
//! connection), with and without leases, on a loopback `redis-server` the
//! harness starts:
//! `cargo run --release --example redis_lease_bench --features redis`
//! (`-- --secs 2 --rounds 5 --tasks 4`).
//!
//! Two workloads, each in alternating rounds (the plain `RedisLimiter`,
//! then `RedisLeaseLimiter` with `max_lease(1)`, then with leases of 16):
//! a hot key far from its limit (1M/s, burst 10,000) and a saturated one
//! (20k/s, burst 200, with the deny cache). Round trips are the
//! server's own count of script calls (`INFO commandstats`); after every
//! round the harness checks admitted <= burst + rate x elapsed, elapsed
//! measured from before the first call to after the last reply. A
//! harness, not a test: on a shared machine read the ratios.

#[path = "../tests/support/redis_server.rs"]
mod redis_server;

use ratewall::redis::{
    DecisionSource, FailurePolicy, RedisBackend, RedisLeaseLimiter, RedisLeaseOptions, RedisLimiter,
};
use ratewall::{Policy, Rate};
use redis_server::RedisServer;
use std::sync::Arc;
use std::time::{Duration, Instant};

struct Args {
    secs: f64,
    rounds: usize,
    tasks: usize,
}

fn args() -> Args {
    let mut a = Args {
        secs: 2.0,
        rounds: 5,
        tasks: 4,
    };
    let v: Vec<String> = std::env::args().collect();
    let mut i = 1;
    while i + 1 < v.len() {
        match v[i].as_str() {
            "--secs" => a.secs = v[i + 1].parse().expect("--secs <float>"),
            "--rounds" => a.rounds = v[i + 1].parse().expect("--rounds <n>"),
            "--tasks" => a.tasks = v[i + 1].parse().expect("--tasks <n>"),
            _ => {}
        }
        i += 2;
    }
    a
}

/// Script calls the server ran since the last `CONFIG RESETSTAT`.
async fn script_calls(conn: &mut redis::aio::MultiplexedConnection) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .unwrap();
    info.lines()
        .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:"))
        .map(|l| {
            l.split("calls=")
                .nth(1)
                .unwrap()
                .split(',')
                .next()
                .unwrap()
                .parse::<u64>()
                .unwrap()
        })
        .sum()
}

/// A client instance: the plain limiter (gcra.lua) or a leased one.
enum Inst {
    Plain(Box<RedisLimiter>),
    Leased(Box<RedisLeaseLimiter>),
}

impl Inst {
    async fn check(&self, key: &[u8]) -> ratewall::redis::RedisDecision {
        match self {
            Inst::Plain(l) => l.check_key(key).await.unwrap(),
            Inst::Leased(l) => l.check_key(key).await.unwrap(),
        }
    }
}

struct Point {
    checks: u64,
    admitted: u64,
    from_lease: u64,
    calls: u64,
    secs: f64,
}

#[allow(clippy::too_many_arguments)]
async fn round(
    url: &str,
    conn: &mut redis::aio::MultiplexedConnection,
    policy: Policy,
    name: &str,
    max_lease: u64,
    deny_cache: bool,
    tasks: usize,
    run: Duration,
) -> Point {
    let instances: Vec<Arc<Inst>> = (0..4)
        .map(|_| {
            let b = RedisBackend::builder(url)
                .timeout(Duration::from_secs(2))
                .build()
                .unwrap();
            let mut l = RedisLimiter::builder(policy, &b)
                .name(name)
                .on_failure(FailurePolicy::Closed);
            if deny_cache {
                l = l.deny_cache(1000);
            }
            let l = l.build().unwrap();
            Arc::new(if max_lease == 0 {
                Inst::Plain(Box::new(l))
            } else {
                Inst::Leased(Box::new(
                    RedisLeaseLimiter::new(l, RedisLeaseOptions::new().max_lease(max_lease))
                        .unwrap(),
                ))
            })
        })
        .collect();
    // A fresh key per round; the script is loaded before counting.
    let key = format!("hot-{}", rand_suffix());
    for l in &instances {
        let _ = l.check(b"warm-up").await;
    }
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(conn)
        .await
        .unwrap();
    let start = Instant::now();
    let stop = start + run;
    let mut handles = Vec::new();
    for l in &instances {
        for _ in 0..tasks {
            let l = l.clone();
            let key = key.clone();
            handles.push(tokio::spawn(async move {
                let (mut checks, mut admitted, mut from_lease) = (0u64, 0u64, 0u64);
                while Instant::now() < stop {
                    for _ in 0..32 {
                        let d = l.check(key.as_bytes()).await;
                        checks += 1;
                        if d.is_allowed() {
                            admitted += 1;
                            from_lease += u64::from(d.source() == DecisionSource::Lease);
                        }
                    }
                    // Lets the other tasks of this runtime in.
                    tokio::task::yield_now().await;
                }
                (checks, admitted, from_lease)
            }));
        }
    }
    let (mut checks, mut admitted, mut from_lease) = (0, 0, 0);
    for h in handles {
        let (c, a, f) = h.await.unwrap();
        checks += c;
        admitted += a;
        from_lease += f;
    }
    let elapsed = start.elapsed();
    let calls = script_calls(conn).await;
    for l in instances.iter() {
        if let Inst::Leased(l) = &**l {
            let _ = l.release_all().await;
        }
    }
    // The bound: admitted <= burst + rate x elapsed (elapsed covers every
    // server-side admission of the round).
    let r = policy.rate().unwrap();
    let bound =
        r.burst_size() as f64 + r.count() as f64 * elapsed.as_secs_f64() / r.period().as_secs_f64();
    assert!(
        admitted as f64 <= bound.floor(),
        "bound violated: {admitted} admitted, bound {bound:.0}"
    );
    Point {
        checks,
        admitted,
        from_lease,
        calls,
        secs: elapsed.as_secs_f64(),
    }
}

fn rand_suffix() -> u64 {
    use std::hash::{BuildHasher, RandomState};
    RandomState::new().hash_one(Instant::now())
}

#[tokio::main]
async fn main() {
    let a = args();
    // A throwaway server on a free port, killed (by PID) however the
    // harness ends, a panic included.
    let server = RedisServer::start();
    let url = server.url();
    let client = redis::Client::open(url.as_str()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let run = Duration::from_secs_f64(a.secs);
    println!(
        "4 instances x {} tasks, one hot key, {} s per round, {} alternating rounds",
        a.tasks, a.secs, a.rounds
    );
    println!(
        "{:<28} {:>9} {:>12} {:>12} {:>10} {:>11} {:>9}",
        "workload", "max_lease", "checks/s", "admitted/s", "calls/s", "calls/adm", "leased %"
    );
    let workloads = [
        (
            "hot, 1M/s burst 10000",
            Policy::token_bucket(Rate::per_second(1_000_000).burst(10_000)),
            false,
        ),
        (
            "saturated, 20k/s burst 200",
            Policy::token_bucket(Rate::per_second(20_000).burst(200)),
            true,
        ),
    ];
    for (label, policy, deny_cache) in workloads {
        let mut ratios = Vec::new();
        let mut speed = Vec::new();
        for r in 0..a.rounds {
            let mut per = Vec::new();
            for max_lease in [0u64, 1, 16] {
                let name = format!("b{r}x{max_lease}");
                let p = round(
                    &url, &mut conn, policy, &name, max_lease, deny_cache, a.tasks, run,
                )
                .await;
                println!(
                    "{:<28} {:>9} {:>12.0} {:>12.0} {:>10.0} {:>11.3} {:>8.1}%",
                    label,
                    if max_lease == 0 {
                        "plain".to_string()
                    } else {
                        max_lease.to_string()
                    },
                    p.checks as f64 / p.secs,
                    p.admitted as f64 / p.secs,
                    p.calls as f64 / p.secs,
                    p.calls as f64 / p.admitted.max(1) as f64,
                    100.0 * p.from_lease as f64 / p.admitted.max(1) as f64,
                );
                per.push(p);
            }
            let rt = |p: &Point| p.calls as f64 / p.admitted.max(1) as f64;
            ratios.push(rt(&per[0]) / rt(&per[2]).max(1e-9));
            speed.push((per[2].checks as f64 / per[2].secs) / (per[0].checks as f64 / per[0].secs));
        }
        ratios.sort_by(f64::total_cmp);
        speed.sort_by(f64::total_cmp);
        let m = a.rounds / 2;
        println!(
            "{label}: round trips per admitted, plain limiter / leases of 16: median {:.1}x (min {:.1}x, max {:.1}x); checks/s leases of 16 / plain: median {:.1}x (min {:.1}x, max {:.1}x)\n",
            ratios[m],
            ratios[0],
            ratios[a.rounds - 1],
            speed[m],
            speed[0],
            speed[a.rounds - 1]
        );
    }
}
