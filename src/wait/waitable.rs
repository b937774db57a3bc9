//! What a [`Wait`] waits on: the one shape `wait.until(x)` /
//! `wait.blocking(x)`, where `x` is a try (a closure returning an
//! [`Attempt`]) or a permit request (`pool.acquire_n(3)`). The blanket
//! impl for tries lives here; each permit request implements the traits
//! beside its own code (`concurrency/acquire.rs`, `redis/concurrency.rs`).

use super::{Attempt, Step, Wait, WaitError, Waiter, TOKEN};
use std::time::Instant;

pub(crate) use sealed::WaitableCore;

mod sealed {
    /// The seal of [`Waitable`](super::Waitable) and
    /// [`BlockingWaitable`](super::BlockingWaitable): implemented by the
    /// crate only.
    pub trait WaitableCore {}
}

/// What [`Wait::blocking`] waits on, on this thread: a **try**, a closure
/// that tries once and returns an [`Attempt`] (`|| bucket.check()`,
/// `|| pool.try_acquire_key(&user)`), or a **permit request** of a local
/// [`ConcurrencyLimiter`](crate::ConcurrencyLimiter)
/// ([`Acquire`](crate::Acquire), [`AcquireOwned`](crate::AcquireOwned),
/// from `acquire()` / `acquire_n(n)`), which a release wakes. Sealed: the
/// crate implements it. A Redis permit request is not one: its tries are
/// network calls, which need a runtime (use `Wait::until`).
///
/// # Example
///
/// ```
/// use ratewall::wait::{BlockingWaitable, Wait};
/// use ratewall::{ConcurrencyLimiter, Rate, TokenBucket};
///
/// fn admitted<W: BlockingWaitable>(what: W) -> bool {
///     Wait::new().blocking(what).is_ok()
/// }
/// let bucket = TokenBucket::new(Rate::per_second(10))?;
/// let pool = ConcurrencyLimiter::new(2)?;
/// assert!(admitted(|| bucket.check())); // a try
/// assert!(admitted(pool.acquire_n(2))); // a permit request (its permit drops at once)
/// # Ok::<(), ratewall::ConfigError>(())
/// ```
pub trait BlockingWaitable: WaitableCore {
    /// What an admitted wait gives back (a decision, a permit).
    type Output;
    /// The limiter's own error ([`Infallible`](std::convert::Infallible)
    /// for local limiters).
    type Error;
    /// Waits on this thread (internal: only the crate can make the token).
    #[doc(hidden)]
    fn block(self, wait: &Wait, _: super::Token) -> Result<Self::Output, WaitError<Self::Error>>;
}

/// What `Wait::until` waits on, in async code (feature `wait`): everything
/// [`BlockingWaitable`] covers (a try, a local permit request), and a Redis
/// permit request (`RedisConcurrencyLimiter::acquire_key_n`, feature
/// `redis`). Sealed: the crate implements it.
///
/// A try that is itself async (a Redis rate check, `|| redis.check_key(k)`,
/// returns a future) is not one: a closure returning a future cannot share
/// the tries' blanket impl without overlapping it, so it has its own
/// method, `Wait::until_async`.
///
/// # Example
///
/// ```
/// # #[cfg(feature = "wait")]
/// # {
/// use ratewall::wait::{Wait, Waitable};
/// use ratewall::{ConcurrencyLimiter, Rate, TokenBucket};
///
/// async fn admitted<W: Waitable>(what: W) -> bool {
///     Wait::new().until(what).await.is_ok()
/// }
/// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
/// let bucket = TokenBucket::new(Rate::per_second(10))?;
/// let pool = ConcurrencyLimiter::new(2)?;
/// assert!(admitted(|| bucket.check()).await);
/// assert!(admitted(pool.acquire_n(2)).await);
/// # Ok::<(), ratewall::ConfigError>(())
/// # }).unwrap();
/// # }
/// ```
#[cfg(feature = "wait")]
pub trait Waitable: WaitableCore {
    /// What an admitted wait gives back (a decision, a permit).
    type Output;
    /// The limiter's own error (a Redis error;
    /// [`Infallible`](std::convert::Infallible) for local limiters).
    type Error;
    /// Waits on tokio's timer (internal: only the crate can make the token).
    #[doc(hidden)]
    fn until(
        self,
        wait: &Wait,
        _: super::Token,
    ) -> impl std::future::Future<Output = Result<Self::Output, WaitError<Self::Error>>>;
}

// A try. `FnMut` is a fundamental trait, so this blanket impl does not
// overlap the impls for the crate's own request types (which are no
// closures).
impl<F: FnMut() -> A, A: Attempt> WaitableCore for F {}

impl<F: FnMut() -> A, A: Attempt> BlockingWaitable for F {
    type Output = A::Output;
    type Error = A::Error;
    fn block(mut self, wait: &Wait, _: super::Token) -> Result<A::Output, WaitError<A::Error>> {
        let deadline = wait.timeout.and_then(|t| Instant::now().checked_add(t));
        let mut waiter = Waiter::new(wait);
        loop {
            let outcome = self().outcome(TOKEN);
            let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
            match waiter.step(outcome, left) {
                Step::Done(result) => return result,
                Step::Sleep(d) => std::thread::sleep(d),
            }
        }
    }
}

#[cfg(feature = "wait")]
impl<F: FnMut() -> A, A: Attempt> Waitable for F {
    type Output = A::Output;
    type Error = A::Error;
    async fn until(
        mut self,
        wait: &Wait,
        _: super::Token,
    ) -> Result<A::Output, WaitError<A::Error>> {
        wait.until_async(|| std::future::ready(self())).await
    }
}
