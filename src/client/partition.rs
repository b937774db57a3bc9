//! What a client learns per upstream partition (an authority, or whatever
//! key the caller picks), and the bounded table that holds it.
//!
//! # Rules
//!
//! - A pause ([`Announcement::pause`]: a 429, `r=0`, a `Retry-After`)
//!   holds the partition until the upstream says. Pauses only lengthen:
//!   a later response asking for a shorter one (it may have been sent
//!   before the 429) does not end an earlier one early.
//! - The latest announced quota is kept (an upstream may change it), but
//!   [`Partitions::pace`] only ever slows a pace the user set: it is the
//!   slower of the two, with the smaller burst.
//! - What is left (`r`) lowers the partition's local pace to at most
//!   `r - 1 - newer` units, `newer` being the requests a pacing layer sent
//!   after the one answered and has no response for yet (`pacer.rs`); it
//!   never raises it, but a later response can prove that such a cut
//!   counted a request the upstream had already counted, and that unit is
//!   given back (`flights.rs`).
//! - Memory is bounded: at most `capacity` partitions. A new partition in
//!   a full table evicts the **least recently used** one (used: any call
//!   but the read-only views), found by a scan of the table. Eviction
//!   forgets what was learned; the upstream's next response teaches it
//!   again.
//!
//! # Concurrency
//!
//! The table is one mutex over a hash map, held only to find or insert a
//! partition: a client's calls are network round trips, and the lookup
//! is not where they spend time. Each partition's pause end and counters
//! are atomics (a pacing layer holding the partition checks them without
//! the table's lock); its quota and remaining count sit under its own
//! small mutex, so the two numbers of a quota are always read together.
//! A partition also holds its local pace (`pacer.rs`, made on first use by
//! a pacing layer), so evicting it forgets the pace with what was learned.

use super::announce::{Announcement, Quota, Remaining, MAX_PAUSE};
use super::flights::Flights;
use super::pacer::{come_back_in, Pacer};
use super::refusals::{RefusalCounters, Refusals};
use crate::clock::Clock;
use crate::decision::Decision;
use crate::limiter::DefaultClock;
use crate::quota::Rate;
use crate::sync::{lock, AtomicU64, Mutex, Ordering};
use std::collections::HashMap;
use std::fmt;
use std::hash::Hash;
use std::sync::Arc;
use std::time::Duration;

/// The most partitions a table may hold.
pub const MAX_PARTITIONS: usize = 1 << 20;

/// A partition table that cannot be built.
///
/// ```
/// use ratewall::client::{Partitions, PartitionsError};
///
/// let err = Partitions::<String>::new(0).unwrap_err();
/// assert_eq!(err, PartitionsError::ZeroCapacity);
/// ```
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PartitionsError {
    /// The capacity is 0: give it room for at least one partition.
    ZeroCapacity,
    /// The capacity is above [`MAX_PARTITIONS`]: lower it.
    TooLarge {
        /// The capacity asked for.
        capacity: usize,
    },
}

impl fmt::Display for PartitionsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PartitionsError::ZeroCapacity => {
                f.write_str("a partition table needs a capacity of at least 1")
            }
            PartitionsError::TooLarge { capacity } => write!(
                f,
                "a partition table holds at most {MAX_PARTITIONS} partitions; {capacity} asked"
            ),
        }
    }
}

impl std::error::Error for PartitionsError {}

/// What the upstream said that is still in force.
#[derive(Clone, Copy, Debug, Default)]
struct Learned {
    quota: Option<Quota>,
    /// The smallest windowed `q` announced with `quota`.
    burst: Option<u64>,
    /// Requests left, and until when (ns on the table's clock).
    remaining: Option<(u64, Option<u64>)>,
}

/// One partition's learned state, and its local pace.
#[derive(Debug)]
pub(crate) struct Partition<C: Clock> {
    /// When the pause ends, in ns on the table's clock (0: never paused).
    paused_until: AtomicU64,
    waits: AtomicU64,
    refusals: RefusalCounters,
    retries: AtomicU64,
    /// Requests a pacing layer sent and has no response for yet.
    in_flight: Mutex<Flights>,
    learned: Mutex<Learned>,
    pacer: Pacer<C>,
}

impl<C: Clock> Default for Partition<C> {
    fn default() -> Self {
        Partition {
            paused_until: AtomicU64::new(0),
            waits: AtomicU64::new(0),
            refusals: RefusalCounters::default(),
            retries: AtomicU64::new(0),
            in_flight: Mutex::new(Flights::default()),
            learned: Mutex::new(Learned::default()),
            pacer: Pacer::default(),
        }
    }
}

impl<C: Clock> Partition<C> {
    /// Applies one response's announcement, read at `now`; `answered` is
    /// the request it answers, if a pacing layer sent it (the requests sent
    /// after it and still in flight may not be counted in its `r` yet).
    pub(crate) fn learn(&self, now: u64, said: &Announcement, answered: Option<&InFlight<'_, C>>) {
        self.refusals.record(said);
        if let Some(pause) = said.pause() {
            let end = now.saturating_add(nanos(pause));
            // Relaxed: the pause end publishes no other memory, and
            // fetch_max is one read-modify-write, so of concurrent pauses
            // the latest end stays.
            self.paused_until.fetch_max(end, Ordering::Relaxed);
        }
        if said.quota.is_none() && said.remaining.is_none() {
            return;
        }
        let mut learned = lock(&self.learned);
        if let Some(q) = said.quota {
            learned.quota = Some(q);
            learned.burst = said.burst;
        }
        if let Some(r) = said.remaining {
            let until = r.within.map(|w| now.saturating_add(nanos(w)));
            learned.remaining = Some((r.available, until));
            let upstream = learned.quota.and_then(|q| announced_pace(q, learned.burst));
            drop(learned);
            self.keep_in_step(now, r.available, upstream, answered.map(|a| a.ticket));
        }
    }

    /// Keeps the local pace at or below what the upstream says is `left`
    /// after the request `ticket` (if a pacing layer sent it): first gives
    /// back what earlier cuts are proven to have taken twice, then cuts
    /// (`flights.rs`). `upstream` is the upstream's announced pace.
    fn keep_in_step(&self, now: u64, left: u64, upstream: Option<Rate>, ticket: Option<u64>) {
        // Lock order: the flights, then the pace's own lock (in `pacer`).
        let mut flights = lock(&self.in_flight);
        if let Some(t) = ticket {
            self.pacer.give_back(flights.prove(t, left, now, upstream));
        }
        let newer = ticket.map_or(0, |t| flights.newer(t));
        // One unit of margin: the bucket may hold a fraction of a unit
        // beyond its whole ones (see `pacer.rs`).
        let bound = left.saturating_sub(1).saturating_sub(newer);
        // Before the bucket exists, the cap kept for it may count the
        // `newer` requests twice as well: a cut of up to that many.
        let (held, taken) = self
            .pacer
            .lower_to(bound, now)
            .unwrap_or((bound.saturating_add(newer), newer));
        flights.cut(ticket, left, bound, held, taken);
    }

    #[cfg(test)]
    pub(crate) fn pacer_for_tests(&self) -> &Pacer<C> {
        &self.pacer
    }

    /// Marks one request sent by a pacing layer at `now` until the guard
    /// drops (its response read, or the call failed or was dropped).
    pub(crate) fn send(&self, now: u64) -> InFlight<'_, C> {
        let ticket = lock(&self.in_flight).open(now);
        InFlight {
            partition: self,
            ticket,
        }
    }

    pub(crate) fn record_retry(&self) {
        // Relaxed: a counter; it publishes no other memory.
        self.retries.fetch_add(1, Ordering::Relaxed);
    }

    /// How much longer the partition is paused at `now`, at most
    /// [`MAX_PAUSE`] (also if the clock stepped back since).
    pub(crate) fn paused_for(&self, now: u64) -> Option<Duration> {
        // Relaxed: see `learn`.
        let until = self.paused_until.load(Ordering::Relaxed);
        let left = until.checked_sub(now).filter(|&ns| ns > 0)?;
        Some(Duration::from_nanos(left).min(MAX_PAUSE))
    }

    pub(crate) fn record_wait(&self) {
        // Relaxed: a counter; it publishes no other memory.
        self.waits.fetch_add(1, Ordering::Relaxed);
    }

    /// The pace to keep: the slower of the user's and the announced quota's.
    pub(crate) fn pace(&self, user: Option<Rate>) -> Option<Rate> {
        let learned = *lock(&self.learned);
        slower_pace(user, learned.quota, learned.burst)
    }

    /// Tries to admit one request at `now`: denied (nothing taken, come
    /// back when the pause ends) while the partition is paused, else one
    /// unit of its local pace ([`Partition::pace`] of `user`).
    pub(crate) fn admit(&self, now: u64, user: Option<Rate>, clock: &C) -> Decision
    where
        C: Clone,
    {
        if let Some(pause) = self.paused_for(now) {
            return come_back_in(pause);
        }
        self.pacer.admit(self.pace(user), clock)
    }

    fn view(&self, now: u64) -> PartitionView {
        let learned = *lock(&self.learned);
        let remaining = learned.remaining.and_then(|(available, until)| {
            let within = match until {
                // The window it spoke of is over: it says nothing now.
                Some(until) => Some(Duration::from_nanos(until.checked_sub(now)?).min(MAX_PAUSE)),
                None => None,
            };
            Some(Remaining { available, within })
        });
        PartitionView {
            quota: learned.quota,
            remaining,
            paused_for: self.paused_for(now),
            // Relaxed: counters, read for display.
            waits: self.waits.load(Ordering::Relaxed),
            refusals: self.refusals.load(),
            retries: self.retries.load(Ordering::Relaxed),
        }
    }
}

/// A duration in ns, saturating (every duration here is at most a year).
fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// One request sent and not answered yet (see [`Partition::send`]).
pub(crate) struct InFlight<'p, C: Clock> {
    partition: &'p Partition<C>,
    ticket: u64,
}

impl<C: Clock> InFlight<'_, C> {
    /// How many requests sent after this one are still in flight.
    #[cfg(test)]
    pub(crate) fn newer(&self) -> u64 {
        lock(&self.partition.in_flight).newer(self.ticket)
    }
}

impl<C: Clock> Drop for InFlight<'_, C> {
    fn drop(&mut self) {
        lock(&self.partition.in_flight).close(self.ticket);
    }
}

/// The announced quota as a pace: `q` per `w` as one request every
/// `ceil(w / q)` (rounding up only slows it), at most one every
/// [`MAX_PAUSE`] (no single response makes the client wait longer than
/// that: `q=1;w=31622400` paces one a day, not one a year), with a burst
/// of `q`, or of `burst` (the smallest windowed `q` announced) if lower:
/// the upstream's own bucket, so a paced client spends what the upstream
/// admits at once, then keeps its refill rate. `None` without a window.
fn announced_pace(quota: Quota, burst: Option<u64>) -> Option<Rate> {
    let window = u128::from(nanos(quota.window?));
    let limit = quota.limit.max(1);
    let interval = window.div_ceil(u128::from(limit)).max(1);
    let interval = u64::try_from(interval).unwrap_or(u64::MAX);
    let burst = burst.map_or(limit, |b| b.clamp(1, limit));
    Some(Rate::every(Duration::from_nanos(interval).min(MAX_PAUSE)).burst(burst))
}

/// The slower of the user's pace and the announced quota's, with the
/// smaller of their bursts: an announcement sets a pace where the user
/// set none, and tightens one, but never raises it.
fn slower_pace(user: Option<Rate>, quota: Option<Quota>, burst: Option<u64>) -> Option<Rate> {
    let announced = quota.and_then(|q| announced_pace(q, burst));
    match (user, announced) {
        (Some(u), Some(a)) => {
            // a is slower iff a.period / a.count > u.period / u.count
            // (a.count is 1); periods below 2^64 ns and counts below 2^64: no overflow.
            let slower = a.period().as_nanos() * u128::from(u.count()) > u.period().as_nanos();
            let burst = a.burst_size().min(u.burst_size());
            let pace = if slower { a } else { u };
            // Only a smaller burst is written: a pace keeps its own form.
            Some(if pace.burst_size() > burst {
                pace.burst(burst)
            } else {
                pace
            })
        }
        (u, a) => u.or(a),
    }
}

/// What a client learned about one partition, for printing.
///
/// ```
/// use ratewall::client::{Announcement, Partitions};
/// use http::{HeaderMap, HeaderValue, StatusCode};
///
/// let partitions = Partitions::new(64).unwrap();
/// let mut headers = HeaderMap::new();
/// headers.insert("ratelimit-policy", HeaderValue::from_static(r#""d";q=10;w=1"#));
/// headers.insert("ratelimit", HeaderValue::from_static(r#""d";r=0;t=1"#));
/// partitions.learn(&"api.example.com", &Announcement::read(StatusCode::OK, &headers));
/// let view = partitions.view(&"api.example.com").unwrap();
/// assert_eq!(view.quota.unwrap().limit, 10);
/// assert!(view.paused_for.is_some());
/// println!("{view}"); // quota 10 per 1s, 0 left within 1s, paused 1s, ...
/// ```
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PartitionView {
    /// The last quota announced.
    pub quota: Option<Quota>,
    /// What the upstream last said is left (`None` once the time it spoke
    /// of is over).
    pub remaining: Option<Remaining>,
    /// How much longer the partition is paused.
    pub paused_for: Option<Duration>,
    /// How many times a request waited for this partition.
    pub waits: u64,
    /// How many refusals (429s and 503s) came back, by status.
    pub refusals: Refusals,
    /// How many of this partition's requests a pacing layer sent again.
    pub retries: u64,
}

impl fmt::Display for PartitionView {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.quota {
            Some(Quota {
                limit,
                window: Some(w),
            }) => write!(f, "quota {limit} per {:?}", to_ms(w))?,
            Some(Quota { limit, .. }) => write!(f, "quota {limit}")?,
            None => f.write_str("no quota announced")?,
        }
        match self.remaining {
            Some(Remaining {
                available,
                within: Some(w),
            }) => write!(f, ", {available} left within {:?}", to_ms(w))?,
            Some(Remaining { available, .. }) => write!(f, ", {available} left")?,
            None => {}
        }
        if let Some(p) = self.paused_for {
            write!(f, ", paused {:?}", to_ms(p))?;
        }
        write!(
            f,
            ", {} waits, {}, {} retries",
            self.waits, self.refusals, self.retries
        )
    }
}

/// `d` rounded to the nearest millisecond, for printing (`999.922025ms`
/// reads as `1s`).
fn to_ms(d: Duration) -> Duration {
    Duration::from_millis(((d.as_micros() + 500) / 1000).min(u128::from(u64::MAX)) as u64)
}

/// A slot: the partition, and when it was last used (a tick of the table).
#[derive(Debug)]
struct Slot<C: Clock> {
    used: u64,
    partition: Arc<Partition<C>>,
}

#[derive(Debug)]
struct Table<K, C: Clock> {
    map: HashMap<K, Slot<C>>,
    tick: u64,
}

/// What a client learned per upstream partition: bounded, shared, safe to
/// call from many tasks.
///
/// A pacing layer calls [`learn`](Self::learn) with every response, and
/// before each request waits out [`paused_for`](Self::paused_for) and
/// keeps [`pace`](Self::pace); the module docs give the rules.
///
/// ```
/// use http::{HeaderMap, HeaderValue, StatusCode};
/// use ratewall::client::{Announcement, Partitions};
/// use ratewall::{ManualClock, Rate};
/// use std::time::Duration;
///
/// let clock = ManualClock::new();
/// let partitions = Partitions::with_clock(128, clock.clone()).unwrap();
/// let mut headers = HeaderMap::new();
/// headers.insert("retry-after", HeaderValue::from_static("2"));
/// let said = Announcement::read(StatusCode::TOO_MANY_REQUESTS, &headers);
/// partitions.learn(&"api.example.com", &said);
/// assert_eq!(partitions.paused_for(&"api.example.com"), Some(Duration::from_secs(2)));
/// clock.advance(Duration::from_secs(2));
/// assert_eq!(partitions.paused_for(&"api.example.com"), None);
///
/// // An announced quota slows the user's pace, never speeds it up, and
/// // keeps the upstream's burst: 5 at once, then one every 200 ms.
/// headers.insert("ratelimit-policy", HeaderValue::from_static(r#""d";q=5;w=1"#));
/// partitions.learn(&"api.example.com", &Announcement::read(StatusCode::OK, &headers));
/// let pace = partitions.pace(&"api.example.com", Some(Rate::per_second(100))).unwrap();
/// assert_eq!(pace, Rate::every(Duration::from_millis(200)).burst(5));
/// ```
pub struct Partitions<K, C: Clock = DefaultClock> {
    table: Mutex<Table<K, C>>,
    capacity: usize,
    clock: C,
}

impl<K, C: Clock> fmt::Debug for Partitions<K, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Partitions")
            .field("len", &lock(&self.table).map.len())
            .field("capacity", &self.capacity)
            .field("clock", &self.clock)
            .finish()
    }
}

impl<K: Hash + Eq + Clone> Partitions<K> {
    /// A table for at most `capacity` partitions, on the default clock.
    ///
    /// ```
    /// let partitions = ratewall::client::Partitions::<String>::new(1024).unwrap();
    /// assert_eq!(partitions.capacity(), 1024);
    /// ```
    pub fn new(capacity: usize) -> Result<Self, PartitionsError> {
        Partitions::with_clock(capacity, DefaultClock::default())
    }
}

impl<K: Hash + Eq + Clone, C: Clock> Partitions<K, C> {
    /// A table for at most `capacity` partitions, on `clock`.
    ///
    /// ```
    /// use ratewall::client::Partitions;
    /// use ratewall::ManualClock;
    ///
    /// let partitions = Partitions::<u32, _>::with_clock(16, ManualClock::new()).unwrap();
    /// assert!(partitions.is_empty());
    /// ```
    pub fn with_clock(capacity: usize, clock: C) -> Result<Self, PartitionsError> {
        if capacity == 0 {
            return Err(PartitionsError::ZeroCapacity);
        }
        if capacity > MAX_PARTITIONS {
            return Err(PartitionsError::TooLarge { capacity });
        }
        Ok(Partitions {
            table: Mutex::new(Table {
                map: HashMap::new(),
                tick: 0,
            }),
            capacity,
            clock,
        })
    }

    /// The most partitions the table holds.
    ///
    /// ```
    /// # let partitions = ratewall::client::Partitions::<u8>::new(8).unwrap();
    /// assert_eq!(partitions.capacity(), 8);
    /// ```
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// How many partitions the table holds now.
    ///
    /// ```
    /// # use ratewall::client::{Announcement, Partitions};
    /// let partitions = Partitions::new(8).unwrap();
    /// partitions.learn(&1u8, &Announcement::default());
    /// assert_eq!(partitions.len(), 1);
    /// ```
    pub fn len(&self) -> usize {
        lock(&self.table).map.len()
    }

    /// Whether the table holds no partition.
    ///
    /// ```
    /// # let partitions = ratewall::client::Partitions::<u8>::new(8).unwrap();
    /// assert!(partitions.is_empty());
    /// ```
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The table's clock.
    pub(crate) fn clock(&self) -> &C {
        &self.clock
    }

    /// The partition of `key`, marked used; inserted (evicting the least
    /// recently used one if the table is full) if absent.
    pub(crate) fn partition(&self, key: &K) -> Arc<Partition<C>> {
        let mut table = lock(&self.table);
        table.tick += 1;
        let tick = table.tick;
        if let Some(slot) = table.map.get_mut(key) {
            slot.used = tick;
            return Arc::clone(&slot.partition);
        }
        if table.map.len() >= self.capacity {
            let oldest = table
                .map
                .iter()
                .min_by_key(|(_, slot)| slot.used)
                .map(|(k, _)| k.clone());
            if let Some(oldest) = oldest {
                table.map.remove(&oldest);
            }
        }
        let partition = Arc::new(Partition::default());
        table.map.insert(
            key.clone(),
            Slot {
                used: tick,
                partition: Arc::clone(&partition),
            },
        );
        partition
    }

    /// Learns what one response from partition `key` announced (see the
    /// module docs for the rules).
    ///
    /// ```
    /// use http::{HeaderMap, HeaderValue, StatusCode};
    /// use ratewall::client::{Announcement, Partitions};
    ///
    /// let partitions = Partitions::new(8).unwrap();
    /// let said = Announcement::read(StatusCode::TOO_MANY_REQUESTS, &HeaderMap::new());
    /// partitions.learn(&"upstream", &said);
    /// assert_eq!(partitions.view(&"upstream").unwrap().refusals.too_many_requests, 1);
    /// ```
    pub fn learn(&self, key: &K, said: &Announcement) {
        let now = self.clock.now();
        self.partition(key).learn(now, said, None);
    }

    /// How much longer partition `key` is paused (`None`: not paused).
    ///
    /// ```
    /// # let partitions = ratewall::client::Partitions::<&str>::new(8).unwrap();
    /// assert_eq!(partitions.paused_for(&"upstream"), None);
    /// ```
    pub fn paused_for(&self, key: &K) -> Option<Duration> {
        let now = self.clock.now();
        self.partition(key).paused_for(now)
    }

    /// The pace to keep for partition `key`: the slower of `user` (the
    /// pace the user set, if any) and the announced quota (`q` per `w` as
    /// one request every `w/q`, rounded up, at most one every
    /// [`MAX_PAUSE`], burst `q`, or the smallest windowed `q` announced
    /// with it if lower), with the smaller of the two bursts. `None` if
    /// neither is known.
    ///
    /// ```
    /// use ratewall::client::Partitions;
    /// use ratewall::Rate;
    ///
    /// let partitions = Partitions::new(8).unwrap();
    /// // Nothing announced yet: the user's pace.
    /// let user = Rate::per_second(10);
    /// assert_eq!(partitions.pace(&"upstream", Some(user)), Some(user));
    /// assert_eq!(partitions.pace(&"upstream", None), None);
    /// ```
    pub fn pace(&self, key: &K, user: Option<Rate>) -> Option<Rate> {
        self.partition(key).pace(user)
    }

    /// Counts one wait for partition `key` (a pacing layer calls it each
    /// time a request waits; so may a hand-written client loop).
    ///
    /// ```
    /// # let partitions = ratewall::client::Partitions::<&str>::new(8).unwrap();
    /// partitions.record_wait(&"upstream");
    /// assert_eq!(partitions.view(&"upstream").unwrap().waits, 1);
    /// ```
    pub fn record_wait(&self, key: &K) {
        self.partition(key).record_wait();
    }

    /// What was learned about partition `key`, if the table holds it
    /// (does not count as a use).
    ///
    /// ```
    /// # let partitions = ratewall::client::Partitions::<&str>::new(8).unwrap();
    /// assert_eq!(partitions.view(&"never seen"), None);
    /// ```
    pub fn view(&self, key: &K) -> Option<PartitionView> {
        let partition = Arc::clone(&lock(&self.table).map.get(key)?.partition);
        Some(partition.view(self.clock.now()))
    }

    /// Every partition's key and view, in no particular order (does not
    /// count as a use).
    ///
    /// ```
    /// # use ratewall::client::{Announcement, Partitions};
    /// let partitions = Partitions::new(8).unwrap();
    /// partitions.record_wait(&"a");
    /// partitions.record_wait(&"b");
    /// for (key, view) in partitions.views() {
    ///     println!("{key}: {view}");
    /// }
    /// assert_eq!(partitions.views().len(), 2);
    /// ```
    pub fn views(&self) -> Vec<(K, PartitionView)> {
        let all: Vec<(K, Arc<Partition<C>>)> = lock(&self.table)
            .map
            .iter()
            .map(|(k, slot)| (k.clone(), Arc::clone(&slot.partition)))
            .collect();
        let now = self.clock.now();
        all.into_iter().map(|(k, p)| (k, p.view(now))).collect()
    }
}

#[cfg(test)]
#[path = "partition_tests.rs"]
mod tests;
