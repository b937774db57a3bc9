//! The tower layer over Redis limits (features `axum` and `redis`), against
//! real `redis-server`s that the tests start (tests/support/redis_server.rs):
//! the same 429 / Retry-After / RateLimit answers as local rules,
//! all-or-nothing across Redis+Redis and Redis+local mixes, 32 concurrent
//! clients through a real server, shadow and count-only-failures rules,
//! and each failure policy with the server killed.

mod support;

use axum::body::Body;
use axum::routing::{get, post};
use axum::{Extension, Router};
use http::{HeaderMap, Request, StatusCode};
use ratewall::http::{Key, Mode, RateLimitInfo, RateLimitLayer, Rule};
use ratewall::redis::{FailurePolicy, RedisBackend, RedisLimiter};
use ratewall::{Policy, Rate, Window};
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use support::http_client::Got;
use support::redis_server::RedisServer;
use tower::ServiceExt;

fn backend(server: &RedisServer) -> RedisBackend {
    RedisBackend::builder(server.url())
        .timeout(Duration::from_millis(300))
        .build()
        .unwrap()
}

fn limiter(b: &RedisBackend, name: &str, policy: Policy, failure: FailurePolicy) -> RedisLimiter {
    RedisLimiter::builder(policy, b)
        .name(name)
        .on_failure(failure)
        .build()
        .unwrap()
}

async fn info(info: Option<Extension<RateLimitInfo>>) -> String {
    match info {
        Some(Extension(info)) => info
            .iter()
            .map(|(n, d)| format!("{n}={}:{:?}", d.remaining(), info.source(n)))
            .collect::<Vec<_>>()
            .join(","),
        None => "none".into(),
    }
}

async fn login(headers: HeaderMap) -> StatusCode {
    if headers.get("x-password").is_some_and(|p| p == "right") {
        StatusCode::OK
    } else {
        StatusCode::UNAUTHORIZED
    }
}

fn make_app(layer: RateLimitLayer) -> Router {
    Router::new()
        .route("/", get(|| async { "ok" }))
        .route("/info", get(info))
        .route("/login", post(login))
        .layer(layer)
}

async fn send(app: &Router, method: &str, path: &str, peer: &str, headers: &[(&str, &str)]) -> Got {
    let mut req = Request::builder().method(method).uri(path);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let mut req = req.body(Body::empty()).unwrap();
    let ip: std::net::IpAddr = peer.parse().unwrap();
    req.extensions_mut()
        .insert(axum::extract::ConnectInfo(SocketAddr::new(ip, 40_000)));
    Got::read(app.clone().oneshot(req).await.unwrap()).await
}

async fn get_(app: &Router, peer: &str) -> Got {
    send(app, "GET", "/", peer, &[]).await
}

#[tokio::test]
async fn a_redis_rule_answers_429_with_retry_after_ratelimit_fields_and_problem_json() {
    let server = RedisServer::start();
    let b = backend(&server);
    let ip = limiter(
        &b,
        "ip",
        Policy::fixed_window(Window::per_minute(3)),
        FailurePolicy::Closed,
    );
    let layer = RateLimitLayer::builder()
        .rule(Rule::redis(Key::ip(), ip))
        .build()
        .unwrap();
    let app = make_app(layer.clone());
    for want in [2, 1, 0] {
        let got = get_(&app, "192.0.2.1").await;
        assert_eq!(got.status, StatusCode::OK);
        assert_eq!(got.remaining("ip"), Some(want));
        assert_eq!(
            got.headers["ratelimit-policy"].to_str().unwrap(),
            "\"ip\";q=3;w=60"
        );
    }
    let got = get_(&app, "192.0.2.1").await;
    assert_eq!(got.status, StatusCode::TOO_MANY_REQUESTS);
    let retry = got.retry_after().unwrap();
    assert!((1..=60).contains(&retry), "{retry}");
    assert_eq!(got.remaining("ip"), Some(0));
    assert_eq!(got.headers["content-type"], "application/problem+json");
    assert_eq!(got.json()["violated-policies"], serde_json::json!(["ip"]));
    // gRPC clients get RESOURCE_EXHAUSTED.
    let grpc = send(
        &app,
        "GET",
        "/",
        "192.0.2.1",
        &[("content-type", "application/grpc")],
    )
    .await;
    assert_eq!(grpc.headers["grpc-status"], "8");
    // Another client is not affected. The count is in Redis, under the
    // client's address as text.
    assert_eq!(get_(&app, "192.0.2.2").await.status, StatusCode::OK);
    assert!(server
        .cmd(&["KEYS", "ratewall:ip:*"])
        .contains("ratewall:ip:192.0.2.1"));
    // IPv6 by /64, the v4-mapped address as IPv4.
    assert_eq!(get_(&app, "2001:db8:1:2::7").await.status, StatusCode::OK);
    assert_eq!(get_(&app, "::ffff:192.0.2.9").await.status, StatusCode::OK);
    let keys = server.cmd(&["KEYS", "ratewall:ip:*"]);
    assert!(keys.contains("ratewall:ip:2001:db8:1:2::/64"), "{keys}");
    assert!(keys.contains("ratewall:ip:192.0.2.9\r"), "{keys}");
    let s = &layer.stats()[0];
    assert_eq!(
        (s.allowed(), s.denied(), s.errors(), s.fallbacks()),
        (6, 2, 0, 0)
    );
}

/// One app per mix: `ip` on every request, `login` on /login only.
async fn denied_requests_take_nothing(ip: Rule, login: Rule) {
    let layer = RateLimitLayer::builder()
        .rule(ip)
        .rule(login.on_path_prefix("/login"))
        .build()
        .unwrap();
    let app = make_app(layer.clone());
    let pw = [("x-password", "right")];
    for _ in 0..2 {
        assert_eq!(
            send(&app, "POST", "/login", "192.0.2.1", &pw).await.status,
            StatusCode::OK
        );
    }
    let before = get_(&app, "192.0.2.1").await.remaining("ip").unwrap();
    for _ in 0..3 {
        let denied = send(&app, "POST", "/login", "192.0.2.1", &pw).await;
        assert_eq!(denied.status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(
            denied.json()["violated-policies"],
            serde_json::json!(["login"])
        );
    }
    let after = get_(&app, "192.0.2.1").await.remaining("ip").unwrap();
    assert_eq!(
        after,
        before - 1,
        "the denied logins took nothing from `ip`"
    );
    let s = layer.stats();
    assert_eq!((s[0].allowed(), s[0].denied()), (4, 0));
    assert_eq!((s[1].allowed(), s[1].denied()), (2, 3));
}

/// A Redis rule has one name, its limiter's (issue 23, "the same name
/// twice"): the name in `RateLimit-Policy` and the stats is the one in the
/// Redis keys, a default name (`fw.…`) included; two rules on limiters of
/// one name are refused, and so is a limiter name that cannot name a rule,
/// each with an error naming `RedisLimiterBuilder::name` as the fix.
#[tokio::test]
async fn a_redis_rule_is_named_after_its_limiter() {
    use ratewall::http::HttpConfigError;
    let server = RedisServer::start();
    let b = backend(&server);
    let policy = Policy::fixed_window(Window::per_minute(3));
    let unnamed = RedisLimiter::builder(policy, &b).build().unwrap();
    let name = unnamed.name().to_owned();
    assert!(name.starts_with("fw."), "{name}");
    let named = limiter(&b, "per-ip", policy, FailurePolicy::Closed);
    // A limiter left with its default name is refused: the default names
    // only the algorithm, and would reach clients' headers.
    let err = RateLimitLayer::builder()
        .rule(Rule::redis(Key::ip(), unnamed))
        .build()
        .unwrap_err();
    assert_eq!(
        err,
        HttpConfigError::RedisLimiterUnnamed {
            default: name.clone()
        }
    );
    assert!(
        err.to_string().contains(&name) && err.to_string().contains(".name("),
        "{err}"
    );
    let ip = limiter(&b, "ip", policy, FailurePolicy::Closed);
    let rules = [
        Rule::redis(Key::ip(), ip),
        Rule::redis(Key::header("x-api-key"), named),
    ];
    assert_eq!([rules[0].name(), rules[1].name()], ["ip", "per-ip"]);
    let layer = RateLimitLayer::builder()
        .rule(rules[0].clone())
        .rule(rules[1].clone())
        .build()
        .unwrap();
    let app = make_app(layer.clone());
    let got = send(&app, "GET", "/", "192.0.2.1", &[("x-api-key", "k")]).await;
    assert_eq!(got.status, StatusCode::OK);
    assert_eq!(
        got.headers["ratelimit-policy"].to_str().unwrap(),
        "\"ip\";q=3;w=60, \"per-ip\";q=3;w=60"
    );
    assert_eq!(got.remaining("ip"), Some(2));
    let stats = layer.stats();
    assert_eq!([stats[0].name(), stats[1].name()], ["ip", "per-ip"]);
    assert_eq!((stats[0].allowed(), stats[1].allowed()), (1, 1));
    // The state is under the limiter's keys, of the same one name.
    assert!(server
        .cmd(&["KEYS", "ratewall:ip:*"])
        .contains("ratewall:ip:192.0.2.1"));

    // Two limiters of one name (they share one limit) under two rules:
    // refused, as is one limiter under two rules.
    let hourly = Policy::fixed_window(Window::per_hour(9));
    let twin = limiter(&b, "per-ip", hourly, FailurePolicy::Closed);
    let seconds = [
        Rule::redis(Key::ip(), twin),
        rules[1].clone().on_path_prefix("/login"),
    ];
    for second in seconds {
        let err = RateLimitLayer::builder()
            .rule(rules[1].clone())
            .rule(second)
            .build()
            .unwrap_err();
        let want = HttpConfigError::DuplicateRuleName {
            name: "per-ip".into(),
        };
        assert_eq!(err, want);
        assert!(err.to_string().contains("RedisLimiterBuilder::name"));
    }

    // A Redis name that is not a rule name: refused with the fix named.
    let digit = limiter(&b, "1st", policy, FailurePolicy::Closed);
    let err = RateLimitLayer::builder()
        .rule(Rule::redis(Key::ip(), digit))
        .build()
        .unwrap_err();
    assert_eq!(err, HttpConfigError::InvalidRuleName { name: "1st".into() });
    assert!(
        err.to_string().contains("RedisLimiterBuilder::name"),
        "{err}"
    );
}

#[tokio::test]
async fn a_denied_request_takes_nothing_redis_and_redis() {
    let server = RedisServer::start();
    let b = backend(&server);
    let ip = limiter(
        &b,
        "ip",
        Policy::token_bucket(Rate::per_minute(100)),
        FailurePolicy::Closed,
    );
    let login = limiter(
        &b,
        "login",
        Policy::sliding_window_log(Window::per_minute(2)),
        FailurePolicy::Closed,
    );
    denied_requests_take_nothing(Rule::redis(Key::ip(), ip), Rule::redis(Key::ip(), login)).await;
}

#[tokio::test]
async fn a_local_denial_gives_the_redis_units_back() {
    let server = RedisServer::start();
    let b = backend(&server);
    let ip = limiter(
        &b,
        "ip",
        Policy::fixed_window(Window::per_minute(100)),
        FailurePolicy::Closed,
    );
    denied_requests_take_nothing(
        Rule::redis(Key::ip(), ip),
        Rule::per_ip("login", Policy::sliding_window_log(Window::per_minute(2))),
    )
    .await;
}

#[tokio::test]
async fn a_redis_denial_leaves_the_local_rules_uncharged() {
    let server = RedisServer::start();
    let b = backend(&server);
    let login = limiter(
        &b,
        "login",
        Policy::fixed_window(Window::per_minute(2)),
        FailurePolicy::Closed,
    );
    denied_requests_take_nothing(
        Rule::per_ip("ip", Policy::token_bucket(Rate::per_minute(100))),
        Rule::redis(Key::ip(), login),
    )
    .await;
}

#[tokio::test]
async fn shadow_count_only_failures_and_the_decisions_extension() {
    let server = RedisServer::start();
    let b = backend(&server);
    let trial = limiter(
        &b,
        "trial",
        Policy::fixed_window(Window::per_minute(1)),
        FailurePolicy::Closed,
    );
    let login = limiter(
        &b,
        "login",
        Policy::fixed_window(Window::per_minute(2)),
        FailurePolicy::Closed,
    );
    let layer = RateLimitLayer::builder()
        .rule(Rule::redis(Key::ip(), trial).mode(Mode::Shadow))
        .rule(
            Rule::redis(Key::header("x-user"), login)
                .on_path_prefix("/login")
                .count_failures_only(),
        )
        .decisions_extension(true)
        .build()
        .unwrap();
    let app = make_app(layer.clone());
    // Shadow: never rejects, counts what it would have denied.
    for _ in 0..3 {
        assert_eq!(get_(&app, "192.0.2.1").await.status, StatusCode::OK);
    }
    let info = send(&app, "GET", "/info", "192.0.2.1", &[]).await;
    assert_eq!(info.text(), "trial=0:Some(Redis)");
    let s = &layer.stats()[0];
    assert_eq!((s.allowed(), s.shadow_denied()), (1, 3));
    // Count-only-failures: successful logins give their unit back.
    let user = [("x-user", "alice"), ("x-password", "right")];
    for _ in 0..5 {
        assert_eq!(
            send(&app, "POST", "/login", "192.0.2.1", &user)
                .await
                .status,
            StatusCode::OK
        );
    }
    // The refunds are sent in a task: wait for them.
    let deadline = Instant::now() + Duration::from_secs(5);
    while layer.stats()[1].refunded() < 5 {
        assert!(Instant::now() < deadline, "{:?}", layer.stats()[1]);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let wrong = [("x-user", "alice"), ("x-password", "wrong")];
    for _ in 0..2 {
        assert_eq!(
            send(&app, "POST", "/login", "192.0.2.1", &wrong)
                .await
                .status,
            StatusCode::UNAUTHORIZED
        );
    }
    let got = send(&app, "POST", "/login", "192.0.2.1", &user).await;
    assert_eq!(
        got.status,
        StatusCode::TOO_MANY_REQUESTS,
        "two failures spent the limit"
    );
    let names = server.cmd(&["KEYS", "ratewall:login:*"]);
    assert!(
        names.contains(&format!(
            "ratewall:login:{}",
            support::redis_limits::hashed("h:alice")
        )),
        "{names}"
    );
}

#[tokio::test]
async fn with_the_server_killed_each_failure_policy_does_what_it_says() {
    let mut server = RedisServer::start();
    let b = RedisBackend::builder(server.url())
        .timeout(Duration::from_millis(200))
        .build()
        .unwrap();
    let policy = Policy::fixed_window(Window::per_hour(2));
    let rules = [
        ("open", FailurePolicy::Open),
        ("closed", FailurePolicy::Closed),
        ("share", FailurePolicy::FallbackShare { instances: 1 }),
    ];
    let mut apps = Vec::new();
    for (name, failure) in rules {
        let layer = RateLimitLayer::builder()
            .rule(Rule::redis(Key::ip(), limiter(&b, name, policy, failure)))
            .decisions_extension(true)
            .build()
            .unwrap();
        let app = make_app(layer.clone());
        // Healthy: decided by Redis.
        let got = send(&app, "GET", "/info", "192.0.2.1", &[]).await;
        assert_eq!(got.text(), format!("{name}=1:Some(Redis)"));
        apps.push((name, layer, app));
    }
    server.kill9();
    for (name, layer, app) in &apps {
        for i in 0..4 {
            let t = Instant::now();
            let got = send(app, "GET", "/info", "192.0.2.1", &[]).await;
            assert!(
                t.elapsed() < Duration::from_secs(2),
                "{name} {i}: {:?}",
                t.elapsed()
            );
            match *name {
                "open" => {
                    assert_eq!(got.status, StatusCode::OK);
                    assert!(got.text().contains("Some(FailOpen)"), "{}", got.text());
                }
                "closed" => {
                    assert_eq!(got.status, StatusCode::SERVICE_UNAVAILABLE);
                    assert!(got.retry_after().unwrap() >= 1);
                    assert_eq!(
                        got.json()["violated-policies"],
                        serde_json::json!(["closed"])
                    );
                    let grpc = [("content-type", "application/grpc")];
                    let g = send(app, "GET", "/", "192.0.2.1", &grpc).await;
                    assert_eq!(g.status, StatusCode::OK);
                    assert_eq!(g.headers["grpc-status"], "14");
                }
                _ => {
                    // The local fallback holds the whole limit (2 per hour).
                    if i < 2 {
                        assert_eq!(got.status, StatusCode::OK, "{i}");
                        assert!(got.text().contains("Some(Fallback)"), "{}", got.text());
                    } else {
                        assert_eq!(got.status, StatusCode::TOO_MANY_REQUESTS, "{i}");
                    }
                }
            }
        }
        let s = &layer.stats()[0];
        match *name {
            "open" => assert_eq!((s.allowed(), s.errors(), s.fallbacks()), (5, 4, 0)),
            "closed" => assert_eq!((s.allowed(), s.errors(), s.fallbacks()), (1, 8, 0)),
            _ => assert_eq!((s.allowed(), s.denied(), s.fallbacks()), (3, 2, 4)),
        }
    }
}

/// A server that accepts but does not answer (`CLIENT PAUSE`): each
/// request waits at most the backend's timeout, then the failure policy
/// answers.
#[tokio::test]
async fn a_stalled_server_costs_at_most_the_timeout() {
    let server = RedisServer::start();
    let b = RedisBackend::builder(server.url())
        .timeout(Duration::from_millis(200))
        .build()
        .unwrap();
    let ip = limiter(
        &b,
        "ip",
        Policy::fixed_window(Window::per_minute(5)),
        FailurePolicy::Closed,
    );
    let layer = RateLimitLayer::builder()
        .rule(Rule::redis(Key::ip(), ip))
        .build()
        .unwrap();
    let app = make_app(layer.clone());
    assert_eq!(get_(&app, "192.0.2.1").await.status, StatusCode::OK);
    server.cmd(&["CLIENT", "PAUSE", "3000", "ALL"]);
    let t = Instant::now();
    let got = get_(&app, "192.0.2.1").await;
    let waited = t.elapsed();
    assert_eq!(got.status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(
        waited >= Duration::from_millis(150),
        "{waited:?}: it did wait for Redis"
    );
    assert!(waited < Duration::from_millis(1500), "{waited:?}");
    assert_eq!(layer.stats()[0].errors(), 1);
}

#[derive(Clone, Hash)]
struct UserId(u64);

/// Two instances (two layers, each with its own backend and limiters of
/// the same names) count against one limit: the Redis keys are the same
/// bytes in every process (not a seeded fingerprint), and bounded.
#[tokio::test]
async fn two_instances_share_one_limit_and_the_redis_keys_are_bounded() {
    let server = RedisServer::start();
    let instance = || {
        let b = backend(&server);
        let closed = FailurePolicy::Closed;
        let wide = Policy::fixed_window(Window::per_minute(100));
        let layer = RateLimitLayer::builder()
            .rule(Rule::redis(
                Key::extension::<UserId>(),
                limiter(
                    &b,
                    "user",
                    Policy::fixed_window(Window::per_minute(3)),
                    closed,
                ),
            ))
            .rule(Rule::redis(
                Key::composite([Key::ip(), Key::route()]),
                limiter(&b, "iproute", wide, closed),
            ))
            .rule(Rule::redis(
                Key::header("x-api-key"),
                limiter(&b, "key", wide, closed),
            ))
            .build()
            .unwrap();
        (layer.clone(), make_app(layer))
    };
    let (layer_a, a) = instance();
    let (layer_b, b) = instance();
    let huge = "k".repeat(10_000);
    let call = |app: &Router, user: u64| {
        let mut req = Request::builder()
            .uri("/")
            .header("x-api-key", huge.as_str())
            .body(Body::empty())
            .unwrap();
        req.extensions_mut().insert(UserId(user));
        req.extensions_mut()
            .insert(axum::extract::ConnectInfo(SocketAddr::new(
                [192, 0, 2, 1].into(),
                40_000,
            )));
        app.clone().oneshot(req)
    };
    let mut statuses = Vec::new();
    for (i, app) in [&a, &b, &a, &b, &a].into_iter().enumerate() {
        let user = if i == 4 { 8 } else { 7 };
        statuses.push(call(app, user).await.unwrap().status().as_u16());
    }
    assert_eq!(
        statuses,
        [200, 200, 200, 429, 200],
        "3 per minute for user 7, across both"
    );
    assert_eq!(
        layer_a.stats()[0].allowed() + layer_b.stats()[0].allowed(),
        4
    );
    let user_keys = server.cmd(&["KEYS", "ratewall:user:*"]);
    let lines: Vec<&str> = user_keys
        .lines()
        .filter(|l| l.starts_with("ratewall:"))
        .collect();
    assert_eq!(lines.len(), 2, "{user_keys}");
    for l in lines {
        // An extension's material (`x:` and a SHA-1 of its `Hash`) is
        // client material: named by its hash.
        let hex = l.strip_prefix("ratewall:user:~").unwrap();
        assert!(
            hex.len() == 32 && hex.bytes().all(|c| c.is_ascii_hexdigit()),
            "{l}"
        );
    }
    let api = server.cmd(&["KEYS", "ratewall:key:*"]);
    let key = api.lines().find(|l| l.starts_with("ratewall:")).unwrap();
    assert_eq!(
        key.len(),
        "ratewall:key:".len() + 33,
        "a 10 kB header is hashed: {key}"
    );
    // An address with a route is client material (the route): hashed.
    let iproute = server.cmd(&["KEYS", "ratewall:iproute:*"]);
    let material = "9:192.0.2.13:r:/"; // "192.0.2.1" and "r:/", each after its length
    assert!(
        iproute.contains(&format!(
            "ratewall:iproute:{}\r",
            support::redis_limits::hashed(material)
        )),
        "{iproute}"
    );
}

mod end_to_end {
    use super::*;
    use support::http_client::{fetch, serve};

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn thirty_two_concurrent_clients_against_ten_per_minute_exactly_ten_succeed() {
        let server = RedisServer::start();
        let b = backend(&server);
        let ip = limiter(
            &b,
            "ip",
            Policy::token_bucket(Rate::per_minute(10)),
            FailurePolicy::Closed,
        );
        let layer = RateLimitLayer::builder()
            .rule(Rule::redis(Key::ip(), ip))
            .build()
            .unwrap();
        let (addr, stop, srv) = serve("127.0.0.1:0", make_app(layer.clone())).await;
        let tasks: Vec<_> = (0..32)
            .map(|_| tokio::spawn(async move { fetch(addr, "GET", "/", &[]).await.status }))
            .collect();
        let mut counts = (0, 0);
        for t in tasks {
            match t.await.unwrap() {
                StatusCode::OK => counts.0 += 1,
                StatusCode::TOO_MANY_REQUESTS => counts.1 += 1,
                other => panic!("unexpected {other}"),
            }
        }
        assert_eq!(counts, (10, 22));
        assert_eq!(layer.stats()[0].errors(), 0);
        drop(stop);
        srv.await.unwrap();
    }

    #[tokio::test]
    async fn atomic_over_http_with_redis_and_local_rules() {
        let server = RedisServer::start();
        let b = backend(&server);
        let ip = limiter(
            &b,
            "ip",
            Policy::token_bucket(Rate::per_minute(100)),
            FailurePolicy::Closed,
        );
        let layer = RateLimitLayer::builder()
            .rule(Rule::redis(Key::ip(), ip))
            .rule(
                Rule::per_ip("login", Policy::sliding_window_log(Window::per_minute(2)))
                    .on_path_prefix("/login"),
            )
            .build()
            .unwrap();
        let (addr, stop, srv) = serve("127.0.0.1:0", make_app(layer)).await;
        let pw = [("x-password", "right")];
        for _ in 0..2 {
            assert_eq!(
                fetch(addr, "POST", "/login", &pw).await.status,
                StatusCode::OK
            );
        }
        let before = fetch(addr, "GET", "/", &[]).await.remaining("ip").unwrap();
        for _ in 0..3 {
            let denied = fetch(addr, "POST", "/login", &pw).await;
            assert_eq!(denied.status, StatusCode::TOO_MANY_REQUESTS);
            assert_eq!(denied.retry_after(), Some(60));
        }
        let after = fetch(addr, "GET", "/", &[]).await.remaining("ip").unwrap();
        assert_eq!(after, before - 1);
        drop(stop);
        srv.await.unwrap();
    }
}

/// A local concurrency rule beside a Redis rule is one all-or-nothing step
/// (issue 21 item 5): a request the concurrency rule sheds gives its Redis
/// unit back, and one the Redis rule denies takes no permit.
#[tokio::test]
async fn a_local_concurrency_rule_and_a_redis_rule_are_one_step() {
    let server = RedisServer::start();
    let b = backend(&server);
    let ip = limiter(
        &b,
        "ip",
        Policy::token_bucket(Rate::per_hour(5).burst(5)),
        FailurePolicy::Closed,
    );
    let layer = RateLimitLayer::builder()
        .rule(Rule::redis(Key::ip(), ip))
        .rule(Rule::concurrent("db", Key::global(), 1).hide_headers())
        .build()
        .unwrap();
    let app = make_app(layer.clone());
    let mut req = Request::builder().uri("/").body(Body::empty()).unwrap();
    req.extensions_mut()
        .insert(axum::extract::ConnectInfo(SocketAddr::from((
            [192, 0, 2, 1],
            4,
        ))));
    // Its body unread, the response holds the permit.
    let held = app.clone().oneshot(req).await.unwrap();
    assert_eq!(held.status(), StatusCode::OK);
    assert_eq!(layer.stats()[1].in_flight(), 1);
    for _ in 0..3 {
        let shed = get_(&app, "192.0.2.1").await;
        assert_eq!(shed.status, StatusCode::SERVICE_UNAVAILABLE);
    }
    drop(held);
    assert_eq!(layer.stats()[1].in_flight(), 0);
    // 1 of 5 units taken by the held request; the shed ones gave theirs back.
    let ok = get_(&app, "192.0.2.1").await;
    assert_eq!((ok.status, ok.remaining("ip")), (StatusCode::OK, Some(3)));
    for _ in 0..3 {
        assert_eq!(get_(&app, "192.0.2.1").await.status, StatusCode::OK);
    }
    for _ in 0..3 {
        let denied = get_(&app, "192.0.2.1").await;
        assert_eq!(denied.status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(layer.stats()[1].in_flight(), 0);
    }
    let s = layer.stats();
    assert_eq!((s[0].allowed(), s[0].denied()), (5, 3));
    assert_eq!((s[1].allowed(), s[1].shed(), s[1].in_flight()), (5, 3, 0));
}

/// A key that holds another policy's data is that key's error, not the
/// store's: its requests answer 503 whatever the failure policy (here
/// `Open`, which must not admit it untracked), every other key is decided
/// by Redis, and the breaker stays closed.
#[tokio::test]
async fn a_key_holding_another_policys_data_answers_503_for_that_key_only() {
    let server = RedisServer::start();
    let b = backend(&server);
    let l = limiter(
        &b,
        "open",
        Policy::fixed_window(Window::per_hour(2)),
        FailurePolicy::Open,
    );
    let layer = RateLimitLayer::builder()
        .rule(Rule::redis(Key::ip(), l))
        .decisions_extension(true)
        .build()
        .unwrap();
    let app = make_app(layer.clone());
    server.cmd(&["HSET", "ratewall:open:192.0.2.9", "f", "v"]);
    for _ in 0..6 {
        let got = get_(&app, "192.0.2.9").await;
        assert_eq!(got.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(got.json()["violated-policies"], serde_json::json!(["open"]));
    }
    assert!(b.is_available());
    let got = send(&app, "GET", "/info", "192.0.2.1", &[]).await;
    assert_eq!(got.status, StatusCode::OK);
    assert_eq!(got.text(), "open=1:Some(Redis)");
    assert_eq!(layer.stats()[0].errors(), 6);
}

/// A fail-closed Redis rule through an outage logs one warning, when the
/// limiter starts failing, not one per rejected request (issue 30: 125
/// lines in a 5 s outage at 24 requests/s). Each rejected request is a
/// `debug` event.
#[cfg(feature = "tracing")]
#[tokio::test]
async fn an_outage_of_a_fail_closed_rule_is_one_warning_not_one_per_request() {
    use support::http_client::{fetch, serve};
    let out = support::logs::Captured::default();
    // A current-thread runtime: the server and the limiters run here too.
    let _guard = tracing::subscriber::set_default(out.subscriber());
    tracing::callsite::rebuild_interest_cache();
    let mut server = RedisServer::start();
    let b = backend(&server);
    let l = limiter(
        &b,
        "closed",
        Policy::token_bucket(Rate::per_second(1000)),
        FailurePolicy::Closed,
    );
    let layer = RateLimitLayer::builder()
        .rule(Rule::redis(Key::ip(), l))
        .build()
        .unwrap();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer);
    let (addr, stop, task) = serve("127.0.0.1:0", app).await;
    assert_eq!(fetch(addr, "GET", "/", &[]).await.status, StatusCode::OK);
    server.kill9();
    for i in 0..40 {
        let got = fetch(addr, "GET", "/", &[]).await;
        assert_eq!(got.status, StatusCode::SERVICE_UNAVAILABLE, "{i}");
    }
    assert_eq!(out.warnings(), 1, "one warning for the outage");
    drop(stop);
    task.await.unwrap();
}
