//! The batch check (`check_keys`): for every algorithm, random batches of
//! keys (repeats included, batches longer than one group of 16) on a
//! `ManualClock` (which at times steps back) give, decision by decision,
//! what `check_key_at` on each key in turn gives on a twin limiter at the
//! same time; and it is lazy: keys
//! after the last decision read are never checked.

use proptest::prelude::*;
use ratewall::{
    check_all, KeyedPolicyLimiter, KeyedTokenBucket, ManualClock, Policy, Rate, WhenFull, Window,
};
use std::time::Duration;

fn policies() -> Vec<Policy> {
    vec![
        Policy::token_bucket(Rate::per_second(5).burst(3)),
        Policy::leaky_bucket(Rate::per_second(4).burst(2)),
        Policy::fixed_window(Window::new(4, Duration::from_millis(300))),
        Policy::sliding_window_counter(Window::new(5, Duration::from_millis(400))),
        Policy::sliding_window_log(Window::new(3, Duration::from_millis(250))),
        // Long enough that a table keeps time in coarser units than 1 ns.
        Policy::token_bucket(Rate::per_day(5).burst(3)),
        Policy::fixed_window(Window::new(4, Duration::from_secs(30 * 86_400))),
    ]
}

fn limiter(policy: Policy, clock: &ManualClock, seed: u64) -> KeyedPolicyLimiter<u8, ManualClock> {
    KeyedPolicyLimiter::<u8, _>::builder(policy)
        .max_keys(32)
        .when_full(WhenFull::EvictLeastRecent)
        .seed(seed)
        .clock(clock.clone())
        .build()
        .unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn a_batch_decides_as_one_check_after_another(
        batches in prop::collection::vec(
            (0u64..200_000_000, any::<bool>(), prop::collection::vec(0u8..12, 0..40)),
            1..30,
        ),
        seed in any::<u64>(),
    ) {
        for policy in policies() {
            let clock = ManualClock::new();
            let batched = limiter(policy, &clock, seed);
            let single = limiter(policy, &clock, seed);
            for (advance, back, keys) in &batches {
                // Now and then the clock steps back: both limiters judge
                // the batch at the latest instant either has used.
                if *back && *advance % 4 == 0 {
                    clock.step_back(Duration::from_nanos(*advance));
                } else {
                    clock.advance(Duration::from_nanos(*advance));
                }
                if keys.is_empty() {
                    // Read no clock on either side: an empty batch reads
                    // none, and a reading moves a stepped-back clock's floor.
                    prop_assert_eq!(batched.check_keys(keys).count(), 0);
                    continue;
                }
                let now = single.now();
                let got: Vec<_> = batched.check_keys(keys).collect();
                let want: Vec<_> = keys.iter().map(|k| single.check_key_at(k, now)).collect();
                prop_assert_eq!(&got, &want, "{:?}, keys {:?}", policy, keys);
                for (g, w) in got.iter().zip(&want) {
                    prop_assert_eq!(g.tracking(), w.tracking());
                    prop_assert_eq!(g.retry_after(), w.retry_after());
                    prop_assert_eq!(g.reset_after(), w.reset_after());
                }
            }
        }
    }
}

/// A table large enough (12 MB) that a batch loads its keys' slots ahead
/// decides as one check after another too, in batches longer than a group.
#[test]
fn a_batch_on_a_large_table_decides_as_one_check_after_another() {
    let clock = ManualClock::new();
    let build = || {
        KeyedTokenBucket::<u64, _>::builder(Rate::per_second(3).burst(2))
            .max_keys(1_000_000)
            .clock(clock.clone())
            .build()
            .unwrap()
    };
    let (batched, single) = (build(), build());
    let mut x = 7u64;
    for _ in 0..200 {
        clock.advance(Duration::from_millis(150));
        let keys: Vec<u64> = (0..37)
            .map(|_| {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                (x >> 33) % 50
            })
            .collect();
        let now = single.now();
        let got: Vec<_> = batched.check_keys(&keys).collect();
        let want: Vec<_> = keys.iter().map(|k| single.check_key_at(k, now)).collect();
        assert_eq!(got, want, "keys {keys:?}");
        assert!(got.iter().any(|d| !d.is_allowed()) || keys.len() < 10);
    }
}

/// Keys after the last decision read are not checked: they were at most
/// loaded. Here 40 keys, of which 20 decisions are read: keys 0..20 each
/// took its unit, keys 20..40 still have their whole burst.
#[test]
fn keys_past_the_last_decision_read_are_not_checked() {
    let l = KeyedTokenBucket::<u32, _>::builder(Rate::per_hour(2).burst(2))
        .clock(ManualClock::new())
        .build()
        .unwrap();
    let keys: Vec<u32> = (0..40).collect();
    let read = l
        .check_keys(&keys)
        .take(20)
        .filter(|d| d.is_allowed())
        .count();
    assert_eq!(read, 20);
    for k in 0..40 {
        let left = l.peek_key(&k).remaining();
        // A unit request would leave 0 after one check, 1 after none.
        assert_eq!(left, if k < 20 { 0 } else { 1 }, "key {k}");
    }
}

/// The iterator's size is the keys' (exact for a slice), also mid-group;
/// an empty batch checks nothing.
#[test]
fn the_batch_knows_its_length() {
    let l = KeyedTokenBucket::<u64>::builder(Rate::per_second(10))
        .build()
        .unwrap();
    let keys: Vec<u64> = (0..35).collect();
    let mut it = l.check_keys(&keys);
    assert_eq!(it.size_hint(), (35, Some(35)));
    let _ = it.next();
    assert_eq!(it.size_hint(), (34, Some(34)));
    // The group of 16 holds 15 keys not yet checked.
    let shown = format!("{it:?}");
    assert!(
        shown.starts_with("CheckKeys { queued: 15, now: "),
        "{shown}"
    );
    assert_eq!(l.check_keys(&[] as &[u64]).count(), 0);
    // One decision read: one key checked (the rest of its group was only
    // loaded), and the empty batch checked none.
    assert_eq!(l.len(), 1);
}

/// Borrowed forms work as with `check_key`: `String` keys checked by `&str`.
#[test]
fn keys_are_checked_by_their_borrowed_form() {
    let l = KeyedTokenBucket::<String>::builder(Rate::per_hour(1))
        .build()
        .unwrap();
    let allowed: Vec<bool> = l
        .check_keys(["ada", "bob", "ada"])
        .map(|d| d.is_allowed())
        .collect();
    assert_eq!(allowed, [true, true, false]);
    assert!(!l.check_key("bob").is_allowed());
}

/// `check_all` over several keyed tables (which now loads every key's slot
/// before the first take) stays all or nothing.
#[test]
fn check_all_over_several_tables_is_still_all_or_nothing() {
    let clock = ManualClock::new();
    // A table large enough (12 MB) that `check_all` loads its slot ahead.
    let a = KeyedPolicyLimiter::<u8, _>::builder(policies()[0])
        .max_keys(1_000_000)
        .clock(clock.clone())
        .build()
        .unwrap();
    let b = limiter(
        Policy::fixed_window(Window::new(100, Duration::from_secs(60))),
        &clock,
        2,
    );
    let c = limiter(policies()[4], &clock, 3);
    let mut admitted = 0;
    for _ in 0..10 {
        if check_all(&[&a.with_key(&1), &b.with_key(&1), &c.with_key(&1)]).is_allowed() {
            admitted += 1;
        }
    }
    // The token bucket's burst and the log's limit are both 3; the seven
    // refused checks took nothing from the fixed window.
    assert_eq!(admitted, 3);
    assert_eq!(b.peek_key(&1).remaining(), 100 - 3 - 1);
    assert!(!a.peek_key(&1).is_allowed());
}
