//! Loading a key's slot ahead of its check: a prefetch of the slot's cache
//! line, so that its miss overlaps other work (the clock read, the other
//! keys of a batch or of a multi-limit check, an HTTP request's other
//! rules). Not a part of the slot protocol: it publishes and decides
//! nothing (docs/design.md, "Overlapped misses").
//!
//! On x86-64 it is the `prefetcht0` instruction, the crate's one `unsafe`
//! block. A plain load whose value is discarded (what other targets use)
//! also starts the miss, but it cannot retire before its data arrives, so
//! more than about 200 instructions after it the reorder buffer fills and
//! the core stops issuing: a second key's load ahead, issued after work of
//! that size, then waits for the first miss instead of overlapping it. A
//! prefetch retires at once. Measured on the HTTP layer with three rules
//! and 1M clients, each rule's slot loaded ahead as soon as its key is
//! known: 658 ns a request with loads, 530 with prefetches, against 568
//! with loads issued together just before the check (medians of four
//! alternating rounds, the request's making included; docs/benchmarks.md,
//! "The final build").

use super::Table;
#[cfg(not(ratewall_loom))]
use crate::sync::AtomicU64;
#[cfg(all(
    not(ratewall_loom),
    not(all(target_arch = "x86_64", target_feature = "sse"))
))]
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

    /// Prefetches the first slot of the key's probe window, so that the
    /// slot's cache miss overlaps what the caller does next (the clock
    /// read, other keys) instead of following it. A check then finds the
    /// line on its way in. Not compiled under loom (it is no part of the
    /// protocol the models check).
    #[inline]
    pub(crate) fn touch(&self, h: u64) {
        #[cfg(not(ratewall_loom))]
        {
            let (shard, start) = self.locate(h);
            prefetch(&shard.slots[start]);
        }
        #[cfg(ratewall_loom)]
        let _ = h;
    }
}

/// Starts loading `slot`'s cache line and returns at once: a hint that
/// reads nothing the program sees, so it orders nothing.
#[cfg(not(ratewall_loom))]
#[inline(always)]
#[allow(unsafe_code)]
pub(super) fn prefetch(slot: &AtomicU64) {
    #[cfg(all(target_arch = "x86_64", target_feature = "sse"))]
    // SAFETY: `_mm_prefetch` is `unsafe` only because it is declared with
    // `#[target_feature(enable = "sse")]`, and the `cfg` above compiles
    // this call only where the build enables SSE (every x86-64 target
    // does). The instruction never faults, whatever the address, and
    // neither reads nor writes memory the program can observe; the address
    // here is a live slot's, from a reference.
    unsafe {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        _mm_prefetch::<_MM_HINT_T0>(std::ptr::from_ref(slot).cast());
    }
    #[cfg(not(all(target_arch = "x86_64", target_feature = "sse")))]
    {
        // Relaxed: the value is discarded.
        let _ = slot.load(Ordering::Relaxed);
    }
}
