//! The keyed packings (`KeyedWord`) against the full state words: a state
//! the algorithm reached by its own steps, packed at the time it was
//! written and read back at any time within twice the sweep period (what
//! the table's wrap sweep guarantees), means the same: exactly for the
//! window counters and for GCRA with 1 ns units; never more permissive,
//! and later by less than a unit, for GCRA with larger units.
use super::*;
use crate::quota::{Rate, Window};
use proptest::prelude::*;
use std::time::Duration;

/// Runs `ops` (time step, cost) from a fresh key on the full state and,
/// as the table does, on the packed one (read at `now`, stepped, written
/// at `now`), comparing every decision; then reads the last state back
/// `later_frac` of two sweep periods on, and compares a unit request's
/// decision there.
fn same_decisions<A: KeyedWord>(a: A, start: u64, ops: &[(u64, bool, u64)], later_frac: f64) {
    let p = a.packing().unwrap();
    let (mut full, mut packed, mut now) = (0u64, p.pack(0, start), start);
    for &(dt, back, n) in ops {
        now = if back {
            now.saturating_sub(dt)
        } else {
            now + dt
        };
        let n = n.clamp(1, a.capacity());
        let (d_full, next_full) = a.step(full, now, n);
        let (d_packed, next_packed) = a.step(p.unpack(packed, now), now, n);
        assert_eq!(
            d_full, d_packed,
            "at {now} from full {full:#x}, packed {packed:#x}"
        );
        if let Some(next) = next_full {
            full = next;
        }
        if let Some(next) = next_packed {
            packed = p.pack(next, now);
            assert!(packed <= crate::word::STATE_MASK);
        }
    }
    let later = now + (2.0 * p.sweep_period() as f64 * later_frac) as u64;
    let read = p.unpack(packed, later);
    assert_eq!(
        a.step(full, later, 1).0,
        a.step(read, later, 1).0,
        "at {later}"
    );
    assert_eq!(a.is_idle(full, later), a.is_idle(read, later));
}

fn window(limit: u64, ms: u64) -> Window {
    Window::new(limit, Duration::from_millis(ms))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// Buckets whose burst window keeps 1 ns units: exact, whatever the
    /// times (up to the horizon) and the costs.
    #[test]
    fn gcra_with_1_ns_units_is_exact(
        count in 1u64..1_000, secs in 1u64..60, burst in 1u64..100,
        start in 0u64..1 << 62,
        ops in prop::collection::vec((0u64..2_000_000_000, prop::bool::weighted(0.1), 1u64..4), 1..40),
        later in 0.0f64..1.0,
    ) {
        let g = Gcra::from_rate(Rate::new(count, Duration::from_secs(secs)).burst(burst)).unwrap();
        prop_assume!(g.tolerance.saturating_mul(4) <= 1 << 38);
        prop_assert_eq!(g.packing().unwrap().unit(), 1);
        same_decisions(g, start, &ops, later);
        same_decisions(LeakyGcra(g), start, &ops, later);
    }

    /// Larger units: a TAT read back is later than the one stored by less
    /// than a unit (or both idle), and its decision is never more
    /// permissive.
    #[test]
    fn gcra_with_larger_units_rounds_towards_less(
        count in 1u64..1_000, hours in 1u64..100, burst in 1u64..1_000,
        tat_ahead in 0.0f64..1.0, now in 0u64..1 << 62, later in 0.0f64..1.0,
    ) {
        let g = Gcra::from_rate(Rate::new(count, Duration::from_secs(hours * 3600)).burst(burst)).unwrap();
        let Ok(p) = g.packing() else { return Ok(()) };
        let tat = now + (g.tolerance as f64 * tat_ahead) as u64;
        let at = now + (2.0 * p.sweep_period() as f64 * later) as u64;
        let read = p.unpack(p.pack(tat, now), at);
        if tat > at {
            prop_assert!(read >= tat && read - tat < p.unit(), "{} -> {}", tat, read);
        } else {
            prop_assert!(g.is_idle(read, at), "{} -> {} at {}", tat, read, at);
        }
        let (exact, rounded) = (g.step(tat, at, 1).0, g.step(read, at, 1).0);
        prop_assert!(!rounded.is_allowed() || exact.is_allowed());
        prop_assert!(rounded.remaining() <= exact.remaining());
    }

    #[test]
    fn fixed_window_is_exact(
        limit in 1u64..1 << 24, ms in 9u64..100_000, start in 0u64..1 << 62,
        ops in prop::collection::vec((0u64..200_000_000, prop::bool::weighted(0.1), 1u64..1 << 20), 1..40),
        later in 0.0f64..1.0,
    ) {
        let f = FixedCounter::from_window(&window(limit, ms)).unwrap();
        same_decisions(f, start, &ops, later);
    }

    #[test]
    fn sliding_window_is_exact(
        limit in 1u64..=16_383, ms in 135u64..100_000, start in 0u64..1 << 62,
        ops in prop::collection::vec((0u64..200_000_000, prop::bool::weighted(0.1), 1u64..100), 1..40),
        later in 0.0f64..1.0,
    ) {
        let s = SlidingCounter::from_window(&window(limit, ms)).unwrap();
        same_decisions(s, start, &ops, later);
    }
}

/// The bounds each packing states: GCRA's unit, range and sweep period;
/// the windows' sweep period (2^13 windows fixed, 2^9 sliding).
#[test]
fn packing_bounds_by_hand() {
    let g = Gcra::from_rate(Rate::per_second(10).burst(10)).unwrap();
    let p = g.packing().unwrap();
    assert_eq!(
        (p.unit(), p.max_tolerance(), p.sweep_period()),
        (1, 1 << 38, 1 << 37)
    );
    // An hour-long burst window: 4 h of headroom need 2^44 ns, 64 ns units.
    let h = Gcra::from_rate(Rate::per_hour(100)).unwrap();
    let p = h.packing().unwrap();
    assert_eq!((p.unit(), p.max_tolerance()), (64, 1 << 44));
    let f = FixedCounter::from_window(&window(5, 1000)).unwrap();
    assert_eq!(f.packing().unwrap().sweep_period(), 8192 * 1_000_000_000);
    let s = SlidingCounter::from_window(&window(5, 1000)).unwrap();
    assert_eq!(s.packing().unwrap().sweep_period(), 512 * 1_000_000_000);
    // The fresh state packs as idle at any time and reads back as idle.
    for now in [0, 1, 1 << 40, (1 << 62) + 12345] {
        let p = g.packing().unwrap();
        assert!(g.is_idle(p.unpack(p.pack(0, now), now), now));
        let fp = f.packing().unwrap();
        assert!(f.is_idle(fp.unpack(fp.pack(0, now), now), now));
        let sp = s.packing().unwrap();
        assert!(s.is_idle(sp.unpack(sp.pack(0, now), now), now));
    }
}
