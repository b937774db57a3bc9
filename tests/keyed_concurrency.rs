//! `KeyedConcurrencyLimiter`: the per-key bound against a reference model
//! (random keys, costs, releases in any order, maximum changes, per-key
//! maxima, reclaims, a full table under every policy), permits released
//! exactly once (drop, panic, a dropped future), keys with permits out never
//! reclaimed nor evicted, bad input, and threads.

use proptest::prelude::*;
use ratewall::{
    ConfigError, InsufficientCapacity, KeyedConcurrencyLimiter, KeyedPermit, ManualClock,
    OwnedKeyedPermit, Tracking, WhenFull, MAX_PERMITS,
};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

type Keyed = KeyedConcurrencyLimiter<u64, ManualClock>;

fn limiter(max: u64, max_keys: usize, policy: WhenFull) -> Keyed {
    KeyedConcurrencyLimiter::builder(max)
        .max_keys(max_keys)
        .shards(1)
        .seed(3)
        .when_full(policy)
        .clock(ManualClock::new())
        .build()
        .unwrap()
}

#[derive(Clone, Debug)]
enum Op {
    Acquire { key: u64, n: u64 },
    Peek { key: u64, n: u64 },
    Release(usize),
    SetMax(u64),
    SetKeyMax { key: u64, max: u64 },
    ClearKeyMax(u64),
    RetainActive,
}

const KEYS: u64 = 6;

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..KEYS, 1u64..5).prop_map(|(key, n)| Op::Acquire { key, n }),
        1 => (0..KEYS, 1u64..5).prop_map(|(key, n)| Op::Peek { key, n }),
        5 => (0usize..32).prop_map(Op::Release),
        1 => (1u64..6).prop_map(Op::SetMax),
        1 => (0..KEYS, 1u64..8).prop_map(|(key, max)| Op::SetKeyMax { key, max }),
        1 => (0..KEYS).prop_map(Op::ClearKeyMax),
        1 => Just(Op::RetainActive),
    ]
}

fn policy() -> impl Strategy<Value = WhenFull> {
    prop_oneof![
        Just(WhenFull::RejectNew),
        Just(WhenFull::AdmitUntracked),
        Just(WhenFull::EvictLeastRecent),
    ]
}

/// The reference: a count per key, the default and per-key maxima, the
/// table's key budget and policy. A key with nothing in flight carries no
/// state, so a new key finds room iff fewer than `max_keys` keys have
/// permits out (idle keys are reclaimed to make room; keys with permits out
/// never are, whatever the policy).
struct Model {
    counts: HashMap<u64, u64>,
    max: u64,
    own: HashMap<u64, u64>,
    max_keys: usize,
    policy: WhenFull,
}

/// What the model expects of one decision.
#[derive(Debug, PartialEq, Eq)]
struct Expect {
    allowed: bool,
    remaining: u64,
    limit: u64,
    tracking: Tracking,
}

impl Model {
    fn max_of(&self, key: u64) -> u64 {
        self.own.get(&key).copied().unwrap_or(self.max)
    }

    fn count(&self, key: u64) -> u64 {
        self.counts.get(&key).copied().unwrap_or(0)
    }

    /// The decision for `n` units of `key`; takes them if `take` and allowed.
    fn acquire(&mut self, key: u64, n: u64, take: bool) -> Result<Expect, InsufficientCapacity> {
        let max = self.max_of(key);
        if n > max {
            return Err(InsufficientCapacity {
                requested: n,
                capacity: max,
            });
        }
        let out = self.count(key);
        let active = self.counts.values().filter(|&&c| c > 0).count();
        if out == 0 && active >= self.max_keys {
            // A new key and no room: every key in the table holds permits.
            return Ok(match self.policy {
                WhenFull::AdmitUntracked => Expect {
                    allowed: true,
                    remaining: max - n,
                    limit: max,
                    tracking: Tracking::Untracked,
                },
                _ => Expect {
                    allowed: false,
                    remaining: 0,
                    limit: max,
                    tracking: Tracking::Rejected,
                },
            });
        }
        let allowed = out + n <= max;
        if allowed && take {
            *self.counts.entry(key).or_insert(0) += n;
        }
        Ok(Expect {
            allowed,
            remaining: if allowed {
                max - out - n
            } else {
                max.saturating_sub(out)
            },
            limit: max,
            tracking: Tracking::Tracked,
        })
    }
}

fn seen(d: ratewall::Decision) -> Expect {
    Expect {
        allowed: d.is_allowed(),
        remaining: d.remaining(),
        limit: d.limit(),
        tracking: d.tracking(),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Every decision's `allowed`, `remaining`, `limit` and tracking equal
    /// the model's, every error too; the counts in the table equal the
    /// model's after every step (so no key ever holds more than the maximum
    /// it was admitted under, and no release is lost or lands on another
    /// key); and once every permit is dropped every count is 0 and every
    /// key can be reclaimed.
    #[test]
    fn keyed_permits_follow_the_model(
        max in 1u64..6,
        max_keys in 1usize..5,
        policy in policy(),
        ops in proptest::collection::vec(op(), 1..120),
    ) {
        let l = limiter(max, max_keys, policy);
        let mut m = Model { counts: HashMap::new(), max, own: HashMap::new(), max_keys, policy };
        // (key, units counted in the table, the permit)
        let mut held: Vec<(u64, u64, KeyedPermit<'_, u64, ManualClock>)> = Vec::new();
        for op in ops {
            match op {
                Op::Acquire { key, n } => {
                    let want = m.acquire(key, n, true);
                    let got = l.try_acquire_key_n(&key, n);
                    match (want, got) {
                        (Err(w), Err(g)) => prop_assert_eq!(w, g),
                        (Ok(w), Ok(a)) => {
                            prop_assert_eq!(&seen(a.decision()), &w, "{:?} of key {}", op, key);
                            if let Some(p) = a.into_permit() {
                                prop_assert_eq!(p.units(), n);
                                let counted = if w.tracking == Tracking::Untracked { 0 } else { n };
                                held.push((key, counted, p));
                            }
                        }
                        (w, g) => prop_assert!(false, "model {:?}, limiter {:?}", w, g.map(|a| a.decision())),
                    }
                }
                Op::Peek { key, n } => {
                    let want = m.acquire(key, n, false);
                    let got = l.peek_key_n(&key, n);
                    match (want, got) {
                        (Err(w), Err(g)) => prop_assert_eq!(w, g),
                        (Ok(w), Ok(d)) => prop_assert_eq!(seen(d), w),
                        (w, g) => prop_assert!(false, "model {:?}, limiter {:?}", w, g),
                    }
                }
                Op::Release(i) => {
                    if !held.is_empty() {
                        let (key, counted, p) = held.swap_remove(i % held.len());
                        drop(p);
                        *m.counts.get_mut(&key).unwrap_or(&mut 0) -= counted;
                    }
                }
                Op::SetMax(new) => {
                    l.set_max(new).unwrap();
                    m.max = new;
                }
                Op::SetKeyMax { key, max } => {
                    l.set_key_max(&key, max).unwrap();
                    m.own.insert(key, max);
                }
                Op::ClearKeyMax(key) => {
                    l.clear_key_max(&key);
                    m.own.remove(&key);
                }
                Op::RetainActive => {
                    l.retain_active();
                    let active = m.counts.values().filter(|&&c| c > 0).count();
                    prop_assert_eq!(l.len(), active, "retain_active leaves the keys with permits out");
                }
            }
            for key in 0..KEYS {
                prop_assert_eq!(l.in_flight_key(&key), m.count(key), "key {}", key);
                prop_assert_eq!(l.key_max(&key), m.max_of(key));
            }
            prop_assert!(l.len() <= max_keys);
        }
        drop(held);
        for key in 0..KEYS {
            prop_assert_eq!(l.in_flight_key(&key), 0);
        }
        l.retain_active();
        prop_assert!(l.is_empty());
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// A table of 4 shards and 32 keys under 200 keys in use: whether a new
    /// key finds room now depends on its shard (reclaim is per shard), so
    /// the model takes the table's answer for new keys (tracked, rejected,
    /// untracked) and checks everything else: a tracked admission never
    /// passes its key's maximum, its `remaining` is right, every key's count
    /// equals the model's (no release lost or landing on another key, in
    /// any shard), and everything returns to 0.
    #[test]
    fn keyed_permits_in_a_sharded_table(
        policy in policy(),
        ops in proptest::collection::vec((0u64..200, 1u64..4, 0usize..64, any::<bool>()), 1..300),
    ) {
        let l = KeyedConcurrencyLimiter::<u64, _>::builder(3)
            .max_keys(32)
            .shards(4)
            .when_full(policy)
            .clock(ManualClock::new())
            .build()
            .unwrap();
        let mut counts: HashMap<u64, u64> = HashMap::new();
        let mut held: Vec<(u64, u64, KeyedPermit<'_, u64, ManualClock>)> = Vec::new();
        for (key, n, i, release) in ops {
            let touched = if release && !held.is_empty() {
                let (k, counted, p) = held.swap_remove(i % held.len());
                drop(p);
                *counts.get_mut(&k).unwrap() -= counted;
                k
            } else {
                let out = counts.get(&key).copied().unwrap_or(0);
                let a = l.try_acquire_key_n(&key, n).unwrap();
                let d = a.decision();
                match d.tracking() {
                    Tracking::Tracked => {
                        prop_assert_eq!(d.is_allowed(), out + n <= 3);
                        let left = if d.is_allowed() { 3 - out - n } else { 3 - out };
                        prop_assert_eq!(d.remaining(), left);
                    }
                    Tracking::Rejected => {
                        prop_assert!(out == 0 && !d.is_allowed() && policy != WhenFull::AdmitUntracked);
                    }
                    Tracking::Untracked => {
                        prop_assert!(out == 0 && d.is_allowed() && policy == WhenFull::AdmitUntracked);
                    }
                    other => prop_assert!(false, "{:?}", other),
                }
                if let Some(p) = a.into_permit() {
                    let counted = if d.tracking() == Tracking::Tracked { n } else { 0 };
                    *counts.entry(key).or_insert(0) += counted;
                    held.push((key, counted, p));
                }
                key
            };
            let want = counts.get(&touched).copied().unwrap_or(0);
            prop_assert_eq!(l.in_flight_key(&touched), want, "key {}", touched);
            let active = counts.values().filter(|&&c| c > 0).count();
            prop_assert!(active <= 32 && l.len() <= 32);
        }
        for (&key, &c) in &counts {
            prop_assert_eq!(l.in_flight_key(&key), c, "key {}", key);
        }
        drop(held);
        for &key in counts.keys() {
            prop_assert_eq!(l.in_flight_key(&key), 0);
        }
        l.retain_active();
        prop_assert!(l.is_empty());
    }
}

#[test]
fn a_key_holds_at_most_its_maximum_and_gets_units_back_on_drop() {
    let l = limiter(3, 16, WhenFull::RejectNew);
    let a = l.try_acquire_key_n(&1, 2).unwrap();
    assert_eq!(
        (
            a.is_allowed(),
            a.decision().limit(),
            a.decision().remaining()
        ),
        (true, 3, 1)
    );
    let denied = l.try_acquire_key_n(&1, 2).unwrap();
    assert!(!denied.is_allowed());
    assert_eq!(denied.decision().remaining(), 1);
    assert!(denied.into_permit().is_none());
    // Another key has its own count.
    let b = l.try_acquire_key_n(&2, 3).unwrap();
    assert!(b.is_allowed());
    assert_eq!((l.in_flight_key(&1), l.in_flight_key(&2)), (2, 3));
    drop(a);
    assert_eq!(l.in_flight_key(&1), 0);
    assert!(l.try_acquire_key_n(&1, 3).unwrap().is_allowed());
    drop(b);
    assert_eq!(l.peek_key(&2).remaining(), 2);
}

#[test]
fn bad_input_is_a_typed_error() {
    assert_eq!(
        KeyedConcurrencyLimiter::<u64>::new(0).unwrap_err(),
        ConfigError::ZeroLimit
    );
    assert_eq!(
        KeyedConcurrencyLimiter::<u64>::new(MAX_PERMITS + 1).unwrap_err(),
        ConfigError::LimitTooLarge {
            limit: MAX_PERMITS + 1,
            max: MAX_PERMITS
        }
    );
    assert_eq!(
        KeyedConcurrencyLimiter::<u64>::builder(1)
            .shards(3)
            .build()
            .unwrap_err(),
        ConfigError::InvalidShards { shards: 3 }
    );
    let l = limiter(4, 16, WhenFull::RejectNew);
    assert_eq!(
        l.try_acquire_key_n(&1, 5).unwrap_err(),
        InsufficientCapacity {
            requested: 5,
            capacity: 4
        }
    );
    assert_eq!(l.set_max(0).unwrap_err(), ConfigError::ZeroLimit);
    assert_eq!(l.set_key_max(&1, 0).unwrap_err(), ConfigError::ZeroLimit);
    assert_eq!(l.max(), 4, "a refused change changes nothing");
    // A key's own maximum bounds its cost.
    l.set_key_max(&1, 8).unwrap();
    assert!(l.try_acquire_key_n(&1, 8).unwrap().is_allowed());
    assert_eq!(l.in_flight_key(&1), 0, "the acquisition was dropped");
    // A cost of 0 takes nothing: a unit request's decision, a permit of nothing.
    let keys = l.len();
    let zero = l.try_acquire_key_n(&2, 0).unwrap();
    assert!(zero.is_allowed());
    assert_eq!(zero.decision().remaining(), 3);
    assert_eq!(
        (l.in_flight_key(&2), l.len()),
        (0, keys),
        "nothing taken, no key stored"
    );
    drop(zero);
    assert_eq!(l.in_flight_key(&2), 0);
}

#[test]
fn lowering_the_maximum_strands_nothing_and_raising_it_admits_at_once() {
    let l = limiter(4, 16, WhenFull::RejectNew);
    let held: Vec<_> = (0..4)
        .map(|_| l.try_acquire_key(&1).into_permit().unwrap())
        .collect();
    l.set_max(2).unwrap();
    assert_eq!((l.max(), l.in_flight_key(&1)), (2, 4));
    let d = l.try_acquire_key(&1).decision();
    assert_eq!((d.is_allowed(), d.limit(), d.remaining()), (false, 2, 0));
    let mut held = held;
    held.truncate(2);
    assert_eq!(l.in_flight_key(&1), 2);
    assert!(!l.try_acquire_key(&1).is_allowed());
    held.truncate(1);
    assert!(l.try_acquire_key(&1).is_allowed());
    l.set_max(5).unwrap();
    let more: Vec<_> = (0..4).map(|_| l.try_acquire_key(&1)).collect();
    assert!(more.iter().all(|a| a.is_allowed()));
    assert_eq!(l.in_flight_key(&1), 5);
    drop((held, more));
    assert_eq!(l.in_flight_key(&1), 0);
}

/// A table of 2 keys whose keys both hold permits: a third key is rejected
/// under `RejectNew` and `EvictLeastRecent` (nothing is evicted: both
/// holders still release into their own slots), admitted uncounted under
/// `AdmitUntracked`. Once a key's permits come back, it is reclaimed for
/// the new key.
#[test]
fn a_key_with_permits_out_is_never_reclaimed_nor_evicted() {
    for policy in [
        WhenFull::RejectNew,
        WhenFull::EvictLeastRecent,
        WhenFull::AdmitUntracked,
    ] {
        let l = limiter(2, 2, policy);
        assert_eq!(l.when_full(), policy);
        let a = l.try_acquire_key_n(&1, 2).unwrap().into_permit().unwrap();
        let b = l.try_acquire_key(&2).into_permit().unwrap();
        assert_eq!(l.retain_active(), 0);
        let peek = l.peek_key(&3);
        let c = l.try_acquire_key(&3);
        assert_eq!(peek.tracking(), c.decision().tracking(), "{policy:?}");
        match policy {
            WhenFull::AdmitUntracked => {
                assert!(c.is_allowed());
                assert_eq!(c.decision().tracking(), Tracking::Untracked);
                assert_eq!(l.in_flight_key(&3), 0, "an untracked permit counts nothing");
            }
            _ => {
                assert!(!c.is_allowed());
                assert_eq!(c.decision().tracking(), Tracking::Rejected);
                assert!(c.decision().retry_after() > Duration::ZERO);
            }
        }
        drop(c);
        assert_eq!((l.in_flight_key(&1), l.in_flight_key(&2)), (2, 1));
        drop(b);
        // Key 2 is idle: key 3 takes its place.
        let c = l.try_acquire_key_n(&3, 2).unwrap();
        assert_eq!(
            (c.is_allowed(), c.decision().tracking()),
            (true, Tracking::Tracked)
        );
        assert_eq!((l.in_flight_key(&3), l.len()), (2, 2));
        drop((a, c));
        assert_eq!((l.in_flight_key(&1), l.in_flight_key(&3)), (0, 0));
        assert_eq!(l.retain_active(), 2);
        assert!(l.is_empty());
    }
}

#[test]
fn a_key_of_its_own_keeps_its_maximum_across_changes() {
    let l = limiter(1, 16, WhenFull::RejectNew);
    l.set_key_max(&7, 3).unwrap();
    let held: Vec<_> = (0..3).map(|_| l.try_acquire_key(&7)).collect();
    assert!(held.iter().all(|a| a.is_allowed()));
    l.set_max(2).unwrap();
    assert_eq!((l.key_max(&7), l.key_max(&8)), (3, 2));
    l.clear_key_max(&7);
    assert_eq!(l.key_max(&7), 2);
    assert_eq!(
        l.in_flight_key(&7),
        3,
        "clearing the maximum strands no permit"
    );
    assert!(!l.try_acquire_key(&7).is_allowed());
    drop(held);
    assert_eq!(l.in_flight_key(&7), 0);
}

#[test]
fn a_panic_releases_the_permit_once() {
    let l = Arc::new(limiter(2, 16, WhenFull::RejectNew));
    let l2 = Arc::clone(&l);
    let r = std::thread::spawn(move || {
        let _p = l2.try_acquire_key_n(&1, 2).unwrap().into_permit().unwrap();
        assert_eq!(l2.in_flight_key(&1), 2);
        panic!("handler failed");
    })
    .join();
    assert!(r.is_err());
    assert_eq!(l.in_flight_key(&1), 0);
    assert!(l.try_acquire_key_n(&1, 2).unwrap().is_allowed());
}

#[test]
fn a_dropped_future_releases_its_permit() {
    let l = Arc::new(limiter(1, 16, WhenFull::RejectNew));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let inner = Arc::clone(&l);
    let r = rt.block_on(async move {
        let held = async move {
            let _permit: OwnedKeyedPermit<u64, ManualClock> = inner
                .try_acquire_key_owned_n(&1, 1)
                .unwrap()
                .into_permit()
                .unwrap();
            tokio::time::sleep(Duration::from_secs(3600)).await;
        };
        tokio::time::timeout(Duration::from_millis(20), held).await
    });
    assert!(r.is_err(), "the timeout cancelled the future");
    assert_eq!(l.in_flight_key(&1), 0);
    let p = l
        .try_acquire_key_owned_n(&1, 1)
        .unwrap()
        .into_permit()
        .unwrap();
    rt.block_on(async move { tokio::spawn(async move { drop(p) }).await })
        .unwrap();
    assert_eq!(l.in_flight_key(&1), 0);
}

#[test]
fn permits_are_send_and_owned_ones_static() {
    fn send<T: Send>() {}
    fn send_static<T: Send + 'static>() {}
    send::<KeyedPermit<'_, String>>();
    send_static::<OwnedKeyedPermit<String>>();
    send_static::<OwnedKeyedPermit<(u32, &'static str), ManualClock>>();
}

/// A denial's `retry_after` (and every decision's `reset_after`) is the
/// observed mean hold time, over the permits of every key.
#[test]
fn the_hold_time_hint_is_the_mean_hold_time() {
    let clock = ManualClock::new();
    let l = KeyedConcurrencyLimiter::<u64, _>::builder(1)
        .clock(clock.clone())
        .build()
        .unwrap();
    let p = l.try_acquire_key(&1);
    let d = l.try_acquire_key(&1).decision();
    assert_eq!(d.retry_after(), Duration::from_nanos(1), "no sample yet");
    clock.advance(Duration::from_millis(80));
    drop(p);
    assert_eq!(l.mean_hold_time(), Duration::from_millis(80));
    let q = l.try_acquire_key(&2);
    clock.advance(Duration::from_millis(160));
    drop(q);
    assert_eq!(l.mean_hold_time(), Duration::from_millis(90)); // 80 + (160 - 80) / 8
    let _held = l.try_acquire_key(&1);
    let d = l.try_acquire_key(&1).decision();
    assert_eq!(
        (d.retry_after(), d.reset_after()),
        (Duration::from_millis(90), Duration::from_millis(90))
    );
    assert_eq!(l.peek_key(&1).retry_after(), Duration::from_millis(90));
}

/// 4 threads, 3 keys of maximum 2 (and one key of its own maximum, 3):
/// no key ever has more holders than its maximum, and every count returns
/// to 0.
#[test]
fn threads_never_exceed_a_keys_maximum() {
    let l = Arc::new(
        KeyedConcurrencyLimiter::<u64>::builder(2)
            .max_keys(2)
            .build()
            .unwrap(),
    );
    l.set_key_max(&2, 3).unwrap();
    let holders: Arc<Vec<AtomicU64>> = Arc::new((0..3).map(|_| AtomicU64::new(0)).collect());
    let admitted = Arc::new(AtomicU64::new(0));
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let (l, holders, admitted) =
                (Arc::clone(&l), Arc::clone(&holders), Arc::clone(&admitted));
            std::thread::spawn(move || {
                for i in 0..20_000u64 {
                    let key = (i + t) % 3;
                    let a = l.try_acquire_key(&key);
                    if let Some(p) = a.into_permit() {
                        // SeqCst: a test-side count, checked against the limit.
                        let before = holders[key as usize].fetch_add(1, Ordering::SeqCst);
                        assert!(
                            before < l.key_max(&key),
                            "key {key}: {} holders",
                            before + 1
                        );
                        admitted.fetch_add(1, Ordering::Relaxed);
                        holders[key as usize].fetch_sub(1, Ordering::SeqCst);
                        drop(p);
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert!(admitted.load(Ordering::Relaxed) > 0);
    for key in 0..3 {
        assert_eq!(l.in_flight_key(&key), 0);
    }
    assert!(l.len() <= 2);
}

/// A wait for a keyed permit sleeps for the hold-time hint between tries
/// and returns the permit once a holder releases; a cost above the key's
/// maximum ends it at once; a hint longer than the time left ends a wait
/// with a timeout at once, taking nothing.
#[test]
fn a_wait_returns_the_permit_when_one_comes_back() {
    use ratewall::wait::{Wait, WaitError};
    use std::time::Instant;

    let l = Arc::new(KeyedConcurrencyLimiter::<u64>::new(1).unwrap());
    let held = l
        .try_acquire_key_owned_n(&7, 1)
        .unwrap()
        .into_permit()
        .unwrap();
    let start = Instant::now();
    let t = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(30));
        drop(held);
    });
    let wait = Wait::new().timeout(Duration::from_secs(10));
    let permit = wait.blocking(|| l.try_acquire_key_n(&7, 1)).unwrap();
    assert!(start.elapsed() >= Duration::from_millis(25));
    assert_eq!((permit.units(), l.in_flight_key(&7)), (1, 1));
    t.join().unwrap();
    assert!(matches!(
        wait.blocking(|| l.try_acquire_key_n(&7, 2)),
        Err(WaitError::InsufficientCapacity(InsufficientCapacity {
            requested: 2,
            capacity: 1
        }))
    ));
    drop(permit);
    assert_eq!(l.in_flight_key(&7), 0);

    // A mean hold time of 10 s against a timeout of 50 ms: no sleep at all.
    let clock = ManualClock::new();
    let slow = KeyedConcurrencyLimiter::<u64, _>::builder(1)
        .clock(clock.clone())
        .build()
        .unwrap();
    let p = slow.try_acquire_key(&1);
    clock.advance(Duration::from_secs(10));
    drop(p);
    let _busy = slow.try_acquire_key(&1);
    let start = Instant::now();
    let r = Wait::new()
        .timeout(Duration::from_millis(50))
        .blocking(|| slow.try_acquire_key_n(&1, 1));
    match r {
        Err(
            e @ WaitError::NoPermit {
                last: Some(d),
                requested: 1,
                max: 1,
                ..
            },
        ) => {
            assert_eq!(d.retry_after(), Duration::from_secs(10));
            // A permit has no time at which it is due: none is named.
            assert!(!e.to_string().contains("next chance"), "{e}");
        }
        other => panic!("expected a deadline, got {other:?}"),
    }
    assert!(start.elapsed() < Duration::from_millis(50));
    assert_eq!(slow.in_flight_key(&1), 1, "the failed wait took nothing");
}

/// The async wait (feature `wait`) with an owned permit, which the task
/// then keeps.
#[cfg(feature = "wait")]
#[test]
fn an_async_wait_returns_an_owned_permit() {
    use ratewall::wait::Wait;

    let l = Arc::new(KeyedConcurrencyLimiter::<String>::new(2).unwrap());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let first = l
        .try_acquire_key_owned_n("t", 2)
        .unwrap()
        .into_permit()
        .unwrap();
    let l2 = Arc::clone(&l);
    let permit = rt.block_on(async move {
        let release = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            drop(first);
        });
        let p = Wait::new()
            .timeout(Duration::from_secs(10))
            .until(|| l2.try_acquire_key_owned_n("t", 1))
            .await
            .unwrap();
        release.await.unwrap();
        p
    });
    assert_eq!((permit.units(), l.in_flight_key("t")), (1, 1));
    drop(permit);
    assert_eq!(l.in_flight_key("t"), 0);
}
