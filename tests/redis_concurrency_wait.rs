//! `RedisConcurrencyLimiter::acquire_key` (waiting for a Redis permit)
//! against a real `redis-server` the tests start: waiters admitted as
//! holders release and the bound never exceeded, the deadline kept,
//! cancelled waits leaving nothing in Redis (well before the expiry could
//! reclaim it), and the failure policies with the server killed.
#![cfg(all(feature = "redis", feature = "wait"))]

mod support;

use ratewall::redis::{
    DecisionSource, FailurePolicy, RedisBackend, RedisConcurrencyLimiter, RedisError,
};
use ratewall::wait::{Wait, WaitError};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::redis_server::RedisServer;

fn backend(server: &RedisServer) -> RedisBackend {
    RedisBackend::builder(server.url())
        .timeout(Duration::from_millis(500))
        .build()
        .unwrap()
}

/// A limiter whose permits expire after a minute: anything these tests
/// see come back came back by a release, not by the expiry.
fn limiter(b: &RedisBackend, max: u64, failure: FailurePolicy) -> RedisConcurrencyLimiter {
    RedisConcurrencyLimiter::builder(max, b)
        .prefix("itw")
        .name("cc")
        .expiry(Duration::from_secs(60))
        .on_failure(failure)
        .build()
        .unwrap()
}

/// The permits Redis holds for `key` (members of its set).
fn held_in_redis(server: &RedisServer, l: &RedisConcurrencyLimiter, key: &[u8]) -> u64 {
    let zkey = String::from_utf8(l.redis_key(key).unwrap()).unwrap();
    let reply = server.cmd(&["ZCARD", &zkey]);
    reply
        .trim()
        .trim_start_matches(':')
        .parse()
        .unwrap_or_else(|_| panic!("ZCARD reply {reply:?}"))
}

async fn eventually(within: Duration, mut f: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + within;
    while Instant::now() < end {
        if f() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_waiters_on_two_permits_all_get_through_never_more_than_two() {
    let server = RedisServer::start();
    let (b1, b2) = (backend(&server), backend(&server));
    // Two instances of one limit.
    let instances = [
        limiter(&b1, 2, FailurePolicy::Closed),
        limiter(&b2, 2, FailurePolicy::Closed),
    ];
    let holders = Arc::new(AtomicU64::new(0));
    let peak = Arc::new(AtomicU64::new(0));
    let wait = Wait::new()
        .timeout(Duration::from_secs(10))
        .jitter(Duration::from_millis(2));
    let t = Instant::now();
    let tasks: Vec<_> = (0..8)
        .map(|i| {
            let l = instances[i % 2].clone();
            let (holders, peak) = (holders.clone(), peak.clone());
            tokio::spawn(async move {
                let permit = l.acquire_key(b"w", 1, &wait).await.unwrap();
                assert_eq!(permit.source(), DecisionSource::Redis);
                let now = holders.fetch_add(1, Ordering::SeqCst) + 1;
                assert!(now <= 2, "{now} holders of 2 permits");
                peak.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(30)).await;
                holders.fetch_sub(1, Ordering::SeqCst);
                if i % 2 == 0 {
                    assert!(permit.release().await.unwrap());
                } else {
                    drop(permit);
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    let took = t.elapsed();
    assert_eq!(peak.load(Ordering::SeqCst), 2);
    // 4 rounds of 30 ms at best; waiters retry on the mean hold time.
    assert!(took >= Duration::from_millis(120), "{took:?}");
    assert!(took < Duration::from_secs(5), "{took:?}");
    assert!(
        eventually(Duration::from_secs(2), || held_in_redis(
            &server,
            &instances[0],
            b"w"
        ) == 0)
        .await
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_deadline_is_kept_and_a_cost_above_the_maximum_fails_at_once() {
    let server = RedisServer::start();
    let b = backend(&server);
    let l = limiter(&b, 1, FailurePolicy::Closed);
    let held = l
        .try_acquire_key(b"d", 1)
        .await
        .unwrap()
        .into_permit()
        .unwrap();
    let wait = Wait::new()
        .timeout(Duration::from_millis(150))
        .jitter(Duration::from_secs(5)); // jitter is cut at the deadline
    let t = Instant::now();
    let e = l.acquire_key(b"d", 1, &wait).await.unwrap_err();
    let took = t.elapsed();
    assert!(
        matches!(e, WaitError::Deadline { last: Some(d) } if !d.is_allowed()),
        "{e:?}"
    );
    assert!(took >= Duration::from_millis(150), "{took:?}");
    assert!(took < Duration::from_millis(400), "{took:?}");
    assert_eq!(held_in_redis(&server, &l, b"d"), 1);
    assert!(matches!(
        l.acquire_key(b"d", 2, &wait).await,
        Err(WaitError::InsufficientCapacity(_))
    ));
    // Released while a waiter sleeps: admitted on its next try.
    let waiter = {
        let l = l.clone();
        tokio::spawn(async move {
            l.acquire_key(b"d", 1, &Wait::new().timeout(Duration::from_secs(5)))
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(held.release().await.unwrap());
    let p = waiter.await.unwrap().unwrap();
    assert_eq!(held_in_redis(&server, &l, b"d"), 1);
    drop(p);
}

/// Waits dropped at every moment of their script call (timeouts from 0 to
/// 1.5 ms, around a loopback round trip): whatever the script did, nothing
/// stays held in Redis, though the expiry (a minute) reclaims nothing here.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_waits_leave_nothing_held() {
    let server = RedisServer::start();
    let b = backend(&server);
    let l = limiter(&b, 1, FailurePolicy::Closed);
    let wait = Wait::new().timeout(Duration::from_secs(1));
    let (mut admitted, mut cancelled) = (0, 0);
    for i in 0..150u64 {
        match tokio::time::timeout(Duration::from_micros(i * 10), l.acquire_key(b"c", 1, &wait))
            .await
        {
            Ok(r) => {
                drop(r.unwrap());
                admitted += 1;
            }
            Err(_) => cancelled += 1,
        }
    }
    assert!(cancelled > 0 && admitted > 0, "{cancelled} {admitted}");
    assert!(
        eventually(Duration::from_secs(2), || held_in_redis(&server, &l, b"c")
            == 0)
        .await,
        "{} permits stranded",
        held_in_redis(&server, &l, b"c")
    );
    assert_eq!(l.held_here(b"c").unwrap(), 0);
    // And the unit is free again.
    assert!(l.try_acquire_key(b"c", 1).await.unwrap().is_allowed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_redis_down_each_failure_policy_answers_the_wait() {
    let mut server = RedisServer::start();
    let b = RedisBackend::builder(server.url())
        .timeout(Duration::from_millis(100))
        .build()
        .unwrap();
    let open = limiter(&b, 2, FailurePolicy::Open);
    let closed = limiter(&b, 2, FailurePolicy::Closed);
    let share = limiter(&b, 2, FailurePolicy::FallbackShare { instances: 2 });
    server.kill9();
    let wait = Wait::new().timeout(Duration::from_millis(300));
    let p = open.acquire_key(b"k", 1, &wait).await.unwrap();
    assert_eq!(p.source(), DecisionSource::FailOpen);
    let t = Instant::now();
    assert!(matches!(
        closed.acquire_key(b"k", 1, &wait).await,
        Err(WaitError::Limiter(RedisError::Unavailable { .. }))
    ));
    assert!(t.elapsed() < Duration::from_millis(300), "never retried");
    // The local share is 1: the second waits for the first, locally.
    let first = share.acquire_key(b"k", 1, &wait).await.unwrap();
    assert_eq!(first.source(), DecisionSource::Fallback);
    let second = {
        let share = share.clone();
        tokio::spawn(async move { share.acquire_key(b"k", 1, &wait).await })
    };
    tokio::time::sleep(Duration::from_millis(30)).await;
    drop(first);
    let second = second.await.unwrap().unwrap();
    assert_eq!(second.source(), DecisionSource::Fallback);
    let t = Instant::now();
    assert!(matches!(
        share.acquire_key(b"k", 1, &wait).await,
        Err(WaitError::Deadline { .. })
    ));
    assert!(t.elapsed() >= Duration::from_millis(300));
}
