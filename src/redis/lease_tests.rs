//! The lease script against models, on a real server and the test-only
//! clock: several holders take, use, release and abandon leases at random,
//! and the bound is checked over every interval of the admission log; a
//! take with no extra units is the plain script, field by field.

use super::*;
use crate::redis::{FailurePolicy, RedisBackend};
use crate::{Policy, Rate, Window};
// The server harness of the differential tests (tests/support/redis_server.rs).
use crate::redis::testing::at;
use crate::redis::tests::server::RedisServer;
use crate::redis::tests::Rng;

/// A realistic Unix time in us (about 2^50.6).
const T0: u64 = 1_700_000_000_000_000;

fn backend(server: &RedisServer) -> RedisBackend {
    RedisBackend::builder(server.url())
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap()
}

fn leased(b: &RedisBackend, policy: Policy, name: &str, life: Duration) -> RedisLeaseLimiter {
    let l = RedisLimiter::builder(policy, b)
        .name(name)
        .on_failure(FailurePolicy::Closed)
        .build()
        .unwrap();
    let k = policy.limit().min(8);
    RedisLeaseLimiter::new(l, RedisLeaseOptions::new().max_lease(k).life(life)).unwrap()
}

/// The Redis key of `k` under `l`'s name.
fn rkey(l: &RedisLeaseLimiter) -> Vec<u8> {
    l.limiter.redis_key(b"k").unwrap()
}

/// A holder's lease, in server time.
#[derive(Clone, Copy, Debug)]
struct ModelLease {
    id: u64,
    granted: u64,
    units: u64,
    end: u64,
    window: u64,
}

async fn take(
    l: &RedisLeaseLimiter,
    t: u64,
    n: u64,
    extra: u64,
    id: u64,
    prev: Option<(u64, u64)>,
) -> crate::redis::wire::LeaseReply {
    let v = at(t, l.call(&rkey(l), "t", n, extra, id, prev, Ok))
        .await
        .unwrap();
    parse_lease(&v).unwrap()
}

/// One holder's action in a model run.
#[derive(Clone, Copy, Debug)]
enum Op {
    /// Admit a unit from its lease (a take of `extra` if it has none).
    Use(u64),
    /// A take asking for `extra` units, reporting its previous lease.
    Take(u64),
    /// Give back its lease.
    Release,
    /// Forget its lease (it ends unreleased).
    Abandon,
}

/// Runs `steps` (time step in us, holder, action) on key `key` of `l`, on
/// the test-only clock. After every step the units free in Redis plus the
/// units usable in leases are at most the burst; after every admission the
/// bound holds over every interval ending at it; a release gives back iff
/// its lease had not ended; a take reports the server time it was given.
/// Returns (admitted, units leased, units released) or the violation.
async fn gcra_steps(
    l: &RedisLeaseLimiter,
    key: &[u8],
    holders: usize,
    life_us: u64,
    steps: &[(u64, usize, Op)],
) -> Result<(usize, u64, u64), String> {
    let rkey = l.limiter.redis_key(key).unwrap();
    let [tt, _, burst] = l.limiter.program().params;
    let call = |mode: &'static str, n, extra, id, prev, t| {
        let rkey = rkey.clone();
        async move {
            at(t, l.call(&rkey, mode, n, extra, id, prev, Ok))
                .await
                .unwrap()
        }
    };
    let mut t = T0;
    let mut leases: Vec<Option<ModelLease>> = vec![None; holders];
    let mut admitted: Vec<u64> = Vec::new();
    let (mut leased_units, mut released) = (0, 0);
    let mut next_id = 1;
    for (step, &(dt, h, op)) in steps.iter().enumerate() {
        t += dt;
        let h = h % holders;
        let usable = leases[h].filter(|m| m.units > 0 && t < m.end);
        let op = match op {
            Op::Use(extra) if usable.is_none() => Op::Take(extra),
            Op::Release | Op::Abandon if leases[h].is_none() => Op::Take(2),
            op => op,
        };
        match op {
            Op::Use(_) => {
                let mut m = usable.unwrap();
                m.units -= 1;
                leases[h] = Some(m);
                admitted.push(t);
            }
            Op::Release => {
                let m = leases[h].take().unwrap();
                let v = call("r", m.granted - m.units, m.granted, m.id, None, t).await;
                if (v == Value::Int(1)) != (t < m.end) {
                    return Err(format!("step {step}: release of {m:?} at {t}: {v:?}"));
                }
                if t < m.end {
                    released += m.units;
                }
            }
            Op::Abandon => leases[h] = None,
            Op::Take(extra) => {
                let prev = leases[h].take().map(|m| (m.id, m.granted - m.units));
                let id = next_id;
                next_id += 1;
                let r = parse_lease(&call("t", 1, extra, id, prev, t).await).unwrap();
                if r.now_us != t || r.granted > extra {
                    return Err(format!("step {step}: {r:?}"));
                }
                if r.decision.is_allowed() {
                    admitted.push(t);
                    if r.granted > 0 {
                        if r.end_us != t + life_us {
                            return Err(format!("step {step}: end {r:?}"));
                        }
                        leased_units += r.granted;
                        leases[h] = Some(ModelLease {
                            id,
                            granted: r.granted,
                            units: r.granted,
                            end: r.end_us,
                            window: 0,
                        });
                    }
                } else if r.granted != 0 || r.decision.retry_after() == Duration::ZERO {
                    return Err(format!("step {step}: denial {r:?}"));
                }
            }
        }
        // Conservation: free in Redis plus usable in leases <= burst.
        let in_leases: u64 = leases
            .iter()
            .flatten()
            .filter(|m| t < m.end)
            .map(|m| m.units)
            .sum();
        let d = parse_lease(&call("p", 1, 0, 0, None, t).await)
            .unwrap()
            .decision;
        let free = d.remaining() + u64::from(d.is_allowed());
        if free + in_leases > burst {
            return Err(format!(
                "step {step}: free {free} + leased {in_leases} > burst {burst}"
            ));
        }
        // The bound over every interval ending now.
        if admitted.last() == Some(&t) {
            let n = admitted.len() as u64;
            for (i, &x) in admitted.iter().enumerate() {
                let bound = burst + (t - x) / tt;
                if n - i as u64 > bound {
                    return Err(format!(
                        "step {step}: {} admitted in [{x}, {t}], bound {bound}",
                        n - i as u64
                    ));
                }
            }
        }
    }
    Ok((admitted.len(), leased_units, released))
}

/// Bucket policies, lease lives and holder counts of the model runs.
fn gcra_cases() -> [(Policy, u64, usize); 4] {
    let ms = Duration::from_millis;
    [
        (
            Policy::token_bucket(Rate::new(4, ms(400)).burst(8)),
            250_000,
            3,
        ),
        (
            Policy::token_bucket(Rate::new(4, ms(400)).burst(8)),
            2_000_000,
            4,
        ),
        (
            Policy::leaky_bucket(Rate::per_second(50).burst(10)),
            30_000,
            3,
        ),
        (
            Policy::token_bucket(Rate::per_second(1000).burst(5)),
            1_000,
            2,
        ),
    ]
}

/// A time step: none, under one interval, up to three, or across a burst
/// and a lease life, from a class (0..10) and a random number.
fn time_step(class: u8, r: u64, tt: u64, tau: u64, life_us: u64) -> u64 {
    match class {
        0..=3 => 0,
        4..=7 => r % tt,
        8 => r % (3 * tt),
        _ => r % (2 * tau + life_us),
    }
}

fn op_of(class: u8, extra: u64) -> Op {
    match class {
        0..=2 => Op::Use(extra),
        3 => Op::Take(extra),
        4 => Op::Release,
        _ => Op::Abandon,
    }
}

/// Seeded runs of 700 steps (three seeds per case), each of which must
/// exercise leases, uses and releases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bound_is_exact_with_holders_taking_using_releasing_and_abandoning() {
    let server = RedisServer::start();
    let b = backend(&server);
    for (i, (policy, life_us, holders)) in gcra_cases().into_iter().enumerate() {
        let l = leased(&b, policy, &format!("m{i}"), Duration::from_micros(life_us));
        let [tt, tau, _] = l.limiter.program().params;
        for seed in [7u64, 11, 13] {
            let mut rng = Rng(seed * (life_us + 1));
            let steps: Vec<_> = (0..700)
                .map(|_| {
                    let dt = time_step(rng.below(10) as u8, rng.next(), tt, tau, life_us);
                    let h = rng.below(holders as u64) as usize;
                    (dt, h, op_of(rng.below(6) as u8, rng.below(6)))
                })
                .collect();
            let key = format!("s{seed}");
            let (admitted, leased, released) =
                gcra_steps(&l, key.as_bytes(), holders, life_us, &steps)
                    .await
                    .unwrap();
            // The run exercised what it claims to.
            assert!(admitted > 50, "{policy:?}: {admitted}");
            assert!(leased > 20, "{policy:?}: {leased}");
            assert!(released > 0, "{policy:?}: {released}");
        }
    }
}

/// The same model as a property test (proptest shrinks a failing run to
/// its shortest steps): random cases, holders and step lists.
#[test]
fn the_bound_holds_for_any_steps() {
    use proptest::collection::vec;
    use proptest::prelude::*;
    use proptest::test_runner::{Config, TestCaseError, TestRunner};
    let server = RedisServer::start();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let b = rt.block_on(async { backend(&server) });
    let limiters: Vec<_> = rt.block_on(async {
        gcra_cases()
            .into_iter()
            .enumerate()
            .map(|(i, (p, life, _))| leased(&b, p, &format!("q{i}"), Duration::from_micros(life)))
            .collect()
    });
    let mut runner = TestRunner::new(Config {
        cases: 32,
        failure_persistence: None,
        ..Config::default()
    });
    let next = std::cell::Cell::new(0u64);
    let strategy = (
        0..4usize,
        vec((0u8..10, any::<u64>(), 0usize..4, 0u8..6, 0u64..6), 1..200),
    );
    runner
        .run(&strategy, |(case, raw)| {
            let (_, life_us, holders) = gcra_cases()[case];
            let l = &limiters[case];
            let [tt, tau, _] = l.limiter.program().params;
            let steps: Vec<_> = raw
                .iter()
                .map(|&(c, r, h, o, e)| (time_step(c, r, tt, tau, life_us), h, op_of(o, e)))
                .collect();
            // A fresh key per case (the server keeps the others' state).
            let key = format!("c{}", next.replace(next.get() + 1));
            rt.block_on(gcra_steps(l, key.as_bytes(), holders, life_us, &steps))
                .map(|_| ())
                .map_err(TestCaseError::fail)
        })
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fixed_window_lease_counts_in_its_window_and_ends_with_it() {
    let server = RedisServer::start();
    let b = backend(&server);
    let l = leased(
        &b,
        Policy::fixed_window(Window::new(6, Duration::from_millis(100))),
        "f",
        Duration::from_millis(100),
    );
    let [w, limit, _] = l.limiter.program().params;
    let mut rng = Rng(23);
    let mut t = T0 + 12_345;
    let mut leases: Vec<Option<ModelLease>> = vec![None; 3];
    let mut per_window: HashMap<u64, u64> = HashMap::default();
    let (mut leased_units, mut released) = (0, 0);
    for step in 0..600 {
        t += match rng.below(10) {
            0..=3 => 0,
            4..=8 => rng.below(w / 20),
            _ => rng.below(2 * w),
        };
        let h = rng.below(3) as usize;
        let usable = leases[h].filter(|m| m.units > 0 && t < m.end);
        match rng.below(5) {
            0 | 1 if usable.is_some() => {
                let mut m = usable.unwrap();
                m.units -= 1;
                leases[h] = Some(m);
                *per_window.entry(t / w).or_default() += 1;
            }
            2 if leases[h].is_some() => {
                let m = leases[h].take().unwrap();
                let v = at(
                    t,
                    l.call(
                        &rkey(&l),
                        "r",
                        m.granted - m.units,
                        m.granted,
                        m.window,
                        None,
                        Ok,
                    ),
                )
                .await
                .unwrap();
                let live = t < m.end && m.units > 0;
                assert_eq!(v == Value::Int(1), live, "step {step}");
                if live {
                    released += m.units;
                }
            }
            _ => {
                let extra = rng.below(4);
                leases[h] = None;
                let r = take(&l, t, 1, extra, 0, None).await;
                if r.decision.is_allowed() {
                    *per_window.entry(t / w).or_default() += 1;
                    assert_eq!(r.end_us, (t / w + 1) * w, "the lease ends with the window");
                    assert_eq!(r.window, t / w);
                    if r.granted > 0 {
                        leased_units += r.granted;
                        leases[h] = Some(ModelLease {
                            id: 0,
                            granted: r.granted,
                            units: r.granted,
                            end: r.end_us,
                            window: r.window,
                        });
                    }
                }
            }
        }
        for (id, n) in &per_window {
            assert!(*n <= limit, "step {step}: {n} admitted in window {id}");
        }
    }
    assert!(
        leased_units > 20 && released > 0,
        "{leased_units} {released}"
    );
    // Windows filled to the limit, some of them by leases.
    assert!(per_window.values().filter(|&&n| n == limit).count() >= 3);
}

/// A take with no extra units decides exactly as the plain script: every
/// field, random costs and times (the same state, read by two scripts).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_take_of_no_extra_units_is_the_plain_check() {
    let server = RedisServer::start();
    let b = backend(&server);
    let ms = Duration::from_millis;
    for (i, policy) in [
        Policy::token_bucket(Rate::new(7, ms(350)).burst(3)),
        Policy::leaky_bucket(Rate::per_second(5).burst(2)),
        Policy::fixed_window(Window::new(5, ms(100))),
    ]
    .into_iter()
    .enumerate()
    {
        let l = leased(&b, policy, &format!("d{i}"), ms(100));
        let plain = RedisLimiter::builder(policy, &b)
            .name(format!("p{i}"))
            .on_failure(FailurePolicy::Closed)
            .build()
            .unwrap();
        let [tt, _, _] = l.limiter.program().params;
        let mut rng = Rng(31 + i as u64);
        let mut t = T0;
        for step in 0..300 {
            t += match rng.below(3) {
                0 => 0,
                1 => rng.below(tt),
                _ => rng.below(4 * tt),
            };
            let n = 1 + rng.below(policy.limit());
            let consume = rng.below(4) != 0;
            let got = if consume {
                take(&l, t, n, 0, 0, None).await.decision
            } else {
                let v = at(t, l.call(&rkey(&l), "p", n, 0, 0, None, Ok))
                    .await
                    .unwrap();
                parse_lease(&v).unwrap().decision
            };
            let want = at(t, plain.decide(b"k", n, consume)).await.unwrap();
            assert_eq!(got, want.decision(), "{policy:?} step {step} n {n}");
        }
    }
}

#[test]
fn bad_options_and_policies_are_typed_errors() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let b = RedisBackend::builder("redis://127.0.0.1:1")
            .build()
            .unwrap();
        let tb = |p| RedisLimiter::builder(p, &b).build().unwrap();
        let p = Policy::token_bucket(Rate::per_second(10));
        for opts in [
            RedisLeaseOptions::new().max_lease(0),
            RedisLeaseOptions::new().max_lease(11),
            RedisLeaseOptions::new().life(Duration::ZERO),
            RedisLeaseOptions::new().life(Duration::from_secs(3601)),
            RedisLeaseOptions::new().max_keys(0).max_lease(4),
        ] {
            let e = RedisLeaseLimiter::new(tb(p), opts).unwrap_err();
            assert!(matches!(e, RedisError::Config(_)), "{opts:?}: {e}");
        }
        for p in [
            Policy::sliding_window_counter(Window::per_second(10)),
            Policy::sliding_window_log(Window::per_second(10)),
            Policy::token_bucket(Rate::per_second(100)).soft(crate::Tolerance::Percent(10)),
        ] {
            let e = RedisLeaseLimiter::new(tb(p), RedisLeaseOptions::new()).unwrap_err();
            assert!(matches!(e, RedisError::Unsupported { .. }), "{p:?}: {e}");
        }
        let l = RedisLeaseLimiter::new(tb(p), RedisLeaseOptions::new().max_lease(10)).unwrap();
        assert!(format!("{l:?}").contains("RedisLeaseLimiter"));
        assert_eq!(l.held(b"k"), 0);
        assert!(matches!(l.check_key(b"").await, Err(RedisError::EmptyKey)));
        assert!(matches!(
            l.check_key_n(b"k", 11).await,
            Err(RedisError::InsufficientCapacity(_))
        ));
    });
}

#[test]
fn a_lease_is_usable_only_while_the_server_time_may_be_before_its_end() {
    let sent = Instant::now();
    let h = Held {
        id: 1,
        granted: 4,
        units: 4,
        sent,
        span: 10_000_000, // 10 ms
        reset: 0,
        window: 0,
    };
    assert_eq!(h.usable(sent), 4);
    // 1/1024 drift allowance: at 9.99 ms of local time the estimate passes 10 ms.
    assert_eq!(h.usable(sent + Duration::from_micros(9_991)), 0);
    assert_eq!(h.usable(sent + Duration::from_micros(9_980)), 4);
    assert_eq!(h.usable(sent + Duration::from_millis(11)), 0);
}

/// The local table holds at most `max_keys` keys, whatever the keys
/// checked; evicted keys just take again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lease_table_stays_bounded() {
    let server = RedisServer::start();
    let b = backend(&server);
    let l = RedisLimiter::builder(
        Policy::token_bucket(Rate::new(100, Duration::from_secs(3600))),
        &b,
    )
    .name("bounded")
    .on_failure(FailurePolicy::Closed)
    .build()
    .unwrap();
    let l = RedisLeaseLimiter::new(
        l,
        RedisLeaseOptions::new()
            .max_keys(4)
            .max_lease(4)
            .hot_gap(Duration::from_secs(10)),
    )
    .unwrap();
    let len = |l: &RedisLeaseLimiter| -> usize { l.shards.iter().map(|s| lock(s).map.len()).sum() };
    for round in 0..3 {
        for i in 0..40u32 {
            let key = format!("key{i}");
            for _ in 0..2 {
                let d = l.check_key(key.as_bytes()).await.unwrap();
                assert!(d.is_allowed(), "round {round} {key}");
            }
            assert!(len(&l) <= 4, "{}", len(&l));
        }
    }
    // Leases are held for at most the 4 keys in the table.
    let released = l.release_all().await.unwrap();
    assert!(released <= 4 * 3, "{released}");
}
