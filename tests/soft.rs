//! Soft limits: every algorithm, against a reference model on a
//! `ManualClock`. The model is the plain rule of each algorithm with its
//! capacity widened by the tolerance; a request is above the limit iff the
//! nominal capacity would have denied it in the same state.

use proptest::prelude::*;
use ratewall::{
    check_all, check_each, KeyedPolicyLimiter, ManualClock, Policy, PolicyAlgorithm, Rate,
    Tolerance, Window,
};
use std::collections::HashMap;
use std::time::Duration;

const SEC: u64 = 1_000_000_000;

/// The reference: per key, the plain rule of the algorithm.
#[derive(Debug, Default, Clone)]
struct KeyModel {
    tat: u64,
    window: u64,
    prev: u64,
    cur: u64,
    log: Vec<u64>,
}

/// (allowed, above, remaining) for a request of cost `n` at `t`, updating
/// the key's state on allow. `cap` is the widened capacity, `limit` nominal,
/// `unit` the emission interval (buckets) or the window length.
fn model_step(
    alg: PolicyAlgorithm,
    m: &mut KeyModel,
    t: u64,
    n: u64,
    limit: u64,
    cap: u64,
    unit: u64,
) -> (bool, bool, u64) {
    let u = cap - limit;
    // `used` before this request, in cost units (buckets: in ns).
    match alg {
        PolicyAlgorithm::TokenBucket | PolicyAlgorithm::LeakyBucket => {
            let held = m.tat.saturating_sub(t);
            let used = held + n * unit;
            if used <= cap * unit {
                m.tat = t + used;
                let rem = (cap * unit - used) / unit;
                (true, rem < u, rem.saturating_sub(u))
            } else {
                let rem = (cap * unit).saturating_sub(held) / unit;
                (false, false, rem.saturating_sub(u))
            }
        }
        PolicyAlgorithm::FixedWindow | PolicyAlgorithm::SlidingWindowCounter => {
            let id = t / unit;
            let (prev, cur) = if id == m.window {
                (m.prev, m.cur)
            } else if id == m.window + 1 {
                (m.cur, 0)
            } else {
                (0, 0)
            };
            let weighted = if alg == PolicyAlgorithm::FixedWindow {
                0
            } else {
                // ceil(prev * (W - e) / W)
                let e = t - id * unit;
                (prev * (unit - e)).div_ceil(unit)
            };
            let used = weighted + cur;
            if used + n <= cap {
                (m.window, m.prev, m.cur) = (id, prev, cur + n);
                let rem = cap - used - n;
                (true, rem < u, rem.saturating_sub(u))
            } else {
                (false, false, cap.saturating_sub(used).saturating_sub(u))
            }
        }
        PolicyAlgorithm::SlidingWindowLog => {
            let in_window = m.log.iter().filter(|&&s| s + unit > t).count() as u64;
            if in_window + n <= cap {
                m.log.extend(std::iter::repeat(t).take(n as usize));
                let rem = cap - in_window - n;
                (true, rem < u, rem.saturating_sub(u))
            } else {
                (false, false, (cap - in_window).saturating_sub(u))
            }
        }
        _ => unreachable!(),
    }
}

fn build(alg: usize, limit: u64, tol: Tolerance) -> (Policy, u64) {
    // Buckets: `limit` per second with burst `limit` (exact intervals for
    // the counts used); windows: `limit` per second.
    let rate = Rate::per_second(limit);
    let window = Window::per_second(limit);
    let (p, unit) = match alg {
        0 => (Policy::token_bucket(rate), SEC / limit),
        1 => (Policy::leaky_bucket(rate), SEC / limit),
        2 => (Policy::fixed_window(window), SEC),
        3 => (Policy::sliding_window_counter(window), SEC),
        _ => (Policy::sliding_window_log(window), SEC),
    };
    (p.soft(tol), unit)
}

fn tolerance() -> impl Strategy<Value = Tolerance> {
    prop_oneof![
        (0u64..6).prop_map(Tolerance::Units),
        (0u32..150).prop_map(Tolerance::Percent),
    ]
}

/// Admissions: (time, cost, above the limit).
type Admitted = Vec<(u64, u64, bool)>;

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    /// Every decision equals the model's: allowed, above the limit, the
    /// nominal limit and remaining. Then the bounds hold over what passed.
    #[test]
    fn soft_limits_match_the_model_and_keep_their_bounds(
        alg in 0usize..5,
        limit in prop::sample::select(vec![1u64, 2, 4, 5, 8, 10]),
        tol in tolerance(),
        ops in prop::collection::vec((0u64..1500, 0u8..2, 1u64..16), 1..80),
    ) {
        let (policy, unit) = build(alg, limit, tol);
        let cap = policy.soft_limit();
        prop_assert_eq!(cap, limit + tol.units(limit));
        let clock = ManualClock::new();
        let l = KeyedPolicyLimiter::<u8, _>::builder(policy).clock(clock.clone()).build().unwrap();
        let mut models: HashMap<u8, KeyModel> = HashMap::new();
        let mut admitted: HashMap<u8, Admitted> = HashMap::new();
        for (dt_ms, key, n) in ops {
            clock.advance(Duration::from_millis(dt_ms));
            let t = l.now();
            let got = l.check_key_n(&key, n);
            if n > cap {
                prop_assert!(got.is_err(), "cost {} above {}", n, cap);
                continue;
            }
            let d = got.unwrap();
            let m = models.entry(key).or_default();
            let (allowed, above, remaining) =
                model_step(policy.algorithm(), m, t, n, limit, cap, unit);
            prop_assert_eq!(
                (d.is_allowed(), d.is_above_limit(), d.limit(), d.remaining()),
                (allowed, above, limit, remaining),
                "t={} key={} n={}", t, key, n
            );
            if allowed {
                admitted.entry(key).or_default().push((t, n, above));
            }
        }
        for adm in admitted.values() {
            check_bounds(policy.algorithm(), adm, limit, cap, unit)?;
        }
    }
}

/// The documented bounds of a soft limit with nominal limit `limit` and
/// widened capacity `cap`: everything admitted stays within the widened
/// algorithm's bound, and what is not marked within the nominal one.
fn check_bounds(
    alg: PolicyAlgorithm,
    adm: &Admitted,
    limit: u64,
    cap: u64,
    unit: u64,
) -> Result<(), TestCaseError> {
    match alg {
        PolicyAlgorithm::TokenBucket | PolicyAlgorithm::LeakyBucket => {
            // In [t_i, t_j]: at most cap + d/T in all, limit + d/T unmarked.
            for i in 0..adm.len() {
                let (mut all, mut nominal) = (0u64, 0u64);
                for &(tj, n, above) in &adm[i..] {
                    all += n;
                    nominal += if above { 0 } else { n };
                    let refill = (tj - adm[i].0) / unit;
                    prop_assert!(all <= cap + refill, "{} > {} + {}", all, cap, refill);
                    prop_assert!(
                        nominal <= limit + refill,
                        "{} > {} + {}",
                        nominal,
                        limit,
                        refill
                    );
                }
            }
        }
        PolicyAlgorithm::SlidingWindowLog => {
            // Every rolling window (t - W, t]: at most cap.
            for &(t, ..) in adm {
                let sum: u64 = adm
                    .iter()
                    .filter(|&&(s, ..)| s <= t && s + unit > t)
                    .map(|&(_, n, _)| n)
                    .sum();
                prop_assert!(sum <= cap, "{} in the window ending at {}", sum, t);
            }
        }
        _ => {
            // Every aligned window: at most cap, and at most limit unmarked.
            let mut per: HashMap<u64, (u64, u64)> = HashMap::new();
            for &(t, n, above) in adm {
                let e = per.entry(t / unit).or_default();
                e.0 += n;
                e.1 += if above { 0 } else { n };
            }
            for (w, (all, nominal)) in per {
                prop_assert!(
                    all <= cap && nominal <= limit,
                    "window {}: {} / {}",
                    w,
                    all,
                    nominal
                );
            }
        }
    }
    Ok(())
}

#[test]
fn the_issue_example_lets_ten_percent_over_and_marks_it() {
    let policy: Policy = "100/min fixed-window soft 10%".parse().unwrap();
    let clock = ManualClock::new();
    let l = KeyedPolicyLimiter::<&str, _>::builder(policy)
        .clock(clock.clone())
        .build()
        .unwrap();
    let d: Vec<_> = (0..120).map(|_| l.check_key("alice")).collect();
    let allowed = d.iter().filter(|d| d.is_allowed()).count();
    let above = d.iter().filter(|d| d.is_above_limit()).count();
    assert_eq!((allowed, above), (110, 10));
    assert!(d[..100].iter().all(|d| !d.is_above_limit()));
    assert!(d[100..110]
        .iter()
        .all(|d| d.is_above_limit() && d.remaining() == 0));
    assert!(d.iter().all(|d| d.limit() == 100));
    assert_eq!(
        d[99].ratelimit_header("api", &policy).unwrap(),
        "\"api\";r=0;t=60"
    );
    assert_eq!(d[110].retry_after(), Duration::from_secs(60));
    clock.advance(Duration::from_secs(60));
    assert!(!l.check_key("alice").is_above_limit());
}

#[test]
fn multi_limit_checks_carry_the_mark() {
    let clock = ManualClock::new();
    let soft = KeyedPolicyLimiter::<u8, _>::builder("2/min fixed-window soft 1".parse().unwrap())
        .clock(clock.clone())
        .build()
        .unwrap();
    let hard = KeyedPolicyLimiter::<u8, _>::builder("10/min".parse().unwrap())
        .clock(clock)
        .build()
        .unwrap();
    let marks: Vec<_> = (0..4)
        .map(|_| {
            let d = check_all(&[&hard.with_key(&1), &soft.with_key(&1)]);
            (d.is_allowed(), d.is_above_limit())
        })
        .collect();
    assert_eq!(
        marks,
        [(true, false), (true, false), (true, true), (false, false)]
    );
    // check_each reports the mark on the soft limit's own decision.
    let mut ds = [None; 2];
    assert!(check_each(&[(&hard.with_key(&2), 1), (&soft.with_key(&2), 3)], &mut ds).unwrap());
    let [h, s] = ds.map(Option::unwrap);
    assert!(!h.is_above_limit() && s.is_above_limit());
    assert_eq!((s.limit(), s.remaining()), (2, 0));
    // The denied 4th call above gave back what the hard limit took.
    assert_eq!(hard.peek_key(&1).remaining(), 6);
}

#[test]
fn a_cost_up_to_the_soft_limit_is_admitted_not_an_error() {
    let l = KeyedPolicyLimiter::<u8, _>::builder(
        Policy::token_bucket(Rate::per_second(10)).soft(Tolerance::Units(5)),
    )
    .clock(ManualClock::new())
    .build()
    .unwrap();
    let d = l.check_key_n(&1, 15).unwrap();
    assert!(d.is_allowed() && d.is_above_limit());
    assert_eq!(l.check_key_n(&1, 16).unwrap_err().capacity, 15);
}

#[test]
fn a_soft_policy_keeps_its_quota_and_says_why() {
    let l = KeyedPolicyLimiter::<u8, _>::builder("10/s soft 2".parse().unwrap())
        .clock(ManualClock::new())
        .build()
        .unwrap();
    let err = l.set_quota("20/s".parse().unwrap()).unwrap_err();
    assert!(matches!(err, ratewall::ConfigError::Incompatible { .. }));
    assert!(err.to_string().contains("soft"), "{err}");
    assert_eq!(l.policy().to_string(), "10/s soft 2");
    assert_eq!(l.check_key_n(&1, 12).unwrap().limit(), 10);
}
