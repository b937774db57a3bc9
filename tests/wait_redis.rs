//! Waiting on limits kept in Redis (features `wait` and `redis`), against a
//! real `redis-server` the test starts on a free loopback port: the async
//! check, then a sleep on its `retry_after` (the server's clock), the
//! deadline decided up front, a cost that can never pass, Redis' own
//! all-or-nothing `check_all`, and fair waiting through a `FairQueue`.

mod support;

use ratewall::redis::{self, FailurePolicy, RedisBackend, RedisError, RedisLimiter};
use ratewall::wait::{FairQueue, Wait, WaitError};
use ratewall::{Policy, Rate};
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::redis_server::RedisServer;

fn backend(server: &RedisServer) -> RedisBackend {
    RedisBackend::builder(server.url())
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap()
}

fn limiter(b: &RedisBackend, name: &str, rate: Rate) -> RedisLimiter {
    RedisLimiter::builder(Policy::token_bucket(rate), b)
        .prefix("wait")
        .name(name)
        .on_failure(FailurePolicy::Closed)
        .build()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_checks_wait_on_retry_after_with_deadlines_and_errors() {
    let server = RedisServer::start();
    let b = backend(&server);
    // 20/s, burst 2: the 3rd to 6th admissions are 50 ms apart.
    let l = limiter(&b, "pace", Rate::per_second(20).burst(2));
    let wait = Wait::new().timeout(Duration::from_secs(5));
    let start = Instant::now();
    for _ in 0..6 {
        let d = wait.until_async(|| l.check_key(b"k")).await.unwrap();
        assert!(d.is_allowed());
    }
    let took = start.elapsed();
    assert!(took >= Duration::from_millis(190), "{took:?}");
    assert!(took < Duration::from_secs(3), "{took:?}");

    // A minute's wait does not fit a second's deadline: an error at once.
    let slow = limiter(&b, "slow", Rate::per_minute(1).burst(1));
    assert!(slow.check_key(b"k").await.unwrap().is_allowed());
    let start = Instant::now();
    let err = wait.until_async(|| slow.check_key(b"k")).await.unwrap_err();
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "a sleep would be 55 s or more"
    );
    let last = err.last_decision().expect("the denial");
    assert!(last.retry_after() > Duration::from_secs(50), "{last:?}");

    // A cost above the burst can never pass; bad input is the limiter's error.
    let never = wait
        .until_async(|| l.check_key_n(b"k", 3))
        .await
        .unwrap_err();
    assert!(matches!(never, WaitError::InsufficientCapacity(e) if e.requested == 3));
    let empty = wait.until_async(|| l.check_key(b"")).await.unwrap_err();
    assert!(
        matches!(empty, WaitError::Limiter(RedisError::EmptyKey)),
        "{empty:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_global_and_a_per_customer_limit_in_redis_waited_on_together() {
    let server = RedisServer::start();
    let b = backend(&server);
    let global = Arc::new(limiter(&b, "global", Rate::per_hour(100).burst(100)));
    let per_customer = Arc::new(limiter(&b, "customer", Rate::per_second(10).burst(1)));
    let queue = Arc::new(FairQueue::new());
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let (global, per_customer, queue) = (global.clone(), per_customer.clone(), queue.clone());
        tasks.push(tokio::spawn(async move {
            let both = || {
                let (c, g) = (per_customer.clone(), global.clone());
                async move { redis::check_all(&[(&*c, &b"acme"[..], 1), (&*g, &b"all"[..], 1)]).await }
            };
            let wait = Wait::new().timeout(Duration::from_secs(5));
            queue.until_async(&wait, both).await.unwrap()
        }));
    }
    for t in tasks {
        let decisions = t.await.unwrap();
        assert_eq!(decisions.len(), 2);
        assert!(decisions.iter().all(|d| d.is_allowed()));
    }
    // 4 admissions at 10/s burst 1 for the customer: at least 300 ms.
    assert!(
        start.elapsed() >= Duration::from_millis(290),
        "{:?}",
        start.elapsed()
    );
    // Only the 4 admitted calls took from the global limit: the denials
    // took nothing from it.
    // (100 per hour: nothing refills meanwhile; `remaining` is after one more.)
    let g = global.peek_key(b"all").await.unwrap();
    assert_eq!(g.remaining(), 100 - 4 - 1);
}
