//! A quick side-by-side of ratewall's keyed limiter and governor 0.10 in one
//! run: keyed checks per second (100k and 1M keys, 1 and 2 threads, a hot
//! key), multi-limit cost, and resident memory per tracked key for three
//! key types. Not the criterion suite (that lives on the `bench` branch).
//!
//! Run: `cargo run --release --example keyed_bench` (about a minute).
//! `KEYED_BENCH_SECS=0.3` shortens each measurement.

use governor::{Quota, RateLimiter};
use ratewall::{check_all, KeyedTokenBucket, Limit, Rate, TokenBucket};
use std::hint::black_box;
use std::net::{IpAddr, Ipv6Addr};
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn secs() -> f64 {
    std::env::var("KEYED_BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1.0)
}

fn keys(n: u64, len: usize, seed: u64) -> Vec<u64> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        })
        .collect()
}

/// Runs `f(thread, i)` on `threads` threads for about `secs()`, three times,
/// and returns the best aggregate operations per second (the machine is
/// shared: the best run is the least disturbed one).
fn ops_per_sec<F: Fn(usize, usize) + Send + Sync + 'static>(threads: usize, f: F) -> f64 {
    let f = Arc::new(f);
    (0..3)
        .map(|_| one_run(threads, Arc::clone(&f)))
        .fold(0.0, f64::max)
}

fn one_run<F: Fn(usize, usize) + Send + Sync + 'static>(threads: usize, f: Arc<F>) -> f64 {
    let budget = Duration::from_secs_f64(secs());
    let start = Instant::now();
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let f = Arc::clone(&f);
            std::thread::spawn(move || {
                let begin = Instant::now();
                let mut i = 0usize;
                while begin.elapsed() < budget {
                    for _ in 0..4096 {
                        f(t, i);
                        i += 1;
                    }
                }
                i
            })
        })
        .collect();
    let total: usize = handles.into_iter().map(|h| h.join().unwrap()).sum();
    total as f64 / start.elapsed().as_secs_f64()
}

fn rss_bytes() -> usize {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: usize = statm
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

fn generous() -> Rate {
    Rate::per_second(1_000_000).burst(1_000_000)
}

fn gov_quota() -> Quota {
    Quota::per_second(NonZeroU32::new(1_000_000).unwrap())
}

fn keyed_throughput(n_keys: u64) {
    const LEN: usize = 1 << 22;
    let ks = Arc::new([keys(n_keys, LEN, 1), keys(n_keys, LEN, 2)]);
    let rw = Arc::new(
        KeyedTokenBucket::<u64>::builder(generous())
            .max_keys(n_keys as usize * 9 / 8)
            .build()
            .unwrap(),
    );
    let gv = Arc::new(RateLimiter::keyed(gov_quota()));
    // Warm up: every key present in both.
    for k in 0..n_keys {
        let _ = rw.check_key(&k);
        let _ = gv.check_key(&k);
    }
    // The machine's floor for this access pattern: one random 16-byte slot
    // of a table the same size, a plain 8-byte load + CAS, no hash, no clock.
    let floor_table: Arc<Vec<std::sync::atomic::AtomicU64>> = Arc::new(
        (0..rw.memory_bytes() / 8)
            .map(|_| std::sync::atomic::AtomicU64::new(0))
            .collect(),
    );
    for threads in [1, 2] {
        let (r, k) = (Arc::clone(&rw), Arc::clone(&ks));
        let ours = ops_per_sec(threads, move |t, i| {
            let _ = black_box(r.check_key(&k[t][i & (LEN - 1)]));
        });
        let (g, k) = (Arc::clone(&gv), Arc::clone(&ks));
        let theirs = ops_per_sec(threads, move |t, i| {
            let _ = black_box(g.check_key(&k[t][i & (LEN - 1)]));
        });
        let (f, k) = (Arc::clone(&floor_table), Arc::clone(&ks));
        let floor = ops_per_sec(threads, move |t, i| {
            use std::sync::atomic::Ordering::Relaxed;
            let h = k[t][i & (LEN - 1)].wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 20;
            let slot = &f[((h as usize) % f.len()) & !1];
            let v = slot.load(Relaxed);
            let _ = slot.compare_exchange(v, v + 1, Relaxed, Relaxed);
        });
        println!(
            "  (floor: random load+CAS in a table of the same size, {threads} thread(s): {:.2} M/s)",
            floor / 1e6
        );
        println!(
            "keyed {n_keys:>9} keys, {threads} thread(s): ratewall {:>7.2} M/s  governor {:>6.2} M/s  ratio {:.2}x",
            ours / 1e6,
            theirs / 1e6,
            ours / theirs
        );
    }
}

fn hot_key() {
    let rw = Arc::new(
        KeyedTokenBucket::<u64>::builder(generous())
            .build()
            .unwrap(),
    );
    let gv = Arc::new(RateLimiter::keyed(gov_quota()));
    let r = Arc::clone(&rw);
    let ours = ops_per_sec(2, move |_, _| {
        let _ = black_box(r.check_key(&7));
    });
    let g = Arc::clone(&gv);
    let theirs = ops_per_sec(2, move |_, _| {
        let _ = black_box(g.check_key(&7));
    });
    println!(
        "hot key, 2 threads:           ratewall {:>7.2} M/s  governor {:>6.2} M/s  ratio {:.2}x",
        ours / 1e6,
        theirs / 1e6,
        ours / theirs
    );
}

fn denials() {
    let rw = Arc::new(
        KeyedTokenBucket::<u64>::builder(Rate::per_hour(1).burst(1))
            .max_keys(1 << 17)
            .build()
            .unwrap(),
    );
    let gv = Arc::new(RateLimiter::keyed(Quota::per_hour(
        NonZeroU32::new(1).unwrap(),
    )));
    for k in 0..100_000u64 {
        let _ = rw.check_key(&k);
        let _ = gv.check_key(&k);
    }
    const LEN: usize = 1 << 22;
    let ks = Arc::new([keys(100_000, LEN, 3), keys(100_000, LEN, 4)]);
    for threads in [1, 2] {
        let (r, k) = (Arc::clone(&rw), Arc::clone(&ks));
        let ours = ops_per_sec(threads, move |t, i| {
            let _ = black_box(r.check_key(&k[t][i & (LEN - 1)]));
        });
        let (g, k) = (Arc::clone(&gv), Arc::clone(&ks));
        let theirs = ops_per_sec(threads, move |t, i| {
            let _ = black_box(g.check_key(&k[t][i & (LEN - 1)]));
        });
        println!(
            "keyed deny 100k, {threads} thread(s):   ratewall {:>7.2} M/s  governor {:>6.2} M/s  ratio {:.2}x",
            ours / 1e6,
            theirs / 1e6,
            ours / theirs
        );
    }
}

fn multi() {
    let global = TokenBucket::new(generous()).unwrap();
    let route = TokenBucket::new(generous()).unwrap();
    let per_user = KeyedTokenBucket::<u64>::builder(generous())
        .max_keys(1 << 17)
        .build()
        .unwrap();
    for k in 0..100_000u64 {
        let _ = per_user.check_key(&k);
    }
    let ks = keys(100_000, 1 << 20, 5);
    let budget = Duration::from_secs_f64(secs());
    let time = |f: &dyn Fn(u64)| {
        let start = Instant::now();
        let mut n = 0usize;
        while start.elapsed() < budget {
            for _ in 0..4096 {
                f(ks[n & ((1 << 20) - 1)]);
                n += 1;
            }
        }
        start.elapsed().as_nanos() as f64 / n as f64
    };
    let single = time(&|k| {
        let _ = black_box(per_user.check_key(&k));
    });
    let three = time(&|k| {
        let limits: [&dyn Limit<_>; 3] = [&per_user.with_key(&k), &route, &global];
        let _ = black_box(check_all(&limits));
    });
    println!(
        "multi-limit of 3: {three:.1} ns; single keyed check: {single:.1} ns; ratio {:.2}x",
        three / single
    );
}

fn memory() {
    const N: usize = 1_000_000;
    fn fill<K: std::hash::Hash + Eq>(name: &str, make: impl Fn(usize) -> K) {
        let before = rss_bytes();
        let l = KeyedTokenBucket::<K>::builder(Rate::per_hour(1))
            .max_keys(N)
            .build()
            .unwrap();
        let start = Instant::now();
        for i in 0..N {
            let _ = l.check_key(&make(i));
        }
        let fill = start.elapsed();
        let after = rss_bytes();
        println!(
            "memory {name:<10}: {} keys tracked of {N}, RSS +{:.1} MiB = {:.1} B/tracked key (memory_bytes {:.1} B/key), fill {:.0} ns/insert",
            l.len(),
            (after - before) as f64 / (1 << 20) as f64,
            (after - before) as f64 / l.len() as f64,
            l.memory_bytes() as f64 / N as f64,
            fill.as_nanos() as f64 / N as f64
        );
        drop(l);
    }
    fill("u64", |i| i as u64);
    fill("IpAddr", |i| {
        IpAddr::V6(Ipv6Addr::from((i as u128) << 64 | 0x2001_0db8))
    });
    fill("String(40)", |i| format!("{i:040}"));
    let before = rss_bytes();
    let gv = RateLimiter::keyed(Quota::per_hour(NonZeroU32::new(1).unwrap()));
    for i in 0..N as u64 {
        let _ = gv.check_key(&i);
    }
    let after = rss_bytes();
    println!(
        "memory governor u64: {} keys, RSS +{:.1} MiB = {:.1} B/key (unbounded)",
        gv.len(),
        (after - before) as f64 / (1 << 20) as f64,
        (after - before) as f64 / gv.len() as f64
    );
}

/// The slot design's raw costs: an 8-byte vs a 16-byte load + CAS on one
/// uncontended word, and whether a 16-byte load writes the cache line (if it
/// did, two threads only loading one word would slow each other down).
fn slot_costs() {
    use portable_atomic::AtomicU128;
    use std::sync::atomic::{AtomicU64, Ordering::*};
    const N: u64 = 20_000_000;
    let w8 = AtomicU64::new(0);
    let t = Instant::now();
    for _ in 0..N {
        let v = w8.load(Acquire);
        let _ = black_box(w8.compare_exchange(v, v + 1, AcqRel, Acquire));
    }
    let c8 = t.elapsed().as_nanos() as f64 / N as f64;
    let w16 = AtomicU128::new(0);
    let t = Instant::now();
    for _ in 0..N {
        let v = w16.load(Acquire);
        let _ = black_box(w16.compare_exchange(v, v + 1, AcqRel, Acquire));
    }
    let c16 = t.elapsed().as_nanos() as f64 / N as f64;
    println!("slot: load+CAS 8-byte {c8:.1} ns, 16-byte {c16:.1} ns (1 thread, uncontended)");
    let word = Arc::new(AtomicU128::new(7));
    for threads in [1, 2] {
        let w = Arc::clone(&word);
        let loads = ops_per_sec(threads, move |_, _| {
            black_box(w.load(Acquire));
        });
        let w = Arc::clone(&word);
        let cas_loads = ops_per_sec(threads, move |_, _| {
            // A load done as cmpxchg16b (what portable-atomic does without AVX).
            let _ = black_box(w.compare_exchange(0, 0, AcqRel, Acquire));
        });
        println!(
            "slot: 16-byte loads of one word, {threads} thread(s): vmovdqa {:.0} M/s, cmpxchg16b-as-load {:.0} M/s",
            loads / 1e6,
            cas_loads / 1e6
        );
    }
}

fn main() {
    println!(
        "ratewall keyed vs governor 0.10, {} s per measurement, {} CPUs",
        secs(),
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    let only = std::env::args().nth(1).unwrap_or_default();
    let run = |name: &str| only.is_empty() || only == name;
    if run("memory") {
        memory();
    }
    if run("keyed") {
        keyed_throughput(100_000);
        keyed_throughput(1_000_000);
    }
    if run("deny") {
        denials();
    }
    if run("hot") {
        hot_key();
    }
    if only == "slot" {
        slot_costs();
    }
    if only == "prof" {
        // ratewall alone, 100k keys, 1 thread: for `perf record`.
        const LEN: usize = 1 << 22;
        let n: u64 = std::env::var("PROF_KEYS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(100_000);
        let ks = keys(n, LEN, 1);
        let rw = KeyedTokenBucket::<u64>::builder(generous())
            .max_keys(n as usize * 9 / 8)
            .build()
            .unwrap();
        let start = Instant::now();
        let mut n = 0usize;
        while start.elapsed() < Duration::from_secs_f64(secs()) {
            for _ in 0..4096 {
                let _ = black_box(rw.check_key(&ks[n & (LEN - 1)]));
                n += 1;
            }
        }
        println!(
            "prof: {:.1} ns/check",
            start.elapsed().as_nanos() as f64 / n as f64
        );
    }
    if run("multi") {
        multi();
    }
}
