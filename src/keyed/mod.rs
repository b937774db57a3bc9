//! Keyed limiters: one limit per key (user, IP address, route, tuple of
//! them) in a bounded, lock-free table.
//!
//! The table (`table.rs`) keeps, per key, an 8-byte slot: a 24-bit tag of
//! the key's hash, and the algorithm's state packed in 40 bits
//! (`algo::KeyedWord`). A check of a key
//! already tracked takes no lock and writes nothing but that slot (a denial
//! writes nothing at all). A new key takes its shard's mutex to claim a slot,
//! and reclaims idle keys on its way. See `docs/design.md`, "Keyed table".
//!
//! Files, each importing only the ones listed before it (and `mod.rs`'s
//! [`KeyedAlgorithm`]): `wrap.rs`, the wrap sweep's schedule (idle keys
//! reclaimed before their packed time wraps); `table.rs`, the slot table
//! and its protocol;
//! `hot_slots.rs`, [`HotKeys`] and the hot slots' state; `builder.rs`,
//! [`TableOptions`], [`WhenFull`], [`KeyedBuilder`] and their bounds;
//! `family.rs`, the keyed interface written once (the sealed core, the
//! method family, [`KeyedRef`]); `overrides.rs`, the per-key quota store;
//! `limiter.rs`, [`KeyedLimiter`] (its build and check paths); `insert.rs`,
//! the path of a key the table does not hold; `quotas.rs`, quota changes
//! and per-key quotas; `hot.rs`, the hot keys' check paths; `log.rs`, the
//! keyed sliding log (its own table); `policy.rs`, [`KeyedPolicyLimiter`]
//! over either; `concurrency.rs`, [`KeyedConcurrencyLimiter`] (a
//! concurrency limit per key: a [`KeyedLimiter`] over the keyed
//! concurrency algorithm, behind RAII permits).

pub(crate) mod builder;
mod concurrency;
pub(crate) mod family;
mod hot;
mod hot_slots;
mod insert;
mod limiter;
mod log;
mod overrides;
mod policy;
mod quotas;
pub(crate) mod table;
pub(crate) mod wrap;

pub use builder::{KeyedBuilder, TableOptions, WhenFull, MAX_KEYS};
pub use concurrency::{
    KeyedConcurrencyBuilder, KeyedConcurrencyLimiter, KeyedPermit, OwnedKeyedPermit,
};
pub use family::{CheckKeys, KeyedRef};
pub use hot_slots::HotKeys;
pub use limiter::KeyedLimiter;
pub use log::KeyedSlidingWindowLog;
pub use policy::{KeyedPolicyBuilder, KeyedPolicyLimiter};

use crate::algo::{Algorithm, FixedCounter, Gcra, KeyedWord, LeakyGcra, SlidingCounter};
use crate::limiter::DefaultClock;

/// An algorithm a [`KeyedLimiter`] can use: every single-word algorithm
/// (the GCRA buckets and the window counters) whose state packs into the
/// keyed table's 8-byte slot. Sealed: its step is the crate's own
/// single-word step (`algo`'s `WordStep`), its packing `algo`'s `KeyedWord`.
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
pub trait KeyedAlgorithm: Algorithm + KeyedWord {}

impl<A: Algorithm + KeyedWord> KeyedAlgorithm for A {}

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
