//! The floor: what one clock read costs, for every clock a check can use.
//!
//! `cargo bench --bench clock`

use criterion::{criterion_group, criterion_main, Criterion};
use ratewall::{Clock, CoarseClock, QuantaClock, StdClock};
use std::hint::black_box;
use std::time::Duration;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn clocks(c: &mut Criterion) {
    let mut g = c.benchmark_group("clock");
    let q = QuantaClock::new();
    g.bench_function("ratewall QuantaClock::now", |b| {
        b.iter(|| black_box(&q).now())
    });
    let s = StdClock::new();
    g.bench_function("ratewall StdClock::now", |b| b.iter(|| black_box(&s).now()));
    let coarse = CoarseClock::new();
    g.bench_function("ratewall CoarseClock::now", |b| {
        b.iter(|| black_box(&coarse).now())
    });
    let raw = quanta::Clock::new();
    g.bench_function("quanta Clock::now", |b| b.iter(|| black_box(&raw).now()));
    g.bench_function("quanta Clock::raw", |b| b.iter(|| black_box(&raw).raw()));
    let gov = governor::clock::DefaultClock::default();
    g.bench_function("governor DefaultClock::now", |b| {
        b.iter(|| governor::clock::Clock::now(black_box(&gov)))
    });
    let gov_upkeep = governor::clock::QuantaUpkeepClock::from_interval(Duration::from_millis(1))
        .expect("quanta upkeep thread");
    g.bench_function("governor QuantaUpkeepClock::now", |b| {
        b.iter(|| governor::clock::Clock::now(black_box(&gov_upkeep)))
    });
    let epoch = std::time::Instant::now();
    g.bench_function("std Instant::elapsed", |b| {
        b.iter(|| black_box(&epoch).elapsed())
    });
    g.finish();
}

criterion_group!(benches, clocks);
criterion_main!(benches);
