//! A simulated backend behind a concurrency limiter, on a manual clock:
//! shared by `tests/adaptive.rs` (the convergence bounds) and
//! `examples/plot_adaptive.rs` (the figure in docs/concurrency.md), and the
//! demo's concurrency row.
//!
//! The backend serves `knee` requests at once at its base latency; above
//! that, requests share it, so a request admitted with `c` in flight takes
//! `base × max(1, c / knee)`. `clients` callers each send a request as soon
//! as their last one ends, and try again 1 ms later when shed. Everything is
//! deterministic (no threads, no randomness). (The demo's waiting variant,
//! callers that wait instead of being shed, runs the same backend through
//! `latency_ns`.)

use ratewall::{Adaptive, ConcurrencyLimiter, ManualClock, Permit};
use std::time::Duration;

/// One millisecond, the simulation's tick.
pub const TICK: Duration = Duration::from_millis(1);

/// The backend's knee from `until_ms` on (phases sorted by time).
#[derive(Clone, Copy, Debug)]
pub struct Phase {
    /// Where the phase ends, in ms since the start.
    pub until_ms: u64,
    /// Requests the backend serves at once at its base latency.
    pub knee: u64,
}

/// One point of the run, every `every_ms`.
#[derive(Clone, Copy, Debug)]
pub struct Point {
    /// Time in ms.
    pub t_ms: u64,
    /// The limiter's maximum.
    pub limit: u64,
    /// The backend's knee.
    pub knee: u64,
    /// Mean latency of the requests that completed in this period, in ms.
    pub latency_ms: f64,
    /// Requests shed (denied) in this period.
    pub shed: u64,
    /// Requests that completed in this period.
    pub served: u64,
}

/// Runs the phases and returns one point every `every_ms`.
pub fn run(
    limiter: &ConcurrencyLimiter<ManualClock>,
    clock: &ManualClock,
    phases: &[Phase],
    clients: usize,
    base: Duration,
    every_ms: u64,
) -> Vec<Point> {
    let base_ns = base.as_nanos() as u64;
    let mut running: Vec<(u64, u64, Permit<'_, ManualClock>)> = Vec::new();
    let mut points = Vec::new();
    let (mut lat_sum, mut lat_n, mut shed) = (0u64, 0u64, 0u64);
    let end = phases.last().map_or(0, |p| p.until_ms);
    let start_ns = ratewall::Clock::now(clock);
    for t_ms in 0..end {
        let now = start_ns + t_ms * 1_000_000;
        let knee = phases.iter().find(|p| t_ms < p.until_ms).unwrap().knee;
        // Requests that end by now give their permits back (the drop times them).
        let mut i = 0;
        while i < running.len() {
            if running[i].0 <= now {
                let (_, latency, permit) = running.swap_remove(i);
                drop(permit);
                lat_sum += latency;
                lat_n += 1;
            } else {
                i += 1;
            }
        }
        let idle = clients - running.len();
        for _ in 0..idle {
            let acquired = limiter.try_acquire_n(1).expect("cost 1 fits");
            match acquired.into_permit() {
                Some(permit) => {
                    let latency = latency_ns(base_ns, limiter.in_flight(), knee);
                    running.push((now + latency, latency, permit));
                }
                None => shed += 1,
            }
        }
        if (t_ms + 1) % every_ms == 0 {
            points.push(Point {
                t_ms: t_ms + 1,
                limit: limiter.max(),
                knee,
                latency_ms: if lat_n == 0 {
                    0.0
                } else {
                    lat_sum as f64 / lat_n as f64 / 1e6
                },
                shed,
                served: lat_n,
            });
            (lat_sum, lat_n, shed) = (0, 0, 0);
        }
        clock.advance(TICK);
    }
    points
}

/// How long a request admitted with `in_flight` requests in flight (itself
/// included) takes: `base` up to the knee, shared above it.
pub fn latency_ns(base_ns: u64, in_flight: u64, knee: u64) -> u64 {
    base_ns * in_flight.max(knee) / knee
}

/// The scenario of the test and the figure: knee 100, degraded to 40 at
/// 15 s, recovered to 100 at 30 s.
pub const PHASES: [Phase; 3] = [
    Phase {
        until_ms: 15_000,
        knee: 100,
    },
    Phase {
        until_ms: 30_000,
        knee: 40,
    },
    Phase {
        until_ms: 45_000,
        knee: 100,
    },
];
/// Where the limit starts.
pub const INITIAL: u64 = 20;
/// Callers, more than the backend ever serves well.
pub const CLIENTS: usize = 250;
/// The backend's latency below its knee.
pub const BASE: Duration = Duration::from_millis(10);
/// One point per 100 ms.
pub const EVERY_MS: u64 = 100;
/// The last 5 s of each phase count as settled.
pub const SETTLE_MS: u64 = 5_000;

/// The two algorithms, as the scenario configures them (AIMD's threshold
/// is 10% above the base latency).
pub fn algorithms() -> [(&'static str, Adaptive); 2] {
    [
        (
            "AIMD (threshold 11 ms)",
            Adaptive::aimd(5, 400, Duration::from_millis(11)),
        ),
        ("Vegas", Adaptive::vegas(5, 400)),
    ]
}

/// The scenario (`PHASES`, from `INITIAL`) run for one adaptive limit:
/// the limiter after the run, and its points.
pub fn scenario(adaptive: Adaptive) -> (ConcurrencyLimiter<ManualClock>, Vec<Point>) {
    let clock = ManualClock::new();
    let l = ConcurrencyLimiter::builder(INITIAL)
        .adaptive(adaptive)
        .clock(clock.clone())
        .build()
        .expect("valid adaptive limit");
    let points = run(&l, &clock, &PHASES, CLIENTS, BASE, EVERY_MS);
    (l, points)
}

/// The mean limit and mean latency (ms) of the points in `(from_ms, to_ms]`.
pub fn settled(points: &[Point], from_ms: u64, to_ms: u64) -> (f64, f64) {
    let s: Vec<&Point> = points
        .iter()
        .filter(|q| q.t_ms > from_ms && q.t_ms <= to_ms)
        .collect();
    let n = s.len().max(1) as f64;
    (
        s.iter().map(|q| q.limit as f64).sum::<f64>() / n,
        s.iter().map(|q| q.latency_ms).sum::<f64>() / n,
    )
}
