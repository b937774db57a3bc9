//! Real threads racing on one limiter (ManualClock, so it also runs under
//! miri, whose spuriously failing weak CASes drive `AtomicWord::update`'s
//! retry arm). Under either, the totals must be exact.

use ratewall::{LeakyBucket, ManualClock, Rate, TokenBucket};
use std::sync::Arc;
use std::thread;

const THREADS: usize = 2;
const PER_THREAD: u64 = if cfg!(miri) { 20 } else { 20_000 };

#[test]
fn racing_checks_admit_exactly_the_burst() {
    let burst = PER_THREAD; // half of all requests
    let b = Arc::new(
        TokenBucket::with_clock(Rate::per_hour(1).burst(burst), ManualClock::new()).unwrap(),
    );
    let admitted: u64 = (0..THREADS)
        .map(|_| {
            let b = Arc::clone(&b);
            thread::spawn(move || (0..PER_THREAD).filter(|_| b.check().is_allowed()).count() as u64)
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|h| h.join().unwrap())
        .sum();
    assert_eq!(admitted, burst);
    assert!(!b.peek().is_allowed());
}

#[test]
fn racing_checks_and_refunds_balance() {
    // Every thread takes one and gives it back: the bucket ends full.
    let b =
        Arc::new(LeakyBucket::with_clock(Rate::per_hour(1).burst(3), ManualClock::new()).unwrap());
    let handles: Vec<_> = (0..THREADS)
        .map(|_| {
            let b = Arc::clone(&b);
            thread::spawn(move || {
                let mut taken = 0;
                for _ in 0..PER_THREAD {
                    if b.check().is_allowed() {
                        taken += 1;
                        b.refund(1);
                    }
                }
                taken
            })
        })
        .collect();
    let taken: u64 = handles.into_iter().map(|h| h.join().unwrap()).sum();
    assert!(taken > 0);
    assert_eq!(b.check_n(3).unwrap().remaining(), 0, "all refunds arrived");
    assert!(b.is_idle() || !b.check().is_allowed());
}
