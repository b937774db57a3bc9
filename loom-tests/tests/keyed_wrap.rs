#![cfg(ratewall_loom)]
//! Loom model of the keyed table's wrap sweep (`src/keyed/wrap.rs`) racing
//! a check of a key whose word it rewrites: the sweep's exchange (the idle
//! key's word, rewritten as an idle state packed at the sweep's time) and
//! the check's go through the same slot protocol, so the check's decision
//! is applied to the key's live state or to the rewritten (fresh) one, as
//! one of the two orders would; the sweep never overwrites the check's
//! admission while the key is active.

use loom::sync::Arc;
use loom::thread;
use ratewall::{KeyedTokenBucket, ManualClock, Rate, Tracking, WhenFull};
use std::time::Duration;

/// The sweep period of a table whose burst window is 2 s: 2^37 ns (its
/// packing keeps time in 1 ns units, `src/algo/gcra.rs`); one shard, so the
/// whole table is due once per period.
const PERIOD: u64 = 1 << 37;

#[test]
fn wrap_sweep_racing_a_check_of_the_key_it_rewrites() {
    loom::model(|| {
        let clock = ManualClock::new();
        let l = Arc::new(
            KeyedTokenBucket::<u64, _>::builder(Rate::per_second(1).burst(2))
                .max_keys(2)
                .shards(1)
                .seed(7)
                .when_full(WhenFull::RejectNew)
                .clock(clock.clone())
                .build()
                .unwrap(),
        );
        // Key 1 at 0 s: 1 of 2 used, its TAT 1 s. The table was built at 0:
        // its first sweep is due at PERIOD, when key 1 has long been idle.
        assert!(l.check_key(&1).is_allowed());
        clock.advance(Duration::from_nanos(PERIOD));

        // A checks key 1 half a second before the sweep is due (an
        // explicit instant; unless B's reading moved the limiter's floor
        // first, then A runs at PERIOD, after the sweep): key 1 is idle
        // then, so A admits it afresh and leaves it active at PERIOD. B
        // peeks another key at PERIOD, which runs the sweep: it finds key 1
        // idle (before A's exchange) or active (after it). Whatever the
        // order, A's admission must survive: a sweep that rewrote the word
        // on a stale judgement would erase it.
        let a = {
            let l = Arc::clone(&l);
            thread::spawn(move || l.check_key_at(&1, PERIOD - 500_000_000))
        };
        let b = {
            let l = Arc::clone(&l);
            thread::spawn(move || l.peek_key(&2))
        };
        let da = a.join().unwrap();
        let pb = b.join().unwrap();
        // Key 2 is new, and the table has room for it.
        assert!(pb.is_allowed(), "{pb:?}");
        // A fresh key's admission: 1 of 2 in use.
        assert!(da.is_allowed(), "{da:?}");
        assert_eq!(
            (da.tracking(), da.remaining()),
            (Tracking::Tracked, 1),
            "{da:?}"
        );
        assert_eq!(l.len(), 1);
        // At PERIOD, A's admission still holds 0.5 or 1 s of the 2 s
        // burst window: a unit request leaves 0.
        let p = l.peek_key(&1);
        assert_eq!(
            (p.tracking(), p.remaining()),
            (Tracking::Tracked, 0),
            "{p:?}"
        );
    });
}
