//! Keyed limiters: one limit per key (user, IP address, route, tuple of
//! them) in a bounded, lock-free table.
//!
//! The table (`table.rs`) keeps, per key, a 16-byte slot: the key's 64-bit
//! hash as its fingerprint, and the algorithm's state word. A check of a key
//! already tracked takes no lock and writes nothing but that slot (a denial
//! writes nothing at all). A new key takes its shard's mutex to claim a slot,
//! and reclaims idle keys on its way. See `docs/design.md`, "Keyed table".

mod log;
pub(crate) mod table;

pub use log::{KeyedLogRef, KeyedSlidingWindowLog};

use crate::algo::{Algorithm, FixedCounter, Gcra, LeakyGcra, SlidingCounter, WordStep};
use crate::clock::{Clock, Timebase};
use crate::decision::{Decision, Tracking};
use crate::error::{ConfigError, InsufficientCapacity};
use crate::limiter::DefaultClock;
use crate::quota::HORIZON;
use crate::sync::{lock, AtomicU64, Mutex, Ordering};
use crate::word::ParamCell;
use crossbeam_utils::CachePadded;
use std::borrow::Borrow;
use std::collections::HashMap;
use std::fmt;
use std::hash::Hash;
use std::marker::PhantomData;
use table::{Full, Inserted, Room, StateView, Table};

/// The largest `max_keys` accepted (2^32 keys, about 90 GiB of table).
pub const MAX_KEYS: usize = 1 << 32;
const MAX_SHARDS: usize = 1 << 16;
const DEFAULT_MAX_KEYS: usize = 1 << 16;
const DEFAULT_SHARDS: usize = 64;

/// What a keyed limiter does with a new key when the table is full of
/// active keys (keys whose state differs from a fresh key's).
///
/// The decision reports which one acted through [`Decision::tracking`].
///
/// # Example
///
/// ```
/// use ratewall::{KeyedTokenBucket, ManualClock, Rate, Tracking, WhenFull};
///
/// let limiter = KeyedTokenBucket::<u32, _>::builder(Rate::per_second(1))
///     .max_keys(1)
///     .when_full(WhenFull::AdmitUntracked)
///     .clock(ManualClock::new())
///     .build()?;
/// assert_eq!(limiter.check_key(&1).tracking(), Tracking::Tracked);
/// let second = limiter.check_key(&2);
/// assert!(second.is_allowed());
/// assert_eq!(second.tracking(), Tracking::Untracked);
/// # Ok::<(), ratewall::ConfigError>(())
/// ```
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum WhenFull {
    /// Deny the new key without tracking it (fail closed): an attacker
    /// spraying keys cannot push out the keys already limited. The
    /// rejection's `retry_after` is the time until the first active key in
    /// the new key's way goes idle: a check then is admitted.
    #[default]
    RejectNew,
    /// Allow the new key's request without tracking it (fail open).
    AdmitUntracked,
    /// Evict an active key with the least time to idle (the time until its
    /// state equals a fresh key's: the least recently active by the
    /// algorithm's own measure) among the new key's neighbours, and track
    /// the new key in its place. The neighbours are the whole table for one
    /// shard of `max_keys <= 22`, else the key's 32-slot probe window (and
    /// its shard's small overflow stash when that window holds no empty
    /// slot), or, if the window holds no key, the next slots of its shard;
    /// the keyed sliding log compares up to 32 keys of the shard.
    ///
    /// ```
    /// use ratewall::{KeyedTokenBucket, ManualClock, Rate, Tracking, WhenFull};
    ///
    /// let l = KeyedTokenBucket::<u32, _>::builder(Rate::per_second(1).burst(10))
    ///     .max_keys(2)
    ///     .when_full(WhenFull::EvictLeastRecent)
    ///     .clock(ManualClock::new())
    ///     .build()?;
    /// let _ = l.check_key_n(&1, 5).unwrap(); // idle in 5 s
    /// let _ = l.check_key_n(&2, 2).unwrap(); // idle in 2 s: the victim
    /// assert_eq!(l.check_key(&3).tracking(), Tracking::EvictedOther);
    /// assert_eq!(l.peek_key(&1).remaining(), 4); // still held
    /// assert_eq!(l.peek_key(&2).remaining(), 9); // fresh again
    /// # Ok::<(), ratewall::ConfigError>(())
    /// ```
    EvictLeastRecent,
}

/// An algorithm a [`KeyedLimiter`] can use: every single-word algorithm
/// (the GCRA buckets and the window counters). Sealed.
///
/// # Example
///
/// ```
/// use ratewall::{algorithm::{Gcra, KeyedAlgorithm}, KeyedLimiter};
///
/// fn name<A: KeyedAlgorithm>(_: &KeyedLimiter<u64, A>) -> &'static str { A::NAME }
/// let limiter = KeyedLimiter::<u64, Gcra>::builder(ratewall::Rate::per_second(5)).build().unwrap();
/// assert_eq!(name(&limiter), "token bucket");
/// ```
pub trait KeyedAlgorithm: Algorithm + sealed::KeyedCore {}

pub(crate) mod sealed {
    use crate::decision::Decision;

    /// The pure single-word step, as the keyed table runs it.
    pub trait KeyedCore: Copy {
        fn k_capacity(&self) -> u64;
        fn k_step(&self, state: u64, now: u64, n: u64) -> (Decision, Option<u64>);
        fn k_refund(&self, state: u64, now: u64, n: u64) -> Option<u64>;
        fn k_rescale(&self, old: &Self, state: u64, now: u64) -> u64;
        fn k_is_idle(&self, state: u64, now: u64) -> bool;
        fn k_time_to_idle(&self, state: u64, now: u64) -> u64;
    }
}

impl<A: Algorithm + WordStep> sealed::KeyedCore for A {
    #[inline]
    fn k_capacity(&self) -> u64 {
        WordStep::capacity(self)
    }
    #[inline]
    fn k_step(&self, state: u64, now: u64, n: u64) -> (Decision, Option<u64>) {
        WordStep::step(self, state, now, n)
    }
    #[inline]
    fn k_refund(&self, state: u64, now: u64, n: u64) -> Option<u64> {
        WordStep::refund(self, state, now, n)
    }
    fn k_rescale(&self, old: &Self, state: u64, now: u64) -> u64 {
        WordStep::rescale(self, old, state, now)
    }
    #[inline]
    fn k_is_idle(&self, state: u64, now: u64) -> bool {
        WordStep::is_idle(self, state, now)
    }
    #[inline]
    fn k_time_to_idle(&self, state: u64, now: u64) -> u64 {
        WordStep::time_to_idle(self, state, now)
    }
}

impl<A: Algorithm + WordStep> KeyedAlgorithm for A {}

/// A keyed token bucket: one GCRA bucket per key.
///
/// # Example
///
/// ```
/// use ratewall::{KeyedTokenBucket, Rate};
/// use std::net::IpAddr;
///
/// let per_ip = KeyedTokenBucket::<IpAddr>::builder(Rate::per_second(10).burst(2))
///     .max_keys(100_000)
///     .build()?;
/// let ip: IpAddr = "192.0.2.7".parse().unwrap();
/// assert!(per_ip.check_key(&ip).is_allowed());
/// # Ok::<(), ratewall::ConfigError>(())
/// ```
pub type KeyedTokenBucket<K, C = DefaultClock> = KeyedLimiter<K, Gcra, C>;

/// A keyed leaky bucket (policing): one GCRA meter per key.
///
/// # Example
///
/// ```
/// use ratewall::{KeyedLeakyBucket, Rate};
///
/// let per_user = KeyedLeakyBucket::<String>::builder(Rate::per_second(5).burst(5)).build()?;
/// assert!(per_user.check_key("alice").is_allowed());
/// # Ok::<(), ratewall::ConfigError>(())
/// ```
pub type KeyedLeakyBucket<K, C = DefaultClock> = KeyedLimiter<K, LeakyGcra, C>;

/// A keyed fixed window: one window counter per key.
///
/// # Example
///
/// ```
/// use ratewall::{KeyedFixedWindow, Window};
/// use std::time::Duration;
///
/// let per_user = KeyedFixedWindow::<u64>::builder(Window::new(2, Duration::from_secs(60))).build()?;
/// assert!(per_user.check_key(&1).is_allowed());
/// assert!(per_user.check_key(&1).is_allowed());
/// assert!(!per_user.check_key(&1).is_allowed());
/// # Ok::<(), ratewall::ConfigError>(())
/// ```
pub type KeyedFixedWindow<K, C = DefaultClock> = KeyedLimiter<K, FixedCounter, C>;

/// A keyed sliding-window counter: one counter pair per key.
///
/// # Example
///
/// ```
/// use ratewall::{KeyedSlidingWindowCounter, Window};
/// use std::time::Duration;
///
/// let per_ip = KeyedSlidingWindowCounter::<[u8; 4]>::builder(Window::new(100, Duration::from_secs(1))).build()?;
/// assert!(per_ip.check_key(&[192, 0, 2, 1]).is_allowed());
/// # Ok::<(), ratewall::ConfigError>(())
/// ```
pub type KeyedSlidingWindowCounter<K, C = DefaultClock> = KeyedLimiter<K, SlidingCounter, C>;

/// One limit per key, for any key type `K: Hash + Eq` (tuples included),
/// with memory bounded by `max_keys`.
///
/// - A check of a tracked key is lock-free: one hash, a short probe, one
///   16-byte compare-exchange on the key's own slot; a denial writes nothing.
/// - Keys are identified by a 64-bit seeded hash (`ahash`); no key is
///   stored, so memory is 24 bytes per key of `max_keys` (small tables add
///   their headers) whatever the key type, and `max_keys` distinct keys
///   always fit. Two keys whose hashes collide (probability about 2^-64
///   per pair, with a per-process random seed) share one limit.
/// - A key whose state equals a fresh key's carries no information and may
///   be reclaimed at any time; inserts reclaim such keys as they go.
/// - When the table is full of active keys, [`WhenFull`] decides.
///
/// # Example
///
/// ```
/// use ratewall::{KeyedTokenBucket, ManualClock, Rate};
///
/// let clock = ManualClock::new();
/// let limiter = KeyedTokenBucket::<(u32, &str), _>::builder(Rate::per_second(1).burst(1))
///     .clock(clock.clone())
///     .build()?;
/// assert!(limiter.check_key(&(7, "/login")).is_allowed());
/// assert!(!limiter.check_key(&(7, "/login")).is_allowed());
/// assert!(limiter.check_key(&(8, "/login")).is_allowed()); // another key
/// assert_eq!(limiter.len(), 2);
/// # Ok::<(), ratewall::ConfigError>(())
/// ```
pub struct KeyedLimiter<K, A: Algorithm, C: Clock = DefaultClock> {
    table: Table,
    params: CachePadded<ParamCell>,
    hasher: ahash::RandomState,
    time: Timebase<C>,
    policy: WhenFull,
    /// Serializes quota changes; holds the configuration they were built from.
    config: Mutex<A::Config>,
    /// How many keys have their own quota; 0 keeps the hot path off `overrides`.
    override_count: AtomicU64,
    /// Per-key quotas, by fingerprint.
    overrides: Mutex<HashMap<u64, A>>,
    _key: PhantomData<fn(&K)>,
}

/// Configures a [`KeyedLimiter`]: quota, `max_keys`, shards, policy when
/// full, hash seed and clock.
///
/// # Example
///
/// ```
/// use ratewall::{KeyedTokenBucket, ManualClock, Rate, WhenFull};
///
/// let limiter = KeyedTokenBucket::<u64, _>::builder(Rate::per_minute(60))
///     .max_keys(1_000_000)
///     .shards(128)
///     .when_full(WhenFull::EvictLeastRecent)
///     .seed(42)
///     .clock(ManualClock::new())
///     .build()?;
/// assert_eq!(limiter.max_keys(), 1_000_000);
/// # Ok::<(), ratewall::ConfigError>(())
/// ```
#[must_use = "a builder does nothing until `build`"]
pub struct KeyedBuilder<K, A: Algorithm, C: Clock = DefaultClock> {
    config: A::Config,
    max_keys: usize,
    shards: Option<usize>,
    policy: WhenFull,
    seed: Option<u64>,
    clock: C,
    _key: PhantomData<fn(&K)>,
}

impl<K, A: KeyedAlgorithm> KeyedLimiter<K, A, DefaultClock> {
    /// A builder for the quota `config`, with defaults: 65,536 keys, up to 64
    /// shards, [`WhenFull::RejectNew`], a random seed, the default clock.
    ///
    /// ```
    /// use ratewall::{KeyedTokenBucket, Rate};
    /// let limiter = KeyedTokenBucket::<u64>::builder(Rate::per_second(5)).build()?;
    /// assert!(limiter.check_key(&1).is_allowed());
    /// # Ok::<(), ratewall::ConfigError>(())
    /// ```
    pub fn builder(config: A::Config) -> KeyedBuilder<K, A, DefaultClock> {
        KeyedBuilder::new(config)
    }
}

impl<K, A: Algorithm, C: Clock> KeyedBuilder<K, A, C> {
    /// The most keys tracked at once (1 to 2^32), and the promise that this
    /// many distinct keys fit. Memory is allocated up front: 24 bytes per key
    /// (small tables add a few slots and their headers).
    ///
    /// ```
    /// # use ratewall::{KeyedTokenBucket, Rate};
    /// let l = KeyedTokenBucket::<u64>::builder(Rate::per_second(5)).max_keys(10).build()?;
    /// assert_eq!(l.max_keys(), 10);
    /// # Ok::<(), ratewall::ConfigError>(())
    /// ```
    pub fn max_keys(mut self, max_keys: usize) -> Self {
        self.max_keys = max_keys;
        self
    }

    /// The shard count: a power of two from 1 to 65,536 (default: 64, fewer
    /// for small tables). Inserts of new keys lock one shard; checks of
    /// tracked keys never lock. If larger than `max_keys`, it is reduced to
    /// the largest power of two not above `max_keys`.
    ///
    /// ```
    /// # use ratewall::{ConfigError, KeyedTokenBucket, Rate};
    /// let bad = KeyedTokenBucket::<u64>::builder(Rate::per_second(5)).shards(3).build();
    /// assert_eq!(bad.unwrap_err(), ConfigError::InvalidShards { shards: 3 });
    /// ```
    pub fn shards(mut self, shards: usize) -> Self {
        self.shards = Some(shards);
        self
    }

    /// What happens to a new key when the table is full of active keys.
    ///
    /// ```
    /// # use ratewall::{KeyedTokenBucket, Rate, WhenFull};
    /// let l = KeyedTokenBucket::<u64>::builder(Rate::per_second(5))
    ///     .when_full(WhenFull::AdmitUntracked)
    ///     .build()?;
    /// assert_eq!(l.when_full(), WhenFull::AdmitUntracked);
    /// # Ok::<(), ratewall::ConfigError>(())
    /// ```
    pub fn when_full(mut self, policy: WhenFull) -> Self {
        self.policy = policy;
        self
    }

    /// A fixed hash seed (default: random per limiter). A fixed seed makes
    /// the table's layout reproducible, and lets anyone who knows it craft
    /// colliding keys: keep it secret in production.
    ///
    /// ```
    /// # use ratewall::{KeyedTokenBucket, Rate};
    /// let l = KeyedTokenBucket::<u64>::builder(Rate::per_second(5)).seed(7).build()?;
    /// assert!(l.check_key(&1).is_allowed());
    /// # Ok::<(), ratewall::ConfigError>(())
    /// ```
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// The clock.
    ///
    /// ```
    /// # use ratewall::{Clock, KeyedTokenBucket, ManualClock, Rate};
    /// let l = KeyedTokenBucket::<u64, _>::builder(Rate::per_second(5)).clock(ManualClock::new()).build()?;
    /// assert_eq!(l.clock().now(), 0);
    /// # Ok::<(), ratewall::ConfigError>(())
    /// ```
    pub fn clock<C2: Clock>(self, clock: C2) -> KeyedBuilder<K, A, C2> {
        KeyedBuilder {
            config: self.config,
            max_keys: self.max_keys,
            shards: self.shards,
            policy: self.policy,
            seed: self.seed,
            clock,
            _key: PhantomData,
        }
    }

    /// Validates `max_keys` and the shard count; returns the shard count to
    /// use (shared by every keyed limiter's `build`).
    fn validated_shards(&self) -> Result<usize, ConfigError> {
        if self.max_keys == 0 || self.max_keys > MAX_KEYS {
            return Err(ConfigError::InvalidCapacity {
                max_keys: self.max_keys,
                max: MAX_KEYS,
            });
        }
        let asked = self.shards.unwrap_or(DEFAULT_SHARDS);
        if !asked.is_power_of_two() || asked > MAX_SHARDS {
            return Err(ConfigError::InvalidShards { shards: asked });
        }
        // At most the largest power of two <= max_keys, so every shard has
        // a share of at least one key; by default also at least ~1024 keys
        // per shard.
        let mut shards = asked.min(prev_power_of_two(self.max_keys));
        if self.shards.is_none() {
            shards = shards.min(prev_power_of_two((self.max_keys / 1024).max(1)));
        }
        Ok(shards)
    }

    /// The key hasher: seeded as asked, fixed under loom, random otherwise.
    fn key_hasher(&self) -> ahash::RandomState {
        match self.seed {
            Some(s) => ahash::RandomState::with_seeds(s, s ^ 0x9e37_79b9_7f4a_7c15, 1, 2),
            None if cfg!(ratewall_loom) => ahash::RandomState::with_seeds(0, 1, 2, 3),
            None => ahash::RandomState::new(),
        }
    }
}

impl<K, A: Algorithm> KeyedBuilder<K, A, DefaultClock> {
    pub(crate) fn new(config: A::Config) -> Self {
        KeyedBuilder {
            config,
            max_keys: DEFAULT_MAX_KEYS,
            shards: None,
            policy: WhenFull::default(),
            seed: None,
            clock: DefaultClock::default(),
            _key: PhantomData,
        }
    }
}

impl<K, A: KeyedAlgorithm, C: Clock> KeyedBuilder<K, A, C> {
    /// Validates the configuration and allocates the table.
    ///
    /// ```
    /// # use ratewall::{ConfigError, KeyedTokenBucket, Rate};
    /// let err = KeyedTokenBucket::<u64>::builder(Rate::per_second(5)).max_keys(0).build();
    /// assert!(matches!(err, Err(ConfigError::InvalidCapacity { .. })));
    /// ```
    pub fn build(self) -> Result<KeyedLimiter<K, A, C>, ConfigError> {
        let params = A::from_config(&self.config)?;
        let shards = self.validated_shards()?;
        let hasher = self.key_hasher();
        Ok(KeyedLimiter {
            table: Table::new(self.max_keys, shards),
            params: CachePadded::new(ParamCell::new(params)),
            hasher,
            time: Timebase::new(self.clock),
            policy: self.policy,
            config: Mutex::new(self.config),
            override_count: AtomicU64::new(0),
            overrides: Mutex::new(HashMap::new()),
            _key: PhantomData,
        })
    }
}

fn prev_power_of_two(n: usize) -> usize {
    debug_assert!(n > 0);
    1 << (usize::BITS - 1 - n.leading_zeros())
}

/// The insert path's view of states: idleness and time to idle at `now`.
struct View<A> {
    params: A,
    now: u64,
}

impl<A: KeyedAlgorithm> StateView for View<A> {
    fn is_idle(&self, state: u64) -> bool {
        // Idleness is "equals a fresh state": the same under any quota for
        // the GCRA buckets; the window counters compare window ids.
        self.params.k_is_idle(state, self.now)
    }
    fn time_to_idle(&self, state: u64) -> u64 {
        self.params.k_time_to_idle(state, self.now)
    }
}

impl<K, A: KeyedAlgorithm, C: Clock> KeyedLimiter<K, A, C> {
    #[inline]
    fn hash<Q: Hash + ?Sized>(&self, key: &Q) -> u64 {
        self.hasher.hash_one(key)
    }

    /// The largest cost `key` can ever be admitted at once (its own quota's
    /// if it has one): what a multi-limit check validates before taking.
    pub(crate) fn capacity_for<Q: Hash + ?Sized>(&self, key: &Q) -> u64 {
        self.params_for(self.hash(key)).k_capacity()
    }

    /// The parameters for the key with hash `h`. Called inside the step,
    /// after the slot load (see `ParamCell`).
    #[inline]
    fn params_for(&self, h: u64) -> A {
        // Relaxed: a key's override is inserted before its state is rescaled
        // (AcqRel exchange); a check that loaded the rescaled slot (Acquire)
        // therefore sees the count; one that loaded an older value fails its
        // exchange and comes back here.
        if self.override_count.load(Ordering::Relaxed) != 0 {
            if let Some(a) = lock(&self.overrides).get(&table::fingerprint(h)) {
                return *a;
            }
        }
        self.params.read()
    }

    #[inline]
    fn clamp(&self, now: u64) -> u64 {
        self.time.clamp(now).min(HORIZON)
    }

    /// The core of every check: `consume` takes `n` if allowed.
    #[inline]
    fn run(
        &self,
        h: u64,
        now: u64,
        n: u64,
        consume: bool,
    ) -> Result<Decision, InsufficientCapacity> {
        let take = consume && n > 0;
        // The slot loop only decides the next state and hands back the
        // parameters it read; the decision is built after the exchange from
        // the state the winning step saw (the same pure function of the same
        // inputs), so no decision is stored across the exchange and copied
        // out (a store-forwarding stall on every check, see
        // docs/benchmarks.md). Nothing here is forced inline any more: with
        // plain `#[inline]` the closure and `Table::apply` inline into the
        // check (callgrind counts the same instructions as with
        // `#[inline(always)]`).
        if let Some((a, state)) = self.table.apply(h, &mut |state| {
            let a = self.params_for(h);
            let next = if take && n <= a.k_capacity() {
                a.k_step(state, now, n).1
            } else {
                None
            };
            (a, next)
        }) {
            let capacity = a.k_capacity();
            if n > capacity {
                return Err(InsufficientCapacity {
                    requested: n,
                    capacity,
                });
            }
            // A cost of 0 asks for a unit request's decision, without taking it.
            return Ok(a.k_step(state, now, n.max(1)).0);
        }
        self.run_untracked(h, now, n, take)
    }

    /// One step of the algorithm on `state`, for the insert path.
    #[inline]
    fn step_at(
        &self,
        h: u64,
        state: u64,
        now: u64,
        n: u64,
        take: bool,
    ) -> (Result<Decision, InsufficientCapacity>, Option<u64>) {
        let a = self.params_for(h);
        let capacity = a.k_capacity();
        if n > capacity {
            return (
                Err(InsufficientCapacity {
                    requested: n,
                    capacity,
                }),
                None,
            );
        }
        // A cost of 0 asks for a unit request's decision, without taking it.
        let (d, next) = a.k_step(state, now, n.max(1));
        (Ok(d), if take { next } else { None })
    }

    /// `run` for a key the table does not hold: a fresh key's decision,
    /// stored only if it must be.
    #[cold]
    #[inline(never)]
    fn run_untracked(
        &self,
        h: u64,
        now: u64,
        n: u64,
        take: bool,
    ) -> Result<Decision, InsufficientCapacity> {
        let mut step = |state: u64| self.step_at(h, state, now, n, take);
        let (fresh, next) = step(0);
        if take {
            if next.is_none() {
                return fresh;
            }
            return self.insert(h, now, &mut step);
        }
        // A peek: the decision the check would get, full-table policy
        // included. A check that would store nothing is the fresh decision.
        let fresh = fresh?;
        if n == 0 || self.step_at(h, 0, now, n, true).1.is_none() {
            return Ok(fresh);
        }
        Ok(match self.table.room(h, &self.view(now), self.full()) {
            Room::Tracked => fresh,
            Room::Evict => fresh.with_tracking(Tracking::EvictedOther),
            Room::Full { soonest } => self.when_no_room(fresh, soonest),
        })
    }

    fn view(&self, now: u64) -> View<A> {
        View {
            params: self.params.read::<A>(),
            now,
        }
    }

    fn full(&self) -> Full {
        match self.policy {
            WhenFull::RejectNew => Full::Reject,
            WhenFull::AdmitUntracked => Full::Untracked,
            WhenFull::EvictLeastRecent => Full::Evict,
        }
    }

    /// The decision for a new key that found no room: admitted untracked,
    /// or rejected until the first key in its way goes idle.
    fn when_no_room(&self, fresh: Decision, soonest: u64) -> Decision {
        match self.policy {
            WhenFull::AdmitUntracked => fresh.with_tracking(Tracking::Untracked),
            // RejectNew, or EvictLeastRecent with nothing to evict.
            _ => {
                Decision::deny(fresh.limit(), 0, soonest, soonest).with_tracking(Tracking::Rejected)
            }
        }
    }

    #[cold]
    #[inline(never)]
    fn insert(
        &self,
        h: u64,
        now: u64,
        step: &mut impl FnMut(u64) -> (Result<Decision, InsufficientCapacity>, Option<u64>),
    ) -> Result<Decision, InsufficientCapacity> {
        match self.table.insert(h, step, &self.view(now), self.full()) {
            Inserted::Existing(r) | Inserted::NotStored(r) => r,
            Inserted::New { outcome, evicted } => outcome.map(|d| {
                if evicted {
                    d.with_tracking(Tracking::EvictedOther)
                } else {
                    d
                }
            }),
            Inserted::Full { soonest } => {
                let fresh = step(0).0?;
                Ok(self.when_no_room(fresh, soonest))
            }
        }
    }

    /// Checks one request of cost 1 for `key`, and takes it if allowed.
    ///
    /// ```
    /// # use ratewall::{KeyedTokenBucket, Rate};
    /// let l = KeyedTokenBucket::<String>::builder(Rate::per_hour(2)).build().unwrap();
    /// assert!(l.check_key("bob").is_allowed());
    /// assert!(l.check_key("bob").is_allowed());
    /// assert!(!l.check_key("bob").is_allowed());
    /// ```
    #[inline]
    pub fn check_key<Q>(&self, key: &Q) -> Decision
    where
        K: Borrow<Q>,
        Q: Hash + ?Sized,
    {
        self.check_key_at(key, self.now())
    }

    /// [`check_key`](Self::check_key) at a time the caller read (one clock
    /// read shared by several limiters).
    ///
    /// ```
    /// # use ratewall::{KeyedTokenBucket, ManualClock, Rate};
    /// let l = KeyedTokenBucket::<u64, _>::builder(Rate::per_second(1).burst(1))
    ///     .clock(ManualClock::new()).build().unwrap();
    /// assert!(l.check_key_at(&1, 0).is_allowed());
    /// assert!(l.check_key_at(&1, 1_000_000_000).is_allowed());
    /// ```
    #[inline]
    pub fn check_key_at<Q>(&self, key: &Q, now: u64) -> Decision
    where
        K: Borrow<Q>,
        Q: Hash + ?Sized,
    {
        match self.run(self.hash(key), self.clamp(now), 1, true) {
            Ok(d) => d,
            Err(_) => unreachable_capacity(),
        }
    }

    /// Checks a request of cost `n` for `key` and takes all of it if
    /// allowed. A cost above the capacity is an error.
    ///
    /// ```
    /// # use ratewall::{KeyedTokenBucket, Rate};
    /// let l = KeyedTokenBucket::<u64>::builder(Rate::per_hour(10).burst(10)).build().unwrap();
    /// assert!(l.check_key_n(&1, 8).unwrap().is_allowed());
    /// assert!(!l.check_key_n(&1, 8).unwrap().is_allowed());
    /// assert!(l.check_key_n(&1, 11).is_err());
    /// ```
    #[inline]
    pub fn check_key_n<Q>(&self, key: &Q, n: u64) -> Result<Decision, InsufficientCapacity>
    where
        K: Borrow<Q>,
        Q: Hash + ?Sized,
    {
        self.check_key_n_at(key, self.now(), n)
    }

    /// [`check_key_n`](Self::check_key_n) at a time the caller read.
    ///
    /// ```
    /// # use ratewall::{KeyedTokenBucket, ManualClock, Rate};
    /// let l = KeyedTokenBucket::<u64, _>::builder(Rate::per_second(10))
    ///     .clock(ManualClock::new()).build().unwrap();
    /// assert_eq!(l.check_key_n_at(&1, 0, 4).unwrap().remaining(), 6);
    /// ```
    #[inline]
    pub fn check_key_n_at<Q>(
        &self,
        key: &Q,
        now: u64,
        n: u64,
    ) -> Result<Decision, InsufficientCapacity>
    where
        K: Borrow<Q>,
        Q: Hash + ?Sized,
    {
        self.run(self.hash(key), self.clamp(now), n, true)
    }

    /// The decision a unit request for `key` would get, without taking it
    /// (and without tracking an unknown key): what [`check_key`](Self::check_key)
    /// would return now, if nothing else happened in between. For a key the
    /// table does not hold, that includes the full-table policy: its
    /// [`tracking`](Decision::tracking) says whether the check would track
    /// the key, evict another one for it, admit it untracked, or reject it
    /// (with the same `retry_after`).
    ///
    /// ```
    /// # use ratewall::{KeyedTokenBucket, Rate};
    /// let l = KeyedTokenBucket::<u64>::builder(Rate::per_hour(1)).build().unwrap();
    /// assert!(l.peek_key(&1).is_allowed());
    /// assert_eq!(l.len(), 0);
    /// let _ = l.check_key(&1);
    /// assert!(!l.peek_key(&1).is_allowed());
    /// ```
    #[inline]
    pub fn peek_key<Q>(&self, key: &Q) -> Decision
    where
        K: Borrow<Q>,
        Q: Hash + ?Sized,
    {
        match self.peek_key_n(key, 1) {
            Ok(d) => d,
            Err(_) => unreachable_capacity(),
        }
    }

    /// The decision a request of cost `n` for `key` would get, without taking
    /// it: what [`check_key_n`](Self::check_key_n) would return now, full-table
    /// policy included (see [`peek_key`](Self::peek_key)).
    ///
    /// ```
    /// # use ratewall::{KeyedTokenBucket, Rate};
    /// let l = KeyedTokenBucket::<u64>::builder(Rate::per_second(10).burst(5)).build().unwrap();
    /// assert!(l.peek_key_n(&1, 5).unwrap().is_allowed());
    /// assert!(l.peek_key_n(&1, 6).is_err());
    /// ```
    #[inline]
    pub fn peek_key_n<Q>(&self, key: &Q, n: u64) -> Result<Decision, InsufficientCapacity>
    where
        K: Borrow<Q>,
        Q: Hash + ?Sized,
    {
        self.run(self.hash(key), self.clamp(self.now()), n, false)
    }

    /// [`peek_key_n`](Self::peek_key_n) at a time the caller read.
    #[inline]
    pub(crate) fn peek_key_n_at<Q>(
        &self,
        key: &Q,
        now: u64,
        n: u64,
    ) -> Result<Decision, InsufficientCapacity>
    where
        K: Borrow<Q>,
        Q: Hash + ?Sized,
    {
        self.run(self.hash(key), self.clamp(now), n, false)
    }

    /// Gives back `n` units an allowed check of `key` took. Nothing happens
    /// if the key is no longer tracked (it went idle and was reclaimed, or
    /// was admitted untracked).
    ///
    /// ```
    /// # use ratewall::{KeyedTokenBucket, Rate};
    /// let l = KeyedTokenBucket::<u64>::builder(Rate::per_hour(1)).build().unwrap();
    /// let _ = l.check_key(&1);
    /// l.refund_key(&1, 1);
    /// assert!(l.check_key(&1).is_allowed());
    /// ```
    pub fn refund_key<Q>(&self, key: &Q, n: u64)
    where
        K: Borrow<Q>,
        Q: Hash + ?Sized,
    {
        self.refund_key_at(key, self.now(), n);
    }

    /// [`refund_key`](Self::refund_key) at the time the refunded check used.
    ///
    /// ```
    /// # use ratewall::{KeyedTokenBucket, Rate};
    /// let l = KeyedTokenBucket::<u64>::builder(Rate::per_hour(1)).build().unwrap();
    /// let t = l.now();
    /// let _ = l.check_key_at(&1, t);
    /// l.refund_key_at(&1, t, 1);
    /// assert!(l.check_key_at(&1, t).is_allowed());
    /// ```
    pub fn refund_key_at<Q>(&self, key: &Q, now: u64, n: u64)
    where
        K: Borrow<Q>,
        Q: Hash + ?Sized,
    {
        if n == 0 {
            return;
        }
        let h = self.hash(key);
        let now = self.clamp(now);
        let _ = self.table.update(h, &mut |state| {
            let a = self.params_for(h);
            ((), a.k_refund(state, now, n))
        });
    }

    /// Forgets `key`'s history: its next check is a fresh key's.
    ///
    /// ```
    /// # use ratewall::{KeyedTokenBucket, Rate};
    /// let l = KeyedTokenBucket::<u64>::builder(Rate::per_hour(1)).build().unwrap();
    /// let _ = l.check_key(&1);
    /// l.reset_key(&1);
    /// assert!(l.check_key(&1).is_allowed());
    /// ```
    pub fn reset_key<Q>(&self, key: &Q)
    where
        K: Borrow<Q>,
        Q: Hash + ?Sized,
    {
        // All-zero is every algorithm's fresh state; the slot stays the key's
        // until an insert reclaims it.
        let _ = self.table.update(self.hash(key), &mut |_| ((), Some(0)));
    }

    /// Changes the quota of every key at run time, keeping each key's usage
    /// (rescaled as [`Limiter::set_quota`](crate::Limiter::set_quota) does).
    /// Keys with their own quota ([`set_key_quota`](Self::set_key_quota))
    /// keep it.
    ///
    /// Cost: one pass over the table (about a millisecond per 100,000 slots);
    /// new keys' inserts wait for it, and checks wait while the parameters
    /// change. A check that races with the pass is decided under the old
    /// quota or the new one, never a mix.
    ///
    /// ```
    /// # use ratewall::{KeyedTokenBucket, ManualClock, Rate};
    /// let l = KeyedTokenBucket::<u64, _>::builder(Rate::per_second(10).burst(10))
    ///     .clock(ManualClock::new())
    ///     .build()
    ///     .unwrap();
    /// let _ = l.check_key_n(&1, 4).unwrap();
    /// l.set_quota(Rate::per_second(100).burst(20)).unwrap();
    /// assert_eq!(l.peek_key(&1).remaining(), 15);
    /// assert_eq!(l.quota(), Rate::per_second(100).burst(20));
    /// ```
    pub fn set_quota(&self, config: A::Config) -> Result<(), ConfigError> {
        let new = A::from_config(&config)?;
        let mut current = lock(&self.config);
        let old: A = self.params.read();
        let now = self.clamp(self.now());
        // Relaxed: read under the config mutex, which every override change holds.
        let overrides = (self.override_count.load(Ordering::Relaxed) != 0)
            .then(|| lock(&self.overrides).clone());
        // Keys with their own quota keep it (and their state as it is).
        self.table.for_each_state(
            || self.params.begin(),
            |fp, s| match &overrides {
                Some(map) if map.contains_key(&fp) => s,
                _ => new.k_rescale(&old, s, now),
            },
        );
        self.params.publish(new);
        *current = config;
        Ok(())
    }

    /// Gives `key` its own quota (a premium tier), keeping its usage. It
    /// survives global [`set_quota`](Self::set_quota) calls until
    /// [`clear_key_quota`](Self::clear_key_quota). While any override
    /// exists, every check also consults a small mutex-guarded map: keep
    /// overrides few, or use a second limiter for a large tier.
    ///
    /// ```
    /// # use ratewall::{KeyedTokenBucket, Rate};
    /// let l = KeyedTokenBucket::<&str>::builder(Rate::per_hour(1)).build().unwrap();
    /// l.set_key_quota(&"premium", Rate::per_hour(100)).unwrap();
    /// assert_eq!((0..5).filter(|_| l.check_key(&"premium").is_allowed()).count(), 5);
    /// assert_eq!((0..5).filter(|_| l.check_key(&"free").is_allowed()).count(), 1);
    /// ```
    pub fn set_key_quota<Q>(&self, key: &Q, config: A::Config) -> Result<(), ConfigError>
    where
        K: Borrow<Q>,
        Q: Hash + ?Sized,
    {
        let new = A::from_config(&config)?;
        let _serial = lock(&self.config);
        let h = self.hash(key);
        let fp = table::fingerprint(h);
        let old = self.params_for(h);
        let now = self.clamp(self.now());
        {
            let mut map = lock(&self.overrides);
            if map.insert(fp, new).is_none() {
                // Relaxed: ordered before the rescale exchange below, which
                // a check's Acquire load synchronizes with (see `params_for`).
                self.override_count.fetch_add(1, Ordering::Relaxed);
            }
        }
        let _ = self
            .table
            .update(h, &mut |s| ((), Some(new.k_rescale(&old, s, now))));
        Ok(())
    }

    /// Removes `key`'s own quota: it follows the limiter's quota again.
    ///
    /// ```
    /// # use ratewall::{KeyedTokenBucket, Rate};
    /// let l = KeyedTokenBucket::<u64>::builder(Rate::per_hour(1)).build().unwrap();
    /// l.set_key_quota(&1, Rate::per_hour(10)).unwrap();
    /// l.clear_key_quota(&1);
    /// let _ = l.check_key(&1);
    /// assert!(!l.check_key(&1).is_allowed());
    /// ```
    pub fn clear_key_quota<Q>(&self, key: &Q)
    where
        K: Borrow<Q>,
        Q: Hash + ?Sized,
    {
        let _serial = lock(&self.config);
        let h = self.hash(key);
        let fp = table::fingerprint(h);
        let global: A = self.params.read();
        let now = self.clamp(self.now());
        let removed = lock(&self.overrides).remove(&fp);
        if let Some(own) = removed {
            let _ = self
                .table
                .update(h, &mut |s| ((), Some(global.k_rescale(&own, s, now))));
            // Relaxed: as in `set_key_quota`.
            self.override_count.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// The quota in force for keys without their own.
    ///
    /// ```
    /// # use ratewall::{KeyedTokenBucket, Rate};
    /// let l = KeyedTokenBucket::<u64>::builder(Rate::per_second(3)).build().unwrap();
    /// assert_eq!(l.quota(), Rate::per_second(3));
    /// ```
    pub fn quota(&self) -> A::Config {
        *lock(&self.config)
    }

    /// Keys tracked now, idle ones not yet reclaimed included. Never above
    /// [`max_keys`](Self::max_keys).
    ///
    /// ```
    /// # use ratewall::{KeyedTokenBucket, Rate};
    /// let l = KeyedTokenBucket::<u64>::builder(Rate::per_second(3)).build().unwrap();
    /// let _ = (l.check_key(&1), l.check_key(&2), l.check_key(&1));
    /// assert_eq!(l.len(), 2);
    /// ```
    pub fn len(&self) -> usize {
        self.table.len()
    }

    /// Whether no key is tracked.
    ///
    /// ```
    /// # use ratewall::{KeyedTokenBucket, Rate};
    /// let l = KeyedTokenBucket::<u64>::builder(Rate::per_second(3)).build().unwrap();
    /// assert!(l.is_empty());
    /// ```
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The most keys tracked at once.
    ///
    /// ```
    /// # use ratewall::{KeyedTokenBucket, Rate};
    /// let l = KeyedTokenBucket::<u64>::builder(Rate::per_second(3)).max_keys(500).build().unwrap();
    /// assert_eq!(l.max_keys(), 500);
    /// ```
    pub fn max_keys(&self) -> usize {
        self.table.capacity()
    }

    /// The shard count in use.
    ///
    /// ```
    /// # use ratewall::{KeyedTokenBucket, Rate};
    /// let l = KeyedTokenBucket::<u64>::builder(Rate::per_second(3)).max_keys(4).shards(16).build().unwrap();
    /// assert_eq!(l.shards(), 4); // capped at max_keys
    /// ```
    pub fn shards(&self) -> usize {
        self.table.shard_count()
    }

    /// The policy when the table is full.
    ///
    /// ```
    /// # use ratewall::{KeyedTokenBucket, Rate, WhenFull};
    /// let l = KeyedTokenBucket::<u64>::builder(Rate::per_second(3)).build().unwrap();
    /// assert_eq!(l.when_full(), WhenFull::RejectNew);
    /// ```
    pub fn when_full(&self) -> WhenFull {
        self.policy
    }

    /// Removes every idle key (state equal to a fresh key's), one shard at a
    /// time; returns how many. Never required (inserts reclaim idle keys as
    /// they go) but it makes [`len`](Self::len) exact.
    ///
    /// ```
    /// # use ratewall::{KeyedTokenBucket, ManualClock, Rate};
    /// # use std::time::Duration;
    /// let clock = ManualClock::new();
    /// let l = KeyedTokenBucket::<u64, _>::builder(Rate::per_second(1)).clock(clock.clone()).build().unwrap();
    /// let _ = (l.check_key(&1), l.check_key(&2));
    /// clock.advance(Duration::from_secs(1));
    /// assert_eq!(l.retain_active(), 2);
    /// assert!(l.is_empty());
    /// ```
    pub fn retain_active(&self) -> usize {
        self.table.retain_active(&self.view(self.clamp(self.now())))
    }

    /// Bytes the table owns (allocated up front, constant): at most 24 per
    /// key of `max_keys` from about 1,000 keys up, whatever the key type.
    ///
    /// ```
    /// # use ratewall::{KeyedTokenBucket, Rate};
    /// let l = KeyedTokenBucket::<String>::builder(Rate::per_second(3)).max_keys(1_000_000).build().unwrap();
    /// assert!(l.memory_bytes() <= 24 * 1_000_000);
    /// ```
    pub fn memory_bytes(&self) -> usize {
        self.table.memory_bytes() + std::mem::size_of::<Self>()
    }

    /// Loom-only test hook (compiled only with `--cfg ratewall_loom`, so not
    /// part of the API): the shard and the first slot of the key's probe
    /// window. Loom models use it to make two keys compete for one slot.
    #[cfg(ratewall_loom)]
    #[doc(hidden)]
    pub fn __home_slot<Q>(&self, key: &Q) -> (usize, usize)
    where
        K: Borrow<Q>,
        Q: Hash + ?Sized,
    {
        self.table.home(self.hash(key))
    }

    /// One reading of this limiter's clock (guarded against backward steps).
    ///
    /// ```
    /// # use ratewall::{KeyedTokenBucket, ManualClock, Rate};
    /// let l = KeyedTokenBucket::<u64, _>::builder(Rate::per_second(3)).clock(ManualClock::new()).build().unwrap();
    /// assert_eq!(l.now(), 0);
    /// ```
    #[inline]
    pub fn now(&self) -> u64 {
        self.time.now()
    }

    /// The clock.
    ///
    /// ```
    /// # use ratewall::{Clock, KeyedTokenBucket, ManualClock, Rate};
    /// let l = KeyedTokenBucket::<u64, _>::builder(Rate::per_second(3)).clock(ManualClock::new()).build().unwrap();
    /// assert_eq!(l.clock().now(), 0);
    /// ```
    pub fn clock(&self) -> &C {
        self.time.clock()
    }
}

#[cold]
fn unreachable_capacity() -> Decision {
    // Capacity >= 1 is validated at construction, so a unit cost always fits.
    Decision::deny(0, 0, u64::MAX, u64::MAX)
}

impl<K, A: Algorithm, C: Clock> fmt::Debug for KeyedLimiter<K, A, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedLimiter")
            .field("algorithm", &A::NAME)
            .field("quota", &*lock(&self.config))
            .field("policy", &self.policy)
            .field("table", &self.table)
            .field("clock", self.time.clock())
            .finish()
    }
}

impl<K, A: Algorithm, C: Clock> fmt::Debug for KeyedBuilder<K, A, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedBuilder")
            .field("config", &self.config)
            .field("max_keys", &self.max_keys)
            .field("shards", &self.shards)
            .field("policy", &self.policy)
            .field("seed", &self.seed.map(|_| "<set>"))
            .field("clock", &self.clock)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Rate;

    fn builder() -> KeyedBuilder<u64, Gcra, DefaultClock> {
        KeyedTokenBucket::<u64>::builder(Rate::per_second(5))
    }

    /// The bounds are inclusive: `MAX_KEYS` keys and `MAX_SHARDS` shards
    /// are accepted, one more is not (checked without building the table).
    #[test]
    fn the_largest_table_and_shard_count_are_accepted_and_no_more() {
        let largest = builder().max_keys(MAX_KEYS).shards(MAX_SHARDS);
        assert_eq!(largest.validated_shards(), Ok(MAX_SHARDS));
        assert_eq!(
            builder().max_keys(MAX_KEYS + 1).validated_shards(),
            Err(ConfigError::InvalidCapacity {
                max_keys: MAX_KEYS + 1,
                max: MAX_KEYS
            })
        );
        assert_eq!(
            builder()
                .max_keys(MAX_KEYS)
                .shards(2 * MAX_SHARDS)
                .validated_shards(),
            Err(ConfigError::InvalidShards {
                shards: 2 * MAX_SHARDS
            })
        );
    }

    /// A seed fixes the key hasher (a reproducible layout); without one,
    /// every limiter draws its own keys, so nobody can precompute keys that
    /// collide in it.
    #[test]
    fn a_seed_fixes_the_hasher_and_no_seed_draws_a_random_one() {
        let hash = |b: KeyedBuilder<u64, Gcra, DefaultClock>| b.key_hasher().hash_one(42u64);
        assert_eq!(hash(builder().seed(7)), hash(builder().seed(7)));
        assert_ne!(hash(builder().seed(7)), hash(builder().seed(8)));
        assert_ne!(hash(builder()), hash(builder()));
    }
}
