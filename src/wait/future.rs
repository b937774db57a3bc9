//! The async wait (feature `wait`): the same step as the blocking loop, on
//! tokio's timer (`tokio::time`, so `tokio::time::pause` drives it in tests).

use super::{Attempt, Step, Wait, WaitError, Waitable, Waited, Waiter, TOKEN};
use std::future::Future;
use tokio::time::Instant;

impl Wait {
    /// Waits for `what` until it is admitted, or until the timeout, on
    /// tokio's timer; needs a tokio runtime with time enabled. `what` is a
    /// try (a closure returning an [`Attempt`]: tried until admitted,
    /// sleeping for each denial's `retry_after`, plus jitter), a local
    /// permit request (`pool.acquire_n(n)`: a release wakes it; the timer
    /// only ends it at the deadline), or a Redis permit request
    /// (`redis_pool.acquire_key_n(k, n)`, feature `redis`). Awaiting a
    /// permit request without a `Wait` waits with no deadline.
    ///
    /// Cancellation-safe: a try either takes and returns, or takes
    /// nothing, and a dropped permit request takes nothing (a permit handed
    /// to it at that moment goes to the next waiter), so dropping the
    /// future (a `select!`, a timeout) takes nothing. Tries are not fair:
    /// waiters released together race for the capacity (see
    /// [`FairQueue`](super::FairQueue)); permit requests queue.
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime with time enabled, as every tokio timer does
    /// (on another runtime, use [`blocking`](Self::blocking) on a blocking
    /// thread).
    ///
    /// ```
    /// use ratewall::wait::{Wait, WaitError};
    /// use ratewall::{ConcurrencyLimiter, KeyedConcurrencyLimiter, KeyedTokenBucket, Rate};
    /// use std::time::Duration;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let wait = Wait::new().timeout(Duration::from_secs(1));
    /// // A rate: a try.
    /// let per_customer = KeyedTokenBucket::<u32>::builder(Rate::per_second(500).burst(2)).build()?;
    /// for _ in 0..4 {
    ///     let d = wait.until(|| per_customer.check_key_n(&7, 1)).await?;
    ///     assert!(d.is_allowed());
    /// }
    /// // Local permits: a request; keyed permits: a try.
    /// let pool = ConcurrencyLimiter::new(4)?;
    /// let permit = wait.until(pool.acquire_n(3)).await?;
    /// let short = Wait::new().timeout(Duration::from_millis(5));
    /// assert!(matches!(short.until(pool.acquire_n(2)).await, Err(WaitError::NoPermit { .. })));
    /// drop(permit);
    /// let per_tenant = KeyedConcurrencyLimiter::<u32>::new(1)?;
    /// let p = wait.until(|| per_tenant.try_acquire_key(&7)).await?;
    /// assert_eq!(p.units(), 1);
    /// # Ok(()) }
    /// ```
    pub async fn until<W: Waitable>(&self, what: W) -> Result<W::Output, WaitError<W::Error>> {
        what.until(self, TOKEN).await
    }

    /// [`until`](Self::until) for a try that is itself async (a Redis
    /// rate check: `wait.until_async(|| redis.check_key(b"k"))`). It is a
    /// method of its own because a closure returning a future cannot share
    /// `until`'s blanket impl for tries (closures returning an [`Attempt`])
    /// without overlapping it. Dropping the future between tries takes
    /// nothing; dropped while a try is in flight, the try may still
    /// complete on the server (as any network call may).
    ///
    /// ```
    /// use ratewall::wait::Wait;
    /// use ratewall::{Rate, TokenBucket};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let bucket = TokenBucket::new(Rate::per_second(1000).burst(1))?;
    /// for _ in 0..3 {
    ///     let d = Wait::new().until_async(|| async { bucket.check() }).await?;
    ///     assert!(d.is_allowed());
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn until_async<F, Fut>(&self, attempt: F) -> Waited<Fut::Output>
    where
        F: FnMut() -> Fut,
        Fut: Future,
        Fut::Output: Attempt,
    {
        self.run(self.deadline_from(Instant::now()), attempt).await
    }

    /// When a wait that starts at `start` must end (`None`: never).
    pub(crate) fn deadline_from(&self, start: Instant) -> Option<Instant> {
        self.timeout.and_then(|t| start.checked_add(t))
    }

    /// The async loop, to `deadline`.
    pub(crate) async fn run<F, Fut>(
        &self,
        deadline: Option<Instant>,
        attempt: F,
    ) -> Waited<Fut::Output>
    where
        F: FnMut() -> Fut,
        Fut: Future,
        Fut::Output: Attempt,
    {
        Self::run_with(Waiter::new(self), deadline, attempt).await
    }

    /// [`until_async`](Self::until_async) for tries whose denials'
    /// `retry_after` is only a hint (`Waiter::hinted`): a Redis concurrency
    /// permit, which comes back when its holder is done.
    #[cfg(feature = "redis")]
    pub(crate) async fn until_hinted<F, Fut>(&self, attempt: F) -> Waited<Fut::Output>
    where
        F: FnMut() -> Fut,
        Fut: Future,
        Fut::Output: Attempt,
    {
        let deadline = self.deadline_from(Instant::now());
        Self::run_with(Waiter::hinted(self), deadline, attempt).await
    }

    async fn run_with<F, Fut>(
        mut waiter: Waiter,
        deadline: Option<Instant>,
        mut attempt: F,
    ) -> Waited<Fut::Output>
    where
        F: FnMut() -> Fut,
        Fut: Future,
        Fut::Output: Attempt,
    {
        loop {
            let outcome = attempt().await.outcome(TOKEN);
            let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
            match waiter.step(outcome, left) {
                Step::Done(result) => return result,
                Step::Sleep(d) => tokio::time::sleep(d).await,
            }
        }
    }
}
