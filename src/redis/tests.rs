//! Differential tests: each script against the local step, decision by
//! decision, every field, on the same timestamps.
//!
//! Rounding rule: Redis keeps whole microseconds. The policies here have
//! whole-microsecond intervals and windows, and the times are whole
//! microseconds (`t_us`, the local limiter at `t_us * 1000` ns), where both
//! sides must agree exactly: allowed, limit, remaining, retry_after and
//! reset_after (the script's microseconds times 1000). Times start at a
//! realistic Unix time in microseconds (about 2^50.6), where Lua's doubles
//! are still exact.

#[path = "../../tests/support/redis_server.rs"]
#[allow(unreachable_pub)]
pub(super) mod server;

use super::testing::at;
use super::{RedisBackend, RedisLimiter};
use crate::{Decision, KeyedPolicyLimiter, ManualClock, Policy, Rate, Tolerance, Window};
use server::RedisServer;
use std::future::Future;
use std::time::Duration;

/// A small deterministic generator (xorshift64*), so a failure replays.
pub(super) struct Rng(pub(super) u64);

impl Rng {
    pub(super) fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    pub(super) fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn policies() -> Vec<Policy> {
    let ms = Duration::from_millis;
    vec![
        Policy::token_bucket(Rate::per_second(10).burst(4)),
        Policy::token_bucket(Rate::new(7, ms(350)).burst(3)),
        Policy::leaky_bucket(Rate::per_second(5).burst(2)),
        Policy::fixed_window(Window::new(5, ms(100))),
        Policy::fixed_window(Window::new(3, ms(30))),
        Policy::sliding_window_counter(Window::new(6, ms(200))),
        Policy::sliding_window_counter(Window::new(20, ms(150))),
        Policy::sliding_window_log(Window::new(4, ms(100))),
        // Enough entries that a long gap expires more than the scan's 4
        // and the script's binary search runs.
        Policy::sliding_window_log(Window::new(12, ms(50))),
    ]
}

#[derive(Debug, Clone, Copy)]
enum Op {
    Check(u64),
    Peek(u64),
    Refund(u64),
    Reset,
}

/// Every field of a decision, with the durations in whole microseconds
/// rounded up: the script computes the earliest whole microsecond, where
/// the local step may land between two (the sliding counter's retry, a
/// quotient of the window). Everything else is equal as it is.
fn fields(d: Decision) -> (bool, bool, u64, u64, u64, u64, crate::Tracking) {
    let us = |x: Duration| (x.as_nanos() as u64).div_ceil(1000);
    (
        d.is_allowed(),
        d.is_above_limit(),
        d.limit(),
        d.remaining(),
        us(d.retry_after()),
        us(d.reset_after()),
        d.tracking(),
    )
}

/// Whether the script's duration is the local one exactly or rounded up
/// to the microsecond, never less.
#[test]
fn fields_rounds_up_only_below_a_microsecond() {
    let a = Decision::deny(5, 0, 233_333_334, 400_000_000);
    let b = Decision::deny(5, 0, 233_334_000, 400_000_000);
    assert_eq!(fields(a), fields(b));
    let c = Decision::deny(5, 0, 233_335_000, 400_000_000);
    assert_ne!(fields(a), fields(c));
}

pub(super) const T0_US: u64 = 1_700_000_000_123_457;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_script_matches_the_local_step_decision_by_decision() {
    let compared = differential(&policies(), "difftest").await;
    assert!(compared > 2000, "{compared} decisions compared");
}

/// Sliding logs with big limits and big costs (random costs up to the
/// limit): one run per admission on the server, and still every field of
/// every decision equal to the local step's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_log_script_matches_the_local_step_with_big_costs() {
    let ms = Duration::from_millis;
    let big = [
        Policy::sliding_window_log(Window::new(100_000, ms(200))),
        Policy::sliding_window_log(Window::new(3_000, ms(40))),
    ];
    let compared = differential(&big, "bigdiff").await;
    assert!(compared > 500, "{compared} decisions compared");
}

/// A key the previous format wrote (one plain time per unit, after a
/// plain floor) is read as it stands, each time one unit: the decisions
/// are those of the local log fed the same admissions, never more
/// permissive, and the first admission rewrites it as runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_in_the_previous_log_format_is_read_exactly_and_rewritten() {
    let server = RedisServer::start();
    let backend = RedisBackend::builder(server.url())
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let policy = Policy::sliding_window_log(Window::new(6, Duration::from_millis(100)));
    let remote = RedisLimiter::builder(policy, &backend)
        .prefix("oldfmt")
        .build()
        .unwrap();
    let clock = ManualClock::new();
    let local = KeyedPolicyLimiter::<u8, _>::builder(policy)
        .clock(clock.clone())
        .build()
        .unwrap();
    let key = String::from_utf8(remote.redis_key(b"k").unwrap()).unwrap();
    let t = T0_US;
    // The old script's state after 3 units at t and 2 at t + 30 ms.
    let (t1, t2) = (t.to_string(), (t + 30_000).to_string());
    server.cmd(&["RPUSH", &key, &t2, &t1, &t1, &t1, &t2, &t2]);
    let _ = local.check_key_n_at(&1, t * 1000, 3).unwrap();
    let _ = local.check_key_n_at(&1, (t + 30_000) * 1000, 2).unwrap();
    let lrange = |server: &RedisServer| -> Vec<String> {
        server
            .cmd(&["LRANGE", &key, "0", "-1"])
            .lines()
            .filter(|l| !l.starts_with('*') && !l.starts_with('$'))
            .map(str::to_string)
            .collect()
    };
    // Denials and peeks (nothing written), a refund of one unit, an
    // admission that rewrites the key, then an expiry.
    for (dt_us, n, take) in [(40_000, 2, false), (40_000, 3, true), (50_000, 1, false)] {
        let now = t + dt_us;
        clock.set_nanos(now * 1000);
        let want = if take {
            local.check_key_n_at(&1, now * 1000, n).unwrap()
        } else {
            local.peek_key_n(&1, n).unwrap()
        };
        let got = at(now, remote.decide(b"k", n, take)).await.unwrap();
        assert_eq!(fields(got.decision()), fields(want), "+{dt_us} us n={n}");
    }
    assert_eq!(lrange(&server).len(), 6, "a denial rewrites nothing");
    local.refund_key_at(&1, (t + 60_000) * 1000, 1);
    at(t + 60_000, remote.refund_key(b"k", 1)).await.unwrap();
    assert_eq!(lrange(&server).len(), 5, "one plain unit given back");
    for (dt_us, n) in [(70_000, 2), (70_000, 1), (100_000, 3), (101_000, 1)] {
        let now = t + dt_us;
        let want = local.check_key_n_at(&1, now * 1000, n).unwrap();
        let got = at(now, remote.decide(b"k", n, true)).await.unwrap();
        assert_eq!(fields(got.decision()), fields(want), "+{dt_us} us n={n}");
    }
    // Rewritten: the head `floor:base`, then (time, count so far) for each
    // time still in the window, equal times merged.
    let list = lrange(&server);
    let (f, at) = (t + 100_000, |dt: u64| (t + dt).to_string());
    assert_eq!(list[0], format!("{f}:3"), "{list:?}");
    assert_eq!(
        list[1..],
        [
            at(30_000),
            "4".into(),
            at(70_000),
            "6".into(),
            at(100_000),
            "9".into()
        ]
    );
}

/// Soft policies: the script runs with the widened capacity and its reply
/// is read back through the same mapping as the local soft limiter, so
/// every field (the nominal limit and remaining, the above-limit mark)
/// matches a local `KeyedPolicyLimiter` of the same soft policy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_soft_script_matches_the_local_soft_limiter() {
    let soft: Vec<Policy> = policies()
        .into_iter()
        .enumerate()
        .map(|(i, p)| {
            p.soft(if i % 2 == 0 {
                Tolerance::Percent(50)
            } else {
                Tolerance::Units(2)
            })
        })
        .collect();
    assert!(soft.iter().all(|p| p.tolerance_units() > 0));
    let compared = differential(&soft, "softdiff").await;
    assert!(compared > 2000, "{compared} decisions compared");
}

/// Runs each policy's script and the local limiter on the same random
/// operations and timestamps, comparing every decision; returns how many
/// decisions were compared. Fails if no decision was above the limit
/// for a soft policy (the mark must be exercised).
async fn differential(policies: &[Policy], prefix: &str) -> usize {
    let server = RedisServer::start();
    let backend = RedisBackend::builder(server.url())
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let mut compared = 0;
    for (pi, &policy) in policies.iter().enumerate() {
        let clock = ManualClock::new();
        let local = KeyedPolicyLimiter::<u8, _>::builder(policy)
            .clock(clock.clone())
            .build()
            .unwrap();
        let remote = RedisLimiter::builder(policy, &backend)
            .prefix(prefix)
            .name(format!("p{pi}"))
            .build()
            .unwrap();
        // The most a check may cost (the tolerance included).
        let limit = policy.soft_limit();
        let span = policy.span().as_micros() as u64;
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ pi as u64);
        let mut t = T0_US;
        let mut history = Vec::new();
        let mut above = 0;
        for step in 0..400 {
            // Time: often still, often a little, sometimes a long gap.
            // (Never back: see `a_server_clock_step_back_never_admits_more`.)
            t = match rng.below(20) {
                0..=5 => t,
                6..=13 => t + rng.below(span / 8 + 1),
                14..=18 => t + rng.below(2 * span + 1),
                _ => t + span * (1 + rng.below(4)),
            };
            let op = match rng.below(20) {
                0..=9 => Op::Check(1 + rng.below(limit)),
                10 => Op::Check(0),
                11..=14 => Op::Peek(1 + rng.below(limit)),
                15..=18 => Op::Refund(1 + rng.below(limit)),
                _ => Op::Reset,
            };
            let now = t * 1000;
            clock.set_nanos(now);
            history.push(format!("t0+{} {op:?}", t - T0_US));
            let ctx = format!("{policy:?} step {step}; history {history:?}");
            match op {
                Op::Check(n) => {
                    let want = local.check_key_n_at(&1, now, n).unwrap();
                    let got = at(t, remote.decide(b"k", n, n > 0)).await.unwrap();
                    assert_eq!(fields(got.decision()), fields(want), "{ctx}");
                    above += usize::from(want.is_above_limit());
                    compared += 1;
                }
                Op::Peek(n) => {
                    let want = local.peek_key_n(&1, n).unwrap();
                    let got = at(t, remote.decide(b"k", n, false)).await.unwrap();
                    assert_eq!(fields(got.decision()), fields(want), "{ctx}");
                    compared += 1;
                }
                Op::Refund(n) => {
                    local.refund_key_at(&1, now, n);
                    at(t, remote.refund_key(b"k", n)).await.unwrap();
                }
                Op::Reset => {
                    local.reset_key(&1);
                    remote.reset_key(b"k").await.unwrap();
                }
            }
        }
        if policy.tolerance().is_some() {
            assert!(above > 0, "{policy:?}: no decision above the limit");
        }
    }
    compared
}

/// The same sequence of allowed and denied decisions at the edges: exactly
/// at a TAT, a window boundary, and an entry leaving the log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn edges_match_to_the_microsecond() {
    let server = RedisServer::start();
    let backend = RedisBackend::builder(server.url())
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    for (pi, policy) in policies().into_iter().enumerate() {
        let local = KeyedPolicyLimiter::<u8, _>::builder(policy)
            .clock(ManualClock::new())
            .build()
            .unwrap();
        let remote = RedisLimiter::builder(policy, &backend)
            .prefix("edgetest")
            .name(format!("p{pi}"))
            .build()
            .unwrap();
        let limit = policy.limit();
        // Fill up at a window start, then probe at every retry_after
        // (exactly when it should pass) and one microsecond before it.
        let span = policy.span().as_micros() as u64;
        let mut t = (T0_US / span + 1) * span;
        for round in 0..6 {
            for _ in 0..=limit {
                let want = local.check_key_n_at(&1, t * 1000, 1).unwrap();
                let got = at(t, remote.decide(b"e", 1, true)).await.unwrap();
                assert_eq!(
                    fields(got.decision()),
                    fields(want),
                    "{policy:?} round {round} at {t}"
                );
            }
            let denied = local.check_key_n_at(&1, t * 1000, 1).unwrap();
            assert!(!denied.is_allowed(), "{policy:?}");
            // The earliest whole microsecond the request passes at.
            let retry = (denied.retry_after().as_nanos() as u64).div_ceil(1000);
            assert!(retry >= 1);
            for probe in [t + retry - 1, t + retry] {
                let want = local.check_key_n_at(&1, probe * 1000, 1).unwrap();
                let got = at(probe, remote.decide(b"e", 1, true)).await.unwrap();
                assert_eq!(
                    fields(got.decision()),
                    fields(want),
                    "{policy:?} probe at t+{}",
                    probe - t
                );
            }
            t += retry + span / 3;
        }
    }
}

/// The local limiters hold a high-water mark of time; the scripts have no
/// shared one (it would be one hot key for the whole fleet). A step back of
/// the server's clock (NTP, a failover to a server whose clock is behind)
/// is still safe: every algorithm is at most as permissive as with time
/// frozen at its latest value. GCRA counts the step as time still owed,
/// the windows stay in the state's window, and the log keeps its floor.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_clock_step_back_never_admits_more() {
    let server = RedisServer::start();
    let backend = RedisBackend::builder(server.url())
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    for (pi, policy) in policies().into_iter().enumerate() {
        let remote = RedisLimiter::builder(policy, &backend)
            .prefix("backtest")
            .name(format!("p{pi}"))
            .build()
            .unwrap();
        let frozen = KeyedPolicyLimiter::<u8, _>::builder(policy)
            .clock(ManualClock::new())
            .build()
            .unwrap();
        let span = policy.span().as_micros() as u64;
        let t = (T0_US / span + 1) * span + span / 2;
        let first = at(t, remote.decide(b"b", 1, true)).await.unwrap();
        let _ = frozen.check_key_n_at(&1, t * 1000, 1).unwrap();
        assert!(first.is_allowed());
        for back in [1, span / 3, span / 2 + 1] {
            let got = at(t - back, remote.decide(b"b", 1, false)).await.unwrap();
            let want = frozen.peek_key_n(&1, 1).unwrap();
            assert!(
                got.remaining() <= want.remaining() && (want.is_allowed() || !got.is_allowed()),
                "{policy:?} {back} us back: {got:?} vs frozen {want:?}"
            );
        }
    }
}

/// Elastic limits: the script against the local `ElasticLimiter` on the
/// same timestamps, three keys sharing one pool, every field of every
/// decision (the above-limit mark included), for each algorithm as the
/// guarantee and ceiling and a mix of pools. Fixed-window and log pools
/// also change their limit now and then (`set_pool`, same window length).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_elastic_script_matches_the_local_elastic_limiter() {
    use super::RedisElasticLimiter;
    use crate::ElasticLimiter;
    let ms = Duration::from_millis;
    let sets = [
        (
            Policy::token_bucket(Rate::per_second(10).burst(3)),
            Policy::token_bucket(Rate::per_second(20).burst(6)),
            Policy::token_bucket(Rate::per_second(8).burst(4)),
        ),
        (
            Policy::leaky_bucket(Rate::per_second(5).burst(2)),
            Policy::leaky_bucket(Rate::per_second(15).burst(5)),
            Policy::fixed_window(Window::new(5, ms(100))),
        ),
        (
            Policy::fixed_window(Window::new(3, ms(100))),
            Policy::fixed_window(Window::new(7, ms(100))),
            Policy::fixed_window(Window::new(5, ms(60))),
        ),
        (
            Policy::sliding_window_counter(Window::new(4, ms(200))),
            Policy::sliding_window_counter(Window::new(9, ms(200))),
            Policy::sliding_window_log(Window::new(6, ms(150))),
        ),
        (
            Policy::sliding_window_log(Window::new(2, ms(50))),
            Policy::sliding_window_log(Window::new(5, ms(50))),
            Policy::sliding_window_counter(Window::new(4, ms(150))),
        ),
    ];
    let server = RedisServer::start();
    let backend = RedisBackend::builder(server.url())
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let (mut compared, mut above, mut denied, mut changes) = (0, 0, 0, 0);
    for (si, &(g, c, p)) in sets.iter().enumerate() {
        let clock = ManualClock::new();
        let local = ElasticLimiter::<u8, _>::builder(g, c, p)
            .clock(clock.clone())
            .build()
            .unwrap();
        let remote = RedisElasticLimiter::builder(g, c, p, &backend)
            .prefix("elasticdiff")
            .name(format!("e{si}"))
            .build()
            .unwrap();
        let span = g.span().max(p.span()).as_micros() as u64;
        let mut rng = Rng(0xD1B5_4A32_D192_ED03 ^ si as u64);
        let mut t = T0_US;
        let mut history = Vec::new();
        for step in 0..500 {
            t = match rng.below(20) {
                0..=7 => t,
                8..=14 => t + rng.below(span / 8 + 1),
                15..=18 => t + rng.below(span + 1),
                _ => t + span * (1 + rng.below(3)),
            };
            // A window pool of a fixed window or a log changes its limit
            // now and then (same length): both sides keep the counts.
            if let (Some(w), 2..=3) = (p.window(), si) {
                if rng.below(25) == 0 {
                    let new = Window::new(1 + rng.below(2 * w.limit()), w.length());
                    let new = if si == 2 {
                        Policy::fixed_window(new)
                    } else {
                        Policy::sliding_window_log(new)
                    };
                    local.set_pool(new).unwrap();
                    remote.set_pool(new).unwrap();
                    history.push(format!("set_pool {new}"));
                    changes += 1;
                }
            }
            let pool_cap = local.pool().limit();
            let cap = g.limit().max((c.limit() - g.limit()).min(pool_cap));
            let key = rng.below(3) as u8;
            let n = match rng.below(10) {
                0 => 0,
                1 => cap + 1,
                _ => 1 + rng.below(cap),
            };
            let now = t * 1000;
            clock.set_nanos(now);
            history.push(format!("t0+{} key {key} n {n}", t - T0_US));
            let ctx = format!("set {si} step {step}; history {history:?}");
            let want = local.check_key_n_at(&key, now, n);
            let got = at(t, remote.check_key_n(&[b'k', key], n)).await;
            match (want, got) {
                (Ok(want), Ok(got)) => {
                    assert_eq!(got.source(), super::DecisionSource::Redis);
                    assert_eq!(fields(got.decision()), fields(want), "{ctx}");
                    above += usize::from(want.is_above_limit());
                    denied += usize::from(!want.is_allowed());
                    compared += 1;
                }
                (Err(_), Err(super::RedisError::InsufficientCapacity(_))) => {}
                (want, got) => panic!("{ctx}: local {want:?}, Redis {got:?}"),
            }
        }
    }
    assert!(compared > 2000, "{compared} decisions compared");
    assert!(
        above > 200 && denied > 200,
        "{above} above, {denied} denied"
    );
    assert!(changes > 10, "{changes} pool changes");
}

/// The number of script calls the server ran so far.
fn evalsha_calls(server: &RedisServer) -> u64 {
    let stats = server.cmd(&["INFO", "commandstats"]);
    stats
        .lines()
        .find_map(|l| l.strip_prefix("cmdstat_evalsha:calls="))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// Batching: groups of calls (checks, peeks and refunds of several keys of
/// several policies, the same key several times) made at once run as
/// batches (`lua/batch.lua`), and every decision equals the local step's
/// applied one call after the other in arrival order at the group's time:
/// what a call would have got alone. Fails if the calls were not batched.
// One thread: the calls of a group all queue before the runner sends,
// so the batches are the same on every run.
#[tokio::test(flavor = "current_thread")]
async fn batched_calls_match_the_local_step_in_arrival_order() {
    let server = RedisServer::start();
    let backend = RedisBackend::builder(server.url())
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let mut ps = policies();
    ps.push(Policy::token_bucket(Rate::per_second(10).burst(4)).soft(Tolerance::Units(2)));
    ps.push(
        Policy::sliding_window_counter(Window::new(6, Duration::from_millis(200)))
            .soft(Tolerance::Percent(50)),
    );
    let clock = ManualClock::new();
    let mut locals = Vec::new();
    let mut remotes = Vec::new();
    for (pi, &policy) in ps.iter().enumerate() {
        locals.push(
            KeyedPolicyLimiter::<u8, _>::builder(policy)
                .clock(clock.clone())
                .build()
                .unwrap(),
        );
        remotes.push(
            RedisLimiter::builder(policy, &backend)
                .prefix("batchdiff")
                .name(format!("p{pi}"))
                .build()
                .unwrap(),
        );
    }
    // Load every script first: a call that meets NOSCRIPT is sent again
    // after the reload, behind calls made after it (concurrent calls have
    // no order; this test compares against one).
    for remote in &remotes {
        let d = at(T0_US, remote.decide(b"warm", 1, false)).await.unwrap();
        assert!(d.is_allowed());
    }
    let warm = at(
        T0_US,
        futures_util::future::join_all((0..4).map(|_| remotes[0].decide(b"warm", 1, false))),
    )
    .await;
    assert!(warm.iter().all(Result::is_ok));
    let mut rng = Rng(0xB47C_4ED0);
    let mut t = T0_US;
    let (mut calls, mut compared, mut denied) = (0u64, 0, 0);
    let before = evalsha_calls(&server);
    for group in 0..150 {
        t += rng.below(40_000);
        let now = t * 1000;
        clock.set_nanos(now);
        // Up to 24 calls at once (join_all polls them in order, so each
        // queues in this order), on few keys so that keys repeat. In every
        // third group all calls share their policy, mode and cost (calls of
        // one limiter: the batch sends that triple once).
        let op_of = |rng: &mut Rng| {
            let p = rng.below(ps.len() as u64) as usize;
            let limit = ps[p].soft_limit();
            let op = match rng.below(10) {
                0..=6 => Op::Check(1 + rng.below(limit)),
                7 | 8 => Op::Peek(1 + rng.below(limit)),
                _ => Op::Refund(1 + rng.below(limit)),
            };
            (p, op)
        };
        let shared = (group % 3 == 0).then(|| op_of(&mut rng));
        let ops: Vec<(usize, u8, Op)> = (0..1 + rng.below(24))
            .map(|_| {
                let (p, op) = shared.unwrap_or_else(|| op_of(&mut rng));
                (p, rng.below(3) as u8, op)
            })
            .collect();
        calls += ops.len() as u64;
        let replies = futures_util::future::join_all(ops.iter().map(|&(p, k, op)| {
            let remote = &remotes[p];
            async move {
                let key = [b'k', b'0' + k];
                match op {
                    Op::Check(n) => Some(at(t, remote.decide(&key, n, true)).await.unwrap()),
                    Op::Peek(n) => Some(at(t, remote.decide(&key, n, false)).await.unwrap()),
                    Op::Refund(n) => {
                        at(t, remote.refund_key(&key, n)).await.unwrap();
                        None
                    }
                    Op::Reset => unreachable!(),
                }
            }
        }))
        .await;
        for (i, (&(p, k, op), got)) in ops.iter().zip(replies).enumerate() {
            let want = match op {
                Op::Check(n) => locals[p].check_key_n_at(&k, now, n).unwrap(),
                Op::Peek(n) => locals[p].peek_key_n(&k, n).unwrap(),
                Op::Refund(n) => {
                    locals[p].refund_key_at(&k, now, n);
                    continue;
                }
                Op::Reset => unreachable!(),
            };
            let got = got.expect("a decision");
            assert_eq!(
                fields(got.decision()),
                fields(want),
                "group {group} call {i} of {ops:?} ({:?}, key {k})",
                ps[p]
            );
            compared += 1;
            denied += usize::from(!want.is_allowed());
        }
    }
    let scripts = evalsha_calls(&server) - before;
    assert!(
        compared > 1000 && denied > 100,
        "{compared} compared, {denied} denied"
    );
    // Batched: far fewer script calls than calls.
    assert!(
        scripts * 2 < calls,
        "{scripts} script calls for {calls} calls"
    );
}

/// A limiter of `policy` named `name` on a backend of `server` with
/// batches of up to `max_batch` calls and one batch in flight at a time,
/// so the batches are the same on every run.
fn one_batch_at_a_time(
    server: &RedisServer,
    max_batch: usize,
    policy: Policy,
    name: &str,
) -> RedisLimiter {
    let backend = RedisBackend::builder(server.url())
        .timeout(Duration::from_secs(5))
        .max_batch(max_batch)
        .batches_in_flight(1)
        .build()
        .unwrap();
    RedisLimiter::builder(policy, &backend)
        .name(name)
        .build()
        .unwrap()
}

/// A call that fails inside a batch (its key holds another policy's state,
/// or a value of another type) is an error for that call only; the other
/// calls of the batch get their decisions, and the foreign keys are left
/// as they were. For every algorithm the batch reads ahead with its MGET
/// (which reads a key of another type as absent, so its write must fail).
// One thread: the calls of a group all queue before the runner sends,
// so the batches are the same on every run.
#[tokio::test(flavor = "current_thread")]
async fn a_failing_call_in_a_batch_fails_alone() {
    let server = RedisServer::start();
    let policies = [
        ("gcra", Policy::token_bucket(Rate::per_second(10).burst(5))),
        (
            "fixed",
            Policy::fixed_window(Window::new(5, Duration::from_secs(60))),
        ),
        (
            "sliding",
            Policy::sliding_window_counter(Window::new(5, Duration::from_secs(60))),
        ),
    ];
    for (name, policy) in policies {
        let l = one_batch_at_a_time(&server, super::DEFAULT_MAX_BATCH, policy, name);
        let text = format!("ratewall:{name}:text");
        let zset = format!("ratewall:{name}:zset");
        server.cmd(&["SET", &text, "not-a-number"]);
        server.cmd(&["ZADD", &zset, "1", "a"]);
        // Load both scripts (a call alone, then a batch) before counting.
        let warm = [&b"w1"[..], b"w2", b"w3"];
        for r in futures_util::future::join_all(warm.iter().map(|k| l.check_key(k))).await {
            assert!(r.unwrap().is_allowed());
        }
        let before = evalsha_calls(&server);
        let keys: Vec<&[u8]> = vec![b"a", b"text", b"b", b"zset", b"a", b"zset", b"c", b"a"];
        let replies = futures_util::future::join_all(keys.iter().map(|k| l.check_key(k))).await;
        for (k, r) in keys.iter().zip(&replies) {
            match *k {
                // The script's own message for that call, not a parse error.
                b"text" => assert!(
                    matches!(r, Err(super::RedisError::Server { message }) if message.contains("state of another policy") && !message.contains("unexpected")),
                    "{name}: {r:?}"
                ),
                b"zset" => assert!(
                    matches!(r, Err(super::RedisError::Server { message }) if message.contains("WRONGTYPE") && !message.contains("unexpected")),
                    "{name}: {r:?}"
                ),
                _ => assert!(r.as_ref().is_ok_and(|d| d.is_allowed()), "{name}: {r:?}"),
            }
        }
        // The three checks of "a" took three units, in order.
        let remaining: Vec<u64> = keys
            .iter()
            .zip(&replies)
            .filter(|(k, _)| **k == b"a")
            .map(|(_, r)| r.as_ref().unwrap().remaining())
            .collect();
        assert_eq!(remaining, [4, 3, 2], "{name}");
        assert!(
            server.cmd(&["GET", &text]).contains("not-a-number"),
            "{name}"
        );
        assert!(server.cmd(&["TYPE", &zset]).contains("zset"), "{name}");
        // All eight in one script call: the warm-up's runner still holds its
        // slot (it yields once before looking at the queue again), so every
        // call queues and it sends them together.
        let after = evalsha_calls(&server);
        assert_eq!(after - before, 1, "{name}: {before} -> {after}");
    }
}

/// Outside a tokio runtime, building a backend or calling one is a typed
/// error, never a panic.
#[test]
fn outside_a_runtime_calls_are_a_typed_error() {
    let outside = RedisBackend::builder("redis://127.0.0.1:1").build();
    assert_eq!(outside.unwrap_err(), super::RedisError::NoRuntime);
    let rt = tokio::runtime::Runtime::new().unwrap();
    for max_batch in [1, 64] {
        let backend = rt.block_on(async {
            RedisBackend::builder("redis://127.0.0.1:1")
                .max_batch(max_batch)
                .build()
                .unwrap()
        });
        let l = RedisLimiter::builder(Policy::token_bucket(Rate::per_second(1)), &backend)
            .on_failure(super::FailurePolicy::Closed)
            .build()
            .unwrap();
        let mut call = std::pin::pin!(l.check_key(b"k"));
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        match call.as_mut().poll(&mut cx) {
            std::task::Poll::Ready(r) => {
                assert_eq!(
                    r.unwrap_err(),
                    super::RedisError::NoRuntime,
                    "max_batch {max_batch}"
                )
            }
            std::task::Poll::Pending => panic!("max_batch {max_batch}: pending outside a runtime"),
        }
    }
}

/// A batch holds at most `max_batch` calls: 11 calls at once on a backend
/// with batches of 3 and one batch in flight go out as the first call
/// alone (nothing was in flight), then batches of 3, 3, 3 and 1.
// One thread: the batches are the same on every run.
#[tokio::test(flavor = "current_thread")]
async fn batches_hold_at_most_max_batch_calls() {
    let server = RedisServer::start();
    let l = one_batch_at_a_time(
        &server,
        3,
        Policy::token_bucket(Rate::per_second(1000).burst(100)),
        "max",
    );
    // Both scripts loaded, so no call meets NOSCRIPT (a second call).
    assert!(l.check_key(b"warm").await.unwrap().is_allowed());
    assert!(server
        .cmd(&["SCRIPT", "LOAD", super::script::BATCH_SOURCE])
        .starts_with('$'));
    let before = evalsha_calls(&server);
    let keys: Vec<String> = (0..11).map(|i| format!("k{i}")).collect();
    let replies =
        futures_util::future::join_all(keys.iter().map(|k| l.check_key(k.as_bytes()))).await;
    assert!(replies
        .iter()
        .all(|r| r.as_ref().is_ok_and(|d| d.is_allowed())));
    assert_eq!(evalsha_calls(&server) - before, 1 + 4);
}

/// A runtime that shuts down with a call on the wire and one queued gives
/// the slot back: the first caller's slot goes to a runner spawned as the
/// runtime drops its tasks, and that runner, dropped before it ever runs,
/// gives it back (its guard exists before the task). The next call, on
/// another runtime, is then sent at once instead of queueing behind a slot
/// nobody holds until its timeout. The backend's `Debug` shows its
/// batching.
#[test]
fn a_runtime_shut_down_mid_batch_leaves_no_slot_taken() {
    let server = RedisServer::start();
    let first = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let (backend, l) = first.block_on(async {
        let backend = RedisBackend::builder(server.url())
            .timeout(Duration::from_secs(3))
            .batches_in_flight(1)
            .build()
            .unwrap();
        let l = RedisLimiter::builder(Policy::token_bucket(Rate::per_second(100)), &backend)
            .name("shut")
            .on_failure(super::FailurePolicy::Closed)
            .build()
            .unwrap();
        assert!(l.check_key(b"warm").await.unwrap().is_allowed());
        (backend, l)
    });
    assert!(format!("{backend:?}").contains("max_batch: 128"));
    assert_eq!(server.cmd(&["CLIENT", "PAUSE", "400", "ALL"]), "+OK\r\n");
    let l = std::sync::Arc::new(l);
    for _ in 0..2 {
        // The first call goes inline and waits for the paused server; the
        // second queues behind it (one slot).
        let l = l.clone();
        first.spawn(async move { l.check_key(b"k").await });
    }
    std::thread::sleep(Duration::from_millis(100));
    drop(first);
    let second = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let started = std::time::Instant::now();
    let _ = second.block_on(l.check_key(b"k"));
    // Answered (or failed) when the pause ends or the connection is found
    // gone, not after the 3 s timeout of a call queued behind a lost slot.
    assert!(
        started.elapsed() < Duration::from_millis(2000),
        "{:?}",
        started.elapsed()
    );
}
