//! Loom model: a keyed check racing a keyed quota change decides under one
//! quota, never a mix (the keyed twin of `gcra.rs`'s quota model; it fails
//! if the table's no-write exit skips its re-validation).
#![cfg(ratewall_loom)]

use loom::sync::Arc;
use loom::thread;
use ratewall::{KeyedTokenBucket, ManualClock, Rate};

#[test]
fn keyed_check_racing_a_quota_change_sees_one_quota() {
    loom::model(|| {
        let l = Arc::new(
            KeyedTokenBucket::<u64>::builder(Rate::per_second(10).burst(2))
                .clock(ManualClock::new())
                .max_keys(4)
                .shards(1)
                .seed(7)
                .build()
                .unwrap(),
        );
        assert!(l.check_key_n(&1, 2).unwrap().is_allowed()); // empty under burst 2
        let l2 = l.clone();
        let changer = thread::spawn(move || {
            // Twice the rate: the 2 tokens in use become 100 ms of credit.
            l2.set_quota(Rate::per_second(20).burst(4)).unwrap();
        });
        let d = l.check_key(&1);
        changer.join().unwrap();
        if d.is_allowed() {
            assert_eq!((d.limit(), d.remaining()), (4, 1));
        } else {
            assert_eq!((d.limit(), d.remaining()), (2, 0));
        }
    });
}
