//! The window algorithms' cost per check next to GCRA's, one thread.
//!
//! `cargo bench --bench windows -- --quick`
//!
//! - `step/*`: `check_at(t)` with `t` moving forward each call, so every
//!   check is admitted and the clock read is not in the figure: the
//!   algorithm alone (word or ring, CAS or lock, arithmetic);
//! - `check/*`: `check()` on the default clock, admitted;
//! - `deny/*`: `check()` on an exhausted limiter (the read-only path).

use criterion::{criterion_group, Criterion};
use ratewall::{FixedWindow, Rate, SlidingWindowCounter, SlidingWindowLog, TokenBucket, Window};
use std::cell::Cell;
use std::hint::black_box;
use std::time::Duration;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// 100 µs apart: 10,000 per second, under every limit below.
const STEP_NS: u64 = 100_000;

fn step(c: &mut Criterion) {
    let mut g = c.benchmark_group("step");
    let t = Cell::new(0u64);
    let next = || {
        t.set(t.get() + STEP_NS);
        t.get()
    };
    let tb = TokenBucket::new(Rate::per_second(1_000_000).burst(1000)).unwrap();
    g.bench_function("token bucket (GCRA)", |b| {
        b.iter(|| assert!(black_box(&tb).check_at(next()).is_allowed()))
    });
    let fw = FixedWindow::new(Window::per_second(1_000_000)).unwrap();
    g.bench_function("fixed window", |b| {
        b.iter(|| assert!(black_box(&fw).check_at(next()).is_allowed()))
    });
    let sw = SlidingWindowCounter::new(Window::per_second(16_000)).unwrap();
    g.bench_function("sliding window counter", |b| {
        b.iter(|| assert!(black_box(&sw).check_at(next()).is_allowed()))
    });
    // L = 1000 per 110 ms: about 1100 entries would arrive per window, so
    // the ring stays near full (the DESIGN target's case).
    let t2 = Cell::new(0u64);
    let log = SlidingWindowLog::new(Window::new(1000, Duration::from_millis(110))).unwrap();
    g.bench_function("sliding window log, L=1000", |b| {
        b.iter(|| {
            t2.set(t2.get() + 110_000);
            assert!(black_box(&log).check_at(t2.get()).is_allowed())
        })
    });
    g.finish();
}

fn check(c: &mut Criterion) {
    let mut g = c.benchmark_group("check");
    let tb = TokenBucket::new(Rate::per_second(1_000_000_000).burst(10_000_000)).unwrap();
    g.bench_function("token bucket (GCRA)", |b| {
        b.iter(|| assert!(black_box(&tb).check().is_allowed()))
    });
    let fw = FixedWindow::new(Window::new(16_000_000, Duration::from_millis(10))).unwrap();
    g.bench_function("fixed window", |b| {
        b.iter(|| black_box(black_box(&fw).check()))
    });
    let sw = SlidingWindowCounter::new(Window::per_second(16_000)).unwrap();
    g.bench_function("sliding window counter (mostly denied)", |b| {
        b.iter(|| black_box(black_box(&sw).check()))
    });
    let log = SlidingWindowLog::new(Window::new(1000, Duration::from_micros(100))).unwrap();
    g.bench_function("sliding window log, L=1000", |b| {
        b.iter(|| black_box(black_box(&log).check()))
    });
    g.finish();
}

fn deny(c: &mut Criterion) {
    let mut g = c.benchmark_group("deny");
    let tb = TokenBucket::new(Rate::per_hour(1).burst(1)).unwrap();
    let _ = tb.check();
    g.bench_function("token bucket (GCRA)", |b| {
        b.iter(|| assert!(!black_box(&tb).check().is_allowed()))
    });
    let fw = FixedWindow::new(Window::per_hour(1)).unwrap();
    let _ = fw.check();
    g.bench_function("fixed window", |b| {
        b.iter(|| assert!(!black_box(&fw).check().is_allowed()))
    });
    let sw = SlidingWindowCounter::new(Window::per_hour(1)).unwrap();
    let _ = sw.check();
    g.bench_function("sliding window counter", |b| {
        b.iter(|| assert!(!black_box(&sw).check().is_allowed()))
    });
    let log = SlidingWindowLog::new(Window::new(1000, Duration::from_secs(3600))).unwrap();
    let _ = log.check_n(1000);
    g.bench_function("sliding window log, L=1000", |b| {
        b.iter(|| assert!(!black_box(&log).check().is_allowed()))
    });
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1));
    targets = step, check, deny
}

/// Instruction counts, for a machine too noisy for wall-clock figures:
/// `RATEWALL_ICOUNT=<algorithm>:<iterations> valgrind --tool=callgrind
/// target/release/deps/windows-*` runs only the `step` loop of one
/// algorithm; the difference between two iteration counts, divided by
/// their difference, is the cost of one check in instructions.
fn icount(spec: &str) {
    let (which, iters) = spec.split_once(':').expect("algorithm:iterations");
    let iters: u64 = iters.parse().expect("iterations");
    let mut admitted = 0u64;
    macro_rules! run {
        ($limiter:expr, $step:expr) => {{
            let l = $limiter;
            for i in 1..=iters {
                admitted += u64::from(black_box(one(black_box(&l), i * $step)).is_allowed());
            }
        }};
    }
    match which {
        "gcra" => run!(
            TokenBucket::new(Rate::per_second(1_000_000).burst(1000)).unwrap(),
            STEP_NS
        ),
        "fixed" => run!(
            FixedWindow::new(Window::per_second(1_000_000)).unwrap(),
            STEP_NS
        ),
        "sliding" => run!(
            SlidingWindowCounter::new(Window::per_second(16_000)).unwrap(),
            STEP_NS
        ),
        "log" => run!(
            SlidingWindowLog::new(Window::new(1000, Duration::from_millis(110))).unwrap(),
            110_000
        ),
        other => panic!("unknown algorithm {other}"),
    }
    assert_eq!(admitted, iters, "every check is admitted");
}

/// One admitted check, never inlined, so callgrind can count it alone. It
/// returns the whole decision, so every field is computed (a caller that
/// reads only `is_allowed` lets the compiler drop the rest).
#[inline(never)]
fn one<A: ratewall::algorithm::Algorithm, C: ratewall::Clock>(
    l: &ratewall::Limiter<A, C>,
    t: u64,
) -> ratewall::Decision {
    l.check_at(t)
}

/// Wall-clock ns per admitted `check_at`, the minimum of `ROUNDS`
/// interleaved rounds of 1M checks (the minimum filters out the other
/// tenants' noise).
fn min_times() {
    const ROUNDS: usize = 41;
    let algos = ["gcra", "fixed", "sliding", "log"];
    let mut best = [f64::MAX; 4];
    for _ in 0..ROUNDS {
        for (i, a) in algos.iter().enumerate() {
            let t0 = std::time::Instant::now();
            icount(&format!("{a}:1000000"));
            best[i] = best[i].min(t0.elapsed().as_nanos() as f64 / 1e6);
        }
    }
    for (a, b) in algos.iter().zip(best) {
        println!("{a}: {b:.1} ns per check (min of {ROUNDS} rounds)");
    }
}

/// Two threads on one limiter for 300 ms, `check()` on the default clock:
/// aggregate million checks per second (best of 3).
fn contended() {
    fn run<A: ratewall::algorithm::Algorithm>(name: &str, l: ratewall::Limiter<A>) {
        let l = std::sync::Arc::new(l);
        let mut best = 0.0f64;
        for _ in 0..3 {
            let stop = std::time::Instant::now() + Duration::from_millis(300);
            let hs: Vec<_> = (0..2)
                .map(|_| {
                    let l = l.clone();
                    std::thread::spawn(move || {
                        let mut n = 0u64;
                        while std::time::Instant::now() < stop {
                            for _ in 0..100 {
                                let _ = black_box(l.check());
                            }
                            n += 100;
                        }
                        n
                    })
                })
                .collect();
            let total: u64 = hs.into_iter().map(|h| h.join().unwrap()).sum();
            best = best.max(total as f64 / 0.3 / 1e6);
        }
        println!("2 threads, {name}: {best:.1} M checks/s");
    }
    run(
        "token bucket, allow",
        TokenBucket::new(Rate::per_second(1_000_000_000).burst(10_000_000)).unwrap(),
    );
    run(
        "sliding log L=2^20, allow",
        SlidingWindowLog::new(Window::new(1 << 20, Duration::from_millis(1))).unwrap(),
    );
    let tb = TokenBucket::new(Rate::per_hour(1).burst(1)).unwrap();
    let _ = tb.check();
    run("token bucket, deny", tb);
    let log = SlidingWindowLog::new(Window::new(1000, Duration::from_secs(3600))).unwrap();
    let _ = log.check_n(1000);
    run("sliding log L=1000, deny", log);
    let fw = FixedWindow::new(Window::per_hour(1)).unwrap();
    let _ = fw.check();
    run("fixed window, deny", fw);
}

fn main() {
    if std::env::var("RATEWALL_CONTENDED").is_ok() {
        contended();
        return;
    }
    if std::env::var("RATEWALL_MIN_TIMES").is_ok() {
        min_times();
        return;
    }
    if let Ok(spec) = std::env::var("RATEWALL_ICOUNT") {
        icount(&spec);
        return;
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
