//! What an acquisition returns: the decision, and a permit that gives its
//! units back exactly once, when it is dropped; and the acquiring methods
//! of `ConcurrencyLimiter` that hand them out.

use super::adaptive::Outcome;
use super::limiter::{ConcurrencyLimiter, Held};
use super::priority::Priority;
use crate::clock::Clock;
use crate::decision::Decision;
use crate::error::InsufficientCapacity;
use crate::limiter::DefaultClock;
use std::fmt;
use std::sync::Arc;

/// The answer to a `try_acquire`: the [`Decision`] (as every limiter gives
/// one, with `limit` and `remaining`), and the permit when it was allowed.
///
/// # Example
///
/// ```
/// use ratewall::ConcurrencyLimiter;
///
/// let l = ConcurrencyLimiter::new(2)?;
/// let a = l.try_acquire();
/// assert!(a.is_allowed());
/// assert_eq!((a.decision().limit(), a.decision().remaining()), (2, 1));
/// let permit = a.into_permit().unwrap(); // dropping it gives the unit back
/// # drop(permit);
/// # Ok::<(), ratewall::ConfigError>(())
/// ```
#[must_use = "dropping an acquisition releases its permit at once"]
pub struct Acquisition<P> {
    decision: Decision,
    permit: Option<P>,
    /// The units asked for (a wait's error names them).
    units: u64,
}

impl<P> Acquisition<P> {
    pub(crate) fn new(decision: Decision, permit: Option<P>, units: u64) -> Self {
        Acquisition {
            decision,
            permit,
            units,
        }
    }

    /// A one-permit request's acquisition: one permit always fits (a
    /// maximum, and each class's share of it, is at least 1), so the error
    /// arm never runs; were it reached, it is a denial that takes nothing.
    #[inline]
    pub(crate) fn unit(result: Result<Self, InsufficientCapacity>) -> Self {
        match result {
            Ok(a) => a,
            Err(e) => Self::unit_never_fits(e),
        }
    }

    #[cold]
    fn unit_never_fits(e: InsufficientCapacity) -> Self {
        Acquisition::new(Decision::deny(e.capacity, 0, u64::MAX, u64::MAX), None, 1)
    }

    /// The units asked for.
    pub(crate) fn units(&self) -> u64 {
        self.units
    }

    /// Whether the request was admitted (and so holds a permit).
    ///
    /// ```
    /// # use ratewall::ConcurrencyLimiter;
    /// let l = ConcurrencyLimiter::new(1)?;
    /// let first = l.try_acquire();
    /// assert!(first.is_allowed());
    /// assert!(!l.try_acquire().is_allowed());
    /// # Ok::<(), ratewall::ConfigError>(())
    /// ```
    pub fn is_allowed(&self) -> bool {
        self.decision.is_allowed()
    }

    /// The decision: `limit` is the current maximum, `remaining` what this
    /// request's class may still take, and a denial's `retry_after` is the
    /// observed mean hold time of a permit: a **hint** of when one comes back.
    ///
    /// ```
    /// # use ratewall::ConcurrencyLimiter;
    /// let l = ConcurrencyLimiter::new(3)?;
    /// let a = l.try_acquire_n(2).unwrap();
    /// assert_eq!(a.decision().remaining(), 1);
    /// # Ok::<(), ratewall::ConfigError>(())
    /// ```
    pub fn decision(&self) -> Decision {
        self.decision
    }

    /// The permit, if the request was admitted.
    ///
    /// ```
    /// # use ratewall::ConcurrencyLimiter;
    /// let l = ConcurrencyLimiter::new(1)?;
    /// let permit = l.try_acquire().into_permit();
    /// assert!(permit.is_some());
    /// assert!(l.try_acquire().into_permit().is_none());
    /// # Ok::<(), ratewall::ConfigError>(())
    /// ```
    pub fn into_permit(self) -> Option<P> {
        self.permit
    }
}

impl<P> fmt::Debug for Acquisition<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Acquisition")
            .field("decision", &self.decision)
            .field("permit", &self.permit.is_some())
            .finish()
    }
}

/// A permit borrowed from a [`ConcurrencyLimiter`]: its units are in flight
/// until it is dropped, which releases them exactly once (also when the
/// thread panics or the future holding it is dropped).
///
/// # Example
///
/// ```
/// use ratewall::ConcurrencyLimiter;
///
/// let l = ConcurrencyLimiter::new(1)?;
/// {
///     let _permit = l.try_acquire().into_permit().unwrap();
///     assert_eq!(l.in_flight(), 1);
/// }
/// assert_eq!(l.in_flight(), 0);
/// # Ok::<(), ratewall::ConfigError>(())
/// ```
#[must_use = "dropping a permit releases it at once"]
pub struct Permit<'a, C: Clock = DefaultClock> {
    pub(crate) limiter: &'a ConcurrencyLimiter<C>,
    pub(crate) held: Held,
}

/// A permit that owns an `Arc` of its [`ConcurrencyLimiter`], so it is
/// `'static` and can move into a spawned task or a response body (what
/// middleware needs). Dropping it releases its units exactly once.
///
/// # Example
///
/// ```
/// use ratewall::ConcurrencyLimiter;
/// use std::sync::Arc;
///
/// let l = Arc::new(ConcurrencyLimiter::new(4)?);
/// let permit = l.try_acquire_owned().into_permit().unwrap();
/// std::thread::spawn(move || drop(permit)).join().unwrap();
/// assert_eq!(l.in_flight(), 0);
/// # Ok::<(), ratewall::ConfigError>(())
/// ```
#[must_use = "dropping a permit releases it at once"]
pub struct OwnedPermit<C: Clock = DefaultClock> {
    pub(crate) limiter: Arc<ConcurrencyLimiter<C>>,
    pub(crate) held: Held,
}

/// The methods both permits share, written once.
macro_rules! permit_methods {
    ($name:ident $(<$lt:lifetime>)?) => {
        impl<$($lt,)? C: Clock> $name<$($lt,)? C> {
            /// The units this permit holds.
            ///
            /// ```
            /// # use ratewall::ConcurrencyLimiter;
            /// let l = ConcurrencyLimiter::new(5)?;
            /// let p = l.try_acquire_n(3).unwrap().into_permit().unwrap();
            /// assert_eq!(p.units(), 3);
            /// # Ok::<(), ratewall::ConfigError>(())
            /// ```
            pub fn units(&self) -> u64 {
                self.held.units
            }

            /// Releases the permit now and tells an adaptive limit how the
            /// request ended (a plain drop reports [`Outcome::Success`], or
            /// [`Outcome::Dropped`] during a panic). Without an adaptive
            /// limit the outcome is ignored.
            ///
            /// ```
            /// # use ratewall::{ConcurrencyLimiter, Outcome};
            /// let l = ConcurrencyLimiter::new(5)?;
            /// let p = l.try_acquire().into_permit().unwrap();
            /// p.release(Outcome::Ignored);
            /// assert_eq!(l.in_flight(), 0);
            /// # Ok::<(), ratewall::ConfigError>(())
            /// ```
            pub fn release(mut self, outcome: Outcome) {
                self.held.outcome = Some(outcome);
                // Dropped here: `Drop` releases, once.
            }
        }

        impl<$($lt,)? C: Clock> Drop for $name<$($lt,)? C> {
            fn drop(&mut self) {
                self.limiter.release(&self.held);
            }
        }

        impl<$($lt,)? C: Clock> fmt::Debug for $name<$($lt,)? C> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.debug_struct(stringify!($name))
                    .field("units", &self.held.units)
                    .finish()
            }
        }
    };
}

permit_methods!(Permit<'a>);
permit_methods!(OwnedPermit);

impl<C: Clock> ConcurrencyLimiter<C> {
    /// Takes one unit if it fits, as a [`Priority::Normal`] request,
    /// without waiting. One unit always fits a maximum (at least 1), so
    /// this is the [`Acquisition`] itself, as `check()` is a decision;
    /// [`try_acquire_n`](Self::try_acquire_n) takes more.
    ///
    /// ```
    /// # use ratewall::ConcurrencyLimiter;
    /// let l = ConcurrencyLimiter::new(1)?;
    /// let first = l.try_acquire();
    /// assert!(first.is_allowed());
    /// assert!(!l.try_acquire().is_allowed()); // held by `first`
    /// drop(first);
    /// assert!(l.try_acquire().is_allowed());
    /// # Ok::<(), ratewall::ConfigError>(())
    /// ```
    #[inline]
    pub fn try_acquire(&self) -> Acquisition<Permit<'_, C>> {
        Acquisition::unit(self.try_acquire_n(1))
    }

    /// Takes `n` units if they fit, as a [`Priority::Normal`] request,
    /// without waiting. A cost above what this class may ever hold at the
    /// current maximum is an error, not a denial.
    ///
    /// ```
    /// # use ratewall::{ConcurrencyLimiter, InsufficientCapacity};
    /// let l = ConcurrencyLimiter::new(4)?;
    /// let big = l.try_acquire_n(3)?;
    /// assert!(big.is_allowed());
    /// assert!(!l.try_acquire_n(2)?.is_allowed());
    /// assert_eq!(l.try_acquire_n(5).unwrap_err(), InsufficientCapacity { requested: 5, capacity: 4 });
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline]
    pub fn try_acquire_n(
        &self,
        n: u64,
    ) -> Result<Acquisition<Permit<'_, C>>, InsufficientCapacity> {
        self.try_acquire_n_with(n, Priority::Normal)
    }

    /// [`try_acquire`](Self::try_acquire) for a request of class `class`.
    ///
    /// ```
    /// # use ratewall::{ConcurrencyLimiter, Priority};
    /// let l = ConcurrencyLimiter::builder(10).keep_for(Priority::Critical, 50).build()?;
    /// let _held = l.try_acquire_n(5)?;
    /// assert!(!l.try_acquire().is_allowed());
    /// assert!(l.try_acquire_with(Priority::Critical).is_allowed());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline]
    pub fn try_acquire_with(&self, class: Priority) -> Acquisition<Permit<'_, C>> {
        Acquisition::unit(self.try_acquire_n_with(1, class))
    }

    /// [`try_acquire_n`](Self::try_acquire_n) for a request of class `class`.
    ///
    /// ```
    /// # use ratewall::{ConcurrencyLimiter, Priority};
    /// let l = ConcurrencyLimiter::builder(10).keep_for(Priority::Critical, 50).build()?;
    /// let _held = l.try_acquire_n(5)?;
    /// assert!(!l.try_acquire().is_allowed());
    /// assert!(l.try_acquire_n_with(2, Priority::Critical)?.is_allowed());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline]
    pub fn try_acquire_n_with(
        &self,
        n: u64,
        class: Priority,
    ) -> Result<Acquisition<Permit<'_, C>>, InsufficientCapacity> {
        let (decision, held) = self.try_admit(n, class)?;
        Ok(Acquisition::new(
            decision,
            held.map(|held| Permit {
                limiter: self,
                held,
            }),
            n,
        ))
    }

    /// [`try_acquire`](Self::try_acquire) with a `'static` permit that owns
    /// an `Arc` of the limiter: for spawned tasks and response bodies.
    ///
    /// ```
    /// # use ratewall::ConcurrencyLimiter;
    /// # use std::sync::Arc;
    /// let l = Arc::new(ConcurrencyLimiter::new(1)?);
    /// let p = l.try_acquire_owned().into_permit().unwrap();
    /// assert!(!l.try_acquire_owned().is_allowed());
    /// std::thread::spawn(move || drop(p)).join().unwrap();
    /// assert_eq!(l.in_flight(), 0);
    /// # Ok::<(), ratewall::ConfigError>(())
    /// ```
    #[inline]
    pub fn try_acquire_owned(self: &Arc<Self>) -> Acquisition<OwnedPermit<C>> {
        Acquisition::unit(self.try_acquire_owned_n(1))
    }

    /// [`try_acquire_n`](Self::try_acquire_n) with a `'static` permit that
    /// owns an `Arc` of the limiter.
    ///
    /// ```
    /// # use ratewall::ConcurrencyLimiter;
    /// # use std::sync::Arc;
    /// let l = Arc::new(ConcurrencyLimiter::new(2)?);
    /// let p = l.try_acquire_owned_n(2)?.into_permit().unwrap();
    /// assert!(!l.try_acquire_owned().is_allowed());
    /// drop(p);
    /// assert_eq!(l.in_flight(), 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline]
    pub fn try_acquire_owned_n(
        self: &Arc<Self>,
        n: u64,
    ) -> Result<Acquisition<OwnedPermit<C>>, InsufficientCapacity> {
        self.try_acquire_owned_n_with(n, Priority::Normal)
    }

    /// [`try_acquire_owned`](Self::try_acquire_owned) for a request of class `class`.
    ///
    /// ```
    /// # use ratewall::{ConcurrencyLimiter, Priority};
    /// # use std::sync::Arc;
    /// let l = Arc::new(ConcurrencyLimiter::new(1)?);
    /// assert!(l.try_acquire_owned_with(Priority::Sheddable).is_allowed());
    /// # Ok::<(), ratewall::ConfigError>(())
    /// ```
    #[inline]
    pub fn try_acquire_owned_with(
        self: &Arc<Self>,
        class: Priority,
    ) -> Acquisition<OwnedPermit<C>> {
        Acquisition::unit(self.try_acquire_owned_n_with(1, class))
    }

    /// [`try_acquire_owned_n`](Self::try_acquire_owned_n) for a request of class `class`.
    ///
    /// ```
    /// # use ratewall::{ConcurrencyLimiter, Priority};
    /// # use std::sync::Arc;
    /// let l = Arc::new(ConcurrencyLimiter::new(2)?);
    /// assert!(l.try_acquire_owned_n_with(2, Priority::Sheddable)?.is_allowed());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline]
    pub fn try_acquire_owned_n_with(
        self: &Arc<Self>,
        n: u64,
        class: Priority,
    ) -> Result<Acquisition<OwnedPermit<C>>, InsufficientCapacity> {
        let (decision, held) = self.try_admit(n, class)?;
        Ok(Acquisition::new(
            decision,
            held.map(|held| OwnedPermit {
                limiter: Arc::clone(self),
                held,
            }),
            n,
        ))
    }
}
