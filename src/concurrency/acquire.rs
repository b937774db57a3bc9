//! Waiting for a permit: the `acquire` futures (every build, no runtime:
//! a release wakes them), their blocking form, and with feature `wait` a
//! deadline on tokio's timer. The queue they wait in is `waiters.rs`.

use super::limiter::{ConcurrencyLimiter, Held, UNTIMED};
use super::permit::{OwnedPermit, Permit};
use super::priority::Priority;
use super::waiters::Joined;
use crate::algo::concurrency as algo;
use crate::clock::Clock;
use crate::decision::Decision;
use crate::error::InsufficientCapacity;
use crate::limiter::DefaultClock;
use crate::sync::{current_thread, park, park_timeout, Ordering, Thread};
#[cfg(feature = "wait")]
use crate::wait::Waitable;
use crate::wait::{BlockingWaitable, Token, Wait, WaitError, WaitableCore};
use std::convert::Infallible;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::Instant;

/// What a waiting acquire borrows or owns: the limiter, and how to make its
/// permit. Sealed (private): `&ConcurrencyLimiter` and `Arc<ConcurrencyLimiter>`.
trait Handle {
    type Clock: Clock;
    type Permit;
    fn limiter(&self) -> &ConcurrencyLimiter<Self::Clock>;
    fn permit(&self, held: Held) -> Self::Permit;
}

impl<'a, C: Clock> Handle for &'a ConcurrencyLimiter<C> {
    type Clock = C;
    type Permit = Permit<'a, C>;
    fn limiter(&self) -> &ConcurrencyLimiter<C> {
        self
    }
    fn permit(&self, held: Held) -> Permit<'a, C> {
        Permit {
            limiter: self,
            held,
        }
    }
}

impl<C: Clock> Handle for Arc<ConcurrencyLimiter<C>> {
    type Clock = C;
    type Permit = OwnedPermit<C>;
    fn limiter(&self) -> &ConcurrencyLimiter<C> {
        self
    }
    fn permit(&self, held: Held) -> OwnedPermit<C> {
        OwnedPermit {
            limiter: Arc::clone(self),
            held,
        }
    }
}

/// One waiting acquire, written once for both futures: tries at once, else
/// queues and sleeps until a release serves it; leaves the queue when
/// dropped (handing back units served meanwhile).
struct Turn<L: Handle> {
    handle: L,
    units: u64,
    class: Priority,
    /// Its id in the queue, while queued.
    queued: Option<u64>,
    /// The denial of its try at once, if it tried.
    last: Option<Decision>,
}

impl<L: Handle> Turn<L> {
    fn new(handle: L, units: u64) -> Self {
        Turn {
            handle,
            units,
            class: Priority::Normal,
            queued: None,
            last: None,
        }
    }

    fn poll_turn(&mut self, waker: &Waker) -> Poll<Result<L::Permit, InsufficientCapacity>> {
        let l = self.handle.limiter();
        let verdict = match self.queued {
            None => {
                // Fair: no try at once while others wait (no passing them).
                if !(l.waiters.is_fair() && algo::has_waiters(l.state.word.load())) {
                    let (d, held) = l.try_admit(self.units, self.class)?;
                    if let Some(held) = held {
                        return Poll::Ready(Ok(self.handle.permit(held)));
                    }
                    self.last = Some(d);
                }
                match l.waiters.join(l.counts(), self.units, self.class, waker) {
                    Joined::Done(verdict) => verdict,
                    Joined::Queued(id) => {
                        self.queued = Some(id);
                        return Poll::Pending;
                    }
                }
            }
            Some(id) => match l.waiters.poll(id, waker) {
                Some(verdict) => {
                    self.queued = None;
                    verdict
                }
                None => return Poll::Pending,
            },
        };
        // Served: the units are ours already (the decision was made for
        // us); time the permit as `try_admit` does.
        let _served: Decision = verdict?;
        // Relaxed: a hint; it orders nothing.
        let hold = l.state.hold_ns.load(Ordering::Relaxed);
        Poll::Ready(Ok(self.handle.permit(l.held(self.units, hold))))
    }

    /// The error of a wait that reached its deadline unserved.
    fn no_permit(&self, wait: &Wait) -> WaitError {
        WaitError::NoPermit {
            timeout: wait.timeout_value().unwrap_or_default(),
            requested: self.units,
            max: self.handle.limiter().max(),
            last: self.last,
        }
    }

    /// The blocking form: parks the thread between polls.
    fn block(mut self, wait: &Wait) -> Result<L::Permit, WaitError> {
        let deadline = wait
            .timeout_value()
            .and_then(|t| Instant::now().checked_add(t));
        let waker = Waker::from(Arc::new(Unpark(current_thread())));
        loop {
            if let Poll::Ready(r) = self.poll_turn(&waker) {
                return r.map_err(WaitError::InsufficientCapacity);
            }
            match deadline {
                None => park(),
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        // Dropping `self` leaves the queue.
                        return Err(self.no_permit(wait));
                    }
                    park_timeout(d - now);
                }
            }
        }
    }

    /// With a deadline on tokio's timer (feature `wait`).
    #[cfg(feature = "wait")]
    async fn until(mut self, wait: &Wait) -> Result<L::Permit, WaitError> {
        let Some(deadline) = wait.deadline_from(tokio::time::Instant::now()) else {
            return std::future::poll_fn(|cx| self.poll_turn(cx.waker()))
                .await
                .map_err(WaitError::InsufficientCapacity);
        };
        let mut sleep = std::pin::pin!(tokio::time::sleep_until(deadline));
        std::future::poll_fn(|cx| {
            if let Poll::Ready(r) = self.poll_turn(cx.waker()) {
                return Poll::Ready(r.map_err(WaitError::InsufficientCapacity));
            }
            match sleep.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(Err(self.no_permit(wait))),
                Poll::Pending => Poll::Pending,
            }
        })
        .await
        // `self` drops here: a waiter still queued leaves the queue.
    }
}

impl<L: Handle> Drop for Turn<L> {
    fn drop(&mut self) {
        if let Some(id) = self.queued.take() {
            let l = self.handle.limiter();
            if l.waiters.leave(l.counts(), id) {
                // Served meanwhile: the units go back, and on to the next.
                l.release(&Held {
                    units: self.units,
                    start: UNTIMED,
                    outcome: None,
                });
            }
        }
    }
}

/// Wakes a parked thread.
struct Unpark(Thread);

impl Wake for Unpark {
    #[inline]
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
    #[inline]
    fn wake_by_ref(self: &Arc<Self>) {
        self.0.unpark();
    }
}

/// A waiting acquire of a [`Permit`], from
/// [`ConcurrencyLimiter::acquire`]: a future that resolves when the units
/// are admitted. It takes nothing until then; a release wakes it (no
/// polling, no timer, any executor). Dropped (a `select!`, a timeout), it
/// takes nothing and loses nothing: a permit handed to it at that moment
/// goes back, and on to the next waiter.
///
/// Awaited, it waits with no deadline (its output is
/// `Result<Permit, InsufficientCapacity>`: only a cost that can never fit
/// fails). Set the class with [`priority`](Self::priority). With a
/// deadline, give it to a [`Wait`], as every wait with a deadline is
/// written: `wait.blocking(pool.acquire())` on a thread, or, with feature
/// `wait`, `wait.until(pool.acquire()).await` (the error is then a
/// [`WaitError`]). As any future, it is not to be polled again once it
/// has completed (it would start waiting for another permit).
///
/// # Example
///
/// ```
/// use ratewall::wait::Wait;
/// use ratewall::ConcurrencyLimiter;
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let pool = ConcurrencyLimiter::new(1)?;
/// let first = pool.try_acquire().into_permit().unwrap();
/// std::thread::scope(|s| {
///     s.spawn(|| {
///         // Waits until `first` is dropped, then holds the unit.
///         let permit = Wait::new().blocking(pool.acquire()).unwrap();
///         assert_eq!(permit.units(), 1);
///     });
///     std::thread::sleep(std::time::Duration::from_millis(20));
///     drop(first);
/// });
/// assert_eq!(pool.in_flight(), 0);
/// # Ok(()) }
/// ```
#[must_use = "a waiting acquire does nothing unless awaited or blocked on"]
pub struct Acquire<'a, C: Clock = DefaultClock> {
    turn: Turn<&'a ConcurrencyLimiter<C>>,
}

/// [`Acquire`] for an [`OwnedPermit`], from
/// [`ConcurrencyLimiter::acquire_owned`]: the future and its permit own an
/// `Arc` of the limiter, so both are `'static` (spawned tasks, response
/// bodies).
///
/// # Example
///
/// ```
/// use ratewall::wait::Wait;
/// use ratewall::ConcurrencyLimiter;
/// use std::sync::Arc;
///
/// let pool = Arc::new(ConcurrencyLimiter::new(2)?);
/// let pool2 = Arc::clone(&pool);
/// let permit = std::thread::spawn(move || Wait::new().blocking(pool2.acquire_owned_n(2)))
///     .join()
///     .unwrap()
///     .unwrap();
/// assert_eq!(pool.in_flight(), 2);
/// drop(permit);
/// assert_eq!(pool.in_flight(), 0);
/// # Ok::<(), ratewall::ConfigError>(())
/// ```
#[must_use = "a waiting acquire does nothing unless awaited or blocked on"]
pub struct AcquireOwned<C: Clock = DefaultClock> {
    turn: Turn<Arc<ConcurrencyLimiter<C>>>,
}

/// The methods both waiting acquires share, written once.
macro_rules! acquire_methods {
    ($name:ident $(<$lt:lifetime>)?, $permit:ty) => {
        impl<$($lt,)? C: Clock> $name<$($lt,)? C> {
            /// Waits as a request of class `class` (default
            /// [`Priority::Normal`]): it may fill only its class's share, and
            /// a release serves the higher classes' waiters first.
            ///
            /// ```
            /// # use ratewall::{wait::Wait, ConcurrencyLimiter, Priority};
            /// let l = ConcurrencyLimiter::builder(4).keep_for(Priority::Critical, 50).build()?;
            /// let p = Wait::new().blocking(l.acquire_n(3).priority(Priority::Critical)).unwrap();
            /// assert_eq!(p.units(), 3);
            /// # Ok::<(), ratewall::ConfigError>(())
            /// ```
            pub fn priority(mut self, class: Priority) -> Self {
                self.turn.class = class;
                self
            }
        }

        impl<$($lt,)? C: Clock> WaitableCore for $name<$($lt,)? C> {}

        /// `wait.blocking(pool.acquire_n(n))`: waits on this thread
        /// (parked; a release unparks it) until admitted, or until `wait`'s
        /// timeout from now: never later. At the deadline the error is
        /// [`WaitError::NoPermit`], with the denial of the try at once
        /// (`None` for a fair waiter that queued behind others). A cost
        /// above the class's share of the maximum is
        /// [`WaitError::InsufficientCapacity`] at once, or when a lowered
        /// maximum rules it out while it waits. `wait`'s jitter is not
        /// used: a waiter is woken by the release that admits it.
        impl<$($lt,)? C: Clock> BlockingWaitable for $name<$($lt,)? C> {
            type Output = $permit;
            type Error = Infallible;
            fn block(self, wait: &Wait, _: Token) -> Result<$permit, WaitError> {
                self.turn.block(wait)
            }
        }

        /// `wait.until(pool.acquire_n(n)).await` (feature `wait`): waits
        /// (on tokio's timer for the deadline) until admitted or until
        /// `wait`'s timeout from now, never later; the errors as the
        /// blocking form's. Dropping the future takes nothing and loses
        /// nothing.
        #[cfg(feature = "wait")]
        impl<$($lt,)? C: Clock> Waitable for $name<$($lt,)? C> {
            type Output = $permit;
            type Error = Infallible;
            async fn until(self, wait: &Wait, _: Token) -> Result<$permit, WaitError> {
                self.turn.until(wait).await
            }
        }

        impl<$($lt,)? C: Clock> Future for $name<$($lt,)? C> {
            type Output = Result<$permit, InsufficientCapacity>;
            fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
                self.turn.poll_turn(cx.waker())
            }
        }

        impl<$($lt,)? C: Clock> fmt::Debug for $name<$($lt,)? C> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.debug_struct(stringify!($name))
                    .field("units", &self.turn.units)
                    .field("class", &self.turn.class)
                    .field("queued", &self.turn.queued.is_some())
                    .finish()
            }
        }
    };
}

acquire_methods!(Acquire<'a>, Permit<'a, C>);
acquire_methods!(AcquireOwned, OwnedPermit<C>);

impl<C: Clock> ConcurrencyLimiter<C> {
    /// Waits for one unit: [`acquire_n`](Self::acquire_n)`(1)`. Await it
    /// to wait with no deadline; give it to a [`Wait`] for one.
    ///
    /// ```
    /// # use ratewall::ConcurrencyLimiter;
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let pool = ConcurrencyLimiter::new(1)?;
    /// let permit = pool.acquire().await?;
    /// assert_eq!((permit.units(), pool.in_flight()), (1, 1));
    /// # Ok(()) }
    /// ```
    pub fn acquire(&self) -> Acquire<'_, C> {
        self.acquire_n(1)
    }

    /// Waits for `n` units: a future that resolves with the permit when a
    /// release (or a raised maximum) admits it, on any executor. A cost
    /// above the maximum is an error at once. See [`Acquire`] for the
    /// class, the deadline and the blocking form.
    ///
    /// ```
    /// # use ratewall::ConcurrencyLimiter;
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let pool = ConcurrencyLimiter::new(2)?;
    /// let a = pool.acquire().await?;
    /// let b = pool.acquire().await?;
    /// assert_eq!(pool.in_flight(), 2);
    /// assert!(pool.acquire_n(3).await.is_err()); // can never fit
    /// # drop((a, b));
    /// # Ok(()) }
    /// ```
    pub fn acquire_n(&self, n: u64) -> Acquire<'_, C> {
        Acquire {
            turn: Turn::new(self, n),
        }
    }

    /// [`acquire`](Self::acquire) for a `'static` [`OwnedPermit`]; see
    /// [`AcquireOwned`].
    ///
    /// ```
    /// # use ratewall::ConcurrencyLimiter;
    /// # use std::sync::Arc;
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let pool = Arc::new(ConcurrencyLimiter::new(1)?);
    /// let permit = pool.acquire_owned().await?;
    /// let task = tokio::spawn(async move { drop(permit) });
    /// task.await?;
    /// assert_eq!(pool.in_flight(), 0);
    /// # Ok(()) }
    /// ```
    pub fn acquire_owned(self: &Arc<Self>) -> AcquireOwned<C> {
        self.acquire_owned_n(1)
    }

    /// [`acquire_n`](Self::acquire_n) for a `'static` [`OwnedPermit`]; see
    /// [`AcquireOwned`].
    ///
    /// ```
    /// # use ratewall::ConcurrencyLimiter;
    /// # use std::sync::Arc;
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let pool = Arc::new(ConcurrencyLimiter::new(3)?);
    /// let permit = pool.acquire_owned_n(3).await?;
    /// let task = tokio::spawn(async move { drop(permit) });
    /// task.await?;
    /// assert_eq!(pool.in_flight(), 0);
    /// # Ok(()) }
    /// ```
    pub fn acquire_owned_n(self: &Arc<Self>, n: u64) -> AcquireOwned<C> {
        AcquireOwned {
            turn: Turn::new(Arc::clone(self), n),
        }
    }
}
