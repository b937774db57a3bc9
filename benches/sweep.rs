//! Thread sweep and memory harness: ratewall against governor, 1, 2 and 4
//! threads, for a fixed time per point; aggregate ops/s.
//!
//! ```text
//! cargo bench --bench sweep -- [--secs 1] [--threads 1,2,4] [--csv out.csv]
//!                              [--svg out.svg] [--md out.md] [--no-memory]
//!                              [--rounds 3] [--no-sweep] [--criterion target/criterion]
//!                              [--ops CASE N]
//! ```
//!
//! Cases:
//! - `single allow`: one limiter, every check admitted (1e9/s, burst 1e7);
//! - `single deny`: one limiter, every check denied (1/hour, taken);
//! - `hot key`: a keyed limiter, every thread checks the same key (allow-heavy);
//! - `spread keys`: a keyed limiter, 100k keys, uniform, pre-generated per thread.
//!
//! Memory: each (implementation, key type, key count) point runs in a fresh
//! child process (this binary with `--mem-child`), which reads its RSS before
//! and after inserting the keys; bytes per key is the delta over the count.

#[path = "common/mod.rs"]
mod common;

use common::{ip_key, key_sequence, rss_bytes, string_key, u64_key, Dist};
use governor::{Quota, RateLimiter};
use ratewall::{check_all, KeyedTokenBucket, Limit, Rate, TokenBucket};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::hash::Hash;
use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Barrier;
use std::time::{Duration, Instant};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const ALLOW_BURST: u32 = 10_000_000;
const SPREAD_KEYS: usize = 100_000;
const SEQ_LEN: usize = 1 << 20;

fn allow_rate() -> Rate {
    Rate::per_second(1_000_000_000).burst(u64::from(ALLOW_BURST))
}
fn gov_allow() -> Quota {
    Quota::with_period(Duration::from_nanos(1))
        .unwrap()
        .allow_burst(NonZeroU32::new(ALLOW_BURST).unwrap())
}
/// Keyed quota: 1e9/s per key would admit everything; 1000/s with a burst
/// of 1000 is a realistic per-key quota that is mostly allowed with spread keys.
fn gov_keyed() -> Quota {
    Quota::per_second(NonZeroU32::new(1000).unwrap())
}

fn gov_keyed_rate() -> Rate {
    Rate::per_second(1000)
}

struct Opts {
    secs: f64,
    threads: Vec<usize>,
    csv: Option<String>,
    svg: Option<String>,
    md: Option<String>,
    memory: bool,
    sweep: bool,
    rounds: usize,
    criterion: Option<String>,
}

fn parse() -> Result<Opts, String> {
    let mut o = Opts {
        secs: 1.0,
        threads: vec![1, 2, 4],
        csv: None,
        svg: None,
        md: None,
        memory: true,
        sweep: true,
        rounds: 3,
        criterion: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = || args.next().ok_or(format!("{a} needs a value"));
        match a.as_str() {
            "--secs" => o.secs = val()?.parse().map_err(|e| format!("--secs: {e}"))?,
            "--threads" => {
                o.threads = val()?
                    .split(',')
                    .map(|t| t.parse().map_err(|e| format!("--threads: {e}")))
                    .collect::<Result<_, _>>()?
            }
            "--csv" => o.csv = Some(val()?),
            "--svg" => o.svg = Some(val()?),
            "--md" => o.md = Some(val()?),
            "--no-memory" => o.memory = false,
            "--no-sweep" => o.sweep = false,
            "--rounds" => {
                o.rounds = val()?.parse().map_err(|e| format!("--rounds: {e}"))?;
                o.rounds = o.rounds.max(1);
            }
            "--criterion" => o.criterion = Some(val()?),
            "--bench" => {} // passed by `cargo bench`
            "--ops" => {
                let (case, n) = (val()?, val()?);
                ops(&case, n.parse().map_err(|e| format!("count: {e}"))?)?;
                std::process::exit(0);
            }
            "--mem-child" => {
                let (imp, key, n) = (val()?, val()?, val()?);
                mem_child(&imp, &key, n.parse().map_err(|e| format!("count: {e}"))?);
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(o)
}

/// Runs `threads` threads for `secs`; each calls its own `op` (built by
/// `make(thread_index)`) in batches and counts. Returns aggregate ops/s: the
/// sum over threads of ops over that thread's own elapsed time.
fn sweep_point<F, Op>(threads: usize, secs: f64, make: F) -> f64
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
                    n as f64 / start.elapsed().as_secs_f64()
                })
            })
            .collect();
        barrier.wait();
        std::thread::sleep(Duration::from_secs_f64(secs));
        stop.store(true, Ordering::Relaxed);
        handles.into_iter().map(|h| h.join().unwrap()).sum()
    })
}

/// (case, implementation) -> threads -> ops/s (median over rounds)
type Results = BTreeMap<(String, String), BTreeMap<usize, f64>>;

/// Every point `rounds` times, ratewall and governor alternating within each
/// (case, threads) pair, so slow drifts of a shared machine hit both alike;
/// the median round is reported.
fn run_sweeps(o: &Opts) -> Results {
    let tmax = o.threads.iter().copied().max().unwrap_or(1);
    let seqs: Vec<Vec<u64>> = (0..tmax)
        .map(|i| key_sequence(SPREAD_KEYS, SEQ_LEN, Dist::Uniform, i as u64 + 1))
        .collect();
    let spread = |i: usize| {
        let seq = &seqs[i];
        let mut j = 0usize;
        move || {
            j = (j + 1) & (SEQ_LEN - 1);
            u64_key(seq[j])
        }
    };

    let rw_allow = TokenBucket::new(allow_rate()).unwrap();
    let gv_allow = RateLimiter::direct(gov_allow());
    let rw_deny = TokenBucket::new(Rate::per_hour(1).burst(1)).unwrap();
    let _ = rw_deny.check();
    let gv_deny = RateLimiter::direct(Quota::per_hour(NonZeroU32::new(1).unwrap()));
    let _ = gv_deny.check();
    let rw_hot = KeyedTokenBucket::<u64>::builder(allow_rate())
        .build()
        .unwrap();
    let rw_spread = KeyedTokenBucket::<u64>::builder(Rate::per_second(1000))
        .max_keys(SPREAD_KEYS)
        .build()
        .unwrap();
    for i in 0..SPREAD_KEYS as u64 {
        let _ = rw_spread.check_key(&u64_key(i));
    }
    let gv_hot = RateLimiter::keyed(gov_allow());
    let gv_spread = RateLimiter::keyed(gov_keyed());
    for i in 0..SPREAD_KEYS as u64 {
        let _ = gv_spread.check_key(&u64_key(i));
    }

    let mut samples: BTreeMap<(String, String, usize), Vec<f64>> = BTreeMap::new();
    for round in 0..o.rounds {
        for &t in &o.threads {
            let mut point = |case: &str, imp: &str, v: f64| {
                eprintln!(
                    "  round {round} {case:<12} {imp:<9} {t} threads: {:>8.2} M ops/s",
                    v / 1e6
                );
                samples
                    .entry((case.to_string(), imp.to_string(), t))
                    .or_default()
                    .push(v);
            };
            // Alternate which implementation goes first.
            for first in [round % 2 == 0, round % 2 != 0] {
                if first {
                    point(
                        "single allow",
                        "ratewall",
                        sweep_point(t, o.secs, |_| || rw_allow.check().is_allowed()),
                    );
                    point(
                        "single deny",
                        "ratewall",
                        sweep_point(t, o.secs, |_| || rw_deny.check().is_allowed()),
                    );
                    point(
                        "hot key",
                        "ratewall",
                        sweep_point(t, o.secs, |_| || rw_hot.check_key(&u64_key(7)).is_allowed()),
                    );
                    point(
                        "spread keys",
                        "ratewall",
                        sweep_point(t, o.secs, |i| {
                            let mut key = spread(i);
                            let rw = &rw_spread;
                            move || rw.check_key(&key()).is_allowed()
                        }),
                    );
                } else {
                    point(
                        "single allow",
                        "governor",
                        sweep_point(t, o.secs, |_| || gv_allow.check().is_ok()),
                    );
                    point(
                        "single deny",
                        "governor",
                        sweep_point(t, o.secs, |_| || gv_deny.check().is_ok()),
                    );
                    point(
                        "hot key",
                        "governor",
                        sweep_point(t, o.secs, |_| || gv_hot.check_key(&u64_key(7)).is_ok()),
                    );
                    point(
                        "spread keys",
                        "governor",
                        sweep_point(t, o.secs, |i| {
                            let mut key = spread(i);
                            let gv = &gv_spread;
                            move || gv.check_key(&key()).is_ok()
                        }),
                    );
                }
            }
        }
    }
    let mut res = Results::new();
    for ((case, imp, t), mut v) in samples {
        v.sort_by(f64::total_cmp);
        res.entry((case, imp))
            .or_default()
            .insert(t, v[v.len() / 2]);
    }
    res
}

/// The limiter's own accounting of its memory (`memory_bytes()`), where it
/// has one, for the memory child to print after the RSS figure.
static OWN_BYTES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();

fn mem_child(imp: &str, key: &str, n: u64) {
    /// All `keys` inserted into a fresh governor keyed limiter (it has no
    /// bound); the RSS delta over the keys tracked.
    fn gov<K: Hash + Eq + Clone>(keys: Vec<K>) -> (u64, usize) {
        let before = rss_bytes();
        let lim = RateLimiter::keyed(Quota::per_hour(NonZeroU32::new(1).unwrap()));
        for k in &keys {
            let _ = lim.check_key(k);
        }
        let after = rss_bytes();
        black_box(&lim);
        (after.saturating_sub(before), lim.len())
    }
    /// A table for `n` keys, filled: keys are offered until it tracks `n`
    /// (the first `n` distinct keys, since `max_keys` is a promise), then
    /// the RSS delta is divided by the keys tracked.
    fn rw<K: Hash + Eq>(keys: Vec<K>, n: usize) -> (u64, usize) {
        let before = rss_bytes();
        let lim = KeyedTokenBucket::<K>::builder(Rate::per_hour(1).burst(1))
            .max_keys(n)
            .build()
            .unwrap();
        for k in &keys {
            if lim.len() >= n {
                break;
            }
            let _ = lim.check_key(k);
        }
        let after = rss_bytes();
        let tracked = lim.len();
        assert!(tracked <= n, "never above max_keys");
        let _ = OWN_BYTES.set(lim.memory_bytes());
        black_box(&lim);
        (after.saturating_sub(before), tracked)
    }
    let (delta, tracked) = match (imp, key) {
        ("ratewall", "u64") => rw((0..n * 5 / 4).map(u64_key).collect(), n as usize),
        ("ratewall", "IpAddr") => rw((0..n * 5 / 4).map(ip_key).collect(), n as usize),
        ("ratewall", "String40") => rw((0..n * 5 / 4).map(string_key).collect(), n as usize),
        ("governor", "u64") => gov((0..n).map(u64_key).collect()),
        ("governor", "IpAddr") => gov((0..n).map(ip_key).collect()),
        ("governor", "String40") => gov((0..n).map(string_key).collect()),
        _ => {
            println!("n/a");
            return;
        }
    };
    println!("{:.1}", delta as f64 / tracked.max(1) as f64);
    if let Some(own) = OWN_BYTES.get() {
        println!("{:.1}", *own as f64 / tracked.max(1) as f64);
    }
}

/// `--ops CASE N`: N single-threaded operations and nothing else, for
/// instruction counts under `valgrind --tool=callgrind` (repeatable on a
/// noisy machine). Subtract the `noop` case's total and divide by N.
fn ops(case: &str, n: u64) -> Result<(), String> {
    fn run(n: u64, mut op: impl FnMut(u64) -> bool) {
        let mut allowed = 0u64;
        let start = Instant::now();
        for i in 0..n {
            allowed += u64::from(op(black_box(i)));
        }
        let ns = start.elapsed().as_nanos() as f64 / n as f64;
        println!("{allowed} of {n} allowed, {ns:.2} ns/op");
    }
    let deny = || {
        let l = TokenBucket::new(Rate::per_hour(1).burst(1)).unwrap();
        let _ = l.check();
        l
    };
    let gov_deny = || {
        let l = RateLimiter::direct(Quota::per_hour(NonZeroU32::new(1).unwrap()));
        let _ = l.check();
        l
    };
    match case {
        "noop" => run(n, |i| i & 1 == 0),
        // A concurrency permit, acquire plus release (benches/concurrency.rs
        // races the two in wall-clock time).
        "rw-permit" => {
            let l = ratewall::ConcurrencyLimiter::new(1024).unwrap();
            run(n, |_| l.try_acquire().into_permit().is_some())
        }
        "tokio-permit" => {
            let s = tokio::sync::Semaphore::new(1024);
            run(n, |_| s.try_acquire().is_ok())
        }
        // A keyed permit, acquire plus release, over 10,000 keys (uniform),
        // against a tokio Semaphore per key in a prebuilt `HashMap` with
        // ratewall's hasher, ahash (read only, so no lock: the peer neither
        // bounds nor reclaims keys), and a keyed token bucket's check over
        // the same keys for scale (benches/concurrency.rs races the first
        // two in wall-clock time).
        "rw-keyed-permit-10k" => {
            let l = ratewall::KeyedConcurrencyLimiter::<u64>::builder(1024)
                .max_keys(10_000)
                .seed(0x5eed)
                .build()
                .unwrap();
            let seq = key_sequence(10_000, SEQ_LEN, Dist::Uniform, 1);
            run(n, |i| {
                l.try_acquire_key_n(&u64_key(seq[i as usize & (SEQ_LEN - 1)]), 1)
                    .unwrap()
                    .into_permit()
                    .is_some()
            })
        }
        "tokio-keyed-permit-10k" => {
            let map: std::collections::HashMap<u64, tokio::sync::Semaphore, ahash::RandomState> =
                (0..10_000)
                    .map(|i| (u64_key(i), tokio::sync::Semaphore::new(1024)))
                    .collect();
            let seq = key_sequence(10_000, SEQ_LEN, Dist::Uniform, 1);
            run(n, |i| {
                map[&u64_key(seq[i as usize & (SEQ_LEN - 1)])]
                    .try_acquire()
                    .is_ok()
            })
        }
        // The same 10k keys in a table built for 2N (a one-third load):
        // the probe's branch mispredictions against the table for N
        // (docs/benchmarks.md, "A lookup by groups").
        "rw-keyed-10k" | "rw-keyed-10k-2n" => {
            let l = KeyedTokenBucket::<u64>::builder(gov_keyed_rate())
                .max_keys(if case == "rw-keyed-10k" {
                    10_000
                } else {
                    20_000
                })
                .seed(0x5eed)
                .build()
                .unwrap();
            let seq = key_sequence(10_000, SEQ_LEN, Dist::Uniform, 1);
            run(n, |i| {
                l.check_key(&u64_key(seq[i as usize & (SEQ_LEN - 1)]))
                    .is_allowed()
            })
        }
        "rw-allow" => {
            let l = TokenBucket::new(allow_rate()).unwrap();
            run(n, |_| l.check().is_allowed())
        }
        "rw-deny" => {
            let l = deny();
            run(n, |_| l.check().is_allowed())
        }
        "rw-deny-at" => {
            let l = deny();
            let t = l.now();
            run(n, |_| l.check_at(t).is_allowed())
        }
        "rw-allow-coarse" => {
            let l = TokenBucket::with_clock(allow_rate(), ratewall::CoarseClock::new()).unwrap();
            run(n, |_| l.check().is_allowed())
        }
        "rw-deny-leaky" => {
            let l = ratewall::LeakyBucket::new(Rate::per_hour(1).burst(1)).unwrap();
            let _ = l.check();
            run(n, |_| l.check().is_allowed())
        }
        "rw-deny-fixed" => {
            let l = ratewall::FixedWindow::new(ratewall::Window::per_hour(1)).unwrap();
            let _ = l.check();
            run(n, |_| l.check().is_allowed())
        }
        "rw-deny-sliding" => {
            let l = ratewall::SlidingWindowCounter::new(ratewall::Window::per_hour(1)).unwrap();
            let _ = l.check();
            run(n, |_| l.check().is_allowed())
        }
        "rw-deny-log" => {
            let l = ratewall::SlidingWindowLog::new(ratewall::Window::per_hour(1000)).unwrap();
            for _ in 0..1000 {
                let _ = l.check();
            }
            run(n, |_| l.check().is_allowed())
        }
        "rw-deny-coarse" => {
            let l =
                TokenBucket::with_clock(Rate::per_hour(1).burst(1), ratewall::CoarseClock::new())
                    .unwrap();
            let _ = l.check();
            run(n, |_| l.check().is_allowed())
        }
        "gov-allow-upkeep" => {
            let clock = governor::clock::QuantaUpkeepClock::from_interval(Duration::from_millis(1))
                .unwrap();
            let l = RateLimiter::direct_with_clock(gov_allow(), clock);
            run(n, |_| l.check().is_ok())
        }
        "gov-deny-upkeep" => {
            let clock = governor::clock::QuantaUpkeepClock::from_interval(Duration::from_millis(1))
                .unwrap();
            let l =
                RateLimiter::direct_with_clock(Quota::per_hour(NonZeroU32::new(1).unwrap()), clock);
            let _ = l.check();
            run(n, |_| l.check().is_ok())
        }
        "gov-allow" => {
            let l = RateLimiter::direct(gov_allow());
            run(n, |_| l.check().is_ok())
        }
        "gov-deny" => {
            let l = gov_deny();
            run(n, |_| l.check().is_ok())
        }
        "rw-clock" => {
            let c = ratewall::QuantaClock::new();
            run(n, |_| ratewall::Clock::now(&c) & 1 == 0)
        }
        "gov-clock" => {
            let c = governor::clock::DefaultClock::default();
            let t0 = governor::clock::Clock::now(&c);
            run(n, |_| {
                let t = governor::clock::Clock::now(&c);
                u64::from(governor::clock::Reference::duration_since(&t, t0)) & 1 == 0
            })
        }
        "rw-keyed-100k" => {
            let (l, seq) = filled_table(SPREAD_KEYS);
            run(n, |i| {
                l.check_key(&u64_key(seq[i as usize & (SEQ_LEN - 1)]))
                    .is_allowed()
            })
        }
        "gov-keyed-100k" => {
            let l = RateLimiter::keyed(gov_keyed());
            for i in 0..SPREAD_KEYS as u64 {
                let _ = l.check_key(&u64_key(i));
            }
            let seq = key_sequence(SPREAD_KEYS, SEQ_LEN, Dist::Uniform, 1);
            run(n, |i| {
                l.check_key(&u64_key(seq[i as usize & (SEQ_LEN - 1)]))
                    .is_ok()
            })
        }
        // 16 keys of a 1M-key table (tables for N, every key inserted
        // first) a call: `check_keys` on the 16 against 16 `check_key`
        // calls; an op is the 16 (divide by 16 for a check). The table
        // loads its slots ahead (12 MB of slots).
        "rw-batch16-1m" => {
            let (l, seq) = filled_table(1_000_000);
            run(n, |i| {
                let keys = keys16(&seq, i);
                l.check_keys(&keys).filter(|d| d.is_allowed()).count() == 16
            })
        }
        "rw-one16-1m" => {
            let (l, seq) = filled_table(1_000_000);
            run(n, |i| {
                let keys = keys16(&seq, i);
                keys.iter().filter(|k| l.check_key(*k).is_allowed()).count() == 16
            })
        }
        "rw-multi3-allow" | "rw-multi3-deny" => {
            // `check_all` of 3 as in `benches/keyed.rs`'s multi-limit group:
            // per-IP keyed, per-user keyed, one global limiter. Denied: the
            // global limiter (the last) denies, so both keyed limits give
            // back what they took and are peeked for the report.
            let keyed = || {
                KeyedTokenBucket::<u64>::builder(allow_rate())
                    .seed(0x5eed)
                    .build()
                    .unwrap()
            };
            let (per_ip, per_user) = (keyed(), keyed());
            let global = if case == "rw-multi3-deny" {
                deny()
            } else {
                TokenBucket::new(allow_rate()).unwrap()
            };
            run(n, |_| {
                let (ip, user) = (per_ip.with_key(&7), per_user.with_key(&9));
                let limits: [&dyn Limit<_>; 3] = [&ip, &user, &global];
                check_all(&limits).is_allowed()
            })
        }
        other => return Err(format!("unknown --ops case {other}")),
    }
    Ok(())
}

/// (implementation, key type, key count, RSS bytes per key, own accounting)
type MemResults = Vec<(String, String, u64, Option<f64>, Option<f64>)>;

fn run_memory() -> MemResults {
    let exe = std::env::current_exe().expect("own path");
    let mut out = Vec::new();
    for imp in ["ratewall", "governor"] {
        for key in ["u64", "IpAddr", "String40"] {
            for n in [100_000u64, 1_000_000] {
                let o = std::process::Command::new(&exe)
                    .args(["--mem-child", imp, key, &n.to_string()])
                    .output()
                    .expect("run memory child");
                let text = String::from_utf8_lossy(&o.stdout);
                let mut lines = text.lines().map(|l| l.trim().parse::<f64>().ok());
                let (rss, own) = (lines.next().flatten(), lines.next().flatten());
                eprintln!(
                    "  memory {imp:<9} {key:<8} {n:>8} keys: RSS {rss:?} B/key, own {own:?} B/key"
                );
                out.push((imp.to_string(), key.to_string(), n, rss, own));
            }
        }
    }
    out
}

fn table(o: &Opts, res: &Results, mem: &MemResults) -> String {
    let mut s = String::new();
    let _ = write!(s, "| case | implementation |");
    for t in &o.threads {
        let _ = write!(s, " {t} thr (M ops/s) |");
    }
    s.push('\n');
    s.push_str("|---|---|");
    for _ in &o.threads {
        s.push_str("---:|");
    }
    s.push('\n');
    let cases: Vec<String> = {
        let mut c: Vec<String> = res.keys().map(|k| k.0.clone()).collect();
        c.dedup();
        c
    };
    for case in &cases {
        let get = |imp: &str, t: usize| {
            res.get(&(case.clone(), imp.to_string()))
                .and_then(|m| m.get(&t))
                .copied()
        };
        for imp in ["ratewall", "governor"] {
            let _ = write!(s, "| {case} | {imp} |");
            for &t in &o.threads {
                match get(imp, t) {
                    Some(v) => {
                        let _ = write!(s, " {:.1} |", v / 1e6);
                    }
                    None => s.push_str(" n/a |"),
                }
            }
            s.push('\n');
        }
        let _ = write!(s, "| {case} | **ratio** |");
        for &t in &o.threads {
            match (get("ratewall", t), get("governor", t)) {
                (Some(a), Some(b)) => {
                    let _ = write!(s, " **{:.2}x** |", a / b);
                }
                _ => s.push_str(" n/a |"),
            }
        }
        s.push('\n');
    }
    if !mem.is_empty() {
        s.push_str("\n| implementation | key type | keys | bytes per key (RSS delta) | bytes per key (`memory_bytes()`) |\n|---|---|---:|---:|---:|\n");
        let f = |v: &Option<f64>| v.map_or("n/a".to_string(), |v| format!("{v:.1}"));
        for (imp, key, n, rss, own) in mem {
            let _ = writeln!(s, "| {imp} | {key} | {n} | {} | {} |", f(rss), f(own));
        }
    }
    s
}

fn csv(res: &Results, mem: &MemResults) -> String {
    let mut s = String::from("kind,case,implementation,threads_or_keys,value\n");
    for ((case, imp), m) in res {
        for (t, v) in m {
            let _ = writeln!(s, "ops_per_sec,{case},{imp},{t},{v:.0}");
        }
    }
    for (imp, key, n, rss, own) in mem {
        if let Some(v) = rss {
            let _ = writeln!(s, "rss_bytes_per_key,{key},{imp},{n},{v:.1}");
        }
        if let Some(v) = own {
            let _ = writeln!(s, "own_bytes_per_key,{key},{imp},{n},{v:.1}");
        }
    }
    s
}

/// Small multiples: one panel per case, M ops/s against threads, one line
/// per implementation. Hand-written SVG, no plotting dependency.
fn svg(o: &Opts, res: &Results) -> String {
    let cases: Vec<String> = {
        let mut c: Vec<String> = res.keys().map(|k| k.0.clone()).collect();
        c.dedup();
        c
    };
    let (pw, ph, pad) = (300.0, 220.0, 45.0);
    let w = pw * cases.len() as f64;
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{}\" font-family=\"sans-serif\" font-size=\"11\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n",
        ph + 30.0
    );
    let colors = [("ratewall", "#d62728"), ("governor", "#1f77b4")];
    let tmax = *o.threads.iter().max().unwrap_or(&1) as f64;
    for (ci, case) in cases.iter().enumerate() {
        let x0 = ci as f64 * pw;
        let ymax = colors
            .iter()
            .filter_map(|(imp, _)| res.get(&(case.clone(), imp.to_string())))
            .flat_map(|m| m.values())
            .fold(0.0f64, |a, &b| a.max(b / 1e6))
            * 1.1;
        let ymax = if ymax > 0.0 { ymax } else { 1.0 };
        let px = |t: f64| x0 + pad + (t - 1.0) / (tmax - 1.0).max(1.0) * (pw - pad - 15.0);
        let py = |v: f64| ph - pad + 20.0 - v / ymax * (ph - pad - 10.0);
        let _ = writeln!(
            s,
            "<text x=\"{}\" y=\"14\" text-anchor=\"middle\" font-weight=\"bold\">{case}</text>",
            x0 + pw / 2.0
        );
        let _ = writeln!(
            s,
            "<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"black\"/>",
            px(1.0),
            py(0.0),
            px(tmax),
            py(0.0)
        );
        let _ = writeln!(
            s,
            "<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"black\"/>",
            px(1.0),
            py(0.0),
            px(1.0),
            py(ymax)
        );
        for k in 0..=4 {
            let v = ymax * k as f64 / 4.0;
            let _ = writeln!(
                s,
                "<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{v:.0}</text>",
                px(1.0) - 4.0,
                py(v) + 4.0
            );
        }
        for &t in &o.threads {
            let _ = writeln!(
                s,
                "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{t}</text>",
                px(t as f64),
                py(0.0) + 14.0
            );
        }
        let _ = writeln!(
            s,
            "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">threads (y: M ops/s)</text>",
            x0 + pw / 2.0,
            ph + 22.0
        );
        for (li, (imp, color)) in colors.iter().enumerate() {
            if let Some(m) = res.get(&(case.clone(), imp.to_string())) {
                let pts: Vec<String> = m
                    .iter()
                    .map(|(&t, &v)| format!("{:.1},{:.1}", px(t as f64), py(v / 1e6)))
                    .collect();
                let _ = writeln!(
                    s,
                    "<polyline points=\"{}\" fill=\"none\" stroke=\"{color}\" stroke-width=\"2\"/>",
                    pts.join(" ")
                );
                for p in &pts {
                    let (x, y) = p.split_once(',').unwrap();
                    let _ = writeln!(
                        s,
                        "<circle cx=\"{x}\" cy=\"{y}\" r=\"3\" fill=\"{color}\"/>"
                    );
                }
                let _ = writeln!(
                    s,
                    "<text x=\"{}\" y=\"{}\" fill=\"{color}\">{imp}</text>",
                    x0 + pw - 80.0,
                    30.0 + 14.0 * li as f64
                );
            }
        }
    }
    s.push_str("</svg>\n");
    s
}

/// Pulls one string or number field out of criterion's small JSON files
/// (no JSON dependency: the files are flat and machine-written).
fn json_field<'a>(json: &'a str, after: &str, field: &str) -> Option<&'a str> {
    let start = json.find(after)? + after.len();
    let rest = &json[start..];
    let at = rest.find(&format!("\"{field}\":"))? + field.len() + 3;
    let rest = &rest[at..];
    match rest.strip_prefix('"') {
        Some(string) => Some(&string[..string.find('"')?]),
        None => Some(&rest[..rest.find([',', '}'])?]),
    }
}

/// The medians criterion saved under `dir` (`target/criterion`), as a table:
/// each group's governor entry with the shortest name is its baseline, and
/// every other entry gets `baseline / entry` (above 1: faster than governor).
fn criterion_table(dir: &str) -> String {
    let mut rows: BTreeMap<String, Vec<(String, f64)>> = BTreeMap::new();
    let walk = |d: &std::path::Path| -> Vec<std::path::PathBuf> {
        std::fs::read_dir(d)
            .map(|r| r.filter_map(|e| e.ok().map(|e| e.path())).collect())
            .unwrap_or_default()
    };
    for group in walk(std::path::Path::new(dir)) {
        for bench in walk(&group) {
            let read = |f: &str| std::fs::read_to_string(bench.join("new").join(f)).ok();
            let (Some(meta), Some(est)) = (read("benchmark.json"), read("estimates.json")) else {
                continue;
            };
            let (Some(g), Some(f), Some(m)) = (
                json_field(&meta, "", "group_id"),
                json_field(&meta, "", "function_id"),
                json_field(&est, "\"median\"", "point_estimate").and_then(|m| m.parse().ok()),
            ) else {
                continue;
            };
            rows.entry(g.to_string())
                .or_default()
                .push((f.to_string(), m));
        }
    }
    let mut s = String::from(
        "| group | benchmark | median ns/op | governor / this |\n|---|---|---:|---:|\n",
    );
    for (g, mut v) in rows {
        v.sort_by(|a, b| a.0.cmp(&b.0));
        let base = v
            .iter()
            .filter(|(f, _)| f.starts_with("governor"))
            .min_by_key(|(f, _)| f.len())
            .map(|(_, m)| *m);
        for (f, m) in &v {
            let ratio = match base {
                Some(b) if !f.starts_with("governor") => format!("{:.2}x", b / m),
                _ => String::new(),
            };
            let _ = writeln!(s, "| {g} | {f} | {m:.2} | {ratio} |");
        }
    }
    s
}

fn main() {
    let o = match parse() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("sweep: {e}");
            std::process::exit(2);
        }
    };
    eprintln!(
        "sweep: {} s per point, threads {:?}, {} rounds",
        o.secs, o.threads, o.rounds
    );
    let res = if o.sweep {
        run_sweeps(&o)
    } else {
        Results::new()
    };
    let mem = if o.memory { run_memory() } else { Vec::new() };
    let mut t = table(&o, &res, &mem);
    if let Some(dir) = &o.criterion {
        t = format!("{}\n{t}", criterion_table(dir));
    }
    println!("{t}");
    let write = |path: &Option<String>, body: String| {
        if let Some(p) = path {
            std::fs::write(p, body).unwrap_or_else(|e| panic!("write {p}: {e}"));
        }
    };
    write(&o.csv, csv(&res, &mem));
    write(&o.svg, svg(&o, &res));
    write(&o.md, t);
}

/// A keyed token bucket built for `keys` keys, every one inserted first,
/// with a uniform sequence over them: `rw-keyed-100k`'s table, and the
/// 1M-key one of `rw-batch16-1m` and `rw-one16-1m` (12 MB of slots, so its
/// checks load ahead). A fixed seed: with a random one the table's layout
/// (and so the probe lengths) changes from run to run, and the count by up
/// to 5 instructions per check.
fn filled_table(keys: usize) -> (KeyedTokenBucket<u64>, Vec<u64>) {
    let l = KeyedTokenBucket::<u64>::builder(gov_keyed_rate())
        .max_keys(keys)
        .seed(0x5eed)
        .build()
        .unwrap();
    for i in 0..keys as u64 {
        let _ = l.check_key(&u64_key(i));
    }
    (l, key_sequence(keys, SEQ_LEN, Dist::Uniform, 1))
}

/// Op `i`'s 16 keys of `seq` (an op of the two cases above is 16 checks:
/// divide by 16 for one).
fn keys16(seq: &[u64], i: u64) -> [u64; 16] {
    let at = i as usize * 16;
    std::array::from_fn(|j| u64_key(seq[(at + j) & (SEQ_LEN - 1)]))
}
