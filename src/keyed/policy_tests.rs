//! Unit tests of `policy.rs` (the keyed policy limiter and the policy
//! values it is built from).

use super::*;
use crate::quota::{Rate, Window};
use crate::ManualClock;
use std::time::Duration;

fn all_policies() -> [Policy; 5] {
    [
        Policy::token_bucket(Rate::per_second(4)),
        Policy::leaky_bucket(Rate::per_second(4)),
        Policy::fixed_window(Window::per_second(4)),
        Policy::sliding_window_counter(Window::per_second(4)),
        Policy::sliding_window_log(Window::per_second(4)),
    ]
}

#[test]
fn each_policy_builds_its_own_algorithm_and_limits_at_its_limit() {
    for policy in all_policies() {
        let l = KeyedPolicyLimiter::<u8, _>::builder(policy)
            .max_keys(64)
            .clock(ManualClock::new())
            .build()
            .unwrap();
        assert_eq!(l.policy(), policy);
        for i in 0..4 {
            let d = l.check_key(&1);
            assert!(d.is_allowed(), "{policy:?} check {i}");
            assert_eq!(d.limit(), 4);
            assert_eq!(d.remaining(), 3 - i);
        }
        assert!(!l.check_key(&1).is_allowed(), "{policy:?}");
        assert!(
            l.check_key(&2).is_allowed(),
            "{policy:?}: keys are separate"
        );
        let inner_name = dispatch!(&l.inner, x => format!("{x:?}"));
        let expected = match policy.algorithm() {
            PolicyAlgorithm::SlidingWindowLog => "KeyedSlidingWindowLog",
            _ => "KeyedLimiter",
        };
        assert!(inner_name.starts_with(expected), "{inner_name}");
    }
}

#[test]
fn builder_knobs_reach_the_table() {
    for policy in all_policies() {
        let l = KeyedPolicyLimiter::<u8, _>::builder(policy)
            .max_keys(1)
            .shards(1)
            .when_full(WhenFull::AdmitUntracked)
            .seed(3)
            .clock(ManualClock::new())
            .build()
            .unwrap();
        assert_eq!((l.max_keys(), l.when_full()), (1, WhenFull::AdmitUntracked));
        let _ = l.check_key(&1);
        assert_eq!(
            l.check_key(&2).tracking(),
            crate::Tracking::Untracked,
            "{policy:?}"
        );
        assert_eq!(l.len(), 1);
        assert!(!l.is_empty());
    }
}

#[test]
fn validation_matches_the_typed_constructors() {
    let bad = [
        (
            Policy::token_bucket(Rate::per_second(0)),
            ConfigError::ZeroRate,
        ),
        (
            Policy::leaky_bucket(Rate::per_second(1).burst(0)),
            ConfigError::ZeroBurst,
        ),
        (
            Policy::fixed_window(Window::per_second(0)),
            ConfigError::ZeroLimit,
        ),
        (
            Policy::sliding_window_counter(Window::new(5, Duration::ZERO)),
            ConfigError::ZeroPeriod,
        ),
        (
            Policy::sliding_window_log(Window::per_second(0)),
            ConfigError::ZeroLimit,
        ),
    ];
    for (policy, err) in bad {
        assert_eq!(policy.validate(), Err(err.clone()), "{policy:?}");
        assert_eq!(
            KeyedPolicyLimiter::<u8>::builder(policy)
                .max_keys(64)
                .build()
                .unwrap_err(),
            err,
            "{policy:?}"
        );
    }
    for policy in all_policies() {
        assert_eq!(policy.validate(), Ok(()));
    }
}

#[test]
fn span_is_the_window_or_the_time_to_refill_the_burst() {
    assert_eq!(
        Policy::token_bucket(Rate::per_minute(60).burst(10)).span(),
        Duration::from_secs(10)
    );
    assert_eq!(
        Policy::sliding_window_log(Window::per_hour(3)).span(),
        Duration::from_secs(3600)
    );
    assert_eq!(
        Policy::token_bucket(Rate::per_second(0)).span(),
        Duration::from_secs(1)
    );
}

#[test]
fn refund_reset_and_peek_reach_every_algorithm() {
    for policy in all_policies() {
        let clock = ManualClock::new();
        let l = KeyedPolicyLimiter::<u8, _>::builder(policy)
            .max_keys(64)
            .clock(clock.clone())
            .build()
            .unwrap();
        assert_eq!(l.check_key_n(&1, 3).unwrap().remaining(), 1);
        assert_eq!(l.peek_key(&1).remaining(), 0, "{policy:?}");
        l.refund_key(&1, 2);
        assert_eq!(l.peek_key_n(&1, 1).unwrap().remaining(), 2, "{policy:?}");
        l.refund_key_at(&1, l.now(), 1);
        assert_eq!(l.peek_key(&1).remaining(), 3, "{policy:?}");
        l.reset_key(&1);
        assert_eq!(l.peek_key(&1).remaining(), 3, "{policy:?}");
        assert!(l.check_key_n(&1, 5).is_err());
        assert!(l.check_key_n_at(&1, 0, 4).unwrap().is_allowed());
        clock.advance(Duration::from_secs(3));
        assert_eq!(l.retain_active(), 1, "{policy:?}");
        assert_eq!(l.len(), 0, "{policy:?}");
    }
}

/// A table loads a batch's slots ahead from 2 MiB of slots (1M keys: 12
/// MB), whatever its algorithm; the sliding log (per-key lists) never.
#[test]
// Tables of up to 1M keys: far too slow for miri's interpreter.
#[cfg_attr(miri, ignore)]
fn large_tables_of_every_counter_algorithm_load_ahead_and_the_log_never() {
    for policy in all_policies() {
        let build = |max_keys| {
            KeyedPolicyLimiter::<u64, _>::builder(policy)
                .max_keys(max_keys)
                .clock(ManualClock::new())
                .build()
                .unwrap()
        };
        let is_log = policy.algorithm() == PolicyAlgorithm::SlidingWindowLog;
        assert_eq!(build(1_000_000).prefetches(), !is_log, "{policy:?}");
        assert!(!build(1_000).prefetches(), "{policy:?}");
    }
}
