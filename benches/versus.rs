//! ratewall against governor, side by side, as a new user would measure it:
//! the same workloads, the same kind of clock on both sides, each point run
//! in several rounds that alternate which implementation goes first, and the
//! median of the per-round ratios reported with its spread.
//!
//! ```text
//! cargo bench --bench versus -- [--rounds 5] [--secs 0.5] [--only NAME]
//!                               [--md out.md] [--no-promise] [--wall]
//!                               [--mode in|procs|both] [--big]
//! ```
//!
//! `--mode`: the keyed rows measured with both sides in this process (`in`,
//! the default), with each side in its own process and wall time (`procs`:
//! every round starts this binary twice with `--child ratewall|governor`,
//! each child builds only its own table, runs one unmeasured pass and one
//! measured run, and prints its ops/s), or both, one after the other per
//! row (`both`; `benches/versus.sh` runs this). `--big` adds the 10M-key
//! rows (slow: both tables take 0.9 GB and seconds to fill, per child).
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
//! - `keyed, N keys, table for N|2N, T threads` (N = 10k, 100k, 1M; 10M
//!   with `--big`; 1 and 2 threads): `u64` keys `0..N`, all inserted before
//!   timing, checked in a splitmix64 order (thread `i` runs its own stream);
//!   ratewall's table built for `N` or `2N` keys (`max_keys`), governor's
//!   default keyed limiter; targets from issue 24;
//! - `hot key, 2 threads`: both threads check the same key;
//! - `batch of 16, ...` and `check_all of 3 tables` (in this process only;
//!   see `batch_rows`);
//! - with `--mode procs` or `both`, the one-limiter rows with default
//!   clocks also run with each side in its own process (`--child SIDE
//!   --one allow|deny`).
//!
//! Then, unless `--no-promise`: the `max_keys` promise (a table built for N
//! tracks N distinct keys under every `WhenFull` policy) and the table's own
//! memory per requested key.

mod common;

use common::{cpu_name, flag_num, median, splitmix64, thread_cpu_ns};
use governor::clock::QuantaUpkeepClock;
use governor::{Quota, RateLimiter};
use ratewall::{check_all, CoarseClock, KeyedTokenBucket, Rate, TokenBucket, WhenFull};
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

/// The `c`-th key of a stream over `0..n` (multiply-high, no division).
#[inline(always)]
fn key_at(c: u64, n: u64) -> u64 {
    ((u128::from(splitmix64(c)) * u128::from(n)) >> 64) as u64
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
    /// (median ratio, min, max, spread = (max - min) / median)
    fn summary(&self) -> (f64, f64, f64, f64) {
        let r = self.ratios();
        let med = median(&r);
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
    /// Also the 10M-key rows (`--big`).
    big: bool,
    /// Keyed rows in one process, in one process per side, or both.
    mode: Mode,
    /// `--child SIDE` and its row.
    child: Option<(String, ChildArgs)>,
}

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    In,
    Procs,
    Both,
}

#[derive(Default)]
struct ChildArgs {
    keys: u64,
    cap: u64,
    threads: usize,
    hot: bool,
    /// `--one allow|deny`: the one-limiter row (default clocks) instead
    /// of a keyed one.
    one: Option<bool>,
}

fn parse() -> Result<Opts, String> {
    let mut o = Opts {
        rounds: 5,
        secs: 0.5,
        only: None,
        md: None,
        promise: true,
        big: false,
        mode: Mode::In,
        child: None,
    };
    let mut c = ChildArgs {
        keys: 100_000,
        cap: 2,
        threads: 1,
        hot: false,
        one: None,
    };
    let mut side = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = || args.next().ok_or(format!("{a} needs a value"));
        match a.as_str() {
            "--rounds" => o.rounds = flag_num("--rounds", val())?,
            "--secs" => o.secs = flag_num("--secs", val())?,
            "--only" => o.only = Some(val()?),
            "--md" => o.md = Some(val()?),
            "--no-promise" => o.promise = false,
            "--big" => o.big = true,
            "--mode" => {
                o.mode = match val()?.as_str() {
                    "in" => Mode::In,
                    "procs" => Mode::Procs,
                    "both" => Mode::Both,
                    m => return Err(format!("--mode {m}: use in, procs or both")),
                }
            }
            "--child" => side = Some(val()?),
            "--keys" => c.keys = flag_num("--keys", val())?,
            "--cap" => c.cap = flag_num("--cap", val())?,
            "--threads" => c.threads = flag_num("--threads", val())?,
            "--hot" => c.hot = true,
            "--one" => {
                c.one = match val()?.as_str() {
                    "allow" => Some(true),
                    "deny" => Some(false),
                    w => return Err(format!("--one {w}: use allow or deny")),
                }
            }
            // Relaxed: set before any measuring thread starts.
            "--wall" => WALL.store(true, Ordering::Relaxed),
            "--bench" => {} // passed by `cargo bench`
            other => return Err(format!("unknown argument {other}")),
        }
    }
    o.rounds = o.rounds.max(1);
    if c.keys == 0 || c.cap == 0 || c.threads == 0 {
        return Err("--keys, --cap and --threads must be at least 1".into());
    }
    o.child = side.map(|s| (s, c));
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

/// A keyed row: `n` keys, a ratewall table built for `cap * n` keys,
/// `threads` threads (`hot`: every thread checks key 7).
#[derive(Clone, Copy)]
struct KeyedRow {
    n: u64,
    cap: u64,
    threads: usize,
    hot: bool,
}

impl KeyedRow {
    fn name(self) -> String {
        let plural = if self.threads == 1 { "" } else { "s" };
        if self.hot {
            return format!("hot key, {} thread{plural}", self.threads);
        }
        let keys = if self.n >= 1_000_000 {
            format!("{}M", self.n / 1_000_000)
        } else {
            format!("{}k", self.n / 1000)
        };
        let table = if self.cap == 1 { "N" } else { "2N" };
        format!(
            "keyed, {keys} keys, table for {table}, {} thread{plural}",
            self.threads
        )
    }

    /// Issue 24's targets: (ratio, max spread; 0 = none).
    fn target(self) -> (f64, f64) {
        match (self.hot, self.n, self.threads) {
            (true, _, _) => (2.0, 0.0),
            (false, 10_000_000, 1) => (2.5, 0.0),
            (false, 1_000_000, 1) => (2.0, 0.0),
            (false, _, 1) => (1.3, 0.0),
            (false, 10_000, _) => (0.0, 0.0),
            (false, _, _) => (2.0, 0.0),
        }
    }

    fn ratewall(self) -> KeyedTokenBucket<u64> {
        let rw = KeyedTokenBucket::<u64>::builder(rw_allow())
            .max_keys((self.cap * self.n) as usize)
            .build()
            .unwrap();
        for k in 0..self.n {
            let _ = rw.check_key(&k);
        }
        // Every key tracked, but for the rare key whose 24-bit tag equals
        // that of a key in its chain (about 2^-23 per key: it shares that
        // key's slot; docs/design.md, "Keyed table").
        assert!(
            rw.len() as u64 + self.n / (1 << 20) + 2 >= self.n,
            "every key tracked: {} of {}",
            rw.len(),
            self.n
        );
        rw
    }

    fn governor(self) -> governor::DefaultKeyedRateLimiter<u64> {
        let gv = RateLimiter::keyed(gov_allow());
        for k in 0..self.n {
            let _ = gv.check_key(&k);
        }
        gv
    }

    /// Runs the row's workload for `secs` on its threads, each check
    /// `check(key)`; aggregate ops/s (see `measure`).
    fn run(self, secs: f64, check: impl Fn(u64) -> bool + Sync) -> f64 {
        let (n, check) = (self.n, &check);
        if self.hot {
            return measure(self.threads, secs, |_| move || check(7));
        }
        measure(self.threads, secs, |i| {
            let mut c = stream(i);
            move || {
                c += 1;
                check(key_at(c, n))
            }
        })
    }
}

/// Each thread's key stream starts far from the others'.
fn stream(i: usize) -> u64 {
    (i as u64) << 40
}

/// The keyed rows, in the table's order; `big` adds the 10M rows.
fn keyed_rows(big: bool) -> Vec<KeyedRow> {
    let mut sizes = vec![10_000, 100_000, 1_000_000];
    if big {
        sizes.push(10_000_000);
    }
    let mut rows = Vec::new();
    for n in sizes {
        for cap in [1, 2] {
            for threads in [1, 2] {
                rows.push(KeyedRow {
                    n,
                    cap,
                    threads,
                    hot: false,
                });
            }
        }
    }
    rows.push(KeyedRow {
        n: 1,
        cap: 2,
        threads: 2,
        hot: true,
    });
    rows
}

/// One keyed row, both sides in this process: the tables built once, then
/// alternating rounds.
fn keyed(o: &Opts, row: KeyedRow) -> Vec<(f64, f64)> {
    let name = row.name();
    let (rw, gv) = (row.ratewall(), row.governor());
    alternate(
        o.rounds,
        &name,
        || row.run(o.secs, |k| rw.check_key(&k).is_allowed()),
        || row.run(o.secs, |k| gv.check_key(&k).is_ok()),
    )
}

/// One keyed row, each side in its own process (this binary with
/// `--child`), wall time: every round starts two fresh processes, each
/// building only its own table, so neither side's allocations, page faults
/// or cache state are the other's, and no figure depends on this harness's
/// process.
fn keyed_procs(o: &Opts, row: KeyedRow) -> Vec<(f64, f64)> {
    let name = format!("{} [procs]", row.name());
    let (n, cap, threads) = (
        row.n.to_string(),
        row.cap.to_string(),
        row.threads.to_string(),
    );
    let mut args = vec!["--keys", &n, "--cap", &cap, "--threads", &threads];
    if row.hot {
        args.push("--hot");
    }
    let child = |side: &str| run_child(side, &args, o.secs);
    alternate(o.rounds, &name, || child("ratewall"), || child("governor"))
}

/// Starts this binary as `--child side` with `args`; its ops/s.
fn run_child(side: &str, args: &[&str], secs: f64) -> f64 {
    let exe = std::env::current_exe().expect("own executable");
    let out = std::process::Command::new(exe)
        .args(["--child", side])
        .args(args)
        .args(["--secs", &secs.to_string()])
        .output()
        .expect("start a child");
    let text = String::from_utf8_lossy(&out.stdout);
    match text.trim().parse() {
        Ok(v) if out.status.success() => v,
        _ => panic!(
            "child {side} failed: {}{}",
            text,
            String::from_utf8_lossy(&out.stderr)
        ),
    }
}

/// The one-limiter rows with default clocks, each side in its own process
/// and wall time (`--child SIDE --one allow|deny`).
fn one_limiter_procs(o: &Opts, out: &mut Vec<Rounds>) {
    for which in ["allow", "deny"] {
        let name = format!("one limiter, {which}, default clocks [procs]");
        if o.only.as_deref().is_some_and(|w| !name.contains(w)) {
            continue;
        }
        let args = ["--one", which];
        let child = |side: &str| run_child(side, &args, o.secs);
        let r = alternate(o.rounds, &name, || child("ratewall"), || child("governor"));
        push_row(out, &name, 1.0, r);
    }
}

/// `--child SIDE`: builds one side's table, one unmeasured pass, then one
/// measured run in wall time; prints its ops/s.
fn child(side: &str, args: &ChildArgs, secs: f64) -> Result<f64, String> {
    // Relaxed: set before any measuring thread starts.
    WALL.store(true, Ordering::Relaxed);
    let row = KeyedRow {
        n: args.keys,
        cap: args.cap,
        threads: args.threads,
        hot: args.hot,
    };
    let warm = (secs / 3.0).min(0.1);
    if let Some(allow) = args.one {
        return match side {
            "ratewall" => {
                let rw = TokenBucket::new(if allow { rw_allow() } else { rw_deny() }).unwrap();
                let _ = rw.check();
                let check = || rw.check().is_allowed();
                let _ = measure(1, warm, |_| check);
                Ok(measure(1, secs, |_| check))
            }
            "governor" => {
                let gv = RateLimiter::direct(if allow { gov_allow() } else { gov_deny() });
                let _ = gv.check();
                let check = || gv.check().is_ok();
                let _ = measure(1, warm, |_| check);
                Ok(measure(1, secs, |_| check))
            }
            other => Err(format!("--child {other}: use ratewall or governor")),
        };
    }
    match side {
        "ratewall" => {
            let rw = row.ratewall();
            let check = |k| rw.check_key(&k).is_allowed();
            let _ = row.run(warm, check);
            Ok(row.run(secs, check))
        }
        "governor" => {
            let gv = row.governor();
            let check = |k| gv.check_key(&k).is_ok();
            let _ = row.run(warm, check);
            Ok(row.run(secs, check))
        }
        other => Err(format!("--child {other}: use ratewall or governor")),
    }
}

/// Keys per batch in the batch rows.
const BATCH: usize = 16;

/// The batch rows (issue 33), in this process, 1 thread, on-CPU rates in
/// checks per second: `n` keys (all inserted first, tables for N), checked
/// in a splitmix64 order, 16 at a time.
/// - `batch of 16`: `check_keys` on 16 keys against 16 governor
///   `check_key` calls;
/// - `batch of 16 ... [vs one at a time]`: `check_keys` on 16 keys against
///   16 of ratewall's own `check_key` calls (the "governor" column);
/// - `check_all of 3 tables`: `check_all` of one key in each of three
///   tables against three governor `check_key` calls on three limiters.
fn batch_rows(o: &Opts, out: &mut Vec<Rounds>) {
    let want = |name: &str| o.only.as_deref().map_or(true, |w| name.contains(w));
    let mut sizes = vec![1_000_000u64];
    if o.big {
        sizes.push(10_000_000);
    }
    for n in sizes {
        let keys = format!("{}M keys", n / 1_000_000);
        let row = KeyedRow {
            n,
            cap: 1,
            threads: 1,
            hot: false,
        };
        let batch = format!("batch of {BATCH}, {keys}, table for N, 1 thread");
        let own = format!("{batch} [vs one at a time]");
        if want(&batch) || want(&own) {
            let rw = &row.ratewall();
            // 16 keys from the stream: one batch's.
            let next16 = |c: &mut u64| -> [u64; BATCH] {
                std::array::from_fn(|_| {
                    *c += 1;
                    key_at(*c, n)
                })
            };
            // Checks per second of `check` on 16 keys at a time from the
            // stream (`check` says how many it admitted: all of them).
            let per16 = |check: &(dyn Fn(&[u64; BATCH]) -> usize + Sync)| {
                per_check(measure(1, o.secs, |i| {
                    let mut c = stream(i);
                    move || check(&next16(&mut c)) == BATCH
                }))
            };
            let batched = || per16(&|keys| rw.check_keys(keys).filter(|d| d.is_allowed()).count());
            if want(&batch) {
                let gv = &row.governor();
                let one_by_one =
                    || per16(&|keys| keys.iter().filter(|k| gv.check_key(k).is_ok()).count());
                let r = alternate(o.rounds, &batch, batched, one_by_one);
                push_row(out, &batch, 4.0, r);
            }
            if want(&own) {
                let own_one_by_one =
                    || per16(&|keys| keys.iter().filter(|k| rw.check_key(k).is_allowed()).count());
                let r = alternate(o.rounds, &own, batched, own_one_by_one);
                push_row(out, &own, 2.0, r);
            }
        }
        let name = format!("check_all of 3 tables, {keys} each, 1 thread");
        if n == 1_000_000 && want(&name) {
            let rws = &[row.ratewall(), row.ratewall(), row.ratewall()];
            let gvs = &[row.governor(), row.governor(), row.governor()];
            let r = alternate(
                o.rounds,
                &name,
                || {
                    row.run(o.secs, |k| {
                        check_all(&[
                            &rws[0].with_key(&k),
                            &rws[1].with_key(&k),
                            &rws[2].with_key(&k),
                        ])
                        .is_allowed()
                    })
                },
                || row.run(o.secs, |k| gvs.iter().all(|g| g.check_key(&k).is_ok())),
            );
            push_row(out, &name, 2.5, r);
        }
    }
}

/// Checks per second from batches per second.
fn per_check(batches_per_sec: f64) -> f64 {
    batches_per_sec * BATCH as f64
}

fn push_row(out: &mut Vec<Rounds>, name: &str, target: f64, rounds: Vec<(f64, f64)>) {
    out.push(Rounds {
        name: name.to_string(),
        target,
        max_spread: 0.0,
        rounds,
    });
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
    if let Some((side, args)) = &o.child {
        match child(side, args, o.secs) {
            Ok(v) => println!("{v}"),
            Err(e) => {
                eprintln!("versus: {e}");
                std::process::exit(2);
            }
        }
        return;
    }
    let started = Instant::now();
    let mut out = Vec::new();
    if o.mode != Mode::Procs {
        one_limiter(&o, &mut out);
    }
    if o.mode != Mode::In {
        one_limiter_procs(&o, &mut out);
    }
    if o.mode != Mode::Procs {
        batch_rows(&o, &mut out);
    }
    let want = |name: &str| o.only.as_deref().map_or(true, |w| name.contains(w));
    for row in keyed_rows(o.big) {
        let (target, max_spread) = row.target();
        // Both modes: one row's two modes back to back, in-process first
        // on even rows, so the machine's state drifts over both alike.
        let mut modes = match o.mode {
            Mode::In => vec![Mode::In],
            Mode::Procs => vec![Mode::Procs],
            Mode::Both => vec![Mode::In, Mode::Procs],
        };
        if out.len() % 2 == 1 {
            modes.reverse();
        }
        let mut got = Vec::new();
        for m in modes {
            let name = if m == Mode::In {
                row.name()
            } else {
                format!("{} [procs]", row.name())
            };
            if !want(&name) {
                continue;
            }
            let rounds = if m == Mode::In {
                keyed(&o, row)
            } else {
                keyed_procs(&o, row)
            };
            got.push(Rounds {
                name,
                target,
                max_spread,
                rounds,
            });
        }
        got.sort_by(|a, b| a.name.cmp(&b.name));
        out.extend(got);
    }

    let mut md = String::new();
    md.push_str(&format!(
        "{}; {} rounds of {} s per side, alternating; ratio = ratewall ops/s over governor ops/s in the same round; rates per {} second ([procs]: each side in its own process, per wall second).\n\n",
        cpu_name(),
        o.rounds, o.secs,
        // Relaxed: a setting.
        if WALL.load(Ordering::Relaxed) || thread_cpu_ns().is_none() { "wall-clock" } else { "on-CPU" }
    ));
    md.push_str("| workload | ratewall M ops/s | governor M ops/s | ratio (median) | min-max | spread | target | met |\n");
    md.push_str("|---|---:|---:|---:|---:|---:|---|---|\n");
    for r in &out {
        let (med, lo, hi, spread) = r.summary();
        let rw = median(&r.rounds.iter().map(|x| x.0).collect::<Vec<_>>());
        let gv = median(&r.rounds.iter().map(|x| x.1).collect::<Vec<_>>());
        let met = med >= r.target && (r.max_spread == 0.0 || spread < r.max_spread);
        let target = if r.target == 0.0 {
            "-".to_string()
        } else if r.max_spread > 0.0 {
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
            if r.target == 0.0 {
                "-"
            } else if met {
                "yes"
            } else {
                "**no**"
            }
        ));
    }
    if o.promise && o.only.is_none() {
        md.push_str(
            "\n| max_keys | policy | tracked | not tracked | table bytes per requested key |\n",
        );
        md.push_str("|---:|---|---:|---:|---:|\n");
        let mut sizes = vec![1_000, 100_000, 1_000_000];
        if o.big {
            sizes.push(10_000_000);
        }
        for n in sizes {
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
