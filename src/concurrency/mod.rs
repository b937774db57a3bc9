//! Concurrency limits: how many requests are in flight at once, beside the
//! rate limits. One file per concern:
//!
//! - `limiter.rs`: [`ConcurrencyLimiter`] and [`ConcurrencyBuilder`]; the
//!   admission and the release (the word arithmetic is `algo::concurrency`);
//! - `permit.rs`: [`Acquisition`], [`Permit`], [`OwnedPermit`], and the
//!   `try_acquire` methods that hand them out;
//! - `acquire.rs`: waiting for a permit: [`Acquire`], [`AcquireOwned`]
//!   (futures on any executor, their blocking form, a deadline with
//!   feature `wait`) and the `acquire` methods;
//! - `waiters.rs`: the queue waiters sleep in, and its protocol with the
//!   word's waiters mark;
//! - `adaptive.rs`: [`Adaptive`] (AIMD, Vegas) and the lock-free controller;
//! - `priority.rs`: [`Priority`] and the kept shares.
//!
//! See `docs/concurrency.md`.

mod acquire;
mod adaptive;
mod limiter;
mod permit;
mod priority;
mod waiters;

pub use crate::algo::concurrency::MAX_PERMITS;
pub use acquire::{Acquire, AcquireOwned};
pub use adaptive::{Adaptive, Outcome, MAX_ADAPTIVE};
#[cfg(feature = "redis")]
pub(crate) use limiter::check_max;
pub use limiter::{ConcurrencyBuilder, ConcurrencyLimiter};
pub use permit::{Acquisition, OwnedPermit, Permit};
pub use priority::Priority;
