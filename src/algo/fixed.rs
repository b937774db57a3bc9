//! Fixed window: a window id and a count in one word.
//!
//! ```text
//!  63                                      24 23                    0
//! +------------------------------------------+-----------------------+
//! | window id (40 bit): now / W since epoch  | count (24 bit)        |
//! +------------------------------------------+-----------------------+
//! ```
//!
//! - `count` is the cost admitted in window `id`, `0 ..= L`, so `L < 2^24`.
//! - `id` is `floor(now / W)`. Time is clamped to `2^63 - 1` ns, and `W` is at
//!   least `2^23` ns (8.39 ms), so `id <= (2^63 - 1) / 2^23 < 2^40`: the id
//!   **never wraps** within the time horizon, and an idle key's old count can
//!   never look current (checked at compile time below and by validation).
//! - All-zero is window 0 with nothing admitted: the fresh state.
//!
//! A check at `now` of cost `n`: `nid = now / W`; if `nid > id` the count is
//! stale and reads as 0 in window `nid`; if `nid <= id` (same window, or a
//! clock that stepped back) it is evaluated in window `id`, so the state never
//! moves back to an older window. Allowed iff `count + n <= L`; on allow store
//! `(window, count + n)`, on deny store nothing.

use super::window::{KeyedWindow, WindowParams, LAST_NS};
use super::{word_algorithm, KeyedWord, WordStep};
use crate::decision::Decision;
use crate::error::ConfigError;
use crate::quota::Window;
use crate::word::{Packing, Params, STATE_BITS};

const COUNT_BITS: u32 = 24;
const ID_SHIFT: u32 = COUNT_BITS;
const COUNT_MASK: u64 = (1 << COUNT_BITS) - 1;
const ID_BITS: u32 = 64 - COUNT_BITS;
const MAX_ID: u64 = (1 << ID_BITS) - 1;
/// The largest limit: the count field's maximum.
pub(crate) const FIXED_MAX_LIMIT: u64 = COUNT_MASK;
/// The shortest window: the id of the latest time must fit `ID_BITS`.
pub(crate) const FIXED_MIN_LENGTH: u64 = 1 << (63 - ID_BITS);

// The id of the last representable time fits: ids never wrap.
const _: () = assert!(LAST_NS / FIXED_MIN_LENGTH <= MAX_ID);
const _: () = assert!(ID_BITS + COUNT_BITS == 64);

/// The fixed-window counter: the parameter type of [`FixedWindow`](crate::FixedWindow).
///
/// At most `L` per aligned window `[k*W, (k+1)*W)`, so up to `2L` across a
/// window boundary (a burst at the end of one window and another at the start
/// of the next). State: one `u64` (window id and count).
///
/// # Example
///
/// ```
/// use ratewall::{algorithm::FixedCounter, Limiter, ManualClock, Window};
///
/// let fixed: Limiter<FixedCounter, _> =
///     Limiter::with_clock(Window::per_second(3), ManualClock::new()).unwrap();
/// let admitted = (0..10).filter(|_| fixed.check().is_allowed()).count();
/// assert_eq!(admitted, 3);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FixedCounter(pub(crate) WindowParams);

impl FixedCounter {
    pub(crate) fn from_window(w: &Window) -> Result<Self, crate::error::ConfigError> {
        WindowParams::new(w, FIXED_MAX_LIMIT, FIXED_MIN_LENGTH).map(FixedCounter)
    }
}

#[inline(always)]
fn unpack(s: u64) -> (u64, u64) {
    (s >> ID_SHIFT, s & COUNT_MASK)
}

#[inline(always)]
fn pack(id: u64, count: u64) -> u64 {
    debug_assert!(id <= MAX_ID && count <= COUNT_MASK);
    id << ID_SHIFT | count
}

impl Params for FixedCounter {
    fn encode(&self) -> [u64; 3] {
        self.0.encode()
    }
    fn decode(w: [u64; 3]) -> Self {
        FixedCounter(WindowParams::decode(w))
    }
}

impl WordStep for FixedCounter {
    #[inline]
    fn capacity(&self) -> u64 {
        self.0.limit
    }

    #[inline(always)]
    fn step(&self, state: u64, now: u64, n: u64) -> (Decision, Option<u64>) {
        let p = &self.0;
        let now = now.min(LAST_NS);
        let (sid, count) = unpack(state);
        let nid = p.id(now);
        // Rolled over: the stored count is for an older window and reads as 0.
        // Otherwise (same window, or time behind the state's window) the
        // check is evaluated in the state's window: it never moves back.
        let (id, used) = if nid > sid { (nid, 0) } else { (sid, count) };
        // No overflow: id <= (2^63 - 1) / W, so (id + 1) * W < 2^63 + W.
        let left = (id + 1) * p.length - now;
        let total = used + n;
        if total <= p.limit {
            (
                Decision::allow(p.limit, p.limit - total, left),
                Some(pack(id, total)),
            )
        } else {
            // The window's end brings the count back to 0, and n <= L.
            (
                Decision::deny(p.limit, p.limit.saturating_sub(used), left, left),
                None,
            )
        }
    }

    #[inline]
    fn refund(&self, state: u64, now: u64, n: u64) -> Option<u64> {
        let (sid, count) = unpack(state);
        // Only into the window the units were taken from, while it is current.
        if self.0.id(now.min(LAST_NS)) != sid || count == 0 {
            return None;
        }
        Some(pack(sid, count.saturating_sub(n)))
    }

    fn rescale(&self, old: &Self, state: u64, now: u64) -> u64 {
        let (sid, count) = unpack(state);
        if count == 0 {
            return 0;
        }
        if self.0.length == old.0.length {
            // Same windows: keep the count, at most the new limit.
            return pack(sid, count.min(self.0.limit));
        }
        // New window length: the usage of the old window in force at `now`
        // (or of the state's window, if time is behind it) is carried into
        // the new window containing that instant. Nothing is forgotten
        // early; the carried count may deny a little longer than the new
        // windows alone would.
        let now = now.min(LAST_NS);
        if old.0.id(now) > sid {
            return 0; // the old window is over: nothing in use
        }
        let at = now.max(sid * old.0.length).min(LAST_NS);
        pack(self.0.id(at), count.min(self.0.limit))
    }

    #[inline]
    fn is_idle(&self, state: u64, now: u64) -> bool {
        let (sid, count) = unpack(state);
        count == 0 || self.0.id(now.min(LAST_NS)) > sid
    }

    #[inline]
    fn time_to_idle(&self, state: u64, now: u64) -> u64 {
        if self.is_idle(state, now) {
            return 0;
        }
        // Idle when the state's window is over. No overflow: as in `step`.
        let (sid, _) = unpack(state);
        (sid + 1) * self.0.length - now.min(LAST_NS)
    }

    #[inline]
    fn held(&self, state: u64, now: u64) -> u64 {
        if self.is_idle(state, now) {
            0
        } else {
            unpack(state).1
        }
    }
}

word_algorithm!(FixedCounter, Window, "fixed window", |w| {
    FixedCounter::from_window(w)
});

/// Bits of the window id in a keyed slot: the id modulo 2^16.
const KEYED_ID_BITS: u32 = 16;
// A keyed slot holds the id's low 16 bits and the whole count.
const _: () = assert!(KEYED_ID_BITS + COUNT_BITS == STATE_BITS);

/// The fixed window in a keyed slot: `id mod 2^16 | count` (40 bits), the
/// id read back as `KeyedWindow` says. A count of 0, or a window before
/// `now`'s, is packed as an idle state (`KeyedWindow::idle`). Nothing of
/// the limit is given up (`L < 2^24` as unkeyed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FixedPacking(KeyedWindow<KEYED_ID_BITS>);

impl Packing for FixedPacking {
    #[inline]
    fn pack(&self, state: u64, now: u64) -> u64 {
        let (sid, count) = unpack(state);
        let nid = self.0.id(now);
        if count == 0 || sid < nid {
            return KeyedWindow::<KEYED_ID_BITS>::idle(nid) << COUNT_BITS;
        }
        KeyedWindow::<KEYED_ID_BITS>::low(sid) << COUNT_BITS | count
    }

    #[inline]
    fn unpack(&self, packed: u64, now: u64) -> u64 {
        match KeyedWindow::<KEYED_ID_BITS>::full(packed >> COUNT_BITS, self.0.id(now)) {
            Some(id) if id <= MAX_ID => pack(id, packed & COUNT_MASK),
            _ => 0,
        }
    }

    fn sweep_period(&self) -> u64 {
        self.0.sweep_period()
    }
}

impl KeyedWord for FixedCounter {
    type Packing = FixedPacking;

    fn packing(&self) -> Result<FixedPacking, ConfigError> {
        Ok(FixedPacking(KeyedWindow::new(&self.0)))
    }

    fn fits(&self, p: &FixedPacking) -> Result<(), ConfigError> {
        p.0.fits(&self.0)
    }
}

#[cfg(all(test, not(ratewall_loom)))]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::time::Duration;

    const MS: u64 = 1_000_000;

    fn f(limit: u64, ms: u64) -> FixedCounter {
        FixedCounter::from_window(&Window::new(limit, Duration::from_millis(ms))).unwrap()
    }

    /// (state, now ms, n) -> (allowed, remaining, retry ms, reset ms, next), by hand:
    /// L = 3 per W = 100 ms.
    #[test]
    fn table_of_hand_computed_steps() {
        let p = f(3, 100);
        type Row = (u64, u64, u64, bool, u64, u64, u64, Option<u64>);
        let cases: &[Row] = &[
            // fresh key at 1050 ms: window 10, count 1, 50 ms left
            (0, 1050, 1, true, 2, 0, 50, Some(pack(10, 1))),
            // two more in the same window: count 3 = L is allowed
            (pack(10, 1), 1060, 2, true, 0, 0, 40, Some(pack(10, 3))),
            // a fourth: denied until the window ends at 1100
            (pack(10, 3), 1070, 1, false, 0, 30, 30, None),
            // cost 2 with 2 used: denied, 1 remaining
            (pack(10, 2), 1099, 2, false, 1, 1, 1, None),
            // next window: the old count is stale
            (pack(10, 3), 1100, 1, true, 2, 0, 100, Some(pack(11, 1))),
            // long idle key: same as fresh
            (pack(10, 3), 9000, 3, true, 0, 0, 100, Some(pack(90, 3))),
            // clock behind the state's window: evaluated in window 11, never 10
            (pack(11, 3), 1050, 1, false, 0, 150, 150, None),
            (pack(11, 1), 1050, 1, true, 1, 0, 150, Some(pack(11, 2))),
        ];
        for &(state, now, n, allowed, remaining, retry, reset, next) in cases {
            let (d, nx) = p.step(state, now * MS, n);
            let ctx = format!("state={:?} now={now} n={n}: {d:?}", unpack(state));
            assert_eq!(d.is_allowed(), allowed, "{ctx}");
            assert_eq!(d.remaining(), remaining, "{ctx}");
            assert_eq!(d.retry_after().as_nanos() as u64, retry * MS, "{ctx}");
            assert_eq!(d.reset_after().as_nanos() as u64, reset * MS, "{ctx}");
            assert_eq!(d.limit(), 3, "{ctx}");
            assert_eq!(nx, next, "{ctx}");
        }
    }

    #[test]
    fn refund_only_into_the_current_window() {
        let p = f(3, 100);
        assert_eq!(p.refund(pack(10, 3), 1050 * MS, 2), Some(pack(10, 1)));
        assert_eq!(p.refund(pack(10, 1), 1050 * MS, 5), Some(pack(10, 0)));
        assert_eq!(p.refund(pack(10, 3), 1100 * MS, 1), None, "window over");
        assert_eq!(p.refund(pack(10, 0), 1050 * MS, 1), None);
    }

    #[test]
    fn rescale_keeps_or_carries_the_count() {
        let old = f(10, 100);
        let smaller = f(4, 100);
        assert_eq!(smaller.rescale(&old, pack(10, 7), 1050 * MS), pack(10, 4));
        assert_eq!(old.rescale(&smaller, pack(10, 4), 1050 * MS), pack(10, 4));
        let longer = f(10, 1000);
        assert_eq!(longer.rescale(&old, pack(10, 7), 1050 * MS), pack(1, 7));
        assert_eq!(
            longer.rescale(&old, pack(9, 7), 1050 * MS),
            0,
            "old window over"
        );
        assert_eq!(longer.rescale(&old, 0, 1050 * MS), 0);
    }

    #[test]
    fn limits_and_windows_are_validated() {
        use crate::error::ConfigError;
        assert_eq!(
            FixedCounter::from_window(&Window::per_second(1 << 24)),
            Err(ConfigError::LimitTooLarge {
                limit: 1 << 24,
                max: (1 << 24) - 1
            })
        );
        assert!(FixedCounter::from_window(&Window::per_second((1 << 24) - 1)).is_ok());
        assert_eq!(
            FixedCounter::from_window(&Window::new(1, Duration::from_nanos((1 << 23) - 1))),
            Err(ConfigError::WindowTooShort {
                min: Duration::from_nanos(1 << 23)
            })
        );
        assert!(FixedCounter::from_window(&Window::new(1, Duration::from_nanos(1 << 23))).is_ok());
    }

    #[test]
    fn the_id_of_the_last_instant_fits_for_the_shortest_window() {
        let p = FixedCounter::from_window(&Window::new(1, Duration::from_nanos(FIXED_MIN_LENGTH)))
            .unwrap();
        let (d, next) = p.step(0, u64::MAX, 1);
        assert!(d.is_allowed());
        let (id, count) = unpack(next.unwrap());
        assert_eq!(
            (id, count),
            (MAX_ID, 1),
            "the largest id is exactly the field's max"
        );
        // An idle key with the largest count at id 0 never looks current later.
        let (d, _) = p.step(pack(0, 1), u64::MAX, 1);
        assert!(d.is_allowed());
    }

    proptest! {
        #[test]
        fn pack_round_trips(id in 0..=MAX_ID, count in 0..=COUNT_MASK) {
            prop_assert_eq!(unpack(pack(id, count)), (id, count));
        }

        /// An old window's count never reads as current, however long the
        /// key was idle: no wrap within the horizon.
        #[test]
        fn stale_counts_never_look_current(
            len in FIXED_MIN_LENGTH..=1 << 40,
            t0 in 0..=LAST_NS,
            gap in 1u64..=LAST_NS,
        ) {
            let p = FixedCounter::from_window(&Window::new(5, Duration::from_nanos(len))).unwrap();
            let (_, s) = p.step(0, t0, 5);
            let s = s.unwrap();
            let later = t0.saturating_add(gap).min(LAST_NS);
            let (d, _) = p.step(s, later, 1);
            prop_assert_eq!(d.is_allowed(), later / len != t0 / len);
        }
    }

    /// A new window length carries the count into the new window holding
    /// the start of the state's window when time is behind it.
    #[test]
    fn rescale_behind_the_states_window_carries_from_its_start() {
        let old = f(10, 100);
        let longer = f(10, 1000);
        // State in window 10 (1000..1100 ms); now is 500 ms (a step back).
        assert_eq!(longer.rescale(&old, pack(10, 7), 500 * MS), pack(1, 7));
        assert_eq!(longer.rescale(&old, pack(25, 3), 500 * MS), pack(2, 3));
    }

    #[test]
    fn time_to_idle_by_hand() {
        let p = f(3, 100);
        assert_eq!(p.time_to_idle(0, 50 * MS), 0);
        assert_eq!(p.time_to_idle(pack(10, 0), 1050 * MS), 0, "no count");
        assert_eq!(p.time_to_idle(pack(10, 2), 1050 * MS), 50 * MS);
        assert_eq!(p.time_to_idle(pack(10, 2), 1000 * MS), 100 * MS);
        assert_eq!(p.time_to_idle(pack(10, 2), 1100 * MS), 0, "window over");
        assert_eq!(p.time_to_idle(pack(10, 2), 900 * MS), 200 * MS, "behind");
    }

    proptest! {
        /// Zero exactly when idle; idle at `now + time_to_idle`, not 1 ns before.
        #[test]
        fn time_to_idle_is_exact(
            len in FIXED_MIN_LENGTH..=1 << 40, sid in 0u64..1 << 20, count in 0u64..5, now in 0u64..1 << 62,
        ) {
            let p = FixedCounter::from_window(&Window::new(5, Duration::from_nanos(len))).unwrap();
            let s = pack(sid.min(LAST_NS / len), count);
            let now = now % ((sid + 3) * len);
            let t = p.time_to_idle(s, now);
            prop_assert_eq!(t == 0, p.is_idle(s, now));
            if t > 0 {
                prop_assert!(p.is_idle(s, now + t));
                prop_assert!(!p.is_idle(s, now + t - 1));
            }
        }
    }
}
