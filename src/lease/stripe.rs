//! The stripe machinery shared by [`StripedLimiter`](super::StripedLimiter)
//! (one shared word) and a keyed table's hot keys (`src/keyed/hot.rs`, the
//! key's slot in the table): the stripe and its lease word, the use, install
//! claim and release protocol, the lease size rule and the take step. The shared
//! state itself (a word, or a key's table slot) is the caller's: these
//! functions get it as a closure.
//!
//! A check whose stripe has no usable lease claims the stripe (locks its
//! lease word), takes from the shared state, and publishes the lease (or
//! gives the stripe back what it held); a check that finds the stripe
//! claimed takes a plain unit instead of waiting.
//!
//! A *keyed* stripe (`KEYED = true`) also records which key its lease was
//! taken from (`Stripe::key`), and a use or steal for key `h` admits only
//! from a lease of `h`. The key is written under the install lock, like
//! `end`, so the same generation argument covers it: a check that loaded
//! `lease`, then `key` and `end`, and compare-exchanges `lease` from the
//! value it loaded, used that very lease's key and end.

use crate::algo::{Gcra, WordStep};
use crate::decision::Decision;
use crate::error::ConfigError;
use crate::sync::{AtomicU64, Ordering};

use super::LeaseOptions;

/// Most stripes accepted.
pub(crate) const MAX_STRIPES: usize = 1024;
/// Largest default lease.
const DEFAULT_MAX_LEASE: u64 = 1 << 16;
/// `last_take` of a stripe that never took.
const NEVER: u64 = u64::MAX;

/// One stripe: a lease and its size. Its own cache line (the owner wraps it
/// in `CachePadded`).
///
/// ```text
/// lease:  63  62            32 31                 0
///        +---+----------------+--------------------+
///        | L | generation     | units left         |
///        +---+----------------+--------------------+
/// end:   the TAT the lease's take stored (64 bits)
/// key:   the key's hash the lease was taken from (keyed stripes only)
/// ```
///
/// `end` and `key` change only while `L` (an installer's lock) is set, and
/// every lock bumps the generation, so a check that read `lease` and then
/// `end` (and `key`) and compare-exchanges `lease` from the value it read
/// used the `end` (and `key`) of that very lease. The generation wraps after
/// 2^31 installs, far more than can happen between one check's load and its
/// CAS.
#[derive(Debug)]
pub(crate) struct Stripe {
    lease: AtomicU64,
    end: AtomicU64,
    key: AtomicU64,
    /// The size of this stripe's next lease (a hint: races only mis-size it).
    size: AtomicU64,
    /// When this stripe last took from the word (`NEVER` before its first take).
    last_take: AtomicU64,
}

impl Stripe {
    pub(crate) fn new() -> Self {
        Stripe {
            lease: AtomicU64::new(0),
            end: AtomicU64::new(0),
            key: AtomicU64::new(0),
            size: AtomicU64::new(1),
            last_take: AtomicU64::new(NEVER),
        }
    }

    /// When this stripe last took (`None` before its first take). A hint.
    pub(crate) fn last_take(&self) -> Option<u64> {
        // Relaxed: a hint that publishes nothing.
        let t = self.last_take.load(Ordering::Relaxed);
        (t != NEVER).then_some(t)
    }
}

const UNITS: u64 = (1 << 32) - 1;
const LOCK: u64 = 1 << 63;

/// The units of a lease word (none while an installer holds it).
#[inline]
fn units_of(w: u64) -> u64 {
    if w & LOCK != 0 {
        0
    } else {
        w & UNITS
    }
}

/// The lease word's next generation, unlocked, with no units.
#[inline]
fn next_generation(w: u64) -> u64 {
    (((w >> 32) + 1) & 0x7FFF_FFFF) << 32
}

/// Units of the lease `(units, end)` that may still be admitted at `now`:
/// those whose slot has not started to pass.
#[inline]
pub(crate) fn usable(units: u64, end: u64, now: u64, emission: u64) -> u64 {
    let ahead = end.saturating_sub(now);
    // No overflow: units * T <= burst * T = tau <= 2^62. The common case (no
    // slot has started to pass) needs no division.
    if units * emission <= ahead {
        units
    } else {
        ahead / emission
    }
}

/// What [`Leases::claim`] finds.
#[derive(Debug)]
pub(crate) enum Claim {
    /// The caller holds the stripe's claim (its lease word locked).
    Locked(Locked),
    /// Another check holds the claim (it is taking a lease right now).
    Busy,
    /// A usable lease (of the key) is there.
    Filled,
}

/// A held claim: the locked lease word and what the stripe held before
/// (its units, and the key and end they were taken for).
#[derive(Debug)]
#[must_use = "a claim must be ended with `publish`, or the stripe stays locked"]
pub(crate) struct Locked {
    locked: u64,
    /// The key the claim is for.
    key: u64,
    old: u64,
    old_key: u64,
    old_end: u64,
}

/// What a take hands back: the caller's decision, the units taken (the
/// first admitted), and the lease's end (the TAT the take stored).
pub(crate) type Taken = Result<(Decision, u64, u64), Decision>;

/// The lease arithmetic of one GCRA limit: its parameters, the largest
/// lease and the adaptation threshold.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Leases {
    pub(crate) params: Gcra,
    pub(crate) max_lease: u64,
    hot_gap: u64,
}

impl Leases {
    /// Validates `options` for `params`; returns the lease rules and the
    /// stripe count.
    pub(crate) fn new(params: Gcra, options: &LeaseOptions) -> Result<(Self, usize), ConfigError> {
        let stripes = match options.stripes {
            Some(s) => s,
            None => std::thread::available_parallelism()
                .map_or(1, |n| n.get())
                .saturating_mul(2)
                .min(64),
        };
        if stripes == 0 || stripes > MAX_STRIPES {
            return Err(ConfigError::Incompatible {
                reason: "a striped limiter needs between 1 and 1024 stripes",
            });
        }
        let max_lease = match options.max_lease {
            Some(k) => k,
            None => (params.burst / (4 * stripes as u64)).clamp(1, DEFAULT_MAX_LEASE),
        };
        if max_lease == 0 || max_lease > params.burst || max_lease > UNITS {
            return Err(ConfigError::Incompatible {
                reason: "the largest lease must be between 1 and the burst (and below 2^32)",
            });
        }
        let hot_gap = u64::try_from(options.hot_gap.as_nanos()).unwrap_or(u64::MAX);
        Ok((
            Leases {
                params,
                max_lease,
                hot_gap,
            },
            stripes,
        ))
    }

    /// Uses one unit of `stripe`'s lease (of `key`, if `KEYED`), if it has
    /// one usable at `now`; returns the units left in it.
    #[inline]
    pub(crate) fn use_lease<const KEYED: bool>(
        &self,
        stripe: &Stripe,
        key: u64,
        now: u64,
    ) -> Option<u64> {
        // Acquire: pairs with the Release store that published the lease, so
        // its `end` and `key` (stored before) and the take that made it are
        // visible.
        let mut seen = stripe.lease.load(Ordering::Acquire);
        loop {
            let units = units_of(seen);
            if units == 0 {
                return None;
            }
            // Relaxed: ordered after the Acquire above, so at least this
            // lease's key; a later key belongs to a later lock, which changed
            // the lease word, and the CAS below then fails.
            if KEYED && stripe.key.load(Ordering::Relaxed) != key {
                return None;
            }
            // Relaxed: as the key.
            let end = stripe.end.load(Ordering::Relaxed);
            let u = usable(units, end, now, self.params.emission);
            if u == 0 {
                return None;
            }
            // Success AcqRel: as the load above, and publishes the use to the
            // next user of the stripe. Failure Acquire: as the load above.
            match stripe.lease.compare_exchange(
                seen,
                (seen & !UNITS) | (u - 1),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return Some(u - 1),
                Err(actual) => seen = actual,
            }
        }
    }

    /// Units of `stripe`'s lease (of `key`, if `KEYED`) usable at `now`: a
    /// snapshot, for `available` counts.
    pub(crate) fn held<const KEYED: bool>(&self, stripe: &Stripe, key: u64, now: u64) -> u64 {
        // Acquire, then Relaxed: as in `use_lease`.
        let units = units_of(stripe.lease.load(Ordering::Acquire));
        if units == 0 || (KEYED && stripe.key.load(Ordering::Relaxed) != key) {
            return 0;
        }
        let end = stripe.end.load(Ordering::Relaxed);
        usable(units, end, now, self.params.emission)
    }

    /// An allowed decision for a unit served from a lease that has `left`
    /// units left, with the shared state at `tat`: `remaining` counts the
    /// shared state's free units and `left`.
    #[inline]
    pub(crate) fn lease_decision(&self, tat: u64, left: u64, now: u64) -> Decision {
        let p = self.params;
        let held = tat.saturating_sub(now);
        // No overflow: tau <= 2^62 and left * T <= burst * T = tau.
        let credit = p.tolerance.saturating_sub(held) + left * p.emission;
        Decision::allow_credit(p.burst, credit, p.emission, held)
    }

    /// The size of `stripe`'s next lease (the adaptation rule), with the
    /// hints it read (handed to [`took`](Self::took)).
    #[inline]
    pub(crate) fn next_size(&self, stripe: &Stripe, now: u64) -> (u64, u64, u64) {
        // Relaxed: the size and the last take are hints that publish nothing.
        let last = stripe.last_take.load(Ordering::Relaxed);
        let size = stripe.size.load(Ordering::Relaxed);
        // Hot: this stripe drew more than one unit per `hot_gap` since its
        // last take (of a lease of `size` units).
        let hot = last != NEVER && now.saturating_sub(last) < self.hot_gap.saturating_mul(size);
        let k = if hot {
            size.saturating_mul(2).min(self.max_lease)
        } else {
            (size / 2).max(1)
        };
        (k, last, size)
    }

    /// Records a successful take in `stripe`'s hints (a denial writes
    /// nothing, as the plain bucket's: the steal scans of other threads read
    /// this line).
    #[inline]
    pub(crate) fn took(&self, stripe: &Stripe, now: u64, (k, last, size): (u64, u64, u64)) {
        if last != now {
            // Relaxed: hints, as in `next_size`.
            stripe.last_take.store(now, Ordering::Relaxed);
        }
        if k != size {
            stripe.size.store(k, Ordering::Relaxed);
        }
    }

    /// The take step on the shared state `tat`: up to `k` units at `now`,
    /// the first admitted. `(Err(denial), None)` if no unit is free (the
    /// plain bucket's unit denial; nothing written).
    #[inline]
    pub(crate) fn take_step(&self, tat: u64, now: u64, k: u64) -> (Taken, Option<u64>) {
        let p = self.params;
        let held = tat.saturating_sub(now);
        let free = p.tolerance.saturating_sub(held) / p.emission;
        if free == 0 {
            // The plain bucket's denial of a unit request.
            return (Err(p.step(tat, now, 1).0), None);
        }
        let m = k.min(free);
        // m * T <= tau - held, so no overflow and the take is admitted.
        let used = held + m * p.emission;
        let end = now + used;
        // Admit one unit, hold m - 1: remaining is the plain check's,
        // (tau - held - T) / T, which counts the m - 1 held units.
        let credit = p.tolerance - used + (m - 1) * p.emission;
        let d = Decision::allow_credit(p.burst, credit, p.emission, used);
        (Ok((d, m, end)), Some(end))
    }

    /// Claims `stripe` for a take: a check whose home stripe had no usable
    /// lease (of `key`, if `KEYED`) locks the stripe *before* it takes units
    /// from the shared state, so that one take at a time fills a stripe and
    /// every fresh lease has a place to go. (Taking first and installing
    /// after let two checks of one stripe take at once; the second install
    /// found the first lease and could only try to give its own units back,
    /// which fails once it is no longer the shared state's tail: units
    /// neither admitted nor available until their slots passed, for ever
    /// on a frozen clock. The loom model
    /// `two_threads_taking_for_one_stripe_lose_no_unit` found it.)
    ///
    /// [`Claim::Busy`]: another check holds the claim; take a plain unit
    /// (no lease) rather than wait. [`Claim::Filled`]: a usable lease
    /// appeared meanwhile; use it. [`Claim::Locked`]: the caller holds the
    /// claim and must end it with [`publish`](Self::publish), whatever
    /// the take answers.
    pub(crate) fn claim<const KEYED: bool>(&self, stripe: &Stripe, key: u64, now: u64) -> Claim {
        // Acquire: as in `use_lease`.
        let mut seen = stripe.lease.load(Ordering::Acquire);
        loop {
            if seen & LOCK != 0 {
                return Claim::Busy;
            }
            let old = seen & UNITS;
            // Relaxed: as in `use_lease` (validated by the CAS below: `end`
            // and `key` change only under a claim, which changes the word).
            let old_end = stripe.end.load(Ordering::Relaxed);
            let old_key = if KEYED {
                stripe.key.load(Ordering::Relaxed)
            } else {
                key
            };
            if old_key == key && old > 0 && usable(old, old_end, now, self.params.emission) > 0 {
                return Claim::Filled;
            }
            let locked = next_generation(seen) | LOCK;
            // Success AcqRel: Acquire as the load; Release orders the lock
            // before the claim holder's stores. Failure Acquire: as the load.
            match stripe
                .lease
                .compare_exchange(seen, locked, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => {
                    return Claim::Locked(Locked {
                        locked,
                        key,
                        old,
                        old_key,
                        old_end,
                    })
                }
                Err(actual) => seen = actual,
            }
        }
    }

    /// Ends a claim: puts the fresh lease of `units` (of the claim's key)
    /// ending at `end` into `stripe`, or, with no units (the take admitted one unit
    /// only, or denied), gives the stripe back what it held (another key's
    /// lease keeps serving its key). A lease of another key that a fresh
    /// one replaces goes back to its key through `give_back(key, end,
    /// units)` if it is still its tail, or expires unused.
    pub(crate) fn publish<const KEYED: bool>(
        &self,
        stripe: &Stripe,
        lock: Locked,
        units: u64,
        end: u64,
        now: u64,
        give_back: impl Fn(u64, u64, u64) -> bool,
    ) {
        let (open, key) = (lock.locked & !LOCK, lock.key);
        if units == 0 {
            // Release: pairs with `use_lease`'s Acquire load; `end` and
            // `key` are as they were, and so is the lease.
            stripe.lease.store(open | lock.old, Ordering::Release);
            return;
        }
        // Relaxed: published by the Release store below. Only the claim
        // holder writes `end`, `key` or the lease word now (users and other
        // claims see no units and a lock).
        stripe.end.store(end, Ordering::Relaxed);
        if KEYED {
            stripe.key.store(key, Ordering::Relaxed);
        }
        // Release: pairs with `use_lease`'s Acquire load: the `end` and
        // `key` above and the take before them are visible.
        stripe.lease.store(open | units, Ordering::Release);
        if KEYED && lock.old_key != key {
            // Another key's lease, emptied by the claim: its usable units
            // are ours to give back (or to leave to expire). (A lease of
            // this key had none usable, or there was no claim.)
            let u = usable(lock.old, lock.old_end, now, self.params.emission);
            if u > 0 {
                give_back(lock.old_key, lock.old_end, u);
            }
        }
    }

    /// Gives back the usable units of `stripe`'s lease (of `key`, if
    /// `KEYED`) if it is the shared state's tail (`tail(key) == Some(end)`),
    /// through `give_back(key, end, units)`. Returns the units given back.
    pub(crate) fn release<const KEYED: bool>(
        &self,
        stripe: &Stripe,
        key: u64,
        now: u64,
        tail: impl Fn(u64) -> Option<u64>,
        give_back: impl Fn(u64, u64, u64) -> bool,
    ) -> u64 {
        // Acquire: as in `use_lease`.
        let seen = stripe.lease.load(Ordering::Acquire);
        let units = units_of(seen);
        if units == 0 {
            return 0;
        }
        // Relaxed: as in `use_lease`.
        if KEYED && stripe.key.load(Ordering::Relaxed) != key {
            return 0;
        }
        let end = stripe.end.load(Ordering::Relaxed);
        let u = usable(units, end, now, self.params.emission);
        if u == 0 || tail(key) != Some(end) {
            return 0; // nothing usable, or not the tail: it expires on its own
        }
        // Take the units out of the stripe first (a new generation, so a
        // check that read the old word fails its CAS), so no one uses them
        // after they are back in the shared state. Ordering as in `use_lease`.
        let emptied = next_generation(seen);
        if stripe
            .lease
            .compare_exchange(seen, emptied, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return 0; // in use right now: not idle
        }
        if give_back(key, end, u) {
            u
        } else {
            // A take moved the shared state meanwhile: put the units back if
            // the stripe is still as we left it (same generation, so the same
            // `end` and `key`); otherwise they expire unused.
            let _ = stripe.lease.compare_exchange(
                emptied,
                emptied | u,
                Ordering::AcqRel,
                Ordering::Acquire,
            );
            0
        }
    }

    /// The give-back step on the shared state `tat`: `units` of the lease
    /// ending at `end`, only if that lease is the tail (`tat == end`).
    #[inline]
    pub(crate) fn give_back_step(&self, tat: u64, end: u64, units: u64) -> (bool, Option<u64>) {
        if tat == end && units > 0 {
            (true, Some(end - units * self.params.emission))
        } else {
            (false, None)
        }
    }
}

#[cfg(all(test, not(ratewall_loom)))]
mod tests {
    use super::*;

    #[test]
    fn usable_counts_only_units_whose_slot_has_not_started_to_pass() {
        // T = 10: a lease of 3 ending at 100 owns [70, 100).
        assert_eq!(usable(3, 100, 70, 10), 3);
        assert_eq!(usable(3, 100, 71, 10), 2);
        assert_eq!(usable(3, 100, 90, 10), 1);
        assert_eq!(usable(3, 100, 91, 10), 0);
        assert_eq!(usable(3, 100, 500, 10), 0);
        assert_eq!(usable(1, 100, 0, 10), 1, "never more than the units left");
    }

    #[test]
    fn a_keyed_stripe_serves_only_the_key_its_lease_came_from() {
        let p = crate::algo::Gcra::from_rate(crate::Rate::per_second(10).burst(10)).unwrap();
        let (l, _) = Leases::new(p, &LeaseOptions::new().stripes(1).max_lease(4)).unwrap();
        let s = Stripe::new();
        let given = std::cell::Cell::new(Vec::new());
        let record = |k, e, u| {
            let mut v = given.take();
            v.push((k, e, u));
            given.set(v);
            true
        };
        let claimed = |key| match l.claim::<true>(&s, key, 0) {
            Claim::Locked(lock) => lock,
            other => panic!("{other:?}"),
        };
        l.publish::<true>(&s, claimed(7), 3, 400_000_000, 0, record);
        assert_eq!(l.use_lease::<true>(&s, 8, 0), None, "another key");
        assert_eq!(l.held::<true>(&s, 8, 0), 0);
        assert_eq!(l.held::<true>(&s, 7, 0), 3);
        assert_eq!(l.use_lease::<true>(&s, 7, 0), Some(2));
        assert!(matches!(l.claim::<true>(&s, 7, 0), Claim::Filled));
        // A claim for key 8 that takes nothing leaves key 7's lease.
        l.publish::<true>(&s, claimed(8), 0, 0, 0, record);
        assert_eq!(l.held::<true>(&s, 7, 0), 2);
        // While a claim is held, another is busy and no unit is usable.
        let held = claimed(8);
        assert!(matches!(l.claim::<true>(&s, 9, 0), Claim::Busy));
        assert_eq!(l.use_lease::<true>(&s, 7, 0), None);
        // Key 8's lease takes the stripe over and gives key 7's 2 back.
        l.publish::<true>(&s, held, 1, 500_000_000, 0, record);
        assert_eq!(given.take(), vec![(7, 400_000_000, 2)]);
        assert_eq!(l.use_lease::<true>(&s, 7, 0), None);
        assert_eq!(l.use_lease::<true>(&s, 8, 0), Some(0));
    }
}
