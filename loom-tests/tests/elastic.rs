#![cfg(ratewall_loom)]
//! Loom models of the elastic protocol: guarantee, then headroom + pool all
//! or nothing (a pool denial gives the headroom back).

use loom::sync::Arc;
use loom::thread;
use ratewall::{Decision, ElasticLimiter, ManualClock, Policy, Window};

/// Guarantee 1, ceiling 2 (headroom 1) per key, pool 1; frozen time.
fn limiter(clock: &ManualClock) -> ElasticLimiter<u64, ManualClock> {
    let w = |n| Policy::fixed_window(Window::per_hour(n));
    ElasticLimiter::<u64, _>::builder(w(1), w(2), w(1))
        .max_keys(4)
        .shards(1)
        .seed(7)
        .clock(clock.clone())
        .build()
        .unwrap()
}

fn guaranteed(d: &Decision) -> bool {
    d.is_allowed() && !d.is_above_limit()
}

/// Two keys, two requests each, on two threads: each key's first request
/// is its guarantee, whatever the other does; the second requests race for
/// the pool's one unit. Exactly one wins it (never two: no over-draw), and
/// the loser's headroom is back (its denial took nothing).
#[test]
fn two_keys_race_for_the_pool() {
    loom::model(|| {
        let clock = ManualClock::new();
        let l = Arc::new(limiter(&clock));
        let spawn = |key: u64| {
            let l = Arc::clone(&l);
            thread::spawn(move || [l.check_key(&key), l.check_key(&key)])
        };
        let (a, b) = (spawn(1), spawn(2));
        let (da, db) = (a.join().unwrap(), b.join().unwrap());
        assert!(guaranteed(&da[0]) && guaranteed(&db[0]), "{da:?} {db:?}");
        let from_pool = [da[1], db[1]].iter().filter(|d| d.is_above_limit()).count();
        assert_eq!(from_pool, 1, "one pool unit: {da:?} {db:?}");
        assert!(!l.peek_pool().is_allowed());
        // The loser's headroom was given back: a larger pool admits it now.
        l.set_pool(Policy::fixed_window(Window::per_hour(2)))
            .unwrap();
        let loser = if da[1].is_above_limit() { 2 } else { 1 };
        assert!(l.check_key(&loser).is_above_limit());
    });
}

/// Key 1 on two threads and key 2 on a third: key 1's two requests split
/// into its guarantee and one pool attempt, key 2's one request is always
/// its guarantee, and the pool gives out exactly its one unit.
#[test]
fn a_key_racing_itself_and_another_key() {
    loom::model(|| {
        let clock = ManualClock::new();
        let l = Arc::new(limiter(&clock));
        let spawn = |key: u64| {
            let l = Arc::clone(&l);
            thread::spawn(move || l.check_key(&key))
        };
        let (a1, a2, b) = (spawn(1), spawn(1), spawn(2));
        let (d1, d2, db) = (a1.join().unwrap(), a2.join().unwrap(), b.join().unwrap());
        assert!(guaranteed(&db), "{db:?}");
        assert_eq!(
            [d1, d2].iter().filter(|d| guaranteed(d)).count(),
            1,
            "{d1:?} {d2:?}"
        );
        assert_eq!(
            [d1, d2].iter().filter(|d| d.is_above_limit()).count(),
            1,
            "the pool's unit went to key 1: {d1:?} {d2:?}"
        );
        assert!(!l.peek_pool().is_allowed());
    });
}

/// A pool shrinking (`set_pool`, the capacity signal) while a request of
/// cost 2 is between its headroom and the pool: the request passes, or it
/// is refused and the headroom it took is given back.
#[test]
fn pool_shrinking_during_a_check_leaves_nothing_taken() {
    loom::model(|| {
        let clock = ManualClock::new();
        let w = |n| Policy::fixed_window(Window::per_hour(n));
        let l = Arc::new(
            ElasticLimiter::<u64, _>::builder(w(1), w(3), w(2))
                .max_keys(4)
                .shards(1)
                .seed(7)
                .clock(clock.clone())
                .build()
                .unwrap(),
        );
        assert!(guaranteed(&l.check_key(&1)));
        let a = {
            let l = Arc::clone(&l);
            thread::spawn(move || l.check_key_n(&1, 2))
        };
        let b = {
            let l = Arc::clone(&l);
            thread::spawn(move || l.set_pool(w(1)).unwrap())
        };
        let da = a.join().unwrap();
        b.join().unwrap();
        let passed = matches!(da, Ok(d) if d.is_allowed());
        if let Ok(d) = da {
            assert_eq!(d.is_allowed(), d.is_above_limit(), "{d:?}");
        }
        // Headroom 2: intact unless the request passed.
        l.set_pool(w(3)).unwrap();
        let again = l.check_key_n(&1, 2).unwrap();
        assert_eq!(again.is_allowed(), !passed, "{da:?} then {again:?}");
    });
}

/// An elastic limit inside a multi-limit check whose other limit denies,
/// racing another key's pool request: the denied check gives the pool unit
/// back (the racer may be denied while it is out, never admitted twice),
/// so afterwards the unit is either the racer's or back in the pool.
#[test]
fn a_multi_limit_rollback_returns_the_pool_unit() {
    loom::model(|| {
        let clock = ManualClock::new();
        let l = Arc::new(limiter(&clock));
        let blocked = Arc::new(
            ratewall::KeyedPolicyLimiter::<u64, _>::builder(Policy::fixed_window(
                Window::per_hour(1),
            ))
            .max_keys(2)
            .shards(1)
            .seed(7)
            .clock(clock.clone())
            .build()
            .unwrap(),
        );
        // Both keys have used their guarantee; the other limit is spent.
        assert!(guaranteed(&l.check_key(&1)) && guaranteed(&l.check_key(&2)));
        assert!(blocked.check_key(&9).is_allowed());
        let a = {
            let (l, blocked) = (Arc::clone(&l), Arc::clone(&blocked));
            thread::spawn(move || ratewall::check_all(&[&l.with_key(&1), &blocked.with_key(&9)]))
        };
        let b = {
            let l = Arc::clone(&l);
            thread::spawn(move || l.check_key(&2))
        };
        let (da, db) = (a.join().unwrap(), b.join().unwrap());
        assert!(!da.is_allowed(), "{da:?}");
        assert_eq!(l.peek_pool().is_allowed(), !db.is_allowed(), "{db:?}");
        // Key 1's headroom is back too: with the pool refilled it passes.
        l.set_pool(Policy::fixed_window(Window::per_hour(2)))
            .unwrap();
        assert!(l.check_key(&1).is_above_limit());
    });
}
