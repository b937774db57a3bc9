//! GCRA (generic cell rate algorithm): the token bucket and the leaky bucket
//! in one word.
//!
//! ```text
//!  63                                                              0
//! +------------------------------------------------------------------+
//! | TAT: theoretical arrival time, ns since the clock epoch (64 bit) |
//! +------------------------------------------------------------------+
//! ```
//!
//! All-zero means "never seen" (any `TAT <= now` is a full bucket). Time is
//! clamped to `HORIZON` (2^63 ns) and the tolerance to 2^62 ns, so
//! `TAT <= HORIZON + tolerance` always fits.
//!
//! With `T = period / count` and `tau = burst * T`, a request of cost `n` at
//! time `t`: `new = max(TAT, t) + n*T`; allowed iff `new - t <= tau`; on allow
//! store `new`, on deny store nothing.

use super::{word_algorithm, KeyedWord, WordStep};
use crate::decision::Decision;
use crate::error::ConfigError;
use crate::quota::{period_ns, Rate, MAX_TOLERANCE};
use crate::word::{Packing, Params, STATE_BITS, STATE_MASK};

/// The token bucket, as GCRA: the parameter type of [`TokenBucket`](crate::TokenBucket).
///
/// Admits at most `burst + rate * d` in any interval of length `d`, with no
/// boundary artifact. State: one `u64` (the theoretical arrival time).
///
/// # Example
///
/// ```
/// use ratewall::{algorithm::Gcra, Limiter, ManualClock, Rate};
///
/// let bucket: Limiter<Gcra, _> = Limiter::with_clock(Rate::per_second(10).burst(3), ManualClock::new()).unwrap();
/// let admitted = (0..10).filter(|_| bucket.check().is_allowed()).count();
/// assert_eq!(admitted, 3);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Gcra {
    /// `T`, ns per unit of cost.
    pub(crate) emission: u64,
    /// `tau = burst * T`, ns.
    pub(crate) tolerance: u64,
    pub(crate) burst: u64,
}

impl Params for Gcra {
    fn encode(&self) -> [u64; 3] {
        [self.emission, self.tolerance, self.burst]
    }
    fn decode(w: [u64; 3]) -> Self {
        Gcra {
            emission: w[0],
            tolerance: w[1],
            burst: w[2],
        }
    }
}

/// GCRA's decision arithmetic, in any time unit: a request whose cost is
/// `cost = n*T`, against a bucket that holds `held = max(TAT - now, 0)`,
/// with tolerance `tau`. Allowed iff `used = held + cost <= tau`; then the
/// credit left is `tau - used` and the bucket is full again after `used`
/// (the new TAT is `now + used`). Denied: the credit is `tau - held`, the
/// retry `used - tau`, and the reset `held`.
///
/// Returns `(allowed, credit, retry, reset)`. The one source of this
/// arithmetic: the local step below and the Redis batch decoding
/// (`redis::wire`, which gets `held` from `lua/batch.lua`) both call it.
#[inline]
pub(crate) fn gcra_decide(held: u64, cost: u64, tau: u64) -> (bool, u64, u64, u64) {
    let used = held.saturating_add(cost);
    if used <= tau {
        (true, tau - used, 0, used)
    } else {
        (false, tau.saturating_sub(held), used - tau, held)
    }
}

impl WordStep for Gcra {
    #[inline]
    fn capacity(&self) -> u64 {
        self.burst
    }

    #[inline]
    fn step(&self, tat: u64, now: u64, n: u64) -> (Decision, Option<u64>) {
        // No overflow: held <= tau_max <= 2^62 and n*T <= burst*T = tau <= 2^62,
        // and an admitted `now + used` is at most HORIZON + 2^62.
        let held = tat.saturating_sub(now);
        match gcra_decide(held, n * self.emission, self.tolerance) {
            (true, credit, _, used) => {
                let d = Decision::allow_credit(self.burst, credit, self.emission, used);
                (d, Some(now + used))
            }
            (false, credit, retry, held) => {
                let d = Decision::deny_credit(self.burst, credit, self.emission, retry, held);
                (d, None)
            }
        }
    }

    #[inline]
    fn refund(&self, tat: u64, now: u64, n: u64) -> Option<u64> {
        if tat <= now {
            return None; // already full: nothing to give back
        }
        Some(tat.saturating_sub(n.saturating_mul(self.emission)))
    }

    fn rescale(&self, old: &Self, tat: u64, now: u64) -> u64 {
        if tat <= now {
            return tat;
        }
        // Keep the tokens in use: (tat - now) / T_old of them, now costing
        // T_new each; at most a full bucket's worth under the new burst.
        let used = u128::from(tat - now) * u128::from(self.emission) / u128::from(old.emission);
        now + (used.min(u128::from(self.tolerance)) as u64)
    }

    #[inline]
    fn is_idle(&self, tat: u64, now: u64) -> bool {
        tat <= now
    }

    #[inline]
    fn time_to_idle(&self, tat: u64, now: u64) -> u64 {
        tat.saturating_sub(now)
    }

    fn as_gcra(&self) -> Option<Gcra> {
        Some(*self)
    }
}

impl Gcra {
    /// Validates a rate into GCRA parameters: `T = period / count` rounded
    /// up to whole nanoseconds (never more permissive, and refused if that
    /// rounds by more than a thousandth) and `tau = burst * T`.
    pub(crate) fn from_rate(rate: Rate) -> Result<Gcra, ConfigError> {
        let count = rate.count();
        if count == 0 {
            return Err(ConfigError::ZeroRate);
        }
        let period_ns = period_ns(rate.period())?;
        let burst = rate.burst_size();
        if burst == 0 {
            return Err(ConfigError::ZeroBurst);
        }
        if period_ns < count {
            return Err(ConfigError::RateTooHigh { count, period_ns });
        }
        let emission = period_ns.div_ceil(count);
        // Rounding error (emission*count - period) relative to the period, in
        // u128 so the products cannot overflow.
        let excess = u128::from(emission) * u128::from(count) - u128::from(period_ns);
        if excess * 1000 > u128::from(period_ns) {
            return Err(ConfigError::RateImprecise { count, period_ns });
        }
        let max_burst = MAX_TOLERANCE / emission;
        if burst > max_burst {
            return Err(ConfigError::BurstTooLarge {
                burst,
                max: max_burst,
            });
        }
        Ok(Gcra {
            emission,
            tolerance: burst * emission,
            burst,
        })
    }
}

word_algorithm!(Gcra, Rate, "token bucket", |r| Gcra::from_rate(*r));

/// A time (a TAT, a deadline) in a keyed slot: in units of `2^shift` ns,
/// rounded up, modulo 2^40 units. Read back at `now`, a packed time up to
/// [`AHEAD`] units after `now`'s unit is that time; any other is in the
/// past, which GCRA reads as a full bucket (0, the fresh state).
///
/// The table holds tolerances up to [`TimePacking::max_tolerance`] =
/// 2^38 units (a TAT is at most that far ahead of the check that stored
/// it); the rest of the ahead range absorbs checks at instants behind the
/// table's latest. A time that has passed reads as current again only
/// after 2^39 units: the wrap sweep reclaims idle keys every 2^37 units
/// (2^37 ns = 137 s with 1 ns units).
///
/// Rounding up makes a TAT later by less than a unit: each admission costs
/// up to a unit more (never admits more). The unit is 1 ns (exact) unless
/// the burst window `burst * T` is above 2^36 ns (68.7 s; 2^38 over the
/// headroom of 4 that quota changes get); a larger unit is refused unless
/// it is at most `T / 2^10` (0.1% of an admission).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TimePacking {
    shift: u32,
}

/// Units ahead of `now` a packed time may be (half the modulus).
const AHEAD: u64 = 1 << (STATE_BITS - 1);
/// Units before `now` an idle state is packed at.
const IDLE_BACK: u64 = 1 << (STATE_BITS - 3);
/// The largest unit exponent: keeps `(now's unit + AHEAD) << shift` under
/// 2^64 for every `now <= HORIZON`.
const MAX_SHIFT: u32 = 23;

impl TimePacking {
    /// The packing whose range holds tolerances up to `tolerance` ns, with
    /// the least unit that does (1 ns up to 2^38 ns).
    pub(crate) fn for_tolerance(tolerance: u64) -> TimePacking {
        let units = tolerance >> (STATE_BITS - 2);
        let shift = if units == 0 {
            0
        } else {
            64 - units.leading_zeros()
        };
        TimePacking {
            shift: shift.min(MAX_SHIFT),
        }
    }

    /// The largest tolerance (ns) this packing holds: 2^38 units.
    pub(crate) fn max_tolerance(&self) -> u64 {
        (1u64 << (STATE_BITS - 2)) << self.shift
    }

    /// The unit, in ns.
    pub(crate) fn unit(&self) -> u64 {
        1 << self.shift
    }
}

impl Packing for TimePacking {
    #[inline]
    fn pack(&self, t: u64, now: u64) -> u64 {
        if t <= now {
            // Idle: any time not after `now` means the same. Packed 2^37
            // units before `now`, it reads as past (idle) from 2^37 units
            // before `now` (checks at earlier instants) to 3 * 2^37 after.
            (now >> self.shift).wrapping_sub(IDLE_BACK) & STATE_MASK
        } else {
            // Rounded up: never earlier than the time it stands for.
            (((t - 1) >> self.shift) + 1) & STATE_MASK
        }
    }

    #[inline]
    fn unpack(&self, packed: u64, now: u64) -> u64 {
        let base = now >> self.shift;
        let ahead = packed.wrapping_sub(base) & STATE_MASK;
        if ahead < AHEAD {
            (base + ahead) << self.shift
        } else {
            0
        }
    }

    fn sweep_period(&self) -> u64 {
        (1u64 << (STATE_BITS - 3)) << self.shift
    }

    #[inline]
    fn time(&self, now: u64) -> u64 {
        (now >> self.shift) << self.shift
    }
}

impl KeyedWord for Gcra {
    type Packing = TimePacking;

    fn packing(&self) -> Result<TimePacking, ConfigError> {
        // Headroom: quota changes and per-key quotas up to four times this
        // burst window fit the same table.
        let p = TimePacking::for_tolerance(self.tolerance.saturating_mul(4));
        self.fits(&p)?;
        Ok(p)
    }

    fn in_units(self, p: &TimePacking) -> Gcra {
        // T rounded up to whole units (slower by at most 2^-10: `fits`);
        // with the table's time also in units, every TAT is a whole number
        // of units and packs exactly.
        let emission = self.emission.div_ceil(p.unit()) * p.unit();
        Gcra {
            emission,
            tolerance: self.burst.saturating_mul(emission),
            burst: self.burst,
        }
    }

    fn fits(&self, p: &TimePacking) -> Result<(), ConfigError> {
        if p.unit() > 1 && p.unit() << 10 > self.emission {
            // A unit above 0.1% of the interval: rounding the interval up
            // to whole units would slow the rate by more than that.
            return Err(ConfigError::KeyedSlot {
                what: "interval (period / count) in ns",
                value: self.emission,
                bound: p.unit() << 10,
                fix: "use a smaller burst (a keyed bucket's burst is at most about 2^25, by the rate), or for a per-key quota a slower rate or a table built for a shorter burst window",
            });
        }
        // The burst window the table runs: in whole units.
        if self.in_units(p).tolerance > p.max_tolerance() {
            return Err(ConfigError::KeyedSlot {
                what: "burst window (burst x interval) in ns",
                value: self.tolerance,
                bound: p.max_tolerance(),
                fix: "use a smaller burst or a faster rate, or build the table with the largest quota it will hold (it takes up to four times its own burst window)",
            });
        }
        Ok(())
    }
}

impl KeyedWord for LeakyGcra {
    type Packing = TimePacking;

    fn packing(&self) -> Result<TimePacking, ConfigError> {
        self.0.packing()
    }

    fn in_units(self, p: &TimePacking) -> LeakyGcra {
        LeakyGcra(self.0.in_units(p))
    }

    fn fits(&self, p: &TimePacking) -> Result<(), ConfigError> {
        self.0.fits(p)
    }
}

/// The leaky bucket, as GCRA: the parameter type of [`LeakyBucket`](crate::LeakyBucket).
///
/// The same arithmetic as [`Gcra`] with the burst read as the bucket's
/// capacity: as a meter (`check`) it rejects what would overflow; as a shaper
/// (`reserve`) it queues up to `capacity` requests and spaces their
/// departures one emission interval apart.
///
/// # Example
///
/// ```
/// use ratewall::{LeakyBucket, ManualClock, Rate};
/// use std::time::Duration;
///
/// let leaky = LeakyBucket::with_clock(Rate::per_second(10).burst(3), ManualClock::new()).unwrap();
/// let delays: Vec<_> = (0..4).map(|_| leaky.reserve().map(|r| r.delay())).collect();
/// assert_eq!(delays[0], Ok(Duration::ZERO));
/// assert_eq!(delays[2], Ok(Duration::from_millis(200)));
/// assert!(delays[3].is_err(), "three already queued: the fourth is rejected");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeakyGcra(pub(crate) Gcra);

impl Params for LeakyGcra {
    fn encode(&self) -> [u64; 3] {
        self.0.encode()
    }
    fn decode(w: [u64; 3]) -> Self {
        LeakyGcra(Gcra::decode(w))
    }
}

impl WordStep for LeakyGcra {
    #[inline]
    fn capacity(&self) -> u64 {
        self.0.capacity()
    }
    #[inline]
    fn step(&self, s: u64, now: u64, n: u64) -> (Decision, Option<u64>) {
        self.0.step(s, now, n)
    }
    #[inline]
    fn refund(&self, s: u64, now: u64, n: u64) -> Option<u64> {
        self.0.refund(s, now, n)
    }
    fn rescale(&self, old: &Self, s: u64, now: u64) -> u64 {
        self.0.rescale(&old.0, s, now)
    }
    #[inline]
    fn is_idle(&self, s: u64, now: u64) -> bool {
        self.0.is_idle(s, now)
    }

    #[inline]
    fn time_to_idle(&self, s: u64, now: u64) -> u64 {
        self.0.time_to_idle(s, now)
    }
}

word_algorithm!(LeakyGcra, Rate, "leaky bucket", |r| Gcra::from_rate(*r)
    .map(LeakyGcra));

#[cfg(all(test, not(ratewall_loom)))]
mod tests {
    use super::*;
    use std::time::Duration;

    const MS: u64 = 1_000_000;

    fn g(count: u64, burst: u64) -> Gcra {
        Gcra::from_rate(Rate::per_second(count).burst(burst)).unwrap()
    }

    /// (tat, now, n) -> (allowed, remaining, retry_ms, reset_ms, next tat), by hand:
    /// 10/s so T = 100 ms, burst 3 so tau = 300 ms.
    #[test]
    fn table_of_hand_computed_steps() {
        let p = g(10, 3);
        type Row = (u64, u64, u64, bool, u64, u64, u64, Option<u64>);
        let cases: &[Row] = &[
            // fresh key at t=1000ms, cost 1: new = 1100, used 100, remaining (300-100)/100 = 2
            (0, 1000, 1, true, 2, 0, 100, Some(1100)),
            // two more: used 300 = tau exactly is allowed (<=), remaining 0
            (1200, 1000, 1, true, 0, 0, 300, Some(1300)),
            // a fourth: used 400 > 300: denied, wait 100, full again in 300
            (1300, 1000, 1, false, 0, 100, 300, None),
            // 50 ms later: used 350: wait 50
            (1300, 1050, 1, false, 0, 50, 250, None),
            // at 1100: used 300: allowed again
            (1300, 1100, 1, true, 0, 0, 300, Some(1400)),
            // cost 3 on a full bucket: used 300, allowed, empty
            (0, 5000, 3, true, 0, 0, 300, Some(5300)),
            // cost 3 with one token used: used 400: wait 100, 2 remaining
            (5100, 5000, 3, false, 2, 100, 100, None),
            // tat long past: same as fresh
            (10, 9000, 2, true, 1, 0, 200, Some(9200)),
        ];
        for &(tat, now, n, allowed, remaining, retry, reset, next) in cases {
            let (d, nx) = p.step(tat * MS, now * MS, n);
            let ctx = format!("tat={tat} now={now} n={n}: {d:?}");
            assert_eq!(d.is_allowed(), allowed, "{ctx}");
            assert_eq!(d.remaining(), remaining, "{ctx}");
            assert_eq!(d.retry_after().as_nanos() as u64, retry * MS, "{ctx}");
            assert_eq!(d.reset_after().as_nanos() as u64, reset * MS, "{ctx}");
            assert_eq!(d.limit(), 3, "{ctx}");
            assert_eq!(nx, next.map(|t| t * MS), "{ctx}");
        }
    }

    #[test]
    fn refund_gives_back_exactly_and_never_overfills() {
        let p = g(10, 3);
        assert_eq!(p.refund(1300 * MS, 1000 * MS, 2), Some(1100 * MS));
        assert_eq!(p.refund(1300 * MS, 1000 * MS, 99), Some(0));
        assert_eq!(
            p.refund(900 * MS, 1000 * MS, 1),
            None,
            "a full bucket stays full"
        );
        // A refund followed by a check behaves as if the refunded request never came.
        let (_, a) = p.step(0, 1000 * MS, 1);
        let (_, b) = p.step(a.unwrap(), 1000 * MS, 1);
        let back = p.refund(b.unwrap(), 1000 * MS, 1).unwrap();
        assert_eq!(back, a.unwrap());
    }

    #[test]
    fn rescale_keeps_tokens_in_use() {
        let old = g(10, 10); // T = 100 ms
        let new = g(100, 10); // T = 10 ms
                              // 5 tokens in use (500 ms) under old -> 5 tokens (50 ms) under new.
        assert_eq!(new.rescale(&old, 1500 * MS, 1000 * MS), 1050 * MS);
        // Capped at the new full bucket.
        let small = g(10, 2);
        assert_eq!(small.rescale(&old, 1900 * MS, 1000 * MS), 1200 * MS);
        // Idle state stays idle.
        assert_eq!(new.rescale(&old, 700 * MS, 1000 * MS), 700 * MS);
    }

    #[test]
    fn horizon_values_do_not_overflow() {
        let p = Gcra::from_rate(Rate::new(1, std::time::Duration::from_nanos(1 << 62))).unwrap();
        let now = crate::clock::HORIZON;
        let (d, next) = p.step(0, now, 1);
        assert!(d.is_allowed());
        let (d2, _) = p.step(next.unwrap(), now, 1);
        assert!(!d2.is_allowed());
        assert_eq!(next.unwrap(), now + (1 << 62));
    }

    #[test]
    fn time_to_idle_is_the_time_until_the_tat() {
        let p = g(10, 3);
        assert_eq!(p.time_to_idle(0, 5), 0);
        assert_eq!(p.time_to_idle(5, 5), 0);
        assert_eq!(p.time_to_idle(305 * MS, 5 * MS), 300 * MS);
        assert!(!p.is_idle(305 * MS, 305 * MS - 1));
        assert!(p.is_idle(305 * MS, 305 * MS));
        let leaky = LeakyGcra(p);
        assert_eq!(leaky.time_to_idle(305 * MS, 5 * MS), 300 * MS);
        assert!(!leaky.is_idle(305 * MS, 5 * MS));
        assert!(leaky.is_idle(305 * MS, 305 * MS));
    }

    #[test]
    fn validation_names_each_bad_input() {
        assert_eq!(
            Gcra::from_rate(Rate::per_second(0)),
            Err(ConfigError::ZeroRate)
        );
        assert_eq!(
            Gcra::from_rate(Rate::new(1, Duration::ZERO)),
            Err(ConfigError::ZeroPeriod)
        );
        assert_eq!(
            Gcra::from_rate(Rate::per_second(1).burst(0)),
            Err(ConfigError::ZeroBurst)
        );
        assert!(matches!(
            Gcra::from_rate(Rate::new(1, Duration::MAX)),
            Err(ConfigError::PeriodTooLong { .. })
        ));
        assert!(matches!(
            Gcra::from_rate(Rate::per_second(2_000_000_000)),
            Err(ConfigError::RateTooHigh { .. })
        ));
        assert!(matches!(
            Gcra::from_rate(Rate::per_second(999_999_937)),
            Err(ConfigError::RateImprecise { .. })
        ));
        assert_eq!(
            Gcra::from_rate(Rate::per_second(1).burst(u64::MAX)),
            Err(ConfigError::BurstTooLarge {
                burst: u64::MAX,
                max: MAX_TOLERANCE / 1_000_000_000
            })
        );
    }

    #[test]
    fn intervals_are_exact_or_rounded_up_within_a_thousandth() {
        let g = Gcra::from_rate(Rate::per_second(1_000_000_000)).unwrap();
        assert_eq!(g.emission, 1, "1e9/s is exact at ns resolution");
        let g = Gcra::from_rate(Rate::per_second(3)).unwrap();
        assert_eq!(g.emission, 333_333_334, "rounded up: never more permissive");
        let g = Gcra::from_rate(Rate::per_second(1_000_000)).unwrap();
        assert_eq!(g.emission, 1000);
        let g = Gcra::from_rate(Rate::per_second(999_999)).unwrap();
        assert_eq!(g.emission, 1001);
        let g = Gcra::from_rate(Rate::per_minute(60).burst(10)).unwrap();
        assert_eq!(
            (g.emission, g.tolerance, g.burst),
            (1_000_000_000, 10_000_000_000, 10)
        );
    }

    #[test]
    fn errors_say_what_to_change() {
        for e in [
            Gcra::from_rate(Rate::per_second(0)).unwrap_err(),
            Gcra::from_rate(Rate::per_second(1).burst(u64::MAX)).unwrap_err(),
            Gcra::from_rate(Rate::per_second(5_000_000_000)).unwrap_err(),
        ] {
            let msg = e.to_string();
            assert!(msg.contains("use") || msg.contains("count in"), "{msg}");
        }
    }
}
