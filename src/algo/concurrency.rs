//! The concurrency limit's word: how many permits are out, the maximum, and
//! whether anyone waits, in one `u64`; the pure steps that admit, re-size
//! and mark waiters, and the arithmetic that explains a decision.
//!
//! ```text
//! //  63 62                          32 31                               0
//! // +--+------------------------------+----------------------------------+
//! // |W | max (31 bit, permits admitted| in flight (32 bit, permits out   |
//! // |  |      at most at once, >= 1)  |      now, units of cost)         |
//! // +--+------------------------------+----------------------------------+
//! ```
//!
//! - `W` (bit 63) is set while a waiter is queued (`concurrency/waiters.rs`),
//!   so a release's `fetch_sub` returns, in the word it already reads,
//!   whether it must wake anyone: no extra read-modify-write when nobody
//!   waits. Only the queue (under its lock) sets or clears it; every other
//!   step keeps it as it is.
//! - `max` is `1..=MAX_PERMITS`; it changes only through [`set_max`]'s step.
//! - `in flight` only grows through [`acquire`] (which admits only while
//!   `in flight + n <= cap <= max`), and only shrinks by a release of exactly
//!   what a permit holds, so it never exceeds the largest `max` ever set and
//!   never borrows from `max`: a release is one `fetch_sub` of `n` on the
//!   whole word.
//! - All-zero is never a valid word (`max >= 1`). A word with `in flight`
//!   0 carries no information beyond its `max`: a keyed slot holding one is
//!   reclaimable, a slot with permits out never is (docs/concurrency.md).

use crate::decision::Decision;
use crate::error::InsufficientCapacity;

/// The largest maximum (and so the largest permit) a concurrency limit
/// holds: 2^31 - 1 (the word's top bit marks waiters).
pub const MAX_PERMITS: u64 = (1 << 31) - 1;

const IN_FLIGHT_BITS: u32 = 32;
const IN_FLIGHT_MASK: u64 = (1 << IN_FLIGHT_BITS) - 1;
const MAX_SHIFT: u32 = IN_FLIGHT_BITS;
const MAX_MASK: u64 = MAX_PERMITS;
/// Bit 63: a waiter is queued.
const WAITERS: u64 = 1 << 63;
const _: () = assert!(MAX_PERMITS <= IN_FLIGHT_MASK);
const _: () = assert!(MAX_SHIFT + 31 == 63);

/// The word's two fields as a value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct InFlight {
    /// Permits out now.
    pub(crate) in_flight: u64,
    /// The maximum.
    pub(crate) max: u64,
}

impl InFlight {
    /// A fresh word: nothing out.
    pub(crate) const fn fresh(max: u64) -> u64 {
        pack(max, 0)
    }

    #[inline]
    pub(crate) const fn unpack(word: u64) -> Self {
        InFlight {
            in_flight: word & IN_FLIGHT_MASK,
            max: (word >> MAX_SHIFT) & MAX_MASK,
        }
    }
}

#[inline]
pub(crate) const fn pack(max: u64, in_flight: u64) -> u64 {
    (max << MAX_SHIFT) | in_flight
}

/// Whether a waiter is queued (bit 63): what a release reads in the word
/// its `fetch_sub` returns, to know whether to wake anyone.
#[inline]
pub(crate) const fn has_waiters(word: u64) -> bool {
    word & WAITERS != 0
}

/// The step that marks the word as having waiters (no write if it has).
#[inline]
pub(crate) fn mark_waiters(word: u64) -> ((), Option<u64>) {
    ((), Some(word | WAITERS))
}

/// The step that clears the mark, when the queue is empty (no write if clear).
#[inline]
pub(crate) fn clear_waiters(word: u64) -> ((), Option<u64>) {
    ((), Some(word & !WAITERS))
}

/// The word a release of `n` units subtracts: `n` in the low field, so the
/// subtraction never touches `max` (the holder's `n` is part of `in flight`).
#[inline]
pub(crate) const fn release_delta(n: u64) -> u64 {
    n
}

/// The part of `max` a request may fill: all of it (`share_pct == 100`), or
/// `share_pct` percent of it, rounded down but at least 1 (a class whose
/// share rounds to nothing still gets one unit when the limit is idle).
#[inline]
pub(crate) const fn cap(max: u64, share_pct: u64) -> u64 {
    if share_pct >= 100 {
        max
    } else {
        let c = max * share_pct / 100;
        if c == 0 {
            1
        } else {
            c
        }
    }
}

/// The pure admission step: `n` units for a request that may fill `cap` of
/// `max` (`share_pct` percent). Returns the decision's inputs, and the next
/// word when admitted; `Err` when `n` can never pass at this maximum.
///
/// `hold_ns` is the observed mean hold time, the denial's `retry_after` hint.
#[inline]
pub(crate) fn acquire(
    word: u64,
    n: u64,
    share_pct: u64,
    hold_ns: u64,
) -> (Result<Decision, InsufficientCapacity>, Option<u64>) {
    let s = InFlight::unpack(word);
    let cap = cap(s.max, share_pct);
    if let Err(e) = InsufficientCapacity::check(n, cap) {
        return (Err(e), None);
    }
    let after = s.in_flight + n;
    if after <= cap {
        let d = Decision::allow(s.max, cap - after, hold_ns);
        // `word + n`: `after <= max < 2^31`, so the sum stays in the low
        // field and keeps `max` and the waiters' mark as they are.
        (Ok(d), Some(word + n))
    } else {
        // Denied: nothing to write.
        let remaining = cap.saturating_sub(s.in_flight);
        (Ok(Decision::deny(s.max, remaining, hold_ns, hold_ns)), None)
    }
}

/// The pure re-size step: the new maximum, permits out and the waiters'
/// mark unchanged. Lowering
/// below `in flight` strands nothing: those permits are released as usual,
/// and nothing is admitted until `in flight` is below the new maximum.
#[inline]
pub(crate) fn set_max(word: u64, max: u64) -> ((), Option<u64>) {
    let s = InFlight::unpack(word);
    ((), Some(pack(max, s.in_flight) | (word & WAITERS)))
}

#[cfg(all(test, not(ratewall_loom)))]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// (max, in flight, n, share) -> (allowed, remaining, next in flight), by hand.
    #[test]
    fn acquire_table() {
        let cases = [
            (10, 0, 1, 100, true, 9, Some(1)),
            (10, 9, 1, 100, true, 0, Some(10)),
            (10, 10, 1, 100, false, 0, None),
            (10, 7, 4, 100, false, 3, None),
            (10, 7, 3, 100, true, 0, Some(10)),
            // 80% of 10 is 8: a class held to it stops at 8.
            (10, 7, 1, 80, true, 0, Some(8)),
            (10, 8, 1, 80, false, 0, None),
            // 5% of 10 rounds to 0: one unit still passes when idle.
            (10, 0, 1, 5, true, 0, Some(1)),
            (10, 1, 1, 5, false, 0, None),
            // Max lowered below what is out: remaining 0, nothing admitted.
            (4, 6, 1, 100, false, 0, None),
        ];
        for (max, out, n, share, allowed, remaining, next) in cases {
            let (d, w) = acquire(pack(max, out), n, share, 7);
            let d = d.unwrap();
            assert_eq!(d.is_allowed(), allowed, "{max} {out} {n} {share}");
            assert_eq!(d.remaining(), remaining, "{max} {out} {n} {share}");
            assert_eq!(d.limit(), max);
            assert_eq!(w.map(|w| InFlight::unpack(w).in_flight), next);
            assert_eq!(w.map(|w| InFlight::unpack(w).max), next.map(|_| max));
            assert_eq!(d.retry_after().as_nanos(), if allowed { 0 } else { 7 });
        }
    }

    #[test]
    fn a_cost_above_the_cap_is_an_error() {
        let (e, w) = acquire(pack(10, 0), 11, 100, 0);
        assert_eq!(
            e.unwrap_err(),
            InsufficientCapacity {
                requested: 11,
                capacity: 10
            }
        );
        assert_eq!(w, None);
        let (e, _) = acquire(pack(10, 0), 9, 80, 0);
        assert_eq!(e.unwrap_err().capacity, 8);
    }

    proptest! {
        #[test]
        fn pack_round_trips(max in 1..=MAX_PERMITS, out in 0..=MAX_PERMITS) {
            prop_assert_eq!(InFlight::unpack(pack(max, out)), InFlight { in_flight: out, max });
        }

        /// A release subtracts from `in flight` only, never from `max`.
        #[test]
        fn release_leaves_max_alone(max in 1..=MAX_PERMITS, out in 0..=MAX_PERMITS, n in 0..=MAX_PERMITS) {
            let n = n.min(out);
            let w = pack(max, out) - release_delta(n);
            prop_assert_eq!(InFlight::unpack(w), InFlight { in_flight: out - n, max });
        }

        /// Re-sizing keeps the permits out.
        #[test]
        fn set_max_keeps_in_flight(max in 1..=MAX_PERMITS, out in 0..=MAX_PERMITS, new in 1..=MAX_PERMITS) {
            let ((), w) = set_max(pack(max, out), new);
            prop_assert_eq!(InFlight::unpack(w.unwrap()), InFlight { in_flight: out, max: new });
        }

        /// The waiters' mark survives every other step and never changes
        /// the fields; a release never touches it.
        #[test]
        fn the_waiters_mark_is_kept_by_every_step(max in 1..=MAX_PERMITS, out in 0..=MAX_PERMITS, n in 1..=MAX_PERMITS, new in 1..=MAX_PERMITS) {
            let fields = InFlight { in_flight: out, max };
            let ((), marked) = mark_waiters(pack(max, out));
            let marked = marked.unwrap();
            prop_assert!(has_waiters(marked));
            prop_assert!(!has_waiters(pack(max, out)));
            prop_assert_eq!(InFlight::unpack(marked), fields);
            prop_assert_eq!(clear_waiters(marked).1, Some(pack(max, out)));
            if let (Ok(d), Some(next)) = acquire(marked, n, 100, 0) {
                prop_assert!(d.is_allowed());
                prop_assert!(has_waiters(next));
                prop_assert_eq!(InFlight::unpack(next), InFlight { in_flight: out + n, max });
                prop_assert!(has_waiters(next - release_delta(n)));
            }
            let resized = set_max(marked, new).1.unwrap();
            prop_assert!(has_waiters(resized));
            prop_assert_eq!(InFlight::unpack(resized), InFlight { in_flight: out, max: new });
        }
    }
}

// ---------------------------------------------------------------------------
// Keyed concurrency (issue 21 item 2): the same arithmetic, one count per key.
// ---------------------------------------------------------------------------
//
// A keyed table's slot holds one state word per key. For a concurrency
// limit that word is the key's **in-flight count only** (at most 32 bits,
// the low field of the word above); the maximum is the algorithm's
// parameter (the limiter's default, or the key's own through the table's
// per-key quotas), so a live change of the maximum rewrites no slot, and the
// state fits a slot of any width the table gives it. All-zero (nothing out)
// is a fresh key's state and the only idle one: no clock is involved. A
// release is the `refund` step: it subtracts exactly the units the permit
// holds, through the table's update path, by the key's hash.

use crate::algo::{KeyedWord, WordStep};
use crate::error::ConfigError;
use crate::word::{Params, Plain};

/// The keyed concurrency algorithm: per key, a count of units in flight
/// under a maximum of `max` (the table's parameter). Crate-private: users
/// meet it as `KeyedConcurrencyLimiter`, whose permits are the only way to
/// take and give back units.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Concurrent {
    max: u64,
}

impl Concurrent {
    /// Validates a maximum: 0 admits nothing, and above [`MAX_PERMITS`] the
    /// count would not fit its 32 bits.
    pub(crate) fn new(max: u64) -> Result<Self, ConfigError> {
        match max {
            0 => Err(ConfigError::ZeroLimit),
            m if m > MAX_PERMITS => Err(ConfigError::LimitTooLarge {
                limit: m,
                max: MAX_PERMITS,
            }),
            max => Ok(Concurrent { max }),
        }
    }
}

impl Params for Concurrent {
    fn encode(&self) -> [u64; 3] {
        [self.max, 0, 0]
    }
    fn decode(w: [u64; 3]) -> Self {
        Concurrent { max: w[0] }
    }
}

/// The count is at most [`MAX_PERMITS`] (31 bits) and has no time in it:
/// it fits the keyed slot's 40-bit state as it is, never swept, under any
/// maximum.
impl KeyedWord for Concurrent {
    type Packing = Plain;

    fn packing(&self) -> Result<Plain, ConfigError> {
        Ok(Plain)
    }

    fn fits(&self, _: &Plain) -> Result<(), ConfigError> {
        Ok(())
    }
}

impl WordStep for Concurrent {
    #[inline]
    fn capacity(&self) -> u64 {
        self.max
    }

    /// The admission: [`acquire`] on the unkeyed word made of this key's
    /// count and the maximum (the one admission arithmetic); the next state
    /// is the count alone. The decision's hints are the limiter's to set.
    #[inline]
    fn step(&self, state: u64, _now: u64, n: u64) -> (Decision, Option<u64>) {
        match acquire(pack(self.max, state), n, 100, 0) {
            (Ok(d), next) => (d, next.map(|w| InFlight::unpack(w).in_flight)),
            // The callers check the capacity first; a cost above it is
            // denied here, never admitted.
            (Err(_), _) => (Decision::deny(self.max, 0, 0, 0), None),
        }
    }

    /// A permit's release ([`release_count`]).
    #[inline]
    fn refund(&self, state: u64, _now: u64, n: u64) -> Option<u64> {
        Some(release_count(state, n))
    }

    /// The count does not depend on the maximum: a re-size keeps it.
    fn rescale(&self, _old: &Self, state: u64, _now: u64) -> u64 {
        state
    }

    /// Idle iff nothing is in flight: no clock.
    #[inline]
    fn is_idle(&self, state: u64, _now: u64) -> bool {
        state == 0
    }

    /// 0 when idle; a key with permits out goes idle when its holders are
    /// done, which no clock predicts: "never" (`u64::MAX`). The limiter
    /// never lets the table evict such a key, and replaces this value by
    /// the observed hold time wherever it would reach a decision.
    fn time_to_idle(&self, state: u64, _now: u64) -> u64 {
        if state == 0 {
            0
        } else {
            u64::MAX
        }
    }
}

/// A keyed count after a release of `n` units: exactly `n` off. A key
/// holding a permit is never reclaimed (its count is at least `n`), so this
/// never goes below 0; saturating only guards a broken caller.
#[inline]
pub(crate) fn release_count(count: u64, n: u64) -> u64 {
    debug_assert!(n <= count, "releasing {n} of {count} units in flight");
    count.saturating_sub(n)
}

crate::algo::word_algorithm!(Concurrent, u64, "concurrency", |max| {
    Concurrent::new(*max)
});

/// The next mean hold time: an exponentially weighted mean of weight 1/8
/// (`old` 0: no sample yet), never 0 once a sample came in.
#[inline]
pub(crate) fn mean_hold(old: u64, sample: u64) -> u64 {
    let mean = if old == 0 {
        sample
    } else {
        old - old / 8 + sample / 8
    };
    mean.max(1)
}

#[cfg(all(test, not(ratewall_loom)))]
mod keyed_tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_maximum_of_0_or_above_max_permits_is_a_typed_error() {
        assert_eq!(Concurrent::new(0), Err(ConfigError::ZeroLimit));
        assert_eq!(
            Concurrent::new(MAX_PERMITS + 1),
            Err(ConfigError::LimitTooLarge {
                limit: MAX_PERMITS + 1,
                max: MAX_PERMITS
            })
        );
        assert_eq!(
            Concurrent::new(MAX_PERMITS).unwrap().capacity(),
            MAX_PERMITS
        );
    }

    #[test]
    fn the_mean_hold_time_weighs_a_sample_by_an_eighth() {
        assert_eq!(mean_hold(0, 800), 800);
        assert_eq!(mean_hold(800, 1600), 900);
        assert_eq!(mean_hold(0, 0), 1, "never 0 once sampled");
    }

    proptest! {
        /// The keyed step is the unkeyed one on (max, count): same decision,
        /// and the next state is the next word's count.
        #[test]
        fn the_keyed_step_is_the_unkeyed_one(max in 1..=64u64, out in 0..=80u64, n in 1..=64u64) {
            let c = Concurrent::new(max).unwrap();
            prop_assume!(n <= max);
            let (d, next) = c.step(out, 0, n);
            let (e, wnext) = acquire(pack(max, out), n, 100, 0);
            let e = e.unwrap();
            prop_assert_eq!((d.is_allowed(), d.remaining(), d.limit()), (e.is_allowed(), e.remaining(), e.limit()));
            prop_assert_eq!(next, wnext.map(|w| InFlight::unpack(w).in_flight));
            prop_assert_eq!(d.is_allowed(), out + n <= max);
            if let Some(next) = next {
                prop_assert_eq!(next, out + n);
                // A release of the same units returns to where it started.
                prop_assert_eq!(c.refund(next, 0, n), Some(out));
            }
            prop_assert_eq!(c.is_idle(out, 0), out == 0);
            prop_assert_eq!(c.time_to_idle(out, 0) == 0, out == 0);
            prop_assert_eq!(c.rescale(&Concurrent::new(1).unwrap(), out, 0), out);
            prop_assert_eq!(Concurrent::decode(c.encode()), c);
        }
    }
}
