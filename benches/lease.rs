//! One hot limit, many threads: aggregate checks per second of a
//! `StripedLimiter` (leases in per-thread stripes) against the plain
//! `TokenBucket` (one word) and `governor`'s direct limiter, on the same quota.
//!
//! `cargo bench --bench lease -- [--secs 0.3] [--rounds 5] [--threads 1,2,4,8] [--coarse] [--keyed]`
//!
//! `--keyed`: one hot key of a keyed token bucket instead (the same quota
//! per key; 10,000 other keys tracked): the table with hot keys
//! (`KeyedBuilder::hot_keys`, the key promoted before the run), the plain
//! keyed table (one 16-byte slot), and governor's `RateLimiter::keyed`.
//!
//! `--coarse`: ratewall on `CoarseClock` and governor on `QuantaUpkeepClock`
//! (1 ms), so the clock read (an `rdtsc`, 30-40 ns on the 2-core VM) no
//! longer hides the cost of the shared cache line.
//!
//! Quota: 1e9/s with a burst of 1e7, so every check is admitted (and takes a
//! unit): this measures the admission path of a hot limit. Each round runs
//! every (threads, implementation) point for `secs`, alternating
//! implementations, so slow drifts of a shared machine hit all alike. The
//! table gives the median over rounds and the striped / single-word ratio's
//! median and spread (min..max over rounds). After each striped point the
//! admitted count is checked against `burst + rate * elapsed`.
//!
//! The figures in docs/design.md come from a 2-core machine shared with other
//! builds: more threads than cores measure time-slicing, not parallelism.

use governor::{Quota, RateLimiter};
use ratewall::{Clock, CoarseClock, HotKeys, KeyedTokenBucket, Rate, StripedLimiter, TokenBucket};
use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Barrier;
use std::time::{Duration, Instant};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const BURST: u64 = 10_000_000;
const RATE: u64 = 1_000_000_000;

fn rate() -> Rate {
    Rate::per_second(RATE).burst(BURST)
}

fn gov_quota() -> Quota {
    Quota::with_period(Duration::from_nanos(1))
        .unwrap()
        .allow_burst(NonZeroU32::new(BURST as u32).unwrap())
}

/// Runs `threads` threads for `secs` on `op`; returns (aggregate ops/s,
/// admitted, wall time).
fn point<Op: Fn() -> bool + Sync>(threads: usize, secs: f64, op: &Op) -> (f64, u64, Duration) {
    let stop = AtomicBool::new(false);
    let barrier = Barrier::new(threads + 1);
    let t0 = Instant::now();
    let (rate, admitted) = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                let (stop, barrier) = (&stop, &barrier);
                s.spawn(move || {
                    barrier.wait();
                    let start = Instant::now();
                    let (mut n, mut allowed) = (0u64, 0u64);
                    // Relaxed: a flag with no data behind it; lateness costs one batch.
                    while !stop.load(Ordering::Relaxed) {
                        for _ in 0..256 {
                            allowed += u64::from(op());
                        }
                        n += 256;
                    }
                    (n as f64 / start.elapsed().as_secs_f64(), allowed)
                })
            })
            .collect();
        barrier.wait();
        std::thread::sleep(Duration::from_secs_f64(secs));
        stop.store(true, Ordering::Relaxed);
        handles
            .into_iter()
            .map(|h| h.join().unwrap())
            .fold((0.0, 0), |(r, a), (r1, a1)| (r + r1, a + a1))
    });
    (rate, admitted, t0.elapsed())
}

/// The keyed tables: `hot` with hot keys, key 7 promoted; 10,000 other
/// keys tracked so the hot key's slot sits in a real table.
fn keyed_table<C: Clock>(clock: C, hot: bool) -> KeyedTokenBucket<u64, C> {
    let b = KeyedTokenBucket::<u64>::builder(rate())
        .max_keys(1 << 16)
        .clock(clock);
    let l = if hot {
        b.hot_keys(HotKeys::new(4)).build().unwrap()
    } else {
        b.build().unwrap()
    };
    for k in 0..10_000 {
        let _ = l.check_key(&k);
    }
    assert_eq!(l.promote_key(&7), hot);
    l
}

/// One point of the `--keyed` mode: implementation `ii` at `t` threads.
fn keyed_point(ii: usize, t: usize, secs: f64, coarse: bool) -> f64 {
    let check_bound = |(ops, admitted, wall): (f64, u64, Duration)| {
        let bound = BURST as f64 + RATE as f64 * wall.as_secs_f64();
        assert!(
            admitted as f64 <= bound,
            "bound violated: {admitted} > {bound}"
        );
        ops
    };
    match (ii, coarse) {
        (0 | 1, true) => {
            let l = keyed_table(CoarseClock::new(), ii == 0);
            check_bound(point(t, secs, &|| black_box(&l).check_key(&7).is_allowed()))
        }
        (0 | 1, false) => {
            let l = keyed_table(ratewall::DefaultClock::default(), ii == 0);
            check_bound(point(t, secs, &|| black_box(&l).check_key(&7).is_allowed()))
        }
        (_, true) => {
            let l = RateLimiter::dashmap_with_clock(
                gov_quota(),
                governor::clock::QuantaUpkeepClock::from_interval(Duration::from_millis(1))
                    .unwrap(),
            );
            for k in 0..10_000u64 {
                let _ = l.check_key(&k);
            }
            point(t, secs, &|| black_box(&l).check_key(&7).is_ok()).0
        }
        (_, false) => {
            let l = RateLimiter::keyed(gov_quota());
            for k in 0..10_000u64 {
                let _ = l.check_key(&k);
            }
            point(t, secs, &|| black_box(&l).check_key(&7).is_ok()).0
        }
    }
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn main() {
    let mut secs = 0.3;
    let mut rounds = 5;
    let mut threads = vec![1, 2, 4, 8];
    let mut coarse = false;
    let mut keyed = false;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--secs" => secs = args.next().and_then(|v| v.parse().ok()).expect("--secs N"),
            "--rounds" => {
                rounds = args
                    .next()
                    .and_then(|v| v.parse().ok())
                    .expect("--rounds N")
            }
            "--threads" => {
                threads = args
                    .next()
                    .expect("--threads 1,2")
                    .split(',')
                    .map(|t| t.parse().expect("--threads: numbers"))
                    .collect()
            }
            "--coarse" => coarse = true,
            "--keyed" => keyed = true,
            _ => {} // cargo bench passes --bench
        }
    }
    let names = if keyed {
        ["hot key", "keyed", "governor keyed"]
    } else {
        ["striped", "single word", "governor"]
    };
    // [threads][impl] -> per-round ops/s
    let mut results = vec![vec![Vec::new(); names.len()]; threads.len()];
    for round in 0..rounds {
        for (ti, &t) in threads.iter().enumerate() {
            for (ii, name) in names.iter().enumerate() {
                let ops = match ii {
                    _ if keyed => keyed_point(ii, t, secs, coarse),
                    0 if coarse => {
                        let l = StripedLimiter::with_clock(rate(), CoarseClock::new()).unwrap();
                        point(t, secs, &|| black_box(&l).check().is_allowed()).0
                    }
                    1 if coarse => {
                        let l = TokenBucket::with_clock(rate(), CoarseClock::new()).unwrap();
                        point(t, secs, &|| black_box(&l).check().is_allowed()).0
                    }
                    2 if coarse => {
                        let l = RateLimiter::direct_with_clock(
                            gov_quota(),
                            governor::clock::QuantaUpkeepClock::from_interval(
                                Duration::from_millis(1),
                            )
                            .unwrap(),
                        );
                        point(t, secs, &|| black_box(&l).check().is_ok()).0
                    }
                    0 => {
                        let l = StripedLimiter::new(rate()).unwrap();
                        let (ops, admitted, wall) =
                            point(t, secs, &|| black_box(&l).check().is_allowed());
                        let bound = BURST as f64 + RATE as f64 * wall.as_secs_f64();
                        assert!(
                            admitted as f64 <= bound,
                            "bound violated: {admitted} > {bound}"
                        );
                        ops
                    }
                    1 => {
                        let l = TokenBucket::new(rate()).unwrap();
                        point(t, secs, &|| black_box(&l).check().is_allowed()).0
                    }
                    _ => {
                        let l = RateLimiter::direct(gov_quota());
                        point(t, secs, &|| black_box(&l).check().is_ok()).0
                    }
                };
                eprintln!(
                    "round {round} {t} threads {name:<14}: {:>7.2} M/s",
                    ops / 1e6
                );
                results[ti][ii].push(ops);
            }
        }
    }
    println!(
        "| threads | {} M/s | {} M/s | {} M/s | {} / {} (spread) | {} / {} |",
        names[0], names[1], names[2], names[0], names[1], names[0], names[2]
    );
    println!("|---|---|---|---|---|---|");
    for (ti, &t) in threads.iter().enumerate() {
        let r = &results[ti];
        let mut ratio: Vec<f64> = (0..rounds).map(|k| r[0][k] / r[1][k]).collect();
        let mut gratio: Vec<f64> = (0..rounds).map(|k| r[0][k] / r[2][k]).collect();
        let (lo, hi) = (
            ratio.iter().cloned().fold(f64::INFINITY, f64::min),
            ratio.iter().cloned().fold(0.0, f64::max),
        );
        let m: Vec<f64> = r.iter().map(|v| median(&mut v.clone())).collect();
        println!(
            "| {t} | {:.1} | {:.1} | {:.1} | {:.2}x ({lo:.2}..{hi:.2}) | {:.2}x |",
            m[0] / 1e6,
            m[1] / 1e6,
            m[2] / 1e6,
            median(&mut ratio),
            median(&mut gratio)
        );
    }
}
