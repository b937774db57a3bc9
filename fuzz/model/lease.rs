//! The lease target: a `StripedLimiter` with several holders against a naive
//! model written from the documented rules (`src/lease/` module docs and
//! docs/design.md, "Leases") in `u128`: take, use, steal, release, expiry and
//! the adaptation of the lease size. After every step every field of the
//! decision and the units available anywhere must agree, and every admission
//! must keep the bound `admitted <= burst + floor(d / T)` over every interval
//! ending at it.
//!
//! The `lease_keyed` target runs the same scenarios on a hot key of a keyed
//! token bucket (`HotKeys`, one slot): after one plain check (which tracks
//! the key) and its promotion, the key's entry in the table is the shared
//! word and the same model must hold, field for field (releases are not
//! offered there, so they are skipped).

use super::gcra::{keyed_quota, keyed_time, keyed_unit};
use super::{assert_decision, gcra, Dec, RateSpec, SmallRate, TimeModel, TimeOp, MAX_STEPS};
use arbitrary::{Arbitrary, Unstructured};
use ratewall::{
    ConfigError, Decision, HotKeys, KeyedTokenBucket, LeaseOptions, ManualClock, StripedLimiter,
};
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
    /// A plain unit check on the word (no lease, no hints): the keyed
    /// table's check of a key that is not hot yet.
    fn plain_check(&mut self, now: u128) -> Dec {
        let plain = gcra::Bucket {
            quota: self.q,
            tat: self.tat,
        };
        let (d, next) = plain.decide(now, 1);
        if let Some(tat) = next {
            self.tat = tat;
        }
        d
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

/// The limiter under test: a striped limiter, or hot key 0 of a keyed table.
#[derive(Debug)]
enum Subject {
    Striped(StripedLimiter<ManualClock>),
    Keyed(KeyedTokenBucket<u64, ManualClock>),
}

impl Subject {
    fn check_at_stripe(&self, holder: usize, at: u64) -> Decision {
        match self {
            Subject::Striped(l) => l.check_at_stripe(holder, at),
            Subject::Keyed(l) => l.check_key_at_stripe(&0, holder, at),
        }
    }
    fn available_at(&self, at: u64) -> u64 {
        match self {
            Subject::Striped(l) => l.available_at(at),
            Subject::Keyed(l) => l.available_key_at(&0, at),
        }
    }
}

/// Decodes and runs one lease scenario on a `StripedLimiter`; panics on any
/// disagreement.
pub fn run_lease(data: &[u8]) {
    run(data, false);
}

/// The same scenario on hot key 0 of a keyed token bucket.
pub fn run_lease_keyed(data: &[u8]) {
    run(data, true);
}

fn run(data: &[u8], keyed: bool) {
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
    let real = if keyed {
        KeyedTokenBucket::<u64, _>::builder(spec.rate())
            .max_keys(4)
            .shards(1)
            .seed(0)
            .hot_keys(HotKeys::new(1).lease(opts))
            .clock(clock.clone())
            .build()
            .map(Subject::Keyed)
    } else {
        StripedLimiter::with_options(spec.rate(), clock.clone(), opts).map(Subject::Striped)
    };
    // A keyed table's documented precision (`keyed_unit`): its time unit,
    // and the quota in whole units; a quota it cannot hold is refused.
    let unit = match spec.model() {
        Ok(q) if keyed => keyed_unit(&q),
        _ => 1,
    };
    if let (true, Ok(q)) = (keyed, spec.model()) {
        if keyed_quota(q, unit).is_none() {
            assert!(
                matches!(real, Err(ConfigError::KeyedSlot { .. })),
                "{spec:?}: {real:?}"
            );
            return;
        }
    }
    let q = match (
        real.as_ref(),
        spec.model().map(|q| keyed_quota(q, unit).unwrap_or(q)),
    ) {
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
    if let Subject::Keyed(l) = &real {
        // One plain check tracks the key; then it is made hot.
        let at = time.clock;
        let d = l.check_key_at(&0, at);
        let now = keyed_time(time.observe(at), unit);
        assert_decision(&d, &model.plain_check(now), &"the first, plain check");
        if d.is_allowed() {
            log.push(now);
        }
        assert!(l.promote_key(&0), "a tracked key takes the free slot");
    }
    for step in 0..MAX_STEPS {
        let Ok(op) = LeaseOp::arbitrary(&mut u) else {
            break;
        };
        let ctx = (step, op, time, model.tat);
        let admitted_at = match op {
            LeaseOp::Check { holder } => {
                let at = time.clock;
                let d = real.check_at_stripe(holder.into(), at);
                let now = keyed_time(time.observe(at), unit);
                let want = model.check(holder.into(), now);
                assert_decision(&d, &want, &ctx);
                d.is_allowed().then_some(now)
            }
            LeaseOp::CheckBefore { holder, ms } => {
                let at = time.clock.saturating_sub(u64::from(ms) * 1_000_000);
                let d = real.check_at_stripe(holder.into(), at);
                let now = keyed_time(time.observe(at), unit);
                let want = model.check(holder.into(), now);
                assert_decision(&d, &want, &ctx);
                d.is_allowed().then_some(now)
            }
            LeaseOp::Release => {
                if let Subject::Striped(real) = &real {
                    let at = time.clock;
                    let got = real.release_at(at);
                    let now = keyed_time(time.observe(at), unit);
                    assert_eq!(u128::from(got), model.release(now), "release at {ctx:?}");
                }
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
