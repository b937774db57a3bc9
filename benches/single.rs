//! One limiter, one thread: the allow path and the deny path of every
//! algorithm, side by side with `governor`'s direct limiter on the same quota.
//!
//! `cargo bench --bench single`
//!
//! - allow: 1e9/s with a burst of 1e7, so every check is admitted (and
//!   writes), even on a coarse clock that stands still for 1 ms;
//! - deny: 1/hour, burst 1, taken before timing, so every check is denied
//!   (and writes nothing).

use criterion::{criterion_group, criterion_main, Criterion};
use governor::{Quota, RateLimiter};
use ratewall::{CoarseClock, LeakyBucket, Rate, TokenBucket};
use std::hint::black_box;
use std::num::NonZeroU32;
use std::time::Duration;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const ALLOW_BURST: u32 = 10_000_000;

fn allow_rate() -> Rate {
    Rate::per_second(1_000_000_000).burst(u64::from(ALLOW_BURST))
}
fn deny_rate() -> Rate {
    Rate::per_hour(1).burst(1)
}
fn gov_allow() -> Quota {
    Quota::with_period(Duration::from_nanos(1))
        .unwrap()
        .allow_burst(NonZeroU32::new(ALLOW_BURST).unwrap())
}
fn gov_deny() -> Quota {
    Quota::per_hour(NonZeroU32::new(1).unwrap())
}

fn allow(c: &mut Criterion) {
    let mut g = c.benchmark_group("single allow");
    let tb = TokenBucket::new(allow_rate()).unwrap();
    g.bench_function("ratewall token bucket", |b| {
        b.iter(|| assert!(black_box(&tb).check().is_allowed()))
    });
    let lb = LeakyBucket::new(allow_rate()).unwrap();
    g.bench_function("ratewall leaky bucket", |b| {
        b.iter(|| assert!(black_box(&lb).check().is_allowed()))
    });
    let gov = RateLimiter::direct(gov_allow());
    g.bench_function("governor direct", |b| {
        b.iter(|| assert!(black_box(&gov).check().is_ok()))
    });
    let tb_coarse = TokenBucket::with_clock(allow_rate(), CoarseClock::new()).unwrap();
    g.bench_function("ratewall token bucket, CoarseClock", |b| {
        b.iter(|| assert!(black_box(&tb_coarse).check().is_allowed()))
    });
    let gov_upkeep = RateLimiter::direct_with_clock(
        gov_allow(),
        governor::clock::QuantaUpkeepClock::from_interval(Duration::from_millis(1)).unwrap(),
    );
    g.bench_function("governor direct, QuantaUpkeepClock", |b| {
        b.iter(|| assert!(black_box(&gov_upkeep).check().is_ok()))
    });
    // The step alone: one caller-read time, no clock in the loop.
    let t = tb.now();
    let mut i = 0u64;
    g.bench_function("ratewall token bucket, check_at (no clock)", |b| {
        b.iter(|| {
            i += 1;
            assert!(black_box(&tb).check_at(t + i).is_allowed())
        })
    });
    g.finish();
}

fn deny(c: &mut Criterion) {
    let mut g = c.benchmark_group("single deny");
    let tb = TokenBucket::new(deny_rate()).unwrap();
    let _ = tb.check();
    g.bench_function("ratewall token bucket", |b| {
        b.iter(|| assert!(!black_box(&tb).check().is_allowed()))
    });
    let lb = LeakyBucket::new(deny_rate()).unwrap();
    let _ = lb.check();
    g.bench_function("ratewall leaky bucket", |b| {
        b.iter(|| assert!(!black_box(&lb).check().is_allowed()))
    });
    let gov = RateLimiter::direct(gov_deny());
    let _ = gov.check();
    g.bench_function("governor direct", |b| {
        b.iter(|| assert!(black_box(&gov).check().is_err()))
    });
    let tb_coarse = TokenBucket::with_clock(deny_rate(), CoarseClock::new()).unwrap();
    let _ = tb_coarse.check();
    g.bench_function("ratewall token bucket, CoarseClock", |b| {
        b.iter(|| assert!(!black_box(&tb_coarse).check().is_allowed()))
    });
    let t = tb.now();
    g.bench_function("ratewall token bucket, check_at (no clock)", |b| {
        b.iter(|| assert!(!black_box(&tb).check_at(black_box(t)).is_allowed()))
    });
    g.finish();
}

criterion_group!(benches, allow, deny);
criterion_main!(benches);
