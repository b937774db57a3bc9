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
use crate::quota::{Rate, HORIZON};
use crate::sync::{thread_index, AtomicU64, Ordering};
use crate::word::AtomicWord;
use crossbeam_utils::CachePadded;
use std::fmt;
use std::time::Duration;

/// Most stripes a [`StripedLimiter`] accepts.
const MAX_STRIPES: usize = 1024;
/// Largest default lease.
const DEFAULT_MAX_LEASE: u64 = 1 << 16;
/// `last_take` of a stripe that never took.
const NEVER: u64 = u64::MAX;

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

/// One stripe: a lease and its size. Its own cache line.
///
/// ```text
/// lease:  63  62            32 31                 0
///        +---+----------------+--------------------+
///        | L | generation     | units left         |
///        +---+----------------+--------------------+
/// end:   the TAT the lease's take stored (64 bits)
/// ```
///
/// `end` changes only while `L` (an installer's lock) is set, and every lock
/// bumps the generation, so a check that read `lease` and then `end` and
/// compare-exchanges `lease` from the value it read used the `end` of that
/// very lease. The generation wraps after 2^31 installs, far more than can
/// happen between one check's load and its CAS.
#[derive(Debug)]
struct Stripe {
    lease: AtomicU64,
    end: AtomicU64,
    /// The size of this stripe's next lease (a hint: races only mis-size it).
    size: AtomicU64,
    /// When this stripe last took from the word (`NEVER` before its first take).
    last_take: AtomicU64,
}

const UNITS: u64 = (1 << 32) - 1;
const LOCK: u64 = 1 << 63;

/// The units of a lease word (none while an installer holds it).
#[inline]
fn units_of(w: u64) -> u64 {
    if w & LOCK != 0 {
        0
    } else {
        w & UNITS
    }
}

/// The lease word's next generation, unlocked, with no units.
#[inline]
fn next_generation(w: u64) -> u64 {
    (((w >> 32) + 1) & 0x7FFF_FFFF) << 32
}

/// Units of the lease `(units, end)` that may still be admitted at `now`:
/// those whose slot has not started to pass.
#[inline]
fn usable(units: u64, end: u64, now: u64, emission: u64) -> u64 {
    let ahead = end.saturating_sub(now);
    // No overflow: units * T <= burst * T = tau <= 2^62. The common case (no
    // slot has started to pass) needs no division.
    if units * emission <= ahead {
        units
    } else {
        ahead / emission
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
    params: Gcra,
    rate: Rate,
    max_lease: u64,
    hot_gap: u64,
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
        let params = rate.to_gcra()?;
        let stripes = match options.stripes {
            Some(s) => s,
            None => std::thread::available_parallelism()
                .map_or(1, |n| n.get())
                .saturating_mul(2)
                .min(64),
        };
        if stripes == 0 || stripes > MAX_STRIPES {
            return Err(ConfigError::Incompatible {
                reason: "a striped limiter needs between 1 and 1024 stripes",
            });
        }
        let max_lease = match options.max_lease {
            Some(k) => k,
            None => (params.burst / (4 * stripes as u64)).clamp(1, DEFAULT_MAX_LEASE),
        };
        if max_lease == 0 || max_lease > params.burst || max_lease > UNITS {
            return Err(ConfigError::Incompatible {
                reason: "the largest lease must be between 1 and the burst (and below 2^32)",
            });
        }
        let stripes = (0..stripes)
            .map(|_| {
                CachePadded::new(Stripe {
                    lease: AtomicU64::new(0),
                    end: AtomicU64::new(0),
                    size: AtomicU64::new(1),
                    last_take: AtomicU64::new(NEVER),
                })
            })
            .collect();
        Ok(StripedLimiter {
            word: CachePadded::new(AtomicWord::new(0)),
            stripes,
            params,
            rate,
            max_lease,
            hot_gap: u64::try_from(options.hot_gap.as_nanos()).unwrap_or(u64::MAX),
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
        self.check_at_stripe(thread_index(), self.now())
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
        self.check_at_stripe(thread_index(), now)
    }

    /// [`check_at`](Self::check_at) on stripe `stripe % stripes()`, for
    /// callers that number their own workers (a thread pool's worker index).
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
    pub fn check_at_stripe(&self, stripe: usize, now: u64) -> Decision {
        let now = self.clamp(now);
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
        let now = self.clamp(now);
        let p = self.params;
        if n > p.burst {
            return Err(InsufficientCapacity {
                requested: n,
                capacity: p.burst,
            });
        }
        Ok(self.word.update(|tat| {
            let (d, next) = p.step(tat, now, n.max(1));
            (d, if n > 0 { next } else { None })
        }))
    }

    /// Uses one unit of `stripe`'s lease, if it has one usable at `now`;
    /// returns the units left in it.
    #[inline]
    fn use_lease(&self, stripe: &Stripe, now: u64) -> Option<u64> {
        // Acquire: pairs with the Release store that published the lease, so
        // its `end` (stored before) and the word take that made it are visible.
        let mut seen = stripe.lease.load(Ordering::Acquire);
        loop {
            let units = units_of(seen);
            if units == 0 {
                return None;
            }
            // Relaxed: ordered after the Acquire above, so at least this
            // lease's end; a later end belongs to a later lock, which changed
            // the lease word, and the CAS below then fails.
            let end = stripe.end.load(Ordering::Relaxed);
            let u = usable(units, end, now, self.params.emission);
            if u == 0 {
                return None;
            }
            // Success AcqRel: as the load above, and publishes the use to the
            // next user of the stripe. Failure Acquire: as the load above.
            match stripe.lease.compare_exchange(
                seen,
                (seen & !UNITS) | (u - 1),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return Some(u - 1),
                Err(actual) => seen = actual,
            }
        }
    }

    /// An allowed decision for a unit served from a lease that has `left`
    /// units left: `remaining` counts the word's free units and `left`.
    #[inline]
    fn lease_decision(&self, left: u64, now: u64) -> Decision {
        let p = self.params;
        let held = self.word.load().saturating_sub(now);
        // No overflow: tau <= 2^62 and left * T <= burst * T = tau.
        let credit = p.tolerance.saturating_sub(held) + left * p.emission;
        Decision::allow_credit(p.burst, credit, p.emission, held)
    }

    /// Takes a new lease for `stripe` from the word and admits its first
    /// unit; `Err(denial)` if the word has no unit free.
    fn take(&self, stripe: &Stripe, now: u64) -> Result<Decision, Decision> {
        let p = self.params;
        // Relaxed: the size and the last take are hints that publish nothing.
        let last = stripe.last_take.load(Ordering::Relaxed);
        let size = stripe.size.load(Ordering::Relaxed);
        // Hot: this stripe drew more than one unit per `hot_gap` since its
        // last take (of a lease of `size` units).
        let hot = last != NEVER && now.saturating_sub(last) < self.hot_gap.saturating_mul(size);
        let k = if hot {
            size.saturating_mul(2).min(self.max_lease)
        } else {
            (size / 2).max(1)
        };
        let taken = self.word.update(|tat| {
            let held = tat.saturating_sub(now);
            let free = p.tolerance.saturating_sub(held) / p.emission;
            if free == 0 {
                // The plain bucket's denial of a unit request.
                return (Err(p.step(tat, now, 1).0), None);
            }
            let m = k.min(free);
            // m * T <= tau - held, so no overflow and the take is admitted.
            let used = held + m * p.emission;
            let end = now + used;
            // Admit one unit, hold m - 1: remaining is the plain check's,
            // (tau - held - T) / T, which counts the m - 1 held units.
            let credit = p.tolerance - used + (m - 1) * p.emission;
            let d = Decision::allow_credit(p.burst, credit, p.emission, used);
            (Ok((d, m, end)), Some(end))
        });
        // A denial writes nothing, as the plain bucket's (the steal scans of
        // other threads read this line): the hints change only on a take.
        let (d, m, end) = taken?;
        if last != now {
            // Relaxed: hints, as above.
            stripe.last_take.store(now, Ordering::Relaxed);
        }
        if k != size {
            stripe.size.store(k, Ordering::Relaxed);
        }
        if m > 1 {
            self.install(stripe, m - 1, end, now);
        }
        Ok(d)
    }

    /// Puts a fresh lease of `units` ending at `end` into `stripe`. If
    /// another thread on the same stripe installed a usable lease meanwhile,
    /// the fresh units go back to the word (if still its tail) or are left
    /// to expire: never used, so never over-admitted.
    fn install(&self, stripe: &Stripe, units: u64, end: u64, now: u64) {
        // Acquire: as in `use_lease`.
        let mut seen = stripe.lease.load(Ordering::Acquire);
        loop {
            let old = units_of(seen);
            // Relaxed: as in `use_lease`.
            let busy = seen & LOCK != 0
                || (old > 0
                    && usable(
                        old,
                        stripe.end.load(Ordering::Relaxed),
                        now,
                        self.params.emission,
                    ) > 0);
            if busy {
                // Another installer at work, or a usable lease already there.
                self.give_back(end, units);
                return;
            }
            let locked = next_generation(seen) | LOCK;
            // Success AcqRel: Acquire as the load; Release orders the lock
            // before the stores below. Failure Acquire: as the load.
            match stripe
                .lease
                .compare_exchange(seen, locked, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => {
                    // Relaxed: published by the Release store below. Only the
                    // lock holder writes `end` or the lease word now (users
                    // and other installers see no units and a lock).
                    stripe.end.store(end, Ordering::Relaxed);
                    // Release: pairs with `use_lease`'s Acquire load: the
                    // `end` above and the word take before it are visible.
                    stripe
                        .lease
                        .store((locked & !LOCK) | units, Ordering::Release);
                    return;
                }
                Err(actual) => seen = actual,
            }
        }
    }

    /// Gives `units` (usable, out of every stripe) of the lease ending at
    /// `end` back to the word, if that lease is still the word's tail.
    /// Returns whether it did.
    fn give_back(&self, end: u64, units: u64) -> bool {
        let t = self.params.emission;
        self.word.update(|tat| {
            if tat == end && units > 0 {
                (true, Some(end - units * t))
            } else {
                (false, None)
            }
        })
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
        let now = self.clamp(now);
        let mut released = 0;
        for stripe in self.stripes.iter() {
            // Acquire: as in `use_lease`.
            let seen = stripe.lease.load(Ordering::Acquire);
            let units = units_of(seen);
            if units == 0 {
                continue;
            }
            // Relaxed: as in `use_lease`.
            let end = stripe.end.load(Ordering::Relaxed);
            let u = usable(units, end, now, self.params.emission);
            if u == 0 || self.word.load() != end {
                continue; // nothing usable, or not the tail: it expires on its own
            }
            // Take the units out of the stripe first (a new generation, so a
            // check that read the old word fails its CAS), so no one uses
            // them after they are back in the word. Ordering as in `use_lease`.
            let emptied = next_generation(seen);
            if stripe
                .lease
                .compare_exchange(seen, emptied, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
            {
                continue; // in use right now: not idle
            }
            if self.give_back(end, u) {
                released += u;
            } else {
                // A take moved the word meanwhile: put the units back if the
                // stripe is still as we left it (same generation, so the
                // same `end`); otherwise they expire unused.
                let _ = stripe.lease.compare_exchange(
                    emptied,
                    emptied | u,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                );
            }
        }
        released
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
        let now = self.clamp(now);
        let p = self.params;
        let held = self.word.load().saturating_sub(now);
        let mut total = p.tolerance.saturating_sub(held) / p.emission;
        for stripe in self.stripes.iter() {
            // Acquire, then Relaxed: as in `use_lease`.
            let units = units_of(stripe.lease.load(Ordering::Acquire));
            let end = stripe.end.load(Ordering::Relaxed);
            total += usable(units, end, now, p.emission);
        }
        total
    }

    /// The burst: the largest number of units admitted at once.
    ///
    /// ```
    /// # use ratewall::{Rate, StripedLimiter};
    /// assert_eq!(StripedLimiter::new(Rate::per_second(100).burst(20))?.capacity(), 20);
    /// # Ok::<(), ratewall::ConfigError>(())
    /// ```
    pub fn capacity(&self) -> u64 {
        self.params.burst
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
        self.max_lease
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

    #[inline]
    fn clamp(&self, now: u64) -> u64 {
        self.time.clamp(now).min(HORIZON)
    }
}

impl<C: Clock> fmt::Debug for StripedLimiter<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StripedLimiter")
            .field("quota", &self.rate)
            .field("stripes", &self.stripes.len())
            .field("max_lease", &self.max_lease)
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
    fn usable_counts_only_units_whose_slot_has_not_started_to_pass() {
        // T = 10: a lease of 3 ending at 100 owns [70, 100).
        assert_eq!(usable(3, 100, 70, 10), 3);
        assert_eq!(usable(3, 100, 71, 10), 2);
        assert_eq!(usable(3, 100, 90, 10), 1);
        assert_eq!(usable(3, 100, 91, 10), 0);
        assert_eq!(usable(3, 100, 500, 10), 0);
        assert_eq!(usable(1, 100, 0, 10), 1, "never more than the units left");
    }

    #[test]
    fn leases_grow_while_hot_and_conserve_units_in_frozen_time() {
        let l = striped(20, 1, 8);
        // Sizes 2, 4, 8, 8: the first take (cold) is 1.
        let mut admitted = 0;
        for i in 0..20 {
            let d = l.check_at_stripe(0, 0);
            assert!(d.is_allowed(), "check {i}");
            admitted += 1;
            assert_eq!(l.available_at(0) + admitted, 20, "after check {i}");
            assert_eq!(
                d.remaining(),
                20 - admitted,
                "one stripe: remaining is exact"
            );
        }
        assert!(!l.check_at_stripe(0, 0).is_allowed());
    }

    #[test]
    fn a_lease_expires_unit_by_unit_and_the_word_gets_them_back() {
        // T = 100 ms, tau = 1000 ms.
        let l = striped(10, 2, 4);
        let ms = 1_000_000;
        let _ = l.check_at_stripe(0, 0); // a lease of 1, used: TAT 100 ms
        let _ = l.check_at_stripe(0, 0); // a lease of 2: 1 held, TAT 300 ms
        let _ = l.check_at_stripe(0, 0); // uses the held one
        let _ = l.check_at_stripe(0, 0); // a lease of 4: 3 held, slots [300, 700) ms
        assert_eq!(l.available_at(0), 3 + 3);
        // At 350 ms: 3.5 units in use in the word (6 free), 3 held slots
        // still wholly ahead ([400, 700)).
        assert_eq!(l.available_at(350 * ms), 6 + 3);
        // At 450 ms: 7 free in the word, and the slot [400, 500) has begun
        // to pass: 2 held units left usable.
        assert_eq!(l.available_at(450 * ms), 7 + 2);
        let mut d = l.check_at_stripe(0, 450 * ms);
        assert!(d.is_allowed());
        for _ in 0..8 {
            d = l.check_at_stripe(0, 450 * ms);
            assert!(d.is_allowed());
        }
        assert!(
            !l.check_at_stripe(1, 450 * ms).is_allowed(),
            "9 were available at 450 ms"
        );
    }

    #[test]
    fn a_denial_uses_units_held_by_another_stripe_first() {
        // T = 100 ms, tau = 400 ms.
        let l = striped(4, 2, 4);
        assert!(l.check_at_stripe(0, 0).is_allowed()); // a lease of 1
        assert!(l.check_at_stripe(0, 0).is_allowed()); // a lease of 2: 1 held
        assert_eq!(l.available_at(0), 2);
        assert!(l.check_at_stripe(1, 0).is_allowed()); // the word's last unit
        assert_eq!(l.available_at(0), 1);
        // Stripe 1 finds the word empty and uses stripe 0's held unit.
        assert!(l.check_at_stripe(1, 0).is_allowed());
        assert_eq!(l.available_at(0), 0);
        let d = l.check_at_stripe(1, 0);
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
