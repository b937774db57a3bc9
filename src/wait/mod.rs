//! Waiting for capacity, with a deadline: one shape for every limiter kind.
//!
//! A [`Wait`] is a small value (a timeout and an optional jitter) that
//! takes **what to wait on**:
//!
//! - a **try**, a closure that tries once (`|| bucket.check_n(3)`,
//!   `|| keyed.check_key(&user)`, `|| check_all(&[&per_user.with_key(&7), &global])`,
//!   `|| pool.try_acquire_key(&tenant)`), tried until it is admitted,
//!   sleeping for the denial's `retry_after` in between;
//! - a **permit request** (`pool.acquire_n(3)`, `pool.acquire()`, and with
//!   feature `redis` `redis_pool.acquire_key_n(b"k", 2)`), which waits as
//!   its limiter does (a local release wakes it).
//!
//! The calls:
//!
//! - [`Wait::blocking`]: for synchronous code (the thread sleeps or parks);
//!   in every build.
//! - `Wait::until` and `Wait::until_async` (feature `wait`): the same as a
//!   future, on tokio's timer; `until_async` for tries that are themselves
//!   async (a Redis rate check); [`FairQueue`] and [`FairKeys`] admit
//!   waiters in arrival order, per limiter or per key.
//!
//! The semantics (docs/client.md):
//!
//! - a wait takes nothing until it is admitted: each try either takes (and
//!   the wait returns) or takes nothing; dropping a waiting future between
//!   tries takes nothing;
//! - with a timeout, a wait fails at once with [`WaitError::Deadline`] when
//!   a denial's `retry_after` already exceeds the time left, and never
//!   sleeps past the deadline; a cost that can never pass fails at once
//!   with [`WaitError::InsufficientCapacity`];
//! - jitter (off by default) adds a random extra in `[0, max]` to each
//!   sleep: it only ever lengthens a wait (and is cut at the deadline).
//!
//! # Example
//!
//! ```
//! use ratewall::wait::{Wait, WaitError};
//! use ratewall::{Rate, TokenBucket};
//! use std::time::Duration;
//!
//! let bucket = TokenBucket::new(Rate::per_second(1000).burst(2))?;
//! let wait = Wait::new().timeout(Duration::from_secs(1));
//! for _ in 0..4 {
//!     let admitted = wait.blocking(|| bucket.check_n(1)).unwrap(); // the last two wait ~1 ms each
//!     assert!(admitted.is_allowed());
//! }
//! // A cost above the burst can never pass: an error at once, nothing taken.
//! assert!(matches!(wait.blocking(|| bucket.check_n(3)), Err(WaitError::InsufficientCapacity(_))));
//! # Ok::<(), ratewall::ConfigError>(())
//! ```

use crate::decision::Decision;
use crate::error::InsufficientCapacity;
use crate::wording::{plural, Millis};
use std::convert::Infallible;
use std::fmt;
use std::time::Duration;

#[cfg(feature = "wait")]
mod fair;
#[cfg(feature = "wait")]
mod future;
mod waitable;

pub use waitable::BlockingWaitable;
#[cfg(feature = "wait")]
pub use waitable::Waitable;
pub(crate) use waitable::WaitableCore;

#[cfg(feature = "wait")]
pub use fair::{FairKeys, FairQueue};

/// How to wait: an optional timeout and an optional jitter. `Copy`, cheap to
/// build; build one per call site or share it. Its calls take what to wait
/// on: a closure that tries once ([`Attempt`]) or a permit request
/// ([`BlockingWaitable`], `Waitable`).
///
/// # Example
///
/// ```
/// use ratewall::wait::Wait;
/// use std::time::Duration;
///
/// let wait = Wait::new()
///     .timeout(Duration::from_secs(2))
///     .jitter(Duration::from_millis(20));
/// assert_eq!(wait.timeout_value(), Some(Duration::from_secs(2)));
/// println!("{wait:?}");
/// ```
#[derive(Clone, Copy, Default, PartialEq, Eq)]
pub struct Wait {
    timeout: Option<Duration>,
    jitter: Duration,
}

// Every non-generic function of this module is `#[inline]`, so the
// default build (which uses none of them) compiles no code from it: a new
// codegen unit would change how rustc partitions the crate, and with it the
// inlining on hot paths elsewhere (measured: `SlidingLog::step`).
impl fmt::Debug for Wait {
    #[inline]
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Wait")
            .field("timeout", &self.timeout)
            .field("jitter", &self.jitter)
            .finish()
    }
}

impl Wait {
    /// Waits as long as it takes, with no jitter.
    ///
    /// ```
    /// # use ratewall::wait::Wait;
    /// assert_eq!(Wait::new().timeout_value(), None);
    /// ```
    #[inline]
    pub const fn new() -> Self {
        Wait {
            timeout: None,
            jitter: Duration::ZERO,
        }
    }

    /// Gives up when the request cannot be admitted within `timeout` of the
    /// call (the time in a fair queue included): at once if a denial's
    /// `retry_after` exceeds the time left, else at the deadline, never
    /// later. Fails with [`WaitError::Deadline`].
    ///
    /// ```
    /// # use ratewall::wait::{Wait, WaitError};
    /// # use ratewall::{Rate, TokenBucket};
    /// # use std::time::Duration;
    /// let bucket = TokenBucket::new(Rate::per_minute(1).burst(1)).unwrap();
    /// let _ = bucket.check();
    /// let wait = Wait::new().timeout(Duration::from_secs(1));
    /// // The next unit is a minute away: no sleep at all.
    /// let err = wait.blocking(|| bucket.check()).unwrap_err();
    /// assert!(err.last_decision().unwrap().retry_after() > Duration::from_secs(59));
    /// ```
    #[must_use = "a Wait is a value: use the one this returns"]
    #[inline]
    pub const fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// Adds a random extra in `[0, max]` to each sleep, so waiters released
    /// together do not all come back together. Zero (the default) is none.
    /// The randomness is a xorshift64* generator per wait, seeded from std's
    /// per-process random hash keys (no dependency); it is not for secrets.
    ///
    /// ```
    /// # use ratewall::wait::Wait;
    /// # use std::time::Duration;
    /// let wait = Wait::new().jitter(Duration::from_millis(50));
    /// assert_eq!(wait.jitter_value(), Duration::from_millis(50));
    /// ```
    #[must_use = "a Wait is a value: use the one this returns"]
    #[inline]
    pub const fn jitter(mut self, max: Duration) -> Self {
        self.jitter = max;
        self
    }

    /// The timeout, if any.
    ///
    /// ```
    /// # use ratewall::wait::Wait;
    /// # use std::time::Duration;
    /// assert_eq!(Wait::new().timeout(Duration::from_secs(3)).timeout_value(), Some(Duration::from_secs(3)));
    /// ```
    #[inline]
    pub const fn timeout_value(&self) -> Option<Duration> {
        self.timeout
    }

    /// The most jitter added to one sleep.
    ///
    /// ```
    /// # use ratewall::wait::Wait;
    /// assert!(Wait::new().jitter_value().is_zero());
    /// ```
    #[inline]
    pub const fn jitter_value(&self) -> Duration {
        self.jitter
    }

    /// Waits on this thread for `what` until it is admitted, or until the
    /// timeout. `what` is a try (a closure returning an [`Attempt`]: tried
    /// until admitted, the thread sleeping (`std::thread::sleep`) for each
    /// denial's `retry_after`, plus jitter) or a local permit request
    /// (`pool.acquire_n(n)`: the thread parks, and the release that admits
    /// it unparks it). Returns what the admitted try returned, or the
    /// permit, or the error (see [`WaitError`]). For synchronous code; in
    /// async code use `until` (feature `wait`), which does not block the
    /// executor.
    ///
    /// ```
    /// use ratewall::wait::Wait;
    /// use ratewall::{check_all, ConcurrencyLimiter, KeyedTokenBucket, Rate, TokenBucket};
    /// use std::time::Duration;
    ///
    /// let global = TokenBucket::new(Rate::per_second(1000).burst(5))?;
    /// let per_user = KeyedTokenBucket::<u32>::builder(Rate::per_second(500).burst(1)).build()?;
    /// let wait = Wait::new().timeout(Duration::from_secs(1));
    /// for _ in 0..3 {
    ///     // Takes from both or from neither, then sleeps and tries again.
    ///     let d = wait.blocking(|| check_all(&[&per_user.with_key(&7), &global])).unwrap();
    ///     assert!(d.is_allowed());
    /// }
    /// // A permit request has the same shape.
    /// let pool = ConcurrencyLimiter::new(4)?;
    /// let permit = wait.blocking(pool.acquire_n(3)).unwrap();
    /// assert_eq!(permit.units(), 3);
    /// # Ok::<(), ratewall::ConfigError>(())
    /// ```
    pub fn blocking<W: BlockingWaitable>(&self, what: W) -> Result<W::Output, WaitError<W::Error>> {
        what.block(self, TOKEN)
    }
}

/// Why a wait ended without admission. `E` is the limiter's own error type
/// (a Redis error; [`Infallible`] for local limiters).
///
/// # Example
///
/// ```
/// use ratewall::wait::{Wait, WaitError};
/// use ratewall::{Rate, TokenBucket};
/// use std::time::Duration;
///
/// let bucket = TokenBucket::new(Rate::per_hour(1).burst(1))?;
/// let _ = bucket.check();
/// match Wait::new().timeout(Duration::from_millis(10)).blocking(|| bucket.check()) {
///     Err(WaitError::Deadline { last: Some(d) }) => println!("try again in {:?}", d.retry_after()),
///     other => panic!("{other:?}"),
/// }
/// # Ok::<(), ratewall::ConfigError>(())
/// ```
#[non_exhaustive]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WaitError<E = Infallible> {
    /// The request cannot be admitted before the deadline: the last denial
    /// said so (its `retry_after` exceeded the time left), or the deadline
    /// came. `last` is the last decision; `None` if the wait never reached
    /// the head of its fair queue.
    Deadline {
        /// The last denial, if the wait tried at all.
        last: Option<Decision>,
    },
    /// No permit of a [`ConcurrencyLimiter`](crate::ConcurrencyLimiter)
    /// (`wait.blocking(pool.acquire())`, `wait.until(pool.acquire())`),
    /// of a [`KeyedConcurrencyLimiter`](crate::KeyedConcurrencyLimiter)
    /// (a wait on `|| pool.try_acquire_key(&k)`), or of a Redis concurrency
    /// limiter (`wait.until(redis_pool.acquire_key(k))`, feature `redis`) was
    /// released before the deadline, or (keyed: the mean hold time is a
    /// lower bound there) none is expected before it.
    /// A permit comes back when its holder is done with it, so unlike a
    /// rate there is no time at which the next one is due.
    ///
    /// ```
    /// use ratewall::wait::{Wait, WaitError};
    /// use ratewall::ConcurrencyLimiter;
    /// use std::time::Duration;
    ///
    /// let l = ConcurrencyLimiter::new(2)?;
    /// let _held = l.try_acquire_n(2).unwrap();
    /// let err = Wait::new().timeout(Duration::from_millis(5)).blocking(l.acquire()).unwrap_err();
    /// assert!(matches!(err, WaitError::NoPermit { requested: 1, max: 2, .. }));
    /// println!("{err}"); // no permit was released within the 5 ms timeout: ...
    /// # Ok::<(), ratewall::ConfigError>(())
    /// ```
    NoPermit {
        /// The wait's timeout.
        timeout: Duration,
        /// The permits asked for.
        requested: u64,
        /// The limiter's maximum when the wait gave up.
        max: u64,
        /// The denial of the try at once; `None` for a fair waiter that
        /// queued behind others without trying.
        last: Option<Decision>,
    },
    /// The cost can never pass at once (above the burst or the limit).
    InsufficientCapacity(InsufficientCapacity),
    /// The limiter failed (for Redis: unavailable, bad input): returned as
    /// is, never retried by the wait.
    Limiter(E),
}

impl<E> WaitError<E> {
    /// The last decision of a wait that ran out of time.
    ///
    /// ```
    /// # use ratewall::wait::WaitError;
    /// # use ratewall::InsufficientCapacity;
    /// let e: WaitError = WaitError::InsufficientCapacity(InsufficientCapacity { requested: 3, capacity: 2 });
    /// assert!(e.last_decision().is_none());
    /// ```
    pub fn last_decision(&self) -> Option<Decision> {
        match self {
            WaitError::Deadline { last } | WaitError::NoPermit { last, .. } => *last,
            _ => None,
        }
    }
}

impl<E: fmt::Display> fmt::Display for WaitError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WaitError::Deadline { last: Some(d) } => write!(
                f,
                "not admitted before the deadline (next chance in {}): raise the timeout, lower the cost or the rate of calls",
                Millis(d.retry_after())
            ),
            WaitError::Deadline { last: None } => f.write_str(
                "not admitted before the deadline: the wait was still queued behind earlier waiters; raise the timeout",
            ),
            WaitError::NoPermit {
                timeout,
                requested,
                max,
                ..
            } => write!(
                f,
                "no permit was released within the {} timeout: asked for {} of a maximum of {max}, all held meanwhile; raise the timeout, release permits sooner (hold each for less work) or ask for fewer",
                Millis(*timeout),
                plural(*requested, "permit")
            ),
            WaitError::InsufficientCapacity(e) => e.fmt(f),
            WaitError::Limiter(e) => write!(f, "the limiter failed: {e}"),
        }
    }
}

impl<E: fmt::Debug + fmt::Display> std::error::Error for WaitError<E> {}

/// What one try of a wait returns: a [`Decision`], a
/// `Result<Decision, InsufficientCapacity>` (from `check_n`, `check_key_n`,
/// `check_all_n`), a leaky bucket's `reserve` result, and with the `redis`
/// feature a Redis check's `Result`. Sealed: the crate implements it for
/// the result of every check.
///
/// # Example
///
/// ```
/// use ratewall::wait::{Attempt, Wait};
/// use ratewall::{Rate, TokenBucket};
///
/// fn wait_for<A: Attempt>(try_once: impl FnMut() -> A) -> bool {
///     Wait::new().blocking(try_once).is_ok()
/// }
/// let bucket = TokenBucket::new(Rate::per_second(10))?;
/// assert!(wait_for(|| bucket.check()));
/// # Ok::<(), ratewall::ConfigError>(())
/// ```
pub trait Attempt: sealed::AttemptCore {
    /// What an admitted try gives back.
    type Output;
    /// The error of a try that failed (not a denial).
    type Error;
    /// What this try says (internal: only the crate can make the token).
    #[doc(hidden)]
    fn outcome(self, _: Token) -> Outcome<Self::Output, Self::Error>;
}

mod sealed {
    /// The seal of [`Attempt`](super::Attempt): implemented by the crate only.
    pub trait AttemptCore {}

    /// Proof that the caller is this crate.
    #[derive(Clone, Copy)]
    pub struct Token(pub(super) ());

    impl std::fmt::Debug for Token {
        #[inline]
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("Token")
        }
    }

    /// What one try said.
    #[derive(Debug)]
    pub enum Outcome<T, E> {
        /// Admitted (and taken).
        Admitted(T),
        /// Denied, nothing taken.
        Denied(crate::decision::Decision),
        /// Denied a permit, nothing taken: no permit was free.
        Busy {
            /// The denial.
            last: crate::decision::Decision,
            /// The permits asked for.
            requested: u64,
        },
        /// A cost that can never pass.
        Never(crate::error::InsufficientCapacity),
        /// The limiter failed.
        Failed(E),
    }
}
pub(crate) use sealed::{AttemptCore, Outcome, Token};

/// The one [`Token`].
pub(crate) const TOKEN: Token = Token(());

impl AttemptCore for Decision {}
impl Attempt for Decision {
    type Output = Decision;
    type Error = Infallible;
    #[inline]
    fn outcome(self, _: Token) -> Outcome<Decision, Infallible> {
        if self.is_allowed() {
            Outcome::Admitted(self)
        } else {
            Outcome::Denied(self)
        }
    }
}

impl AttemptCore for Result<Decision, InsufficientCapacity> {}
impl Attempt for Result<Decision, InsufficientCapacity> {
    type Output = Decision;
    type Error = Infallible;
    #[inline]
    fn outcome(self, t: Token) -> Outcome<Decision, Infallible> {
        match self {
            Ok(d) => d.outcome(t),
            Err(e) => Outcome::Never(e),
        }
    }
}

/// What a wait whose tries are `A` returns.
#[cfg(feature = "wait")]
pub(crate) type Waited<A> = Result<<A as Attempt>::Output, WaitError<<A as Attempt>::Error>>;

/// What the loop does after one try.
pub(crate) enum Step<T, E> {
    /// The wait is over.
    Done(Result<T, WaitError<E>>),
    /// Sleep this long, then try again.
    Sleep(Duration),
}

/// One wait's state: its jitter and its generator. The step is the whole
/// policy; the blocking and the async loops only read their clock and sleep.
pub(crate) struct Waiter {
    jitter_ns: u64,
    /// The wait's timeout (zero: none), for a permit wait's error.
    timeout: Duration,
    /// xorshift64* state, seeded on the first jittered sleep (never 0).
    rng: u64,
    /// A denial's `retry_after` is a hint (a concurrency permit comes back
    /// when its holder is done), not a lower bound: never give up before
    /// the deadline because of it.
    hint: bool,
}

impl Waiter {
    #[inline]
    pub(crate) fn new(wait: &Wait) -> Self {
        Waiter {
            jitter_ns: u64::try_from(wait.jitter.as_nanos()).unwrap_or(u64::MAX),
            timeout: wait.timeout.unwrap_or_default(),
            rng: 0,
            hint: false,
        }
    }

    /// A waiter whose denials' `retry_after` is only a hint: it sleeps for
    /// it (plus jitter), cut at the deadline, and gives up only when a try
    /// at the deadline is denied.
    // Only the Redis concurrency limiter waits on a hint.
    #[cfg(all(feature = "wait", any(feature = "redis", test)))]
    #[inline]
    pub(crate) fn hinted(wait: &Wait) -> Self {
        Waiter {
            hint: true,
            ..Waiter::new(wait)
        }
    }

    /// The next step after a try whose outcome is `outcome`, with `left`
    /// until the deadline (`None`: no deadline).
    pub(crate) fn step<T, E>(
        &mut self,
        outcome: Outcome<T, E>,
        left: Option<Duration>,
    ) -> Step<T, E> {
        let (denied, permits) = match outcome {
            Outcome::Admitted(t) => return Step::Done(Ok(t)),
            Outcome::Never(e) => return Step::Done(Err(WaitError::InsufficientCapacity(e))),
            Outcome::Failed(e) => return Step::Done(Err(WaitError::Limiter(e))),
            Outcome::Denied(d) => (d, None),
            Outcome::Busy { last, requested } => (last, Some(requested)),
        };
        let retry = denied.retry_after();
        match left {
            // A hint gives up only at the deadline (its last try denied).
            Some(left) if retry > left && (!self.hint || left.is_zero()) => {
                Step::Done(Err(match permits {
                    None => WaitError::Deadline { last: Some(denied) },
                    // A permit has no time at which it is due.
                    Some(requested) => WaitError::NoPermit {
                        timeout: self.timeout,
                        requested,
                        max: denied.limit(),
                        last: Some(denied),
                    },
                }))
            }
            // Jitter only lengthens, and is cut at the deadline.
            Some(left) => Step::Sleep(retry.saturating_add(self.jitter()).min(left)),
            None => Step::Sleep(retry.saturating_add(self.jitter())),
        }
    }

    /// A random extra in `[0, jitter]`.
    #[inline]
    fn jitter(&mut self) -> Duration {
        if self.jitter_ns == 0 {
            return Duration::ZERO;
        }
        Duration::from_nanos(random_up_to(&mut self.rng, self.jitter_ns))
    }
}

/// A random number in `[0, max]` from the xorshift64* generator state
/// `rng` (0: not seeded yet; it is seeded here on first use). Not for
/// secrets: it spreads waits, which is all its callers ask.
#[inline]
pub(crate) fn random_up_to(rng: &mut u64, max: u64) -> u64 {
    if *rng == 0 {
        *rng = seed();
    }
    // xorshift64* (Vigna 2016): full period over non-zero states.
    *rng ^= *rng >> 12;
    *rng ^= *rng << 25;
    *rng ^= *rng >> 27;
    let r = rng.wrapping_mul(0x2545_F491_4F6C_DD1D);
    match max.checked_add(1) {
        Some(span) => r % span,
        None => r,
    }
}

/// A per-wait seed: std's `RandomState` draws random keys once per thread
/// and steps them for every new state, so two waits get different seeds.
#[inline]
fn seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(0x9E37_79B9_7F4A_7C15);
    h.finish() | 1
}

#[cfg(test)]
mod tests {
    use super::*;

    fn denied(retry_ms: u64) -> Outcome<Decision, Infallible> {
        Outcome::Denied(Decision::deny(
            1,
            0,
            retry_ms * 1_000_000,
            retry_ms * 1_000_000,
        ))
    }

    fn sleep_of<T, E>(s: Step<T, E>) -> Duration {
        match s {
            Step::Sleep(d) => d,
            Step::Done(_) => panic!("expected a sleep"),
        }
    }

    #[test]
    fn a_denial_sleeps_its_retry_after_and_fails_at_once_past_the_deadline() {
        let mut w = Waiter::new(&Wait::new());
        assert_eq!(
            sleep_of(w.step(denied(30), None)),
            Duration::from_millis(30)
        );
        assert_eq!(
            sleep_of(w.step(denied(30), Some(Duration::from_millis(30)))),
            Duration::from_millis(30)
        );
        match w.step(denied(31), Some(Duration::from_millis(30))) {
            Step::Done(Err(WaitError::Deadline { last: Some(d) })) => {
                assert_eq!(d.retry_after(), Duration::from_millis(31))
            }
            _ => panic!("expected the deadline error"),
        }
    }

    #[test]
    fn jitter_only_lengthens_stays_within_its_max_and_is_cut_at_the_deadline() {
        let max = Duration::from_millis(10);
        let mut w = Waiter::new(&Wait::new().jitter(max));
        let mut seen = std::collections::HashSet::new();
        for _ in 0..1000 {
            let s = sleep_of(w.step(denied(5), None));
            assert!(
                s >= Duration::from_millis(5) && s <= Duration::from_millis(15),
                "{s:?}"
            );
            seen.insert(s);
        }
        assert!(
            seen.len() > 500,
            "jitter should vary: {} distinct sleeps",
            seen.len()
        );
        for _ in 0..100 {
            let s = sleep_of(w.step(denied(5), Some(Duration::from_millis(6))));
            assert!(
                s >= Duration::from_millis(5) && s <= Duration::from_millis(6),
                "{s:?}"
            );
        }
    }

    #[test]
    fn two_waits_draw_different_jitter() {
        let wait = Wait::new().jitter(Duration::from_secs(1));
        let draws = |_| sleep_of(Waiter::new(&wait).step(denied(1), None));
        let a: Vec<_> = (0..4).map(draws).collect();
        assert!(a.windows(2).any(|p| p[0] != p[1]), "{a:?}");
    }

    #[cfg(feature = "wait")]
    #[test]
    fn a_hinted_wait_sleeps_to_the_deadline_then_gives_up() {
        let mut w = Waiter::hinted(&Wait::new());
        assert_eq!(
            sleep_of(w.step(denied(30), Some(Duration::from_millis(10)))),
            Duration::from_millis(10)
        );
        assert_eq!(
            sleep_of(w.step(denied(3), Some(Duration::from_millis(10)))),
            Duration::from_millis(3)
        );
        assert!(matches!(
            w.step(denied(3), Some(Duration::ZERO)),
            Step::Done(Err(WaitError::Deadline { last: Some(_) }))
        ));
        assert_eq!(
            sleep_of(w.step(denied(30), None)),
            Duration::from_millis(30)
        );
    }

    #[test]
    fn admissions_errors_and_failures_end_the_wait() {
        let mut w = Waiter::new(&Wait::new().timeout(Duration::ZERO));
        let ok = Decision::allow(1, 0, 0);
        assert!(matches!(
            w.step::<_, Infallible>(Outcome::Admitted(ok), Some(Duration::ZERO)),
            Step::Done(Ok(_))
        ));
        let e = InsufficientCapacity {
            requested: 2,
            capacity: 1,
        };
        assert!(matches!(
            w.step::<Decision, Infallible>(Outcome::Never(e), None),
            Step::Done(Err(WaitError::InsufficientCapacity(x))) if x == e
        ));
        assert!(matches!(
            w.step::<Decision, u8>(Outcome::Failed(7), None),
            Step::Done(Err(WaitError::Limiter(7)))
        ));
    }

    #[test]
    fn errors_say_what_to_change() {
        let d = Decision::deny(1, 0, 2_000_000_000, 0);
        let e: WaitError = WaitError::Deadline { last: Some(d) };
        assert!(e.to_string().contains("raise the timeout"), "{e}");
        assert!(e.to_string().contains("next chance in 2000 ms"), "{e}");
        // A wait under a millisecond is rounded up, never "0 ms" or "1ns".
        let soon: WaitError = WaitError::Deadline {
            last: Some(Decision::deny(1, 0, 1, 0)),
        };
        assert!(soon.to_string().contains("next chance in 1 ms)"), "{soon}");
        assert_eq!(e.last_decision(), Some(d));
        let q: WaitError = WaitError::Deadline { last: None };
        assert!(q.to_string().contains("queued"), "{q}");
        let p: WaitError = WaitError::NoPermit {
            timeout: Duration::from_millis(50),
            requested: 2,
            max: 4,
            last: Some(d),
        };
        assert_eq!(
            p.to_string(),
            "no permit was released within the 50 ms timeout: asked for 2 permits of a maximum \
             of 4, all held meanwhile; raise the timeout, release permits sooner (hold each for \
             less work) or ask for fewer"
        );
        assert_eq!(p.last_decision(), Some(d));
        let l: WaitError<&str> = WaitError::Limiter("down");
        assert_eq!(l.to_string(), "the limiter failed: down");
    }
}
