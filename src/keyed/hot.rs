//! Hot keys: leases in cache-padded stripes for the few keys of a keyed
//! token bucket that many threads check at once (opt-in:
//! [`KeyedBuilder::hot_keys`](super::KeyedBuilder::hot_keys)).
//!
//! A few *hot slots*, each an owner word (the key's hash, 0 = free) and its
//! own stripes. A key whose table compare-exchange loses to another check of
//! the same key is promoted to a free slot (or to a slot cold for
//! [`HotKeys::cool_after`](super::HotKeys::cool_after)). A check of a hot key then runs the lease
//! protocol of [`StripedLimiter`](crate::StripedLimiter) (`src/lease/stripe.rs`)
//! with the key's table slot as the shared word: a take is the GCRA check of
//! cost `m` on the key's state, and its lease ends at the TAT it stored. Each
//! lease records its key, so units are only ever admitted for the key they
//! were taken from, whoever owns the slot now. See `docs/design.md`,
//! "Hot keys of a keyed table".

use super::hot_slots::{Hot, FREE};
use super::limiter::KeyedLimiter;
use super::KeyedAlgorithm;
use crate::clock::Clock;
use crate::decision::Decision;
use crate::lease::Claim;
use crate::sync::Ordering;
use std::borrow::Borrow;
use std::hash::Hash;

impl<K, A: KeyedAlgorithm, C: Clock> KeyedLimiter<K, A, C> {
    /// A unit check of the key with hash `h` at `now` in a table with hot
    /// keys, on stripe `stripe` of the key's slot if it is hot.
    pub(super) fn check_hot(&self, hot: &Hot, h: u64, stripe: usize, now: u64) -> Decision {
        let Some(i) = hot.slot_of(h) else {
            return self.check_maybe_contended(hot, h, now);
        };
        let l = &hot.leases;
        let stripes = &hot.slots[i].stripes;
        let at = stripe % stripes.len();
        let home = &stripes[at];
        if let Some(left) = l.use_lease::<true>(home, h, now) {
            return l.lease_decision(self.tat_of(h, now), left, now);
        }
        // The stripe is claimed before the take (`Leases::claim`): while
        // another check of it is taking, this one takes a plain unit.
        let (lock, k, hints) = match l.claim::<true>(home, h, now) {
            Claim::Locked(lock) => {
                let hints = l.next_size(home, now);
                (Some(lock), hints.0, Some(hints))
            }
            Claim::Filled => {
                if let Some(left) = l.use_lease::<true>(home, h, now) {
                    return l.lease_decision(self.tat_of(h, now), left, now);
                }
                (None, 1, None)
            }
            Claim::Busy => (None, 1, None),
        };
        let taken = self
            .table
            .update(h, now, &mut |tat| l.take_step(tat, now, k));
        if let Some(lock) = lock {
            let (held, end) = match taken {
                Some(Ok((_, m, end))) => (m - 1, end),
                _ => (0, 0),
            };
            if let (Some(hints), Some(Ok(_))) = (hints, &taken) {
                l.took(home, now, hints);
            }
            l.publish::<true>(home, lock, held, end, now, |k, e, u| {
                self.give_back(hot, k, e, u, now)
            });
        }
        match taken {
            // Not tracked (idle and reclaimed): the plain path of a new key.
            None => self.check_untracked(h, now),
            Some(Ok((d, _, _))) => d,
            Some(Err(denial)) => {
                // The key's entry is empty: before denying, use a unit of the
                // key that another stripe of its slot holds.
                for j in 1..stripes.len() {
                    let other = &stripes[(at + j) % stripes.len()];
                    if let Some(left) = l.use_lease::<true>(other, h, now) {
                        return l.lease_decision(self.tat_of(h, now), left, now);
                    }
                }
                denial
            }
        }
    }

    /// The decision [`check_hot`](Self::check_hot) on `stripe` would return
    /// for a hot key, without taking anything: the home stripe's lease, else
    /// the take's answer, else another stripe's lease. `None`: not hot, or not tracked (the plain peek).
    pub(super) fn peek_hot(&self, hot: &Hot, h: u64, stripe: usize, now: u64) -> Option<Decision> {
        let i = hot.slot_of(h)?;
        let l = &hot.leases;
        let stripes = &hot.slots[i].stripes;
        let home = stripe % stripes.len();
        let lease = |j: usize| {
            let u = l.held::<true>(&stripes[(home + j) % stripes.len()], h, now);
            (u > 0).then(|| l.lease_decision(self.tat_of(h, now), u - 1, now))
        };
        if let Some(d) = lease(0) {
            return Some(d);
        }
        // The take the check would make (a pure step; its size from the
        // stripe's hints, as `check_hot` reads them).
        let tat = self.table.state(h, now)?;
        let (k, _, _) = l.next_size(&stripes[home], now);
        match l.take_step(tat, now, k).0 {
            Ok((d, _, _)) => Some(d),
            Err(denial) => Some((1..stripes.len()).find_map(lease).unwrap_or(denial)),
        }
    }

    /// The plain unit check of a key that is not hot; promotes it if its
    /// compare-exchange lost to another check of the same key.
    fn check_maybe_contended(&self, hot: &Hot, h: u64, now: u64) -> Decision {
        let mut attempts = 0u32;
        let Some((a, state)) = self.table.apply(h, now, &mut |state| {
            attempts += 1;
            let a = self.params_for(h);
            (a, a.step(state, now, 1).1)
        }) else {
            return self.check_untracked(h, now);
        };
        if attempts > 1 {
            self.promote(hot, h, now);
        }
        a.step(state, now, 1).0
    }

    /// The key's state in the table (0, a fresh key's, if not tracked): a
    /// snapshot for a decision's counts.
    fn tat_of(&self, h: u64, now: u64) -> u64 {
        self.table.state(h, now).unwrap_or(0)
    }

    /// Gives `units` of key `k`'s lease ending at `end` back to its entry in
    /// the table, if that lease is still the entry's tail.
    fn give_back(&self, hot: &Hot, k: u64, end: u64, units: u64, now: u64) -> bool {
        self.table
            .update(k, now, &mut |tat| {
                hot.leases.give_back_step(tat, end, units)
            })
            .unwrap_or(false)
    }

    /// Makes `h` hot in a free slot, or in one cold for `cool_after` (whose
    /// key is demoted first). Returns whether `h` is hot.
    #[cold]
    #[inline(never)]
    fn promote(&self, hot: &Hot, h: u64, now: u64) -> bool {
        if h == FREE {
            return false; // the one hash that means "free" (2^-64 of keys)
        }
        if hot.slot_of(h).is_some() {
            return true;
        }
        // Relaxed: a hint that publishes nothing (see `full_until`).
        if now < hot.full_until.load(Ordering::Relaxed) {
            return false;
        }
        for i in 0..hot.owners.len() {
            // Relaxed: owners are routing hints (see `Hot::owners`).
            let old = hot.owners[i].load(Ordering::Relaxed);
            if old != FREE && !hot.is_cold(i, now) {
                continue;
            }
            if hot.owners[i]
                .compare_exchange(old, h, Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
            {
                continue;
            }
            if old != FREE {
                self.drain(hot, i, old, now);
            }
            // A racing promotion of the same key into an earlier slot wins.
            if hot.slot_of(h) != Some(i) {
                let _ =
                    hot.owners[i].compare_exchange(h, FREE, Ordering::Relaxed, Ordering::Relaxed);
            }
            return true;
        }
        // No slot free or cold: look again after a quarter of the cool-off.
        // Relaxed: a hint, as above.
        hot.full_until
            .store(now.saturating_add(hot.cool_after / 4), Ordering::Relaxed);
        false
    }

    /// Gives back to `key` every lease of it in slot `i` that is (or, once
    /// another is given back, becomes) its entry's tail. Leases that are
    /// not the tail stay until they expire (within `burst * T`): that key
    /// cannot use them while it is not hot there.
    fn drain(&self, hot: &Hot, i: usize, key: u64, now: u64) -> u64 {
        let mut total = 0;
        loop {
            let round: u64 = hot.slots[i]
                .stripes
                .iter()
                .map(|s| {
                    hot.leases.release::<true>(
                        s,
                        key,
                        now,
                        |k| self.table.state(k, now),
                        |k, e, u| self.give_back(hot, k, e, u, now),
                    )
                })
                .sum();
            if round == 0 {
                return total;
            }
            total += round;
        }
    }

    /// Makes `key` hot now (if the table has hot keys, the key is tracked
    /// and a slot is free or cold); returns whether it is hot. Checks of a
    /// hot key admit from striped leases.
    ///
    /// ```
    /// # use ratewall::{HotKeys, KeyedTokenBucket, Rate};
    /// let l = KeyedTokenBucket::<u64>::builder(Rate::per_second(100))
    ///     .hot_keys(HotKeys::new(1))
    ///     .build()?;
    /// assert!(!l.promote_key(&1), "not tracked yet");
    /// let _ = l.check_key(&1);
    /// assert!(l.promote_key(&1));
    /// assert!(l.is_hot_key(&1));
    /// # Ok::<(), ratewall::ConfigError>(())
    /// ```
    pub fn promote_key<Q>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + ?Sized,
    {
        let Some(hot) = self.hot.as_deref() else {
            return false;
        };
        let h = self.hash(key);
        let now = self.clamp(self.now());
        if self.table.state(h, now).is_none() {
            return false;
        }
        self.promote(hot, h, now)
    }

    /// Makes `key` plain again: frees its slot and gives its leases back to
    /// its entry in the table where they are the tail. Returns the units
    /// given back. Units in other leases of the key stay stranded until their
    /// time passes (at most `stripes * (max_lease - 1)`, for at most a burst's
    /// time).
    ///
    /// ```
    /// # use ratewall::{HotKeys, KeyedTokenBucket, ManualClock, Rate, LeaseOptions};
    /// # use std::time::Duration;
    /// let opts = LeaseOptions::new().stripes(1).max_lease(4).hot_gap(Duration::from_secs(1));
    /// let l = KeyedTokenBucket::<u64, _>::builder(Rate::per_second(10).burst(10))
    ///     .hot_keys(HotKeys::new(1).lease(opts))
    ///     .clock(ManualClock::new())
    ///     .build()?;
    /// let _ = l.check_key(&1);
    /// assert!(l.promote_key(&1));
    /// for _ in 0..4 {
    ///     assert!(l.check_key(&1).is_allowed()); // leases of 1, 2, then 4 (one stripe)
    /// }
    /// # #[cfg(feature = "testing")]
    /// assert_eq!(l.available_key_at(&1, 0), 5); // 2 in the table, 3 leased
    /// assert_eq!(l.demote_key(&1), 3);
    /// # #[cfg(feature = "testing")]
    /// assert_eq!(l.available_key_at(&1, 0), 5); // all 5 in the table
    /// assert!(!l.is_hot_key(&1));
    /// # Ok::<(), ratewall::ConfigError>(())
    /// ```
    pub fn demote_key<Q>(&self, key: &Q) -> u64
    where
        K: Borrow<Q>,
        Q: Hash + ?Sized,
    {
        let Some(hot) = self.hot.as_deref() else {
            return 0;
        };
        let h = self.hash(key);
        let Some(i) = hot.slot_of(h) else {
            return 0;
        };
        // Relaxed: a routing hint (see `Hot::owners`).
        if hot.owners[i]
            .compare_exchange(h, FREE, Ordering::Relaxed, Ordering::Relaxed)
            .is_err()
        {
            return 0;
        }
        // Relaxed: a hint (see `Hot::full_until`): a slot is free now.
        hot.full_until.store(0, Ordering::Relaxed);
        self.drain(hot, i, h, self.clamp(self.now()))
    }

    /// Whether `key` is hot now.
    ///
    /// ```
    /// # use ratewall::{KeyedTokenBucket, Rate};
    /// let l = KeyedTokenBucket::<u64>::builder(Rate::per_second(100)).build()?;
    /// assert!(!l.is_hot_key(&1)); // no hot keys configured
    /// # Ok::<(), ratewall::ConfigError>(())
    /// ```
    pub fn is_hot_key<Q>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + ?Sized,
    {
        self.hot
            .as_deref()
            .is_some_and(|hot| hot.slot_of(self.hash(key)).is_some())
    }

    /// [`check_key_at`](Self::check_key_at) on stripe `stripe % stripes` of
    /// the key's hot slot (if it is hot). A test hook (the `testing`
    /// feature; not part of the API, may change any time): tests pick the
    /// stripe that `check_key` takes from the calling thread. Without hot
    /// keys, or for a key that is not hot, the same as `check_key_at`.
    ///
    /// A hot key's decision counts in `remaining` the units of its entry in
    /// the table plus those left in the lease that served the check; units
    /// in the key's other stripes (at most `(stripes - 1) * (max_lease - 1)`)
    /// are not counted. [`available_key_at`](Self::available_key_at) counts
    /// them all.
    ///
    /// ```
    /// # use ratewall::{HotKeys, KeyedTokenBucket, LeaseOptions, ManualClock, Rate};
    /// let l = KeyedTokenBucket::<u64, _>::builder(Rate::per_second(10).burst(4))
    ///     .hot_keys(HotKeys::new(1).lease(LeaseOptions::new().stripes(2)))
    ///     .clock(ManualClock::new())
    ///     .build()?;
    /// assert_eq!(l.check_key_at_stripe(&1, 0, 0).remaining(), 3);
    /// assert!(l.promote_key(&1));
    /// assert_eq!(l.check_key_at_stripe(&1, 1, 0).remaining(), 2);
    /// # Ok::<(), ratewall::ConfigError>(())
    /// ```
    #[cfg(feature = "testing")]
    #[doc(hidden)]
    pub fn check_key_at_stripe<Q>(&self, key: &Q, stripe: usize, now: u64) -> Decision
    where
        K: Borrow<Q>,
        Q: Hash + ?Sized,
    {
        let h = self.hash(key);
        let now = self.clamp(now);
        match self.hot.as_deref() {
            Some(hot) => self.check_hot(hot, h, stripe, now),
            None => self.check_key_at(key, now),
        }
    }

    /// The decision [`check_key_at_stripe`](Self::check_key_at_stripe)
    /// with the same `stripe` would return at `now`, without taking anything
    /// (for a key that is not hot, or a table without hot keys, the plain
    /// unit peek at `now`). [`peek_key`](Self::peek_key) is this with the
    /// calling thread's stripe and the clock's time. A test hook (the
    /// `testing` feature).
    ///
    /// ```
    /// # use ratewall::{HotKeys, KeyedTokenBucket, LeaseOptions, ManualClock, Rate};
    /// let l = KeyedTokenBucket::<u64, _>::builder(Rate::per_second(10).burst(4))
    ///     .hot_keys(HotKeys::new(1).lease(LeaseOptions::new().stripes(2)))
    ///     .clock(ManualClock::new())
    ///     .build()?;
    /// let _ = l.check_key_at_stripe(&1, 0, 0);
    /// assert!(l.promote_key(&1));
    /// let peek = l.peek_key_at_stripe(&1, 1, 0);
    /// assert_eq!(l.check_key_at_stripe(&1, 1, 0), peek);
    /// # Ok::<(), ratewall::ConfigError>(())
    /// ```
    #[cfg(feature = "testing")]
    #[doc(hidden)]
    pub fn peek_key_at_stripe<Q>(&self, key: &Q, stripe: usize, now: u64) -> Decision
    where
        K: Borrow<Q>,
        Q: Hash + ?Sized,
    {
        let h = self.hash(key);
        let now = self.clamp(now);
        if let Some(d) = self
            .hot
            .as_deref()
            .and_then(|hot| self.peek_hot(hot, h, stripe, now))
        {
            return d;
        }
        match self.peek_key_n_at(key, now, 1) {
            Ok(d) => d,
            Err(_) => super::limiter::unreachable_capacity(),
        }
    }

    /// The units of `key` that could be admitted at `now` anywhere: those
    /// free in its entry in the table (a full burst if it is not tracked)
    /// plus every lease of it in every hot slot. Reads every stripe (for
    /// monitoring and tests, not the hot path); under concurrent checks it
    /// is a snapshot of moving parts. Without hot keys, the entry's free
    /// units. A test hook (the `testing` feature).
    ///
    /// ```
    /// # use ratewall::{HotKeys, KeyedTokenBucket, ManualClock, Rate};
    /// let l = KeyedTokenBucket::<u64, _>::builder(Rate::per_second(10).burst(5))
    ///     .hot_keys(HotKeys::new(2))
    ///     .clock(ManualClock::new())
    ///     .build()?;
    /// assert_eq!(l.available_key_at(&1, 0), 5);
    /// let _ = l.check_key_at(&1, 0);
    /// assert_eq!(l.available_key_at(&1, 0), 4);
    /// # Ok::<(), ratewall::ConfigError>(())
    /// ```
    #[cfg(feature = "testing")]
    #[doc(hidden)]
    pub fn available_key_at<Q>(&self, key: &Q, now: u64) -> u64
    where
        K: Borrow<Q>,
        Q: Hash + ?Sized,
    {
        let h = self.hash(key);
        let now = self.clamp(now);
        let Some(hot) = self.hot.as_deref() else {
            // No leases: the entry's own answer, through a peek.
            return match self.peek_key_n_at(key, now, 1) {
                Ok(d) if d.is_allowed() => d.remaining() + 1,
                _ => 0,
            };
        };
        let p = hot.leases.params;
        let held = self.tat_of(h, now).saturating_sub(now);
        let free = p.tolerance.saturating_sub(held) / p.emission;
        let leased: u64 = hot
            .slots
            .iter()
            .flat_map(|s| s.stripes.iter())
            .map(|s| hot.leases.held::<true>(s, h, now))
            .sum();
        free + leased
    }
}
