//! Sliding-window log: the exact rolling window, from a per-key ring of
//! admission runs behind a small lock.
//!
//! ```text
//! LogRing = Mutex { runs: VecDeque<Run>, base: u64, floor: u64 }   grows with use, from empty
//!   front                                                   back
//!   [ (t_0, upto_0), (t_1, upto_1), ..., (t_(k-1), upto_(k-1)) ]   t_0 < t_1 < ... ; k <= L
//!   upto_i = units admitted up to and including run i (wrapping u64);
//!   base   = units admitted before the front run, so run i holds
//!            upto_i - upto_(i-1) units (upto_(-1) = base)
//! ```
//!
//! A check at `now` of cost `n`, under the key's lock: `t = max(now, floor)`
//! where `floor` is the time of the latest admission (a clock that stepped
//! back is evaluated there, so the runs stay sorted; a refund does not
//! lower it, so a refund never reopens room for an older reading); runs
//! with `ts + W <= t` have left the window `(t - W, t]` (found by a short
//! scan from the front, then a binary search); the units in the window are
//! `upto_back - upto_(expired - 1)`, one subtraction; allowed iff
//! `in_window + n <= L`. On allow the expired runs are dropped and the `n`
//! units join the back run if it is at `t`, else one run `(t, upto + n)` is
//! appended. A denial writes nothing.
//!
//! # Memory
//!
//! One run of 16 bytes per distinct admission time still in the window, so
//! at most `L` runs (each holds at least one unit), whatever the costs: a
//! cost-`n` admission is one run. A new key allocates nothing until its
//! first admission; the ring then grows by doubling, never past `L` runs,
//! and halves when an admission that drops expired runs finds it a quarter
//! full; a reset gives all but a few runs back. A key admitted `L` times at `L` distinct instants
//! holds `16*L` bytes; one admitted once at cost `L`, 64.
//!
//! # Why a lock
//!
//! A lock-free ring needs a slot claim that no delayed writer can make stale:
//! either a 128-bit slot (timestamp plus sequence number) or a helping
//! protocol, and a cost-`n` admission updates a run and a count at once. The
//! per-key critical section here is a binary search and a few stores (tens
//! of nanoseconds); `std`'s futex mutex takes it with one uncontended
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

/// How many expired runs a check looks for one by one before it
/// switches to a binary search.
const SCAN: usize = 4;

/// The runs a ring keeps through a reset or a shrink (64 bytes): a key in
/// light use never returns to the allocator.
const KEEP_RUNS: usize = 4;

/// The largest limit: 2^20 units in any window.
pub(crate) const LOG_MAX_LIMIT: u64 = 1 << 20;

/// The exact sliding-window log: the parameter type of
/// [`SlidingWindowLog`](crate::SlidingWindowLog).
///
/// Never more than `L` admitted in any rolling window of length `W`. State:
/// a ring of admission runs per key, one `(time, count)` run of 16 bytes per
/// distinct admission time still in the window (at most `L`, whatever the
/// costs), plus 56 bytes, behind a per-key lock. A new key allocates
/// nothing until it is admitted.
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

    /// The decision for cost `n` (`1..=L`) at `now`; records it on allow if `consume`.
    fn step(&self, ring: &mut Ring, now: u64, n: u64, consume: bool) -> Decision {
        let (w, l) = (self.length, self.limit);
        // Never earlier than the latest admission: the runs stay sorted and
        // a clock that stepped back never reopens room.
        let t = now.max(ring.floor);
        // Runs that have left (t - W, t]. Usually none or one (each allow
        // drains them), so scan from the front; past a few (a peek after a
        // long idle), binary search. No overflow: times are at most 2^63
        // and W at most 2^62.
        let gone = |r: &Run| r.time + w <= t;
        // The units before the first run kept: the last expired run's count.
        let (mut expired, mut before) = (0, ring.base);
        for r in ring.runs.iter().take(SCAN) {
            if !gone(r) {
                break;
            }
            expired += 1;
            before = r.upto;
        }
        if expired == SCAN {
            expired = ring.runs.partition_point(gone);
            before = ring.upto_before(expired);
        }
        let newest = ring.runs.back().copied();
        let total = newest.map_or(ring.base, |r| r.upto);
        // Wrapping: the counts are exact modulo 2^64 and at most L apart.
        let in_window = total.wrapping_sub(before);
        if in_window + n <= l {
            if consume {
                // `t >= floor >= every run's time`: equal means this instant.
                let joins = newest.is_some_and(|r| r.time == t);
                ring.admit(expired, before, t, total.wrapping_add(n), joins, l);
            }
            return Decision::allow(l, l - in_window - n, t + w - now);
        }
        // The (in_window + n - L)-th oldest unit in the window must leave:
        // the first run whose count since `before` reaches it. The window
        // is not empty here (n <= L), so that run exists.
        let runs = &ring.runs;
        let must_leave = in_window + n - l;
        let (mut lo, mut hi) = (expired, runs.len() - 1);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if runs[mid].upto.wrapping_sub(before) < must_leave {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        let oldest = runs[lo].time;
        let newest = newest.map_or(t, |r| r.time);
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

/// One key's sliding log: its admission runs, oldest first, behind a lock.
/// Built by the algorithm for each key; self-contained, so a keyed table
/// can hold one per slot. Memory: 56 bytes plus 16 bytes on the heap per
/// distinct admission time still in the window (nothing before the first
/// admission).
pub struct LogRing {
    ring: Mutex<Ring>,
}

/// Admission runs, oldest first, the count before them, and the time of
/// the latest admission.
#[derive(Debug)]
struct Ring {
    runs: VecDeque<Run>,
    /// Units admitted before the front run (wrapping).
    base: u64,
    floor: u64,
}

/// The units admitted at one time: `upto` counts every unit up to and
/// including this run (wrapping), so a run's own count is the difference
/// from the run before it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Run {
    time: u64,
    upto: u64,
}

impl Ring {
    const fn new() -> Ring {
        Ring {
            runs: VecDeque::new(),
            base: 0,
            floor: 0,
        }
    }

    /// The units admitted before run `i` (`base` for the front).
    fn upto_before(&self, i: usize) -> u64 {
        match i {
            0 => self.base,
            _ => self.runs[i - 1].upto,
        }
    }

    /// The units admitted up to the newest run.
    fn total(&self) -> u64 {
        self.runs.back().map_or(self.base, |r| r.upto)
    }

    /// The units the ring holds, expired or not.
    fn units(&self) -> u64 {
        self.total().wrapping_sub(self.base)
    }

    /// Records an admission at `t` whose units bring the total to `upto`:
    /// drops the first `expired` runs (`before` units came before the
    /// first run kept), then adds to the back run if it `joins` (it is at
    /// `t`), else appends one run. The ring holds at most `limit` runs.
    fn admit(&mut self, expired: usize, before: u64, t: u64, upto: u64, joins: bool, limit: u64) {
        let runs = &mut self.runs;
        if expired > 0 {
            // Plain pops: cheaper than `drain` for the usual one run.
            for _ in 0..expired {
                runs.pop_front();
            }
            self.base = before;
            // A quarter full: halve, so a burst's memory goes back.
            if runs.len() * 4 <= runs.capacity() && runs.capacity() > KEEP_RUNS {
                runs.shrink_to((runs.capacity() / 2).max(KEEP_RUNS));
            }
        }
        if joins {
            // The back run is at `t`, so in the window: it was not popped.
            if let Some(back) = runs.back_mut() {
                back.upto = upto;
            }
        } else {
            if runs.len() == runs.capacity() {
                // Double, but never past L runs: a run in the window holds
                // a unit, so len < L here.
                let len = runs.len() as u64;
                let grow = len
                    .max(KEEP_RUNS as u64)
                    .min(limit.saturating_sub(len))
                    .max(1);
                runs.reserve_exact(grow as usize);
            }
            runs.push_back(Run { time: t, upto });
        }
        self.floor = t;
    }

    /// Forgets everything, keeping a few runs of capacity.
    fn clear(&mut self) {
        self.runs.clear();
        self.runs.shrink_to(KEEP_RUNS);
        self.base = 0;
        self.floor = 0;
    }
}

impl LogRing {
    pub(crate) fn new() -> Self {
        LogRing {
            ring: Mutex::new(Ring::new()),
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
        lock(&self.ring).runs.back().map(|r| r.time)
    }

    /// The heap bytes the ring holds (its runs' capacity), for memory tests.
    #[cfg(test)]
    pub(crate) fn heap_bytes(&self) -> usize {
        lock(&self.ring).runs.capacity() * std::mem::size_of::<Run>()
    }
}

impl fmt::Debug for LogRing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ring = lock(&self.ring);
        f.debug_struct("LogRing")
            .field("len", &ring.units())
            .field("runs", &ring.runs.len())
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
        LogRing::new()
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
        // Give back the newest units, while their runs are still in the
        // window. The floor stays: time does not move back with them.
        let mut left = n;
        while left > 0 {
            let Some(&back) = ring.runs.back() else { break };
            if back.time + p.length <= t {
                break;
            }
            let held = back
                .upto
                .wrapping_sub(ring.upto_before(ring.runs.len() - 1));
            if held <= left {
                ring.runs.pop_back();
                left -= held;
            } else {
                let last = ring.runs.len() - 1;
                ring.runs[last].upto = back.upto.wrapping_sub(left);
                left = 0;
            }
        }
    }

    fn reset(cell: &LogRing) {
        lock(&cell.ring).clear();
    }

    fn rescale(cell: &LogRing, _old: &Self, new: &Self, _now: u64) {
        let mut ring = lock(&cell.ring);
        // Times mean the same under any window length. A smaller limit
        // keeps the newest L units: the older ones leave the window first,
        // so every later decision is the same as with the full history.
        // A larger limit needs nothing: the ring grows with use.
        let mut drop = ring.units().saturating_sub(new.limit);
        while drop > 0 {
            let front = ring.runs[0];
            let held = front.upto.wrapping_sub(ring.base);
            if held <= drop {
                ring.runs.pop_front();
                ring.base = front.upto;
                drop -= held;
            } else {
                // The front run keeps its newest units.
                ring.base = ring.base.wrapping_add(drop);
                drop = 0;
            }
        }
    }

    fn is_idle(cell: &LogRing, params: &Self, now: u64) -> bool {
        lock(&cell.ring)
            .runs
            .back()
            .map_or(true, |r| r.time + params.length <= now)
    }
}

impl Algorithm for SlidingLog {
    const NAME: &'static str = "sliding window log";
}

#[cfg(all(test, not(ratewall_loom)))]
#[path = "log_tests.rs"]
mod tests;
