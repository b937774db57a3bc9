//! [`RedisConcurrencyLimiter`]: a concurrency limit (units in flight per
//! key) shared by every instance through Redis, with permits that expire
//! unless renewed, so a crashed instance's permits lapse.
//!
//! # Protocol (`lua/concurrency.lua`; docs/concurrency.md, "Across
//! instances: Redis permits")
//!
//! - **Acquire**: one script call drops the key's lapsed permits, admits
//!   iff the units held + n <= max, and records the permit (a ZSET member
//!   `<id>:<units>` scored by its expiry, server time, plus the sum of the
//!   units) with the expiry `now + expiry`.
//! - **Renew**: one task per limiter, started by its first acquire on the
//!   tokio runtime, renews every permit this instance holds every
//!   `expiry / 3`: one script call per key for all of that key's permits.
//! - **Release**: the permit's drop (a call spawned on the runtime; with no
//!   runtime, its expiry reclaims it) or `release().await`; once either
//!   way.

use super::backend::RedisBackend;
use super::door;
use super::events::Watch;
use super::failover::{option_methods, Options};
use super::fault::{bad_reply, Fault};
use super::key;
use super::wire::{concurrency_call, parse_decision};
use super::{DecisionSource, FailurePolicy, RedisDecision, RedisError};
use crate::algo::concurrency::mean_hold;
use crate::concurrency::{check_max, ConcurrencyLimiter, OwnedPermit};
use crate::decision::{Decision, Tracking};
use crate::error::{ConfigError, InsufficientCapacity};
use crate::sync::{lock, AtomicU64, Mutex, Ordering};
use redis::Value;
use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

/// The default expiry of a permit not renewed: 10 s.
pub const DEFAULT_PERMIT_EXPIRY: Duration = Duration::from_secs(10);

/// A concurrency limit shared through Redis: at most `max` units in flight
/// per key across every instance. The bound is exact while the instances
/// live: each acquire is one script call that admits iff the units held
/// plus its own fit. Each permit is held in Redis with an expiry (the
/// server's `TIME`) that this instance renews every `expiry / 3` while the
/// permit lives, so the permits of an instance that crashes, or loses its
/// runtime, lapse within the expiry and others can take them.
///
/// A permit ([`RedisPermit`]) releases on drop (the call is spawned on the
/// tokio runtime; dropped where there is none, its expiry reclaims it) or
/// with [`RedisPermit::release`]; exactly once either way.
///
/// When Redis cannot answer, the [`FailurePolicy`] does: `Open` admits
/// untracked (the permit holds nothing), `Closed` returns the error,
/// `FallbackShare { instances }` takes a permit from a local
/// [`ConcurrencyLimiter`] of `max / instances` (at least 1) for the key,
/// in a table bounded by `fallback_max_keys`. A fallback permit stays local
/// when Redis returns: it is released locally and never counted in Redis,
/// so for as long as such permits are held, the fleet may hold up to `max`
/// more units per key than the bound (see docs/concurrency.md).
/// `Fallback(policy)` (a rate policy) is not offered here.
///
/// Keys: `prefix:name:{key}` (the permits) and `prefix:name:{key}:n`
/// (their sum), one hash tag per key, so Redis Cluster spreads the keys.
///
/// # Example
///
/// ```no_run
/// use ratewall::redis::{RedisBackend, RedisConcurrencyLimiter};
/// use std::time::Duration;
///
/// # async fn f() -> Result<(), ratewall::redis::RedisError> {
/// let redis = RedisBackend::builder("redis://127.0.0.1:6379").build()?;
/// let db = RedisConcurrencyLimiter::builder(20, &redis)
///     .name("db")
///     .expiry(Duration::from_secs(5))
///     .build()?;
/// let a = db.try_acquire_key(b"tenant:7").await?;
/// if let Some(permit) = a.into_permit() {
///     // ... the work; the permit is renewed while held ...
///     permit.release().await?; // or drop it
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RedisConcurrencyLimiter {
    inner: Arc<Inner>,
}

struct Inner {
    /// The name in key names, events and metrics.
    name: String,
    /// Whether `name` was given (`name`), not the default `cc.MAX`.
    named: bool,
    max: u64,
    expiry: Duration,
    /// `prefix:name:{`
    base: Vec<u8>,
    backend: RedisBackend,
    failure: FailurePolicy,
    watch: Watch,
    fallback: Option<Fallback>,
    /// This instance's part of every permit id.
    instance: u64,
    next_id: AtomicU64,
    /// The permits this instance holds in Redis, by their ZSET key.
    held: Mutex<HashMap<Vec<u8>, HashSet<String>>>,
    /// 1 once the renewal task runs.
    renewing: AtomicU64,
    /// Mean time this instance's Redis permits were held, in ns
    /// (exponentially weighted, 1/8; 0 until one comes back): how long a
    /// waiting acquire sleeps between tries.
    hold_ns: AtomicU64,
}

/// The local limiters of `FallbackShare`, one per key, bounded.
struct Fallback {
    share: u64,
    max_keys: usize,
    map: Mutex<HashMap<Vec<u8>, Arc<ConcurrencyLimiter>>>,
}

impl Fallback {
    /// A local permit of `n` for `key`; a denial if the key's share is
    /// taken, or if the table is full of keys with permits out.
    fn try_acquire_n(&self, key: &[u8], n: u64) -> (Decision, Option<OwnedPermit>) {
        let limiter = {
            let mut map = lock(&self.map);
            if !map.contains_key(key) && map.len() >= self.max_keys {
                // Cold path (failing over, table full): forget idle keys.
                map.retain(|_, l| l.in_flight() > 0);
            }
            match map.get(key) {
                Some(l) => Arc::clone(l),
                None if map.len() < self.max_keys => {
                    // `share` was checked at build.
                    let l = Arc::new(ConcurrencyLimiter::new(self.share).expect("valid share"));
                    map.insert(key.to_vec(), Arc::clone(&l));
                    l
                }
                None => return (Decision::deny(self.share, 0, 0, 0), None),
            }
        };
        match limiter.try_acquire_owned_n(n) {
            Ok(a) => (a.decision(), a.into_permit()),
            // More than this instance's share: it cannot fit while failing over.
            Err(_) => (Decision::deny(self.share, 0, 0, 0), None),
        }
    }
}

/// Configures a [`RedisConcurrencyLimiter`]: the expiry, key prefix, name,
/// failure policy.
///
/// # Example
///
/// ```
/// use ratewall::redis::{FailurePolicy, RedisBackend, RedisConcurrencyLimiter};
/// use std::time::Duration;
///
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let redis = RedisBackend::builder("redis://127.0.0.1:6379").build()?;
/// let l = RedisConcurrencyLimiter::builder(8, &redis)
///     .name("gpu")
///     .expiry(Duration::from_secs(3))
///     .on_failure(FailurePolicy::FallbackShare { instances: 4 })
///     .build()?;
/// assert_eq!((l.max(), l.expiry()), (8, Duration::from_secs(3)));
/// # Ok::<(), ratewall::redis::RedisError>(()) }).unwrap();
/// ```
#[must_use = "a builder does nothing until `build`"]
#[derive(Debug)]
pub struct RedisConcurrencyBuilder {
    max: u64,
    expiry: Duration,
    backend: RedisBackend,
    options: Options,
}

impl RedisConcurrencyBuilder {
    option_methods! {
        name_doc: "The limit's name in key names (default `cc.<max>`). Instances that share
    a limit use the same prefix, name and maximum.",
        default_failure: "`FailurePolicy::FallbackShare { instances: 1 }`: a local
    [`ConcurrencyLimiter`] of the whole maximum per key).",
        setup: "# use ratewall::redis::{RedisBackend, RedisConcurrencyLimiter};
# tokio::runtime::Runtime::new().unwrap().block_on(async {
# let redis = RedisBackend::builder(\"redis://127.0.0.1:6379\").build()?;
let b = || RedisConcurrencyLimiter::builder(4, &redis);",
        prefix_check: "assert_eq!(l.redis_key(b\"k\")?, b\"shop:e:{k}\");",
        name_check: "assert_eq!(l.redis_key(b\"k\")?, b\"ratewall:per-ip:{k}\");",
    }

    /// How long a permit lives in Redis unless renewed (default
    /// [`DEFAULT_PERMIT_EXPIRY`], 10 ms to 1 hour): how long a crashed
    /// instance's permits stay taken. Held permits are renewed every
    /// `expiry / 3`.
    ///
    /// ```
    /// # use ratewall::redis::{RedisBackend, RedisConcurrencyLimiter};
    /// # use std::time::Duration;
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// # let redis = RedisBackend::builder("redis://127.0.0.1:6379").build()?;
    /// let bad = RedisConcurrencyLimiter::builder(4, &redis).expiry(Duration::from_millis(1)).build();
    /// assert!(bad.unwrap_err().to_string().contains("expiry"));
    /// # Ok::<(), ratewall::redis::RedisError>(()) }).unwrap();
    /// ```
    pub fn expiry(mut self, expiry: Duration) -> Self {
        self.expiry = expiry;
        self
    }

    /// The limiter. Errors: a maximum of 0 or above
    /// [`MAX_PERMITS`](crate::MAX_PERMITS), an expiry outside 10 ms to 1
    /// hour, a bad prefix or name, or [`FailurePolicy::Fallback`] (a rate
    /// policy cannot stand in for a concurrency limit; use `FallbackShare`).
    ///
    /// ```
    /// # use ratewall::redis::{RedisBackend, RedisConcurrencyLimiter, RedisError};
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// # let redis = RedisBackend::builder("redis://127.0.0.1:6379").build()?;
    /// let zero = RedisConcurrencyLimiter::builder(0, &redis).build();
    /// assert!(matches!(zero, Err(RedisError::Config(_))));
    /// # Ok::<(), ratewall::redis::RedisError>(()) }).unwrap();
    /// ```
    pub fn build(self) -> Result<RedisConcurrencyLimiter, RedisError> {
        check_max(self.max)?;
        if self.expiry < Duration::from_millis(10) || self.expiry > Duration::from_secs(3600) {
            return Err(RedisError::Config(ConfigError::Incompatible {
                reason: "a permit's expiry must be between 10 ms and 1 hour",
            }));
        }
        let max = self.max;
        let (prefix, name) = self.options.names(|| format!("cc.{max}"))?;
        let base = format!("{prefix}:{name}:{{").into_bytes();
        let fallback = match self.options.failure {
            FailurePolicy::Open | FailurePolicy::Closed => None,
            FailurePolicy::FallbackShare { instances } => {
                let max_keys = self.options.fallback_table.max_keys;
                if max_keys == 0 || max_keys > crate::keyed::MAX_KEYS {
                    return Err(RedisError::Config(ConfigError::InvalidCapacity {
                        max_keys,
                        max: crate::keyed::MAX_KEYS,
                    }));
                }
                Some(Fallback {
                    share: (max / u64::from(instances.max(1))).max(1),
                    max_keys,
                    map: Mutex::new(HashMap::new()),
                })
            }
            FailurePolicy::Fallback(_) => {
                return Err(RedisError::Unsupported {
                    reason: "a concurrency limit falls back to a local concurrency limit: use FailurePolicy::FallbackShare, Open or Closed",
                })
            }
        };
        let hasher = ahash::RandomState::new();
        Ok(RedisConcurrencyLimiter {
            inner: Arc::new(Inner {
                named: self.options.name.is_some(),
                name: name.clone(),
                max,
                expiry: self.expiry,
                base,
                watch: Watch::new(&name, self.options.failure, self.options.hook.clone()),
                backend: self.backend,
                failure: self.options.failure,
                fallback,
                instance: hasher.hash_one(std::process::id()) ^ hasher.hash_one(Instant::now()),
                next_id: AtomicU64::new(1),
                held: Mutex::new(HashMap::new()),
                renewing: AtomicU64::new(0),
                hold_ns: AtomicU64::new(0),
            }),
        })
    }
}

impl RedisConcurrencyLimiter {
    /// A builder for at most `max` units in flight per key, on `backend`.
    ///
    /// ```
    /// # use ratewall::redis::{RedisBackend, RedisConcurrencyLimiter};
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let redis = RedisBackend::builder("redis://127.0.0.1:6379").build()?;
    /// let l = RedisConcurrencyLimiter::builder(10, &redis).build()?;
    /// assert_eq!(l.max(), 10);
    /// # Ok::<(), ratewall::redis::RedisError>(()) }).unwrap();
    /// ```
    pub fn builder(max: u64, backend: &RedisBackend) -> RedisConcurrencyBuilder {
        RedisConcurrencyBuilder {
            max,
            expiry: DEFAULT_PERMIT_EXPIRY,
            backend: backend.clone(),
            options: Options::default(),
        }
    }

    /// The name in its Redis keys, store events and metrics (default
    /// `cc.MAX`); an HTTP rule on the limiter takes this name.
    ///
    /// ```
    /// # use ratewall::redis::{RedisBackend, RedisConcurrencyLimiter};
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// # let redis = RedisBackend::builder("redis://127.0.0.1:6379").build()?;
    /// assert_eq!(RedisConcurrencyLimiter::builder(3, &redis).build()?.name(), "cc.3");
    /// let l = RedisConcurrencyLimiter::builder(3, &redis).name("reports").build()?;
    /// assert_eq!(l.name(), "reports");
    /// # Ok::<(), ratewall::redis::RedisError>(()) }).unwrap();
    /// ```
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// Whether the limiter was given a name rather than its default.
    #[cfg_attr(not(feature = "tower"), allow(dead_code))]
    pub(crate) fn has_own_name(&self) -> bool {
        self.inner.named
    }

    /// The maximum units in flight per key.
    ///
    /// ```
    /// # use ratewall::redis::{RedisBackend, RedisConcurrencyLimiter};
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// # let redis = RedisBackend::builder("redis://127.0.0.1:6379").build()?;
    /// assert_eq!(RedisConcurrencyLimiter::builder(3, &redis).build()?.max(), 3);
    /// # Ok::<(), ratewall::redis::RedisError>(()) }).unwrap();
    /// ```
    pub fn max(&self) -> u64 {
        self.inner.max
    }

    /// The backend the permits live on.
    #[cfg_attr(not(feature = "tower"), allow(dead_code))]
    pub(crate) fn backend(&self) -> &RedisBackend {
        &self.inner.backend
    }

    /// The observed mean time this instance held a permit of this limiter
    /// (an exponentially weighted mean, the local
    /// [`ConcurrencyLimiter::mean_hold_time`]'s formula), zero before the
    /// first comes back. The HTTP layer tells a shed request to retry after
    /// it, as it does for a local concurrency rule.
    ///
    /// ```
    /// # use ratewall::redis::{RedisBackend, RedisConcurrencyLimiter};
    /// # use std::time::Duration;
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// # let redis = RedisBackend::builder("redis://127.0.0.1:6379").build()?;
    /// let l = RedisConcurrencyLimiter::builder(3, &redis).build()?;
    /// assert_eq!(l.mean_hold_time(), Duration::ZERO); // nothing held yet
    /// # Ok::<(), ratewall::redis::RedisError>(()) }).unwrap();
    /// ```
    pub fn mean_hold_time(&self) -> Duration {
        // Relaxed: a hint; it orders nothing.
        Duration::from_nanos(self.inner.hold_ns.load(Ordering::Relaxed))
    }

    /// How long a permit lives in Redis unless renewed.
    ///
    /// ```
    /// # use ratewall::redis::{RedisBackend, RedisConcurrencyLimiter, DEFAULT_PERMIT_EXPIRY};
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// # let redis = RedisBackend::builder("redis://127.0.0.1:6379").build()?;
    /// assert_eq!(RedisConcurrencyLimiter::builder(3, &redis).build()?.expiry(), DEFAULT_PERMIT_EXPIRY);
    /// # Ok::<(), ratewall::redis::RedisError>(()) }).unwrap();
    /// ```
    pub fn expiry(&self) -> Duration {
        self.inner.expiry
    }

    /// The failure policy.
    ///
    /// ```
    /// # use ratewall::redis::{FailurePolicy, RedisBackend, RedisConcurrencyLimiter};
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// # let redis = RedisBackend::builder("redis://127.0.0.1:6379").build()?;
    /// let l = RedisConcurrencyLimiter::builder(3, &redis).on_failure(FailurePolicy::Open).build()?;
    /// assert_eq!(l.failure_policy(), FailurePolicy::Open);
    /// # Ok::<(), ratewall::redis::RedisError>(()) }).unwrap();
    /// ```
    pub fn failure_policy(&self) -> FailurePolicy {
        self.inner.failure
    }

    /// The Redis key of `key`'s permits, `prefix:name:{key}` (a long,
    /// binary or braced key is hashed, as for
    /// [`RedisLimiter::redis_key`](super::RedisLimiter::redis_key)); their
    /// sum is this key plus `:n`.
    ///
    /// ```
    /// # use ratewall::redis::{RedisBackend, RedisConcurrencyLimiter};
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// # let redis = RedisBackend::builder("redis://127.0.0.1:6379").build()?;
    /// let l = RedisConcurrencyLimiter::builder(3, &redis).build()?;
    /// assert_eq!(l.redis_key(b"t1")?, b"ratewall:cc.3:{t1}");
    /// assert!(l.redis_key(b"").is_err());
    /// # Ok::<(), ratewall::redis::RedisError>(()) }).unwrap();
    /// ```
    pub fn redis_key(&self, key: &[u8]) -> Result<Vec<u8>, RedisError> {
        let mut k = key::redis_key(&self.inner.base, key)?;
        k.push(b'}');
        Ok(k)
    }

    /// Takes one unit for `key` if it fits, without waiting:
    /// [`try_acquire_key_n`](Self::try_acquire_key_n) for a cost of 1 (a
    /// `Result` still: Redis can fail).
    ///
    /// ```no_run
    /// # use ratewall::redis::{RedisBackend, RedisConcurrencyLimiter};
    /// # async fn f() -> Result<(), ratewall::redis::RedisError> {
    /// # let redis = RedisBackend::builder("redis://127.0.0.1:6379").build()?;
    /// let l = RedisConcurrencyLimiter::builder(1, &redis).build()?;
    /// let first = l.try_acquire_key(b"k").await?;
    /// assert!(first.is_allowed());
    /// assert!(!l.try_acquire_key(b"k").await?.is_allowed());
    /// # Ok(()) }
    /// ```
    pub async fn try_acquire_key(&self, key: &[u8]) -> Result<RedisAcquisition, RedisError> {
        self.try_acquire_key_n(key, 1).await
    }

    /// Takes `n` units for `key` if they fit, without waiting: one script
    /// call. The acquisition holds the decision (`limit` the maximum,
    /// `remaining` what the key may still take; a denial's `retry_after` is
    /// the time until the first held permit would lapse if its holder
    /// stopped renewing: a hint) and, when allowed, the permit. A cost above
    /// the maximum is [`RedisError::InsufficientCapacity`]; a cost of 0 is
    /// admitted without a call and holds nothing.
    ///
    /// A call that timed out, or whose future was dropped while it was in
    /// flight, may have admitted a permit in Redis that no one holds: it is
    /// never renewed, and lapses within the expiry (a cost in liveness, never
    /// in the bound).
    ///
    /// ```no_run
    /// # use ratewall::redis::{RedisBackend, RedisConcurrencyLimiter};
    /// # async fn f() -> Result<(), ratewall::redis::RedisError> {
    /// # let redis = RedisBackend::builder("redis://127.0.0.1:6379").build()?;
    /// let l = RedisConcurrencyLimiter::builder(2, &redis).build()?;
    /// let first = l.try_acquire_key_n(b"k", 2).await?;
    /// assert!(first.is_allowed());
    /// assert!(!l.try_acquire_key(b"k").await?.is_allowed());
    /// drop(first); // releases (a call spawned on the runtime)
    /// assert!(l.try_acquire_key_n(b"k", 3).await.is_err()); // never fits
    /// # Ok(()) }
    /// ```
    pub async fn try_acquire_key_n(
        &self,
        key: &[u8],
        n: u64,
    ) -> Result<RedisAcquisition, RedisError> {
        let inner = &self.inner;
        InsufficientCapacity::check(n, inner.max)?;
        let zkey = self.redis_key(key)?;
        if n == 0 {
            let d = Decision::allow(inner.max, inner.max, 0);
            return Ok(RedisAcquisition::new(d, DecisionSource::Redis, Hold::None));
        }
        let id = inner.next_id.fetch_add(1, Ordering::Relaxed); // Relaxed: a unique number; it orders nothing
        let member = format!("{:016x}.{id}:{n}", inner.instance);
        let args = [n.to_string(), inner.max.to_string(), member.clone()];
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let read = |v: Value| parse_decision(&v);
        let got = inner.call(&zkey, "a", &args, read).await.map(|decision| {
            let hold = if decision.is_allowed() {
                lock(&inner.held)
                    .entry(zkey.clone())
                    .or_default()
                    .insert(member.clone());
                self.start_renewal();
                Hold::Redis {
                    limiter: Arc::clone(inner),
                    key: zkey,
                    member,
                    since: Instant::now(),
                }
            } else {
                Hold::None
            };
            RedisAcquisition::new(decision, DecisionSource::Redis, hold)
        });
        door::settle(&inner.watch, got, |retry_in, cause| match &inner.fallback {
            Some(local) => {
                let (d, permit) = local.try_acquire_n(key, n);
                let hold = permit.map_or(Hold::None, Hold::Local);
                Ok(RedisAcquisition::new(d, DecisionSource::Fallback, hold))
            }
            None if inner.failure == FailurePolicy::Open => {
                let d =
                    Decision::allow(inner.max, inner.max - n, 0).with_tracking(Tracking::Untracked);
                Ok(RedisAcquisition::new(
                    d,
                    DecisionSource::FailOpen,
                    Hold::None,
                ))
            }
            None => Err(RedisError::Unavailable { retry_in, cause }),
        })
    }

    /// The units of `key` this instance holds in Redis now.
    ///
    /// ```no_run
    /// # use ratewall::redis::{RedisBackend, RedisConcurrencyLimiter};
    /// # async fn f() -> Result<(), ratewall::redis::RedisError> {
    /// # let redis = RedisBackend::builder("redis://127.0.0.1:6379").build()?;
    /// let l = RedisConcurrencyLimiter::builder(4, &redis).build()?;
    /// let a = l.try_acquire_key_n(b"k", 3).await?;
    /// assert_eq!(l.held_here(b"k")?, 3);
    /// # Ok(()) }
    /// ```
    pub fn held_here(&self, key: &[u8]) -> Result<u64, RedisError> {
        let zkey = self.redis_key(key)?;
        Ok(lock(&self.inner.held)
            .get(&zkey)
            .map_or(0, |m| m.iter().map(|member| units_of(member)).sum()))
    }

    /// Starts the renewal task once, on the current runtime.
    fn start_renewal(&self) {
        // Relaxed: the flag only elects one starter; the task reads the
        // permits under the lock.
        if self
            .inner
            .renewing
            .compare_exchange(0, 1, Ordering::Relaxed, Ordering::Relaxed)
            .is_err()
        {
            return;
        }
        let weak = Arc::downgrade(&self.inner);
        let every = self.inner.expiry / 3;
        tokio::spawn(renew_loop(weak, every));
    }
}

/// The renewal task: every `every`, renews every permit the limiter holds;
/// ends when the limiter and its permits are gone.
async fn renew_loop(weak: Weak<Inner>, every: Duration) {
    loop {
        tokio::time::sleep(every).await;
        let Some(inner) = weak.upgrade() else {
            return;
        };
        inner.renew_all().await;
    }
}

impl Inner {
    /// One script call on `zkey` (and its sum), its reply read by `read`.
    async fn call<T>(
        &self,
        zkey: &[u8],
        mode: &'static str,
        args: &[&str],
        read: impl FnOnce(Value) -> Result<T, Fault>,
    ) -> Result<T, RedisError> {
        let mut sum = zkey.to_vec();
        sum.extend_from_slice(b":n");
        let expiry_us = self.expiry.as_micros() as u64;
        let invocation = concurrency_call([zkey, &sum], mode, expiry_us, args);
        self.backend.invoke(&[&self.watch], &invocation, read).await
    }

    /// Renews every permit held: one call per key, the keys in parallel.
    /// A permit that lapsed (Redis could not be reached for longer than
    /// the expiry, or lost its state) is forgotten here: its holder's
    /// release finds nothing to give back.
    async fn renew_all(&self) {
        let snapshot: Vec<(Vec<u8>, Vec<String>)> = lock(&self.held)
            .iter()
            .map(|(k, m)| (k.clone(), m.iter().cloned().collect()))
            .collect();
        let calls = snapshot.iter().map(|(zkey, members)| async move {
            let count = members.len().to_string();
            let mut args = vec![count.as_str()];
            args.extend(members.iter().map(String::as_str));
            // One flag per member: 1 renewed, 0 lapsed.
            let read = |v: Value| match v {
                Value::Array(flags)
                    if flags.len() == members.len()
                        && flags.iter().all(|f| matches!(f, Value::Int(0 | 1))) =>
                {
                    Ok(flags)
                }
                other => Err(bad_reply("renewal", &other)),
            };
            (zkey, members, self.call(zkey, "n", &args, read).await)
        });
        for (zkey, members, reply) in futures_util::future::join_all(calls).await {
            let Ok(flags) = reply else {
                continue; // Redis down or slow: try again next round
            };
            let mut held = lock(&self.held);
            for (member, flag) in members.iter().zip(flags) {
                if flag == Value::Int(0) {
                    if let Some(set) = held.get_mut(zkey) {
                        set.remove(member);
                    }
                }
            }
            if held.get(zkey).is_some_and(HashSet::is_empty) {
                held.remove(zkey);
            }
        }
    }

    /// A permit held since `since` is released: stop renewing it, and
    /// count its hold time into the mean (a relaxed load and store: two
    /// racing releases may lose a sample of a hint).
    fn released(&self, zkey: &[u8], member: &str, since: Instant) {
        self.forget(zkey, member);
        let hold = u64::try_from(since.elapsed().as_nanos()).unwrap_or(u64::MAX);
        // Relaxed: a hint; it orders nothing.
        let old = self.hold_ns.load(Ordering::Relaxed);
        self.hold_ns.store(mean_hold(old, hold), Ordering::Relaxed);
    }

    /// Stops renewing `member`; whether it was still held here.
    fn forget(&self, zkey: &[u8], member: &str) -> bool {
        let mut held = lock(&self.held);
        let Some(set) = held.get_mut(zkey) else {
            return false;
        };
        let was = set.remove(member);
        if set.is_empty() {
            held.remove(zkey);
        }
        was
    }
}

/// The units a permit's member `<id>:<units>` holds.
fn units_of(member: &str) -> u64 {
    member
        .rsplit(':')
        .next()
        .and_then(|u| u.parse().ok())
        .unwrap_or(0)
}

/// What a permit holds.
enum Hold {
    /// Nothing: fail-open, a cost of 0, or already released.
    None,
    /// A permit in Redis.
    Redis {
        limiter: Arc<Inner>,
        key: Vec<u8>,
        member: String,
        /// When it was admitted (for the mean hold time).
        since: Instant,
    },
    /// A permit of the local fallback.
    Local(OwnedPermit),
}

/// The answer to [`RedisConcurrencyLimiter::try_acquire_key`]: the
/// decision and where it came from, and the permit when allowed.
///
/// # Example
///
/// ```no_run
/// # use ratewall::redis::{DecisionSource, RedisBackend, RedisConcurrencyLimiter};
/// # async fn f() -> Result<(), ratewall::redis::RedisError> {
/// # let redis = RedisBackend::builder("redis://127.0.0.1:6379").build()?;
/// let l = RedisConcurrencyLimiter::builder(4, &redis).build()?;
/// let a = l.try_acquire_key(b"k").await?;
/// assert_eq!(a.decision().source(), DecisionSource::Redis);
/// assert_eq!(a.decision().remaining(), 3);
/// let _permit = a.into_permit();
/// # Ok(()) }
/// ```
#[must_use = "dropping an acquisition releases its permit at once"]
#[derive(Debug)]
pub struct RedisAcquisition {
    decision: RedisDecision,
    permit: Option<RedisPermit>,
}

impl door::Answer for RedisAcquisition {
    fn counted(&self) -> &RedisDecision {
        &self.decision
    }
}

impl RedisAcquisition {
    fn new(decision: Decision, source: DecisionSource, hold: Hold) -> Self {
        let decision = RedisDecision { decision, source };
        let permit = decision.is_allowed().then(|| RedisPermit { hold, source });
        RedisAcquisition { decision, permit }
    }

    /// Whether the request was admitted (and so holds a permit).
    ///
    /// ```no_run
    /// # use ratewall::redis::{RedisBackend, RedisConcurrencyLimiter};
    /// # async fn f() -> Result<(), ratewall::redis::RedisError> {
    /// # let redis = RedisBackend::builder("redis://127.0.0.1:6379").build()?;
    /// # let l = RedisConcurrencyLimiter::builder(1, &redis).build()?;
    /// let a = l.try_acquire_key(b"k").await?;
    /// assert!(a.is_allowed());
    /// # Ok(()) }
    /// ```
    pub fn is_allowed(&self) -> bool {
        self.decision.is_allowed()
    }

    /// The decision and its source.
    ///
    /// ```no_run
    /// # use ratewall::redis::{RedisBackend, RedisConcurrencyLimiter};
    /// # async fn f() -> Result<(), ratewall::redis::RedisError> {
    /// # let redis = RedisBackend::builder("redis://127.0.0.1:6379").build()?;
    /// # let l = RedisConcurrencyLimiter::builder(5, &redis).build()?;
    /// let a = l.try_acquire_key_n(b"k", 2).await?;
    /// assert_eq!((a.decision().limit(), a.decision().remaining()), (5, 3));
    /// # Ok(()) }
    /// ```
    pub fn decision(&self) -> RedisDecision {
        self.decision
    }

    /// The permit, if the request was admitted.
    ///
    /// ```no_run
    /// # use ratewall::redis::{RedisBackend, RedisConcurrencyLimiter};
    /// # async fn f() -> Result<(), ratewall::redis::RedisError> {
    /// # let redis = RedisBackend::builder("redis://127.0.0.1:6379").build()?;
    /// # let l = RedisConcurrencyLimiter::builder(1, &redis).build()?;
    /// let permit = l.try_acquire_key(b"k").await?.into_permit();
    /// assert!(permit.is_some());
    /// # Ok(()) }
    /// ```
    pub fn into_permit(self) -> Option<RedisPermit> {
        self.permit
    }
}

/// Units held in a [`RedisConcurrencyLimiter`], renewed while the permit
/// lives. Dropped, it releases: the release call is spawned on the tokio
/// runtime; dropped outside one, nothing is sent and its expiry reclaims
/// the units. [`release`](Self::release) releases now and says whether
/// the permit was still held. Either way, exactly once.
///
/// # Example
///
/// ```no_run
/// # use ratewall::redis::{RedisBackend, RedisConcurrencyLimiter};
/// # async fn f() -> Result<(), ratewall::redis::RedisError> {
/// # let redis = RedisBackend::builder("redis://127.0.0.1:6379").build()?;
/// let l = RedisConcurrencyLimiter::builder(1, &redis).build()?;
/// let permit = l.try_acquire_key(b"k").await?.into_permit().unwrap();
/// assert!(permit.release().await?); // held until now
/// assert!(l.try_acquire_key(b"k").await?.is_allowed());
/// # Ok(()) }
/// ```
#[must_use = "dropping a permit releases it at once"]
pub struct RedisPermit {
    hold: Hold,
    source: DecisionSource,
}

impl RedisPermit {
    /// Where the permit came from: Redis, the local fallback, or fail-open
    /// (which holds nothing).
    ///
    /// ```no_run
    /// # use ratewall::redis::{DecisionSource, RedisBackend, RedisConcurrencyLimiter};
    /// # async fn f() -> Result<(), ratewall::redis::RedisError> {
    /// # let redis = RedisBackend::builder("redis://127.0.0.1:6379").build()?;
    /// # let l = RedisConcurrencyLimiter::builder(1, &redis).build()?;
    /// let p = l.try_acquire_key(b"k").await?.into_permit().unwrap();
    /// assert_eq!(p.source(), DecisionSource::Redis);
    /// # Ok(()) }
    /// ```
    pub fn source(&self) -> DecisionSource {
        self.source
    }

    /// Releases now. `Ok(true)` if the units were still held and are
    /// given back; `Ok(false)` if there was nothing to give back in Redis
    /// (the permit had lapsed, or it was a fail-open one); a local
    /// fallback permit is released locally (`Ok(true)`). An error if Redis
    /// could not be reached: the permit is not renewed any more and its
    /// expiry reclaims it.
    ///
    /// ```no_run
    /// # use ratewall::redis::{RedisBackend, RedisConcurrencyLimiter};
    /// # async fn f() -> Result<(), ratewall::redis::RedisError> {
    /// # let redis = RedisBackend::builder("redis://127.0.0.1:6379").build()?;
    /// # let l = RedisConcurrencyLimiter::builder(1, &redis).build()?;
    /// let p = l.try_acquire_key(b"k").await?.into_permit().unwrap();
    /// assert!(p.release().await?);
    /// # Ok(()) }
    /// ```
    pub async fn release(mut self) -> Result<bool, RedisError> {
        match std::mem::replace(&mut self.hold, Hold::None) {
            Hold::None => Ok(false),
            Hold::Local(permit) => {
                drop(permit);
                Ok(true)
            }
            Hold::Redis {
                limiter,
                key,
                member,
                since,
            } => {
                limiter.released(&key, &member, since);
                limiter.call(&key, "r", &[&member], read_release).await
            }
        }
    }
}

impl Drop for RedisPermit {
    fn drop(&mut self) {
        if let Hold::Redis {
            limiter,
            key,
            member,
            since,
        } = std::mem::replace(&mut self.hold, Hold::None)
        {
            limiter.released(&key, &member, since);
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(async move {
                    // A failure leaves the permit to its expiry.
                    let _ = limiter.call(&key, "r", &[&member], read_release).await;
                });
            }
        }
        // A local permit releases in its own drop.
    }
}

/// A release's reply: whether the permit was still held (1) or had
/// lapsed (0).
fn read_release(v: Value) -> Result<bool, Fault> {
    match v {
        Value::Int(r @ (0 | 1)) => Ok(r == 1),
        other => Err(bad_reply("release", &other)),
    }
}

impl fmt::Debug for RedisPermit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let units = match &self.hold {
            Hold::None => 0,
            Hold::Redis { member, .. } => units_of(member),
            Hold::Local(p) => p.units(),
        };
        f.debug_struct("RedisPermit")
            .field("units", &units)
            .field("source", &self.source)
            .finish()
    }
}

impl fmt::Debug for RedisConcurrencyLimiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let i = &self.inner;
        f.debug_struct("RedisConcurrencyLimiter")
            .field("max", &i.max)
            .field("expiry", &i.expiry)
            .field("keys", &String::from_utf8_lossy(&i.base))
            .field("failure", &i.failure)
            .field("backend", &i.backend)
            .finish()
    }
}

#[cfg(feature = "wait")]
#[path = "concurrency_wait.rs"]
mod wait;
#[cfg(feature = "wait")]
pub use wait::RedisAcquire;

#[cfg(test)]
#[path = "concurrency_tests.rs"]
mod tests;
