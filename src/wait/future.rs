//! The async wait (feature `wait`): the same step as the blocking loop, on
//! tokio's timer (`tokio::time`, so `tokio::time::pause` drives it in tests).

use super::{Attempt, Step, Wait, Waited, Waiter, TOKEN};
use std::future::Future;
use tokio::time::Instant;

impl Wait {
    /// Tries `attempt` until it is admitted, sleeping on tokio's timer for
    /// each denial's `retry_after` (plus jitter); needs a tokio runtime with
    /// time enabled. Cancellation-safe: a try either takes and returns, or
    /// takes nothing, so dropping the future (a `select!`, a timeout) takes
    /// nothing. Not fair: waiters released together race for the capacity
    /// (see [`FairQueue`](super::FairQueue)).
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime with time enabled, as every tokio timer does
    /// (on another runtime, use [`blocking`](Self::blocking) on a blocking
    /// thread).
    ///
    /// ```
    /// use ratewall::wait::Wait;
    /// use ratewall::{KeyedTokenBucket, Rate};
    /// use std::time::Duration;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let per_customer = KeyedTokenBucket::<u32>::builder(Rate::per_second(500).burst(2)).build()?;
    /// let wait = Wait::new().timeout(Duration::from_secs(1));
    /// for _ in 0..4 {
    ///     let d = wait.until(|| per_customer.check_key_n(&7, 1)).await?;
    ///     assert!(d.is_allowed());
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn until<A: Attempt>(&self, mut attempt: impl FnMut() -> A) -> Waited<A> {
        self.until_async(|| std::future::ready(attempt())).await
    }

    /// [`until`](Self::until) for a try that is itself async (a Redis
    /// check). Dropping the future between tries takes nothing; dropped
    /// while a try is in flight, the try may still complete on the server
    /// (as any network call may).
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
