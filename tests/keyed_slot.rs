//! The keyed table's 8-byte slot (issue 24): what its packed state gives up
//! and keeps. Time in a slot is modular, so the table's own wrap sweep must
//! reclaim an idle key before its old time reads as current again (each
//! test below would see a stale key come back without it); limits a slot
//! cannot hold are refused with a typed error that says what to change.

use ratewall::{
    ConfigError, KeyedFixedWindow, KeyedLeakyBucket, KeyedSlidingWindowCounter, KeyedTokenBucket,
    ManualClock, Rate, SlidingWindowCounter, Tracking, Window,
};
use std::time::Duration;

const S: u64 = 1_000_000_000;

/// A token bucket's TAT is kept modulo 2^40 ns (its burst window is small,
/// so its unit is 1 ns): exactly 2^40 ns later, an unswept TAT would read
/// as the same time ahead of `now` as when it was stored, and deny.
#[test]
fn an_idle_bucket_does_not_come_back_after_its_time_wraps() {
    let clock = ManualClock::new();
    let l = KeyedTokenBucket::<u64, _>::builder(Rate::per_second(1).burst(1))
        .clock(clock.clone())
        .build()
        .unwrap();
    assert!(l.check_key(&1).is_allowed());
    clock.advance(Duration::from_millis(500));
    assert!(
        !l.check_key(&1).is_allowed(),
        "the bucket is empty for 0.5 s"
    );
    clock.advance(Duration::from_nanos(1 << 40));
    let d = l.check_key(&1);
    assert!(d.is_allowed(), "an hour-old TAT read as current: {d:?}");
    assert_eq!(d.tracking(), Tracking::Tracked);
    // The same for the leaky bucket, whose meter is the same word.
    let leaky = KeyedLeakyBucket::<u64, _>::builder(Rate::per_second(1).burst(1))
        .clock(clock.clone())
        .build()
        .unwrap();
    assert!(leaky.check_key(&1).is_allowed());
    clock.advance(Duration::from_nanos(1 << 40));
    assert!(leaky.check_key(&1).is_allowed());
}

/// A fixed window's id is kept modulo 2^16: 2^16 windows later, an unswept
/// full window would read as the current one.
#[test]
fn a_full_fixed_window_does_not_come_back_2_16_windows_later() {
    let clock = ManualClock::new();
    let l = KeyedFixedWindow::<u64, _>::builder(Window::per_second(2))
        .clock(clock.clone())
        .build()
        .unwrap();
    assert!(l.check_key_n(&1, 2).unwrap().is_allowed());
    assert!(!l.check_key(&1).is_allowed());
    clock.advance(Duration::from_secs(1 << 16));
    let d = l.check_key(&1);
    assert!(d.is_allowed(), "{d:?}");
    assert_eq!(d.remaining(), 1);
}

/// The sliding counter's id is kept modulo 2^12 (its counts keep 14 bits
/// each), and its previous window (id - 1) is read back as well.
#[test]
fn a_full_sliding_window_does_not_come_back_2_12_windows_later() {
    let clock = ManualClock::new();
    let l = KeyedSlidingWindowCounter::<u64, _>::builder(Window::per_second(2))
        .clock(clock.clone())
        .build()
        .unwrap();
    assert!(l.check_key_n(&1, 2).unwrap().is_allowed());
    for later in [(1 << 12) - 1, 1] {
        // First one window short of the wrap: the full window would then
        // read as the previous one and still weigh; then exactly at it.
        clock.advance(Duration::from_secs(later));
        let d = l.peek_key(&1);
        assert_eq!(d.remaining(), 1, "after {later} s more: {d:?}");
    }
}

/// No insert needed: checks of other keys drive the sweep, which rewrites
/// an idle key's word within its period (2^37 ns here: a 2 s burst window
/// keeps 1 ns units) over one shard, so that a check of it 2^40 ns after
/// its last one finds it fresh (unswept, its TAT would read as 1 s ahead
/// again). The key stays tracked, as any idle key until an insert needs
/// its slot.
#[test]
fn checks_of_other_keys_sweep_an_idle_key_within_the_period() {
    let clock = ManualClock::new();
    let l = KeyedTokenBucket::<u64, _>::builder(Rate::per_second(1).burst(2))
        .shards(1)
        .max_keys(16)
        .clock(clock.clone())
        .build()
        .unwrap();
    assert!(l.check_key_n(&1, 2).unwrap().is_allowed());
    assert!(l.check_key(&2).is_allowed());
    assert_eq!(l.len(), 2);
    // Key 2 is checked every minute; key 1 goes idle.
    let mut t = 0;
    while t < 1u64 << 40 {
        clock.advance(Duration::from_secs(60));
        t += 60 * S;
        assert!(l.check_key(&2).is_allowed());
    }
    assert_eq!(l.len(), 2, "idle keys stay tracked");
    // 2^40 ns and a bit after key 1's TAT (2 s): unswept, its word would
    // read as about 2 s ahead (both tokens in use).
    let d = l.peek_key(&1);
    assert_eq!(
        (d.remaining(), d.tracking()),
        (1, Tracking::Tracked),
        "{d:?}"
    );
}

/// A keyed token bucket's unit grows with its burst window (4x headroom
/// for quota changes); a per-key quota or a quota change beyond the range
/// the table was built for is refused, saying what to change; within it,
/// accepted.
#[test]
fn quotas_beyond_the_tables_range_are_refused_with_a_typed_error() {
    let l = KeyedTokenBucket::<u64>::builder(Rate::per_second(10).burst(10))
        .build()
        .unwrap();
    // Built for a 1 s burst window: its range is 2^38 ns (4.6 min).
    l.set_key_quota(&1, Rate::per_minute(60).burst(240))
        .unwrap();
    let err = l
        .set_key_quota(&2, Rate::per_hour(10).burst(10))
        .unwrap_err();
    assert!(
        matches!(err, ConfigError::KeyedSlot { value, bound, .. } if value == 3600 * S && bound == 1 << 38),
        "{err:?}"
    );
    assert!(
        err.to_string()
            .contains("build the table with the largest quota"),
        "{err}"
    );
    let err = l.set_quota(Rate::per_hour(10).burst(10)).unwrap_err();
    assert!(matches!(err, ConfigError::KeyedSlot { .. }), "{err:?}");
    assert_eq!(l.quota(), Rate::per_second(10).burst(10), "unchanged");
    // A table built for an hour-long window takes hourly quotas, in 64 ns
    // units, but not a rate whose interval is under 2^10 units.
    let hourly = KeyedTokenBucket::<u64>::builder(Rate::per_hour(100))
        .build()
        .unwrap();
    hourly.set_quota(Rate::per_hour(400)).unwrap();
    let err = hourly
        .set_key_quota(&1, Rate::per_second(100_000))
        .unwrap_err();
    assert!(
        matches!(err, ConfigError::KeyedSlot { value: 10_000, .. }),
        "{err:?}"
    );
    // A burst whose unit would exceed 0.1% of the interval: refused at build.
    let err = KeyedTokenBucket::<u64>::builder(Rate::per_second(1).burst(1 << 27))
        .build()
        .unwrap_err();
    assert!(matches!(err, ConfigError::KeyedSlot { .. }), "{err:?}");
}

/// Window counters keep every limit the unkeyed ones take (a sliding
/// counter's 14-bit counts, a fixed window's 24-bit count), and keep their
/// window length: a change of it is refused.
#[test]
fn window_counters_keep_their_limits_and_their_window_length() {
    let big = Window::new(16_383, Duration::from_secs(1));
    assert!(SlidingWindowCounter::new(big).is_ok());
    let l = KeyedSlidingWindowCounter::<u64, _>::builder(big)
        .clock(ManualClock::new())
        .build()
        .unwrap();
    assert!(l.check_key_n(&1, 16_383).unwrap().is_allowed());
    assert!(!l.check_key(&1).is_allowed());
    assert!(l.set_quota(Window::per_second(100)).is_ok());
    assert!(l.set_key_quota(&1, big).is_ok());
    assert!(matches!(
        l.set_quota(Window::per_minute(100)),
        Err(ConfigError::Incompatible { .. })
    ));
    let fixed = KeyedFixedWindow::<u64>::builder(Window::per_second(100))
        .build()
        .unwrap();
    assert!(fixed
        .set_key_quota(&1, Window::new(1 << 20, Duration::from_secs(1)))
        .is_ok());
    assert!(matches!(
        fixed.set_key_quota(&1, Window::per_minute(100)),
        Err(ConfigError::Incompatible { .. })
    ));
}

/// A monotonic clock the test moves (`ManualClock` is not monotonic: it
/// floors readings at explicit instants, so time never goes back there).
#[derive(Debug, Clone, Default)]
struct SteadyClock(std::sync::Arc<std::sync::atomic::AtomicU64>);

impl ratewall::Clock for SteadyClock {
    fn now(&self) -> u64 {
        self.0.load(std::sync::atomic::Ordering::SeqCst)
    }
    fn is_monotonic(&self) -> bool {
        true
    }
}

/// An explicit instant far ahead of a monotonic clock makes the wrap sweep
/// due (one shard, period 2^37 ns: about 137 s), but the sweep judges idle
/// keys at the clock's own time, where key 1 still holds its token until
/// 60 s. Judged at the explicit instant (150 s), key 1 was idle and was
/// rewritten as idle then (a TAT 2^37 ns before 150 s, about 12.6 s), so a
/// check at the clock's 20 s admitted it: usage forgotten.
#[test]
fn an_explicit_instant_ahead_of_the_clock_keeps_the_usage_held_at_the_clocks_time() {
    let clock = SteadyClock::default();
    let l = KeyedTokenBucket::<u64, _>::builder(Rate::per_minute(1).burst(1))
        .shards(1)
        .max_keys(16)
        .clock(clock.clone())
        .build()
        .unwrap();
    assert!(l.check_key(&1).is_allowed());
    assert!(!l.check_key(&1).is_allowed());
    assert!(l.check_key_at(&2, 150 * S).is_allowed());
    clock.0.store(20 * S, std::sync::atomic::Ordering::SeqCst);
    let d = l.check_key(&1);
    assert!(!d.is_allowed(), "key 1's token is in use until 60 s: {d:?}");
    assert_eq!(d.retry_after(), Duration::from_secs(40));
    clock.0.store(60 * S, std::sync::atomic::Ordering::SeqCst);
    assert!(l.check_key(&1).is_allowed());
    // Key 2, used at the explicit instant only, was left as it was: at
    // 150 s it has no token left.
    assert!(!l.check_key_at(&2, 150 * S).is_allowed());
    assert_eq!(l.len(), 2);
}
