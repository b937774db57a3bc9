//! Loom models of hot keys of a keyed token bucket (`src/keyed/hot.rs`, on
//! the lease protocol of `src/lease/stripe.rs`): leases taken from a key's
//! table entry, used, stolen and given back, racing a demotion of the key
//! (its slot reassigned to another key, whose install takes the stripe
//! over), on a frozen `ManualClock`.
//!
//! The invariants: per key, what was admitted plus what is still available
//! for it anywhere (`available_key_at`: its entry's free units plus every
//! lease of it) never exceeds the burst (no unit admitted twice, and none
//! admitted for a key it was not taken from); where nothing can be dropped,
//! it is exactly the burst.
//!
//! Run: `LOOM_MAX_PREEMPTIONS=2 RUSTFLAGS="--cfg ratewall_loom" cargo test --release -p loom-tests`
#![cfg(ratewall_loom)]

use loom::sync::Arc;
use loom::thread;
use ratewall::{HotKeys, KeyedTokenBucket, LeaseOptions, ManualClock, Rate};
use std::time::Duration;

type Table = KeyedTokenBucket<u64, ManualClock>;

fn table(burst: u64, slots: usize, stripes: usize, max_lease: u64) -> Arc<Table> {
    let lease = LeaseOptions::new()
        .stripes(stripes)
        .max_lease(max_lease)
        .hot_gap(Duration::from_secs(3600));
    Arc::new(
        KeyedTokenBucket::<u64, _>::builder(Rate::per_second(10).burst(burst))
            .max_keys(4)
            .shards(1)
            .hot_keys(HotKeys::new(slots).lease(lease).cool_after(Duration::ZERO))
            .clock(ManualClock::new())
            .build()
            .unwrap(),
    )
}

fn count(l: &Table, key: u64, stripe: usize, checks: usize) -> u64 {
    (0..checks)
        .filter(|_| l.check_key_at_stripe(&key, stripe, 0).is_allowed())
        .count() as u64
}

/// Key 1 is hot with a lease of 1 unit held in stripe 0 and an empty entry
/// (burst 4). Thread A checks it twice on stripe 0 (a use, then a take);
/// thread B demotes it (gives its tail lease back). Every interleaving
/// conserves the key's units: used from the lease or given back, never
/// both, never lost.
#[test]
fn use_and_take_racing_a_demotion_conserve_units() {
    loom::model(|| {
        let l = table(4, 1, 1, 2);
        assert!(l.check_key_at_stripe(&1, 0, 0).is_allowed()); // tracked
        assert!(l.promote_key(&1));
        assert!(l.check_key_at_stripe(&1, 0, 0).is_allowed()); // a take of 1
        assert!(l.check_key_at_stripe(&1, 0, 0).is_allowed()); // a lease of 2: 1 held
        assert_eq!(l.available_key_at(&1, 0), 1);
        let l2 = l.clone();
        let t = thread::spawn(move || l2.demote_key(&1));
        let admitted = 3 + count(&l, 1, 0, 2);
        let given_back = t.join().unwrap();
        assert!(given_back <= 1);
        assert!(admitted <= 4, "over-admitted: {admitted}");
        assert_eq!(
            admitted + l.available_key_at(&1, 0),
            4,
            "a unit lost or duplicated"
        );
    });
}

/// Key 1 is hot and holds 1 unit in stripe 0; its entry is empty (burst 4
/// per key). Thread A checks key 1 on stripe 0; thread B promotes key 2
/// into the only slot (demoting key 1: its lease goes back) and checks key
/// 2 twice on stripe 0, whose install takes the stripe over. No unit of key
/// 1 is ever admitted for key 2 or twice: per key, admitted plus available
/// stays within the burst.
#[test]
fn a_slot_reassigned_under_a_check_never_mixes_keys() {
    loom::model(|| {
        let l = table(4, 1, 1, 2);
        assert!(l.check_key_at_stripe(&1, 0, 0).is_allowed()); // tracked
        assert!(l.check_key_at_stripe(&2, 0, 0).is_allowed()); // tracked
        assert!(l.promote_key(&1));
        assert!(l.check_key_at_stripe(&1, 0, 0).is_allowed()); // a take of 1
        assert!(l.check_key_at_stripe(&1, 0, 0).is_allowed()); // a lease of 2: 1 held
        assert_eq!(l.available_key_at(&1, 0), 1);
        let l2 = l.clone();
        let t = thread::spawn(move || {
            let _ = l2.promote_key(&2);
            1 + count(&l2, 2, 0, 2)
        });
        let one = 3 + count(&l, 1, 0, 1);
        let two = t.join().unwrap();
        assert!(one <= 4, "key 1 over-admitted: {one}");
        assert!(two <= 4, "key 2 over-admitted: {two}");
        assert!(
            one + l.available_key_at(&1, 0) <= 4,
            "key 1: a unit duplicated"
        );
        assert!(
            two + l.available_key_at(&2, 0) <= 4,
            "key 2: a unit duplicated"
        );
    });
}

/// Key 1 is hot on two stripes, holds 1 unit in stripe 1 and has an empty
/// entry (burst 4). Thread A (stripe 0: a denied take, then a steal) and
/// thread B (stripe 1: a use) check it once each while the main thread
/// demotes it (a give-back). Exactly one unit is left to admit: never
/// over-admits, never duplicates.
#[test]
fn owner_thief_and_demotion_race() {
    loom::model(|| {
        let l = table(4, 1, 2, 2);
        assert!(l.check_key_at_stripe(&1, 1, 0).is_allowed()); // tracked
        assert!(l.promote_key(&1));
        assert!(l.check_key_at_stripe(&1, 1, 0).is_allowed()); // a take of 1
        assert!(l.check_key_at_stripe(&1, 1, 0).is_allowed()); // a lease of 2: 1 held
        assert_eq!(l.available_key_at(&1, 0), 1);
        let (la, lb) = (l.clone(), l.clone());
        let a = thread::spawn(move || count(&la, 1, 0, 1));
        let b = thread::spawn(move || count(&lb, 1, 1, 1));
        let _ = l.demote_key(&1);
        let admitted = 3 + a.join().unwrap() + b.join().unwrap();
        assert!(admitted <= 4, "over-admitted: {admitted}");
        assert!(
            admitted + l.available_key_at(&1, 0) <= 4,
            "a unit duplicated"
        );
    });
}
