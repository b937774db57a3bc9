//! One partition's local pace: a token bucket at the pace in force
//! ([`Partitions::pace`](super::Partitions::pace): the user's rate,
//! tightened by what the upstream announced), rebuilt in place when that
//! pace changes.
//!
//! The bucket is made on first use (a partition that was only learned
//! about costs no bucket) and lives as long as its partition: evicting the
//! partition from the bounded table forgets its pace too. A change of pace
//! rescales the bucket's usage ([`set_quota`](crate::Limiter::set_quota)), so a tighter
//! announcement does not hand out a fresh burst.

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

/// One partition's local pace (see the module docs).
pub(crate) struct Pacer<C: Clock> {
    bucket: Mutex<Option<Bucket<C>>>,
}

impl<C: Clock> Default for Pacer<C> {
    fn default() -> Self {
        Pacer {
            bucket: Mutex::new(None),
        }
    }
}

impl<C: Clock> fmt::Debug for Pacer<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let pace = lock(&self.bucket).as_ref().map(|b| b.pace);
        f.debug_struct("Pacer").field("pace", &pace).finish()
    }
}

/// A denial that asks the caller to come back in `wait` (nothing taken).
pub(crate) fn come_back_in(wait: Duration) -> Decision {
    let ns = u64::try_from(wait.as_nanos()).unwrap_or(u64::MAX);
    Decision::deny(1, 0, ns, ns)
}

impl<C: Clock + Clone> Pacer<C> {
    /// Takes one request at `pace` (`None`: no pace known, every request
    /// passes). A pace the bucket cannot be built for (an announced window
    /// beyond the limiters' range) leaves the bucket as it was, or none.
    pub(crate) fn admit(&self, pace: Option<Rate>, clock: &C) -> Decision {
        let Some(pace) = pace else {
            return Decision::allow(1, 1, 0);
        };
        let mut slot = lock(&self.bucket);
        match slot.as_mut() {
            Some(b) if b.pace == pace => {}
            Some(b) => {
                if b.limiter.set_quota(pace).is_ok() {
                    b.pace = pace;
                }
            }
            None => {
                if let Ok(limiter) = TokenBucket::with_clock(pace, clock.clone()) {
                    *slot = Some(Bucket { pace, limiter });
                }
            }
        }
        match slot.as_ref() {
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
        p.learn(clock.now(), &quota(10, 1000));
        let d = admit(&p, &clock, user);
        assert!(!d.is_allowed());
        assert!(d.retry_after() > Duration::ZERO && d.retry_after() <= Duration::from_millis(100));
        clock.advance(d.retry_after());
        assert!(admit(&p, &clock, user).is_allowed());
        assert!(!admit(&p, &clock, user).is_allowed());
        // A looser announcement never raises the user's pace.
        p.learn(clock.now(), &quota(1000, 1000));
        clock.advance(Duration::from_secs(1));
        assert_eq!(
            (0..20)
                .filter(|_| admit(&p, &clock, user).is_allowed())
                .count(),
            10
        );
    }

    proptest! {
        /// Against the reference: at most `q` admissions in any window of
        /// length `w`, whatever the user's (faster) pace and the tries' timing.
        #[test]
        fn an_announced_quota_bounds_every_window(
            q in 1u64..20,
            w_ms in 100u64..2000,
            steps in proptest::collection::vec((0u64..40, 1usize..4), 1..300),
        ) {
            let clock = ManualClock::new();
            let p = Partition::default();
            p.learn(clock.now(), &quota(q, w_ms));
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
            let w = w_ms * 1_000_000;
            for (i, &t) in admitted.iter().enumerate() {
                let within = admitted[i..].iter().take_while(|&&u| u < t + w).count();
                prop_assert!(within as u64 <= q, "{within} admitted in {w_ms} ms from {t}");
            }
        }
    }
}
