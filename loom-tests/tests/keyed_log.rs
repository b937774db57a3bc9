//! Loom models of the keyed sliding log: racing checks of one key admit
//! exactly the limit, and a check racing a quota change sees one quota
//! (the change takes every shard lock before its odd version).
#![cfg(ratewall_loom)]

use loom::sync::Arc;
use loom::thread;
use ratewall::{KeyedSlidingWindowLog, ManualClock, Window};

fn log(limit: u64) -> Arc<KeyedSlidingWindowLog<u32, ManualClock>> {
    Arc::new(
        KeyedSlidingWindowLog::<u32>::builder(Window::per_second(limit))
            .clock(ManualClock::new())
            .max_keys(2)
            .shards(1)
            .seed(3)
            .build()
            .unwrap(),
    )
}

#[test]
fn keyed_log_racing_checks_admit_exactly_the_limit() {
    loom::model(|| {
        let l = log(1);
        let l2 = l.clone();
        let t = thread::spawn(move || l2.check_key(&1).is_allowed());
        let mine = l.check_key(&1).is_allowed();
        let theirs = t.join().unwrap();
        assert!(
            mine ^ theirs,
            "exactly one of two may pass: {mine} {theirs}"
        );
    });
}

#[test]
fn keyed_log_check_racing_a_quota_change_sees_one_quota() {
    loom::model(|| {
        let l = log(1);
        assert!(l.check_key(&1).is_allowed()); // full under limit 1
        let l2 = l.clone();
        let changer = thread::spawn(move || l2.set_quota(Window::per_second(2)).unwrap());
        let d = l.check_key(&1);
        changer.join().unwrap();
        if d.is_allowed() {
            assert_eq!((d.limit(), d.remaining()), (2, 0));
        } else {
            assert_eq!((d.limit(), d.remaining()), (1, 0));
        }
    });
}
