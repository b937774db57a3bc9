//! Redis rules written as configuration (`store = "redis"` in a
//! `LayerConfig`; features `axum`, `serde` and `redis`), against real
//! `redis-server`s that the test starts (tests/support/redis_server.rs).
//!
//! Two instances (two layers, each with its own backend) built from one
//! configuration on one server answer a long request sequence exactly as
//! two instances built in Rust with `Rule::redis` do on another server:
//! the same statuses, `RateLimit` remaining values, policies and violated
//! policies, and `Retry-After` within the second that passes between the
//! two. The policies are hour-scale token buckets and sliding logs, whose
//! counts do not change while the test runs.

mod support;

use axum::body::Body;
use axum::routing::{get, post};
use axum::Router;
use http::{HeaderMap, Method, Request, StatusCode};
use ratewall::http::{Key, LayerConfig, Mode, RateLimitLayer, Rule};
use ratewall::redis::{FailurePolicy, RedisBackend, RedisLimiter};
use ratewall::{Policy, Rate, Window};
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;
use support::http_client::Got;
use support::redis_server::RedisServer;
use tower::ServiceExt;

#[path = "../examples/server.rs"]
#[allow(dead_code)]
mod server;

const CONFIG: &str = r#"
[[rules]]
name = "ip"
key = "ip"
policy = "6/h"
store = "redis"
redis_prefix = "cfg"
deny_cache = 1000

[[rules]]
name = "key"
key = "header:x-api-key"
policy = "8/h sliding-log"
store = "redis"
on_failure = "closed"

[[rules]]
name = "login"
key = "ip"
policy = "2/h sliding-log"
methods = ["POST"]
path_prefix = "/login"
count_failures_only = true
hide_headers = true

[[rules]]
name = "trial"
key = "ip + route"
policy = "3/h sliding-log"
store = "redis"
mode = "shadow"
"#;

fn backend(server: &RedisServer) -> RedisBackend {
    RedisBackend::builder(server.url())
        .timeout(Duration::from_millis(500))
        .build()
        .unwrap()
}

/// `CONFIG`, written in Rust.
fn in_rust(server: &RedisServer) -> RateLimitLayer {
    let b = backend(server);
    let ip = RedisLimiter::builder(Policy::token_bucket(Rate::per_hour(6)), &b)
        .name("ip")
        .prefix("cfg")
        .deny_cache(1000)
        .build()
        .unwrap();
    let key = RedisLimiter::builder(Policy::sliding_window_log(Window::per_hour(8)), &b)
        .name("key")
        .on_failure(FailurePolicy::Closed)
        .build()
        .unwrap();
    let trial = RedisLimiter::builder(Policy::sliding_window_log(Window::per_hour(3)), &b)
        .name("trial")
        .build()
        .unwrap();
    RateLimitLayer::builder()
        .rule(Rule::redis(Key::ip(), ip))
        .rule(Rule::redis(Key::header("x-api-key"), key))
        .rule(
            Rule::per_ip("login", Policy::sliding_window_log(Window::per_hour(2)))
                .on_method(Method::POST)
                .on_path_prefix("/login")
                .count_failures_only()
                .hide_headers(),
        )
        .rule(Rule::redis(Key::composite([Key::ip(), Key::route()]), trial).mode(Mode::Shadow))
        .build()
        .unwrap()
}

fn from_config(server: &RedisServer) -> RateLimitLayer {
    let config: LayerConfig = toml::from_str(CONFIG).unwrap();
    assert!(config.uses_redis());
    config
        .to_builder_with_redis(&backend(server))
        .unwrap()
        .build()
        .unwrap()
}

async fn login(headers: HeaderMap) -> StatusCode {
    if headers.get("x-password").is_some_and(|p| p == "right") {
        StatusCode::OK
    } else {
        StatusCode::UNAUTHORIZED
    }
}

fn app(layer: RateLimitLayer) -> Router {
    Router::new()
        .route("/", get(|| async { "ok" }))
        .route("/items", get(|| async { "items" }))
        .route("/login", post(login))
        .layer(layer)
}

#[derive(Clone, Debug)]
struct Req {
    method: Method,
    path: &'static str,
    peer: IpAddr,
    headers: Vec<(&'static str, &'static str)>,
}

async fn send(app: &Router, r: &Req) -> Got {
    let mut req = Request::builder().method(r.method.clone()).uri(r.path);
    for (k, v) in &r.headers {
        req = req.header(*k, *v);
    }
    let mut req = req.body(Body::empty()).unwrap();
    req.extensions_mut()
        .insert(axum::extract::ConnectInfo(SocketAddr::new(r.peer, 40_000)));
    Got::read(app.clone().oneshot(req).await.unwrap()).await
}

/// What must be the same: status, `RateLimit` names and remaining values,
/// `RateLimit-Policy`, and the violated policies of a problem body. (`t`
/// and `Retry-After` are seconds rounded up, compared apart.)
type Seen = (
    StatusCode,
    Vec<(String, i64)>,
    Vec<(String, i64, i64)>,
    Option<serde_json::Value>,
);

fn seen(got: &Got) -> Seen {
    let problem = (got.headers.get("content-type").map(|v| v.as_bytes())
        == Some(b"application/problem+json"))
    .then(|| got.json()["violated-policies"].clone());
    (
        got.status,
        got.ratelimit()
            .into_iter()
            .map(|(n, r, _)| (n, r))
            .collect(),
        got.policy(),
        problem,
    )
}

/// A small deterministic generator (xorshift), so a failure replays.
struct Gen(u64);

impl Gen {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
}

fn request(g: &mut Gen) -> Req {
    let peers: [IpAddr; 4] = [
        "192.0.2.1".parse().unwrap(),
        "192.0.2.2".parse().unwrap(),
        "2001:db8::1".parse().unwrap(),
        "2001:db8::2".parse().unwrap(), // the same /64 as the one before
    ];
    let peer = peers[g.below(peers.len())];
    let mut headers = Vec::new();
    match g.below(3) {
        0 => headers.push(("x-api-key", "k1")),
        1 => headers.push(("x-api-key", "k2")),
        _ => {}
    }
    let (method, path) = match g.below(4) {
        0 => (Method::GET, "/"),
        1 => (Method::GET, "/items"),
        _ => {
            headers.push((
                "x-password",
                if g.below(3) == 0 { "right" } else { "wrong" },
            ));
            (Method::POST, "/login")
        }
    };
    Req {
        method,
        path,
        peer,
        headers,
    }
}

#[tokio::test]
async fn a_config_built_redis_layer_limits_two_instances_as_the_rust_built_one_does() {
    let (config_server, rust_server) = (RedisServer::start(), RedisServer::start());
    let config = [from_config(&config_server), from_config(&config_server)];
    let rust = [in_rust(&rust_server), in_rust(&rust_server)];
    let config_apps = config.clone().map(app);
    let rust_apps = rust.clone().map(app);

    // One client across both instances: 6 an hour in all, not 6 each.
    let one = Req {
        method: Method::GET,
        path: "/",
        peer: "198.51.100.9".parse().unwrap(),
        headers: Vec::new(),
    };
    let mut statuses = Vec::new();
    for i in 0..8 {
        let got = send(&config_apps[i % 2], &one).await;
        let want = send(&rust_apps[i % 2], &one).await;
        assert_eq!(seen(&got), seen(&want), "request {i}");
        statuses.push((got.status.as_u16(), got.remaining("ip")));
    }
    assert_eq!(
        statuses,
        [
            (200, Some(5)),
            (200, Some(4)),
            (200, Some(3)),
            (200, Some(2)),
            (200, Some(1)),
            (200, Some(0)),
            (429, Some(0)),
            (429, Some(0)),
        ]
    );

    // A long mixed sequence: keys, logins (count-only-failures, local),
    // a shadow rule, IPv6 clients grouped by /64.
    let mut g = Gen(0x5eed_cafe);
    let mut counts = [0usize; 3];
    for i in 0..120 {
        let r = request(&mut g);
        let instance = g.below(2);
        let got = send(&config_apps[instance], &r).await;
        let want = send(&rust_apps[instance], &r).await;
        assert_eq!(seen(&got), seen(&want), "request {i}: {r:?}");
        match (got.retry_after(), want.retry_after()) {
            (Some(a), Some(b)) => assert!(a.abs_diff(b) <= 1, "request {i}: {a} vs {b}"),
            (a, b) => assert_eq!(a, b, "request {i}"),
        }
        counts[match got.status.as_u16() {
            200 => 0,
            429 => 1,
            _ => 2,
        }] += 1;
    }
    assert!(
        counts.iter().all(|&n| n > 0),
        "200 / 429 / other: {counts:?}"
    );

    // The config's knobs reached Redis: the per-IP keys carry its prefix.
    let keys = config_server.cmd(&["KEYS", "cfg:ip:*"]);
    assert!(keys.contains("cfg:ip:198.51.100.9"), "{keys}");
    assert!(keys.contains("cfg:ip:2001:db8::/64"), "{keys}");
    // The API key's name is a hash of it, never the key itself.
    let api = config_server.cmd(&["KEYS", "ratewall:key:*"]);
    assert!(
        api.contains(&format!(
            "ratewall:key:{}",
            support::redis_limits::hashed("h:k1")
        )),
        "{api}"
    );
    assert!(!api.contains("k1"), "{api}");
    // Both instances served requests and counted them in their own stats.
    for (c, r) in config.iter().zip(&rust) {
        let (cs, rs) = (c.stats(), r.stats());
        for (a, b) in cs.iter().zip(&rs) {
            assert_eq!(a.name(), b.name());
            assert!(a.allowed() + a.denied() > 0, "{}", a.name());
        }
    }
}

/// `examples/server.rs` serves `examples/http_limits_redis.toml` on Redis
/// as it serves its Rust-built Redis limits: two instances of each on two
/// servers, a burst of 21 requests from one client across both.
#[tokio::test]
async fn the_redis_example_file_serves_what_the_server_sets_in_rust() {
    let (config_server, rust_server) = (RedisServer::start(), RedisServer::start());
    let file = std::path::Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/http_limits_redis.toml"
    ));
    let config_apps = [(); 2].map(|_| {
        server::router(
            server::limits_from_file_on_redis(file, &config_server.url())
                .expect("the example file builds"),
        )
    });
    let rust_apps =
        [(); 2].map(|_| server::router(server::redis_limits(&rust_server.url()).unwrap()));
    let one = Req {
        method: Method::GET,
        path: "/",
        peer: "203.0.113.5".parse().unwrap(),
        headers: vec![("x-api-key", "demo")],
    };
    let mut statuses = Vec::new();
    for i in 0..21 {
        let got = send(&config_apps[i % 2], &one).await;
        let want = send(&rust_apps[i % 2], &one).await;
        assert_eq!(
            (got.status, got.policy()),
            (want.status, want.policy()),
            "request {i}"
        );
        statuses.push(got.status.as_u16());
    }
    // Bursts of 20 for the fleet, not 20 per instance.
    assert_eq!(statuses[..20], [200; 20]);
    assert_eq!(statuses[20], 429);
    let keys = config_server.cmd(&["KEYS", "ratewall:*"]);
    assert!(keys.contains("ratewall:ip:203.0.113.5"), "{keys}");
    assert!(
        keys.contains(&format!(
            "ratewall:key:{}",
            support::redis_limits::hashed("h:demo")
        )),
        "{keys}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_concurrency_rule_with_store_redis_holds_its_permits_in_redis() {
    let server = RedisServer::start();
    let rule = |extra: &str| {
        format!(
            "[[rules]]\nname = \"jobs\"\nkey = \"header:x-tenant\"\nconcurrent = 1\nstore = \"redis\"\n{extra}"
        )
    };
    let build = |text: &str| {
        let config: LayerConfig = toml::from_str(text).unwrap();
        config.to_builder_with_redis(&backend(&server))
    };
    // What a permit cannot have is a typed error naming the field.
    for (extra, field) in [
        ("on_failure = \"fallback 10/s\"", "on_failure"),
        ("deny_cache = 100", "deny_cache"),
        ("redis_prefix = \"a:b\"", "redis_prefix"),
    ] {
        match build(&rule(extra)) {
            Err(ratewall::http::HttpConfigError::InvalidValue { field: f, .. }) => {
                assert_eq!(f, field)
            }
            other => panic!("{extra}: {other:?}"),
        }
    }
    let config: LayerConfig = toml::from_str(&rule("on_failure = \"closed\"")).unwrap();
    assert!(matches!(
        config.to_builder(),
        Err(ratewall::http::HttpConfigError::RedisBackendMissing { .. })
    ));
    let layer = build(&rule("on_failure = \"closed\"\nredis_prefix = \"cfgc\""))
        .unwrap()
        .build()
        .unwrap();
    let app = app(layer);
    let req = || {
        let mut r = Request::get("/")
            .header("x-tenant", "t1")
            .body(Body::empty())
            .unwrap();
        r.extensions_mut()
            .insert(axum::extract::ConnectInfo(SocketAddr::new(
                "192.0.2.1".parse().unwrap(),
                40_000,
            )));
        r
    };
    // The first response's body, not read yet, holds the tenant's permit.
    let first = app.clone().oneshot(req()).await.unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    assert_eq!(
        server.keys_with_pttl("cfgc:jobs:*").len(),
        2,
        "permits and their sum"
    );
    let second = app.clone().oneshot(req()).await.unwrap();
    assert_eq!(second.status(), StatusCode::TOO_MANY_REQUESTS);
    drop(first);
    let mut status = StatusCode::TOO_MANY_REQUESTS;
    for _ in 0..200 {
        status = app.clone().oneshot(req()).await.unwrap().status();
        if status == StatusCode::OK {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(status, StatusCode::OK, "released when the body was dropped");
}
