//! A concurrency permit, acquire plus release, against
//! `tokio::sync::Semaphore::try_acquire` (what `tower::limit::ConcurrencyLimit`
//! uses), in alternating rounds at 1 and 2 threads.
//!
//! ```text
//! cargo bench --bench concurrency -- [--rounds 7] [--ms 300] [--threads 1,2]
//! ```
//!
//! Each round runs ratewall then tokio (the order flips every round) for
//! `--ms` per point at each thread count, and takes the ratio of their
//! aggregate ops/s; the report is the median ratio per thread count with
//! its spread (min..max). Both sides admit every request (a maximum of
//! 1024, far above the threads), so the cost measured is the acquire and
//! release themselves. Instruction counts, which repeat exactly, come from
//! `sh benches/callgrind.sh rw-permit tokio-permit` (cases in `sweep.rs`).
//!
//! Then the waiting row: 8 tokio tasks on a limit of 2 (a current-thread
//! runtime, so every wait really queues), each acquiring with
//! `ConcurrencyLimiter::acquire(1).await` against `Semaphore::acquire().await`,
//! holding the permit across one `yield_now` and releasing it; permits per
//! second, alternating rounds, median ratio with its spread.
//! Under `cargo test --benches` (`--bench` absent), one short round runs.

use ratewall::ConcurrencyLimiter;
use std::hint::black_box;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};
use tokio::sync::Semaphore;

const MAX: u64 = 1024;

/// Keys of the keyed rows.
const KEYS: u64 = 10_000;

std::thread_local! {
    /// Each thread's place in its walk over the keys (xorshift state).
    static NEXT: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// The next key of this thread's pseudo-random walk over `0..KEYS`.
fn next_key() -> u64 {
    NEXT.with(|c| {
        let mut x = c.get() | 1;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        c.set(x);
        x % KEYS
    })
}

/// The keyed rows: a `KeyedConcurrencyLimiter` permit (acquire plus
/// release) over `KEYS` keys, each thread walking its own pseudo-random
/// sequence of them, against a tokio `Semaphore` per key in a `HashMap`
/// built up front with ratewall's hasher, ahash (read only: no lock, no
/// bound on keys, no reclaim). No keyed semaphore exists to compare with;
/// this peer is what a service that knows every key in advance could do.
/// Instruction counts: `sh benches/callgrind.sh rw-keyed-permit-10k
/// tokio-keyed-permit-10k rw-keyed-10k`.
fn keyed_rows(rounds: usize, ms: u64, threads: &[usize]) {
    let keyed = ratewall::KeyedConcurrencyLimiter::<u64>::builder(MAX)
        .max_keys(KEYS as usize)
        .build()
        .unwrap();
    let map: std::collections::HashMap<u64, Semaphore, ahash::RandomState> = (0..KEYS)
        .map(|k| (k, Semaphore::new(MAX as usize)))
        .collect();
    let rw_op = || {
        let permit = keyed
            .try_acquire_key_n(&next_key(), 1)
            .unwrap()
            .into_permit();
        permit.is_some()
    };
    let tk_op = || {
        let permit = map[&next_key()].try_acquire();
        permit.is_ok()
    };
    println!(
        "keyed permit: acquire + release over {KEYS} keys, {rounds} rounds of {ms} ms per point"
    );
    for &t in threads {
        let r = alternate(rounds, || point(t, ms, rw_op), || point(t, ms, tk_op));
        println!(
            "{t} thread(s): ratewall keyed {:.1} M/s, tokio Semaphore per key (HashMap) {:.1} M/s, {r}",
            r.rw / 1e6,
            r.tk / 1e6
        );
    }
    assert_eq!((0..KEYS).map(|k| keyed.in_flight_key(&k)).sum::<u64>(), 0);
}

/// Aggregate ops/s of `threads` threads each running `op` for `ms`.
fn point(threads: usize, ms: u64, op: impl Fn() -> bool + Sync) -> f64 {
    let stop = AtomicBool::new(false);
    let barrier = Barrier::new(threads + 1);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                let (op, stop, barrier) = (&op, &stop, &barrier);
                s.spawn(move || {
                    barrier.wait();
                    let start = Instant::now();
                    let mut n = 0u64;
                    // Relaxed: a stop flag polled every 256 ops; no data rides on it.
                    while !stop.load(Ordering::Relaxed) {
                        for _ in 0..256 {
                            assert!(black_box(op()));
                        }
                        n += 256;
                    }
                    n as f64 / start.elapsed().as_secs_f64()
                })
            })
            .collect();
        barrier.wait();
        std::thread::sleep(Duration::from_millis(ms));
        stop.store(true, Ordering::Relaxed);
        handles.into_iter().map(|h| h.join().unwrap()).sum()
    })
}

fn ratewall_op(l: &ConcurrencyLimiter) -> bool {
    let permit = l.try_acquire().into_permit();
    permit.is_some()
}

fn tokio_op(s: &Semaphore) -> bool {
    let permit = s.try_acquire();
    permit.is_ok()
}

/// Permits per second through 8 tasks on a limit of 2 that wait for them:
/// each task acquires (waiting), yields once while holding, releases.
fn waiting_point(ms: u64, ratewall_side: bool) -> f64 {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let l = Arc::new(ConcurrencyLimiter::new(2).unwrap());
    let s = Arc::new(Semaphore::new(2));
    let stop = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let total: u64 = rt.block_on(async {
        let tasks: Vec<_> = (0..8)
            .map(|_| {
                let (l, s, stop) = (Arc::clone(&l), Arc::clone(&s), Arc::clone(&stop));
                tokio::spawn(async move {
                    let mut n = 0u64;
                    // Relaxed: a stop flag; no data rides on it.
                    while !stop.load(Ordering::Relaxed) {
                        for _ in 0..64 {
                            if ratewall_side {
                                let p = l.acquire().await.unwrap();
                                tokio::task::yield_now().await;
                                drop(p);
                            } else {
                                let p = s.acquire().await.unwrap();
                                tokio::task::yield_now().await;
                                drop(p);
                            }
                        }
                        n += 64;
                        if start.elapsed() >= Duration::from_millis(ms) {
                            stop.store(true, Ordering::Relaxed);
                        }
                    }
                    n
                })
            })
            .collect();
        let mut total = 0;
        for t in tasks {
            total += t.await.unwrap();
        }
        total
    });
    assert_eq!(l.in_flight(), 0);
    total as f64 / start.elapsed().as_secs_f64()
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |name: &str, default: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .cloned()
            .unwrap_or_else(|| default.to_string())
    };
    let benching = args.iter().any(|a| a == "--bench");
    let rounds: usize = arg("--rounds", if benching { "7" } else { "1" })
        .parse()
        .unwrap();
    let ms: u64 = arg("--ms", if benching { "300" } else { "20" })
        .parse()
        .unwrap();
    let threads: Vec<usize> = arg("--threads", "1,2")
        .split(',')
        .map(|t| t.parse().unwrap())
        .collect();
    keyed_rows(rounds, ms, &threads);
    let l = Arc::new(ConcurrencyLimiter::new(MAX).unwrap());
    let s = Arc::new(Semaphore::new(MAX as usize));
    println!("concurrency permit: acquire + release, {rounds} rounds of {ms} ms per point");
    for &t in &threads {
        let r = alternate(
            rounds,
            || point(t, ms, || ratewall_op(&l)),
            || point(t, ms, || tokio_op(&s)),
        );
        println!(
            "{t} thread(s): ratewall {:.1} M/s, tokio Semaphore {:.1} M/s, {r}",
            r.rw / 1e6,
            r.tk / 1e6
        );
    }
    assert_eq!(l.in_flight(), 0);
    assert_eq!(s.available_permits(), MAX as usize);

    let r = alternate(
        rounds,
        || waiting_point(ms, true),
        || waiting_point(ms, false),
    );
    println!(
        "waiting, 8 tasks on a limit of 2: ratewall acquire().await {:.2} M permits/s, tokio Semaphore::acquire().await {:.2} M/s, {r}",
        r.rw / 1e6,
        r.tk / 1e6,
    );
}

/// Medians of alternating rounds.
struct Rounds {
    rw: f64,
    tk: f64,
    ratio: f64,
    lo: f64,
    hi: f64,
}

impl std::fmt::Display for Rounds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "ratio median {:.2}x (spread {:.2}..{:.2})",
            self.ratio, self.lo, self.hi
        )
    }
}

/// `rounds` rounds of both sides, ratewall first in even rounds and tokio
/// first in odd ones: the median of each side and of the ratios.
fn alternate(rounds: usize, mut rw: impl FnMut() -> f64, mut tk: impl FnMut() -> f64) -> Rounds {
    let (mut ratios, mut rw_all, mut tk_all) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..rounds {
        let (a, b) = if round % 2 == 0 {
            let a = rw();
            (a, tk())
        } else {
            let b = tk();
            (rw(), b)
        };
        ratios.push(a / b);
        rw_all.push(a);
        tk_all.push(b);
    }
    let med = |v: &mut Vec<f64>| {
        v.sort_by(|a, b| a.partial_cmp(b).unwrap());
        v[v.len() / 2]
    };
    let (lo, hi) = ratios
        .iter()
        .fold((f64::MAX, f64::MIN), |(lo, hi), &r| (lo.min(r), hi.max(r)));
    Rounds {
        rw: med(&mut rw_all),
        tk: med(&mut tk_all),
        ratio: med(&mut ratios),
        lo,
        hi,
    }
}
