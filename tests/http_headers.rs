//! What the rate-limit headers say, for each algorithm (issue 23, "Headers
//! a client can read"): exact values along a request sequence with a
//! manual clock, and properties over random histories. docs/http.md has
//! the table these tests pin down.

mod support;

use axum::body::Body;
use axum::routing::get;
use axum::Router;
use http::{Request, StatusCode};
use ratewall::http::{Headers, RateLimitLayer, Rule};
use ratewall::{ManualClock, Policy, Rate, Window};
use std::net::SocketAddr;
use std::time::Duration;
use support::http_client::Got;
use tower::ServiceExt;

fn make(policy: Policy, headers: Headers, clock: &ManualClock) -> Router {
    let layer = RateLimitLayer::builder()
        .clock(clock.clone())
        .headers(headers)
        .rule(Rule::per_ip("p", policy))
        .build()
        .unwrap();
    Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer)
}

async fn get_(app: &Router) -> Got {
    let mut req = Request::builder().uri("/").body(Body::empty()).unwrap();
    req.extensions_mut()
        .insert(axum::extract::ConnectInfo(SocketAddr::from((
            [192, 0, 2, 1],
            40_000,
        ))));
    Got::read(app.clone().oneshot(req).await.unwrap()).await
}

/// (status, r, t, Retry-After) of one request, after checking that the
/// policy item is `q`/`w`.
async fn step(app: &Router, q: i64, w: i64) -> (u16, i64, i64, Option<u64>) {
    let got = get_(app).await;
    assert_eq!(got.policy(), vec![("p".to_owned(), q, w)]);
    let [(_, r, t)] = got.ratelimit()[..] else {
        panic!("one RateLimit item: {:?}", got.headers)
    };
    (got.status.as_u16(), r, t, got.retry_after())
}

#[tokio::test]
async fn token_bucket_advertises_its_burst_over_the_time_to_refill_it() {
    // `100/min burst 20`: 20 at once, one back every 0.6 s, all 20 in 12 s.
    let clock = ManualClock::new();
    let app = make(
        Policy::token_bucket(Rate::per_minute(100).burst(20)),
        Headers::default(),
        &clock,
    );
    // t: the time until the quota is back (0.6 s per unit used), rounded up.
    assert_eq!(step(&app, 20, 12).await, (200, 19, 1, None));
    for _ in 0..18 {
        let _ = get_(&app).await;
    }
    assert_eq!(step(&app, 20, 12).await, (200, 0, 12, None));
    // Denied: t is the wait for one unit (0.6 s), and Retry-After the same.
    assert_eq!(step(&app, 20, 12).await, (429, 0, 1, Some(1)));
    clock.advance(Duration::from_secs(6)); // 10 units back
    assert_eq!(step(&app, 20, 12).await, (200, 9, 7, None)); // 11 used: 6.6 s
}

#[tokio::test]
async fn leaky_bucket_advertises_its_burst_over_the_time_to_drain_it() {
    let clock = ManualClock::new();
    let app = make(
        Policy::leaky_bucket(Rate::per_second(1).burst(4)),
        Headers::default(),
        &clock,
    );
    assert_eq!(step(&app, 4, 4).await, (200, 3, 1, None));
    assert_eq!(step(&app, 4, 4).await, (200, 2, 2, None));
    assert_eq!(step(&app, 4, 4).await, (200, 1, 3, None));
    assert_eq!(step(&app, 4, 4).await, (200, 0, 4, None));
    assert_eq!(step(&app, 4, 4).await, (429, 0, 1, Some(1)));
    clock.advance(Duration::from_millis(2500));
    assert_eq!(step(&app, 4, 4).await, (200, 1, 3, None)); // 2.5 s of 4 drained
}

#[tokio::test]
async fn fixed_window_t_is_the_end_of_the_window() {
    let clock = ManualClock::new();
    let app = make(
        Policy::fixed_window(Window::per_minute(10)),
        Headers::default(),
        &clock,
    );
    assert_eq!(step(&app, 10, 60).await, (200, 9, 60, None));
    clock.advance(Duration::from_secs(20));
    for _ in 0..8 {
        let _ = get_(&app).await;
    }
    assert_eq!(step(&app, 10, 60).await, (200, 0, 40, None));
    assert_eq!(step(&app, 10, 60).await, (429, 0, 40, Some(40)));
    clock.advance(Duration::from_secs(40));
    assert_eq!(step(&app, 10, 60).await, (200, 9, 60, None));
}

#[tokio::test]
async fn sliding_window_counter_t_is_never_past_w_while_admitted() {
    // The report: `1000/h` answered `t=7199` beside `w=3600` (its previous
    // window weighs for one more hour). Admitted, `t` is capped at `w`.
    let clock = ManualClock::new();
    let app = make(
        Policy::sliding_window_counter(Window::per_hour(1000)),
        Headers::default(),
        &clock,
    );
    clock.advance(Duration::from_secs(1));
    assert_eq!(step(&app, 1000, 3600).await, (200, 999, 3600, None));

    let clock = ManualClock::new();
    let app = make(
        Policy::sliding_window_counter(Window::per_minute(10)),
        Headers::default(),
        &clock,
    );
    clock.advance(Duration::from_secs(1));
    for _ in 0..9 {
        let _ = get_(&app).await;
    }
    assert_eq!(step(&app, 10, 60).await, (200, 0, 60, None));
    // Denied, t is the true wait: the rest of this window (59 s) and then
    // the previous window's weight falling by one unit (6 s). It is later
    // than w, and Retry-After says the same: a retry before would fail.
    assert_eq!(step(&app, 10, 60).await, (429, 0, 65, Some(65)));
    clock.advance(Duration::from_secs(65));
    assert_eq!(step(&app, 10, 60).await, (200, 0, 60, None));
}

#[tokio::test]
async fn sliding_window_log_t_is_when_the_oldest_entry_leaves_on_a_denial() {
    let clock = ManualClock::new();
    let app = make(
        Policy::sliding_window_log(Window::per_minute(3)),
        Headers::default(),
        &clock,
    );
    assert_eq!(step(&app, 3, 60).await, (200, 2, 60, None));
    clock.advance(Duration::from_secs(10));
    assert_eq!(step(&app, 3, 60).await, (200, 1, 60, None));
    clock.advance(Duration::from_secs(10));
    assert_eq!(step(&app, 3, 60).await, (200, 0, 60, None));
    assert_eq!(step(&app, 3, 60).await, (429, 0, 40, Some(40)));
    clock.advance(Duration::from_secs(40));
    assert_eq!(step(&app, 3, 60).await, (200, 0, 60, None));
}

#[tokio::test]
async fn legacy_reset_is_the_draft_t() {
    let clock = ManualClock::new();
    let app = make(
        Policy::sliding_window_counter(Window::per_minute(10)),
        Headers::Legacy,
        &clock,
    );
    clock.advance(Duration::from_secs(1));
    let got = get_(&app).await;
    assert_eq!(got.headers["x-ratelimit-limit"], "10");
    assert_eq!(got.headers["x-ratelimit-remaining"], "9");
    assert_eq!(got.headers["x-ratelimit-reset"], "60"); // not 119
}

fn policies() -> Vec<Policy> {
    vec![
        Policy::token_bucket(Rate::per_minute(100).burst(20)),
        Policy::token_bucket(Rate::per_second(10).burst(5)),
        Policy::leaky_bucket(Rate::per_second(3).burst(4)),
        Policy::fixed_window(Window::per_second(7)),
        Policy::sliding_window_counter(Window::per_minute(10)),
        Policy::sliding_window_counter(Window::per_second(3)),
        Policy::sliding_window_log(Window::per_second(5)),
    ]
}

/// For every algorithm and random histories: an admitted response's `t`
/// is at most `w`; a 429's `Retry-After` is at least its `t` (at least 1),
/// and a retry at `Retry-After` passes; the legacy reset is the draft `t`.
#[tokio::test]
async fn t_is_within_w_and_retry_after_is_never_before_t() {
    let mut x = 0x2545_f491_4f6c_dd1d_u64;
    let mut next = move |n: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % n
    };
    for policy in policies() {
        for round in 0..4 {
            let clock = ManualClock::new();
            let draft = make(policy, Headers::default(), &clock);
            let legacy = make(policy, Headers::Legacy, &clock);
            let q = i64::try_from(policy.limit()).unwrap();
            for i in 0..150 {
                let ctx = format!("{policy:?} round {round} step {i}");
                // Mostly short gaps (bursts), sometimes long ones.
                let gap = if next(10) == 0 {
                    next(90_000)
                } else {
                    next(700)
                };
                clock.advance(Duration::from_millis(gap));
                let got = get_(&draft).await;
                let [(_, pq, w)] = got.policy()[..] else {
                    panic!("{ctx}")
                };
                assert_eq!(pq, q, "{ctx}");
                let [(_, r, t)] = got.ratelimit()[..] else {
                    panic!("{ctx}")
                };
                assert!((0..=q).contains(&r), "{ctx}: r={r}");
                assert!(t >= 1 || got.status == StatusCode::OK, "{ctx}");
                if got.status == StatusCode::OK {
                    assert!(t <= w, "{ctx}: t={t} w={w}");
                } else {
                    assert_eq!(got.status, StatusCode::TOO_MANY_REQUESTS, "{ctx}");
                    assert_eq!(r, 0, "{ctx}");
                    let retry = got.retry_after().unwrap();
                    assert!(retry >= u64::try_from(t).unwrap(), "{ctx}: {retry} < {t}");
                    assert!(t >= 1, "{ctx}");
                    if next(3) == 0 {
                        clock.advance(Duration::from_secs(retry));
                        assert_eq!(get_(&draft).await.status, StatusCode::OK, "{ctx}");
                    }
                }
                // The legacy layer sees another key space: compare it with
                // its own draft twin only through the invariant.
                let old = get_(&legacy).await;
                let reset: u64 = old.headers["x-ratelimit-reset"]
                    .to_str()
                    .unwrap()
                    .parse()
                    .unwrap();
                if old.status == StatusCode::OK {
                    assert!(reset <= u64::try_from(w).unwrap(), "{ctx}: reset={reset}");
                } else {
                    assert!(old.retry_after().unwrap() >= reset, "{ctx}");
                }
            }
        }
    }
}

/// The promise `q` and `w` make: a client that sends at most `q` in any
/// `w` seconds (read from the headers) is never denied, by every algorithm
/// but the sliding-window counter (an estimate). A bucket's `q=100;w=60`
/// reading (its rate) would break it at once: that is why `q` is the burst.
#[tokio::test]
async fn a_client_keeping_to_q_per_w_is_never_denied() {
    let mut x = 0x9e37_79b9_7f4a_7c15_u64;
    let mut next = move |n: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % n
    };
    let exact = [
        Policy::token_bucket(Rate::per_minute(100).burst(20)),
        Policy::token_bucket(Rate::per_second(10).burst(5)),
        Policy::token_bucket(Rate::per_second(3)),
        Policy::leaky_bucket(Rate::per_second(3).burst(4)),
        Policy::fixed_window(Window::per_second(7)),
        Policy::sliding_window_log(Window::per_second(5)),
    ];
    for policy in exact {
        for round in 0..3 {
            let clock = ManualClock::new();
            let app = make(policy, Headers::default(), &clock);
            let first = get_(&app).await;
            let [(_, q, w)] = first.policy()[..] else {
                panic!()
            };
            let (q, w_ms) = (
                usize::try_from(q).unwrap(),
                u64::try_from(w).unwrap() * 1000,
            );
            let mut now = 0u64;
            let mut sent = std::collections::VecDeque::from([0u64]);
            for i in 0..400 {
                // Bursts (no gap) and pauses up to three quarters of w.
                let gap = next(4) * next(w_ms / 4 + 1);
                now += gap;
                clock.advance(Duration::from_millis(gap));
                // At most q in any closed window of w: drop what left it.
                while sent.front().is_some_and(|&s| s + w_ms < now) {
                    sent.pop_front();
                }
                if sent.len() < q {
                    let got = get_(&app).await;
                    assert_eq!(
                        got.status,
                        StatusCode::OK,
                        "{policy:?} round {round} step {i} at {now} ms, sent {sent:?}"
                    );
                    sent.push_back(now);
                }
            }
        }
    }
}
