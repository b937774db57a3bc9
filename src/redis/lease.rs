//! Leases on Redis: [`RedisLeaseLimiter`] takes up to `k` units of a hot key
//! in one script call and admits them locally, with the bound "admitted <=
//! burst + rate*d in any interval d" kept exact across any number of
//! instances.
//!
//! # Protocol (details and the bound: `docs/distributed.md`, "Leases")
//!
//! - **Take** (`lua/lease.lua`, mode `t`): one call decides the caller's
//!   unit as a plain check does and, when allowed, sets aside up to
//!   `k - 1` more units for this instance: a token or leaky bucket
//!   *reserves* them (a field `l:<id> = "units:end"` in the key's hash,
//!   which every check subtracts from what it sees free); a fixed window
//!   counts them in the current window. The reply carries the server's
//!   time `s0` and the lease's end `E` (GCRA: `s0 + life`; window: the
//!   window's end).
//! - **Local use**: the instance admits from the lease while it has units
//!   and `elapsed * (1 + 1/1024) < E - s0`, with `elapsed` measured on this
//!   process's monotonic clock from *before* the call was sent. The server's
//!   time at any later moment is at most `s0 + elapsed` (the script ran
//!   after the send), so client/server clock skew can only shorten a lease;
//!   the 1/1024 covers the two clocks' rates differing by up to ~1000 ppm.
//! - **Release**: unused units go back by a call (`release_key`, or piggybacked
//!   on the next take of the key); the used ones are charged then. A GCRA
//!   lease nobody released is charged in full at its end, by whatever call
//!   comes next; a window lease simply ends with its window.
//!
//! Lease sizes adapt per key: 1 unit (a plain check) while this instance
//! checks the key less often than once per `hot_gap`, doubling at each take
//! that comes within `hot_gap * k` of the previous one, up to `max_lease`,
//! and halving otherwise.

use super::door;
use super::fault::{bad_reply, Fault};
use super::limiter::RedisLimiter;
use super::wire::{parse_lease, LeaseCall, LeaseReply};
use super::{DecisionSource, RedisDecision, RedisError};
use crate::decision::Decision;
use crate::error::ConfigError;
use crate::policy::PolicyAlgorithm;
use crate::sync::{lock, AtomicU64, Mutex, Ordering};
use redis::Value;
use std::collections::HashMap;
use std::fmt;
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// Shards of the local lease table (fewer when `max_keys` is small).
const SHARDS: usize = 16;
/// Entries looked at to find one to evict when a shard is full.
const EVICT_SCAN: usize = 64;

/// How a [`RedisLeaseLimiter`] leases: the largest lease, when a key is
/// hot, how long a lease lives, and how many keys hold leases at once.
///
/// # Example
///
/// ```
/// use ratewall::redis::RedisLeaseOptions;
/// use std::time::Duration;
///
/// let o = RedisLeaseOptions::new().max_lease(32).hot_gap(Duration::from_micros(500));
/// assert_eq!(o.get_max_lease(), 32);
/// assert_eq!(RedisLeaseOptions::default().get_max_lease(), 16);
/// ```
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RedisLeaseOptions {
    max_lease: u64,
    hot_gap: Duration,
    life: Duration,
    max_keys: usize,
}

impl Default for RedisLeaseOptions {
    fn default() -> Self {
        Self::new()
    }
}

impl RedisLeaseOptions {
    /// The defaults: leases of at most 16 units, a hot gap of 1 ms (a key
    /// this instance checks less than 1000 times a second is checked one
    /// unit per round trip, as without leases), leases living 100 ms on a
    /// bucket (a window lease ends with its window), and 65,536 keys.
    ///
    /// ```
    /// # use ratewall::redis::RedisLeaseOptions;
    /// let _ = RedisLeaseOptions::new();
    /// ```
    pub const fn new() -> Self {
        RedisLeaseOptions {
            max_lease: 16,
            hot_gap: Duration::from_millis(1),
            life: Duration::from_millis(100),
            max_keys: 65_536,
        }
    }

    /// The largest lease, in units (1 to the policy's limit). 1 turns
    /// leasing off: every check is one round trip.
    ///
    /// ```
    /// # use ratewall::redis::RedisLeaseOptions;
    /// assert_eq!(RedisLeaseOptions::new().max_lease(4).get_max_lease(), 4);
    /// ```
    #[must_use]
    pub const fn max_lease(mut self, units: u64) -> Self {
        self.max_lease = units;
        self
    }

    /// The largest lease.
    ///
    /// ```
    /// # use ratewall::redis::RedisLeaseOptions;
    /// assert_eq!(RedisLeaseOptions::new().get_max_lease(), 16);
    /// ```
    pub const fn get_max_lease(&self) -> u64 {
        self.max_lease
    }

    /// The adaptation threshold, per unit: a take of a key that comes
    /// within `hot_gap * k` of this instance's previous take of it (a lease
    /// of `k`) doubles the next lease, up to the largest; any other take
    /// halves it, down to 1 unit.
    ///
    /// ```
    /// # use ratewall::redis::RedisLeaseOptions;
    /// let o = RedisLeaseOptions::new().hot_gap(std::time::Duration::from_micros(200));
    /// ```
    #[must_use]
    pub const fn hot_gap(mut self, gap: Duration) -> Self {
        self.hot_gap = gap;
        self
    }

    /// How long a token or leaky bucket lease lives on the server (1 ms to
    /// 1 hour; default 100 ms). Units a holder neither used nor released by
    /// then are charged as used at that moment. A fixed-window lease ends
    /// with its window instead.
    ///
    /// ```
    /// # use ratewall::redis::RedisLeaseOptions;
    /// let o = RedisLeaseOptions::new().life(std::time::Duration::from_millis(20));
    /// ```
    #[must_use]
    pub const fn life(mut self, life: Duration) -> Self {
        self.life = life;
        self
    }

    /// The most keys this instance holds leases for (default 65,536). When
    /// full, a key with no usable lease is forgotten first; a key evicted
    /// with a usable lease loses it (its units are charged when it ends).
    ///
    /// ```
    /// # use ratewall::redis::RedisLeaseOptions;
    /// let o = RedisLeaseOptions::new().max_keys(1024);
    /// ```
    #[must_use]
    pub const fn max_keys(mut self, max_keys: usize) -> Self {
        self.max_keys = max_keys;
        self
    }
}

/// Which lease script branch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Algo {
    Gcra,
    Fixed,
}

impl Algo {
    fn arg(self) -> &'static str {
        match self {
            Algo::Gcra => "g",
            Algo::Fixed => "f",
        }
    }
}

/// A lease this instance holds for one key.
#[derive(Clone, Copy, Debug)]
struct Held {
    /// Its id on the server (GCRA).
    id: u64,
    /// Units the take set aside.
    granted: u64,
    /// Units not used yet.
    units: u64,
    /// This process's clock just before the take was sent.
    sent: Instant,
    /// The lease's end minus the server's time of the take, in ns.
    span: u64,
    /// The take's `reset_after`, in ns.
    reset: u64,
    /// The window id (fixed window).
    window: u64,
}

impl Held {
    /// The server time elapsed since the take, over-estimated: this
    /// process's elapsed time plus 1/1024 of it for clock-rate drift.
    fn elapsed(&self, now: Instant) -> u64 {
        let e = now.saturating_duration_since(self.sent).as_nanos() as u64;
        e.saturating_add(e / 1024 + 1)
    }

    /// Units usable at `now`: none once the lease may have ended.
    fn usable(&self, now: Instant) -> u64 {
        if self.elapsed(now) < self.span {
            self.units
        } else {
            0
        }
    }
}

/// What a take in flight ended with, for the checks that waited on it.
#[derive(Clone, Debug)]
enum Outcome {
    /// A lease may be installed: look again.
    Granted,
    /// Denied by Redis; the decision and when its call was sent.
    Denied(Decision, Instant),
    /// The call failed.
    Failed(RedisError),
}

#[derive(Debug, Default)]
struct Entry {
    lease: Option<Held>,
    /// The next lease size.
    size: u64,
    /// When this instance's last successful take of the key was sent.
    last_take: Option<Instant>,
    /// A take in flight: its id and where its outcome is published.
    taking: Option<(u64, watch::Receiver<Option<Outcome>>)>,
}

struct Shard {
    map: HashMap<Vec<u8>, Entry, ahash::RandomState>,
    cap: usize,
}

/// What a check does after looking at its key's entry.
enum Step {
    Done(RedisDecision),
    Wait(watch::Receiver<Option<Outcome>>),
    Take(Take),
}

struct Take {
    id: u64,
    extra: u64,
    size: u64,
    prev: Option<(u64, u64)>,
    tx: watch::Sender<Option<Outcome>>,
    /// Whether the key has an entry to update.
    tracked: bool,
    /// Whether other checks wait for this take (it may grant a lease).
    waits: bool,
}

/// A [`RedisLimiter`] whose hot keys are checked from **leases**: one
/// script call takes the caller's unit and up to `k - 1` more for this
/// instance, which then admits them locally ([`DecisionSource::Lease`])
/// until they run out or the lease ends. The bound "admitted <= burst +
/// rate x d in any interval d" (a window's limit per window) stays exact
/// across any number of instances and holders; the only cost is that units
/// one instance holds cannot serve another until used, released or ended
/// (see `docs/distributed.md`, "Leases").
///
/// Offered for the token bucket, the leaky bucket (as a meter: the same
/// GCRA) and the fixed window; not for the sliding window counter or log,
/// nor soft policies ([`RedisError::Unsupported`]). Leases adapt per key: a
/// key this instance checks less than once per `hot_gap` is checked one
/// unit per round trip, as by the plain limiter.
///
/// Its verbs are [`RedisLimiter`]'s (`check_key`, `check_key_n`,
/// `reset_key`), plus `release_key` (give back one key's unused lease) and
/// `release_all`; it has no peek or refund (a lease's units are admitted
/// locally, so there is no one shared state to peek at or refund into).
///
/// The wrapped limiter's name, failure policy and deny cache apply. A
/// bucket's key holds a hash here (the TAT and the live leases), so a plain
/// [`RedisLimiter`] on the same key name gets a typed error
/// ([`RedisError::Server`]); give the leased limit a name of its own. A
/// fixed window keeps the plain state, so plain and leased instances can
/// share it.
///
/// # Example
///
/// ```
/// use ratewall::redis::{RedisBackend, RedisLeaseLimiter, RedisLeaseOptions, RedisLimiter};
/// use ratewall::{Policy, Rate};
///
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let redis = RedisBackend::builder("redis://127.0.0.1:6379").build()?;
/// let global = RedisLimiter::builder(Policy::token_bucket(Rate::per_second(100_000).burst(1000)), &redis)
///     .name("global")
///     .build()?;
/// let global = RedisLeaseLimiter::new(global, RedisLeaseOptions::new().max_lease(16))?;
/// assert_eq!(global.options().get_max_lease(), 16);
/// // With a server running:
/// // let d = global.check_key(b"all").await?;   // DecisionSource::Lease when served locally
/// # Ok::<(), ratewall::redis::RedisError>(()) }).unwrap();
/// ```
pub struct RedisLeaseLimiter {
    limiter: RedisLimiter,
    options: RedisLeaseOptions,
    algo: Algo,
    /// The lease life in us (GCRA).
    life_us: u64,
    shards: Box<[Mutex<Shard>]>,
    hasher: ahash::RandomState,
    /// This instance's part of every lease id.
    instance: u64,
    next_id: AtomicU64,
    round_trips: AtomicU64,
}

impl RedisLeaseLimiter {
    /// Leases on `limiter`'s keys. Errors: a policy other than a token
    /// bucket, leaky bucket or fixed window, or a soft one
    /// ([`RedisError::Unsupported`]); a largest lease of 0 or above the
    /// limit, a life outside 1 ms to 1 hour, or `max_keys` of 0 or above
    /// [`MAX_KEYS`](crate::keyed::MAX_KEYS) ([`RedisError::Config`]).
    ///
    /// ```
    /// # use ratewall::redis::{RedisBackend, RedisError, RedisLeaseLimiter, RedisLeaseOptions, RedisLimiter};
    /// # use ratewall::{Policy, Window};
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let redis = RedisBackend::builder("redis://127.0.0.1:6379").build()?;
    /// let log = RedisLimiter::builder(Policy::sliding_window_log(Window::per_second(10)), &redis).build()?;
    /// assert!(matches!(RedisLeaseLimiter::new(log, RedisLeaseOptions::new()), Err(RedisError::Unsupported { .. })));
    /// # Ok::<(), ratewall::redis::RedisError>(()) }).unwrap();
    /// ```
    pub fn new(limiter: RedisLimiter, options: RedisLeaseOptions) -> Result<Self, RedisError> {
        let policy = limiter.policy();
        let algo = match policy.algorithm() {
            PolicyAlgorithm::TokenBucket | PolicyAlgorithm::LeakyBucket => Algo::Gcra,
            PolicyAlgorithm::FixedWindow => Algo::Fixed,
            _ => {
                return Err(RedisError::Unsupported {
                    reason: "leases are offered for token buckets, leaky buckets and fixed windows; a sliding window counter or log checks every request on Redis",
                })
            }
        };
        if policy.tolerance().is_some() {
            return Err(RedisError::Unsupported {
                reason: "leases do not take soft policies; use a hard policy (or no lease)",
            });
        }
        let limit = limiter.program().limit;
        if options.max_lease == 0 || options.max_lease > limit {
            return Err(RedisError::Config(ConfigError::Incompatible {
                reason: "the largest lease must be between 1 and the policy's limit (burst)",
            }));
        }
        if options.life < Duration::from_millis(1) || options.life > Duration::from_secs(3600) {
            return Err(RedisError::Config(ConfigError::Incompatible {
                reason: "a lease's life must be between 1 ms and 1 hour",
            }));
        }
        if options.max_keys == 0 || options.max_keys > crate::keyed::MAX_KEYS {
            return Err(RedisError::Config(ConfigError::InvalidCapacity {
                max_keys: options.max_keys,
                max: crate::keyed::MAX_KEYS,
            }));
        }
        let shards = SHARDS.min(options.max_keys);
        let cap = options.max_keys.div_ceil(shards);
        let hasher = ahash::RandomState::new();
        let instance = hasher.hash_one(std::process::id()) ^ hasher.hash_one(Instant::now());
        Ok(RedisLeaseLimiter {
            limiter,
            options,
            algo,
            life_us: options.life.as_micros() as u64,
            shards: (0..shards)
                .map(|_| {
                    Mutex::new(Shard {
                        map: HashMap::with_hasher(ahash::RandomState::new()),
                        cap,
                    })
                })
                .collect(),
            hasher,
            instance,
            next_id: AtomicU64::new(1),
            round_trips: AtomicU64::new(0),
        })
    }

    /// The wrapped limiter (its policy, failure policy, key names).
    ///
    /// ```no_run
    /// # use ratewall::redis::{RedisBackend, RedisLeaseLimiter, RedisLeaseOptions, RedisLimiter};
    /// # use ratewall::{Policy, Rate};
    /// # async fn f() -> Result<(), ratewall::redis::RedisError> {
    /// # let redis = RedisBackend::builder("redis://127.0.0.1:6379").build()?;
    /// let l = RedisLeaseLimiter::new(RedisLimiter::builder(Policy::token_bucket(Rate::per_second(50)), &redis).build()?, RedisLeaseOptions::new())?;
    /// assert_eq!(l.limiter().policy().limit(), 50);
    /// # Ok(()) }
    /// ```
    pub fn limiter(&self) -> &RedisLimiter {
        &self.limiter
    }

    /// The lease options.
    ///
    /// ```no_run
    /// # use ratewall::redis::{RedisBackend, RedisLeaseLimiter, RedisLeaseOptions, RedisLimiter};
    /// # use ratewall::{Policy, Rate};
    /// # async fn f() -> Result<(), ratewall::redis::RedisError> {
    /// # let redis = RedisBackend::builder("redis://127.0.0.1:6379").build()?;
    /// let l = RedisLeaseLimiter::new(RedisLimiter::builder(Policy::token_bucket(Rate::per_second(50)), &redis).build()?, RedisLeaseOptions::new())?;
    /// assert_eq!(l.options(), RedisLeaseOptions::new());
    /// # Ok(()) }
    /// ```
    pub fn options(&self) -> RedisLeaseOptions {
        self.options
    }

    /// Script calls this limiter has sent (takes, checks, releases), for
    /// metrics: round trips per admitted request.
    ///
    /// ```no_run
    /// # use ratewall::redis::{RedisBackend, RedisLeaseLimiter, RedisLeaseOptions, RedisLimiter};
    /// # use ratewall::{Policy, Rate};
    /// # async fn f() -> Result<(), ratewall::redis::RedisError> {
    /// # let redis = RedisBackend::builder("redis://127.0.0.1:6379").build()?;
    /// let l = RedisLeaseLimiter::new(RedisLimiter::builder(Policy::token_bucket(Rate::per_second(50)), &redis).build()?, RedisLeaseOptions::new())?;
    /// assert_eq!(l.round_trips(), 0);
    /// # Ok(()) }
    /// ```
    pub fn round_trips(&self) -> u64 {
        // Relaxed: a statistics counter that publishes nothing.
        self.round_trips.load(Ordering::Relaxed)
    }

    /// Units this instance holds for `key` and may still admit now without
    /// a round trip (0 for an unknown key or an ended lease).
    ///
    /// ```no_run
    /// # use ratewall::redis::{RedisBackend, RedisLeaseLimiter, RedisLeaseOptions, RedisLimiter};
    /// # use ratewall::{Policy, Rate};
    /// # async fn f() -> Result<(), ratewall::redis::RedisError> {
    /// # let redis = RedisBackend::builder("redis://127.0.0.1:6379").build()?;
    /// let l = RedisLeaseLimiter::new(RedisLimiter::builder(Policy::token_bucket(Rate::per_second(50)), &redis).build()?, RedisLeaseOptions::new())?;
    /// assert_eq!(l.held(b"k"), 0);
    /// # Ok(()) }
    /// ```
    pub fn held(&self, key: &[u8]) -> u64 {
        let Ok(rkey) = self.limiter.redis_key(key) else {
            return 0;
        };
        let now = Instant::now();
        lock(self.shard(&rkey))
            .map
            .get(&rkey)
            .and_then(|e| e.lease)
            .map_or(0, |h| h.usable(now))
    }

    /// Checks one request for `key`: from this instance's lease if it has
    /// a usable unit ([`DecisionSource::Lease`], no round trip), otherwise
    /// by one script call that may also take a new lease. While a take
    /// that asks for a lease is in flight, other checks of the key wait for
    /// its reply rather than send their own. When Redis cannot answer, units already leased
    /// keep being admitted until their lease ends, and the failure policy
    /// answers the rest. A call that timed out is never retried.
    ///
    /// ```no_run
    /// # use ratewall::redis::{DecisionSource, RedisBackend, RedisLeaseLimiter, RedisLeaseOptions, RedisLimiter};
    /// # use ratewall::{Policy, Rate};
    /// # async fn f() -> Result<(), ratewall::redis::RedisError> {
    /// # let redis = RedisBackend::builder("redis://127.0.0.1:6379").build()?;
    /// let l = RedisLeaseLimiter::new(RedisLimiter::builder(Policy::token_bucket(Rate::per_second(5000)), &redis).name("hot").build()?, RedisLeaseOptions::new())?;
    /// let d = l.check_key(b"all").await?;
    /// if d.source() == DecisionSource::Lease { /* admitted locally */ }
    /// # Ok(()) }
    /// ```
    pub async fn check_key(&self, key: &[u8]) -> Result<RedisDecision, RedisError> {
        self.limiter.validate(key, 1)?;
        let rkey = self.limiter.redis_key(key)?;
        loop {
            let step = self.step(&rkey);
            match step {
                Step::Done(d) => return Ok(self.limiter.decided_here(d)),
                Step::Wait(mut rx) => {
                    let outcome = rx
                        .wait_for(Option::is_some)
                        .await
                        .ok()
                        .and_then(|o| o.clone());
                    match outcome {
                        // Sender gone (its check was cancelled) or granted:
                        // look again.
                        None | Some(Outcome::Granted) => continue,
                        Some(Outcome::Denied(d, sent)) => {
                            // The denial holds until `sent + retry_after`
                            // (measured from before the call: never longer
                            // than Redis said); after that, look again.
                            let gone = sent.elapsed().as_nanos() as u64;
                            let retry = (d.retry_after().as_nanos() as u64).saturating_sub(gone);
                            if retry == 0 {
                                continue;
                            }
                            let reset = (d.reset_after().as_nanos() as u64).saturating_sub(gone);
                            return Ok(self.limiter.decided_here(RedisDecision {
                                decision: Decision::deny(d.limit(), 0, retry, reset.max(retry)),
                                source: DecisionSource::Redis,
                            }));
                        }
                        Some(Outcome::Failed(e @ RedisError::Unavailable { .. })) => {
                            // The check in flight's call, accounted at
                            // the door; this check's answer is the policy's.
                            return door::settle(
                                self.limiter.watch(),
                                Err(e),
                                |retry_in, cause| {
                                    self.limiter.unavailable(key, 1, true, retry_in, cause)
                                },
                            );
                        }
                        Some(Outcome::Failed(e)) => return Err(e),
                    }
                }
                Step::Take(take) => return self.take(key, &rkey, take).await,
            }
        }
    }

    /// Checks a request of cost `n` for `key`: `n <= 1` is [`check_key`](Self::check_key);
    /// a larger cost is one script call that takes no lease (and does not
    /// use this instance's lease).
    ///
    /// ```no_run
    /// # use ratewall::redis::{RedisBackend, RedisLeaseLimiter, RedisLeaseOptions, RedisLimiter};
    /// # use ratewall::{Policy, Rate};
    /// # async fn f() -> Result<(), ratewall::redis::RedisError> {
    /// # let redis = RedisBackend::builder("redis://127.0.0.1:6379").build()?;
    /// let l = RedisLeaseLimiter::new(RedisLimiter::builder(Policy::token_bucket(Rate::per_second(50)), &redis).build()?, RedisLeaseOptions::new())?;
    /// let d = l.check_key_n(b"user:1", 5).await?;
    /// # Ok(()) }
    /// ```
    pub async fn check_key_n(&self, key: &[u8], n: u64) -> Result<RedisDecision, RedisError> {
        if n <= 1 {
            return self.check_key(key).await;
        }
        self.limiter.validate(key, n)?;
        let rkey = self.limiter.redis_key(key)?;
        if let Some(left) = self.limiter.denied_for(&rkey) {
            return Ok(self.limiter.decided_here(RedisDecision {
                decision: Decision::deny(self.limiter.program().limit, 0, left, left),
                source: DecisionSource::DenyCache,
            }));
        }
        let got = self.call(&rkey, "t", n, 0, 0, None, read_lease).await;
        self.settle(key, &rkey, n, got)
    }

    /// A lease call's answer to a check of `n` for `key`: Redis's decision
    /// (noted in the deny cache), or the failure policy's, settled at the
    /// door (`door.rs`).
    fn settle(
        &self,
        key: &[u8],
        rkey: &[u8],
        n: u64,
        got: Result<LeaseReply, RedisError>,
    ) -> Result<RedisDecision, RedisError> {
        let got = got.map(|r| {
            self.limiter.note(rkey, n, &r.decision);
            RedisDecision {
                decision: r.decision,
                source: DecisionSource::Redis,
            }
        });
        door::settle(self.limiter.watch(), got, |retry_in, cause| {
            self.limiter.unavailable(key, n, true, retry_in, cause)
        })
    }

    /// Gives back the units this instance holds for `key` and has not used
    /// (one round trip if it holds any). Returns the units given back. If
    /// Redis cannot answer, the error is returned and the units come back
    /// when the lease ends (charged as used).
    ///
    /// ```no_run
    /// # use ratewall::redis::{RedisBackend, RedisLeaseLimiter, RedisLeaseOptions, RedisLimiter};
    /// # use ratewall::{Policy, Rate};
    /// # async fn f() -> Result<(), ratewall::redis::RedisError> {
    /// # let redis = RedisBackend::builder("redis://127.0.0.1:6379").build()?;
    /// let l = RedisLeaseLimiter::new(RedisLimiter::builder(Policy::token_bucket(Rate::per_second(50)), &redis).build()?, RedisLeaseOptions::new())?;
    /// let back = l.release_key(b"user:1").await?;
    /// # Ok(()) }
    /// ```
    pub async fn release_key(&self, key: &[u8]) -> Result<u64, RedisError> {
        let rkey = self.limiter.redis_key(key)?;
        let held = {
            let mut shard = lock(self.shard(&rkey));
            match shard.map.get_mut(&rkey) {
                Some(e) => e.lease.take(),
                None => None,
            }
        };
        // A lease that may have ended here (the estimate is conservative)
        // can still be live on the server, which decides.
        match held {
            Some(h) if h.units > 0 => self.give_back(&rkey, &h).await,
            _ => Ok(0),
        }
    }

    /// Gives back every lease this instance holds (at shutdown, say): one
    /// round trip per key with unused units. Returns the units given back.
    ///
    /// ```no_run
    /// # use ratewall::redis::{RedisBackend, RedisLeaseLimiter, RedisLeaseOptions, RedisLimiter};
    /// # use ratewall::{Policy, Rate};
    /// # async fn f() -> Result<(), ratewall::redis::RedisError> {
    /// # let redis = RedisBackend::builder("redis://127.0.0.1:6379").build()?;
    /// let l = RedisLeaseLimiter::new(RedisLimiter::builder(Policy::token_bucket(Rate::per_second(50)), &redis).build()?, RedisLeaseOptions::new())?;
    /// l.release_all().await?;
    /// # Ok(()) }
    /// ```
    pub async fn release_all(&self) -> Result<u64, RedisError> {
        let mut held = Vec::new();
        for shard in self.shards.iter() {
            let mut shard = lock(shard);
            for (k, e) in shard.map.iter_mut() {
                if let Some(h) = e.lease.take() {
                    if h.units > 0 {
                        held.push((k.clone(), h));
                    }
                }
            }
        }
        let mut total = 0;
        let mut first_err = None;
        for (rkey, h) in held {
            match self.give_back(&rkey, &h).await {
                Ok(n) => total += n,
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(total),
        }
    }

    /// Forgets `key`: this instance's lease, its state in Redis (every
    /// instance's leases of it included), and the fallback's. Returns the
    /// error if Redis cannot answer.
    ///
    /// ```no_run
    /// # use ratewall::redis::{RedisBackend, RedisLeaseLimiter, RedisLeaseOptions, RedisLimiter};
    /// # use ratewall::{Policy, Rate};
    /// # async fn f() -> Result<(), ratewall::redis::RedisError> {
    /// # let redis = RedisBackend::builder("redis://127.0.0.1:6379").build()?;
    /// let l = RedisLeaseLimiter::new(RedisLimiter::builder(Policy::token_bucket(Rate::per_second(50)), &redis).build()?, RedisLeaseOptions::new())?;
    /// l.reset_key(b"user:1").await?;
    /// # Ok(()) }
    /// ```
    pub async fn reset_key(&self, key: &[u8]) -> Result<(), RedisError> {
        let rkey = self.limiter.redis_key(key)?;
        if let Some(e) = lock(self.shard(&rkey)).map.get_mut(&rkey) {
            e.lease = None;
        }
        self.limiter.reset_key(key).await
    }

    fn shard(&self, rkey: &[u8]) -> &Mutex<Shard> {
        let i = self.hasher.hash_one(rkey) as usize % self.shards.len();
        &self.shards[i]
    }

    /// Looks at `rkey`'s entry: a unit from the lease, a denial from the
    /// deny cache, a take in flight to wait for, or a take to make.
    fn step(&self, rkey: &[u8]) -> Step {
        let now = Instant::now();
        let limit = self.limiter.program().limit;
        let mut guard = lock(self.shard(rkey));
        let shard = &mut *guard;
        if !shard.map.contains_key(rkey) {
            if !shard.make_room(now) {
                // No room: a plain check, with no lease.
                let (tx, _) = watch::channel(None);
                return Step::Take(Take {
                    id: 0,
                    extra: 0,
                    size: 1,
                    prev: None,
                    tx,
                    tracked: false,
                    waits: false,
                });
            }
            shard.map.insert(
                rkey.to_vec(),
                Entry {
                    size: 1,
                    ..Entry::default()
                },
            );
        }
        // Looked up again rather than through `entry`, which would copy
        // the key on every check.
        let Some(e) = shard.map.get_mut(rkey) else {
            unreachable!("the entry was inserted above")
        };
        if let Some(h) = &mut e.lease {
            if h.usable(now) > 0 {
                h.units -= 1;
                let reset = h.reset.saturating_sub(h.elapsed(now));
                return Step::Done(RedisDecision {
                    decision: Decision::allow(limit, h.units, reset),
                    source: DecisionSource::Lease,
                });
            }
        }
        if let Some((_, rx)) = &e.taking {
            return Step::Wait(rx.clone());
        }
        if let Some(left) = self.limiter.denied_for(rkey) {
            return Step::Done(RedisDecision {
                decision: Decision::deny(limit, 0, left, left),
                source: DecisionSource::DenyCache,
            });
        }
        // Adaptation: within `hot_gap * k` of the previous take, double;
        // otherwise halve.
        let hot = e.last_take.is_some_and(|t| {
            now.saturating_duration_since(t)
                < self
                    .options
                    .hot_gap
                    .saturating_mul(e.size.min(u64::from(u32::MAX)) as u32)
        });
        let size = if hot {
            (e.size * 2).min(self.options.max_lease)
        } else {
            (e.size / 2).max(1)
        };
        // The previous lease (empty or ended here) is reported with this
        // take: its unused units, if the server still holds them, go back.
        let prev = match (e.lease.take(), self.algo) {
            (Some(h), Algo::Gcra) => Some((h.id, h.granted - h.units)),
            _ => None,
        };
        // Relaxed: a unique-id counter that publishes nothing.
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = watch::channel(None);
        // A take of one unit grants no lease: concurrent checks send their
        // own (pipelined, as the plain limiter's) instead of waiting.
        let waits = size > 1;
        if waits {
            e.taking = Some((id, rx));
        }
        Step::Take(Take {
            id,
            extra: size - 1,
            size,
            prev,
            tx,
            tracked: true,
            waits,
        })
    }

    /// Sends a take and installs what it grants.
    async fn take(&self, key: &[u8], rkey: &[u8], take: Take) -> Result<RedisDecision, RedisError> {
        // If this future is dropped mid-call, the entry's take is cleared
        // (the dropped sender wakes the waiters, who look again). Units a
        // lost reply granted are charged when their lease ends.
        let mut guard = TakeGuard {
            limiter: self,
            rkey,
            id: take.id,
            armed: take.waits,
        };
        let sent = Instant::now();
        let parsed = self
            .call(rkey, "t", 1, take.extra, take.id, take.prev, read_lease)
            .await;
        let outcome = match &parsed {
            Ok(r) if r.decision.is_allowed() => Outcome::Granted,
            Ok(r) => Outcome::Denied(r.decision, sent),
            Err(e) => Outcome::Failed(e.clone()),
        };
        if take.tracked {
            let mut shard = lock(self.shard(rkey));
            if let Some(e) = shard.map.get_mut(rkey) {
                if e.taking.as_ref().is_some_and(|(id, _)| *id == take.id) {
                    e.taking = None;
                }
                if let Ok(r) = &parsed {
                    if r.decision.is_allowed() {
                        e.size = take.size;
                        e.last_take = Some(sent);
                        if r.granted > 0 {
                            e.lease = Some(Held {
                                id: take.id,
                                granted: r.granted,
                                units: r.granted,
                                sent,
                                span: r.end_us.saturating_sub(r.now_us).saturating_mul(1000),
                                reset: r.decision.reset_after().as_nanos() as u64,
                                window: r.window,
                            });
                        }
                    }
                }
            }
            guard.armed = false;
        }
        drop(guard);
        // Waiters see the outcome (none may be waiting: no error then).
        let _ = take.tx.send(Some(outcome));
        self.settle(key, rkey, 1, parsed)
    }

    /// Releases `h` (already removed from the table).
    async fn give_back(&self, rkey: &[u8], h: &Held) -> Result<u64, RedisError> {
        let used = h.granted - h.units;
        let (n, extra, id) = match self.algo {
            Algo::Gcra => (used, h.granted, h.id),
            Algo::Fixed => (used, h.granted, h.window),
        };
        // 1 if the units were given back, 0 if the lease had ended.
        let read = |v: Value| match v {
            Value::Int(r @ (0 | 1)) => Ok(r == 1),
            other => Err(bad_reply("lease release", &other)),
        };
        if self.call(rkey, "r", n, extra, id, None, read).await? {
            self.limiter.clear_denial(rkey);
            Ok(h.units)
        } else {
            Ok(0)
        }
    }

    /// One call of the lease script.
    #[allow(clippy::too_many_arguments)]
    async fn call<T>(
        &self,
        rkey: &[u8],
        mode: &'static str,
        n: u64,
        extra: u64,
        id: u64,
        prev: Option<(u64, u64)>,
        read: impl FnOnce(Value) -> Result<T, Fault>,
    ) -> Result<T, RedisError> {
        let invocation = LeaseCall {
            key: rkey,
            algo: self.algo.arg(),
            mode,
            n,
            extra,
            params: self.limiter.program().params,
            life_us: self.life_us,
            id: self.lease_id(id),
            prev: prev.map(|(pid, used)| (self.lease_id(pid), used)),
        }
        .invocation();
        // Relaxed: a statistics counter that publishes nothing.
        self.round_trips.fetch_add(1, Ordering::Relaxed);
        self.limiter
            .backend()
            .invoke(&[self.limiter.watch()], &invocation, read)
            .await
    }

    /// A lease id unique across instances: this instance's random part and
    /// a counter (a fixed window's release passes its window id instead).
    fn lease_id(&self, id: u64) -> String {
        match self.algo {
            Algo::Gcra => format!("{:x}.{id}", self.instance),
            Algo::Fixed => id.to_string(),
        }
    }
}

/// Clears an entry's take in flight if the check that made it is dropped.
struct TakeGuard<'a> {
    limiter: &'a RedisLeaseLimiter,
    rkey: &'a [u8],
    id: u64,
    armed: bool,
}

impl Drop for TakeGuard<'_> {
    fn drop(&mut self) {
        if self.armed {
            let mut shard = lock(self.limiter.shard(self.rkey));
            if let Some(e) = shard.map.get_mut(self.rkey) {
                if e.taking.as_ref().is_some_and(|(id, _)| *id == self.id) {
                    e.taking = None;
                }
            }
        }
    }
}

impl Shard {
    /// Makes room for one more key if the shard is full: forgets a key
    /// with no usable lease and no take in flight, else one with a usable
    /// lease (its units are lost until the lease ends). False if every key
    /// looked at has a take in flight.
    fn make_room(&mut self, now: Instant) -> bool {
        if self.map.len() < self.cap {
            return true;
        }
        let mut fallback = None;
        let mut victim = None;
        for (k, e) in self.map.iter().take(EVICT_SCAN) {
            if e.taking.is_some() {
                continue;
            }
            if e.lease.map_or(true, |h| h.usable(now) == 0) {
                victim = Some(k.clone());
                break;
            }
            if fallback.is_none() {
                fallback = Some(k.clone());
            }
        }
        match victim.or(fallback) {
            Some(k) => {
                self.map.remove(&k);
                true
            }
            None => false,
        }
    }
}

/// A take's or peek's reply (`lua/lease.lua`), read.
fn read_lease(v: Value) -> Result<LeaseReply, Fault> {
    parse_lease(&v)
}

impl fmt::Debug for RedisLeaseLimiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisLeaseLimiter")
            .field("limiter", &self.limiter)
            .field("options", &self.options)
            .field("round_trips", &self.round_trips())
            .finish()
    }
}

#[cfg(test)]
#[path = "lease_tests.rs"]
mod tests;
