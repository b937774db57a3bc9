#![cfg(ratewall_loom)]
//! Loom models of the concurrency limit's word: admission (one CAS),
//! release (one `fetch_sub`) and a change of the maximum, racing.

use loom::sync::atomic::{AtomicU64, Ordering};
use loom::sync::Arc;
use loom::thread;
use ratewall::{ConcurrencyLimiter, ManualClock};

fn limiter(max: u64) -> Arc<ConcurrencyLimiter<ManualClock>> {
    Arc::new(
        ConcurrencyLimiter::builder(max)
            .clock(ManualClock::new())
            .build()
            .unwrap(),
    )
}

/// One acquire-hold-release by a thread. `holders` is raised after the
/// admission and lowered before the release, so it never exceeds the units
/// in the word: if it ever passed the maximum the admission saw, two
/// permits would have been admitted past it.
fn hold_once(l: &ConcurrencyLimiter<ManualClock>, holders: &AtomicU64) -> bool {
    let a = l.try_acquire();
    let d = a.decision();
    match a.into_permit() {
        Some(permit) => {
            // SeqCst: a test-side counter; the strongest order keeps the
            // assertion about the word's order, not about this counter's.
            let before = holders.fetch_add(1, Ordering::SeqCst);
            assert!(
                before < d.limit(),
                "{} holders under a maximum of {}",
                before + 1,
                d.limit()
            );
            holders.fetch_sub(1, Ordering::SeqCst);
            drop(permit);
            true
        }
        None => false,
    }
}

/// Two threads, each running `hold_once` with one shared holder count.
fn two_holders(l: &Arc<ConcurrencyLimiter<ManualClock>>) -> Vec<thread::JoinHandle<bool>> {
    let holders = Arc::new(AtomicU64::new(0));
    (0..2)
        .map(|_| {
            let (l, holders) = (Arc::clone(l), Arc::clone(&holders));
            thread::spawn(move || hold_once(&l, &holders))
        })
        .collect()
}

/// Max 1, two threads: never two holders; every permit comes back once, so
/// the count returns to 0 and the next acquire passes.
#[test]
fn racing_acquires_admit_one_at_a_time_and_release_once() {
    loom::model(|| {
        let l = limiter(1);
        let handles = two_holders(&l);
        let admitted = handles.into_iter().map(|h| h.join().unwrap());
        // Each one was admitted or denied; at least the first always is.
        assert!(admitted.fold(false, |any, a| any | a));
        assert_eq!(l.in_flight(), 0);
        assert!(l.try_acquire().is_allowed());
    });
}

/// Max 2 lowered to 1 while two threads acquire and release: an admission
/// that saw the maximum 1 was alone, one that saw 2 had at most one other
/// holder; the change keeps the permits out (none stranded), and the count
/// returns to 0 with the new maximum in place.
#[test]
fn lowering_the_maximum_racing_acquires_and_releases() {
    loom::model(|| {
        let l = limiter(2);
        let handles = two_holders(&l);
        l.set_max(1).unwrap();
        for h in handles {
            h.join().unwrap();
        }
        assert_eq!((l.in_flight(), l.max()), (0, 1));
        let a = l.try_acquire();
        assert!(a.is_allowed());
        assert!(!l.try_acquire().is_allowed());
    });
}

/// A weighted permit of 2 racing a permit of 1 under a maximum of 2: at
/// most one of them holds at a time, and both give back exactly what they
/// took.
#[test]
fn weighted_permits_release_exactly_their_units() {
    loom::model(|| {
        let l = limiter(2);
        let big = {
            let l = Arc::clone(&l);
            thread::spawn(move || {
                let a = l.try_acquire_n(2).unwrap();
                let allowed = a.is_allowed();
                drop(a);
                allowed
            })
        };
        let small = {
            let l = Arc::clone(&l);
            thread::spawn(move || {
                let a = l.try_acquire();
                let in_flight = l.in_flight();
                assert!(in_flight <= 2, "{in_flight}");
                a.is_allowed()
            })
        };
        let (b, s) = (big.join().unwrap(), small.join().unwrap());
        assert!(b || s, "one of them always finds room");
        assert_eq!(l.in_flight(), 0);
        assert!(l.try_acquire_n(2).unwrap().is_allowed());
    });
}
