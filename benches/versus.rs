//! ratewall against governor, side by side, as a new user would measure it:
//! the same workloads, the same kind of clock on both sides, each point run
//! in several rounds that alternate which implementation goes first, and the
//! median of the per-round ratios reported with its spread.
//!
//! ```text
//! cargo bench --bench versus -- [--rounds 5] [--secs 0.5] [--only NAME]
//!                               [--md out.md] [--no-promise] [--wall]
//! ```
//!
//! Rates are per second *on a CPU* (each thread's `schedstat` run time,
//! Linux), so that a round in which the shared machine kept a thread off
//! the CPUs does not count against that side; `--wall` divides by elapsed
//! time instead (the only choice where `schedstat` is missing).
//!
//! Workloads (quota 1e9/s so nothing is denied, unless said otherwise):
//! - `one limiter, allow/deny, default clocks`: `TokenBucket` on `QuantaClock`
//!   against governor's direct limiter on its default clock; deny = 1 per
//!   hour, already spent;
//! - `... cached clocks`: ratewall's `CoarseClock` against governor's
//!   `QuantaUpkeepClock`, both updated every 1 ms;
//! - `keyed, N keys, T threads`: `u64` keys `0..N`, all inserted before
//!   timing, checked in a splitmix64 order (thread `i` runs its own stream);
//!   ratewall's table built for `2N` keys, governor's default keyed limiter;
//! - `hot key, 2 threads`: both threads check the same key.
//!
//! Then, unless `--no-promise`: the `max_keys` promise (a table built for N
//! tracks N distinct keys under every `WhenFull` policy) and the table's own
//! memory per requested key.

use governor::clock::QuantaUpkeepClock;
use governor::{Quota, RateLimiter};
use ratewall::{CoarseClock, KeyedTokenBucket, Rate, TokenBucket, WhenFull};
use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Barrier;
use std::time::{Duration, Instant};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const BURST: u32 = 10_000_000;
const CACHED_INTERVAL: Duration = Duration::from_millis(1);

fn rw_allow() -> Rate {
    Rate::per_second(1_000_000_000).burst(u64::from(BURST))
}
fn gov_allow() -> Quota {
    Quota::with_period(Duration::from_nanos(1))
        .unwrap()
        .allow_burst(NonZeroU32::new(BURST).unwrap())
}
fn rw_deny() -> Rate {
    Rate::per_hour(1).burst(1)
}
fn gov_deny() -> Quota {
    Quota::per_hour(NonZeroU32::new(1).unwrap())
}

/// splitmix64: the order keys are checked in.
#[inline(always)]
fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The `c`-th key of a stream over `0..n` (multiply-high, no division).
#[inline(always)]
fn key_at(c: u64, n: u64) -> u64 {
    ((u128::from(splitmix64(c)) * u128::from(n)) >> 64) as u64
}

/// Nanoseconds this thread has spent on a CPU (Linux `schedstat`), or
/// `None` where that is not available.
fn thread_cpu_ns() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    s.split_whitespace().next()?.parse().ok()
}

/// Whether rates are per on-CPU second (the default) or per wall second.
static WALL: AtomicBool = AtomicBool::new(false);

/// Runs `threads` threads for `secs`, each calling its own `op` (built by
/// `make(thread_index)`) in batches of 256. Aggregate ops/s: the sum over
/// threads of each thread's ops over its own time on a CPU (so time the
/// shared machine kept it off every CPU does not count; `--wall`: over its
/// elapsed time).
fn measure<F, Op>(threads: usize, secs: f64, make: F) -> f64
where
    F: Fn(usize) -> Op,
    Op: FnMut() -> bool + Send,
{
    let stop = AtomicBool::new(false);
    let barrier = Barrier::new(threads + 1);
    let ops: Vec<Op> = (0..threads).map(&make).collect();
    std::thread::scope(|s| {
        let handles: Vec<_> = ops
            .into_iter()
            .map(|mut op| {
                let (stop, barrier) = (&stop, &barrier);
                s.spawn(move || {
                    barrier.wait();
                    let cpu = thread_cpu_ns();
                    let start = Instant::now();
                    let mut n = 0u64;
                    let mut allowed = 0u64;
                    // Relaxed: a flag with no data behind it; lateness costs one batch.
                    while !stop.load(Ordering::Relaxed) {
                        for _ in 0..256 {
                            allowed += u64::from(op());
                        }
                        n += 256;
                    }
                    black_box(allowed);
                    let wall = start.elapsed().as_secs_f64();
                    // Relaxed: a setting written before any thread starts.
                    let on_cpu = match (WALL.load(Ordering::Relaxed), cpu, thread_cpu_ns()) {
                        (false, Some(a), Some(b)) if b > a => (b - a) as f64 / 1e9,
                        _ => wall,
                    };
                    n as f64 / on_cpu
                })
            })
            .collect();
        barrier.wait();
        std::thread::sleep(Duration::from_secs_f64(secs));
        stop.store(true, Ordering::Relaxed);
        handles.into_iter().map(|h| h.join().unwrap()).sum()
    })
}

/// One workload's rounds: (ratewall ops/s, governor ops/s) per round.
struct Rounds {
    name: String,
    target: f64,
    /// Also required: round-to-round spread of the ratio under this (0 = none).
    max_spread: f64,
    rounds: Vec<(f64, f64)>,
}

impl Rounds {
    fn ratios(&self) -> Vec<f64> {
        let mut r: Vec<f64> = self.rounds.iter().map(|(a, b)| a / b).collect();
        r.sort_by(f64::total_cmp);
        r
    }
    fn median(v: &[f64]) -> f64 {
        let mut v = v.to_vec();
        v.sort_by(f64::total_cmp);
        let m = v.len() / 2;
        if v.len() % 2 == 1 {
            v[m]
        } else {
            (v[m - 1] + v[m]) / 2.0
        }
    }
    /// (median ratio, min, max, spread = (max - min) / median)
    fn summary(&self) -> (f64, f64, f64, f64) {
        let r = self.ratios();
        let med = Self::median(&r);
        let (lo, hi) = (r[0], r[r.len() - 1]);
        (med, lo, hi, (hi - lo) / med)
    }
}

/// Runs `rounds` rounds of the pair, alternating which side goes first.
fn alternate(
    rounds: usize,
    name: &str,
    mut rw: impl FnMut() -> f64,
    mut gov: impl FnMut() -> f64,
) -> Vec<(f64, f64)> {
    // One unmeasured pass each: page faults, lazily started clock threads.
    let _ = (rw(), gov());
    (0..rounds)
        .map(|r| {
            let (a, b) = if r % 2 == 0 {
                let a = rw();
                (a, gov())
            } else {
                let b = gov();
                (rw(), b)
            };
            eprintln!(
                "  {name:<44} round {r}: ratewall {:>7.2} M/s, governor {:>7.2} M/s, ratio {:.2}x",
                a / 1e6,
                b / 1e6,
                a / b
            );
            (a, b)
        })
        .collect()
}

struct Opts {
    rounds: usize,
    secs: f64,
    only: Option<String>,
    md: Option<String>,
    promise: bool,
}

fn parse() -> Result<Opts, String> {
    let mut o = Opts {
        rounds: 5,
        secs: 0.5,
        only: None,
        md: None,
        promise: true,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = || args.next().ok_or(format!("{a} needs a value"));
        match a.as_str() {
            "--rounds" => o.rounds = val()?.parse().map_err(|e| format!("--rounds: {e}"))?,
            "--secs" => o.secs = val()?.parse().map_err(|e| format!("--secs: {e}"))?,
            "--only" => o.only = Some(val()?),
            "--md" => o.md = Some(val()?),
            "--no-promise" => o.promise = false,
            // Relaxed: set before any measuring thread starts.
            "--wall" => WALL.store(true, Ordering::Relaxed),
            "--bench" => {} // passed by `cargo bench`
            other => return Err(format!("unknown argument {other}")),
        }
    }
    o.rounds = o.rounds.max(1);
    Ok(o)
}

fn one_limiter(o: &Opts, out: &mut Vec<Rounds>) {
    let secs = o.secs;
    let mut push = |name: &str, target: f64, rounds| {
        out.push(Rounds {
            name: name.to_string(),
            target,
            max_spread: 0.0,
            rounds,
        })
    };
    let want = |name: &str| o.only.as_deref().map_or(true, |w| name.contains(w));

    let name = "one limiter, allow, default clocks";
    if want(name) {
        let rw = TokenBucket::new(rw_allow()).unwrap();
        let gv = RateLimiter::direct(gov_allow());
        let r = alternate(
            o.rounds,
            name,
            || measure(1, secs, |_| || rw.check().is_allowed()),
            || measure(1, secs, |_| || gv.check().is_ok()),
        );
        push(name, 1.0, r);
    }
    let name = "one limiter, deny, default clocks";
    if want(name) {
        let rw = TokenBucket::new(rw_deny()).unwrap();
        let _ = rw.check();
        let gv = RateLimiter::direct(gov_deny());
        let _ = gv.check();
        let r = alternate(
            o.rounds,
            name,
            || measure(1, secs, |_| || rw.check().is_allowed()),
            || measure(1, secs, |_| || gv.check().is_ok()),
        );
        push(name, 1.0, r);
    }
    let name = "one limiter, allow, cached clocks";
    if want(name) {
        let rw = TokenBucket::with_clock(rw_allow(), CoarseClock::with_interval(CACHED_INTERVAL))
            .unwrap();
        let gv = RateLimiter::direct_with_clock(
            gov_allow(),
            QuantaUpkeepClock::from_interval(CACHED_INTERVAL).unwrap(),
        );
        let r = alternate(
            o.rounds,
            name,
            || measure(1, secs, |_| || rw.check().is_allowed()),
            || measure(1, secs, |_| || gv.check().is_ok()),
        );
        push(name, 1.2, r);
    }
    let name = "one limiter, deny, cached clocks";
    if want(name) {
        let rw = TokenBucket::with_clock(rw_deny(), CoarseClock::with_interval(CACHED_INTERVAL))
            .unwrap();
        let _ = rw.check();
        let gv = RateLimiter::direct_with_clock(
            gov_deny(),
            QuantaUpkeepClock::from_interval(CACHED_INTERVAL).unwrap(),
        );
        let _ = gv.check();
        let r = alternate(
            o.rounds,
            name,
            || measure(1, secs, |_| || rw.check().is_allowed()),
            || measure(1, secs, |_| || gv.check().is_ok()),
        );
        push(name, 1.2, r);
    }
}

/// Keyed: `n` keys inserted, then checked by `threads` threads in
/// splitmix64 order (`hot` = every thread checks key 7).
fn keyed(o: &Opts, out: &mut Vec<Rounds>, n: u64, threads: usize, hot: bool) -> Option<()> {
    let name = if hot {
        format!("hot key, {threads} threads")
    } else {
        format!(
            "keyed, {} keys, {threads} thread{}",
            if n >= 1_000_000 {
                format!("{}M", n / 1_000_000)
            } else {
                format!("{}k", n / 1000)
            },
            if threads == 1 { "" } else { "s" }
        )
    };
    if !o.only.as_deref().map_or(true, |w| name.contains(w)) {
        return None;
    }
    let (target, max_spread) = match (hot, n, threads) {
        (true, _, _) => (2.0, 0.0),
        (false, 1_000_000, _) => (2.5, 0.0),
        (false, _, 1) => (1.5, 0.15),
        (false, _, _) => (2.0, 0.0),
    };
    let rw = KeyedTokenBucket::<u64>::builder(rw_allow())
        .max_keys((2 * n) as usize)
        .build()
        .unwrap();
    let gv = RateLimiter::keyed(gov_allow());
    for k in 0..n {
        let _ = rw.check_key(&k);
        let _ = gv.check_key(&k);
    }
    assert_eq!(rw.len() as u64, n, "every key tracked");
    let secs = o.secs;
    // Each thread's stream starts far from the others'.
    let stream = |i: usize| (i as u64) << 40;
    let r = if hot {
        alternate(
            o.rounds,
            &name,
            || measure(threads, secs, |_| || rw.check_key(&7).is_allowed()),
            || measure(threads, secs, |_| || gv.check_key(&7).is_ok()),
        )
    } else {
        alternate(
            o.rounds,
            &name,
            || {
                measure(threads, secs, |i| {
                    let (mut c, rw) = (stream(i), &rw);
                    move || {
                        c += 1;
                        rw.check_key(&key_at(c, n)).is_allowed()
                    }
                })
            },
            || {
                measure(threads, secs, |i| {
                    let (mut c, gv) = (stream(i), &gv);
                    move || {
                        c += 1;
                        gv.check_key(&key_at(c, n)).is_ok()
                    }
                })
            },
        )
    };
    out.push(Rounds {
        name,
        target,
        max_spread,
        rounds: r,
    });
    Some(())
}

/// The `max_keys` promise: distinct keys tracked by a table built for `n`,
/// under each policy, with a quota that keeps every key active; and the
/// table's own bytes per requested key.
fn promise(n: usize) -> String {
    let mut s = String::new();
    for (label, policy) in [
        ("RejectNew", WhenFull::RejectNew),
        ("AdmitUntracked", WhenFull::AdmitUntracked),
        ("EvictLeastRecent", WhenFull::EvictLeastRecent),
    ] {
        let l = KeyedTokenBucket::<u64>::builder(Rate::per_hour(1))
            .max_keys(n)
            .when_full(policy)
            .build()
            .unwrap();
        let mut not_tracked = 0u64;
        for k in 0..n as u64 {
            let d = l.check_key(&splitmix64(k));
            not_tracked += u64::from(d.tracking() != ratewall::Tracking::Tracked);
        }
        let line = format!(
            "| {n} | {label} | {} | {not_tracked} | {:.2} |\n",
            l.len(),
            l.memory_bytes() as f64 / n as f64
        );
        eprint!("  promise {line}");
        s.push_str(&line);
    }
    s
}

fn main() {
    let o = match parse() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("versus: {e}");
            std::process::exit(2);
        }
    };
    let started = Instant::now();
    let mut out = Vec::new();
    one_limiter(&o, &mut out);
    for (n, t) in [(100_000, 1), (100_000, 2), (1_000_000, 1), (1_000_000, 2)] {
        keyed(&o, &mut out, n, t, false);
    }
    keyed(&o, &mut out, 1, 2, true);

    let mut md = String::new();
    md.push_str(&format!(
        "{} rounds of {} s per side, alternating; ratio = ratewall ops/s over governor ops/s in the same round; rates per {} second.\n\n",
        o.rounds, o.secs,
        // Relaxed: a setting.
        if WALL.load(Ordering::Relaxed) || thread_cpu_ns().is_none() { "wall-clock" } else { "on-CPU" }
    ));
    md.push_str("| workload | ratewall M ops/s | governor M ops/s | ratio (median) | min-max | spread | target | met |\n");
    md.push_str("|---|---:|---:|---:|---:|---:|---|---|\n");
    for r in &out {
        let (med, lo, hi, spread) = r.summary();
        let rw = Rounds::median(&r.rounds.iter().map(|x| x.0).collect::<Vec<_>>());
        let gv = Rounds::median(&r.rounds.iter().map(|x| x.1).collect::<Vec<_>>());
        let met = med >= r.target && (r.max_spread == 0.0 || spread < r.max_spread);
        let target = if r.max_spread > 0.0 {
            format!(">= {:.1}x, spread < {:.0}%", r.target, r.max_spread * 100.0)
        } else {
            format!(">= {:.1}x", r.target)
        };
        md.push_str(&format!(
            "| {} | {:.1} | {:.1} | **{:.2}x** | {:.2}-{:.2} | {:.0}% | {} | {} |\n",
            r.name,
            rw / 1e6,
            gv / 1e6,
            med,
            lo,
            hi,
            spread * 100.0,
            target,
            if met { "yes" } else { "**no**" }
        ));
    }
    if o.promise && o.only.is_none() {
        md.push_str(
            "\n| max_keys | policy | tracked | not tracked | table bytes per requested key |\n",
        );
        md.push_str("|---:|---|---:|---:|---:|\n");
        for n in [1_000, 100_000, 1_000_000] {
            md.push_str(&promise(n));
        }
    }
    md.push_str(&format!(
        "\n({:.0} s in all)\n",
        started.elapsed().as_secs_f64()
    ));
    println!("{md}");
    if let Some(path) = &o.md {
        std::fs::write(path, &md).expect("write --md");
    }
}
