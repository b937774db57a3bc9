//! The HTTP layer's rules as configuration (`LayerConfig`, `RuleConfig`):
//! a TOML file builds a layer that answers a long request sequence exactly
//! as the same layer built in Rust does (in process, `oneshot`, a
//! `ManualClock` each, advanced together); every bad value is a typed error
//! naming the rule and the field; configurations survive a round trip.

use axum::body::Body;
use axum::routing::{get, post};
use axum::Router;
use http::{HeaderMap, Method, Request, StatusCode};
use http_body_util::BodyExt;
use ratewall::http::{
    ClientIp, Headers, HttpConfigError, Items, Key, LayerConfig, Missing, Mode, ProxyHeader,
    RateLimitBuilder, RateLimitLayer, Rule, RuleConfig, UnknownClient,
};
use ratewall::{ManualClock, ParseError, Policy, Rate, Tolerance, WhenFull, Window};
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;
use tower::ServiceExt;

#[path = "../examples/server.rs"]
#[allow(dead_code)]
mod server;

const EXAMPLE: &str = include_str!("../examples/http_limits.toml");

/// One request of a sequence.
#[derive(Clone, Debug)]
struct Req {
    method: Method,
    path: &'static str,
    peer: IpAddr,
    headers: Vec<(&'static str, String)>,
}

/// What is compared: status, the rate-limit and retry headers, the body.
#[derive(Debug, PartialEq)]
struct Answer {
    status: StatusCode,
    headers: Vec<(String, String)>,
    body: bytes::Bytes,
}

async fn answer(app: &Router, r: &Req) -> Answer {
    let mut req = Request::builder().method(r.method.clone()).uri(r.path);
    for (k, v) in &r.headers {
        req = req.header(*k, v.as_str());
    }
    let mut req = req.body(Body::empty()).unwrap();
    req.extensions_mut()
        .insert(axum::extract::ConnectInfo(SocketAddr::new(r.peer, 40_000)));
    let res = app.clone().oneshot(req).await.unwrap();
    let (parts, body) = res.into_parts();
    let keep = |h: &HeaderMap| {
        let mut v: Vec<(String, String)> = h
            .iter()
            .filter(|(n, _)| {
                let n = n.as_str();
                n.contains("ratelimit") || n == "retry-after" || n == "content-type"
            })
            .map(|(n, v)| (n.to_string(), v.to_str().unwrap().to_owned()))
            .collect();
        v.sort();
        v
    };
    Answer {
        status: parts.status,
        headers: keep(&parts.headers),
        body: body.collect().await.unwrap().to_bytes(),
    }
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
    fn pick<T: Clone>(&mut self, items: &[T]) -> T {
        items[self.below(items.len())].clone()
    }
}

/// A request from a pool of clients (IPv4, IPv6 in one /64 and another,
/// behind a proxy with each header form), paths, methods, API keys and
/// passwords.
fn request(g: &mut Gen) -> Req {
    let peers = [
        "192.0.2.1",
        "192.0.2.200",
        "198.51.100.7",
        "2001:db8::1",
        "2001:db8::2",
        "2001:db8:0:1::1",
        "10.0.0.1",
        "173.245.48.1",
    ];
    let (method, path) = g.pick(&[
        (Method::GET, "/"),
        (Method::GET, "/"),
        (Method::GET, "/items"),
        (Method::GET, "/items/1"),
        (Method::GET, "/items/2"),
        (Method::POST, "/login"),
        (Method::POST, "/login"),
        (Method::GET, "/login"),
        (Method::GET, "/health"),
        (Method::GET, "/export"),
    ]);
    let mut headers = Vec::new();
    match g.below(3) {
        0 => {}
        n => headers.push(("x-api-key", format!("key-{n}"))),
    }
    if path == "/login" {
        let pw = if g.below(4) == 0 { "hunter2" } else { "guess" };
        headers.push(("x-password", pw.to_owned()));
    }
    let client = g.pick(&["203.0.113.5", "203.0.113.6", "2001:db8:5::9"]);
    match g.below(4) {
        0 => headers.push(("x-forwarded-for", format!("6.6.6.6, {client}"))),
        1 => headers.push(("forwarded", format!("for=6.6.6.6, for=\"{client}\""))),
        2 => headers.push(("cf-connecting-ip", client.to_owned())),
        _ => {}
    }
    Req {
        method,
        path,
        peer: g.pick(&peers).parse().unwrap(),
        headers,
    }
}

/// The API both layers guard: `examples/server.rs`'s routes, an item
/// route for `MatchedPath` rules and an export.
fn app(layer: RateLimitLayer<ManualClock>) -> Router {
    Router::new()
        .route("/", get(|| async { "hello" }))
        .route("/health", get(|| async { "ok" }))
        .route("/items", get(|| async { "items" }))
        .route("/items/{id}", get(|| async { "item" }))
        .route("/export", get(|| async { "export" }))
        .route(
            "/login",
            post(|h: HeaderMap| async move {
                if h.get("x-password").is_some_and(|p| p == "hunter2") {
                    StatusCode::NO_CONTENT
                } else {
                    StatusCode::UNAUTHORIZED
                }
            }),
        )
        .layer(layer)
}

/// Clock steps between requests (ms): mostly none, so the limits are reached.
const STEPS: [u64; 10] = [0, 0, 0, 0, 0, 0, 0, 10, 100, 1500];

/// Plays `n` requests through both layers, advancing both clocks alike, and
/// asserts every answer and the final counters are the same. Returns the
/// statuses seen (for the callers' checks that the sequence exercised the
/// rules).
async fn same_answers(
    from_file: RateLimitLayer<ManualClock>,
    file_clock: &ManualClock,
    in_rust: RateLimitLayer<ManualClock>,
    rust_clock: &ManualClock,
    seed: u64,
    n: usize,
) -> Vec<StatusCode> {
    let (a, b) = (app(from_file.clone()), app(in_rust.clone()));
    let mut g = Gen(seed);
    let mut statuses = Vec::new();
    for i in 0..n {
        let step = g.pick(&STEPS);
        file_clock.advance(Duration::from_millis(step));
        rust_clock.advance(Duration::from_millis(step));
        let r = request(&mut g);
        let (x, y) = (answer(&a, &r).await, answer(&b, &r).await);
        assert_eq!(x, y, "request {i}: {r:?}");
        statuses.push(x.status);
    }
    assert_eq!(comparable(&from_file), comparable(&in_rust));
    statuses
}

/// A layer's stats with the top offenders' fingerprints blanked: each
/// layer seeds its own (client addresses, shown in full, stay).
fn comparable(layer: &RateLimitLayer<ManualClock>) -> String {
    let mut text = format!("{:?}", layer.stats());
    while let Some(i) = text.find("key: \"#") {
        // `#` (at i + 6) and its 16 hex digits.
        text.replace_range(i + 6..i + 7 + 16, "*");
    }
    text
}

fn count(statuses: &[StatusCode], s: StatusCode) -> usize {
    statuses.iter().filter(|&&x| x == s).count()
}

#[tokio::test]
async fn the_example_file_serves_the_limits_the_server_sets_in_rust() {
    let (fc, rc) = (ManualClock::new(), ManualClock::new());
    let path = std::path::Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/http_limits.toml"
    ));
    let from_file = server::limits_from_file(path, fc.clone()).unwrap();
    let in_rust = server::limits(rc.clone());
    let statuses = same_answers(from_file.clone(), &fc, in_rust, &rc, 0x5eed, 1500).await;
    // The sequence reached every rule's limit.
    assert!(count(&statuses, StatusCode::TOO_MANY_REQUESTS) > 10);
    let stats = from_file.stats();
    let names: Vec<&str> = stats.iter().map(|s| s.name()).collect();
    assert_eq!(names, ["ip", "key", "login"]);
    for s in [&stats[0], &stats[2]] {
        assert!(s.allowed() > 0 && s.denied() > 0, "{s:?}");
    }
    // 600/min per API key is not reached by a few clients limited per IP;
    // its remaining count is in every compared `RateLimit` field.
    assert!(stats[1].allowed() > 0, "{:?}", stats[1]);
    assert!(stats[2].refunded() > 0, "successful logins were given back");
}

/// A configuration using every field, and the same layer in Rust.
const EVERY_FIELD: &str = r#"
headers = "draft-closest"
trusted_proxies = ["10.0.0.0/8", "fd00::/8"]
proxy_header = "forwarded"
allow = ["198.51.100.7"]

[[rules]]
name = "ip"
key = "ip"
policy = "30/min burst 10"
ipv4_prefix = 24
ipv6_prefix = 48
max_keys = 64
when_full = "evict-least-recent"

[[rules]]
name = "key-route"
key = "header:x-api-key + route"
policy = "8/min sliding-window soft 25%"
when_missing = "reject 401"
methods = ["GET"]

[[rules]]
name = "item"
key = "ip"
policy = "3/min fixed-window"
route = "/items/{id}"
ipv6_prefix = 64

[[rules]]
name = "export"
key = "global"
policy = "10/min"
path_prefix = "/export"
cost = 4

[[rules]]
name = "login"
key = "ip"
policy = "4/min sliding-log"
methods = ["POST"]
path_prefix = "/login"
hide_headers = true
count_failures_only = true

[[rules]]
name = "trial"
key = "ip"
policy = "2/min"
mode = "shadow"
ipv6_prefix = 56

[[rules]]
name = "unused"
key = "global"
policy = "1/h"
mode = "off"
"#;

fn every_field_in_rust(clock: ManualClock) -> RateLimitBuilder<ManualClock> {
    RateLimitLayer::builder()
        .clock(clock)
        .headers(Headers::Draft(Items::ClosestToExhaustion))
        .client_ip(
            ClientIp::behind_proxies(["10.0.0.0/8".parse().unwrap(), "fd00::/8".parse().unwrap()])
                .header(ProxyHeader::Forwarded),
        )
        .allow(["198.51.100.7".parse().unwrap()])
        .rule(
            Rule::per_ip("ip", Policy::token_bucket(Rate::per_minute(30).burst(10)))
                .ipv4_prefix(24)
                .ipv6_prefix(48)
                .max_keys(64)
                .when_full(WhenFull::EvictLeastRecent),
        )
        .rule(
            Rule::new(
                "key-route",
                Key::composite([Key::header("x-api-key"), Key::route()]),
                Policy::sliding_window_counter(Window::per_minute(8)).soft(Tolerance::Percent(25)),
            )
            .when_missing(Missing::Reject(StatusCode::UNAUTHORIZED))
            .on_method(Method::GET),
        )
        .rule(
            Rule::per_ip("item", Policy::fixed_window(Window::per_minute(3)))
                .on_route("/items/{id}")
                .ipv6_prefix(64),
        )
        .rule(
            Rule::global("export", Policy::token_bucket(Rate::per_minute(10)))
                .on_path_prefix("/export")
                .cost(4),
        )
        .rule(
            Rule::per_ip("login", Policy::sliding_window_log(Window::per_minute(4)))
                .on_method(Method::POST)
                .on_path_prefix("/login")
                .hide_headers()
                .count_failures_only(),
        )
        .rule(
            Rule::per_ip("trial", Policy::token_bucket(Rate::per_minute(2)))
                .mode(Mode::Shadow)
                .ipv6_prefix(56),
        )
        .rule(Rule::global("unused", Policy::token_bucket(Rate::per_hour(1))).mode(Mode::Off))
}

#[tokio::test]
async fn every_field_builds_what_the_rust_api_builds() {
    let (fc, rc) = (ManualClock::new(), ManualClock::new());
    let config: LayerConfig = toml::from_str(EVERY_FIELD).unwrap();
    let from_file = config
        .to_builder()
        .unwrap()
        .clock(fc.clone())
        .build()
        .unwrap();
    let in_rust = every_field_in_rust(rc.clone()).build().unwrap();
    let statuses = same_answers(from_file.clone(), &fc, in_rust, &rc, 0xc0ffee, 1500).await;
    assert!(count(&statuses, StatusCode::TOO_MANY_REQUESTS) > 10);
    assert!(count(&statuses, StatusCode::UNAUTHORIZED) > 10);
    let stats = from_file.stats();
    for s in &stats[..5] {
        assert!(s.allowed() > 0 && s.denied() > 0, "{s:?}");
    }
    assert!(
        stats[1].missing_key() > 0,
        "requests without a key were rejected"
    );
    assert!(stats[5].shadow_denied() > 0 && stats[5].denied() == 0);
    assert_eq!(
        stats[6].allowed() + stats[6].denied(),
        0,
        "an off rule is ignored"
    );
}

#[tokio::test]
async fn hop_counts_and_single_headers_build_what_the_rust_api_builds() {
    type InRust = fn(ManualClock) -> RateLimitBuilder<ManualClock>;
    let ip_rule = || Rule::per_ip("ip", Policy::token_bucket(Rate::per_minute(20).burst(5)));
    let cases: [(&str, InRust); 4] = [
        ("headers = \"legacy\"\ntrusted_hops = 1\n", |c| {
            RateLimitLayer::builder()
                .clock(c)
                .headers(Headers::Legacy)
                .client_ip(ClientIp::behind_hops(1))
        }),
        (
            "trusted_hops = 1\ntrusted_peers = [\"10.0.0.0/8\", \"2001:db8::1\"]\n",
            |c| {
                RateLimitLayer::builder()
                    .clock(c)
                    .client_ip(ClientIp::behind_hops(1).from_peers([
                        "10.0.0.0/8".parse().unwrap(),
                        "2001:db8::1".parse().unwrap(),
                    ]))
            },
        ),
        (
            "headers = \"none\"\ntrusted_hops = 2\nproxy_header = \"forwarded\"\n",
            |c| {
                RateLimitLayer::builder()
                    .clock(c)
                    .headers(Headers::None)
                    .client_ip(ClientIp::behind_hops(2).header(ProxyHeader::Forwarded))
            },
        ),
        (
            "client_ip_header = \"cf-connecting-ip\"\ntrusted_proxies = [\"173.245.48.0/20\"]\n",
            |c| {
                RateLimitLayer::builder()
                    .clock(c)
                    .client_ip(ClientIp::single_header(
                        "cf-connecting-ip",
                        ["173.245.48.0/20".parse().unwrap()],
                    ))
            },
        ),
    ];
    for (i, (layer, in_rust)) in cases.into_iter().enumerate() {
        let text = format!(
            "{layer}\n[[rules]]\nname = \"ip\"\nkey = \"ip\"\npolicy = \"20/min burst 5\"\n"
        );
        let (fc, rc) = (ManualClock::new(), ManualClock::new());
        let config: LayerConfig = toml::from_str(&text).unwrap();
        let from_file = config
            .to_builder()
            .unwrap()
            .clock(fc.clone())
            .build()
            .unwrap();
        let in_rust = in_rust(rc.clone()).rule(ip_rule()).build().unwrap();
        let statuses = same_answers(from_file, &fc, in_rust, &rc, 7 + i as u64, 400).await;
        assert!(
            count(&statuses, StatusCode::TOO_MANY_REQUESTS) > 5,
            "{text}"
        );
    }
}

/// A one-rule configuration with `line` added to the rule (or, with
/// `layer`, to the layer).
fn with(layer: &str, line: &str) -> String {
    format!("{layer}\n[[rules]]\nname = \"r\"\nkey = \"ip\"\npolicy = \"10/s\"\n{line}\n")
}

fn error_of(text: &str) -> HttpConfigError {
    let config: LayerConfig =
        toml::from_str(text).unwrap_or_else(|e| panic!("{text}\ndoes not parse: {e}"));
    match config.to_builder() {
        Ok(b) => b.build().expect_err(text),
        Err(e) => e,
    }
}

#[test]
fn every_bad_value_is_a_typed_error_naming_the_rule_and_field() {
    let rule_fields = [
        ("key = \"user\"", "key"),
        ("key = \"header:bad name\"", "key"),
        ("key = \"ip +\"", "key"),
        ("ipv4_prefix = 33", "ipv4_prefix"),
        ("ipv6_prefix = 129", "ipv6_prefix"),
        ("ipv6_prefix = 300", "ipv6_prefix"),
        ("methods = [\"GET\", \"post\"]", "methods"),
        ("methods = [\"GE T\"]", "methods"),
        ("path_prefix = \"login\"", "path_prefix"),
        ("ignore_path_case = true", "ignore_path_case"),
        ("route = \"items/{id}\"", "route"),
        ("mode = \"dry-run\"", "mode"),
        ("when_missing = \"reject 200\"", "when_missing"),
        ("when_missing = \"reject\"", "when_missing"),
        ("unknown_client = \"hop\"", "unknown_client"),
        ("when_full = \"evict\"", "when_full"),
        ("store = \"disk\"", "store"),
        ("redis_prefix = \"shop\"", "redis_prefix"),
        ("on_failure = \"open\"", "on_failure"),
        ("deny_cache = 1000", "deny_cache"),
        ("store = \"redis\"\nmax_keys = 5", "max_keys"),
        ("store = \"redis\"\nwhen_full = \"reject-new\"", "when_full"),
    ];
    for (line, field) in rule_fields {
        // The key line replaces the rule's own.
        let text = if line.starts_with("key") {
            format!("[[rules]]\nname = \"r\"\n{line}\npolicy = \"10/s\"\n")
        } else {
            with("", line)
        };
        let err = error_of(&text);
        match &err {
            HttpConfigError::InvalidValue {
                rule: Some(rule),
                field: f,
                value,
                expected,
            } => {
                assert_eq!((rule.as_str(), *f), ("r", field), "{line}");
                assert!(
                    line.contains(value.as_str()) || line.contains(&value.replace('"', "")),
                    "{line}: {value}"
                );
                assert!(!expected.is_empty());
            }
            other => panic!("{line}: {other:?}"),
        }
        let msg = err.to_string();
        assert!(
            msg.starts_with("rule \"r\", field `") && msg.contains(field),
            "{msg}"
        );
    }
    // A prefix on a key without an IP part.
    let err = error_of("[[rules]]\nname = \"k\"\nkey = \"header:x-api-key\"\npolicy = \"10/s\"\nipv6_prefix = 56\n");
    assert!(
        matches!(&err, HttpConfigError::InvalidValue { rule: Some(r), field: "ipv6_prefix", .. } if r == "k"),
        "{err:?}"
    );

    // The policy text: its token and what was expected.
    let err = error_of("[[rules]]\nname = \"ip\"\nkey = \"ip\"\npolicy = \"100/s brust 5\"\n");
    let HttpConfigError::PolicyText { rule, error } = &err else {
        panic!("{err:?}")
    };
    assert_eq!(rule, "ip");
    assert!(matches!(error, ParseError::Unexpected { token, at: 6, .. } if token == "brust"));
    assert_eq!(
        err.to_string(),
        "rule \"ip\", field `policy`: unexpected `brust` at byte 6: expected an algorithm, `burst`, `queue` or `soft`"
    );

    // Checked when the layer is built, as for rules made in Rust.
    assert!(matches!(
        error_of(&with("", "cost = 11")),
        HttpConfigError::CostTooHigh {
            cost: 11,
            limit: 10,
            ..
        }
    ));
    assert!(matches!(
        error_of("[[rules]]\nname = \"per ip\"\nkey = \"ip\"\npolicy = \"10/s\"\n"),
        HttpConfigError::InvalidRuleName { .. }
    ));
    assert!(matches!(
        error_of(&with("", "max_keys = 0")),
        HttpConfigError::Policy { .. }
    ));

    let layer_fields = [
        ("headers = \"draft-10\"", "headers"),
        ("trusted_proxies = [\"10.0.0.0/33\"]", "trusted_proxies"),
        ("allow = [\"localhost\"]", "allow"),
        ("trusted_hops = 33", "trusted_hops"),
        ("trusted_hops = 1\ntrusted_proxies = [\"10.0.0.0/8\"]", "trusted_hops"),
        ("trusted_hops = 1\nproxy_header = \"via\"", "proxy_header"),
        ("trusted_hops = 1\ntrusted_peers = [\"10.0.0.0/33\"]", "trusted_peers"),
        ("trusted_peers = [\"10.0.0.0/8\"]", "trusted_peers"),
        ("trusted_peers = [\"10.0.0.0/8\"]\ntrusted_proxies = [\"10.0.0.0/8\"]", "trusted_peers"),
        ("proxy_header = \"forwarded\"", "proxy_header"),
        ("client_ip_header = \"cf-connecting-ip\"", "client_ip_header"),
        ("client_ip_header = \"bad header\"\ntrusted_proxies = [\"10.0.0.0/8\"]", "client_ip_header"),
        ("client_ip_header = \"x-ip\"\ntrusted_proxies = [\"10.0.0.0/8\"]\ntrusted_hops = 1", "trusted_hops"),
        ("client_ip_header = \"x-ip\"\ntrusted_proxies = [\"10.0.0.0/8\"]\nproxy_header = \"forwarded\"", "proxy_header"),
    ];
    for (lines, field) in layer_fields {
        let err = error_of(&with(lines, ""));
        assert!(
            matches!(&err, HttpConfigError::InvalidValue { rule: None, field: f, .. } if *f == field),
            "{lines}: {err:?}"
        );
        let msg = err.to_string();
        assert!(msg.starts_with(&format!("field `{field}`: ")), "{msg}");
    }
}

#[test]
fn structural_mistakes_are_the_file_formats_errors() {
    for (text, says) in [
        (
            "[[rules]]\nname = \"r\"\nkey = \"ip\"\npolcy = \"10/s\"\n",
            "polcy",
        ),
        ("trusted_proxy = [\"10.0.0.0/8\"]\n", "trusted_proxy"),
        (
            "[[rules]]\nname = \"r\"\nkey = \"ip\"\npolicy = \"10/s\"\ncost = \"two\"\n",
            "cost",
        ),
    ] {
        let err = toml::from_str::<LayerConfig>(text).unwrap_err().to_string();
        assert!(err.contains(says), "{text}: {err}");
    }
    // No `policy` parses (a concurrency rule has `concurrent` instead); a
    // rule with neither is a typed error naming the rule and `policy`.
    let config: LayerConfig = toml::from_str("[[rules]]\nname = \"r\"\nkey = \"ip\"\n").unwrap();
    let err = config.to_builder().unwrap_err();
    assert!(
        matches!(&err, HttpConfigError::InvalidValue { rule: Some(r), field: "policy", .. } if r == "r"),
        "{err:?}"
    );
    assert!(err.to_string().contains("concurrent = N"), "{err}");
}

const REDIS_EXAMPLE: &str = include_str!("../examples/http_limits_redis.toml");

/// A rule with `store = "redis"` parses with every feature set; building it
/// without a Redis backend (or without the `redis` feature) is a typed
/// error naming the rule and saying what to do. Local rules of the same
/// file are unaffected.
#[test]
fn redis_rules_parse_and_say_what_they_need_to_build() {
    let config: LayerConfig = toml::from_str(REDIS_EXAMPLE).unwrap();
    assert!(config.uses_redis());
    let redis: Vec<bool> = config.rules.iter().map(RuleConfig::is_redis).collect();
    assert_eq!(redis, [true, true, false]);
    assert!(!toml::from_str::<LayerConfig>(EXAMPLE).unwrap().uses_redis());
    assert!(config.rules[2].to_rule().is_ok(), "the local login rule");
    let err = config.to_builder().unwrap_err();
    assert_eq!(err, config.rules[0].to_rule().unwrap_err());
    let msg = err.to_string();
    assert!(
        msg.starts_with("rule \"ip\" keeps its state in Redis"),
        "{msg}"
    );
    assert!(msg.contains("`store = \"local\"`"), "{msg}");
    #[cfg(feature = "redis")]
    {
        assert_eq!(
            err,
            HttpConfigError::RedisBackendMissing { rule: "ip".into() }
        );
        assert!(msg.contains("to_builder_with_redis(&backend)"), "{msg}");
    }
    #[cfg(not(feature = "redis"))]
    {
        assert_eq!(
            err,
            HttpConfigError::RedisFeatureMissing { rule: "ip".into() }
        );
        assert!(msg.contains("`redis` feature"), "{msg}");
    }
    // `store = "local"` is the default, written out.
    let local = with("", "store = \"LOCAL\"");
    let config: LayerConfig = toml::from_str(&local).unwrap();
    assert!(!config.uses_redis());
    assert!(config.to_builder().unwrap().build().is_ok());
}

/// The Redis fields' values are checked before the backend is needed, and
/// each bad one names the rule and the field (feature `redis`).
#[cfg(feature = "redis")]
#[tokio::test]
async fn bad_redis_values_are_typed_errors_naming_the_rule_and_field() {
    // No server: building limiters does not connect.
    let backend = ratewall::redis::RedisBackend::builder("redis://127.0.0.1:1")
        .build()
        .unwrap();
    let redis_rule = |line: &str| with("", &format!("store = \"redis\"\n{line}"));
    for (line, field) in [
        ("on_failure = \"sometimes\"", "on_failure"),
        ("on_failure = \"fallback-share 0\"", "on_failure"),
        ("on_failure = \"fallback 10/fortnight\"", "on_failure"),
        ("redis_prefix = \"a:b\"", "redis_prefix"),
        ("redis_prefix = \"\"", "redis_prefix"),
    ] {
        let config: LayerConfig = toml::from_str(&redis_rule(line)).unwrap();
        for err in [
            config.to_builder().unwrap_err(),
            config.to_builder_with_redis(&backend).unwrap_err(),
        ] {
            assert!(
                matches!(&err, HttpConfigError::InvalidValue { rule: Some(r), field: f, .. } if r == "r" && *f == field),
                "{line}: {err:?}"
            );
        }
    }
    // A rule name with `:` cannot name Redis keys.
    let config: LayerConfig = toml::from_str(
        "[[rules]]\nname = \"a:b\"\nkey = \"ip\"\npolicy = \"1/s\"\nstore = \"redis\"\n",
    )
    .unwrap();
    let err = config.to_builder_with_redis(&backend).unwrap_err();
    assert!(
        matches!(&err, HttpConfigError::InvalidValue { field: "name", .. }),
        "{err:?}"
    );
    // What the limiter itself rejects is its error, with the rule's name.
    let config: LayerConfig = toml::from_str(&redis_rule("deny_cache = 0")).unwrap();
    let err = config.to_builder_with_redis(&backend).unwrap_err();
    assert!(
        matches!(&err, HttpConfigError::Redis { rule, error: ratewall::redis::RedisError::Config(_) } if rule == "r"),
        "{err:?}"
    );
    assert!(err.to_string().starts_with("rule \"r\": "), "{err}");
    // Good values build, and the example file builds three rules.
    let good =
        redis_rule("redis_prefix = \"shop\"\non_failure = \"fallback 5/s\"\ndeny_cache = 100");
    let config: LayerConfig = toml::from_str(&good).unwrap();
    let layer = config
        .to_builder_with_redis(&backend)
        .unwrap()
        .build()
        .unwrap();
    assert_eq!(layer.stats().len(), 1);
    let config: LayerConfig = toml::from_str(REDIS_EXAMPLE).unwrap();
    let layer = config
        .to_builder_with_redis(&backend)
        .unwrap()
        .build()
        .unwrap();
    let stats = layer.stats();
    let names: Vec<&str> = stats.iter().map(|s| s.name()).collect();
    assert_eq!(names, ["ip", "key", "login"]);
}

#[test]
fn configurations_survive_a_round_trip() {
    for text in [EXAMPLE, EVERY_FIELD, REDIS_EXAMPLE] {
        let config: LayerConfig = toml::from_str(text).unwrap();
        let written = toml::to_string(&config).unwrap();
        let back: LayerConfig = toml::from_str(&written).unwrap();
        assert_eq!(back, config, "{written}");
        let json = serde_json::to_string(&config).unwrap();
        assert_eq!(serde_json::from_str::<LayerConfig>(&json).unwrap(), config);
    }
    // A configuration made in Rust, written out and read back.
    let mut config = LayerConfig::default();
    config.trusted_hops = Some(1);
    let mut login = RuleConfig::new("login", "ip", "5/15min sliding-log");
    login.methods = vec!["POST".into()];
    login.count_failures_only = true;
    let mut shared = RuleConfig::new("key", "header:x-api-key", "100/min");
    shared.store = Some("redis".into());
    shared.redis_prefix = Some("shop".into());
    shared.on_failure = Some("fallback-share 3".into());
    shared.deny_cache = Some(10_000);
    config.rules = vec![
        RuleConfig::new("ip", "ip", "100/min soft 10%"),
        login,
        shared.clone(),
    ];
    let written = toml::to_string(&config).unwrap();
    assert!(written.contains("[[rules]]"), "{written}");
    assert!(
        !written.contains("hide_headers"),
        "defaults are left out: {written}"
    );
    assert_eq!(toml::from_str::<LayerConfig>(&written).unwrap(), config);
    for line in [
        "store = \"redis\"",
        "redis_prefix = \"shop\"",
        "on_failure = \"fallback-share 3\"",
        "deny_cache = 10000",
    ] {
        assert!(written.contains(line), "{line} in {written}");
    }
    let json = serde_json::to_string(&config).unwrap();
    assert!(json.contains("\"store\":\"redis\""), "{json}");
    assert_eq!(serde_json::from_str::<LayerConfig>(&json).unwrap(), config);
    // Without the Redis rule it builds with no backend.
    config.rules.pop();
    assert!(config.to_builder().unwrap().build().is_ok());
}

/// Issue 23: `unknown_client` in a file answers as `when_client_unknown`
/// in Rust: 400 by default, the nearest trusted hop's bucket on request,
/// never 5xx.
#[tokio::test]
async fn unknown_client_in_a_file_is_what_rust_builds() {
    let req = |xff: &str| Req {
        method: Method::GET,
        path: "/",
        peer: "10.0.0.1".parse().unwrap(),
        headers: vec![("x-forwarded-for", xff.to_owned())],
    };
    let chains = [
        "unknown",
        "not-an-ip",
        "1.2.3",
        "1.2.3.4.5",
        "198.51.100.7, _x",
    ];
    for (line, unknown, status) in [
        ("", UnknownClient::AsMissing, StatusCode::BAD_REQUEST),
        (
            "unknown_client = \"as-missing\"",
            UnknownClient::AsMissing,
            StatusCode::BAD_REQUEST,
        ),
        (
            "unknown_client = \"nearest-hop\"",
            UnknownClient::NearestHop,
            StatusCode::OK,
        ),
    ] {
        let text = with("trusted_proxies = [\"10.0.0.0/8\"]", line);
        let config: LayerConfig = toml::from_str(&text).unwrap();
        let from_file = app(config
            .to_builder()
            .unwrap()
            .clock(ManualClock::new())
            .build()
            .unwrap());
        let in_rust = app(RateLimitLayer::builder()
            .clock(ManualClock::new())
            .client_ip(ClientIp::behind_proxies(["10.0.0.0/8".parse().unwrap()]))
            .rule(Rule::per_ip("r", "10/s".parse().unwrap()).when_client_unknown(unknown))
            .build()
            .unwrap());
        for chain in chains {
            let (a, b) = (
                answer(&from_file, &req(chain)).await,
                answer(&in_rust, &req(chain)).await,
            );
            assert_eq!(a.status, status, "{line}: {chain}");
            assert_eq!(a, b, "{line}: {chain}");
        }
    }
}
