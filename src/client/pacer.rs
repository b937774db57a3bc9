//! One partition's local pace: a token bucket at the pace in force
//! ([`Partitions::pace`](super::Partitions::pace): the user's rate,
//! tightened by what the upstream announced, with the announced burst),
//! rebuilt in place when that pace changes, and lowered to what the
//! upstream says is left.
//!
//! The bucket is made on first use (a partition that was only learned
//! about costs no bucket) and lives as long as its partition: evicting the
//! partition from the bounded table forgets its pace too. A change of pace
//! rescales the bucket's usage ([`set_quota`](crate::Limiter::set_quota)), so a tighter
//! announcement does not hand out a fresh burst.
//!
//! # Kept in step with the upstream
//!
//! A response that says `r` requests are left lowers the bucket to at most
//! `r - 1 - in_flight` whole units ([`Pacer::lower_to`]): the requests
//! still in flight may not be counted in `r` yet, and the one unit of
//! margin covers the fraction of a unit the bucket may hold beyond its
//! whole units, so the bucket never holds more than the upstream does
//! (both refill at the announced rate from then on). A larger `r` is not
//! believed: the only units given back are those a cut is proven to have
//! taken twice (`flights.rs`). Before the bucket exists (no pace
//! known yet), the latest such cap is kept with the time it was learned,
//! and applied when the bucket is made, plus what the pace refilled since.

use crate::clock::Clock;
use crate::decision::Decision;
use crate::limiter::TokenBucket;
use crate::quota::Rate;
use crate::sync::{lock, Mutex};
use std::fmt;
use std::time::Duration;

/// The bucket and the pace it was built for.
struct Bucket<C: Clock> {
    pace: Rate,
    limiter: TokenBucket<C>,
}

impl<C: Clock> Bucket<C> {
    /// The whole units it holds now (a peek: nothing taken).
    fn held(&self) -> u64 {
        let peek = self.limiter.peek();
        // Allowed: `remaining` counts the units left after this one.
        if peek.is_allowed() {
            peek.remaining().saturating_add(1)
        } else {
            0
        }
    }

    /// Takes whole units until at most `units` are left (nothing if fewer):
    /// the whole units it held, and how many it took.
    fn lower_to(&self, units: u64) -> (u64, u64) {
        let held = self.held();
        if held <= units {
            return (held, 0);
        }
        // At most what the bucket holds: always admitted, never an error.
        let _ = self.limiter.check_n(held - units);
        (held, held - units)
    }
}

/// The bucket, and the cap to apply when it is made.
struct State<C: Clock> {
    bucket: Option<Bucket<C>>,
    /// The units the upstream last said were left before the bucket
    /// existed, and when (ns on the clock): applied when it is made.
    cap: Option<(u64, u64)>,
}

/// One partition's local pace (see the module docs).
pub(crate) struct Pacer<C: Clock> {
    state: Mutex<State<C>>,
}

impl<C: Clock> Default for Pacer<C> {
    fn default() -> Self {
        Pacer {
            state: Mutex::new(State {
                bucket: None,
                cap: None,
            }),
        }
    }
}

impl<C: Clock> fmt::Debug for Pacer<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let pace = lock(&self.state).bucket.as_ref().map(|b| b.pace);
        f.debug_struct("Pacer").field("pace", &pace).finish()
    }
}

/// A denial that asks the caller to come back in `wait` (nothing taken).
pub(crate) fn come_back_in(wait: Duration) -> Decision {
    let ns = u64::try_from(wait.as_nanos()).unwrap_or(u64::MAX);
    Decision::deny(1, 0, ns, ns)
}

/// Whole units `pace` refills from `at` to `now` (ns; none if the clock
/// stepped back), rounded down.
fn refilled(pace: Rate, at: u64, now: u64) -> u64 {
    let elapsed = u128::from(now.saturating_sub(at)) * u128::from(pace.count().max(1));
    let period = pace.period().as_nanos().max(1);
    u64::try_from(elapsed / period).unwrap_or(u64::MAX)
}

impl<C: Clock> Pacer<C> {
    /// Lowers the bucket to at most `units` whole units at `now` (see the
    /// module docs): the whole units it held and how many it took. Before
    /// the bucket exists, keeps the cap for it (`None`).
    pub(crate) fn lower_to(&self, units: u64, now: u64) -> Option<(u64, u64)> {
        let mut state = lock(&self.state);
        match state.bucket.as_ref() {
            Some(b) => Some(b.lower_to(units)),
            None => {
                state.cap = Some((units, now));
                None
            }
        }
    }

    /// The whole units the bucket holds now (0 before it exists).
    #[cfg(test)]
    pub(crate) fn held(&self) -> u64 {
        lock(&self.state).bucket.as_ref().map_or(0, Bucket::held)
    }

    /// Gives `units` back to the bucket (units a cut took twice,
    /// `flights.rs`), at most up to its burst; before the bucket exists,
    /// to the cap kept for it.
    pub(crate) fn give_back(&self, units: u64) {
        if units == 0 {
            return;
        }
        let state = &mut *lock(&self.state);
        match (state.bucket.as_ref(), state.cap.as_mut()) {
            (Some(b), _) => b.limiter.refund(units),
            (None, Some((cap, _))) => *cap = cap.saturating_add(units),
            (None, None) => {}
        }
    }
}

impl<C: Clock + Clone> Pacer<C> {
    /// Takes one request at `pace` (`None`: no pace known, every request
    /// passes). A pace the bucket cannot be built for (an announced window
    /// beyond the limiters' range) leaves the bucket as it was, or none.
    pub(crate) fn admit(&self, pace: Option<Rate>, clock: &C) -> Decision {
        let Some(pace) = pace else {
            return Decision::allow(1, 1, 0);
        };
        let mut state = lock(&self.state);
        let cap = state.cap;
        match state.bucket.as_mut() {
            Some(b) if b.pace == pace => {}
            Some(b) => {
                if b.limiter.set_quota(pace).is_ok() {
                    b.pace = pace;
                }
            }
            None => {
                if let Ok(limiter) = TokenBucket::with_clock(pace, clock.clone()) {
                    let bucket = Bucket { pace, limiter };
                    if let Some((units, at)) = cap {
                        bucket.lower_to(units.saturating_add(refilled(pace, at, clock.now())));
                    }
                    state.bucket = Some(bucket);
                    state.cap = None;
                }
            }
        }
        match state.bucket.as_ref() {
            Some(b) => b.limiter.check(),
            None => Decision::allow(1, 1, 0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::announce::{Announcement, Quota};
    use super::super::partition::Partition;
    use super::*;
    use crate::clock::ManualClock;
    use proptest::prelude::*;

    fn quota(limit: u64, window_ms: u64) -> Announcement {
        Announcement {
            quota: Some(Quota {
                limit,
                window: Some(Duration::from_millis(window_ms)),
            }),
            ..Announcement::default()
        }
    }

    fn admit(p: &Partition<ManualClock>, clock: &ManualClock, user: Option<Rate>) -> Decision {
        p.admit(clock.now(), user, clock)
    }

    #[test]
    fn no_pace_admits_everything_and_a_pause_denies_taking_nothing() {
        let clock = ManualClock::new();
        let p = Partition::default();
        assert!((0..100).all(|_| admit(&p, &clock, None).is_allowed()));
        let user = Some(Rate::per_second(10).burst(1));
        p.learn(
            clock.now(),
            &Announcement {
                retry_after: Some(Duration::from_secs(2)),
                too_many_requests: true,
                ..Announcement::default()
            },
            None,
        );
        for _ in 0..3 {
            let d = admit(&p, &clock, user);
            assert!(!d.is_allowed());
            assert_eq!(d.retry_after(), Duration::from_secs(2));
        }
        clock.advance(Duration::from_secs(2));
        // The pause took nothing: the one-unit burst is still there.
        assert!(admit(&p, &clock, user).is_allowed());
        assert!(!admit(&p, &clock, user).is_allowed());
    }

    #[test]
    fn a_tighter_announcement_rescales_the_bucket_without_a_fresh_burst() {
        let clock = ManualClock::new();
        let p = Partition::default();
        let user = Some(Rate::per_second(100).burst(10));
        assert_eq!(
            (0..20)
                .filter(|_| admit(&p, &clock, user).is_allowed())
                .count(),
            10
        );
        p.learn(clock.now(), &quota(10, 1000), None);
        let d = admit(&p, &clock, user);
        assert!(!d.is_allowed());
        assert!(d.retry_after() > Duration::ZERO && d.retry_after() <= Duration::from_millis(100));
        clock.advance(d.retry_after());
        assert!(admit(&p, &clock, user).is_allowed());
        assert!(!admit(&p, &clock, user).is_allowed());
        // A looser announcement never raises the user's pace.
        p.learn(clock.now(), &quota(1000, 1000), None);
        clock.advance(Duration::from_secs(1));
        assert_eq!(
            (0..20)
                .filter(|_| admit(&p, &clock, user).is_allowed())
                .count(),
            10
        );
    }

    fn left(limit: u64, window_ms: u64, available: u64) -> Announcement {
        Announcement {
            remaining: Some(super::super::announce::Remaining {
                available,
                within: None,
            }),
            ..quota(limit, window_ms)
        }
    }

    fn burst(p: &Partition<ManualClock>, clock: &ManualClock, user: Option<Rate>) -> usize {
        (0..1000)
            .take_while(|_| admit(p, clock, user).is_allowed())
            .count()
    }

    #[test]
    fn an_announced_quota_paces_with_its_burst_then_its_rate() {
        // `q=100;w=2`: the upstream's bucket, 100 at once, then 50/s; the
        // pace used to be burst 1 (one every 20 ms from the start).
        let clock = ManualClock::new();
        let p = Partition::default();
        p.learn(clock.now(), &quota(100, 2000), None);
        assert_eq!(burst(&p, &clock, None), 100);
        clock.advance(Duration::from_millis(20));
        assert_eq!(burst(&p, &clock, None), 1);
        clock.advance(Duration::from_secs(2));
        assert_eq!(burst(&p, &clock, None), 100, "full again after w");
        // A user's burst below it is kept.
        let p = Partition::default();
        p.learn(clock.now(), &quota(100, 2000), None);
        let user = Some(Rate::per_second(50).burst(10));
        assert_eq!(burst(&p, &clock, user), 10);
    }

    #[test]
    fn what_is_left_lowers_the_pace_less_one_and_what_is_in_flight() {
        let clock = ManualClock::new();
        // Learned before the bucket exists: applied when it is made, with
        // what the pace refilled since.
        let p = Partition::default();
        p.learn(clock.now(), &left(10, 1000, 9), None);
        assert_eq!(burst(&p, &clock, None), 8, "r=9, one unit of margin");
        let later = Partition::default();
        later.learn(clock.now(), &left(10, 1000, 3), None);
        clock.advance(Duration::from_millis(250));
        assert_eq!(
            burst(&later, &clock, None),
            4,
            "2, and 2 refilled in 250 ms"
        );
        // Learned after: the bucket is lowered in place, and never raised.
        clock.advance(Duration::from_secs(1));
        // One sent before the answered one (counted in its `r`), three after.
        let older = p.send(clock.now());
        let answered = p.send(clock.now());
        let newer: Vec<_> = (0..3).map(|_| p.send(clock.now())).collect();
        assert_eq!(answered.newer(), 3);
        p.learn(clock.now(), &left(10, 1000, 6), Some(&answered));
        assert_eq!(burst(&p, &clock, None), 2, "6 - 1 - 3 sent after it");
        drop((older, answered, newer));
        p.learn(clock.now(), &left(10, 1000, 10), None);
        assert_eq!(burst(&p, &clock, None), 0, "a larger r raises nothing");
        clock.advance(Duration::from_secs(1));
        assert_eq!(burst(&p, &clock, None), 10, "refilled at the pace");
        // One left: the margin takes it; nothing admitted until the
        // bucket refills (r=0 would pause the partition instead).
        clock.advance(Duration::from_secs(1));
        p.learn(clock.now(), &left(10, 1000, 1), None);
        assert_eq!(burst(&p, &clock, None), 0);
        clock.advance(Duration::from_millis(100));
        assert_eq!(burst(&p, &clock, None), 1);
    }

    #[test]
    fn answers_proving_a_cut_counted_twice_give_its_units_back() {
        // The 300-call run's loss: 20 requests in flight to a `50/s burst
        // 100` upstream that counts them newest first, answered oldest
        // first. The first answer says 80 left with 19 newer in flight: the
        // cut lowers the pace to 60, though the upstream has counted all
        // 19. Each later answer says more than 80 were left after it, so
        // it was counted first: its unit comes back.
        let clock = ManualClock::new();
        let p = Partition::default();
        p.learn(clock.now(), &quota(100, 2000), None);
        let flights: Vec<_> = (0..20)
            .map(|_| {
                assert!(admit(&p, &clock, None).is_allowed());
                p.send(clock.now())
            })
            .collect();
        for (i, flight) in (0u64..).zip(&flights) {
            clock.advance(Duration::from_micros(50));
            p.learn(clock.now(), &left(100, 2000, 80 + i), Some(flight));
            if i == 0 {
                assert_eq!(held(&p), 60, "80 - 1 - 19 newer");
            }
        }
        drop(flights);
        assert_eq!(held(&p), 79, "the upstream's 80, less the margin");
    }

    /// The whole units the pace holds now (a peek: nothing taken).
    fn held(p: &Partition<ManualClock>) -> u64 {
        p.pacer_for_tests().held()
    }

    proptest! {
        /// A paced client against a real upstream bucket (`q` per `w`,
        /// burst `q`, as announced) that others had used `used` of. The
        /// client sends a first wave before it knows (its bucket is full;
        /// the wave fits what is left), learns what the others used from
        /// one answer with the rest of the wave in flight, then sends,
        /// waits and reads the other answers in any order, each request
        /// counted upstream when sent: the upstream refuses none. The cuts
        /// and what they give back keep the pace at or below what the
        /// upstream holds. (Counted later than sent, a client's spread-out
        /// sends can meet an upstream bucket that was full meanwhile and
        /// refilled nothing: no pace can promise that case.)
        #[test]
        fn answers_in_any_order_never_overrun_the_upstream(
            q in 2u64..30,
            used in 0u64..30,
            wave in 1u64..10,
            w_ms in 100u64..2000,
            first in 0usize..10,
            ops in proptest::collection::vec((0u8..3, 0u64..30, 0usize..50), 1..400),
        ) {
            let clock = ManualClock::new();
            let p = Partition::default();
            p.learn(clock.now(), &quota(q, w_ms), None);
            let interval = Duration::from_nanos((w_ms * 1_000_000).div_ceil(q));
            let upstream =
                TokenBucket::with_clock(Rate::every(interval).burst(q), clock.clone()).unwrap();
            let used = used.min(q - 1);
            if used > 0 {
                prop_assert!(upstream.check_n(used).unwrap().is_allowed());
            }
            let mut counted = Vec::new();
            let send = |counted: &mut Vec<_>| -> Result<(), TestCaseError> {
                if admit(&p, &clock, None).is_allowed() {
                    let flight = p.send(clock.now());
                    let d = upstream.check();
                    prop_assert!(d.is_allowed(), "the upstream refused at {}", clock.now());
                    counted.push((flight, d.remaining()));
                }
                Ok(())
            };
            for _ in 0..wave.min(q - used) {
                send(&mut counted)?;
            }
            let (flight, r) = counted.remove(first % counted.len());
            p.learn(clock.now(), &left(q, w_ms, r), Some(&flight));
            drop(flight);
            for (op, ms, pick) in ops {
                match op {
                    0 => clock.advance(Duration::from_millis(ms)),
                    1 => send(&mut counted)?,
                    _ => {
                        if !counted.is_empty() {
                            let (flight, r) = counted.swap_remove(pick % counted.len());
                            p.learn(clock.now(), &left(q, w_ms, r), Some(&flight));
                        }
                    }
                }
            }
        }

        /// Against the reference: the admissions conform to the upstream's
        /// own bucket, `q` at once and one more per `ceil(w/q)` (at most
        /// `q + d / ceil(w/q)` in any span `d`), whatever the user's (faster)
        /// pace and the tries' timing; and right after a response saying
        /// `r` are left, at most `r - 1` pass at once.
        #[test]
        fn an_announced_quota_bounds_every_span(
            q in 1u64..20,
            w_ms in 100u64..2000,
            r in 0u64..20,
            steps in proptest::collection::vec((0u64..40, 1usize..4), 1..300),
        ) {
            let clock = ManualClock::new();
            let p = Partition::default();
            p.learn(clock.now(), &quota(q, w_ms), None);
            let user = Some(Rate::per_second(1000).burst(50));
            let mut admitted = Vec::new();
            for (advance_ms, tries) in steps {
                clock.advance(Duration::from_millis(advance_ms));
                for _ in 0..tries {
                    if admit(&p, &clock, user).is_allowed() {
                        admitted.push(clock.now());
                    }
                }
            }
            let interval = (w_ms * 1_000_000).div_ceil(q);
            for (i, &t) in admitted.iter().enumerate() {
                for (n, &u) in (1u64..).zip(&admitted[i..]) {
                    let most = q + (u - t) / interval;
                    prop_assert!(n <= most, "{n} admitted in {} ns from {t}", u - t);
                }
            }
            clock.advance(Duration::from_millis(w_ms));
            p.learn(clock.now(), &left(q, w_ms, r), None);
            let at_once = burst(&p, &clock, user) as u64;
            prop_assert!(at_once <= r.saturating_sub(1).min(q), "{at_once} after r={r}");
        }
    }
}
