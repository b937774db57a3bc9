//! [`KeyedLimiter`]: its struct, its build, its check paths over the slot
//! table (the hot path), and its [`KeyedCore`]/[`KeyedTable`] core, from
//! which `family.rs` makes the method family. The path of a key the table
//! does not hold is in `insert.rs`, quota changes in `quotas.rs`, hot keys in
//! `hot.rs`.

use super::builder::{KeyedBuilder, WhenFull};
use super::family::{
    keyed_methods, refund_methods, table_methods, Checked, KeyedCore, KeyedRefund, KeyedTable,
};
use super::hot_slots::Hot;
use super::overrides::Overrides;
use super::table::Table;
use super::KeyedAlgorithm;
use crate::algo::WordStep;
use crate::clock::{Clock, Timebase};
use crate::decision::Decision;
use crate::error::{ConfigError, InsufficientCapacity};
use crate::limiter::DefaultClock;
use crate::sync::{lock, thread_index, Mutex};
use crate::word::ParamCell;
use crossbeam_utils::CachePadded;

use std::fmt;
use std::hash::Hash;
use std::marker::PhantomData;

/// One limit per key, for any key type `K: Hash + Eq` (tuples included),
/// with memory bounded by `max_keys`.
///
/// - A check of a tracked key is lock-free: one hash, a short probe, one
///   8-byte compare-exchange on the key's own slot; a denial writes nothing.
/// - Keys are identified by a 24-bit tag of a 64-bit seeded hash (`ahash`)
///   and their place in the table; no key is stored, so memory is 12 bytes
///   per key of `max_keys` (small tables add their headers) whatever the
///   key type, and `max_keys` distinct keys always fit. A new key whose tag
///   equals that of a key its lookup passes shares that key's limit (about
///   1.2e-7 of new keys, with a per-process random seed; docs/design.md,
///   "Keyed table").
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
pub struct KeyedLimiter<K, A: KeyedAlgorithm, C: Clock = DefaultClock> {
    pub(super) table: Table<A::Packing>,
    pub(super) params: CachePadded<ParamCell>,
    pub(super) hasher: ahash::RandomState,
    pub(super) time: Timebase<C>,
    pub(super) policy: WhenFull,
    /// Serializes quota changes; holds the configuration they were built from.
    pub(super) config: Mutex<A::Config>,
    /// Per-key quotas (`overrides.rs`).
    pub(super) overrides: Overrides<A>,
    /// Hot keys' striped leases (`hot.rs`), if configured.
    pub(super) hot: Option<Box<Hot>>,
    pub(super) _key: PhantomData<fn(&K)>,
}

// The keyed method family (`family.rs`), from this type's core below.
keyed_methods!([K, A: KeyedAlgorithm, C: Clock] KeyedLimiter<K, A, C>, K);
refund_methods!([K, A: KeyedAlgorithm, C: Clock] KeyedLimiter<K, A, C>, K);
table_methods!([K, A: KeyedAlgorithm, C: Clock] KeyedLimiter<K, A, C>);

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
        let packing = params.packing()?;
        let params = params.in_units(&packing);
        let shards = self.table.validated_shards()?;
        let hasher = self.table.key_hasher();
        // `hot_keys` exists only on token-bucket builders.
        let hot = match (self.hot, params.as_gcra()) {
            (Some(options), Some(gcra)) => Some(Box::new(Hot::new(gcra, options)?)),
            _ => None,
        };
        Ok(KeyedLimiter {
            // The wrap sweep's schedule starts at the build (a reading of
            // the clock itself: the limiter's floor is not moved).
            table: Table::new(
                self.table.max_keys,
                shards,
                packing,
                self.clock.now().min(crate::clock::HORIZON),
            ),
            params: CachePadded::new(ParamCell::new(params)),
            hasher,
            time: Timebase::new(self.clock),
            policy: self.table.when_full,
            config: Mutex::new(self.config),
            overrides: Overrides::new(),
            hot,
            _key: PhantomData,
        })
    }
}

impl<K, A: KeyedAlgorithm, C: Clock> KeyedLimiter<K, A, C> {
    #[inline]
    pub(super) fn hash<Q: Hash + ?Sized>(&self, key: &Q) -> u64 {
        self.hasher.hash_one(key)
    }

    /// `now` as every entry point uses it: clamped (`Timebase`), and only
    /// once the table's wrap sweep is done up to it (`wrap.rs`: one load and
    /// a compare while none is due), so that no slot is read that the sweep
    /// should have reclaimed first.
    #[inline]
    pub(super) fn clamp(&self, now: u64) -> u64 {
        let now = self.table.time(self.time.clamp(now));
        if self.table.sweep_due(now) {
            self.sweep_wrap(now);
        }
        now
    }

    /// The wrap sweep's due part (out of line: once per shard per sweep
    /// period at most). It runs when `now` asks, but judges and packs idle
    /// keys at a monotonic clock's own reading if `now` is ahead of it: such
    /// a clock's explicit instants are trusted as they come (`Timebase`),
    /// and a key idle at an instant far ahead may still hold usage at the
    /// clock's time, which later checks read at. A clock that is not
    /// monotonic is not read here: its explicit instants already moved the
    /// floor that its readings never go below, and a reading would move it
    /// further (past instants the caller passes next).
    #[cold]
    #[inline(never)]
    fn sweep_wrap(&self, now: u64) {
        let judged = self
            .time
            .monotonic_now()
            .map_or(now, |clock| now.min(self.table.time(clock)));
        self.table.sweep_wrap(now, &self.view(judged));
    }

    /// The core of every check: `consume` takes `n` if allowed.
    #[inline]
    pub(super) fn run(
        &self,
        h: u64,
        now: u64,
        n: u64,
        consume: bool,
    ) -> Result<Decision, InsufficientCapacity> {
        if !consume && n == 1 {
            if let Some(hot) = self.hot.as_deref() {
                // A hot key's peek counts its leases, as its check would.
                if let Some(d) = self.peek_hot(hot, h, thread_index(), now) {
                    return Ok(d);
                }
            }
        }
        match self.run_tracked(h, now, n, consume) {
            Some(r) => r,
            None => self.run_untracked(h, now, n, consume && n > 0),
        }
    }

    /// `run` for a key the table holds; `None` if it does not.
    #[inline(always)]
    fn run_tracked(
        &self,
        h: u64,
        now: u64,
        n: u64,
        consume: bool,
    ) -> Option<Result<Decision, InsufficientCapacity>> {
        let take = consume && n > 0;
        // The slot loop only decides the next state and hands back the
        // parameters it read; the decision is built after the exchange from
        // the state the winning step saw (the same pure function of the same
        // inputs), so no decision is stored across the exchange and copied
        // out (a store-forwarding stall on every check, see
        // docs/benchmarks.md). This function is forced inline into its two
        // callers (`run`, and `check_tracked` with a unit cost), and with
        // plain `#[inline]` this one closure and `Table::apply` inline into
        // it. The paths of a key the table does not hold
        // (`check_untracked`, `run_untracked`) are `#[cold]` and out of
        // line, so that `check_key` builds its decision in place (measured:
        // docs/benchmarks.md, round 2 and "cuts on the 8-byte slot").
        if let Some((a, state)) = self.table.apply(h, now, &mut |state| {
            let a = self.params_for(h);
            let next = if take && n <= WordStep::capacity(&a) {
                a.step(state, now, n).1
            } else {
                None
            };
            (a, next)
        }) {
            let capacity = WordStep::capacity(&a);
            if let Err(e) = InsufficientCapacity::check(n, capacity) {
                return Some(Err(e));
            }
            // A cost of 0 asks for a unit request's decision, without taking it.
            return Some(Ok(a.step(state, now, n.max(1)).0));
        }
        None
    }

    /// A unit check of a key the table does not hold (`check_hashed`'s
    /// slow path, out of line so that the fast path builds its decision in
    /// the caller's return slot, not in a temporary shared with this one).
    #[cold]
    #[inline(never)]
    pub(super) fn check_untracked(&self, h: u64, now: u64) -> Decision {
        match self.run_untracked(h, now, 1, true) {
            Ok(d) => d,
            Err(_) => unreachable_capacity(),
        }
    }

    /// A unit check of the key with hash `h` at `now` (clamped).
    #[inline]
    fn check_hashed(&self, h: u64, now: u64) -> Decision {
        if let Some(hot) = self.hot.as_deref() {
            return self.check_hot(hot, h, thread_index(), now);
        }
        self.check_tracked(h, now)
    }

    /// `check_hashed` past the hot keys: `run_tracked` inlined with a unit
    /// cost, out of line itself, so that the decision is built in the
    /// caller's return slot (not in an `Option<Result<Decision>>` the caller
    /// copies out) and the cost's checks fold away (docs/benchmarks.md,
    /// "cuts on the 8-byte slot").
    #[inline(never)]
    fn check_tracked(&self, h: u64, now: u64) -> Decision {
        match self.run_tracked(h, now, 1, true) {
            Some(Ok(d)) => d,
            Some(Err(_)) => unreachable_capacity(),
            None => self.check_untracked(h, now),
        }
    }

    /// [`peek_key_n`](Self::peek_key_n) at a time the caller read (the hot
    /// keys' test hooks).
    #[cfg(feature = "testing")]
    #[inline]
    pub(crate) fn peek_key_n_at<Q>(
        &self,
        key: &Q,
        now: u64,
        n: u64,
    ) -> Result<Decision, InsufficientCapacity>
    where
        K: std::borrow::Borrow<Q>,
        Q: Hash + ?Sized,
    {
        self.key_run(key, Some(now), n, false)
    }

    /// Whether a batch loads this table's slots ahead (`Table::prefetches`).
    // The HTTP layer's build asks (feature `tower`).
    #[cfg_attr(not(feature = "tower"), allow(dead_code))]
    pub(crate) fn prefetches(&self) -> bool {
        self.table.prefetches()
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

    /// Bytes the table owns (allocated up front, constant): at most 12 per
    /// key of `max_keys` from about 1,000 keys up, whatever the key type,
    /// plus a cache-padded line (128 bytes on x86-64) per stripe of the hot
    /// slots if it has hot keys.
    ///
    /// ```
    /// # use ratewall::{KeyedTokenBucket, Rate};
    /// let l = KeyedTokenBucket::<String>::builder(Rate::per_second(3)).max_keys(1_000_000).build().unwrap();
    /// assert!(l.memory_bytes() <= 12 * 1_000_000);
    /// ```
    pub fn memory_bytes(&self) -> usize {
        self.table.memory_bytes()
            + std::mem::size_of::<Self>()
            + self.hot.as_deref().map_or(0, Hot::memory_bytes)
    }

    /// Loom-only test hook (compiled only with `--cfg ratewall_loom` and the
    /// `testing` feature, so not part of the API): the shard and the first
    /// slot of the key's probe window. Loom models use it to make two keys
    /// compete for one slot.
    #[cfg(all(ratewall_loom, feature = "testing"))]
    #[doc(hidden)]
    pub fn __home_slot<Q>(&self, key: &Q) -> (usize, usize)
    where
        K: std::borrow::Borrow<Q>,
        Q: Hash + ?Sized,
    {
        self.table.home(self.hash(key))
    }

    /// Loom-only test hook (as `__home_slot`): the key's 24-bit tag, so that
    /// a model can check that two keys competing for one slot have distinct
    /// tags (the case the slot protocol makes exact).
    #[cfg(all(ratewall_loom, feature = "testing"))]
    #[doc(hidden)]
    pub fn __tag<Q>(&self, key: &Q) -> u64
    where
        K: std::borrow::Borrow<Q>,
        Q: Hash + ?Sized,
    {
        super::table::tag(self.hash(key))
    }
}

impl<K, A: KeyedAlgorithm, C: Clock> KeyedCore for KeyedLimiter<K, A, C> {
    type Key = K;
    type Clock = C;
    type Memo = ();

    #[inline]
    fn key_now(&self) -> u64 {
        self.time.now()
    }

    fn key_clock(&self) -> &C {
        self.time.clock()
    }

    #[inline]
    fn key_run<Q: Hash + ?Sized>(&self, key: &Q, now: Option<u64>, n: u64, take: bool) -> Checked {
        let h = self.hash(key);
        let now = match now {
            Some(now) => now,
            None => {
                // A check starts the slot's load before the clock read: the
                // two overlap (docs/benchmarks.md, "prefetch the slot before
                // the clock read").
                if take {
                    self.table.touch(h);
                }
                self.time.now()
            }
        };
        self.run(h, self.clamp(now), n, take)
    }

    #[inline]
    fn check_key_with<Q: Hash + ?Sized>(&self, key: &Q, now: Option<u64>) -> Decision {
        let h = self.hash(key);
        let now = match now {
            Some(now) => now,
            None => {
                // As in `key_run`: the slot's load, then the clock read.
                self.table.touch(h);
                self.time.now()
            }
        };
        self.check_hashed(h, self.clamp(now))
    }

    #[inline]
    fn key_touch<Q: Hash + ?Sized>(&self, key: &Q) {
        // A table that stays in the caches has no miss to overlap: not even
        // the hash.
        if self.table.prefetches() {
            self.table.touch(self.hash(key));
        }
    }

    #[inline]
    fn key_prepare<Q: Hash + ?Sized>(&self, key: &Q) -> u64 {
        let h = self.hash(key);
        if self.table.prefetches() {
            self.table.touch(h);
        }
        h
    }

    #[inline]
    fn key_batch_now(&self) -> u64 {
        // What every check does to its reading (and the wrap sweep, if due),
        // done once for the batch: `clamp` is idempotent.
        self.clamp(self.time.now())
    }

    #[inline]
    fn check_prepared<Q: Hash + ?Sized>(&self, _: &Q, h: u64, now: u64) -> Decision {
        // `h` is the key's hash (`key_prepare`), `now` clamped
        // (`key_batch_now`).
        self.check_hashed(h, now)
    }

    fn key_capacity<Q: Hash + ?Sized>(&self, key: &Q) -> u64 {
        self.capacity_for(key)
    }

    fn key_give_back<Q: Hash + ?Sized>(&self, key: &Q, now: u64, n: u64, _: &()) {
        self.key_refund(key, now, n);
    }
}

impl<K, A: KeyedAlgorithm, C: Clock> KeyedRefund for KeyedLimiter<K, A, C> {
    fn key_refund<Q: Hash + ?Sized>(&self, key: &Q, now: u64, n: u64) {
        if n == 0 || self.hot.is_some() {
            return;
        }
        let h = self.hash(key);
        let now = self.clamp(now);
        let _ = self.table.update(h, now, &mut |state| {
            let a = self.params_for(h);
            ((), a.refund(state, now, n))
        });
    }

    fn key_reset<Q: Hash + ?Sized>(&self, key: &Q) {
        // A key the table does not hold is a fresh key: removing it is the
        // reset (a packed fresh state would need a time to pack it at).
        self.table.remove(self.hash(key));
    }
}

impl<K, A: KeyedAlgorithm, C: Clock> KeyedTable for KeyedLimiter<K, A, C> {
    fn table_len(&self) -> usize {
        self.table.len()
    }

    fn table_max_keys(&self) -> usize {
        self.table.capacity()
    }

    fn table_when_full(&self) -> WhenFull {
        self.policy
    }

    fn table_retain_active(&self) -> usize {
        self.table
            .retain_active(&self.view(self.clamp(self.time.now())))
    }
}

#[cold]
pub(super) fn unreachable_capacity() -> Decision {
    // Capacity >= 1 is validated at construction, so a unit cost always fits.
    Decision::deny(0, 0, u64::MAX, u64::MAX)
}

impl<K, A: KeyedAlgorithm, C: Clock> fmt::Debug for KeyedLimiter<K, A, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedLimiter")
            .field("algorithm", &A::NAME)
            .field("quota", &*lock(&self.config))
            .field("policy", &self.policy)
            .field("table", &self.table)
            .field("hot", &self.hot)
            .field("clock", self.time.clock())
            .finish()
    }
}
