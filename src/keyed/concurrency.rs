//! [`KeyedConcurrencyLimiter`]: a concurrency limit per key (user, tenant,
//! IP address) in the bounded keyed table, its builder, and its permits.
//!
//! It is a [`KeyedLimiter`] over the keyed concurrency algorithm
//! (`algo::concurrency::Concurrent`: the slot's state is the key's count
//! of units in flight, the maximum is the table's parameter), behind a face
//! that hands units out only as RAII permits: the rate family's
//! `check_key`, `refund_key` and `reset_key` would take units no permit
//! holds or give back units a permit still holds, so they are not offered.
//!
//! - An acquire is the table's keyed check of cost `n` (a new key takes the
//!   insert path and the full-table policy as any keyed limiter's does).
//! - A release is the table's update of the key's slot, found by the key's
//!   hash (the permit keeps the hash, not the key nor a slot index), with
//!   the algorithm's release step: exactly the permit's units off.
//! - A key with permits out has a count of at least their units, so it is
//!   never idle: the table's reclaim (insert-time sweep, `retain_active`)
//!   only removes idle keys, and this limiter never asks the table to evict
//!   an active one ([`WhenFull::EvictLeastRecent`] rejects instead, see
//!   [`KeyedConcurrencyBuilder::when_full`]). So a release always finds its
//!   key's slot.
//!
//! See docs/concurrency.md, "Keyed concurrency".

use super::builder::{table_setters, KeyedBuilder, TableOptions, WhenFull};
use super::family::{table_methods, KeyedCore, KeyedTable};
use super::limiter::KeyedLimiter;
use crate::algo::concurrency::{mean_hold, release_count, Concurrent};
use crate::clock::Clock;
use crate::concurrency::Acquisition;
use crate::decision::{Decision, Tracking};
use crate::error::{ConfigError, InsufficientCapacity};
use crate::limiter::DefaultClock;
use crate::sync::{AtomicU64, Ordering};
use crate::wait::{Attempt, AttemptCore, Outcome, Token};
use crossbeam_utils::CachePadded;
use std::borrow::Borrow;
use std::fmt;
use std::hash::Hash;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

/// A permit's `start` when it is not timed.
const UNTIMED: u64 = u64::MAX;

/// A concurrency limit per key: at most `max` units in flight for each key
/// (per user, per tenant, per IP address), in the same bounded, lock-free
/// table as the keyed rate limiters ([`KeyedLimiter`]), with the same
/// options (`max_keys`, [`WhenFull`], shards, seed).
///
/// - [`try_acquire_key`](Self::try_acquire_key) returns an [`Acquisition`]
///   (the decision, and a [`KeyedPermit`] when allowed), as
///   [`ConcurrencyLimiter::try_acquire`](crate::ConcurrencyLimiter::try_acquire)
///   does; [`try_acquire_key_owned`](Self::try_acquire_key_owned) a
///   `'static` [`OwnedKeyedPermit`] for a spawned task or a response body.
/// - A permit gives its units back exactly once, when it is dropped (also
///   during a panic, or with the future that holds it).
/// - A key with nothing in flight is idle and may be reclaimed; a key with
///   permits out never is, nor is it evicted.
/// - The maximum can change at run time for every key
///   ([`set_max`](Self::set_max)) or for one ([`set_key_max`](Self::set_key_max)),
///   keeping the permits out.
///
/// # Example
///
/// ```
/// use ratewall::KeyedConcurrencyLimiter;
///
/// let per_tenant = KeyedConcurrencyLimiter::<String>::builder(2).max_keys(10_000).build()?;
/// let a = per_tenant.try_acquire_key("acme").into_permit().unwrap();
/// let _b = per_tenant.try_acquire_key("acme").into_permit().unwrap();
/// assert!(!per_tenant.try_acquire_key("acme").is_allowed()); // 2 in flight
/// assert!(per_tenant.try_acquire_key("globex").is_allowed()); // another key
/// drop(a);
/// assert_eq!(per_tenant.in_flight_key("acme"), 1);
/// # Ok::<(), ratewall::ConfigError>(())
/// ```
///
/// # Waiting
///
/// An acquisition is one try of a [`Wait`](crate::wait::Wait), written as
/// every wait with a deadline is: `wait.blocking(|| limiter.try_acquire_key(&key))`
/// (or `try_acquire_key_n(&key, n)`) returns the permit, and
/// `wait.until(|| ...)` (feature `wait`) is its async form
/// (`try_acquire_key_owned` for an owned permit). A denial sleeps for its
/// `retry_after`, the observed mean hold time: a **hint**, so the wait tries
/// again then, and a release may have come sooner or later. With a
/// timeout, a hint longer than the time left ends the wait at once (the
/// wait's rule for every limiter), with
/// [`WaitError::NoPermit`](crate::wait::WaitError::NoPermit) (the count
/// asked, the maximum, the denial). A cost above the key's maximum ends it
/// with [`WaitError::InsufficientCapacity`](crate::wait::WaitError).
///
/// ```
/// use ratewall::{wait::Wait, KeyedConcurrencyLimiter};
/// use std::{sync::Arc, time::Duration};
///
/// let l = Arc::new(KeyedConcurrencyLimiter::<u64>::new(1)?);
/// let held = l.try_acquire_key_owned(&7).into_permit().unwrap();
/// let t = std::thread::spawn(move || { std::thread::sleep(Duration::from_millis(20)); drop(held) });
/// let permit = Wait::new().timeout(Duration::from_secs(5)).blocking(|| l.try_acquire_key(&7)).unwrap();
/// assert_eq!(permit.units(), 1);
/// # t.join().unwrap();
/// # Ok::<(), ratewall::ConfigError>(())
/// ```
pub struct KeyedConcurrencyLimiter<K, C: Clock = DefaultClock> {
    table: KeyedLimiter<K, Concurrent, C>,
    /// The policy asked for (the table runs `RejectNew` for `EvictLeastRecent`).
    when_full: WhenFull,
    /// Exponentially weighted mean hold time in ns, over the timed permits of
    /// every key; 0 until the first comes back.
    hold_ns: CachePadded<AtomicU64>,
}

/// Builds a [`KeyedConcurrencyLimiter`]: the maximum per key, the table's
/// options and the clock that times permits.
///
/// # Example
///
/// ```
/// use ratewall::{KeyedConcurrencyLimiter, ManualClock, WhenFull};
///
/// let l = KeyedConcurrencyLimiter::<u64, _>::builder(8)
///     .max_keys(100_000)
///     .shards(16)
///     .when_full(WhenFull::AdmitUntracked)
///     .clock(ManualClock::new())
///     .build()?;
/// assert_eq!((l.max(), l.max_keys()), (8, 100_000));
/// # Ok::<(), ratewall::ConfigError>(())
/// ```
#[must_use = "a builder does nothing until `build`"]
pub struct KeyedConcurrencyBuilder<K, C: Clock = DefaultClock> {
    max: u64,
    table: TableOptions,
    clock: C,
    _key: PhantomData<fn(&K)>,
}

table_setters!([K, C: Clock] KeyedConcurrencyBuilder<K, C>);

impl<K, C: Clock> KeyedConcurrencyBuilder<K, C> {
    /// The clock that times permits for the mean hold time (the denials'
    /// hint); tests use [`ManualClock`](crate::ManualClock).
    ///
    /// ```
    /// # use ratewall::{KeyedConcurrencyLimiter, ManualClock};
    /// let l = KeyedConcurrencyLimiter::<u64, _>::builder(1).clock(ManualClock::new()).build()?;
    /// assert_eq!(l.now(), 0);
    /// # Ok::<(), ratewall::ConfigError>(())
    /// ```
    pub fn clock<C2: Clock>(self, clock: C2) -> KeyedConcurrencyBuilder<K, C2> {
        KeyedConcurrencyBuilder {
            max: self.max,
            table: self.table,
            clock,
            _key: PhantomData,
        }
    }

    /// Validates and allocates the table. A maximum of 0 is
    /// [`ConfigError::ZeroLimit`], above [`MAX_PERMITS`](crate::MAX_PERMITS)
    /// [`ConfigError::LimitTooLarge`]; the table's options fail as
    /// [`KeyedBuilder::build`]'s do.
    ///
    /// A key with permits out is never evicted: with
    /// [`WhenFull::EvictLeastRecent`] a new key that finds no room (every
    /// key in its way holds permits) is rejected, as with
    /// [`WhenFull::RejectNew`] (idle keys are reclaimed under every policy).
    ///
    /// ```
    /// # use ratewall::{ConfigError, KeyedConcurrencyLimiter};
    /// let err = KeyedConcurrencyLimiter::<u64>::builder(0).build().unwrap_err();
    /// assert_eq!(err, ConfigError::ZeroLimit);
    /// ```
    pub fn build(self) -> Result<KeyedConcurrencyLimiter<K, C>, ConfigError> {
        let when_full = self.table.when_full;
        let table = match when_full {
            // Evicting a key with permits out would strand its permits.
            WhenFull::EvictLeastRecent => self.table.when_full(WhenFull::RejectNew),
            _ => self.table,
        };
        let table = KeyedBuilder::<K, Concurrent, DefaultClock>::new(self.max)
            .table(table)
            .clock(self.clock)
            .build()?;
        Ok(KeyedConcurrencyLimiter {
            table,
            when_full,
            hold_ns: CachePadded::new(AtomicU64::new(0)),
        })
    }
}

impl<K> KeyedConcurrencyLimiter<K, DefaultClock> {
    /// At most `max` units in flight per key, with the table's defaults
    /// (65,536 keys, [`WhenFull::RejectNew`]) and the default clock.
    ///
    /// ```
    /// # use ratewall::KeyedConcurrencyLimiter;
    /// let l = KeyedConcurrencyLimiter::<u32>::new(4)?;
    /// assert_eq!(l.max(), 4);
    /// # Ok::<(), ratewall::ConfigError>(())
    /// ```
    pub fn new(max: u64) -> Result<Self, ConfigError> {
        Self::builder(max).build()
    }

    /// A builder for at most `max` units in flight per key.
    ///
    /// ```
    /// # use ratewall::KeyedConcurrencyLimiter;
    /// let l = KeyedConcurrencyLimiter::<u32>::builder(4).max_keys(10).build()?;
    /// assert_eq!(l.max_keys(), 10);
    /// # Ok::<(), ratewall::ConfigError>(())
    /// ```
    pub fn builder(max: u64) -> KeyedConcurrencyBuilder<K, DefaultClock> {
        KeyedConcurrencyBuilder {
            max,
            table: TableOptions::new(),
            clock: DefaultClock::default(),
            _key: PhantomData,
        }
    }
}

/// What a keyed permit holds: its key's hash, its units, when it was taken
/// (or `UNTIMED`), and whether its units are counted in the table (a key
/// admitted untracked by [`WhenFull::AdmitUntracked`] has nothing to give back).
#[derive(Debug)]
struct KeyHeld {
    h: u64,
    units: u64,
    start: u64,
    counted: bool,
}

impl<K, C: Clock> KeyedConcurrencyLimiter<K, C> {
    /// The one admission path: the table's keyed check of cost `n`, then the
    /// hints. `None` in the second place: denied.
    #[inline]
    fn admit<Q: Hash + ?Sized>(
        &self,
        key: &Q,
        n: u64,
    ) -> Result<(Decision, Option<KeyHeld>), InsufficientCapacity> {
        let h = self.table.hash(key);
        let now = self.table.key_now();
        // Relaxed: a hint for the decision; it orders nothing.
        let hold = self.hold_ns.load(Ordering::Relaxed);
        // The slot's compare-exchange (AcqRel) pairs with the releases'
        // exchanges on the same slot: a holder sees what the previous
        // holders of its units did (the semaphore contract).
        let d = hinted(self.table.run(h, self.table.clamp(now), n, true)?, hold);
        if !d.is_allowed() {
            return Ok((d, None));
        }
        // Time one permit in 16 (and the first ones): the low bits of the
        // nanosecond reading pick them, so deciding writes nothing. (A clock
        // that ticks in multiples of 16 ns, like `ManualClock` in tests,
        // times every permit.)
        let timed = hold == 0 || now % 16 == 0;
        Ok((
            d,
            Some(KeyHeld {
                h,
                units: n,
                start: if timed { now } else { UNTIMED },
                counted: n > 0 && d.tracking() != Tracking::Untracked,
            }),
        ))
    }

    /// [`admit`](Self::admit) as an acquisition whose permit `permit` makes.
    #[inline]
    fn acquisition<Q: Hash + ?Sized, P>(
        &self,
        key: &Q,
        n: u64,
        permit: impl FnOnce(KeyHeld) -> P,
    ) -> Result<Acquisition<P>, InsufficientCapacity> {
        let (decision, held) = self.admit(key, n)?;
        Ok(Acquisition::new(decision, held.map(permit), n))
    }

    /// Gives a permit's units back (its `Drop`): one update of its key's
    /// slot, found by the hash. A timed permit then feeds the mean hold time.
    #[inline]
    fn release(&self, held: &KeyHeld) {
        if held.counted {
            let n = held.units;
            // The table's update: the slot's AcqRel compare-exchange (its
            // Release pairs with the next admission's Acquire load).
            // Time 0: the count's packing (`Plain`) reads no time.
            let found = self
                .table
                .table
                .update(held.h, 0, &mut |state| ((), Some(release_count(state, n))));
            // (Not checked while unwinding: a second panic would abort.)
            debug_assert!(
                found.is_some() || std::thread::panicking(),
                "a key with permits out was reclaimed"
            );
        }
        if held.start != UNTIMED {
            self.record(held.start);
        }
    }

    /// The timed part of a release, out of line.
    #[inline(never)]
    fn record(&self, start: u64) {
        let hold = self.table.key_now().saturating_sub(start);
        // Relaxed load and store, not a read-modify-write: two racing
        // releases may lose one sample, which a hint can afford.
        let old = self.hold_ns.load(Ordering::Relaxed);
        self.hold_ns.store(mean_hold(old, hold), Ordering::Relaxed);
    }

    /// Takes one unit for `key` if it fits, without waiting: the
    /// [`Acquisition`] itself (one unit always fits a key's maximum, at
    /// least 1), as `check_key` is a decision; see
    /// [`try_acquire_key_n`](Self::try_acquire_key_n) for the decision's
    /// fields and a full table.
    ///
    /// ```
    /// # use ratewall::KeyedConcurrencyLimiter;
    /// let l = KeyedConcurrencyLimiter::<&str>::new(1)?;
    /// let a = l.try_acquire_key("db");
    /// assert!(a.is_allowed());
    /// assert!(!l.try_acquire_key("db").is_allowed());
    /// assert!(l.try_acquire_key("cache").is_allowed()); // another key
    /// # Ok::<(), ratewall::ConfigError>(())
    /// ```
    #[inline]
    pub fn try_acquire_key<Q>(&self, key: &Q) -> Acquisition<KeyedPermit<'_, K, C>>
    where
        K: Borrow<Q>,
        Q: Hash + ?Sized,
    {
        Acquisition::unit(self.try_acquire_key_n(key, 1))
    }

    /// Takes `n` units for `key` if they fit under its maximum, without
    /// waiting. The decision's `limit` is the key's maximum, `remaining` what
    /// the key may still take after this request, and a denial's
    /// `retry_after` the observed mean hold time of a permit (a hint, 1 ns
    /// before the first timed permit comes back). A cost above the key's
    /// maximum is an error, not a denial. A new key that finds the table
    /// full is handled by [`WhenFull`]: rejected (a denial whose
    /// [`tracking`](Decision::tracking) is [`Tracking::Rejected`]), or
    /// admitted untracked ([`Tracking::Untracked`]: its permit counts
    /// nothing). A cost of 0 takes nothing: its decision is a unit
    /// request's, as for every keyed limiter, and its permit holds nothing.
    ///
    /// ```
    /// # use ratewall::{InsufficientCapacity, KeyedConcurrencyLimiter};
    /// let l = KeyedConcurrencyLimiter::<&str>::new(4)?;
    /// let a = l.try_acquire_key_n("db", 3).unwrap();
    /// assert_eq!((a.decision().limit(), a.decision().remaining()), (4, 1));
    /// assert!(!l.try_acquire_key_n("db", 2).unwrap().is_allowed());
    /// assert_eq!(l.try_acquire_key_n("db", 5).unwrap_err(), InsufficientCapacity { requested: 5, capacity: 4 });
    /// # Ok::<(), ratewall::ConfigError>(())
    /// ```
    #[inline]
    pub fn try_acquire_key_n<Q>(
        &self,
        key: &Q,
        n: u64,
    ) -> Result<Acquisition<KeyedPermit<'_, K, C>>, InsufficientCapacity>
    where
        K: Borrow<Q>,
        Q: Hash + ?Sized,
    {
        self.acquisition(key, n, |held| KeyedPermit {
            limiter: self,
            held,
        })
    }

    /// [`try_acquire_key`](Self::try_acquire_key) with a `'static` permit
    /// that owns an `Arc` of the limiter (and the key's hash, not the key):
    /// for spawned tasks and response bodies.
    ///
    /// ```
    /// # use ratewall::KeyedConcurrencyLimiter;
    /// # use std::sync::Arc;
    /// let l = Arc::new(KeyedConcurrencyLimiter::<u64>::new(1)?);
    /// let p = l.try_acquire_key_owned(&7).into_permit().unwrap();
    /// std::thread::spawn(move || drop(p)).join().unwrap();
    /// assert_eq!(l.in_flight_key(&7), 0);
    /// # Ok::<(), ratewall::ConfigError>(())
    /// ```
    #[inline]
    pub fn try_acquire_key_owned<Q>(
        self: &Arc<Self>,
        key: &Q,
    ) -> Acquisition<OwnedKeyedPermit<K, C>>
    where
        K: Borrow<Q>,
        Q: Hash + ?Sized,
    {
        Acquisition::unit(self.try_acquire_key_owned_n(key, 1))
    }

    /// [`try_acquire_key_n`](Self::try_acquire_key_n) with a `'static`
    /// permit that owns an `Arc` of the limiter.
    ///
    /// ```
    /// # use ratewall::KeyedConcurrencyLimiter;
    /// # use std::sync::Arc;
    /// let l = Arc::new(KeyedConcurrencyLimiter::<u64>::new(1)?);
    /// let p = l.try_acquire_key_owned(&7).into_permit().unwrap();
    /// std::thread::spawn(move || drop(p)).join().unwrap();
    /// assert_eq!(l.in_flight_key(&7), 0);
    /// # Ok::<(), ratewall::ConfigError>(())
    /// ```
    #[inline]
    pub fn try_acquire_key_owned_n<Q>(
        self: &Arc<Self>,
        key: &Q,
        n: u64,
    ) -> Result<Acquisition<OwnedKeyedPermit<K, C>>, InsufficientCapacity>
    where
        K: Borrow<Q>,
        Q: Hash + ?Sized,
    {
        self.acquisition(key, n, |held| OwnedKeyedPermit {
            limiter: Arc::clone(self),
            held,
        })
    }

    /// The decision a unit acquire for `key` would get now, taking nothing
    /// (and not tracking an unknown key): `remaining` is the key's maximum
    /// minus its units in flight, minus 1. For a key the table does not hold,
    /// that includes the full-table policy (its
    /// [`tracking`](Decision::tracking)).
    ///
    /// ```
    /// # use ratewall::KeyedConcurrencyLimiter;
    /// let l = KeyedConcurrencyLimiter::<u64>::new(3)?;
    /// let _p = l.try_acquire_key(&1);
    /// assert_eq!(l.peek_key(&1).remaining(), 1);
    /// # Ok::<(), ratewall::ConfigError>(())
    /// ```
    pub fn peek_key<Q>(&self, key: &Q) -> Decision
    where
        K: Borrow<Q>,
        Q: Hash + ?Sized,
    {
        crate::keyed::family::unit(self.peek_key_n(key, 1))
    }

    /// The decision an acquire of `n` units for `key` would get now, taking
    /// nothing; a cost above the key's maximum is the same error.
    ///
    /// ```
    /// # use ratewall::KeyedConcurrencyLimiter;
    /// let l = KeyedConcurrencyLimiter::<u64>::new(3)?;
    /// assert!(l.peek_key_n(&1, 3).unwrap().is_allowed());
    /// assert!(l.peek_key_n(&1, 4).is_err());
    /// # Ok::<(), ratewall::ConfigError>(())
    /// ```
    pub fn peek_key_n<Q>(&self, key: &Q, n: u64) -> Result<Decision, InsufficientCapacity>
    where
        K: Borrow<Q>,
        Q: Hash + ?Sized,
    {
        // Relaxed: a hint; it orders nothing.
        let hold = self.hold_ns.load(Ordering::Relaxed);
        Ok(hinted(self.table.key_run(key, None, n, false)?, hold))
    }

    /// The units `key` has in flight now (0 for a key the table does not
    /// hold): a snapshot.
    ///
    /// ```
    /// # use ratewall::KeyedConcurrencyLimiter;
    /// let l = KeyedConcurrencyLimiter::<u64>::new(5)?;
    /// let _p = l.try_acquire_key_n(&1, 2).unwrap();
    /// assert_eq!((l.in_flight_key(&1), l.in_flight_key(&2)), (2, 0));
    /// # Ok::<(), ratewall::ConfigError>(())
    /// ```
    pub fn in_flight_key<Q>(&self, key: &Q) -> u64
    where
        K: Borrow<Q>,
        Q: Hash + ?Sized,
    {
        self.table.table.state(self.table.hash(key), 0).unwrap_or(0)
    }

    /// The maximum of keys without their own.
    ///
    /// ```
    /// # use ratewall::KeyedConcurrencyLimiter;
    /// assert_eq!(KeyedConcurrencyLimiter::<u64>::new(9)?.max(), 9);
    /// # Ok::<(), ratewall::ConfigError>(())
    /// ```
    pub fn max(&self) -> u64 {
        self.table.quota()
    }

    /// The maximum in force for `key`: its own, or the limiter's.
    ///
    /// ```
    /// # use ratewall::KeyedConcurrencyLimiter;
    /// let l = KeyedConcurrencyLimiter::<&str>::new(2)?;
    /// l.set_key_max("batch", 20)?;
    /// assert_eq!((l.key_max("batch"), l.key_max("web")), (20, 2));
    /// # Ok::<(), ratewall::ConfigError>(())
    /// ```
    pub fn key_max<Q>(&self, key: &Q) -> u64
    where
        K: Borrow<Q>,
        Q: Hash + ?Sized,
    {
        self.table.capacity_for(key)
    }

    /// Changes the maximum of every key without its own, now, keeping the
    /// permits out: raising it admits at once; lowering it below a key's
    /// units in flight admits nothing for that key until enough come back
    /// (nothing is revoked or stranded). No slot is rewritten (the count
    /// does not depend on the maximum), but the change waits for the
    /// table's inserts as any keyed quota change does.
    ///
    /// ```
    /// # use ratewall::KeyedConcurrencyLimiter;
    /// let l = KeyedConcurrencyLimiter::<u64>::new(2)?;
    /// let held = l.try_acquire_key_n(&1, 2).unwrap();
    /// l.set_max(1)?;
    /// assert_eq!((l.max(), l.in_flight_key(&1)), (1, 2));
    /// assert!(!l.try_acquire_key(&1).is_allowed());
    /// drop(held);
    /// assert!(l.try_acquire_key(&1).is_allowed());
    /// # Ok::<(), ratewall::ConfigError>(())
    /// ```
    pub fn set_max(&self, max: u64) -> Result<(), ConfigError> {
        self.table.set_quota(max)
    }

    /// Gives `key` its own maximum (a larger tenant), keeping its permits
    /// out, until [`clear_key_max`](Self::clear_key_max); it survives
    /// [`set_max`](Self::set_max). While any key has its own maximum, every
    /// acquire also consults a small mutex-guarded map (the keyed tables'
    /// per-key quotas): keep such keys few.
    ///
    /// ```
    /// # use ratewall::KeyedConcurrencyLimiter;
    /// let l = KeyedConcurrencyLimiter::<&str>::new(1)?;
    /// l.set_key_max("batch", 3)?;
    /// let held: Vec<_> = (0..3).map(|_| l.try_acquire_key("batch")).collect();
    /// assert!(held.iter().all(|a| a.is_allowed()));
    /// # Ok::<(), ratewall::ConfigError>(())
    /// ```
    pub fn set_key_max<Q>(&self, key: &Q, max: u64) -> Result<(), ConfigError>
    where
        K: Borrow<Q>,
        Q: Hash + ?Sized,
    {
        self.table.set_key_quota(key, max)
    }

    /// Removes `key`'s own maximum: it follows the limiter's again (its
    /// permits out stay).
    ///
    /// ```
    /// # use ratewall::KeyedConcurrencyLimiter;
    /// let l = KeyedConcurrencyLimiter::<&str>::new(1)?;
    /// l.set_key_max("batch", 3)?;
    /// l.clear_key_max("batch");
    /// assert_eq!(l.key_max("batch"), 1);
    /// # Ok::<(), ratewall::ConfigError>(())
    /// ```
    pub fn clear_key_max<Q>(&self, key: &Q)
    where
        K: Borrow<Q>,
        Q: Hash + ?Sized,
    {
        self.table.clear_key_quota(key);
    }

    /// The observed mean time a permit is held, over a sample of the permits
    /// of every key (an exponentially weighted mean, weight 1/8); zero before
    /// the first timed permit comes back. A denial's `retry_after` is this
    /// hint.
    ///
    /// ```
    /// # use ratewall::{KeyedConcurrencyLimiter, ManualClock};
    /// # use std::time::Duration;
    /// let clock = ManualClock::new();
    /// let l = KeyedConcurrencyLimiter::<u64, _>::builder(1).clock(clock.clone()).build()?;
    /// let p = l.try_acquire_key(&1);
    /// clock.advance(Duration::from_millis(30));
    /// drop(p);
    /// assert_eq!(l.mean_hold_time(), Duration::from_millis(30));
    /// assert_eq!(l.try_acquire_key(&1).decision().reset_after(), Duration::from_millis(30));
    /// # Ok::<(), ratewall::ConfigError>(())
    /// ```
    pub fn mean_hold_time(&self) -> Duration {
        // Relaxed: a hint; it orders nothing.
        Duration::from_nanos(self.hold_ns.load(Ordering::Relaxed))
    }

    /// One reading of the clock that times permits, in nanoseconds.
    ///
    /// ```
    /// # use ratewall::{KeyedConcurrencyLimiter, ManualClock};
    /// let l = KeyedConcurrencyLimiter::<u64, _>::builder(1).clock(ManualClock::new()).build()?;
    /// assert_eq!(l.now(), 0);
    /// # Ok::<(), ratewall::ConfigError>(())
    /// ```
    pub fn now(&self) -> u64 {
        self.table.now()
    }

    /// Bytes the table owns (allocated up front, constant), as
    /// [`KeyedLimiter::memory_bytes`].
    ///
    /// ```
    /// # use ratewall::KeyedConcurrencyLimiter;
    /// let l = KeyedConcurrencyLimiter::<String>::builder(4).max_keys(100_000).build()?;
    /// assert!(l.memory_bytes() <= 25 * 100_000);
    /// # Ok::<(), ratewall::ConfigError>(())
    /// ```
    pub fn memory_bytes(&self) -> usize {
        self.table.memory_bytes() + std::mem::size_of::<CachePadded<AtomicU64>>()
    }

    /// Loom-only test hook (compiled only with `--cfg ratewall_loom` and the
    /// `testing` feature): the key's shard and home slot, so that a model can
    /// make two keys compete for one slot.
    #[cfg(all(ratewall_loom, feature = "testing"))]
    #[doc(hidden)]
    pub fn __home_slot<Q>(&self, key: &Q) -> (usize, usize)
    where
        K: Borrow<Q>,
        Q: Hash + ?Sized,
    {
        self.table.__home_slot(key)
    }
}

table_methods!([K, C: Clock] KeyedConcurrencyLimiter<K, C>);

/// The table's size and policy. `when_full` is the policy asked for (the
/// table runs `RejectNew` for `EvictLeastRecent`: a key with permits out is
/// never evicted), and `retain_active` removes the keys with nothing in
/// flight: keys with permits out stay.
impl<K, C: Clock> KeyedTable for KeyedConcurrencyLimiter<K, C> {
    fn table_len(&self) -> usize {
        self.table.len()
    }

    fn table_max_keys(&self) -> usize {
        self.table.max_keys()
    }

    fn table_when_full(&self) -> WhenFull {
        self.when_full
    }

    fn table_retain_active(&self) -> usize {
        self.table.retain_active()
    }
}

/// The decision with this limiter's hints: the mean hold time as an
/// allowed decision's `reset_after`, and as a denial's `retry_after` and
/// `reset_after` (never 0 on a denial). A rejected new key's too: the
/// table's "time until a key in the way goes idle" is unknown here.
#[inline]
fn hinted(mut d: Decision, hold: u64) -> Decision {
    d.reset_after_ns = hold;
    if !d.is_allowed() {
        d.retry_after_ns = hold.max(1);
        d.reset_after_ns = hold.max(1);
    }
    d
}

/// A permit of a [`KeyedConcurrencyLimiter`], borrowing it: its units are
/// in flight for its key until it is dropped, which releases them exactly
/// once (also when the thread panics or the future holding it is dropped).
///
/// # Example
///
/// ```
/// use ratewall::KeyedConcurrencyLimiter;
///
/// let l = KeyedConcurrencyLimiter::<&str>::new(1)?;
/// {
///     let permit = l.try_acquire_key("alice").into_permit().unwrap();
///     assert_eq!((permit.units(), l.in_flight_key("alice")), (1, 1));
/// }
/// assert_eq!(l.in_flight_key("alice"), 0);
/// # Ok::<(), ratewall::ConfigError>(())
/// ```
#[must_use = "dropping a permit releases it at once"]
pub struct KeyedPermit<'a, K, C: Clock = DefaultClock> {
    limiter: &'a KeyedConcurrencyLimiter<K, C>,
    held: KeyHeld,
}

/// A permit of a [`KeyedConcurrencyLimiter`] that owns an `Arc` of it and
/// its key's hash (not the key), so it is `'static` and `Send`: it can move
/// into a spawned task or a response body. Dropping it releases its units
/// exactly once.
///
/// # Example
///
/// ```
/// use ratewall::{KeyedConcurrencyLimiter, OwnedKeyedPermit};
/// use std::sync::Arc;
///
/// let l = Arc::new(KeyedConcurrencyLimiter::<String>::new(2)?);
/// let p: OwnedKeyedPermit<String> = l.try_acquire_key_owned_n("bob", 2).unwrap().into_permit().unwrap();
/// std::thread::spawn(move || drop(p)).join().unwrap();
/// assert_eq!(l.in_flight_key("bob"), 0);
/// # Ok::<(), ratewall::ConfigError>(())
/// ```
#[must_use = "dropping a permit releases it at once"]
pub struct OwnedKeyedPermit<K, C: Clock = DefaultClock> {
    limiter: Arc<KeyedConcurrencyLimiter<K, C>>,
    held: KeyHeld,
}

/// The methods both keyed permits share, written once.
macro_rules! keyed_permit_methods {
    ($name:ident $(<$lt:lifetime>)?) => {
        impl<$($lt,)? K, C: Clock> $name<$($lt,)? K, C> {
            /// The units this permit holds (for a key admitted untracked,
            /// the units it asked for, which the table does not count).
            ///
            /// ```
            /// # use ratewall::KeyedConcurrencyLimiter;
            /// let l = KeyedConcurrencyLimiter::<u64>::new(5)?;
            /// let p = l.try_acquire_key_n(&1, 3).unwrap().into_permit().unwrap();
            /// assert_eq!(p.units(), 3);
            /// # Ok::<(), ratewall::ConfigError>(())
            /// ```
            pub fn units(&self) -> u64 {
                self.held.units
            }
        }

        impl<$($lt,)? K, C: Clock> Drop for $name<$($lt,)? K, C> {
            fn drop(&mut self) {
                self.limiter.release(&self.held);
            }
        }

        impl<$($lt,)? K, C: Clock> fmt::Debug for $name<$($lt,)? K, C> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.debug_struct(stringify!($name))
                    .field("units", &self.held.units)
                    .field("counted", &self.held.counted)
                    .finish()
            }
        }
    };
}

keyed_permit_methods!(KeyedPermit<'a>);
keyed_permit_methods!(OwnedKeyedPermit);

/// A keyed acquisition as one try of a wait (see "Waiting" on
/// [`KeyedConcurrencyLimiter`]): `try_acquire_key`'s [`Acquisition`] and
/// `try_acquire_key_n`'s `Result`, written once for both permits.
macro_rules! permit_attempt {
    ($name:ident $(<$lt:lifetime>)?) => {
        impl<$($lt,)? K, C: Clock> AttemptCore for Acquisition<$name<$($lt,)? K, C>> {}
        impl<$($lt,)? K, C: Clock> Attempt for Acquisition<$name<$($lt,)? K, C>> {
            type Output = $name<$($lt,)? K, C>;
            type Error = std::convert::Infallible;
            #[inline]
            fn outcome(self, _: Token) -> Outcome<Self::Output, Self::Error> {
                let (last, requested) = (self.decision(), self.units());
                match self.into_permit() {
                    Some(permit) => Outcome::Admitted(permit),
                    None => Outcome::Busy { last, requested },
                }
            }
        }

        impl<$($lt,)? K, C: Clock> AttemptCore
            for Result<Acquisition<$name<$($lt,)? K, C>>, InsufficientCapacity>
        {
        }
        impl<$($lt,)? K, C: Clock> Attempt
            for Result<Acquisition<$name<$($lt,)? K, C>>, InsufficientCapacity>
        {
            type Output = $name<$($lt,)? K, C>;
            type Error = std::convert::Infallible;
            #[inline]
            fn outcome(self, t: Token) -> Outcome<Self::Output, Self::Error> {
                match self {
                    Err(e) => Outcome::Never(e),
                    Ok(a) => a.outcome(t),
                }
            }
        }
    };
}

permit_attempt!(KeyedPermit<'a>);
permit_attempt!(OwnedKeyedPermit);

impl<K, C: Clock> fmt::Debug for KeyedConcurrencyLimiter<K, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedConcurrencyLimiter")
            .field("max", &self.max())
            .field("when_full", &self.when_full)
            .field("mean_hold_time", &self.mean_hold_time())
            .field("table", &self.table)
            .finish()
    }
}

impl<K, C: Clock> fmt::Debug for KeyedConcurrencyBuilder<K, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedConcurrencyBuilder")
            .field("max", &self.max)
            .field("table", &self.table)
            .field("clock", &self.clock)
            .finish()
    }
}
