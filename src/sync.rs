//! The one place atomics, locks and spin hints come from.
//!
//! Under `--cfg ratewall_loom` everything here is loom's model-checked
//! version; otherwise it is `std`'s. No other module may import
//! `std::sync::atomic` directly (CI greps for it), so loom sees every
//! atomic access the crate makes.

#[cfg(not(ratewall_loom))]
pub(crate) use std::sync::atomic::{fence, AtomicU64, Ordering};
#[cfg(not(ratewall_loom))]
pub(crate) use std::sync::{Mutex, MutexGuard};

#[cfg(ratewall_loom)]
pub(crate) use loom::sync::atomic::{fence, AtomicU64, Ordering};
#[cfg(ratewall_loom)]
pub(crate) use loom::sync::{Mutex, MutexGuard};

#[cfg(ratewall_loom)]
pub(crate) use loom::thread::{current as current_thread, park, Thread};
/// Parking a thread until a concurrency permit is handed to it
/// (`ConcurrencyLimiter`'s blocking wait); loom's under loom, so the models
/// see a lost wake-up as a deadlock.
#[cfg(not(ratewall_loom))]
pub(crate) use std::thread::{current as current_thread, park, Thread};

/// Parks for at most `d`. Loom has no timed park: its models wait without
/// a deadline, and this is a scheduling point there.
#[inline]
pub(crate) fn park_timeout(d: std::time::Duration) {
    #[cfg(not(ratewall_loom))]
    std::thread::park_timeout(d);
    #[cfg(ratewall_loom)]
    {
        let _ = d;
        loom::thread::yield_now();
    }
}

/// Called in every spin loop: a CPU hint normally, a scheduling point under loom
/// (loom must see the spinning thread yield, or the model never terminates).
#[inline]
pub(crate) fn spin_hint() {
    #[cfg(not(ratewall_loom))]
    std::hint::spin_loop();
    #[cfg(ratewall_loom)]
    loom::thread::yield_now();
}

/// Gives the CPU away after a spin loop ran long (the writer holding a
/// seqlock was probably preempted: on 2 cores, spinning only delays it).
#[inline]
pub(crate) fn yield_now() {
    #[cfg(not(ratewall_loom))]
    std::thread::yield_now();
    #[cfg(ratewall_loom)]
    loom::thread::yield_now();
}

/// Locks a mutex, ignoring poisoning: every critical section in this crate
/// leaves the protected data consistent before anything in it can panic.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    #[cfg(not(ratewall_loom))]
    {
        m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
    #[cfg(ratewall_loom)]
    {
        m.lock().unwrap()
    }
}

/// Locks a mutex if no one holds it (poisoning ignored, as by [`lock`]):
/// for a thread that already holds another lock of the same kind, which
/// must never wait for a second one.
pub(crate) fn try_lock<T>(m: &Mutex<T>) -> Option<MutexGuard<'_, T>> {
    match m.try_lock() {
        Ok(g) => Some(g),
        Err(std::sync::TryLockError::Poisoned(p)) => Some(p.into_inner()),
        Err(std::sync::TryLockError::WouldBlock) => None,
    }
}

/// A small number for the calling thread, handed out in the order threads
/// first ask (0, 1, 2, ...), so that threads spread over a striped limiter's
/// stripes (`src/lease/`). Always `std`'s atomics, even under loom: the
/// index only picks a stripe and publishes no memory, so loom need not see it.
pub(crate) fn thread_index() -> usize {
    use std::cell::Cell;
    use std::sync::atomic::{AtomicUsize, Ordering as StdOrdering};
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static INDEX: Cell<usize> = const { Cell::new(usize::MAX) };
    }
    INDEX.with(|i| {
        let mut v = i.get();
        if v == usize::MAX {
            // Relaxed: a counter that publishes nothing; only uniqueness matters.
            v = NEXT.fetch_add(1, StdOrdering::Relaxed);
            i.set(v);
        }
        v
    })
}
