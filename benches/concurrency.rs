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
//! Under `cargo test --benches` (`--bench` absent), one short round runs.

use ratewall::ConcurrencyLimiter;
use std::hint::black_box;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};
use tokio::sync::Semaphore;

const MAX: u64 = 1024;

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
    let permit = l.try_acquire(1).unwrap().into_permit();
    permit.is_some()
}

fn tokio_op(s: &Semaphore) -> bool {
    let permit = s.try_acquire();
    permit.is_ok()
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
    let l = Arc::new(ConcurrencyLimiter::new(MAX).unwrap());
    let s = Arc::new(Semaphore::new(MAX as usize));
    println!("concurrency permit: acquire + release, {rounds} rounds of {ms} ms per point");
    for &t in &threads {
        let mut ratios = Vec::new();
        let (mut rw_all, mut tk_all) = (Vec::new(), Vec::new());
        for round in 0..rounds {
            let (rw, tk) = if round % 2 == 0 {
                let rw = point(t, ms, || ratewall_op(&l));
                (rw, point(t, ms, || tokio_op(&s)))
            } else {
                let tk = point(t, ms, || tokio_op(&s));
                (point(t, ms, || ratewall_op(&l)), tk)
            };
            ratios.push(rw / tk);
            rw_all.push(rw);
            tk_all.push(tk);
        }
        let med = |v: &mut Vec<f64>| {
            v.sort_by(|a, b| a.partial_cmp(b).unwrap());
            v[v.len() / 2]
        };
        let (lo, hi) = ratios
            .iter()
            .fold((f64::MAX, f64::MIN), |(lo, hi), &r| (lo.min(r), hi.max(r)));
        println!(
            "{t} thread(s): ratewall {:.1} M/s, tokio Semaphore {:.1} M/s, ratio median {:.2}x (spread {lo:.2}..{hi:.2})",
            med(&mut rw_all) / 1e6,
            med(&mut tk_all) / 1e6,
            med(&mut ratios),
        );
    }
    assert_eq!(l.in_flight(), 0);
    assert_eq!(s.available_permits(), MAX as usize);
}
