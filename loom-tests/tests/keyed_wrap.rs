#![cfg(ratewall_loom)]
//! Loom model of the keyed table's wrap sweep (`src/keyed/wrap.rs`) racing
//! a check of a key whose slot it reclaims: the sweep's tombstone and the
//! check's exchange go through the same slot protocol, so the check's
//! decision is applied to the key's live state or, once the key is gone, to
//! a fresh insert of it; never to a tombstone or to nothing while it reports
//! the key as tracked.

use loom::sync::Arc;
use loom::thread;
use ratewall::{KeyedTokenBucket, ManualClock, Rate, Tracking, WhenFull};
use std::time::Duration;

/// The sweep period of a table whose burst window is 2 s: 2^37 ns (its
/// packing keeps time in 1 ns units, `src/algo/gcra.rs`); one shard, so the
/// whole table is due once per period.
const PERIOD: u64 = 1 << 37;

#[test]
fn wrap_sweep_racing_a_check_of_the_key_it_reclaims() {
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
        // its first sweep is due at PERIOD.
        assert!(l.check_key(&1).is_allowed());
        clock.advance(Duration::from_nanos(PERIOD));

        // A checks key 1 at 0.5 s (an explicit instant: active then, and
        // before the sweep is due, unless B's reading moved the limiter's
        // floor first); B peeks another key now, which runs the sweep: at
        // PERIOD key 1 is idle and its slot is reclaimed.
        let a = {
            let l = Arc::clone(&l);
            thread::spawn(move || l.check_key_at(&1, 500_000_000))
        };
        let b = {
            let l = Arc::clone(&l);
            thread::spawn(move || l.peek_key(&2))
        };
        let da = a.join().unwrap();
        let pb = b.join().unwrap();
        // Key 2 is new, and the table has room for it.
        assert!(pb.is_allowed(), "{pb:?}");
        assert!(da.is_allowed(), "{da:?}");
        assert_eq!(da.tracking(), Tracking::Tracked, "{da:?}");
        // A's admission went to key 1's live state (1 left before it, so 0
        // remain; the sweep then reclaimed the idle key), or to a fresh key
        // 1 inserted after the sweep (1 remains, and the table holds it).
        match da.remaining() {
            0 => assert_eq!(l.len(), 0, "{da:?}"),
            1 => assert_eq!(l.len(), 1, "{da:?}"),
            r => panic!("remaining {r}: {da:?}"),
        }
    });
}
