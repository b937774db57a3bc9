//! Lockouts after a breach (issue 23): once a rule denies a key, the key is
//! denied for `block_for` whatever its limit says, takes nothing from any
//! rule meanwhile, and its 429s tell the block's end; in process with a
//! `ManualClock` (with a property test against a model) and end to end
//! with a real server and a real HTTP/1.1 client on loopback.

mod support;

use axum::routing::get;
use axum::Router;
use http::StatusCode;
use proptest::prelude::*;
use ratewall::http::{HttpConfigError, Mode, RateLimitLayer, Rule};
use ratewall::{ManualClock, Policy, Rate, Window};
use std::time::Duration;
use support::http_client::{call, check_fields, fetch, serve, Got};

const BLOCK: Duration = Duration::from_secs(15 * 60);

fn app(layer: RateLimitLayer<ManualClock>) -> Router {
    Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer)
}

async fn send(app: &Router, [a, b, c, d]: [u8; 4]) -> Got {
    call(app, "GET", "/", &format!("{a}.{b}.{c}.{d}"), &[]).await
}

fn login() -> Rule {
    Rule::per_ip("login", Policy::fixed_window(Window::per_minute(3))).block_for(BLOCK)
}

/// A day-long window: what it has left says how much the blocked
/// requests took from it (nothing).
fn all() -> Rule {
    Rule::global(
        "all",
        Policy::fixed_window(Window::new(1000, Duration::from_secs(86_400))),
    )
}

#[tokio::test]
async fn a_breach_locks_the_key_out_for_its_time_and_the_429s_tell_the_block_end() {
    let clock = ManualClock::new();
    let layer = RateLimitLayer::builder()
        .clock(clock.clone())
        .rule(login())
        .rule(all())
        .build()
        .unwrap();
    let app = app(layer.clone());
    let ip = [192, 0, 2, 7];
    for _ in 0..3 {
        assert_eq!(send(&app, ip).await.status, StatusCode::OK);
    }
    let breach = send(&app, ip).await;
    assert_eq!(breach.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(breach.retry_after(), Some(900));
    assert_eq!(breach.ratelimit(), vec![("login".to_owned(), 0, 900)]);
    // A minute later the window has room again; the block holds.
    clock.advance(Duration::from_secs(61));
    for _ in 0..5 {
        let blocked = send(&app, ip).await;
        assert_eq!(blocked.status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(blocked.retry_after(), Some(839));
        assert_eq!(blocked.ratelimit(), vec![("login".to_owned(), 0, 839)]);
    }
    // Another client is not blocked.
    let other = send(&app, [192, 0, 2, 8]).await;
    assert_eq!(other.status, StatusCode::OK);
    assert_eq!(other.remaining("all"), Some(1000 - 4));
    // One nanosecond before the end: still blocked; at the end: free.
    clock.advance(BLOCK - Duration::from_secs(61) - Duration::from_nanos(1));
    let last = send(&app, ip).await;
    assert_eq!(
        (last.status, last.retry_after()),
        (StatusCode::TOO_MANY_REQUESTS, Some(1))
    );
    clock.advance(Duration::from_nanos(1));
    let free = send(&app, ip).await;
    assert_eq!(free.status, StatusCode::OK);
    // The breach and the six blocked requests took nothing from "all".
    assert_eq!(free.remaining("all"), Some(1000 - 5));
    let s = &layer.stats()[0];
    assert_eq!((s.allowed(), s.denied()), (5, 7));
    // The top offenders count every refusal, the breach and the six
    // refused during the block (issue 30: they counted the breach only).
    assert_eq!(s.offender_denials(), 7);
    let top = s.top_offenders();
    assert_eq!(top.len(), 1);
    assert_eq!((top[0].key(), top[0].count()), ("192.0.2.7", 7));
}

#[tokio::test]
async fn a_shadow_rule_never_locks_out() {
    let clock = ManualClock::new();
    let layer = RateLimitLayer::builder()
        .clock(clock.clone())
        .rule(login().mode(Mode::Shadow))
        .build()
        .unwrap();
    let app = app(layer.clone());
    for _ in 0..6 {
        assert_eq!(send(&app, [192, 0, 2, 7]).await.status, StatusCode::OK);
    }
    assert_eq!(layer.stats()[0].shadow_denied(), 3);
}

#[test]
fn bad_blocks_are_typed_errors() {
    for block in [Duration::ZERO, Duration::from_secs(u64::MAX)] {
        let err = RateLimitLayer::builder()
            .rule(Rule::per_ip("login", Policy::token_bucket(Rate::per_minute(5))).block_for(block))
            .build()
            .map(|_| ())
            .unwrap_err();
        assert!(
            matches!(&err, HttpConfigError::InvalidValue { rule: Some(r), field: "block_for", .. } if r == "login"),
            "{err:?}"
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// No admission for a key during [deny, deny + block): every 429 of a
    /// key starts or reports a block, and no 200 of that key falls inside
    /// one; outside the blocks, the rule alone decides (a token bucket of
    /// 2 per second, burst 2, checked against a model).
    #[test]
    fn no_admission_for_a_key_during_its_block(
        steps in prop::collection::vec((0u64..700, 0u8..3), 1..80),
    ) {
        let block_ms = 1_500;
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        rt.block_on(async {
            let clock = ManualClock::new();
            let layer = RateLimitLayer::builder()
                .clock(clock.clone())
                .rule(Rule::per_ip("ip", Policy::token_bucket(Rate::per_second(2)))
                    .block_for(Duration::from_millis(block_ms)))
                .build()
                .unwrap();
            let app = app(layer);
            let mut now_ms = 0u64;
            // Per key: the end of its block, and its bucket's TAT (ms).
            let mut blocked_until = [0u64; 3];
            let mut tat = [0u64; 3];
            for (advance, key) in steps {
                clock.advance(Duration::from_millis(advance));
                now_ms += advance;
                let k = usize::from(key);
                let got = send(&app, [10, 0, 0, key]).await;
                if now_ms < blocked_until[k] {
                    prop_assert_eq!(got.status, StatusCode::TOO_MANY_REQUESTS, "admitted during a block at {}", now_ms);
                    let left = (blocked_until[k] - now_ms).div_ceil(1000);
                    prop_assert_eq!(got.retry_after(), Some(left.max(1)));
                    continue;
                }
                // The model: GCRA with T = 500 ms, burst 2 (tolerance 500 ms).
                let allowed = tat[k].saturating_sub(500) <= now_ms;
                if allowed {
                    prop_assert_eq!(got.status, StatusCode::OK, "denied at {} outside a block", now_ms);
                    tat[k] = tat[k].max(now_ms) + 500;
                } else {
                    prop_assert_eq!(got.status, StatusCode::TOO_MANY_REQUESTS);
                    prop_assert_eq!(got.retry_after(), Some(block_ms.div_ceil(1000)));
                    blocked_until[k] = now_ms + block_ms;
                }
            }
            Ok(())
        })?;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn end_to_end_a_locked_out_client_gets_the_block_end_in_retry_after() {
    let clock = ManualClock::new();
    let layer = RateLimitLayer::builder()
        .clock(clock.clone())
        .rule(login())
        .build()
        .unwrap();
    let (addr, stop, server) = serve("127.0.0.1:0", app(layer)).await;
    let mut statuses = Vec::new();
    for _ in 0..4 {
        statuses.push(fetch(addr, "GET", "/", &[]).await.status);
    }
    assert_eq!(statuses[3], StatusCode::TOO_MANY_REQUESTS);
    clock.advance(Duration::from_secs(600));
    let got = fetch(addr, "GET", "/", &[]).await;
    check_fields(&got);
    assert_eq!(got.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(got.retry_after(), Some(300));
    assert_eq!(got.ratelimit(), vec![("login".to_owned(), 0, 300)]);
    clock.advance(Duration::from_secs(300));
    assert_eq!(fetch(addr, "GET", "/", &[]).await.status, StatusCode::OK);
    drop(stop);
    server.await.unwrap();
}

/// A block shorter than the rule's own wait (issue 30: a `3/min` sliding
/// log with a 30 s block answered `retry-after: 30`; obeying it met the
/// rule's denial, about 60 s, and started a new block): `Retry-After` is
/// the later of the two, at the breach and while blocked, and a client
/// that waits exactly what it is told is admitted.
#[tokio::test]
async fn retry_after_covers_the_rules_own_wait_and_obeying_it_starts_no_new_block() {
    let clock = ManualClock::new();
    let rule = Rule::per_ip("login", Policy::sliding_window_log(Window::per_minute(3)))
        .block_for(Duration::from_secs(30));
    let layer = RateLimitLayer::builder()
        .clock(clock.clone())
        .rule(rule)
        .build()
        .unwrap();
    let short = app(layer);
    let ip = [192, 0, 2, 9];
    for _ in 0..3 {
        assert_eq!(send(&short, ip).await.status, StatusCode::OK);
    }
    let breach = send(&short, ip).await;
    assert_eq!(breach.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        breach.retry_after(),
        Some(60),
        "the log's own wait, not the 30 s block"
    );
    clock.advance(Duration::from_secs(10));
    let blocked = send(&short, ip).await;
    assert_eq!(blocked.retry_after(), Some(50));
    // Obeying: admitted, and so is the next one (no new block).
    clock.advance(Duration::from_secs(50));
    assert_eq!(send(&short, ip).await.status, StatusCode::OK);
    assert_eq!(send(&short, ip).await.status, StatusCode::OK);
    // A block longer than the rule's wait is still the block.
    let clock = ManualClock::new();
    let layer = RateLimitLayer::builder()
        .clock(clock.clone())
        .rule(login())
        .build()
        .unwrap();
    let long = app(layer);
    for _ in 0..3 {
        assert_eq!(send(&long, ip).await.status, StatusCode::OK);
    }
    assert_eq!(send(&long, ip).await.retry_after(), Some(900));
}
