//! Keyed limiters, ratewall against governor's `RateLimiter::keyed`
//! (`DashMap`), `u64` keys, same quota, same pre-generated key sequence:
//! 100k and 1M keys with uniform and Zipf (0.99) choice, one hot key,
//! inserts of new keys, and the multi-limit check. ratewall's tables have
//! room for twice the working set; governor's map has no bound.
//!
//! `cargo bench --bench keyed`

#[path = "common/mod.rs"]
mod common;

use common::{key_sequence, u64_key, Dist};
use criterion::{criterion_group, criterion_main, Criterion};
use governor::{Quota, RateLimiter};
use ratewall::{check_all, KeyedTokenBucket, Limit, Rate, TokenBucket};
use std::hint::black_box;
use std::num::NonZeroU32;
use std::time::{Duration, Instant};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const SEQ_LEN: usize = 1 << 20;

/// A realistic per-key quota: 1000/s, burst 1000. With spread keys, nearly
/// every check is allowed and writes.
fn rate() -> Rate {
    Rate::per_second(1000)
}
fn quota() -> Quota {
    Quota::per_second(NonZeroU32::new(1000).unwrap())
}
/// Everything allowed (the hot key and the inserts).
fn open_rate() -> Rate {
    Rate::per_second(1_000_000_000).burst(10_000_000)
}
fn open_quota() -> Quota {
    Quota::with_period(Duration::from_nanos(1))
        .unwrap()
        .allow_burst(NonZeroU32::new(10_000_000).unwrap())
}

fn spread(c: &mut Criterion) {
    for keys in [100_000usize, 1_000_000] {
        // Room for twice the working set (governor's map has no bound).
        let rw = KeyedTokenBucket::<u64>::builder(rate())
            .max_keys(2 * keys)
            .build()
            .unwrap();
        let gv = RateLimiter::keyed(quota());
        for i in 0..keys as u64 {
            let _ = rw.check_key(&u64_key(i));
            let _ = gv.check_key(&u64_key(i));
        }
        for dist in [Dist::Uniform, Dist::Zipf] {
            let seq = key_sequence(keys, SEQ_LEN, dist, 42);
            let name = format!("keyed {}k {dist:?}", keys / 1000).to_lowercase();
            let mut g = c.benchmark_group(name);
            let mut i = 0usize;
            g.bench_function("ratewall", |b| {
                b.iter(|| {
                    i = (i + 1) & (SEQ_LEN - 1);
                    black_box(rw.check_key(&u64_key(seq[i])).is_allowed())
                })
            });
            g.bench_function("governor", |b| {
                b.iter(|| {
                    i = (i + 1) & (SEQ_LEN - 1);
                    black_box(gv.check_key(&u64_key(seq[i])).is_ok())
                })
            });
            g.finish();
        }
    }
}

fn hot_key(c: &mut Criterion) {
    let mut g = c.benchmark_group("keyed hot key");
    let rw = KeyedTokenBucket::<u64>::builder(open_rate())
        .build()
        .unwrap();
    g.bench_function("ratewall", |b| {
        b.iter(|| assert!(rw.check_key(black_box(&7)).is_allowed()))
    });
    let gv = RateLimiter::keyed(open_quota());
    g.bench_function("governor", |b| {
        b.iter(|| assert!(gv.check_key(black_box(&7)).is_ok()))
    });
    g.finish();
}

/// Keys never seen before. Each sample builds fresh limiters and times only
/// the inserts. ratewall's table holds 1M keys: past that, inserts reclaim
/// idle keys (every key is idle 1 ns after its check under this quota).
fn inserts(c: &mut Criterion) {
    let mut g = c.benchmark_group("keyed insert new key");
    g.bench_function("ratewall", |b| {
        b.iter_custom(|iters| {
            let rw = KeyedTokenBucket::<u64>::builder(open_rate())
                .max_keys(1_000_000)
                .build()
                .unwrap();
            let start = Instant::now();
            for i in 0..iters {
                black_box(rw.check_key(&u64_key(i)).is_allowed());
            }
            start.elapsed()
        })
    });
    g.bench_function("governor", |b| {
        b.iter_custom(|iters| {
            let gv = RateLimiter::keyed(open_quota());
            let start = Instant::now();
            for i in 0..iters {
                black_box(gv.check_key(&u64_key(i)).is_ok());
            }
            start.elapsed()
        })
    });
    g.finish();
}

/// The multi-limit check of 3 limits (per-IP keyed, per-user keyed, global)
/// against one check of each kind it is made of.
fn multi(c: &mut Criterion) {
    let mut g = c.benchmark_group("multi-limit");
    let global = TokenBucket::new(open_rate()).unwrap();
    let per_ip = KeyedTokenBucket::<u64>::builder(open_rate())
        .build()
        .unwrap();
    let per_user = KeyedTokenBucket::<u64>::builder(open_rate())
        .build()
        .unwrap();
    g.bench_function("ratewall 1 limiter check", |b| {
        b.iter(|| assert!(black_box(&global).check().is_allowed()))
    });
    g.bench_function("ratewall 1 keyed check", |b| {
        b.iter(|| assert!(per_ip.check_key(black_box(&7)).is_allowed()))
    });
    g.bench_function("ratewall check_all of 3", |b| {
        b.iter(|| {
            let limits: [&dyn Limit<_>; 3] = [
                &per_ip.with_key(black_box(&7u64)),
                &per_user.with_key(black_box(&9u64)),
                &global,
            ];
            assert!(check_all(&limits).is_allowed())
        })
    });
    let gv_global = RateLimiter::direct(open_quota());
    let gv_ip = RateLimiter::keyed(open_quota());
    let gv_user = RateLimiter::keyed(open_quota());
    g.bench_function("governor 3 checks in a row (not all-or-nothing)", |b| {
        b.iter(|| {
            assert!(
                gv_ip.check_key(black_box(&7u64)).is_ok()
                    && gv_user.check_key(black_box(&9u64)).is_ok()
                    && gv_global.check().is_ok()
            )
        })
    });
    g.finish();
}

criterion_group!(benches, hot_key, spread, inserts, multi);
criterion_main!(benches);
