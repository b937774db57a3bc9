//! The blocking waits (`Wait::blocking`, in every build) on real threads
//! and real clocks, bounded in time: admissions spaced by the rate across
//! threads, a deadline decided up front, never sleeping past a deadline,
//! all-or-nothing sets, and the leaky bucket's `acquire` as one case.

use ratewall::wait::{Wait, WaitError};
use ratewall::{check_all, KeyedTokenBucket, LeakyBucket, Rate, TokenBucket};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const MS: Duration = Duration::from_millis(1);

#[test]
fn threads_waiting_on_one_bucket_are_admitted_at_its_rate() {
    // 200/s, burst 1: 20 admissions are at least 19 * 5 ms apart in total.
    let b = Arc::new(TokenBucket::new(Rate::per_second(200).burst(1)).unwrap());
    let times = Arc::new(Mutex::new(Vec::new()));
    let start = Instant::now();
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let (b, times) = (b.clone(), times.clone());
            std::thread::spawn(move || {
                for _ in 0..5 {
                    let d = Wait::new()
                        .timeout(Duration::from_secs(10))
                        .blocking(|| b.check())
                        .unwrap();
                    assert!(d.is_allowed());
                    times.lock().unwrap().push(start.elapsed());
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let took = start.elapsed();
    assert_eq!(times.lock().unwrap().len(), 20);
    assert!(took >= 19 * 5 * MS, "{took:?}");
    assert!(took < Duration::from_secs(5), "{took:?}");
}

#[test]
fn a_blocking_deadline_shorter_than_retry_after_fails_without_sleeping() {
    let b = TokenBucket::new(Rate::per_minute(1).burst(1)).unwrap();
    let _ = b.check();
    let start = Instant::now();
    let err = Wait::new()
        .timeout(Duration::from_secs(30))
        .blocking(|| b.check())
        .unwrap_err();
    assert!(
        start.elapsed() < 500 * MS,
        "{:?} (a sleep would be 55 s)",
        start.elapsed()
    );
    assert!(
        matches!(err, WaitError::Deadline { last: Some(d) } if d.retry_after() > Duration::from_secs(55))
    );
    let never = Wait::new().blocking(|| b.check_n(2)).unwrap_err();
    assert!(matches!(never, WaitError::InsufficientCapacity(e) if e.capacity == 1));
}

#[test]
fn a_blocking_wait_never_sleeps_past_its_deadline() {
    let b = TokenBucket::new(Rate::per_second(20).burst(1)).unwrap();
    for jitter in [Duration::ZERO, Duration::from_secs(5)] {
        let start = Instant::now();
        // A thief inside the try takes each unit first: always denied.
        let err = Wait::new()
            .timeout(120 * MS)
            .jitter(jitter)
            .blocking(|| {
                let _ = b.check();
                b.check()
            })
            .unwrap_err();
        assert!(matches!(err, WaitError::Deadline { .. }));
        // The sleeps end by the deadline; the margin is the OS's wake-up.
        assert!(
            start.elapsed() < 170 * MS,
            "{:?} with jitter {jitter:?}",
            start.elapsed()
        );
    }
}

#[test]
fn a_blocking_all_or_nothing_wait_takes_from_both_only_when_both_admit() {
    let global = TokenBucket::new(Rate::per_hour(100).burst(100)).unwrap();
    let per_customer = KeyedTokenBucket::<u32>::builder(Rate::per_second(50).burst(1))
        .build()
        .unwrap();
    let start = Instant::now();
    for _ in 0..3 {
        let d = Wait::new()
            .blocking(|| check_all(&[&per_customer.with_key(&1), &global]))
            .unwrap();
        assert!(d.is_allowed());
    }
    assert!(start.elapsed() >= 2 * 20 * MS - MS, "{:?}", start.elapsed());
    // Three taken from the global limit; the denials in between took nothing.
    assert_eq!(global.peek().remaining(), 100 - 3 - 1);
}

#[test]
fn the_leaky_buckets_acquire_is_one_blocking_wait_and_a_reserve_with_a_deadline_is_another() {
    let leaky = LeakyBucket::new(Rate::per_second(100).burst(2)).unwrap();
    let start = Instant::now();
    for _ in 0..4 {
        let _ = leaky.pace_blocking();
    }
    // Departures 10 ms apart: the 4th leaves at least 30 ms after the 1st.
    assert!(start.elapsed() >= 29 * MS, "{:?}", start.elapsed());
    // A place in a full queue within a deadline: the reservation, or the denial.
    let full = LeakyBucket::new(Rate::per_minute(1).burst(1)).unwrap();
    let _ = full.reserve().unwrap();
    let err = Wait::new()
        .timeout(10 * MS)
        .blocking(|| full.reserve())
        .unwrap_err();
    assert!(err.last_decision().is_some_and(|d| !d.is_allowed()));
    let r = Wait::new()
        .timeout(Duration::from_secs(1))
        .blocking(|| leaky.reserve())
        .unwrap();
    assert!(r.delay() <= 20 * MS);
}
