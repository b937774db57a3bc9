#![cfg(ratewall_loom)]
//! Loom models of waiting for a concurrency permit: the waiters mark in the
//! word, the queue under its lock, and the hand-off of released units.
//! A lost wake-up shows as a deadlock (every thread parked), which loom
//! reports as a failure.

use loom::thread;
use ratewall::wait::Wait;
use ratewall::{ConcurrencyLimiter, ManualClock};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Waker};

fn limiter(max: u64, fair: bool) -> Arc<ConcurrencyLimiter<ManualClock>> {
    let b = ConcurrencyLimiter::builder(max).clock(ManualClock::new());
    let b = if fair { b.fair_waiting() } else { b };
    Arc::new(b.build().unwrap())
}

/// A release racing a waiter's registration (its try at once, its entry,
/// the mark, its park): whichever comes first, the waiter is woken and
/// holds the unit; afterwards the count is 0 and the mark is gone (a fair
/// newcomer tries at once and passes).
#[test]
fn a_release_racing_a_waiters_registration_is_never_lost() {
    loom::model(|| {
        let l = limiter(1, true);
        let held = l.try_acquire_owned().into_permit().unwrap();
        let releaser = thread::spawn(move || drop(held));
        let permit = Wait::new().blocking(l.acquire()).unwrap();
        assert_eq!(l.in_flight(), 1);
        drop(permit);
        releaser.join().unwrap();
        assert_eq!(l.in_flight(), 0);
        assert!(Wait::new().blocking(l.acquire()).is_ok());
    });
}

/// A waiter that registered, then is dropped while a release hands it the
/// unit: the unit is never lost (back to the limiter, count 0) and never
/// given twice.
#[test]
fn a_waiter_dropped_while_handed_a_permit_loses_nothing() {
    loom::model(|| {
        let l = limiter(1, false);
        let held = l.try_acquire_owned().into_permit().unwrap();
        let waiter = {
            let l = Arc::clone(&l);
            thread::spawn(move || {
                let mut a = l.acquire_owned();
                let mut cx = Context::from_waker(Waker::noop());
                let got = Pin::new(&mut a).poll(&mut cx);
                drop(a); // cancelled, whether or not it was just served
                got.is_ready()
            })
        };
        drop(held);
        waiter.join().unwrap();
        assert_eq!(l.in_flight(), 0);
        assert!(l.try_acquire().is_allowed());
    });
}

/// Two blocked waiters, one unit, one release: each is served in turn by
/// the release before it (no wake-up lost between them), never both at
/// once.
#[test]
fn two_waiters_are_served_one_after_the_other() {
    loom::model(|| {
        let l = limiter(1, true);
        let held = l.try_acquire_owned().into_permit().unwrap();
        let other = {
            let l = Arc::clone(&l);
            thread::spawn(move || {
                let p = Wait::new().blocking(l.acquire()).unwrap();
                assert_eq!(l.in_flight(), 1);
                drop(p);
            })
        };
        drop(held);
        let p = Wait::new().blocking(l.acquire()).unwrap();
        assert_eq!(l.in_flight(), 1);
        drop(p);
        other.join().unwrap();
        assert_eq!(l.in_flight(), 0);
    });
}

/// A raised maximum racing a waiter's registration (the holder never
/// releases): the re-size's CAS sees the mark and serves the waiter, or the
/// waiter's drain sees the new maximum; either way it is woken.
#[test]
fn a_raised_maximum_racing_a_registration_is_never_lost() {
    loom::model(|| {
        let l = limiter(1, false);
        let held = l.try_acquire_owned().into_permit().unwrap();
        let raiser = {
            let l = Arc::clone(&l);
            thread::spawn(move || l.set_max(2).unwrap())
        };
        let permit = Wait::new().blocking(l.acquire()).unwrap();
        assert_eq!(l.in_flight(), 2);
        raiser.join().unwrap();
        drop((permit, held));
        assert_eq!(l.in_flight(), 0);
    });
}
