//! Sliding-window counter: a window id and two counts in one word.
//!
//! ```text
//!  63                            28 27               14 13                0
//! +--------------------------------+-------------------+------------------+
//! | window id (36 bit): now / W    | previous (14 bit) | current (14 bit) |
//! +--------------------------------+-------------------+------------------+
//! ```
//!
//! - `current` is the cost admitted in window `id`, `previous` the cost
//!   admitted in window `id - 1`; both `0 ..= L`, so `L < 2^14`.
//! - `id` is `floor(now / W)`. Time is clamped to `2^63 - 1` ns, and `W` is at
//!   least `2^27` ns (134.2 ms), so `id < 2^36`: the id **never wraps** within
//!   the time horizon (checked at compile time below and by validation).
//! - All-zero is window 0 with nothing admitted: the fresh state.
//!
//! A check at `now` of cost `n`, with `e = now - id*W` the time into the
//! window: the estimate of the rolling window's usage is
//! `prev * (W - e) / W + cur`, and the request is allowed iff
//! `est + n <= L`. In integers, exactly: `ceil(prev * (W - e) / W) =
//! prev - floor(prev * e / W)`, and `x + c + n <= L` holds for the rational
//! `x` iff it holds for `ceil(x)`. No floating point, no drift.

use super::window::{KeyedWindow, WindowParams, LAST_NS};
use super::{word_algorithm, KeyedWord, WordStep};
use crate::decision::Decision;
use crate::error::ConfigError;
use crate::quota::Window;
use crate::word::{Packing, Params, STATE_BITS};

const COUNT_BITS: u32 = 14;
const CUR_MASK: u64 = (1 << COUNT_BITS) - 1;
const PREV_SHIFT: u32 = COUNT_BITS;
const ID_SHIFT: u32 = 2 * COUNT_BITS;
const ID_BITS: u32 = 64 - ID_SHIFT;
const MAX_ID: u64 = (1 << ID_BITS) - 1;
/// The largest limit: a count field's maximum.
pub(crate) const SLIDING_MAX_LIMIT: u64 = CUR_MASK;
/// The shortest window: the id of the latest time must fit `ID_BITS`.
pub(crate) const SLIDING_MIN_LENGTH: u64 = 1 << (63 - ID_BITS);

// The id of the last representable time fits: ids never wrap.
const _: () = assert!(LAST_NS / SLIDING_MIN_LENGTH <= MAX_ID);
const _: () = assert!(ID_BITS + 2 * COUNT_BITS == 64);

/// The sliding-window counter: the parameter type of
/// [`SlidingWindowCounter`](crate::SlidingWindowCounter).
///
/// Weighs the previous window's count by how much of it still overlaps the
/// rolling window. At most `L` per aligned window; over a rolling window the
/// estimate assumes the previous window's traffic was spread evenly, so a
/// burst at the very end of one window can let through up to about `2L - 1`
/// in a rolling window (see `docs/algorithms.md` for the measured worst case
/// and the accuracy on realistic traffic). State: one `u64`.
///
/// # Example
///
/// ```
/// use ratewall::{algorithm::SlidingCounter, Limiter, ManualClock, Window};
/// use std::time::Duration;
///
/// let clock = ManualClock::new();
/// let sliding: Limiter<SlidingCounter, _> =
///     Limiter::with_clock(Window::per_second(4), clock.clone()).unwrap();
/// assert!(sliding.check_n(4).unwrap().is_allowed());
/// clock.advance(Duration::from_millis(1500)); // half the previous window still counts
/// assert_eq!(sliding.peek().remaining(), 1); // 4 * 0.5 = 2 in use, 1 more for the peek
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlidingCounter(pub(crate) WindowParams);

impl SlidingCounter {
    pub(crate) fn from_window(w: &Window) -> Result<Self, crate::error::ConfigError> {
        WindowParams::new(w, SLIDING_MAX_LIMIT, SLIDING_MIN_LENGTH).map(SlidingCounter)
    }

    /// The state seen at `now`: `(id, window start, prev, cur, e)`.
    #[inline(always)]
    fn view(&self, state: u64, now: u64) -> (u64, u64, u64, u64, u64) {
        let p = &self.0;
        let (sid, prev, cur) = unpack(state);
        let nid = p.id(now);
        // Same window, or time behind the state's window: evaluated in the
        // state's window (never moves back). One window later: the current
        // count becomes the previous one. Later still: all stale.
        let (id, pv, c) = if nid <= sid {
            (sid, prev, cur)
        } else if nid == sid + 1 {
            (nid, cur, 0)
        } else {
            (nid, 0, 0)
        };
        let start = id * p.length; // <= now when id = nid; id * W <= LAST_NS
                                   // Behind the state's window: e = 0 weighs the previous window fully.
        (id, start, pv, c, now.saturating_sub(start))
    }

    /// `ceil(pv * (W - e) / W)`, the previous window's weighted count.
    #[inline(always)]
    fn weighted(&self, pv: u64, e: u64) -> u64 {
        let faded = match pv.checked_mul(e) {
            Some(x) if x <= LAST_NS => self.0.div.div(x),
            // W above 2^49 ns (6.5 days): a 128-bit product.
            _ => (u128::from(pv) * u128::from(e) / u128::from(self.0.length)) as u64,
        };
        pv - faded
    }
}

#[inline(always)]
fn unpack(s: u64) -> (u64, u64, u64) {
    (s >> ID_SHIFT, (s >> PREV_SHIFT) & CUR_MASK, s & CUR_MASK)
}

#[inline(always)]
fn pack(id: u64, prev: u64, cur: u64) -> u64 {
    debug_assert!(id <= MAX_ID && prev <= CUR_MASK && cur <= CUR_MASK);
    id << ID_SHIFT | prev << PREV_SHIFT | cur
}

/// `floor(a * b / c)` in 128 bits (`c > 0`); deny path only.
fn mul_div(a: u64, b: u64, c: u64) -> u64 {
    (u128::from(a) * u128::from(b) / u128::from(c)) as u64
}

impl Params for SlidingCounter {
    fn encode(&self) -> [u64; 3] {
        self.0.encode()
    }
    fn decode(w: [u64; 3]) -> Self {
        SlidingCounter(WindowParams::decode(w))
    }
}

impl WordStep for SlidingCounter {
    #[inline]
    fn capacity(&self) -> u64 {
        self.0.limit
    }

    #[inline(always)]
    fn step(&self, state: u64, now: u64, n: u64) -> (Decision, Option<u64>) {
        let (w, l) = (self.0.length, self.0.limit);
        let now = now.min(LAST_NS);
        let (id, start, pv, c, e) = self.view(state, now);
        let used = self.weighted(pv, e) + c;
        // No overflow: start <= LAST_NS and W <= 2^62, so start + 2W < 2^64.
        let end = start + w;
        if used + n <= l {
            // The new count fades out by the end of the next window.
            let reset = end + w - now;
            return (
                Decision::allow(l, l - used - n, reset),
                Some(pack(id, pv, c + n)),
            );
        }
        let retry = if c + n <= l {
            // Fits in this window once the previous one has faded enough:
            // the least e' with pv*(W - e') <= (L - c - n)*W (pv > 0 here).
            let e2 = w - mul_div(l - c - n, w, pv);
            start + e2 - now
        } else {
            // Next window: the current count becomes the previous one.
            let e3 = if c == 0 { 0 } else { w - mul_div(l - n, w, c) };
            end + e3 - now
        };
        let reset = if c > 0 { end + w - now } else { end - now };
        (
            Decision::deny(l, l.saturating_sub(used), retry, reset),
            None,
        )
    }

    #[inline]
    fn refund(&self, state: u64, now: u64, n: u64) -> Option<u64> {
        let (sid, prev, cur) = unpack(state);
        let nid = self.0.id(now.min(LAST_NS));
        if (nid == sid || nid == sid + 1) && cur > 0 {
            // Units of the state's window, current or just previous at `now`.
            Some(pack(sid, prev, cur.saturating_sub(n)))
        } else if nid + 1 == sid && prev > 0 {
            // Units taken in the window before the state's (time behind).
            Some(pack(sid, prev.saturating_sub(n), cur))
        } else {
            None
        }
    }

    fn rescale(&self, old: &Self, state: u64, now: u64) -> u64 {
        let (sid, prev, cur) = unpack(state);
        if self.0.length == old.0.length {
            // Same windows: keep both counts, at most the new limit.
            return pack(sid, prev.min(self.0.limit), cur.min(self.0.limit));
        }
        // New window length: the old estimate at `now` (rounded up) becomes
        // the current count of the new window containing `now`. Nothing in
        // use is forgotten; it fades with the new windows from there.
        let now = now.min(LAST_NS);
        let at = now.max(sid.saturating_mul(old.0.length)).min(LAST_NS);
        let (_, _, pv, c, e) = old.view(state, at);
        let used = (old.weighted(pv, e) + c).min(self.0.limit);
        if used == 0 {
            return 0;
        }
        pack(self.0.id(at), 0, used)
    }

    #[inline]
    fn is_idle(&self, state: u64, now: u64) -> bool {
        let (_, _, pv, c, _) = self.view(state, now.min(LAST_NS));
        pv == 0 && c == 0
    }

    #[inline]
    fn time_to_idle(&self, state: u64, now: u64) -> u64 {
        let now = now.min(LAST_NS);
        let (_, start, pv, c, _) = self.view(state, now);
        // A current count is gone two windows on (it is the previous count
        // for one window); a previous count alone, one window on.
        // No overflow: start <= LAST_NS and W <= 2^62.
        match (pv, c) {
            (_, 1..) => start + 2 * self.0.length - now,
            (1.., 0) => start + self.0.length - now,
            (0, 0) => 0,
        }
    }

    #[inline]
    fn held(&self, state: u64, now: u64) -> u64 {
        let (_, _, pv, c, _) = self.view(state, now.min(LAST_NS));
        pv + c
    }
}

word_algorithm!(SlidingCounter, Window, "sliding window counter", |w| {
    SlidingCounter::from_window(w)
});

/// Bits of the window id in a keyed slot: the id modulo 2^12, so that both
/// counts keep their 14 bits (the sweep period is 2^9 windows: 68.7 s at
/// the shortest window, 134 ms).
const KEYED_ID_BITS: u32 = 12;
const _: () = assert!(KEYED_ID_BITS + 2 * COUNT_BITS == STATE_BITS);

/// The sliding window counter in a keyed slot: `id mod 2^12 | previous |
/// current` (12 + 14 + 14 bits), the id read back as `KeyedWindow` says.
/// Both counts 0, or a window two or more before `now`'s, is packed as an
/// idle state (`KeyedWindow::idle`). Nothing of the limit is given up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlidingPacking(KeyedWindow<KEYED_ID_BITS>);

impl Packing for SlidingPacking {
    #[inline]
    fn pack(&self, state: u64, now: u64) -> u64 {
        let (sid, prev, cur) = unpack(state);
        let nid = self.0.id(now);
        if (prev == 0 && cur == 0) || sid + 1 < nid {
            return KeyedWindow::<KEYED_ID_BITS>::idle(nid) << ID_SHIFT;
        }
        KeyedWindow::<KEYED_ID_BITS>::low(sid) << ID_SHIFT | prev << PREV_SHIFT | cur
    }

    #[inline]
    fn unpack(&self, packed: u64, now: u64) -> u64 {
        match KeyedWindow::<KEYED_ID_BITS>::full(packed >> ID_SHIFT, self.0.id(now)) {
            Some(id) if id <= MAX_ID => {
                pack(id, (packed >> PREV_SHIFT) & CUR_MASK, packed & CUR_MASK)
            }
            _ => 0,
        }
    }

    fn sweep_period(&self) -> u64 {
        self.0.sweep_period()
    }
}

impl KeyedWord for SlidingCounter {
    type Packing = SlidingPacking;

    fn packing(&self) -> Result<SlidingPacking, ConfigError> {
        Ok(SlidingPacking(KeyedWindow::new(&self.0)))
    }

    fn fits(&self, p: &SlidingPacking) -> Result<(), ConfigError> {
        p.0.fits(&self.0)
    }
}

#[cfg(all(test, not(ratewall_loom)))]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::time::Duration;

    const MS: u64 = 1_000_000;

    fn s(limit: u64, ms: u64) -> SlidingCounter {
        SlidingCounter::from_window(&Window::new(limit, Duration::from_millis(ms))).unwrap()
    }

    /// (state, now ms, n) -> (allowed, remaining, retry ms, reset ms, next), by hand:
    /// L = 10 per W = 1000 ms.
    #[test]
    fn table_of_hand_computed_steps() {
        let p = s(10, 1000);
        type Row = (u64, u64, u64, bool, u64, u64, u64, Option<u64>);
        let cases: &[Row] = &[
            // fresh key at 5.25 s: window 5, cur 1; fades by 7 s
            (0, 5250, 1, true, 9, 0, 1750, Some(pack(5, 0, 1))),
            // window 6 at e = 250: prev 8 weighs ceil(8 * 0.75) = 6; 6 + 1 used -> 3 left
            (
                pack(5, 3, 8),
                6250,
                1,
                true,
                3,
                0,
                1750,
                Some(pack(6, 8, 1)),
            ),
            // same, cost 4 with cur 1: 6 + 1 + 4 = 11 > 10: denied. Need 8*(W-e') <= 5W:
            // e' = 1000 - floor(5000/8) = 375 ms into the window: wait 125 ms
            (pack(6, 8, 1), 6250, 4, false, 3, 125, 1750, None),
            // cur alone over: cur 8 + 3 > 10: next window, prev 8: need 8(W-e) <= 7W:
            // e = 1000 - 7000/8 = 125 ms: wait 750 + 125
            (pack(6, 0, 8), 6250, 3, false, 2, 875, 1750, None),
            // e = 500: prev 10 weighs exactly 5 (no rounding): 5 + 5 = 10 allowed
            (
                pack(6, 0, 10),
                7500,
                5,
                true,
                0,
                0,
                1500,
                Some(pack(7, 10, 5)),
            ),
            // two windows later: all stale
            (
                pack(5, 10, 10),
                7000,
                10,
                true,
                0,
                0,
                2000,
                Some(pack(7, 0, 10)),
            ),
            // clock behind the state's window: evaluated at the window's start
            (
                pack(7, 4, 0),
                6900,
                6,
                true,
                0,
                0,
                2100,
                Some(pack(7, 4, 6)),
            ),
            // 4 + 7 > 10; needs 4(W - e) <= 3W: e = 250 ms, from 6.9 s: 350 ms
            (pack(7, 4, 0), 6900, 7, false, 6, 350, 1100, None),
        ];
        for (i, &(state, now, n, allowed, remaining, retry, reset, next)) in
            cases.iter().enumerate()
        {
            let (d, nx) = p.step(state, now * MS, n);
            let ctx = format!("row {i} state={:?} now={now} n={n}: {d:?}", unpack(state));
            assert_eq!(d.is_allowed(), allowed, "{ctx}");
            assert_eq!(d.remaining(), remaining, "{ctx}");
            assert_eq!(d.retry_after().as_nanos() as u64, retry * MS, "{ctx}");
            assert_eq!(d.reset_after().as_nanos() as u64, reset * MS, "{ctx}");
            assert_eq!(d.limit(), 10, "{ctx}");
            assert_eq!(nx, next, "{ctx}");
        }
    }

    #[test]
    fn one_nanosecond_early_rounds_the_previous_window_up() {
        // e = 500 ms - 1 ns: prev 10 weighs ceil(5.00000001) = 6: 6 + 5 > 10,
        // and the wait is exactly the 1 ns to the point where it weighs 5.
        let (d, next) = s(10, 1000).step(pack(6, 0, 10), 7500 * MS - 1, 5);
        assert!(!d.is_allowed());
        assert_eq!((d.remaining(), d.retry_after().as_nanos()), (4, 1));
        assert_eq!(next, None);
    }

    #[test]
    fn refund_goes_to_the_window_it_came_from() {
        let p = s(10, 1000);
        assert_eq!(p.refund(pack(6, 4, 3), 6500 * MS, 2), Some(pack(6, 4, 1)));
        assert_eq!(p.refund(pack(6, 4, 3), 7500 * MS, 5), Some(pack(6, 4, 0)));
        assert_eq!(p.refund(pack(6, 4, 3), 5500 * MS, 1), Some(pack(6, 3, 3)));
        assert_eq!(p.refund(pack(6, 4, 3), 8000 * MS, 1), None);
    }

    #[test]
    fn rescale_keeps_counts_or_carries_the_estimate() {
        let old = s(10, 1000);
        assert_eq!(
            s(5, 1000).rescale(&old, pack(6, 8, 7), 6500 * MS),
            pack(6, 5, 5)
        );
        // 2 s windows: old estimate at 6.5 s is ceil(8 * 0.5) + 2 = 6, in new window 3.
        assert_eq!(
            s(10, 2000).rescale(&old, pack(6, 8, 2), 6500 * MS),
            pack(3, 0, 6)
        );
        assert_eq!(s(10, 2000).rescale(&old, pack(3, 8, 2), 6500 * MS), 0);
    }

    #[test]
    fn limits_and_windows_are_validated() {
        use crate::error::ConfigError;
        assert_eq!(
            SlidingCounter::from_window(&Window::per_second(1 << 14)),
            Err(ConfigError::LimitTooLarge {
                limit: 1 << 14,
                max: (1 << 14) - 1
            })
        );
        assert_eq!(
            SlidingCounter::from_window(&Window::new(1, Duration::from_millis(100))),
            Err(ConfigError::WindowTooShort {
                min: Duration::from_nanos(1 << 27)
            })
        );
        let p =
            SlidingCounter::from_window(&Window::new(1, Duration::from_nanos(1 << 27))).unwrap();
        let (_, next) = p.step(0, u64::MAX, 1);
        assert_eq!(
            unpack(next.unwrap()).0,
            MAX_ID,
            "the last id fills the field exactly"
        );
    }

    proptest! {
        #[test]
        fn pack_round_trips(id in 0..=MAX_ID, prev in 0..=CUR_MASK, cur in 0..=CUR_MASK) {
            prop_assert_eq!(unpack(pack(id, prev, cur)), (id, prev, cur));
        }

        /// The integer estimate equals the exact rational rule.
        #[test]
        fn decision_is_the_exact_rational_rule(
            limit in 1u64..=200, len in SLIDING_MIN_LENGTH..=1 << 62,
            prev in 0u64..=200, cur in 0u64..=200, n in 1u64..=200, frac in 0u64..1_000_000,
        ) {
            let (prev, cur, n) = (prev % (limit + 1), cur % (limit + 1), 1 + n % limit);
            let p = SlidingCounter::from_window(&Window::new(limit, Duration::from_nanos(len))).unwrap();
            let id = 3;
            let e = (u128::from(len) * u128::from(frac) / 1_000_000) as u64;
            let now = id * len + e;
            prop_assume!(now <= LAST_NS);
            let (d, _) = p.step(pack(id, prev, cur), now, n);
            let lhs = u128::from(prev) * u128::from(len - e) + u128::from(cur + n) * u128::from(len);
            prop_assert_eq!(d.is_allowed(), lhs <= u128::from(limit) * u128::from(len));
            if !d.is_allowed() {
                // retry_after is the earliest wait: allowed then, denied 1 ns before.
                let r = d.retry_after().as_nanos() as u64;
                prop_assume!(now + r <= LAST_NS); // time stands still past the horizon
                let (later, _) = p.step(pack(id, prev, cur), now + r, n);
                prop_assert!(later.is_allowed());
                if r > 1 {
                    let (before, _) = p.step(pack(id, prev, cur), now + r - 1, n);
                    prop_assert!(!before.is_allowed());
                }
            }
        }
    }

    /// Refunds go into the window the units were taken in, and return
    /// `None` whenever nothing would change.
    #[test]
    fn refund_boundaries() {
        let p = s(10, 1000);
        let at = |id: u64, ms: u64| id * 1000 * MS + ms * MS;
        // Same window, and one window later: into `cur`.
        assert_eq!(p.refund(pack(5, 2, 3), at(5, 10), 1), Some(pack(5, 2, 2)));
        assert_eq!(p.refund(pack(5, 2, 3), at(6, 10), 2), Some(pack(5, 2, 1)));
        // Two windows later: gone.
        assert_eq!(p.refund(pack(5, 2, 3), at(7, 10), 1), None);
        // Nothing in `cur`: nothing to give back, in either window.
        assert_eq!(p.refund(pack(5, 2, 0), at(5, 10), 1), None);
        assert_eq!(p.refund(pack(5, 2, 0), at(6, 10), 1), None);
        // Time one window behind the state's: into `prev`, if any.
        assert_eq!(p.refund(pack(5, 2, 3), at(4, 10), 1), Some(pack(5, 1, 3)));
        assert_eq!(p.refund(pack(5, 0, 3), at(4, 10), 1), None);
        // Two windows behind: nothing.
        assert_eq!(p.refund(pack(5, 2, 3), at(3, 10), 1), None);
    }

    /// The previous count's weight for products past the fast division's
    /// range (W above 2^49 ns) and at its edge.
    #[test]
    fn weighted_past_the_fast_division() {
        let ns = |len: u64| {
            SlidingCounter::from_window(&Window::new(100, Duration::from_nanos(len))).unwrap()
        };
        let w = 1u64 << 60;
        let p = ns(w);
        // 20 * 2^59 = 1.15e19 > 2^63: the 128-bit path.
        assert_eq!(p.weighted(20, w / 2), 10);
        assert_eq!(p.weighted(16, w / 2), 8); // 2^63 exactly
        assert_eq!(p.weighted(15, w / 2 + 1), 8);
        // 7 * (LAST_NS / 7) == LAST_NS (7 divides 2^63 - 1): the fast
        // path's last product.
        let q = ns(1 << 61);
        assert_eq!(7 * (LAST_NS / 7), LAST_NS);
        assert_eq!(q.weighted(7, LAST_NS / 7), 7 - 3);
        assert_eq!(q.weighted(7, LAST_NS / 7 + 1), 7 - 4);
    }

    #[test]
    fn time_to_idle_by_hand() {
        let p = s(10, 1000);
        let at = |id: u64, ms: u64| id * 1000 * MS + ms * MS;
        assert_eq!(p.time_to_idle(0, at(3, 0)), 0);
        assert_eq!(p.time_to_idle(pack(5, 0, 2), at(5, 250)), 1750 * MS);
        assert_eq!(p.time_to_idle(pack(5, 0, 2), at(6, 250)), 750 * MS);
        assert_eq!(p.time_to_idle(pack(5, 3, 0), at(5, 250)), 750 * MS);
        assert_eq!(p.time_to_idle(pack(5, 3, 0), at(6, 0)), 0);
        assert_eq!(p.time_to_idle(pack(5, 3, 2), at(7, 0)), 0);
        assert_eq!(
            p.time_to_idle(pack(5, 3, 2), at(4, 500)),
            2500 * MS,
            "behind"
        );
    }

    proptest! {
        /// Zero exactly when idle; idle at `now + time_to_idle`, not 1 ns before.
        #[test]
        fn time_to_idle_is_exact(
            len in SLIDING_MIN_LENGTH..=1 << 40, id in 0u64..1 << 20,
            prev in 0u64..3, cur in 0u64..3, now in 0u64..1 << 62,
        ) {
            let p = SlidingCounter::from_window(&Window::new(5, Duration::from_nanos(len))).unwrap();
            let st = pack(id, prev, cur);
            let now = now % ((id + 4) * len);
            let t = p.time_to_idle(st, now);
            prop_assert_eq!(t == 0, p.is_idle(st, now));
            if t > 0 {
                prop_assert!(p.is_idle(st, now + t));
                prop_assert!(!p.is_idle(st, now + t - 1));
            }
        }
    }
}
