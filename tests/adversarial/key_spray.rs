//! Key spraying: a client sends new values of a header the rule keys by
//! (checked before authentication) until the rule's table is full. Before,
//! the full table (`RejectNew`) answered 429 to every new client, valid
//! keys included, until the junk went idle (a day for a daily window).

use crate::support::http_client::{call, Got};
use axum::Router;
use http::StatusCode;
use ratewall::http::{RateLimitLayer, Rule};
use ratewall::{ManualClock, Policy, WhenFull, Window};
use std::time::Duration;

const DAY: Duration = Duration::from_secs(86_400);

/// The finding's rule: an API key header, 1,000 a day in a fixed window,
/// with a small table so that the spray is short.
fn api_keys() -> Rule {
    Rule::per_header(
        "key",
        "x-api-key",
        Policy::fixed_window(Window::new(1000, DAY)),
    )
    .max_keys(16)
}

use crate::one_rule_app as app;

async fn with_key(app: &Router, key: &str) -> Got {
    call(app, "GET", "/", "192.0.2.1", &[("x-api-key", key)]).await
}

#[tokio::test]
async fn a_spray_fills_the_table_and_new_and_active_keys_are_still_served_as_before() {
    let clock = ManualClock::new();
    let app = app(api_keys(), &clock);
    // An honest client spends 5 of its 1,000.
    for _ in 0..5 {
        assert_eq!(with_key(&app, "valid").await.status, StatusCode::OK);
    }
    // The spray: ten times the table's size in junk keys, one request each.
    for i in 0..160 {
        let junk = with_key(&app, &format!("junk-{i}")).await;
        assert_eq!(junk.status, StatusCode::OK, "junk {i}");
    }
    // A client never seen is served.
    let new = with_key(&app, "never-seen").await;
    assert_eq!(new.status, StatusCode::OK, "a new client after the spray");
    // The honest key kept its state: what it spent is still spent.
    let valid = with_key(&app, "valid").await;
    assert_eq!(valid.status, StatusCode::OK);
    assert_eq!(valid.remaining("key"), Some(1000 - 6));
    // Twenty hours on (the finding's check), with another spray between.
    clock.advance(Duration::from_secs(20 * 3600));
    for i in 0..160 {
        let _ = with_key(&app, &format!("junk-b-{i}")).await;
    }
    let later = with_key(&app, "valid").await;
    assert_eq!(later.status, StatusCode::OK, "20 h later");
    assert_eq!(later.remaining("key"), Some(1000 - 7));
    assert_eq!(
        with_key(&app, "never-seen-2").await.status,
        StatusCode::OK,
        "a new client 20 h later"
    );
}

#[tokio::test]
async fn a_key_that_spent_more_than_one_junk_request_is_never_the_one_pushed_out() {
    // The eviction takes the key closest to idle, then the one holding
    // least: in a fixed window every key goes idle at the window's end,
    // so the junk keys (one unit each) go before any key that spent two.
    let clock = ManualClock::new();
    // (Explicit, so that the test asks the same of the table before the
    // default changed.)
    let app = app(api_keys().when_full(WhenFull::EvictLeastRecent), &clock);
    let honest: Vec<String> = (0..8).map(|i| format!("honest-{i}")).collect();
    for (i, key) in honest.iter().enumerate() {
        for _ in 0..2 + i {
            assert_eq!(with_key(&app, key).await.status, StatusCode::OK);
        }
    }
    for i in 0..200 {
        let _ = with_key(&app, &format!("junk-{i}")).await;
    }
    for (i, key) in honest.iter().enumerate() {
        let got = with_key(&app, key).await;
        assert_eq!(got.remaining("key"), Some(1000 - 3 - i as i64), "{key}");
    }
}

/// The layer's warnings while `build` runs, captured (feature `tracing`:
/// they are `tracing` events; without it they go to standard error).
#[cfg(feature = "tracing")]
fn warnings_of(build: impl Fn()) -> String {
    let out = crate::support::logs::Captured::default();
    let subscriber = out.subscriber();
    tracing::subscriber::with_default(subscriber, || {
        // A test on another thread, with no subscriber, may register the
        // warning's callsite as "never" while this one is being set up:
        // then ask again (once its registration is done) and build again.
        for _ in 0..2 {
            tracing::callsite::rebuild_interest_cache();
            build();
            if !out.is_empty() {
                break;
            }
        }
    });
    out.text()
}

#[cfg(feature = "tracing")]
#[test]
fn reject_new_on_a_key_a_client_picks_warns_at_build_with_its_cost() {
    let build = |rule: Rule| {
        warnings_of(|| {
            RateLimitLayer::builder()
                .rule(rule.clone())
                .build()
                .unwrap();
        })
    };
    let explicit = build(api_keys().max_keys(65_536).when_full(WhenFull::RejectNew));
    assert!(
        explicit.contains("\"key\"") && explicit.contains("RejectNew"),
        "{explicit}"
    );
    assert!(explicit.contains("65536 requests"), "{explicit}");
    // The default, and a table that is costly to keep full, say nothing.
    assert!(!build(api_keys()).contains("RejectNew"));
    let per_second = Rule::per_header(
        "key",
        "x-api-key",
        Policy::fixed_window(Window::per_second(10)),
    )
    .when_full(WhenFull::RejectNew);
    assert!(!build(per_second).contains("RejectNew"));
}
