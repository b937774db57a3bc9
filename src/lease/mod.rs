//! Leases: one hot token bucket shared by many cores, with the bound kept
//! exact.
//!
//! A [`StripedLimiter`] is a token bucket (GCRA, the same word and arithmetic
//! as [`TokenBucket`](crate::TokenBucket)) plus a few cache-padded *stripes*.
//! Each thread uses one stripe. A stripe holds a *lease*: `k` units taken from
//! the shared word in one compare-exchange, which the stripe then admits one
//! at a time with a compare-exchange on its own cache line only.
//!
//! # The protocol
//!
//! - **Take.** A take of up to `k` units at `t` is the GCRA check of cost
//!   `m = min(k, free)` at `t`, where `free` is the number of units the word
//!   could admit now: `start = max(TAT, t)`, `TAT' = start + m*T`. The lease
//!   owns the slots `[start, TAT')`; it stores `(m - 1, end = TAT')` (the
//!   caller is admitted with the first unit).
//! - **Use.** At time `now` a lease `(units, end)` may admit
//!   `usable = min(units, floor((end - now) / T))` units: only units whose
//!   slot has not started to pass. A unit whose slot has passed is back in the
//!   word (the word never stopped ageing it), so it must not be used again:
//!   this is how a lease expires, unit by unit, without any write.
//! - **Steal.** A check that finds its own lease empty and the word empty
//!   uses a unit of any other stripe's lease before it denies.
//! - **Release.** [`release`](StripedLimiter::release) gives a lease's usable
//!   units back to the word when the lease is the word's tail
//!   (`TAT == end`): `TAT' = end - usable*T`.
//!
//! # The bound
//!
//! Units in the word plus usable units in leases never exceed the burst, and
//! only the word's refill (one unit per `T`) adds units, so in any interval
//! of length `d` at most `burst + floor(d / T)` units are admitted, exactly as
//! for the plain token bucket. See `docs/design.md`, "Leases".

use crate::algo::{Gcra, WordStep};
use crate::clock::{Clock, Timebase};
use crate::decision::Decision;
use crate::error::{ConfigError, InsufficientCapacity};
use crate::limiter::DefaultClock;
use crate::quota::Rate;
use crate::sync::thread_index;
use crate::word::AtomicWord;
use crossbeam_utils::CachePadded;
use std::fmt;
use std::time::Duration;

mod stripe;

#[cfg(all(test, not(ratewall_loom)))]
use stripe::MAX_STRIPES;
pub(crate) use stripe::{Claim, Leases, Stripe};

/// How a [`StripedLimiter`] leases: the number of stripes, the largest lease
/// and how quickly a lease grows.
///
/// # Example
///
/// ```
/// use ratewall::{LeaseOptions, ManualClock, Rate, StripedLimiter};
/// use std::time::Duration;
///
/// let opts = LeaseOptions::new().stripes(4).max_lease(8).hot_gap(Duration::from_micros(50));
/// let l = StripedLimiter::with_options(Rate::per_second(1000).burst(100), ManualClock::new(), opts)?;
/// assert_eq!(l.stripes(), 4);
/// assert_eq!(l.max_lease(), 8);
/// # Ok::<(), ratewall::ConfigError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct LeaseOptions {
    stripes: Option<usize>,
    max_lease: Option<u64>,
    hot_gap: Duration,
}

impl Default for LeaseOptions {
    fn default() -> Self {
        Self::new()
    }
}

impl LeaseOptions {
    /// The defaults: two stripes per available core (at most 64), leases of
    /// at most `burst / (4 * stripes)` units (between 1 and 65536), and a hot
    /// gap of 10 µs per unit.
    ///
    /// ```
    /// # use ratewall::LeaseOptions;
    /// let _ = LeaseOptions::new();
    /// ```
    pub const fn new() -> Self {
        LeaseOptions {
            stripes: None,
            max_lease: None,
            hot_gap: Duration::from_micros(10),
        }
    }

    /// The number of stripes (1 to 1024). Thread `i` (in the order threads
    /// first check any striped limiter) uses stripe `i % stripes`.
    ///
    /// ```
    /// # use ratewall::{LeaseOptions, Rate, StripedLimiter};
    /// let l = StripedLimiter::with_options(Rate::per_second(10), ratewall::ManualClock::new(), LeaseOptions::new().stripes(3))?;
    /// assert_eq!(l.stripes(), 3);
    /// # Ok::<(), ratewall::ConfigError>(())
    /// ```
    #[must_use]
    pub const fn stripes(mut self, stripes: usize) -> Self {
        self.stripes = Some(stripes);
        self
    }

    /// The largest lease, in units (1 to the burst). 1 turns leasing off:
    /// every check is then one compare-exchange on the shared word, and the
    /// decisions are the plain token bucket's.
    ///
    /// ```
    /// # use ratewall::{LeaseOptions, Rate, StripedLimiter};
    /// let l = StripedLimiter::with_options(Rate::per_second(10), ratewall::ManualClock::new(), LeaseOptions::new().max_lease(5))?;
    /// assert_eq!(l.max_lease(), 5);
    /// # Ok::<(), ratewall::ConfigError>(())
    /// ```
    #[must_use]
    pub const fn max_lease(mut self, units: u64) -> Self {
        self.max_lease = Some(units);
        self
    }

    /// The adaptation threshold, per unit: a stripe that comes back to the
    /// shared word within `hot_gap * k` of its previous take (a lease of `k`
    /// units), that is, whose holder drew more than one unit per `hot_gap`,
    /// doubles its next lease (up to the largest); otherwise it halves it
    /// (down to 1 unit). With the default 10 µs, a holder that checks less
    /// than 100 000 times a second takes one unit at a time.
    ///
    /// ```
    /// # use ratewall::LeaseOptions;
    /// let _ = LeaseOptions::new().hot_gap(std::time::Duration::from_micros(1));
    /// ```
    #[must_use]
    pub const fn hot_gap(mut self, gap: Duration) -> Self {
        self.hot_gap = gap;
        self
    }
}

/// A token bucket for one hot limit shared by many threads: each thread
/// admits from a lease of units taken from the shared word in batches, so a
/// hot limit stops queueing every check on one cache line. The bound stays
/// the token bucket's, exactly: at most `burst + rate * d` in any interval of
/// length `d`.
///
/// Use it for one limit that many threads check at a high rate. Leases are 1
/// unit while traffic is slow, so nothing changes then; see `docs/design.md`
/// ("Leases") for when not to use it.
///
/// # Example
///
/// ```
/// use ratewall::{Rate, StripedLimiter};
/// use std::sync::Arc;
///
/// let global = Arc::new(StripedLimiter::new(Rate::per_second(1_000_000).burst(10_000))?);
/// let workers: Vec<_> = (0..4)
///     .map(|_| {
///         let global = global.clone();
///         std::thread::spawn(move || (0..1000).filter(|_| global.check().is_allowed()).count())
///     })
///     .collect();
/// let admitted: usize = workers.into_iter().map(|w| w.join().unwrap()).sum();
/// assert!(admitted <= 10_000 + 1_000_000); // far below in practice: a few ms of work
/// # Ok::<(), ratewall::ConfigError>(())
/// ```
pub struct StripedLimiter<C: Clock = DefaultClock> {
    word: CachePadded<AtomicWord>,
    stripes: Box<[CachePadded<Stripe>]>,
    leases: Leases,
    rate: Rate,
    time: Timebase<C>,
}

impl StripedLimiter<DefaultClock> {
    /// A striped token bucket on the default clock, with the default options.
    ///
    /// ```
    /// # use ratewall::{Rate, StripedLimiter};
    /// let l = StripedLimiter::new(Rate::per_second(100).burst(10))?;
    /// assert!(l.check().is_allowed());
    /// # Ok::<(), ratewall::ConfigError>(())
    /// ```
    pub fn new(rate: Rate) -> Result<Self, ConfigError> {
        Self::with_options(rate, DefaultClock::default(), LeaseOptions::new())
    }
}

impl<C: Clock> StripedLimiter<C> {
    /// A striped token bucket on the given clock, with the default options.
    ///
    /// ```
    /// # use ratewall::{ManualClock, Rate, StripedLimiter};
    /// let l = StripedLimiter::with_clock(Rate::per_second(10).burst(2), ManualClock::new())?;
    /// assert!(l.check().is_allowed());
    /// assert!(l.check().is_allowed());
    /// assert!(!l.check().is_allowed());
    /// # Ok::<(), ratewall::ConfigError>(())
    /// ```
    pub fn with_clock(rate: Rate, clock: C) -> Result<Self, ConfigError> {
        Self::with_options(rate, clock, LeaseOptions::new())
    }

    /// A striped token bucket with explicit lease options. Fails if the rate
    /// is invalid, or the stripes or the largest lease are out of range.
    ///
    /// ```
    /// # use ratewall::{LeaseOptions, ManualClock, Rate, StripedLimiter};
    /// let bad = StripedLimiter::with_options(Rate::per_second(10), ManualClock::new(), LeaseOptions::new().stripes(0));
    /// assert!(bad.is_err());
    /// ```
    pub fn with_options(rate: Rate, clock: C, options: LeaseOptions) -> Result<Self, ConfigError> {
        let (leases, stripes) = Leases::new(Gcra::from_rate(rate)?, &options)?;
        let stripes = (0..stripes)
            .map(|_| CachePadded::new(Stripe::new()))
            .collect();
        Ok(StripedLimiter {
            word: CachePadded::new(AtomicWord::new(0)),
            stripes,
            leases,
            rate,
            time: Timebase::new(clock),
        })
    }

    /// Checks one request and takes it if allowed, on the calling thread's stripe.
    ///
    /// ```
    /// # use ratewall::{ManualClock, Rate, StripedLimiter};
    /// let l = StripedLimiter::with_clock(Rate::per_second(10).burst(3), ManualClock::new())?;
    /// assert_eq!((0..5).filter(|_| l.check().is_allowed()).count(), 3);
    /// # Ok::<(), ratewall::ConfigError>(())
    /// ```
    #[inline]
    pub fn check(&self) -> Decision {
        self.check_stripe(thread_index(), self.now())
    }

    /// [`check`](Self::check) at a time the caller read.
    ///
    /// ```
    /// # use ratewall::{ManualClock, Rate, StripedLimiter};
    /// let l = StripedLimiter::with_clock(Rate::per_second(10).burst(1), ManualClock::new())?;
    /// assert!(l.check_at(0).is_allowed());
    /// assert!(!l.check_at(0).is_allowed());
    /// assert!(l.check_at(100_000_000).is_allowed());
    /// # Ok::<(), ratewall::ConfigError>(())
    /// ```
    #[inline]
    pub fn check_at(&self, now: u64) -> Decision {
        self.check_stripe(thread_index(), now)
    }

    /// [`check_at`](Self::check_at) on stripe `stripe % stripes()`. A test
    /// hook (the `testing` feature; not part of the API, may change any
    /// time): tests pick the stripe that [`check`](Self::check) takes from
    /// the calling thread.
    ///
    /// The decision's `remaining` counts the units the shared word could
    /// still admit plus the units left in the lease that served this check;
    /// units in other stripes' leases (at most `(stripes - 1) * max_lease`)
    /// are not counted. [`available_at`](Self::available_at) counts them all.
    ///
    /// ```
    /// # use ratewall::{LeaseOptions, ManualClock, Rate, StripedLimiter};
    /// let l = StripedLimiter::with_options(Rate::per_second(10).burst(4), ManualClock::new(), LeaseOptions::new().stripes(2))?;
    /// assert_eq!(l.check_at_stripe(0, 0).remaining(), 3);
    /// assert_eq!(l.check_at_stripe(1, 0).remaining(), 2);
    /// # Ok::<(), ratewall::ConfigError>(())
    /// ```
    #[cfg(feature = "testing")]
    #[doc(hidden)]
    #[inline]
    pub fn check_at_stripe(&self, stripe: usize, now: u64) -> Decision {
        self.check_stripe(stripe, now)
    }

    /// [`check_at`](Self::check_at) on stripe `stripe % stripes()`.
    fn check_stripe(&self, stripe: usize, now: u64) -> Decision {
        let now = self.time.clamp(now);
        let home = stripe % self.stripes.len();
        if let Some(left) = self.use_lease(&self.stripes[home], now) {
            return self.lease_decision(left, now);
        }
        match self.take(&self.stripes[home], now) {
            Ok(d) => d,
            Err(denial) => {
                // The word is empty: before denying, use a unit that another
                // stripe holds (stranded units never cause a denial that the
                // plain bucket would not make, except in a race).
                for j in 1..self.stripes.len() {
                    let other = &self.stripes[(home + j) % self.stripes.len()];
                    if let Some(left) = self.use_lease(other, now) {
                        return self.lease_decision(left, now);
                    }
                }
                denial
            }
        }
    }

    /// A check of cost `n`, straight on the shared word (not leased): the
    /// plain token bucket's `check_n_at`. A cost above the burst is an error.
    ///
    /// ```
    /// # use ratewall::{ManualClock, Rate, StripedLimiter};
    /// let l = StripedLimiter::with_clock(Rate::per_second(10).burst(10), ManualClock::new())?;
    /// assert_eq!(l.check_n_at(0, 4).unwrap().remaining(), 6);
    /// assert!(l.check_n_at(0, 11).is_err());
    /// # Ok::<(), ratewall::ConfigError>(())
    /// ```
    pub fn check_n_at(&self, now: u64, n: u64) -> Result<Decision, InsufficientCapacity> {
        let now = self.time.clamp(now);
        let p = self.leases.params;
        InsufficientCapacity::check(n, p.burst)?;
        Ok(self.word.update(|tat| {
            let (d, next) = p.step(tat, now, n.max(1));
            (d, if n > 0 { next } else { None })
        }))
    }

    /// Uses one unit of `stripe`'s lease, if it has one usable at `now`;
    /// returns the units left in it.
    #[inline]
    fn use_lease(&self, stripe: &Stripe, now: u64) -> Option<u64> {
        self.leases.use_lease::<false>(stripe, 0, now)
    }

    /// An allowed decision for a unit served from a lease that has `left`
    /// units left: `remaining` counts the word's free units and `left`.
    #[inline]
    fn lease_decision(&self, left: u64, now: u64) -> Decision {
        self.leases.lease_decision(self.word.load(), left, now)
    }

    /// Takes a new lease for `stripe` from the word and admits its first
    /// unit; `Err(denial)` if the word has no unit free. The stripe is
    /// claimed first (`Leases::claim`): while another check of it is
    /// taking, this one takes a plain unit.
    fn take(&self, stripe: &Stripe, now: u64) -> Result<Decision, Decision> {
        let lock = match self.leases.claim::<false>(stripe, 0, now) {
            Claim::Locked(lock) => lock,
            Claim::Filled => match self.use_lease(stripe, now) {
                Some(left) => return Ok(self.lease_decision(left, now)),
                None => return self.take_unit(now),
            },
            Claim::Busy => return self.take_unit(now),
        };
        let hints = self.leases.next_size(stripe, now);
        let taken = self
            .word
            .update(|tat| self.leases.take_step(tat, now, hints.0));
        let (held, end) = match taken {
            Ok((_, m, end)) => {
                self.leases.took(stripe, now, hints);
                (m - 1, end)
            }
            Err(_) => (0, 0),
        };
        self.leases
            .publish::<false>(stripe, lock, held, end, now, |_, end, units| {
                self.give_back(end, units)
            });
        taken.map(|(d, _, _)| d)
    }

    /// A plain unit from the word, no lease: while another check is taking
    /// a lease for this stripe.
    fn take_unit(&self, now: u64) -> Result<Decision, Decision> {
        self.word
            .update(|tat| self.leases.take_step(tat, now, 1))
            .map(|(d, _, _)| d)
    }

    /// Gives `units` (usable, out of every stripe) of the lease ending at
    /// `end` back to the word, if that lease is still the word's tail.
    /// Returns whether it did.
    fn give_back(&self, end: u64, units: u64) -> bool {
        self.word
            .update(|tat| self.leases.give_back_step(tat, end, units))
    }

    /// Gives back the usable units of every lease that is the shared word's
    /// tail (normally the most recent one), so that they count in the word
    /// again at once. Other leases expire on their own, unit by unit, as
    /// their slots pass (within one burst's time, `burst * T`); until then,
    /// a check that finds the word empty uses them. Returns the units given
    /// back. Call it when a worker goes idle, or before a quiet period.
    ///
    /// ```
    /// # use ratewall::{LeaseOptions, ManualClock, Rate, StripedLimiter};
    /// # use std::time::Duration;
    /// let opts = LeaseOptions::new().stripes(1).max_lease(4).hot_gap(Duration::from_secs(1));
    /// let l = StripedLimiter::with_options(Rate::per_second(10).burst(10), ManualClock::new(), opts)?;
    /// for _ in 0..3 {
    ///     assert!(l.check_at(0).is_allowed()); // leases of 1, then 2
    /// }
    /// let now = l.now();
    /// assert_eq!(l.available_at(now), 7);
    /// assert_eq!(l.release_at(now), 0); // that lease of 2 is used up
    /// assert!(l.check_at(0).is_allowed()); // a lease of 4: 3 held
    /// assert_eq!(l.release_at(now), 3);
    /// assert_eq!(l.available_at(now), 6);
    /// # Ok::<(), ratewall::ConfigError>(())
    /// ```
    pub fn release_at(&self, now: u64) -> u64 {
        let now = self.time.clamp(now);
        self.stripes
            .iter()
            .map(|stripe| {
                self.leases.release::<false>(
                    stripe,
                    0,
                    now,
                    |_| Some(self.word.load()),
                    |_, end, units| self.give_back(end, units),
                )
            })
            .sum()
    }

    /// [`release_at`](Self::release_at) now.
    ///
    /// ```
    /// # use ratewall::{Rate, StripedLimiter};
    /// let l = StripedLimiter::new(Rate::per_second(10))?;
    /// assert_eq!(l.release(), 0);
    /// # Ok::<(), ratewall::ConfigError>(())
    /// ```
    pub fn release(&self) -> u64 {
        self.release_at(self.now())
    }

    /// The units that could be admitted at `now` anywhere: the shared word's
    /// free units plus every lease's usable units. Reads every stripe (for
    /// monitoring and tests, not the hot path); under concurrent checks it
    /// is a snapshot of moving parts.
    ///
    /// ```
    /// # use ratewall::{ManualClock, Rate, StripedLimiter};
    /// let l = StripedLimiter::with_clock(Rate::per_second(10).burst(5), ManualClock::new())?;
    /// assert_eq!(l.available_at(0), 5);
    /// let _ = l.check_at(0);
    /// assert_eq!(l.available_at(0), 4);
    /// # Ok::<(), ratewall::ConfigError>(())
    /// ```
    pub fn available_at(&self, now: u64) -> u64 {
        let now = self.time.clamp(now);
        let p = self.leases.params;
        let held = self.word.load().saturating_sub(now);
        let free = p.tolerance.saturating_sub(held) / p.emission;
        let leased: u64 = self
            .stripes
            .iter()
            .map(|stripe| self.leases.held::<false>(stripe, 0, now))
            .sum();
        free + leased
    }

    /// The burst: the largest number of units admitted at once.
    ///
    /// ```
    /// # use ratewall::{Rate, StripedLimiter};
    /// assert_eq!(StripedLimiter::new(Rate::per_second(100).burst(20))?.capacity(), 20);
    /// # Ok::<(), ratewall::ConfigError>(())
    /// ```
    pub fn capacity(&self) -> u64 {
        self.leases.params.burst
    }

    /// The quota.
    ///
    /// ```
    /// # use ratewall::{Rate, StripedLimiter};
    /// assert_eq!(StripedLimiter::new(Rate::per_second(7))?.quota(), Rate::per_second(7));
    /// # Ok::<(), ratewall::ConfigError>(())
    /// ```
    pub fn quota(&self) -> Rate {
        self.rate
    }

    /// The number of stripes.
    ///
    /// ```
    /// # use ratewall::{LeaseOptions, Rate, StripedLimiter};
    /// let l = StripedLimiter::with_options(Rate::per_second(7), ratewall::ManualClock::new(), LeaseOptions::new().stripes(2))?;
    /// assert_eq!(l.stripes(), 2);
    /// # Ok::<(), ratewall::ConfigError>(())
    /// ```
    pub fn stripes(&self) -> usize {
        self.stripes.len()
    }

    /// The largest lease, in units.
    ///
    /// ```
    /// # use ratewall::{LeaseOptions, Rate, StripedLimiter};
    /// let opts = LeaseOptions::new().stripes(2);
    /// let l = StripedLimiter::with_options(Rate::per_second(100).burst(80), ratewall::ManualClock::new(), opts)?;
    /// assert_eq!(l.max_lease(), 10); // burst / (4 * stripes)
    /// # Ok::<(), ratewall::ConfigError>(())
    /// ```
    pub fn max_lease(&self) -> u64 {
        self.leases.max_lease
    }

    /// One reading of the clock, guarded against backward steps when the
    /// clock is not monotonic.
    ///
    /// ```
    /// # use ratewall::{ManualClock, Rate, StripedLimiter};
    /// let l = StripedLimiter::with_clock(Rate::per_second(7), ManualClock::new())?;
    /// assert_eq!(l.now(), 0);
    /// # Ok::<(), ratewall::ConfigError>(())
    /// ```
    #[inline]
    pub fn now(&self) -> u64 {
        self.time.now()
    }

    /// The clock.
    ///
    /// ```
    /// # use ratewall::{Clock, ManualClock, Rate, StripedLimiter};
    /// let l = StripedLimiter::with_clock(Rate::per_second(7), ManualClock::new())?;
    /// assert_eq!(l.clock().now(), 0);
    /// # Ok::<(), ratewall::ConfigError>(())
    /// ```
    pub fn clock(&self) -> &C {
        self.time.clock()
    }
}

impl<C: Clock> fmt::Debug for StripedLimiter<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StripedLimiter")
            .field("quota", &self.rate)
            .field("stripes", &self.stripes.len())
            .field("max_lease", &self.leases.max_lease)
            .field("word", &*self.word)
            .field("clock", self.time.clock())
            .finish()
    }
}

#[cfg(all(test, not(ratewall_loom)))]
mod tests {
    use super::*;
    use crate::ManualClock;

    fn striped(burst: u64, stripes: usize, max_lease: u64) -> StripedLimiter<ManualClock> {
        let opts = LeaseOptions::new()
            .stripes(stripes)
            .max_lease(max_lease)
            .hot_gap(Duration::from_secs(3600));
        StripedLimiter::with_options(Rate::per_second(10).burst(burst), ManualClock::new(), opts)
            .unwrap()
    }

    #[test]
    fn leases_grow_while_hot_and_conserve_units_in_frozen_time() {
        let l = striped(20, 1, 8);
        // Sizes 2, 4, 8, 8: the first take (cold) is 1.
        let mut admitted = 0;
        for i in 0..20 {
            let d = l.check_stripe(0, 0);
            assert!(d.is_allowed(), "check {i}");
            admitted += 1;
            assert_eq!(l.available_at(0) + admitted, 20, "after check {i}");
            assert_eq!(
                d.remaining(),
                20 - admitted,
                "one stripe: remaining is exact"
            );
        }
        assert!(!l.check_stripe(0, 0).is_allowed());
    }

    #[test]
    fn a_lease_expires_unit_by_unit_and_the_word_gets_them_back() {
        // T = 100 ms, tau = 1000 ms.
        let l = striped(10, 2, 4);
        let ms = 1_000_000;
        let _ = l.check_stripe(0, 0); // a lease of 1, used: TAT 100 ms
        let _ = l.check_stripe(0, 0); // a lease of 2: 1 held, TAT 300 ms
        let _ = l.check_stripe(0, 0); // uses the held one
        let _ = l.check_stripe(0, 0); // a lease of 4: 3 held, slots [300, 700) ms
        assert_eq!(l.available_at(0), 3 + 3);
        // At 350 ms: 3.5 units in use in the word (6 free), 3 held slots
        // still wholly ahead ([400, 700)).
        assert_eq!(l.available_at(350 * ms), 6 + 3);
        // At 450 ms: 7 free in the word, and the slot [400, 500) has begun
        // to pass: 2 held units left usable.
        assert_eq!(l.available_at(450 * ms), 7 + 2);
        let mut d = l.check_stripe(0, 450 * ms);
        assert!(d.is_allowed());
        for _ in 0..8 {
            d = l.check_stripe(0, 450 * ms);
            assert!(d.is_allowed());
        }
        assert!(
            !l.check_stripe(1, 450 * ms).is_allowed(),
            "9 were available at 450 ms"
        );
    }

    #[test]
    fn a_denial_uses_units_held_by_another_stripe_first() {
        // T = 100 ms, tau = 400 ms.
        let l = striped(4, 2, 4);
        assert!(l.check_stripe(0, 0).is_allowed()); // a lease of 1
        assert!(l.check_stripe(0, 0).is_allowed()); // a lease of 2: 1 held
        assert_eq!(l.available_at(0), 2);
        assert!(l.check_stripe(1, 0).is_allowed()); // the word's last unit
        assert_eq!(l.available_at(0), 1);
        // Stripe 1 finds the word empty and uses stripe 0's held unit.
        assert!(l.check_stripe(1, 0).is_allowed());
        assert_eq!(l.available_at(0), 0);
        let d = l.check_stripe(1, 0);
        assert!(!d.is_allowed());
        assert_eq!(d.remaining(), 0);
        assert_eq!(d.retry_after(), Duration::from_millis(100));
        assert_eq!(d.reset_after(), Duration::from_millis(400));
    }

    #[test]
    fn bad_options_are_typed_errors() {
        let r = Rate::per_second(10).burst(5);
        for opts in [
            LeaseOptions::new().stripes(0),
            LeaseOptions::new().stripes(MAX_STRIPES + 1),
            LeaseOptions::new().max_lease(0),
            LeaseOptions::new().max_lease(6),
        ] {
            let e = StripedLimiter::with_options(r, ManualClock::new(), opts).unwrap_err();
            assert!(matches!(e, ConfigError::Incompatible { .. }), "{e}");
        }
        assert!(StripedLimiter::with_options(
            r,
            ManualClock::new(),
            LeaseOptions::new().max_lease(5)
        )
        .is_ok());
        assert!(StripedLimiter::with_clock(Rate::per_second(0), ManualClock::new()).is_err());
    }
}
