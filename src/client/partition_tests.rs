use super::super::announce::MAX_WINDOW;
use super::*;
use crate::clock::ManualClock;
use proptest::prelude::*;

fn table(capacity: usize) -> (Partitions<&'static str, ManualClock>, ManualClock) {
    let clock = ManualClock::new();
    (
        Partitions::with_clock(capacity, clock.clone()).unwrap(),
        clock,
    )
}

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

fn pause_of(s: u64) -> Announcement {
    Announcement {
        retry_after: Some(secs(s)),
        too_many_requests: true,
        ..Announcement::default()
    }
}

fn left(available: u64, within: Option<Duration>) -> Option<Remaining> {
    Some(Remaining { available, within })
}

fn announce(limit: u64, window: u64) -> Announcement {
    Announcement {
        quota: Some(Quota {
            limit,
            window: Some(secs(window)),
        }),
        ..Announcement::default()
    }
}

#[test]
fn a_429_pauses_until_the_upstream_says() {
    let (t, clock) = table(4);
    t.learn(&"a", &pause_of(5));
    assert_eq!(t.paused_for(&"a"), Some(secs(5)));
    assert_eq!(t.paused_for(&"b"), None, "partitions are separate");
    clock.advance(Duration::from_millis(4_500));
    assert_eq!(t.paused_for(&"a"), Some(Duration::from_millis(500)));
    clock.advance(Duration::from_millis(500));
    assert_eq!(t.paused_for(&"a"), None);
    assert_eq!(t.view(&"a").unwrap().refusals.too_many_requests, 1);
}

#[test]
fn r_zero_pauses_for_t() {
    let (t, clock) = table(4);
    let said = Announcement {
        remaining: left(0, Some(secs(3))),
        ..Announcement::default()
    };
    t.learn(&"a", &said);
    assert_eq!(t.paused_for(&"a"), Some(secs(3)));
    assert_eq!(t.view(&"a").unwrap().refusals.too_many_requests, 0);
    clock.advance(secs(3));
    assert_eq!(t.paused_for(&"a"), None);
}

#[test]
fn pauses_only_lengthen() {
    let (t, clock) = table(4);
    t.learn(&"a", &pause_of(10));
    clock.advance(secs(1));
    // A response sent before the 429 may arrive after it.
    t.learn(&"a", &pause_of(2));
    t.learn(&"a", &Announcement::default());
    assert_eq!(t.paused_for(&"a"), Some(secs(9)));
    t.learn(&"a", &pause_of(20));
    assert_eq!(t.paused_for(&"a"), Some(secs(20)));
}

#[test]
fn a_pause_never_reads_longer_than_the_clamp_after_a_step_back() {
    let (t, clock) = table(4);
    clock.advance(secs(1_000_000));
    t.learn(&"a", &pause_of(MAX_PAUSE.as_secs()));
    clock.step_back(secs(500_000));
    assert_eq!(t.paused_for(&"a"), Some(MAX_PAUSE));
    assert_eq!(t.view(&"a").unwrap().paused_for, Some(MAX_PAUSE));
}

#[test]
fn the_latest_quota_is_kept_and_paces_only_slower() {
    let (t, _) = table(4);
    let user = Rate::per_second(10);
    assert_eq!(t.pace(&"a", None), None);
    assert_eq!(t.pace(&"a", Some(user)), Some(user));
    // 4 per second: slower than the user's 10: it sets the pace, with
    // its burst of 4 (below the user's 10).
    t.learn(&"a", &announce(4, 1));
    let four = Rate::every(Duration::from_millis(250)).burst(4);
    assert_eq!(t.pace(&"a", Some(user)), Some(four));
    assert_eq!(t.pace(&"a", None), Some(four));
    // The upstream raises its quota to 100/s: the user's 10/s stays, with
    // its own burst of 10.
    t.learn(&"a", &announce(100, 1));
    assert_eq!(t.view(&"a").unwrap().quota.unwrap().limit, 100);
    assert_eq!(t.pace(&"a", Some(user)), Some(user));
    // Without a user pace, the announced one, burst 100.
    assert_eq!(
        t.pace(&"a", None),
        Some(Rate::every(Duration::from_millis(10)).burst(100))
    );
    // A user burst below the quota's is kept; a quota of 2 at once tightens it.
    let strict = Rate::per_second(1).burst(1);
    assert_eq!(t.pace(&"a", Some(strict)), Some(strict));
    t.learn(&"a", &announce(2, 1));
    assert_eq!(
        t.pace(&"a", Some(Rate::per_second(1))),
        Some(Rate::per_second(1))
    );
    assert_eq!(
        t.pace(&"a", Some(Rate::per_second(1).burst(50))),
        Some(Rate::per_second(1).burst(2))
    );
    // An announcement without quota keeps the last one.
    t.learn(&"a", &pause_of(0));
    assert_eq!(t.view(&"a").unwrap().quota.unwrap().limit, 2);
}

#[test]
fn announced_paces_round_the_interval_up() {
    let pace = |limit, window| {
        let quota = Quota {
            limit,
            window: Some(secs(window)),
        };
        announced_pace(quota, None)
    };
    let every = |d: Duration, burst| Some(Rate::every(d).burst(burst));
    assert_eq!(pace(3, 1), every(Duration::from_nanos(333_333_334), 3));
    assert_eq!(pace(100, 60), every(Duration::from_millis(600), 100));
    // Faster than one per ns: one per ns (a limiter accepts it).
    let huge = 999_999_999_999_999;
    assert_eq!(pace(huge, 1), every(Duration::from_nanos(1), huge));
    // One per 366 days: one per day at most (MAX_PAUSE), no slower.
    assert_eq!(pace(1, 366 * 86_400), every(MAX_PAUSE, 1));
    assert_eq!(pace(2, 2 * 86_400 + 2), every(MAX_PAUSE, 2));
    assert_eq!(pace(2, 2 * 86_400 - 2), every(secs(86_399), 2));
    // Several policies: the smallest windowed `q` bounds the burst, never
    // below 1 nor above the quota's own `q`.
    let day = Quota {
        limit: 1000,
        window: Some(secs(86_400)),
    };
    assert_eq!(
        announced_pace(day, Some(5)),
        every(Duration::from_millis(86_400), 5)
    );
    assert_eq!(announced_pace(day, Some(0)).unwrap().burst_size(), 1);
    assert_eq!(announced_pace(day, Some(5000)).unwrap().burst_size(), 1000);
    // No window: no pace.
    let windowless = Quota {
        limit: 5,
        window: None,
    };
    assert_eq!(announced_pace(windowless, None), None);
    assert_eq!(slower_pace(None, Some(windowless), None), None);
    let user = Rate::per_minute(1);
    assert_eq!(slower_pace(Some(user), Some(windowless), None), Some(user));
}

#[test]
fn the_least_recently_used_partition_is_evicted() {
    let (t, _) = table(2);
    t.record_wait(&"a");
    t.record_wait(&"b");
    t.record_wait(&"a");
    // A view is not a use: b stays the least recently used.
    assert!(t.view(&"b").is_some());
    let _ = t.views();
    t.record_wait(&"c");
    assert_eq!(t.len(), 2);
    assert!(t.view(&"b").is_none(), "b was the least recently used");
    assert_eq!(t.view(&"a").unwrap().waits, 2);
    assert_eq!(t.view(&"c").unwrap().waits, 1);
    // Eviction forgot b's state.
    t.record_wait(&"b");
    assert_eq!(t.view(&"b").unwrap().waits, 1);
    assert!(t.view(&"a").is_none());
}

#[test]
fn the_table_never_holds_more_than_its_capacity() {
    let clock = ManualClock::new();
    let t = Partitions::with_clock(8, clock).unwrap();
    for key in 0..1000u32 {
        t.learn(&key, &pause_of(1));
        assert!(t.len() <= 8);
    }
    assert_eq!(t.len(), 8);
    let mut kept: Vec<u32> = t.views().into_iter().map(|(k, _)| k).collect();
    kept.sort_unstable();
    assert_eq!(kept, (992..1000).collect::<Vec<_>>());
}

#[test]
fn remaining_is_shown_until_its_time_is_over() {
    let (t, clock) = table(4);
    let said = Announcement {
        remaining: left(7, Some(secs(10))),
        ..Announcement::default()
    };
    t.learn(&"a", &said);
    clock.advance(secs(4));
    let shown = t.view(&"a").unwrap().remaining.unwrap();
    assert_eq!((shown.available, shown.within), (7, Some(secs(6))));
    clock.advance(Duration::from_nanos(6_000_000_001));
    assert_eq!(t.view(&"a").unwrap().remaining, None);
    // Without a time, it stays until the next announcement.
    let said = Announcement {
        remaining: left(2, None),
        ..Announcement::default()
    };
    t.learn(&"a", &said);
    clock.advance(secs(100));
    assert_eq!(t.view(&"a").unwrap().remaining.unwrap().available, 2);
}

#[test]
fn the_view_prints_what_was_learned() {
    let (t, _) = table(4);
    let said = Announcement {
        quota: Some(Quota {
            limit: 100,
            window: Some(secs(60)),
        }),
        remaining: left(0, Some(secs(12))),
        retry_after: Some(secs(12)),
        too_many_requests: true,
        ..Announcement::default()
    };
    t.learn(&"a", &said);
    t.record_wait(&"a");
    // A 503 is a refusal too, counted apart.
    let unavailable = Announcement {
        unavailable: true,
        ..Announcement::default()
    };
    t.learn(&"a", &unavailable);
    t.learn(&"a", &unavailable);
    t.partition(&"a").record_retry();
    let shown = t.view(&"a").unwrap().to_string();
    assert_eq!(
        shown,
        "quota 100 per 60s, 0 left within 12s, paused 12s, 1 waits, 3 refused (429: 1, 503: 2), 1 retries"
    );
    t.learn(&"b", &Announcement::default());
    assert_eq!(
        t.view(&"b").unwrap().to_string(),
        "no quota announced, 0 waits, 0 refused (429: 0, 503: 0), 0 retries"
    );
    // Times print to the millisecond: 77.9 us into a 1 s pause reads
    // 1s, 0.6 ms in 999ms.
    let (t, clock) = table(4);
    let pause = Announcement {
        retry_after: Some(secs(1)),
        too_many_requests: true,
        ..Announcement::default()
    };
    t.learn(&"c", &pause);
    clock.advance(Duration::from_nanos(77_978));
    assert!(t.view(&"c").unwrap().to_string().contains(", paused 1s,"));
    clock.advance(Duration::from_nanos(522_022));
    assert!(t
        .view(&"c")
        .unwrap()
        .to_string()
        .contains(", paused 999ms,"));
}

#[test]
fn bad_capacities_are_typed_errors() {
    let zero = Partitions::<u8>::new(0).unwrap_err();
    assert_eq!(zero, PartitionsError::ZeroCapacity);
    assert!(zero.to_string().contains("at least 1"));
    let big = Partitions::<u8>::new(MAX_PARTITIONS + 1).unwrap_err();
    assert_eq!(
        big,
        PartitionsError::TooLarge {
            capacity: MAX_PARTITIONS + 1
        }
    );
    assert!(big.to_string().contains(&MAX_PARTITIONS.to_string()));
    assert!(Partitions::<u8>::new(MAX_PARTITIONS).is_ok());
}

#[test]
fn concurrent_learners_keep_the_latest_pause_end_and_every_count() {
    let (t, _) = table(4);
    std::thread::scope(|s| {
        for i in 1..=4u64 {
            let t = &t;
            s.spawn(move || {
                for j in 0..100 {
                    t.learn(&"a", &pause_of(i * 100 + j));
                    t.record_wait(&"a");
                }
            });
        }
    });
    let view = t.view(&"a").unwrap();
    assert_eq!((view.waits, view.refusals.too_many_requests), (400, 400));
    assert_eq!(view.paused_for, Some(secs(499)));
}

fn any_rate() -> impl Strategy<Value = Rate> {
    (1u64..=1_000_000, 1u64..=10u64.pow(12))
        .prop_map(|(c, p)| Rate::new(c, Duration::from_nanos(p)))
}

fn any_quota() -> impl Strategy<Value = Quota> {
    // Any quota, and often one slower than one a day (a hostile upstream's).
    let any = (1u64..=999_999_999_999_999, 1u64..=MAX_WINDOW.as_secs());
    let slow = (1u64..=400, 86_400u64..=MAX_WINDOW.as_secs());
    prop_oneof![any, slow].prop_map(|(limit, w)| Quota {
        limit,
        window: Some(secs(w)),
    })
}

proptest! {
    /// The pace is never faster than the user's, nor than the quota's
    /// `q` per `w`, and is one of the two.
    #[test]
    fn the_pace_is_the_slower_one(user in any_rate(), quota in any_quota()) {
        let pace = slower_pace(Some(user), Some(quota), None).unwrap();
        // rate = count / period; compare pace <= user as a cross product.
        let (pc, pp) = (u128::from(pace.count()), pace.period().as_nanos());
        let (uc, up) = (u128::from(user.count()), user.period().as_nanos());
        prop_assert!(pc * up <= uc * pp, "{pace:?} faster than the user's {user:?}");
        let w = quota.window.unwrap().as_nanos();
        let announced = announced_pace(quota, None).unwrap();
        // One of the two rates, with the smaller burst.
        let burst = user.burst_size().min(quota.limit);
        prop_assert_eq!(pace.burst_size(), burst);
        let same_rate = |r: Rate| (r.count(), r.period());
        let a_rate = same_rate(announced);
        prop_assert!(same_rate(pace) == same_rate(user) || same_rate(pace) == a_rate);
        prop_assert_eq!(announced.burst_size(), quota.limit);
        let ap = announced.period().as_nanos();
        prop_assert!(pc * ap <= pp, "{pace:?} faster than the announced {announced:?}");
        if same_rate(pace) == a_rate && same_rate(user) != a_rate {
            // At most q per w (the interval times q covers w), unless that
            // would be slower than one per MAX_PAUSE: then one per MAX_PAUSE.
            let max = MAX_PAUSE.as_nanos();
            prop_assert!(pp * u128::from(quota.limit) >= w || pp == max, "{pace:?}");
        }
        // No announcement paces slower than one per MAX_PAUSE.
        prop_assert!(ap <= MAX_PAUSE.as_nanos(), "{announced:?}");
        // Every announced pace builds a limiter (the layer's local pace).
        let bucket = crate::limiter::TokenBucket::with_clock(announced, ManualClock::new());
        prop_assert!(bucket.is_ok(), "{announced:?}: {bucket:?}");
    }

    /// Whatever is learned, in whatever order, a partition's pause never
    /// reads longer than MAX_PAUSE, and ends once MAX_PAUSE has passed
    /// since the last announcement.
    #[test]
    fn a_pause_never_exceeds_the_clamp(
        steps in proptest::collection::vec((0u64..u64::MAX, 0u64..100_000_000_000, any::<bool>()), 1..40)
    ) {
        let (t, clock) = table(2);
        for (retry, advance_ns, limited) in steps {
            let said = Announcement {
                retry_after: Some(Duration::from_secs(retry).min(MAX_PAUSE)),
                too_many_requests: limited,
                ..Announcement::default()
            };
            t.learn(&"a", &said);
            prop_assert!(t.paused_for(&"a").unwrap_or_default() <= MAX_PAUSE);
            clock.advance(Duration::from_nanos(advance_ns));
        }
        clock.advance(MAX_PAUSE);
        prop_assert_eq!(t.paused_for(&"a"), None);
    }
}
