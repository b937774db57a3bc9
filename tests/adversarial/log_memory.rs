//! Memory to spend through a sliding log: a client sends one request of
//! a huge cost (read from `content-length`) under each of many new keys of
//! a `100000/h sliding-log` rule. Each new key used to cost the host
//! `8 * limit` bytes (800 KB) and Redis one list entry per unit of cost;
//! now a log's memory follows its distinct admission times, not its limit.

use crate::support::http_client::call;
use crate::support::redis_server::RedisServer;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::get;
use axum::Router;
use ratewall::http::{Key, RateLimitLayer, Rule};
use ratewall::redis::{RedisBackend, RedisLimiter};
use ratewall::{ManualClock, Policy};
use std::time::Duration;

/// The attacker's new keys, each with one request of cost `COST`.
const KEYS: usize = 200;
const COST: u64 = 100_000;

/// The request's cost: its declared body length (0 if absent or bad).
fn content_length(headers: &HeaderMap) -> u64 {
    headers
        .get("content-length")
        .and_then(|v| v.to_str().ok()?.parse().ok())
        .unwrap_or(0)
}

fn app(rule: Rule) -> Router {
    let layer = RateLimitLayer::builder()
        .clock(ManualClock::new())
        .rule(rule.cost_fn(|_, _, headers| content_length(headers)))
        .build()
        .unwrap();
    Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer)
}

/// One big-cost request under `key`, through the layer in process.
async fn big(app: &Router, key: &str, cost: u64) -> StatusCode {
    let cost = cost.to_string();
    call(
        app,
        "GET",
        "/",
        "192.0.2.1",
        &[("x-api-key", key), ("content-length", &cost)],
    )
    .await
    .status
}

/// 200 new keys, one request of cost 100,000 each, through the real
/// tower layer: the bytes the process still holds afterwards (counted by
/// the allocator, on this thread) stay under 512 per key, where each key
/// used to keep an 800 KB ring. The limit is still exact per key.
#[test]
fn new_keys_with_big_costs_cost_the_host_a_few_bytes_each() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let app = app(Rule::per_header(
        "bulk",
        "x-api-key",
        "100000/h sliding-log".parse::<Policy>().unwrap(),
    )
    .max_keys(10_000));
    // One request first: anything built lazily on the first call is not
    // the attack's.
    assert_eq!(rt.block_on(big(&app, "warm-up", COST)), StatusCode::OK);
    let mut statuses = Vec::new();
    let held = allocation_counter::measure(|| {
        rt.block_on(async {
            for i in 0..KEYS {
                statuses.push(big(&app, &format!("attacker-{i}"), COST).await);
            }
        })
    });
    assert!(
        statuses.iter().all(|s| *s == StatusCode::OK),
        "{statuses:?}"
    );
    let per_key = held.bytes_current / KEYS as i64;
    assert!(
        per_key <= 512,
        "{per_key} bytes held per new key ({} in all, peak {})",
        held.bytes_current,
        held.bytes_max
    );
    // Exact all the same: every key is full for the hour.
    rt.block_on(async {
        assert_eq!(
            big(&app, "attacker-0", 1).await,
            StatusCode::TOO_MANY_REQUESTS
        );
        assert_eq!(
            big(&app, "fresh", COST + 1).await,
            StatusCode::PAYLOAD_TOO_LARGE
        );
        assert_eq!(big(&app, "fresh", COST).await, StatusCode::OK);
    });
}

/// The same attack against a Redis rule: each new key is one list of three
/// entries (the head, and one run: a time and a count), not 100,001, and a
/// few hundred bytes; the limit is exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_keys_with_big_costs_cost_redis_one_run_each() {
    let server = RedisServer::start();
    let backend = RedisBackend::builder(server.url())
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let limiter =
        RedisLimiter::builder("100000/h sliding-log".parse::<Policy>().unwrap(), &backend)
            .name("bulk")
            .build()
            .unwrap();
    let app = app(Rule::redis(Key::header("x-api-key"), limiter));
    for i in 0..20 {
        assert_eq!(
            big(&app, &format!("attacker-{i}"), COST).await,
            StatusCode::OK
        );
    }
    // A header's value is a credential: the layer names its key by a hash.
    let listed = server.cmd(&["KEYS", "ratewall:bulk:*"]);
    let keys: Vec<&str> = listed
        .lines()
        .filter(|l| l.starts_with("ratewall:bulk:"))
        .collect();
    assert_eq!(keys.len(), 20, "{listed}");
    for key in keys {
        let len: u64 = server.cmd(&["LLEN", key])[1..].trim().parse().unwrap();
        assert_eq!(len, 3, "{key}: the head and one run (time, count)");
        let usage: u64 = server.cmd(&["MEMORY", "USAGE", key])[1..]
            .trim()
            .parse()
            .unwrap();
        assert!(usage <= 256, "{key}: {usage} bytes");
    }
    // Exact: a full key denies one more unit, an empty one takes the limit.
    assert_eq!(
        big(&app, "attacker-0", 1).await,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(big(&app, "fresh", COST).await, StatusCode::OK);
    assert_eq!(big(&app, "fresh", 1).await, StatusCode::TOO_MANY_REQUESTS);
}
