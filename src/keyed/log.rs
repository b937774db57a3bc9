//! The exact sliding-window log, per key: `KeyedSlidingWindowLog`.
//!
//! The log keeps up to `L` runs per key, not one word, so it does not
//! fit the slot table of `KeyedLimiter`. It lives in sharded maps instead:
//!
//! ```text
//! shards: [CachePadded<Mutex<Shard>>; power of two]   picked by the key hash's low bits
//! Shard  { rings: HashMap<fingerprint, LogRing>,      pre-sized past the shard's share
//!          next_idle_at, idle_exact }
//! count: the keys tracked, across the shards (at most `max_keys`)
//! LogRing: Mutex { VecDeque<Run> grown with use, base, floor } (src/algo/log.rs)
//! ```
//!
//! - A key is its 64-bit seeded hash (its fingerprint), as in the slot
//!   table: no key copies, memory independent of `K`.
//! - Every operation locks the key's shard (then the ring's own, uncontended,
//!   lock). The log was already a per-key lock; here the lock is per shard,
//!   so keys of one shard serialize. Checks of a hot log key are not
//!   read-only: pick a window counter for mostly-denied hot keys.
//! - `max_keys` is a promise, as for the slot table: the keys tracked are
//!   counted across the shards (an insert reserves a unit with a
//!   compare-and-add that fails at `max_keys`), and no shard has a cap of
//!   its own, so `max_keys` distinct keys fit however they split between
//!   the shards. (With a cap per shard adding up to `max_keys`, 100,000
//!   keys over 64 shards tracked 99,015.) Each shard's map is sized for
//!   its share and a margin of a few standard deviations of the split, so
//!   it rarely grows.
//! - Memory: 64 bytes of map entry, lock and deque header per key, for at
//!   most `max_keys` keys, plus 16
//!   bytes of ring per distinct admission time still in the key's window
//!   (at most `L`; a cost-`n` admission is one run). A new key allocates
//!   nothing until it is admitted, and then one small block; a reclaimed
//!   or evicted key's ring is cleared and reused for the key that replaces
//!   it.
//! - Reclaiming: a key whose newest entry has left the window is idle (its
//!   state equals a fresh key's). An insert into a full shard sweeps the
//!   shard for idle keys and notes the earliest time a remaining key can
//!   go idle; the shard does not sweep again before then, so every sweep
//!   either frees a key or could not have (a refund lowers that time). Then
//!   `WhenFull` applies: `RejectNew` says when the shard's first key goes
//!   idle; `EvictLeastRecent` evicts, among a sample of 32 keys, the one
//!   whose newest admission is oldest (the least time to idle), from the
//!   key's shard, or from another when its own holds no key (taken with
//!   `try_lock` while the own shard is held: never two shard locks waited
//!   for, so no lock order to keep).
//! - Quota changes take every shard lock first, then run the `ParamCell`
//!   change (odd version, rescale every ring, publish): no check holds a
//!   shard lock while the version is odd, so none can wait on it.

use super::builder::{KeyedBuilder, WhenFull};
use super::family::{
    keyed_methods, refund_methods, table_methods, Checked, KeyedCore, KeyedRefund, KeyedTable,
};
use crate::algo::sealed::Core;
use crate::algo::{LogRing, SlidingLog};
use crate::clock::{Clock, Timebase};
use crate::decision::{Decision, Tracking};
use crate::error::{ConfigError, InsufficientCapacity};
use crate::limiter::DefaultClock;
use crate::quota::Window;
use crate::sync::{lock, try_lock, AtomicU64, Mutex, Ordering};
use crate::word::ParamCell;
use crossbeam_utils::CachePadded;
use std::fmt;
use std::hash::{BuildHasher, Hash, Hasher};
use std::marker::PhantomData;

/// How many keys `EvictLeastRecent` compares to pick a victim.
const EVICT_SAMPLE: usize = 32;
/// Other shards an insert into a full table looks at, for idle keys and
/// (when its own shard holds none) a key to evict: a window that moves on
/// with each such insert, so that retries reach every shard.
const ELSEWHERE: usize = 8;

/// A keyed exact sliding-window log: for every key, never more than
/// `limit` admissions in any rolling window of `length`. Bounded by
/// `max_keys`, with idle keys reclaimed as new ones arrive.
///
/// Built with [`KeyedSlidingWindowLog::builder`]; the knobs are those of
/// [`KeyedBuilder`] (`max_keys`, `shards`, `when_full`, `seed`, `clock`).
///
/// # Example
///
/// ```
/// use ratewall::{KeyedSlidingWindowLog, ManualClock, Window};
/// use std::time::Duration;
///
/// let clock = ManualClock::new();
/// let per_user = KeyedSlidingWindowLog::<&str>::builder(Window::per_second(2))
///     .max_keys(10_000)
///     .clock(clock.clone())
///     .build()?;
/// assert!(per_user.check_key("ann").is_allowed());
/// assert!(per_user.check_key("ann").is_allowed());
/// assert!(!per_user.check_key("ann").is_allowed()); // 2 in the last second
/// assert!(per_user.check_key("bob").is_allowed()); // every key on its own
/// clock.advance(Duration::from_secs(1));
/// assert!(per_user.check_key("ann").is_allowed());
/// # Ok::<(), ratewall::ConfigError>(())
/// ```
pub struct KeyedSlidingWindowLog<K, C: Clock = DefaultClock> {
    shards: Box<[CachePadded<Mutex<Shard>>]>,
    shard_mask: u64,
    params: CachePadded<ParamCell>,
    time: Timebase<C>,
    hasher: ahash::RandomState,
    policy: WhenFull,
    max_keys: usize,
    /// Keys tracked across the shards; at most `max_keys`. Changed only
    /// under the changing shard's lock (an insert reserves its unit first).
    count: AtomicU64,
    /// Where the next insert into a full table starts looking at other
    /// shards (`elsewhere`).
    cursor: AtomicU64,
    /// Serializes quota changes; holds the window they were built from.
    config: Mutex<Window>,
    _key: PhantomData<fn(&K)>,
}

// The keyed method family (`family.rs`), from this type's core below.
keyed_methods!([K, C: Clock] KeyedSlidingWindowLog<K, C>, K);
refund_methods!([K, C: Clock] KeyedSlidingWindowLog<K, C>, K);
table_methods!([K, C: Clock] KeyedSlidingWindowLog<K, C>);

struct Shard {
    rings: hashbrown::HashMap<u64, LogRing, Fingerprint>,
    /// No key can be idle before this time (the earliest expiry the last
    /// sweep saw, lowered by refunds and inserts): a full shard does not
    /// sweep again until then.
    next_idle_at: u64,
    /// Whether `next_idle_at` is exactly the earliest expiry of the shard's
    /// keys (it always is a lower bound). Cleared by anything that may delay
    /// the earliest expiry (an admission, a removal, a quota change); a
    /// rejected new key, told to retry at `next_idle_at`, makes it exact
    /// with one pass over the shard.
    idle_exact: bool,
}

impl Shard {
    /// A key's expiry changed to `expiry` (a refund, a new key): the
    /// earliest expiry is the lesser of the two, exact if it was.
    fn lower_next_idle(&mut self, expiry: u64) {
        self.next_idle_at = self.next_idle_at.min(expiry);
    }

    /// The earliest time a key of this shard goes idle, made exact.
    fn soonest_idle(&mut self, length: u64) -> u64 {
        if !self.idle_exact {
            self.next_idle_at = self
                .rings
                .values()
                .map(|r| expiry(r, length))
                .min()
                .unwrap_or(0);
            self.idle_exact = true;
        }
        self.next_idle_at
    }
}

/// When `ring` goes idle: its newest entry leaves the window (0: idle now).
fn expiry(ring: &LogRing, length: u64) -> u64 {
    ring.newest().map_or(0, |t| t.saturating_add(length))
}

/// The map's hasher: the key is already a seeded 64-bit hash.
#[derive(Clone, Copy, Default)]
struct Fingerprint;

impl BuildHasher for Fingerprint {
    type Hasher = FingerprintHasher;
    fn build_hasher(&self) -> FingerprintHasher {
        FingerprintHasher(0)
    }
}

struct FingerprintHasher(u64);

impl Hasher for FingerprintHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        // Only `write_u64` is used (the map's key is a `u64`).
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = v;
    }
}

impl<K, C: Clock> KeyedBuilder<K, SlidingLog, C> {
    /// Builds the keyed sliding log, or says which setting to change.
    ///
    /// ```
    /// # use ratewall::{ConfigError, KeyedSlidingWindowLog, Window};
    /// let bad = KeyedSlidingWindowLog::<u64>::builder(Window::per_second(0)).build();
    /// assert_eq!(bad.unwrap_err(), ConfigError::ZeroLimit);
    /// ```
    pub fn build(self) -> Result<KeyedSlidingWindowLog<K, C>, ConfigError> {
        let params = SlidingLog::from_config(&self.config)?;
        let shards = self.table.validated_shards()?;
        let max_keys = self.table.max_keys;
        let (base, extra) = (max_keys / shards, max_keys % shards);
        let shards: Box<[_]> = (0..shards)
            .map(|i| {
                let share = base + usize::from(i < extra);
                // The share and four standard deviations of a random split
                // (about its square root), never more than `max_keys`.
                let room = (share + 4 * (share as f64).sqrt() as usize + 8).min(max_keys);
                CachePadded::new(Mutex::new(Shard {
                    rings: hashbrown::HashMap::with_capacity_and_hasher(room, Fingerprint),
                    next_idle_at: 0,
                    idle_exact: false,
                }))
            })
            .collect();
        let hasher = self.table.key_hasher();
        Ok(KeyedSlidingWindowLog {
            shard_mask: shards.len() as u64 - 1,
            shards,
            params: CachePadded::new(ParamCell::new(params)),
            time: Timebase::new(self.clock),
            hasher,
            policy: self.table.when_full,
            max_keys,
            count: AtomicU64::new(0),
            cursor: AtomicU64::new(0),
            config: Mutex::new(self.config),
            _key: PhantomData,
        })
    }
}

impl<K> KeyedSlidingWindowLog<K, DefaultClock> {
    /// A builder for the window quota, with the defaults of
    /// [`KeyedLimiter::builder`](crate::KeyedLimiter::builder).
    ///
    /// ```
    /// use ratewall::{KeyedSlidingWindowLog, Window};
    /// let l = KeyedSlidingWindowLog::<u64>::builder(Window::per_minute(100)).build()?;
    /// assert!(l.check_key(&7).is_allowed());
    /// # Ok::<(), ratewall::ConfigError>(())
    /// ```
    pub fn builder(window: Window) -> KeyedBuilder<K, SlidingLog, DefaultClock> {
        KeyedBuilder::new(window)
    }
}

impl<K, C: Clock> KeyedSlidingWindowLog<K, C> {
    /// Changes the window quota for every key, keeping each key's log (a
    /// smaller limit keeps the newest entries).
    ///
    /// ```
    /// # use ratewall::{KeyedSlidingWindowLog, ManualClock, Window};
    /// let l = KeyedSlidingWindowLog::<u32>::builder(Window::per_hour(2))
    ///     .clock(ManualClock::new()).build().unwrap();
    /// let _ = l.check_key(&1);
    /// l.set_quota(Window::per_hour(5)).unwrap();
    /// assert_eq!(l.check_key(&1).remaining(), 3);
    /// assert!(l.set_quota(Window::per_hour(0)).is_err());
    /// ```
    pub fn set_quota(&self, window: Window) -> Result<(), ConfigError> {
        let new = SlidingLog::from_config(&window)?;
        let mut current = lock(&self.config);
        let old: SlidingLog = self.params.read();
        let now = self.clamp(self.now());
        // Every shard first: a check holding a shard lock may be waiting for
        // the parameters, so none may hold one while the version is odd.
        let mut guards: Vec<_> = self.shards.iter().map(|s| lock(s)).collect();
        self.params.begin();
        for shard in &mut guards {
            for ring in shard.rings.values() {
                SlidingLog::rescale(ring, &old, &new, now);
            }
            // Expiries move with the window length: sweep at the next need.
            shard.next_idle_at = 0;
            shard.idle_exact = false;
        }
        self.params.publish(new);
        drop(guards);
        *current = window;
        Ok(())
    }

    /// The window quota in force.
    ///
    /// ```
    /// # use ratewall::{KeyedSlidingWindowLog, Window};
    /// let l = KeyedSlidingWindowLog::<u32>::builder(Window::per_hour(2)).build().unwrap();
    /// assert_eq!(l.quota(), Window::per_hour(2));
    /// ```
    pub fn quota(&self) -> Window {
        *lock(&self.config)
    }
    fn clamp(&self, now: u64) -> u64 {
        self.time.clamp(now)
    }

    fn fingerprint<Q: Hash + ?Sized>(&self, key: &Q) -> u64 {
        self.hasher.hash_one(key)
    }

    /// The index of the shard of the key with fingerprint `fp`.
    fn shard_of(&self, fp: u64) -> usize {
        (fp & self.shard_mask) as usize
    }

    fn shard(&self, fp: u64) -> &Mutex<Shard> {
        &self.shards[self.shard_of(fp)]
    }

    fn run<Q: Hash + ?Sized>(
        &self,
        key: &Q,
        now: u64,
        n: u64,
        consume: bool,
    ) -> Result<Decision, InsufficientCapacity> {
        let fp = self.fingerprint(key);
        let mut shard = lock(self.shard(fp));
        if let Some(ring) = shard.rings.get(&fp) {
            let d = SlidingLog::check(ring, &self.params, now, n, consume)?;
            if consume && d.is_allowed() {
                // This key's expiry moved later: the earliest may have too.
                shard.idle_exact = false;
            }
            return Ok(d);
        }
        // A new key: its decision on an empty log, stored only if it takes.
        let params: SlidingLog = self.params.read();
        let fresh = params.new_cell();
        let d = SlidingLog::check(&fresh, &self.params, now, n, false)?;
        if n == 0 || !d.is_allowed() {
            return Ok(d);
        }
        let own = self.shard_of(fp);
        if !consume {
            // A peek: what the check would do, full-table policy included.
            return Ok(match self.room(&shard, own, &params, now) {
                Some(tracking) => d.with_tracking(tracking),
                None => self.when_no_room(&mut shard, &params, now, d),
            });
        }
        let (ring, tracking) = match self.make_room(&mut shard, own, &params, now) {
            Some(room) => room,
            None => return Ok(self.when_no_room(&mut shard, &params, now, d)),
        };
        let ring = ring.unwrap_or(fresh);
        let d = match SlidingLog::check(&ring, &self.params, now, n, true) {
            Ok(d) => d,
            Err(e) => {
                // The unit made room for a key that is not inserted.
                self.release(1);
                return Err(e);
            }
        };
        shard.lower_next_idle(expiry(&ring, params.length));
        shard.rings.insert(fp, ring);
        Ok(d.with_tracking(tracking))
    }

    /// The decision for a new key that found no room: admitted untracked, or
    /// rejected until the shard's first key goes idle.
    fn when_no_room(
        &self,
        shard: &mut Shard,
        params: &SlidingLog,
        now: u64,
        fresh: Decision,
    ) -> Decision {
        if self.policy == WhenFull::AdmitUntracked {
            return fresh.with_tracking(Tracking::Untracked);
        }
        // When the shard's first key goes idle (a retry reclaims it); a
        // shard with no key: within a window, when every key held now has
        // gone idle at the latest.
        let idle_at = if shard.rings.is_empty() {
            now.saturating_add(params.length)
        } else {
            shard.soonest_idle(params.length)
        };
        let wait = idle_at.saturating_sub(now).max(1);
        Decision::deny(fresh.limit(), 0, wait, wait).with_tracking(Tracking::Rejected)
    }

    /// Reserves a unit of `max_keys` for a new key; `false` when full.
    fn reserve(&self) -> bool {
        // Relaxed: the count only bounds how many keys exist; each key is
        // published by its shard's lock, which every reader takes.
        self.count
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |c| {
                (c < self.max_keys as u64).then_some(c + 1)
            })
            .is_ok()
    }

    /// Gives back the units of `k` keys removed.
    fn release(&self, k: usize) {
        if k > 0 {
            // Relaxed: as `reserve`.
            self.count.fetch_sub(k as u64, Ordering::Relaxed);
        }
    }

    /// The other shards an insert into shard `own` looks at, from `start`
    /// (the cursor): at most `ELSEWHERE`, never `own`.
    fn elsewhere(&self, own: usize, start: u64) -> impl Iterator<Item = usize> {
        let n = self.shards.len();
        let others = n - 1;
        (0..ELSEWHERE.min(others)).map(move |i| (own + 1 + (start as usize + i) % others) % n)
    }

    /// What `make_room` would do, read only: `Some(Tracked)` if the table
    /// has room or a shard it looks at an idle key, `Some(EvictedOther)`
    /// if a key would be evicted, `None` if there is no room.
    fn room(&self, shard: &Shard, own: usize, params: &SlidingLog, now: u64) -> Option<Tracking> {
        let idle = |shard: &Shard| {
            now >= shard.next_idle_at
                && shard
                    .rings
                    .values()
                    .any(|r| SlidingLog::is_idle(r, params, now))
        };
        // Relaxed: as `reserve`.
        if self.count.load(Ordering::Relaxed) < self.max_keys as u64 || idle(shard) {
            return Some(Tracking::Tracked);
        }
        // Relaxed: the cursor only spreads the search; it publishes nothing.
        let start = self.cursor.load(Ordering::Relaxed);
        // One pass over the other shards: an idle key anywhere comes first;
        // else a key to evict, in the own shard or in one of them.
        let mut some_key = !shard.rings.is_empty();
        for other in self
            .elsewhere(own, start)
            .filter_map(|j| try_lock(&self.shards[j]))
        {
            if idle(&other) {
                return Some(Tracking::Tracked);
            }
            some_key |= !other.rings.is_empty();
        }
        (self.policy == WhenFull::EvictLeastRecent && some_key).then_some(Tracking::EvictedOther)
    }

    /// Room for one more key, if the policy allows: a ring to reuse
    /// (cleared) if one was freed, and how the room was made. In order: a
    /// unit of `max_keys`; the key's shard's idle keys; other shards' idle
    /// keys; then, under `EvictLeastRecent`, a key of its shard, or of
    /// another when its shard holds none. `None`: no room (the policy says
    /// reject or admit untracked).
    fn make_room(
        &self,
        shard: &mut Shard,
        own: usize,
        params: &SlidingLog,
        now: u64,
    ) -> Option<(Option<LogRing>, Tracking)> {
        if self.reserve() {
            return Some((None, Tracking::Tracked));
        }
        // Full: reclaim idle keys, unless none can be idle yet. One ring is
        // the new key's, with its unit.
        if let (removed, Some(ring)) = reclaim_idle(shard, params, now) {
            self.release(removed - 1);
            return Some((Some(ring), Tracking::Tracked));
        }
        // Relaxed: as in `room`.
        let start = self.cursor.fetch_add(1, Ordering::Relaxed);
        for j in self.elsewhere(own, start) {
            if let Some(mut other) = try_lock(&self.shards[j]) {
                let (removed, _) = reclaim_idle(&mut other, params, now);
                self.release(removed);
                if removed > 0 && self.reserve() {
                    return Some((None, Tracking::Tracked));
                }
            }
        }
        if self.policy != WhenFull::EvictLeastRecent {
            return None;
        }
        // An evicted key's unit passes to the new key.
        if let Some(ring) = evict(shard) {
            return Some((Some(ring), Tracking::EvictedOther));
        }
        self.elsewhere(own, start).find_map(|j| {
            let ring = evict(&mut *try_lock(&self.shards[j])?)?;
            Some((Some(ring), Tracking::EvictedOther))
        })
    }
}

/// Removes `shard`'s idle keys, unless none can be idle yet: how many, and
/// one of their rings, cleared, to reuse.
fn reclaim_idle(shard: &mut Shard, params: &SlidingLog, now: u64) -> (usize, Option<LogRing>) {
    if now < shard.next_idle_at {
        return (0, None);
    }
    let before = shard.rings.len();
    let mut next_idle_at = u64::MAX;
    let mut reused = None;
    shard.rings.retain(|_, ring| {
        if SlidingLog::is_idle(ring, params, now) {
            if reused.is_none() {
                reused = Some(std::mem::replace(ring, LogRing::new()));
            }
            false
        } else {
            next_idle_at = next_idle_at.min(expiry(ring, params.length));
            true
        }
    });
    // Exact: the earliest expiry of the keys left. A key inserted next
    // lowers it if it must (`lower_next_idle`).
    shard.next_idle_at = next_idle_at;
    shard.idle_exact = true;
    if let Some(ring) = &reused {
        SlidingLog::reset(ring);
    }
    (before - shard.rings.len(), reused)
}

/// Removes the sampled key of `shard` whose newest admission is oldest:
/// its ring, cleared, to reuse; `None` if the shard holds no key.
fn evict(shard: &mut Shard) -> Option<LogRing> {
    let victim = shard
        .rings
        .iter()
        .take(EVICT_SAMPLE)
        .min_by_key(|(_, r)| r.newest())
        .map(|(&fp, _)| fp)?;
    let ring = shard.rings.remove(&victim)?;
    shard.idle_exact = false;
    SlidingLog::reset(&ring);
    Some(ring)
}

impl<K, C: Clock> fmt::Debug for KeyedSlidingWindowLog<K, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedSlidingWindowLog")
            .field("quota", &self.quota())
            .field("max_keys", &self.max_keys)
            .field("shards", &self.shards.len())
            .field("policy", &self.policy)
            .field("clock", self.time.clock())
            .finish()
    }
}

impl<K, C: Clock> KeyedCore for KeyedSlidingWindowLog<K, C> {
    type Key = K;
    type Clock = C;
    type Memo = ();

    fn key_now(&self) -> u64 {
        self.time.now()
    }

    fn key_clock(&self) -> &C {
        self.time.clock()
    }

    fn key_run<Q: Hash + ?Sized>(&self, key: &Q, now: Option<u64>, n: u64, take: bool) -> Checked {
        let now = now.unwrap_or_else(|| self.time.now());
        self.run(key, self.clamp(now), n, take)
    }

    fn key_capacity<Q: Hash + ?Sized>(&self, _: &Q) -> u64 {
        self.params.read::<SlidingLog>().capacity()
    }

    fn key_give_back<Q: Hash + ?Sized>(&self, key: &Q, now: u64, n: u64, _: &()) {
        self.key_refund(key, now, n);
    }
}

impl<K, C: Clock> KeyedRefund for KeyedSlidingWindowLog<K, C> {
    fn key_refund<Q: Hash + ?Sized>(&self, key: &Q, now: u64, n: u64) {
        let now = self.clamp(now);
        let fp = self.fingerprint(key);
        let mut shard = lock(self.shard(fp));
        if let Some(ring) = shard.rings.get(&fp) {
            SlidingLog::refund(ring, &self.params, now, n);
            // The key may go idle sooner now (at once, if emptied).
            let e = expiry(ring, self.params.read::<SlidingLog>().length);
            shard.lower_next_idle(e);
        }
    }

    fn key_reset<Q: Hash + ?Sized>(&self, key: &Q) {
        let fp = self.fingerprint(key);
        let mut shard = lock(self.shard(fp));
        if shard.rings.remove(&fp).is_some() {
            shard.idle_exact = false;
            self.release(1);
        }
    }
}

impl<K, C: Clock> KeyedTable for KeyedSlidingWindowLog<K, C> {
    fn table_len(&self) -> usize {
        // The count, not a sum over the shards: a key evicted from one
        // shard for a key of another would be counted twice by a sum that
        // read the first shard before the eviction and the second after.
        // Relaxed: as `reserve`.
        self.count.load(Ordering::Relaxed) as usize
    }

    fn table_max_keys(&self) -> usize {
        self.max_keys
    }

    fn table_when_full(&self) -> WhenFull {
        self.policy
    }

    fn table_retain_active(&self) -> usize {
        let now = self.clamp(self.time.now());
        let params: SlidingLog = self.params.read();
        self.shards
            .iter()
            .map(|s| {
                let mut shard = lock(s);
                let before = shard.rings.len();
                shard
                    .rings
                    .retain(|_, ring| !SlidingLog::is_idle(ring, &params, now));
                shard.idle_exact = false;
                let removed = before - shard.rings.len();
                self.release(removed);
                removed
            })
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;

    /// The shards an insert into a full log looks at besides its own: never
    /// its own, all distinct, `ELSEWHERE` of them (or every other shard,
    /// when there are fewer), and over as many inserts as there are other
    /// shards, every other shard.
    #[test]
    fn the_window_of_other_shards_moves_over_all_of_them() {
        for shards in [1usize, 2, 4, 16, 64] {
            let log = KeyedSlidingWindowLog::<u64, _>::builder(Window::per_second(1))
                .max_keys(shards * 4)
                .shards(shards)
                .clock(ManualClock::new())
                .build()
                .unwrap();
            for own in [0, shards / 2, shards - 1] {
                let mut seen = vec![false; shards];
                for start in 0..shards as u64 {
                    let window: Vec<usize> = log.elsewhere(own, start).collect();
                    assert_eq!(window.len(), ELSEWHERE.min(shards - 1), "{shards} shards");
                    let mut distinct = window.clone();
                    distinct.sort_unstable();
                    distinct.dedup();
                    assert_eq!(distinct.len(), window.len(), "{window:?}");
                    for j in window {
                        assert!(j < shards && j != own, "{j} from {own} of {shards}");
                        seen[j] = true;
                    }
                }
                let reached = seen.iter().filter(|&&s| s).count();
                assert_eq!(reached, shards - 1, "from {own} of {shards}");
            }
        }
    }
}
