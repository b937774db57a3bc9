//! [`RedisLimiter`]: a [`Policy`] whose state lives in Redis.

use super::backend::RedisBackend;
use super::batch::{Call, Reply};
use super::deny_cache::DenyCache;
use super::key;
use super::script::{Mode, Program};
use super::{DecisionSource, RedisDecision, RedisError};
use crate::decision::{Decision, Tracking};
use crate::keyed::KeyedPolicyLimiter;
use crate::keyed::WhenFull;
use crate::policy::{Policy, PolicyAlgorithm};
use crate::quota::{Rate, Window};
use crate::soft::{Soft, Tolerance};
use redis::Value;
use std::fmt;

/// What a [`RedisLimiter`] answers when Redis cannot (refused, lost, no
/// reply within the timeout, or the circuit breaker is open).
///
/// # Example
///
/// ```
/// use ratewall::redis::FailurePolicy;
/// use ratewall::{Policy, Rate};
///
/// assert_eq!(FailurePolicy::default(), FailurePolicy::FallbackShare { instances: 1 });
/// let strict = FailurePolicy::Closed;
/// let own = FailurePolicy::Fallback(Policy::token_bucket(Rate::per_second(10)));
/// # let _ = (strict, own);
/// ```
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailurePolicy {
    /// Allow every request (the decision's source is
    /// [`DecisionSource::FailOpen`], its tracking `Untracked`). Refunds are
    /// dropped.
    Open,
    /// Return [`RedisError::Unavailable`], which says when Redis is tried
    /// again. The caller decides (a 503, say).
    Closed,
    /// Limit locally, in this process, with this instance's share of the
    /// policy: the limit (or burst) divided by `instances`, at least 1, and
    /// a bucket's rate divided by `instances`. A soft policy's share is
    /// soft: a percentage tolerance stays, a tolerance in units is divided
    /// by `instances` (rounded down). With N instances behind a
    /// load balancer, the fleet then admits about what Redis would.
    FallbackShare {
        /// How many instances share the limit.
        instances: u32,
    },
    /// Limit locally with this policy.
    Fallback(Policy),
}

impl Default for FailurePolicy {
    /// A local fallback with the whole limit (`instances: 1`); set the
    /// number of instances with [`FailurePolicy::FallbackShare`].
    fn default() -> Self {
        FailurePolicy::FallbackShare { instances: 1 }
    }
}

/// The per-instance share of `policy` among `instances`. A soft policy
/// stays soft: a percentage tolerance is kept, a tolerance in units is
/// divided like the limit (rounded down).
pub(crate) fn share(policy: &Policy, instances: u32) -> Policy {
    let k = u64::from(instances.max(1));
    let hard = share_hard(policy, k, instances);
    match policy.tolerance() {
        Some(Tolerance::Units(u)) => hard.soft(Tolerance::Units(u / k)),
        Some(t) => hard.soft(t),
        None => hard,
    }
}

fn share_hard(policy: &Policy, k: u64, instances: u32) -> Policy {
    if let Some(r) = policy.rate() {
        // count per (period x k): the same intervals, exactly k times longer.
        let period = r
            .period()
            .checked_mul(instances.max(1))
            .unwrap_or(r.period());
        let rate = Rate::new(r.count(), period).burst((r.burst_size() / k).max(1));
        return match policy.algorithm() {
            PolicyAlgorithm::LeakyBucket => Policy::leaky_bucket(rate),
            _ => Policy::token_bucket(rate),
        };
    }
    let w = policy.window().unwrap_or(Window::per_second(1));
    let window = Window::new((w.limit() / k).max(1), w.length());
    match policy.algorithm() {
        PolicyAlgorithm::FixedWindow => Policy::fixed_window(window),
        PolicyAlgorithm::SlidingWindowCounter => Policy::sliding_window_counter(window),
        _ => Policy::sliding_window_log(window),
    }
}

/// A limit shared through Redis: the same [`Policy`] as a local
/// [`KeyedPolicyLimiter`], with its state in Redis, so every instance
/// behind a load balancer counts against one limit.
///
/// Each check is one script call (one round trip) that reads the server's
/// clock, decides, and on allow writes the key's new state with its TTL; a
/// denial writes nothing. Decisions have the same fields and meaning as
/// local ones (to the microsecond: see `docs/distributed.md`). When Redis
/// cannot answer, the [`FailurePolicy`] does.
///
/// A **soft** policy ([`Policy::soft`]) works as locally: the script runs
/// with the widened capacity `L + u`, and its decisions are read back by
/// the same mapping as the local soft limiter (the nominal limit,
/// `remaining = max(0, remaining' - u)`, and
/// [`is_above_limit`](crate::Decision::is_above_limit) on what passes above
/// `L`). The local fallback keeps the softness (see
/// [`FailurePolicy::FallbackShare`]).
///
/// Keys are bytes: short printable keys are stored as they are
/// (`ratewall:<name>:<key>`); long, binary or untrusted ones are hashed
/// (see [`redis_key`](Self::redis_key)). An empty key is an error.
///
/// # Example
///
/// ```
/// use ratewall::redis::{RedisBackend, RedisLimiter};
/// use ratewall::{Policy, Rate};
///
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let redis = RedisBackend::builder("redis://127.0.0.1:6379").build()?;
/// let per_user = RedisLimiter::builder(Policy::token_bucket(Rate::per_second(10)), &redis)
///     .name("api")
///     .build()?;
/// assert_eq!(per_user.redis_key(b"user:42")?, b"ratewall:api:user:42");
/// // With a server running:
/// // let d = per_user.check(b"user:42").await?;
/// // if !d.is_allowed() { /* 429, Retry-After: d.retry_after_secs() */ }
/// # Ok::<(), ratewall::redis::RedisError>(()) }).unwrap();
/// ```
pub struct RedisLimiter {
    policy: Policy,
    /// How to read the script's (widened) decisions; a no-op for a hard policy.
    soft: Soft,
    program: Program,
    base: Vec<u8>,
    /// Whether the key part goes in a hash tag (`base{key}`).
    hash_tag_keys: bool,
    backend: RedisBackend,
    failure: FailurePolicy,
    fallback: Option<KeyedPolicyLimiter<Vec<u8>>>,
    deny_cache: Option<DenyCache>,
}

/// Configures a [`RedisLimiter`]: key prefix, policy name, failure policy.
///
/// # Example
///
/// ```
/// use ratewall::redis::{FailurePolicy, RedisBackend, RedisLimiter};
/// use ratewall::{Policy, Window};
///
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let redis = RedisBackend::builder("redis://127.0.0.1:6379").build()?;
/// let login = RedisLimiter::builder(Policy::sliding_window_log(Window::per_minute(5)), &redis)
///     .prefix("myapp")
///     .name("login")
///     .on_failure(FailurePolicy::FallbackShare { instances: 3 })
///     .fallback_max_keys(10_000)
///     .build()?;
/// assert_eq!(login.redis_key(b"alice")?, b"myapp:login:alice");
/// # Ok::<(), ratewall::redis::RedisError>(()) }).unwrap();
/// ```
#[must_use = "a builder does nothing until `build`"]
#[derive(Debug)]
pub struct RedisLimiterBuilder {
    policy: Policy,
    backend: RedisBackend,
    prefix: String,
    name: Option<String>,
    failure: FailurePolicy,
    fallback_max_keys: usize,
    deny_cache: Option<usize>,
    hash_tag_keys: bool,
}

impl RedisLimiter {
    /// A builder for `policy` on `backend`.
    ///
    /// ```
    /// # use ratewall::redis::{RedisBackend, RedisLimiter};
    /// # use ratewall::{Policy, Rate};
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let redis = RedisBackend::builder("redis://127.0.0.1:6379").build()?;
    /// let l = RedisLimiter::builder(Policy::token_bucket(Rate::per_second(100).burst(20)), &redis).build()?;
    /// assert_eq!(l.redis_key(b"k")?, b"ratewall:tb.10000.20:k"); // the default name: algorithm.params
    /// # Ok::<(), ratewall::redis::RedisError>(()) }).unwrap();
    /// ```
    pub fn builder(policy: Policy, backend: &RedisBackend) -> RedisLimiterBuilder {
        RedisLimiterBuilder {
            policy,
            backend: backend.clone(),
            prefix: "ratewall".into(),
            name: None,
            failure: FailurePolicy::default(),
            fallback_max_keys: 65_536,
            deny_cache: None,
            hash_tag_keys: false,
        }
    }

    /// The policy.
    ///
    /// ```
    /// # use ratewall::redis::{RedisBackend, RedisLimiter};
    /// # use ratewall::{Policy, Rate};
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// # let redis = RedisBackend::builder("redis://127.0.0.1:6379").build()?;
    /// let p = Policy::token_bucket(Rate::per_second(5));
    /// assert_eq!(RedisLimiter::builder(p, &redis).build()?.policy(), p);
    /// # Ok::<(), ratewall::redis::RedisError>(()) }).unwrap();
    /// ```
    pub fn policy(&self) -> Policy {
        self.policy
    }

    /// The failure policy.
    ///
    /// ```
    /// # use ratewall::redis::{FailurePolicy, RedisBackend, RedisLimiter};
    /// # use ratewall::{Policy, Rate};
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// # let redis = RedisBackend::builder("redis://127.0.0.1:6379").build()?;
    /// let l = RedisLimiter::builder(Policy::token_bucket(Rate::per_second(5)), &redis)
    ///     .on_failure(FailurePolicy::Open).build()?;
    /// assert_eq!(l.failure_policy(), FailurePolicy::Open);
    /// # Ok::<(), ratewall::redis::RedisError>(()) }).unwrap();
    /// ```
    pub fn failure_policy(&self) -> FailurePolicy {
        self.failure
    }

    /// The Redis key that holds `key`'s state: `prefix:name:key` for a
    /// printable key of up to 64 bytes (no space or braces, not starting
    /// with `#`), `prefix:name:#` and 32 hex digits of its SHA-1 otherwise.
    ///
    /// ```
    /// # use ratewall::redis::{RedisBackend, RedisLimiter};
    /// # use ratewall::{Policy, Window};
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// # let redis = RedisBackend::builder("redis://127.0.0.1:6379").build()?;
    /// let l = RedisLimiter::builder(Policy::fixed_window(Window::per_second(5)), &redis).name("w").build()?;
    /// assert_eq!(l.redis_key(b"10.0.0.1")?, b"ratewall:w:10.0.0.1");
    /// assert_eq!(l.redis_key(&[b'x'; 1 << 20])?.len(), "ratewall:w:".len() + 33);
    /// assert!(l.redis_key(b"").is_err());
    /// # Ok::<(), ratewall::redis::RedisError>(()) }).unwrap();
    /// ```
    pub fn redis_key(&self, key: &[u8]) -> Result<Vec<u8>, RedisError> {
        let mut k = key::redis_key(&self.base, key)?;
        if self.hash_tag_keys {
            // The key part never holds a brace (a key with one is hashed).
            k.insert(self.base.len(), b'{');
            k.push(b'}');
        }
        Ok(k)
    }

    /// Checks one unit for `key`: taken if allowed.
    ///
    /// ```no_run
    /// # use ratewall::redis::{RedisBackend, RedisLimiter};
    /// # use ratewall::{Policy, Rate};
    /// # async fn f() -> Result<(), ratewall::redis::RedisError> {
    /// # let redis = RedisBackend::builder("redis://127.0.0.1:6379").build()?;
    /// let l = RedisLimiter::builder(Policy::token_bucket(Rate::per_second(5)), &redis).build()?;
    /// let d = l.check(b"user:1").await?;
    /// println!("{} from {:?}", d.is_allowed(), d.source());
    /// # Ok(()) }
    /// ```
    pub async fn check(&self, key: &[u8]) -> Result<RedisDecision, RedisError> {
        self.check_n(key, 1).await
    }

    /// Checks `n` units for `key`, taken if allowed. A cost of 0 is the
    /// decision for one unit, taking nothing; a cost above the limit is
    /// [`RedisError::InsufficientCapacity`], without a call.
    ///
    /// ```no_run
    /// # use ratewall::redis::{RedisBackend, RedisLimiter};
    /// # use ratewall::{Policy, Rate};
    /// # async fn f() -> Result<(), ratewall::redis::RedisError> {
    /// # let redis = RedisBackend::builder("redis://127.0.0.1:6379").build()?;
    /// let bytes = RedisLimiter::builder(Policy::token_bucket(Rate::per_second(1000)), &redis).build()?;
    /// let d = bytes.check_n(b"tenant:9", 250).await?;
    /// # Ok(()) }
    /// ```
    pub async fn check_n(&self, key: &[u8], n: u64) -> Result<RedisDecision, RedisError> {
        self.decide(key, n, n > 0, None).await
    }

    /// The decision one unit for `key` would get, taking nothing.
    ///
    /// ```no_run
    /// # use ratewall::redis::{RedisBackend, RedisLimiter};
    /// # use ratewall::{Policy, Rate};
    /// # async fn f() -> Result<(), ratewall::redis::RedisError> {
    /// # let redis = RedisBackend::builder("redis://127.0.0.1:6379").build()?;
    /// # let l = RedisLimiter::builder(Policy::token_bucket(Rate::per_second(5)), &redis).build()?;
    /// let left = l.peek(b"user:1").await?.remaining();
    /// # Ok(()) }
    /// ```
    pub async fn peek(&self, key: &[u8]) -> Result<RedisDecision, RedisError> {
        self.peek_n(key, 1).await
    }

    /// The decision `n` units for `key` would get, taking nothing.
    ///
    /// ```no_run
    /// # use ratewall::redis::{RedisBackend, RedisLimiter};
    /// # use ratewall::{Policy, Rate};
    /// # async fn f() -> Result<(), ratewall::redis::RedisError> {
    /// # let redis = RedisBackend::builder("redis://127.0.0.1:6379").build()?;
    /// # let l = RedisLimiter::builder(Policy::token_bucket(Rate::per_second(5)), &redis).build()?;
    /// let fits = l.peek_n(b"user:1", 3).await?.is_allowed();
    /// # Ok(()) }
    /// ```
    pub async fn peek_n(&self, key: &[u8], n: u64) -> Result<RedisDecision, RedisError> {
        self.decide(key, n, false, None).await
    }

    /// Gives back `n` units an earlier check of `key` took (a request that
    /// was admitted but not served). When Redis cannot answer: the fallback
    /// limiter gets the refund, fail-open drops it (nothing was taken),
    /// fail-closed returns the error.
    ///
    /// ```no_run
    /// # use ratewall::redis::{RedisBackend, RedisLimiter};
    /// # use ratewall::{Policy, Rate};
    /// # async fn f() -> Result<(), ratewall::redis::RedisError> {
    /// # let redis = RedisBackend::builder("redis://127.0.0.1:6379").build()?;
    /// # let l = RedisLimiter::builder(Policy::token_bucket(Rate::per_second(5)), &redis).build()?;
    /// let d = l.check(b"user:1").await?;
    /// l.refund(b"user:1", 1).await?;
    /// # Ok(()) }
    /// ```
    pub async fn refund(&self, key: &[u8], n: u64) -> Result<(), RedisError> {
        self.refund_at(key, n, None).await
    }

    /// Forgets `key`'s state in Redis (and in the local fallback): its next
    /// request sees a fresh limit. Returns the error if Redis cannot answer,
    /// whatever the failure policy.
    ///
    /// ```no_run
    /// # use ratewall::redis::{RedisBackend, RedisLimiter};
    /// # use ratewall::{Policy, Rate};
    /// # async fn f() -> Result<(), ratewall::redis::RedisError> {
    /// # let redis = RedisBackend::builder("redis://127.0.0.1:6379").build()?;
    /// # let l = RedisLimiter::builder(Policy::token_bucket(Rate::per_second(5)), &redis).build()?;
    /// l.reset(b"user:1").await?;
    /// # Ok(()) }
    /// ```
    pub async fn reset(&self, key: &[u8]) -> Result<(), RedisError> {
        let rkey = self.redis_key(key)?;
        if let Some(c) = &self.deny_cache {
            c.clear(&rkey);
        }
        if let Some(local) = &self.fallback {
            local.reset_key(key);
        }
        self.backend.query(redis::cmd("DEL").arg(&rkey)).await?;
        Ok(())
    }

    /// The errors a check of `n` for `key` gets before any call.
    pub(crate) fn validate(&self, key: &[u8], n: u64) -> Result<(), RedisError> {
        if n.max(1) > self.program.limit {
            return Err(RedisError::InsufficientCapacity(
                crate::InsufficientCapacity {
                    requested: n,
                    capacity: self.program.limit,
                },
            ));
        }
        if key.is_empty() {
            return Err(RedisError::EmptyKey);
        }
        Ok(())
    }

    /// Gives `n` back to the local fallback only.
    pub(crate) fn refund_fallback(&self, key: &[u8], n: u64) {
        if let Some(local) = &self.fallback {
            local.refund_key(key, n);
        }
    }

    /// A check (`consume`) or peek of `n` for `key`; `now_us` replaces the
    /// server's clock on the test-only path.
    pub(crate) async fn decide(
        &self,
        key: &[u8],
        n: u64,
        consume: bool,
        now_us: Option<u64>,
    ) -> Result<RedisDecision, RedisError> {
        self.validate(key, n)?;
        let cost = n.max(1);
        let rkey = self.redis_key(key)?;
        // The test-only clock path never uses the cache (its time is not ours).
        let cache = self.deny_cache.as_ref().filter(|_| now_us.is_none());
        if let Some(left) = cache.and_then(|c| c.denied_for(&rkey)) {
            return Ok(RedisDecision {
                decision: Decision::deny(self.policy.limit(), 0, left, left),
                source: DecisionSource::DenyCache,
            });
        }
        let mode = if consume { Mode::Check } else { Mode::Peek };
        // The key goes into the call; a copy stays only for the cache.
        let (call_key, kept) = match cache {
            Some(_) => (rkey.clone(), Some(rkey)),
            None => (rkey, None),
        };
        match self.call(call_key, mode, cost, now_us).await {
            Ok(reply) => {
                let raw = reply.decision()?;
                if let Some(rkey) = &kept {
                    self.note(rkey, cost, &raw);
                }
                Ok(RedisDecision {
                    decision: self.nominal(raw),
                    source: DecisionSource::Redis,
                })
            }
            Err(RedisError::Unavailable { retry_in, cause }) => {
                self.unavailable(key, cost, consume, retry_in, cause)
            }
            Err(e) => Err(e),
        }
    }

    /// The failure policy's answer to a check (`consume`) or peek of
    /// `cost` for `key` when Redis could not answer.
    pub(crate) fn unavailable(
        &self,
        key: &[u8],
        cost: u64,
        consume: bool,
        retry_in: std::time::Duration,
        cause: String,
    ) -> Result<RedisDecision, RedisError> {
        match &self.fallback {
            Some(local) => {
                let decision = if consume {
                    local.check_key_n(key, cost)?
                } else {
                    local.peek_key_n(key, cost)?
                };
                Ok(RedisDecision {
                    decision,
                    source: DecisionSource::Fallback,
                })
            }
            None if self.failure == FailurePolicy::Open => {
                let limit = self.program.limit;
                let decision =
                    Decision::allow(limit, limit - cost, 0).with_tracking(Tracking::Untracked);
                Ok(RedisDecision {
                    decision: self.nominal(decision),
                    source: DecisionSource::FailOpen,
                })
            }
            None => Err(RedisError::Unavailable { retry_in, cause }),
        }
    }

    /// A decision of the script (run with the widened capacity of a soft
    /// policy) in nominal terms: the same mapping as the local soft limiter.
    pub(crate) fn nominal(&self, raw: Decision) -> Decision {
        self.soft.view(raw)
    }

    /// Records a Redis denial in the deny cache, if it is one that holds
    /// for every cost until its retry_after (a unit denial, nothing left).
    /// `decision` is the script's own (widened) decision: nothing left
    /// means nothing left of the tolerance either.
    pub(crate) fn note(&self, rkey: &[u8], cost: u64, decision: &Decision) {
        if let Some(c) = &self.deny_cache {
            if !decision.is_allowed() && decision.remaining() == 0 && cost == 1 {
                c.record(rkey, decision.retry_after().as_nanos() as u64);
            }
        }
    }

    /// The time left (ns) of a live deny-cache denial for `rkey`, if any.
    pub(crate) fn denied_for(&self, rkey: &[u8]) -> Option<u64> {
        self.deny_cache.as_ref().and_then(|c| c.denied_for(rkey))
    }

    /// Forgets a deny-cache entry for `rkey` (capacity came back here).
    pub(crate) fn clear_denial(&self, rkey: &[u8]) {
        if let Some(c) = &self.deny_cache {
            c.clear(rkey);
        }
    }

    /// Whether the deny cache holds a live denial for `rkey`.
    pub(crate) fn cached_denial(&self, rkey: &[u8]) -> bool {
        self.deny_cache
            .as_ref()
            .is_some_and(|c| c.denied_for(rkey).is_some())
    }

    pub(crate) fn backend(&self) -> &RedisBackend {
        &self.backend
    }

    pub(crate) fn program(&self) -> &Program {
        &self.program
    }

    pub(crate) async fn refund_at(
        &self,
        key: &[u8],
        n: u64,
        now_us: Option<u64>,
    ) -> Result<(), RedisError> {
        let rkey = self.redis_key(key)?;
        if n == 0 {
            return Ok(());
        }
        if let Some(c) = &self.deny_cache {
            c.clear(&rkey);
        }
        // Giving back more than the limit is giving back the limit.
        let n = n.min(self.program.limit);
        match self.call(rkey, Mode::Refund, n, now_us).await {
            Ok(_) => Ok(()),
            Err(RedisError::Unavailable { .. }) if self.failure == FailurePolicy::Open => Ok(()),
            Err(RedisError::Unavailable { retry_in, cause }) => match &self.fallback {
                Some(local) => {
                    local.refund_key(key, n);
                    Ok(())
                }
                None => Err(RedisError::Unavailable { retry_in, cause }),
            },
            Err(e) => Err(e),
        }
    }

    async fn call(
        &self,
        rkey: Vec<u8>,
        mode: Mode,
        n: u64,
        now_us: Option<u64>,
    ) -> Result<Reply, RedisError> {
        let call = Call {
            script: self.program.script(),
            code: self.program.code(),
            key: rkey,
            mode,
            n,
            params: self.program.params,
            now_us,
        };
        self.backend.call(call).await
    }
}

/// A script's reply `{allowed, limit, remaining, retry_after_us,
/// reset_after_us}` as a decision.
pub(crate) fn parse_decision(reply: &Value) -> Result<Decision, RedisError> {
    let bad = || RedisError::Server {
        message: format!("unexpected script reply {reply:?}"),
    };
    let Value::Array(items) = reply else {
        return Err(bad());
    };
    parse_fields(items).ok_or_else(bad)
}

/// Five reply fields as a decision; `None` if they are not five
/// non-negative integers.
pub(crate) fn parse_fields(items: &[Value]) -> Option<Decision> {
    let mut f = [0u64; 5];
    if items.len() != 5 {
        return None;
    }
    for (slot, item) in f.iter_mut().zip(items) {
        match item {
            Value::Int(v) if *v >= 0 => *slot = *v as u64,
            _ => return None,
        }
    }
    Some(fields_decision(f))
}

/// The five fields `{allowed, limit, remaining, retry_after_us,
/// reset_after_us}` as a decision.
pub(crate) fn fields_decision(f: [u64; 5]) -> Decision {
    let [allowed, limit, remaining, retry_us, reset_us] = f;
    let reset = reset_us.saturating_mul(1000);
    if allowed == 1 {
        Decision::allow(limit, remaining, reset)
    } else {
        Decision::deny(limit, remaining, retry_us.saturating_mul(1000), reset)
    }
}

impl RedisLimiterBuilder {
    /// The first part of every key name (default `ratewall`).
    ///
    /// ```
    /// # use ratewall::redis::{RedisBackend, RedisLimiter};
    /// # use ratewall::{Policy, Rate};
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// # let redis = RedisBackend::builder("redis://127.0.0.1:6379").build()?;
    /// let l = RedisLimiter::builder(Policy::token_bucket(Rate::per_second(5)), &redis)
    ///     .prefix("shop").name("api").build()?;
    /// assert_eq!(l.redis_key(b"k")?, b"shop:api:k");
    /// # Ok::<(), ratewall::redis::RedisError>(()) }).unwrap();
    /// ```
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// The policy's name in key names (default: the algorithm and its
    /// parameters, such as `tb.10000.20`). Two limiters with the same
    /// prefix and name share their state: give each policy its own name.
    ///
    /// ```
    /// # use ratewall::redis::{RedisBackend, RedisLimiter};
    /// # use ratewall::{Policy, Rate};
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// # let redis = RedisBackend::builder("redis://127.0.0.1:6379").build()?;
    /// let l = RedisLimiter::builder(Policy::token_bucket(Rate::per_second(5)), &redis)
    ///     .name("per-ip").build()?;
    /// assert_eq!(l.redis_key(b"k")?, b"ratewall:per-ip:k");
    /// # Ok::<(), ratewall::redis::RedisError>(()) }).unwrap();
    /// ```
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// What to answer when Redis cannot (default
    /// `FailurePolicy::FallbackShare { instances: 1 }`).
    ///
    /// ```
    /// # use ratewall::redis::{FailurePolicy, RedisBackend, RedisLimiter};
    /// # use ratewall::{Policy, Rate};
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// # let redis = RedisBackend::builder("redis://127.0.0.1:6379").build()?;
    /// let l = RedisLimiter::builder(Policy::token_bucket(Rate::per_second(5)), &redis)
    ///     .on_failure(FailurePolicy::Closed).build()?;
    /// # Ok::<(), ratewall::redis::RedisError>(()) }).unwrap();
    /// ```
    pub fn on_failure(mut self, failure: FailurePolicy) -> Self {
        self.failure = failure;
        self
    }

    /// The most keys the local fallback tracks (default 65,536; the least
    /// recently active key is evicted when full).
    ///
    /// ```
    /// # use ratewall::redis::{RedisBackend, RedisLimiter};
    /// # use ratewall::{Policy, Rate};
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// # let redis = RedisBackend::builder("redis://127.0.0.1:6379").build()?;
    /// let l = RedisLimiter::builder(Policy::token_bucket(Rate::per_second(5)), &redis)
    ///     .fallback_max_keys(1024).build()?;
    /// # Ok::<(), ratewall::redis::RedisError>(()) }).unwrap();
    /// ```
    pub fn fallback_max_keys(mut self, max_keys: usize) -> Self {
        self.fallback_max_keys = max_keys;
        self
    }

    /// A local deny cache of up to `max_keys` keys (off by default): after
    /// Redis denies a unit request for a key with `retry_after` r, checks
    /// of that key before r are denied locally with no round trip
    /// ([`DecisionSource::DenyCache`]), so a hot key under attack costs one
    /// round trip per r. Exact until capacity comes back early from
    /// elsewhere: a refund or reset by another instance makes this instance
    /// deny that key up to r too long (never admit too much). Its own
    /// refunds and resets clear the entry.
    ///
    /// ```
    /// # use ratewall::redis::{RedisBackend, RedisLimiter};
    /// # use ratewall::{Policy, Rate};
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// # let redis = RedisBackend::builder("redis://127.0.0.1:6379").build()?;
    /// let l = RedisLimiter::builder(Policy::token_bucket(Rate::per_second(5)), &redis)
    ///     .deny_cache(100_000).build()?;
    /// # Ok::<(), ratewall::redis::RedisError>(()) }).unwrap();
    /// ```
    pub fn deny_cache(mut self, max_keys: usize) -> Self {
        self.deny_cache = Some(max_keys);
        self
    }

    /// Puts the key part of every Redis key in a hash tag
    /// (`ratewall:name:{user:42}`), so on a Redis Cluster one key's state
    /// in every limiter built this way lives in one hash slot. Then
    /// [`check_all`](super::check_all) of such limits on one key (a
    /// per-second and a per-day limit of one API key, say) runs as one
    /// script on one node, all or nothing with no window, instead of
    /// parallel checks with rollback. Off by default: keys then spread over
    /// the slots by their whole name. Changing it changes the key names
    /// (the old state is not found: every key starts fresh).
    ///
    /// ```
    /// # use ratewall::redis::{RedisBackend, RedisLimiter};
    /// # use ratewall::{Policy, Rate};
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let redis = RedisBackend::builder("redis://127.0.0.1:6379").build()?;
    /// let per_day = RedisLimiter::builder(Policy::token_bucket(Rate::per_day(10_000)), &redis)
    ///     .name("day")
    ///     .hash_tag_keys(true)
    ///     .build()?;
    /// assert_eq!(per_day.redis_key(b"key-7")?, b"ratewall:day:{key-7}");
    /// # Ok::<(), ratewall::redis::RedisError>(()) }).unwrap();
    /// ```
    pub fn hash_tag_keys(mut self, on: bool) -> Self {
        self.hash_tag_keys = on;
        self
    }

    /// The limiter; the policy is validated for Redis here.
    ///
    /// ```
    /// # use ratewall::redis::{RedisBackend, RedisError, RedisLimiter};
    /// # use ratewall::{ConfigError, Policy, Rate};
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// # let redis = RedisBackend::builder("redis://127.0.0.1:6379").build()?;
    /// let bad = RedisLimiter::builder(Policy::token_bucket(Rate::per_second(0)), &redis).build();
    /// assert_eq!(bad.unwrap_err(), RedisError::Config(ConfigError::ZeroRate));
    /// # Ok::<(), ratewall::redis::RedisError>(()) }).unwrap();
    /// ```
    pub fn build(self) -> Result<RedisLimiter, RedisError> {
        // A soft policy runs its script with the widened capacity, and its
        // decisions are read back in nominal terms (`Soft::view`).
        self.policy.validate()?;
        let (hard, soft) = self.policy.widened()?;
        let program = Program::compile(&hard)?;
        if let Some(max_keys) = self.deny_cache {
            if max_keys == 0 || max_keys > crate::MAX_KEYS {
                return Err(RedisError::Config(crate::ConfigError::InvalidCapacity {
                    max_keys,
                    max: crate::MAX_KEYS,
                }));
            }
        }
        let name = self.name.unwrap_or_else(|| program.default_name());
        for part in [&self.prefix, &name] {
            if !key::valid_name(part) {
                return Err(RedisError::InvalidName { name: part.clone() });
            }
        }
        let local = match self.failure {
            FailurePolicy::Open | FailurePolicy::Closed => None,
            FailurePolicy::FallbackShare { instances } => Some(share(&self.policy, instances)),
            FailurePolicy::Fallback(p) => Some(p),
        };
        let fallback = match local {
            Some(p) => Some(
                KeyedPolicyLimiter::<Vec<u8>>::builder(p)
                    .max_keys(self.fallback_max_keys)
                    .when_full(WhenFull::EvictLeastRecent)
                    .build()?,
            ),
            None => None,
        };
        Ok(RedisLimiter {
            policy: self.policy,
            soft,
            program,
            base: format!("{}:{}:", self.prefix, name).into_bytes(),
            hash_tag_keys: self.hash_tag_keys,
            backend: self.backend,
            failure: self.failure,
            fallback,
            deny_cache: self.deny_cache.map(DenyCache::new),
        })
    }
}

impl fmt::Debug for RedisLimiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisLimiter")
            .field("policy", &self.policy)
            .field("keys", &String::from_utf8_lossy(&self.base))
            .field("failure", &self.failure)
            .field("backend", &self.backend)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_share_divides_the_limit_and_the_rate() {
        let p = share(&Policy::token_bucket(Rate::per_second(30).burst(9)), 3);
        let r = p.rate().unwrap();
        assert_eq!(
            (r.count(), r.period(), r.burst_size()),
            (30, Duration::from_secs(3), 3)
        );
        assert_eq!(p.algorithm(), PolicyAlgorithm::TokenBucket);
        let p = share(&Policy::sliding_window_log(Window::per_minute(10)), 4);
        assert_eq!(p.window(), Some(Window::per_minute(2)));
        assert_eq!(p.algorithm(), PolicyAlgorithm::SlidingWindowLog);
        // Never below one.
        let p = share(&Policy::fixed_window(Window::per_second(2)), 5);
        assert_eq!(p.limit(), 1);
        assert_eq!(
            share(&Policy::leaky_bucket(Rate::per_second(4)), 0).limit(),
            4
        );
        // A soft policy stays soft: a percentage as it is, units divided.
        let soft = Policy::fixed_window(Window::per_second(10));
        let p = share(&soft.soft(Tolerance::Percent(20)), 2);
        assert_eq!((p.limit(), p.soft_limit()), (5, 6));
        let p = share(&soft.soft(Tolerance::Units(6)), 3);
        assert_eq!(p.tolerance(), Some(Tolerance::Units(2)));
        let p = share(
            &Policy::token_bucket(Rate::per_second(9)).soft(Tolerance::Units(4)),
            1,
        );
        assert_eq!((p.limit(), p.soft_limit()), (9, 13));
    }

    #[test]
    fn replies_become_decisions_and_bad_replies_errors() {
        let ok = Value::Array(vec![
            Value::Int(1),
            Value::Int(10),
            Value::Int(7),
            Value::Int(0),
            Value::Int(300),
        ]);
        assert_eq!(
            parse_decision(&ok).unwrap(),
            Decision::allow(10, 7, 300_000)
        );
        let deny = Value::Array(vec![
            Value::Int(0),
            Value::Int(10),
            Value::Int(0),
            Value::Int(5),
            Value::Int(9),
        ]);
        assert_eq!(
            parse_decision(&deny).unwrap(),
            Decision::deny(10, 0, 5_000, 9_000)
        );
        for bad in [
            Value::Int(1),
            Value::Array(vec![Value::Int(1)]),
            Value::Array(vec![Value::Int(-1); 5]),
            Value::Nil,
        ] {
            assert!(matches!(
                parse_decision(&bad),
                Err(RedisError::Server { .. })
            ));
        }
    }
}
