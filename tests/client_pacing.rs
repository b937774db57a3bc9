//! The client pacing layer end to end: real axum servers on 127.0.0.1 and
//! a real hyper-util client (the legacy pooled client) through
//! `ratewall::client::PacingLayer`.
//!
//! The main run is the issue's: a server limiting each client to 10/s
//! (burst 10), 20 client tasks finishing 200 requests between them (19 s
//! ideal), with and without the layer.

mod support;

use axum::extract::State;
use axum::routing::get;
use axum::Router;
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use ratewall::client::{PacingError, PacingLayer};
use ratewall::http::{RateLimitLayer, Rule};
use ratewall::{Policy, Rate};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};
use support::http_client::serve;
use tower::{Service, ServiceExt};

type Body = Empty<Bytes>;

fn client() -> Client<hyper_util::client::legacy::connect::HttpConnector, Body> {
    Client::builder(TokioExecutor::new()).build_http::<Body>()
}

fn request(method: Method, addr: SocketAddr, path: &str) -> Request<Body> {
    Request::builder()
        .method(method)
        .uri(format!("http://{addr}{path}"))
        .body(Body::new())
        .unwrap()
}

/// Sends one request and reads the whole body (so the connection is reused).
async fn send<S>(svc: &S, req: Request<Body>) -> Result<StatusCode, S::Error>
where
    S: Service<Request<Body>, Response = Response<Incoming>> + Clone,
{
    let res = svc.clone().oneshot(req).await?;
    let status = res.status();
    res.into_body().collect().await.unwrap();
    Ok(status)
}

const RATE: u64 = 10;
const REQUESTS: u64 = 200;
const TASKS: u64 = 20;

/// A server with ratewall's own layer: 10 per second per client, burst 10.
fn limited_app() -> Router {
    let layer = RateLimitLayer::builder()
        .rule(Rule::per_ip(
            "ip",
            Policy::token_bucket(Rate::per_second(RATE).burst(RATE)),
        ))
        .build()
        .unwrap();
    Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer)
}

/// 20 tasks finish 200 successful GETs between them; a task whose request
/// gets a 429 sends it again 10 ms later. Returns the time and the 429s.
async fn burst<S>(svc: S, addr: SocketAddr) -> (Duration, u64)
where
    S: Service<Request<Body>, Response = Response<Incoming>> + Clone + Send + Sync + 'static,
    S::Future: Send,
    S::Error: std::fmt::Debug,
{
    let claimed = Arc::new(AtomicU64::new(0));
    let refused = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let tasks: Vec<_> = (0..TASKS)
        .map(|_| {
            let (svc, claimed, refused) = (svc.clone(), claimed.clone(), refused.clone());
            tokio::spawn(async move {
                while claimed.fetch_add(1, Ordering::Relaxed) < REQUESTS {
                    loop {
                        match send(&svc, request(Method::GET, addr, "/")).await.unwrap() {
                            StatusCode::OK => break,
                            StatusCode::TOO_MANY_REQUESTS => {
                                refused.fetch_add(1, Ordering::Relaxed);
                                tokio::time::sleep(Duration::from_millis(10)).await;
                            }
                            other => panic!("unexpected status {other}"),
                        }
                    }
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    (start.elapsed(), refused.load(Ordering::Relaxed))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paced_tasks_get_at_most_one_429_and_finish_near_the_ideal_time_unpaced_get_many() {
    // The ideal: the first 10 at once (the server's burst), then 10/s.
    let ideal = Duration::from_secs_f64((REQUESTS - RATE) as f64 / RATE as f64);

    let (addr, stop, server) = serve("127.0.0.1:0", limited_app()).await;
    // The client keeps the server's rate with a burst of 5: the 5 tokens of
    // slack absorb loopback latency that varies (a request sent on time but
    // overtaken by the next one).
    let pacing = PacingLayer::builder()
        .rate(Rate::per_second(RATE).burst(RATE - 5))
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let paced = tower::ServiceBuilder::new()
        .layer(pacing.clone())
        .service(client());
    let (took, refused) = burst(paced, addr).await;
    let view = pacing.view(&addr.to_string()).unwrap();
    println!(
        "with the layer: {REQUESTS} requests in {took:?} (ideal {ideal:?}), {refused} 429s; {view}"
    );
    drop(stop);
    server.await.unwrap();

    let (addr, stop, server) = serve("127.0.0.1:0", limited_app()).await;
    let (bare_took, bare_refused) = burst(client(), addr).await;
    println!("without the layer: {REQUESTS} requests in {bare_took:?}, {bare_refused} 429s");
    drop(stop);
    server.await.unwrap();

    assert!(refused <= 1, "{refused} 429s through the layer");
    assert_eq!(pacing.too_many_requests(), refused);
    assert!(pacing.waits() > 100, "{} waits", pacing.waits());
    assert_eq!(view.quota.map(|q| q.limit), Some(RATE), "{view}");
    assert!(
        took >= ideal.mul_f64(0.9) && took <= ideal.mul_f64(1.1),
        "{took:?} against the ideal {ideal:?}"
    );
    assert!(bare_refused >= 100, "{bare_refused} 429s without the layer");
}

/// Answers every other request (the first, the third, ...) with a 429 whose
/// `Retry-After` is an HTTP date 2 s ahead.
async fn every_other(State(hits): State<Arc<AtomicU64>>) -> (StatusCode, HeaderMap) {
    let mut headers = HeaderMap::new();
    if hits.fetch_add(1, Ordering::SeqCst) % 2 == 1 {
        return (StatusCode::OK, headers);
    }
    let date = httpdate::fmt_http_date(SystemTime::now() + Duration::from_secs(2));
    headers.insert("retry-after", HeaderValue::from_str(&date).unwrap());
    (StatusCode::TOO_MANY_REQUESTS, headers)
}

#[tokio::test]
async fn retry_after_as_an_http_date_pauses_retries_only_idempotent_and_times_out_at_once() {
    let hits = Arc::new(AtomicU64::new(0));
    let app = Router::new()
        .route("/", get(every_other).post(every_other))
        .with_state(hits.clone());
    let (addr, stop, server) = serve("127.0.0.1:0", app).await;
    let pacing = PacingLayer::builder()
        .retries(1)
        .timeout(Duration::from_millis(500))
        .build()
        .unwrap();
    let paced = tower::ServiceBuilder::new()
        .layer(pacing.clone())
        .service(client());

    // A GET: 429 until an HTTP date (1 to 2 s away, the date has whole
    // seconds), then retried once the pause is over: a 200. The pause is
    // longer than the 500 ms timeout, but the retry's wait is its own.
    let long = PacingLayer::builder().retries(1).build().unwrap();
    let retrying = tower::ServiceBuilder::new()
        .layer(long.clone())
        .service(client());
    let start = Instant::now();
    let status = send(&retrying, request(Method::GET, addr, "/"))
        .await
        .unwrap();
    let took = start.elapsed();
    assert_eq!(status, StatusCode::OK);
    assert!(took >= Duration::from_secs(1), "retried after {took:?}");
    assert!(took < Duration::from_secs(3), "retried after {took:?}");
    assert_eq!(
        (hits.load(Ordering::SeqCst), long.too_many_requests()),
        (2, 1)
    );
    // One retry; it waited for the pause unless its backoff (1 to 2 s,
    // random) outlasted the pause already.
    assert_eq!(long.retries_made(), 1);
    assert!(long.waits() <= 1, "{} waits", long.waits());

    // A POST is never retried: its 429 comes back to the caller.
    let status = send(&paced, request(Method::POST, addr, "/"))
        .await
        .unwrap();
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(hits.load(Ordering::SeqCst), 3);
    assert_eq!(pacing.retries_made(), 0);
    let paused = pacing.view(&addr.to_string()).unwrap().paused_for.unwrap();
    assert!(paused > Duration::from_secs(1) && paused <= Duration::from_secs(2));

    // Paused for longer than the timeout: the next call fails at once,
    // sends nothing, and says how long the pause is.
    let start = Instant::now();
    match send(&paced, request(Method::GET, addr, "/")).await {
        Err(PacingError::Deadline {
            paused_for: Some(p),
            last: Some(d),
        }) => {
            assert!(p > Duration::from_millis(500), "{p:?}");
            assert!(d.retry_after() > Duration::from_millis(500));
        }
        other => panic!("expected a deadline error, got {other:?}"),
    }
    assert!(start.elapsed() < Duration::from_millis(100));
    assert_eq!(hits.load(Ordering::SeqCst), 3);
    drop(stop);
    server.await.unwrap();
}

/// Announces 100 per second for the first 10 responses, then 20 per second.
async fn shrinking(State(hits): State<Arc<AtomicU64>>) -> HeaderMap {
    let n = hits.fetch_add(1, Ordering::SeqCst);
    let q = if n < 10 { 100 } else { 20 };
    let mut headers = HeaderMap::new();
    let policy = format!(r#""p";q={q};w=1"#);
    headers.insert("ratelimit-policy", HeaderValue::from_str(&policy).unwrap());
    headers.insert("ratelimit", HeaderValue::from_static(r#""p";r=5;t=1"#));
    headers
}

#[tokio::test]
async fn an_announced_quota_that_shrinks_mid_run_slows_the_pace() {
    let hits = Arc::new(AtomicU64::new(0));
    let app = Router::new()
        .route("/", get(shrinking))
        .with_state(hits.clone());
    let (addr, stop, server) = serve("127.0.0.1:0", app).await;
    // No pace of its own, and a generous one: only the announcements pace it.
    for user in [None, Some(Rate::per_second(1000))] {
        hits.store(0, Ordering::SeqCst);
        let mut builder = PacingLayer::builder();
        if let Some(rate) = user {
            builder = builder.rate(rate);
        }
        let pacing = builder.build().unwrap();
        let paced = tower::ServiceBuilder::new()
            .layer(pacing.clone())
            .service(client());
        let mut took = Vec::new();
        for _ in 0..2 {
            let start = Instant::now();
            for _ in 0..10 {
                let status = send(&paced, request(Method::GET, addr, "/")).await.unwrap();
                assert_eq!(status, StatusCode::OK);
            }
            took.push(start.elapsed());
        }
        let view = pacing.view(&addr.to_string()).unwrap();
        println!(
            "{user:?}: 10 at q=100 in {:?}, 10 at q=20 in {:?}; {view}",
            took[0], took[1]
        );
        // At 100/s: 9 or 10 gaps of 10 ms; at 20/s: at least 9 gaps of 50 ms.
        assert!(took[0] < Duration::from_millis(400), "{:?}", took[0]);
        assert!(took[1] >= Duration::from_millis(440), "{:?}", took[1]);
        assert_eq!(view.quota.map(|q| q.limit), Some(20));
        assert_eq!(view.too_many_requests, 0);
    }
    drop(stop);
    server.await.unwrap();
}

/// Answers 200 with every rate-limit field malformed or absurd.
async fn garbage() -> HeaderMap {
    let mut headers = HeaderMap::new();
    for (name, value) in [
        ("ratelimit-policy", ";;q=-1;w=abc"),
        ("ratelimit", r#""p";r=;t=x, ((("#),
        ("x-ratelimit-limit", "-5"),
        ("x-ratelimit-remaining", "lots"),
        ("x-ratelimit-reset", "99999999999999999999999"),
        ("retry-after", "soon"),
    ] {
        headers.insert(name, HeaderValue::from_static(value));
    }
    headers
}

#[tokio::test]
async fn garbage_headers_are_ignored() {
    let app = Router::new().route("/", get(garbage));
    let (addr, stop, server) = serve("127.0.0.1:0", app).await;
    let pacing = PacingLayer::builder()
        .rate(Rate::per_second(100).burst(10))
        .build()
        .unwrap();
    let paced = tower::ServiceBuilder::new()
        .layer(pacing.clone())
        .service(client());
    let start = Instant::now();
    for _ in 0..30 {
        let status = send(&paced, request(Method::GET, addr, "/")).await.unwrap();
        assert_eq!(status, StatusCode::OK);
    }
    let took = start.elapsed();
    let view = pacing.view(&addr.to_string()).unwrap();
    println!("30 requests in {took:?}; {view}");
    // The user's pace alone: 10 at once, then 20 at 100/s (0.2 s).
    assert!(took >= Duration::from_millis(190), "{took:?}");
    assert!(took < Duration::from_millis(1500), "{took:?}");
    assert_eq!(
        (view.quota, view.remaining, view.paused_for),
        (None, None, None)
    );
    assert_eq!(view.waits, pacing.waits());
    drop(stop);
    server.await.unwrap();
}
