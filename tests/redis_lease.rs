//! Redis leases (`RedisLeaseLimiter`) against real servers the tests start:
//! the exact bound with several instances on separate connections and
//! concurrent tasks (with releases and ended leases), round trips per
//! admitted request, the failure policies with the server killed, the
//! deny cache, and the units stranded in leases.
#![cfg(feature = "redis")]

mod support;

use ratewall::redis::{
    DecisionSource, FailurePolicy, RedisBackend, RedisError, RedisLeaseLimiter, RedisLeaseOptions,
    RedisLimiter,
};
use ratewall::{Policy, Rate};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::redis_server::{RedisCluster, RedisServer};

const HOUR: Duration = Duration::from_secs(3600);

fn backend(server: &RedisServer, timeout: Duration) -> RedisBackend {
    RedisBackend::builder(server.url())
        .timeout(timeout)
        .build()
        .unwrap()
}

/// A leased limiter on its own connection.
fn instance(
    server: &RedisServer,
    policy: Policy,
    name: &str,
    failure: FailurePolicy,
    options: RedisLeaseOptions,
) -> Arc<RedisLeaseLimiter> {
    let b = backend(server, Duration::from_secs(2));
    let l = RedisLimiter::builder(policy, &b)
        .prefix("lt")
        .name(name)
        .on_failure(failure)
        .build()
        .unwrap();
    Arc::new(RedisLeaseLimiter::new(l, options).unwrap())
}

/// Calls of the lease script the server ran since the last reset.
fn script_calls(server: &RedisServer) -> u64 {
    let stats = server.cmd(&["INFO", "commandstats"]);
    stats
        .lines()
        .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:"))
        .map(|l| {
            let calls = l.split("calls=").nth(1).unwrap();
            calls.split(',').next().unwrap().parse::<u64>().unwrap()
        })
        .sum()
}

#[derive(Default)]
struct Counts {
    admitted: AtomicU64,
    from_lease: AtomicU64,
    denied: AtomicU64,
}

/// `tasks` tasks per instance check `key` until `stop`, each releasing its
/// instance's lease now and then (1 check in `release_every`) and pausing
/// now and then (so leases end unused).
async fn hammer(
    instances: &[Arc<RedisLeaseLimiter>],
    tasks: usize,
    run: Duration,
    release_every: u64,
    pause: Option<Duration>,
) -> Arc<Counts> {
    let counts = Arc::new(Counts::default());
    let stop = Instant::now() + run;
    let mut handles = Vec::new();
    for (i, l) in instances.iter().enumerate() {
        for j in 0..tasks {
            let l = l.clone();
            let counts = counts.clone();
            handles.push(tokio::spawn(async move {
                let mut n = (i * 31 + j * 7) as u64;
                while Instant::now() < stop {
                    n += 1;
                    let d = l.check_key(b"hot").await.unwrap();
                    if d.is_allowed() {
                        counts.admitted.fetch_add(1, Ordering::Relaxed);
                        if d.source() == DecisionSource::Lease {
                            counts.from_lease.fetch_add(1, Ordering::Relaxed);
                        }
                    } else {
                        counts.denied.fetch_add(1, Ordering::Relaxed);
                    }
                    if n % release_every == 0 {
                        l.release_key(b"hot").await.unwrap();
                    }
                    if let Some(p) = pause.filter(|_| n % 97 == 0) {
                        tokio::time::sleep(p).await;
                    }
                    if n % 8 == 0 {
                        tokio::task::yield_now().await;
                    }
                }
            }));
        }
    }
    for h in handles {
        h.await.unwrap();
    }
    counts
}

/// No refill during the test (1 unit per 36 s): 4 instances x 6 tasks with
/// leases of up to 16 and random releases admit exactly the burst in
/// total, once every instance has given back what it holds: nothing over
/// the bound, and no unit lost in a lease that was released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_instances_admit_exactly_the_burst_and_lose_nothing_they_release() {
    let server = RedisServer::start();
    let policy = Policy::token_bucket(Rate::new(100, HOUR));
    let opts = RedisLeaseOptions::new()
        .max_lease(16)
        .hot_gap(Duration::from_secs(1))
        .life(Duration::from_secs(60));
    let instances: Vec<_> = (0..4)
        .map(|_| instance(&server, policy, "exact", FailurePolicy::Closed, opts))
        .collect();
    let counts = hammer(&instances, 6, Duration::from_millis(600), 13, None).await;
    let first = counts.admitted.load(Ordering::Relaxed);
    assert!(first <= 100, "{first} admitted, burst 100");
    assert!(counts.from_lease.load(Ordering::Relaxed) > 0, "leases used");
    let mut back = 0;
    for l in &instances {
        back += l.release_all().await.unwrap();
        assert_eq!(l.held(b"hot"), 0);
    }
    // A fresh instance now gets exactly what nobody used.
    let probe = instance(&server, policy, "exact", FailurePolicy::Closed, opts);
    let mut more = 0;
    while probe.check_key(b"hot").await.unwrap().is_allowed() {
        more += 1;
        assert!(more <= 100);
    }
    probe.release_all().await.unwrap();
    assert_eq!(
        first + more,
        100,
        "admitted {first} then {more} (released {back})"
    );
}

/// A refilling bucket (2000/s, burst 40) under 4 instances x 6 tasks, with
/// short leases that end unused during pauses and random releases: the
/// total admitted over the run is at most burst + rate x elapsed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refilling_bucket_never_admits_more_than_the_bound() {
    let server = RedisServer::start();
    let policy = Policy::token_bucket(Rate::per_second(2000).burst(40));
    let opts = RedisLeaseOptions::new()
        .max_lease(16)
        .hot_gap(Duration::from_millis(5))
        .life(Duration::from_millis(15));
    let instances: Vec<_> = (0..4)
        .map(|_| instance(&server, policy, "refill", FailurePolicy::Closed, opts))
        .collect();
    let start = Instant::now();
    let counts = hammer(
        &instances,
        6,
        Duration::from_millis(1200),
        29,
        Some(Duration::from_millis(20)),
    )
    .await;
    let elapsed = start.elapsed();
    let admitted = counts.admitted.load(Ordering::Relaxed);
    // T = 500 us.
    let bound = 40 + elapsed.as_micros() as u64 / 500;
    assert!(admitted <= bound, "{admitted} admitted, bound {bound}");
    assert!(counts.from_lease.load(Ordering::Relaxed) > 0);
    assert!(
        counts.denied.load(Ordering::Relaxed) > 0,
        "the limit was hit"
    );
    // Far from starved: at least a third of the bound.
    assert!(admitted * 3 >= bound, "{admitted} of {bound}");
}

/// Round trips per admitted request on a hot key that is not saturated:
/// 4 instances, 2 tasks each, ~20k checks/s each against 1M/s. With leases
/// of 16 at most 1 round trip per 10 admitted; with `max_lease(1)`, one
/// per check.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_of_16_cut_round_trips_per_admitted_request_tenfold() {
    let server = RedisServer::start();
    let policy = Policy::token_bucket(Rate::per_second(1_000_000).burst(10_000));
    let mut ratios = Vec::new();
    for max_lease in [1u64, 16] {
        let opts = RedisLeaseOptions::new().max_lease(max_lease);
        let instances: Vec<_> = (0..4)
            .map(|_| {
                instance(
                    &server,
                    policy,
                    &format!("rt{max_lease}"),
                    FailurePolicy::Closed,
                    opts,
                )
            })
            .collect();
        // Warm up (the first call loads the script), then count from zero.
        for l in &instances {
            let _ = l.check_key(b"warm").await.unwrap();
        }
        let before: u64 = instances.iter().map(|l| l.round_trips()).sum();
        server.cmd(&["CONFIG", "RESETSTAT"]);
        let stop = Instant::now() + Duration::from_millis(600);
        let mut handles = Vec::new();
        for l in &instances {
            for _ in 0..2 {
                let l = l.clone();
                handles.push(tokio::spawn(async move {
                    let (mut admitted, mut checks) = (0u64, 0u64);
                    while Instant::now() < stop {
                        for _ in 0..20 {
                            checks += 1;
                            admitted += u64::from(l.check_key(b"hot").await.unwrap().is_allowed());
                        }
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                    (admitted, checks)
                }));
            }
        }
        let (mut admitted, mut checks) = (0, 0);
        for h in handles {
            let (a, c) = h.await.unwrap();
            admitted += a;
            checks += c;
        }
        let calls = script_calls(&server);
        let ours: u64 = instances.iter().map(|l| l.round_trips()).sum::<u64>() - before;
        assert_eq!(admitted, checks, "not saturated: all admitted");
        assert_eq!(calls, ours, "the server ran every call we counted, once");
        let ratio = calls as f64 / admitted as f64;
        println!("max_lease {max_lease}: {admitted} admitted, {calls} script calls, {ratio:.3} per admitted");
        ratios.push(ratio);
    }
    assert!(ratios[0] > 0.99, "without leases: one call per check");
    assert!(ratios[1] <= 0.1, "with leases of 16: {:.3}", ratios[1]);
}

/// Leases held when the server dies keep admitting until they run out;
/// then the failure policy answers (fallback, or a typed error), each
/// within the timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_outlive_a_killed_server_then_the_failure_policy_answers() {
    let mut server = RedisServer::start();
    let policy = Policy::token_bucket(Rate::new(1000, HOUR));
    let opts = RedisLeaseOptions::new()
        .max_lease(16)
        .hot_gap(Duration::from_secs(10))
        .life(Duration::from_secs(30));
    let timeout = Duration::from_millis(100);
    let make = |name: &str, failure| {
        let b = backend(&server, timeout);
        let l = RedisLimiter::builder(policy, &b)
            .prefix("lt")
            .name(name)
            .on_failure(failure)
            .build()
            .unwrap();
        RedisLeaseLimiter::new(l, opts).unwrap()
    };
    let closed = make("closed", FailurePolicy::Closed);
    let fallback = make("fallback", FailurePolicy::FallbackShare { instances: 4 });
    for l in [&closed, &fallback] {
        // Grow the lease to 16: takes of 1, 2, 4, 8, 16 units.
        let mut checks = 0;
        while l.held(b"k") < 15 {
            assert!(l.check_key(b"k").await.unwrap().is_allowed());
            checks += 1;
            assert!(checks < 64);
        }
    }
    server.kill9();
    for (l, name) in [(&closed, "closed"), (&fallback, "fallback")] {
        for i in 0..15 {
            let t = Instant::now();
            let d = l.check_key(b"k").await.unwrap();
            assert!(
                d.is_allowed() && d.source() == DecisionSource::Lease,
                "{name} {i}"
            );
            assert_eq!(d.remaining(), 14 - i);
            assert!(t.elapsed() < Duration::from_millis(5));
        }
        let t = Instant::now();
        let next = l.check_key(b"k").await;
        assert!(t.elapsed() < timeout + Duration::from_millis(400), "{name}");
        match name {
            "closed" => assert!(
                matches!(next, Err(RedisError::Unavailable { .. })),
                "{next:?}"
            ),
            _ => assert_eq!(next.unwrap().source(), DecisionSource::Fallback),
        }
    }
}

/// The deny cache answers a denied key locally; a release by this
/// instance clears it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_deny_cache_composes_with_leases() {
    let server = RedisServer::start();
    let b = backend(&server, Duration::from_secs(2));
    let l = RedisLimiter::builder(Policy::token_bucket(Rate::new(6, HOUR)), &b)
        .prefix("lt")
        .name("dc")
        .deny_cache(100)
        .on_failure(FailurePolicy::Closed)
        .build()
        .unwrap();
    let l = RedisLeaseLimiter::new(
        l,
        RedisLeaseOptions::new()
            .max_lease(4)
            .hot_gap(Duration::from_secs(10))
            .life(Duration::from_secs(30)),
    )
    .unwrap();
    let other = instance(
        &server,
        Policy::token_bucket(Rate::new(6, HOUR)),
        "dc",
        FailurePolicy::Closed,
        RedisLeaseOptions::new().max_lease(1),
    );
    // This instance: takes of 1 and 2 units (3 admitted, 1 held).
    for _ in 0..2 {
        assert!(l.check_key(b"k").await.unwrap().is_allowed());
    }
    assert_eq!(l.held(b"k"), 1);
    // Another instance takes the other 3; then it is denied.
    for _ in 0..3 {
        assert!(other.check_key(b"k").await.unwrap().is_allowed());
    }
    assert!(!other.check_key(b"k").await.unwrap().is_allowed());
    // This one uses its last leased unit, then Redis denies, then the cache.
    assert_eq!(
        l.check_key(b"k").await.unwrap().source(),
        DecisionSource::Lease
    );
    let d = l.check_key(b"k").await.unwrap();
    assert!(!d.is_allowed() && d.source() == DecisionSource::Redis);
    let calls = l.round_trips();
    for _ in 0..10 {
        let d = l.check_key(b"k").await.unwrap();
        assert!(!d.is_allowed());
        assert_eq!(d.source(), DecisionSource::DenyCache);
        assert_eq!(d.remaining(), 0);
    }
    assert_eq!(l.round_trips(), calls, "no round trip for cached denials");
}

/// The worst-case false denial: `h` holders that each just took a full
/// lease of `k` strand exactly `h x (k - 1)` units (another instance is
/// denied although the bucket had them); `release_all` returns every one.
/// A lease that ends unreleased is charged as used at its end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stranded_units_are_holders_times_lease_minus_one_and_come_back() {
    let server = RedisServer::start();
    let burst = 300;
    let policy = Policy::token_bucket(Rate::new(burst, HOUR));
    for (h, k) in [(2u64, 4u64), (4, 8), (4, 16)] {
        let name = format!("s{h}x{k}");
        let opts = RedisLeaseOptions::new()
            .max_lease(k)
            .hot_gap(Duration::from_secs(10))
            .life(Duration::from_secs(60));
        let holders: Vec<_> = (0..h)
            .map(|_| instance(&server, policy, &name, FailurePolicy::Closed, opts))
            .collect();
        let mut admitted = 0;
        for l in &holders {
            // Until its newest lease is full: k - 1 units held, unused.
            while l.held(b"k") < k - 1 {
                assert!(l.check_key(b"k").await.unwrap().is_allowed());
                admitted += 1;
            }
        }
        let probe = instance(
            &server,
            policy,
            &name,
            FailurePolicy::Closed,
            RedisLeaseOptions::new().max_lease(1),
        );
        let mut got = 0;
        loop {
            let d = probe.check_key(b"k").await.unwrap();
            if !d.is_allowed() {
                assert_eq!(d.remaining(), 0);
                break;
            }
            got += 1;
        }
        let stranded = burst - admitted - got;
        println!("{h} holders, leases of {k}: {stranded} units stranded");
        assert_eq!(stranded, h * (k - 1), "{h} x {k}");
        let mut back = 0;
        for l in &holders {
            back += l.release_all().await.unwrap();
        }
        assert_eq!(back, stranded);
        let mut more = 0;
        while probe.check_key(b"k").await.unwrap().is_allowed() {
            more += 1;
        }
        assert_eq!(more, stranded, "every stranded unit came back");
    }
    // A lease that ends unreleased: charged as used at its end.
    let opts = RedisLeaseOptions::new()
        .max_lease(8)
        .hot_gap(Duration::from_secs(10))
        .life(Duration::from_millis(30));
    let l = instance(&server, policy, "ended", FailurePolicy::Closed, opts);
    let mut admitted = 0;
    while l.held(b"k") < 7 {
        assert!(l.check_key(b"k").await.unwrap().is_allowed());
        admitted += 1;
    }
    tokio::time::sleep(Duration::from_millis(60)).await;
    assert_eq!(l.held(b"k"), 0, "ended here");
    assert_eq!(l.release_all().await.unwrap(), 0);
    let probe = instance(
        &server,
        policy,
        "ended",
        FailurePolicy::Closed,
        RedisLeaseOptions::new().max_lease(1),
    );
    let mut got = 0;
    while probe.check_key(b"k").await.unwrap().is_allowed() {
        got += 1;
    }
    assert_eq!(admitted + got + 7, burst, "the 7 unused units were charged");
}

/// A check dropped while its take is in flight leaves nothing stuck (the
/// next check takes again), and a take that times out is not retried:
/// after the stall the server has run each call exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_or_timed_out_take_is_neither_stuck_nor_retried() {
    let server = RedisServer::start();
    let timeout = Duration::from_millis(50);
    let b = backend(&server, timeout);
    let l = RedisLimiter::builder(Policy::token_bucket(Rate::new(1000, HOUR)), &b)
        .prefix("lt")
        .name("stall")
        .on_failure(FailurePolicy::Closed)
        .build()
        .unwrap();
    let l = RedisLeaseLimiter::new(
        l,
        RedisLeaseOptions::new()
            .max_lease(16)
            .hot_gap(Duration::from_secs(10))
            .life(Duration::from_secs(30)),
    )
    .unwrap();
    // Takes of 1 and 2 units, then the leased unit: the next take asks
    // for 4 (others would wait for it).
    for _ in 0..3 {
        assert!(l.check_key(b"k").await.unwrap().is_allowed());
    }
    assert_eq!(l.held(b"k"), 0);
    server.cmd(&["CONFIG", "RESETSTAT"]);
    let before = l.round_trips();
    server.cmd(&["CLIENT", "PAUSE", "400", "ALL"]);
    assert!(
        tokio::time::timeout(Duration::from_millis(10), l.check_key(b"k"))
            .await
            .is_err(),
        "dropped mid-take"
    );
    let t = Instant::now();
    let next = tokio::time::timeout(Duration::from_secs(2), l.check_key(b"k"))
        .await
        .expect("not stuck behind the dropped take");
    assert!(
        matches!(next, Err(RedisError::Unavailable { .. })),
        "{next:?}"
    );
    assert!(t.elapsed() < timeout + Duration::from_millis(300));
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(l.round_trips() - before, 2);
    assert_eq!(script_calls(&server), 2, "each call ran once, none retried");
    assert!(l.check_key(b"k").await.unwrap().is_allowed());
}

/// On a 3-master Redis Cluster: 3 instances x 4 tasks with leases of up to
/// 8, on 6 keys spread over every master (no refill): at most the burst
/// per key, and after `release_all` another instance gets exactly the rest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_on_a_cluster_are_exact_on_every_master() {
    let cluster = RedisCluster::start(3);
    let policy = Policy::token_bucket(Rate::new(20, HOUR));
    let opts = RedisLeaseOptions::new()
        .max_lease(8)
        .hot_gap(Duration::from_secs(1))
        .life(Duration::from_secs(60));
    let make = |max_lease| {
        let b = RedisBackend::cluster_builder(cluster.urls())
            .timeout(Duration::from_secs(5))
            .build()
            .unwrap();
        let l = RedisLimiter::builder(policy, &b)
            .prefix("lc")
            .name("cl")
            .on_failure(FailurePolicy::Closed)
            .build()
            .unwrap();
        Arc::new(RedisLeaseLimiter::new(l, opts.max_lease(max_lease)).unwrap())
    };
    let instances: Vec<_> = (0..3).map(|_| make(8)).collect();
    let keys: Vec<String> = (0..6).map(|i| format!("k{i}")).collect();
    let mut owners = [0usize; 3];
    for k in &keys {
        let rkey = instances[0].limiter().redis_key(k.as_bytes()).unwrap();
        owners[cluster.owner(std::str::from_utf8(&rkey).unwrap())] += 1;
    }
    assert!(
        owners.iter().all(|&n| n > 0),
        "keys on every master: {owners:?}"
    );
    let admitted = Arc::new((0..6).map(|_| AtomicU64::new(0)).collect::<Vec<_>>());
    let mut handles = Vec::new();
    for l in &instances {
        for t in 0..4usize {
            let (l, keys, admitted) = (l.clone(), keys.clone(), admitted.clone());
            handles.push(tokio::spawn(async move {
                for round in 0..40usize {
                    let i = (round + t) % 6;
                    if l.check_key(keys[i].as_bytes()).await.unwrap().is_allowed() {
                        admitted[i].fetch_add(1, Ordering::Relaxed);
                    }
                }
            }));
        }
    }
    for h in handles {
        h.await.unwrap();
    }
    for l in &instances {
        l.release_all().await.unwrap();
    }
    let probe = make(1);
    for (i, k) in keys.iter().enumerate() {
        let first = admitted[i].load(Ordering::Relaxed);
        assert!(first <= 20, "{k}: {first}");
        let mut more = 0;
        while probe.check_key(k.as_bytes()).await.unwrap().is_allowed() {
            more += 1;
            assert!(more <= 20);
        }
        assert_eq!(first + more, 20, "{k}: {first} then {more}");
    }
}
