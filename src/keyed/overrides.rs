//! The per-key quota store (premium tiers): [`Overrides`], by key hash.
//! The quota changes that use it are `quotas.rs`.

use crate::sync::{lock, AtomicU64, Mutex, Ordering};
use std::collections::HashMap;

/// Per-key quotas, by key hash. Changed only under the limiter's config
/// mutex.
pub(super) struct Overrides<A> {
    /// How many keys have their own quota; 0 keeps the hot path off `map`.
    count: AtomicU64,
    map: Mutex<HashMap<u64, A>>,
}

impl<A: Copy> Overrides<A> {
    pub(super) fn new() -> Self {
        Overrides {
            count: AtomicU64::new(0),
            map: Mutex::new(HashMap::new()),
        }
    }

    /// Whether any key has its own quota (else checks skip `get`).
    #[inline]
    pub(super) fn any(&self) -> bool {
        // Relaxed: a key's override is inserted before its state is rescaled
        // (AcqRel exchange); a check that loaded the rescaled slot (Acquire)
        // therefore sees the count; one that loaded an older value fails its
        // exchange and comes back here.
        self.count.load(Ordering::Relaxed) != 0
    }

    /// The own quota of the key with hash `h`, if it has one (a mutex: the
    /// slow path of `params_for`, taken only while `any`).
    #[cold]
    #[inline(never)]
    pub(super) fn get(&self, h: u64) -> Option<A> {
        lock(&self.map).get(&h).copied()
    }

    /// A copy of every override, if there is any (for `set_quota`, which
    /// leaves these keys alone). Called under the config mutex.
    pub(super) fn snapshot(&self) -> Option<HashMap<u64, A>> {
        // Relaxed: read under the config mutex, which every override change holds.
        (self.count.load(Ordering::Relaxed) != 0).then(|| lock(&self.map).clone())
    }

    /// Gives the key with hash `h` its own quota. Called under the config
    /// mutex, before the key's state is rescaled.
    pub(super) fn insert(&self, h: u64, a: A) {
        if lock(&self.map).insert(h, a).is_none() {
            // Relaxed: ordered before the caller's rescale exchange, which a
            // check's Acquire load synchronizes with (see `get`).
            self.count.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Removes the own quota of the key with hash `h`; returns it. Called
    /// under the config mutex, before the key's state is rescaled back.
    pub(super) fn remove(&self, h: u64) -> Option<A> {
        let removed = lock(&self.map).remove(&h);
        if removed.is_some() {
            // Relaxed: a check that still sees the old count finds nothing in
            // the map, and one that sees the new count skips it: both use
            // the limiter's quota from here on.
            self.count.fetch_sub(1, Ordering::Relaxed);
        }
        removed
    }
}
