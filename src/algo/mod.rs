//! The algorithms. Each is a validated parameter type with a pure step
//! function; `word.rs` applies the single-word ones atomically.
//!
//! [`Algorithm`] is public so it can name a limiter's type
//! (`Limiter<Gcra>`), but it is sealed: its methods are internal.

use crate::decision::Decision;
use crate::error::{ConfigError, InsufficientCapacity};
use crate::word::{AtomicWord, Packing, ParamCell, Params};
use std::fmt;

pub(crate) mod concurrency;
mod fixed;
mod gcra;
mod log;
mod sliding;
mod window;

pub use fixed::FixedCounter;
#[cfg(feature = "redis")]
pub(crate) use gcra::gcra_decide;
#[cfg(feature = "redis")]
pub(crate) use gcra::TimePacking;
pub use gcra::{Gcra, LeakyGcra};
pub(crate) use log::LogRing;
pub use log::SlidingLog;
pub use sliding::SlidingCounter;

/// A rate-limiting algorithm: the type parameter of [`Limiter`](crate::Limiter).
///
/// Implemented by [`Gcra`] (token bucket), [`LeakyGcra`] (leaky bucket),
/// and the window algorithms. Sealed: it cannot be implemented outside this
/// crate.
///
/// # Example
///
/// ```
/// use ratewall::{algorithm::Gcra, Limiter, Rate};
///
/// fn describe<A: ratewall::algorithm::Algorithm>(l: &Limiter<A>) -> String {
///     format!("{} with {:?}", A::NAME, l.quota())
/// }
/// let bucket: Limiter<Gcra> = Limiter::new(Rate::per_second(5)).unwrap();
/// assert!(describe(&bucket).starts_with("token bucket"));
/// ```
pub trait Algorithm: sealed::Core {
    /// A short human-readable name, such as `"token bucket"`.
    const NAME: &'static str;
}

pub(crate) mod sealed {
    use super::*;

    /// The engine's view of an algorithm. Public in a private module, so
    /// nothing outside the crate can name or implement it.
    pub trait Core: Params + Copy + fmt::Debug + Send + Sync + 'static {
        /// What users configure ([`Rate`](crate::Rate) or a window).
        type Config: Copy + fmt::Debug + Send + Sync + 'static;
        /// Per-limiter (per-key) state.
        type Cell: fmt::Debug + Send + Sync;

        fn from_config(config: &Self::Config) -> Result<Self, ConfigError>;
        fn new_cell(&self) -> Self::Cell;
        /// The largest cost that can ever pass at once.
        fn capacity(&self) -> u64;
        /// One check of cost `n` (0 never consumes). Parameters are read from
        /// `params` inside the CAS loop (see `ParamCell`).
        fn check(
            cell: &Self::Cell,
            params: &ParamCell,
            now: u64,
            n: u64,
            consume: bool,
        ) -> Result<Decision, InsufficientCapacity>;
        /// Gives back `n` that an earlier check at about `now` took.
        fn refund(cell: &Self::Cell, params: &ParamCell, now: u64, n: u64);
        /// Back to the fresh state.
        fn reset(cell: &Self::Cell);
        /// Converts the state kept under `old` into the same usage under `new`.
        fn rescale(cell: &Self::Cell, old: &Self, new: &Self, now: u64);
        /// Whether the state equals a fresh one's at `now`.
        fn is_idle(cell: &Self::Cell, params: &Self, now: u64) -> bool;
    }
}

/// A single-word algorithm: pure functions over the packed state. All-zero
/// is the fresh state. `now` is at most `HORIZON`; `n` is in `1..=capacity`.
// `pub` in a private module: a supertrait of the public `KeyedAlgorithm`
// that nothing outside the crate can name or implement (sealed).
pub trait WordStep: Params + Copy {
    fn capacity(&self) -> u64;
    /// The decision for cost `n`, and the next state if it must change.
    fn step(&self, state: u64, now: u64, n: u64) -> (Decision, Option<u64>);
    /// The state after giving back `n`, or `None` if nothing changes.
    fn refund(&self, state: u64, now: u64, n: u64) -> Option<u64>;
    /// The state kept under `old`, converted to mean the same usage under `self`.
    fn rescale(&self, old: &Self, state: u64, now: u64) -> u64;
    /// Whether `state` carries no information at `now` (equals a fresh state).
    fn is_idle(&self, state: u64, now: u64) -> bool;
    /// Nanoseconds from `now` until `state` is idle (0 iff `is_idle`): the
    /// earliest moment a keyed table may reclaim the key.
    fn time_to_idle(&self, state: u64, now: u64) -> u64;
    /// The units `state` holds at `now`: among keys equally close to idle
    /// (a window's keys all go idle at its end), eviction takes the one
    /// that holds least, so a key-spraying client's one-request keys go
    /// before a key that spent more. 0 where the time to idle says it all.
    fn held(&self, _state: u64, _now: u64) -> u64 {
        0
    }
    /// The token bucket's parameters (`None` for every other algorithm):
    /// leases (`src/lease/`) are token-bucket arithmetic.
    fn as_gcra(&self) -> Option<Gcra> {
        None
    }
}

/// A single-word algorithm a keyed table can hold: how its state packs into
/// the 40 low bits of the table's 8-byte slot word (the 24 above hold the
/// key's tag; `docs/design.md`, "Keyed table"). The one interface between an
/// algorithm and the keyed table: an algorithm implements it once (its
/// packing type, the packing a table built with its parameters uses, and
/// which parameters that packing can hold), and the table does the rest
/// (tags, probing, reclaim, the wrap sweep of a packing with time in it).
///
/// A packing is fixed for the table's life: per-key quotas and quota changes
/// whose parameters it cannot hold are refused with the `ConfigError` that
/// [`fits`](Self::fits) returns. An algorithm whose state is a count with no
/// time (`< 2^40`) uses [`Plain`](crate::word::Plain) and accepts any
/// parameters.
// `pub` in a private module, as `WordStep`: sealed.
pub trait KeyedWord: WordStep {
    /// The packing of the state (`word::Packing`).
    type Packing: Packing;
    /// The packing of a table built with these parameters, or what to
    /// change if its slot cannot hold them.
    fn packing(&self) -> Result<Self::Packing, ConfigError>;
    /// Whether a table with `packing` can hold keys under these parameters
    /// (a per-key quota, a quota change), or what to change.
    fn fits(&self, packing: &Self::Packing) -> Result<(), ConfigError>;
    /// These parameters as the table runs them, in the packing's units
    /// (GCRA: the interval rounded up to whole time units, so that every
    /// state is a whole number of units and packs exactly). The keyed
    /// limiter stores these in its `ParamCell`, and reads time with
    /// `Packing::time`. Itself by default.
    fn in_units(self, packing: &Self::Packing) -> Self {
        let _ = packing;
        self
    }
}

/// The CAS-applied check shared by every single-word algorithm.
#[inline]
pub(crate) fn word_check<A: WordStep>(
    cell: &AtomicWord,
    params: &ParamCell,
    now: u64,
    n: u64,
    consume: bool,
) -> Result<Decision, InsufficientCapacity> {
    // The loop only decides the next state; the decision is built once,
    // after the exchange, from the state and parameters the winning step
    // used (the same pure function of the same inputs). Built inside the
    // loop, it was stored field by field, kept across the exchange, and
    // copied out: a store-forwarding stall on every check.
    let (a, state) = cell.apply(|state| {
        let a: A = params.read();
        if n > a.capacity() {
            return (a, None);
        }
        let next = if consume && n > 0 {
            a.step(state, now, n).1
        } else {
            None
        };
        (a, next)
    });
    InsufficientCapacity::check(n, a.capacity())?;
    // A cost of 0 asks for the decision of a unit request, without taking it.
    Ok(a.step(state, now, n.max(1)).0)
}

#[inline]
pub(crate) fn word_refund<A: WordStep>(cell: &AtomicWord, params: &ParamCell, now: u64, n: u64) {
    if n == 0 {
        return;
    }
    cell.update(|state| {
        let a: A = params.read();
        ((), a.refund(state, now, n))
    });
}

/// Implements the engine trait for a single-word algorithm.
macro_rules! word_algorithm {
    ($ty:ty, $config:ty, $name:expr, $validate:expr) => {
        impl $crate::algo::sealed::Core for $ty {
            type Config = $config;
            type Cell = $crate::word::AtomicWord;

            fn from_config(config: &$config) -> Result<Self, $crate::error::ConfigError> {
                let validate: fn(&$config) -> Result<$ty, $crate::error::ConfigError> = $validate;
                validate(config)
            }
            fn new_cell(&self) -> Self::Cell {
                $crate::word::AtomicWord::new(0)
            }
            #[inline]
            fn capacity(&self) -> u64 {
                $crate::algo::WordStep::capacity(self)
            }
            #[inline]
            fn check(
                cell: &Self::Cell,
                params: &$crate::word::ParamCell,
                now: u64,
                n: u64,
                consume: bool,
            ) -> Result<$crate::decision::Decision, $crate::error::InsufficientCapacity> {
                $crate::algo::word_check::<$ty>(cell, params, now, n, consume)
            }
            fn refund(cell: &Self::Cell, params: &$crate::word::ParamCell, now: u64, n: u64) {
                $crate::algo::word_refund::<$ty>(cell, params, now, n)
            }
            fn reset(cell: &Self::Cell) {
                cell.store(0);
            }
            fn rescale(cell: &Self::Cell, old: &Self, new: &Self, now: u64) {
                cell.update(|s| ((), Some($crate::algo::WordStep::rescale(new, old, s, now))));
            }
            fn is_idle(cell: &Self::Cell, params: &Self, now: u64) -> bool {
                $crate::algo::WordStep::is_idle(params, cell.load(), now)
            }
        }
        impl $crate::algo::Algorithm for $ty {
            const NAME: &'static str = $name;
        }
    };
}
pub(crate) use word_algorithm;

#[cfg(all(test, not(ratewall_loom)))]
#[path = "keyed_word_tests.rs"]
mod keyed_word_tests;
