#![cfg(ratewall_loom)]
//! Loom model of the all-or-nothing multi-limit check over two limiters.

use loom::sync::Arc;
use loom::thread;
use ratewall::{check_all, KeyedTokenBucket, Limit, ManualClock, Rate, TokenBucket};

/// Two limits with one token each. Thread A takes from both at once; thread
/// B takes from the second alone. At most one of them wins the second
/// limit's token, and if A is denied, the first limit is as if A never came
/// (its token is still there).
#[test]
fn denied_multi_check_gives_back_what_it_took() {
    loom::model(|| {
        let clock = ManualClock::new();
        let first =
            Arc::new(TokenBucket::with_clock(Rate::per_hour(1).burst(1), clock.clone()).unwrap());
        let second =
            Arc::new(TokenBucket::with_clock(Rate::per_hour(1).burst(1), clock.clone()).unwrap());
        let a = {
            let (first, second) = (Arc::clone(&first), Arc::clone(&second));
            thread::spawn(move || {
                let limits: [&dyn Limit<ManualClock>; 2] = [&*first, &*second];
                check_all(&limits)
            })
        };
        let b = {
            let second = Arc::clone(&second);
            thread::spawn(move || second.check())
        };
        let da = a.join().unwrap();
        let db = b.join().unwrap();
        assert!(
            da.is_allowed() != db.is_allowed(),
            "exactly one wins: {da:?} {db:?}"
        );
        assert!(!second.peek().is_allowed());
        assert_eq!(
            first.peek().is_allowed(),
            !da.is_allowed(),
            "first limit: {da:?}"
        );
    });
}

/// A keyed limit and a global one, checked together by two threads for
/// two keys, with one global token: one request gets through, and the loser's
/// key is left as if its request never came.
#[test]
fn keyed_and_global_limits_roll_back_together() {
    loom::model(|| {
        let clock = ManualClock::new();
        let global =
            Arc::new(TokenBucket::with_clock(Rate::per_hour(1).burst(1), clock.clone()).unwrap());
        let per_key = Arc::new(
            KeyedTokenBucket::<u64, _>::builder(Rate::per_hour(1).burst(1))
                .max_keys(4)
                .shards(1)
                .clock(clock.clone())
                .build()
                .unwrap(),
        );
        let spawn = |key: u64| {
            let (global, per_key) = (Arc::clone(&global), Arc::clone(&per_key));
            thread::spawn(move || check_all(&[&per_key.with_key(&key), &*global]))
        };
        let (a, b) = (spawn(1), spawn(2));
        let (da, db) = (a.join().unwrap(), b.join().unwrap());
        assert!(
            da.is_allowed() != db.is_allowed(),
            "one global token: {da:?} {db:?}"
        );
        assert_eq!(per_key.peek_key(&1).is_allowed(), !da.is_allowed());
        assert_eq!(per_key.peek_key(&2).is_allowed(), !db.is_allowed());
    });
}
