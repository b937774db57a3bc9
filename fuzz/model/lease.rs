//! The lease target: a `StripedLimiter` with several holders against a naive
//! model written from the documented rules (`src/lease.rs` module docs and
//! docs/design.md, "Leases") in `u128`: take, use, steal, release, expiry and
//! the adaptation of the lease size. After every step every field of the
//! decision and the units available anywhere must agree, and every admission
//! must keep the bound `admitted <= burst + floor(d / T)` over every interval
//! ending at it.

use super::{assert_decision, gcra, Dec, RateSpec, SmallRate, TimeModel, TimeOp, MAX_STEPS};
use arbitrary::{Arbitrary, Unstructured};
use ratewall::{ConfigError, LeaseOptions, ManualClock, StripedLimiter};
use std::time::Duration;

#[derive(Arbitrary, Clone, Copy, Debug)]
enum LeaseOp {
    Check {
        holder: u8,
    },
    /// `check_at` a reading `ms` before the clock's (a stale shared read).
    CheckBefore {
        holder: u8,
        ms: u8,
    },
    Release,
    Time(TimeOp),
    TimeNs(u16),
}

#[derive(Clone, Copy, Debug, Default)]
struct Stripe {
    units: u128,
    end: u128,
    size: u128,
    last_take: Option<u128>,
}

struct Model {
    q: gcra::Quota,
    tat: u128,
    stripes: Vec<Stripe>,
    max_lease: u128,
    gap: u128,
}

impl Model {
    fn t(&self) -> u128 {
        self.q.emission
    }
    fn usable(&self, s: &Stripe, now: u128) -> u128 {
        s.units.min(s.end.saturating_sub(now) / self.t())
    }
    fn held(&self, now: u128) -> u128 {
        self.tat.saturating_sub(now)
    }
    fn free(&self, now: u128) -> u128 {
        self.q.tau().saturating_sub(self.held(now)) / self.t()
    }
    fn available(&self, now: u128) -> u128 {
        self.free(now)
            + self
                .stripes
                .iter()
                .map(|s| self.usable(s, now))
                .sum::<u128>()
    }
    /// A unit from stripe `i`'s lease: the allowed decision, or `None`.
    fn use_lease(&mut self, i: usize, now: u128) -> Option<Dec> {
        let u = self.usable(&self.stripes[i], now);
        if u == 0 {
            return None;
        }
        self.stripes[i].units = u - 1;
        Some(Dec {
            allowed: true,
            limit: self.q.burst,
            remaining: ((self.q.tau().saturating_sub(self.held(now))) / self.t() + u - 1) as u64,
            retry_ns: 0,
            reset_ns: self.held(now),
        })
    }
    fn check(&mut self, home: usize, now: u128) -> Dec {
        let n = self.stripes.len();
        let home = home % n;
        if let Some(d) = self.use_lease(home, now) {
            return d;
        }
        // Take: adapt the size, then up to k units from the word.
        let s = self.stripes[home];
        let hot = s
            .last_take
            .is_some_and(|l| now.saturating_sub(l) < self.gap.saturating_mul(s.size.max(1)));
        let size = s.size.max(1);
        let k = if hot {
            (size * 2).min(self.max_lease)
        } else {
            (size / 2).max(1)
        };
        let free = self.free(now);
        if free != 0 {
            // The adaptation hints change only on a take, not on a denial.
            self.stripes[home].last_take = Some(now);
            self.stripes[home].size = k;
        }
        if free == 0 {
            for j in 1..n {
                if let Some(d) = self.use_lease((home + j) % n, now) {
                    return d;
                }
            }
            let plain = gcra::Bucket {
                quota: self.q,
                tat: self.tat,
            };
            return plain.decide(now, 1).0;
        }
        let m = k.min(free);
        let held = self.held(now);
        self.tat = self.tat.max(now) + m * self.t();
        if m > 1 {
            self.stripes[home].units = m - 1;
            self.stripes[home].end = self.tat;
        }
        // The plain check's remaining; reset is the word's drain time.
        Dec {
            allowed: true,
            limit: self.q.burst,
            remaining: ((self.q.tau() - held - self.t()) / self.t()) as u64,
            retry_ns: 0,
            reset_ns: held + m * self.t(),
        }
    }
    fn release(&mut self, now: u128) -> u128 {
        let mut total = 0;
        for i in 0..self.stripes.len() {
            let s = self.stripes[i];
            let u = self.usable(&s, now);
            if u == 0 || self.tat != s.end {
                continue;
            }
            self.stripes[i].units = 0;
            self.tat = s.end - u * self.t();
            total += u;
        }
        total
    }
}

/// Decodes and runs one lease scenario; panics on any disagreement.
pub fn run_lease(data: &[u8]) {
    let mut u = Unstructured::new(data);
    let (Ok(spec), Ok(stripes), Ok(max_lease), Ok(gap_us)) = (
        SmallRate::arbitrary(&mut u),
        u8::arbitrary(&mut u),
        u8::arbitrary(&mut u),
        u16::arbitrary(&mut u),
    ) else {
        return;
    };
    let (stripes, max_lease) = (usize::from(stripes % 5), u64::from(max_lease % 17));
    let opts = LeaseOptions::new()
        .stripes(stripes)
        .max_lease(max_lease)
        .hot_gap(Duration::from_micros(gap_us.into()));
    let clock = ManualClock::new();
    let real = StripedLimiter::with_options(spec.rate(), clock.clone(), opts);
    let q = match (real.as_ref(), spec.model()) {
        (Ok(_), Ok(q)) if stripes >= 1 && (1..=q.burst).contains(&max_lease) => q,
        (Err(ConfigError::Incompatible { .. }), Ok(q))
            if stripes == 0 || !(1..=q.burst).contains(&max_lease) =>
        {
            return
        }
        (Err(e), Err(v)) => {
            assert!(v.contains(e), "{spec:?}: {e:?} not in {v:?}");
            return;
        }
        (got, want) => {
            panic!("{spec:?} stripes {stripes} max_lease {max_lease}: {got:?} vs {want:?}")
        }
    };
    let real = real.unwrap();
    let mut model = Model {
        q,
        tat: 0,
        stripes: vec![Stripe::default(); stripes],
        max_lease: max_lease.into(),
        gap: u128::from(gap_us) * 1000,
    };
    let mut time = TimeModel::default();
    let mut log: Vec<u128> = Vec::new();
    for step in 0..MAX_STEPS {
        let Ok(op) = LeaseOp::arbitrary(&mut u) else {
            break;
        };
        let ctx = (step, op, time, model.tat);
        let admitted_at = match op {
            LeaseOp::Check { holder } => {
                let at = time.clock;
                let d = real.check_at_stripe(holder.into(), at);
                let now = time.observe(at);
                let want = model.check(holder.into(), now);
                assert_decision(&d, &want, &ctx);
                d.is_allowed().then_some(now)
            }
            LeaseOp::CheckBefore { holder, ms } => {
                let at = time.clock.saturating_sub(u64::from(ms) * 1_000_000);
                let d = real.check_at_stripe(holder.into(), at);
                let now = time.observe(at);
                let want = model.check(holder.into(), now);
                assert_decision(&d, &want, &ctx);
                d.is_allowed().then_some(now)
            }
            LeaseOp::Release => {
                let at = time.clock;
                let got = real.release_at(at);
                let now = time.observe(at);
                assert_eq!(u128::from(got), model.release(now), "release at {ctx:?}");
                None
            }
            LeaseOp::Time(op) => {
                op.apply(&clock, &mut time);
                None
            }
            LeaseOp::TimeNs(ns) => {
                TimeOp::AdvanceNs(ns.into()).apply(&clock, &mut time);
                None
            }
        };
        let now = u128::from(time.floor).min(super::HORIZON);
        assert_eq!(
            u128::from(real.available_at(time.floor)),
            model.available(now),
            "available at {ctx:?}"
        );
        if let Some(t) = admitted_at {
            // The bound over every interval that ends at this admission
            // (readings only move forward: the log is sorted).
            log.push(t);
            let last = log.len() - 1;
            for (i, &start) in log.iter().enumerate() {
                let n = (last - i + 1) as u128;
                let bound = u128::from(q.burst) + (t - start) / q.emission;
                assert!(
                    n <= bound,
                    "{n} admitted in [{start}, {t}] > {bound} at {ctx:?}"
                );
            }
        }
    }
}
