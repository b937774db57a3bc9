//! [`RedisLimiter`]: a [`Policy`] whose state lives in Redis.

use super::backend::RedisBackend;
use super::deny_cache::DenyCache;
use super::door;
use super::events::Watch;
use super::failover::{option_methods, share, Failover, FailurePolicy, Options};
use super::key;
use super::script::{Mode, Program};
use super::wire::Call;
use super::{DecisionSource, RedisDecision, RedisError};
use crate::decision::{Decision, Tracking};
#[allow(unused_imports)] // doc links
use crate::keyed::KeyedPolicyLimiter;
use crate::policy::Policy;
use crate::soft::Soft;
use std::fmt;

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
/// The verbs are the local keyed limiters' (`check_key`, `check_key_n`,
/// `peek_key`, `peek_key_n`, `refund_key`, `reset_key`), with the
/// differences a shared store brings: each is `async` and returns
/// `Result<_, RedisError>` (what Redis could not answer is the failure
/// policy's answer or a typed error); a decision is a [`RedisDecision`]
/// (it says where it came from); keys are bytes, because they are part of
/// the Redis key name; `reset_key` that cannot reach Redis is always an
/// error; and there are no `_at` variants (the time is the server's). See
/// `docs/distributed.md`, "Same verbs as the local limiters".
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
/// // let d = per_user.check_key(b"user:42").await?;
/// // if !d.is_allowed() { /* 429, Retry-After: d.retry_after_secs() */ }
/// # Ok::<(), ratewall::redis::RedisError>(()) }).unwrap();
/// ```
pub struct RedisLimiter {
    policy: Policy,
    /// How to read the script's (widened) decisions; a no-op for a hard policy.
    soft: Soft,
    program: Program,
    /// The name in key names (`prefix:name:key`).
    name: String,
    base: Vec<u8>,
    /// Whether the key part goes in a hash tag (`base{key}`).
    hash_tag_keys: bool,
    backend: RedisBackend,
    failover: Failover,
    deny_cache: Option<DenyCache>,
    /// What it was built with, for its tiers (`for_tier`).
    options: Options,
    deny_cache_keys: Option<usize>,
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
    options: Options,
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
            options: Options::default(),
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
        self.failover.policy()
    }

    /// The name in its key names (`prefix:name:key`): the one given to
    /// [`RedisLimiterBuilder::name`], or the default, the algorithm and its
    /// parameters. Two limiters with the same prefix and name share their
    /// state.
    ///
    /// ```
    /// # use ratewall::redis::{RedisBackend, RedisLimiter};
    /// # use ratewall::{Policy, Rate};
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// # let redis = RedisBackend::builder("redis://127.0.0.1:6379").build()?;
    /// let p = Policy::token_bucket(Rate::per_second(100).burst(20));
    /// assert_eq!(RedisLimiter::builder(p, &redis).name("ip").build()?.name(), "ip");
    /// assert_eq!(RedisLimiter::builder(p, &redis).build()?.name(), "tb.10000.20");
    /// # Ok::<(), ratewall::redis::RedisError>(()) }).unwrap();
    /// ```
    pub fn name(&self) -> &str {
        &self.name
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

    /// The Redis key of `key`'s lockout (the HTTP layer's `block_for`),
    /// read in one script with `state_key` (the state key of the limit
    /// checked with it: this limiter's, or a tier's): this limiter's state
    /// key with `#b:` after the prefix and name. No state key has that
    /// form (a key part starting with `#` is always hashed to `#` and 32
    /// hex digits). Both keys must live in one Cluster slot: with hash
    /// tags the tag is kept; on a Cluster without them the block key is
    /// `prefix:name:#b:{state_key}`, tagged with the whole state key (so
    /// there a key's block is its tier's: a key that changes tier leaves
    /// its block behind, as it leaves its count).
    #[cfg_attr(not(feature = "tower"), allow(dead_code))]
    pub(crate) fn block_key(&self, key: &[u8], state_key: &[u8]) -> Result<Vec<u8>, RedisError> {
        if !self.hash_tag_keys && self.backend.is_cluster() {
            let mut k = Vec::with_capacity(self.base.len() + state_key.len() + 5);
            k.extend_from_slice(&self.base);
            k.extend_from_slice(b"#b:{");
            k.extend_from_slice(state_key);
            k.push(b'}');
            return Ok(k);
        }
        let mut k = self.redis_key(key)?;
        let at = self.base.len();
        k.splice(at..at, *b"#b:");
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
    /// let d = l.check_key(b"user:1").await?;
    /// println!("{} from {:?}", d.is_allowed(), d.source());
    /// # Ok(()) }
    /// ```
    pub async fn check_key(&self, key: &[u8]) -> Result<RedisDecision, RedisError> {
        self.check_key_n(key, 1).await
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
    /// let d = bytes.check_key_n(b"tenant:9", 250).await?;
    /// # Ok(()) }
    /// ```
    pub async fn check_key_n(&self, key: &[u8], n: u64) -> Result<RedisDecision, RedisError> {
        self.decide(key, n, n > 0).await
    }

    /// The decision one unit for `key` would get, taking nothing.
    ///
    /// ```no_run
    /// # use ratewall::redis::{RedisBackend, RedisLimiter};
    /// # use ratewall::{Policy, Rate};
    /// # async fn f() -> Result<(), ratewall::redis::RedisError> {
    /// # let redis = RedisBackend::builder("redis://127.0.0.1:6379").build()?;
    /// # let l = RedisLimiter::builder(Policy::token_bucket(Rate::per_second(5)), &redis).build()?;
    /// let left = l.peek_key(b"user:1").await?.remaining();
    /// # Ok(()) }
    /// ```
    pub async fn peek_key(&self, key: &[u8]) -> Result<RedisDecision, RedisError> {
        self.peek_key_n(key, 1).await
    }

    /// The decision `n` units for `key` would get, taking nothing.
    ///
    /// ```no_run
    /// # use ratewall::redis::{RedisBackend, RedisLimiter};
    /// # use ratewall::{Policy, Rate};
    /// # async fn f() -> Result<(), ratewall::redis::RedisError> {
    /// # let redis = RedisBackend::builder("redis://127.0.0.1:6379").build()?;
    /// # let l = RedisLimiter::builder(Policy::token_bucket(Rate::per_second(5)), &redis).build()?;
    /// let fits = l.peek_key_n(b"user:1", 3).await?.is_allowed();
    /// # Ok(()) }
    /// ```
    pub async fn peek_key_n(&self, key: &[u8], n: u64) -> Result<RedisDecision, RedisError> {
        self.decide(key, n, false).await
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
    /// let d = l.check_key(b"user:1").await?;
    /// l.refund_key(b"user:1", 1).await?;
    /// # Ok(()) }
    /// ```
    pub async fn refund_key(&self, key: &[u8], n: u64) -> Result<(), RedisError> {
        let rkey = self.redis_key(key)?;
        if n == 0 {
            return Ok(());
        }
        if let Some(c) = &self.deny_cache {
            c.clear(&rkey);
        }
        // Giving back more than the limit is giving back the limit.
        let n = n.min(self.program.limit);
        match self.call(rkey, Mode::Refund, n).await {
            Ok(_) => Ok(()),
            Err(RedisError::Unavailable { retry_in, cause }) => {
                self.failover.refund_unavailable(key, n, retry_in, cause)
            }
            Err(e) => Err(e),
        }
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
    /// l.reset_key(b"user:1").await?;
    /// # Ok(()) }
    /// ```
    pub async fn reset_key(&self, key: &[u8]) -> Result<(), RedisError> {
        let rkey = self.redis_key(key)?;
        if let Some(c) = &self.deny_cache {
            c.clear(&rkey);
        }
        self.failover.reset_local(key);
        self.backend
            .query(self.watch(), redis::cmd("DEL").arg(&rkey))
            .await?;
        Ok(())
    }

    /// A sibling of this limiter for a premium tier of an HTTP rule:
    /// `policy` under the name `name.tier` (its own keys: a key that
    /// changes tier starts the tier's limit afresh), with the same backend,
    /// prefix, failure policy, deny cache and hash tags. A
    /// `FallbackShare` fallback shares the tier's policy.
    #[cfg_attr(not(feature = "tower"), allow(dead_code))]
    pub(crate) fn for_tier(&self, tier: &str, policy: Policy) -> Result<RedisLimiter, RedisError> {
        let mut options = self.options.clone();
        options.name = Some(format!("{}.{tier}", self.name));
        RedisLimiterBuilder {
            policy,
            backend: self.backend.clone(),
            options,
            deny_cache: self.deny_cache_keys,
            hash_tag_keys: self.hash_tag_keys,
        }
        .build()
    }

    /// Whether the limiter was given a name (`RedisLimiterBuilder::name`)
    /// rather than its default (the algorithm and its parameters).
    #[cfg_attr(not(feature = "tower"), allow(dead_code))]
    pub(crate) fn has_own_name(&self) -> bool {
        self.options.name.is_some()
    }

    /// The errors a check of `n` for `key` gets before any call.
    pub(crate) fn validate(&self, key: &[u8], n: u64) -> Result<(), RedisError> {
        // A limit is at least 1, so a cost of 0 always fits.
        crate::error::InsufficientCapacity::check(n, self.program.limit)?;
        if key.is_empty() {
            return Err(RedisError::EmptyKey);
        }
        Ok(())
    }

    /// Gives `n` back to the local fallback only.
    pub(crate) fn refund_fallback(&self, key: &[u8], n: u64) {
        self.failover.refund_local(key, n);
    }

    /// A check (`consume`) or peek of `n` for `key`.
    pub(crate) async fn decide(
        &self,
        key: &[u8],
        n: u64,
        consume: bool,
    ) -> Result<RedisDecision, RedisError> {
        self.validate(key, n)?;
        let cost = n.max(1);
        let rkey = self.redis_key(key)?;
        let cache = self.deny_cache.as_ref();
        // A unit test's own time never uses the cache (its time is not ours).
        #[cfg(test)]
        let cache = cache.filter(|_| super::testing::now_us().is_none());
        if let Some(left) = cache.and_then(|c| c.denied_for(&rkey)) {
            return Ok(self.decided_here(RedisDecision {
                decision: Decision::deny(self.policy.limit(), 0, left, left),
                source: DecisionSource::DenyCache,
            }));
        }
        let mode = if consume { Mode::Check } else { Mode::Peek };
        // The key goes into the call; a copy stays only for the cache.
        let (call_key, kept) = match cache {
            Some(_) => (rkey.clone(), Some(rkey)),
            None => (rkey, None),
        };
        let got = self.call(call_key, mode, cost).await.map(|raw| {
            if let Some(rkey) = &kept {
                self.note(rkey, cost, &raw);
            }
            self.redis_decision(raw)
        });
        door::settle(self.watch(), got, |retry_in, cause| {
            self.unavailable(key, cost, consume, retry_in, cause)
        })
    }

    /// The failure policy's answer to a check (`consume`) or peek of
    /// `cost` for `key` when Redis could not answer (not counted: the
    /// door's [`settle`](door::settle) counts it).
    pub(crate) fn unavailable(
        &self,
        key: &[u8],
        cost: u64,
        consume: bool,
        retry_in: std::time::Duration,
        cause: String,
    ) -> Result<RedisDecision, RedisError> {
        let open = || {
            let limit = self.program.limit;
            self.nominal(Decision::allow(limit, limit - cost, 0).with_tracking(Tracking::Untracked))
        };
        self.failover
            .unavailable(key, cost, consume, open, retry_in, cause)
    }

    /// A decision Redis made (the script's own, `raw`), in nominal terms.
    #[inline]
    pub(crate) fn redis_decision(&self, raw: Decision) -> RedisDecision {
        RedisDecision {
            decision: self.nominal(raw),
            source: DecisionSource::Redis,
        }
    }

    /// `d`, a decision made for this limiter without a call to Redis (a
    /// deny-cache hit, a lease's local admission), counted (feature
    /// `metrics`; otherwise `d` as it is).
    #[inline]
    pub(crate) fn decided_here(&self, d: RedisDecision) -> RedisDecision {
        door::decided(self.watch(), d)
    }

    /// The watch of this limiter's calls and decisions (see `door.rs`).
    #[inline]
    pub(crate) fn watch(&self) -> &Watch {
        self.failover.watch()
    }

    /// Whether this limiter is failing over now: Redis did not answer its
    /// last check (its [`FailurePolicy`] answered), and has not answered
    /// one since. The [`StoreEvent`](super::StoreEvent)s report each change.
    ///
    /// ```
    /// # use ratewall::redis::{RedisBackend, RedisLimiter};
    /// # use ratewall::{Policy, Rate};
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// # let redis = RedisBackend::builder("redis://127.0.0.1:6379").build()?;
    /// let l = RedisLimiter::builder(Policy::token_bucket(Rate::per_second(5)), &redis).build()?;
    /// assert!(!l.is_failing_over()); // nothing checked yet
    /// # Ok::<(), ratewall::redis::RedisError>(()) }).unwrap();
    /// ```
    pub fn is_failing_over(&self) -> bool {
        self.failover.watch().is_failing()
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

    async fn call(&self, rkey: Vec<u8>, mode: Mode, n: u64) -> Result<Decision, RedisError> {
        let call = Call {
            script: self.program.script(),
            code: self.program.code(),
            key: rkey,
            mode,
            n,
            params: self.program.params,
            #[cfg(test)]
            now_us: super::testing::now_us(),
        };
        self.backend.call(self.watch(), call).await
    }
}

impl RedisLimiterBuilder {
    option_methods! {
        name_doc: "The policy's name in key names (default: the algorithm and its
parameters, such as `tb.10000.20`). Two limiters with the same prefix and
name share their state: give each policy its own name.",
        default_failure: "`FailurePolicy::FallbackShare { instances: 1 }`).",
        setup: "# use ratewall::redis::{RedisBackend, RedisLimiter};
# use ratewall::{Policy, Rate};
# tokio::runtime::Runtime::new().unwrap().block_on(async {
# let redis = RedisBackend::builder(\"redis://127.0.0.1:6379\").build()?;
let b = || RedisLimiter::builder(Policy::token_bucket(Rate::per_second(5)), &redis);",
        prefix_check: "assert_eq!(l.redis_key(b\"k\")?, b\"shop:e:k\");",
        name_check: "assert_eq!(l.redis_key(b\"k\")?, b\"ratewall:per-ip:k\");",
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
            if max_keys == 0 || max_keys > crate::keyed::MAX_KEYS {
                return Err(RedisError::Config(
                    crate::error::ConfigError::InvalidCapacity {
                        max_keys,
                        max: crate::keyed::MAX_KEYS,
                    },
                ));
            }
        }
        let (prefix, name) = self.options.names(|| program.default_name())?;
        let base = format!("{prefix}:{name}:").into_bytes();
        let policy = self.policy;
        let failover = self.options.failover(&name, |instances| {
            self.options.keyed(share(&policy, instances))
        })?;
        Ok(RedisLimiter {
            policy: self.policy,
            soft,
            program,
            name,
            base,
            hash_tag_keys: self.hash_tag_keys,
            backend: self.backend,
            failover,
            deny_cache: self.deny_cache.map(DenyCache::new),
            deny_cache_keys: self.deny_cache,
            options: self.options,
        })
    }
}

impl fmt::Debug for RedisLimiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisLimiter")
            .field("policy", &self.policy)
            .field("keys", &String::from_utf8_lossy(&self.base))
            .field("failure", &self.failover.policy())
            .field("backend", &self.backend)
            .finish()
    }
}
