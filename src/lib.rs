//! # ratewall
//!
//! Lock-free rate limiting for hot paths. Five algorithms behind one API,
//! each keeping its per-key state in a single atomic word (the exact sliding
//! log keeps a ring): an allowed check is one compare-exchange, a denied
//! check writes no shared memory at all.
//!
//! ```
//! use ratewall::{Rate, TokenBucket};
//!
//! let limiter = TokenBucket::new(Rate::per_second(100).burst(20))?;
//! let decision = limiter.check();
//! if decision.is_allowed() {
//!     // handle the request
//! } else {
//!     // 429 Too Many Requests, with Retry-After: decision.retry_after_secs()
//! }
//! # Ok::<(), ratewall::ConfigError>(())
//! ```
//!
//! Every check returns a [`Decision`] with `limit`, `remaining`,
//! `retry_after` and `reset_after`. Time comes from a [`Clock`]; tests use
//! [`ManualClock`].
//!
//! With the `tower` feature, `ratewall::http` is a tower layer that
//! checks per-IP, per-key and per-route rules in one all-or-nothing step
//! (`docs/http.md`).
//!
//! With the `client` feature, `ratewall::client` reads what an upstream
//! API announces about its limits and keeps what a client learns from it
//! per partition, and `client::PacingLayer` paces any tower HTTP client by
//! it (`docs/client.md`).
//!
//! See `docs/design.md` for the bit layouts, the CAS protocol and the
//! memory orderings.
// `deny`, not `forbid`: one function allows it, the x86-64 prefetch under a
// keyed slot's load ahead (`keyed/table_ahead.rs`, run under miri).
#![cfg_attr(not(ratewall_loom), deny(unsafe_code))]
#![warn(
    missing_docs,
    missing_debug_implementations,
    rust_2018_idioms,
    unreachable_pub
)]

mod algo;
#[cfg(feature = "client")]
pub mod client;
mod clock;
mod concurrency;
mod decision;
mod elastic;
mod error;
#[cfg(feature = "tower")]
pub mod http;
mod keyed;
mod lease;
mod limiter;
#[cfg(feature = "metrics")]
mod metrics;
mod multi;
#[cfg(feature = "tower")]
mod offenders;
mod policy;
mod quota;
#[cfg(feature = "redis")]
pub mod redis;
mod soft;
mod sync;
mod text;
pub mod wait;
mod word;
mod wording;

/// The README's examples, compiled and run as doctests with warnings
/// denied (`cargo test --all-features --doc Readme`). Blocks that need a
/// server are `no_run`: compiled, not run.
#[cfg(all(
    doctest,
    feature = "axum",
    feature = "client",
    feature = "redis",
    feature = "wait"
))]
#[doc = include_str!("../README.md")]
#[doc(test(attr(deny(warnings))))]
pub struct Readme;

/// The algorithm types that parametrize [`Limiter`].
pub mod algorithm {
    pub use crate::algo::{Algorithm, FixedCounter, Gcra, LeakyGcra, SlidingCounter, SlidingLog};
    pub use crate::keyed::KeyedAlgorithm;
}

#[cfg(all(feature = "quanta", not(ratewall_loom)))]
pub use clock::CoarseClock;
#[cfg(feature = "quanta")]
pub use clock::QuantaClock;
pub use clock::{Clock, ManualClock, StdClock};
pub use concurrency::{
    Acquire, AcquireOwned, Acquisition, Adaptive, ConcurrencyBuilder, ConcurrencyLimiter, Outcome,
    OwnedPermit, Permit, Priority, MAX_ADAPTIVE, MAX_PERMITS,
};
pub use decision::{Decision, Tracking};
pub use elastic::{ElasticBuilder, ElasticLimiter};
pub use error::{ConfigError, InsufficientCapacity, InvalidPolicyName};
pub use keyed::{
    CheckKeys, HotKeys, KeyedBuilder, KeyedConcurrencyBuilder, KeyedConcurrencyLimiter,
    KeyedFixedWindow, KeyedLeakyBucket, KeyedLimiter, KeyedPermit, KeyedPolicyBuilder,
    KeyedPolicyLimiter, KeyedRef, KeyedSlidingWindowCounter, KeyedSlidingWindowLog,
    KeyedTokenBucket, OwnedKeyedPermit, TableOptions, WhenFull, MAX_KEYS,
};
pub use lease::{LeaseOptions, StripedLimiter};
pub use limiter::{
    DefaultClock, FixedWindow, LeakyBucket, Limiter, Reservation, SlidingWindowCounter,
    SlidingWindowLog, TokenBucket,
};
pub use multi::{check_all, check_all_n, check_each, Limit};
pub use policy::{Policy, PolicyAlgorithm};
pub use quota::{Rate, Window};
pub use soft::Tolerance;
pub use text::ParseError;
