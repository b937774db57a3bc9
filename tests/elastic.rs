//! Elastic limits against a reference model on a `ManualClock`: the
//! protocol's decisions, the guarantee of every key while others drain the
//! pool, the bound on the total, and the pool following a capacity signal.

use proptest::prelude::*;
use ratewall::{ElasticLimiter, KeyedPolicyLimiter, ManualClock, Policy, Rate, Window};
use std::collections::HashMap;
use std::time::Duration;

const SEC: u64 = 1_000_000_000;

/// One limit of the model: a GCRA bucket (burst = count per second) or a
/// fixed window of one second, with its plain rule.
#[derive(Clone, Copy, Debug)]
struct Model {
    bucket: bool,
    cap: u64,
}

#[derive(Clone, Copy, Debug, Default)]
struct State {
    tat: u64,
    window: u64,
    count: u64,
}

impl Model {
    fn emission(&self) -> u64 {
        SEC.div_ceil(self.cap)
    }
    /// The state after admitting `n` at `t`, or `None` if denied.
    fn step(&self, s: State, t: u64, n: u64) -> Option<State> {
        if self.bucket {
            let used = s.tat.saturating_sub(t) + n * self.emission();
            (used <= self.cap * self.emission()).then_some(State { tat: t + used, ..s })
        } else {
            let count = if t / SEC == s.window { s.count } else { 0 };
            (count + n <= self.cap).then_some(State {
                window: t / SEC,
                count: count + n,
                ..s
            })
        }
    }
    fn policy(&self) -> Policy {
        if self.bucket {
            Policy::token_bucket(Rate::per_second(self.cap))
        } else {
            Policy::fixed_window(Window::per_second(self.cap))
        }
    }
}

/// The elastic protocol over three model limits.
struct Elastic {
    g: Model,
    h: Model,
    p: Model,
    gs: HashMap<u8, State>,
    hs: HashMap<u8, State>,
    ps: State,
}

#[derive(Debug, PartialEq, Eq, Clone, Copy)]
enum Outcome {
    Error,
    Denied,
    Guaranteed,
    Pool,
}

impl Elastic {
    fn new(bucket: bool, g: u64, h: u64, p: u64) -> Self {
        Elastic {
            g: Model { bucket, cap: g },
            h: Model { bucket, cap: h },
            p: Model { bucket, cap: p },
            gs: HashMap::new(),
            hs: HashMap::new(),
            ps: State::default(),
        }
    }
    fn limiter(&self, clock: &ManualClock) -> ElasticLimiter<u8, ManualClock> {
        let ceiling = Model {
            cap: self.g.cap + self.h.cap,
            ..self.g
        };
        ElasticLimiter::<u8, _>::builder(self.g.policy(), ceiling.policy(), self.p.policy())
            .max_keys(16)
            .clock(clock.clone())
            .build()
            .unwrap()
    }
    fn check(&mut self, key: u8, t: u64, n: u64) -> Outcome {
        if n > self.g.cap.max(self.h.cap.min(self.p.cap)) {
            return Outcome::Error;
        }
        let g = self.gs.entry(key).or_default();
        if let Some(next) = self.g.step(*g, t, n) {
            *g = next;
            return Outcome::Guaranteed;
        }
        let h = self.hs.entry(key).or_default();
        match (self.h.step(*h, t, n), self.p.step(self.ps, t, n)) {
            (Some(hn), Some(pn)) => {
                *h = hn;
                self.ps = pn;
                Outcome::Pool
            }
            _ => Outcome::Denied,
        }
    }
}

fn outcome(r: Result<ratewall::Decision, ratewall::InsufficientCapacity>) -> Outcome {
    match r {
        Err(_) => Outcome::Error,
        Ok(d) if !d.is_allowed() => Outcome::Denied,
        Ok(d) if d.is_above_limit() => Outcome::Pool,
        Ok(_) => Outcome::Guaranteed,
    }
}

fn counts() -> impl Strategy<Value = u64> {
    prop::sample::select(vec![1u64, 2, 4, 5])
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    /// Every decision is the protocol's: guaranteed, from the pool (marked
    /// above the limit, nominal limit = the guarantee), denied, or an error.
    /// Then the bounds: per key at most the ceiling, in all at most the
    /// guarantees of the keys in use plus the pool.
    #[test]
    fn elastic_matches_the_protocol_and_keeps_its_bounds(
        bucket in any::<bool>(),
        g in counts(), h in counts(), p in counts(),
        ops in prop::collection::vec((0u64..700, 0u8..3, 1u64..6), 1..80),
    ) {
        let mut model = Elastic::new(bucket, g, h, p);
        let clock = ManualClock::new();
        let l = model.limiter(&clock);
        let mut admitted: Vec<(u64, u8, u64, Outcome)> = Vec::new();
        for (dt, key, n) in ops {
            clock.advance(Duration::from_millis(dt));
            let t = l.now();
            let got = l.check_key_n(&key, n);
            if let Ok(d) = got {
                prop_assert_eq!(d.limit(), g);
            }
            let want = model.check(key, t, n);
            prop_assert_eq!(outcome(got), want, "t={} key={} n={}", t, key, n);
            if matches!(want, Outcome::Guaranteed | Outcome::Pool) {
                admitted.push((t, key, n, want));
            }
        }
        let emission = |c: u64| SEC.div_ceil(c);
        for i in 0..admitted.len() {
            let t0 = admitted[i].0;
            let mut per_key: HashMap<u8, u64> = HashMap::new();
            let mut total = 0;
            for &(t, key, n, _) in &admitted[i..] {
                *per_key.entry(key).or_default() += n;
                total += n;
                let d = t - t0;
                let (key_bound, total_bound) = if bucket {
                    (
                        g + d / emission(g) + h + d / emission(h),
                        per_key.len() as u64 * (g + d / emission(g)) + p + d / emission(p),
                    )
                } else if t / SEC == t0 / SEC {
                    (g + h, per_key.len() as u64 * g + p)
                } else {
                    continue;
                };
                prop_assert!(per_key[&key] <= key_bound, "key {} over its ceiling", key);
                prop_assert!(total <= total_bound, "{} > {}", total, total_bound);
            }
        }
    }

    /// All five algorithms: key 1 gets through its guarantee exactly what a
    /// standalone guarantee limiter admits from its requests, whatever keys 2
    /// and 3 do to the pool at the same times; and the total admitted stays
    /// within the guarantees of the keys in use plus the pool.
    #[test]
    fn every_key_gets_its_guarantee_while_others_drain_the_pool(
        alg in 0usize..5,
        g in counts(), h in counts(), p in counts(),
        ops in prop::collection::vec((0u64..400, 1u8..4, 1u64..4), 1..120),
    ) {
        let policy = |cap: u64| {
            let (r, w) = (Rate::per_second(cap), Window::per_second(cap));
            match alg {
                0 => Policy::token_bucket(r),
                1 => Policy::leaky_bucket(r),
                2 => Policy::fixed_window(w),
                3 => Policy::sliding_window_counter(w),
                _ => Policy::sliding_window_log(w),
            }
        };
        let clock = ManualClock::new();
        let l = ElasticLimiter::<u8, _>::builder(policy(g), policy(g + h), policy(p))
            .max_keys(16)
            .clock(clock.clone())
            .build()
            .unwrap();
        let alone = KeyedPolicyLimiter::<u8, _>::builder(policy(g))
            .max_keys(16)
            .clock(clock.clone())
            .build()
            .unwrap();
        let mut admitted: Vec<(u64, u8, u64)> = Vec::new();
        for (dt, key, n) in ops {
            clock.advance(Duration::from_millis(dt));
            let t = l.now();
            let d = l.check_key_n(&key, n.min(g)).unwrap();
            if key == 1 {
                let reference = alone.check_key_n(&1, n.min(g)).unwrap();
                prop_assert_eq!(
                    d.is_allowed() && !d.is_above_limit(),
                    reference.is_allowed(),
                    "t={} n={}: {:?} vs alone {:?}", t, n, d, reference
                );
            }
            if d.is_allowed() {
                admitted.push((t, key, n.min(g)));
            }
        }
        // Every interval [t_i, t_j] (buckets), aligned window (fixed and
        // sliding counter) or rolling window (log).
        let refill = |cap: u64, d: u64| if alg < 2 { d / SEC.div_ceil(cap) } else { 0 };
        for i in 0..admitted.len() {
            let t0 = admitted[i].0;
            let mut keys = std::collections::HashSet::new();
            let mut total = 0;
            for &(t, key, n) in &admitted[i..] {
                let same = match alg {
                    0 | 1 => true,
                    2 | 3 => t / SEC == t0 / SEC,
                    _ => t - t0 < SEC,
                };
                if !same {
                    break;
                }
                keys.insert(key);
                total += n;
                let d = t - t0;
                let bound = keys.len() as u64 * (g + refill(g, d)) + p + refill(p, d);
                prop_assert!(total <= bound, "{} > {} from t={}", total, bound, t0);
            }
        }
    }

    /// The pool follows a capacity signal: between two quota changes, the
    /// pool admits at most the quota in force per window; guarantees are
    /// untouched by the changes.
    #[test]
    fn the_pool_follows_a_capacity_signal(
        ops in prop::collection::vec(
            prop_oneof![
                (0u64..700, 0u8..3, 1u64..3).prop_map(|(dt, k, n)| (dt, Some((k, n)), None)),
                (0u64..300, 1u64..9).prop_map(|(dt, cap)| (dt, None, Some(cap))),
            ],
            1..100,
        ),
    ) {
        let clock = ManualClock::new();
        let l = ElasticLimiter::<u8, _>::builder(
            "2/s fixed-window".parse().unwrap(),
            "4/s fixed-window".parse().unwrap(),
            "4/s fixed-window".parse().unwrap(),
        )
        .max_keys(16)
        .clock(clock.clone())
        .build()
        .unwrap();
        let mut segment = 0u64;
        let mut pool_used: HashMap<(u64, u64), u64> = HashMap::new();
        let mut guaranteed: HashMap<(u64, u8), u64> = HashMap::new();
        let mut caps = vec![4u64];
        for (dt, check, set) in ops {
            clock.advance(Duration::from_millis(dt));
            let window = l.now() / SEC;
            if let Some(new_cap) = set {
                l.set_pool(Policy::fixed_window(Window::per_second(new_cap))).unwrap();
                prop_assert_eq!(l.pool(), Policy::fixed_window(Window::per_second(new_cap)));
                segment += 1;
                caps.push(new_cap);
            }
            if let Some((key, n)) = check {
                let d = l.check_key_n(&key, n).unwrap();
                if d.is_above_limit() {
                    *pool_used.entry((window, segment)).or_default() += n;
                } else if d.is_allowed() {
                    *guaranteed.entry((window, key)).or_default() += n;
                } else {
                    // Denied with the guarantee used up: 2 per window.
                    prop_assert!(guaranteed.get(&(window, key)).copied().unwrap_or(0) + n > 2);
                }
            }
        }
        for ((w, s), used) in pool_used {
            prop_assert!(used <= caps[s as usize], "window {} segment {}: {} > {}", w, s, used, caps[s as usize]);
        }
    }
}

#[test]
fn a_denial_takes_nothing_from_the_headroom_or_the_pool() {
    let clock = ManualClock::new();
    let l = ElasticLimiter::<u8, _>::builder(
        "1/h fixed-window".parse().unwrap(),
        "3/h fixed-window".parse().unwrap(),
        "1/h fixed-window".parse().unwrap(),
    )
    .clock(clock)
    .build()
    .unwrap();
    assert!(l.check_key(&1).is_allowed()); // key 1: guarantee
    assert!(l.check_key(&2).is_allowed()); // key 2: guarantee
    assert!(l.check_key(&2).is_above_limit()); // key 2 takes the pool's unit
                                               // Key 1 is above its guarantee, its headroom allows, the pool denies:
                                               // the headroom's unit comes back.
    let d = l.check_key(&1);
    assert!(!d.is_allowed());
    assert_eq!(d.retry_after(), Duration::from_secs(3600));
    l.set_pool("4/h fixed-window".parse().unwrap()).unwrap();
    // The pool has 3 more units; key 1's headroom (2) is intact: two pass,
    // then the headroom (not the pool) denies.
    assert!(l.check_key(&1).is_above_limit());
    assert!(l.check_key(&1).is_above_limit());
    assert!(!l.check_key(&1).is_allowed());
    assert!(l.peek_pool().is_allowed());
}

#[test]
fn a_cost_the_guarantee_cannot_hold_may_still_pass_from_the_pool() {
    let l = ElasticLimiter::<u8, _>::builder(
        "2/h".parse().unwrap(),
        "10/h".parse().unwrap(),
        "6/h".parse().unwrap(),
    )
    .clock(ManualClock::new())
    .build()
    .unwrap();
    let d = l.check_key_n(&1, 5).unwrap();
    assert!(d.is_allowed() && d.is_above_limit());
    assert_eq!(
        d.remaining(),
        1,
        "the guarantee is untouched: 1 after a unit"
    );
    assert_eq!(l.check_key_n(&1, 7).unwrap_err().capacity, 6);
    assert!(
        !l.check_key_n(&1, 3).unwrap().is_allowed(),
        "pool has 1 left"
    );
    assert!(l.check_key_n(&1, 2).unwrap().is_allowed());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 150, ..ProptestConfig::default() })]

    /// An elastic limit inside an all-or-nothing multi-limit check, beside a
    /// per-IP limit: a request passes iff both would, and a denial by the
    /// per-IP limit gives back exactly what the elastic limit took (its
    /// guarantee, or its headroom and the pool): every later decision still
    /// matches the model.
    #[test]
    fn elastic_limits_roll_back_inside_multi_limit_checks(
        bucket in any::<bool>(),
        g in counts(), h in counts(), p in counts(), ip_cap in counts(),
        ops in prop::collection::vec((0u64..700, 0u8..3, 0u8..2, 1u64..4), 1..80),
    ) {
        let mut model = Elastic::new(bucket, g, h, p);
        let ip_model = Model { bucket, cap: ip_cap };
        let mut ip_states: HashMap<u8, State> = HashMap::new();
        let clock = ManualClock::new();
        let l = model.limiter(&clock);
        let per_ip = KeyedPolicyLimiter::<u8, _>::builder(ip_model.policy())
            .max_keys(16)
            .clock(clock.clone())
            .build()
            .unwrap();
        for (dt, user, ip, n) in ops {
            clock.advance(Duration::from_millis(dt));
            let t = l.now();
            let n = n.min(g).min(ip_cap);
            let got = ratewall::check_all_n(&[&l.with_key(&user), &per_ip.with_key(&ip)], n)
                .unwrap();
            // The model: both must admit; only then does either state change.
            let snapshot = (model.gs.clone(), model.hs.clone(), model.ps);
            let elastic = model.check(user, t, n);
            let ip_state = ip_states.entry(ip).or_default();
            let ip_next = ip_model.step(*ip_state, t, n);
            let passes = matches!(elastic, Outcome::Guaranteed | Outcome::Pool) && ip_next.is_some();
            if passes {
                *ip_state = ip_next.unwrap();
            } else {
                (model.gs, model.hs, model.ps) = snapshot;
            }
            prop_assert_eq!(got.is_allowed(), passes, "t={} user={} ip={} n={}", t, user, ip, n);
            prop_assert_eq!(got.is_above_limit(), passes && elastic == Outcome::Pool);
        }
    }
}
