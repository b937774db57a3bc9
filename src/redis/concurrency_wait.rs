//! Waiting for Redis permits (feature `wait`): [`RedisAcquire`], the
//! request that `RedisConcurrencyLimiter::acquire_key(_n)` returns and a
//! [`Wait`] waits on (`wait.until(request)`), and the hinted try it repeats.

use super::{RedisAcquisition, RedisConcurrencyLimiter, RedisPermit};
use crate::decision::Decision;
use crate::redis::RedisError;
use crate::sync::Ordering;
use crate::wait::{Attempt, AttemptCore, Outcome, Token, Wait, WaitError, Waitable, WaitableCore};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

impl RedisConcurrencyLimiter {
    /// A request for one unit of `key`, to wait for:
    /// [`acquire_key_n`](Self::acquire_key_n)`(key, 1)` (feature `wait`).
    ///
    /// ```no_run
    /// # use ratewall::redis::{RedisBackend, RedisConcurrencyLimiter};
    /// # use ratewall::wait::Wait;
    /// # use std::time::Duration;
    /// # async fn f() -> Result<(), Box<dyn std::error::Error>> {
    /// # let redis = RedisBackend::builder("redis://127.0.0.1:6379").build()?;
    /// let db = RedisConcurrencyLimiter::builder(20, &redis).name("db").build()?;
    /// let permit = Wait::new().timeout(Duration::from_secs(2)).until(db.acquire_key(b"tenant:7")).await?;
    /// drop(permit);
    /// let no_deadline = db.acquire_key(b"tenant:7").await?;
    /// # drop(no_deadline);
    /// # Ok(()) }
    /// ```
    pub fn acquire_key(&self, key: &[u8]) -> RedisAcquire {
        self.acquire_key_n(key, 1)
    }

    /// A request for `n` units of `key`, to wait for (feature `wait`), as
    /// every wait with a deadline is written: `wait.until(request).await`
    /// waits up to `wait`'s timeout; awaiting the request itself waits with
    /// no deadline. See [`RedisAcquire`] for how it waits.
    ///
    /// ```no_run
    /// # use ratewall::redis::{RedisBackend, RedisConcurrencyLimiter};
    /// # use ratewall::wait::Wait;
    /// # use std::time::Duration;
    /// # async fn f() -> Result<(), Box<dyn std::error::Error>> {
    /// # let redis = RedisBackend::builder("redis://127.0.0.1:6379").build()?;
    /// let db = RedisConcurrencyLimiter::builder(20, &redis).name("db").build()?;
    /// let wait = Wait::new().timeout(Duration::from_secs(2)).jitter(Duration::from_millis(5));
    /// let permit = wait.until(db.acquire_key_n(b"tenant:7", 2)).await?;
    /// // ... the work ...
    /// drop(permit);
    /// # Ok(()) }
    /// ```
    pub fn acquire_key_n(&self, key: &[u8], n: u64) -> RedisAcquire {
        RedisAcquire {
            limiter: self.clone(),
            key: key.into(),
            n,
        }
    }
}

/// A waiting request for Redis permits, from
/// [`RedisConcurrencyLimiter::acquire_key`] /
/// [`acquire_key_n`](RedisConcurrencyLimiter::acquire_key_n) (feature
/// `wait`). It does nothing until it is waited for, in the one shape of a
/// wait with a deadline: `wait.until(request).await` (its error a
/// [`WaitError<RedisError>`](WaitError)), or awaited itself, with no
/// deadline (its error the [`RedisError`] a try returned).
///
/// It tries as [`try_acquire_key_n`](RedisConcurrencyLimiter::try_acquire_key_n)
/// does (the same failure policy answers when Redis cannot: `Open` admits,
/// `FallbackShare` waits on the local share, `Closed` ends the wait with
/// [`WaitError::Limiter`]), and after a denial sleeps for a **hint**: the
/// mean time this instance's permits were held (10 ms until one came
/// back), at least 1 ms and at most the denial's own `retry_after` (the
/// first lapse), plus `wait`'s jitter (which only lengthens); cut at the
/// deadline, where a last try decides (denied: [`WaitError::NoPermit`]).
/// Nobody wakes a Redis waiter: other instances' releases are not seen
/// until the next try. There is no blocking form: each try is a network
/// call on the tokio runtime.
///
/// Cancel-safe: each try runs in a task of its own, so a wait dropped
/// while its script is in flight does not drop the call; if the script
/// admitted, the task drops the permit, whose drop releases it at once (a
/// call spawned on the runtime), as any dropped permit does. Nothing is
/// stranded until the expiry.
///
/// # Example
///
/// ```no_run
/// # use ratewall::redis::{RedisBackend, RedisConcurrencyLimiter};
/// # use ratewall::wait::{Wait, WaitError};
/// # use std::time::Duration;
/// # async fn f() -> Result<(), Box<dyn std::error::Error>> {
/// # let redis = RedisBackend::builder("redis://127.0.0.1:6379").build()?;
/// let db = RedisConcurrencyLimiter::builder(1, &redis).build()?;
/// let held = db.acquire_key(b"k").await?;
/// let wait = Wait::new().timeout(Duration::from_millis(50));
/// let late = wait.until(db.acquire_key(b"k")).await;
/// assert!(matches!(late, Err(WaitError::NoPermit { requested: 1, max: 1, .. })));
/// println!("{:?}", db.acquire_key(b"k"));
/// # drop(held);
/// # Ok(()) }
/// ```
#[must_use = "a waiting request does nothing unless waited for or awaited"]
pub struct RedisAcquire {
    limiter: RedisConcurrencyLimiter,
    key: Arc<[u8]>,
    n: u64,
}

impl RedisAcquire {
    /// The wait itself: tries until admitted, on the hint.
    async fn run(self, wait: &Wait) -> Result<RedisPermit, WaitError<RedisError>> {
        let RedisAcquire { limiter, key, n } = self;
        let max = limiter.max();
        wait.until_hinted(|| {
            let (limiter, key) = (limiter.clone(), Arc::clone(&key));
            async move {
                let call = tokio::spawn(async move {
                    let got = limiter.try_acquire_key_n(&key, n).await;
                    (got, limiter.inner.hold_ns.load(Ordering::Relaxed)) // Relaxed: a hint
                });
                match call.await {
                    Ok((got, hold_ns)) => Hinted { got, hold_ns },
                    Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                    Err(_) => Hinted {
                        got: Err(RedisError::Unavailable {
                            retry_in: Duration::ZERO,
                            cause: "the tokio runtime shut down during a waiting acquire".into(),
                        }),
                        hold_ns: 0,
                    },
                }
            }
        })
        .await
        // A permit has no time at which it is due: say none was released.
        .map_err(|e| match e {
            WaitError::Deadline { last } => WaitError::NoPermit {
                timeout: wait.timeout_value().unwrap_or_default(),
                requested: n,
                max,
                last,
            },
            e => e,
        })
    }
}

impl WaitableCore for RedisAcquire {}

/// `wait.until(redis_pool.acquire_key_n(key, n)).await`.
impl Waitable for RedisAcquire {
    type Output = RedisPermit;
    type Error = RedisError;
    async fn until(self, wait: &Wait, _: Token) -> Result<RedisPermit, WaitError<RedisError>> {
        self.run(wait).await
    }
}

/// Awaited itself: a wait with no deadline, whose error is the try's.
impl std::future::IntoFuture for RedisAcquire {
    type Output = Result<RedisPermit, RedisError>;
    type IntoFuture =
        std::pin::Pin<Box<dyn std::future::Future<Output = Self::Output> + Send + 'static>>;
    fn into_future(self) -> Self::IntoFuture {
        Box::pin(async move {
            self.run(&Wait::new()).await.map_err(|e| match e {
                WaitError::Limiter(e) => e,
                WaitError::InsufficientCapacity(e) => RedisError::InsufficientCapacity(e),
                // No deadline: a wait without one ends admitted or failed.
                other => RedisError::Unavailable {
                    retry_in: Duration::ZERO,
                    cause: other.to_string(),
                },
            })
        })
    }
}

impl fmt::Debug for RedisAcquire {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisAcquire")
            .field("key", &String::from_utf8_lossy(&self.key))
            .field("units", &self.n)
            .finish()
    }
}

/// One try of a waiting acquire, with the hint its denial sleeps for.
struct Hinted {
    got: Result<RedisAcquisition, RedisError>,
    /// The mean hold time when it was made (0: none known).
    hold_ns: u64,
}

impl AttemptCore for Hinted {}

impl Attempt for Hinted {
    type Output = RedisPermit;
    type Error = RedisError;
    fn outcome(self, _: Token) -> Outcome<RedisPermit, RedisError> {
        match self.got {
            Ok(a) => match a.permit {
                Some(permit) => Outcome::Admitted(permit),
                None => {
                    let d = a.decision.decision();
                    let ns = |t: Duration| u64::try_from(t.as_nanos()).unwrap_or(u64::MAX);
                    let hint = if self.hold_ns == 0 {
                        10_000_000
                    } else {
                        self.hold_ns
                    };
                    let retry = hint.max(1_000_000).min(ns(d.retry_after()).max(1_000_000));
                    let hinted =
                        Decision::deny(d.limit(), d.remaining(), retry, ns(d.reset_after()));
                    Outcome::Denied(hinted)
                }
            },
            Err(RedisError::InsufficientCapacity(e)) => Outcome::Never(e),
            Err(e) => Outcome::Failed(e),
        }
    }
}
