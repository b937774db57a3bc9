//! The attack: send the key header twice, the real value first and a new
//! random value second. The application (and anything reading
//! `headers.get`) sees the first line; a key built from all the lines was
//! a fresh bucket on every request, a full bypass of a header-keyed rule.
//! Now a key header sent more than once is a bad request (400) in an
//! enforced rule, whatever `when_missing` says, on local and Redis rules
//! and in composites; and a tier header sent twice names no tier.

use crate::support::http_client::{call, fetch, serve, Got};
use crate::support::redis_limits::{backend, limiter};
use crate::support::redis_server::RedisServer;
use axum::routing::get;
use axum::Router;
use http::StatusCode;
use ratewall::http::{Key, Missing, RateLimitLayer, Rule, RuleStats};
use ratewall::redis::FailurePolicy;
use ratewall::{ManualClock, Policy, Window};

const PEER: &str = "192.0.2.1";

fn app<C: ratewall::Clock + Clone + Send + Sync + 'static>(layer: RateLimitLayer<C>) -> Router {
    Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer)
}

fn three_a_minute() -> Policy {
    Policy::fixed_window(Window::per_minute(3))
}

/// Spends `key`'s quota under a 3/min rule, then tries 50 times more with
/// a second, fresh line after the real one: none may pass.
async fn spend_then_repeat(app: &Router, extra: &[(&str, &str)]) -> Vec<StatusCode> {
    let mut one = vec![("x-api-key", "valid-key")];
    one.extend_from_slice(extra);
    for _ in 0..3 {
        assert_eq!(
            call(app, "GET", "/", PEER, &one).await.status,
            StatusCode::OK
        );
    }
    assert_eq!(
        call(app, "GET", "/", PEER, &one).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    let mut seen = Vec::new();
    for i in 0..50 {
        let fresh = format!("random-{i}");
        let mut two = one.clone();
        two.push(("x-api-key", &fresh));
        seen.push(call(app, "GET", "/", PEER, &two).await.status);
    }
    seen
}

fn assert_all_rejected(seen: &[StatusCode], status: StatusCode) {
    assert!(
        seen.iter().all(|s| *s == status),
        "a repeated key header must be answered {status}, never a fresh bucket: {seen:?}"
    );
}

#[tokio::test]
async fn a_second_key_line_is_a_bad_request_never_a_fresh_bucket() {
    for missing in [
        None,
        Some(Missing::Skip),
        Some(Missing::Reject(StatusCode::UNAUTHORIZED)),
    ] {
        let mut rule = Rule::per_header("api", "x-api-key", three_a_minute());
        if let Some(m) = missing {
            rule = rule.when_missing(m);
        }
        let layer = RateLimitLayer::builder()
            .clock(ManualClock::new())
            .rule(rule)
            .build()
            .unwrap();
        let seen = spend_then_repeat(&app(layer.clone()), &[]).await;
        assert_all_rejected(&seen, StatusCode::BAD_REQUEST);
        let stats: Vec<RuleStats> = layer.stats();
        assert_eq!(stats[0].allowed(), 3, "{missing:?}");
        assert_eq!(stats[0].missing_key(), 50, "{missing:?}");
    }
}

#[tokio::test]
async fn a_repeated_header_inside_a_composite_key_is_a_bad_request() {
    let rule = Rule::new(
        "ip-and-key",
        Key::composite([Key::ip(), Key::header("x-api-key")]),
        three_a_minute(),
    );
    let layer = RateLimitLayer::builder()
        .clock(ManualClock::new())
        .rule(rule)
        .build()
        .unwrap();
    let seen = spend_then_repeat(&app(layer), &[]).await;
    assert_all_rejected(&seen, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn through_a_real_server_the_answer_names_the_header() {
    let layer = RateLimitLayer::builder()
        .rule(Rule::per_header("api", "x-api-key", three_a_minute()))
        .build()
        .unwrap();
    let (addr, stop, server) = serve("127.0.0.1:0", app(layer)).await;
    let got: Got = fetch(
        addr,
        "GET",
        "/",
        &[("x-api-key", "valid-key"), ("x-api-key", "other")],
    )
    .await;
    assert_eq!(got.status, StatusCode::BAD_REQUEST);
    let body = got.json();
    let detail = body["detail"].as_str().unwrap_or_default();
    assert!(detail.contains("more than once"), "{body}");
    // The same request with one line passes.
    let one = fetch(addr, "GET", "/", &[("x-api-key", "valid-key")]).await;
    assert_eq!(one.status, StatusCode::OK);
    drop(stop);
    server.await.unwrap();
}

#[tokio::test]
async fn a_premium_key_sent_twice_gets_neither_the_premium_tier_nor_a_fresh_bucket() {
    let rule = Rule::per_header("api", "x-api-key", three_a_minute())
        .tier("premium", Policy::fixed_window(Window::per_minute(100)))
        .tier_keys("premium", ["gold-1"]);
    let layer = RateLimitLayer::builder()
        .clock(ManualClock::new())
        .rule(rule)
        .build()
        .unwrap();
    let app = app(layer);
    let mut seen = Vec::new();
    for i in 0..20 {
        let fresh = format!("random-{i}");
        let got = call(
            &app,
            "GET",
            "/",
            PEER,
            &[("x-api-key", "gold-1"), ("x-api-key", &fresh)],
        )
        .await;
        seen.push(got.status);
    }
    assert_all_rejected(&seen, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn a_tier_header_sent_twice_names_no_tier() {
    let rule = Rule::per_ip("ip", three_a_minute())
        .tier("pro", Policy::fixed_window(Window::per_minute(30)))
        .tier_by_header("x-plan");
    let layer = RateLimitLayer::builder()
        .clock(ManualClock::new())
        .rule(rule)
        .build()
        .unwrap();
    let app = app(layer);
    let once = call(&app, "GET", "/", "192.0.2.7", &[("x-plan", "pro")]).await;
    assert_eq!(once.policy()[0].1, 30, "one line names the tier");
    let twice = call(
        &app,
        "GET",
        "/",
        "192.0.2.8",
        &[("x-plan", "pro"), ("x-plan", "pro")],
    )
    .await;
    assert_eq!(twice.status, StatusCode::OK);
    assert_eq!(twice.policy()[0].1, 3, "two lines: the rule's own policy");
}

#[tokio::test]
async fn on_redis_a_second_key_line_is_a_bad_request_too() {
    let server = RedisServer::start();
    let b = backend(&server);
    let l = limiter(&b, "api", three_a_minute(), FailurePolicy::Closed);
    let layer = RateLimitLayer::builder()
        .rule(Rule::redis(Key::header("x-api-key"), l))
        .build()
        .unwrap();
    let seen = spend_then_repeat(&app(layer), &[]).await;
    assert_all_rejected(&seen, StatusCode::BAD_REQUEST);
    // One key in Redis, the real one's (named by its hash): nothing was
    // written under a key made of the joined lines.
    let names = server.cmd(&["KEYS", "ratewall:api:*"]);
    assert!(names.starts_with("*1"), "{names}");
    let one = crate::support::redis_limits::hashed("h:valid-key");
    assert!(names.contains(&one), "{names}");
}
