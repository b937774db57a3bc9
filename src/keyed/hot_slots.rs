//! The hot slots of a keyed token bucket: [`HotKeys`], the options, and
//! `Hot`, the slots' owners and stripes. What a check does with them (the
//! lease protocol on a key's table slot, promotion, demotion) is `hot.rs`.

use crate::error::ConfigError;
use crate::lease::{LeaseOptions, Leases, Stripe};
use crate::sync::{AtomicU64, Ordering};
use crossbeam_utils::CachePadded;
use std::fmt;
use std::time::Duration;

/// Most hot slots.
const MAX_SLOTS: usize = 64;
/// A free slot's owner.
pub(super) const FREE: u64 = 0;

/// Opt-in striped leases for the hot keys of a keyed token bucket: `slots`
/// keys at a time (1 to 64) get their own cache-padded stripes, and their
/// checks admit from leases taken from the key's entry in the table, as a
/// [`StripedLimiter`](crate::StripedLimiter) does from its word. The bound
/// of every key stays exact: at most `burst + rate * d` in any interval `d`.
///
/// A key becomes hot when a check of it loses a compare-exchange to another
/// check of the same key (two threads at once on one key), or when
/// [`KeyedLimiter::promote_key`](crate::KeyedLimiter::promote_key) asks; it leaves its slot when another key
/// needs the slot and it took no lease for [`cool_after`](Self::cool_after),
/// or on [`KeyedLimiter::demote_key`](crate::KeyedLimiter::demote_key).
///
/// # Example
///
/// ```
/// use ratewall::{HotKeys, KeyedTokenBucket, LeaseOptions, Rate};
/// use std::sync::Arc;
///
/// let per_tenant = Arc::new(
///     KeyedTokenBucket::<u64>::builder(Rate::per_second(1_000_000).burst(10_000))
///         .hot_keys(HotKeys::new(4).lease(LeaseOptions::new().stripes(8)))
///         .build()?,
/// );
/// let workers: Vec<_> = (0..4)
///     .map(|_| {
///         let l = per_tenant.clone();
///         std::thread::spawn(move || (0..1000).filter(|_| l.check_key(&7).is_allowed()).count())
///     })
///     .collect();
/// let admitted: usize = workers.into_iter().map(|w| w.join().unwrap()).sum();
/// assert!(admitted <= 10_000 + 1_000_000);
/// # Ok::<(), ratewall::ConfigError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct HotKeys {
    pub(super) slots: usize,
    lease: LeaseOptions,
    pub(super) cool_after: Duration,
}

impl HotKeys {
    /// Up to `slots` hot keys at once (1 to 64), with the default lease
    /// options (two stripes per core, at most 64, per slot) and a cool-off
    /// of 1 ms.
    ///
    /// ```
    /// # use ratewall::HotKeys;
    /// let _ = HotKeys::new(4);
    /// ```
    pub const fn new(slots: usize) -> Self {
        HotKeys {
            slots,
            lease: LeaseOptions::new(),
            cool_after: Duration::from_millis(1),
        }
    }

    /// The stripes of each hot slot, its largest lease and its adaptation
    /// threshold, as for a [`StripedLimiter`](crate::StripedLimiter).
    ///
    /// ```
    /// # use ratewall::{HotKeys, LeaseOptions};
    /// let _ = HotKeys::new(4).lease(LeaseOptions::new().stripes(4).max_lease(32));
    /// ```
    #[must_use]
    pub const fn lease(mut self, options: LeaseOptions) -> Self {
        self.lease = options;
        self
    }

    /// How long a hot key must have taken no lease before another key may
    /// take its slot (default 1 ms). Promotion and demotion are cold paths;
    /// this keeps two contended keys from trading one slot back and forth.
    /// A promotion that finds every slot busy does not look again for a
    /// quarter of this (so many contended keys do not scan every stripe on
    /// every lost compare-exchange).
    ///
    /// ```
    /// # use ratewall::HotKeys;
    /// let _ = HotKeys::new(4).cool_after(std::time::Duration::from_millis(10));
    /// ```
    #[must_use]
    pub const fn cool_after(mut self, idle: Duration) -> Self {
        self.cool_after = idle;
        self
    }
}

/// One hot slot's stripes.
pub(super) struct HotSlot {
    pub(super) stripes: Box<[CachePadded<Stripe>]>,
}

/// The hot slots of one keyed table.
pub(crate) struct Hot {
    /// The key's hash per slot (`FREE`: none). A routing hint only: every
    /// lease carries its own key, so an owner read stale never admits a
    /// unit for the wrong key. Read-mostly (written by promotions).
    pub(super) owners: CachePadded<Box<[AtomicU64]>>,
    pub(super) slots: Box<[HotSlot]>,
    pub(super) leases: Leases,
    pub(super) cool_after: u64,
    /// Until when a promotion need not look for a slot: every slot was hot
    /// at the last look (a hint, so that many contended keys do not scan
    /// every stripe on every lost compare-exchange).
    pub(super) full_until: AtomicU64,
    options: HotKeys,
}

impl Hot {
    pub(crate) fn new(params: crate::algo::Gcra, options: HotKeys) -> Result<Self, ConfigError> {
        if options.slots == 0 || options.slots > MAX_SLOTS {
            return Err(ConfigError::Incompatible {
                reason: "hot keys need between 1 and 64 slots",
            });
        }
        let (leases, stripes) = Leases::new(params, &options.lease)?;
        let slots = (0..options.slots)
            .map(|_| HotSlot {
                stripes: (0..stripes)
                    .map(|_| CachePadded::new(Stripe::new()))
                    .collect(),
            })
            .collect();
        let owners = (0..options.slots).map(|_| AtomicU64::new(FREE)).collect();
        Ok(Hot {
            owners: CachePadded::new(owners),
            slots,
            leases,
            cool_after: u64::try_from(options.cool_after.as_nanos()).unwrap_or(u64::MAX),
            full_until: AtomicU64::new(0),
            options,
        })
    }

    /// The slot `h` owns, if any.
    #[inline]
    pub(super) fn slot_of(&self, h: u64) -> Option<usize> {
        if h == FREE {
            return None; // never promoted (see `promote`)
        }
        // Relaxed: a routing hint (see `owners`).
        self.owners
            .iter()
            .position(|o| o.load(Ordering::Relaxed) == h)
    }

    /// Bytes the hot slots own (allocated when the table is built).
    pub(crate) fn memory_bytes(&self) -> usize {
        let stripes: usize = self.slots.iter().map(|s| s.stripes.len()).sum();
        std::mem::size_of::<Self>()
            + self.owners.len() * std::mem::size_of::<AtomicU64>()
            + self.slots.len() * std::mem::size_of::<HotSlot>()
            + stripes * std::mem::size_of::<CachePadded<Stripe>>()
    }

    /// Whether slot `i` took no lease within `cool_after` of `now`.
    pub(super) fn is_cold(&self, i: usize, now: u64) -> bool {
        self.slots[i]
            .stripes
            .iter()
            .filter_map(|s| s.last_take())
            .all(|t| now.saturating_sub(t) >= self.cool_after)
    }
}

impl fmt::Debug for Hot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Relaxed: a snapshot for display.
        let hot = self
            .owners
            .iter()
            .filter(|o| o.load(Ordering::Relaxed) != FREE)
            .count();
        f.debug_struct("Hot")
            .field("options", &self.options)
            .field("max_lease", &self.leases.max_lease)
            .field("hot", &hot)
            .finish()
    }
}
