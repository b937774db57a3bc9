#![cfg(ratewall_loom)]
//! Loom models of keyed concurrency: a permit's acquire and release racing
//! the reclaim of its key's slot, and the slot's reuse by another key, in a
//! table with room for one key. A key with permits out is never reclaimed,
//! so a release always lands on its own key; no key ever has more holders
//! than its maximum; every count returns to 0.

use loom::sync::atomic::{AtomicU64, Ordering};
use loom::thread;
use ratewall::{KeyedConcurrencyLimiter, ManualClock, Tracking, WhenFull};
// std's `Arc`, not loom's: an owned permit holds a `std::sync::Arc` of its
// limiter (its count is not part of the protocol modelled here).
use std::sync::Arc;

type Keyed = KeyedConcurrencyLimiter<u64, ManualClock>;

/// One shard, room for one key (two slots): every new key must reclaim the
/// only key's slot, and may only when that key has nothing in flight.
fn table(max: u64, policy: WhenFull) -> Arc<Keyed> {
    Arc::new(
        KeyedConcurrencyLimiter::<u64, _>::builder(max)
            .max_keys(1)
            .shards(1)
            .seed(7)
            .when_full(policy)
            .clock(ManualClock::new())
            .build()
            .unwrap(),
    )
}

/// A key whose probe window starts where key 1's does, so that it competes
/// for key 1's slot.
fn rival_of_key_1(l: &Keyed) -> u64 {
    (2..10_000)
        .find(|k| l.__home_slot(k) == l.__home_slot(&1))
        .expect("a key with the same home slot")
}

/// Acquires a unit of `key`, and while holding it checks that the holders
/// of `key` (test-side count) stay within the decision's maximum, then
/// releases. Returns the decision's tracking and whether it was admitted.
fn hold_once(l: &Keyed, key: u64, holders: &AtomicU64) -> (Tracking, bool) {
    let a = l.try_acquire_key(&key);
    let d = a.decision();
    match a.into_permit() {
        Some(permit) => {
            // SeqCst: a test-side counter; the strongest order keeps the
            // assertion about the table's order, not about this counter's.
            let before = holders.fetch_add(1, Ordering::SeqCst);
            assert!(
                before < d.limit(),
                "{} holders of key {key} under a maximum of {}",
                before + 1,
                d.limit()
            );
            assert!(l.in_flight_key(&key) >= 1, "key {key} lost its count");
            holders.fetch_sub(1, Ordering::SeqCst);
            drop(permit);
            (d.tracking(), true)
        }
        None => (d.tracking(), false),
    }
}

/// Key 1 holds a permit in the only slot. Thread A releases it, then
/// acquires key 1 again and releases; thread B acquires the rival key 2,
/// which reclaims key 1's slot only while key 1 has nothing out, then
/// releases. A's release must land on key 1 (never on key 2's count, even
/// when the slot already holds key 2 by then: it cannot, key 1 was not
/// idle), a reacquire of a reclaimed key 1 must start from 0, and at the
/// end both counts are 0 and both keys can be reclaimed.
#[test]
fn release_and_reacquire_race_the_reclaim_of_the_slot() {
    loom::model(|| {
        let l = table(1, WhenFull::RejectNew);
        let k2 = rival_of_key_1(&l);
        let first = l
            .try_acquire_key_owned_n(&1, 1)
            .unwrap()
            .into_permit()
            .unwrap();
        let holders1 = Arc::new(AtomicU64::new(1));

        let a = {
            let (l, holders1) = (Arc::clone(&l), Arc::clone(&holders1));
            thread::spawn(move || {
                holders1.fetch_sub(1, Ordering::SeqCst);
                drop(first);
                hold_once(&l, 1, &holders1)
            })
        };
        let b = {
            let l = Arc::clone(&l);
            thread::spawn(move || hold_once(&l, k2, &AtomicU64::new(0)))
        };
        let (ta, admitted_a) = a.join().unwrap();
        let (tb, admitted_b) = b.join().unwrap();

        // Each acquire was admitted on its own key's slot, or rejected
        // because the other key held the only slot with a permit out.
        for (t, admitted) in [(ta, admitted_a), (tb, admitted_b)] {
            match t {
                Tracking::Tracked => assert!(admitted),
                Tracking::Rejected => assert!(!admitted),
                other => panic!("unexpected {other:?}"),
            }
        }
        assert!(admitted_a || admitted_b, "one of them always finds room");
        assert_eq!((l.in_flight_key(&1), l.in_flight_key(&k2)), (0, 0));
        assert!(l.len() <= 1);
        let _ = l.retain_active();
        assert!(l.is_empty());
        // And the slot is whole: a full-size permit of either key passes.
        assert!(l.try_acquire_key(&k2).is_allowed());
    });
}

/// Maximum 1 for key 1: A acquires and releases, B runs `retain_active`
/// (which removes key 1 if it is idle) and then acquires and releases.
/// Never two holders; a key with a permit out is never removed (the count
/// stays while A holds it); the count returns to 0.
#[test]
fn acquires_race_retain_active() {
    loom::model(|| {
        let l = table(1, WhenFull::RejectNew);
        let holders = Arc::new(AtomicU64::new(0));
        let a = {
            let (l, holders) = (Arc::clone(&l), Arc::clone(&holders));
            thread::spawn(move || hold_once(&l, 1, &holders))
        };
        let b = {
            let (l, holders) = (Arc::clone(&l), Arc::clone(&holders));
            thread::spawn(move || {
                let _ = l.retain_active();
                hold_once(&l, 1, &holders)
            })
        };
        let (ta, _) = a.join().unwrap();
        let (tb, _) = b.join().unwrap();
        assert_eq!((ta, tb), (Tracking::Tracked, Tracking::Tracked));
        assert_eq!(l.in_flight_key(&1), 0);
        assert!(l.try_acquire_key(&1).is_allowed());
    });
}

/// `EvictLeastRecent` never evicts a key with permits out: key 1 holds a
/// permit; A releases it while B's rival key asks for the only slot. B is
/// admitted only if key 1 was idle by then (a reclaim, not an eviction);
/// otherwise it is rejected, and key 1's release still lands on key 1.
#[test]
fn eviction_never_takes_a_slot_with_permits_out() {
    loom::model(|| {
        let l = table(2, WhenFull::EvictLeastRecent);
        let k2 = rival_of_key_1(&l);
        let first = l
            .try_acquire_key_owned_n(&1, 2)
            .unwrap()
            .into_permit()
            .unwrap();
        let a = thread::spawn(move || drop(first));
        let b = {
            let l = Arc::clone(&l);
            thread::spawn(move || {
                let acq = l.try_acquire_key_n(&k2, 2).unwrap();
                let t = acq.decision().tracking();
                assert_ne!(t, Tracking::EvictedOther);
                assert_eq!(acq.is_allowed(), t == Tracking::Tracked);
                if acq.is_allowed() {
                    assert_eq!(l.in_flight_key(&k2), 2);
                    assert_eq!(l.in_flight_key(&1), 0, "key 1 was idle");
                }
            })
        };
        a.join().unwrap();
        b.join().unwrap();
        assert_eq!((l.in_flight_key(&1), l.in_flight_key(&k2)), (0, 0));
    });
}
