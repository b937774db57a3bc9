//! Redis concurrency rules in the HTTP layer (`Rule::redis_concurrent`,
//! issue 21 item 5), against a real `redis-server` the tests start and real
//! servers and clients on loopback: two layers ("instances") on one Redis
//! share a per-key bound; the all-or-nothing step with Redis rate rules (a
//! rate denial takes no permit, read from Redis's own command counts; a
//! concurrency denial gives the rate units back); permits released at the
//! body's end and when it is dropped; Redis killed under `Open` and
//! `Closed`.

mod support;

use axum::routing::get;
use axum::Router;
use http::StatusCode;
use http_body_util::BodyExt;
use ratewall::http::{Key, PermitRelease, RateLimitLayer, Rule};
use ratewall::redis::{FailurePolicy, RedisBackend, RedisConcurrencyLimiter};
use ratewall::{Policy, Rate};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::http_client::{get_seen, head, held_route, serve, Gauge, Seen, Stalling};
use support::redis_limits::{backend, limiter};
use support::redis_server::RedisServer;
use tokio::sync::Semaphore;

fn permits(
    b: &RedisBackend,
    name: &str,
    max: u64,
    failure: FailurePolicy,
) -> RedisConcurrencyLimiter {
    RedisConcurrencyLimiter::builder(max, b)
        .name(name)
        .expiry(Duration::from_secs(30))
        .on_failure(failure)
        .build()
        .unwrap()
}

/// The units held in Redis under every key of the limiter `name` (the sum
/// the script keeps beside each key's permits).
fn held_in_redis(server: &RedisServer, name: &str) -> u64 {
    server
        .keys_with_pttl(&format!("*:{name}:*:n"))
        .iter()
        .map(|(k, _)| {
            let reply = server.cmd(&["GET", k]);
            reply
                .lines()
                .last()
                .and_then(|l| l.trim().parse::<u64>().ok())
                .unwrap_or(0)
        })
        .sum()
}

/// Waits (at most 5 s) until `held_in_redis` is `n`.
async fn held_becomes(server: &RedisServer, name: &str, n: u64) {
    for _ in 0..500 {
        if held_in_redis(server, name) == n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("held stayed {}, not {n}", held_in_redis(server, name));
}

/// The script calls Redis has run so far (`EVAL`, `EVALSHA`, `FCALL`).
fn script_calls(server: &RedisServer) -> u64 {
    server
        .cmd(&["INFO", "commandstats"])
        .lines()
        .filter(|l| l.starts_with("cmdstat_eval") || l.starts_with("cmdstat_fcall"))
        .filter_map(|l| {
            let calls = l.split("calls=").nth(1)?;
            calls.split(',').next()?.parse::<u64>().ok()
        })
        .sum()
}

/// `/` sleeps 150 ms inside `gauge`; `/hold` waits for a permit of `gate`.
fn app(layer: RateLimitLayer, gauge: Arc<Gauge>, gate: Arc<Semaphore>) -> Router {
    Router::new()
        .route("/", gauge.slow_route(Duration::from_millis(150)))
        .route("/hold", held_route(gate))
        .layer(layer)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_instances_share_a_per_key_bound_reached_and_never_exceeded() {
    let server = RedisServer::start();
    let gauge = Arc::new(Gauge::default());
    let mut addrs = Vec::new();
    let mut stops = Vec::new();
    for _instance in 0..2 {
        // Each instance its own backend and limiter, one name: one bound.
        let b = backend(&server);
        let layer = RateLimitLayer::builder()
            .rule(Rule::redis_concurrent(
                Key::header("x-tenant"),
                permits(&b, "jobs", 3, FailurePolicy::Closed),
            ))
            .build()
            .unwrap();
        let gate = Arc::new(Semaphore::new(0));
        let (addr, stop, task) = serve("127.0.0.1:0", app(layer, gauge.clone(), gate)).await;
        addrs.push(addr);
        stops.push((stop, task));
    }
    let mut ok = 0;
    for _round in 0..2 {
        let calls: Vec<_> = (0..12)
            .map(|i| {
                let addr = addrs[i % 2];
                tokio::spawn(async move { get_seen(addr, "/", &[("x-tenant", "t1")]).await })
            })
            .collect();
        for c in calls {
            let got = c.await.unwrap();
            match got.status {
                StatusCode::OK => ok += 1,
                // Keyed by the client: 429, with the rule's headers.
                StatusCode::TOO_MANY_REQUESTS => {
                    assert_eq!(got.r("jobs"), Some(0), "{:?}", got.headers);
                    assert!(got.retry_after().is_some());
                }
                other => panic!("unexpected {other}"),
            }
        }
        held_becomes(&server, "jobs", 0).await;
    }
    assert!((6..24).contains(&ok), "{ok} admitted");
    assert_eq!(
        gauge.most.load(Ordering::SeqCst),
        3,
        "reached, never exceeded"
    );
    // Another tenant has its own bound.
    assert_eq!(
        get_seen(addrs[0], "/", &[("x-tenant", "t2")]).await.status,
        StatusCode::OK
    );
    for (stop, task) in stops {
        drop(stop);
        task.await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_denial_takes_no_permit_and_a_permit_denial_gives_the_units_back() {
    let server = RedisServer::start();
    let b = backend(&server);
    let rate = limiter(
        &b,
        "calls",
        Policy::token_bucket(Rate::per_minute(3)),
        FailurePolicy::Closed,
    );
    let layer = RateLimitLayer::builder()
        .rule(Rule::redis(Key::header("x-tenant"), rate))
        .rule(Rule::redis_concurrent(
            Key::header("x-tenant"),
            permits(&b, "jobs", 1, FailurePolicy::Closed),
        ))
        .build()
        .unwrap();
    let gate = Arc::new(Semaphore::new(0));
    let (addr, stop, task) = serve("127.0.0.1:0", app(layer, Arc::default(), gate.clone())).await;
    let t1 = [("x-tenant", "t1")];
    // A holds the tenant's one permit.
    let a = tokio::spawn(async move { get_seen(addr, "/hold", &t1).await });
    held_becomes(&server, "jobs", 1).await;
    // B: the rate rule admits, the permit is refused: 429 by "jobs", and
    // the rate unit comes back.
    let b_ = get_seen(addr, "/", &t1).await;
    assert_eq!(b_.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(b_.r("jobs"), Some(0));
    gate.add_permits(1);
    assert_eq!(a.await.unwrap().status, StatusCode::OK);
    held_becomes(&server, "jobs", 0).await;
    // C: 3 - A - C = 1 left (0 had B's unit been kept).
    let c = get_seen(addr, "/", &t1).await;
    assert_eq!(c.status, StatusCode::OK);
    assert_eq!(c.r("calls"), Some(1), "{:?}", c.headers);
    assert_eq!(get_seen(addr, "/", &t1).await.status, StatusCode::OK);
    // An admitted request ran three scripts (rate, acquire, release) ...
    held_becomes(&server, "jobs", 0).await;
    let before = script_calls(&server);
    assert_eq!(
        get_seen(addr, "/", &[("x-tenant", "t9")]).await.status,
        StatusCode::OK
    );
    held_becomes(&server, "jobs", 0).await;
    assert_eq!(script_calls(&server) - before, 3);
    // ... a request the rate rule denies runs the rate script only.
    let before = script_calls(&server);
    let denied = get_seen(addr, "/", &t1).await;
    assert_eq!(denied.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(denied.r("calls"), Some(0));
    assert_eq!(
        script_calls(&server) - before,
        1,
        "a rate denial took a permit"
    );
    drop(stop);
    task.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permits_are_held_by_the_body_and_released_at_its_end_or_drop() {
    let server = RedisServer::start();
    let b = backend(&server);
    let layer = RateLimitLayer::builder()
        .rule(Rule::redis_concurrent(
            Key::global(),
            permits(&b, "stream", 1, FailurePolicy::Closed),
        ))
        .build()
        .unwrap();
    let dropped = Arc::new(AtomicUsize::new(0));
    let app = Router::new()
        .route("/stream", Stalling::route(dropped.clone()))
        .route("/", get(|| async { "ok" }))
        .layer(layer);
    let (addr, stop, task) = serve("127.0.0.1:0", app).await;
    // At the body's end.
    let got = get_seen(addr, "/", &[]).await;
    assert_eq!(got.status, StatusCode::OK);
    assert_eq!(
        got.header("ratelimit-policy"),
        Some("\"stream\";q=1;qu=\"concurrent-requests\""),
    );
    assert_eq!(got.r("stream"), Some(0));
    held_becomes(&server, "stream", 0).await;
    // Held while the body streams; a global rule sheds with 503.
    let res = head(addr, "/stream", &[]).await;
    assert_eq!(res.status(), StatusCode::OK);
    let mut body = res.into_body();
    body.frame().await.unwrap().unwrap();
    assert_eq!(held_in_redis(&server, "stream"), 1);
    let shed = get_seen(addr, "/", &[]).await;
    assert_eq!(shed.status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(shed.retry_after().is_some());
    // The client goes away: the body is dropped, the permit released.
    drop(body);
    held_becomes(&server, "stream", 0).await;
    assert_eq!(dropped.load(Ordering::SeqCst), 1);
    assert_eq!(get_seen(addr, "/", &[]).await.status, StatusCode::OK);
    drop(stop);
    task.await.unwrap();
}

async fn killed(failure: FailurePolicy) -> (Seen, Duration) {
    let mut server = RedisServer::start();
    let b = backend(&server);
    let layer = RateLimitLayer::builder()
        .rule(Rule::redis_concurrent(
            Key::header("x-tenant"),
            permits(&b, "jobs", 2, failure),
        ))
        .build()
        .unwrap();
    let gate = Arc::new(Semaphore::new(0));
    let (addr, stop, task) = serve("127.0.0.1:0", app(layer, Arc::default(), gate.clone())).await;
    let t1 = [("x-tenant", "t1")];
    assert_eq!(get_seen(addr, "/", &t1).await.status, StatusCode::OK);
    // One request holds a permit when Redis goes.
    let holding = tokio::spawn(async move { get_seen(addr, "/hold", &t1).await });
    held_becomes(&server, "jobs", 1).await;
    server.kill9();
    let start = Instant::now();
    let got = get_seen(addr, "/", &t1).await;
    let took = start.elapsed();
    // The holder's response is unharmed: its release cannot reach Redis
    // and is left to the permit's expiry.
    gate.add_permits(1);
    let held = tokio::time::timeout(Duration::from_secs(3), holding).await;
    assert_eq!(held.unwrap().unwrap().status, StatusCode::OK);
    drop(stop);
    task.await.unwrap();
    (got, took)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_killed_open_admits_closed_answers_503_and_neither_hangs() {
    let (open, took) = killed(FailurePolicy::Open).await;
    assert_eq!(open.status, StatusCode::OK, "open admits holding nothing");
    assert!(took < Duration::from_secs(3), "took {took:?}");
    let (closed, took) = killed(FailurePolicy::Closed).await;
    assert_eq!(closed.status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(closed.retry_after().is_some_and(|s| s >= 1));
    assert!(closed.text().contains("jobs"), "{}", closed.text());
    // A concurrency rule's outage is not told as rate limits, and the
    // detail's seconds agree with `Retry-After` in number.
    assert!(
        closed.text().contains("concurrency limit"),
        "{}",
        closed.text()
    );
    assert!(!closed.text().contains("rate limits"), "{}", closed.text());
    let secs = closed.retry_after().unwrap();
    let said = if secs == 1 {
        "1 second.".to_string()
    } else {
        format!("{secs} seconds.")
    };
    assert!(closed.text().contains(&said), "{}", closed.text());
    assert!(took < Duration::from_secs(3), "took {took:?}");
}

#[tokio::test]
async fn a_redis_permit_cannot_be_released_at_the_response_head() {
    let server = RedisServer::start();
    let b = backend(&server);
    let jobs = permits(&b, "jobs", 4, FailurePolicy::Closed);
    let err = RateLimitLayer::builder()
        .rule(Rule::redis_concurrent(Key::ip(), jobs).release_permit(PermitRelease::ResponseHead))
        .build()
        .unwrap_err();
    assert!(
        matches!(&err, ratewall::http::HttpConfigError::Policy { rule, error: ratewall::ConfigError::Incompatible { .. } } if rule == "jobs"),
        "{err:?}"
    );
    assert!(err.to_string().contains("release_permit"), "{err}");
}

/// A shed request gets the same `Retry-After` from the same formula
/// whatever the store (issue 30: 10 s for a Redis concurrency rule, 1 s for
/// the local rule on the same 200 ms route): the mean time this instance
/// saw a permit of the rule held, rounded up to whole seconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shed_request_is_told_the_same_retry_after_whatever_the_store() {
    let server = RedisServer::start();
    let b = backend(&server);
    let layer = RateLimitLayer::builder()
        .rule(Rule::concurrent("local", Key::global(), 1).on_path_prefix("/local"))
        .rule(
            Rule::redis_concurrent(
                Key::global(),
                permits(&b, "redis", 1, FailurePolicy::Closed),
            )
            .on_path_prefix("/redis"),
        )
        .build()
        .unwrap();
    let gate = Arc::new(Semaphore::new(0));
    let slow = || {
        get(|| async {
            tokio::time::sleep(Duration::from_millis(200)).await;
            "slow"
        })
    };
    let app = Router::new()
        .route("/local/slow", slow())
        .route("/redis/slow", slow())
        .route("/local/held", held_route(gate.clone()))
        .route("/redis/held", held_route(gate.clone()))
        .layer(layer);
    let (addr, stop, task) = serve("127.0.0.1:0", app).await;
    for _ in 0..3 {
        for store in ["local", "redis"] {
            let got = get_seen(addr, &format!("/{store}/slow"), &[]).await;
            assert_eq!(got.status, StatusCode::OK, "{store}");
        }
    }
    let mut held = Vec::new();
    for store in ["local", "redis"] {
        let path = format!("/{store}/held");
        held.push(tokio::spawn(
            async move { get_seen(addr, &path, &[]).await },
        ));
    }
    held_becomes(&server, "redis", 1).await;
    let mut told = Vec::new();
    for store in ["local", "redis"] {
        let shed = loop {
            // The local permit is taken once its request reaches the layer.
            let got = get_seen(addr, &format!("/{store}/slow"), &[]).await;
            if got.status == StatusCode::SERVICE_UNAVAILABLE {
                break got;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        told.push((store, shed.retry_after()));
    }
    assert_eq!(told, vec![("local", Some(1)), ("redis", Some(1))]);
    gate.add_permits(2);
    for h in held {
        assert_eq!(h.await.unwrap().status, StatusCode::OK);
    }
    drop(stop);
    task.await.unwrap();
}

/// A Redis concurrency rule is named after its limiter, as a Redis rate
/// rule is (one name in headers, stats, store events and Redis keys); a
/// limiter left with its default name (`cc.4`) is refused at build.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_concurrency_rule_takes_its_limiters_one_name() {
    let server = RedisServer::start();
    let b = backend(&server);
    let rule = Rule::redis_concurrent(Key::global(), permits(&b, "jobs", 4, FailurePolicy::Closed));
    assert_eq!(rule.name(), "jobs");
    let unnamed = RedisConcurrencyLimiter::builder(4, &b).build().unwrap();
    assert_eq!(unnamed.name(), "cc.4");
    let err = RateLimitLayer::builder()
        .rule(Rule::redis_concurrent(Key::global(), unnamed))
        .build()
        .unwrap_err();
    assert_eq!(
        err,
        ratewall::http::HttpConfigError::RedisLimiterUnnamed {
            default: "cc.4".into()
        }
    );
}
