//! Adaptive concurrency limits on a simulated backend (manual clock, no
//! threads): the limit settles within 20% of the backend's knee, follows
//! it down when the backend degrades, and back up when it recovers.

#[path = "support/backend_sim.rs"]
mod backend_sim;

use backend_sim::{algorithms, run, settled, BASE, CLIENTS, EVERY_MS, INITIAL, PHASES, SETTLE_MS};
use ratewall::{ConcurrencyLimiter, ManualClock};

#[test]
fn the_limit_settles_near_the_knee_and_recovers() {
    for (name, adaptive) in algorithms() {
        let (l, points) = backend_sim::scenario(adaptive);
        assert_eq!(points.len() as u64, PHASES[2].until_ms / EVERY_MS);
        for p in PHASES {
            let (limit, latency_ms) = settled(&points, p.until_ms - SETTLE_MS, p.until_ms);
            let knee = p.knee as f64;
            assert!(
                (limit - knee).abs() <= 0.2 * knee,
                "{name}: limit {limit:.1} is not within 20% of the knee {knee} before {} ms",
                p.until_ms
            );
            // Not too low either: the backend stays busy, serving at least
            // 90% of what its knee allows (knee requests per base latency).
            let settled_points = points
                .iter()
                .filter(|q| q.t_ms > p.until_ms - SETTLE_MS && q.t_ms <= p.until_ms);
            let served: u64 = settled_points.map(|q| q.served).sum();
            let capacity = p.knee * SETTLE_MS / BASE.as_millis() as u64;
            assert!(
                served * 10 >= capacity * 9,
                "{name}: served {served} of {capacity} before {} ms",
                p.until_ms
            );
            // Held near the knee, the backend stays near its base latency.
            assert!(
                latency_ms < 1.3 * BASE.as_millis() as f64,
                "{name}: {latency_ms:.1} ms"
            );
        }
        // Every point stays between the floor and the ceiling, and the
        // limit did move (it started at 20, far below the knee).
        let (floor, ceiling) = l.adaptive_bounds().unwrap();
        assert!(points.iter().all(|p| (floor..=ceiling).contains(&p.limit)));
        assert!(points.iter().any(|p| p.limit > 2 * INITIAL));
        // Overload was shed, not queued.
        assert!(points.iter().map(|p| p.shed).sum::<u64>() > 0);
        assert_eq!(points.last().unwrap().knee, PHASES[2].knee);
    }
}

/// Without an adaptive limit, the same overload keeps the maximum fixed
/// and the latency grows with it: what the adaptive limit prevents.
#[test]
fn a_fixed_limit_above_the_knee_lets_latency_grow() {
    let clock = ManualClock::new();
    let l = ConcurrencyLimiter::builder(200)
        .clock(clock.clone())
        .build()
        .unwrap();
    let points = run(&l, &clock, &PHASES[..1], CLIENTS, BASE, EVERY_MS);
    let (limit, latency_ms) = settled(&points, 10_000, 15_000);
    assert_eq!(limit, 200.0);
    assert!(
        latency_ms > 1.8 * BASE.as_millis() as f64,
        "{latency_ms:.1} ms"
    );
}
