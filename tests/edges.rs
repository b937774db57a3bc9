//! Regression tests for issue 15: the keyed tables and the header helper at
//! their edges (a full table, a refunded key, a rejected new key, eviction,
//! peek, header values). Each test reproduces one finding through the public
//! API on a `ManualClock`; each failed on the code before the fix.

use ratewall::{
    KeyedSlidingWindowLog, KeyedTokenBucket, ManualClock, Policy, Rate, TokenBucket, Tracking,
    WhenFull, Window,
};
use std::time::Duration;

fn token_table(
    rate: Rate,
    max_keys: usize,
    policy: WhenFull,
    clock: &ManualClock,
) -> KeyedTokenBucket<u64, ManualClock> {
    KeyedTokenBucket::<u64, _>::builder(rate)
        .max_keys(max_keys)
        .shards(1)
        .when_full(policy)
        .clock(clock.clone())
        .build()
        .unwrap()
}

/// Finding 1: a keyed log key whose entries were all refunded is idle, and a
/// new key takes its place instead of evicting an active key.
#[test]
fn keyed_log_reclaims_a_refunded_key_before_evicting() {
    // The hash seed decides which of the equally old keys key 8 evicts; try
    // several, and refund a key the table still holds.
    for seed in 0..16 {
        let clock = ManualClock::new();
        let log = KeyedSlidingWindowLog::<u64>::builder(Window::new(5, Duration::from_secs(1)))
            .max_keys(6)
            .when_full(WhenFull::EvictLeastRecent)
            .seed(seed)
            .clock(clock.clone())
            .build()
            .unwrap();
        let script = [(0, 5), (1, 1), (2, 3), (4, 1), (6, 1), (7, 1), (8, 1)];
        for (i, &(key, cost)) in script.iter().enumerate() {
            let d = log.check_key_n(&key, cost).unwrap();
            assert!(d.is_allowed());
            let expect = if i < 6 {
                Tracking::Tracked
            } else {
                Tracking::EvictedOther
            };
            assert_eq!(d.tracking(), expect, "seed {seed}, key {key}");
        }
        assert_eq!(log.len(), 6);
        // A held cost-1 key has 3 left for a unit peek; an evicted one 4.
        let held = [7u64, 1, 4, 6]
            .into_iter()
            .find(|k| log.peek_key_n(k, 1).unwrap().remaining() == 3)
            .expect("a cost-1 key is still held");
        log.refund_key(&held, 1);
        let d = log.check_key(&5);
        assert!(d.is_allowed());
        assert_eq!(
            d.tracking(),
            Tracking::Tracked,
            "seed {seed}: key {held} is idle, 5 other keys are active"
        );
        assert_eq!(log.len(), 6);
    }
}

/// Finding 1, second half: a rejected new key of a full keyed log is told
/// the time until the first key goes idle (not 1 ns), and is admitted then.
#[test]
fn keyed_log_rejection_says_when_a_slot_frees() {
    let clock = ManualClock::new();
    let log = KeyedSlidingWindowLog::<u64>::builder(Window::new(5, Duration::from_secs(1)))
        .max_keys(3)
        .when_full(WhenFull::RejectNew)
        .clock(clock.clone())
        .build()
        .unwrap();
    for key in 0..3 {
        assert!(log.check_key(&key).is_allowed());
        clock.advance(Duration::from_millis(100));
    }
    // Key 0 expires at 1 s, key 1 at 1.1 s, key 2 at 1.2 s; now is 0.3 s.
    assert!(log.check_key(&0).is_allowed()); // key 0 now expires at 1.3 s
    let d = log.check_key(&9);
    assert!(!d.is_allowed());
    assert_eq!(d.tracking(), Tracking::Rejected);
    assert_eq!(
        d.retry_after(),
        Duration::from_millis(800),
        "key 1 at 1.1 s"
    );
    clock.advance(d.retry_after() - Duration::from_nanos(1));
    assert_eq!(log.check_key(&9).tracking(), Tracking::Rejected);
    assert_eq!(log.check_key(&9).retry_after(), Duration::from_nanos(1));
    clock.advance(Duration::from_nanos(1));
    let d = log.check_key(&9);
    assert!(d.is_allowed());
    assert_eq!(d.tracking(), Tracking::Tracked);
}

/// Finding 2: a rejected new key's `retry_after` is the time until the held
/// key goes idle, and a check then is admitted.
#[test]
fn rejected_new_key_retries_when_the_held_key_goes_idle() {
    let clock = ManualClock::starting_at(Duration::from_nanos(4));
    let l = token_table(
        Rate::new(3, Duration::from_nanos(3)).burst(9),
        1,
        WhenFull::RejectNew,
        &clock,
    );
    assert!(l.check_key(&2).is_allowed());
    let d = l.check_key(&1);
    assert!(!d.is_allowed());
    assert_eq!(d.tracking(), Tracking::Rejected);
    assert_eq!(d.retry_after(), Duration::from_nanos(1));
    clock.advance(d.retry_after());
    let d = l.check_key(&1);
    assert!(d.is_allowed());
    assert_eq!(d.tracking(), Tracking::Tracked);
}

/// Finding 3: `EvictLeastRecent` evicts the key with the least time to idle
/// (whatever the hash seed, which decides the keys' slots).
#[test]
fn eviction_takes_the_key_closest_to_idle() {
    for seed in 0..16 {
        let clock = ManualClock::starting_at(Duration::from_nanos(1_000_000_000_000_003));
        let l =
            KeyedTokenBucket::<u64, _>::builder(Rate::new(8, Duration::from_nanos(48)).burst(3))
                .max_keys(2)
                .when_full(WhenFull::EvictLeastRecent)
                .seed(seed)
                .clock(clock.clone())
                .build()
                .unwrap();
        assert!(l.check_key_n(&2, 3).unwrap().is_allowed()); // idle in 18 ns
        assert!(l.check_key_n(&0, 2).unwrap().is_allowed()); // idle in 12 ns
        let d = l.check_key_n(&3, 3).unwrap();
        assert!(d.is_allowed());
        assert_eq!(d.tracking(), Tracking::EvictedOther);
        // Key 2 is still held (empty bucket); key 0 was evicted (a new key).
        assert!(
            !l.peek_key(&2).is_allowed(),
            "seed {seed}: key 2 was evicted"
        );
        assert_eq!(l.peek_key(&2).tracking(), Tracking::Tracked);
        let p0 = l.peek_key(&0);
        assert_eq!(
            (p0.is_allowed(), p0.remaining(), p0.tracking()),
            (true, 2, Tracking::EvictedOther)
        );
    }
}

/// Finding 4: `peek_key` of a new key on a full table predicts `check_key`,
/// under every policy; and peeks of held keys predict their checks too.
#[test]
fn peek_predicts_check_on_a_full_table() {
    for policy in [
        WhenFull::RejectNew,
        WhenFull::AdmitUntracked,
        WhenFull::EvictLeastRecent,
    ] {
        let clock = ManualClock::new();
        let l = token_table(Rate::per_second(1).burst(2), 2, policy, &clock);
        let _ = (l.check_key(&1), l.check_key(&2));
        let peek = l.peek_key(&3);
        let check = l.check_key(&3);
        assert_eq!(peek, check, "{policy:?}");
        assert_eq!(peek.tracking(), check.tracking(), "{policy:?}");
        let expect = match policy {
            WhenFull::RejectNew => Tracking::Rejected,
            WhenFull::AdmitUntracked => Tracking::Untracked,
            _ => Tracking::EvictedOther,
        };
        assert_eq!(check.tracking(), expect);
        let peek = l.peek_key(&2);
        assert_eq!(peek, l.check_key(&2), "{policy:?}: a held key");
        // A cost of 0 takes nothing, so it never meets the full table.
        let peek = l.peek_key_n(&4, 0).unwrap();
        assert_eq!(peek, l.check_key_n(&4, 0).unwrap(), "{policy:?}");
        assert_eq!(peek.tracking(), Tracking::Tracked);
    }
    // The keyed log as well.
    let clock = ManualClock::new();
    let log = KeyedSlidingWindowLog::<u64>::builder(Window::per_second(2))
        .max_keys(1)
        .clock(clock.clone())
        .build()
        .unwrap();
    let _ = log.check_key(&1);
    let peek = log.peek_key_n(&2, 1).unwrap();
    let check = log.check_key(&2);
    assert_eq!(
        (peek, peek.tracking(), peek.retry_after()),
        (check, Tracking::Rejected, Duration::from_secs(1))
    );
    assert_eq!(check.tracking(), Tracking::Rejected);
    // A cost of 0 takes nothing: it never meets the full shard.
    let peek = log.peek_key_n(&2, 0).unwrap();
    assert_eq!(peek, log.check_key_n(&2, 0).unwrap());
    assert_eq!(
        (peek.tracking(), peek.is_allowed()),
        (Tracking::Tracked, true)
    );
    assert_eq!(log.len(), 1);
    clock.advance(Duration::from_secs(1));
    assert_eq!(log.peek_key_n(&2, 1).unwrap().tracking(), Tracking::Tracked);
}

/// Finding 5: a policy name can never put CR, LF or another control
/// character into a header value; quotes and backslashes are escaped.
#[test]
fn header_values_cannot_be_injected() {
    let bucket = TokenBucket::with_clock(Rate::per_second(10), ManualClock::new()).unwrap();
    let policy = Policy::token_bucket(Rate::per_second(10));
    let d = bucket.check();
    let err = d
        .ratelimit_header("a\r\nSet-Cookie: x=1", &policy)
        .unwrap_err();
    assert_eq!((err.position, err.character), (1, '\r'));
    assert!(err.to_string().contains("printable ASCII"));
    assert_eq!(
        d.ratelimit_header(r#"we "quote" \ this"#, &policy).unwrap(),
        r#""we \"quote\" \\ this";r=9;t=1"#
    );
}
