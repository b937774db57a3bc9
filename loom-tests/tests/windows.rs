#![cfg(ratewall_loom)]
//! Loom models of the window algorithms: the fixed and sliding counters'
//! one-word CAS, and the sliding log's slot claim (a per-key lock), each
//! racing checks against checks, refunds and quota changes.

use loom::sync::Arc;
use loom::thread;
use ratewall::{FixedWindow, ManualClock, SlidingWindowCounter, SlidingWindowLog, Window};
use std::time::Duration;

fn window(limit: u64) -> Window {
    Window::new(limit, Duration::from_secs(1))
}

/// Three threads race for two units: exactly two win, and the state says so.
macro_rules! three_threads_two_units {
    ($name:ident, $ty:ident) => {
        #[test]
        fn $name() {
            loom::model(|| {
                let clock = ManualClock::starting_at(Duration::from_millis(500));
                let l = Arc::new($ty::with_clock(window(2), clock).unwrap());
                let handles: Vec<_> = (0..2)
                    .map(|_| {
                        let l = l.clone();
                        thread::spawn(move || l.check().is_allowed())
                    })
                    .collect();
                let mine = l.check().is_allowed();
                let won = handles
                    .into_iter()
                    .map(|h| h.join().unwrap())
                    .chain([mine])
                    .filter(|&a| a)
                    .count();
                assert_eq!(won, 2);
                assert!(!l.peek().is_allowed(), "both units are recorded");
            });
        }
    };
}

three_threads_two_units!(fixed_cas_admits_exactly_the_limit, FixedWindow);
three_threads_two_units!(sliding_cas_admits_exactly_the_limit, SlidingWindowCounter);
three_threads_two_units!(log_slot_claim_admits_exactly_the_limit, SlidingWindowLog);

/// A refund racing a check: no update is lost. The check wins the unit iff
/// it ran after the refund, and the final state agrees with it.
macro_rules! refund_races_check {
    ($name:ident, $ty:ident) => {
        #[test]
        fn $name() {
            loom::model(|| {
                let clock = ManualClock::starting_at(Duration::from_millis(500));
                let l = Arc::new($ty::with_clock(window(1), clock).unwrap());
                assert!(l.check().is_allowed());
                let r = {
                    let l = l.clone();
                    thread::spawn(move || l.refund(1))
                };
                let won = l.check().is_allowed();
                r.join().unwrap();
                // Won: the unit is taken again. Lost: the refund came after
                // the check, so the unit is free now.
                assert_eq!(l.peek().is_allowed(), !won);
            });
        }
    };
}

refund_races_check!(fixed_refund_races_check, FixedWindow);
refund_races_check!(sliding_refund_races_check, SlidingWindowCounter);
refund_races_check!(log_refund_races_check, SlidingWindowLog);

/// A quota change (limit 2 -> 1) racing a check: the check is decided under
/// one quota or the other, and its unit is never lost by the rescale.
macro_rules! quota_change_races_check {
    ($name:ident, $ty:ident) => {
        #[test]
        fn $name() {
            loom::model(|| {
                let clock = ManualClock::starting_at(Duration::from_millis(500));
                let l = Arc::new($ty::with_clock(window(2), clock).unwrap());
                let q = {
                    let l = l.clone();
                    thread::spawn(move || l.set_quota(window(1)).unwrap())
                };
                let d = l.check();
                q.join().unwrap();
                assert!(d.is_allowed(), "a fresh key admits under either quota");
                assert!(d.limit() == 1 || d.limit() == 2);
                // One unit in use under limit 1: full.
                assert!(
                    !l.peek().is_allowed(),
                    "the admitted unit survived the rescale"
                );
                assert_eq!(l.quota(), window(1));
            });
        }
    };
}

quota_change_races_check!(fixed_quota_change_races_check, FixedWindow);
quota_change_races_check!(sliding_quota_change_races_check, SlidingWindowCounter);
quota_change_races_check!(log_quota_change_races_check, SlidingWindowLog);

/// The clock crosses a window boundary while two checks race: the stale
/// count of the old window is never read as current, and the new window
/// gets at most its limit.
#[test]
fn fixed_rollover_races_checks() {
    loom::model(|| {
        let clock = ManualClock::starting_at(Duration::from_millis(900));
        let l = Arc::new(FixedWindow::with_clock(window(1), clock.clone()).unwrap());
        assert!(l.check().is_allowed()); // window 0 is full
        let a = {
            let (l, clock) = (l.clone(), clock.clone());
            thread::spawn(move || {
                clock.set(Duration::from_millis(1100));
                l.check().is_allowed()
            })
        };
        let b = l.check().is_allowed();
        let a = a.join().unwrap();
        // Thread a's check is in window 1 and always wins it; b wins only
        // if it read the new time, and then a and b share window 1's one unit.
        assert!(a || b);
        assert!(!(a && b), "window 1 admitted two with a limit of one");
    });
}

/// Sliding counter across a boundary: the previous window's count carries
/// into the estimate whatever the interleaving.
#[test]
fn sliding_rollover_races_checks() {
    loom::model(|| {
        let clock = ManualClock::starting_at(Duration::from_millis(999));
        let l = Arc::new(SlidingWindowCounter::with_clock(window(2), clock.clone()).unwrap());
        assert!(l.check_n(2).unwrap().is_allowed()); // window 0: 2 at its very end
        let a = {
            let (l, clock) = (l.clone(), clock.clone());
            thread::spawn(move || {
                clock.set(Duration::from_millis(1500)); // prev weighs 2 * 0.5 = 1
                l.check().is_allowed()
            })
        };
        let b = l.check().is_allowed();
        let a = a.join().unwrap();
        // At 1.5 s one unit is free; at 0.999 s none. Never two.
        assert!(!(a && b), "one unit free at 1.5 s, none at 0.999 s");
        assert!(a || b);
    });
}
