//! The concurrency script against the local step and a reference model of
//! expiring permits, at times the test chooses (see `testing.rs`): every
//! admission is `algo::concurrency::acquire`'s on the units the model
//! holds, and every field of every decision is the model's.

use super::*;
use crate::algo::concurrency as local;
use crate::redis::testing::at;
use crate::redis::tests::server::RedisServer;
use crate::redis::tests::{Rng, T0_US};

#[test]
fn a_member_names_its_units() {
    assert_eq!(units_of("00ab.7:3"), 3);
    assert_eq!(units_of("garbage"), 0);
}

/// A permit in the model: its expiry (us) and units.
struct Model {
    expiry: u64,
    units: u64,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_script_matches_the_local_step_and_the_expiry_model() {
    let server = RedisServer::start();
    let backend = RedisBackend::builder(server.url())
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    // The longest expiry: the renewal task (on the server's own clock)
    // sleeps 20 minutes, so only the test's times move the permits.
    let life = 3_600_000_000u64;
    let mut compared = 0;
    for (round, max) in [1u64, 3, 7].into_iter().enumerate() {
        let l = RedisConcurrencyLimiter::builder(max, &backend)
            .prefix("diff")
            .name(format!("m{max}"))
            .expiry(Duration::from_micros(life))
            .build()
            .unwrap();
        let mut rng = Rng(0x5151_7A7A_0101_3C3C ^ round as u64);
        let mut t = T0_US;
        let mut held: Vec<(Model, RedisPermit)> = Vec::new();
        let mut lapsed_releases = 0;
        for step in 0..300 {
            t = match rng.below(10) {
                0..=5 => t + rng.below(1000),
                6..=8 => t + rng.below(life / 2),
                _ => t + life,
            };
            let ctx = format!("max {max} step {step} t0+{}", t - T0_US);
            if rng.below(3) == 0 && !held.is_empty() {
                let (m, permit) = held.swap_remove(rng.below(held.len() as u64) as usize);
                let live = m.expiry > t;
                lapsed_releases += usize::from(!live);
                assert_eq!(at(t, permit.release()).await.unwrap(), live, "{ctx}");
                continue;
            }
            let n = 1 + rng.below(max);
            let live: Vec<&Model> = held
                .iter()
                .map(|(m, _)| m)
                .filter(|m| m.expiry > t)
                .collect();
            let units: u64 = live.iter().map(|m| m.units).sum();
            let first = live.iter().map(|m| m.expiry - t).min().unwrap_or(0);
            let last = live.iter().map(|m| m.expiry - t).max().unwrap_or(0);
            let (want, _) = local::acquire(local::pack(max, units), n, 100, 0);
            let want = want.unwrap();
            let got = at(t, l.try_acquire_key_n(b"k", n)).await.unwrap();
            let d = got.decision();
            assert_eq!(d.source(), DecisionSource::Redis, "{ctx}");
            assert_eq!(
                (d.is_allowed(), d.limit(), d.remaining()),
                (want.is_allowed(), want.limit(), want.remaining()),
                "{ctx}"
            );
            let us = |x: Duration| x.as_micros() as u64;
            if d.is_allowed() {
                assert_eq!(
                    (us(d.retry_after()), us(d.reset_after())),
                    (0, life),
                    "{ctx}"
                );
                let permit = got.into_permit().unwrap();
                held.push((
                    Model {
                        expiry: t + life,
                        units: n,
                    },
                    permit,
                ));
            } else {
                assert_eq!(
                    (us(d.retry_after()), us(d.reset_after())),
                    (first, last),
                    "{ctx}"
                );
            }
            compared += 1;
        }
        assert!(lapsed_releases > 0, "no permit lapsed before its release");
        for (_, p) in held {
            std::mem::forget(p); // leave the test's times alone
        }
    }
    assert!(compared > 400);
}

#[test]
fn the_fallback_table_is_bounded_and_never_drops_a_key_with_permits_out() {
    let f = Fallback {
        share: 2,
        max_keys: 2,
        map: Mutex::new(HashMap::new()),
    };
    let (d, a) = f.try_acquire_n(b"a", 2);
    assert!(d.is_allowed() && a.is_some());
    assert!(
        !f.try_acquire_n(b"a", 1).0.is_allowed(),
        "a's share is taken"
    );
    let (d, b) = f.try_acquire_n(b"b", 1);
    assert!(d.is_allowed());
    // Full of keys with permits out: a new key is denied, not tracked.
    let (d, c) = f.try_acquire_n(b"c", 1);
    assert!(!d.is_allowed() && c.is_none());
    assert_eq!(lock(&f.map).len(), 2);
    // `b` idle again: it makes room; `a` keeps its permits.
    drop(b);
    assert!(f.try_acquire_n(b"c", 1).0.is_allowed());
    assert!(!f.try_acquire_n(b"a", 1).0.is_allowed());
    // More than the share is a denial while failing over, not an error.
    drop(a);
    assert!(!f.try_acquire_n(b"a", 3).0.is_allowed());
}
