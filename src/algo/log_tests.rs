//! The sliding log's unit tests: hand-computed steps, memory, and the
//! run-length ring against the one-entry-per-unit log it replaced.

use super::*;
use proptest::prelude::*;
use std::time::Duration;

const MS: u64 = 1_000_000;

fn log(limit: u64, ms: u64) -> SlidingLog {
    SlidingLog::from_window(&Window::new(limit, Duration::from_millis(ms))).unwrap()
}

/// The runs as (time in ms, count).
fn runs_ms(ring: &Ring) -> Vec<(u64, u64)> {
    let mut before = ring.base;
    ring.runs
        .iter()
        .map(|r| {
            let count = r.upto.wrapping_sub(before);
            before = r.upto;
            (r.time / MS, count)
        })
        .collect()
}

/// L = 3 per W = 1000 ms; steps by hand: (now ms, n) -> (allowed, remaining, retry, reset).
#[test]
fn table_of_hand_computed_steps() {
    let p = log(3, 1000);
    let mut ring = Ring::new();
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
        assert!(ring.runs.len() <= 3);
    }
    assert_eq!(runs_ms(&ring), [(400, 1), (700, 1), (1100, 1)]);
}

/// L = 10 per W = 1000 ms with costs: one run per instant, a denial
/// points into the middle of a run, and a clock behind the floor joins
/// the floor's run. (now ms, n) -> (allowed, remaining, retry, reset).
#[test]
fn table_of_steps_with_costs() {
    let p = log(10, 1000);
    let mut ring = Ring::new();
    let rows: &[(u64, u64, bool, u64, u64, u64)] = &[
        (100, 4, true, 6, 0, 1000),
        (100, 2, true, 4, 0, 1000), // the same instant: joins the run
        (500, 3, true, 1, 0, 1000),
        (600, 3, false, 1, 500, 900), // 2 units must leave: both at 100
        (600, 8, false, 1, 900, 900), // 7 must leave: the 100 run and 1 at 500
        (1100, 7, true, 0, 0, 1000),  // the 100 run has left: 3 in the window
        (1000, 1, false, 0, 500, 1100), // clock behind: evaluated at 1100
        (1500, 3, true, 0, 0, 1000),  // the 500 run leaves at 1500 exactly
    ];
    let mut seen = Vec::new();
    for &(now, n, allowed, remaining, retry, reset) in rows {
        let d = p.step(&mut ring, now * MS, n, true);
        let ctx = format!("now={now} n={n}: {d:?} ring={ring:?}");
        assert_eq!(d.is_allowed(), allowed, "{ctx}");
        assert_eq!(d.remaining(), remaining, "{ctx}");
        assert_eq!(d.retry_after().as_nanos() as u64, retry * MS, "{ctx}");
        assert_eq!(d.reset_after().as_nanos() as u64, reset * MS, "{ctx}");
        seen.push(runs_ms(&ring));
    }
    assert_eq!(seen[1], [(100, 6)]);
    assert_eq!(seen[5], [(500, 3), (1100, 7)]);
    assert_eq!(seen[7], [(1100, 7), (1500, 3)]);
    // A refund at 1500 gives back 2 of the newest run; a check behind the
    // floor (at 1200) is evaluated at 1500 and joins that run again.
    let params = ParamCell::new(p);
    let cell = LogRing {
        ring: Mutex::new(ring),
    };
    SlidingLog::refund(&cell, &params, 1500 * MS, 2);
    assert_eq!(runs_ms(&lock(&cell.ring)), [(1100, 7), (1500, 1)]);
    let d = SlidingLog::check(&cell, &params, 1200 * MS, 2, true).unwrap();
    assert!(d.is_allowed() && d.remaining() == 0, "{d:?}");
    assert_eq!(d.reset_after(), Duration::from_millis(1300));
    assert_eq!(runs_ms(&lock(&cell.ring)), [(1100, 7), (1500, 3)]);
}

/// Finding 3 of issue 34: a fresh key's ring allocated `8 * L` bytes up
/// front (800 KB at L = 100,000). Now a new ring allocates nothing, and
/// one admission of cost L is one run.
#[test]
fn a_fresh_ring_allocates_nothing_and_a_big_cost_is_one_run() {
    let p = log(100_000, 3_600_000);
    let cell = p.new_cell();
    assert_eq!(cell.heap_bytes(), 0);
    let params = ParamCell::new(p);
    let d = SlidingLog::check(&cell, &params, 5 * MS, 100_000, true).unwrap();
    assert!(d.is_allowed() && d.remaining() == 0, "{d:?}");
    assert!(cell.heap_bytes() <= 64, "{} bytes", cell.heap_bytes());
    assert_eq!(lock(&cell.ring).runs.len(), 1);
    // Exact still: the next unit waits for the whole run to leave.
    let d = SlidingLog::check(&cell, &params, 6 * MS, 1, true).unwrap();
    assert!(!d.is_allowed());
    assert_eq!(d.retry_after(), Duration::from_millis(3_600_000 - 1));
    // A denial and a peek of a fresh key allocate nothing either.
    let other = p.new_cell();
    let _ = SlidingLog::check(&other, &params, 5 * MS, 100_000, false);
    assert_eq!(other.heap_bytes(), 0);
}

/// The ring never holds more than one run per distinct admission time
/// still in the window, never more than L runs, and its capacity never
/// goes past L runs (or the few it keeps); it shrinks as use falls.
#[test]
fn the_ring_grows_with_use_and_gives_memory_back() {
    let p = log(64, 100);
    let params = ParamCell::new(p);
    let cell = p.new_cell();
    // A burst at 64 distinct instants in one window: 64 runs.
    for i in 0..64u64 {
        let d = SlidingLog::check(&cell, &params, i * MS, 1, true).unwrap();
        assert!(d.is_allowed());
        let ring = lock(&cell.ring);
        assert!(ring.runs.len() <= 64);
        assert!(ring.runs.capacity() <= 64, "{}", ring.runs.capacity());
    }
    assert_eq!(lock(&cell.ring).runs.len(), 64);
    // Then one admission per window: the ring shrinks back.
    for i in 0..20u64 {
        let _ = SlidingLog::check(&cell, &params, (1000 + 200 * i) * MS, 1, true).unwrap();
    }
    assert_eq!(lock(&cell.ring).runs.len(), 1);
    assert!(cell.heap_bytes() <= KEEP_RUNS * 16, "{}", cell.heap_bytes());
    // A reset keeps a few runs, no more.
    SlidingLog::reset(&cell);
    assert!(cell.heap_bytes() <= KEEP_RUNS * 16);
}

#[test]
#[cfg(target_pointer_width = "64")]
fn a_ring_is_56_bytes_plus_16_per_run() {
    assert_eq!(std::mem::size_of::<LogRing>(), 56);
    assert_eq!(std::mem::size_of::<Run>(), 16);
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

/// The log as it was before runs: one timestamp per unit of cost. Every
/// decision of the run-length ring must be this one's.
#[derive(Default)]
struct PerUnit {
    times: VecDeque<u64>,
    floor: u64,
}

impl PerUnit {
    fn step(&mut self, p: &SlidingLog, now: u64, n: u64, consume: bool) -> Decision {
        let (w, l) = (p.length, p.limit);
        let t = now.max(self.floor);
        let expired = self.times.iter().take_while(|&&ts| ts + w <= t).count();
        let in_window = (self.times.len() - expired) as u64;
        if in_window + n <= l {
            if consume {
                self.times.drain(..expired);
                self.times.extend(std::iter::repeat(t).take(n as usize));
                self.floor = t;
            }
            return Decision::allow(l, l - in_window - n, t + w - now);
        }
        let oldest = self.times[expired + (in_window + n - l) as usize - 1];
        let newest = self.times[self.times.len() - 1];
        Decision::deny(l, l - in_window, oldest + w - now, newest + w - now)
    }

    fn refund(&mut self, p: &SlidingLog, now: u64, n: u64) {
        let t = now.max(self.floor);
        for _ in 0..n {
            match self.times.back() {
                Some(&ts) if ts + p.length > t => {
                    self.times.pop_back();
                }
                _ => break,
            }
        }
    }

    fn rescale(&mut self, new: &SlidingLog) {
        let keep = new.limit as usize;
        if self.times.len() > keep {
            let drop = self.times.len() - keep;
            self.times.drain(..drop);
        }
    }

    fn newest(&self) -> Option<u64> {
        self.times.back().copied()
    }
}

#[derive(Clone, Debug)]
enum Op {
    Check { dt: u64, back: bool, n: u64 },
    Peek { n: u64 },
    Refund { n: u64 },
    Reset,
    Quota { limit: u64, ms: u64 },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (0..300u64, proptest::bool::weighted(0.1), 0..=12u64)
            .prop_map(|(dt, back, n)| Op::Check { dt, back, n }),
        2 => (0..=12u64).prop_map(|n| Op::Peek { n }),
        2 => (0..=12u64).prop_map(|n| Op::Refund { n }),
        1 => Just(Op::Reset),
        1 => (1..=12u64, 50..=400u64).prop_map(|(limit, ms)| Op::Quota { limit, ms }),
    ]
}

proptest! {
    /// Random checks (costs up to the limit and past it, a clock that
    /// steps back), peeks, refunds, resets and quota changes: the runs
    /// give the per-unit log's decision every time, every field, and
    /// never hold more runs than units or than L.
    #[test]
    fn runs_decide_as_the_per_unit_log(
        limit in 1..=10u64,
        ms in 50..=400u64,
        ops in proptest::collection::vec(op(), 1..200),
    ) {
        let mut p = log(limit, ms);
        let params = ParamCell::new(p);
        let cell = p.new_cell();
        let mut model = PerUnit::default();
        let mut now = 1_000 * MS;
        for (i, op) in ops.iter().enumerate() {
            match *op {
                Op::Check { dt, back, n } => {
                    now = if back { now.saturating_sub(dt * MS / 4) } else { now + dt * MS / 4 };
                    let got = SlidingLog::check(&cell, &params, now, n, true);
                    match InsufficientCapacity::check(n, p.limit) {
                        Err(e) => prop_assert_eq!(got, Err(e)),
                        Ok(()) => {
                            let want = model.step(&p, now, n.max(1), n > 0);
                            prop_assert_eq!(got.unwrap(), want, "op {} {:?}", i, op);
                        }
                    }
                }
                Op::Peek { n } => {
                    let got = SlidingLog::check(&cell, &params, now, n, false);
                    if n <= p.limit {
                        let want = model.step(&p, now, n.max(1), false);
                        prop_assert_eq!(got.unwrap(), want, "op {} {:?}", i, op);
                    }
                }
                Op::Refund { n } => {
                    SlidingLog::refund(&cell, &params, now, n);
                    model.refund(&p, now, n);
                }
                Op::Reset => {
                    SlidingLog::reset(&cell);
                    model = PerUnit::default();
                }
                Op::Quota { limit, ms } => {
                    let new = log(limit, ms);
                    params.begin();
                    SlidingLog::rescale(&cell, &p, &new, now);
                    params.publish(new);
                    model.rescale(&new);
                    p = new;
                }
            }
            let ring = lock(&cell.ring);
            prop_assert_eq!(ring.units(), model.times.len() as u64, "op {} {:?}", i, op);
            prop_assert_eq!(ring.runs.back().map(|r| r.time), model.newest());
            prop_assert!(ring.runs.len() as u64 <= ring.units());
            let mut distinct: Vec<u64> = model.times.iter().copied().collect();
            distinct.dedup();
            prop_assert_eq!(ring.runs.len(), distinct.len());
            drop(ring);
            prop_assert_eq!(SlidingLog::is_idle(&cell, &p, now), model.newest().map_or(true, |t| t + p.length <= now));
        }
    }

    /// The counts wrap around 2^64 without a wrong decision.
    #[test]
    fn counts_that_wrap_decide_the_same(start in (u64::MAX - 40)..=u64::MAX, costs in proptest::collection::vec(1..=5u64, 1..40)) {
        let p = log(8, 100);
        let mut ring = Ring::new();
        ring.base = start;
        let mut model = PerUnit::default();
        let mut now = MS;
        for (i, &n) in costs.iter().enumerate() {
            now += 7 * MS;
            let got = p.step(&mut ring, now, n, true);
            let want = model.step(&p, now, n, true);
            prop_assert_eq!(got, want, "step {}", i);
        }
    }
}
