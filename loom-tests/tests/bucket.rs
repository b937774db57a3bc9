//! Loom models of the bucket's CAS protocol (`AtomicWord::update`) and of a
//! quota change racing checks (`ParamCell`), through the public API.
#![cfg(ratewall_loom)]

use loom::sync::Arc;
use loom::thread;
use ratewall::{ManualClock, Rate, TokenBucket};
use std::time::Duration;

fn bucket(rate: Rate) -> Arc<TokenBucket<ManualClock>> {
    Arc::new(TokenBucket::with_clock(rate, ManualClock::new()).unwrap())
}

/// Two threads race for a bucket of 3: exactly 3 of 4 checks pass, whatever
/// the interleaving (the loser of a CAS recomputes from the value it saw).
#[test]
fn racing_checks_admit_exactly_the_burst() {
    loom::model(|| {
        let b = bucket(Rate::per_second(1).burst(3));
        let handles: Vec<_> = (0..2)
            .map(|_| {
                let b = b.clone();
                thread::spawn(move || (0..2).filter(|_| b.check().is_allowed()).count())
            })
            .collect();
        let admitted: usize = handles.into_iter().map(|h| h.join().unwrap()).sum();
        assert_eq!(admitted, 3);
        assert!(!b.peek().is_allowed());
    });
}

/// A refund racing a check: the refunded unit is available to exactly one
/// later check, never two.
#[test]
fn refund_racing_a_check_gives_back_one_unit() {
    loom::model(|| {
        let b = bucket(Rate::per_hour(1).burst(2));
        assert!(b.check_n(2).unwrap().is_allowed());
        let r = {
            let b = b.clone();
            thread::spawn(move || b.refund(1))
        };
        let c = {
            let b = b.clone();
            thread::spawn(move || b.check().is_allowed())
        };
        r.join().unwrap();
        let first = c.join().unwrap();
        let second = b.check().is_allowed();
        assert!(first ^ second, "one unit came back: {first} {second}");
        assert!(!b.check().is_allowed());
    });
}

/// A quota change racing a check: the check is decided wholly under the old
/// quota or wholly under the new one (never T_old with burst_new), and the
/// tokens in use survive the change.
#[test]
fn quota_change_racing_a_check_is_old_or_new_never_mixed() {
    loom::model(|| {
        let b = bucket(Rate::per_second(10).burst(2)); // T = 100 ms
        assert!(b.check().is_allowed());
        let w = {
            let b = b.clone();
            thread::spawn(move || b.set_quota(Rate::per_second(1).burst(4)).unwrap())
            // T = 1 s
        };
        let c = {
            let b = b.clone();
            thread::spawn(move || b.check())
        };
        w.join().unwrap();
        let d = c.join().unwrap();
        assert!(d.is_allowed());
        match d.limit() {
            // Old quota, then rescaled: 2 units of 100 ms became 2 units of 1 s.
            2 => {
                assert_eq!(
                    (d.remaining(), d.reset_after()),
                    (0, Duration::from_millis(200))
                );
                assert_eq!(b.peek().reset_after(), Duration::from_secs(3));
            }
            // New quota: 1 unit in use (1 s) plus this one.
            4 => {
                assert_eq!(
                    (d.remaining(), d.reset_after()),
                    (2, Duration::from_secs(2))
                );
                assert_eq!(b.peek().reset_after(), Duration::from_secs(3));
            }
            other => panic!("limit {other}: neither quota"),
        }
    });
}
