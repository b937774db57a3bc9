//! The keyed exact sliding log against naive per-key logs, its full-table
//! policies, its memory bound and concurrent exactness.

use proptest::prelude::*;
use ratewall::Clock;
use ratewall::{
    check_all, KeyedSlidingWindowLog, ManualClock, Rate, TokenBucket, Tracking, WhenFull, Window,
};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Duration;

const W: u64 = 1_000_000_000;

/// The naive exact log: every admission time per key; allowed iff fewer than
/// `limit - n + 1` admissions lie in `(t - W, t]`.
fn naive_allows(times: &[u64], t: u64, n: u64, limit: u64) -> bool {
    let in_window = times.iter().filter(|&&a| a + W > t).count() as u64;
    in_window + n <= limit
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// With room for every key, each key's decisions are exactly the naive
    /// log's, through costs, peeks, refunds, resets and backward steps.
    #[test]
    fn every_key_matches_a_naive_log(
        limit in 1u64..6,
        ops in prop::collection::vec((0u8..5, 0u64..4, 0u64..4, 0u64..700_000_000), 1..150),
    ) {
        let clock = ManualClock::new();
        let log = KeyedSlidingWindowLog::<u64>::builder(Window::new(limit, Duration::from_nanos(W)))
            .clock(clock.clone())
            .max_keys(64)
            .build()
            .unwrap();
        let mut model: HashMap<u64, Vec<u64>> = HashMap::new();
        let mut latest = 0u64;
        for (kind, key, n, dt) in ops {
            match kind {
                0 | 1 => {
                    latest = latest.max(clock.now());
                    let times = model.entry(key).or_default();
                    let got = if kind == 0 { log.check_key_n(&key, n) } else { log.peek_key_n(&key, n) };
                    if n > limit {
                        prop_assert!(got.is_err());
                        continue;
                    }
                    let d = got.unwrap();
                    let want = naive_allows(times, latest, n.max(1), limit);
                    prop_assert_eq!(d.is_allowed(), want, "key {} n {} at {}: {:?}", key, n, latest, times);
                    let in_window = times.iter().filter(|&&a| a + W > latest).count() as u64;
                    let after = if d.is_allowed() { in_window + n.max(1) } else { in_window };
                    prop_assert_eq!(d.remaining(), limit - after.min(limit));
                    if kind == 0 && d.is_allowed() && n > 0 {
                        times.extend(std::iter::repeat(latest).take(n as usize));
                    }
                }
                2 => clock.advance(Duration::from_nanos(dt)),
                3 => clock.step_back(Duration::from_nanos(dt)),
                _ => {
                    if n == 0 {
                        log.reset_key(&key);
                        model.remove(&key);
                    } else {
                        latest = latest.max(clock.now());
                        log.refund_key(&key, n);
                        let times = model.entry(key).or_default();
                        for _ in 0..n {
                            match times.last() {
                                Some(&a) if a + W > latest => { times.pop(); }
                                _ => break,
                            }
                        }
                    }
                }
            }
        }
    }

    /// Never more than `max_keys` tracked, whatever the keys and policy.
    #[test]
    fn never_more_than_max_keys(
        max_keys in 1usize..12,
        policy in 0u8..3,
        keys in prop::collection::vec((0u64..40, 0u64..300_000_000), 1..200),
    ) {
        let clock = ManualClock::new();
        let policy = [WhenFull::RejectNew, WhenFull::AdmitUntracked, WhenFull::EvictLeastRecent][policy as usize];
        let log = KeyedSlidingWindowLog::<u64>::builder(Window::new(3, Duration::from_nanos(W)))
            .clock(clock.clone())
            .max_keys(max_keys)
            .when_full(policy)
            .build()
            .unwrap();
        for (key, dt) in keys {
            clock.advance(Duration::from_nanos(dt));
            let d = log.check_key(&key);
            match d.tracking() {
                Tracking::Rejected => prop_assert!(!d.is_allowed() && policy == WhenFull::RejectNew),
                Tracking::Untracked => prop_assert!(d.is_allowed() && policy == WhenFull::AdmitUntracked),
                Tracking::EvictedOther => prop_assert!(policy == WhenFull::EvictLeastRecent),
                _ => {}
            }
            prop_assert!(log.len() <= max_keys, "{} keys tracked, max {}", log.len(), max_keys);
        }
    }
}

#[test]
fn full_table_policies_act_and_say_so() {
    let clock = ManualClock::new();
    let build = |policy| {
        KeyedSlidingWindowLog::<u32>::builder(Window::per_second(2))
            .clock(clock.clone())
            .max_keys(1)
            .when_full(policy)
            .build()
            .unwrap()
    };
    let reject = build(WhenFull::RejectNew);
    assert!(reject.check_key(&1).is_allowed());
    let d = reject.check_key(&2);
    assert_eq!((d.is_allowed(), d.tracking()), (false, Tracking::Rejected));

    let open = build(WhenFull::AdmitUntracked);
    assert!(open.check_key(&1).is_allowed());
    let d = open.check_key(&2);
    assert_eq!((d.is_allowed(), d.tracking()), (true, Tracking::Untracked));
    assert_eq!(open.len(), 1);

    let evict = build(WhenFull::EvictLeastRecent);
    assert!(evict.check_key(&1).is_allowed());
    let d = evict.check_key(&2);
    assert_eq!(
        (d.is_allowed(), d.tracking()),
        (true, Tracking::EvictedOther)
    );
    assert_eq!(evict.len(), 1);
    // Key 1 was evicted: it starts fresh (a new key, evicting key 2 in turn).
    assert_eq!(evict.check_key(&1).remaining(), 1);
}

#[test]
fn idle_keys_are_reclaimed_for_new_ones() {
    let clock = ManualClock::new();
    let log = KeyedSlidingWindowLog::<u32>::builder(Window::per_second(2))
        .clock(clock.clone())
        .max_keys(4)
        .shards(1)
        .build()
        .unwrap();
    for k in 0..4 {
        assert!(log.check_key(&k).is_allowed());
    }
    assert_eq!(log.check_key(&9).tracking(), Tracking::Rejected);
    clock.advance(Duration::from_secs(1)); // every log has emptied: all idle
    for k in 10..14 {
        let d = log.check_key(&k);
        assert!(d.is_allowed(), "key {k}: {d:?}");
        assert_eq!(d.tracking(), Tracking::Tracked);
    }
    assert_eq!(log.len(), 4);
}

#[test]
fn threads_admit_exactly_the_limit_per_key() {
    let clock = ManualClock::new();
    let log = Arc::new(
        KeyedSlidingWindowLog::<u32>::builder(Window::per_second(25))
            .clock(clock.clone())
            .max_keys(100)
            .build()
            .unwrap(),
    );
    let admitted = Arc::new(AtomicU64::new(0));
    let barrier = Arc::new(Barrier::new(4));
    let handles: Vec<_> = (0..4)
        .map(|_| {
            let (log, admitted, barrier) = (log.clone(), admitted.clone(), barrier.clone());
            std::thread::spawn(move || {
                barrier.wait();
                for i in 0..2000u32 {
                    if log.check_key(&(i % 8)).is_allowed() {
                        admitted.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    assert_eq!(admitted.load(Ordering::Relaxed), 8 * 25);
}

#[test]
fn multi_limit_with_a_keyed_log_rolls_back() {
    let clock = ManualClock::new();
    let per_user = KeyedSlidingWindowLog::<u32>::builder(Window::per_hour(1))
        .clock(clock.clone())
        .build()
        .unwrap();
    let global = TokenBucket::with_clock(Rate::per_second(10).burst(10), clock).unwrap();
    assert!(check_all(&[&global, &per_user.with_key(&5)]).is_allowed());
    let d = check_all(&[&global, &per_user.with_key(&5)]);
    assert!(!d.is_allowed());
    assert_eq!(
        global.peek().remaining(),
        8,
        "global gave back the denied call's unit"
    );
    assert_eq!(per_user.peek_key_n(&5, 1).unwrap().remaining(), 0);
}

#[test]
fn set_quota_keeps_each_keys_log() {
    let clock = ManualClock::new();
    let log = KeyedSlidingWindowLog::<u32>::builder(Window::per_second(4))
        .clock(clock.clone())
        .build()
        .unwrap();
    assert!(log.check_key_n(&1, 3).unwrap().is_allowed());
    log.set_quota(Window::per_second(2)).unwrap();
    assert!(
        !log.check_key(&1).is_allowed(),
        "the 3 entries are kept (2 newest count)"
    );
    log.set_quota(Window::per_second(10)).unwrap();
    assert_eq!(log.check_key(&1).remaining(), 7);
}

/// A denied multi-limit check gives the keyed log its entry back.
#[test]
fn a_denied_multi_limit_check_rolls_the_keyed_log_back() {
    let clock = ManualClock::new();
    let log = KeyedSlidingWindowLog::<u32>::builder(Window::per_hour(3))
        .clock(clock.clone())
        .build()
        .unwrap();
    let empty = TokenBucket::with_clock(Rate::per_hour(1), clock.clone()).unwrap();
    let _ = empty.check();
    assert!(!check_all(&[&log.with_key(&7), &empty]).is_allowed());
    assert_eq!(log.peek_key_n(&7, 1).unwrap().remaining(), 2, "given back");
    assert!(check_all(&[&log.with_key(&7)]).is_allowed());
    assert_eq!(log.peek_key_n(&7, 1).unwrap().remaining(), 1);
}

/// `retain_active` drops the idle keys and returns how many it dropped,
/// as the other keyed limiters do.
#[test]
fn retain_active_returns_the_keys_it_dropped() {
    let clock = ManualClock::new();
    let log = KeyedSlidingWindowLog::<u32>::builder(Window::per_second(2))
        .clock(clock.clone())
        .build()
        .unwrap();
    let _ = (log.check_key(&1), log.check_key(&2));
    clock.advance(Duration::from_millis(600));
    let _ = log.check_key(&3);
    clock.advance(Duration::from_millis(400)); // keys 1 and 2 idle, 3 active
    assert_eq!(log.len(), 3);
    assert_eq!(log.retain_active(), 2);
    assert_eq!(log.len(), 1);
    assert_eq!(log.retain_active(), 0);
}

/// A log filled with many more keys than it holds tracks exactly
/// `max_keys` of them, also when `max_keys` does not divide evenly among
/// the shards (the first shards hold one more).
#[test]
fn a_saturated_log_tracks_exactly_max_keys_over_uneven_shards() {
    for (max_keys, shards) in [(7, 2), (10, 4), (5, 4), (9, 8)] {
        let log = KeyedSlidingWindowLog::<u32, _>::builder(Window::per_hour(3))
            .max_keys(max_keys)
            .shards(shards)
            .clock(ManualClock::new())
            .build()
            .unwrap();
        let tracked = (0..500u32)
            .filter(|k| log.check_key(k).tracking() == Tracking::Tracked)
            .count();
        assert_eq!(
            (tracked, log.len()),
            (max_keys, max_keys),
            "{max_keys} keys, {shards} shards"
        );
    }
}

/// In a multi-limit check whose first limit is a keyed log, the log's clock
/// is the one read: its window moves on with it.
#[test]
fn check_all_led_by_a_keyed_log_reads_its_clock() {
    let clock = ManualClock::new();
    clock.advance(Duration::from_secs(10));
    let log = KeyedSlidingWindowLog::<u32, _>::builder(Window::per_second(1))
        .clock(clock.clone())
        .build()
        .unwrap();
    let alice = log.with_key(&1);
    assert!(check_all(&[&alice]).is_allowed());
    assert!(!check_all(&[&alice]).is_allowed());
    clock.advance(Duration::from_secs(1));
    assert!(check_all(&[&alice]).is_allowed());
    assert_eq!(log.peek_key(&1).reset_after(), Duration::from_secs(1));
}

/// A keyed log's `with_key` and builder print what they hold.
#[test]
fn debug_output_names_the_key() {
    let log = KeyedSlidingWindowLog::<u32>::builder(Window::per_second(1))
        .build()
        .unwrap();
    let alice = log.with_key(&12_345);
    let text = format!("{alice:?}");
    assert!(
        text.starts_with("KeyedRef")
            && text.contains("KeyedSlidingWindowLog")
            && text.contains("12345"),
        "{text}"
    );
}

/// `max_keys` is a promise for the log too: `n` distinct keys, all active,
/// fit in a log built for `n` however they split between its shards (a cap
/// per shard tracked 99,015 of 100,000), under every policy; every peek
/// predicts its check; the next key finds the table full.
#[test]
fn a_log_built_for_n_keys_tracks_n_distinct_keys_under_every_policy() {
    for (n, shards) in [(3, Some(2)), (5_000, Some(64)), (100_000, None)] {
        for policy in [
            WhenFull::RejectNew,
            WhenFull::AdmitUntracked,
            WhenFull::EvictLeastRecent,
        ] {
            let mut b = KeyedSlidingWindowLog::<u64, _>::builder(Window::per_hour(1))
                .max_keys(n)
                .when_full(policy)
                .seed(0x5eed)
                .clock(ManualClock::new());
            if let Some(s) = shards {
                b = b.shards(s);
            }
            let log = b.build().unwrap();
            for k in 0..n as u64 {
                let peek = log.peek_key(&k);
                let d = log.check_key(&k);
                assert_eq!(peek, d, "key {k} of {n} ({policy:?})");
                assert_eq!(
                    d.tracking(),
                    Tracking::Tracked,
                    "key {k} of {n} ({policy:?})"
                );
            }
            assert_eq!(log.len(), n, "{policy:?}");
            let peek = log.peek_key(&u64::MAX);
            let d = log.check_key(&u64::MAX);
            assert_eq!(peek, d, "{policy:?}");
            let want = match policy {
                WhenFull::RejectNew => Tracking::Rejected,
                WhenFull::AdmitUntracked => Tracking::Untracked,
                _ => Tracking::EvictedOther,
            };
            assert_eq!(d.tracking(), want, "{policy:?}");
            assert_eq!(log.len(), n, "never more than max_keys ({policy:?})");
        }
    }
}

/// A full log takes a new key whose shard holds no key: other shards' idle
/// keys make room, and `EvictLeastRecent` evicts from another shard, so no
/// key is locked out because of where it hashes; a refused key is told to
/// come back within a window. Two keys in a log of two shards built for
/// two: over 40 trios, some land the third key in an empty shard.
#[test]
fn a_full_log_takes_a_key_whatever_shard_it_hashes_to() {
    for t in 0..40u64 {
        let (a, b, c) = (t, 1_000 + t, 2_000 + t);
        for policy in [WhenFull::RejectNew, WhenFull::EvictLeastRecent] {
            let clock = ManualClock::new();
            let log = KeyedSlidingWindowLog::<u64, _>::builder(Window::per_second(1))
                .max_keys(2)
                .shards(2)
                .when_full(policy)
                .seed(0x5eed)
                .clock(clock.clone())
                .build()
                .unwrap();
            assert_eq!(log.check_key(&a).tracking(), Tracking::Tracked);
            assert_eq!(log.check_key(&b).tracking(), Tracking::Tracked, "trio {t}");
            // Both active: evicted, or refused until a window has passed.
            let peek = log.peek_key(&c);
            let d = log.check_key(&c);
            assert_eq!(peek, d, "trio {t} ({policy:?})");
            match policy {
                WhenFull::EvictLeastRecent => {
                    assert_eq!(d.tracking(), Tracking::EvictedOther, "trio {t}");
                }
                _ => {
                    assert_eq!(d.tracking(), Tracking::Rejected, "trio {t}");
                    let wait = d.retry_after();
                    assert!(wait <= Duration::from_secs(1), "trio {t}: {wait:?}");
                }
            }
            assert_eq!(log.len(), 2, "trio {t} ({policy:?})");
            // Every key idle: the new key takes an idle key's place.
            clock.advance(Duration::from_secs(2));
            let (d, e) = (2_500 + t, 3_000 + t);
            for key in [d, e] {
                let peek = log.peek_key(&key);
                let got = log.check_key(&key);
                assert_eq!(peek, got, "trio {t} ({policy:?})");
                assert!(got.is_allowed(), "trio {t} ({policy:?})");
                assert_eq!(got.tracking(), Tracking::Tracked, "trio {t} ({policy:?})");
            }
            assert_eq!(log.len(), 2, "trio {t} ({policy:?})");
        }
    }
}

/// The log's key count stays exact under concurrent inserts, evictions,
/// resets and reclaims: never more than `max_keys` tracked, and afterwards
/// new keys fill the log to exactly `max_keys` (no unit lost or kept
/// twice).
#[test]
fn the_key_count_stays_exact_under_concurrency() {
    for policy in [WhenFull::RejectNew, WhenFull::EvictLeastRecent] {
        let clock = ManualClock::new();
        let log = Arc::new(
            KeyedSlidingWindowLog::<u64, _>::builder(Window::per_second(1))
                .max_keys(64)
                .shards(8)
                .when_full(policy)
                .seed(0x5eed)
                .clock(clock.clone())
                .build()
                .unwrap(),
        );
        let start = Arc::new(Barrier::new(4));
        let threads: Vec<_> = (0..4u64)
            .map(|t| {
                let (log, start, clock) = (log.clone(), start.clone(), clock.clone());
                std::thread::spawn(move || {
                    start.wait();
                    for i in 0..2_000u64 {
                        let key = t * 1_000_000 + i;
                        let _ = log.check_key(&key);
                        match i % 97 {
                            0 => log.reset_key(&key.saturating_sub(3)),
                            1 if t == 0 => {
                                clock.advance(Duration::from_millis(700));
                                let _ = log.retain_active();
                            }
                            _ => {}
                        }
                        assert!(log.len() <= 64, "{} tracked ({policy:?})", log.len());
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert!(log.len() <= 64);
        // Every key active from here on: new keys fill what is left.
        let mut k = 10_000_000u64;
        while log.len() < 64 {
            let d = log.check_key(&k);
            assert_eq!(
                d.tracking(),
                Tracking::Tracked,
                "{} tracked ({policy:?})",
                log.len()
            );
            k += 1;
        }
        let d = log.check_key(&k);
        let want = match policy {
            WhenFull::RejectNew => Tracking::Rejected,
            _ => Tracking::EvictedOther,
        };
        assert_eq!(d.tracking(), want, "{policy:?}");
        assert_eq!(log.len(), 64, "{policy:?}");
    }
}
