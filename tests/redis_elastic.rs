//! Elastic limits on Redis (`RedisElasticLimiter`) against real servers that
//! the tests start: the guarantee holds while other keys drain the pool,
//! the total stays within the guarantees in use plus the pool, concurrent
//! callers never over-draw the pool, a denial writes nothing, every key has
//! a TTL, the pool follows a run-time change, each failure policy does what
//! it says, and a 3-master Cluster runs the script (one hash tag).
//!
//! Spans are an hour, so nothing refills during a test and every count is
//! exact on the server's own clock.
#![cfg(feature = "redis")]

mod support;

use ratewall::redis::{
    DecisionSource, FailurePolicy, RedisBackend, RedisElasticLimiter, RedisError,
};
use ratewall::{Policy, Rate, Window};
use std::sync::Arc;
use std::time::Duration;
use support::redis_server::{RedisCluster, RedisServer};

const HOUR: Duration = Duration::from_secs(3600);

fn backend(url: String) -> RedisBackend {
    RedisBackend::builder(url)
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap()
}

/// A guarantee, ceiling and pool of `algorithm`, per hour.
fn parts(algorithm: usize, g: u64, c: u64, p: u64) -> (Policy, Policy, Policy) {
    let make = |n: u64| match algorithm {
        0 => Policy::token_bucket(Rate::new(n, HOUR)),
        1 => Policy::leaky_bucket(Rate::new(n, HOUR)),
        2 => Policy::fixed_window(Window::new(n, HOUR)),
        3 => Policy::sliding_window_counter(Window::new(n, HOUR)),
        _ => Policy::sliding_window_log(Window::new(n, HOUR)),
    };
    (make(g), make(c), make(p))
}

fn elastic(
    (g, c, p): (Policy, Policy, Policy),
    b: &RedisBackend,
    name: &str,
    failure: FailurePolicy,
) -> RedisElasticLimiter {
    RedisElasticLimiter::builder(g, c, p, b)
        .prefix("el")
        .name(name)
        .on_failure(failure)
        .build()
        .unwrap()
}

/// Three keys hammer the pool dry; a fourth key still gets exactly its
/// guarantee. In total, exactly the guarantees in use plus the pool pass,
/// and exactly the pool's worth is marked above the limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_gets_its_guarantee_while_others_drain_the_pool() {
    let server = RedisServer::start();
    let b = backend(server.url());
    for algorithm in 0..5 {
        let l = elastic(
            parts(algorithm, 5, 50, 20),
            &b,
            &format!("drain{algorithm}"),
            FailurePolicy::Closed,
        );
        let (mut admitted, mut above) = (0, 0);
        for hog in [&b"hog1"[..], b"hog2", b"hog3"] {
            for _ in 0..40 {
                let d = l.check_key(hog).await.unwrap();
                assert_eq!(d.source(), DecisionSource::Redis);
                assert_eq!(d.limit(), 5, "the guarantee's limit");
                admitted += u64::from(d.is_allowed());
                above += u64::from(d.is_above_limit());
            }
        }
        assert_eq!(above, 20, "algorithm {algorithm}: the whole pool, no more");
        let late: Vec<_> = futures(&l, b"late", 10).await;
        let guaranteed = late
            .iter()
            .filter(|d| d.is_allowed() && !d.is_above_limit())
            .count();
        assert_eq!(guaranteed, 5, "algorithm {algorithm}: {late:?}");
        assert!(late[5..].iter().all(|d| !d.is_allowed()));
        admitted += guaranteed as u64;
        // 4 keys in use x 5 guaranteed + a pool of 20.
        assert_eq!(admitted, 4 * 5 + 20, "algorithm {algorithm}");
        assert!(late[9].retry_after() > Duration::ZERO);
    }
}

/// 32 tasks on 4 connections, 16 keys (two tasks each), 12 checks per
/// task: exactly each key's guarantee plus exactly the pool pass, for every
/// algorithm. A pool over-drawn by one unit fails the count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_callers_never_over_draw_the_pool() {
    let server = RedisServer::start();
    let backends: Vec<RedisBackend> = (0..4).map(|_| backend(server.url())).collect();
    for algorithm in 0..5 {
        let limiters: Vec<Arc<RedisElasticLimiter>> = backends
            .iter()
            .map(|b| {
                Arc::new(elastic(
                    parts(algorithm, 2, 10, 25),
                    b,
                    &format!("race{algorithm}"),
                    FailurePolicy::Closed,
                ))
            })
            .collect();
        let mut tasks = Vec::new();
        for t in 0..32usize {
            let l = limiters[t % 4].clone();
            let key = format!("user{}", t % 16).into_bytes();
            tasks.push(tokio::spawn(async move {
                let (mut guaranteed, mut pooled) = (0u64, 0u64);
                for _ in 0..12 {
                    let d = l.check_key(&key).await.unwrap();
                    assert_eq!(d.source(), DecisionSource::Redis);
                    match (d.is_allowed(), d.is_above_limit()) {
                        (true, false) => guaranteed += 1,
                        (true, true) => pooled += 1,
                        _ => {}
                    }
                }
                (guaranteed, pooled)
            }));
        }
        let (mut guaranteed, mut pooled) = (0, 0);
        for t in tasks {
            let (g, p) = t.await.unwrap();
            guaranteed += g;
            pooled += p;
        }
        assert_eq!(guaranteed, 16 * 2, "algorithm {algorithm}");
        assert_eq!(pooled, 25, "algorithm {algorithm}: the pool exactly");
    }
}

/// Denials (by the ceiling, and by the pool) leave all three keys as they
/// were, byte for byte and TTL; every key written has a TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denial_writes_nothing_and_every_key_has_a_ttl() {
    let server = RedisServer::start();
    let b = backend(server.url());
    for algorithm in 0..5 {
        let name = format!("still{algorithm}");
        let l = elastic(parts(algorithm, 2, 4, 3), &b, &name, FailurePolicy::Closed);
        // a: 2 guaranteed + 2 from the pool (its ceiling); b: 2 + the last pool unit.
        for _ in 0..4 {
            assert!(l.check_key(b"a").await.unwrap().is_allowed());
        }
        for _ in 0..3 {
            assert!(l.check_key(b"b").await.unwrap().is_allowed());
        }
        let keys: Vec<String> = [&b"a"[..], b"b"]
            .iter()
            .flat_map(|k| l.redis_keys(k).unwrap())
            .map(|k| String::from_utf8(k).unwrap())
            .collect();
        let snapshot = |server: &RedisServer| -> Vec<(String, i64)> {
            keys.iter()
                .map(|k| {
                    let ttl: i64 = server.cmd(&["PTTL", k])[1..].trim().parse().unwrap();
                    (server.cmd(&["DUMP", k]), ttl)
                })
                .collect()
        };
        let before = snapshot(&server);
        // a: its ceiling is reached (the headroom denies); b: the pool is
        // empty (the pool denies after the headroom allowed).
        for _ in 0..3 {
            assert!(!l.check_key(b"a").await.unwrap().is_allowed());
            assert!(!l.check_key(b"b").await.unwrap().is_allowed());
        }
        let after = snapshot(&server);
        for (i, ((dump0, ttl0), (dump1, ttl1))) in before.iter().zip(&after).enumerate() {
            assert_eq!(dump0, dump1, "algorithm {algorithm}: {} changed", keys[i]);
            assert!(ttl1 <= ttl0, "algorithm {algorithm}: {} TTL grew", keys[i]);
        }
        let all = server.keys_with_pttl(&format!("el:{{{name}}}:*"));
        // g:a h:a g:b h:b pool, and a bucket pool's interval (pool:t).
        let expected = if algorithm < 2 { 6 } else { 5 };
        assert_eq!(all.len(), expected, "{all:?}");
        // At most the time to idle: one window (a sliding counter's: two).
        assert!(
            all.iter().all(|&(_, ttl)| ttl > 0 && ttl <= 2 * 3_600_000),
            "{all:?}"
        );
    }
}

/// The pool follows a run-time change: drained at 2, raised to 6, it
/// admits exactly 4 more; a change of algorithm, a soft pool or a window
/// pool of another length is refused, and nothing changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pool_follows_a_run_time_change() {
    let server = RedisServer::start();
    let b = backend(server.url());
    for algorithm in 2..5 {
        let (g, c, p) = parts(algorithm, 1, 20, 2);
        let l = elastic(
            (g, c, p),
            &b,
            &format!("signal{algorithm}"),
            FailurePolicy::Closed,
        );
        let above = |ds: &[ratewall::redis::RedisDecision]| {
            ds.iter().filter(|d| d.is_above_limit()).count()
        };
        let ds = futures(&l, b"k", 6).await;
        assert_eq!(above(&ds), 2, "algorithm {algorithm}");
        let raised = parts(algorithm, 1, 1, 6).2;
        l.set_pool(raised).unwrap();
        assert_eq!(l.pool(), raised);
        let ds = futures(&l, b"k", 6).await;
        assert_eq!(above(&ds), 4, "algorithm {algorithm}: {ds:?}");
        let shorter = Window::new(6, Duration::from_secs(60));
        let other_length = match algorithm {
            2 => Policy::fixed_window(shorter),
            3 => Policy::sliding_window_counter(shorter),
            _ => Policy::sliding_window_log(shorter),
        };
        for bad in [
            Policy::token_bucket(Rate::per_hour(9)),
            raised.soft(ratewall::Tolerance::Units(1)),
            other_length,
        ] {
            assert!(
                matches!(l.set_pool(bad), Err(RedisError::Config(_))),
                "{bad:?}"
            );
            assert_eq!(l.pool(), raised);
        }
    }
    // Buckets: the units in use are kept across a change of rate (the
    // script rescales the pool's TAT from the interval it was written
    // under), as `set_quota` does locally: 2 in use of a raised 6 leaves 4.
    // Lowered back to 3, the 6 in use are capped at the new burst.
    for algorithm in 0..2 {
        let (g, c, p) = parts(algorithm, 1, 20, 2);
        let l = elastic(
            (g, c, p),
            &b,
            &format!("signal{algorithm}"),
            FailurePolicy::Closed,
        );
        let ds = futures(&l, b"k", 4).await;
        assert_eq!(ds.iter().filter(|d| d.is_above_limit()).count(), 2);
        l.set_pool(parts(algorithm, 1, 1, 6).2).unwrap();
        let ds = futures(&l, b"k", 6).await;
        assert_eq!(
            ds.iter().filter(|d| d.is_above_limit()).count(),
            4,
            "algorithm {algorithm}: {ds:?}"
        );
        l.set_pool(parts(algorithm, 1, 1, 3).2).unwrap();
        let ds = futures(&l, b"k", 3).await;
        assert!(
            ds.iter().all(|d| !d.is_allowed()),
            "algorithm {algorithm}: {ds:?}"
        );
        // Back at 6 (rescaled from a full 3): full, not 6 units free.
        l.set_pool(parts(algorithm, 1, 1, 6).2).unwrap();
        assert!(!l.check_key(b"k").await.unwrap().is_allowed());
    }
}

/// With Redis down: open allows, closed errs, the fallback share runs a
/// local elastic limiter (guarantee, then pool, then denied), and a plain
/// fallback policy limits locally.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_failure_policy_does_what_it_says() {
    let port = support::redis_server::free_port(); // nothing listens there
    let b = RedisBackend::builder(format!("redis://127.0.0.1:{port}"))
        .timeout(Duration::from_millis(100))
        .build()
        .unwrap();
    let p = parts(2, 2, 4, 1);
    let open = elastic(p, &b, "open", FailurePolicy::Open);
    let d = open.check_key(b"k").await.unwrap();
    assert_eq!(d.source(), DecisionSource::FailOpen);
    assert!(d.is_allowed() && !d.is_above_limit());
    let closed = elastic(p, &b, "closed", FailurePolicy::Closed);
    assert!(matches!(
        closed.check_key(b"k").await,
        Err(RedisError::Unavailable { .. })
    ));
    let share = elastic(
        p,
        &b,
        "share",
        FailurePolicy::FallbackShare { instances: 1 },
    );
    let ds = futures(&share, b"k", 4).await;
    assert!(ds.iter().all(|d| d.source() == DecisionSource::Fallback));
    let marks: Vec<_> = ds
        .iter()
        .map(|d| (d.is_allowed(), d.is_above_limit()))
        .collect();
    assert_eq!(
        marks,
        [(true, false), (true, false), (true, true), (false, false)]
    );
    let plain = elastic(
        p,
        &b,
        "plain",
        FailurePolicy::Fallback(Policy::fixed_window(Window::per_hour(1))),
    );
    let ds = futures(&plain, b"k", 2).await;
    assert!(ds[0].is_allowed() && !ds[1].is_allowed());
    assert_eq!(ds[0].source(), DecisionSource::Fallback);
    // Bad input is a typed error before any call.
    assert!(matches!(
        share.check_key(b"").await,
        Err(RedisError::EmptyKey)
    ));
    assert!(matches!(
        share.check_key_n(b"k", 3).await,
        Err(RedisError::InsufficientCapacity(_))
    ));
}

/// A 3-master Cluster: the three keys of every check share the hash tag
/// `{name}`, so the script runs (no CROSSSLOT) on the tag's master, and
/// the counts are exact there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_runs_the_elastic_script_in_one_slot() {
    let cluster = RedisCluster::start(3);
    let b = RedisBackend::cluster_builder(cluster.urls())
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let l = Arc::new(elastic(
        parts(2, 2, 10, 12),
        &b,
        "tenants",
        FailurePolicy::Closed,
    ));
    let mut tasks = Vec::new();
    for t in 0..16usize {
        let l = l.clone();
        tasks.push(tokio::spawn(async move {
            let key = format!("user{}", t % 8).into_bytes();
            let mut out = (0u64, 0u64);
            for _ in 0..6 {
                let d = l.check_key(&key).await.unwrap();
                assert_eq!(d.source(), DecisionSource::Redis);
                out.0 += u64::from(d.is_allowed() && !d.is_above_limit());
                out.1 += u64::from(d.is_above_limit());
            }
            out
        }));
    }
    let (mut guaranteed, mut pooled) = (0, 0);
    for t in tasks {
        let (g, p) = t.await.unwrap();
        guaranteed += g;
        pooled += p;
    }
    assert_eq!((guaranteed, pooled), (8 * 2, 12));
    // Every key of the limit lives on the tag's master. Which users took
    // pool units depends on how the tasks were scheduled (a user that came
    // after the pool ran dry never wrote its headroom key: a denial writes
    // nothing), so each role (guarantee, headroom, pool) must exist on the
    // owner for some user, not for one chosen user.
    let owner = cluster.owner("{tenants}");
    let slot = cluster.slot("{tenants}");
    let mut written = [false; 3];
    for u in 0..8 {
        let keys = l.redis_keys(format!("user{u}").as_bytes()).unwrap();
        for (role, k) in keys.into_iter().enumerate() {
            let k = String::from_utf8(k).unwrap();
            assert_eq!(cluster.slot(&k), slot, "{k}");
            written[role] |= cluster.nodes[owner].cmd(&["EXISTS", &k]).starts_with(":1");
        }
    }
    assert_eq!(
        written, [true; 3],
        "guarantee, headroom and pool keys on the owner"
    );
}

/// `n` unit checks of `key`, one after the other.
async fn futures(
    l: &RedisElasticLimiter,
    key: &[u8],
    n: usize,
) -> Vec<ratewall::redis::RedisDecision> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(l.check_key(key).await.unwrap());
    }
    out
}

/// Memory: each key in use holds two small states (guarantee and
/// headroom, each the size of a plain limiter's key); the pool is one key
/// per limit (plus its interval for a bucket pool). Printed with
/// `--nocapture` for docs/distributed.md.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_per_key_is_two_small_states_and_one_shared_pool() {
    let server = RedisServer::start();
    let b = backend(server.url());
    for algorithm in 0..5 {
        let name = format!("mem{algorithm}");
        let l = elastic(
            parts(algorithm, 100, 300, 1000),
            &b,
            &name,
            FailurePolicy::Closed,
        );
        // Guarantee full, and 100 more from the pool: both per-key states
        // at their fullest for a sliding log.
        for _ in 0..2 {
            let d = l.check_key_n(b"user:1", 100).await.unwrap();
            assert!(d.is_allowed());
        }
        let usage = |k: &[u8]| -> u64 {
            let k = String::from_utf8(k.to_vec()).unwrap();
            server.cmd(&["MEMORY", "USAGE", &k])[1..]
                .trim()
                .parse()
                .unwrap()
        };
        let [g, h, p] = l.redis_keys(b"user:1").unwrap();
        let (g, h, p) = (usage(&g), usage(&h), usage(&p));
        println!("algorithm {algorithm}: guarantee {g} B, headroom {h} B, pool {p} B");
        let bound = if algorithm == 4 { 1200 } else { 120 };
        assert!(g > 0 && g <= bound && h > 0 && h <= bound, "{g} {h}");
    }
}

/// Bad input gets a typed error, never a panic: invalid policies and
/// names at build, an empty key, a key that holds something else, and a
/// huge binary key (hashed, bounded, inside the hash tag).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_typed_errors() {
    let server = RedisServer::start();
    let b = backend(server.url());
    let p = |s: &str| -> Policy { s.parse().unwrap() };
    for (g, c, pool) in [
        ("10/s", "5/s", "100/s"),         // ceiling below the guarantee
        ("10/s", "20/min", "100/s"),      // another period
        ("10/s soft 1", "20/s", "100/s"), // soft
        ("10/s", "20/s", "100/s fixed-window soft 5"),
    ] {
        let e = RedisElasticLimiter::builder(p(g), p(c), p(pool), &b)
            .build()
            .unwrap_err();
        assert!(matches!(e, RedisError::Config(_)), "{g} {c} {pool}: {e:?}");
    }
    let e = RedisElasticLimiter::builder(p("1/s"), p("2/s"), p("2000000/s"), &b)
        .build()
        .unwrap_err();
    assert!(matches!(e, RedisError::Unsupported { .. }), "{e:?}");
    for name in ["", "a b", "{x}", "a:b"] {
        let e = RedisElasticLimiter::builder(p("1/s"), p("2/s"), p("5/s"), &b)
            .name(name)
            .build()
            .unwrap_err();
        assert!(matches!(e, RedisError::InvalidName { .. }), "{name:?}");
    }
    let l = elastic(parts(2, 1, 2, 5), &b, "bad", FailurePolicy::Closed);
    assert_eq!(l.check_key(b"").await.unwrap_err(), RedisError::EmptyKey);
    let huge = vec![0xffu8; 1 << 20];
    assert!(l.check_key(&huge).await.unwrap().is_allowed());
    for k in l.redis_keys(&huge).unwrap() {
        assert!(k.len() <= "el:{bad}:g:".len() + 33 && k.starts_with(b"el:{bad}:"));
    }
    // Another program's data in the pool key: an error reply, not a reset.
    server.cmd(&["SET", "el:{bad}:pool", "hello"]);
    assert!(l.check_key(b"k").await.unwrap().is_allowed()); // the guarantee
    let e = l.check_key(b"k").await.unwrap_err(); // the pool is read
    assert!(matches!(e, RedisError::Server { .. }), "{e:?}");
    assert_eq!(server.cmd(&["GET", "el:{bad}:pool"]), "$5\r\nhello\r\n");
    assert!(b.is_available(), "Redis answered: the circuit stays closed");
}
