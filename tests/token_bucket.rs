//! Token and leaky buckets against a reference model, driven by a manual clock.
//!
//! The model is a classic token bucket written independently of ratewall's
//! GCRA arithmetic: a `level` of credit in nanoseconds (one token is `T` ns
//! of credit, a full bucket `burst*T`), refilled one ns per ns, with exact
//! integer arithmetic. Backward clock steps are modelled as time standing
//! still (the latest reading), which is what the limiter promises.

use proptest::prelude::*;
use ratewall::{
    Clock, ConfigError, InsufficientCapacity, LeakyBucket, ManualClock, Rate, TokenBucket,
};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Duration;

#[derive(Debug, Clone)]
struct Model {
    t: u64,     // ns per token (ceil(period/count))
    burst: u64, // tokens
    level: u64, // credit in ns, 0..=burst*t
    last: u64,  // latest time seen
}

#[derive(Debug, PartialEq, Eq)]
struct Expect {
    allowed: bool,
    limit: u64,
    remaining: u64,
    retry_ns: u64,
    reset_ns: u64,
}

impl Model {
    fn new(count: u64, period_ns: u64, burst: u64) -> Self {
        let t = period_ns.div_ceil(count);
        Model {
            t,
            burst,
            level: burst * t,
            last: 0,
        }
    }
    fn cap(&self) -> u64 {
        self.burst * self.t
    }
    fn advance_to(&mut self, now: u64) {
        if now > self.last {
            self.level = (self.level + (now - self.last)).min(self.cap());
            self.last = now;
        }
    }
    fn check(&mut self, now: u64, n: u64, consume: bool) -> Expect {
        self.advance_to(now);
        let n = n.max(1);
        let cost = n * self.t;
        if self.level >= cost {
            let after = self.level - cost;
            if consume {
                self.level = after;
            }
            Expect {
                allowed: true,
                limit: self.burst,
                remaining: after / self.t,
                retry_ns: 0,
                reset_ns: self.cap() - after,
            }
        } else {
            Expect {
                allowed: false,
                limit: self.burst,
                remaining: self.level / self.t,
                retry_ns: cost - self.level,
                reset_ns: self.cap() - self.level,
            }
        }
    }
    fn refund(&mut self, now: u64, n: u64) {
        self.advance_to(now);
        self.level = self
            .level
            .saturating_add(n.saturating_mul(self.t))
            .min(self.cap());
    }
    fn set_quota(&mut self, now: u64, count: u64, period_ns: u64, burst: u64) {
        self.advance_to(now);
        let new = Model::new(count, period_ns, burst);
        let used_old = self.cap() - self.level;
        let used_new =
            ((u128::from(used_old) * u128::from(new.t) / u128::from(self.t)) as u64).min(new.cap());
        self.t = new.t;
        self.burst = burst;
        self.level = new.cap() - used_new;
    }
}

fn observed(d: ratewall::Decision) -> Expect {
    Expect {
        allowed: d.is_allowed(),
        limit: d.limit(),
        remaining: d.remaining(),
        retry_ns: d.retry_after().as_nanos() as u64,
        reset_ns: d.reset_after().as_nanos() as u64,
    }
}

#[derive(Debug, Clone)]
enum Op {
    Check(u64),
    Peek(u64),
    Advance(u64),
    StepBack(u64),
    Refund(u64),
    Reset,
    SetQuota { count: u64, burst: u64 },
}

fn op(max_cost: u64) -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..=max_cost + 1).prop_map(Op::Check),
        1 => (0..=max_cost + 1).prop_map(Op::Peek),
        4 => (0u64..400_000_000).prop_map(Op::Advance),
        1 => (0u64..400_000_000).prop_map(Op::StepBack),
        1 => (0..=max_cost).prop_map(Op::Refund),
        1 => Just(Op::Reset),
        1 => ((1u64..50), (1u64..20)).prop_map(|(count, burst)| Op::SetQuota { count, burst }),
    ]
}

fn run_against_model(count: u64, burst: u64, ops: &[Op]) {
    let period = 1_000_000_000u64;
    let clock = ManualClock::starting_at(Duration::from_secs(1));
    let bucket = TokenBucket::with_clock(Rate::per_second(count).burst(burst), clock.clone())
        .expect("valid rate");
    let mut model = Model::new(count, period, burst);
    // The latest reading the limiter has seen: it reads the clock on every
    // operation except reset.
    let mut high_water = 0;
    for (i, op) in ops.iter().enumerate() {
        if !matches!(op, Op::Reset | Op::Advance(_) | Op::StepBack(_)) {
            high_water = high_water.max(clock.now());
        }
        let now = high_water;
        match *op {
            Op::Check(n) | Op::Peek(n) => {
                let consume = matches!(op, Op::Check(_));
                let got = if consume {
                    bucket.check_n(n)
                } else {
                    bucket.peek_n(n)
                };
                if n > model.burst {
                    assert_eq!(
                        got,
                        Err(InsufficientCapacity {
                            requested: n,
                            capacity: model.burst
                        }),
                        "step {i}: {op:?}"
                    );
                    continue;
                }
                let want = model.check(now, n, consume && n > 0);
                assert_eq!(observed(got.unwrap()), want, "step {i}: {op:?} at {now}");
            }
            Op::Advance(ns) => clock.advance(Duration::from_nanos(ns)),
            Op::StepBack(ns) => clock.step_back(Duration::from_nanos(ns)),
            Op::Refund(n) => {
                bucket.refund(n);
                model.refund(now, n);
            }
            Op::Reset => {
                bucket.reset();
                model = Model::new(model_count(&bucket), period, bucket.quota().burst_size());
                model.last = now;
            }
            Op::SetQuota { count, burst } => {
                bucket
                    .set_quota(Rate::per_second(count).burst(burst))
                    .unwrap();
                model.set_quota(now, count, period, burst);
            }
        }
    }
}

fn model_count<C: Clock>(b: &TokenBucket<C>) -> u64 {
    b.quota().count()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Every field of every decision equals the reference token bucket's,
    /// through costs, peeks, refunds, resets, quota changes and backward steps.
    #[test]
    fn decisions_match_reference_model(
        count in 1u64..50,
        burst in 1u64..20,
        ops in prop::collection::vec(op(20), 1..200),
    ) {
        run_against_model(count, burst, &ops);
    }

    /// The bound itself, independent of any model: in every interval of
    /// length d (of the limiter's effective time), admitted cost is at most
    /// burst + floor(d / T). Backward steps included.
    #[test]
    fn admitted_never_exceeds_burst_plus_rate_times_interval(
        count in 1u64..1000,
        burst in 1u64..30,
        steps in prop::collection::vec((0u64..30_000_000, any::<bool>(), 1u64..4), 1..300),
    ) {
        let clock = ManualClock::new();
        let bucket = TokenBucket::with_clock(Rate::per_second(count).burst(burst), clock.clone()).unwrap();
        let t = 1_000_000_000u64.div_ceil(count);
        let mut admitted: Vec<(u64, u64)> = Vec::new();
        let mut effective = 0u64;
        for (dt, back, n) in steps {
            if back { clock.step_back(Duration::from_nanos(dt)) } else { clock.advance(Duration::from_nanos(dt)) }
            effective = effective.max(clock.now());
            let n = n.min(burst);
            if bucket.check_n(n).unwrap().is_allowed() {
                admitted.push((effective, n));
            }
        }
        for i in 0..admitted.len() {
            let mut sum = 0;
            for j in i..admitted.len() {
                sum += admitted[j].1;
                let d = admitted[j].0 - admitted[i].0;
                prop_assert!(sum <= burst + d / t,
                    "admitted {} in {} ns, bound {}", sum, d, burst + d / t);
            }
        }
    }

    /// A backward step never denies what time frozen at its latest value
    /// would allow: the same script with the steps removed gets the same
    /// decisions.
    #[test]
    fn backward_steps_read_as_time_standing_still(
        burst in 1u64..10,
        steps in prop::collection::vec((0u64..300_000_000, 0u64..300_000_000, 1u64..3), 1..100),
    ) {
        let jumpy = ManualClock::new();
        let frozen = ManualClock::new();
        let a = TokenBucket::with_clock(Rate::per_second(10).burst(burst), jumpy.clone()).unwrap();
        let b = TokenBucket::with_clock(Rate::per_second(10).burst(burst), frozen.clone()).unwrap();
        let mut latest = 0u64;
        for (fwd, back, n) in steps {
            jumpy.advance(Duration::from_nanos(fwd));
            latest = latest.max(jumpy.now());
            frozen.set_nanos(latest);
            let n = n.min(burst);
            prop_assert_eq!(a.check_n(n).unwrap(), b.check_n(n).unwrap());
            jumpy.step_back(Duration::from_nanos(back));
            prop_assert_eq!(a.check_n(n).unwrap(), b.check_n(n).unwrap());
        }
    }
}

#[test]
fn leaky_shaping_spaces_departures_and_bounds_the_queue() {
    let clock = ManualClock::new();
    let leaky = LeakyBucket::with_clock(Rate::per_second(10).burst(4), clock.clone()).unwrap();
    let mut departures = Vec::new();
    let mut rejected = 0;
    for step in 0..40u64 {
        // 3 arrivals every 50 ms: twice the leak rate, so the queue fills.
        for _ in 0..3 {
            match leaky.reserve() {
                Ok(r) => departures.push(clock.now() + r.delay().as_nanos() as u64),
                Err(d) => {
                    assert!(!d.is_allowed());
                    assert!(d.retry_after() > Duration::ZERO);
                    rejected += 1;
                }
            }
            // Never more than 4 waiting, counting this one.
            let waiting = departures.iter().filter(|&&t| t > clock.now()).count();
            assert!(waiting <= 4, "step {step}: {waiting} waiting");
        }
        clock.advance(Duration::from_millis(50));
    }
    for w in departures.windows(2) {
        assert!(
            w[1] - w[0] >= 100_000_000,
            "departures {w:?} closer than 100 ms"
        );
    }
    assert!(rejected > 0, "the queue must have overflowed");
    // Over 2 s at 10/s, plus the queue: 20 + 4 at most.
    assert!(departures.len() <= 24, "{} departures", departures.len());
}

#[test]
fn leaky_reservation_can_be_cancelled_with_refund() {
    let clock = ManualClock::new();
    let leaky = LeakyBucket::with_clock(Rate::per_second(10).burst(2), clock).unwrap();
    let _first = leaky.reserve().unwrap();
    let _second = leaky.reserve().unwrap();
    assert!(leaky.reserve().is_err());
    leaky.refund(1);
    assert_eq!(
        leaky.reserve().unwrap().delay(),
        Duration::from_millis(100),
        "the cancelled place is reused"
    );
}

#[test]
fn acquire_blocks_until_the_rate_allows() {
    let leaky = LeakyBucket::new(Rate::per_second(200).burst(1)).unwrap();
    let start = std::time::Instant::now();
    for _ in 0..5 {
        leaky.pace_blocking();
    }
    // The first is immediate, the next four 5 ms apart.
    assert!(
        start.elapsed() >= Duration::from_millis(19),
        "{:?}",
        start.elapsed()
    );
}

#[test]
fn bad_configurations_are_typed_errors() {
    let c = ManualClock::new;
    assert_eq!(
        TokenBucket::with_clock(Rate::per_second(0), c()).unwrap_err(),
        ConfigError::ZeroRate
    );
    assert_eq!(
        TokenBucket::with_clock(Rate::per_second(5).burst(0), c()).unwrap_err(),
        ConfigError::ZeroBurst
    );
    assert!(matches!(
        LeakyBucket::with_clock(Rate::per_second(u64::MAX), c()).unwrap_err(),
        ConfigError::RateTooHigh { .. }
    ));
    let b = TokenBucket::with_clock(Rate::per_second(5), c()).unwrap();
    assert!(b.set_quota(Rate::new(1, Duration::ZERO)).is_err());
    assert_eq!(
        b.quota(),
        Rate::per_second(5),
        "a failed change keeps the quota"
    );
}

#[test]
fn extreme_instants_do_not_panic_or_over_admit() {
    let b = TokenBucket::with_clock(Rate::per_second(1).burst(2), ManualClock::new()).unwrap();
    assert!(b.check_at(u64::MAX).is_allowed());
    assert!(b.check_at(u64::MAX).is_allowed());
    // Time is clamped at the horizon: it stands still there, nothing refills.
    assert!(!b.check_at(u64::MAX).is_allowed());
    assert!(
        !b.check_at(0).is_allowed(),
        "a reading far in the past admits nothing extra"
    );
    let b = TokenBucket::with_clock(Rate::per_second(1).burst(2), StdClockLike).unwrap();
    assert!(b.check_at(u64::MAX).is_allowed());
    assert!(b.check_at(u64::MAX).is_allowed());
    assert!(
        !b.check_at(0).is_allowed(),
        "monotonic clock, early reading: stricter, never looser"
    );
}

/// A monotonic clock whose readings the test supplies through `check_at`.
#[derive(Debug)]
struct StdClockLike;
impl Clock for StdClockLike {
    fn now(&self) -> u64 {
        0
    }
    fn is_monotonic(&self) -> bool {
        true
    }
}

#[test]
fn threads_on_a_frozen_clock_admit_exactly_the_burst() {
    let clock = ManualClock::new();
    let bucket =
        Arc::new(TokenBucket::with_clock(Rate::per_second(100).burst(50), clock.clone()).unwrap());
    let admitted = Arc::new(AtomicU64::new(0));
    for round in 0..5u64 {
        let barrier = Arc::new(Barrier::new(4));
        let handles: Vec<_> = (0..4)
            .map(|_| {
                let (bucket, admitted, barrier) =
                    (bucket.clone(), admitted.clone(), barrier.clone());
                std::thread::spawn(move || {
                    barrier.wait();
                    for _ in 0..500 {
                        if bucket.check().is_allowed() {
                            admitted.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        // Round 0: the full burst; later rounds: exactly the 20 tokens that
        // 200 ms of refill buys.
        let want = 50 + 20 * round;
        assert_eq!(admitted.load(Ordering::Relaxed), want, "round {round}");
        clock.advance(Duration::from_millis(200));
    }
}

#[test]
fn concurrent_refunds_are_never_lost() {
    let clock = ManualClock::new();
    let bucket = Arc::new(TokenBucket::with_clock(Rate::per_second(1).burst(1000), clock).unwrap());
    assert!(bucket.check_n(1000).unwrap().is_allowed());
    let handles: Vec<_> = (0..4)
        .map(|_| {
            let bucket = bucket.clone();
            std::thread::spawn(move || {
                for _ in 0..100 {
                    bucket.refund(1);
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    assert_eq!(
        bucket.peek().remaining(),
        399,
        "400 refunds, minus the peeked unit"
    );
}

/// Real clock, many threads: total admitted stays within burst + rate * elapsed.
fn stress(threads: usize, run: Duration) {
    let rate = 200_000u64;
    let burst = 100u64;
    let bucket = Arc::new(TokenBucket::new(Rate::per_second(rate).burst(burst)).unwrap());
    let admitted = Arc::new(AtomicU64::new(0));
    let start = std::time::Instant::now();
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let (bucket, admitted) = (bucket.clone(), admitted.clone());
            std::thread::spawn(move || {
                let mut mine = 0;
                while start.elapsed() < run {
                    if bucket.check().is_allowed() {
                        mine += 1;
                    }
                }
                admitted.fetch_add(mine, Ordering::Relaxed);
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let elapsed = start.elapsed().as_nanos() as u64;
    let bound = burst + elapsed * rate / 1_000_000_000 + 1;
    let got = admitted.load(Ordering::Relaxed);
    assert!(got <= bound, "admitted {got} > bound {bound}");
    assert!(got >= burst, "admitted only {got}");
}

#[test]
fn stress_short() {
    stress(4, Duration::from_millis(200));
}

#[test]
#[ignore = "long stress: run in release by .ci/run"]
fn stress_long() {
    stress(8, Duration::from_secs(3));
}
