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
    assert_eq!(pacing.refusals().too_many_requests, refused);
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
        (
            hits.load(Ordering::SeqCst),
            long.refusals().too_many_requests
        ),
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
        // At 100/s: at most 10 gaps of 10 ms. At 20/s: every response says
        // 5 left, so the bucket holds at most 4 (less one), but the change
        // of pace rescales what it held at 100/s (under one unit) to 20/s:
        // the first request at once, then at least 8 full gaps of 50 ms.
        assert!(took[0] < Duration::from_millis(400), "{:?}", took[0]);
        assert!(took[1] >= Duration::from_millis(400), "{:?}", took[1]);
        assert_eq!(view.quota.map(|q| q.limit), Some(20));
        assert_eq!(view.refusals.total(), 0);
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

// ---------------------------------------------------------------------
// The upstream's burst (issue 32, item 5): a pace learned from an
// upstream spends the upstream's burst, keeps up with a client that
// honours `Retry-After` by hand, and paces a wave once the limits are known.
// ---------------------------------------------------------------------

/// An upstream with ratewall's own layer: `rate` per second per client,
/// burst `burst`. It announces `q=<burst>;w=<burst/rate>` and what is left
/// on every response, and answers 429 with `Retry-After` (whole seconds).
fn bucket_app(rate: u64, burst: u64) -> Router {
    let layer = RateLimitLayer::builder()
        .rule(Rule::per_ip(
            "ip",
            Policy::token_bucket(Rate::per_second(rate).burst(burst)),
        ))
        .build()
        .unwrap();
    Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer)
}

/// Sends one request and reads the whole body; the status and the
/// `Retry-After` seconds, if any.
async fn send_reading_retry_after<S>(svc: &S, addr: SocketAddr) -> (StatusCode, Option<u64>)
where
    S: Service<Request<Body>, Response = Response<Incoming>> + Clone,
    S::Error: std::fmt::Debug,
{
    let res = svc
        .clone()
        .oneshot(request(Method::GET, addr, "/"))
        .await
        .unwrap();
    let status = res.status();
    let retry_after = res
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok());
    res.into_body().collect().await.unwrap();
    (status, retry_after)
}

/// The clients of the 300-call run.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Caller {
    /// No layer: on a 429, sleep `Retry-After` (1 s if absent), send again.
    ByHand,
    /// Through a pacing layer with no pace of its own (only what the
    /// upstream announces); on a 429, send again (the layer waits out the
    /// pause the 429 asked for).
    Paced,
    /// The same, with the upstream's rate given: 50/s, burst 100.
    PacedAtUserRate,
}

const RUN_CALLS: u64 = 300;
const RUN_WORKERS: u64 = 20;
const RUN_RATE: u64 = 50;
const RUN_BURST: u64 = 100;

/// One 300-call run against a fresh `50/s burst 100` upstream: 20
/// workers finish 300 successful GETs between them. Returns the time and
/// the 429s the workers saw.
async fn three_hundred_calls(caller: Caller) -> (Duration, u64) {
    let (addr, stop, server) = serve("127.0.0.1:0", bucket_app(RUN_RATE, RUN_BURST)).await;
    let claimed = Arc::new(AtomicU64::new(0));
    let refused = Arc::new(AtomicU64::new(0));
    let pacing = match caller {
        Caller::ByHand => None,
        Caller::Paced => Some(PacingLayer::builder().build().unwrap()),
        Caller::PacedAtUserRate => Some(
            PacingLayer::builder()
                .rate(Rate::per_second(RUN_RATE).burst(RUN_BURST))
                .build()
                .unwrap(),
        ),
    };
    let start = Instant::now();
    let workers: Vec<_> = (0..RUN_WORKERS)
        .map(|_| {
            let (claimed, refused, pacing) = (claimed.clone(), refused.clone(), pacing.clone());
            let bare = client();
            tokio::spawn(async move {
                let paced = pacing.map(|p| tower::ServiceBuilder::new().layer(p).service(client()));
                while claimed.fetch_add(1, Ordering::Relaxed) < RUN_CALLS {
                    // Bounded: a call that is refused 50 times is a failure.
                    for attempt in 0.. {
                        assert!(attempt < 50, "{caller:?}: refused 50 times");
                        let (status, retry_after) = match &paced {
                            Some(paced) => send_reading_retry_after(paced, addr).await,
                            None => send_reading_retry_after(&bare, addr).await,
                        };
                        match status {
                            StatusCode::OK => break,
                            StatusCode::TOO_MANY_REQUESTS => {
                                refused.fetch_add(1, Ordering::Relaxed);
                                if paced.is_none() {
                                    let secs = retry_after.unwrap_or(1);
                                    tokio::time::sleep(Duration::from_secs(secs)).await;
                                }
                            }
                            other => panic!("unexpected status {other}"),
                        }
                    }
                }
            })
        })
        .collect();
    for w in workers {
        w.await.unwrap();
    }
    let took = start.elapsed();
    drop(stop);
    server.await.unwrap();
    (took, refused.load(Ordering::Relaxed))
}

/// The median and the spread (min, max) of some runs' times.
fn median_and_spread(runs: &[(Duration, u64)]) -> (Duration, Duration, Duration) {
    let mut times: Vec<Duration> = runs.iter().map(|r| r.0).collect();
    times.sort();
    (times[times.len() / 2], times[0], times[times.len() - 1])
}

/// Runs `callers` alternately, `rounds` times; prints and returns each
/// caller's runs.
async fn alternate(callers: &[Caller], rounds: usize) -> Vec<Vec<(Duration, u64)>> {
    let mut runs = vec![Vec::new(); callers.len()];
    for round in 0..rounds {
        for (i, &caller) in callers.iter().enumerate() {
            let run = three_hundred_calls(caller).await;
            println!("round {round}: {caller:?}: {:?}, {} x 429", run.0, run.1);
            runs[i].push(run);
        }
    }
    for (caller, runs) in callers.iter().zip(&runs) {
        let (median, min, max) = median_and_spread(runs);
        let refused: Vec<u64> = runs.iter().map(|r| r.1).collect();
        println!(
            "{caller:?}: median {median:?} (spread {min:?} to {max:?}), 429s per run {refused:?}"
        );
    }
    runs
}

/// The finding: 300 calls to a `50/s burst 100` upstream took 6.04 s
/// paced (the learned pace had burst 1: one call every 20 ms from the
/// start) against 4.16 s by hand. Always run, loose: the paced client
/// takes less than 1.2x the hand-written one's median (the old pace:
/// 1.45x) and is refused at most once a run (by hand: dozens).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paced_300_calls_keep_up_with_a_client_honouring_retry_after_by_hand() {
    let runs = alternate(&[Caller::ByHand, Caller::Paced], 3).await;
    let (by_hand, _, _) = median_and_spread(&runs[0]);
    let (paced, _, _) = median_and_spread(&runs[1]);
    assert!(
        paced < by_hand.mul_f64(1.2),
        "paced {paced:?} against {by_hand:?} by hand"
    );
    for (took, refused) in &runs[1] {
        assert!(*refused <= 1, "{refused} x 429 paced in {took:?}");
    }
    assert!(runs[0].iter().all(|r| r.1 >= 10), "by hand: {:?}", runs[0]);
}

/// The strict figure, in release (`.ci/run`): over 5 rounds run
/// alternately, the paced client's median is within 5% of the
/// hand-written one's, or faster; with the user's rate given too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "about a minute; run in release by .ci/run"]
async fn stress_paced_300_calls_within_five_percent_of_by_hand() {
    let callers = [Caller::ByHand, Caller::Paced, Caller::PacedAtUserRate];
    let runs = alternate(&callers, 5).await;
    let (by_hand, _, _) = median_and_spread(&runs[0]);
    for (caller, runs) in callers.iter().zip(&runs).skip(1) {
        let (median, _, _) = median_and_spread(runs);
        assert!(
            median <= by_hand.mul_f64(1.05),
            "{caller:?}: median {median:?} against {by_hand:?} by hand"
        );
    }
}

/// 16 concurrent tasks, one GET each, through `svc`; the 429s they got.
async fn wave_of_16<S>(svc: &S, addr: SocketAddr) -> u64
where
    S: Service<Request<Body>, Response = Response<Incoming>> + Clone + Send + Sync + 'static,
    S::Future: Send,
    S::Error: std::fmt::Debug,
{
    let tasks: Vec<_> = (0..16)
        .map(|_| {
            let svc = svc.clone();
            tokio::spawn(async move { send(&svc, request(Method::GET, addr, "/")).await.unwrap() })
        })
        .collect();
    let mut refused = 0;
    for t in tasks {
        match t.await.unwrap() {
            StatusCode::OK => {}
            StatusCode::TOO_MANY_REQUESTS => refused += 1,
            other => panic!("unexpected status {other}"),
        }
    }
    refused
}

/// Answers the first request at once, every later one after 200 ms.
async fn held_after_the_first(State(hits): State<Arc<AtomicU64>>) -> &'static str {
    if hits.fetch_add(1, Ordering::SeqCst) > 0 {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    "ok"
}

/// `app`, each request held `delay` before the rate limit sees it.
fn delayed(app: Router, delay: Duration) -> Router {
    app.layer(axum::middleware::from_fn(
        move |req: axum::extract::Request, next: axum::middleware::Next| async move {
            tokio::time::sleep(delay).await;
            next.run(req).await
        },
    ))
}

/// The finding: without a user rate, 16 tasks against a burst of 10 got 6
/// x 429. With nothing known yet, the first wave still passes unpaced (as
/// documented: no rate set, no response read yet); once one response has
/// announced the limits, a wave of 16 is paced from its start: the
/// upstream's burst at once (what it says is left, less one), the rest at
/// its rate, and no 429.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wave_after_the_limits_are_known_is_paced_from_the_start() {
    // Nothing known: the first wave is not paced. The upstream holds each
    // request 200 ms, so the whole wave is sent before any answer could
    // teach the layer anything.
    let app = delayed(bucket_app(10, 10), Duration::from_millis(200));
    let (addr, stop, server) = serve("127.0.0.1:0", app).await;
    let pacing = PacingLayer::builder().build().unwrap();
    let paced = tower::ServiceBuilder::new()
        .layer(pacing.clone())
        .service(client());
    let first_wave = wave_of_16(&paced, addr).await;
    println!("first wave, nothing known: {first_wave} x 429");
    assert!((1..=6).contains(&first_wave), "{first_wave} x 429 unpaced");
    drop(stop);
    server.await.unwrap();

    // One response announces the limits; then the wave. The upstream
    // answers the first request at once and holds every later admitted
    // one 200 ms (its 429s come back at once): the whole wave is sent
    // before any of its answers could lower the pace, and the upstream
    // has not refilled since the first answer.
    let hits = Arc::new(AtomicU64::new(0));
    let held = Router::new()
        .route("/", get(held_after_the_first))
        .with_state(hits)
        .layer(
            RateLimitLayer::builder()
                .rule(Rule::per_ip(
                    "ip",
                    Policy::token_bucket(Rate::per_second(10)),
                ))
                .build()
                .unwrap(),
        );
    let (addr, stop, server) = serve("127.0.0.1:0", held).await;
    let pacing = PacingLayer::builder().build().unwrap();
    let paced = tower::ServiceBuilder::new()
        .layer(pacing.clone())
        .service(client());
    let status = send(&paced, request(Method::GET, addr, "/")).await.unwrap();
    assert_eq!(status, StatusCode::OK);
    let start = Instant::now();
    let refused = wave_of_16(&paced, addr).await;
    let took = start.elapsed();
    let view = pacing.view(&addr.to_string()).unwrap();
    println!("wave after one response: {refused} x 429 in {took:?}; {view}");
    assert_eq!(refused, 0, "{view}");
    // 8 at once (9 left, less one), then 8 at 10/s, each answered 200 ms
    // later: about 1 s; the old burst-1 pace took 1.7 s (one every 100 ms).
    assert!(took >= Duration::from_millis(700), "{took:?}");
    assert!(took < Duration::from_millis(1_400), "{took:?}");
    drop(stop);
    server.await.unwrap();
}

/// Answers 503 (`Retry-After: 0`) to the first `OUTAGE` requests, then 200.
async fn outage(State(hits): State<Arc<AtomicU64>>) -> (StatusCode, HeaderMap) {
    let mut headers = HeaderMap::new();
    if hits.fetch_add(1, Ordering::SeqCst) < OUTAGE {
        headers.insert("retry-after", HeaderValue::from_static("0"));
        return (StatusCode::SERVICE_UNAVAILABLE, headers);
    }
    (StatusCode::OK, headers)
}

const OUTAGE: u64 = 6;

/// The finding: a 503 outage showed "0 429s" with 12 retries: the
/// counters counted 429s only. Every refusal the layer acts on is now
/// counted by status, in the layer's totals and the partition's view,
/// and so are the retries.
#[tokio::test]
async fn a_503_outage_shows_in_the_counters_with_its_retries() {
    let hits = Arc::new(AtomicU64::new(0));
    let app = Router::new()
        .route("/", get(outage))
        .with_state(hits.clone());
    let (addr, stop, server) = serve("127.0.0.1:0", app).await;
    let pacing = PacingLayer::builder().retries(3).build().unwrap();
    let paced = tower::ServiceBuilder::new()
        .layer(pacing.clone())
        .service(client());
    // 4 GETs at once: 4 x 503, retried after 1-2 s: 2 more 503s, retried
    // after 2-4 s: then every one is a 200.
    let tasks: Vec<_> = (0..4)
        .map(|_| {
            let paced = paced.clone();
            tokio::spawn(
                async move { send(&paced, request(Method::GET, addr, "/")).await.unwrap() },
            )
        })
        .collect();
    for t in tasks {
        assert_eq!(t.await.unwrap(), StatusCode::OK);
    }
    let view = pacing.view(&addr.to_string()).unwrap();
    println!(
        "{}; layer: {}, {} retries",
        view,
        pacing.refusals(),
        pacing.retries_made()
    );
    assert_eq!(hits.load(Ordering::SeqCst), OUTAGE + 4);
    let refused = pacing.refusals();
    assert_eq!(
        (
            refused.unavailable,
            refused.too_many_requests,
            refused.total()
        ),
        (OUTAGE, 0, OUTAGE)
    );
    assert_eq!(pacing.retries_made(), OUTAGE);
    assert_eq!((view.refusals, view.retries), (refused, OUTAGE));
    assert!(
        view.to_string()
            .ends_with("6 refused (429: 0, 503: 6), 6 retries"),
        "{view}"
    );
    drop(stop);
    server.await.unwrap();
}
