//! Concurrency rules in the HTTP layer (issue 21 item 5), over a real
//! server on loopback and a real HTTP/1.1 client: the limit is reached and
//! never exceeded; rate and concurrency rules are one all-or-nothing step
//! (a request denied by either takes nothing from the other, read back
//! from the headers and the stats); permits come back at the body's end,
//! when the body is dropped mid-stream, and when the inner service fails,
//! panics or is cancelled; the headers and the 503 are exact; an adaptive
//! rule shrinks under a slow backend; the configuration file.

mod support;

use axum::routing::get;
use axum::Router;
use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use ratewall::http::{ClientIp, Key, LayerConfig, PermitRelease, RateLimitLayer, Rule, RuleConfig};
use ratewall::{Adaptive, ManualClock, Policy, Priority, Rate};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use support::http_client::{get_seen as get_, head, held_route, serve, Gauge, Seen, Stalling};
use tokio::sync::Semaphore;
use tower::{Service, ServiceExt};

/// Waits (at most 5 s) until the layer's rule `rule` has `n` in flight.
async fn in_flight_becomes(layer: &RateLimitLayer<impl ratewall::Clock>, rule: usize, n: u64) {
    for _ in 0..500 {
        if layer.stats()[rule].in_flight() == n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!(
        "in flight stayed {}, not {n}",
        layer.stats()[rule].in_flight()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_limit_is_reached_and_never_exceeded_under_parallel_slow_requests() {
    let layer = RateLimitLayer::builder()
        .rule(Rule::concurrent("db", Key::global(), 4))
        .build()
        .unwrap();
    let gauge = Arc::new(Gauge::default());
    let app = Router::new()
        .route("/", gauge.slow_route(Duration::from_millis(150)))
        .layer(layer.clone());
    let (addr, stop, server) = serve("127.0.0.1:0", app).await;
    for _round in 0..3 {
        let calls: Vec<_> = (0..16)
            .map(|_| tokio::spawn(async move { get_(addr, "/", &[]).await.status }))
            .collect();
        let mut ok = 0;
        for c in calls {
            match c.await.unwrap() {
                StatusCode::OK => ok += 1,
                StatusCode::SERVICE_UNAVAILABLE => {}
                other => panic!("unexpected {other}"),
            }
        }
        assert!((4..16).contains(&ok), "{ok} admitted");
        in_flight_becomes(&layer, 0, 0).await;
    }
    assert_eq!(
        gauge.most.load(Ordering::SeqCst),
        4,
        "reached, never exceeded"
    );
    let s = &layer.stats()[0];
    assert_eq!(s.allowed() + s.shed(), 48);
    assert_eq!(
        s.denied(),
        0,
        "a global rule sheds, it does not deny a client"
    );
    drop(stop);
    server.await.unwrap();
}

/// `extra`'s routes, `/` and `/hold`, whose requests wait until the test
/// lets them go (one permit of `gate` each), behind `layer`.
fn gated<C: ratewall::Clock + 'static>(
    layer: &RateLimitLayer<C>,
    gate: Arc<Semaphore>,
    extra: Router,
) -> Router {
    extra
        .route("/hold", held_route(gate))
        .route("/", get(|| async { "ok" }))
        .layer(layer.clone())
}

/// A layer with a per-IP rate rule `ip` (`rate`) and a global
/// concurrency rule `db` of `max`, on a manual clock.
fn ip_and_db(clock: &ManualClock, rate: Rate, max: u64) -> RateLimitLayer<ManualClock> {
    RateLimitLayer::builder()
        .clock(clock.clone())
        .rule(Rule::per_ip("ip", Policy::token_bucket(rate)))
        .rule(Rule::concurrent("db", Key::global(), max))
        .build()
        .unwrap()
}

/// `GET /hold` in a task, once rule `rule` of `layer` has `n` in flight.
async fn hold<C: ratewall::Clock>(
    addr: SocketAddr,
    layer: &RateLimitLayer<C>,
    rule: usize,
    n: u64,
) -> tokio::task::JoinHandle<Seen> {
    let held = tokio::spawn(async move { get_(addr, "/hold", &[]).await });
    in_flight_becomes(layer, rule, n).await;
    held
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_denied_by_either_kind_of_rule_takes_nothing_from_the_other() {
    let clock = ManualClock::new();
    let layer = ip_and_db(&clock, Rate::per_minute(5).burst(5), 2);
    let gate = Arc::new(Semaphore::new(0));
    let (addr, stop, server) =
        serve("127.0.0.1:0", gated(&layer, gate.clone(), Router::new())).await;
    // Two requests hold both permits (and 2 of the 5 rate units).
    let held = [
        hold(addr, &layer, 1, 1).await,
        hold(addr, &layer, 1, 2).await,
    ];
    // Shed by the concurrency rule: no rate unit taken (3 times).
    for _ in 0..3 {
        let shed = get_(addr, "/", &[]).await;
        assert_eq!(shed.status, StatusCode::SERVICE_UNAVAILABLE);
    }
    assert_eq!(layer.stats()[0].allowed(), 2);
    gate.add_permits(2);
    for h in held {
        assert_eq!(h.await.unwrap().status, StatusCode::OK);
    }
    in_flight_becomes(&layer, 1, 0).await;
    // 3 of 5 units were left: the shed requests took none.
    let ok = get_(addr, "/", &[]).await;
    assert_eq!(ok.status, StatusCode::OK);
    assert_eq!((ok.r("ip"), ok.r("db")), (Some(2), Some(1)));
    let _ = get_(addr, "/", &[]).await;
    let _ = get_(addr, "/", &[]).await;
    // The rate rule is spent: denied, and no permit is taken (many times).
    for _ in 0..5 {
        let denied = get_(addr, "/", &[]).await;
        assert_eq!(denied.status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(layer.stats()[1].in_flight(), 0);
    }
    let s = layer.stats();
    assert_eq!((s[0].allowed(), s[0].denied()), (5, 5));
    assert_eq!((s[1].allowed(), s[1].shed(), s[1].denied()), (5, 3, 0));
    // Units back: both permits are free (r = 2 - 1), the rate unit taken.
    clock.advance(Duration::from_secs(60));
    let ok = get_(addr, "/", &[]).await;
    assert_eq!((ok.r("ip"), ok.r("db")), (Some(4), Some(1)));
    drop(stop);
    server.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_over_its_own_concurrency_limit_gets_429_and_others_pass() {
    let clock = ManualClock::new();
    let layer = RateLimitLayer::builder()
        .clock(clock.clone())
        .client_ip(ClientIp::behind_proxies(["127.0.0.1/32".parse().unwrap()]))
        .rule(Rule::concurrent("per-ip", Key::ip(), 1))
        .build()
        .unwrap();
    let gate = Arc::new(Semaphore::new(0));
    let (addr, stop, server) =
        serve("127.0.0.1:0", gated(&layer, gate.clone(), Router::new())).await;
    let a = [("x-forwarded-for", "198.51.100.1")];
    let b = [("x-forwarded-for", "198.51.100.2")];
    let held = tokio::spawn(async move { get_(addr, "/hold", &a).await });
    for _ in 0..500 {
        if layer.stats()[0].allowed() == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let over = get_(addr, "/", &a).await;
    assert_eq!(over.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        over.header("ratelimit-policy"),
        Some("\"per-ip\";q=1;qu=\"concurrent-requests\"")
    );
    assert_eq!(over.header("ratelimit"), Some("\"per-ip\";r=0"));
    assert_eq!(over.header("retry-after"), Some("1"));
    assert_eq!(
        over.json()["type"],
        "https://iana.org/assignments/http-problem-types#quota-exceeded"
    );
    // Another client has its own permits.
    let other = get_(addr, "/", &b).await;
    assert_eq!(other.status, StatusCode::OK);
    assert_eq!(other.header("ratelimit"), Some("\"per-ip\";r=0"));
    gate.add_permits(1);
    assert_eq!(held.await.unwrap().status, StatusCode::OK);
    assert_eq!(get_(addr, "/", &a).await.status, StatusCode::OK);
    let s = &layer.stats()[0];
    assert_eq!((s.allowed(), s.denied(), s.shed()), (3, 1, 0));
    assert_eq!(s.top_offenders()[0].key(), "198.51.100.1");
    drop(stop);
    server.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_later_concurrency_rule_that_sheds_gives_back_the_earlier_ones_permit() {
    let layer = RateLimitLayer::builder()
        .rule(Rule::concurrent("all", Key::global(), 5))
        .rule(Rule::concurrent("hold", Key::global(), 1).on_path_prefix("/hold"))
        .build()
        .unwrap();
    let gate = Arc::new(Semaphore::new(0));
    let (addr, stop, server) = serve("127.0.0.1:0", gated(&layer, gate, Router::new())).await;
    let _held = hold(addr, &layer, 1, 1).await;
    for _ in 0..4 {
        let shed = get_(addr, "/hold", &[]).await;
        assert_eq!(shed.status, StatusCode::SERVICE_UNAVAILABLE);
        // `all` took a permit for it, and gave it back.
        assert_eq!(layer.stats()[0].in_flight(), 1);
        assert_eq!(shed.header("ratelimit"), Some("\"hold\";r=0"));
    }
    let s = layer.stats();
    assert_eq!((s[0].allowed(), s[0].shed()), (1, 0));
    assert_eq!((s[1].allowed(), s[1].shed()), (1, 4));
    drop(stop);
    server.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headers_are_exact_and_a_shed_request_gets_the_drafts_503() {
    let clock = ManualClock::new();
    let layer = ip_and_db(&clock, Rate::per_minute(60).burst(10), 1);
    let gate = Arc::new(Semaphore::new(0));
    let (addr, stop, server) =
        serve("127.0.0.1:0", gated(&layer, gate.clone(), Router::new())).await;
    let ok = get_(addr, "/", &[]).await;
    assert_eq!(ok.status, StatusCode::OK);
    assert_eq!(
        ok.header("ratelimit-policy"),
        Some("\"ip\";q=10;w=10, \"db\";q=1;qu=\"concurrent-requests\"")
    );
    assert_eq!(ok.header("ratelimit"), Some("\"ip\";r=9;t=1, \"db\";r=0"));
    let held = hold(addr, &layer, 1, 1).await;
    let shed = get_(addr, "/", &[]).await;
    assert_eq!(shed.status, StatusCode::SERVICE_UNAVAILABLE);
    // Only the rule that shed the request; no `t`; Retry-After at least 1 s.
    assert_eq!(
        shed.header("ratelimit-policy"),
        Some("\"db\";q=1;qu=\"concurrent-requests\"")
    );
    assert_eq!(shed.header("ratelimit"), Some("\"db\";r=0"));
    assert!(shed.header("retry-after").unwrap().parse::<u64>().unwrap() >= 1);
    assert_eq!(
        shed.header("content-type"),
        Some("application/problem+json")
    );
    let v = shed.json();
    assert_eq!(
        v["type"],
        "https://iana.org/assignments/http-problem-types#temporary-reduced-capacity"
    );
    assert_eq!(v["status"], 503);
    assert_eq!(v["violated-policies"], serde_json::json!(["db"]));
    gate.add_permits(1);
    assert_eq!(held.await.unwrap().status, StatusCode::OK);
    drop(stop);
    server.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_of_a_shed_request_is_the_mean_hold_time_rounded_up() {
    let layer = RateLimitLayer::builder()
        .rule(Rule::concurrent("db", Key::global(), 1))
        .build()
        .unwrap();
    let gate = Arc::new(Semaphore::new(0));
    let slow = Router::new().route(
        "/slow",
        get(|| async {
            tokio::time::sleep(Duration::from_millis(2_100)).await;
            "slow"
        }),
    );
    let (addr, stop, server) = serve("127.0.0.1:0", gated(&layer, gate, slow)).await;
    // The first permit back is always timed: a mean hold time of 2.1 s.
    assert_eq!(get_(addr, "/slow", &[]).await.status, StatusCode::OK);
    let _held = hold(addr, &layer, 0, 1).await;
    let shed = get_(addr, "/slow", &[]).await;
    assert_eq!(shed.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(shed.header("retry-after"), Some("3"));
    drop(stop);
    server.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_is_held_while_the_body_streams_and_released_when_it_is_dropped() {
    let layer = RateLimitLayer::builder()
        .rule(Rule::concurrent("stream", Key::global(), 1))
        .build()
        .unwrap();
    let dropped = Arc::new(AtomicUsize::new(0));
    let app = Router::new()
        .route("/stream", Stalling::route(dropped.clone()))
        .route("/", get(|| async { "ok" }))
        .layer(layer.clone());
    let (addr, stop, server) = serve("127.0.0.1:0", app).await;
    let res = head(addr, "/stream", &[]).await;
    assert_eq!(res.status(), StatusCode::OK);
    let mut body = res.into_body();
    let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
    assert_eq!(&first[..], b"first chunk");
    // The head and a chunk are out; the body is not at its end: still held.
    assert_eq!(layer.stats()[0].in_flight(), 1);
    assert_eq!(
        get_(addr, "/", &[]).await.status,
        StatusCode::SERVICE_UNAVAILABLE
    );
    // The client goes away mid-stream: the server drops the body, and the
    // permit comes back.
    drop(body);
    in_flight_becomes(&layer, 0, 0).await;
    assert_eq!(dropped.load(Ordering::SeqCst), 1);
    assert_eq!(get_(addr, "/", &[]).await.status, StatusCode::OK);
    in_flight_becomes(&layer, 0, 0).await;
    drop(stop);
    server.await.unwrap();
}

/// An inner service (not axum's: axum's never fails) that fails, panics,
/// stalls or answers, as the path says; the layer around it.
fn raw_service(
    layer: &RateLimitLayer,
) -> impl Service<
    Request<String>,
    Response = Response<ratewall::http::ResponseBody<String>>,
    Error = &'static str,
    Future: Send,
> + Clone {
    let inner = tower::service_fn(|req: Request<String>| async move {
        match req.uri().path() {
            "/fail" => Err("backend down"),
            "/panic" => panic!("handler bug"),
            "/stall" => std::future::pending().await,
            "/missing-404" => {
                let mut r = Response::new(String::new());
                *r.status_mut() = StatusCode::NOT_FOUND;
                Ok(r)
            }
            "/500" => {
                let mut r = Response::new(String::from("oops"));
                *r.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
                Ok(r)
            }
            _ => Ok(Response::new(String::from("ok"))),
        }
    });
    tower::ServiceBuilder::new()
        .layer(layer.clone())
        .service(inner)
}

fn request(path: &str) -> Request<String> {
    let mut req = Request::builder().uri(path).body(String::new()).unwrap();
    req.extensions_mut()
        .insert(SocketAddr::from(([192, 0, 2, 9], 4000)));
    req
}

#[tokio::test]
async fn permits_come_back_when_the_inner_service_fails_panics_or_is_cancelled() {
    let layer = RateLimitLayer::builder()
        .rule(Rule::concurrent("all", Key::global(), 1))
        .build()
        .unwrap();
    let svc = raw_service(&layer);
    assert_eq!(
        svc.clone().oneshot(request("/fail")).await.unwrap_err(),
        "backend down"
    );
    assert_eq!(layer.stats()[0].in_flight(), 0);
    let panicked = tokio::spawn(svc.clone().oneshot(request("/panic"))).await;
    assert!(panicked.unwrap_err().is_panic());
    assert_eq!(layer.stats()[0].in_flight(), 0);
    // Cancelled: the future is dropped before any response.
    let stalled = tokio::time::timeout(
        Duration::from_millis(50),
        svc.clone().oneshot(request("/stall")),
    )
    .await;
    assert!(stalled.is_err());
    assert_eq!(layer.stats()[0].in_flight(), 0);
    // A response whose body is never read holds its permit until dropped.
    let res = svc.clone().oneshot(request("/")).await.unwrap();
    assert_eq!(layer.stats()[0].in_flight(), 1);
    let denied = svc.clone().oneshot(request("/")).await.unwrap();
    assert_eq!(denied.status(), StatusCode::SERVICE_UNAVAILABLE);
    drop(res);
    assert_eq!(layer.stats()[0].in_flight(), 0);
    // Read to its end: released at the end, before the body is dropped.
    let res = svc.clone().oneshot(request("/500")).await.unwrap();
    let mut body = res.into_body();
    while body.frame().await.is_some() {}
    assert_eq!(layer.stats()[0].in_flight(), 0);
    drop(body);
    assert_eq!(layer.stats()[0].allowed(), 5);
}

#[tokio::test]
async fn an_adaptive_rule_shrinks_under_a_slow_backend() {
    let layer = RateLimitLayer::builder()
        .rule(
            Rule::concurrent("backend", Key::global(), 20)
                .adaptive(Adaptive::aimd(2, 20, Duration::from_millis(5)).backoff(0.5)),
        )
        .build()
        .unwrap();
    let app = Router::new()
        .route(
            "/",
            get(|| async {
                tokio::time::sleep(Duration::from_millis(30)).await;
                "slow"
            }),
        )
        .layer(layer.clone());
    let (addr, stop, server) = serve("127.0.0.1:0", app).await;
    // The quota advertised is the ceiling; r + 1 of a lone request is the
    // maximum now.
    let first = get_(addr, "/", &[]).await;
    assert_eq!(
        first.header("ratelimit-policy"),
        Some("\"backend\";q=20;qu=\"concurrent-requests\"")
    );
    assert_eq!(first.r("backend"), Some(19));
    for _wave in 0..4 {
        let calls: Vec<_> = (0..10)
            .map(|_| tokio::spawn(async move { get_(addr, "/", &[]).await.status }))
            .collect();
        for c in calls {
            assert_ne!(c.await.unwrap(), StatusCode::TOO_MANY_REQUESTS);
        }
    }
    in_flight_becomes(&layer, 0, 0).await;
    let now = get_(addr, "/", &[]).await.r("backend").unwrap() + 1;
    assert!(
        (2..=10).contains(&now),
        "the maximum is {now}, not below 10"
    );
    drop(stop);
    server.await.unwrap();
}

#[tokio::test]
async fn an_adaptive_rule_learns_failures_and_5xx_as_drops_and_4xx_as_nothing() {
    let layer = RateLimitLayer::builder()
        .rule(
            Rule::concurrent("all", Key::global(), 8)
                .adaptive(Adaptive::aimd(1, 8, Duration::from_secs(10)).backoff(0.5)),
        )
        .build()
        .unwrap();
    let svc = raw_service(&layer);
    // r + 1 of a lone request: the maximum now.
    let max = |res: Response<ratewall::http::ResponseBody<String>>| {
        let r = res.headers()["ratelimit"].to_str().unwrap().to_owned();
        r.trim_start_matches("\"all\";r=").parse::<u64>().unwrap() + 1
    };
    assert_eq!(max(svc.clone().oneshot(request("/")).await.unwrap()), 8);
    // 4xx: no sample, whatever the count.
    for _ in 0..20 {
        let res = svc.clone().oneshot(request("/missing-404")).await.unwrap();
        drop(res);
    }
    // Successes below the latency threshold never lower it.
    assert_eq!(max(svc.clone().oneshot(request("/")).await.unwrap()), 8);
    // Inner failures are drops: x 0.5 per window of 8.
    for _ in 0..8 {
        let _ = svc.clone().oneshot(request("/fail")).await.unwrap_err();
    }
    let after_fail = max(svc.clone().oneshot(request("/")).await.unwrap());
    assert!(after_fail <= 5, "{after_fail}");
    for _ in 0..8 {
        let res = svc.clone().oneshot(request("/500")).await.unwrap();
        let mut body = res.into_body();
        while body.frame().await.is_some() {}
    }
    let after_500 = max(svc.clone().oneshot(request("/")).await.unwrap());
    assert!(after_500 < after_fail, "{after_500} after {after_fail}");
}

#[tokio::test]
async fn kept_shares_keep_room_for_critical_requests() {
    let layer = RateLimitLayer::builder()
        .rule(
            Rule::concurrent("all", Key::global(), 4)
                .keep_for(Priority::Critical, 50)
                .priority_by_header("x-priority"),
        )
        .build()
        .unwrap();
    let svc = raw_service(&layer);
    let mut held = Vec::new();
    for _ in 0..2 {
        held.push(svc.clone().oneshot(request("/")).await.unwrap());
    }
    let normal = svc.clone().oneshot(request("/")).await.unwrap();
    assert_eq!(normal.status(), StatusCode::SERVICE_UNAVAILABLE);
    // The class header sent twice names no class: a normal request, shed.
    let mut twice = request("/");
    for _ in 0..2 {
        twice
            .headers_mut()
            .append("x-priority", "critical".parse().unwrap());
    }
    let res = svc.clone().oneshot(twice).await.unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    let mut critical = request("/");
    critical
        .headers_mut()
        .insert("x-priority", "Critical".parse().unwrap());
    for _ in 0..2 {
        let res = svc
            .clone()
            .oneshot(critical.clone_for_test())
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        held.push(res);
    }
    assert_eq!(layer.stats()[0].in_flight(), 4);
    assert_eq!(
        svc.clone()
            .oneshot(critical.clone_for_test())
            .await
            .unwrap()
            .status(),
        StatusCode::SERVICE_UNAVAILABLE
    );
    drop(held);
    assert_eq!(layer.stats()[0].in_flight(), 0);
    assert_eq!(layer.stats()[0].shed(), 3);
}

trait CloneForTest {
    fn clone_for_test(&self) -> Self;
}

impl CloneForTest for Request<String> {
    fn clone_for_test(&self) -> Self {
        let mut req = Request::builder()
            .uri(self.uri().clone())
            .body(String::new())
            .unwrap();
        *req.headers_mut() = self.headers().clone();
        req.extensions_mut()
            .insert(SocketAddr::from(([192, 0, 2, 9], 4000)));
        req
    }
}

#[test]
fn settings_the_layer_cannot_honour_are_typed_errors() {
    use ratewall::http::HttpConfigError;
    let err = |rule: Rule| RateLimitLayer::builder().rule(rule).build().unwrap_err();
    let zero = err(Rule::concurrent("c", Key::global(), 0));
    assert!(matches!(
        zero,
        HttpConfigError::Policy {
            error: ratewall::ConfigError::ZeroLimit,
            ..
        }
    ));
    // A maximum in flight is no window's limit.
    assert!(!zero.to_string().contains("window"), "{zero}");
    for bad in [
        Rule::concurrent("c", Key::ip(), 4).adaptive(Adaptive::vegas(1, 9)),
        Rule::concurrent("c", Key::header("x-user"), 4).keep_for(Priority::Critical, 10),
        Rule::concurrent("c", Key::global(), 4).mode(ratewall::http::Mode::Shadow),
        Rule::concurrent("c", Key::global(), 4).count_failures_only(),
        Rule::per_ip("c", Policy::token_bucket(Rate::per_second(1)))
            .adaptive(Adaptive::vegas(1, 9)),
        Rule::per_ip("c", Policy::token_bucket(Rate::per_second(1)))
            .release_permit(PermitRelease::ResponseHead),
        Rule::concurrent("c", Key::global(), 4).keep_for(Priority::Critical, 100),
    ] {
        let e = err(bad);
        assert!(
            matches!(&e, HttpConfigError::Policy { rule, error: ratewall::ConfigError::Incompatible { .. } } if rule == "c"),
            "{e:?}"
        );
        assert!(!e.to_string().is_empty());
    }
    // Bounds that cannot hold the maximum: the error shows all three.
    let bounds = err(Rule::concurrent("c", Key::global(), 40).adaptive(Adaptive::vegas(1, 9)));
    assert_eq!(
        bounds,
        HttpConfigError::Policy {
            rule: "c".into(),
            error: ratewall::ConfigError::AdaptiveBounds {
                floor: 1,
                initial: 40,
                ceiling: 9
            }
        }
    );
    let text = bounds.to_string();
    assert!(text.contains("40") && text.contains("1..9"), "{text}");
    assert!(matches!(
        err(Rule::concurrent("c", Key::global(), 4).cost(5)),
        HttpConfigError::CostTooHigh {
            cost: 5,
            limit: 4,
            ..
        }
    ));
    let header = err(Rule::concurrent("c", Key::global(), 4).priority_by_header("bad header"));
    assert!(matches!(header, HttpConfigError::InvalidHeaderName { .. }));
    // The rule is keyed by no header: the message names the header's roles.
    assert!(header.to_string().contains("priority header"), "{header}");
}

/// A mistake is told in the words it was made in: a rule from a file
/// names the file's fields and values, one made in Rust the API's names.
#[test]
fn concurrency_errors_speak_the_language_of_their_origin() {
    let from_file = |extra: &str| {
        let text = format!("[[rules]]\nname = \"c\"\nkey = \"ip\"\nconcurrent = 4\n{extra}\n");
        let config: LayerConfig = toml::from_str(&text).unwrap();
        config
            .to_builder()
            .unwrap()
            .build()
            .unwrap_err()
            .to_string()
    };
    let in_rust = |rule: Rule| {
        RateLimitLayer::builder()
            .rule(rule)
            .build()
            .unwrap_err()
            .to_string()
    };

    let file = from_file("adaptive = \"vegas 1..9\"");
    assert!(file.contains("`key = \"global\"`"), "{file}");
    assert!(
        !file.contains("Key::") && !file.contains("on_route"),
        "{file}"
    );
    let rust = in_rust(Rule::concurrent("c", Key::ip(), 4).adaptive(Adaptive::vegas(1, 9)));
    assert!(rust.contains("`Key::global()`"), "{rust}");

    let file = from_file("mode = \"shadow\"");
    assert!(
        file.contains("`mode = \"shadow\"`") && file.contains("`concurrent`"),
        "{file}"
    );
    let rust = in_rust(Rule::concurrent("c", Key::global(), 4).mode(ratewall::http::Mode::Shadow));
    assert!(rust.contains("`Mode::Shadow`"), "{rust}");

    let file = from_file("count_failures_only = true");
    assert!(file.contains("a rule with a `policy`"), "{file}");

    // A rate rule given a concurrency setting in Rust is told to make a
    // concurrency rule with the API (the file refuses it when read).
    let rust = in_rust(
        Rule::per_ip("c", Policy::token_bucket(Rate::per_second(1)))
            .adaptive(Adaptive::vegas(1, 9)),
    );
    assert!(
        rust.contains("`Rule::concurrent`") && !rust.contains(" = "),
        "{rust}"
    );
}

#[tokio::test]
async fn concurrency_rules_come_from_the_configuration_file() {
    let text = r#"
        [[rules]]
        name = "ip"
        key = "ip"
        policy = "600/min"

        [[rules]]
        name = "reports"
        key = "global"
        concurrent = 3
        path_prefix = "/reports"
        keep_for = { critical = 30 }
        priority_header = "x-priority"
        release_permit = "body-end"

        [[rules]]
        name = "backend"
        key = "global"
        concurrent = 50
        adaptive = "aimd 5..100 250ms backoff 0.8"
    "#;
    let config: LayerConfig = toml::from_str(text).unwrap();
    // Round trip: what is written back reads as the same configuration.
    let again: LayerConfig = toml::from_str(&toml::to_string(&config).unwrap()).unwrap();
    assert_eq!(again, config);
    let layer = config.to_builder().unwrap().build().unwrap();
    let svc = raw_service(&layer);
    let res = svc.clone().oneshot(request("/reports/q3")).await.unwrap();
    assert_eq!(
        res.headers()["ratelimit-policy"],
        "\"ip\";q=600;w=60, \"reports\";q=3;qu=\"concurrent-requests\", \"backend\";q=100;qu=\"concurrent-requests\""
    );
    assert_eq!(
        res.headers()["ratelimit"],
        "\"ip\";r=599;t=1, \"reports\";r=1, \"backend\";r=49"
    );
    drop(res);
    assert_eq!(layer.stats()[1].in_flight(), 0);

    let bad = |edit: &dyn Fn(&mut RuleConfig)| {
        let mut rule = RuleConfig::new("c", "global", "");
        rule.concurrent = Some(4);
        edit(&mut rule);
        rule.to_rule().unwrap_err()
    };
    use ratewall::http::HttpConfigError::InvalidValue;
    let field_of = |e| match e {
        InvalidValue { field, .. } => field,
        other => panic!("{other:?}"),
    };
    assert_eq!(field_of(bad(&|r| r.policy = "10/s".into())), "concurrent");
    assert_eq!(
        field_of(bad(&|r| r.adaptive = Some("gradient 1..9".into()))),
        "adaptive"
    );
    assert_eq!(
        field_of(bad(&|r| {
            r.keep_for.insert("urgent".into(), 10);
        })),
        "keep_for"
    );
    assert_eq!(
        field_of(bad(&|r| r.priority_header = Some("a b".into()))),
        "priority_header"
    );
    // A Redis concurrency rule is built on the layer's backend
    // (`to_builder_with_redis`, feature `redis`).
    let redis = bad(&|r| r.store = Some("redis".into()));
    #[cfg(feature = "redis")]
    assert!(
        matches!(
            redis,
            ratewall::http::HttpConfigError::RedisBackendMissing { .. }
        ),
        "{redis:?}"
    );
    #[cfg(not(feature = "redis"))]
    assert!(
        matches!(
            redis,
            ratewall::http::HttpConfigError::RedisFeatureMissing { .. }
        ),
        "{redis:?}"
    );
    assert_eq!(
        field_of(bad(&|r| r.release_permit = Some("head".into()))),
        "release_permit"
    );
    assert_eq!(field_of(bad(&|r| r.concurrent = None)), "policy");
    let mut rate = RuleConfig::new("r", "ip", "10/s");
    rate.adaptive = Some("vegas 1..9".into());
    assert_eq!(field_of(rate.to_rule().unwrap_err()), "adaptive");
    rate.adaptive = None;
    rate.release_permit = Some("response-head".into());
    assert_eq!(field_of(rate.to_rule().unwrap_err()), "release_permit");
    let msg = bad(&|r| r.adaptive = Some("vegas".into())).to_string();
    assert!(msg.contains("vegas FLOOR..CEILING"), "{msg}");
    // A backoff outside (0, 1) reads, but the layer refuses to build, and
    // the message shows the value written.
    let aimd: LayerConfig = toml::from_str(
        "[[rules]]\nname = \"c\"\nkey = \"global\"\nconcurrent = 4\nadaptive = \"aimd 2..8 50ms backoff 1.5\"",
    )
    .unwrap();
    let msg = aimd.to_builder().unwrap().build().unwrap_err().to_string();
    assert!(msg.contains("backoff is 1.5,"), "{msg}");
    // The field's old name is refused, and the message lists its new one.
    let old = toml::from_str::<LayerConfig>(
        "[[rules]]\nname = \"c\"\nkey = \"global\"\nconcurrent = 4\nreserve = { critical = 20 }",
    )
    .unwrap_err()
    .to_string();
    assert!(
        old.contains("unknown field `reserve`") && old.contains("`keep_for`"),
        "{old}"
    );
}

/// With `metrics`, a concurrency rule's outcomes are the facade's counters,
/// one label set per outcome: allowed, denied (429) and shed (503).
#[cfg(feature = "metrics")]
#[tokio::test]
async fn concurrency_outcomes_are_metrics() {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    let recorder = DebuggingRecorder::new();
    let snap = recorder.snapshotter();
    let layer = metrics::with_local_recorder(&recorder, || {
        RateLimitLayer::builder()
            .rule(Rule::concurrent("all", Key::global(), 1))
            .rule(Rule::concurrent("per-ip", Key::ip(), 1).on_path_prefix("/ip"))
            .build()
            .unwrap()
    });
    let svc = raw_service(&layer);
    let held = svc.clone().oneshot(request("/")).await.unwrap();
    for _ in 0..3 {
        let shed = svc.clone().oneshot(request("/")).await.unwrap();
        assert_eq!(shed.status(), StatusCode::SERVICE_UNAVAILABLE);
    }
    drop(held);
    let mine = svc.clone().oneshot(request("/ip")).await.unwrap();
    // `all` admits it; `per-ip` has its 1 permit out.
    let other = svc.clone().oneshot(request("/ip")).await.unwrap();
    assert_eq!(
        other.status(),
        StatusCode::SERVICE_UNAVAILABLE,
        "`all` is full first"
    );
    drop((mine, other));
    let counts: Vec<(String, String, u64)> = snap
        .snapshot()
        .into_vec()
        .into_iter()
        .filter(|(k, ..)| k.key().name() == "ratewall_http_requests_total")
        .filter_map(|(k, _, _, v)| {
            let label = |name: &str| {
                k.key()
                    .labels()
                    .find(|l| l.key() == name)
                    .map(|l| l.value().to_owned())
            };
            match v {
                DebugValue::Counter(n) if n > 0 => Some((label("rule")?, label("outcome")?, n)),
                _ => None,
            }
        })
        .collect();
    let s = layer.stats();
    for (rule, outcome, n) in &counts {
        let st = s.iter().find(|x| x.name() == rule).unwrap();
        let want = match outcome.as_str() {
            "allowed" => st.allowed(),
            "shed" => st.shed(),
            "denied" => st.denied(),
            _ => continue,
        };
        assert_eq!(*n, want, "{rule} {outcome}");
    }
    assert!(
        counts.contains(&("all".into(), "shed".into(), 4)),
        "{counts:?}"
    );
    assert!(
        counts.contains(&("all".into(), "allowed".into(), 2)),
        "{counts:?}"
    );
}

/// Issue 30: all-or-nothing takes nothing from a rule when another refuses
/// the request, so a client could hammer a route that sheds (503) at any
/// rate without meeting its per-IP rule (4,421 requests in 8 s: 3,968 shed,
/// 0 rate-denied). By default it still does (the last line shows it); with
/// `count_refused` on the per-IP rule, the shed requests spend the client's
/// own quota and then its own limit answers 429.
#[tokio::test]
async fn a_rule_that_counts_refused_requests_meets_a_client_hammering_a_shedding_route() {
    let build = |count: bool, config: bool| {
        let ip = Rule::per_ip("ip", Policy::token_bucket(Rate::per_minute(5)));
        let ip = if count { ip.count_refused() } else { ip };
        let shed = Rule::concurrent("reports", Key::global(), 1).on_path_prefix("/stall");
        if config {
            let text = format!(
                "[[rules]]\nname = \"ip\"\nkey = \"ip\"\npolicy = \"5/min\"\ncount_refused = {count}\n\n\
                 [[rules]]\nname = \"reports\"\nkey = \"global\"\nconcurrent = 1\npath_prefix = \"/stall\"\n"
            );
            let config: LayerConfig = toml::from_str(&text).unwrap();
            let again: LayerConfig = toml::from_str(&toml::to_string(&config).unwrap()).unwrap();
            assert_eq!(again, config);
            config.to_builder().unwrap().build().unwrap()
        } else {
            RateLimitLayer::builder()
                .rule(ip)
                .rule(shed)
                .build()
                .unwrap()
        }
    };
    for (count, config) in [(true, false), (true, true), (false, false)] {
        let layer = build(count, config);
        let svc = raw_service(&layer);
        // One request holds the only permit (its handler never answers).
        let held = tokio::spawn(svc.clone().oneshot(request("/stall")));
        while layer.stats()[1].in_flight() == 0 {
            tokio::task::yield_now().await;
        }
        let mut seen = Vec::new();
        for _ in 0..10 {
            seen.push(
                svc.clone()
                    .oneshot(request("/stall"))
                    .await
                    .unwrap()
                    .status(),
            );
        }
        let (shed, limited) = (
            StatusCode::SERVICE_UNAVAILABLE,
            StatusCode::TOO_MANY_REQUESTS,
        );
        let want: Vec<StatusCode> = if count {
            // 4 left after the held request: 4 shed, then the client's own 429s.
            [vec![shed; 4], vec![limited; 6]].concat()
        } else {
            vec![shed; 10]
        };
        assert_eq!(seen, want, "count_refused {count}, from a file {config}");
        held.abort();
    }
}

/// `count_refused` where the refusing rule comes first (the check stops
/// there, and the counting rule is charged all the same) and where it comes
/// after the counting rule (nothing given back to it); a rule that does not
/// count them is not charged; a concurrency rule
/// cannot count refused requests (its permit would be held by nobody).
#[tokio::test]
async fn count_refused_charges_the_rule_in_either_order_and_only_rate_rules_take_it() {
    for counting_first in [true, false] {
        let strict =
            Rule::per_ip("strict", Policy::token_bucket(Rate::per_hour(1))).on_path_prefix("/s");
        let counting =
            Rule::per_ip("counting", Policy::token_bucket(Rate::per_hour(100))).count_refused();
        let (a, b) = if counting_first {
            (counting, strict)
        } else {
            (strict, counting)
        };
        // A rule that does not count refused requests is not charged for them.
        let plain = Rule::per_ip("plain", Policy::token_bucket(Rate::per_hour(100)));
        let layer = RateLimitLayer::builder()
            .rule(a)
            .rule(b)
            .rule(plain)
            .build()
            .unwrap();
        let svc = raw_service(&layer);
        let mut seen = Vec::new();
        for _ in 0..5 {
            let res = svc.clone().oneshot(request("/s")).await.unwrap();
            seen.push(res.status());
        }
        assert_eq!(seen[0], StatusCode::OK);
        assert!(
            seen[1..]
                .iter()
                .all(|s| *s == StatusCode::TOO_MANY_REQUESTS),
            "{seen:?}"
        );
        // The counting rule was charged for all five (a request to a path
        // only it matches reads what it has left).
        let res = svc.clone().oneshot(request("/")).await.unwrap();
        let ratelimit = res.headers()["ratelimit"].to_str().unwrap().to_owned();
        assert!(
            ratelimit.contains("\"counting\";r=94"),
            "counting first {counting_first}: {ratelimit}"
        );
        // The plain rule: the admitted request and this one.
        assert!(
            ratelimit.contains("\"plain\";r=98"),
            "counting first {counting_first}: {ratelimit}"
        );
    }
    let err = RateLimitLayer::builder()
        .rule(Rule::concurrent("c", Key::global(), 2).count_refused())
        .build()
        .unwrap_err();
    assert!(err.to_string().contains("count_refused"), "{err}");
}

/// A cost a rate rule can never admit, in a layer with concurrency rules:
/// the 413 that names the rule (not a 429), and no permit is held.
#[tokio::test]
async fn a_cost_never_admitted_beside_a_concurrency_rule_is_a_413() {
    let layer = RateLimitLayer::builder()
        .rule(Rule::concurrent("c", Key::global(), 4))
        .rule(
            Rule::global("bulk", Policy::token_bucket(Rate::per_minute(10))).cost_fn(|_, _, _| 20),
        )
        .build()
        .unwrap();
    let res = raw_service(&layer).oneshot(request("/")).await.unwrap();
    assert_eq!(res.status(), StatusCode::PAYLOAD_TOO_LARGE);
    let body = res.into_body().collect().await.unwrap().to_bytes();
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["violated-policies"], serde_json::json!(["bulk"]));
    let s = layer.stats();
    assert_eq!((s[0].in_flight(), s[1].errors()), (0, 1));
}
