//! Loading a key's slot ahead of its check: a load whose value is thrown
//! away, so that the slot's cache miss overlaps other work (the clock read,
//! the other keys of a batch or of a multi-limit check). Not a part of the
//! slot protocol: it publishes and decides nothing (docs/design.md,
//! "Overlapped misses").

use super::Table;
#[cfg(not(ratewall_loom))]
use crate::sync::Ordering;
use crate::word::Packing;

/// Slots from which loading a key's slot ahead of a batch's checks pays
/// (`Table::prefetches`): 2 MiB of them, twice a server core's L2 cache.
/// A smaller table mostly stays in the caches, where a load ahead costs a
/// second hash and finds nothing to overlap (measured: 181 instructions a
/// request with 3 HTTP rules on small tables, docs/benchmarks.md).
pub(super) const PREFETCH_MIN_BYTES: usize = 2 << 20;

impl<P: Packing> Table<P> {
    /// Whether the slots outgrow the caches enough that a batch should load
    /// its keys' slots ahead (`touch`) before checking them.
    #[inline]
    pub(crate) fn prefetches(&self) -> bool {
        self.prefetches
    }

    /// Loads the first slot of the key's probe window and discards the
    /// value: a prefetch, so that the slot's cache miss overlaps what the
    /// caller does next (the clock read) instead of following it. A check
    /// then finds the line on its way in. Not compiled under loom (it is no
    /// part of the protocol the models check).
    #[inline]
    pub(crate) fn touch(&self, h: u64) {
        #[cfg(not(ratewall_loom))]
        {
            let (shard, start) = self.locate(h);
            // Relaxed: the value is discarded.
            let _ = shard.slots[start].load(Ordering::Relaxed);
        }
        #[cfg(ratewall_loom)]
        let _ = h;
    }
}
