//! The tower layer, in process (`oneshot` on an axum `Router`, a
//! `ManualClock`, a peer address set per request) and end to end (a real
//! axum server on 127.0.0.1 and [::1] with a real HTTP/1.1 client).

mod support;

use axum::body::Body;
use axum::routing::{get, post};
use axum::{Extension, Router};
use http::{HeaderMap, Request, StatusCode};
use http_body_util::BodyExt;
use ratewall::http::{
    ClientIp, Headers, HttpConfigError, Items, Missing, Mode, ProxyHeader, RateLimitBuilder,
    RateLimitInfo, RateLimitLayer, Rule,
};
use ratewall::{ManualClock, Policy, Rate, Window};
use std::net::SocketAddr;
use std::time::Duration;
use support::http_client::Got;
use tower::ServiceExt;

fn builder(clock: &ManualClock) -> RateLimitBuilder<ManualClock> {
    RateLimitLayer::builder().clock(clock.clone())
}

async fn info(info: Option<Extension<RateLimitInfo>>) -> String {
    match info {
        Some(Extension(info)) => info
            .iter()
            .map(|(n, d)| format!("{n}={}", d.remaining()))
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

fn make_app(layer: RateLimitLayer<ManualClock>) -> Router {
    Router::new()
        .route("/", get(|| async { "ok" }))
        .route("/info", get(info))
        .route("/login", post(login))
        .route("/items/{id}", get(|| async { "item" }))
        .layer(layer)
}

async fn send(
    app: &Router,
    method: &str,
    path: &str,
    peer: &str,
    headers: &[(&str, &[u8])],
) -> Got {
    let mut req = Request::builder().method(method).uri(path);
    for (k, v) in headers {
        req = req.header(*k, http::HeaderValue::from_bytes(v).unwrap());
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
async fn per_ip_limit_answers_429_with_retry_after_draft_fields_and_problem_json() {
    let clock = ManualClock::new();
    let layer = builder(&clock)
        .rule(Rule::per_ip(
            "ip",
            Policy::token_bucket(Rate::per_minute(60).burst(3)),
        ))
        .build()
        .unwrap();
    let app = make_app(layer.clone());
    for want in [2, 1, 0] {
        let got = get_(&app, "192.0.2.1").await;
        assert_eq!(got.status, StatusCode::OK);
        assert_eq!(got.remaining("ip"), Some(want));
        assert_eq!(got.policy(), vec![("ip".to_owned(), 3, 3)]);
    }
    let got = get_(&app, "192.0.2.1").await;
    assert_eq!(got.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(got.retry_after(), Some(1));
    assert_eq!(got.ratelimit(), vec![("ip".to_owned(), 0, 1)]);
    assert_eq!(got.headers["content-type"], "application/problem+json");
    let body = got.json();
    assert_eq!(
        body["type"],
        "https://iana.org/assignments/http-problem-types#quota-exceeded"
    );
    assert_eq!(body["violated-policies"], serde_json::json!(["ip"]));
    // Another client is not affected; time brings the first one back.
    assert_eq!(get_(&app, "192.0.2.2").await.status, StatusCode::OK);
    clock.advance(Duration::from_secs(1));
    assert_eq!(get_(&app, "192.0.2.1").await.status, StatusCode::OK);
    let s = &layer.stats()[0];
    assert_eq!((s.allowed(), s.denied()), (5, 1));
}

#[tokio::test]
async fn retry_after_rounds_sub_second_waits_up_and_t_is_the_wait_not_time_to_full() {
    let clock = ManualClock::new();
    // 10/s, burst 10: after 10 requests one more comes back in 100 ms, the
    // bucket is full again only after 1 s. Also 1/s burst 10: full after 10 s.
    let layer = builder(&clock)
        .rule(Rule::per_ip(
            "fast",
            Policy::token_bucket(Rate::per_second(10).burst(10)),
        ))
        .build()
        .unwrap();
    let app = make_app(layer);
    for _ in 0..10 {
        assert_eq!(get_(&app, "192.0.2.1").await.status, StatusCode::OK);
    }
    let got = get_(&app, "192.0.2.1").await;
    assert_eq!(got.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(got.retry_after(), Some(1), "100 ms rounds up to 1, never 0");

    let clock = ManualClock::new();
    let layer = builder(&clock)
        .rule(Rule::per_ip(
            "slow",
            Policy::token_bucket(Rate::per_second(1).burst(10)),
        ))
        .build()
        .unwrap();
    let app = make_app(layer);
    for _ in 0..10 {
        assert_eq!(get_(&app, "192.0.2.1").await.status, StatusCode::OK);
    }
    let got = get_(&app, "192.0.2.1").await;
    assert_eq!(got.retry_after(), Some(1));
    // Time to full is 10 s; the t sent is the 1 s wait (and check_fields
    // proved it is not later than Retry-After).
    assert_eq!(got.ratelimit(), vec![("slow".to_owned(), 0, 1)]);
    assert_eq!(got.policy(), vec![("slow".to_owned(), 10, 10)]);
}

#[tokio::test]
async fn a_denied_request_takes_nothing_from_the_other_rules() {
    // Small tables, and a per-IP table large enough (6 MB) that a request
    // loads its rules' slots ahead before the all-or-nothing check.
    for max_keys in [None, Some(500_000)] {
        denied_request_takes_nothing(max_keys).await;
    }
}

async fn denied_request_takes_nothing(max_keys: Option<usize>) {
    let clock = ManualClock::new();
    let ip = Rule::per_ip("ip", Policy::token_bucket(Rate::per_minute(100)));
    let layer = builder(&clock)
        .rule(match max_keys {
            Some(n) => ip.max_keys(n),
            None => ip,
        })
        .rule(Rule::global(
            "all",
            Policy::fixed_window(Window::per_minute(1000)),
        ))
        .rule(
            Rule::per_ip("login", Policy::sliding_window_log(Window::per_minute(2)))
                .on_path_prefix("/login"),
        )
        .build()
        .unwrap();
    let app = make_app(layer.clone());
    let pw: &[(&str, &[u8])] = &[("x-password", b"right")];
    for _ in 0..2 {
        assert_eq!(
            send(&app, "POST", "/login", "192.0.2.1", pw).await.status,
            StatusCode::OK
        );
    }
    let before = get_(&app, "192.0.2.1").await;
    assert_eq!(
        (before.remaining("ip"), before.remaining("all")),
        (Some(97), Some(997))
    );
    for _ in 0..5 {
        let denied = send(&app, "POST", "/login", "192.0.2.1", pw).await;
        assert_eq!(denied.status, StatusCode::TOO_MANY_REQUESTS);
        // A 429 lists the rules that denied, and only them.
        assert_eq!(denied.ratelimit().len(), 1);
        assert_eq!(
            denied.json()["violated-policies"],
            serde_json::json!(["login"])
        );
    }
    let after = get_(&app, "192.0.2.1").await;
    assert_eq!(
        (after.remaining("ip"), after.remaining("all")),
        (Some(96), Some(996)),
        "the five denials took nothing from ip or all"
    );
    let stats = layer.stats();
    assert_eq!((stats[0].allowed(), stats[0].denied()), (4, 0));
    assert_eq!((stats[1].allowed(), stats[1].denied()), (4, 0));
    assert_eq!((stats[2].allowed(), stats[2].denied()), (2, 5));
}

#[tokio::test]
async fn addresses_v4_v6_prefixes_and_mapped_v4() {
    let clock = ManualClock::new();
    let layer = builder(&clock)
        .rule(Rule::per_ip(
            "ip",
            Policy::fixed_window(Window::per_minute(2)),
        ))
        .build()
        .unwrap();
    let app = make_app(layer);
    // IPv4 and its mapped form are one client.
    assert_eq!(get_(&app, "192.0.2.1").await.remaining("ip"), Some(1));
    assert_eq!(
        get_(&app, "::ffff:192.0.2.1").await.remaining("ip"),
        Some(0)
    );
    assert_eq!(
        get_(&app, "192.0.2.1").await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    // IPv6 by /64: two addresses in one /64 share, the next /64 does not.
    assert_eq!(get_(&app, "2001:db8:0:1::1").await.remaining("ip"), Some(1));
    assert_eq!(
        get_(&app, "2001:db8:0:1:ffff::2").await.remaining("ip"),
        Some(0)
    );
    assert_eq!(get_(&app, "2001:db8:0:2::1").await.remaining("ip"), Some(1));
}

#[tokio::test]
async fn parallel_v6_prefix_rules_count_each_prefix() {
    let clock = ManualClock::new();
    let per = |name: &str, prefix: u8, limit: u64| {
        Rule::per_ip(name, Policy::fixed_window(Window::per_minute(limit))).ipv6_prefix(prefix)
    };
    let layer = builder(&clock)
        .rule(per("v6-64", 64, 100))
        .rule(per("v6-56", 56, 100))
        .rule(per("v6-48", 48, 100))
        .build()
        .unwrap();
    let app = make_app(layer);
    let _ = get_(&app, "2001:db8:aa:100::1").await; // /64 A, /56 X, /48 P
    let _ = get_(&app, "2001:db8:aa:1ff::1").await; // /64 B, /56 X, /48 P
    let got = get_(&app, "2001:db8:aa:200::1").await; // /64 C, /56 Y, /48 P
    assert_eq!(got.remaining("v6-64"), Some(99));
    assert_eq!(got.remaining("v6-56"), Some(99));
    assert_eq!(got.remaining("v6-48"), Some(97));
    let got = get_(&app, "2001:db8:aa:1ff::9").await;
    assert_eq!(
        (
            got.remaining("v6-64"),
            got.remaining("v6-56"),
            got.remaining("v6-48")
        ),
        (Some(98), Some(97), Some(96))
    );
}

#[tokio::test]
async fn spoofed_forwarded_for_is_not_believed() {
    let clock = ManualClock::new();
    // No proxy trusted: the peer is the client, whatever the header says.
    let layer = builder(&clock)
        .rule(Rule::per_ip(
            "ip",
            Policy::fixed_window(Window::per_minute(2)),
        ))
        .build()
        .unwrap();
    let app = make_app(layer);
    for (i, fake) in ["1.1.1.1", "2.2.2.2", "3.3.3.3"].into_iter().enumerate() {
        let got = send(
            &app,
            "GET",
            "/",
            "203.0.113.9",
            &[("x-forwarded-for", fake.as_bytes())],
        )
        .await;
        let want = if i < 2 {
            StatusCode::OK
        } else {
            StatusCode::TOO_MANY_REQUESTS
        };
        assert_eq!(got.status, want, "spoof {fake}");
    }
    // Behind a trusted proxy, a client that writes its own left-most entry
    // is still keyed by the address the proxy saw.
    let layer = builder(&clock)
        .client_ip(ClientIp::behind_proxies(["10.0.0.0/8".parse().unwrap()]))
        .rule(Rule::per_ip(
            "ip",
            Policy::fixed_window(Window::per_minute(2)),
        ))
        .build()
        .unwrap();
    let app = make_app(layer);
    for (i, fake) in ["1.1.1.1", "2.2.2.2", "3.3.3.3"].into_iter().enumerate() {
        let xff = format!("{fake}, 198.51.100.7");
        let got = send(
            &app,
            "GET",
            "/",
            "10.0.0.1",
            &[("x-forwarded-for", xff.as_bytes())],
        )
        .await;
        let want = if i < 2 {
            StatusCode::OK
        } else {
            StatusCode::TOO_MANY_REQUESTS
        };
        assert_eq!(got.status, want, "spoof {fake}");
    }
}

#[tokio::test]
async fn chains_of_one_to_three_trusted_proxies_find_the_client() {
    for hops in 1..=3usize {
        let clock = ManualClock::new();
        let by_cidr = builder(&clock)
            .client_ip(ClientIp::behind_proxies(["10.0.0.0/8".parse().unwrap()]))
            .rule(Rule::per_ip(
                "ip",
                Policy::fixed_window(Window::per_minute(1)),
            ))
            .build()
            .unwrap();
        let by_count = builder(&clock)
            .client_ip(ClientIp::behind_hops(hops))
            .rule(Rule::per_ip(
                "ip",
                Policy::fixed_window(Window::per_minute(1)),
            ))
            .build()
            .unwrap();
        for layer in [by_cidr, by_count] {
            let app = make_app(layer);
            // client -> 10.0.0.hops -> ... -> 10.0.0.1 (the peer)
            let mut chain = vec!["6.6.6.6".to_owned(), "198.51.100.7".to_owned()];
            for h in (2..=hops).rev() {
                chain.push(format!("10.0.0.{h}"));
            }
            let xff = chain.join(", ");
            let a = send(
                &app,
                "GET",
                "/",
                "10.0.0.1",
                &[("x-forwarded-for", xff.as_bytes())],
            )
            .await;
            assert_eq!(a.status, StatusCode::OK, "{hops} hops: {xff}");
            // Same client via another proxy path: same key, so denied.
            let b = send(
                &app,
                "GET",
                "/",
                "10.0.0.99",
                &[("x-forwarded-for", xff.as_bytes())],
            )
            .await;
            assert_eq!(
                b.status,
                StatusCode::TOO_MANY_REQUESTS,
                "{hops} hops: {xff}"
            );
            // Another client behind the same proxies is separate.
            let other = xff.replace("198.51.100.7", "198.51.100.8");
            let c = send(
                &app,
                "GET",
                "/",
                "10.0.0.1",
                &[("x-forwarded-for", other.as_bytes())],
            )
            .await;
            assert_eq!(c.status, StatusCode::OK, "{hops} hops: {other}");
        }
    }
}

#[tokio::test]
async fn obfuscated_forwarded_stops_the_walk_and_the_rule_says_what_happens() {
    let clock = ManualClock::new();
    let ip =
        ClientIp::behind_proxies(["10.0.0.0/8".parse().unwrap()]).header(ProxyHeader::Forwarded);
    let reject = builder(&clock)
        .client_ip(ip.clone())
        .rule(Rule::per_ip(
            "ip",
            Policy::fixed_window(Window::per_minute(5)),
        ))
        .build()
        .unwrap();
    let app1 = make_app(reject.clone());
    let obf: &[(&str, &[u8])] = &[("forwarded", b"for=198.51.100.7, for=_hidden, for=10.0.0.2")];
    let got = send(&app1, "GET", "/", "10.0.0.1", obf).await;
    // The request, not the server, is at fault (issue 23): 400, not 500.
    assert_eq!(got.status, StatusCode::BAD_REQUEST);
    assert!(got.json()["detail"].as_str().unwrap().contains("unknown"));
    assert_eq!(reject.stats()[0].missing_key(), 1);
    assert_eq!(reject.stats()[0].unknown_client(), 1);
    // A well-formed Forwarded chain works.
    let ok: &[(&str, &[u8])] = &[("forwarded", b"for=\"[2001:db8::7]:443\", for=10.0.0.2")];
    assert_eq!(
        send(&app1, "GET", "/", "10.0.0.1", ok)
            .await
            .remaining("ip"),
        Some(4)
    );
    // Skip: the rule does not apply, nothing is shared between unknown clients.
    let skip = builder(&clock)
        .client_ip(ip)
        .rule(
            Rule::per_ip("ip", Policy::fixed_window(Window::per_minute(1)))
                .when_missing(Missing::Skip),
        )
        .build()
        .unwrap();
    let app2 = make_app(skip);
    for _ in 0..3 {
        let got = send(&app2, "GET", "/", "10.0.0.1", obf).await;
        assert_eq!(got.status, StatusCode::OK);
        assert!(got.ratelimit().is_empty());
    }
}

#[tokio::test]
async fn api_keys_and_extensions_key_rules_and_missing_ones_skip_or_reject() {
    let clock = ManualClock::new();
    let layer = builder(&clock)
        .rule(Rule::per_header(
            "key",
            "x-api-key",
            Policy::fixed_window(Window::per_minute(2)),
        ))
        .build()
        .unwrap();
    let app = make_app(layer.clone());
    let k1: &[(&str, &[u8])] = &[("x-api-key", b"alpha")];
    let k2: &[(&str, &[u8])] = &[("x-api-key", b"beta")];
    assert_eq!(
        send(&app, "GET", "/", "192.0.2.1", k1)
            .await
            .remaining("key"),
        Some(1)
    );
    assert_eq!(
        send(&app, "GET", "/", "192.0.2.2", k1)
            .await
            .remaining("key"),
        Some(0)
    );
    assert_eq!(
        send(&app, "GET", "/", "192.0.2.3", k1).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        send(&app, "GET", "/", "192.0.2.1", k2)
            .await
            .remaining("key"),
        Some(1)
    );
    // No key: skipped by default (no shared bucket for the keyless).
    for _ in 0..4 {
        let got = get_(&app, "192.0.2.1").await;
        assert_eq!(got.status, StatusCode::OK);
        assert!(got.ratelimit().is_empty());
    }
    assert_eq!(layer.stats()[0].missing_key(), 4);
    // Non-UTF-8 key bytes are a key like any other.
    let odd: &[(&str, &[u8])] = &[("x-api-key", b"\xff\xfe")];
    assert_eq!(
        send(&app, "GET", "/", "192.0.2.1", odd)
            .await
            .remaining("key"),
        Some(1)
    );

    let strict = builder(&clock)
        .rule(
            Rule::per_header(
                "key",
                "x-api-key",
                Policy::fixed_window(Window::per_minute(2)),
            )
            .when_missing(Missing::Reject(StatusCode::UNAUTHORIZED)),
        )
        .build()
        .unwrap();
    let got = get_(&app_with(strict), "192.0.2.1").await;
    assert_eq!(got.status, StatusCode::UNAUTHORIZED);
    assert!(got.json()["detail"].as_str().unwrap().contains("key"));

    // Per user: an extension an auth layer set.
    #[derive(Clone, Hash)]
    struct UserId(u64);
    let per_user = builder(&clock)
        .rule(Rule::per_extension::<UserId>(
            "user",
            Policy::fixed_window(Window::per_minute(1)),
        ))
        .build()
        .unwrap();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(per_user)
        .layer(axum::middleware::from_fn(
            |mut req: axum::extract::Request, next: axum::middleware::Next| async move {
                let id = req
                    .headers()
                    .get("x-user")
                    .map(|v| v.to_str().unwrap().parse().unwrap());
                if let Some(id) = id {
                    req.extensions_mut().insert(UserId(id));
                }
                next.run(req).await
            },
        ));
    let u1: &[(&str, &[u8])] = &[("x-user", b"1")];
    let u2: &[(&str, &[u8])] = &[("x-user", b"2")];
    assert_eq!(
        send(&app, "GET", "/", "192.0.2.1", u1).await.status,
        StatusCode::OK
    );
    assert_eq!(
        send(&app, "GET", "/", "192.0.2.9", u1).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        send(&app, "GET", "/", "192.0.2.1", u2).await.status,
        StatusCode::OK
    );
}

fn app_with(layer: RateLimitLayer<ManualClock>) -> Router {
    make_app(layer)
}

#[tokio::test]
async fn routes_methods_and_costs_choose_what_a_rule_charges() {
    let clock = ManualClock::new();
    let layer = builder(&clock)
        .rule(Rule::per_route(
            "route",
            Policy::fixed_window(Window::per_minute(10)),
        ))
        .rule(
            Rule::per_ip("items", Policy::fixed_window(Window::per_minute(10)))
                .on_route("/items/{id}")
                .cost(4),
        )
        .rule(
            Rule::global("posts", Policy::fixed_window(Window::per_minute(10)))
                .on_method(http::Method::POST)
                .cost_fn(|_, _, h| if h.contains_key("x-bulk") { 20 } else { 1 }),
        )
        .build()
        .unwrap();
    let app = make_app(layer.clone());
    let got = send(&app, "GET", "/items/1", "192.0.2.1", &[]).await;
    assert_eq!(
        (got.remaining("route"), got.remaining("items")),
        (Some(9), Some(6))
    );
    let got = send(&app, "GET", "/items/2", "192.0.2.1", &[]).await;
    assert_eq!(
        (got.remaining("route"), got.remaining("items")),
        (Some(8), Some(2)),
        "one route, two paths"
    );
    assert_eq!(
        send(&app, "GET", "/items/3", "192.0.2.1", &[]).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    let got = get_(&app, "192.0.2.1").await;
    assert_eq!(
        (got.remaining("route"), got.remaining("items")),
        (Some(9), None)
    );
    // A cost the policy can never admit: 413 that says retrying will not help.
    let got = send(&app, "POST", "/login", "192.0.2.1", &[("x-bulk", b"1")]).await;
    assert_eq!(got.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert!(got.json()["detail"]
        .as_str()
        .unwrap()
        .contains("will not help"));
    assert_eq!(layer.stats()[2].errors(), 1);
    let got = send(&app, "POST", "/login", "192.0.2.1", &[]).await;
    assert_eq!(got.remaining("posts"), Some(9));
}

#[tokio::test]
async fn shadow_rules_count_but_never_reject_and_off_rules_are_ignored() {
    let clock = ManualClock::new();
    let layer = builder(&clock)
        .rule(Rule::per_ip("trial", Policy::fixed_window(Window::per_minute(2))).mode(Mode::Shadow))
        .rule(Rule::per_ip("off", Policy::fixed_window(Window::per_minute(1))).mode(Mode::Off))
        .build()
        .unwrap();
    let app = make_app(layer.clone());
    for _ in 0..5 {
        let got = get_(&app, "192.0.2.1").await;
        assert_eq!(got.status, StatusCode::OK);
        assert!(got.ratelimit().iter().all(|(n, ..)| n == "trial"));
    }
    let s = layer.stats();
    assert_eq!(
        (s[0].allowed(), s[0].shadow_denied(), s[0].denied()),
        (2, 3, 0)
    );
    assert_eq!((s[1].allowed(), s[1].denied()), (0, 0));
}

/// A request whose cost one rule can never admit is a 413 naming that rule,
/// not another whose cost just fits (equal to its limit).
#[tokio::test]
async fn the_413_names_the_rule_the_cost_can_never_pass() {
    let clock = ManualClock::new();
    let layer = builder(&clock)
        .rule(
            Rule::global("fits", Policy::fixed_window(Window::per_minute(5))).cost_fn(|_, _, _| 5),
        )
        .rule(
            Rule::global("small", Policy::fixed_window(Window::per_minute(3))).cost_fn(|_, _, _| 4),
        )
        .build()
        .unwrap();
    let app = make_app(layer.clone());
    let got = get_(&app, "192.0.2.1").await;
    assert_eq!(got.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(
        got.json()["violated-policies"],
        serde_json::json!(["small"])
    );
    let s = layer.stats();
    assert_eq!((s[0].errors(), s[1].errors()), (0, 1));
}

/// A shadow rule never refuses, not even a request missing its key that
/// the rule, enforced, would refuse (`when_missing`); the miss is counted.
#[tokio::test]
async fn a_shadow_rule_never_refuses_a_request_missing_its_key() {
    let clock = ManualClock::new();
    for (mode, want) in [
        (Mode::Shadow, StatusCode::OK),
        (Mode::Enforce, StatusCode::UNAUTHORIZED),
    ] {
        let layer = builder(&clock)
            .rule(
                Rule::per_header(
                    "key",
                    "x-api-key",
                    Policy::fixed_window(Window::per_minute(5)),
                )
                .when_missing(Missing::Reject(StatusCode::UNAUTHORIZED))
                .mode(mode),
            )
            .build()
            .unwrap();
        let app = make_app(layer.clone());
        let got = get_(&app, "192.0.2.1").await;
        assert_eq!(got.status, want, "{mode:?}");
        assert_eq!(layer.stats()[0].missing_key(), 1, "{mode:?}");
    }
}

#[tokio::test]
async fn skip_predicate_and_allow_list_pass_requests_through() {
    let clock = ManualClock::new();
    let layer = builder(&clock)
        .skip(|_, uri, _| uri.path() == "/info")
        .allow(["192.0.2.0/24".parse().unwrap()])
        .rule(Rule::per_ip(
            "ip",
            Policy::fixed_window(Window::per_minute(1)),
        ))
        .build()
        .unwrap();
    let app = make_app(layer);
    for _ in 0..3 {
        let got = send(&app, "GET", "/info", "203.0.113.1", &[]).await;
        assert_eq!(got.status, StatusCode::OK);
        assert!(got.ratelimit().is_empty());
        assert_eq!(get_(&app, "192.0.2.77").await.status, StatusCode::OK);
    }
    assert_eq!(get_(&app, "203.0.113.1").await.status, StatusCode::OK);
    assert_eq!(
        get_(&app, "203.0.113.1").await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
}

#[tokio::test]
async fn count_only_failures_refunds_successful_logins() {
    // With and without headers: a layer that writes none still refunds.
    for headers in [Headers::default(), Headers::None] {
        refunds_successful_logins(headers).await;
    }
}

async fn refunds_successful_logins(headers: Headers) {
    let clock = ManualClock::new();
    let layer = builder(&clock)
        .headers(headers)
        .rule(
            Rule::per_ip("login", Policy::sliding_window_log(Window::per_minute(3)))
                .on_path_prefix("/login")
                .count_failures_only(),
        )
        .build()
        .unwrap();
    let app = make_app(layer.clone());
    let right: &[(&str, &[u8])] = &[("x-password", b"right")];
    for _ in 0..10 {
        assert_eq!(
            send(&app, "POST", "/login", "192.0.2.1", right)
                .await
                .status,
            StatusCode::OK
        );
    }
    for _ in 0..3 {
        assert_eq!(
            send(&app, "POST", "/login", "192.0.2.1", &[]).await.status,
            StatusCode::UNAUTHORIZED
        );
    }
    assert_eq!(
        send(&app, "POST", "/login", "192.0.2.1", right)
            .await
            .status,
        StatusCode::TOO_MANY_REQUESTS,
        "three failures used the quota"
    );
    assert_eq!(layer.stats()[0].refunded(), 10);
}

#[tokio::test]
async fn header_generations_and_hidden_rules() {
    let clock = ManualClock::new();
    let rules = || {
        [
            Rule::per_ip("ip", Policy::fixed_window(Window::per_minute(100))),
            Rule::global("all", Policy::fixed_window(Window::per_minute(4))),
            Rule::per_ip("secret", Policy::fixed_window(Window::per_minute(1000))).hide_headers(),
        ]
    };
    let make = |h: Headers| {
        let mut b = builder(&clock).headers(h);
        for r in rules() {
            b = b.rule(r);
        }
        make_app(b.build().unwrap())
    };
    let got = get_(&make(Headers::default()), "192.0.2.1").await;
    let names: Vec<_> = got.ratelimit().into_iter().map(|(n, ..)| n).collect();
    assert_eq!(names, ["ip", "all"], "hidden rules are left out");
    assert_eq!(got.policy().len(), 2);
    let got = get_(
        &make(Headers::Draft(Items::ClosestToExhaustion)),
        "192.0.2.1",
    )
    .await;
    assert_eq!(got.ratelimit(), vec![("all".to_owned(), 3, 60)]);
    assert_eq!(got.policy(), vec![("all".to_owned(), 4, 60)]);
    let got = get_(&make(Headers::None), "192.0.2.1").await;
    assert!(
        got.headers.get("ratelimit").is_none() && got.headers.get("x-ratelimit-limit").is_none()
    );
    let legacy = make(Headers::Legacy);
    let got = get_(&legacy, "192.0.2.1").await;
    assert!(got.headers.get("ratelimit").is_none());
    assert_eq!(got.headers["x-ratelimit-limit"], "4");
    assert_eq!(got.headers["x-ratelimit-remaining"], "3");
    assert_eq!(got.headers["x-ratelimit-reset"], "60");
    for _ in 0..3 {
        let _ = get_(&legacy, "192.0.2.1").await;
    }
    let got = get_(&legacy, "192.0.2.1").await;
    assert_eq!(got.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(got.headers["x-ratelimit-remaining"], "0");
    assert_eq!(got.headers["x-ratelimit-reset"], got.headers["retry-after"]);
}

/// The decisions extension reaches the handler whether or not the layer
/// writes rate headers: with them off, an admitted request has nothing to
/// do after its response, and takes the response future's plain path.
#[tokio::test]
async fn the_decisions_extension_reaches_the_handler_with_or_without_rate_headers() {
    let rule = || Rule::per_ip("ip", Policy::fixed_window(Window::per_minute(10)));
    for headers in [Headers::None, Headers::default()] {
        // With the extension on, and off (the handler then sees none).
        for (on, seen) in [(true, &b"ip=9"[..]), (false, &b"none"[..])] {
            let layer = builder(&ManualClock::new())
                .headers(headers)
                .decisions_extension(on)
                .rule(rule())
                .build()
                .unwrap();
            let got = send(&make_app(layer), "GET", "/info", "192.0.2.1", &[]).await;
            assert_eq!(&got.body[..], seen, "{headers:?}, extension {on}");
        }
    }
}

/// A response future says which path it is on: the inner service's
/// (with or without anything to do after the response) or a refusal's.
#[tokio::test]
async fn a_response_future_names_its_path() {
    use tower::{Layer, Service};
    let clock = ManualClock::new();
    let inner = tower::service_fn(|_: Request<Body>| async {
        Ok::<_, std::convert::Infallible>(http::Response::new(Body::empty()))
    });
    for headers in [Headers::None, Headers::default()] {
        let layer = builder(&clock)
            .headers(headers)
            .rule(Rule::per_ip(
                "ip",
                Policy::fixed_window(Window::per_minute(1)),
            ))
            .build()
            .unwrap();
        let mut svc = layer.layer(inner);
        let request = || {
            let mut req = Request::get("/").body(Body::empty()).unwrap();
            req.extensions_mut()
                .insert(axum::extract::ConnectInfo(SocketAddr::from((
                    [192, 0, 2, 1],
                    1,
                ))));
            req
        };
        let admitted = svc.call(request());
        assert_eq!(
            format!("{admitted:?}"),
            "ResponseFuture::Inner",
            "{headers:?}"
        );
        assert_eq!(admitted.await.unwrap().status(), StatusCode::OK);
        let refused = svc.call(request());
        assert_eq!(
            format!("{refused:?}"),
            "ResponseFuture::Ready",
            "{headers:?}"
        );
        assert_eq!(
            refused.await.unwrap().status(),
            StatusCode::TOO_MANY_REQUESTS
        );
    }
}

#[tokio::test]
async fn custom_responder_grpc_and_the_decisions_extension() {
    let clock = ManualClock::new();
    let layer = builder(&clock)
        .decisions_extension(true)
        .responder(|r| {
            let who: Vec<String> = r
                .rules()
                .map(|d| format!("{}:{}:{}", d.name(), d.denied(), d.decision().remaining()))
                .collect();
            http::Response::builder()
                .status(StatusCode::SERVICE_UNAVAILABLE)
                .body(bytes::Bytes::from(who.join(" ")))
                .unwrap()
        })
        .rule(Rule::per_ip(
            "ip",
            Policy::fixed_window(Window::per_minute(10)),
        ))
        .rule(Rule::global(
            "all",
            Policy::fixed_window(Window::per_minute(2)),
        ))
        .build()
        .unwrap();
    let app = make_app(layer);
    let got = send(&app, "GET", "/info", "192.0.2.1", &[]).await;
    assert_eq!(&got.body[..], b"ip=9,all=1");
    let _ = get_(&app, "192.0.2.1").await;
    let got = get_(&app, "192.0.2.1").await;
    assert_eq!(got.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(&got.body[..], b"ip:false:7 all:true:0");
    assert_eq!(got.retry_after(), Some(60));
    let grpc = send(
        &app,
        "POST",
        "/",
        "192.0.2.1",
        &[("content-type", b"application/grpc+proto")],
    )
    .await;
    assert_eq!(grpc.status, StatusCode::OK);
    assert_eq!(grpc.headers["grpc-status"], "8");
}

#[tokio::test]
async fn no_peer_address_is_a_clear_error_not_a_shared_bucket() {
    let clock = ManualClock::new();
    let layer = builder(&clock)
        .rule(Rule::per_ip(
            "ip",
            Policy::fixed_window(Window::per_minute(100)),
        ))
        .build()
        .unwrap();
    let res = make_app(layer)
        .oneshot(Request::builder().uri("/").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::INTERNAL_SERVER_ERROR);
    let body = res.into_body().collect().await.unwrap().to_bytes();
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    // The set-up advice goes to the log, not to the client (issue 23).
    assert!(v["detail"].as_str().unwrap().contains("set-up"));
    assert!(!v["detail"].as_str().unwrap().contains("connect_info"));
}

#[tokio::test]
async fn hostile_proxy_headers_never_panic() {
    let clock = ManualClock::new();
    for header in [ProxyHeader::XForwardedFor, ProxyHeader::Forwarded] {
        let layer = builder(&clock)
            .client_ip(ClientIp::behind_proxies(["10.0.0.0/8".parse().unwrap()]).header(header))
            .rule(Rule::per_ip(
                "ip",
                Policy::fixed_window(Window::per_minute(1000)),
            ))
            .build()
            .unwrap();
        let app = make_app(layer);
        let huge = "10.0.0.1, ".repeat(20_000);
        let inputs: Vec<&[u8]> = vec![
            huge.as_bytes(),
            b"",
            b" ",
            b",",
            b"\xff\xfe\xfd",
            b"for=\"",
            b"for=[::1",
            b"[::1]:99999999",
            b"fe80::1%",
            b"fe80::1%eth0",
            b"for=\"[fe80::1%25eth0]:80\"",
            b"1.2.3.4:",
            b"[1.2.3.4]",
            b"for=unknown",
            b"for=_x;by=_y",
            b"\"\"\"\"",
            b"for=\\\"",
        ];
        for (i, input) in inputs.iter().enumerate() {
            let name = match header {
                ProxyHeader::XForwardedFor => "x-forwarded-for",
                _ => "forwarded",
            };
            let got = send(&app, "GET", "/", "10.0.0.1", &[(name, input)]).await;
            assert!(
                // Never a 5xx from what a request carries (issue 23).
                matches!(got.status, StatusCode::OK | StatusCode::BAD_REQUEST),
                "{name} input {i}: {}",
                got.status
            );
        }
    }
}

#[test]
fn configuration_errors_say_what_to_change() {
    let policy = Policy::token_bucket(Rate::per_second(1));
    let build = |r: Vec<Rule>| {
        let mut b = RateLimitLayer::builder();
        for r in r {
            b = b.rule(r);
        }
        b.build().map(drop)
    };
    for bad in ["", "per ip", "a\"b", "1st", "é"] {
        let err = build(vec![Rule::per_ip(bad, policy)]).unwrap_err();
        assert!(
            matches!(err, HttpConfigError::InvalidRuleName { .. }),
            "{bad}"
        );
    }
    let err = build(vec![Rule::per_ip("a", policy), Rule::global("a", policy)]).unwrap_err();
    assert!(matches!(err, HttpConfigError::DuplicateRuleName { .. }));
    let err = build(vec![Rule::per_header("k", "bad header", policy)]).unwrap_err();
    assert!(matches!(err, HttpConfigError::InvalidHeaderName { .. }));
    let err = build(vec![Rule::per_ip(
        "z",
        Policy::token_bucket(Rate::per_second(0)),
    )])
    .unwrap_err();
    assert!(matches!(err, HttpConfigError::Policy { .. }));
    assert!(err.to_string().contains("\"z\""));
    let err = build(vec![Rule::per_ip("c", policy).cost(2)]).unwrap_err();
    assert!(matches!(
        err,
        HttpConfigError::CostTooHigh {
            cost: 2,
            limit: 1,
            ..
        }
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thirty_two_concurrent_clients_against_ten_per_minute_in_process() {
    let clock = ManualClock::new();
    let layer = builder(&clock)
        .rule(Rule::per_ip(
            "ip",
            Policy::token_bucket(Rate::per_minute(10)),
        ))
        .build()
        .unwrap();
    let app = make_app(layer);
    let tasks: Vec<_> = (0..32)
        .map(|_| {
            let app = app.clone();
            tokio::spawn(async move { get_(&app, "192.0.2.1").await.status })
        })
        .collect();
    let mut ok = 0;
    for t in tasks {
        if t.await.unwrap() == StatusCode::OK {
            ok += 1;
        }
    }
    assert_eq!(ok, 10);
}

mod end_to_end {
    use super::*;
    use support::http_client::{fetch, serve};

    fn layered(clock: &ManualClock) -> RateLimitLayer<ManualClock> {
        builder(clock)
            .rule(Rule::per_ip(
                "ip",
                Policy::token_bucket(Rate::per_minute(100)),
            ))
            .rule(
                Rule::per_ip("login", Policy::sliding_window_log(Window::per_minute(2)))
                    .on_path_prefix("/login"),
            )
            .build()
            .unwrap()
    }

    async fn atomic_over_http(bind: &str) {
        let clock = ManualClock::new();
        let (addr, stop, server) = serve(bind, make_app(layered(&clock))).await;
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
        assert_eq!(
            after,
            before - 1,
            "denied requests took nothing from the per-IP rule"
        );
        drop(stop);
        server.await.unwrap();
    }

    #[tokio::test]
    async fn over_ipv4_loopback() {
        atomic_over_http("127.0.0.1:0").await;
    }

    #[tokio::test]
    async fn over_ipv6_loopback() {
        atomic_over_http("[::1]:0").await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn thirty_two_concurrent_clients_exactly_ten_succeed() {
        let clock = ManualClock::new();
        let layer = builder(&clock)
            .rule(Rule::per_ip(
                "ip",
                Policy::fixed_window(Window::per_minute(10)),
            ))
            .build()
            .unwrap();
        let (addr, stop, server) = serve("127.0.0.1:0", make_app(layer)).await;
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
        drop(stop);
        server.await.unwrap();
    }
}

#[tokio::test]
async fn a_full_key_table_admits_untracked_and_counts_it() {
    // With and without headers: without, the layer keeps no decisions of
    // an admitted request, only whether its key was tracked.
    for headers in [Headers::default(), Headers::None] {
        full_table_counts_untracked(headers).await;
    }
}

async fn full_table_counts_untracked(headers: Headers) {
    let clock = ManualClock::new();
    let layer = builder(&clock)
        .headers(headers)
        .rule(
            Rule::per_ip("ip", Policy::fixed_window(Window::per_minute(5)))
                .max_keys(1)
                .when_full(ratewall::WhenFull::AdmitUntracked),
        )
        .build()
        .unwrap();
    let app = make_app(layer.clone());
    for i in 0..64 {
        let got = get_(&app, &format!("198.51.100.{i}")).await;
        assert_eq!(got.status, StatusCode::OK);
    }
    let s = &layer.stats()[0];
    assert_eq!(s.allowed(), 64);
    assert!(s.untracked() > 0, "{s:?}");
}

/// Issue 23 item 1: what a request's proxy chain says never makes the layer
/// answer 5xx. Each reproducer of the issue, in process and end to end.
mod unknown_clients {
    use super::*;
    use ratewall::http::UnknownClient;
    use support::http_client::{fetch_bytes, serve};

    const XFF: &str = "x-forwarded-for";

    /// The malformed chains of the issue, sent by a trusted peer.
    fn malformed() -> Vec<Vec<u8>> {
        vec![
            b"unknown".to_vec(),
            b"not-an-ip".to_vec(),
            b"1.2.3".to_vec(),
            b"1.2.3.4.5".to_vec(),
            b"\xe9t\xe9, \xff\xfe".to_vec(),
            b"198.51.100.7, unknown".to_vec(),
        ]
    }

    /// 64 KB of `10.1.2.3, `.
    fn long_chain() -> Vec<u8> {
        "10.1.2.3, ".repeat(64 * 1024 / 10).into_bytes()
    }

    /// `trusted_hops = 1` and a per-IP rule of `n` a minute.
    fn behind_one_hop(clock: &ManualClock, n: u64) -> RateLimitLayer<ManualClock> {
        builder(clock)
            .client_ip(ClientIp::behind_hops(1))
            .rule(Rule::per_ip(
                "ip",
                Policy::fixed_window(Window::per_minute(n)),
            ))
            .build()
            .unwrap()
    }

    fn behind_loopback(clock: &ManualClock, unknown: UnknownClient) -> RateLimitLayer<ManualClock> {
        builder(clock)
            .client_ip(ClientIp::behind_proxies(["127.0.0.0/8".parse().unwrap()]))
            .rule(
                Rule::per_ip("ip", Policy::fixed_window(Window::per_minute(100)))
                    .when_client_unknown(unknown),
            )
            .build()
            .unwrap()
    }

    fn assert_bad_request(got: &Got, what: &str) {
        assert_eq!(got.status, StatusCode::BAD_REQUEST, "{what}");
        assert_eq!(got.headers["content-type"], "application/problem+json");
        let detail = got.json()["detail"].as_str().unwrap().to_owned();
        assert!(detail.contains("rule ip"), "{detail}");
        assert!(detail.contains("client address is unknown"), "{detail}");
    }

    #[tokio::test]
    async fn no_chain_with_a_hop_count_is_the_peer_in_process() {
        let clock = ManualClock::new();
        let layer = behind_one_hop(&clock, 5);
        let app = make_app(layer.clone());
        for left in [4, 3] {
            let got = get_(&app, "192.0.2.1").await;
            assert_eq!(got.status, StatusCode::OK);
            assert_eq!(got.remaining("ip"), Some(left));
        }
        // Another peer is another client; a chain still names the client.
        assert_eq!(get_(&app, "192.0.2.2").await.remaining("ip"), Some(4));
        let got = send(&app, "GET", "/", "192.0.2.1", &[(XFF, b"198.51.100.1")]).await;
        assert_eq!(got.remaining("ip"), Some(4));
        let s = &layer.stats()[0];
        assert_eq!((s.missing_key(), s.unknown_client()), (0, 0));
    }

    #[tokio::test]
    async fn malformed_entries_from_a_trusted_peer_are_400_in_process() {
        let clock = ManualClock::new();
        let layer = behind_loopback(&clock, UnknownClient::AsMissing);
        let app = make_app(layer.clone());
        let inputs = malformed();
        for input in &inputs {
            let got = send(&app, "GET", "/", "127.0.0.1", &[(XFF, input)]).await;
            assert_bad_request(&got, &String::from_utf8_lossy(input));
        }
        // The long chain's first entry from the right is an untrusted
        // address: that is the client.
        let long = long_chain();
        let got = send(&app, "GET", "/", "127.0.0.1", &[(XFF, &long)]).await;
        assert_eq!(got.status, StatusCode::OK);
        assert_eq!(got.remaining("ip"), Some(99));
        let got = send(&app, "GET", "/", "127.0.0.1", &[(XFF, b"10.1.2.3")]).await;
        assert_eq!(got.remaining("ip"), Some(98));
        let s = &layer.stats()[0];
        let n = inputs.len() as u64;
        assert_eq!(
            (s.unknown_client(), s.missing_key(), s.allowed()),
            (n, n, 2)
        );
        // When every entry is trusted, the walk passes MAX_HOPS and stops.
        let all = builder(&clock)
            .client_ip(ClientIp::behind_proxies([
                "127.0.0.0/8".parse().unwrap(),
                "10.0.0.0/8".parse().unwrap(),
            ]))
            .rule(Rule::per_ip(
                "ip",
                Policy::fixed_window(Window::per_minute(100)),
            ))
            .build()
            .unwrap();
        let got = send(
            &make_app(all.clone()),
            "GET",
            "/",
            "127.0.0.1",
            &[(XFF, &long)],
        )
        .await;
        assert_bad_request(&got, "too long");
        assert_eq!(all.stats()[0].unknown_client(), 1);
    }

    #[tokio::test]
    async fn a_skipping_or_explicit_status_rule_keeps_its_choice() {
        let clock = ManualClock::new();
        let ip = ClientIp::behind_proxies(["127.0.0.0/8".parse().unwrap()]);
        let layer = builder(&clock)
            .client_ip(ip)
            .rule(
                Rule::per_ip("skip", Policy::fixed_window(Window::per_minute(100)))
                    .when_missing(Missing::Skip),
            )
            .rule(
                Rule::per_ip("ip", Policy::fixed_window(Window::per_minute(100)))
                    .when_missing(Missing::Reject(StatusCode::FORBIDDEN)),
            )
            .build()
            .unwrap();
        let app = make_app(layer.clone());
        let got = send(&app, "GET", "/", "127.0.0.1", &[(XFF, b"unknown")]).await;
        assert_eq!(got.status, StatusCode::FORBIDDEN);
        // The skipping rule was passed over (counted), the other rejected.
        let stats = layer.stats();
        assert_eq!((stats[0].unknown_client(), stats[0].missing_key()), (1, 1));
        assert_eq!((stats[1].unknown_client(), stats[1].missing_key()), (1, 1));
        assert_eq!(stats[0].allowed(), 0);
    }

    #[tokio::test]
    async fn nearest_hop_keys_every_forged_value_under_the_proxy_in_process() {
        let clock = ManualClock::new();
        let layer = behind_loopback(&clock, UnknownClient::NearestHop);
        let app = make_app(layer.clone());
        let inputs = malformed();
        for (i, input) in inputs.iter().enumerate() {
            let got = send(&app, "GET", "/", "127.0.0.1", &[(XFF, input)]).await;
            assert_eq!(got.status, StatusCode::OK);
            // One bucket for all of them, the peer's own: never a fresh one.
            assert_eq!(got.remaining("ip"), Some(99 - i as i64));
        }
        // The peer sending no chain is the same client.
        let got = get_(&app, "127.0.0.1").await;
        assert_eq!(got.remaining("ip"), Some(99 - inputs.len() as i64));
        // A trusted hop that wrote the entry is the key, not the peer.
        let got = send(
            &app,
            "GET",
            "/",
            "127.0.0.1",
            &[(XFF, b"unknown, 127.0.0.9")],
        )
        .await;
        assert_eq!(got.remaining("ip"), Some(99));
        let s = &layer.stats()[0];
        assert_eq!(s.unknown_client(), inputs.len() as u64 + 1);
        assert_eq!(s.missing_key(), 0);
    }

    #[tokio::test]
    async fn a_missing_peer_stays_500_and_the_body_keeps_the_set_up_to_the_log() {
        let clock = ManualClock::new();
        let layer = behind_one_hop(&clock, 100);
        let res = make_app(layer)
            .oneshot(Request::builder().uri("/").body(Body::empty()).unwrap())
            .await
            .unwrap();
        let got = Got::read(res).await;
        assert_eq!(got.status, StatusCode::INTERNAL_SERVER_ERROR);
        let detail = got.json()["detail"].as_str().unwrap().to_owned();
        assert!(detail.contains("set-up"), "{detail}");
        for advice in ["connect_info", "axum", "tonic", "SocketAddr", "feature"] {
            assert!(!detail.contains(advice), "{detail}");
        }
    }

    #[tokio::test]
    async fn every_reproducer_end_to_end() {
        let clock = ManualClock::new();
        // trusted_hops = 1, a direct request without X-Forwarded-For.
        let hops = behind_one_hop(&clock, 100);
        let (addr, stop, server) = serve("127.0.0.1:0", make_app(hops)).await;
        for left in [99, 98] {
            let got = fetch_bytes(addr, "GET", "/", &[]).await;
            assert_eq!(got.status, StatusCode::OK);
            assert_eq!(got.remaining("ip"), Some(left));
        }
        drop(stop);
        server.await.unwrap();
        // trusted_proxies = ["127.0.0.0/8"]: each malformed chain is a 400.
        let layer = behind_loopback(&clock, UnknownClient::AsMissing);
        let (addr, stop, server) = serve("127.0.0.1:0", make_app(layer.clone())).await;
        for input in malformed() {
            let got = fetch_bytes(addr, "GET", "/", &[(XFF, &input)]).await;
            assert_bad_request(&got, &String::from_utf8_lossy(&input));
        }
        let long = long_chain();
        let got = fetch_bytes(addr, "GET", "/", &[(XFF, &long)]).await;
        assert_eq!(got.status, StatusCode::OK);
        assert_eq!(layer.stats()[0].unknown_client(), malformed().len() as u64);
        drop(stop);
        server.await.unwrap();
        // And with the nearest hop as the key: one shared bucket, no 4xx.
        let layer = behind_loopback(&clock, UnknownClient::NearestHop);
        let (addr, stop, server) = serve("127.0.0.1:0", make_app(layer)).await;
        for (i, input) in malformed().iter().enumerate() {
            let got = fetch_bytes(addr, "GET", "/", &[(XFF, input)]).await;
            assert_eq!(got.status, StatusCode::OK);
            assert_eq!(got.remaining("ip"), Some(99 - i as i64));
        }
        drop(stop);
        server.await.unwrap();
    }
}

/// Issue 23 item 5: `.skip`, `.cost_fn` and `.peer_from` take capturing
/// closures.
#[tokio::test]
async fn capturing_closures_skip_cost_and_find_the_peer() {
    #[derive(Clone)]
    struct Tls(std::net::IpAddr);
    let clock = ManualClock::new();
    let open: Vec<String> = vec!["/items/free".into(), "/info".into()];
    let bulk_cost: u64 = 7;
    let layer = builder(&clock)
        .skip(move |_, uri, _| open.iter().any(|p| uri.path() == p))
        .client_ip(ClientIp::peer().peer_from(|ext| ext.get::<Tls>().map(|t| t.0)))
        .rule(
            Rule::per_ip("ip", Policy::fixed_window(Window::per_minute(100))).cost_fn(
                move |_, uri, _| {
                    if uri.path().starts_with("/items") {
                        bulk_cost
                    } else {
                        1
                    }
                },
            ),
        )
        .build()
        .unwrap();
    let app = make_app(layer);
    for _ in 0..3 {
        let got = send(&app, "GET", "/items/free", "192.0.2.1", &[]).await;
        assert_eq!(got.status, StatusCode::OK);
        assert!(got.ratelimit().is_empty(), "skipped");
    }
    assert_eq!(
        send(&app, "GET", "/items/1", "192.0.2.1", &[])
            .await
            .remaining("ip"),
        Some(93)
    );
    assert_eq!(get_(&app, "192.0.2.1").await.remaining("ip"), Some(92));
    // The custom peer lookup comes first: another client.
    let mut req = Request::builder().uri("/").body(Body::empty()).unwrap();
    req.extensions_mut()
        .insert(Tls("198.51.100.3".parse().unwrap()));
    req.extensions_mut()
        .insert(axum::extract::ConnectInfo(SocketAddr::from((
            [192, 0, 2, 1],
            1,
        ))));
    let got = Got::read(app.clone().oneshot(req).await.unwrap()).await;
    assert_eq!(got.remaining("ip"), Some(99));
}

/// axum applies `Router::layer` to what the router holds when it is
/// called: routes and a fallback added before it are limited (the default
/// 404 too), a fallback (or route) added after it is not, so an unknown
/// path is answered unlimited. Wrapping the whole router
/// (`Router::new().fallback_service(limits.layer(router))`) covers every
/// request whatever the order. docs/http.md, "Axum: routes and the fallback".
#[tokio::test]
async fn a_fallback_added_after_the_layer_is_unlimited_and_wrapping_the_router_covers_it() {
    use tower::Layer;
    let layer = |clock: &ManualClock| {
        RateLimitLayer::builder()
            .clock(clock.clone())
            .rule(Rule::per_ip(
                "ip",
                Policy::fixed_window(Window::per_minute(2)),
            ))
            .build()
            .unwrap()
    };
    async fn missing() -> StatusCode {
        StatusCode::NOT_FOUND
    }
    let routes = || Router::new().route("/", get(|| async { "ok" }));
    async fn four<S>(svc: S) -> Vec<StatusCode>
    where
        S: tower::Service<Request<Body>, Response = axum::response::Response> + Clone,
        S::Error: std::fmt::Debug,
    {
        let mut seen = Vec::new();
        for _ in 0..4 {
            let mut req = Request::get("/no-such-path").body(Body::empty()).unwrap();
            req.extensions_mut()
                .insert(axum::extract::ConnectInfo(SocketAddr::from((
                    [192, 0, 2, 1],
                    40_000,
                ))));
            seen.push(svc.clone().oneshot(req).await.unwrap().status());
        }
        seen
    }
    let limited = vec![
        StatusCode::NOT_FOUND,
        StatusCode::NOT_FOUND,
        StatusCode::TOO_MANY_REQUESTS,
        StatusCode::TOO_MANY_REQUESTS,
    ];
    let clock = ManualClock::new();
    // The fallback before the layer (or axum's default 404): limited.
    let before = routes().fallback(missing).layer(layer(&clock));
    assert_eq!(four(before).await, limited);
    let default = routes().layer(layer(&clock));
    assert_eq!(four(default).await, limited);
    // The fallback after the layer: every unknown path unlimited.
    let after = routes().layer(layer(&clock)).fallback(missing);
    assert_eq!(four(after).await, vec![StatusCode::NOT_FOUND; 4]);
    // The whole router wrapped, whatever the order, and put back into a
    // router (so that `into_make_service_with_connect_info` still applies):
    // limited.
    let inner = routes().fallback(missing);
    let wrapped = Router::new().fallback_service(layer(&clock).layer(inner));
    assert_eq!(four(wrapped).await, limited);
}

/// Each rule of a multi-rule request counts its own untracked admissions:
/// a full table admitting untracked counts them, a rule whose table holds
/// every key counts none (a flipped test would count every tracked one).
#[tokio::test]
async fn untracked_admissions_are_counted_per_rule_among_several() {
    let clock = ManualClock::new();
    let layer = builder(&clock)
        .rule(
            Rule::per_ip("ip", Policy::fixed_window(Window::per_minute(5)))
                .max_keys(1)
                .when_full(ratewall::WhenFull::AdmitUntracked),
        )
        .rule(Rule::global(
            "all",
            Policy::fixed_window(Window::per_minute(1000)),
        ))
        .build()
        .unwrap();
    let app = make_app(layer.clone());
    for i in 0..64 {
        let got = get_(&app, &format!("198.51.100.{i}")).await;
        assert_eq!(got.status, StatusCode::OK);
    }
    let s = layer.stats();
    assert_eq!((s[0].allowed(), s[1].allowed()), (64, 64));
    assert_eq!(
        s[1].untracked(),
        0,
        "a global key is always tracked: {:?}",
        s[1]
    );
    assert!(
        (60..64).contains(&s[0].untracked()),
        "a one-key table tracks a few: {:?}",
        s[0]
    );
}

/// `X-Forwarded-For` seen while no proxy is trusted: one warning, however
/// many requests send it.
#[cfg(feature = "tracing")]
#[tokio::test]
async fn an_untrusted_forwarded_header_is_warned_about_once() {
    let logs = support::logs::Captured::default();
    let _guard = tracing::subscriber::set_default(logs.subscriber());
    let clock = ManualClock::new();
    let layer = builder(&clock)
        .rule(Rule::per_ip(
            "ip",
            Policy::fixed_window(Window::per_minute(100)),
        ))
        .build()
        .unwrap();
    send_forwarded(&make_app(layer), "203.0.113.9").await;
    let text = logs.text();
    let seen = text
        .lines()
        .filter(|l| l.contains("X-Forwarded-For seen"))
        .count();
    assert_eq!((seen, logs.warnings()), (1, 1), "{text}");
}

/// Behind trusted proxies `X-Forwarded-For` is expected: no warning, nor
/// for a rule that never reads the client address.
#[cfg(feature = "tracing")]
#[tokio::test]
async fn a_forwarded_header_is_not_warned_about_when_it_is_expected_or_unused() {
    let logs = support::logs::Captured::default();
    let _guard = tracing::subscriber::set_default(logs.subscriber());
    let clock = ManualClock::new();
    let trusted = builder(&clock)
        .client_ip(ClientIp::behind_proxies(["10.0.0.0/8".parse().unwrap()]))
        .rule(Rule::per_ip(
            "ip",
            Policy::fixed_window(Window::per_minute(100)),
        ))
        .build()
        .unwrap();
    let unused = builder(&clock)
        .rule(Rule::global(
            "all",
            Policy::fixed_window(Window::per_minute(100)),
        ))
        .build()
        .unwrap();
    for layer in [trusted, unused] {
        send_forwarded(&make_app(layer), "10.0.0.1").await;
    }
    assert!(logs.is_empty(), "{}", logs.text());
}

/// Five admitted requests from `peer`, each with an `X-Forwarded-For`.
#[cfg(feature = "tracing")]
async fn send_forwarded(app: &Router, peer: &str) {
    for _ in 0..5 {
        let got = send(app, "GET", "/", peer, &[("x-forwarded-for", b"1.1.1.1")]).await;
        assert_eq!(got.status, StatusCode::OK);
    }
}
