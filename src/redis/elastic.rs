//! [`RedisElasticLimiter`]: an elastic limit (a per-key guarantee, a
//! per-key ceiling and a shared pool) whose state lives in Redis.
//!
//! One script (`lua/elastic.lua`) runs the protocol of the local
//! [`ElasticLimiter`] at one server time over three keys: the key's
//! guarantee, the key's headroom (ceiling minus guarantee) and the pool.
//! It writes only what an admission takes, so a denial writes nothing to
//! any of the three. The three keys share one hash tag, `{name}`, so Redis
//! Cluster runs the script on one node: every key of one elastic limit
//! lives in the pool's slot (see `docs/distributed.md`).

use super::backend::RedisBackend;
use super::door;
use super::failover::{option_methods, share, Failover, Options};
use super::key;
use super::script::Program;
use super::wire::{elastic_call, parse_elastic};
use super::{DecisionSource, FailurePolicy, RedisDecision, RedisError};
use crate::decision::{Decision, Tracking};
use crate::elastic::validate;
#[allow(unused_imports)] // doc links
use crate::elastic::ElasticLimiter;
use crate::error::{ConfigError, InsufficientCapacity};
use crate::policy::Policy;
use crate::sync::{lock, Mutex};
use std::fmt;

/// An elastic limit shared through Redis: the same guarantee, ceiling and
/// pool as a local [`ElasticLimiter`], with the same protocol and
/// guarantees, decided by one script call per check.
///
/// - A request within the key's **guarantee** passes as usual.
/// - Above it, it passes only if the key's **ceiling** (its headroom) and
///   the shared **pool** both allow it, all or nothing, and the decision is
///   marked [`is_above_limit`](crate::Decision::is_above_limit).
/// - A denial writes nothing to any of the three keys.
/// - Decisions report the guarantee's limit and remaining.
///
/// Its verbs are the local [`ElasticLimiter`]'s (`check_key`,
/// `check_key_n`), `async` and returning `Result<RedisDecision, RedisError>`
/// as [`RedisLimiter`](super::RedisLimiter)'s do; keys are bytes.
///
/// The pool's quota can follow a capacity signal at run time
/// ([`set_pool`](Self::set_pool)). Every key is written with its time to
/// idle as its TTL. Keys: `prefix:{name}:g:<key>`, `prefix:{name}:h:<key>`
/// and `prefix:{name}:pool` (plus `prefix:{name}:pool:t` for a bucket
/// pool: the interval its state was written under), all in the slot of the
/// hash tag `{name}`. That slot then holds every key of this limit, on one
/// Cluster master: give separate tiers their own names to spread them.
///
/// When Redis cannot answer, the [`FailurePolicy`] does: `Open` allows,
/// `Closed` returns the error, `FallbackShare { instances }` runs a local
/// [`ElasticLimiter`] with this instance's share of all three policies, and
/// `Fallback(policy)` a local keyed limiter with `policy`.
///
/// # Example
///
/// ```
/// use ratewall::redis::{RedisBackend, RedisElasticLimiter};
///
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let redis = RedisBackend::builder("redis://127.0.0.1:6379").build()?;
/// let per_user = RedisElasticLimiter::builder(
///     "100/min fixed-window".parse()?, // every user gets 100 a minute
///     "300/min fixed-window".parse()?, // and up to 300 while there is spare
///     "1000/min fixed-window".parse()?, // spare capacity shared by everyone
///     &redis,
/// )
/// .name("api")
/// .build()?;
/// let [g, _, pool] = per_user.redis_keys(b"alice")?;
/// assert_eq!(g, b"ratewall:{api}:g:alice");
/// assert_eq!(pool, b"ratewall:{api}:pool");
/// // With a server running:
/// // let d = per_user.check_key(b"alice").await?;
/// // if d.is_above_limit() { /* passed on spare capacity: log or bill it */ }
/// # Ok::<(), Box<dyn std::error::Error>>(()) }).unwrap();
/// ```
pub struct RedisElasticLimiter {
    guarantee: Policy,
    ceiling: Policy,
    g: Program,
    h: Program,
    /// The pool's policy and program in force (changed by `set_pool`).
    pool: Mutex<(Policy, Program)>,
    /// `prefix:{name}:`
    base: Vec<u8>,
    backend: RedisBackend,
    failover: Failover,
}

/// Configures a [`RedisElasticLimiter`]: key prefix, name, failure policy.
///
/// # Example
///
/// ```
/// use ratewall::redis::{FailurePolicy, RedisBackend, RedisElasticLimiter};
/// use ratewall::{Policy, Rate};
///
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let redis = RedisBackend::builder("redis://127.0.0.1:6379").build()?;
/// let l = RedisElasticLimiter::builder(
///     Policy::token_bucket(Rate::per_second(10)),
///     Policy::token_bucket(Rate::per_second(50)),
///     Policy::token_bucket(Rate::per_second(200)),
///     &redis,
/// )
/// .prefix("shop")
/// .name("tenants")
/// .on_failure(FailurePolicy::FallbackShare { instances: 4 })
/// .fallback_max_keys(10_000)
/// .build()?;
/// assert_eq!(l.redis_keys(b"t1")?[2], b"shop:{tenants}:pool");
/// # Ok::<(), ratewall::redis::RedisError>(()) }).unwrap();
/// ```
#[must_use = "a builder does nothing until `build`"]
#[derive(Debug)]
pub struct RedisElasticBuilder {
    guarantee: Policy,
    ceiling: Policy,
    pool: Policy,
    backend: RedisBackend,
    options: Options,
}

impl RedisElasticLimiter {
    /// A builder for a guarantee and a ceiling per key and a shared pool,
    /// on `backend`. The policies follow the rules of
    /// [`ElasticLimiter::builder`] (one algorithm and period for the
    /// guarantee and the ceiling, the ceiling above the guarantee, nothing
    /// soft).
    ///
    /// ```
    /// # use ratewall::redis::{RedisBackend, RedisElasticLimiter, RedisError};
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let redis = RedisBackend::builder("redis://127.0.0.1:6379").build()?;
    /// let bad = RedisElasticLimiter::builder("100/min".parse()?, "50/min".parse()?, "1000/min".parse()?, &redis)
    ///     .build();
    /// assert!(matches!(bad, Err(RedisError::Config(_))));
    /// # Ok::<(), Box<dyn std::error::Error>>(()) }).unwrap();
    /// ```
    pub fn builder(
        guarantee: Policy,
        ceiling: Policy,
        pool: Policy,
        backend: &RedisBackend,
    ) -> RedisElasticBuilder {
        RedisElasticBuilder {
            guarantee,
            ceiling,
            pool,
            backend: backend.clone(),
            options: Options::default(),
        }
    }

    /// The Redis keys of `key`'s guarantee and headroom, and of the pool:
    /// `prefix:{name}:g:<key>`, `prefix:{name}:h:<key>`, `prefix:{name}:pool`
    /// (a long, binary or braced key is hashed, as for
    /// [`RedisLimiter::redis_key`](super::RedisLimiter::redis_key)). A
    /// bucket pool also keeps `prefix:{name}:pool:t`.
    ///
    /// ```
    /// # use ratewall::redis::{RedisBackend, RedisElasticLimiter};
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// # let redis = RedisBackend::builder("redis://127.0.0.1:6379").build()?;
    /// let l = RedisElasticLimiter::builder("1/s".parse()?, "2/s".parse()?, "5/s".parse()?, &redis)
    ///     .name("e").build()?;
    /// let [g, h, p] = l.redis_keys(b"{x}")?;
    /// assert!(g.starts_with(b"ratewall:{e}:g:#") && h.starts_with(b"ratewall:{e}:h:#"));
    /// assert_eq!(p, b"ratewall:{e}:pool");
    /// assert!(l.redis_keys(b"").is_err());
    /// # Ok::<(), Box<dyn std::error::Error>>(()) }).unwrap();
    /// ```
    pub fn redis_keys(&self, key: &[u8]) -> Result<[Vec<u8>; 3], RedisError> {
        let part = |tag: &[u8]| {
            let mut base = self.base.clone();
            base.extend_from_slice(tag);
            base
        };
        Ok([
            key::redis_key(&part(b"g:"), key)?,
            key::redis_key(&part(b"h:"), key)?,
            part(b"pool"),
        ])
    }

    /// The per-key guarantee.
    ///
    /// ```
    /// # use ratewall::redis::{RedisBackend, RedisElasticLimiter};
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// # let redis = RedisBackend::builder("redis://127.0.0.1:6379").build()?;
    /// let l = RedisElasticLimiter::builder("1/s".parse()?, "2/s".parse()?, "5/s".parse()?, &redis).build()?;
    /// assert_eq!(l.guarantee().to_string(), "1/s");
    /// # Ok::<(), Box<dyn std::error::Error>>(()) }).unwrap();
    /// ```
    pub fn guarantee(&self) -> Policy {
        self.guarantee
    }

    /// The per-key ceiling.
    ///
    /// ```
    /// # use ratewall::redis::{RedisBackend, RedisElasticLimiter};
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// # let redis = RedisBackend::builder("redis://127.0.0.1:6379").build()?;
    /// let l = RedisElasticLimiter::builder("1/s".parse()?, "2/s".parse()?, "5/s".parse()?, &redis).build()?;
    /// assert_eq!(l.ceiling().to_string(), "2/s");
    /// # Ok::<(), Box<dyn std::error::Error>>(()) }).unwrap();
    /// ```
    pub fn ceiling(&self) -> Policy {
        self.ceiling
    }

    /// The pool's policy in force on this instance.
    ///
    /// ```
    /// # use ratewall::redis::{RedisBackend, RedisElasticLimiter};
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// # let redis = RedisBackend::builder("redis://127.0.0.1:6379").build()?;
    /// let l = RedisElasticLimiter::builder("1/s".parse()?, "2/s".parse()?, "5/s".parse()?, &redis).build()?;
    /// assert_eq!(l.pool().to_string(), "5/s");
    /// # Ok::<(), Box<dyn std::error::Error>>(()) }).unwrap();
    /// ```
    pub fn pool(&self) -> Policy {
        lock(&self.pool).0
    }

    /// The failure policy.
    ///
    /// ```
    /// # use ratewall::redis::{FailurePolicy, RedisBackend, RedisElasticLimiter};
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// # let redis = RedisBackend::builder("redis://127.0.0.1:6379").build()?;
    /// let l = RedisElasticLimiter::builder("1/s".parse()?, "2/s".parse()?, "5/s".parse()?, &redis)
    ///     .on_failure(FailurePolicy::Closed).build()?;
    /// assert_eq!(l.failure_policy(), FailurePolicy::Closed);
    /// # Ok::<(), Box<dyn std::error::Error>>(()) }).unwrap();
    /// ```
    pub fn failure_policy(&self) -> FailurePolicy {
        self.failover.policy()
    }

    /// Changes the pool's quota at run time: how the pool follows a
    /// capacity signal (CPU, queue depth). The new policy keeps the pool's
    /// algorithm, and a window pool its window length; it may not be soft.
    /// The pool's state in Redis is kept and read under the new quota (see
    /// `docs/distributed.md`, "Elastic limits"). It applies to this
    /// instance's calls (and its local fallback's share): give every
    /// instance the same signal.
    ///
    /// ```
    /// # use ratewall::redis::{RedisBackend, RedisElasticLimiter};
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// # let redis = RedisBackend::builder("redis://127.0.0.1:6379").build()?;
    /// let l = RedisElasticLimiter::builder("1/s".parse()?, "2/s".parse()?, "5/s".parse()?, &redis).build()?;
    /// l.set_pool("50/s".parse()?)?;
    /// assert_eq!(l.pool().to_string(), "50/s");
    /// assert!(l.set_pool("50/s fixed-window".parse()?).is_err()); // another algorithm
    /// # Ok::<(), Box<dyn std::error::Error>>(()) }).unwrap();
    /// ```
    pub fn set_pool(&self, pool: Policy) -> Result<(), RedisError> {
        let mut current = lock(&self.pool);
        let bad = |reason| Err(RedisError::Config(ConfigError::Incompatible { reason }));
        if pool.algorithm() != current.0.algorithm() {
            return bad("a pool change keeps the algorithm; build a new limiter to change it");
        }
        if pool.tolerance().is_some() {
            return bad(
                "an elastic limit's guarantee, ceiling and pool cannot be soft; drop `soft`",
            );
        }
        if let (Some(new), Some(old)) = (pool.window(), current.0.window()) {
            if new.length() != old.length() {
                return bad("a Redis pool change keeps the window length (its state counts in those windows); change the limit only");
            }
        }
        let program = Program::compile(&pool)?;
        if let (Some(local), FailurePolicy::FallbackShare { instances }) =
            (self.failover.elastic(), self.failover.policy())
        {
            local.set_pool(share(&pool, instances))?;
        }
        *current = (pool, program);
        Ok(())
    }

    /// Checks one unit for `key` (see the protocol above).
    ///
    /// ```no_run
    /// # use ratewall::redis::{RedisBackend, RedisElasticLimiter};
    /// # async fn f() -> Result<(), Box<dyn std::error::Error>> {
    /// # let redis = RedisBackend::builder("redis://127.0.0.1:6379").build()?;
    /// let l = RedisElasticLimiter::builder("1/h".parse()?, "2/h".parse()?, "1/h".parse()?, &redis).build()?;
    /// let first = l.check_key(b"user:1").await?;
    /// assert!(first.is_allowed() && !first.is_above_limit()); // guaranteed
    /// let second = l.check_key(b"user:1").await?;
    /// assert!(second.is_allowed() && second.is_above_limit()); // from the pool
    /// # Ok(()) }
    /// ```
    pub async fn check_key(&self, key: &[u8]) -> Result<RedisDecision, RedisError> {
        self.check_key_n(key, 1).await
    }

    /// Checks a request of cost `n` for `key`. A cost that neither the
    /// guarantee nor the headroom and pool together could ever admit is
    /// [`RedisError::InsufficientCapacity`], without a call; a cost of 0
    /// takes nothing.
    ///
    /// ```no_run
    /// # use ratewall::redis::{RedisBackend, RedisElasticLimiter};
    /// # async fn f() -> Result<(), Box<dyn std::error::Error>> {
    /// # let redis = RedisBackend::builder("redis://127.0.0.1:6379").build()?;
    /// let l = RedisElasticLimiter::builder("5/h".parse()?, "10/h".parse()?, "100/h".parse()?, &redis).build()?;
    /// assert!(l.check_key_n(b"user:1", 5).await?.is_allowed());
    /// assert!(l.check_key_n(b"user:1", 6).await.is_err()); // more than 5 at once never fits
    /// # Ok(()) }
    /// ```
    pub async fn check_key_n(&self, key: &[u8], n: u64) -> Result<RedisDecision, RedisError> {
        let pool = lock(&self.pool).1;
        let g_cap = self.g.limit;
        let extra = self.h.limit.min(pool.limit);
        InsufficientCapacity::check(n, g_cap.max(extra))?;
        let [gk, hk, pk] = self.redis_keys(key)?;
        let mut qk = pk.clone();
        qk.extend_from_slice(b":t");
        let invocation = elastic_call([&gk, &hk, &pk, &qk], n, &self.g, &self.h, &pool, extra);
        let got = self
            .backend
            .invoke(&[self.failover.watch()], &invocation, |v| parse_elastic(&v))
            .await
            .map(|decision| RedisDecision {
                decision,
                source: DecisionSource::Redis,
            });
        door::settle(self.failover.watch(), got, |retry_in, cause| {
            self.unavailable(key, n, retry_in, cause)
        })
    }

    /// The failure policy's answer when Redis could not.
    fn unavailable(
        &self,
        key: &[u8],
        n: u64,
        retry_in: std::time::Duration,
        cause: String,
    ) -> Result<RedisDecision, RedisError> {
        let open = || {
            let limit = self.g.limit;
            Decision::allow(limit, limit.saturating_sub(n), 0)
                .with_tracking(Tracking::Untracked)
                .with_above_limit(n > limit)
        };
        self.failover
            .unavailable(key, n, true, open, retry_in, cause)
    }
}

impl RedisElasticBuilder {
    option_methods! {
        name_doc: "The limit's name, its hash tag (default: `el.` and the guarantee's and
ceiling's parameters, such as `el.fw.60000000.100.300`). Two elastic
limiters with the same prefix and name share their state: give each its
own name.",
        default_failure: "`FailurePolicy::FallbackShare { instances: 1 }`: a local
    [`ElasticLimiter`] with this instance's share of each policy).",
        setup: "# use ratewall::redis::{RedisBackend, RedisElasticLimiter};
# tokio::runtime::Runtime::new().unwrap().block_on(async {
# let redis = RedisBackend::builder(\"redis://127.0.0.1:6379\").build()?;
let b = || RedisElasticLimiter::builder(\"1/s\".parse().unwrap(), \"2/s\".parse().unwrap(), \"5/s\".parse().unwrap(), &redis);",
        prefix_check: "assert_eq!(l.redis_keys(b\"k\")?[0], b\"shop:{e}:g:k\");",
        name_check: "assert_eq!(l.redis_keys(b\"k\")?[2], b\"ratewall:{per-ip}:pool\");",
    }

    /// The limiter; the three policies are validated here (the rules of
    /// [`ElasticLimiter`], then Redis' microsecond arithmetic).
    ///
    /// ```
    /// # use ratewall::redis::{RedisBackend, RedisElasticLimiter, RedisError};
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// # let redis = RedisBackend::builder("redis://127.0.0.1:6379").build()?;
    /// let soft = RedisElasticLimiter::builder("1/s".parse()?, "2/s".parse()?, "5/s soft 1".parse()?, &redis).build();
    /// assert!(soft.unwrap_err().to_string().contains("soft"));
    /// # Ok::<(), Box<dyn std::error::Error>>(()) }).unwrap();
    /// ```
    pub fn build(self) -> Result<RedisElasticLimiter, RedisError> {
        let headroom = validate(&self.guarantee, &self.ceiling, &self.pool)?;
        let g = Program::compile(&self.guarantee)?;
        let h = Program::compile(&headroom)?;
        Program::compile(&self.ceiling)?;
        let p = Program::compile(&self.pool)?;
        let default_name = || {
            // The guarantee's parameters and the ceiling's (for a bucket:
            // its headroom's interval and burst).
            let tail = match self.ceiling.rate() {
                Some(_) => format!("{}.{}", h.params[0], h.params[2]),
                None => self.ceiling.limit().to_string(),
            };
            let full = format!("el.{}.{}", g.default_name(), tail);
            if key::valid_name(&full) {
                full
            } else {
                let digest = sha1_smol::Sha1::from(&full).digest().to_string();
                format!("el.{}", &digest[..24])
            }
        };
        let (prefix, name) = self.options.names(default_name)?;
        let base = format!("{prefix}:{{{name}}}:").into_bytes();
        let failover = self.options.failover(&name, |instances| {
            self.options.elastic(
                share(&self.guarantee, instances),
                share(&self.ceiling, instances),
                share(&self.pool, instances),
            )
        })?;
        Ok(RedisElasticLimiter {
            guarantee: self.guarantee,
            ceiling: self.ceiling,
            g,
            h,
            pool: Mutex::new((self.pool, p)),
            base,
            backend: self.backend,
            failover,
        })
    }
}

impl fmt::Debug for RedisElasticLimiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisElasticLimiter")
            .field("guarantee", &self.guarantee)
            .field("ceiling", &self.ceiling)
            .field("pool", &self.pool())
            .field("keys", &String::from_utf8_lossy(&self.base))
            .field("failure", &self.failover.policy())
            .field("backend", &self.backend)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn default_names_tell_the_guarantee_and_ceiling_apart() {
        let redis = RedisBackend::builder("redis://127.0.0.1:1")
            .build()
            .unwrap();
        let name = |g: &str, c: &str| {
            let l = RedisElasticLimiter::builder(
                g.parse().unwrap(),
                c.parse().unwrap(),
                "100/s".parse().unwrap(),
                &redis,
            )
            .build()
            .unwrap();
            let [_, _, pool] = l.redis_keys(b"k").unwrap();
            String::from_utf8(pool).unwrap()
        };
        let a = name("10/s", "20/s");
        assert_eq!(a, "ratewall:{el.tb.100000.10.100000.10}:pool");
        assert_eq!(
            name("100/min fixed-window", "300/min fixed-window"),
            "ratewall:{el.fw.60000000.100.300}:pool"
        );
        // Another ceiling count, another ceiling burst, another guarantee.
        for (g, c) in [
            ("10/s", "30/s burst 20"),
            ("10/s", "20/s burst 25"),
            ("11/s", "20/s"),
        ] {
            assert_ne!(name(g, c), a, "{g} / {c}");
        }
        assert_ne!(
            name("5/s fixed-window", "6/s fixed-window"),
            name("5/s fixed-window", "7/s fixed-window")
        );
    }
}
