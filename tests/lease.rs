//! Leases (`StripedLimiter`): the exact token-bucket bound with many holders,
//! conservation of units, expiry, the worst-case stranding, and equivalence
//! with the plain token bucket when leasing is off.

use proptest::prelude::*;
use ratewall::{Clock, LeaseOptions, ManualClock, Rate, StripedLimiter, TokenBucket};
use std::sync::Arc;
use std::time::Duration;

#[path = "support/bound.rs"]
mod bound;
use bound::assert_bound;

fn striped(
    t_ns: u64,
    burst: u64,
    stripes: usize,
    max_lease: u64,
    hot_gap: Duration,
) -> StripedLimiter<ManualClock> {
    let opts = LeaseOptions::new()
        .stripes(stripes)
        .max_lease(max_lease)
        .hot_gap(hot_gap);
    StripedLimiter::with_options(
        Rate::new(1, Duration::from_nanos(t_ns)).burst(burst),
        ManualClock::new(),
        opts,
    )
    .unwrap()
}

#[derive(Clone, Copy, Debug)]
enum Op {
    Check { holder: u8 },
    Release,
    Advance { ns: u32 },
}

fn op(t_ns: u64) -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => any::<u8>().prop_map(|holder| Op::Check { holder }),
        1 => Just(Op::Release),
        3 => (0..(3 * t_ns) as u32).prop_map(|ns| Op::Advance { ns }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Many holders on a ManualClock, leases growing and expiring, releases:
    /// every interval keeps the exact bound; in frozen time units are
    /// conserved (an admission takes exactly one, a release none); a denial
    /// happens only when no unit is available anywhere; `remaining` never
    /// over-counts and under-counts by at most the other stripes' leases.
    #[test]
    fn the_bound_is_exact_with_many_holders(
        (t_ns, burst, stripes, max_lease, gap, ops) in (1u64..500, 1u64..24, 1usize..6)
            .prop_flat_map(|(t, b, s)| (
                Just(t), Just(b), Just(s), 1..=b.min(8),
                prop_oneof![Just(0u64), Just(u64::MAX / 4), 0..(20 * t)],
                prop::collection::vec(op(t), 1..200),
            ))
    ) {
        let l = striped(t_ns, burst, stripes, max_lease, Duration::from_nanos(gap));
        let clock = l.clock().clone();
        let mut log = Vec::new();
        for op in ops {
            let now = clock.now();
            match op {
                Op::Advance { ns } => clock.advance(Duration::from_nanos(ns.into())),
                Op::Release => {
                    let before = l.available_at(now);
                    let _ = l.release_at(now);
                    prop_assert_eq!(l.available_at(now), before, "a release conserves units");
                }
                Op::Check { holder } => {
                    let before = l.available_at(now);
                    let d = l.check_at_stripe(holder.into(), now);
                    let after = l.available_at(now);
                    if d.is_allowed() {
                        log.push(now);
                        prop_assert_eq!(after + 1, before, "an admission takes one unit");
                        prop_assert!(d.remaining() <= after, "{:?} vs {}", d, after);
                        let others = (stripes as u64 - 1) * (max_lease - 1);
                        prop_assert!(d.remaining() + others >= after, "{:?} vs {}", d, after);
                    } else {
                        prop_assert_eq!(before, 0, "false denial: {} units available", before);
                        prop_assert_eq!(after, 0);
                        prop_assert_eq!(d.remaining(), 0);
                        prop_assert!(d.retry_after() > Duration::ZERO);
                    }
                    prop_assert!(after <= burst);
                }
            }
        }
        assert_bound(&log, burst, t_ns);
    }

    /// With leases of one unit the striped limiter is the plain token bucket:
    /// the same decision, every field, for any holders and times.
    #[test]
    fn max_lease_one_is_the_plain_token_bucket(
        t_ns in 1u64..500,
        burst in 1u64..20,
        ops in prop::collection::vec(op(100), 1..150),
    ) {
        let l = striped(t_ns, burst, 3, 1, Duration::from_secs(3600));
        let clock = l.clock().clone();
        let plain = TokenBucket::with_clock(Rate::new(1, Duration::from_nanos(t_ns)).burst(burst), ManualClock::new()).unwrap();
        for op in ops {
            let now = clock.now();
            match op {
                Op::Advance { ns } => clock.advance(Duration::from_nanos(ns.into())),
                Op::Release => prop_assert_eq!(l.release_at(now), 0),
                Op::Check { holder } => {
                    prop_assert_eq!(l.check_at_stripe(holder.into(), now), plain.check_at(now));
                }
            }
        }
    }
}

/// The worst case of stranding: every one of `h` holders has just taken a
/// lease of the largest size `k` and used one unit, so `h * (k - 1)` units
/// sit in leases. None is lost: a holder whose own lease and the word are
/// empty uses them (no false denial), and `remaining` leaves out at most the
/// other holders' `(h - 1) * (k - 1)`.
#[test]
fn worst_case_stranding_is_holders_times_lease() {
    for (h, k) in [(2usize, 4u64), (4, 8), (8, 16), (3, 1)] {
        let burst = 1000;
        let l = striped(1_000, burst, h, k, Duration::from_secs(3600));
        // Grow every stripe to k: sizes 1, 2, 4, ..., k; use each lease up.
        let mut admitted = 0;
        let mut size = 1;
        loop {
            for s in 0..h {
                for _ in 0..size {
                    assert!(l.check_at_stripe(s, 0).is_allowed());
                    admitted += 1;
                }
            }
            if size == k {
                break;
            }
            size = (size * 2).min(k);
        }
        // Now one more take each: k - 1 units held per stripe.
        for s in 0..h {
            assert!(l.check_at_stripe(s, 0).is_allowed());
            admitted += 1;
        }
        let available = l.available_at(0);
        assert_eq!(available, burst - admitted);
        let stranded = h as u64 * (k - 1);
        let word_free = available - stranded;
        let d = l.check_at_stripe(0, 0);
        admitted += 1;
        // Holder 0 sees the word and its own lease.
        if k > 1 {
            assert_eq!(d.remaining(), word_free + k - 2, "served from its lease");
        } else {
            assert_eq!(d.remaining(), word_free - 1, "served from the word");
        }
        assert_eq!(
            l.available_at(0) - d.remaining(),
            (h as u64 - 1) * (k - 1),
            "h = {h}, k = {k}: what remaining leaves out"
        );
        // Drain: every unit is admitted, from any stripe, before a denial.
        let mut more = 0;
        while l.check_at_stripe(h - 1, 0).is_allowed() {
            more += 1;
        }
        assert_eq!(
            admitted + more,
            burst,
            "h = {h}, k = {k}: no unit stranded for good"
        );
    }
}

/// Units held by an idle holder come back by themselves once their slots
/// pass: a burst's time after the last take the bucket is full, with no call.
#[test]
fn idle_leases_expire_within_a_burst_time() {
    let l = striped(1_000, 100, 4, 8, Duration::from_secs(3600));
    for _ in 0..30 {
        for s in 0..4 {
            let _ = l.check_at_stripe(s, 0);
        }
    }
    assert!(l.available_at(0) < 100);
    assert_eq!(l.available_at(100 * 1_000), 100);
}

/// Threads on a frozen clock, one stripe each: exactly the burst passes
/// (leases racing, steals, no unit lost or duplicated).
#[test]
fn threads_on_a_frozen_clock_admit_exactly_the_burst() {
    for _ in 0..20 {
        let l = Arc::new(striped(1_000, 2_000, 4, 64, Duration::from_secs(3600)));
        let handles: Vec<_> = (0..4)
            .map(|s| {
                let l = l.clone();
                std::thread::spawn(move || {
                    let mut n = 0u64;
                    while l.check_at_stripe(s, 0).is_allowed() {
                        n += 1;
                    }
                    n
                })
            })
            .collect();
        let total: u64 = handles.into_iter().map(|h| h.join().unwrap()).sum();
        assert_eq!(total, 2_000);
        assert_eq!(l.available_at(0), 0);
    }
}

/// `runs` times: 4 threads on one stripe of a frozen limiter (4 per ms,
/// burst 256, `max_lease` 228, a hot gap of 10 us), each checking until
/// denied: exactly the burst passes and nothing is left available.
fn four_threads_on_one_stripe(runs: usize) {
    for run in 0..runs {
        let l = Arc::new(striped(250_000, 256, 1, 228, Duration::from_micros(10)));
        let handles: Vec<_> = (0..4)
            .map(|_| {
                let l = l.clone();
                std::thread::spawn(move || {
                    let mut n = 0u64;
                    while l.check_at_stripe(0, 0).is_allowed() {
                        n += 1;
                    }
                    n
                })
            })
            .collect();
        let total: u64 = handles.into_iter().map(|h| h.join().unwrap()).sum();
        assert_eq!(
            (total, l.available_at(0)),
            (256, 0),
            "run {run}: units neither admitted nor available"
        );
    }
}

/// The lost lease of issue 30: threads sharing one stripe took leases at
/// once, and a later install that found the earlier lease could not give
/// its own units back once it was no longer the word's tail (about one run
/// in 8,000: 193 admitted, 63 neither admitted nor available, for ever on a
/// frozen clock). A stripe is now claimed before its take. The loom model
/// `two_threads_taking_for_one_stripe_lose_no_unit` shows the interleaving.
#[test]
fn threads_sharing_one_stripe_admit_exactly_the_burst() {
    four_threads_on_one_stripe(300);
}

/// The same, 20,000 times (release, `.ci/run`'s stress stage).
#[test]
#[ignore]
fn threads_sharing_one_stripe_admit_exactly_the_burst_stress() {
    four_threads_on_one_stripe(20_000);
}

/// Threads sharing stripes (more threads than stripes, by `check`): never
/// more than the burst on a frozen clock.
#[test]
fn threads_sharing_stripes_never_over_admit() {
    let l = Arc::new(striped(1_000, 5_000, 2, 32, Duration::from_secs(3600)));
    let handles: Vec<_> = (0..6)
        .map(|_| {
            let l = l.clone();
            std::thread::spawn(move || {
                (0..2_000).filter(|_| l.check_at(0).is_allowed()).count() as u64
            })
        })
        .collect();
    let total: u64 = handles.into_iter().map(|h| h.join().unwrap()).sum();
    assert!(total <= 5_000, "{total}");
    // No unit lost either: each thread stopped after 2,000 checks, so what
    // was not admitted is still available.
    assert_eq!(total + l.available_at(0), 5_000);
}
