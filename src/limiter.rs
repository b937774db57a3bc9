//! One limiter (one key), generic over the algorithm and the clock.

use crate::algo::{Algorithm, FixedCounter, Gcra, LeakyGcra, SlidingCounter, SlidingLog};
use crate::clock::{Clock, Timebase};
use crate::decision::Decision;
use crate::error::{ConfigError, InsufficientCapacity};
use crate::sync::{lock, Mutex};
use crate::wait::{Attempt, AttemptCore, Outcome, Token, Wait};
use crate::word::ParamCell;
use crossbeam_utils::CachePadded;
use std::fmt;
use std::time::Duration;

/// The clock limiters use unless told otherwise: [`QuantaClock`](crate::QuantaClock)
/// with the `quanta` feature (the default), [`StdClock`](crate::StdClock) without.
#[cfg(feature = "quanta")]
pub type DefaultClock = crate::clock::QuantaClock;
/// The clock limiters use unless told otherwise: [`QuantaClock`](crate::QuantaClock)
/// with the `quanta` feature (the default), [`StdClock`](crate::StdClock) without.
#[cfg(not(feature = "quanta"))]
pub type DefaultClock = crate::clock::StdClock;

/// A token bucket (GCRA): `burst` requests at once, refilled at the rate.
///
/// # Example
///
/// ```
/// use ratewall::{Rate, TokenBucket};
///
/// let bucket = TokenBucket::new(Rate::per_second(100).burst(20))?;
/// let decision = bucket.check();
/// if decision.is_allowed() {
///     // serve the request
/// } else {
///     println!("429, Retry-After: {}", decision.retry_after_secs());
/// }
/// # Ok::<(), ratewall::ConfigError>(())
/// ```
pub type TokenBucket<C = DefaultClock> = Limiter<Gcra, C>;

/// A leaky bucket (GCRA): a meter that rejects overflow (`check`), or a
/// shaper that queues and spaces requests (`reserve`, `pace_blocking`).
///
/// # Example
///
/// ```
/// use ratewall::{LeakyBucket, Rate};
///
/// // Leak 50 per second; hold at most 10.
/// let leaky = LeakyBucket::new(Rate::per_second(50).burst(10))?;
/// match leaky.reserve() {
///     Ok(slot) => std::thread::sleep(slot.delay()), // then send
///     Err(full) => println!("queue full, retry in {:?}", full.retry_after()),
/// }
/// # Ok::<(), ratewall::ConfigError>(())
/// ```
pub type LeakyBucket<C = DefaultClock> = Limiter<LeakyGcra, C>;

/// A fixed window: at most `limit` per aligned window `[k*W, (k+1)*W)`, so up
/// to twice the limit across a window boundary. One atomic word per key.
///
/// # Example
///
/// ```
/// use ratewall::{FixedWindow, ManualClock, Window};
/// use std::time::Duration;
///
/// let clock = ManualClock::new();
/// let fixed = FixedWindow::with_clock(Window::per_second(2), clock.clone())?;
/// assert!(fixed.check().is_allowed());
/// assert!(fixed.check().is_allowed());
/// let denied = fixed.check();
/// assert_eq!(denied.retry_after(), Duration::from_secs(1)); // the window's end
/// clock.advance(Duration::from_secs(1));
/// assert!(fixed.check().is_allowed()); // a new window
/// # Ok::<(), ratewall::ConfigError>(())
/// ```
pub type FixedWindow<C = DefaultClock> = Limiter<FixedCounter, C>;

/// A sliding-window counter: the previous window's count, weighted by how
/// much of it the rolling window still covers, plus the current count. At
/// most `limit` per aligned window and close to it over any rolling window,
/// in one atomic word per key.
///
/// # Example
///
/// ```
/// use ratewall::{ManualClock, SlidingWindowCounter, Window};
/// use std::time::Duration;
///
/// let clock = ManualClock::new();
/// let sliding = SlidingWindowCounter::with_clock(Window::per_minute(100), clock.clone())?;
/// assert!(sliding.check_n(100)?.is_allowed());
/// clock.advance(Duration::from_secs(75)); // 15 s into the next minute
/// // 100 * 45/60 = 75 of the previous minute still count.
/// assert_eq!(sliding.check().remaining(), 24);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub type SlidingWindowCounter<C = DefaultClock> = Limiter<SlidingCounter, C>;

/// An exact sliding-window log: never more than `limit` in any rolling
/// window of length `W`. Keeps one timestamp per admitted unit (a ring of
/// `limit` entries per key, behind a per-key lock).
///
/// # Example
///
/// ```
/// use ratewall::{ManualClock, SlidingWindowLog, Window};
/// use std::time::Duration;
///
/// let clock = ManualClock::new();
/// let log = SlidingWindowLog::with_clock(Window::per_second(2), clock.clone())?;
/// clock.set(Duration::from_millis(900));
/// assert!(log.check_n(2)?.is_allowed());
/// clock.set(Duration::from_millis(1100)); // a new aligned window, same rolling one
/// let denied = log.check();
/// assert!(!denied.is_allowed());
/// assert_eq!(denied.retry_after(), Duration::from_millis(800)); // at 1.9 s
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub type SlidingWindowLog<C = DefaultClock> = Limiter<SlidingLog, C>;

/// A rate limiter for one key: algorithm `A`, clock `C`.
///
/// Use it through the aliases [`TokenBucket`], [`LeakyBucket`] and the window
/// types. All methods take `&self`; share a limiter between threads with an
/// `Arc` or a `static`. The state is one cache-padded atomic word (a ring of
/// admission runs for the sliding log): an allowed check is one compare-exchange,
/// a denied check writes nothing.
///
/// # Example
///
/// ```
/// use ratewall::{ManualClock, Rate, TokenBucket};
/// use std::time::Duration;
///
/// let clock = ManualClock::new();
/// let bucket = TokenBucket::with_clock(Rate::per_second(10).burst(2), clock.clone())?;
/// assert!(bucket.check().is_allowed());
/// assert!(bucket.check().is_allowed());
/// let denied = bucket.check();
/// assert!(!denied.is_allowed());
/// assert_eq!(denied.retry_after(), Duration::from_millis(100));
/// clock.advance(Duration::from_millis(100));
/// assert!(bucket.check().is_allowed());
/// # Ok::<(), ratewall::ConfigError>(())
/// ```
pub struct Limiter<A: Algorithm, C: Clock = DefaultClock> {
    state: CachePadded<A::Cell>,
    params: CachePadded<ParamCell>,
    time: Timebase<C>,
    /// Serializes quota changes; holds the configuration they were built from.
    config: Mutex<A::Config>,
}

impl<A: Algorithm> Limiter<A, DefaultClock> {
    /// A limiter on the default clock.
    ///
    /// ```
    /// use ratewall::{Rate, TokenBucket};
    /// let bucket = TokenBucket::new(Rate::per_minute(600))?;
    /// assert!(bucket.check().is_allowed());
    /// # Ok::<(), ratewall::ConfigError>(())
    /// ```
    pub fn new(config: A::Config) -> Result<Self, ConfigError> {
        Self::with_clock(config, DefaultClock::default())
    }
}

impl<A: Algorithm, C: Clock> Limiter<A, C> {
    /// A limiter on the given clock.
    ///
    /// ```
    /// use ratewall::{ManualClock, Rate, TokenBucket};
    /// let bucket = TokenBucket::with_clock(Rate::per_second(1), ManualClock::new())?;
    /// assert!(bucket.check().is_allowed());
    /// # Ok::<(), ratewall::ConfigError>(())
    /// ```
    pub fn with_clock(config: A::Config, clock: C) -> Result<Self, ConfigError> {
        let params = A::from_config(&config)?;
        Ok(Limiter {
            state: CachePadded::new(params.new_cell()),
            params: CachePadded::new(ParamCell::new(params)),
            time: Timebase::new(clock),
            config: Mutex::new(config),
        })
    }

    /// Checks one request of cost 1 and takes it if allowed.
    ///
    /// ```
    /// # use ratewall::{Rate, TokenBucket};
    /// let bucket = TokenBucket::new(Rate::per_second(3).burst(3)).unwrap();
    /// let allowed = (0..5).filter(|_| bucket.check().is_allowed()).count();
    /// assert_eq!(allowed, 3);
    /// ```
    #[inline(always)]
    pub fn check(&self) -> Decision {
        self.check_at(self.now())
    }

    /// Checks a request of cost `n` (for example bytes, or a batch) and takes
    /// all of it if allowed, nothing otherwise. A cost above the limiter's
    /// capacity could never pass and is an error. A cost of 0 takes nothing.
    ///
    /// ```
    /// # use ratewall::{Rate, TokenBucket};
    /// let bucket = TokenBucket::new(Rate::per_second(10).burst(10)).unwrap();
    /// assert!(bucket.check_n(8).unwrap().is_allowed());
    /// assert!(!bucket.check_n(8).unwrap().is_allowed());
    /// assert!(bucket.check_n(11).is_err());
    /// ```
    #[inline]
    pub fn check_n(&self, n: u64) -> Result<Decision, InsufficientCapacity> {
        self.check_n_at(self.now(), n)
    }

    /// [`check`](Self::check) at a time the caller read (from
    /// [`now`](Self::now) or this limiter's clock), so that several
    /// limiters can share one clock read.
    ///
    /// Readings earlier than one already used never let extra requests
    /// through; with a clock that is not monotonic, the limiter also treats
    /// them as its latest reading.
    ///
    /// ```
    /// # use ratewall::{Rate, TokenBucket};
    /// let per_ip = TokenBucket::new(Rate::per_second(5)).unwrap();
    /// let global = TokenBucket::new(Rate::per_second(1000)).unwrap();
    /// let t = per_ip.now(); // one read; all QuantaClocks share an epoch
    /// assert!(per_ip.check_at(t).is_allowed() && global.check_at(t).is_allowed());
    /// ```
    #[inline(always)]
    pub fn check_at(&self, now: u64) -> Decision {
        match A::check(&self.state, &self.params, self.time.clamp(now), 1, true) {
            Ok(d) => d,
            // Every algorithm's capacity is at least 1 (validated at construction).
            Err(_) => unreachable_capacity(),
        }
    }

    /// [`check_n`](Self::check_n) at a time the caller read.
    ///
    /// ```
    /// # use ratewall::{ManualClock, Rate, TokenBucket};
    /// let bucket = TokenBucket::with_clock(Rate::per_second(10), ManualClock::new()).unwrap();
    /// assert_eq!(bucket.check_n_at(0, 4).unwrap().remaining(), 6);
    /// ```
    #[inline]
    pub fn check_n_at(&self, now: u64, n: u64) -> Result<Decision, InsufficientCapacity> {
        A::check(&self.state, &self.params, self.time.clamp(now), n, true)
    }

    /// The decision a unit request would get now, without taking anything.
    ///
    /// ```
    /// # use ratewall::{Rate, TokenBucket};
    /// let bucket = TokenBucket::new(Rate::per_second(1).burst(1)).unwrap();
    /// assert!(bucket.peek().is_allowed());
    /// assert!(bucket.peek().is_allowed()); // still there
    /// assert!(bucket.check().is_allowed());
    /// assert!(!bucket.peek().is_allowed());
    /// ```
    #[inline]
    pub fn peek(&self) -> Decision {
        match self.peek_n(1) {
            Ok(d) => d,
            Err(_) => unreachable_capacity(),
        }
    }

    /// The decision a request of cost `n` would get now, without taking it.
    ///
    /// ```
    /// # use ratewall::{Rate, TokenBucket};
    /// let bucket = TokenBucket::new(Rate::per_second(10).burst(5)).unwrap();
    /// assert!(bucket.peek_n(5).unwrap().is_allowed());
    /// assert_eq!(bucket.check().remaining(), 4); // peek took nothing
    /// ```
    #[inline]
    pub fn peek_n(&self, n: u64) -> Result<Decision, InsufficientCapacity> {
        A::check(&self.state, &self.params, self.time.clamped_now(), n, false)
    }

    /// [`peek_n`](Self::peek_n) at a time the caller read (multi-limit checks).
    #[inline]
    pub(crate) fn peek_n_at(&self, now: u64, n: u64) -> Result<Decision, InsufficientCapacity> {
        A::check(&self.state, &self.params, self.time.clamp(now), n, false)
    }

    /// Gives back `n` units that an allowed check took (a cancelled
    /// reservation, a request that failed before doing work). The limiter
    /// never holds more than its capacity, so an over-refund is harmless.
    ///
    /// ```
    /// # use ratewall::{Rate, TokenBucket};
    /// let bucket = TokenBucket::new(Rate::per_second(1).burst(2)).unwrap();
    /// let _ = bucket.check_n(2).unwrap();
    /// assert!(!bucket.peek().is_allowed());
    /// bucket.refund(1);
    /// assert!(bucket.check().is_allowed());
    /// ```
    pub fn refund(&self, n: u64) {
        self.refund_at(self.now(), n);
    }

    /// [`refund`](Self::refund) at a time the caller read, the one the
    /// refunded check used (window algorithms give the units back to the
    /// window they were taken from, if it is still current).
    ///
    /// ```
    /// # use ratewall::{Rate, TokenBucket};
    /// let bucket = TokenBucket::new(Rate::per_second(1).burst(1)).unwrap();
    /// let t = bucket.now();
    /// assert!(bucket.check_at(t).is_allowed());
    /// bucket.refund_at(t, 1);
    /// assert!(bucket.check_at(t).is_allowed());
    /// ```
    pub fn refund_at(&self, now: u64, n: u64) {
        A::refund(&self.state, &self.params, self.time.clamp(now), n);
    }

    /// Forgets all history: the limiter is as if just built.
    ///
    /// ```
    /// # use ratewall::{Rate, TokenBucket};
    /// let bucket = TokenBucket::new(Rate::per_hour(1)).unwrap();
    /// let _ = bucket.check();
    /// assert!(!bucket.peek().is_allowed());
    /// bucket.reset();
    /// assert!(bucket.check().is_allowed());
    /// ```
    pub fn reset(&self) {
        A::reset(&self.state);
    }

    /// Changes the quota at run time and keeps the state: usage taken under
    /// the old quota is carried over (for the buckets, the tokens in use; at
    /// most a full bucket's worth under the new burst).
    ///
    /// Checks that race with the change are decided under the old quota or the
    /// new one, never a mix of the two.
    ///
    /// ```
    /// # use ratewall::{ManualClock, Rate, TokenBucket};
    /// let bucket = TokenBucket::with_clock(Rate::per_second(10).burst(10), ManualClock::new()).unwrap();
    /// let _ = bucket.check_n(4).unwrap();
    /// bucket.set_quota(Rate::per_second(100).burst(20)).unwrap();
    /// assert_eq!(bucket.peek().remaining(), 15); // 4 still in use, 1 for the peek
    /// assert!(bucket.set_quota(Rate::per_second(0)).is_err());
    /// ```
    pub fn set_quota(&self, config: A::Config) -> Result<(), ConfigError> {
        let new = A::from_config(&config)?;
        let mut current = lock(&self.config);
        let old: A = self.params.read();
        let now = self.time.clamped_now();
        self.params.begin();
        A::rescale(&self.state, &old, &new, now);
        self.params.publish(new);
        *current = config;
        Ok(())
    }

    /// The quota in force.
    ///
    /// ```
    /// # use ratewall::{Rate, TokenBucket};
    /// let bucket = TokenBucket::new(Rate::per_second(7)).unwrap();
    /// assert_eq!(bucket.quota(), Rate::per_second(7));
    /// ```
    pub fn quota(&self) -> A::Config {
        *lock(&self.config)
    }

    /// The largest cost this limiter admits at once (burst or limit).
    ///
    /// ```
    /// # use ratewall::{Rate, TokenBucket};
    /// assert_eq!(TokenBucket::new(Rate::per_second(100).burst(20)).unwrap().capacity(), 20);
    /// ```
    pub fn capacity(&self) -> u64 {
        self.params.read::<A>().capacity()
    }

    /// Whether the state equals a fresh limiter's (nothing in use).
    ///
    /// ```
    /// # use ratewall::{Rate, TokenBucket};
    /// let bucket = TokenBucket::new(Rate::per_second(10)).unwrap();
    /// assert!(bucket.is_idle());
    /// let _ = bucket.check();
    /// assert!(!bucket.is_idle());
    /// ```
    pub fn is_idle(&self) -> bool {
        let params: A = self.params.read();
        A::is_idle(&self.state, &params, self.time.clamped_now())
    }

    /// One reading of this limiter's clock, in nanoseconds since its epoch,
    /// guarded against backward steps when the clock is not monotonic.
    ///
    /// ```
    /// # use ratewall::{ManualClock, Rate, TokenBucket};
    /// # use std::time::Duration;
    /// let clock = ManualClock::starting_at(Duration::from_secs(5));
    /// let bucket = TokenBucket::with_clock(Rate::per_second(1), clock.clone()).unwrap();
    /// assert_eq!(bucket.now(), 5_000_000_000);
    /// clock.step_back(Duration::from_secs(1));
    /// assert_eq!(bucket.now(), 5_000_000_000);
    /// ```
    #[inline]
    pub fn now(&self) -> u64 {
        self.time.now()
    }

    /// The clock.
    ///
    /// ```
    /// # use ratewall::{Clock, ManualClock, Rate, TokenBucket};
    /// let bucket = TokenBucket::with_clock(Rate::per_second(1), ManualClock::new()).unwrap();
    /// assert_eq!(bucket.clock().now(), 0);
    /// ```
    pub fn clock(&self) -> &C {
        self.time.clock()
    }
}

#[cold]
fn unreachable_capacity() -> Decision {
    // Capacity >= 1 is checked at construction and by every quota change, so
    // a unit cost always fits. Deny rather than panic if that ever broke.
    Decision::deny(0, 0, u64::MAX, u64::MAX)
}

/// A place in a leaky bucket's queue: proceed after [`delay`](Self::delay).
///
/// # Example
///
/// ```
/// use ratewall::{LeakyBucket, ManualClock, Rate};
/// use std::time::Duration;
///
/// let leaky = LeakyBucket::with_clock(Rate::per_second(4).burst(2), ManualClock::new()).unwrap();
/// assert_eq!(leaky.reserve().unwrap().delay(), Duration::ZERO);
/// let second = leaky.reserve().unwrap();
/// assert_eq!(second.delay(), Duration::from_millis(250));
/// assert_eq!(second.decision().remaining(), 0);
/// ```
#[must_use = "a reservation is a place in the queue: wait for its delay, or refund it"]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reservation {
    delay_ns: u64,
    decision: Decision,
}

impl Reservation {
    /// How long to wait before proceeding (0 for the head of the queue).
    ///
    /// ```
    /// # use ratewall::{LeakyBucket, Rate};
    /// let leaky = LeakyBucket::new(Rate::per_second(4).burst(2)).unwrap();
    /// assert!(leaky.reserve().unwrap().delay().is_zero());
    /// ```
    pub const fn delay(&self) -> Duration {
        Duration::from_nanos(self.delay_ns)
    }

    /// The check's decision (allowed, with the queue's remaining room).
    ///
    /// ```
    /// # use ratewall::{LeakyBucket, Rate};
    /// let leaky = LeakyBucket::new(Rate::per_second(4).burst(2)).unwrap();
    /// assert_eq!(leaky.reserve().unwrap().decision().remaining(), 1);
    /// ```
    pub const fn decision(&self) -> Decision {
        self.decision
    }
}

impl<C: Clock> Limiter<LeakyGcra, C> {
    /// Shaping: takes a place in the queue for one request and returns how
    /// long to wait before sending it, or the denial if `capacity` requests
    /// are already waiting. Departures are spaced one emission interval apart.
    /// Async callers sleep for the delay on their own runtime.
    ///
    /// ```
    /// # use ratewall::{LeakyBucket, ManualClock, Rate};
    /// # use std::time::Duration;
    /// let leaky = LeakyBucket::with_clock(Rate::per_second(10).burst(5), ManualClock::new()).unwrap();
    /// let delays: Vec<_> = (0..5).map(|_| leaky.reserve().unwrap().delay().as_millis()).collect();
    /// assert_eq!(delays, [0, 100, 200, 300, 400]);
    /// assert!(leaky.reserve().is_err());
    /// ```
    pub fn reserve(&self) -> Result<Reservation, Decision> {
        match self.reserve_n(1) {
            Ok(r) => r,
            Err(_) => Err(unreachable_capacity()),
        }
    }

    /// Shaping for a request of cost `n` (it occupies `n` places).
    ///
    /// ```
    /// # use ratewall::{LeakyBucket, ManualClock, Rate};
    /// let leaky = LeakyBucket::with_clock(Rate::per_second(10).burst(5), ManualClock::new()).unwrap();
    /// assert_eq!(leaky.reserve_n(3).unwrap().unwrap().delay().as_millis(), 0);
    /// assert_eq!(leaky.reserve_n(2).unwrap().unwrap().delay().as_millis(), 300);
    /// assert!(leaky.reserve_n(6).is_err()); // can never fit
    /// ```
    pub fn reserve_n(&self, n: u64) -> Result<Result<Reservation, Decision>, InsufficientCapacity> {
        let now = self.now();
        let d = self.check_n_at(now, n)?;
        if !d.is_allowed() {
            return Ok(Err(d));
        }
        // The place taken starts where the queue ended: reset_after counts the
        // whole queue including this request, which departs `n*T` before it ends.
        let params: LeakyGcra = self.params.read();
        let own = n.max(1) * params.0.emission;
        Ok(Ok(Reservation {
            delay_ns: d.reset_after_ns.saturating_sub(own),
            decision: d,
        }))
    }

    /// Blocking shaping ("pacing"): waits for a place in the queue
    /// (sleeping while it is full), then for the place's turn, and returns
    /// the total time waited. `_blocking` marks that it sleeps the thread,
    /// as [`Wait::blocking`](crate::wait::Wait::blocking) does; it takes no
    /// permit (that is `acquire`, on the concurrency limiters), it spaces
    /// calls. The first half is the one blocking wait, `Wait::blocking`
    /// over [`reserve`](Self::reserve) (with no timeout); for a deadline,
    /// call `Wait::new().timeout(t).blocking(|| leaky.reserve())` and sleep
    /// the reservation's delay.
    ///
    /// ```
    /// # use ratewall::{LeakyBucket, Rate};
    /// let leaky = LeakyBucket::new(Rate::per_second(1000).burst(1)).unwrap();
    /// leaky.pace_blocking();
    /// let waited = leaky.pace_blocking(); // about 1 ms
    /// assert!(waited.as_micros() > 0);
    /// ```
    ///
    /// `acquire` means taking permits, so a leaky bucket has none (renamed
    /// from `acquire` in 0.x):
    ///
    /// ```compile_fail
    /// # use ratewall::{LeakyBucket, Rate};
    /// let leaky = LeakyBucket::new(Rate::per_second(1000)).unwrap();
    /// leaky.acquire();
    /// ```
    pub fn pace_blocking(&self) -> Duration {
        let start = std::time::Instant::now();
        // No timeout, and a place of cost 1 always fits: the wait ends admitted.
        if let Ok(r) = Wait::new().blocking(|| self.reserve()) {
            std::thread::sleep(r.delay());
        }
        start.elapsed()
    }
}

/// A place in the queue is one try of a wait: taken, or the queue is full.
impl AttemptCore for Result<Reservation, Decision> {}
impl Attempt for Result<Reservation, Decision> {
    type Output = Reservation;
    type Error = std::convert::Infallible;
    #[inline]
    fn outcome(self, _: Token) -> Outcome<Reservation, Self::Error> {
        match self {
            Ok(r) => Outcome::Admitted(r),
            Err(d) => Outcome::Denied(d),
        }
    }
}

impl<A: Algorithm, C: Clock> fmt::Debug for Limiter<A, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Limiter")
            .field("algorithm", &A::NAME)
            .field("quota", &self.quota())
            .field("state", &*self.state)
            .field("clock", self.time.clock())
            .finish()
    }
}
