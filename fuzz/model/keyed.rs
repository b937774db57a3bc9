//! Keyed and multi-limit targets.
//!
//! Keyed: a token bucket per key in a table of 1 to 4 keys (up to 6 keys in
//! play), under every `WhenFull` policy, so reclaim, eviction and the full
//! table run constantly. Which key an eviction picks depends on the table's
//! layout, which the documentation leaves open, so the model keeps, per key,
//! the set of states the key may be in: its own history, and after an
//! eviction elsewhere also "fresh" (evicted). Every decision must match one
//! of them; a key that is certainly active must never be treated as new.
//! Checked after every step: `len() <= max_keys`, and every certainly active
//! key is counted by `len()`.
//!
//! Multi: `check_all_n` over a keyed limiter (roomy table: exact), and two
//! token buckets, all on one clock; each limiter keeps its own view of time.
//! The model: all or nothing, and the most restrictive decision.

use super::gcra::{keyed_quota, keyed_time, keyed_unit, Bucket, Quota};
use super::{assert_decision, Dec, RateSpec, SmallRate, TimeModel, TimeOp, MAX_STEPS};
use arbitrary::{Arbitrary, Unstructured};
use ratewall::{
    check_all_n, Decision, InsufficientCapacity, KeyedTokenBucket, Limit, ManualClock, TokenBucket,
    Tracking, WhenFull,
};

const KEYS: u8 = 6;

#[derive(Arbitrary, Clone, Copy, Debug)]
enum Policy {
    Reject,
    Admit,
    Evict,
}

#[derive(Arbitrary, Clone, Copy, Debug)]
enum KeyedOp {
    Check { key: u8, n: u8 },
    Peek { key: u8, n: u8 },
    Refund { key: u8, n: u8 },
    Reset { key: u8 },
    Time(TimeOp),
    SetQuota(SmallRate),
}

/// The states a key may be in (TATs, with any TAT <= now written as 0: such
/// a key behaves exactly as a fresh one).
#[derive(Clone, Debug)]
struct Maybe(Vec<u128>);

impl Maybe {
    fn normalize(&mut self, t: u128) {
        for tat in &mut self.0 {
            if *tat <= t {
                *tat = 0;
            }
        }
        self.0.sort_unstable();
        self.0.dedup();
    }
    fn certainly_active(&self) -> bool {
        !self.0.contains(&0)
    }
    fn possibly_active(&self) -> bool {
        self.0.iter().any(|&t| t != 0)
    }
}

fn decide(q: Quota, tat: u128, t: u128, n: u64, consume: bool) -> (Option<Dec>, u128) {
    let mut b = Bucket { quota: q, tat };
    let d = b.check(t, n, consume);
    (d, b.tat)
}

fn fields(d: &Decision) -> Dec {
    Dec {
        allowed: d.is_allowed(),
        limit: d.limit(),
        remaining: d.remaining(),
        retry_ns: d.retry_after().as_nanos(),
        reset_ns: d.reset_after().as_nanos(),
    }
}

/// The keyed target.
pub fn run_keyed(data: &[u8]) {
    let mut u = Unstructured::new(data);
    let (Ok(spec), Ok(max_keys), Ok(policy)) = (
        SmallRate::arbitrary(&mut u),
        u.int_in_range(1..=4usize),
        Policy::arbitrary(&mut u),
    ) else {
        return;
    };
    let Ok(q) = spec.model() else {
        return; // validation is the config target's job
    };
    // The keyed table's documented precision: its time unit and the
    // quota in whole units (exact, `unit == 1`, for burst windows up to
    // 2^36 ns); a quota it cannot hold is refused.
    let unit = keyed_unit(&q);
    let clock = ManualClock::new();
    let built = KeyedTokenBucket::<u8, _>::builder(spec.rate())
        .max_keys(max_keys)
        .when_full(match policy {
            Policy::Reject => WhenFull::RejectNew,
            Policy::Admit => WhenFull::AdmitUntracked,
            Policy::Evict => WhenFull::EvictLeastRecent,
        })
        .seed(7)
        .clock(clock.clone())
        .build();
    let Some(mut q) = keyed_quota(q, unit) else {
        assert!(
            matches!(built, Err(ratewall::ConfigError::KeyedSlot { .. })),
            "{spec:?}: {built:?}"
        );
        return;
    };
    let real = built.expect("a valid rate and max_keys build");
    let mut time = TimeModel::default();
    let mut keys: Vec<Maybe> = (0..KEYS).map(|_| Maybe(vec![0])).collect();
    for step in 0..MAX_STEPS {
        if u.is_empty() {
            break;
        }
        let Ok(op) = KeyedOp::arbitrary(&mut u) else {
            break;
        };
        let ctx = (step, op, policy, max_keys, time, keys.clone());
        if std::env::var_os("RATEWALL_FUZZ_TRACE").is_some() {
            eprintln!("{ctx:?}");
        }
        match op {
            KeyedOp::Check { key, n } | KeyedOp::Peek { key, n } => {
                let consume = matches!(op, KeyedOp::Check { .. });
                let (key, n) = (key % KEYS, u64::from(n));
                let got = if consume {
                    real.check_key_n(&key, n)
                } else {
                    real.peek_key_n(&key, n)
                };
                let t = keyed_time(time.read(), unit);
                for m in keys.iter_mut() {
                    m.normalize(t);
                }
                let d = match got {
                    Err(e) => {
                        assert!(n > q.burst, "at {ctx:?}: {e:?}");
                        assert_eq!(
                            e,
                            InsufficientCapacity {
                                requested: n,
                                capacity: q.burst
                            }
                        );
                        continue;
                    }
                    Ok(d) => d,
                };
                let k = key as usize;
                let fresh = decide(q, 0, t, n, consume);
                let was_new = || {
                    assert!(
                        !keys[k].certainly_active(),
                        "at {ctx:?}: an active key was treated as new: {d:?}"
                    );
                    assert!(
                        keys.iter()
                            .enumerate()
                            .any(|(i, m)| i != k && m.possibly_active()),
                        "at {ctx:?}: full-table policy with no other active key: {d:?}"
                    );
                };
                match d.tracking() {
                    Tracking::Tracked => {
                        let next: Vec<u128> = keys[k]
                            .0
                            .iter()
                            .filter_map(|&tat| {
                                let (m, next) = decide(q, tat, t, n, consume);
                                (m == Some(fields(&d))).then_some(next)
                            })
                            .collect();
                        assert!(
                            !next.is_empty(),
                            "at {ctx:?}: {d:?} matches no state the key may be in"
                        );
                        keys[k] = Maybe(next);
                    }
                    Tracking::EvictedOther => {
                        assert!(matches!(policy, Policy::Evict), "at {ctx:?}: {d:?}");
                        was_new();
                        assert_eq!(fields(&d), fresh.0.unwrap(), "evicting at {ctx:?}");
                        keys[k] = Maybe(vec![fresh.1]);
                        // A peek predicts an eviction without making it.
                        for (i, m) in keys.iter_mut().enumerate() {
                            if consume && i != k && !m.0.contains(&0) {
                                m.0.push(0); // may be the one evicted
                            }
                        }
                    }
                    Tracking::Untracked => {
                        assert!(matches!(policy, Policy::Admit), "at {ctx:?}: {d:?}");
                        was_new();
                        let want = fresh.0.unwrap();
                        assert_eq!(fields(&d), want, "untracked at {ctx:?}");
                        keys[k] = Maybe(vec![0]);
                    }
                    Tracking::Rejected => {
                        assert!(!matches!(policy, Policy::Admit), "at {ctx:?}: {d:?}");
                        was_new();
                        assert!(!d.is_allowed() && d.remaining() == 0, "at {ctx:?}: {d:?}");
                        assert_eq!(d.limit(), q.burst, "at {ctx:?}");
                        assert!(d.retry_after_secs() >= 1, "at {ctx:?}: {d:?}");
                        keys[k] = Maybe(vec![0]);
                    }
                    other => panic!("at {ctx:?}: unknown tracking {other:?}"),
                }
            }
            KeyedOp::Refund { key, n } => {
                let key = key % KEYS;
                real.refund_key(&key, n.into());
                let t = keyed_time(time.read(), unit);
                for m in keys.iter_mut() {
                    // Idle keys may be swept (their words rewritten) at
                    // any entry point: they behave as fresh ones.
                    m.normalize(t);
                }
                let m = &mut keys[key as usize];
                for tat in &mut m.0 {
                    let mut b = Bucket {
                        quota: q,
                        tat: *tat,
                    };
                    b.refund(t, n.into());
                    *tat = b.tat;
                }
            }
            KeyedOp::Reset { key } => {
                real.reset_key(&(key % KEYS));
                keys[(key % KEYS) as usize] = Maybe(vec![0]);
            }
            KeyedOp::Time(op) => op.apply(&clock, &mut time),
            KeyedOp::SetQuota(r) => match (
                real.set_quota(r.rate()),
                r.model().map(|new| keyed_quota(new, unit)),
            ) {
                (Err(ratewall::ConfigError::KeyedSlot { .. }), Ok(None)) => {}
                (Ok(()), Ok(Some(new))) => {
                    // Every key keeps its tokens in use, rescaled.
                    let t = keyed_time(time.read(), unit);
                    for m in keys.iter_mut() {
                        m.normalize(t);
                        for tat in &mut m.0 {
                            let mut b = Bucket {
                                quota: q,
                                tat: *tat,
                            };
                            b.set_quota(t, new);
                            // A rescaled TAT is a fraction of the old one:
                            // the slot rounds it up to whole units.
                            *tat = b.tat.div_ceil(unit) * unit;
                        }
                    }
                    q = new;
                }
                (Err(e), Err(v)) => assert!(v.contains(&e), "at {ctx:?}: {e:?} not in {v:?}"),
                (got, want) => panic!("at {ctx:?}: set_quota {got:?}, model {want:?}"),
            },
        }
        let len = real.len();
        assert!(len <= max_keys, "len {len} > max_keys at {ctx:?}");
        let sure = keys.iter().filter(|m| m.certainly_active()).count();
        assert!(
            len >= sure,
            "len {len} but {sure} keys are certainly active at {ctx:?}"
        );
    }
}

#[derive(Arbitrary, Clone, Copy, Debug)]
enum MultiOp {
    /// `check_all_n` over `order` (a permutation pick) of the three limits.
    CheckAll {
        key: u8,
        n: u8,
        order: u8,
    },
    /// A direct check on one limit, so the limits drift apart.
    CheckOne {
        which: u8,
        key: u8,
        n: u8,
    },
    Time(TimeOp),
}

/// The multi-limit target.
pub fn run_multi(data: &[u8]) {
    let mut u = Unstructured::new(data);
    let Ok(specs) = <[SmallRate; 3]>::arbitrary(&mut u) else {
        return;
    };
    let Ok(mut quotas) = specs
        .iter()
        .map(|s| s.model())
        .collect::<Result<Vec<_>, _>>()
    else {
        return;
    };
    let clock = ManualClock::new();
    let built = KeyedTokenBucket::<u8, _>::builder(specs[0].rate())
        .max_keys(64)
        .seed(7)
        .clock(clock.clone())
        .build();
    // The keyed limit runs in its table's time unit (its documented
    // precision); the buckets are exact.
    let units = [keyed_unit(&quotas[0]), 1, 1];
    let Some(kq) = keyed_quota(quotas[0], units[0]) else {
        assert!(matches!(
            built,
            Err(ratewall::ConfigError::KeyedSlot { .. })
        ));
        return;
    };
    quotas[0] = kq;
    let keyed = built.unwrap();
    let a = TokenBucket::with_clock(specs[1].rate(), clock.clone()).unwrap();
    let b = TokenBucket::with_clock(specs[2].rate(), clock.clone()).unwrap();
    // Model: per-key TATs for the keyed limit, one TAT per bucket, and each
    // limiter's own high-water mark of the readings it used.
    let mut keyed_tat = [0u128; 4];
    let mut tats = [0u128; 2];
    let mut floors = [0u64; 3];
    let mut clock_model = TimeModel::default();
    for step in 0..MAX_STEPS {
        if u.is_empty() {
            break;
        }
        let Ok(op) = MultiOp::arbitrary(&mut u) else {
            break;
        };
        let ctx = (step, op, clock_model, floors, keyed_tat, tats);
        if std::env::var_os("RATEWALL_FUZZ_TRACE").is_some() {
            eprintln!("{ctx:?}");
        }
        match op {
            MultiOp::Time(op) => op.apply(&clock, &mut clock_model),
            MultiOp::CheckOne { which, key, n } => {
                let (which, key, n) = (which % 3, key % 4, u64::from(n));
                let i = which as usize;
                let got = match which {
                    0 => keyed.check_key_n(&key, n),
                    1 => a.check_n(n),
                    _ => b.check_n(n),
                };
                floors[i] = floors[i].max(clock_model.clock);
                let t = keyed_time(u128::from(floors[i]).min(super::HORIZON), units[i]);
                let tat = if i == 0 {
                    &mut keyed_tat[key as usize]
                } else {
                    &mut tats[i - 1]
                };
                let (want, next) = decide(quotas[i], *tat, t, n, true);
                *tat = next;
                match (got, want) {
                    (Ok(d), Some(m)) => assert_decision(&d, &m, &ctx),
                    (Err(_), None) => {}
                    (got, want) => panic!("at {ctx:?}: {got:?} vs {want:?}"),
                }
            }
            MultiOp::CheckAll { key, n, order } => {
                let (key, n) = (key % 4, u64::from(n));
                let by_key = keyed.with_key(&key);
                let limits: [&dyn Limit<ManualClock>; 3] = [&by_key, &a, &b];
                let perm: [usize; 3] = match order % 6 {
                    0 => [0, 1, 2],
                    1 => [0, 2, 1],
                    2 => [1, 0, 2],
                    3 => [1, 2, 0],
                    4 => [2, 0, 1],
                    _ => [2, 1, 0],
                };
                let ordered: Vec<&dyn Limit<ManualClock>> =
                    perm.iter().map(|&i| limits[i]).collect();
                let got = check_all_n(&ordered, n);
                // Documented: a cost some limit can never admit is an error,
                // found before anything is read or taken: no clock is read,
                // no mark moves, no state changes.
                let too_big: Vec<u64> = perm
                    .iter()
                    .map(|&i| quotas[i].burst)
                    .filter(|&cap| n > cap)
                    .collect();
                if !too_big.is_empty() {
                    match got {
                        Err(e) => {
                            assert_eq!(e.requested, n, "at {ctx:?}");
                            assert!(too_big.contains(&e.capacity), "at {ctx:?}: {e:?}");
                        }
                        Ok(d) => panic!(
                            "at {ctx:?}: cost {n} exceeds a capacity ({too_big:?}) but check_all_n says {d:?}"
                        ),
                    }
                    continue;
                }
                // One read of the first limit's clock serves all of them.
                let first = perm[0];
                floors[first] = floors[first].max(clock_model.clock);
                let now = floors[first];
                // Each limit evaluates at max(its own mark, now); it records
                // `now` only if the call reaches it (updated below).
                let marks = floors;
                let tat_of = |i: usize| {
                    if i == 0 {
                        keyed_tat[key as usize]
                    } else {
                        tats[i - 1]
                    }
                };
                let t_of = |i: usize| {
                    keyed_time(u128::from(marks[i].max(now)).min(super::HORIZON), units[i])
                };
                // All or nothing, most restrictive (every cost fits here).
                let parts: Vec<Option<Dec>> = perm
                    .iter()
                    .map(|&i| decide(quotas[i], tat_of(i), t_of(i), n, false).0)
                    .collect();
                for &i in &perm {
                    floors[i] = floors[i].max(now);
                }
                let fold = |ds: &[Dec]| Dec {
                    allowed: ds.iter().all(|d| d.allowed),
                    limit: 0, // checked separately: ties may pick any limit's
                    remaining: ds.iter().map(|d| d.remaining).min().unwrap(),
                    retry_ns: ds
                        .iter()
                        .filter(|d| !d.allowed)
                        .map(|d| d.retry_ns)
                        .max()
                        .unwrap_or(0),
                    reset_ns: ds.iter().map(|d| d.reset_ns).max().unwrap(),
                };
                let ds: Vec<Dec> = parts.iter().map(|p| p.unwrap()).collect();
                let allowed = ds.iter().all(|d| d.allowed);
                let want = fold(&ds);
                let d = got.unwrap_or_else(|e| panic!("at {ctx:?}: {e:?}"));
                let mut seen = fields(&d);
                assert!(
                    perm.iter().any(|&i| quotas[i].burst == seen.limit),
                    "at {ctx:?}: limit {} is none of the limits'",
                    seen.limit
                );
                seen.limit = 0;
                assert_eq!(seen, want, "check_all_n at {ctx:?}: parts {ds:?}");
                if allowed && n > 0 {
                    let nexts: Vec<(usize, u128)> = perm
                        .iter()
                        .map(|&i| (i, decide(quotas[i], tat_of(i), t_of(i), n, true).1))
                        .collect();
                    for (i, next) in nexts {
                        if i == 0 {
                            keyed_tat[key as usize] = next;
                        } else {
                            tats[i - 1] = next;
                        }
                    }
                }
            }
        }
    }
}
