//! The sharded open-addressing table behind [`KeyedLimiter`](super::KeyedLimiter).
//!
//! # Layout
//!
//! ```text
//!  127                           64 63                            0
//! +-------------------------------+-------------------------------+
//! | fingerprint (64-bit key hash) | state word (the algorithm's)  |
//! +-------------------------------+-------------------------------+
//! ```
//!
//! One slot is one 16-byte atomic. Fingerprint 0 is an empty slot (never
//! used: a probe stops there), 1 is a tombstone (a removed key: a probe goes
//! on, an insert may reuse it); a key's hash is mapped away from 0 and 1.
//! No key is stored, so the table's memory does not depend on the key type.
//!
//! The table has `2^k` cache-padded shards picked by the hash's low bits.
//! Within a shard a key lives in its *window*: the `PROBE` slots (wrapping)
//! from a start picked by the hash's high bits, and no empty slot lies
//! between the start and the key (linear probing; empties never come back).
//!
//! # Slot protocol
//!
//! - Check of an existing key (lock-free): load the slot; if its fingerprint
//!   is ours, run the step on its state; a step that writes nothing returns
//!   at once (a denial writes no memory); otherwise compare-exchange the
//!   whole 16 bytes from (ours, seen) to (ours, next). A failure whose
//!   fingerprint is still ours recomputes from the observed state; a failure
//!   whose fingerprint changed means the slot was reclaimed for another key:
//!   the check looks the key up again. Because the exchange compares the
//!   fingerprint with the state, a decision computed for one key can never be
//!   written over another key's state, whatever values the states take (ABA).
//! - Everything that changes a fingerprint (insert, reclaim, eviction,
//!   `retain_active`) holds the shard's mutex and uses the same 16-byte
//!   compare-exchange, so it also loses cleanly to a concurrent check.

use crate::sync::{lock, AtomicU128, AtomicU64, Mutex, Ordering};
use crossbeam_utils::CachePadded;
use std::fmt;

/// Fingerprint of a slot that was never used.
pub(crate) const EMPTY: u64 = 0;
/// Fingerprint of a slot whose key was removed.
pub(crate) const TOMB: u64 = 1;
/// Slots scanned for one key: 32 x 16 B = 512 B, eight cache lines.
pub(crate) const PROBE: usize = 32;
/// Slots scanned per insert, beyond the key's window, to reclaim idle keys
/// when the shard is at its cap (amortized eviction).
const SWEEP: usize = 64;
/// Sweep ranges `evict_elsewhere` tries before giving up.
const EVICT_ATTEMPTS: usize = 4;
/// Slots per key: 4/3, a 75% load factor at a full table (21.3 B per key).
const LOAD_NUM: usize = 4;
const LOAD_DEN: usize = 3;

#[cfg(not(ratewall_loom))]
const _: () = assert!(std::mem::size_of::<AtomicU128>() == 16);

#[inline]
fn pack(fp: u64, state: u64) -> u128 {
    (u128::from(fp) << 64) | u128::from(state)
}

#[inline]
fn fp_of(v: u128) -> u64 {
    (v >> 64) as u64
}

#[inline]
fn state_of(v: u128) -> u64 {
    v as u64
}

/// A key's fingerprint: its hash, moved away from the two reserved values.
#[inline]
pub(crate) fn fingerprint(h: u64) -> u64 {
    if h <= TOMB {
        h + 2
    } else {
        h
    }
}

struct Shard {
    slots: Box<[AtomicU128]>,
    /// Most keys this shard may track; the caps add up to `max_keys`.
    cap: u64,
    /// Keys tracked. Written only under `inner`; read with Relaxed by `len()`.
    len: AtomicU64,
    /// Serializes fingerprint changes; holds the reclaim sweep's cursor.
    inner: Mutex<usize>,
}

impl Shard {
    /// One more key tracked. Caller holds `inner`.
    fn count_insert(&self) {
        // Relaxed: `len` is written only under `inner`, which the caller holds.
        self.len
            .store(self.len.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
    }

    /// One key fewer. Caller holds `inner`.
    fn count_removal(&self) {
        // Relaxed: as in `count_insert`.
        self.len
            .store(self.len.load(Ordering::Relaxed) - 1, Ordering::Relaxed);
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
}

pub(crate) struct Table {
    shards: Box<[CachePadded<Shard>]>,
    shard_mask: u64,
}

impl Table {
    /// A table for `max_keys` keys over `shards` shards (a power of two, at
    /// most `max_keys`; the caller validated both).
    pub(crate) fn new(max_keys: usize, shards: usize) -> Table {
        debug_assert!(shards.is_power_of_two() && shards <= max_keys);
        let base = max_keys / shards;
        let extra = max_keys % shards;
        let shards: Box<[CachePadded<Shard>]> = (0..shards)
            .map(|i| {
                let cap = base + usize::from(i < extra);
                let n = (cap * LOAD_NUM).div_ceil(LOAD_DEN).max(cap + 1);
                CachePadded::new(Shard {
                    slots: (0..n).map(|_| AtomicU128::new(0)).collect(),
                    cap: cap as u64,
                    len: AtomicU64::new(0),
                    inner: Mutex::new(0),
                })
            })
            .collect();
        let shard_mask = shards.len() as u64 - 1;
        Table { shards, shard_mask }
    }

    #[inline]
    fn locate(&self, h: u64) -> (&Shard, usize) {
        let shard = &self.shards[(h & self.shard_mask) as usize];
        let n = shard.slots.len() as u128;
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
        step: &mut impl FnMut(u64) -> (R, Option<u64>),
    ) -> Option<R> {
        let fp = fingerprint(h);
        let (shard, start) = self.locate(h);
        'lookup: loop {
            let (slot, mut seen) = find(shard, start, fp)?;
            loop {
                let (outcome, next) = step(state_of(seen));
                let next = match next {
                    Some(next) if next != state_of(seen) => next,
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
                            return Some(outcome);
                        }
                        if fp_of(again) != fp {
                            continue 'lookup;
                        }
                        seen = again;
                        continue;
                    }
                };
                // Success AcqRel / failure Acquire: as `AtomicWord::update`
                // (pairs with a quota change's rescaling exchange).
                match slot.compare_exchange(
                    seen,
                    pack(fp, next),
                    Ordering::AcqRel,
                    Ordering::Acquire,
                ) {
                    Ok(_) => return Some(outcome),
                    // Lost the race to a check of the same key: recompute
                    // from the state we saw, never from the one we wanted.
                    Err(actual) if fp_of(actual) == fp => seen = actual,
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
        let fp = fingerprint(h);
        let (shard, start) = self.locate(h);
        let mut cursor = lock(&shard.inner);
        let n = shard.slots.len();
        let window = PROBE.min(n);
        loop {
            // Fingerprints change only under this mutex: if the key is here
            // now, it stays; `update` only retries on a state race.
            if let Some(r) = self.update(h, step) {
                return Inserted::Existing(r);
            }
            // The key's chain, up to its first empty slot: the first free
            // slot (empty or tombstone) and the first idle key.
            let mut free: Option<(usize, u128)> = None;
            let mut idle: Option<(usize, u128)> = None;
            let mut i = start;
            for _ in 0..window {
                // Acquire: as in `find`.
                let v = shard.slots[i].load(Ordering::Acquire);
                match fp_of(v) {
                    EMPTY => {
                        free.get_or_insert((i, v));
                        break; // the chain ends: no slot beyond can take the key
                    }
                    TOMB => {
                        free.get_or_insert((i, v));
                    }
                    _ => {
                        if idle.is_none() && view.is_idle(state_of(v)) {
                            idle = Some((i, v));
                        }
                    }
                }
                i = if i + 1 == n { 0 } else { i + 1 };
            }
            // Relaxed: `len` is written only under the mutex we hold.
            let len = shard.len.load(Ordering::Relaxed);
            // A free slot while under the cap; else an idle key's slot (the
            // count stays the same); else, at the cap, reclaim idle keys
            // further on (amortized: `SWEEP` slots per insert) and take the
            // free slot if that made room.
            let target = match (free, idle) {
                (Some((i, v)), _) if len < shard.cap => Some((i, v, true)),
                (_, Some((i, v))) => Some((i, v, false)),
                (Some((i, v)), None) if sweep(shard, &mut cursor, view) => Some((i, v, true)),
                _ => None,
            };
            if let Some((i, v, grows)) = target {
                let (outcome, next) = step(0);
                let Some(next) = next else {
                    // A fresh key's step that writes nothing: nothing to track.
                    return Inserted::NotStored(outcome);
                };
                // AcqRel: publishes the new key's state like any update.
                match shard.slots[i].compare_exchange(
                    v,
                    pack(fp, next),
                    Ordering::AcqRel,
                    Ordering::Acquire,
                ) {
                    Ok(_) => {
                        if grows {
                            shard.count_insert();
                        }
                        return Inserted::New {
                            outcome,
                            evicted: false,
                        };
                    }
                    // A check made the idle key active again: start over.
                    Err(_) => continue,
                }
            }
            // No room: the window is full of active keys, or the shard is at
            // its cap with no idle key found. Look at the whole window: the
            // active key closest to idle is the victim (or the `soonest` a
            // rejected key may retry).
            let mut victim: Option<(usize, u128, u64)> = None;
            let mut i = start;
            for _ in 0..window {
                // Acquire: as in `find`.
                let v = shard.slots[i].load(Ordering::Acquire);
                if fp_of(v) > TOMB {
                    let ttl = view.time_to_idle(state_of(v));
                    if victim.map_or(true, |(_, _, best)| ttl < best) {
                        victim = Some((i, v, ttl));
                    }
                }
                i = if i + 1 == n { 0 } else { i + 1 };
            }
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
                    // The window has room but the shard is at its cap with
                    // every key active: evict the sweep's best victim.
                    if !evict_elsewhere(shard, &mut cursor, view) {
                        return Inserted::Full { soonest: 0 };
                    }
                    (fi, fv, true)
                }
                (None, None) => return Inserted::Full { soonest: 0 },
            };
            let (outcome, next) = step(0);
            let Some(next) = next else {
                return Inserted::NotStored(outcome);
            };
            // AcqRel: as for any insert.
            match shard.slots[at].compare_exchange(
                expect,
                pack(fp, next),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    if grows {
                        // The eviction freed one.
                        shard.count_insert();
                    }
                    return Inserted::New {
                        outcome,
                        evicted: true,
                    };
                }
                // The victim was checked meanwhile: choose again.
                Err(_) => continue,
            }
        }
    }

    /// What `insert` would do for the untracked key `h` under `policy`, read
    /// only: the same scans, without reclaiming or evicting anything. Locks
    /// the shard only when the key's window has no free slot under the cap.
    pub(crate) fn room(&self, h: u64, view: &impl StateView, policy: Full) -> Room {
        let (shard, start) = self.locate(h);
        let n = shard.slots.len();
        let window = PROBE.min(n);
        let scan = || {
            // The chain (up to the first empty slot): a free slot, an idle key.
            let (mut free, mut idle) = (false, false);
            // The whole window: the least time to idle (the insert's victim).
            let mut victim: Option<u64> = None;
            let mut chain = true;
            let mut i = start;
            for _ in 0..window {
                // Acquire: as in `find`.
                let v = shard.slots[i].load(Ordering::Acquire);
                match fp_of(v) {
                    EMPTY => {
                        free |= chain;
                        chain = false;
                    }
                    TOMB => free |= chain,
                    _ => {
                        idle |= chain && view.is_idle(state_of(v));
                        let ttl = view.time_to_idle(state_of(v));
                        victim = Some(victim.map_or(ttl, |best| best.min(ttl)));
                    }
                }
                i = if i + 1 == n { 0 } else { i + 1 };
            }
            (free, idle, victim)
        };
        // Relaxed: a prediction; `len` changes only under the mutex.
        let under_cap = || shard.len.load(Ordering::Relaxed) < shard.cap;
        let (free, _, _) = scan();
        if free && under_cap() {
            return Room::Tracked;
        }
        let cursor = lock(&shard.inner);
        let (free, idle, victim) = scan();
        if (free && under_cap()) || idle || (free && sweep_finds_idle(shard, *cursor, view)) {
            return Room::Tracked;
        }
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
                soonest: victim.unwrap_or(0),
            },
        }
    }

    /// Removes every idle key, one shard at a time (each shard's inserts
    /// wait for its own pass only). Returns how many were removed.
    pub(crate) fn retain_active(&self, view: &impl StateView) -> usize {
        let mut removed = 0;
        for shard in self.shards.iter() {
            let _guard = lock(&shard.inner);
            for i in 0..shard.slots.len() {
                // Acquire: as in `find`.
                let v = shard.slots[i].load(Ordering::Acquire);
                if fp_of(v) > TOMB && view.is_idle(state_of(v)) && tombstone(shard, i, v, view) {
                    removed += 1;
                }
            }
        }
        removed
    }

    /// Applies `f` to every tracked key's state (quota changes) with the
    /// slot protocol (a racing check wins or loses cleanly). Takes every
    /// shard's mutex first and holds them all: an insert reads the parameters
    /// under its shard's mutex, so a quota change that made the parameters
    /// unreadable while waiting for a shard would deadlock. `between` runs
    /// once all are held, before the first state changes (it starts the
    /// parameter change).
    pub(crate) fn for_each_state(
        &self,
        between: impl FnOnce(),
        mut f: impl FnMut(u64, u64) -> u64,
    ) {
        let guards: Vec<_> = self.shards.iter().map(|s| lock(&s.inner)).collect();
        between();
        for shard in self.shards.iter() {
            for slot in shard.slots.iter() {
                // Acquire: as in `find`.
                let mut v = slot.load(Ordering::Acquire);
                while fp_of(v) > TOMB {
                    let next = f(fp_of(v), state_of(v));
                    if next == state_of(v) {
                        break;
                    }
                    // AcqRel: Release pairs with a checker's Acquire load (see
                    // `ParamCell`); the fingerprint cannot change (we hold the
                    // mutex), so a failure is a racing check: redo its result.
                    match slot.compare_exchange(
                        v,
                        pack(fp_of(v), next),
                        Ordering::AcqRel,
                        Ordering::Acquire,
                    ) {
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

    /// Keys tracked (idle ones not yet reclaimed included).
    pub(crate) fn len(&self) -> usize {
        self.shards
            .iter()
            // Relaxed: a count for reporting; it publishes nothing.
            .map(|s| s.len.load(Ordering::Relaxed) as usize)
            .sum()
    }

    /// The most keys the table tracks.
    pub(crate) fn capacity(&self) -> usize {
        self.shards.iter().map(|s| s.cap as usize).sum()
    }

    pub(crate) fn shard_count(&self) -> usize {
        self.shards.len()
    }

    /// Bytes the table owns: slots plus shard headers.
    pub(crate) fn memory_bytes(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.slots.len() * std::mem::size_of::<AtomicU128>())
            .sum::<usize>()
            + self.shards.len() * std::mem::size_of::<CachePadded<Shard>>()
            + std::mem::size_of::<Self>()
    }
}

/// The key's slot in its window, and the value seen there.
#[inline]
fn find(shard: &Shard, start: usize, fp: u64) -> Option<(&AtomicU128, u128)> {
    let n = shard.slots.len();
    let mut i = start;
    for _ in 0..PROBE.min(n) {
        let slot = &shard.slots[i];
        // Acquire: pairs with the AcqRel exchange that stored this value, so
        // the state (and, for a quota change, the odd parameter version
        // ordered before it) is visible to the step.
        let v = slot.load(Ordering::Acquire);
        let f = fp_of(v);
        if f == fp {
            return Some((slot, v));
        }
        if f == EMPTY {
            return None;
        }
        i = if i + 1 == n { 0 } else { i + 1 };
    }
    None
}

/// Turns an idle key's slot into a tombstone if it is still `v` (caller holds
/// the shard mutex). A racing check that makes the key active wins.
fn tombstone(shard: &Shard, i: usize, v: u128, view: &impl StateView) -> bool {
    debug_assert!(view.is_idle(state_of(v)));
    evict(shard, i, v)
}

/// Removes the key in slot `i` (leaving a tombstone) if the slot still holds
/// `v`; caller holds the shard mutex. A racing check that changed the slot
/// wins, and the caller chooses again.
fn evict(shard: &Shard, i: usize, v: u128) -> bool {
    // AcqRel: a check of the removed key that loses this race sees the
    // tombstone and looks its key up again.
    let removed = shard.slots[i]
        .compare_exchange(v, pack(TOMB, 0), Ordering::AcqRel, Ordering::Acquire)
        .is_ok();
    if removed {
        shard.count_removal();
    }
    removed
}

/// At the shard's cap: scans the next `SWEEP` slots from the cursor and
/// reclaims the idle keys there. Whether the shard is now under its cap.
fn sweep(shard: &Shard, cursor: &mut usize, view: &impl StateView) -> bool {
    let n = shard.slots.len();
    for _ in 0..SWEEP.min(n) {
        let i = *cursor % n;
        *cursor = (i + 1) % n;
        // Acquire: as in `find`.
        let v = shard.slots[i].load(Ordering::Acquire);
        if fp_of(v) > TOMB && view.is_idle(state_of(v)) {
            tombstone(shard, i, v, view);
        }
    }
    // Relaxed: written only under the mutex the caller holds.
    shard.len.load(Ordering::Relaxed) < shard.cap
}

/// Whether `sweep` from `cursor` would reclaim a key (read only).
fn sweep_finds_idle(shard: &Shard, cursor: usize, view: &impl StateView) -> bool {
    let n = shard.slots.len();
    (0..SWEEP.min(n)).any(|k| {
        // Acquire: as in `find`.
        let v = shard.slots[(cursor + k) % n].load(Ordering::Acquire);
        fp_of(v) > TOMB && view.is_idle(state_of(v))
    })
}

/// Whether `evict_elsewhere` from `cursor` would find a key (read only).
fn sweep_finds_active(shard: &Shard, cursor: usize) -> bool {
    let n = shard.slots.len();
    (0..EVICT_ATTEMPTS * SWEEP.min(n)).any(|k| {
        // Acquire: as in `find`.
        fp_of(shard.slots[(cursor + k) % n].load(Ordering::Acquire)) > TOMB
    })
}

/// Evicts the key closest to idle among the next `SWEEP` slots from the
/// cursor. Whether one was removed.
fn evict_elsewhere(shard: &Shard, cursor: &mut usize, view: &impl StateView) -> bool {
    let n = shard.slots.len();
    for _attempt in 0..EVICT_ATTEMPTS {
        let mut best: Option<(usize, u128, u64)> = None;
        for k in 0..SWEEP.min(n) {
            let i = (*cursor + k) % n;
            // Acquire: as in `find`.
            let v = shard.slots[i].load(Ordering::Acquire);
            if fp_of(v) > TOMB {
                let ttl = view.time_to_idle(state_of(v));
                if best.map_or(true, |(_, _, b)| ttl < b) {
                    best = Some((i, v, ttl));
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

impl fmt::Debug for Table {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Table")
            .field("shards", &self.shards.len())
            .field("len", &self.len())
            .field("capacity", &self.capacity())
            .field("memory_bytes", &self.memory_bytes())
            .finish()
    }
}

#[cfg(all(test, not(ratewall_loom)))]
mod tests {
    //! The table on hand-placed hashes, with a view whose state word *is*
    //! the time to idle (0: idle), so that every scan's choice is visible.
    //! Single-threaded: the direct slot stores and loads use Relaxed.
    use super::*;

    struct Ttl;

    impl StateView for Ttl {
        fn is_idle(&self, state: u64) -> bool {
            state == 0
        }
        fn time_to_idle(&self, state: u64) -> u64 {
            state
        }
    }

    /// A hash whose window starts at slot `start` of a one-shard table of `n`
    /// slots; `salt` (small) tells keys with the same start apart.
    fn hash_at(n: usize, start: usize, salt: u64) -> u64 {
        let base = ((start as u128) << 64).div_ceil(n as u128) as u64;
        let h = base + 2 + salt;
        assert_eq!(((u128::from(h) * n as u128) >> 64) as usize, start);
        h
    }

    /// Inserts the key `h` with state `ttl` (a step that stores `ttl`).
    fn put(t: &Table, h: u64, ttl: u64, policy: Full) -> Inserted<()> {
        t.insert(h, &mut |_| ((), Some(ttl)), &Ttl, policy)
    }

    fn state(t: &Table, h: u64) -> Option<u64> {
        t.update(h, &mut |s| (s, None))
    }

    fn slots(t: &Table) -> usize {
        t.shards[0].slots.len()
    }

    /// 100 keys in one shard of 134 slots, homed at slots 34..134 (one each,
    /// so each sits at its home); key `i` has time to idle `ttl(i)`.
    fn packed(ttl: impl Fn(usize) -> u64) -> (Table, Vec<u64>) {
        let t = Table::new(100, 1);
        let n = slots(&t);
        assert_eq!(n, 134);
        let keys: Vec<u64> = (0..100).map(|i| hash_at(n, 34 + i, 0)).collect();
        for (i, &h) in keys.iter().enumerate() {
            assert!(matches!(
                put(&t, h, ttl(i), Full::Reject),
                Inserted::New { evicted: false, .. }
            ));
        }
        assert_eq!(t.len(), 100);
        (t, keys)
    }

    #[test]
    fn at_the_cap_a_free_window_still_rejects_or_evicts_elsewhere() {
        let (t, keys) = packed(|i| 1000 + i as u64);
        let newcomer = hash_at(slots(&t), 0, 0);
        assert_eq!(
            t.room(newcomer, &Ttl, Full::Reject),
            Room::Full { soonest: 0 }
        );
        assert_eq!(t.room(newcomer, &Ttl, Full::Evict), Room::Evict);
        // The newcomer's window (slots 0..32) is empty, but the shard is at
        // its cap of active keys: rejected, told of no key in its window.
        assert!(matches!(
            put(&t, newcomer, 5, Full::Reject),
            Inserted::Full { soonest: 0 }
        ));
        assert!(matches!(
            put(&t, newcomer, 5, Full::Untracked),
            Inserted::Full { .. }
        ));
        assert_eq!(t.len(), 100);
        assert_eq!(state(&t, newcomer), None);
        // Evicting: the sweeps (cursor at 0 + 2 * 64 = 128 after the two
        // rejections' sweeps, then the eviction's own sweep 128..134, 0..58)
        // leave the eviction scanning slots 58..122: keys 24..88. The least
        // time to idle there is key 24's.
        assert!(matches!(
            put(&t, newcomer, 5, Full::Evict),
            Inserted::New { evicted: true, .. }
        ));
        assert_eq!(t.len(), 100);
        assert_eq!(state(&t, newcomer), Some(5));
        assert_eq!(state(&t, keys[24]), None, "key 24 evicted");
        assert!(keys
            .iter()
            .enumerate()
            .all(|(i, &h)| (i == 24) == state(&t, h).is_none()));
    }

    #[test]
    fn evict_elsewhere_takes_the_least_time_to_idle_in_its_range_and_wraps() {
        let t = Table::new(100, 1);
        let shard = &*t.shards[0];
        let n = shard.slots.len();
        // Keys at every slot but 0..4, time to idle 100 + slot, except slot
        // 130 (20), slots 10 and 20 (10: a tie, the first in scan order
        // goes) and slot 60 (1, outside the range).
        let _g = lock(&shard.inner);
        for i in 4..n {
            let ttl = match i {
                130 => 20,
                10 | 20 => 10,
                60 => 1,
                _ => 100 + i as u64,
            };
            shard.slots[i].store(pack(1000 + i as u64, ttl), Ordering::Relaxed);
        }
        shard.len.store((n - 4) as u64, Ordering::Relaxed);
        // From 120, the range wraps: 120..134 and 0..50.
        let mut cursor = 120;
        assert!(evict_elsewhere(shard, &mut cursor, &Ttl));
        assert_eq!(cursor, (120 + SWEEP) % n);
        assert_eq!(fp_of(shard.slots[10].load(Ordering::Relaxed)), TOMB);
        assert_eq!(fp_of(shard.slots[130].load(Ordering::Relaxed)), 1130);
        assert_eq!(fp_of(shard.slots[20].load(Ordering::Relaxed)), 1020);
        assert_eq!(shard.len.load(Ordering::Relaxed), (n - 5) as u64);
        // Next range 50..114: slot 60.
        assert!(evict_elsewhere(shard, &mut cursor, &Ttl));
        assert_eq!(fp_of(shard.slots[60].load(Ordering::Relaxed)), TOMB);
        assert_eq!(cursor, (50 + SWEEP) % n);
        // A range with only tombstones and empties: the next ranges are
        // tried, up to four of them.
        for i in 0..n {
            if i != 3 {
                shard.slots[i].store(pack(if i < 4 { EMPTY } else { TOMB }, 0), Ordering::Relaxed);
            }
        }
        shard.slots[3].store(pack(7, 9), Ordering::Relaxed);
        let mut cursor = 4; // 4..68, 68..132, 132..134 + 0..62 (slot 3)
        assert!(evict_elsewhere(shard, &mut cursor, &Ttl));
        assert_eq!(fp_of(shard.slots[3].load(Ordering::Relaxed)), TOMB);
        assert!(!evict_elsewhere(shard, &mut cursor, &Ttl), "nothing left");
    }

    #[test]
    fn the_victim_is_the_least_time_to_idle_first_in_probe_order() {
        let t = Table::new(4, 1);
        let n = slots(&t); // 6 slots: every window covers the shard
        let a = hash_at(n, 1, 0);
        let b = hash_at(n, 1, 1);
        let c = hash_at(n, 1, 2);
        let d = hash_at(n, 1, 3);
        for (h, ttl) in [(a, 30), (b, 10), (c, 10), (d, 20)] {
            assert!(matches!(
                put(&t, h, ttl, Full::Evict),
                Inserted::New { evicted: false, .. }
            ));
        }
        // Rejected: retry when the first key goes idle (10).
        let e = hash_at(n, 1, 4);
        assert!(matches!(
            put(&t, e, 1, Full::Reject),
            Inserted::Full { soonest: 10 }
        ));
        // Evicting: b and c tie at 10; b comes first from slot 1.
        assert!(matches!(
            put(&t, e, 1, Full::Evict),
            Inserted::New { evicted: true, .. }
        ));
        assert_eq!(state(&t, b), None);
        assert_eq!(state(&t, c), Some(10));
        assert_eq!(t.len(), 4);
        // An idle key's slot is reused without eviction, count unchanged.
        assert_eq!(t.update(d, &mut |_| ((), Some(0))), Some(()));
        let f = hash_at(n, 1, 5);
        assert!(matches!(
            put(&t, f, 3, Full::Reject),
            Inserted::New { evicted: false, .. }
        ));
        assert_eq!(state(&t, d), None);
        assert_eq!(t.len(), 4);
        assert_eq!(t.retain_active(&Ttl), 0);
        // Make two keys idle: retain_active removes exactly those.
        let _ = t.update(a, &mut |_| ((), Some(0)));
        let _ = t.update(f, &mut |_| ((), Some(0)));
        assert_eq!(t.retain_active(&Ttl), 2);
        assert_eq!(t.len(), 2);
    }

    #[test]
    fn room_predicts_insert() {
        let t = Table::new(4, 1);
        let n = slots(&t);
        let keys: Vec<u64> = (0..6).map(|i| hash_at(n, 2, i)).collect();
        for &h in &keys[..3] {
            assert_eq!(t.room(h, &Ttl, Full::Reject), Room::Tracked);
            let _ = put(&t, h, 7, Full::Reject);
        }
        assert_eq!(t.room(keys[3], &Ttl, Full::Reject), Room::Tracked);
        let _ = put(&t, keys[3], 4, Full::Reject);
        assert_eq!(
            t.room(keys[4], &Ttl, Full::Reject),
            Room::Full { soonest: 4 }
        );
        assert_eq!(
            t.room(keys[4], &Ttl, Full::Untracked),
            Room::Full { soonest: 4 }
        );
        assert_eq!(t.room(keys[4], &Ttl, Full::Evict), Room::Evict);
        let _ = t.update(keys[1], &mut |_| ((), Some(0)));
        assert_eq!(t.room(keys[4], &Ttl, Full::Reject), Room::Tracked);
    }

    #[test]
    fn memory_and_capacity_add_up_over_shards() {
        let t = Table::new(10, 4);
        assert_eq!(t.capacity(), 10);
        assert_eq!(t.shard_count(), 4);
        let slots: usize = t.shards.iter().map(|s| s.slots.len()).sum();
        assert!(t.memory_bytes() >= slots * 16 + 4 * std::mem::size_of::<CachePadded<Shard>>());
        assert!(fingerprint(0) > TOMB && fingerprint(1) > TOMB && fingerprint(7) == 7);
    }
}
