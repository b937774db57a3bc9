//! The sharded open-addressing table behind [`KeyedLimiter`](super::KeyedLimiter).
//!
//! # Layout
//!
//! ```text
//!  63                40 39                                            0
//! +--------------------+-----------------------------------------------+
//! | tag (24 bits, !=0) | packed state (40 bits: `word::Packing`)       |
//! +--------------------+-----------------------------------------------+
//! ```
//!
//! One slot is one 8-byte atomic. Word 0 is an empty slot (a probe stops
//! there), 1 a tombstone (a probe goes on, an insert may reuse it); tags
//! are never 0, so no live word is either. No key is stored. A key whose
//! tag equals that of a key in its chain shares its slot (about 2^-24 per
//! slot compared: docs/design.md, "Keyed table").
//!
//! The table has `2^k` cache-padded shards picked by the hash's low bits.
//! A shard's slots are a *main* region and a small *stash* after it. A key
//! lives in its *chain*: the `PROBE` slots (wrapping within the main region)
//! from a start picked by the hash's high bits, then the stash; no empty slot
//! lies between the chain's start and the key (linear probing; empties never
//! come back). The stash takes the rare key whose window is full of live
//! keys: with windows of 32 slots at a two-thirds load, about one key in
//! 1,000 to 2,000 (by simulation: at most 29 per shard of 15,625 keys).
//! The stash is a sixteenth of the share up to 128 slots, and one slot per
//! 512 keys of a share above 65,536 keys: at 10M keys over 64 shards a
//! stash of 128 overflowed (11 keys of 10M untracked with one seed,
//! `tests/keyed_promise_big.rs`), one of 305 does not.
//!
//! # Sizing: `max_keys` is a promise
//!
//! The keys tracked are counted across the whole table and never exceed `max_keys`; a shard
//! holds as many as hash to it (no per-shard cap, so an unlucky split of the keys between shards
//! rejects nothing). Each shard gets 12 bytes per key of its even share of `max_keys` (header
//! included): 1.5 slots per key, a two-thirds load when full. Only a shard that receives far
//! more than its share (explicit shard counts with a few keys each) can run out of room first.
//!
//! # Slot protocol
//!
//! - Check of an existing key (lock-free): load the word; if its tag is ours, unpack its state
//!   and run the step; a step that writes nothing returns at once (a denial writes no memory);
//!   otherwise compare-exchange the whole word from seen to (ours, packed next). A failure whose
//!   tag is still ours recomputes from the observed word; a failure whose tag changed means the
//!   slot was reclaimed for another key: the check looks the key up again. Because the exchange
//!   compares the tag with the state, a decision computed for one key can never be written over
//!   the state of a key with another tag, whatever values the states take (ABA).
//! - Everything that changes a tag (insert, reclaim, eviction, the wrap sweep, `retain_active`,
//!   `remove`) holds the shard's mutex and uses the same compare-exchange, so it also loses
//!   cleanly to a concurrent check.
//! - Time in a packed state is modular: the wrap sweep (`wrap.rs`) rewrites idle keys' words
//!   before it wraps; every entry point asks `sweep_due`.

use super::wrap::Wrap;
use crate::sync::{lock, AtomicU64, Mutex, Ordering};
use crate::word::{Packing, STATE_BITS, STATE_MASK};
use ahead::PREFETCH_MIN_BYTES;
use crossbeam_utils::CachePadded;
use std::fmt;
use std::sync::Arc;

/// A slot that was never used.
pub(crate) const EMPTY: u64 = 0;
/// A slot whose key was removed.
pub(crate) const TOMB: u64 = 1;

/// Slots scanned for one key: 32 x 8 B = 256 B, four cache lines.
pub(crate) const PROBE: usize = 32;
/// Slots scanned per insert, beyond the key's chain, to reclaim idle keys
/// when the table is at `max_keys` (amortized eviction).
const SWEEP: usize = 64;
/// Sweep ranges `evict_elsewhere` tries before giving up.
const EVICT_ATTEMPTS: usize = 4;
/// Bytes per key of `max_keys`, shard headers included: 1.5 slots per key.
const BYTES_PER_KEY: usize = 12;
/// Largest stash per shard (slots) for shares up to 65,536 keys.
const MAX_STASH: usize = 128;
/// Keys per stash slot above that: a share of 156,000 keys (10M over 64
/// shards) sends about 100 keys to the stash, at times more than 128.
const KEYS_PER_STASH_SLOT: usize = 512;
/// Bytes set aside from the budget for the table's and the limiter's own
/// headers (the budget is per requested key, everything included).
const OWNER_BYTES: usize = 1024;

/// Bytes per slot.
const SLOT: usize = 8;

/// A slot word: the key's tag above `STATE_BITS`, its packed state below.
#[inline]
fn pack(tag: u64, packed: u64) -> u64 {
    debug_assert!(packed <= STATE_MASK);
    (tag << STATE_BITS) | packed
}

/// The tag of a slot word (0: empty or tombstone).
#[inline]
fn tag_of(v: u64) -> u64 {
    v >> STATE_BITS
}

/// A key's tag: the top 24 bits of its hash times an odd constant (a
/// bijection of the hash, so the bits the shard and the chain's start come
/// from are mixed with all the others), never 0.
#[inline]
pub(crate) fn tag(h: u64) -> u64 {
    let t = h.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> STATE_BITS;
    t | u64::from(t == 0)
}

struct Shard<P> {
    /// The main region (`main` slots), then the stash.
    slots: Box<[AtomicU64]>,
    main: usize,
    /// The table's key count, shared by every shard.
    count: Arc<KeyCount>,
    /// Serializes tag changes; holds the reclaim sweep's cursor.
    inner: Mutex<usize>,
    /// The table's packing of states (a copy per shard, beside its slots).
    packing: P,
    /// When the wrap sweep last swept this shard (written under `inner`).
    swept: AtomicU64,
}

/// Keys tracked by the whole table, and the most it may track.
#[derive(Debug)]
struct KeyCount {
    len: AtomicU64,
    max: u64,
}

impl<P: Packing> Shard<P> {
    /// The full state a slot word holds at `now`.
    #[inline]
    fn state_of(&self, v: u64, now: u64) -> u64 {
        self.packing.unpack(v & STATE_MASK, now)
    }

    /// The slot word of the key tagged `tag` in state `state` at `now`.
    #[inline]
    fn word(&self, tag: u64, state: u64, now: u64) -> u64 {
        pack(tag, self.packing.pack(state, now))
    }

    /// Whether the table is under `max_keys` (a hint: `reserve` decides).
    fn has_room(&self) -> bool {
        // Relaxed: a count; it publishes nothing.
        self.count.len.load(Ordering::Relaxed) < self.count.max
    }

    /// Takes one unit of the table's `max_keys` for a key about to be
    /// stored; false if none is left. Caller holds `inner`.
    fn reserve(&self) -> bool {
        // Relaxed: the count publishes nothing; the slot exchange that
        // follows publishes the key. The read-modify-write keeps the total
        // at most `max` when shards reserve at once.
        self.count
            .len
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n < self.count.max).then_some(n + 1)
            })
            .is_ok()
    }

    /// Gives back a unit (a reserved slot that was not taken, or a key
    /// removed). Caller holds `inner`.
    fn count_removal(&self) {
        // Relaxed: as in `reserve`.
        self.count.len.fetch_sub(1, Ordering::Relaxed);
    }

    /// The slot after `i` in a chain: wraps within the main region; in the
    /// stash, `None` at its end.
    #[inline]
    fn next_in_chain(&self, i: usize, step: usize) -> Option<usize> {
        if i < self.main {
            if step + 1 < PROBE.min(self.main) {
                Some(if i + 1 == self.main { 0 } else { i + 1 })
            } else if self.slots.len() > self.main {
                Some(self.main) // the window is done: the stash
            } else {
                None
            }
        } else {
            (i + 1 < self.slots.len()).then_some(i + 1)
        }
    }

    /// The slots of the chain that starts at `start`, in order: the window,
    /// then the stash.
    fn chain(&self, start: usize) -> impl Iterator<Item = usize> + '_ {
        let mut at = Some((start, 0usize));
        std::iter::from_fn(move || {
            let (i, step) = at?;
            at = self.next_in_chain(i, step).map(|j| (j, step + 1));
            Some(i)
        })
    }
}

/// What the insert path does when the key's window has no room.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Full {
    Reject,
    Untracked,
    Evict,
}

/// How an insert went.
pub(crate) enum Inserted<R> {
    /// The key was present after all (another thread inserted it).
    Existing(R),
    /// The key now has a slot; `evicted` says whether an active key made room.
    New { outcome: R, evicted: bool },
    /// The step asked for no write (nothing to track).
    NotStored(R),
    /// No room and the policy did not evict. `soonest` is the least time
    /// (by the caller's measure) until an active key in the way goes idle.
    Full { soonest: u64 },
}

/// What `insert` would do now for a key the table does not hold (a peek's
/// prediction; it changes nothing).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Room {
    /// A free slot or an idle key's: the key would be tracked.
    Tracked,
    /// An active key would be evicted for it.
    Evict,
    /// No room: as `Inserted::Full`.
    Full { soonest: u64 },
}

/// Per-algorithm views of a state word the insert path needs.
pub(crate) trait StateView {
    /// Whether the state equals a fresh key's (may be reclaimed).
    fn is_idle(&self, state: u64) -> bool;
    /// Nanoseconds until the state goes idle (eviction picks the least).
    fn time_to_idle(&self, state: u64) -> u64;
    /// The units the state holds (eviction's tie-break: the least).
    fn held(&self, state: u64) -> u64;
    /// The time the view judges states at (the word's time base).
    fn now(&self) -> u64;
}

pub(crate) struct Table<P> {
    shards: Box<[CachePadded<Shard<P>>]>,
    shard_mask: u64,
    /// The wrap sweep's schedule (`wrap.rs`).
    wrap: Wrap,
    /// The packing (as each shard's copy), for `time`.
    packing: P,
    /// Whether a batch loads its keys' slots ahead (`PREFETCH_MIN_BYTES`).
    prefetches: bool,
}

impl<P: Packing> Table<P> {
    /// A table for `max_keys` keys over `shards` shards (a power of two, at
    /// most `max_keys`; the caller validated both), built at `now` (its
    /// clock's reading: the wrap sweep's schedule starts there).
    pub(crate) fn new(max_keys: usize, shards: usize, packing: P, now: u64) -> Table<P> {
        debug_assert!(shards.is_power_of_two() && shards <= max_keys);
        let base = max_keys / shards;
        let extra = max_keys % shards;
        let count = Arc::new(KeyCount {
            len: AtomicU64::new(0),
            max: max_keys as u64,
        });
        // Each shard's header, and its part of what the table and its owner
        // hold beside the shards (`memory_bytes` counts both).
        let header = std::mem::size_of::<CachePadded<Shard<P>>>() + OWNER_BYTES.div_ceil(shards);
        let shards: Box<[CachePadded<Shard<P>>]> = (0..shards)
            .map(|i| {
                let share = base + usize::from(i < extra);
                // The budget, header included. Small tables, where the
                // headers would eat it, get up to 64 slots more than their
                // share, at most 1.5 per key (and at least one spare).
                let budget = (share * BYTES_PER_KEY).saturating_sub(header) / SLOT;
                let small = (share * 3).div_ceil(2).min(share + 64).max(share + 1);
                let n = budget.max(small);
                let stash = (share / 16).min(MAX_STASH.max(share / KEYS_PER_STASH_SLOT));
                CachePadded::new(Shard {
                    slots: (0..n).map(|_| AtomicU64::new(0)).collect(),
                    main: n - stash,
                    count: Arc::clone(&count),
                    inner: Mutex::new(0),
                    packing,
                    swept: AtomicU64::new(now),
                })
            })
            .collect();
        let shard_mask = shards.len() as u64 - 1;
        let wrap = Wrap::new(packing.sweep_period(), shards.len(), now);
        let slot_bytes: usize = shards.iter().map(|s| s.slots.len() * SLOT).sum();
        Table {
            shards,
            shard_mask,
            wrap,
            packing,
            prefetches: slot_bytes >= PREFETCH_MIN_BYTES,
        }
    }

    #[inline]
    fn locate(&self, h: u64) -> (&Shard<P>, usize) {
        let shard = &self.shards[(h & self.shard_mask) as usize];
        let n = shard.main as u128;
        // The high bits pick the start (the low ones picked the shard).
        let start = ((u128::from(h) * n) >> 64) as usize;
        (shard, start)
    }

    /// Runs `step` on the key's state if the key is tracked, with the slot
    /// protocol (see the module doc). `None`: not tracked.
    #[inline]
    pub(crate) fn update<R>(
        &self,
        h: u64,
        now: u64,
        step: &mut impl FnMut(u64) -> (R, Option<u64>),
    ) -> Option<R> {
        self.apply(h, now, step).map(|(r, _)| r)
    }

    /// The key's state, if tracked: one load of its slot (a snapshot, for a
    /// decision's counts; it decides nothing).
    #[inline]
    pub(crate) fn state(&self, h: u64, now: u64) -> Option<u64> {
        let (shard, start) = self.locate(h);
        find(shard, start, tag(h)).map(|(_, v)| shard.state_of(v, now))
    }

    /// [`update`](Self::update), also returning the state the winning step
    /// ran on (the hot path builds its decision from it after the exchange,
    /// as `AtomicWord::apply`).
    #[inline]
    pub(crate) fn apply<R>(
        &self,
        h: u64,
        now: u64,
        step: &mut impl FnMut(u64) -> (R, Option<u64>),
    ) -> Option<(R, u64)> {
        let fp = tag(h);
        let (shard, start) = self.locate(h);
        'lookup: loop {
            let (slot, mut seen) = find(shard, start, fp)?;
            loop {
                let state = shard.state_of(seen, now);
                let (outcome, next) = step(state);
                let next = match next.map(|n| shard.word(fp, n, now)) {
                    Some(next) if next != seen => next,
                    // No write (a denial, a peek, a step that changed
                    // nothing): nothing to publish. As in
                    // `AtomicWord::update`, confirm the slot still holds what
                    // the step saw: the step read the parameters after
                    // loading it, and a quota change may have rescaled it in
                    // between (a plain load: the deny path stays read-only).
                    _ => {
                        // Acquire: as the slot loads in `find`.
                        let again = slot.load(Ordering::Acquire);
                        if again == seen {
                            return Some((outcome, state));
                        }
                        if tag_of(again) != fp {
                            continue 'lookup;
                        }
                        seen = again;
                        continue;
                    }
                };
                // Success AcqRel / failure Acquire: as `AtomicWord::update`
                // (pairs with a quota change's rescaling exchange).
                match slot.compare_exchange(seen, next, Ordering::AcqRel, Ordering::Acquire) {
                    Ok(_) => return Some((outcome, state)),
                    // Lost the race to a check of the same key: recompute
                    // from the state we saw, never from the one we wanted.
                    Err(actual) if tag_of(actual) == fp => seen = actual,
                    // The slot was reclaimed for another key meanwhile: our
                    // decision must not touch its state; look up again.
                    Err(_) => continue 'lookup,
                }
            }
        }
    }

    /// The insert path for a key `update` did not find: under the shard
    /// mutex, finds the key or a slot for it and stores `step(0)`'s state.
    pub(crate) fn insert<R>(
        &self,
        h: u64,
        step: &mut impl FnMut(u64) -> (R, Option<u64>),
        view: &impl StateView,
        policy: Full,
    ) -> Inserted<R> {
        let fp = tag(h);
        let now = view.now();
        let (shard, start) = self.locate(h);
        let mut cursor = lock(&shard.inner);
        loop {
            // Fingerprints change only under this mutex: if the key is here
            // now, it stays; `update` only retries on a state race.
            if let Some(r) = self.update(h, now, step) {
                return Inserted::Existing(r);
            }
            let ChainScan {
                free,
                idle,
                ends_in_window,
            } = scan_chain(shard, start, view);
            // A free slot while the table is under `max_keys`; else an idle
            // key's slot (the count stays the same); else, at `max_keys`,
            // reclaim idle keys further on (amortized: `SWEEP` slots per
            // insert) and take the free slot if that made room. (`room`
            // mirrors these choices: keep the two in step.)
            let target = match (free, idle) {
                (Some((i, v)), _) if shard.has_room() => Some((i, v, true)),
                (_, Some((i, v))) => Some((i, v, false)),
                (Some((i, v)), None) if sweep(shard, &mut cursor, view) => Some((i, v, true)),
                _ => None,
            };
            if let Some((i, v, grows)) = target {
                match place(shard, i, v, (fp, now), grows, false, step) {
                    Some(inserted) => return inserted,
                    // A check made the idle key active again, or another
                    // shard took the last unit meanwhile: start over.
                    None => continue,
                }
            }
            // No room: the chain is full of active keys, or the table is at
            // `max_keys` with no idle key found. The active key closest to
            // idle in the window (and the stash, if the chain reaches it) is
            // the victim, or gives the `soonest` a rejected key may retry.
            let victim = least_time_to_idle(shard, start, ends_in_window, view);
            if policy != Full::Evict {
                return Inserted::Full {
                    soonest: victim.map_or(0, |(_, _, t)| t),
                };
            }
            // Evict: the active key closest to idle. With a free slot in the
            // chain, the victim becomes a tombstone and the key takes the free
            // slot; otherwise the key takes the victim's slot.
            let (at, expect, grows) = match (victim, free) {
                (Some((vi, vv, _)), Some((fi, fv))) => {
                    if !evict(shard, vi, vv) {
                        continue; // the victim was checked meanwhile: choose again
                    }
                    (fi, fv, true)
                }
                (Some((vi, vv, _)), None) => (vi, vv, false),
                (None, Some((fi, fv))) => {
                    // The chain has room but the table is at `max_keys` and
                    // no key is in the window: evict the best victim of this
                    // shard's next sweep ranges.
                    if !evict_elsewhere(shard, &mut cursor, view) {
                        return Inserted::Full { soonest: 0 };
                    }
                    (fi, fv, true)
                }
                (None, None) => return Inserted::Full { soonest: 0 },
            };
            match place(shard, at, expect, (fp, now), grows, true, step) {
                Some(inserted) => return inserted,
                // The victim was checked meanwhile, or the eviction freed a
                // unit but another shard took it: choose again.
                None => continue,
            }
        }
    }

    /// What `insert` would do for the untracked key `h` under `policy`, read
    /// only: the same scans in the same order (`scan_chain`, the table's key
    /// count, the sweep range, `least_time_to_idle`, `evict_elsewhere`'s
    /// ranges), without reclaiming or evicting anything. Locks the shard
    /// only when the key's chain has no free slot while the table is under
    /// `max_keys`. Inserts into other shards may change the count meanwhile
    /// (as any racing check may change the answer).
    pub(crate) fn room(&self, h: u64, view: &impl StateView, policy: Full) -> Room {
        let (shard, start) = self.locate(h);
        let n = shard.slots.len();
        if scan_chain(shard, start, view).free.is_some() && shard.has_room() {
            return Room::Tracked;
        }
        let cursor = lock(&shard.inner);
        let chain = scan_chain(shard, start, view);
        let free = chain.free.is_some();
        // `sweep` reports whether the table is under `max_keys` afterwards:
        // at `max_keys`, whether it reclaimed a key.
        if (free && shard.has_room())
            || chain.idle.is_some()
            || (free && sweep_finds_idle(shard, *cursor, view))
        {
            return Room::Tracked;
        }
        let victim = least_time_to_idle(shard, start, chain.ends_in_window, view);
        match (policy, victim, free) {
            (Full::Evict, Some(_), _) => Room::Evict,
            // The insert's sweep moves the cursor on before `evict_elsewhere`.
            (Full::Evict, None, true)
                if sweep_finds_active(shard, (*cursor + SWEEP.min(n)) % n) =>
            {
                Room::Evict
            }
            (Full::Evict, _, _) => Room::Full { soonest: 0 },
            (_, victim, _) => Room::Full {
                soonest: victim.map_or(0, |(_, _, t)| t),
            },
        }
    }

    /// Removes every idle key, one shard at a time (each shard's inserts
    /// wait for its own pass only). Returns how many were removed.
    pub(crate) fn retain_active(&self, view: &impl StateView) -> usize {
        self.shards
            .iter()
            .map(|s| {
                let _guard = lock(&s.inner);
                reclaim_idle(s, view)
            })
            .sum()
    }

    /// Removes the key (a reset: its next check is a fresh key's), under
    /// its shard's mutex. Whether it was tracked.
    pub(crate) fn remove(&self, h: u64) -> bool {
        let (shard, start) = self.locate(h);
        let _guard = lock(&shard.inner);
        // Tags change only under the mutex: a failed exchange is a racing
        // check of this key; look again.
        while let Some((i, v)) = position(shard, start, tag(h)) {
            if evict(shard, i, v) {
                return true;
            }
        }
        false
    }

    /// Whether the wrap sweep (`wrap.rs`) is due at `now`: every entry
    /// point asks before it reads a slot (one load of a read-mostly word and
    /// a compare), and runs [`sweep_wrap`](Self::sweep_wrap) if so.
    #[inline]
    pub(crate) fn sweep_due(&self, now: u64) -> bool {
        self.wrap.is_due(now)
    }

    /// The wrap sweep's due part: the shards due at `now` (the entry
    /// point's time: it drives the schedule) have their idle keys rewritten
    /// as idle states (`normalize_idle`), judged and packed at `view.now()`
    /// (at most `now`: the owner's own clock when an explicit instant runs
    /// ahead of it, so that usage still held at the clock's time is kept).
    /// Returns the shards swept. Takes no shard mutex while the caller
    /// holds one.
    #[cold]
    #[inline(never)]
    pub(crate) fn sweep_wrap(&self, now: u64, view: &impl StateView) -> usize {
        let judged = view.now();
        debug_assert!(judged <= now);
        self.wrap.run(now, self.shards.len(), |i| {
            let shard = &self.shards[i];
            let _guard = lock(&shard.inner);
            // Relaxed: read and written under the shard's mutex.
            let at = self
                .wrap
                .read_at(shard.swept.load(Ordering::Relaxed), judged);
            normalize_idle(shard, at, view);
            shard.swept.store(judged, Ordering::Relaxed);
        })
    }

    /// Applies `f` to every tracked key's state (quota changes) with the
    /// slot protocol, but for the keys with hashes in `skip` (per-key
    /// quotas; found under the mutexes, where no key moves). Takes every
    /// shard's mutex first and holds them all (an insert reads the
    /// parameters under its shard's mutex: taking them one by one while the
    /// parameters are unreadable would deadlock); `between` runs once all
    /// are held, before the first state changes (it starts the change).
    pub(crate) fn for_each_state(
        &self,
        now: u64,
        skip: &[u64],
        between: impl FnOnce(),
        mut f: impl FnMut(u64) -> u64,
    ) {
        let guards: Vec<_> = self.shards.iter().map(|s| lock(&s.inner)).collect();
        let skipped: Vec<*const AtomicU64> = skip
            .iter()
            .filter_map(|&h| {
                let (shard, start) = self.locate(h);
                find(shard, start, tag(h)).map(|(slot, _)| slot as *const AtomicU64)
            })
            .collect();
        between();
        for shard in self.shards.iter() {
            for slot in shard.slots.iter() {
                if skipped.contains(&(slot as *const AtomicU64)) {
                    continue;
                }
                // Acquire: as in `find`.
                let mut v = slot.load(Ordering::Acquire);
                while tag_of(v) != 0 {
                    let next = shard.word(tag_of(v), f(shard.state_of(v, now)), now);
                    if next == v {
                        break;
                    }
                    // AcqRel: Release pairs with a checker's Acquire load (see
                    // `ParamCell`); the tag cannot change (we hold the
                    // mutex), so a failure is a racing check: redo its result.
                    match slot.compare_exchange(v, next, Ordering::AcqRel, Ordering::Acquire) {
                        Ok(_) => break,
                        Err(actual) => v = actual,
                    }
                }
            }
        }
        drop(guards);
    }

    /// (shard, window start) of a hash: for tests that need two keys to
    /// compete for one slot (loom models only).
    #[cfg(ratewall_loom)]
    pub(crate) fn home(&self, h: u64) -> (usize, usize) {
        let (_, start) = self.locate(h);
        ((h & self.shard_mask) as usize, start)
    }

    /// The table's packing of states (fixed for its life).
    pub(crate) fn packing(&self) -> &P {
        &self.packing
    }

    /// `now` in the packing's time unit (`Packing::time`).
    #[inline]
    pub(crate) fn time(&self, now: u64) -> u64 {
        self.packing.time(now)
    }

    /// Keys tracked (idle ones not yet reclaimed included).
    pub(crate) fn len(&self) -> usize {
        // Relaxed: a count for reporting; it publishes nothing.
        self.shards[0].count.len.load(Ordering::Relaxed) as usize
    }

    /// The most keys the table tracks.
    pub(crate) fn capacity(&self) -> usize {
        self.shards[0].count.max as usize
    }

    pub(crate) fn shard_count(&self) -> usize {
        self.shards.len()
    }

    /// Bytes the table owns: slots plus shard headers.
    pub(crate) fn memory_bytes(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.slots.len() * std::mem::size_of::<AtomicU64>())
            .sum::<usize>()
            + self.shards.len() * std::mem::size_of::<CachePadded<Shard<P>>>()
            + std::mem::size_of::<Self>()
            + std::mem::size_of::<KeyCount>()
            + self.wrap.heap_bytes()
    }
}

/// Removes every key of `shard` idle at `view.now()` (`retain_active`).
/// Caller holds the shard's mutex.
fn reclaim_idle<P: Packing>(shard: &Shard<P>, view: &impl StateView) -> usize {
    rewrite_idle(shard, view.now(), view, |_| TOMB)
}

/// Rewrites every key of `shard` idle at `view.now()` (its state read at
/// `at`, see `Wrap::read_at`) as the idle state packed at `view.now()`: the
/// key stays tracked, exactly as an idle key not yet reclaimed, and its word
/// reads as idle for the sweep periods to come. Caller holds the shard's
/// mutex.
fn normalize_idle<P: Packing>(shard: &Shard<P>, at: u64, view: &impl StateView) {
    let now = view.now();
    rewrite_idle(shard, at, view, |tag| shard.word(tag, 0, now));
}

/// The pass `reclaim_idle` and `normalize_idle` share: every key of `shard`
/// whose state, read at `at`, is idle at `view.now()` gets the word
/// `to(its tag)` (a key given a tombstone leaves the table's count).
/// Returns how many words it changed. Caller holds the shard's mutex.
fn rewrite_idle<P: Packing>(
    shard: &Shard<P>,
    at: u64,
    view: &impl StateView,
    to: impl Fn(u64) -> u64,
) -> usize {
    let mut changed = 0;
    for slot in shard.slots.iter() {
        // Acquire: as in `find`.
        let mut v = slot.load(Ordering::Acquire);
        // A check that changes the slot meanwhile fails our exchange: judge
        // its state again (a check that leaves the key idle must not make
        // the pass skip it until its next run).
        while tag_of(v) != 0 && view.is_idle(shard.state_of(v, at)) {
            let next = to(tag_of(v));
            if next == v {
                break;
            }
            // AcqRel: as any slot update (a check that loses to it reads the
            // new word with Acquire and recomputes).
            match slot.compare_exchange(v, next, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => {
                    if next == TOMB {
                        shard.count_removal();
                    }
                    changed += 1;
                    break;
                }
                Err(actual) => v = actual,
            }
        }
    }
    changed
}

/// The key's slot in its chain, and the value seen there.
#[inline]
fn find<P: Packing>(shard: &Shard<P>, start: usize, fp: u64) -> Option<(&AtomicU64, u64)> {
    // The window (`PROBE.min(main)` slots from `start`, wrapping at `main`)
    // as two plain slices, `start..main` then `0..`: no index wrap and no
    // bounds check per slot (docs/benchmarks.md, "cuts on the 8-byte slot").
    let (before, from) = shard.slots[..shard.main].split_at(start);
    let first = from.len().min(PROBE);
    if let Some(found) = walk(&from[..first], fp) {
        return found;
    }
    let rest = (PROBE - first).min(before.len());
    if let Some(found) = walk(&before[..rest], fp) {
        return found;
    }
    find_in_stash(shard, fp)
}

/// `find`'s walk over `slots` in order (the window's two parts and the
/// stash share it): `Some` of what it found (the key's slot, or `None` at
/// an empty slot, where the chain ends), or `None` if every slot holds
/// another key or a tombstone.
#[inline(always)]
#[allow(clippy::option_option)]
fn walk(slots: &[AtomicU64], fp: u64) -> Option<Option<(&AtomicU64, u64)>> {
    for slot in slots {
        // Acquire: pairs with the AcqRel exchange that stored this value,
        // so the state (and, for a quota change, the odd parameter version
        // ordered before it) is visible to the step.
        let v = slot.load(Ordering::Acquire);
        if tag_of(v) == fp {
            return Some(Some((slot, v)));
        }
        if v == EMPTY {
            return Some(None);
        }
    }
    None
}

/// `find` for the cold paths that need the slot's index (same chain, same
/// order).
fn position<P: Packing>(shard: &Shard<P>, start: usize, fp: u64) -> Option<(usize, u64)> {
    for i in shard.chain(start) {
        // Acquire: as in `find`.
        let v = shard.slots[i].load(Ordering::Acquire);
        if tag_of(v) == fp {
            return Some((i, v));
        }
        if v == EMPTY {
            return None;
        }
    }
    None
}

/// `find` past a full window: the stash (rare, kept out of line).
#[cold]
#[inline(never)]
fn find_in_stash<P: Packing>(shard: &Shard<P>, fp: u64) -> Option<(&AtomicU64, u64)> {
    walk(&shard.slots[shard.main..], fp).flatten()
}

/// What a scan of a key's chain, up to its first empty slot, found (read
/// only; `insert` decides on it and `room` predicts from it).
struct ChainScan {
    /// The first free slot (empty or tombstone), and the value seen there.
    free: Option<(usize, u64)>,
    /// The first idle key's slot, and the value seen there.
    idle: Option<(usize, u64)>,
    /// The chain ends at an empty slot of the window, short of the stash.
    ends_in_window: bool,
}

/// Scans the chain from `start` (the window, then the stash) up to its
/// first empty slot: no slot beyond it can hold or take the key.
fn scan_chain<P: Packing>(shard: &Shard<P>, start: usize, view: &impl StateView) -> ChainScan {
    let mut scan = ChainScan {
        free: None,
        idle: None,
        ends_in_window: false,
    };
    for i in shard.chain(start) {
        // Acquire: as in `find`.
        let v = shard.slots[i].load(Ordering::Acquire);
        match v {
            EMPTY => {
                scan.free.get_or_insert((i, v));
                scan.ends_in_window = i < shard.main;
                break;
            }
            TOMB => {
                scan.free.get_or_insert((i, v));
            }
            _ => {
                if scan.idle.is_none() && view.is_idle(shard.state_of(v, view.now())) {
                    scan.idle = Some((i, v));
                }
            }
        }
    }
    scan
}

/// The insert's victim (or a rejected key's `soonest`): among the keys of the whole window from
/// `start`, and of the stash unless the chain ends in the window, the least by `rank`, the
/// first in scan order on a tie. Read only.
fn least_time_to_idle<P: Packing>(
    shard: &Shard<P>,
    start: usize,
    ends_in_window: bool,
    view: &impl StateView,
) -> Option<(usize, u64, u64)> {
    let mut victim: Option<(usize, u64, (u64, u64))> = None;
    for i in shard.chain(start) {
        if ends_in_window && i >= shard.main {
            break; // the key's chain stops short of the stash
        }
        // Acquire: as in `find`.
        let v = shard.slots[i].load(Ordering::Acquire);
        if tag_of(v) != 0 {
            let rank = rank(shard, v, view);
            if victim.map_or(true, |(_, _, best)| rank < best) {
                victim = Some((i, v, rank));
            }
        }
    }
    victim.map(|(i, v, (ttl, _))| (i, v, ttl))
}

/// Eviction's order: the time to idle, then the units held (a window's keys go idle together).
fn rank<P: Packing>(shard: &Shard<P>, v: u64, view: &impl StateView) -> (u64, u64) {
    let s = shard.state_of(v, view.now());
    (view.time_to_idle(s), view.held(s))
}

/// Turns an idle key's slot into a tombstone if it is still `v` (caller holds
/// the shard mutex). A racing check that makes the key active wins.
fn tombstone<P: Packing>(shard: &Shard<P>, i: usize, v: u64, view: &impl StateView) -> bool {
    debug_assert!(view.is_idle(shard.state_of(v, view.now())));
    evict(shard, i, v)
}

/// Stores the new key (tag `fp`, state from `step(0)` packed at `now`) in slot `i`
/// of `shard`, which must still hold `v`; `grows`: the key adds to the
/// shard's count (a free slot), `evicted`: it replaces or follows an
/// evicted key. `None` if the caller must choose again: another shard took
/// the last count unit, or a check changed the slot meanwhile (made the idle
/// key active again, or checked the victim).
fn place<R, P: Packing>(
    shard: &Shard<P>,
    i: usize,
    v: u64,
    (fp, now): (u64, u64),
    grows: bool,
    evicted: bool,
    step: &mut impl FnMut(u64) -> (R, Option<u64>),
) -> Option<Inserted<R>> {
    let (outcome, next) = step(0);
    let Some(next) = next else {
        // A fresh key's step that writes nothing: nothing to track.
        return Some(Inserted::NotStored(outcome));
    };
    let next = shard.word(fp, next, now);
    if grows && !shard.reserve() {
        return None;
    }
    // AcqRel: publishes the new key's state like any update.
    match shard.slots[i].compare_exchange(v, next, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => Some(Inserted::New { outcome, evicted }),
        Err(_) => {
            if grows {
                shard.count_removal();
            }
            None
        }
    }
}

/// Removes the key in slot `i` (leaving a tombstone) if the slot still holds
/// `v`; caller holds the shard mutex. A racing check that changed the slot
/// wins, and the caller chooses again.
fn evict<P: Packing>(shard: &Shard<P>, i: usize, v: u64) -> bool {
    // AcqRel: a check of the removed key that loses this race sees the
    // tombstone and looks its key up again.
    let removed = shard.slots[i]
        .compare_exchange(v, TOMB, Ordering::AcqRel, Ordering::Acquire)
        .is_ok();
    if removed {
        shard.count_removal();
    }
    removed
}

/// At `max_keys`: scans the shard's next `SWEEP` slots (main region and
/// stash alike) from the cursor and reclaims the idle keys there. Whether
/// the table is now under `max_keys`.
fn sweep<P: Packing>(shard: &Shard<P>, cursor: &mut usize, view: &impl StateView) -> bool {
    let n = shard.slots.len();
    for _ in 0..SWEEP.min(n) {
        let i = *cursor % n;
        *cursor = (i + 1) % n;
        // Acquire: as in `find`.
        let v = shard.slots[i].load(Ordering::Acquire);
        if tag_of(v) != 0 && view.is_idle(shard.state_of(v, view.now())) {
            tombstone(shard, i, v, view);
        }
    }
    shard.has_room()
}

/// Whether `sweep` from `cursor` would reclaim a key (read only).
fn sweep_finds_idle<P: Packing>(shard: &Shard<P>, cursor: usize, view: &impl StateView) -> bool {
    let n = shard.slots.len();
    (0..SWEEP.min(n)).any(|k| {
        // Acquire: as in `find`.
        let v = shard.slots[(cursor + k) % n].load(Ordering::Acquire);
        tag_of(v) != 0 && view.is_idle(shard.state_of(v, view.now()))
    })
}

/// Whether `evict_elsewhere` from `cursor` would find a key (read only).
fn sweep_finds_active<P: Packing>(shard: &Shard<P>, cursor: usize) -> bool {
    let n = shard.slots.len();
    (0..EVICT_ATTEMPTS * SWEEP.min(n)).any(|k| {
        // Acquire: as in `find`.
        tag_of(shard.slots[(cursor + k) % n].load(Ordering::Acquire)) > TOMB
    })
}

/// Evicts the key closest to idle (`rank`) among the shard's next `SWEEP`
/// slots from the cursor (the first in scan order on a tie); a range without a key
/// moves on to the next, up to `EVICT_ATTEMPTS` ranges. Whether one was
/// removed.
fn evict_elsewhere<P: Packing>(
    shard: &Shard<P>,
    cursor: &mut usize,
    view: &impl StateView,
) -> bool {
    let n = shard.slots.len();
    for _attempt in 0..EVICT_ATTEMPTS {
        let mut best: Option<(usize, u64, (u64, u64))> = None;
        for k in 0..SWEEP.min(n) {
            let i = (*cursor + k) % n;
            // Acquire: as in `find`.
            let v = shard.slots[i].load(Ordering::Acquire);
            if tag_of(v) != 0 {
                let rank = rank(shard, v, view);
                if best.map_or(true, |(_, _, b)| rank < b) {
                    best = Some((i, v, rank));
                }
            }
        }
        *cursor = (*cursor + SWEEP.min(n)) % n;
        if let Some((i, v, _)) = best {
            if evict(shard, i, v) {
                return true;
            }
        }
    }
    false
}

impl<P: Packing> fmt::Debug for Table<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Table")
            .field("shards", &self.shards.len())
            .field("len", &self.len())
            .field("capacity", &self.capacity())
            .field("memory_bytes", &self.memory_bytes())
            .finish()
    }
}

// Loading a key's slot ahead of its check (`touch`, `prefetches`).
#[path = "table_ahead.rs"]
mod ahead;

#[cfg(all(test, not(ratewall_loom)))]
#[path = "table_tests.rs"]
mod tests;
