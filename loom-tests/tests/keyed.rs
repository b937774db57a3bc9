#![cfg(ratewall_loom)]
//! Loom models of the keyed table's slot protocol: a check of one key racing
//! with the reclaim of its slot and the slot's reuse by another key. The
//! keys that compete for one slot have distinct 24-bit tags (asserted): the
//! slot word (tag and packed state, 8 bytes) then differs between them
//! whatever their states, which is what makes a stale exchange fail.

use loom::sync::Arc;
use loom::thread;
use ratewall::{KeyedTokenBucket, ManualClock, Rate, Tracking, WhenFull};
use std::time::Duration;

type Job = Box<dyn Fn(&KeyedTokenBucket<u64, ManualClock>) -> Option<ratewall::Decision> + Send>;

fn table(clock: &ManualClock, policy: WhenFull) -> KeyedTokenBucket<u64, ManualClock> {
    // One shard, one key: every new key must reuse the only key's slot.
    KeyedTokenBucket::<u64, _>::builder(Rate::per_second(1).burst(2))
        .max_keys(1)
        .shards(1)
        .seed(7)
        .when_full(policy)
        .clock(clock.clone())
        .build()
        .unwrap()
}

/// A key whose probe window starts where key 1's does, so that it reuses
/// key 1's slot rather than the table's other (empty) slot; its tag is not
/// key 1's.
fn rival_of_key_1(l: &KeyedTokenBucket<u64, ManualClock>) -> u64 {
    let k = (2..10_000)
        .find(|k| l.__home_slot(k) == l.__home_slot(&1))
        .expect("a key with the same home slot");
    assert_ne!(l.__tag(&k), l.__tag(&1), "the rivals' tags must differ");
    k
}

/// Key 1 checked once (1 of 2 used), then idle a second later: tracked, its
/// slot reclaimable.
fn idle_key_1(l: &KeyedTokenBucket<u64, ManualClock>, clock: &ManualClock) {
    assert!(l.check_key(&1).is_allowed());
    clock.advance(Duration::from_secs(1));
    assert_eq!(l.len(), 1);
}

/// Key 1 sits idle in the table's only slot. Thread A checks key 1; thread
/// B checks key 2 (which reclaims key 1's slot) and then resets key 2 (its
/// slot a tombstone again). A's decision must never land on key 2's state:
/// key 2, touched only by B, ends fresh or untracked, so a peek of it says
/// `burst - 1` remain.
#[test]
fn check_racing_reclaim_and_reuse_of_its_slot() {
    loom::model(|| {
        let clock = ManualClock::new();
        let l = Arc::new(table(&clock, WhenFull::RejectNew));
        idle_key_1(&l, &clock);
        let k2 = rival_of_key_1(&l);

        let a = {
            let l = Arc::clone(&l);
            thread::spawn(move || l.check_key(&1))
        };
        let b = {
            let l = Arc::clone(&l);
            thread::spawn(move || {
                let d = l.check_key(&k2);
                l.reset_key(&k2);
                d
            })
        };
        let da = a.join().unwrap();
        let db = b.join().unwrap();

        // Key 2 is held fresh (remaining 1 after a peek), or not held at
        // all: then its peek is the table's answer to a new key (rejected
        // while key 1 is active), which carries no state of key 2's.
        let p2 = l.peek_key(&k2);
        assert!(
            p2.tracking() != Tracking::Tracked || p2.remaining() == 1,
            "key 1's check touched key 2 ({da:?}, {db:?}, {p2:?})"
        );
        assert!(l.len() <= 1);
        match da.tracking() {
            Tracking::Tracked => {
                assert!(da.is_allowed());
                // Key 1 holds its one check unless B reclaimed or rejected...
                let p = l.peek_key(&1).remaining();
                assert!(p == 0 || p == 1, "key 1: {p}");
            }
            Tracking::Rejected => assert!(!da.is_allowed()),
            other => panic!("unexpected {other:?}"),
        }
        if db.tracking() == Tracking::Tracked {
            assert!(db.is_allowed());
        }
    });
}

/// A peek writes nothing, so it confirms its slot with a second load instead
/// of an exchange. Key 1 sits idle in the only slot; A peeks key 1 while B
/// checks key 2, which reclaims key 1's slot. If the second load finds
/// another key's tag, A must look key 1 up again, never read key 2's
/// state: its peek is key 1 fresh (tracked, one more left after this unit)
/// or a new key facing a full table (rejected), never key 2's last unit.
#[test]
fn peek_racing_reclaim_of_its_slot_never_reads_the_new_key() {
    loom::model(|| {
        let clock = ManualClock::new();
        let l = Arc::new(table(&clock, WhenFull::RejectNew));
        idle_key_1(&l, &clock); // tracked, idle, reclaimable
        let k2 = rival_of_key_1(&l);

        let a = {
            let l = Arc::clone(&l);
            thread::spawn(move || l.peek_key(&1))
        };
        let b = {
            let l = Arc::clone(&l);
            thread::spawn(move || l.check_key(&k2))
        };
        let pa = a.join().unwrap();
        let db = b.join().unwrap();
        assert_eq!((db.tracking(), db.remaining()), (Tracking::Tracked, 1));
        match pa.tracking() {
            Tracking::Tracked => assert!(pa.is_allowed() && pa.remaining() == 1, "{pa:?}"),
            Tracking::Rejected => assert!(!pa.is_allowed()),
            other => panic!("unexpected {other:?}: {pa:?}"),
        }
    });
}

/// Key 1 is active in the only slot; A checks key 1 while B's new key 2
/// evicts it. Whoever wins, each decision is applied to its own key: the
/// slot's final state holds exactly one admission, for the key it belongs to.
#[test]
fn check_racing_eviction_of_an_active_key() {
    loom::model(|| {
        let clock = ManualClock::new();
        let l = Arc::new(table(&clock, WhenFull::EvictLeastRecent));
        assert!(l.check_key(&1).is_allowed()); // active: 1 of 2 used
        let k2 = rival_of_key_1(&l);

        let a = {
            let l = Arc::clone(&l);
            thread::spawn(move || l.check_key(&1))
        };
        let b = {
            let l = Arc::clone(&l);
            thread::spawn(move || l.check_key(&k2))
        };
        let da = a.join().unwrap();
        let db = b.join().unwrap();
        assert!(da.is_allowed() && db.is_allowed());
        assert_eq!(l.len(), 1);
        let (p1, p2) = (l.peek_key(&1), l.peek_key(&k2));
        // Both keys have room for one more; the tracked one holds exactly one
        // admission (remaining 0 after the peek), the other peeks as fresh.
        assert!(
            p1.is_allowed() && p2.is_allowed(),
            "a key holds two admissions: {p1:?} {p2:?}"
        );
        if da.tracking() == Tracking::EvictedOther {
            // B evicted key 1, then A's retry evicted key 2 and re-inserted key 1.
            assert_eq!((p1.remaining(), p2.remaining()), (0, 1));
        } else {
            // A's check of key 1 won, then B evicted key 1 for key 2.
            assert_eq!(da.remaining(), 0);
            assert_eq!(db.tracking(), Tracking::EvictedOther);
            assert_eq!((p1.remaining(), p2.remaining()), (1, 0));
        }
    });
}

/// Three threads on the only slot: A checks idle key 1, B inserts key 2
/// (reclaiming key 1's slot if it is still idle), C runs `retain_active`
/// (evicting idle keys). With room for one key and frozen time, exactly one
/// of A and B is tracked (the other is rejected: the table is full of an
/// active key), and each tracked key holds exactly its own admission.
#[test]
fn check_evict_and_insert_on_one_slot() {
    loom::model(|| {
        let clock = ManualClock::new();
        let l = Arc::new(table(&clock, WhenFull::RejectNew));
        idle_key_1(&l, &clock); // tracked, idle
        let k2 = rival_of_key_1(&l);

        let spawn = |f: Job| {
            let l = Arc::clone(&l);
            thread::spawn(move || f(&l))
        };
        let a = spawn(Box::new(|l| Some(l.check_key(&1))));
        let b = spawn(Box::new(move |l| Some(l.check_key(&k2))));
        let c = spawn(Box::new(|l| {
            let _ = l.retain_active();
            None
        }));
        let da = a.join().unwrap().unwrap();
        let db = b.join().unwrap().unwrap();
        c.join().unwrap();

        assert!(l.len() <= 1);
        let tracked = |d: &ratewall::Decision| d.tracking() == Tracking::Tracked;
        assert!(
            tracked(&da) != tracked(&db),
            "exactly one key tracked: {da:?} {db:?}"
        );
        // The tracked key holds its one admission; the other is not held,
        // and its peek predicts its check: rejected, the table being full.
        let (p1, p2) = (l.peek_key(&1), l.peek_key(&k2));
        let held = |p: &ratewall::Decision| (p.tracking(), p.remaining());
        if tracked(&da) {
            assert!(da.is_allowed() && db.tracking() == Tracking::Rejected);
            assert_eq!(held(&p1), (Tracking::Tracked, 0));
            assert_eq!(p2.tracking(), Tracking::Rejected);
        } else {
            assert!(db.is_allowed() && da.tracking() == Tracking::Rejected);
            assert_eq!(held(&p2), (Tracking::Tracked, 0));
            assert_eq!(p1.tracking(), Tracking::Rejected);
        }
    });
}

/// `max_keys` is counted across shards: with one unit left, two inserts of
/// new keys (in two shards or in one) race for it; exactly one key gets
/// tracked and the table never holds more than `max_keys`.
#[test]
fn inserts_in_two_shards_race_for_the_last_unit() {
    loom::model(|| {
        let clock = ManualClock::new();
        let l = Arc::new(
            KeyedTokenBucket::<u64, _>::builder(Rate::per_hour(1))
                .max_keys(2)
                .shards(2)
                .seed(7)
                .when_full(WhenFull::RejectNew)
                .clock(clock.clone())
                .build()
                .unwrap(),
        );
        assert_eq!(l.check_key(&1).tracking(), Tracking::Tracked);
        let spawn = |k: u64| {
            let l = Arc::clone(&l);
            thread::spawn(move || l.check_key(&k).tracking())
        };
        let (a, b) = (spawn(2), spawn(3));
        let (a, b) = (a.join().unwrap(), b.join().unwrap());
        let tracked = [a, b].iter().filter(|t| **t == Tracking::Tracked).count();
        assert_eq!(tracked, 1, "{a:?} {b:?}");
        assert_eq!(l.len(), 2);
    });
}
