//! A hostile (or failing) upstream against the client pacing layer: it
//! announces a quota of one request per 366 days, or a pause of years, to
//! stall its clients; or it answers 503 (or 429 with `Retry-After: 0`) so
//! that every retry comes back at once, 11 times the load on a failing server.
//!
//! Real axum upstreams on 127.0.0.1, hyper-util's pooled client through
//! `PacingLayer`, on tokio's paused clock (a day's wait takes no wall time,
//! and the layer's clock follows tokio's, so every wait is measured exactly).

use crate::support::http_client::serve;
use axum::extract::State;
use axum::routing::get;
use axum::Router;
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use ratewall::client::{PacingLayer, MAX_PAUSE, MAX_RETRIES};
use ratewall::client::{RETRY_BACKOFF_BASE, RETRY_BACKOFF_CAP};
use ratewall::Clock;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, UNIX_EPOCH};
use tokio::time::Instant;
use tower::ServiceExt;

type Body = Empty<Bytes>;

/// The layer's clock, following tokio's (paused) time.
#[derive(Clone, Debug)]
struct TokioClock(Instant);

impl Clock for TokioClock {
    fn now(&self) -> u64 {
        u64::try_from(self.0.elapsed().as_nanos()).unwrap()
    }
    fn is_monotonic(&self) -> bool {
        true
    }
}

/// What the upstream answers to a hit at `elapsed` since it started.
type Answer = fn(Duration) -> (StatusCode, HeaderMap);

/// An upstream: when it started, what it answers, when it was hit.
#[derive(Clone)]
struct Upstream {
    start: Instant,
    answer: Answer,
    hits: Arc<Mutex<Vec<Duration>>>,
}

async fn hit(State(up): State<Upstream>) -> (StatusCode, HeaderMap) {
    let at = up.start.elapsed();
    up.hits.lock().unwrap().push(at);
    (up.answer)(at)
}

/// Serves `answer` on a free loopback port; returns the upstream's hits,
/// its address, and what stops it.
async fn upstream(
    answer: Answer,
) -> (
    Arc<Mutex<Vec<Duration>>>,
    SocketAddr,
    impl FnOnce() -> tokio::task::JoinHandle<()>,
) {
    let up = Upstream {
        start: Instant::now(),
        answer,
        hits: Arc::default(),
    };
    let hits = Arc::clone(&up.hits);
    let app = Router::new().route("/", get(hit)).with_state(up);
    let (addr, stop, server) = serve("127.0.0.1:0", app).await;
    (hits, addr, move || {
        drop(stop);
        server
    })
}

/// One GET through `pacing`: the status, and how long the call took.
async fn call(
    pacing: &PacingLayer<String, TokioClock>,
    addr: SocketAddr,
) -> (StatusCode, Duration) {
    let client = Client::builder(TokioExecutor::new()).build_http::<Body>();
    let svc = tower::ServiceBuilder::new()
        .layer(pacing.clone())
        .service(client);
    let req = Request::builder()
        .method(Method::GET)
        .uri(format!("http://{addr}/"))
        .body(Body::new())
        .unwrap();
    let start = Instant::now();
    let res = svc
        .oneshot(req)
        .await
        .expect("the call is not refused by the layer");
    let status = res.status();
    res.into_body().collect().await.unwrap();
    (status, start.elapsed())
}

fn headers(fields: &[(&str, &str)]) -> HeaderMap {
    fields
        .iter()
        .map(|&(k, v)| {
            let name = http::HeaderName::from_bytes(k.as_bytes()).unwrap();
            (name, HeaderValue::from_str(v).unwrap())
        })
        .collect()
}

/// A Unix time in 2100, in seconds.
const YEAR_2100: u64 = 4_102_444_800;

fn date_2100() -> String {
    httpdate::fmt_http_date(UNIX_EPOCH + Duration::from_secs(YEAR_2100))
}

/// Every way one response can ask for a long wait: the pace of a quota,
/// what is left and within how long, a legacy reset as delta seconds or a
/// Unix time (seconds and milliseconds), `Retry-After` as seconds or a date.
fn long_waits() -> Vec<(&'static str, Answer)> {
    vec![
        ("quota of 1 per 366 days", |_| {
            (
                StatusCode::OK,
                headers(&[("ratelimit-policy", r#""x";q=1;w=31622400"#)]),
            )
        }),
        ("nothing left within 366 days", |_| {
            (
                StatusCode::OK,
                headers(&[("ratelimit", r#""x";r=0;t=31622400"#)]),
            )
        }),
        ("nothing left, within the quota's 366-day window", |_| {
            let h = [
                ("ratelimit-policy", r#""x";q=10;w=31622400"#),
                ("ratelimit", r#""x";r=0"#),
            ];
            (StatusCode::OK, headers(&h))
        }),
        ("legacy reset in 31 years (delta)", |_| {
            let h = [
                ("x-ratelimit-remaining", "0"),
                ("x-ratelimit-reset", "999999999"),
            ];
            (StatusCode::OK, headers(&h))
        }),
        ("legacy reset in 2100 (Unix seconds)", |_| {
            let reset = YEAR_2100.to_string();
            let h = [
                ("x-ratelimit-remaining", "0"),
                ("x-ratelimit-reset", &reset),
            ];
            (StatusCode::OK, headers(&h))
        }),
        ("legacy reset in 2100 (Unix milliseconds)", |_| {
            let reset = (YEAR_2100 * 1000).to_string();
            let h = [
                ("x-ratelimit-remaining", "0"),
                ("x-ratelimit-reset", &reset),
            ];
            (StatusCode::OK, headers(&h))
        }),
        ("429, Retry-After in 3,000 years", |_| {
            let h = [("retry-after", "99999999999")];
            (StatusCode::TOO_MANY_REQUESTS, headers(&h))
        }),
        ("503, Retry-After an HTTP date in 2100", |_| {
            let date = date_2100();
            (
                StatusCode::SERVICE_UNAVAILABLE,
                headers(&[("retry-after", &date)]),
            )
        }),
    ]
}

/// Each source of a long wait, alone: the layer believes it (the next
/// calls wait), but no call waits longer than `MAX_PAUSE`, though the
/// layer's timeout would allow a year.
#[tokio::test(start_paused = true)]
async fn no_single_response_makes_the_layer_wait_longer_than_max_pause() {
    for (what, answer) in long_waits() {
        let (hits, addr, stop) = upstream(answer).await;
        let pacing = PacingLayer::builder()
            .timeout(Duration::from_secs(400 * 86_400))
            .clock(TokioClock(Instant::now()))
            .build()
            .unwrap();
        let mut longest = Duration::ZERO;
        for _ in 0..3 {
            let (_, took) = call(&pacing, addr).await;
            longest = longest.max(took);
        }
        println!("{what}: the longest call took {longest:?}");
        assert!(longest <= MAX_PAUSE, "{what}: a call waited {longest:?}");
        // Believed, up to the cap: the upstream asked for more than a day.
        assert!(
            longest >= MAX_PAUSE - Duration::from_secs(1),
            "{what}: the longest call took only {longest:?}"
        );
        assert_eq!(hits.lock().unwrap().len(), 3, "{what}");
        stop().await.unwrap();
    }
}

/// How long the outage lasts in the first run.
const OUTAGE: Duration = Duration::from_secs(10);

/// The refusals an upstream in trouble sends: a 503 saying `Retry-After: 0`,
/// a 503 saying nothing, a 429 saying `Retry-After: 0`.
fn refusals() -> [(&'static str, Answer, Answer); 3] {
    fn outage(at: Duration, refusal: (StatusCode, HeaderMap)) -> (StatusCode, HeaderMap) {
        if at < OUTAGE {
            refusal
        } else {
            (StatusCode::OK, HeaderMap::new())
        }
    }
    [
        (
            "503, Retry-After: 0",
            |at| {
                outage(
                    at,
                    (
                        StatusCode::SERVICE_UNAVAILABLE,
                        headers(&[("retry-after", "0")]),
                    ),
                )
            },
            |_| {
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    headers(&[("retry-after", "0")]),
                )
            },
        ),
        (
            "503, no Retry-After",
            |at| outage(at, (StatusCode::SERVICE_UNAVAILABLE, HeaderMap::new())),
            |_| (StatusCode::SERVICE_UNAVAILABLE, HeaderMap::new()),
        ),
        (
            "429, Retry-After: 0",
            |at| {
                outage(
                    at,
                    (
                        StatusCode::TOO_MANY_REQUESTS,
                        headers(&[("retry-after", "0")]),
                    ),
                )
            },
            |_| {
                (
                    StatusCode::TOO_MANY_REQUESTS,
                    headers(&[("retry-after", "0")]),
                )
            },
        ),
    ]
}

/// The gaps between consecutive hits.
fn gaps(hits: &[Duration]) -> Vec<Duration> {
    hits.windows(2).map(|w| w[1] - w[0]).collect()
}

/// tokio's timer rounds a sleep up to its next millisecond.
const TICK: Duration = Duration::from_millis(1);

/// Retry `n` (from 1) waits at least `d_n = min(base * 2^(n-1), cap)`
/// and, with its jitter, at most `2 * d_n`.
fn floor(n: u32) -> Duration {
    RETRY_BACKOFF_BASE
        .saturating_mul(1 << (n - 1).min(20))
        .min(RETRY_BACKOFF_CAP)
}

/// An upstream that refuses for 10 s: one GET with the most retries sends
/// at most 4 requests in those 10 s (the old layer sent all 11 at once);
/// retry `n` comes `[d_n, 2·d_n]` after the one before, so the spacing
/// grows (never shrinks before the cap); the GET succeeds once the outage
/// is over.
#[tokio::test(start_paused = true)]
async fn retries_of_a_refusal_back_off_and_succeed_after_a_short_outage() {
    for (what, brief, _) in refusals() {
        let (hits, addr, stop) = upstream(brief).await;
        let pacing = PacingLayer::builder()
            .retries(MAX_RETRIES)
            .clock(TokioClock(Instant::now()))
            .build()
            .unwrap();
        let (status, took) = call(&pacing, addr).await;
        let hits = hits.lock().unwrap().clone();
        println!("{what}: {status} after {took:?}; hits at {hits:?}");
        let in_outage = hits.iter().filter(|&&at| at < OUTAGE).count();
        // Backoff floors 1, 2, 4, 8 s: retries at 1 s, 3 s, 7 s, 15 s at the earliest.
        assert!(in_outage <= 4, "{what}: {in_outage} hits in {OUTAGE:?}");
        assert_eq!(status, StatusCode::OK, "{what}: the retry after the outage");
        let gaps = gaps(&hits);
        for (i, &gap) in gaps.iter().enumerate() {
            let n = u32::try_from(i).unwrap() + 1;
            assert!(gap >= floor(n), "{what}: retry {n} after {gap:?}");
            assert!(
                gap <= 2 * floor(n) + TICK,
                "{what}: retry {n} after {gap:?}"
            );
        }
        assert!(gaps.len() >= 3, "{what}: {gaps:?}");
        assert!(
            gaps.windows(2).all(|w| w[0] <= w[1] + TICK),
            "{what}: {gaps:?}"
        );
        assert_eq!(pacing.retries_made(), hits.len() as u64 - 1);
        stop().await.unwrap();
    }
}

/// An upstream that never recovers: the retries run out (11 requests in
/// all, as before), but spread over at least the schedule's floors (75 s
/// for 10 retries), not sent at once; a fixed window of 30 s sees at most
/// 6 of them, and the gaps grow up to the cap and stay there.
#[tokio::test(start_paused = true)]
async fn retries_against_an_endless_outage_run_out_spread_over_minutes() {
    for (what, _, endless) in refusals() {
        let (hits, addr, stop) = upstream(endless).await;
        let pacing = PacingLayer::builder()
            .retries(MAX_RETRIES)
            .clock(TokioClock(Instant::now()))
            .build()
            .unwrap();
        let (status, took) = call(&pacing, addr).await;
        let hits = hits.lock().unwrap().clone();
        println!("{what}: {status} after {took:?}; gaps {:?}", gaps(&hits));
        assert_ne!(status, StatusCode::OK, "{what}");
        assert_eq!(hits.len() as u32, MAX_RETRIES + 1, "{what}");
        // The most hits the schedule's floors allow in the first 30 s (the
        // first request, then each retry whose floors add up to less): 6,
        // where there were 11 at once. Jitter only lengthens, so fewer is
        // likely but not certain.
        let window = Duration::from_secs(30);
        let mut at = Duration::ZERO;
        let most = 1
            + (1..=MAX_RETRIES)
                .take_while(|&n| {
                    at += floor(n);
                    at < window
                })
                .count();
        assert_eq!(most, 6);
        let early = hits.iter().filter(|&&at| at < window).count();
        assert!(
            early <= most,
            "{what}: {early} hits in the first {window:?}"
        );
        let least: Duration = (1..=MAX_RETRIES).map(floor).sum();
        assert!(took >= least, "{what}: all retries within {took:?}");
        for (i, gap) in gaps(&hits).into_iter().enumerate() {
            let n = u32::try_from(i).unwrap() + 1;
            assert!(
                gap >= floor(n) && gap <= 2 * floor(n) + TICK,
                "{what}: retry {n} after {gap:?}"
            );
        }
        stop().await.unwrap();
    }
}
