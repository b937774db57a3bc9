//! Sliding-window log: the exact rolling window, from a per-key ring of
//! admission timestamps behind a small lock.
//!
//! ```text
//! LogRing = Mutex { times: VecDeque<u64>, floor: u64 }   capacity L, allocated once
//!   front                                   back
//!   [ t_0 <= t_1 <= ... <= t_(len-1) ]      len <= L, one entry per cost unit
//! ```
//!
//! A check at `now` of cost `n`, under the key's lock: `t = max(now, floor)`
//! where `floor` is the time of the latest admission (a clock that stepped
//! back is evaluated there, so the ring stays sorted; a refund does not
//! lower it, so a refund never reopens room for an older reading); entries with `ts + W <= t` have left the window
//! `(t - W, t]` (found by a short scan from the front, then a binary search); allowed iff `in_window + n <= L`;
//! on allow the expired entries are dropped and `n` copies of `t` appended.
//! The ring never holds more than `L` entries, so it never reallocates after
//! construction (a quota change to a larger limit grows it once).
//!
//! # Why a lock
//!
//! A lock-free ring needs a slot claim that no delayed writer can make stale:
//! either a 128-bit slot (timestamp plus sequence number) or a helping
//! protocol, and a cost-`n` admission claims `n` slots at once. The per-key
//! critical section here is a binary search and a few stores (tens of
//! nanoseconds); `std`'s futex mutex takes it with one uncontended
//! compare-exchange and releases it with one swap, which costs the same as
//! the window counters' CAS. Measured figures are in `docs/algorithms.md`.

use super::sealed::Core;
use super::Algorithm;
use crate::decision::Decision;
use crate::error::{ConfigError, InsufficientCapacity};
use crate::quota::Window;
use crate::sync::{lock, spin_hint, yield_now, Mutex, MutexGuard};
use crate::word::{ParamCell, Params};
use std::collections::VecDeque;
use std::fmt;

/// How many expired entries a check looks for one by one before it
/// switches to a binary search.
const SCAN: usize = 4;

/// The largest limit: 2^20 timestamps, 8 MiB per key.
pub(crate) const LOG_MAX_LIMIT: u64 = 1 << 20;

/// The exact sliding-window log: the parameter type of
/// [`SlidingWindowLog`](crate::SlidingWindowLog).
///
/// Never more than `L` admitted in any rolling window of length `W`. State:
/// a ring of `L` timestamps per key (`8*L` bytes plus 48 bytes), behind a
/// per-key lock.
///
/// # Example
///
/// ```
/// use ratewall::{algorithm::SlidingLog, Limiter, ManualClock, Window};
/// use std::time::Duration;
///
/// let clock = ManualClock::new();
/// let log: Limiter<SlidingLog, _> =
///     Limiter::with_clock(Window::per_second(2), clock.clone()).unwrap();
/// assert!(log.check().is_allowed()); // at 0 ms
/// clock.advance(Duration::from_millis(600));
/// assert!(log.check().is_allowed()); // at 600 ms
/// clock.advance(Duration::from_millis(600));
/// let d = log.check(); // at 1200 ms: the 600 ms one is still in (200 ms, 1200 ms]
/// assert!(d.is_allowed()); // 0 ms has left, so this is the second
/// assert!(!log.check().is_allowed());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlidingLog {
    pub(crate) length: u64,
    pub(crate) limit: u64,
}

impl SlidingLog {
    pub(crate) fn from_window(w: &Window) -> Result<Self, ConfigError> {
        let (limit, length) = w.validate(LOG_MAX_LIMIT, 1)?;
        Ok(SlidingLog { length, limit })
    }

    /// The decision for cost `n` (`1..=L`) at `now`; appends on allow if `consume`.
    fn step(&self, ring: &mut Ring, now: u64, n: u64, consume: bool) -> Decision {
        let (w, l) = (self.length, self.limit);
        // Never earlier than the latest admission: the ring stays sorted and
        // a clock that stepped back never reopens room.
        let t = now.max(ring.floor);
        let times = &mut ring.times;
        // Entries that have left (t - W, t]. Usually none or one (each
        // allow drains them), so scan from the front; past a few (a peek
        // after a long idle), binary search. No overflow: times are at most
        // 2^63 and W at most 2^62.
        let gone = |ts: &u64| ts + w <= t;
        let mut expired = times.iter().take(SCAN).take_while(|ts| gone(ts)).count();
        if expired == SCAN {
            expired = times.partition_point(gone);
        }
        let in_window = (times.len() - expired) as u64;
        if in_window + n <= l {
            if consume {
                // Plain pops and pushes: cheaper than `drain`/`extend` for
                // the usual zero or one entry, and never past capacity L.
                for _ in 0..expired {
                    times.pop_front();
                }
                for _ in 0..n {
                    times.push_back(t);
                }
                ring.floor = t;
            }
            return Decision::allow(l, l - in_window - n, t + w - now);
        }
        // The (in_window + n - L)-th oldest entry in the window must leave;
        // the window is not empty here (n <= L).
        let must_leave = (in_window + n - l) as usize;
        let oldest = times[expired + must_leave - 1];
        let newest = times[times.len() - 1];
        Decision::deny(l, l - in_window, oldest + w - now, newest + w - now)
    }
}

impl Params for SlidingLog {
    fn encode(&self) -> [u64; 3] {
        [self.length, self.limit, 0]
    }
    fn decode(w: [u64; 3]) -> Self {
        SlidingLog {
            length: w[0],
            limit: w[1],
        }
    }
}

/// One key's sliding log: up to `L` admission timestamps, oldest first,
/// behind a lock. Built by the algorithm for each key; self-contained, so a
/// keyed table can hold one per slot. Memory: 40 bytes plus `8*L` on the
/// heap, allocated once.
pub struct LogRing {
    ring: Mutex<Ring>,
}

/// The admission times, oldest first, and the time of the latest admission.
#[derive(Debug)]
struct Ring {
    times: VecDeque<u64>,
    floor: u64,
}

impl LogRing {
    pub(crate) fn with_capacity(limit: u64) -> Self {
        LogRing {
            ring: Mutex::new(Ring {
                times: VecDeque::with_capacity(limit as usize),
                floor: 0,
            }),
        }
    }
}

impl LogRing {
    /// Locks the ring and reads the parameters under the lock. A quota
    /// change rescales the ring under this lock between its `begin` and
    /// `publish`, so the ring seen always matches the parameters read. While
    /// a change is under way the lock is released and retaken (the change
    /// needs it to finish): waiting for the parameters while holding the
    /// lock would deadlock, as the loom model
    /// `log_quota_change_races_check` showed.
    fn lock_with(&self, params: &ParamCell) -> (MutexGuard<'_, Ring>, SlidingLog) {
        let mut spins = 0u32;
        loop {
            let ring = lock(&self.ring);
            if let Some(p) = params.try_read() {
                return (ring, p);
            }
            drop(ring);
            spins += 1;
            if spins < 64 {
                spin_hint();
            } else {
                yield_now();
            }
        }
    }
}

impl LogRing {
    /// The newest admission still recorded (for picking eviction victims).
    pub(crate) fn newest(&self) -> Option<u64> {
        lock(&self.ring).times.back().copied()
    }
}

impl fmt::Debug for LogRing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ring = lock(&self.ring);
        f.debug_struct("LogRing")
            .field("len", &ring.times.len())
            .field("floor", &ring.floor)
            .finish()
    }
}

impl Core for SlidingLog {
    type Config = Window;
    type Cell = LogRing;

    fn from_config(config: &Window) -> Result<Self, ConfigError> {
        SlidingLog::from_window(config)
    }

    fn new_cell(&self) -> LogRing {
        LogRing::with_capacity(self.limit)
    }

    fn capacity(&self) -> u64 {
        self.limit
    }

    #[inline]
    fn check(
        cell: &LogRing,
        params: &ParamCell,
        now: u64,
        n: u64,
        consume: bool,
    ) -> Result<Decision, InsufficientCapacity> {
        let (mut ring, p) = cell.lock_with(params);
        InsufficientCapacity::check(n, p.limit)?;
        Ok(p.step(&mut ring, now, n.max(1), consume && n > 0))
    }

    fn refund(cell: &LogRing, params: &ParamCell, now: u64, n: u64) {
        let (mut ring, p) = cell.lock_with(params);
        let t = now.max(ring.floor);
        // Give back the newest entries, while they are still in the window.
        // The floor stays: time does not move back with them.
        for _ in 0..n {
            match ring.times.back() {
                Some(&ts) if ts + p.length > t => {
                    ring.times.pop_back();
                }
                _ => break,
            }
        }
    }

    fn reset(cell: &LogRing) {
        let mut ring = lock(&cell.ring);
        ring.times.clear();
        ring.floor = 0;
    }

    fn rescale(cell: &LogRing, _old: &Self, new: &Self, _now: u64) {
        let mut ring = lock(&cell.ring);
        // Timestamps mean the same under any window length. A smaller limit
        // keeps the newest L entries: the older ones leave the window first,
        // so every later decision is the same as with the full history.
        let keep = new.limit as usize;
        let times = &mut ring.times;
        if times.len() > keep {
            let drop = times.len() - keep;
            times.drain(..drop);
        }
        // A larger limit grows the ring once, here, not on the hot path.
        times.reserve(keep - times.len());
    }

    fn is_idle(cell: &LogRing, params: &Self, now: u64) -> bool {
        lock(&cell.ring)
            .times
            .back()
            .map_or(true, |&b| b + params.length <= now)
    }
}

impl Algorithm for SlidingLog {
    const NAME: &'static str = "sliding window log";
}

#[cfg(all(test, not(ratewall_loom)))]
mod tests {
    use super::*;
    use std::time::Duration;

    const MS: u64 = 1_000_000;

    fn log(limit: u64, ms: u64) -> SlidingLog {
        SlidingLog::from_window(&Window::new(limit, Duration::from_millis(ms))).unwrap()
    }

    /// L = 3 per W = 1000 ms; steps by hand: (now ms, n) -> (allowed, remaining, retry, reset).
    #[test]
    fn table_of_hand_computed_steps() {
        let p = log(3, 1000);
        let mut ring = Ring {
            times: VecDeque::new(),
            floor: 0,
        };
        let rows: &[(u64, u64, bool, u64, u64, u64)] = &[
            (100, 1, true, 2, 0, 1000),
            (400, 1, true, 1, 0, 1000),
            (700, 2, false, 1, 400, 700), // needs the 100 ms entry gone at 1100
            (700, 1, true, 0, 0, 1000),
            (1099, 1, false, 0, 1, 601), // 100 ms entry leaves at 1100 exactly
            (1100, 1, true, 0, 0, 1000),
            (1200, 3, false, 0, 900, 900), // needs 400, 700, 1100 gone: at 2100
            (300, 1, false, 0, 1100, 1800), // clock behind: evaluated at 1100
        ];
        for &(now, n, allowed, remaining, retry, reset) in rows {
            let d = p.step(&mut ring, now * MS, n, true);
            let ctx = format!("now={now} n={n}: {d:?} ring={ring:?}");
            assert_eq!(d.is_allowed(), allowed, "{ctx}");
            assert_eq!(d.remaining(), remaining, "{ctx}");
            assert_eq!(d.retry_after().as_nanos() as u64, retry * MS, "{ctx}");
            assert_eq!(d.reset_after().as_nanos() as u64, reset * MS, "{ctx}");
            assert!(ring.times.len() <= 3);
        }
        let times: Vec<u64> = ring.times.iter().map(|t| t / MS).collect();
        assert_eq!(times, [400, 700, 1100]);
    }

    #[test]
    fn the_ring_never_reallocates() {
        let p = log(5, 10);
        let cell = p.new_cell();
        let params = ParamCell::new(p);
        let cap = lock(&cell.ring).times.capacity();
        for t in 0..1000u64 {
            let _ = SlidingLog::check(&cell, &params, t * MS / 3, 1 + t % 3, true);
        }
        assert_eq!(lock(&cell.ring).times.capacity(), cap);
    }

    #[test]
    #[cfg(target_pointer_width = "64")]
    fn a_ring_is_48_bytes_plus_8_per_unit_of_limit() {
        assert_eq!(std::mem::size_of::<LogRing>(), 48);
        let cell = log(1000, 10).new_cell();
        assert!(lock(&cell.ring).times.capacity() >= 1000);
    }

    #[test]
    fn limits_are_validated() {
        assert_eq!(
            SlidingLog::from_window(&Window::per_second(LOG_MAX_LIMIT + 1)),
            Err(ConfigError::LimitTooLarge {
                limit: LOG_MAX_LIMIT + 1,
                max: LOG_MAX_LIMIT
            })
        );
        assert!(SlidingLog::from_window(&Window::new(1, Duration::from_nanos(1))).is_ok());
    }
}
