//! The keyed interface, written once: the method family every keyed
//! limiter has (`check_key`, `check_key_n`, `check_key_at`,
//! `check_key_n_at`, `peek_key`, `peek_key_n`, `with_key`, `now`, `clock`,
//! and for a table `refund_key`, `refund_key_at`, `reset_key`, `len`,
//! `is_empty`, `max_keys`, `when_full`, `retain_active`), the one
//! [`KeyedRef`] that binds a keyed limiter to a key, and the one
//! [`Limit`](crate::Limit) implementation for it.
//!
//! Each limiter implements the small sealed core ([`KeyedCore`]; and
//! [`KeyedRefund`] if its units can be given back, [`KeyedTable`] if it is
//! one table of keys), and gets the family as inherent methods from one
//! line each, `keyed_methods!`, `refund_methods!` and `table_methods!`:
//! method-call syntax needs no import, the calls are static and inline as
//! before, and a new keyed limiter costs one core implementation plus one
//! line. See `docs/design.md`, "One keyed interface".

use super::builder::WhenFull;
use crate::clock::Clock;
use crate::decision::Decision;
use crate::error::InsufficientCapacity;
use crate::multi::{LimitCore, Token};
use std::borrow::Borrow;
use std::fmt;
use std::hash::Hash;

/// What a keyed limiter does for a key: the required core behind the
/// method family. Public in a crate-private module: nothing outside the
/// crate can name, call or implement it (sealed).
pub trait KeyedCore {
    /// The key type.
    type Key;
    /// The clock type.
    type Clock: Clock;
    /// What a [`KeyedRef`] remembers from its check for its give-back: `()`
    /// for a table; for an elastic limiter, the path the check took.
    type Memo: Default + fmt::Debug;

    /// One reading of the limiter's clock.
    fn key_now(&self) -> u64;
    /// The clock.
    fn key_clock(&self) -> &Self::Clock;
    /// The decision for a request of cost `n` for `key` at `now` (`None`:
    /// read the clock, after starting the key's load if that helps), taken
    /// if `take` and allowed.
    fn key_run<Q: Hash + ?Sized>(&self, key: &Q, now: Option<u64>, n: u64, take: bool) -> Checked;
    /// A unit check of `key` (`now` as in [`key_run`](Self::key_run)).
    #[inline]
    fn check_key_with<Q: Hash + ?Sized>(&self, key: &Q, now: Option<u64>) -> Decision {
        unit(self.key_run(key, now, 1, true))
    }
    /// Starts the load of `key`'s slot and discards it (a prefetch), so
    /// that its cache miss overlaps other work: the other keys of a batch
    /// ([`CheckKeys`]) or of a multi-limit check. Decides and publishes
    /// nothing. A limiter with nothing to load ahead keeps this no-op.
    #[inline]
    fn key_touch<Q: Hash + ?Sized>(&self, key: &Q) {
        let _ = key;
    }
    /// A batch's first pass over `key` ([`CheckKeys`]): what its check
    /// can work out ahead (a table's hash of the key), with the load of its
    /// slot started as by `key_touch`. By default nothing: 0.
    #[inline]
    fn key_prepare<Q: Hash + ?Sized>(&self, key: &Q) -> u64 {
        self.key_touch(key);
        0
    }
    /// The reading a batch's checks share ([`check_prepared`](Self::check_prepared)'s
    /// `now`): [`key_now`](Self::key_now), or what a check would make of
    /// it first (a table clamps it once for the batch, not once a key).
    #[inline]
    fn key_batch_now(&self) -> u64 {
        self.key_now()
    }
    /// A unit check of `key` at `now` (from [`key_batch_now`](Self::key_batch_now)),
    /// given what `key_prepare` returned for it: `check_key_with`.
    #[inline]
    fn check_prepared<Q: Hash + ?Sized>(&self, key: &Q, prepared: u64, now: u64) -> Decision {
        let _ = prepared;
        self.check_key_with(key, Some(now))
    }
    /// The largest cost `key` can ever pass at once.
    fn key_capacity<Q: Hash + ?Sized>(&self, key: &Q) -> u64;
    /// A multi-limit check's take: [`key_run`](Self::key_run) at `now`,
    /// noting in `memo` what its give-back needs.
    #[inline]
    fn key_take<Q: Hash + ?Sized>(&self, key: &Q, now: u64, n: u64, memo: &Self::Memo) -> Checked {
        let _ = memo;
        self.key_run(key, Some(now), n, true)
    }
    /// A multi-limit check's rollback: gives back what
    /// [`key_take`](Self::key_take) took at `now`.
    fn key_give_back<Q: Hash + ?Sized>(&self, key: &Q, now: u64, n: u64, memo: &Self::Memo);
}

/// A [`KeyedCore`] whose units can be given back and whose keys can be
/// forgotten: a table of rate limits (not a table of permits, whose units
/// only their permits give back). Sealed like [`KeyedCore`].
pub(crate) trait KeyedRefund: KeyedCore {
    /// Gives back `n` units `key` took, at `now` (not yet clamped).
    fn key_refund<Q: Hash + ?Sized>(&self, key: &Q, now: u64, n: u64);
    /// Forgets `key`'s history.
    fn key_reset<Q: Hash + ?Sized>(&self, key: &Q);
}

/// One bounded table of keys: its size and policy (every keyed table, the
/// keyed concurrency limiter's too). Sealed like [`KeyedCore`].
pub(crate) trait KeyedTable {
    /// Keys tracked now.
    fn table_len(&self) -> usize;
    /// The most keys tracked at once.
    fn table_max_keys(&self) -> usize;
    /// The policy when the table is full.
    fn table_when_full(&self) -> WhenFull;
    /// Removes every idle key; returns how many.
    fn table_retain_active(&self) -> usize;
}

/// A check's result: its decision, or the error of a cost that can never
/// pass.
pub(crate) type Checked = Result<Decision, InsufficientCapacity>;

/// A unit request's decision: a cost of 1 always fits (every limit's
/// capacity is validated to be at least 1), so the error arm never runs.
#[inline]
pub(crate) fn unit(result: Checked) -> Decision {
    match result {
        Ok(d) => d,
        Err(e) => unit_never_fits(e),
    }
}

#[cold]
fn unit_never_fits(e: InsufficientCapacity) -> Decision {
    Decision::deny(e.capacity, 0, u64::MAX, u64::MAX)
}

/// A keyed limiter with one key: one limit of a multi-limit
/// [`check_all`](crate::check_all) or [`check_each`](crate::check_each).
/// Made by `with_key` on any keyed limiter ([`KeyedLimiter`](crate::KeyedLimiter),
/// [`KeyedSlidingWindowLog`](crate::KeyedSlidingWindowLog),
/// [`KeyedPolicyLimiter`](crate::KeyedPolicyLimiter),
/// [`ElasticLimiter`](crate::ElasticLimiter)). One made from an
/// [`ElasticLimiter`](crate::ElasticLimiter) remembers which path its last
/// check took (it is not `Sync`): make one per call.
///
/// # Example
///
/// ```
/// use ratewall::{check_all, KeyedRef, KeyedTokenBucket, Rate, TokenBucket};
///
/// let global = TokenBucket::new(Rate::per_second(10_000))?;
/// let per_ip = KeyedTokenBucket::<[u8; 4]>::builder(Rate::per_second(5)).build()?;
/// let one: KeyedRef<'_, _, _> = per_ip.with_key(&[192, 0, 2, 1]);
/// println!("{one:?}");
/// assert!(check_all(&[&one, &global]).is_allowed());
/// # Ok::<(), ratewall::ConfigError>(())
/// ```
pub struct KeyedRef<'a, L: KeyedCore, Q: ?Sized> {
    limiter: &'a L,
    key: &'a Q,
    memo: L::Memo,
}

impl<'a, L: KeyedCore, Q: ?Sized> KeyedRef<'a, L, Q> {
    #[inline]
    pub(crate) fn new(limiter: &'a L, key: &'a Q) -> Self {
        KeyedRef {
            limiter,
            key,
            memo: L::Memo::default(),
        }
    }
}

impl<L: KeyedCore + fmt::Debug, Q: ?Sized + fmt::Debug> fmt::Debug for KeyedRef<'_, L, Q> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedRef")
            .field("limiter", self.limiter)
            .field("key", &self.key)
            .field("took", &self.memo)
            .finish()
    }
}

impl<L: KeyedCore, Q: Hash + ?Sized> KeyedRef<'_, L, Q> {
    // A multi-limit check's calls, without the `Borrow` bound of the public
    // `Limit`: also what a limit built on other keyed limiters (elastic) uses.
    #[inline]
    pub(crate) fn take_at(&self, now: u64, n: u64) -> Checked {
        self.limiter.key_take(self.key, now, n, &self.memo)
    }
    pub(crate) fn peek_at(&self, now: u64, n: u64) -> Checked {
        self.limiter.key_run(self.key, Some(now), n, false)
    }
    pub(crate) fn give_back_at(&self, now: u64, n: u64) {
        self.limiter.key_give_back(self.key, now, n, &self.memo);
    }
    pub(crate) fn capacity(&self) -> u64 {
        self.limiter.key_capacity(self.key)
    }
    /// Starts the load of the key's slot (see `KeyedCore::key_touch`).
    #[inline]
    pub(crate) fn touch(&self) {
        self.limiter.key_touch(self.key);
    }
}

/// Keys a batch check ([`check_keys`](crate::KeyedLimiter::check_keys))
/// looks up before it checks the first of them: 16 slots' cache misses in
/// flight at once, well within what a core tracks (and 16 hashes on the
/// stack).
const BATCH: usize = 16;

/// The decisions of a batch check, in the keys' order: what
/// `check_keys` returns on every keyed limiter
/// ([`KeyedLimiter::check_keys`](crate::KeyedLimiter::check_keys)).
///
/// It takes up to 16 keys from the keys it was given, starts the load of
/// each key's slot, reads the clock once, and then checks them one by one
/// as the decisions are read: the slots' cache misses overlap instead of
/// following each other. Each key's check is the one
/// [`check_key_at`](crate::KeyedLimiter::check_key_at) makes at the
/// group's time. Lazy: a key is checked when its decision is read, and
/// keys after the last decision read are never checked (the rest of their
/// group was only loaded). Allocates nothing.
///
/// ```
/// use ratewall::{KeyedTokenBucket, ManualClock, Rate};
///
/// let l = KeyedTokenBucket::<u64, _>::builder(Rate::per_minute(1).burst(1))
///     .clock(ManualClock::new())
///     .build()?;
/// let keys = [1, 2, 1, 3];
/// let allowed: Vec<bool> = l.check_keys(&keys).map(|d| d.is_allowed()).collect();
/// assert_eq!(allowed, [true, true, false, true]); // key 1's second request is over
/// # Ok::<(), ratewall::ConfigError>(())
/// ```
#[must_use = "iterators are lazy: a key is checked when its decision is read"]
pub struct CheckKeys<'l, 'k, L, Q: ?Sized, I> {
    limiter: &'l L,
    keys: I,
    /// The group's keys, each with what `key_prepare` returned for it.
    group: [Option<(&'k Q, u64)>; BATCH],
    len: usize,
    next: usize,
    now: u64,
}

impl<'l, 'k, L, Q: ?Sized, I> CheckKeys<'l, 'k, L, Q, I> {
    #[inline]
    pub(crate) fn new(limiter: &'l L, keys: I) -> Self {
        CheckKeys {
            limiter,
            keys,
            group: [None; BATCH],
            len: 0,
            next: 0,
            now: 0,
        }
    }
}

impl<'k, L, Q, I> Iterator for CheckKeys<'_, 'k, L, Q, I>
where
    L: KeyedCore,
    L::Key: Borrow<Q>,
    Q: Hash + ?Sized + 'k,
    I: Iterator<Item = &'k Q>,
{
    type Item = Decision;

    #[inline]
    fn next(&mut self) -> Option<Decision> {
        if self.next == self.len {
            // The next group: every slot's load started, then one clock
            // reading (which the loads overlap too).
            self.len = 0;
            self.next = 0;
            for key in self.keys.by_ref().take(BATCH) {
                self.group[self.len] = Some((key, self.limiter.key_prepare(key)));
                self.len += 1;
            }
            if self.len == 0 {
                return None;
            }
            self.now = self.limiter.key_batch_now();
        }
        let (key, prepared) = self.group[self.next]?;
        self.next += 1;
        Some(self.limiter.check_prepared(key, prepared, self.now))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let (lo, hi) = self.keys.size_hint();
        let queued = self.len - self.next;
        (
            lo.saturating_add(queued),
            hi.and_then(|h| h.checked_add(queued)),
        )
    }
}

impl<L, Q: ?Sized, I> fmt::Debug for CheckKeys<'_, '_, L, Q, I> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CheckKeys")
            .field("queued", &(self.len - self.next))
            .field("now", &self.now)
            .finish_non_exhaustive()
    }
}

impl<L, Q> LimitCore<L::Clock> for KeyedRef<'_, L, Q>
where
    L: KeyedCore,
    L::Key: Borrow<Q>,
    Q: Hash + ?Sized,
{
    #[inline]
    fn core_read_clock(&self, _: Token) -> u64 {
        self.limiter.key_now()
    }
    #[inline]
    fn core_take(&self, _: Token, now: u64, n: u64) -> Checked {
        self.take_at(now, n)
    }
    fn core_peek(&self, _: Token, now: u64, n: u64) -> Checked {
        self.peek_at(now, n)
    }
    fn core_give_back(&self, _: Token, now: u64, n: u64) {
        self.give_back_at(now, n);
    }
    fn core_capacity(&self, _: Token) -> u64 {
        self.capacity()
    }
    #[inline]
    fn core_touch(&self, _: Token) {
        self.touch();
    }
}

/// A table's give-back methods, as inherent methods of `$ty` (which
/// implements [`KeyedRefund`]; `$k` is its key type parameter).
macro_rules! keyed_methods {
    ([$($g:tt)*] $ty:ty, $k:ident) => {
        impl<$($g)*> $ty {
            /// Checks one request of cost 1 for `key`, and takes it if allowed.
            ///
            /// ```
            /// # use ratewall::{KeyedTokenBucket, Rate};
            /// let l = KeyedTokenBucket::<String>::builder(Rate::per_hour(2)).build().unwrap();
            /// assert!(l.check_key("bob").is_allowed());
            /// assert!(l.check_key("bob").is_allowed());
            /// assert!(!l.check_key("bob").is_allowed());
            /// ```
            #[inline]
            pub fn check_key<Q: ::std::hash::Hash + ?Sized>(&self, key: &Q) -> $crate::decision::Decision
                where $k: ::std::borrow::Borrow<Q>
            {
                $crate::keyed::family::KeyedCore::check_key_with(self, key, None)
            }

            /// Checks a unit request for each of `keys`, in order, and takes
            /// it where allowed: the decisions `check_key` on each would
            /// give, in the keys' order, as a lazy iterator
            /// ([`CheckKeys`](crate::CheckKeys)). Up to 16 keys at a time
            /// are looked up before the first of them is checked, so their
            /// memory misses overlap (on a table larger than the caches, a
            /// batch costs a fraction of one-at-a-time checks:
            /// docs/benchmarks.md), and each 16 share one clock reading.
            /// Allocates nothing.
            ///
            /// ```
            /// # use ratewall::{KeyedTokenBucket, Rate};
            /// let l = KeyedTokenBucket::<String>::builder(Rate::per_hour(1)).build().unwrap();
            /// let users = ["ada", "bob", "ada"];
            /// let admitted = l.check_keys(users).filter(|d| d.is_allowed()).count();
            /// assert_eq!(admitted, 2); // ada's second request is over
            /// ```
            #[inline]
            pub fn check_keys<'k, Q, I>(&self, keys: I) -> $crate::keyed::family::CheckKeys<'_, 'k, Self, Q, I::IntoIter>
            where
                $k: ::std::borrow::Borrow<Q>,
                Q: ::std::hash::Hash + ?Sized + 'k,
                I: ::std::iter::IntoIterator<Item = &'k Q>,
            {
                $crate::keyed::family::CheckKeys::new(self, keys.into_iter())
            }

            /// Starts loading `key`'s slot, so that a check of it soon after
            /// finds it in the cache; decides and takes nothing. For checks
            /// of several keys in different limiters made one after the
            /// other: prefetch them all, then check them, and their memory
            /// misses overlap. ([`check_keys`](Self::check_keys) and
            /// [`check_all`](crate::check_all) do this themselves.) A
            /// table that stays in the caches (under 2 MiB of slots, about
            /// 175,000 keys) skips it, even the key's hash.
            ///
            /// ```
            /// # use ratewall::{KeyedTokenBucket, Rate};
            /// let per_ip = KeyedTokenBucket::<u32>::builder(Rate::per_second(10)).build().unwrap();
            /// let per_user = KeyedTokenBucket::<String>::builder(Rate::per_second(5)).build().unwrap();
            /// per_ip.prefetch_key(&7);
            /// per_user.prefetch_key("ada");
            /// assert!(per_ip.check_key(&7).is_allowed() && per_user.check_key("ada").is_allowed());
            /// ```
            #[inline]
            pub fn prefetch_key<Q: ::std::hash::Hash + ?Sized>(&self, key: &Q)
                where $k: ::std::borrow::Borrow<Q>
            {
                $crate::keyed::family::KeyedCore::key_touch(self, key)
            }

            /// [`check_key`](Self::check_key) at a time the caller read (a
            /// reading of this limiter's clock, as from [`now`](Self::now):
            /// one reading shared by several limiters).
            ///
            /// ```
            /// # use ratewall::{KeyedTokenBucket, ManualClock, Rate};
            /// let l = KeyedTokenBucket::<u64, _>::builder(Rate::per_second(1).burst(1))
            ///     .clock(ManualClock::new()).build().unwrap();
            /// assert!(l.check_key_at(&1, 0).is_allowed());
            /// assert!(!l.check_key_at(&1, 0).is_allowed());
            /// assert!(l.check_key_at(&1, 1_000_000_000).is_allowed());
            /// ```
            #[inline]
            pub fn check_key_at<Q: ::std::hash::Hash + ?Sized>(&self, key: &Q, now: u64) -> $crate::decision::Decision
                where $k: ::std::borrow::Borrow<Q>
            {
                $crate::keyed::family::KeyedCore::check_key_with(self, key, Some(now))
            }

            /// Checks a request of cost `n` for `key` and takes all of it if
            /// allowed. A cost above what the key can ever pass at once is an
            /// error, and nothing is taken.
            ///
            /// ```
            /// # use ratewall::{KeyedTokenBucket, Rate};
            /// let l = KeyedTokenBucket::<u64>::builder(Rate::per_hour(10).burst(10)).build().unwrap();
            /// assert!(l.check_key_n(&1, 8).unwrap().is_allowed());
            /// assert!(!l.check_key_n(&1, 8).unwrap().is_allowed());
            /// assert!(l.check_key_n(&1, 11).is_err());
            /// ```
            #[inline]
            pub fn check_key_n<Q: ::std::hash::Hash + ?Sized>(&self, key: &Q, n: u64)
                -> ::std::result::Result<$crate::decision::Decision, $crate::error::InsufficientCapacity> where $k: ::std::borrow::Borrow<Q>
            {
                $crate::keyed::family::KeyedCore::key_run(self, key, None, n, true)
            }

            /// [`check_key_n`](Self::check_key_n) at a time the caller read.
            ///
            /// ```
            /// # use ratewall::{KeyedTokenBucket, ManualClock, Rate};
            /// let l = KeyedTokenBucket::<u64, _>::builder(Rate::per_second(10))
            ///     .clock(ManualClock::new()).build().unwrap();
            /// assert_eq!(l.check_key_n_at(&1, 0, 4).unwrap().remaining(), 6);
            /// ```
            #[inline]
            pub fn check_key_n_at<Q: ::std::hash::Hash + ?Sized>(&self, key: &Q, now: u64, n: u64)
                -> ::std::result::Result<$crate::decision::Decision, $crate::error::InsufficientCapacity> where $k: ::std::borrow::Borrow<Q>
            {
                $crate::keyed::family::KeyedCore::key_run(self, key, Some(now), n, true)
            }

            /// The decision a unit request for `key` would get, without taking
            /// it (and without tracking an unknown key): what
            /// [`check_key`](Self::check_key) would return now, if nothing
            /// else happened in between. For a key the table does not hold,
            /// that includes the full-table policy: its
            /// [`tracking`]($crate::Decision::tracking) says whether the
            /// check would track the key, evict another one for it, admit it
            /// untracked, or reject it (with the same `retry_after`).
            ///
            /// ```
            /// # use ratewall::{KeyedTokenBucket, Rate};
            /// let l = KeyedTokenBucket::<u64>::builder(Rate::per_hour(1)).build().unwrap();
            /// assert!(l.peek_key(&1).is_allowed());
            /// assert_eq!(l.len(), 0);
            /// let _ = l.check_key(&1);
            /// assert!(!l.peek_key(&1).is_allowed());
            /// ```
            #[inline]
            pub fn peek_key<Q: ::std::hash::Hash + ?Sized>(&self, key: &Q) -> $crate::decision::Decision
                where $k: ::std::borrow::Borrow<Q>
            {
                $crate::keyed::family::unit(self.peek_key_n(key, 1))
            }

            /// The decision a request of cost `n` for `key` would get, without
            /// taking it: what [`check_key_n`](Self::check_key_n) would return
            /// now, full-table policy included (see [`peek_key`](Self::peek_key)).
            ///
            /// ```
            /// # use ratewall::{KeyedTokenBucket, Rate};
            /// let l = KeyedTokenBucket::<u64>::builder(Rate::per_second(10).burst(5)).build().unwrap();
            /// assert!(l.peek_key_n(&1, 5).unwrap().is_allowed());
            /// assert!(l.peek_key_n(&1, 6).is_err());
            /// ```
            #[inline]
            pub fn peek_key_n<Q: ::std::hash::Hash + ?Sized>(&self, key: &Q, n: u64)
                -> ::std::result::Result<$crate::decision::Decision, $crate::error::InsufficientCapacity> where $k: ::std::borrow::Borrow<Q>
            {
                $crate::keyed::family::KeyedCore::key_run(self, key, None, n, false)
            }

            /// This limiter with one key, as one limit of a multi-limit
            /// [`check_all`]($crate::check_all) or
            /// [`check_each`]($crate::check_each): all or nothing across
            /// limits (see [`KeyedRef`]($crate::KeyedRef)).
            ///
            /// ```
            /// # use ratewall::{check_all, KeyedTokenBucket, Rate};
            /// let per_route = KeyedTokenBucket::<&str>::builder(Rate::per_hour(100)).build().unwrap();
            /// let per_user = KeyedTokenBucket::<u32>::builder(Rate::per_second(1).burst(1)).build().unwrap();
            /// let check = || check_all::<_>(&[&per_user.with_key(&7), &per_route.with_key(&"/search")]);
            /// assert!(check().is_allowed());
            /// assert!(!check().is_allowed()); // per-user denies: nothing taken from per-route
            /// assert_eq!(per_route.peek_key("/search").remaining(), 98);
            /// ```
            #[inline]
            pub fn with_key<'a, Q: ::std::hash::Hash + ?Sized>(&'a self, key: &'a Q) -> $crate::keyed::family::KeyedRef<'a, Self, Q>
                where $k: ::std::borrow::Borrow<Q>
            {
                $crate::keyed::family::KeyedRef::new(self, key)
            }

            /// One reading of this limiter's clock, in nanoseconds (guarded
            /// against backward steps).
            ///
            /// ```
            /// # use ratewall::{KeyedTokenBucket, ManualClock, Rate};
            /// let l = KeyedTokenBucket::<u64, _>::builder(Rate::per_second(3)).clock(ManualClock::new()).build().unwrap();
            /// assert_eq!(l.now(), 0);
            /// ```
            #[inline]
            pub fn now(&self) -> u64 {
                $crate::keyed::family::KeyedCore::key_now(self)
            }

            /// The clock.
            ///
            /// ```
            /// # use ratewall::{Clock, KeyedTokenBucket, ManualClock, Rate};
            /// let l = KeyedTokenBucket::<u64, _>::builder(Rate::per_second(3)).clock(ManualClock::new()).build().unwrap();
            /// assert_eq!(l.clock().now(), 0);
            /// ```
            pub fn clock(&self) -> &<Self as $crate::keyed::family::KeyedCore>::Clock {
                $crate::keyed::family::KeyedCore::key_clock(self)
            }
        }
    };
}
pub(crate) use keyed_methods;

/// The table half of the family, as inherent methods of `$ty` (which
/// implements [`KeyedTable`]; `$k` is its key type parameter).
macro_rules! refund_methods {
    ([$($g:tt)*] $ty:ty, $k:ident) => {
        impl<$($g)*> $ty {
            /// Gives back `n` units an allowed check of `key` took. Nothing
            /// happens if the key is no longer tracked (it went idle and was
            /// reclaimed, or was admitted untracked), or if the table has hot
            /// keys ([`KeyedBuilder::hot_keys`]($crate::KeyedBuilder::hot_keys)):
            /// a refund below a lease would let the lease's units count twice,
            /// so there the units stay taken until their time passes (more
            /// denials, never more admissions). A sliding log gives back its
            /// newest admissions still in the window.
            ///
            /// ```
            /// # use ratewall::{KeyedTokenBucket, Rate};
            /// let l = KeyedTokenBucket::<u64>::builder(Rate::per_hour(1)).build().unwrap();
            /// let _ = l.check_key(&1);
            /// l.refund_key(&1, 1);
            /// assert!(l.check_key(&1).is_allowed());
            /// ```
            pub fn refund_key<Q: ::std::hash::Hash + ?Sized>(&self, key: &Q, n: u64)
                where $k: ::std::borrow::Borrow<Q>
            {
                self.refund_key_at(key, self.now(), n);
            }

            /// [`refund_key`](Self::refund_key) at the time the refunded check used.
            ///
            /// ```
            /// # use ratewall::{KeyedTokenBucket, Rate};
            /// let l = KeyedTokenBucket::<u64>::builder(Rate::per_hour(1)).build().unwrap();
            /// let t = l.now();
            /// let _ = l.check_key_at(&1, t);
            /// l.refund_key_at(&1, t, 1);
            /// assert!(l.check_key_at(&1, t).is_allowed());
            /// ```
            pub fn refund_key_at<Q: ::std::hash::Hash + ?Sized>(&self, key: &Q, now: u64, n: u64)
                where $k: ::std::borrow::Borrow<Q>
            {
                $crate::keyed::family::KeyedRefund::key_refund(self, key, now, n);
            }

            /// Forgets `key`'s history: its next check is a fresh key's.
            ///
            /// ```
            /// # use ratewall::{KeyedTokenBucket, Rate};
            /// let l = KeyedTokenBucket::<u64>::builder(Rate::per_hour(1)).build().unwrap();
            /// let _ = l.check_key(&1);
            /// l.reset_key(&1);
            /// assert!(l.check_key(&1).is_allowed());
            /// ```
            pub fn reset_key<Q: ::std::hash::Hash + ?Sized>(&self, key: &Q)
                where $k: ::std::borrow::Borrow<Q>
            {
                $crate::keyed::family::KeyedRefund::key_reset(self, key);
            }
        }
    };
}
pub(crate) use refund_methods;

/// The size and policy methods of a keyed table, as inherent methods of
/// `$ty` (which implements [`KeyedTable`]).
macro_rules! table_methods {
    ([$($g:tt)*] $ty:ty) => {
        impl<$($g)*> $ty {
            /// Keys tracked now, idle ones not yet reclaimed included. Never
            /// above [`max_keys`](Self::max_keys).
            ///
            /// ```
            /// # use ratewall::{KeyedTokenBucket, Rate};
            /// let l = KeyedTokenBucket::<u64>::builder(Rate::per_second(3)).build().unwrap();
            /// let _ = (l.check_key(&1), l.check_key(&2), l.check_key(&1));
            /// assert_eq!(l.len(), 2);
            /// ```
            pub fn len(&self) -> usize {
                $crate::keyed::family::KeyedTable::table_len(self)
            }

            /// Whether no key is tracked.
            ///
            /// ```
            /// # use ratewall::{KeyedTokenBucket, Rate};
            /// let l = KeyedTokenBucket::<u64>::builder(Rate::per_second(3)).build().unwrap();
            /// assert!(l.is_empty());
            /// ```
            pub fn is_empty(&self) -> bool {
                self.len() == 0
            }

            /// The most keys tracked at once.
            ///
            /// ```
            /// # use ratewall::{KeyedTokenBucket, Rate};
            /// let l = KeyedTokenBucket::<u64>::builder(Rate::per_second(3)).max_keys(500).build().unwrap();
            /// assert_eq!(l.max_keys(), 500);
            /// ```
            pub fn max_keys(&self) -> usize {
                $crate::keyed::family::KeyedTable::table_max_keys(self)
            }

            /// The policy when the table is full.
            ///
            /// ```
            /// # use ratewall::{KeyedTokenBucket, Rate, WhenFull};
            /// let l = KeyedTokenBucket::<u64>::builder(Rate::per_second(3)).build().unwrap();
            /// assert_eq!(l.when_full(), WhenFull::RejectNew);
            /// ```
            pub fn when_full(&self) -> $crate::keyed::builder::WhenFull {
                $crate::keyed::family::KeyedTable::table_when_full(self)
            }

            /// Removes every idle key (state equal to a fresh key's); returns
            /// how many. Never required (inserts reclaim idle keys as they
            /// go) but it makes [`len`](Self::len) exact.
            ///
            /// ```
            /// # use ratewall::{KeyedTokenBucket, ManualClock, Rate};
            /// # use std::time::Duration;
            /// let clock = ManualClock::new();
            /// let l = KeyedTokenBucket::<u64, _>::builder(Rate::per_second(1)).clock(clock.clone()).build().unwrap();
            /// let _ = (l.check_key(&1), l.check_key(&2));
            /// clock.advance(Duration::from_secs(1));
            /// assert_eq!(l.retain_active(), 2);
            /// assert!(l.is_empty());
            /// ```
            pub fn retain_active(&self) -> usize {
                $crate::keyed::family::KeyedTable::table_retain_active(self)
            }
        }
    };
}
pub(crate) use table_methods;
