//! Multi-limit checks: all or nothing, most restrictive decision, one clock
//! read; a proptest of "a denied request leaves every limiter as if it never
//! came" against a reference model, and a concurrent stress test.

use proptest::prelude::*;
use ratewall::{
    check_all, check_all_n, KeyedTokenBucket, Limit, ManualClock, Rate, TokenBucket, Tracking,
};
use std::sync::Arc;
use std::time::Duration;

const MS: u64 = 1_000_000;

#[test]
fn all_allowed_takes_from_every_limit_and_reports_the_tightest() {
    let clock = ManualClock::new();
    let global = TokenBucket::with_clock(Rate::per_second(100).burst(100), clock.clone()).unwrap();
    let per_user = KeyedTokenBucket::<u32, _>::builder(Rate::per_second(5).burst(5))
        .clock(clock.clone())
        .build()
        .unwrap();
    let d = check_all(&[&per_user.with_key(&1), &global]);
    assert!(d.is_allowed());
    assert_eq!((d.limit(), d.remaining()), (5, 4));
    assert_eq!(global.peek().remaining(), 98);
}

#[test]
fn a_denial_refunds_the_others_and_reports_the_longest_wait() {
    let clock = ManualClock::new();
    let route = TokenBucket::with_clock(Rate::per_second(10).burst(10), clock.clone()).unwrap();
    let user = TokenBucket::with_clock(Rate::per_second(1).burst(1), clock.clone()).unwrap();
    let ip = TokenBucket::with_clock(Rate::per_second(2).burst(1), clock.clone()).unwrap();
    let limits: [&dyn Limit<_>; 3] = [&route, &ip, &user];
    assert!(check_all(&limits).is_allowed());
    let d = check_all(&limits);
    assert!(!d.is_allowed());
    assert_eq!(
        d.retry_after(),
        Duration::from_secs(1),
        "user's wait is the longest"
    );
    assert_eq!(
        route.peek().remaining(),
        8,
        "route gave back the denied request"
    );
    assert_eq!(d.remaining(), 0);
}

#[test]
fn an_impossible_cost_is_an_error_and_takes_nothing() {
    let clock = ManualClock::new();
    let big = TokenBucket::with_clock(Rate::per_second(10).burst(10), clock.clone()).unwrap();
    let small = TokenBucket::with_clock(Rate::per_second(10).burst(2), clock.clone()).unwrap();
    let err = check_all_n::<ManualClock>(&[&big, &small], 3).unwrap_err();
    assert_eq!(err.capacity, 2);
    assert_eq!(big.peek().remaining(), 9);
    assert!(check_all::<ManualClock>(&[]).is_allowed());
}

#[test]
fn an_untracked_keyed_admission_is_not_refunded_into_another_key() {
    let clock = ManualClock::new();
    let per_ip = KeyedTokenBucket::<u32, _>::builder(Rate::per_hour(1))
        .max_keys(1)
        .when_full(ratewall::WhenFull::AdmitUntracked)
        .clock(clock.clone())
        .build()
        .unwrap();
    let deny = TokenBucket::with_clock(Rate::per_hour(1), clock.clone()).unwrap();
    let _ = deny.check();
    let _ = per_ip.check_key(&1);
    let d = check_all(&[&per_ip.with_key(&2), &deny]);
    assert!(!d.is_allowed());
    assert_eq!(per_ip.peek_key(&1).tracking(), Tracking::Tracked);
    assert!(!per_ip.peek_key(&1).is_allowed(), "key 1 keeps its usage");
}

/// More limits than the rollback mask's 64 bits: a denial by the last one
/// gives every earlier limit its unit back, those past the 64th included.
#[test]
fn a_denial_after_more_than_64_limits_rolls_every_one_back() {
    let clock = ManualClock::new();
    let buckets: Vec<TokenBucket<ManualClock>> = (0..70)
        .map(|_| TokenBucket::with_clock(Rate::per_hour(2).burst(2), clock.clone()).unwrap())
        .collect();
    let empty = TokenBucket::with_clock(Rate::per_hour(1), clock.clone()).unwrap();
    let _ = empty.check();
    for deny_at in [63usize, 64, 65, 70] {
        let mut limits: Vec<&dyn Limit<ManualClock>> = Vec::new();
        for b in &buckets[..deny_at] {
            limits.push(b);
        }
        limits.push(&empty);
        for b in &buckets[deny_at..] {
            limits.push(b);
        }
        let d = check_all(&limits);
        assert!(!d.is_allowed());
        for (i, b) in buckets.iter().enumerate() {
            assert_eq!(b.peek().remaining(), 1, "bucket {i}, denial at {deny_at}");
        }
    }
    // All allowed: every one of the 70 takes its unit.
    let limits: Vec<&dyn Limit<ManualClock>> = buckets.iter().map(|b| b as _).collect();
    assert!(check_all(&limits).is_allowed());
    assert!(buckets.iter().all(|b| b.peek().remaining() == 0));
}

/// A key admitted by evicting another is tracked: a later denial gives its
/// unit back.
#[test]
fn an_evicting_keyed_admission_is_rolled_back() {
    let clock = ManualClock::new();
    let per_ip = KeyedTokenBucket::<u32, _>::builder(Rate::per_hour(3).burst(3))
        .max_keys(1)
        .when_full(ratewall::WhenFull::EvictLeastRecent)
        .clock(clock.clone())
        .build()
        .unwrap();
    let deny = TokenBucket::with_clock(Rate::per_hour(1), clock.clone()).unwrap();
    let _ = deny.check();
    let _ = per_ip.check_key(&1);
    let d = check_all(&[&per_ip.with_key(&2), &deny]);
    assert!(!d.is_allowed());
    // Key 2 holds key 1's slot, with its unit given back: a fresh key's peek.
    assert_eq!(per_ip.peek_key(&2).tracking(), Tracking::Tracked);
    assert_eq!(per_ip.peek_key(&2).remaining(), 2);
}

// ---- reference model ----

const T: [u64; 3] = [100 * MS, 250 * MS, 50 * MS];
const B: [u64; 3] = [3, 2, 5];

fn decide(tat: u64, now: u64, n: u64, t: u64, b: u64) -> Option<u64> {
    let used = tat.saturating_sub(now) + n * t;
    (used <= b * t).then_some(now + used)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]
    /// Random multi-checks over three limits (two single, one keyed with
    /// three keys) against a model that applies a request to every limit or
    /// to none. After every step, each limit's peek matches the model.
    #[test]
    fn a_denied_request_leaves_every_limiter_as_if_it_never_came(
        ops in proptest::collection::vec((0u8..8, 0u32..3, 1u64..=2, 0u64..300), 1..80),
    ) {
        let clock = ManualClock::new();
        let a = TokenBucket::with_clock(Rate::new(10, Duration::from_secs(1)).burst(B[0]), clock.clone()).unwrap();
        let b = TokenBucket::with_clock(Rate::new(4, Duration::from_secs(1)).burst(B[1]), clock.clone()).unwrap();
        let k = KeyedTokenBucket::<u32, _>::builder(Rate::new(20, Duration::from_secs(1)).burst(B[2]))
            .max_keys(16)
            .clock(clock.clone())
            .build()
            .unwrap();
        let mut model_a = 0u64;
        let mut model_b = 0u64;
        let mut model_k = [0u64; 3];
        for (mask, key, n, advance_ms) in ops {
            clock.advance(Duration::from_millis(advance_ms));
            let now = clock.now_ns();
            let mask = if mask == 0 { 7 } else { mask };
            let kref = k.with_key(&key);
            let mut limits: Vec<&dyn Limit<ManualClock>> = Vec::new();
            if mask & 1 != 0 { limits.push(&a); }
            if mask & 2 != 0 { limits.push(&kref); }
            if mask & 4 != 0 { limits.push(&b); }
            let d = check_all_n(&limits, n).unwrap();
            let na = if mask & 1 != 0 { decide(model_a, now, n, T[0], B[0]) } else { Some(model_a) };
            let nk = if mask & 2 != 0 { decide(model_k[key as usize], now, n, T[2], B[2]) } else { Some(model_k[key as usize]) };
            let nb = if mask & 4 != 0 { decide(model_b, now, n, T[1], B[1]) } else { Some(model_b) };
            let all = na.is_some() && nk.is_some() && nb.is_some();
            prop_assert_eq!(d.is_allowed(), all);
            if all {
                model_a = na.unwrap();
                model_k[key as usize] = nk.unwrap();
                model_b = nb.unwrap();
            }
            // Every limit as the model says (a peek is a decision for 1 at now).
            let peek = |tat: u64, t: u64, b: u64| decide(tat, now, 1, t, b).map(|x| (b * t - (x - now)) / t);
            prop_assert_eq!(a.peek().is_allowed().then(|| a.peek().remaining()), peek(model_a, T[0], B[0]));
            prop_assert_eq!(b.peek().is_allowed().then(|| b.peek().remaining()), peek(model_b, T[1], B[1]));
            for kk in 0..3u32 {
                let p = k.peek_key(&kk);
                prop_assert_eq!(p.is_allowed().then(|| p.remaining()), peek(model_k[kk as usize], T[2], B[2]), "key {}", kk);
            }
        }
    }
}

trait NowNs {
    fn now_ns(&self) -> u64;
}
impl NowNs for ManualClock {
    fn now_ns(&self) -> u64 {
        ratewall::Clock::now(self)
    }
}

/// Threads hammer three limits with multi-checks under frozen time: the
/// total admitted never exceeds any limit's burst, and every limit ends
/// holding exactly the admitted requests (no leaked partial takes).
#[test]
fn concurrent_multi_checks_never_leak_partial_takes() {
    let clock = ManualClock::new();
    let global =
        Arc::new(TokenBucket::with_clock(Rate::per_hour(1000).burst(1000), clock.clone()).unwrap());
    let per_user = Arc::new(
        KeyedTokenBucket::<u32, _>::builder(Rate::per_hour(50).burst(50))
            .clock(clock.clone())
            .build()
            .unwrap(),
    );
    let route =
        Arc::new(TokenBucket::with_clock(Rate::per_hour(120).burst(120), clock.clone()).unwrap());
    let handles: Vec<_> = (0..4u32)
        .map(|t| {
            let (g, u, r) = (
                Arc::clone(&global),
                Arc::clone(&per_user),
                Arc::clone(&route),
            );
            std::thread::spawn(move || {
                let mut admitted = [0u64; 4];
                for i in 0..2000u32 {
                    let user = (i + t) % 4;
                    if check_all(&[&u.with_key(&user), &*r, &*g]).is_allowed() {
                        admitted[user as usize] += 1;
                    }
                }
                admitted
            })
        })
        .collect();
    let mut per = [0u64; 4];
    for h in handles {
        for (p, a) in per.iter_mut().zip(h.join().unwrap()) {
            *p += a;
        }
    }
    let total: u64 = per.iter().sum();
    // The route's burst binds; transient takes by requests that are then
    // refunded can only deny others for a moment, never admit extra.
    assert!((100..=120).contains(&total), "{per:?}");
    assert!(per.iter().all(|&p| p <= 50));
    assert_eq!(global.peek().remaining(), 1000 - total - 1);
    let r = route.peek();
    assert_eq!(r.is_allowed(), total < 120);
    if total < 120 {
        assert_eq!(r.remaining(), 120 - total - 1);
    }
    for (user, &p) in per.iter().enumerate() {
        let left = per_user.peek_key(&(user as u32));
        assert_eq!(left.is_allowed(), p < 50, "user {user}");
        if p < 50 {
            assert_eq!(left.remaining(), 50 - p - 1, "user {user}");
        }
    }
}

/// A cost that some limit can never admit is an error even when an earlier
/// limit denies, and nothing is taken from any limit (found by the multi
/// fuzz target: the check used to stop at the first denial).
#[test]
fn impossible_cost_is_an_error_even_after_a_denial() {
    use ratewall::{check_all_n, InsufficientCapacity, ManualClock, Rate, TokenBucket};
    let clock = ManualClock::new();
    let empty = TokenBucket::with_clock(Rate::per_hour(10).burst(10), clock.clone()).unwrap();
    assert!(empty.check_n(10).unwrap().is_allowed()); // will deny everything
    let roomy = TokenBucket::with_clock(Rate::per_second(100).burst(100), clock.clone()).unwrap();
    let small = TokenBucket::with_clock(Rate::per_second(1).burst(3), clock.clone()).unwrap();
    assert_eq!(
        check_all_n(&[&empty, &roomy, &small], 5),
        Err(InsufficientCapacity {
            requested: 5,
            capacity: 3
        })
    );
    assert_eq!(roomy.peek().remaining(), 99, "nothing was taken");
    assert_eq!(small.peek().remaining(), 2, "nothing was taken");
}

mod check_each_costs {
    use ratewall::{
        check_each, KeyedPolicyLimiter, Limit, ManualClock, Policy, Rate, TokenBucket, Window,
    };
    use std::time::Duration;

    fn policies() -> [Policy; 5] {
        [
            Policy::token_bucket(Rate::per_second(10)),
            Policy::leaky_bucket(Rate::per_second(10)),
            Policy::fixed_window(Window::per_second(10)),
            Policy::sliding_window_counter(Window::per_second(10)),
            Policy::sliding_window_log(Window::per_second(10)),
        ]
    }

    #[test]
    fn a_denial_gives_back_each_limits_own_cost_for_every_algorithm() {
        for policy in policies() {
            let clock = ManualClock::new();
            let a = KeyedPolicyLimiter::<u8, _>::builder(policy)
                .clock(clock.clone())
                .build()
                .unwrap();
            let b = KeyedPolicyLimiter::<u8, _>::builder(policy)
                .clock(clock.clone())
                .build()
                .unwrap();
            let mut out = [None; 2];
            assert!(check_each(&[(&a.with_key(&1), 3), (&b.with_key(&1), 7)], &mut out).unwrap());
            assert_eq!(out.map(|d| d.unwrap().remaining()), [7, 3], "{policy:?}");
            // b has 3 left: 4 more is denied, and a keeps its 7.
            assert!(!check_each(&[(&a.with_key(&1), 2), (&b.with_key(&1), 4)], &mut out).unwrap());
            let [da, db] = out.map(Option::unwrap);
            assert!(
                da.is_allowed(),
                "{policy:?}: a would allow 2 after the rollback"
            );
            assert_eq!(da.remaining(), 5, "{policy:?}: a's peek at its own cost");
            assert!(!db.is_allowed());
            assert!(db.retry_after() > Duration::ZERO);
            assert_eq!(a.peek_key_n(&1, 7).unwrap().remaining(), 0, "{policy:?}");
            assert!(!a.peek_key_n(&1, 8).unwrap().is_allowed(), "{policy:?}");
        }
    }

    #[test]
    fn a_zero_cost_reports_without_taking_and_an_impossible_cost_takes_nothing() {
        let clock = ManualClock::new();
        let global = TokenBucket::with_clock(Rate::per_second(5), clock.clone()).unwrap();
        let per_key =
            KeyedPolicyLimiter::<u8, _>::builder(Policy::fixed_window(Window::per_second(2)))
                .clock(clock)
                .build()
                .unwrap();
        let mut out = [None; 2];
        assert!(check_each(&[(&global, 0), (&per_key.with_key(&9), 2)], &mut out).unwrap());
        assert_eq!(global.peek().remaining(), 4, "cost 0 took nothing");
        assert_eq!(
            out[0].unwrap().remaining(),
            4,
            "cost 0 reports a unit request"
        );
        let before = out;
        let err = check_each(&[(&global, 1), (&per_key.with_key(&9), 3)], &mut out).unwrap_err();
        assert_eq!((err.requested, err.capacity), (3, 2));
        assert_eq!(global.peek().remaining(), 4, "the error took nothing");
        assert_eq!(
            out.map(|d| d.map(|d| d.remaining())),
            before.map(|d| d.map(|d| d.remaining()))
        );
        assert!(check_each::<ManualClock>(&[], &mut []).unwrap());
    }

    #[test]
    fn more_than_64_limits_roll_back_every_one() {
        let clock = ManualClock::new();
        let many: Vec<TokenBucket<ManualClock>> = (0..70)
            .map(|_| TokenBucket::with_clock(Rate::per_second(3), clock.clone()).unwrap())
            .collect();
        let strict = TokenBucket::with_clock(Rate::per_second(1), clock.clone()).unwrap();
        let _ = strict.check();
        let mut limits: Vec<(&dyn Limit<ManualClock>, u64)> = many
            .iter()
            .map(|l| (l as &dyn Limit<ManualClock>, 2))
            .collect();
        limits.push((&strict, 1));
        let mut out = vec![None; limits.len()];
        assert!(!check_each(&limits, &mut out).unwrap());
        for (i, l) in many.iter().enumerate() {
            assert_eq!(l.peek().remaining(), 2, "limit {i} got its 2 units back");
        }
        assert!(out.iter().all(Option::is_some));
        // A short decisions slice is filled as far as it goes, never past it.
        let mut short = [None; 3];
        assert!(!check_each(&limits, &mut short).unwrap());
        assert!(short.iter().all(Option::is_some));
    }
}

#[test]
fn a_keyed_ref_debugs_as_its_limiter_and_key() {
    let per_user = KeyedTokenBucket::<u32, _>::builder(Rate::per_second(5))
        .clock(ManualClock::new())
        .build()
        .unwrap();
    let s = format!("{:?}", per_user.with_key(&7));
    assert!(s.starts_with("KeyedRef"), "{s}");
    assert!(s.contains("key: 7") && s.contains("KeyedLimiter"), "{s}");
}
