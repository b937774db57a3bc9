//! Tail latency under contention: what one check costs at the median and in
//! the tail, ratewall against governor, in the same run.
//!
//! ```text
//! cargo bench --bench tail -- [--rounds 5] [--secs 0.5] [--threads 2] [--md out.md]
//! ```
//!
//! Method. For each workload and side, `--threads` threads start together
//! and each runs batches of 16 checks for `--secs`, timing every batch
//! with `Instant` (the same clock for both sides; 16 checks per reading so
//! that the reading's own ~20 ns is spread thin) and recording the batch's
//! time divided by 16 as the latency of each of its checks. A check that
//! stalls (a lock holder preempted, a cache line fought over) shows as a
//! slow batch. Percentiles are over every batch of every thread of a
//! round; rounds alternate which side goes first, and the table gives each
//! percentile's median over the rounds with its min-max. Everything is
//! admitted (a quota of 1e9/s), so both sides take their admitting path.
//!
//! Workloads:
//! - `hot key`: every thread checks one key of a keyed limiter;
//! - `many keys`: keys drawn from 1M, all inserted first (ratewall's table
//!   built for 1M; governor's default keyed limiter);
//! - `one shared limiter`: every thread checks one direct limiter.
//!
//! The machine this runs on is shared: a thread descheduled mid-batch
//! counts its wait, on both sides alike. Read the tail as what a caller
//! would see, on a quiet machine ideally, and compare the sides, not runs.

mod common;

use common::{cpu_name, median, splitmix64};
use governor::{Quota, RateLimiter};
use ratewall::{KeyedTokenBucket, Rate, TokenBucket};
use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Barrier;
use std::time::{Duration, Instant};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const BATCH: u32 = 16;
const KEYS: u64 = 1_000_000;
const BURST: u32 = 10_000_000;
/// The percentiles reported, in parts per million.
const PERCENTILES: [(&str, u64); 4] = [
    ("p50", 500_000),
    ("p99", 990_000),
    ("p99.9", 999_000),
    ("p99.99", 999_900),
];

fn rw_rate() -> Rate {
    Rate::per_second(1_000_000_000).burst(u64::from(BURST))
}

fn gov_quota() -> Quota {
    Quota::with_period(Duration::from_nanos(1))
        .unwrap()
        .allow_burst(NonZeroU32::new(BURST).unwrap())
}

/// Per-check latencies (ns) of one side in one round: every batch's time
/// over 16, from every thread.
fn run(threads: usize, secs: f64, check: &(impl Fn(u64) -> bool + Sync)) -> Vec<u32> {
    let stop = AtomicBool::new(false);
    let barrier = Barrier::new(threads + 1);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let (stop, barrier) = (&stop, &barrier);
                s.spawn(move || {
                    let mut lat = Vec::with_capacity(1 << 20);
                    let mut c = (t as u64) << 40;
                    let mut allowed = 0u64;
                    barrier.wait();
                    // Relaxed: a flag with no data behind it.
                    while !stop.load(Ordering::Relaxed) {
                        let start = Instant::now();
                        for _ in 0..BATCH {
                            c += 1;
                            allowed += u64::from(check(c));
                        }
                        let ns = start.elapsed().as_nanos() / u128::from(BATCH);
                        lat.push(u32::try_from(ns).unwrap_or(u32::MAX));
                    }
                    black_box(allowed);
                    lat
                })
            })
            .collect();
        barrier.wait();
        std::thread::sleep(Duration::from_secs_f64(secs));
        // Relaxed: as above.
        stop.store(true, Ordering::Relaxed);
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    })
}

/// The reported percentiles and the maximum of `lat` (sorted here).
fn summary(mut lat: Vec<u32>) -> Vec<f64> {
    lat.sort_unstable();
    let at = |ppm: u64| {
        let i = ((lat.len() as u64 - 1) * ppm / 1_000_000) as usize;
        f64::from(lat[i])
    };
    let mut out: Vec<f64> = PERCENTILES.iter().map(|&(_, ppm)| at(ppm)).collect();
    out.push(f64::from(*lat.last().unwrap()));
    out
}

/// One workload: `rounds` alternating rounds; per side, each percentile's
/// per-round values.
fn workload(
    name: &str,
    o: &Opts,
    rw: &(impl Fn(u64) -> bool + Sync),
    gv: &(impl Fn(u64) -> bool + Sync),
) -> [Vec<Vec<f64>>; 2] {
    // One unmeasured pass each: page faults, the clock's calibration.
    let _ = (run(o.threads, 0.05, rw), run(o.threads, 0.05, gv));
    let mut sides = [Vec::new(), Vec::new()];
    for r in 0..o.rounds {
        let order = if r % 2 == 0 { [0, 1] } else { [1, 0] };
        for side in order {
            let lat = if side == 0 {
                run(o.threads, o.secs, rw)
            } else {
                run(o.threads, o.secs, gv)
            };
            sides[side].push(summary(lat));
        }
        eprintln!(
            "  {name:<20} round {r}: p99.99 ratewall {} ns, governor {} ns",
            sides[0][r][3], sides[1][r][3]
        );
    }
    sides
}

struct Opts {
    rounds: usize,
    secs: f64,
    threads: usize,
    md: Option<String>,
}

fn parse() -> Result<Opts, String> {
    let mut o = Opts {
        rounds: 5,
        secs: 0.5,
        threads: 2,
        md: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = || args.next().ok_or(format!("{a} needs a value"));
        match a.as_str() {
            "--rounds" => o.rounds = val()?.parse().map_err(|e| format!("--rounds: {e}"))?,
            "--secs" => o.secs = val()?.parse().map_err(|e| format!("--secs: {e}"))?,
            "--threads" => o.threads = val()?.parse().map_err(|e| format!("--threads: {e}"))?,
            "--md" => o.md = Some(val()?),
            // cargo bench passes --bench.
            "--bench" => {}
            other => return Err(format!("unknown argument {other}")),
        }
    }
    if o.rounds == 0 || o.threads == 0 || o.secs <= 0.0 {
        return Err("--rounds, --threads and --secs must be positive".into());
    }
    Ok(o)
}

fn main() {
    let o = match parse() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("tail: {e}");
            std::process::exit(2);
        }
    };
    let mut rows = Vec::new();

    let rw = KeyedTokenBucket::<u64>::builder(rw_rate()).build().unwrap();
    let gv = RateLimiter::keyed(gov_quota());
    rows.push((
        "hot key",
        workload("hot key", &o, &|_| rw.check_key(&7).is_allowed(), &|_| {
            gv.check_key(&7).is_ok()
        }),
    ));

    let rw = KeyedTokenBucket::<u64>::builder(rw_rate())
        .max_keys(KEYS as usize)
        .build()
        .unwrap();
    let gv = RateLimiter::keyed(gov_quota());
    for k in 0..KEYS {
        let _ = (rw.check_key(&k), gv.check_key(&k));
    }
    let key = |c: u64| ((u128::from(splitmix64(c)) * u128::from(KEYS)) >> 64) as u64;
    rows.push((
        "many keys (1M)",
        workload(
            "many keys (1M)",
            &o,
            &|c| rw.check_key(&key(c)).is_allowed(),
            &|c| gv.check_key(&key(c)).is_ok(),
        ),
    ));

    let rw = TokenBucket::new(rw_rate()).unwrap();
    let gv = RateLimiter::direct(gov_quota());
    rows.push((
        "one shared limiter",
        workload(
            "one shared limiter",
            &o,
            &|_| rw.check().is_allowed(),
            &|_| gv.check().is_ok(),
        ),
    ));

    let mut md = format!(
        "{}; {} threads; {} rounds of {} s per side, alternating; ns per check (each batch of {BATCH} checks timed with `Instant`, its time over {BATCH}); each cell the median over rounds (min-max).\n\n",
        cpu_name(),
        o.threads,
        o.rounds,
        o.secs
    );
    md.push_str("| workload | side |");
    for (name, _) in PERCENTILES {
        md.push_str(&format!(" {name} |"));
    }
    md.push_str(" max |\n|---|---|");
    md.push_str(&"---:|".repeat(PERCENTILES.len() + 1));
    md.push('\n');
    for (name, sides) in &rows {
        for (side, label) in sides.iter().zip(["ratewall", "governor"]) {
            md.push_str(&format!("| {name} | {label} |"));
            for p in 0..=PERCENTILES.len() {
                let mut v: Vec<f64> = side.iter().map(|r| r[p]).collect();
                v.sort_by(f64::total_cmp);
                md.push_str(&format!(
                    " {:.0} ({:.0}-{:.0}) |",
                    median(&v),
                    v[0],
                    v[v.len() - 1]
                ));
            }
            md.push('\n');
        }
    }
    println!("{md}");
    if let Some(path) = &o.md {
        std::fs::write(path, &md).expect("write --md");
    }
}
