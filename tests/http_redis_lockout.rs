//! Premium tiers and lockouts of Redis rules (issue 23), against a real
//! `redis-server` the tests start: a lockout shared by two layers (two
//! "processes" on one Redis), one round trip that takes nothing from the
//! other rules while a key is blocked, a premium key's 10x in Redis, the
//! failure policy when Redis is gone; in process and end to end.

mod support;

use axum::routing::get;
use axum::Router;
use http::StatusCode;
use ratewall::http::{Key, RateLimitLayer, Rule};
use ratewall::redis::FailurePolicy;
use ratewall::{Policy, Rate, Window};
use std::time::Duration;
use support::http_client::{admitted_per_value, call, serve, Got};
use support::redis_limits::{backend, limiter};
use support::redis_server::RedisServer;

fn app(layer: RateLimitLayer) -> Router {
    Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer)
}

async fn send(app: &Router, peer: &str, headers: &[(&str, &str)]) -> Got {
    call(app, "GET", "/", peer, headers).await
}

const BLOCK: Duration = Duration::from_millis(1500);

/// One "process": its own backend, limiters and layer, on the shared Redis.
fn process(server: &RedisServer, failure: FailurePolicy) -> (Router, RateLimitLayer) {
    let b = backend(server);
    let login = limiter(
        &b,
        "login",
        Policy::token_bucket(Rate::per_second(3)),
        failure,
    );
    let all = limiter(
        &b,
        "all",
        Policy::fixed_window(Window::new(1000, Duration::from_secs(86_400))),
        failure,
    );
    let layer = RateLimitLayer::builder()
        .rule(Rule::redis(Key::ip(), login).block_for(BLOCK))
        .rule(Rule::redis(Key::global(), all))
        .build()
        .unwrap();
    (app(layer.clone()), layer)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_lockout_is_shared_by_two_processes_and_blocked_requests_take_nothing() {
    let server = RedisServer::start();
    let (a, layer_a) = process(&server, FailurePolicy::Closed);
    let (b, _) = process(&server, FailurePolicy::Closed);
    let ip = "192.0.2.7";
    for _ in 0..3 {
        assert_eq!(send(&a, ip, &[]).await.status, StatusCode::OK);
    }
    // The breach, through the other process: a block of 1.5 s, r=0, t=2.
    let breach = send(&b, ip, &[]).await;
    assert_eq!(breach.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(breach.retry_after(), Some(2));
    assert_eq!(breach.ratelimit(), vec![("login".to_owned(), 0, 2)]);
    let keys = server.keys_with_pttl("ratewall:login:#b:*");
    assert_eq!(keys.len(), 1, "{keys:?}");
    assert!(
        keys[0].0.ends_with(ip) && keys[0].1 > 1000 && keys[0].1 <= 1500,
        "{keys:?}"
    );
    // A bucket of 3/s has a unit back after 334 ms; the block holds in both
    // processes.
    tokio::time::sleep(Duration::from_millis(400)).await;
    for app in [&a, &b, &a] {
        let blocked = send(app, ip, &[]).await;
        assert_eq!(blocked.status, StatusCode::TOO_MANY_REQUESTS);
        // The block's end, rounded up: at most the 2 s of the breach, and at
        // least what Redis still holds after the answer (a loaded machine may
        // take the test past the 0.5 s where 2 becomes 1).
        let left_ms = server.keys_with_pttl("ratewall:login:#b:*")[0].1;
        let after = u64::try_from(left_ms).unwrap().div_ceil(1000);
        let got = blocked.retry_after().unwrap();
        assert!(
            (after..=2).contains(&got) && got >= 1,
            "the block's end, rounded up: {got} s, {left_ms} ms left"
        );
        assert_eq!(blocked.remaining("login"), Some(0));
    }
    // Another client passes; "all" lost nothing to the breach or the blocks.
    let other = send(&b, "192.0.2.8", &[]).await;
    assert_eq!(other.status, StatusCode::OK);
    assert_eq!(other.remaining("all"), Some(1000 - 4));
    tokio::time::sleep(BLOCK).await;
    let free = send(&a, ip, &[]).await;
    assert_eq!(free.status, StatusCode::OK, "the block ended");
    assert_eq!(free.remaining("all"), Some(1000 - 5));
    let s = &layer_a.stats()[0];
    assert_eq!((s.name(), s.allowed(), s.denied()), ("login", 4, 2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_redis_gone_the_failure_policy_decides_without_blocks() {
    let mut server = RedisServer::start();
    let (a, _) = process(&server, FailurePolicy::Open);
    for _ in 0..3 {
        assert_eq!(send(&a, "192.0.2.9", &[]).await.status, StatusCode::OK);
    }
    assert_eq!(
        send(&a, "192.0.2.9", &[]).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    server.kill9();
    // Open: admitted, the block (in Redis) unknown here.
    assert_eq!(send(&a, "192.0.2.9", &[]).await.status, StatusCode::OK);
    let (closed, _) = process(&server, FailurePolicy::Closed);
    assert_eq!(
        send(&closed, "192.0.2.9", &[]).await.status,
        StatusCode::SERVICE_UNAVAILABLE
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn end_to_end_a_premium_key_gets_ten_times_a_normal_key_in_redis() {
    let server = RedisServer::start();
    let b = backend(&server);
    let api = limiter(
        &b,
        "api",
        Policy::fixed_window(Window::per_minute(5)),
        FailurePolicy::Closed,
    );
    let layer = RateLimitLayer::builder()
        .rule(
            Rule::redis(Key::header("x-api-key"), api)
                .tier("premium", Policy::fixed_window(Window::per_minute(50)))
                .tier_keys("premium", ["gold"]),
        )
        .build()
        .unwrap();
    let (addr, stop, srv) = serve("127.0.0.1:0", app(layer)).await;
    let got = admitted_per_value(addr, "x-api-key", &["plain", "gold"], 60).await;
    assert_eq!(got, [(5, vec![5]), (50, vec![50])]);
    // Each tier's state under its own name.
    let mut names: Vec<String> = server
        .keys_with_pttl("ratewall:api*")
        .into_iter()
        .map(|(k, _)| k)
        .collect();
    names.sort();
    let hashed = support::redis_limits::hashed;
    let mut want = [
        format!("ratewall:api.premium:{}", hashed("h:gold")),
        format!("ratewall:api:{}", hashed("h:plain")),
    ];
    want.sort();
    assert_eq!(names, want);
    drop(stop);
    srv.await.unwrap();
}

#[cfg(feature = "serde")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_rule_from_toml_has_its_tiers_and_lockout() {
    let server = RedisServer::start();
    let config: ratewall::http::LayerConfig = toml::from_str(
        r#"
        [[rules]]
        name = "api"
        key = "header:x-api-key"
        policy = "2/min fixed-window"
        store = "redis"
        on_failure = "closed"
        tiers = { premium = "20/min fixed-window" }
        tier_keys = { premium = ["gold"] }
        block_for = "1s"
        "#,
    )
    .unwrap();
    let layer = config
        .to_builder_with_redis(&backend(&server))
        .unwrap()
        .build()
        .unwrap();
    let app = app(layer);
    let admitted = |key: &'static str| {
        let app = app.clone();
        async move {
            support::http_client::admitted(&app, "/", "192.0.2.1", &[("x-api-key", key)]).await
        }
    };
    assert_eq!(admitted("gold").await, 20);
    assert_eq!(admitted("plain").await, 2);
    let blocked = send(&app, "192.0.2.1", &[("x-api-key", "plain")]).await;
    assert_eq!(blocked.status, StatusCode::TOO_MANY_REQUESTS);
    // The later of the 1 s block and the window's own wait (to the end of
    // the current minute; only the block if a new minute has just begun):
    // never a time at which the request is still denied.
    let until_window_end = 60
        - std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs()
            % 60;
    let told = blocked.retry_after().unwrap();
    assert!(
        told == 1 || (told + 1 >= until_window_end && told <= until_window_end + 1),
        "told {told}, the window ends in {until_window_end} s"
    );
    let blocks: Vec<String> = server
        .keys_with_pttl("ratewall:api:#b:*")
        .into_iter()
        .map(|(k, _)| k)
        .collect();
    // One block per rule and key, whatever the tier.
    let mut blocks = blocks;
    blocks.sort();
    let hashed = support::redis_limits::hashed;
    let mut want = [
        format!("ratewall:api:#b:{}", hashed("h:gold")),
        format!("ratewall:api:#b:{}", hashed("h:plain")),
    ];
    want.sort();
    assert_eq!(blocks, want);
}
