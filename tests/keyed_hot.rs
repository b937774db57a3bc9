//! Hot keys of a keyed token bucket (`KeyedBuilder::hot_keys`): the exact
//! bound per key with many holders, promotion, demotion (slot reassignment)
//! and give-backs on a `ManualClock`; conservation of units; the worst-case
//! false denial (units stranded in stripes); and the plain table's decisions
//! when leasing is off.

use proptest::prelude::*;
use ratewall::{Clock, HotKeys, KeyedTokenBucket, LeaseOptions, ManualClock, Rate, WhenFull};
use std::time::Duration;

#[path = "support/bound.rs"]
mod bound;
use bound::assert_bound;

type Table = KeyedTokenBucket<u64, ManualClock>;

fn table(
    t_ns: u64,
    burst: u64,
    slots: usize,
    stripes: usize,
    max_lease: u64,
    gap: Duration,
) -> Table {
    let lease = LeaseOptions::new()
        .stripes(stripes)
        .max_lease(max_lease)
        .hot_gap(gap);
    KeyedTokenBucket::<u64, _>::builder(Rate::new(1, Duration::from_nanos(t_ns)).burst(burst))
        .max_keys(16)
        .shards(1)
        .seed(7)
        .when_full(WhenFull::RejectNew)
        .hot_keys(HotKeys::new(slots).lease(lease).cool_after(Duration::ZERO))
        .clock(ManualClock::new())
        .build()
        .unwrap()
}

#[derive(Clone, Copy, Debug)]
enum Op {
    Check { key: u8, holder: u8 },
    CheckN { key: u8, n: u8 },
    Promote { key: u8 },
    Demote { key: u8 },
    Advance { ns: u32 },
}

fn op(t_ns: u64, keys: u8) -> impl Strategy<Value = Op> {
    prop_oneof![
        10 => (0..keys, any::<u8>()).prop_map(|(key, holder)| Op::Check { key, holder }),
        1 => (0..keys, 1u8..4).prop_map(|(key, n)| Op::CheckN { key, n }),
        2 => (0..keys).prop_map(|key| Op::Promote { key }),
        1 => (0..keys).prop_map(|key| Op::Demote { key }),
        3 => (0..(3 * t_ns) as u32).prop_map(|ns| Op::Advance { ns }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Up to three keys share one or two hot slots of up to four stripes:
    /// keys are promoted (taking over slots whose key is demoted), demoted,
    /// checked from many holders and with costs above 1, while time moves.
    /// Per key, every interval keeps the exact bound; in frozen time a unit
    /// admission takes exactly one unit of the key (`available_key_at`), a
    /// promotion and a demotion none of a key that keeps them, and no other
    /// key gains any; a denial leaves at most the units held in stripes
    /// (`slots * stripes * (max_lease - 1)`); `remaining` never over-counts;
    /// a peek at a stripe predicts the check at that stripe, every field (with
    /// one stripe per slot, so does the thread's own peek).
    #[test]
    fn the_bound_is_exact_per_key_with_promotion_and_demotion(
        (t_ns, burst, slots, stripes, max_lease, gap, ops) in (1u64..500, 1u64..24, 1usize..3, 1usize..5)
            .prop_flat_map(|(t, b, sl, s)| (
                Just(t), Just(b), Just(sl), Just(s), 1..=b.min(8),
                prop_oneof![Just(0u64), Just(u64::MAX / 4), 0..(20 * t)],
                prop::collection::vec(op(t, 3), 1..200),
            ))
    ) {
        let l = table(t_ns, burst, slots, stripes, max_lease, Duration::from_nanos(gap));
        let clock = l.clock().clone();
        let stranded_max = (slots * stripes) as u64 * (max_lease - 1);
        let mut logs: [Vec<u64>; 3] = Default::default();
        for op in ops {
            let now = clock.now();
            let avail = |k: u64| l.available_key_at(&k, now);
            let before: Vec<u64> = (0..3).map(avail).collect();
            match op {
                Op::Advance { ns } => {
                    clock.advance(Duration::from_nanos(ns.into()));
                    continue;
                }
                Op::Promote { key } => {
                    let _ = l.promote_key(&u64::from(key));
                    // A demoted key may lose units (non-tail leases strand);
                    // no key gains any.
                    for k in 0..3u64 {
                        prop_assert!(avail(k) <= before[k as usize]);
                    }
                    prop_assert_eq!(avail(u64::from(key)), before[usize::from(key)]);
                }
                Op::Demote { key } => {
                    let _ = l.demote_key(&u64::from(key));
                    for k in 0..3u64 {
                        prop_assert!(avail(k) <= before[k as usize]);
                    }
                    prop_assert!(!l.is_hot_key(&u64::from(key)));
                }
                Op::CheckN { key, n } => {
                    let k = u64::from(key);
                    let d = l.check_key_n_at(&k, now, n.into());
                    if let Ok(d) = d {
                        if d.is_allowed() {
                            logs[usize::from(key)].extend((0..n).map(|_| now));
                            prop_assert_eq!(avail(k) + u64::from(n), before[usize::from(key)]);
                        }
                    }
                }
                Op::Check { key, holder } => {
                    let k = u64::from(key);
                    // One stripe: the thread's peek is the check's; any number:
                    // the peek at the check's stripe is.
                    let peek = (stripes == 1).then(|| l.peek_key(&k));
                    let at_stripe = l.peek_key_at_stripe(&k, holder.into(), now);
                    let d = l.check_key_at_stripe(&k, holder.into(), now);
                    if let Some(p) = peek {
                        prop_assert_eq!(p, d, "peek predicts check");
                    }
                    prop_assert_eq!(at_stripe, d, "the peek at its stripe predicts the check");
                    let after: Vec<u64> = (0..3).map(avail).collect();
                    for other in (0..3).filter(|&o| o != usize::from(key)) {
                        prop_assert!(after[other] <= before[other], "key {} gained units", other);
                    }
                    let (b, a) = (before[usize::from(key)], after[usize::from(key)]);
                    if d.is_allowed() {
                        logs[usize::from(key)].push(now);
                        prop_assert_eq!(a + 1, b, "an admission takes one unit");
                        prop_assert!(d.remaining() <= a, "{:?} vs {}", d, a);
                        prop_assert!(d.remaining() + stranded_max >= a, "{:?} vs {}", d, a);
                    } else {
                        prop_assert!(b <= stranded_max, "denied with {} units available", b);
                        prop_assert_eq!(a, b);
                        prop_assert_eq!(d.remaining(), 0);
                        prop_assert!(d.retry_after() > Duration::ZERO);
                    }
                    prop_assert!(a <= burst);
                }
            }
        }
        for log in &logs {
            assert_bound(log, burst, t_ns);
        }
    }

    /// One hot key that stays hot: no false denial at all (a check whose
    /// stripe and entry are empty uses the key's units in the other
    /// stripes), and the bound holds.
    #[test]
    fn a_key_that_stays_hot_is_never_falsely_denied(
        (t_ns, burst, stripes, max_lease, ops) in (1u64..500, 1u64..24, 1usize..5)
            .prop_flat_map(|(t, b, s)| (
                Just(t), Just(b), Just(s), 1..=b.min(8),
                prop::collection::vec(op(t, 1), 1..200),
            ))
    ) {
        let l = table(t_ns, burst, 1, stripes, max_lease, Duration::from_secs(3600));
        let clock = l.clock().clone();
        let _ = l.check_key_at(&0, 0);
        prop_assert!(l.promote_key(&0));
        let mut log = vec![0];
        for op in ops {
            let now = clock.now();
            match op {
                Op::Advance { ns } => clock.advance(Duration::from_nanos(ns.into())),
                Op::Check { holder, .. } => {
                    let before = l.available_key_at(&0, now);
                    let d = l.check_key_at_stripe(&0, holder.into(), now);
                    if d.is_allowed() {
                        log.push(now);
                    } else {
                        prop_assert_eq!(before, 0, "false denial: {} units available", before);
                    }
                }
                _ => {}
            }
        }
        assert_bound(&log, burst, t_ns);
    }

    /// Hot keys with leases of one unit decide every check exactly as the
    /// plain keyed table does, every field, promoted or not.
    #[test]
    fn max_lease_one_is_the_plain_keyed_table(
        t_ns in 1u64..500,
        burst in 1u64..20,
        ops in prop::collection::vec(op(100, 3), 1..150),
    ) {
        let l = table(t_ns, burst, 2, 3, 1, Duration::from_secs(3600));
        let clock = l.clock().clone();
        let plain = KeyedTokenBucket::<u64, _>::builder(Rate::new(1, Duration::from_nanos(t_ns)).burst(burst))
            .max_keys(16).shards(1).seed(7).clock(ManualClock::new()).build().unwrap();
        for op in ops {
            let now = clock.now();
            match op {
                Op::Advance { ns } => clock.advance(Duration::from_nanos(ns.into())),
                Op::Promote { key } => { let _ = l.promote_key(&u64::from(key)); }
                Op::Demote { key } => prop_assert_eq!(l.demote_key(&u64::from(key)), 0),
                Op::CheckN { key, n } => prop_assert_eq!(
                    l.check_key_n_at(&u64::from(key), now, n.into()),
                    plain.check_key_n_at(&u64::from(key), now, n.into())
                ),
                Op::Check { key, holder } => prop_assert_eq!(
                    l.check_key_at_stripe(&u64::from(key), holder.into(), now),
                    plain.check_key_at(&u64::from(key), now)
                ),
            }
        }
    }
}

/// The worst-case false denial, measured. `h` stripes of key 0's hot slot
/// each hold a full lease of `k - 1` units. While the key stays hot, none is
/// lost: every unit of the burst is admitted before the first denial. When
/// the key is demoted, the tail lease goes back and the other `h - 1` leases
/// strand their `(h - 1) * (k - 1)` units: exactly that many checks are
/// falsely denied, and one burst's time later every unit is back.
#[test]
fn worst_case_false_denial_is_the_stranded_leases_of_a_demoted_key() {
    for (h, k) in [(2usize, 4u64), (4, 8), (8, 16)] {
        let burst = 1000;
        let build = || table(1_000_000, burst, 1, h, k, Duration::from_secs(3600));
        // Leaving one stripe holding k - 1 takes k checks: takes of 1, 2,
        // ..., k, each lease used up but the last.
        let per_stripe = k;
        for demote in [false, true] {
            let l = build();
            let _ = l.check_key_at(&1, 0); // another key, untouched below
            let _ = l.check_key_at(&0, 0);
            assert!(l.promote_key(&0));
            let mut admitted = 1;
            for s in 0..h {
                let before = l.available_key_at(&0, 0);
                let mut size = 1;
                loop {
                    assert!(l.check_key_at_stripe(&0, s, 0).is_allowed());
                    admitted += 1;
                    if size == k {
                        break;
                    }
                    for _ in 1..size {
                        assert!(l.check_key_at_stripe(&0, s, 0).is_allowed());
                        admitted += 1;
                    }
                    size *= 2;
                }
                assert_eq!(before - l.available_key_at(&0, 0), per_stripe);
            }
            let held = h as u64 * (k - 1);
            assert_eq!(
                l.available_key_at(&0, 0),
                burst - admitted,
                "units conserved"
            );
            let stranded = if demote {
                assert_eq!(l.demote_key(&0), k - 1, "the tail lease goes back");
                (h as u64 - 1) * (k - 1)
            } else {
                0
            };
            // Check (on stripe 0) until the first denial.
            let mut more = 0;
            while l.check_key_at_stripe(&0, 0, 0).is_allowed() {
                more += 1;
            }
            assert_eq!(
                admitted + more + stranded,
                burst,
                "h = {h}, k = {k}, demoted: {demote}, held: {held}"
            );
            assert_eq!(l.available_key_at(&0, 0), stranded);
            // A burst's time later, every unit is back in the table.
            l.clock().advance(Duration::from_secs(1));
            let now = l.now();
            assert_eq!(l.available_key_at(&0, now), burst);
            assert_eq!(l.available_key_at(&1, now), burst);
        }
    }
}

/// Bad hot-key options are typed errors; quota changes are refused with hot
/// keys; refunds do nothing there.
#[test]
fn bad_options_and_unsupported_calls() {
    let r = Rate::per_second(10).burst(5);
    for hot in [
        HotKeys::new(0),
        HotKeys::new(65),
        HotKeys::new(2).lease(LeaseOptions::new().stripes(0)),
        HotKeys::new(2).lease(LeaseOptions::new().max_lease(6)),
    ] {
        let e = KeyedTokenBucket::<u64>::builder(r)
            .hot_keys(hot)
            .build()
            .unwrap_err();
        assert!(
            matches!(e, ratewall::ConfigError::Incompatible { .. }),
            "{e}"
        );
    }
    let l = KeyedTokenBucket::<u64, _>::builder(r)
        .hot_keys(HotKeys::new(64))
        .clock(ManualClock::new())
        .build()
        .unwrap();
    let plain = KeyedTokenBucket::<u64>::builder(r).build().unwrap();
    assert!(
        l.memory_bytes() >= plain.memory_bytes() + 64 * 128,
        "64 slots of at least one 128-byte stripe each: {} vs {}",
        l.memory_bytes(),
        plain.memory_bytes()
    );
    assert!(l.set_quota(Rate::per_second(20)).is_err());
    assert!(l.set_key_quota(&1, Rate::per_second(20)).is_err());
    assert!(l.check_key(&1).is_allowed());
    l.refund_key(&1, 1);
    assert_eq!(l.available_key_at(&1, 0), 4, "the refund did nothing");
}

/// A key's lease that is not the tail of its entry is never given back
/// when another key's install takes its stripe over: units below a live
/// lease of the same key would count twice once time passes (a refund
/// under a lease). They are dropped and come back as their time passes.
#[test]
fn another_keys_install_drops_a_lease_that_is_not_the_tail() {
    let l = table(1_000_000, 100, 1, 2, 4, Duration::from_secs(3600));
    let (a, b) = (1u64, 2u64);
    let _ = (l.check_key_at(&a, 0), l.check_key_at(&b, 0));
    assert!(l.promote_key(&b));
    // B: stripe 0 takes 1, then 2 (holds 1); stripe 1 the same, above it.
    for s in [0, 1] {
        assert!(l.check_key_at_stripe(&b, s, 0).is_allowed());
        assert!(l.check_key_at_stripe(&b, s, 0).is_allowed());
    }
    assert_eq!(l.available_key_at(&b, 0), 100 - 1 - 4);
    // A takes the slot (cool-off 0): B's tail lease (stripe 1) goes back.
    assert!(l.promote_key(&a));
    assert!(!l.is_hot_key(&b));
    assert_eq!(
        l.available_key_at(&b, 0),
        100 - 1 - 4,
        "a tail give-back conserves"
    );
    // A's install on stripe 0 takes B's other lease over: not B's tail, so
    // its unit is dropped, not given back.
    assert!(l.check_key_at_stripe(&a, 0, 0).is_allowed());
    assert!(l.check_key_at_stripe(&a, 0, 0).is_allowed());
    assert_eq!(l.available_key_at(&b, 0), 100 - 1 - 4 - 1);
    l.clock().advance(Duration::from_millis(100));
    let now = l.now();
    assert_eq!(
        l.available_key_at(&b, now),
        100,
        "back a burst's time later"
    );
}

/// Threads on a frozen clock hammer one key (promoted, and contended so
/// that another key is promoted on its own): never more than the burst
/// admitted per key, and what is admitted plus what is left never exceeds
/// it (a lost install race may leave fresh units to expire unused).
#[test]
fn threads_on_a_frozen_clock_never_exceed_the_burst() {
    use std::sync::Arc;
    let burst = 20_000;
    let l = Arc::new(table(1_000, burst, 2, 4, 64, Duration::from_secs(3600)));
    let _ = (l.check_key_at(&7, 0), l.check_key_at(&8, 0));
    assert!(l.promote_key(&7));
    let workers: Vec<_> = (0..4)
        .map(|_| {
            let l = Arc::clone(&l);
            std::thread::spawn(move || {
                let mut admitted = [0u64; 2];
                for i in 0..10_000u64 {
                    let k = 7 + (i & 1);
                    admitted[(i & 1) as usize] += u64::from(l.check_key(&k).is_allowed());
                }
                admitted
            })
        })
        .collect();
    let mut admitted = [1u64, 1];
    for w in workers {
        let a = w.join().unwrap();
        admitted[0] += a[0];
        admitted[1] += a[1];
    }
    for (k, a) in [(7u64, admitted[0]), (8, admitted[1])] {
        assert!(a <= burst, "key {k}: {a} admitted");
        let left = l.available_key_at(&k, 0);
        assert!(a + left <= burst, "key {k}: {a} admitted, {left} left");
    }
}

/// A table with one hot slot of `stripes` stripes, leases of at most
/// `max_lease`, handed over after `cool_after`, on a manual clock.
fn one_slot(rate: Rate, stripes: usize, max_lease: u64, cool_after: Duration) -> Table {
    let lease = LeaseOptions::new().stripes(stripes).max_lease(max_lease);
    KeyedTokenBucket::<u64, _>::builder(rate)
        .hot_keys(HotKeys::new(1).lease(lease).cool_after(cool_after))
        .clock(ManualClock::new())
        .build()
        .unwrap()
}

/// A slot is taken over only once its key took no lease for `cool_after`;
/// a promotion that found every slot busy does not look again for a
/// quarter of `cool_after`; a demotion frees the slot at once.
#[test]
fn a_slot_changes_hands_only_when_its_key_cooled() {
    let l = one_slot(
        Rate::per_second(1000).burst(100),
        2,
        4,
        Duration::from_secs(1),
    );
    let clock = l.clock().clone();
    let _ = (l.check_key(&1), l.check_key(&2));
    assert!(l.promote_key(&1));
    assert!(l.check_key_at_stripe(&1, 0, 0).is_allowed()); // a take: key 1 active
    assert!(!l.promote_key(&2), "key 1 is not cold");
    clock.advance(Duration::from_millis(999));
    assert!(!l.promote_key(&2), "not yet");
    clock.advance(Duration::from_millis(1));
    assert!(
        !l.promote_key(&2),
        "cold, but the last look at 999 ms holds for 250 ms"
    );
    clock.advance(Duration::from_millis(248));
    assert!(!l.promote_key(&2), "1248 ms");
    clock.advance(Duration::from_millis(1));
    assert!(
        l.promote_key(&2),
        "1249 ms: looked again, and key 1 is cold"
    );
    assert!(l.is_hot_key(&2) && !l.is_hot_key(&1));
    assert_eq!(l.demote_key(&2), 0);
    assert!(l.promote_key(&1), "a demotion frees the slot at once");
}

#[test]
fn available_without_hot_keys_is_the_entrys_count() {
    let l = KeyedTokenBucket::<u64, _>::builder(Rate::per_hour(1).burst(5))
        .clock(ManualClock::new())
        .build()
        .unwrap();
    assert_eq!(l.available_key_at(&1, 0), 5, "a new key: the whole burst");
    for left in (0..5).rev() {
        assert!(l.check_key_at(&1, 0).is_allowed());
        assert_eq!(l.available_key_at(&1, 0), left);
    }
    assert!(!l.check_key_at(&1, 0).is_allowed());
    assert_eq!(l.available_key_at(&1, 0), 0, "a denied key has nothing");
}

#[test]
fn a_cooled_keys_leases_go_back_to_its_entry_when_its_slot_changes_hands() {
    // Slow refill (1/s), so the entry cannot refill in the 2 ms below: what
    // it holds after the hand-over is what the hand-over gave back.
    let l = one_slot(
        Rate::per_second(1).burst(100),
        1,
        8,
        Duration::from_millis(1),
    );
    let clock = l.clock().clone();
    let _ = (l.check_key(&1), l.check_key(&2));
    assert!(l.promote_key(&1));
    for _ in 0..20 {
        assert!(l.check_key_at_stripe(&1, 0, 0).is_allowed());
    }
    let available = l.available_key_at(&1, 0);
    assert_eq!(available, 100 - 21);
    clock.advance(Duration::from_millis(2));
    assert!(l.promote_key(&2), "key 1 cooled: its slot goes to key 2");
    assert!(!l.is_hot_key(&1));
    // Key 1 is plain again: its entry alone answers, and holds every unit.
    let d = l.check_key(&1);
    assert!(d.is_allowed());
    assert_eq!(d.remaining(), available - 1, "the lease was given back");
}

#[test]
fn a_key_two_threads_contend_for_becomes_hot() {
    // Promotion on a lost compare-exchange: two threads on one key of a
    // real clock lose one within a bounded number of checks (bounded in
    // time too, so a machine that never runs them at once fails, not hangs).
    let l = KeyedTokenBucket::<u64>::builder(Rate::per_second(1_000_000_000).burst(1 << 20))
        .hot_keys(HotKeys::new(1))
        .build()
        .unwrap();
    let _ = l.check_key(&7);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| {
                while !l.is_hot_key(&7) && std::time::Instant::now() < deadline {
                    for _ in 0..1_000 {
                        let _ = l.check_key(&7);
                    }
                }
            });
        }
    });
    assert!(
        l.is_hot_key(&7),
        "two threads checking one key for 10 s never contended"
    );
    assert!(!l.is_hot_key(&8));
}

#[test]
fn debug_shows_how_many_keys_are_hot() {
    let l = KeyedTokenBucket::<u64, _>::builder(Rate::per_second(10))
        .hot_keys(HotKeys::new(2))
        .clock(ManualClock::new())
        .build()
        .unwrap();
    let _ = (l.check_key(&1), l.check_key(&2));
    assert!(format!("{l:?}").contains("hot: 0"), "{l:?}");
    assert!(l.promote_key(&1));
    assert!(format!("{l:?}").contains("hot: 1"), "{l:?}");
}

#[test]
fn hot_slots_memory_is_linear_in_slots_and_stripes() {
    let bytes = |slots: Option<usize>, stripes: usize| {
        let b = KeyedTokenBucket::<u64, _>::builder(Rate::per_second(10))
            .max_keys(1_000)
            .clock(ManualClock::new());
        let b = match slots {
            Some(n) => b.hot_keys(HotKeys::new(n).lease(LeaseOptions::new().stripes(stripes))),
            None => b,
        };
        b.build().unwrap().memory_bytes()
    };
    let plain = bytes(None, 1);
    let stripe = bytes(Some(1), 2) - bytes(Some(1), 1);
    assert!(stripe >= 64, "a stripe is a cache line or more: {stripe}");
    assert_eq!(bytes(Some(1), 3) - bytes(Some(1), 2), stripe);
    assert_eq!(bytes(Some(2), 2) - bytes(Some(2), 1), 2 * stripe);
    let slot = bytes(Some(2), 1) - bytes(Some(1), 1);
    assert!(slot > stripe, "a slot is its stripes and more: {slot}");
    assert_eq!(bytes(Some(3), 1) - bytes(Some(2), 1), slot);
    assert_eq!(bytes(Some(4), 1) - bytes(Some(3), 1), slot);
    let fixed = bytes(Some(1), 1) - plain - slot;
    assert!(
        fixed > 0 && fixed < 4096,
        "the hot set's own fields: {fixed}"
    );
}
