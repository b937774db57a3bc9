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
