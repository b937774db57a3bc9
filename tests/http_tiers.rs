//! Premium tiers of HTTP rules (issue 23): a premium key gets 10x and a
//! normal key 1x, the headers advertise each client's own quota, the
//! rule's stats count every tier; in process with a `ManualClock` and end
//! to end with a real server and a real HTTP/1.1 client on loopback.

mod support;

use axum::body::Body;
use axum::routing::get;
use axum::Router;
use http::{Request, StatusCode};
use ratewall::http::{HttpConfigError, RateLimitLayer, Rule};
use ratewall::{ConfigError, ManualClock, Policy, Rate, Window};
use support::http_client::{admitted_per_value, call, serve, Got};

fn app(layer: RateLimitLayer<ManualClock>) -> Router {
    Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer)
}

const PEER: &str = "192.0.2.1";

async fn send(app: &Router, headers: &[(&str, &str)]) -> Got {
    call(app, "GET", "/", PEER, headers).await
}

async fn admitted(app: &Router, headers: &[(&str, &str)]) -> u64 {
    support::http_client::admitted(app, "/", PEER, headers).await
}

fn api() -> Rule {
    Rule::per_header(
        "api",
        "x-api-key",
        Policy::fixed_window(Window::per_minute(10)),
    )
    .tier("premium", Policy::fixed_window(Window::per_minute(100)))
    .tier_keys("premium", ["gold-1", "gold-2"])
}

#[tokio::test]
async fn premium_keys_get_ten_times_normal_keys_one_and_headers_say_which() {
    let clock = ManualClock::new();
    let layer = RateLimitLayer::builder()
        .clock(clock.clone())
        .rule(api())
        .build()
        .unwrap();
    let app = app(layer.clone());
    let first = send(&app, &[("x-api-key", "plain")]).await;
    assert_eq!(first.policy(), vec![("api".to_owned(), 10, 60)]);
    assert_eq!(first.ratelimit(), vec![("api".to_owned(), 9, 60)]);
    let gold = send(&app, &[("x-api-key", "gold-1")]).await;
    assert_eq!(gold.policy(), vec![("api".to_owned(), 100, 60)]);
    assert_eq!(gold.ratelimit(), vec![("api".to_owned(), 99, 60)]);
    assert_eq!(admitted(&app, &[("x-api-key", "plain")]).await, 9);
    assert_eq!(admitted(&app, &[("x-api-key", "gold-1")]).await, 99);
    // Each key has its own state: another premium key and another normal key.
    assert_eq!(admitted(&app, &[("x-api-key", "gold-2")]).await, 100);
    assert_eq!(admitted(&app, &[("x-api-key", "other")]).await, 10);
    let denied = send(&app, &[("x-api-key", "gold-2")]).await;
    assert_eq!(denied.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(denied.ratelimit(), vec![("api".to_owned(), 0, 60)]);
    // One rule in the stats, every tier counted.
    let stats = layer.stats();
    assert_eq!(stats.len(), 1);
    assert_eq!(
        (stats[0].name(), stats[0].allowed(), stats[0].denied()),
        ("api", 220, 5)
    );
    // The top offenders of every tier, as one summary: four keys (two per
    // tier), exact (fewer keys than slots), gold-2 first with its two
    // denials; keys from a header are shown only as fingerprints.
    let top = stats[0].top_offenders();
    assert_eq!(stats[0].offender_denials(), 5);
    assert_eq!(top.len(), 4, "{top:?}");
    assert_eq!(
        top.iter().map(|o| o.count()).collect::<Vec<_>>(),
        [2, 1, 1, 1]
    );
    assert!(top
        .iter()
        .all(|o| o.error() == 0 && o.key().starts_with('#')));
}

#[tokio::test]
async fn a_header_or_a_function_picks_the_tier_and_unknown_names_get_the_rule_own_policy() {
    #[derive(Clone)]
    struct Plan(&'static str);
    let clock = ManualClock::new();
    let by_header = Rule::per_header("h", "x-api-key", Policy::token_bucket(Rate::per_minute(2)))
        .tier("pro", Policy::token_bucket(Rate::per_minute(20)))
        .tier_by_header("x-plan");
    let by_fn = Rule::per_header("f", "x-user", Policy::token_bucket(Rate::per_minute(3)))
        .tier("pro", Policy::token_bucket(Rate::per_minute(30)))
        .tier_by(|_, ext| ext.get::<Plan>().map(|p| p.0));
    let layer = RateLimitLayer::builder()
        .clock(clock)
        .rule(by_header)
        .rule(by_fn)
        .build()
        .unwrap();
    let plans = |req: Request<Body>| {
        let plan = req.headers().get("x-user").is_some_and(|u| u == "vip");
        let mut req = req;
        if plan {
            req.extensions_mut().insert(Plan("pro"));
        }
        req
    };
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer)
        .layer(tower::util::MapRequestLayer::new(plans));
    assert_eq!(
        admitted(&app, &[("x-api-key", "a"), ("x-plan", "pro")]).await,
        20
    );
    assert_eq!(
        admitted(&app, &[("x-api-key", "b"), ("x-plan", "platinum")]).await,
        2
    );
    assert_eq!(admitted(&app, &[("x-api-key", "c")]).await, 2);
    assert_eq!(admitted(&app, &[("x-user", "vip")]).await, 30);
    assert_eq!(admitted(&app, &[("x-user", "joe")]).await, 3);
    let vip = send(&app, &[("x-user", "vip2")]).await;
    assert_eq!(
        vip.policy(),
        vec![("f".to_owned(), 3, 60)],
        "no plan: the rule's own quota"
    );
}

#[test]
fn bad_tiers_are_typed_errors_that_name_the_tier() {
    let build = |r: Rule| {
        RateLimitLayer::builder()
            .rule(r)
            .build()
            .map(|_| ())
            .unwrap_err()
    };
    let unknown = build(api().tier_keys("platinum", ["k"]));
    assert_eq!(
        unknown,
        HttpConfigError::UnknownTier {
            rule: "api".into(),
            tier: "platinum".into()
        }
    );
    assert!(unknown.to_string().contains("\"platinum\""), "{unknown}");
    // A tier's rate that breaks the algorithm's budget: the rule's error.
    let zero = build(api().tier("free", Policy::token_bucket(Rate::per_second(0))));
    assert_eq!(
        zero,
        HttpConfigError::Policy {
            rule: "api".into(),
            error: ConfigError::ZeroRate
        }
    );
    let rule_zero = build(Rule::per_header(
        "api",
        "x-api-key",
        Policy::token_bucket(Rate::per_second(0)),
    ));
    assert_eq!(zero, rule_zero);
    assert!(matches!(
        build(api().tier("bad name", Policy::token_bucket(Rate::per_second(1)))),
        HttpConfigError::InvalidTierName { tier, .. } if tier == "bad name"
    ));
    assert!(matches!(
        build(
            Rule::per_ip("ip", Policy::token_bucket(Rate::per_second(1)))
                .tier("pro", Policy::token_bucket(Rate::per_second(10)))
                .tier_keys("pro", ["x"])
        ),
        HttpConfigError::InvalidValue {
            field: "tier_keys",
            ..
        }
    ));
    assert!(matches!(
        build(api().cost(20)),
        HttpConfigError::CostTooHigh {
            cost: 20,
            limit: 10,
            ..
        }
    ));
    assert!(matches!(
        build(
            Rule::per_header(
                "api",
                "x-api-key",
                Policy::fixed_window(Window::per_minute(100))
            )
            .tier("small", Policy::fixed_window(Window::per_minute(5)))
            .tier_by_header("x-plan")
            .cost(10)
        ),
        HttpConfigError::CostTooHigh {
            cost: 10,
            limit: 5,
            ..
        }
    ));
    assert!(matches!(
        build(api().tier_by_header("bad header")),
        HttpConfigError::InvalidHeaderName { .. }
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn end_to_end_a_premium_key_gets_ten_times_a_normal_key() {
    let layer = RateLimitLayer::builder()
        .clock(ManualClock::new())
        .rule(api())
        .build()
        .unwrap();
    let (addr, stop, server) = serve("127.0.0.1:0", app(layer)).await;
    let got = admitted_per_value(addr, "x-api-key", &["plain", "gold-1"], 120).await;
    assert_eq!(got, [(10, vec![10]), (100, vec![100])]);
    drop(stop);
    server.await.unwrap();
}
