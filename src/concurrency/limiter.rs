//! `ConcurrencyLimiter`: how many requests are in flight, in one atomic
//! word, and its builder; admission (`try_admit`) and release. The public
//! acquiring methods, which wrap an admission in a permit, are in
//! `permit.rs`.
//!
//! An uncontended acquire plus release is two atomic read-modify-writes:
//! the admission's compare-exchange (`AtomicWord::apply` in `try_admit`)
//! and the release's `fetch_sub` (`release`), whose returned word also says
//! whether a waiter is queued (`waiters.rs`). Everything else on that path
//! is a plain load or store: the mean hold time is updated with a relaxed
//! load and store (a racing update may be lost: it is a hint), and only one
//! permit in 16 per thread is timed, unless the limit is adaptive (then
//! every permit is, and each release adds the controller's compare-exchange).

use super::adaptive::{Adaptive, Controller, Outcome};
use super::priority::{Priority, Shares};
use super::waiters::{Counts, Waiters};
use crate::algo::concurrency::{self as algo, InFlight, MAX_PERMITS};
use crate::clock::Clock;
use crate::decision::Decision;
use crate::error::{ConfigError, InsufficientCapacity};
use crate::limiter::DefaultClock;
use crate::sync::{AtomicU64, Ordering};
use crate::word::AtomicWord;
use crossbeam_utils::CachePadded;
use std::time::Duration;

/// A permit's `start` when it was not timed.
pub(super) const UNTIMED: u64 = u64::MAX;

/// What a permit holds: its units, when it was taken (or `UNTIMED`), and
/// the outcome its holder reported. The input of a release.
#[derive(Debug)]
pub(crate) struct Held {
    pub(crate) units: u64,
    pub(crate) start: u64,
    pub(crate) outcome: Option<Outcome>,
}

/// A limit on how many requests are in flight at once: a database pool, a
/// billing call, a GPU. Each admitted request holds a permit of `n` units
/// until it drops it.
///
/// The count and the maximum share one atomic word: admission is one
/// compare-exchange, release one `fetch_sub`, so at the moment of every
/// admission the units in flight are at most the maximum. The maximum can
/// change at run time ([`set_max`](Self::set_max)), or follow the backend's
/// latency ([`Adaptive`]). Requests can be given a [`Priority`], with
/// shares of the maximum kept for the higher classes.
///
/// # Example
///
/// ```
/// use ratewall::ConcurrencyLimiter;
///
/// let pool = ConcurrencyLimiter::new(2)?;
/// let a = pool.try_acquire().into_permit().unwrap();
/// let b = pool.try_acquire().into_permit().unwrap();
/// let denied = pool.try_acquire();
/// assert!(!denied.is_allowed()); // 503, or try a replica
/// drop(a);
/// assert!(pool.try_acquire().is_allowed());
/// # drop(b);
/// # Ok::<(), ratewall::ConfigError>(())
/// ```
#[derive(Debug)]
pub struct ConcurrencyLimiter<C: Clock = DefaultClock> {
    /// The word (waiters, max, in flight) and the mean hold time: written
    /// together by releases, so they share a cache line.
    pub(super) state: CachePadded<State>,
    pub(super) shares: Shares,
    adaptive: Option<Controller>,
    clock: C,
    /// Who waits for a permit (touched only when someone does).
    pub(super) waiters: Waiters,
}

#[derive(Debug)]
pub(super) struct State {
    pub(super) word: AtomicWord,
    /// Exponentially weighted mean hold time in ns (weight 1/8), 0 until
    /// the first timed permit comes back.
    pub(super) hold_ns: AtomicU64,
}

/// Builds a [`ConcurrencyLimiter`] with kept shares, an adaptive
/// maximum or another clock.
///
/// # Example
///
/// ```
/// use ratewall::{Adaptive, ConcurrencyLimiter, ManualClock, Priority};
///
/// let l = ConcurrencyLimiter::builder(50)
///     .keep_for(Priority::Critical, 20)
///     .keep_for(Priority::Normal, 30)
///     .adaptive(Adaptive::vegas(10, 200))
///     .clock(ManualClock::new())
///     .build()?;
/// assert_eq!(l.max(), 50);
/// # Ok::<(), ratewall::ConfigError>(())
/// ```
#[derive(Debug)]
pub struct ConcurrencyBuilder<C = DefaultClock> {
    max: u64,
    kept_pct: [u8; 3],
    adaptive: Option<Adaptive>,
    fair: bool,
    clock: C,
}

impl ConcurrencyBuilder<DefaultClock> {
    fn new(max: u64) -> Self {
        ConcurrencyBuilder {
            max,
            kept_pct: [0; 3],
            adaptive: None,
            fair: false,
            clock: DefaultClock::default(),
        }
    }
}

impl<C: Clock> ConcurrencyBuilder<C> {
    /// Keeps `percent` of the maximum for `class` and the classes above
    /// it: the classes below never fill it. Keeping a share for
    /// [`Priority::Sheddable`] (nothing ranks below it) or keeping 100% or
    /// more in total is a configuration error.
    ///
    /// ```
    /// # use ratewall::{ConcurrencyLimiter, Priority};
    /// let l = ConcurrencyLimiter::builder(10).keep_for(Priority::Critical, 20).build()?;
    /// # let _ = l;
    /// # Ok::<(), ratewall::ConfigError>(())
    /// ```
    pub fn keep_for(mut self, class: Priority, percent: u8) -> Self {
        self.kept_pct[Shares::kept_index(class)] = percent;
        self
    }

    /// Makes the maximum adaptive; the builder's maximum is where it starts.
    ///
    /// ```
    /// # use ratewall::{Adaptive, ConcurrencyLimiter};
    /// let l = ConcurrencyLimiter::builder(10).adaptive(Adaptive::vegas(2, 100)).build()?;
    /// # let _ = l;
    /// # Ok::<(), ratewall::ConfigError>(())
    /// ```
    pub fn adaptive(mut self, adaptive: Adaptive) -> Self {
        self.adaptive = Some(adaptive);
        self
    }

    /// Makes waiting fair: waiters are admitted in order of class, then of
    /// arrival, and none passes a waiter it queued behind (a stream of
    /// small requests cannot starve a large one). Without it (the default)
    /// a release admits every waiter that fits, and a waiting acquire first
    /// tries at once even if others wait. Either way [`try_acquire`](ConcurrencyLimiter::try_acquire)
    /// does not wait and does not queue: it takes what is free now.
    ///
    /// ```
    /// # use ratewall::ConcurrencyLimiter;
    /// let l = ConcurrencyLimiter::builder(10).fair_waiting().build()?;
    /// # let _ = l;
    /// # Ok::<(), ratewall::ConfigError>(())
    /// ```
    pub fn fair_waiting(mut self) -> Self {
        self.fair = true;
        self
    }

    /// The clock that times permits (the mean hold time, the adaptive
    /// samples); tests use [`ManualClock`](crate::ManualClock).
    ///
    /// ```
    /// # use ratewall::{ConcurrencyLimiter, ManualClock};
    /// let l = ConcurrencyLimiter::builder(10).clock(ManualClock::new()).build()?;
    /// # let _ = l;
    /// # Ok::<(), ratewall::ConfigError>(())
    /// ```
    pub fn clock<C2: Clock>(self, clock: C2) -> ConcurrencyBuilder<C2> {
        ConcurrencyBuilder {
            max: self.max,
            kept_pct: self.kept_pct,
            adaptive: self.adaptive,
            fair: self.fair,
            clock,
        }
    }

    /// Validates and builds: a maximum of 0 or above [`MAX_PERMITS`], bad
    /// shares and bad adaptive bounds are typed errors.
    ///
    /// ```
    /// # use ratewall::{ConcurrencyLimiter, ConfigError};
    /// assert_eq!(ConcurrencyLimiter::builder(0).build().unwrap_err(), ConfigError::ZeroLimit);
    /// ```
    pub fn build(self) -> Result<ConcurrencyLimiter<C>, ConfigError> {
        check_max(self.max)?;
        let shares = Shares::new(self.kept_pct)?;
        let adaptive = match self.adaptive {
            Some(a) => Some(Controller::new(a, self.max)?),
            None => None,
        };
        Ok(ConcurrencyLimiter {
            state: CachePadded::new(State {
                word: AtomicWord::new(InFlight::fresh(self.max)),
                hold_ns: AtomicU64::new(0),
            }),
            shares,
            adaptive,
            clock: self.clock,
            waiters: Waiters::new(self.fair),
        })
    }
}

pub(crate) fn check_max(max: u64) -> Result<(), ConfigError> {
    match max {
        0 => Err(ConfigError::ZeroLimit),
        m if m > MAX_PERMITS => Err(ConfigError::LimitTooLarge {
            limit: m,
            max: MAX_PERMITS,
        }),
        _ => Ok(()),
    }
}

/// One permit in 16 per thread is timed for the mean hold time: a clock
/// read costs as much as the rest of an acquire. A thread-local counter, so
/// deciding writes no shared memory. Under loom every permit is timed: a
/// thread-local outlives loom's executions, and the model must repeat.
#[cfg(ratewall_loom)]
#[inline]
fn sample_this_one() -> bool {
    true
}

/// See the loom version above.
#[cfg(not(ratewall_loom))]
#[inline]
fn sample_this_one() -> bool {
    use std::cell::Cell;
    thread_local! {
        static TICK: Cell<u8> = const { Cell::new(0) };
    }
    TICK.with(|t| {
        let v = t.get().wrapping_add(1);
        t.set(v);
        v % 16 == 0
    })
}

impl ConcurrencyLimiter<DefaultClock> {
    /// A limit of `max` units in flight, on the default clock.
    ///
    /// ```
    /// # use ratewall::{ConcurrencyLimiter, ConfigError};
    /// let l = ConcurrencyLimiter::new(8)?;
    /// assert_eq!(l.max(), 8);
    /// assert_eq!(ConcurrencyLimiter::new(0).unwrap_err(), ConfigError::ZeroLimit);
    /// # Ok::<(), ConfigError>(())
    /// ```
    pub fn new(max: u64) -> Result<Self, ConfigError> {
        Self::builder(max).build()
    }

    /// A builder, for kept shares, an adaptive maximum or another clock.
    ///
    /// ```
    /// # use ratewall::ConcurrencyLimiter;
    /// let l = ConcurrencyLimiter::builder(8).build()?;
    /// # let _ = l;
    /// # Ok::<(), ratewall::ConfigError>(())
    /// ```
    pub fn builder(max: u64) -> ConcurrencyBuilder<DefaultClock> {
        ConcurrencyBuilder::new(max)
    }
}

impl<C: Clock> ConcurrencyLimiter<C> {
    /// The one admission path: one compare-exchange when admitted, none
    /// when denied.
    #[inline]
    pub(crate) fn try_admit(
        &self,
        n: u64,
        class: Priority,
    ) -> Result<(Decision, Option<Held>), InsufficientCapacity> {
        let share = self.shares.cap_pct(class);
        // Relaxed: a hint read for the decision; it orders nothing.
        let hold = self.state.hold_ns.load(Ordering::Relaxed);
        // `apply` loads the word (Acquire) and compare-exchanges (AcqRel);
        // the Acquire pairs with the Release `fetch_sub` of the permits
        // released before, so this holder sees what theirs did (the
        // semaphore contract). A denial writes nothing.
        let (decision, _) = self
            .state
            .word
            .apply(|word| algo::acquire(word, n, share, hold));
        let decision = decision?;
        if !decision.is_allowed() {
            return Ok((decision, None));
        }
        Ok((decision, Some(self.held(n, hold))))
    }

    /// What the waiters' queue works on.
    #[inline]
    pub(super) fn counts(&self) -> Counts<'_> {
        Counts {
            word: &self.state.word,
            shares: &self.shares,
            // Relaxed: a hint for the decisions; it orders nothing.
            hold_ns: self.state.hold_ns.load(Ordering::Relaxed),
        }
    }

    /// A release or a re-size found the waiters' mark: serve whoever fits
    /// now. Out of line, so the release without waiters stays small.
    #[cold]
    #[inline(never)]
    fn wake_waiters(&self) {
        self.waiters.wake(self.counts());
    }

    /// What an admitted permit of `n` holds: timed if the limit is
    /// adaptive, no hold time is known yet, or this is one permit in 16.
    #[inline]
    pub(super) fn held(&self, n: u64, hold: u64) -> Held {
        let start = if self.adaptive.is_some() || hold == 0 || sample_this_one() {
            self.clock.now()
        } else {
            UNTIMED
        };
        Held {
            units: n,
            start,
            outcome: None,
        }
    }

    /// Gives a permit's units back (its `Drop`): one `fetch_sub`, whose
    /// returned word says whether a waiter is queued (then the queue is
    /// woken, out of line); a timed permit then feeds its hold time to the
    /// mean and the controller.
    #[inline]
    pub(crate) fn release(&self, held: &Held) {
        let before = self.state.word.fetch_sub(algo::release_delta(held.units));
        if algo::has_waiters(before) {
            self.wake_waiters();
        }
        if held.start != UNTIMED {
            self.record(held, before);
        }
    }

    /// The timed part of a release, out of line: one permit in 16, or every
    /// permit of an adaptive limit.
    #[inline(never)]
    fn record(&self, held: &Held, before: u64) {
        let hold = self.clock.now().saturating_sub(held.start);
        // Relaxed load and store, not a read-modify-write: two racing
        // releases may lose one sample, which a hint can afford.
        let old = self.state.hold_ns.load(Ordering::Relaxed);
        self.state.hold_ns.store(
            crate::algo::concurrency::mean_hold(old, hold),
            Ordering::Relaxed,
        );
        if let Some(controller) = &self.adaptive {
            let outcome = held.outcome.unwrap_or(if std::thread::panicking() {
                Outcome::Dropped
            } else {
                Outcome::Success
            });
            let in_flight = InFlight::unpack(before).in_flight;
            let limit = controller.sample(hold, outcome, in_flight);
            self.resize(limit);
        }
    }

    fn resize(&self, max: u64) {
        // The shared CAS helper; a re-size to the same maximum writes nothing.
        let waiting = self.state.word.update(|word| {
            if InFlight::unpack(word).max == max {
                (false, None)
            } else {
                (algo::has_waiters(word), algo::set_max(word, max).1)
            }
        });
        // A new maximum may admit waiters (raised) or rule some out for good
        // (lowered below their cost): the queue hears of it either way.
        if waiting {
            self.wake_waiters();
        }
    }

    /// Changes the maximum now, keeping the permits out: raising it admits
    /// at once (waiters first); lowering it below the units in flight admits nothing until
    /// enough are released (no permit is revoked or stranded). An adaptive
    /// limit refuses: it moves its maximum itself.
    ///
    /// ```
    /// # use ratewall::ConcurrencyLimiter;
    /// let l = ConcurrencyLimiter::new(3)?;
    /// let held: Vec<_> = (0..3).map(|_| l.try_acquire()).collect();
    /// l.set_max(1)?;
    /// assert_eq!((l.max(), l.in_flight()), (1, 3));
    /// drop(held);
    /// assert_eq!(l.in_flight(), 0);
    /// assert!(l.try_acquire().is_allowed());
    /// # Ok::<(), ratewall::ConfigError>(())
    /// ```
    pub fn set_max(&self, max: u64) -> Result<(), ConfigError> {
        check_max(max)?;
        if self.adaptive.is_some() {
            return Err(ConfigError::Incompatible {
                reason: "this limit is adaptive and moves its maximum itself; build a limiter with other floor and ceiling instead",
            });
        }
        self.resize(max);
        Ok(())
    }

    /// The current maximum.
    ///
    /// ```
    /// # use ratewall::ConcurrencyLimiter;
    /// assert_eq!(ConcurrencyLimiter::new(7)?.max(), 7);
    /// # Ok::<(), ratewall::ConfigError>(())
    /// ```
    pub fn max(&self) -> u64 {
        InFlight::unpack(self.state.word.load()).max
    }

    /// The units in flight now.
    ///
    /// ```
    /// # use ratewall::ConcurrencyLimiter;
    /// let l = ConcurrencyLimiter::new(7)?;
    /// let _p = l.try_acquire_n(2).unwrap();
    /// assert_eq!(l.in_flight(), 2);
    /// # Ok::<(), ratewall::ConfigError>(())
    /// ```
    pub fn in_flight(&self) -> u64 {
        InFlight::unpack(self.state.word.load()).in_flight
    }

    /// The adaptive floor and ceiling, if the maximum is adaptive.
    ///
    /// ```
    /// # use ratewall::{Adaptive, ConcurrencyLimiter};
    /// let l = ConcurrencyLimiter::builder(10).adaptive(Adaptive::vegas(2, 100)).build()?;
    /// assert_eq!(l.adaptive_bounds(), Some((2, 100)));
    /// # Ok::<(), ratewall::ConfigError>(())
    /// ```
    pub fn adaptive_bounds(&self) -> Option<(u64, u64)> {
        self.adaptive.as_ref().map(|c| (c.floor(), c.ceiling()))
    }

    /// The observed mean time a permit is held (an exponentially weighted
    /// mean over a sample of permits), zero before the first comes back.
    /// A denial's `retry_after` is this hint.
    ///
    /// ```
    /// # use ratewall::{ConcurrencyLimiter, ManualClock};
    /// # use std::time::Duration;
    /// let clock = ManualClock::new();
    /// let l = ConcurrencyLimiter::builder(1).clock(clock.clone()).build()?;
    /// let p = l.try_acquire();
    /// clock.advance(Duration::from_millis(40));
    /// drop(p);
    /// assert_eq!(l.mean_hold_time(), Duration::from_millis(40));
    /// # Ok::<(), ratewall::ConfigError>(())
    /// ```
    pub fn mean_hold_time(&self) -> Duration {
        // Relaxed: a hint; it orders nothing.
        Duration::from_nanos(self.state.hold_ns.load(Ordering::Relaxed))
    }
}
