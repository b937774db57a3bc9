//! [`KeyedBuilder`]: the keyed limiters' configuration, its bounds
//! ([`MAX_KEYS`], the shard count) and their validation. Shared by
//! [`KeyedLimiter`](crate::KeyedLimiter) and the keyed sliding log (`log.rs`).

use super::hot_slots::HotKeys;
use crate::algo::{Algorithm, Gcra};
use crate::clock::Clock;
use crate::error::ConfigError;
use crate::limiter::DefaultClock;
use std::fmt;
use std::marker::PhantomData;

/// What a keyed limiter does with a new key when the table is full of
/// active keys (keys whose state differs from a fresh key's).
///
/// The decision reports which one acted through [`Decision::tracking`](crate::Decision::tracking).
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
    /// spraying keys cannot push out the keys already limited, but while
    /// its keys fill the table every new key is denied: `max_keys`
    /// requests lock new keys out for as long as one request keeps a key
    /// active (a fixed window: until its end). The
    /// rejection's `retry_after` is the time until the first active key in
    /// the new key's way goes idle: a check then is admitted.
    #[default]
    RejectNew,
    /// Allow the new key's request without tracking it (fail open).
    AdmitUntracked,
    /// Evict an active key with the least time to idle (the time until its
    /// state equals a fresh key's: the least recently active by the
    /// algorithm's own measure; on a tie, such as the keys of one window,
    /// the one holding the fewest units) among the new key's neighbours,
    /// and track the new key in its place. The neighbours are the whole table for one
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

/// The largest `max_keys` accepted (2^32 keys, about 90 GiB of table).
pub const MAX_KEYS: usize = 1 << 32;
const MAX_SHARDS: usize = 1 << 16;
const DEFAULT_MAX_KEYS: usize = 1 << 16;
const DEFAULT_SHARDS: usize = 64;

/// The settings of a bounded table of keys: `max_keys`, the shard count,
/// the policy when full and the hash seed. One value, shared by every
/// builder that makes a table ([`KeyedBuilder`],
/// [`KeyedPolicyBuilder`](crate::KeyedPolicyBuilder),
/// [`ElasticBuilder`](crate::ElasticBuilder)): each has the four setters
/// below, and `table` to pass a whole `TableOptions` at once (what a
/// configuration layer that makes many tables uses).
///
/// # Example
///
/// ```
/// use ratewall::{KeyedPolicyLimiter, KeyedTokenBucket, Policy, Rate, TableOptions, WhenFull};
///
/// let table = TableOptions::new()
///     .max_keys(10_000)
///     .shards(8)
///     .when_full(WhenFull::EvictLeastRecent);
/// let typed = KeyedTokenBucket::<u64>::builder(Rate::per_second(5)).table(table).build()?;
/// let policy = KeyedPolicyLimiter::<u64>::builder(Policy::token_bucket(Rate::per_second(5)))
///     .table(table)
///     .build()?;
/// assert_eq!((typed.max_keys(), policy.max_keys()), (10_000, 10_000));
/// assert_eq!(typed.shards(), 8);
/// assert_eq!(policy.when_full(), WhenFull::EvictLeastRecent);
/// # Ok::<(), ratewall::ConfigError>(())
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct TableOptions {
    pub(crate) max_keys: usize,
    pub(crate) shards: Option<usize>,
    pub(crate) when_full: WhenFull,
    pub(crate) seed: Option<u64>,
}

impl TableOptions {
    /// The defaults: 65,536 keys, up to 64 shards (fewer for small tables),
    /// [`WhenFull::RejectNew`], a random seed.
    ///
    /// ```
    /// # use ratewall::{TableOptions, WhenFull};
    /// assert_eq!(TableOptions::new(), TableOptions::default());
    /// assert_eq!(TableOptions::new().when_full(WhenFull::RejectNew), TableOptions::new());
    /// ```
    pub const fn new() -> Self {
        TableOptions {
            max_keys: DEFAULT_MAX_KEYS,
            shards: None,
            when_full: WhenFull::RejectNew,
            seed: None,
        }
    }

    /// The most keys tracked at once (1 to [`MAX_KEYS`]), and the promise
    /// that this many distinct keys fit. Memory is allocated up front: 24
    /// bytes per key (small tables add a few slots and their headers).
    ///
    /// ```
    /// # use ratewall::{KeyedTokenBucket, Rate, TableOptions};
    /// let options = TableOptions::new().max_keys(10);
    /// let l = KeyedTokenBucket::<u64>::builder(Rate::per_second(5)).table(options).build()?;
    /// assert_eq!(l.max_keys(), 10);
    /// # Ok::<(), ratewall::ConfigError>(())
    /// ```
    #[must_use]
    pub const fn max_keys(mut self, max_keys: usize) -> Self {
        self.max_keys = max_keys;
        self
    }

    /// The shard count: a power of two from 1 to 65,536 (default: 64, fewer
    /// for small tables). Inserts of new keys lock one shard; checks of
    /// tracked keys never lock. If larger than `max_keys`, it is reduced to
    /// the largest power of two not above `max_keys`.
    ///
    /// ```
    /// # use ratewall::{ConfigError, KeyedTokenBucket, Rate, TableOptions};
    /// let bad = KeyedTokenBucket::<u64>::builder(Rate::per_second(5)).table(TableOptions::new().shards(3)).build();
    /// assert_eq!(bad.unwrap_err(), ConfigError::InvalidShards { shards: 3 });
    /// ```
    #[must_use]
    pub const fn shards(mut self, shards: usize) -> Self {
        self.shards = Some(shards);
        self
    }

    /// What happens to a new key when the table is full of active keys.
    ///
    /// ```
    /// # use ratewall::{KeyedTokenBucket, Rate, TableOptions, WhenFull};
    /// let options = TableOptions::new().when_full(WhenFull::AdmitUntracked);
    /// let l = KeyedTokenBucket::<u64>::builder(Rate::per_second(5)).table(options).build()?;
    /// assert_eq!(l.when_full(), WhenFull::AdmitUntracked);
    /// # Ok::<(), ratewall::ConfigError>(())
    /// ```
    #[must_use]
    pub const fn when_full(mut self, policy: WhenFull) -> Self {
        self.when_full = policy;
        self
    }

    /// A fixed hash seed (default: random per table). A fixed seed makes
    /// the table's layout reproducible, and lets anyone who knows it craft
    /// colliding keys: keep it secret in production.
    ///
    /// ```
    /// # use ratewall::{KeyedTokenBucket, Rate, TableOptions};
    /// let l = KeyedTokenBucket::<u64>::builder(Rate::per_second(5)).table(TableOptions::new().seed(7)).build()?;
    /// assert!(l.check_key(&1).is_allowed());
    /// # Ok::<(), ratewall::ConfigError>(())
    /// ```
    #[must_use]
    pub const fn seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// Validates `max_keys` and the shard count; returns the shard count to
    /// use (shared by every keyed table's `build`).
    pub(crate) fn validated_shards(&self) -> Result<usize, ConfigError> {
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
    pub(crate) fn key_hasher(&self) -> ahash::RandomState {
        match self.seed {
            Some(s) => ahash::RandomState::with_seeds(s, s ^ 0x9e37_79b9_7f4a_7c15, 1, 2),
            None if cfg!(ratewall_loom) => ahash::RandomState::with_seeds(0, 1, 2, 3),
            None => ahash::RandomState::new(),
        }
    }
}

impl Default for TableOptions {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for TableOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TableOptions")
            .field("max_keys", &self.max_keys)
            .field("shards", &self.shards)
            .field("when_full", &self.when_full)
            .field("seed", &self.seed.map(|_| "<set>"))
            .finish()
    }
}

/// The table setters of a builder with a `table: TableOptions` field, as
/// inherent methods of `$ty`: written once for every builder that makes a
/// table.
macro_rules! table_setters {
    ([$($g:tt)*] $ty:ty) => {
        impl<$($g)*> $ty {
            /// The most keys tracked at once (1 to 2^32), and the promise
            /// that this many distinct keys fit
            /// ([`TableOptions::max_keys`]($crate::TableOptions::max_keys)).
            ///
            /// ```
            /// # use ratewall::{KeyedTokenBucket, Rate};
            /// let l = KeyedTokenBucket::<u64>::builder(Rate::per_second(5)).max_keys(10).build()?;
            /// assert_eq!(l.max_keys(), 10);
            /// # Ok::<(), ratewall::ConfigError>(())
            /// ```
            pub fn max_keys(mut self, max_keys: usize) -> Self {
                self.table = self.table.max_keys(max_keys);
                self
            }

            /// The shard count: a power of two from 1 to 65,536
            /// ([`TableOptions::shards`]($crate::TableOptions::shards)).
            ///
            /// ```
            /// # use ratewall::{ConfigError, KeyedTokenBucket, Rate};
            /// let bad = KeyedTokenBucket::<u64>::builder(Rate::per_second(5)).shards(3).build();
            /// assert_eq!(bad.unwrap_err(), ConfigError::InvalidShards { shards: 3 });
            /// ```
            pub fn shards(mut self, shards: usize) -> Self {
                self.table = self.table.shards(shards);
                self
            }

            /// What happens to a new key when the table is full of active
            /// keys ([`WhenFull`]($crate::WhenFull)).
            ///
            /// ```
            /// # use ratewall::{KeyedTokenBucket, Rate, WhenFull};
            /// let l = KeyedTokenBucket::<u64>::builder(Rate::per_second(5))
            ///     .when_full(WhenFull::AdmitUntracked)
            ///     .build()?;
            /// assert_eq!(l.when_full(), WhenFull::AdmitUntracked);
            /// # Ok::<(), ratewall::ConfigError>(())
            /// ```
            pub fn when_full(mut self, policy: $crate::keyed::builder::WhenFull) -> Self {
                self.table = self.table.when_full(policy);
                self
            }

            /// A fixed hash seed (default: random per table; see
            /// [`TableOptions::seed`]($crate::TableOptions::seed)).
            ///
            /// ```
            /// # use ratewall::{KeyedTokenBucket, Rate};
            /// let l = KeyedTokenBucket::<u64>::builder(Rate::per_second(5)).seed(7).build()?;
            /// assert!(l.check_key(&1).is_allowed());
            /// # Ok::<(), ratewall::ConfigError>(())
            /// ```
            pub fn seed(mut self, seed: u64) -> Self {
                self.table = self.table.seed(seed);
                self
            }

            /// All four table settings at once, replacing any set before.
            ///
            /// ```
            /// # use ratewall::{KeyedTokenBucket, Rate, TableOptions};
            /// let l = KeyedTokenBucket::<u64>::builder(Rate::per_second(5))
            ///     .table(TableOptions::new().max_keys(100))
            ///     .build()?;
            /// assert_eq!(l.max_keys(), 100);
            /// # Ok::<(), ratewall::ConfigError>(())
            /// ```
            pub fn table(mut self, options: $crate::keyed::builder::TableOptions) -> Self {
                self.table = options;
                self
            }
        }
    };
}
pub(crate) use table_setters;

/// Configures a [`KeyedLimiter`](crate::KeyedLimiter): quota, `max_keys`, shards, policy when
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
    pub(super) config: A::Config,
    pub(super) table: TableOptions,
    pub(super) hot: Option<HotKeys>,
    pub(super) clock: C,
    _key: PhantomData<fn(&K)>,
}

table_setters!([K, A: Algorithm, C: Clock] KeyedBuilder<K, A, C>);

impl<K, A: Algorithm, C: Clock> KeyedBuilder<K, A, C> {
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
            table: self.table,
            hot: self.hot,
            clock,
            _key: PhantomData,
        }
    }
}

impl<K, C: Clock> KeyedBuilder<K, Gcra, C> {
    /// Striped leases for the table's hot keys (off by default): up to
    /// `hot.slots` keys that several threads check at once admit from
    /// per-thread leases taken from their entry in batches, with the bound
    /// kept exact; see [`HotKeys`]. Then the table's quota cannot change at
    /// run time ([`set_quota`](crate::KeyedLimiter::set_quota) and
    /// [`set_key_quota`](crate::KeyedLimiter::set_key_quota) return an error), and
    /// [`refund_key`](crate::KeyedLimiter::refund_key) does nothing.
    ///
    /// ```
    /// # use ratewall::{HotKeys, KeyedTokenBucket, LeaseOptions, Rate};
    /// let l = KeyedTokenBucket::<u64>::builder(Rate::per_second(1000).burst(100))
    ///     .hot_keys(HotKeys::new(8).lease(LeaseOptions::new().stripes(4)))
    ///     .build()?;
    /// assert!(l.check_key(&1).is_allowed());
    /// assert!(l.set_quota(Rate::per_second(10)).is_err());
    /// # Ok::<(), ratewall::ConfigError>(())
    /// ```
    pub fn hot_keys(mut self, hot: HotKeys) -> Self {
        self.hot = Some(hot);
        self
    }
}

impl<K, A: Algorithm> KeyedBuilder<K, A, DefaultClock> {
    pub(crate) fn new(config: A::Config) -> Self {
        KeyedBuilder {
            config,
            table: TableOptions::new(),
            hot: None,
            clock: DefaultClock::default(),
            _key: PhantomData,
        }
    }
}

fn prev_power_of_two(n: usize) -> usize {
    debug_assert!(n > 0);
    1 << (usize::BITS - 1 - n.leading_zeros())
}

impl<K, A: Algorithm, C: Clock> fmt::Debug for KeyedBuilder<K, A, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedBuilder")
            .field("config", &self.config)
            .field("table", &self.table)
            .field("hot", &self.hot)
            .field("clock", &self.clock)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algo::Gcra;
    use crate::keyed::KeyedTokenBucket;
    use crate::Rate;

    fn builder() -> KeyedBuilder<u64, Gcra, DefaultClock> {
        KeyedTokenBucket::<u64>::builder(Rate::per_second(5))
    }

    /// The bounds are inclusive: `MAX_KEYS` keys and `MAX_SHARDS` shards
    /// are accepted, one more is not (checked without building the table).
    #[test]
    fn the_largest_table_and_shard_count_are_accepted_and_no_more() {
        let largest = builder().max_keys(MAX_KEYS).shards(MAX_SHARDS);
        assert_eq!(largest.table.validated_shards(), Ok(MAX_SHARDS));
        assert_eq!(
            builder().max_keys(MAX_KEYS + 1).table.validated_shards(),
            Err(ConfigError::InvalidCapacity {
                max_keys: MAX_KEYS + 1,
                max: MAX_KEYS
            })
        );
        assert_eq!(
            builder()
                .max_keys(MAX_KEYS)
                .shards(2 * MAX_SHARDS)
                .table
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
        let hash = |b: KeyedBuilder<u64, Gcra, DefaultClock>| b.table.key_hasher().hash_one(42u64);
        assert_eq!(hash(builder().seed(7)), hash(builder().seed(7)));
        assert_ne!(hash(builder().seed(7)), hash(builder().seed(8)));
        assert_ne!(hash(builder()), hash(builder()));
    }
}
