//! Limits shared through Redis (feature `redis`): the same [`Policy`] as a
//! local limiter, with its state in Redis, so N instances behind a load
//! balancer admit L in total, not N x L.
//!
//! - [`RedisBackend`]: one connection (pipelined, reconnecting), a per-call
//!   timeout and a circuit breaker.
//! - [`RedisLimiter`]: one policy on that backend: `check_key`,
//!   `check_key_n`, `peek_key`, `peek_key_n`, `refund_key`, `reset_key`
//!   (the verbs of the local keyed limiters), each one round trip.
//! - [`RedisDecision`]: a [`Decision`] plus where it came from
//!   ([`DecisionSource`]): Redis, the local fallback, or fail-open.
//! - [`FailurePolicy`]: what to answer when Redis cannot, and
//!   [`StoreEvent`]: one report when a limiter starts failing over and one
//!   when Redis answers again.
//! - [`RedisElasticLimiter`]: an elastic limit (guarantee, ceiling and a
//!   shared pool), one script call per check, all or nothing.
//! - [`RedisLeaseLimiter`]: a [`RedisLimiter`] (token or leaky bucket,
//!   fixed window) whose hot keys take up to k units per round trip and
//!   admit them locally, with the bound kept exact.
//! - [`RedisConcurrencyLimiter`]: at most `max` units in flight per key
//!   across every instance, with permits ([`RedisPermit`]) that expire
//!   unless renewed, so a crashed instance's permits lapse.
//! - [`check_all`]: several (limit, key, cost) triples, all or nothing, in
//!   parallel, for the HTTP layer.
//!
//! Connections: one server (`redis://[user:password@]host:port/db`), a
//! Redis Cluster ([`RedisBackend::cluster_builder`]), TLS (`rediss://`,
//! with a private CA or mutual TLS: feature `redis-tls`, rustls) and Redis
//! Sentinel (`RedisBackend::sentinel_builder`, feature `redis-sentinel`),
//! all through the same timeout, breaker and failure policies; see
//! "Connections" in `docs/distributed.md`.
//!
//! Each algorithm is one Lua script (in `src/redis/lua/`), loaded once and
//! called by its SHA (reloaded on `NOSCRIPT`). The script reads the
//! server's `TIME` in microseconds (never the client's clock), runs the
//! same step as the local algorithm, and on allow writes the key's state as
//! integers with its TTL in the same command; a denial writes nothing. Key
//! layout, TTLs, rounding and failure handling are in `docs/distributed.md`.
//!
//! MSRV: the `redis` crate needs Rust 1.88; the core keeps 1.80.
//!
//! # Example
//!
//! ```no_run
//! use ratewall::redis::{DecisionSource, FailurePolicy, RedisBackend, RedisLimiter};
//! use ratewall::{Policy, Rate};
//!
//! # async fn f() -> Result<(), ratewall::redis::RedisError> {
//! let redis = RedisBackend::builder("redis://127.0.0.1:6379").build()?;
//! let per_ip = RedisLimiter::builder(Policy::token_bucket(Rate::per_second(10).burst(20)), &redis)
//!     .name("per-ip")
//!     .on_failure(FailurePolicy::FallbackShare { instances: 3 })
//!     .build()?;
//! let d = per_ip.check_key(b"192.0.2.7").await?;
//! if !d.is_allowed() {
//!     // 429 with Retry-After: d.retry_after_secs()
//! }
//! if d.source() != DecisionSource::Redis {
//!     // decided locally: Redis is down or slow
//! }
//! # Ok(()) }
//! ```

mod backend;
mod batch;
mod breaker;
mod concurrency;
mod connection;
mod deny_cache;
mod door;
mod elastic;
mod error;
mod events;
mod failover;
mod fault;
mod key;
mod key_names;
mod lease;
mod limiter;
mod lockout;
mod multi;
mod script;
#[cfg(feature = "redis-sentinel")]
mod sentinel;
#[cfg(test)]
mod testing;
#[cfg(test)]
mod tests;
#[cfg(feature = "redis-tls")]
mod tls;
#[cfg(feature = "wait")]
mod wait;
mod wire;

pub use backend::{
    RedisBackend, RedisBackendBuilder, DEFAULT_BREAKER_FAILURES, DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_COOL_DOWN, DEFAULT_IN_FLIGHT, DEFAULT_MAX_BATCH, DEFAULT_TIMEOUT,
};
#[cfg(feature = "wait")]
pub use concurrency::RedisAcquire;
pub use concurrency::{
    RedisAcquisition, RedisConcurrencyBuilder, RedisConcurrencyLimiter, RedisPermit,
    DEFAULT_PERMIT_EXPIRY,
};
pub use elastic::{RedisElasticBuilder, RedisElasticLimiter};
pub use error::RedisError;
pub use events::StoreEvent;
pub use failover::FailurePolicy;
pub use lease::{RedisLeaseLimiter, RedisLeaseOptions};
pub use limiter::{RedisLimiter, RedisLimiterBuilder};
#[cfg_attr(not(feature = "tower"), allow(unused_imports))]
pub(crate) use lockout::{check_all_locked, Locked};
pub use multi::check_all;

use crate::decision::Decision;
#[allow(unused_imports)] // doc links
use crate::policy::Policy;
use std::ops::Deref;

/// Where a [`RedisDecision`] came from.
///
/// # Example
///
/// ```
/// use ratewall::redis::DecisionSource;
/// assert_ne!(DecisionSource::Redis, DecisionSource::Fallback);
/// ```
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DecisionSource {
    /// The script in Redis decided, on the shared state.
    Redis,
    /// Denied locally, with no round trip: Redis denied this key a moment
    /// ago and its `retry_after` has not passed (see
    /// [`RedisLimiterBuilder::deny_cache`]).
    DenyCache,
    /// Redis could not answer; the local fallback limiter decided
    /// ([`FailurePolicy::FallbackShare`] or [`FailurePolicy::Fallback`]).
    Fallback,
    /// Redis could not answer and the policy is [`FailurePolicy::Open`]:
    /// allowed without counting.
    FailOpen,
    /// Admitted locally, with no round trip, from units this instance
    /// leased from Redis earlier (see [`RedisLeaseLimiter`]); they were
    /// counted in Redis when the lease was taken.
    Lease,
}

/// A [`Decision`] and where it came from. Derefs to the decision, so
/// `d.is_allowed()`, `d.retry_after_secs()` and the rest read as usual.
///
/// # Example
///
/// ```
/// use ratewall::redis::{DecisionSource, RedisDecision};
///
/// fn describe(d: &RedisDecision) -> String {
///     // Derefs to `Decision`: every field and helper, plus where it came from.
///     format!("remaining {} ({:?})", d.remaining(), d.source())
/// }
/// ```
#[must_use = "a decision that is not looked at does not limit anything"]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RedisDecision {
    decision: Decision,
    source: DecisionSource,
}

impl RedisDecision {
    /// The decision.
    ///
    /// ```
    /// # use ratewall::redis::RedisDecision;
    /// fn allowed(d: &RedisDecision) -> bool { d.decision().is_allowed() }
    /// ```
    pub fn decision(&self) -> Decision {
        self.decision
    }

    /// Where it came from.
    ///
    /// ```
    /// # use ratewall::redis::{DecisionSource, RedisDecision};
    /// fn shared(d: &RedisDecision) -> bool { d.source() == DecisionSource::Redis }
    /// ```
    pub fn source(&self) -> DecisionSource {
        self.source
    }
}

impl Deref for RedisDecision {
    type Target = Decision;
    fn deref(&self) -> &Decision {
        &self.decision
    }
}
