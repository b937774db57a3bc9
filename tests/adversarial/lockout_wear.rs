//! Wearing lockouts down: a client breaches a rule with many keys so that
//! live blocks fill the lockout table. Before, that table was the rule's
//! own size and policy: full, it stopped new blocks (`RejectNew`) or ended
//! old ones (`EvictLeastRecent`); and a table-full denial locked a new key out.

use crate::support::http_client::{call, Got};
use axum::Router;
use http::StatusCode;
use ratewall::http::Rule;
use ratewall::{ManualClock, Policy, WhenFull, Window};
use std::time::Duration;

const BLOCK: Duration = Duration::from_secs(15 * 60);

use crate::one_rule_app as app;

async fn as_user(app: &Router, user: &str) -> Got {
    call(app, "GET", "/", "192.0.2.1", &[("x-user", user)]).await
}

/// One request a minute per user, then 15 minutes out; the rule's table
/// holds 8 users.
fn login() -> Rule {
    Rule::per_header(
        "login",
        "x-user",
        Policy::fixed_window(Window::per_minute(1)),
    )
    .max_keys(8)
    .block_for(BLOCK)
}

/// Breaches the rule with `user` (its one request, then the denial that
/// starts its block), then lets a second go by.
async fn breach(app: &Router, clock: &ManualClock, user: &str) {
    assert_eq!(as_user(app, user).await.status, StatusCode::OK, "{user}");
    let d = as_user(app, user).await;
    assert_eq!(d.status, StatusCode::TOO_MANY_REQUESTS, "{user}");
    assert_eq!(d.retry_after(), Some(BLOCK.as_secs()), "{user}: blocked");
    clock.advance(Duration::from_secs(1));
}

#[tokio::test]
async fn blocks_of_many_keys_neither_stop_a_new_block_nor_end_an_old_one() {
    for when_full in [WhenFull::EvictLeastRecent, WhenFull::RejectNew] {
        let clock = ManualClock::new();
        let app = app(login().when_full(when_full), &clock);
        // Five times the rule's table in breaching users, four a minute
        // (the rule's table has room: its keys go idle each minute), while
        // every block lives on (the lockout table holds 65,536 by default).
        let mut breached = Vec::new();
        let mut at = 0;
        for batch in 0..10 {
            for i in 0..4 {
                let user = format!("user-{batch}-{i}");
                breach(&app, &clock, &user).await;
                breached.push((user, at));
                at += 1;
            }
            clock.advance(Duration::from_secs(60 - 4));
            at += 60 - 4;
        }
        // Every rule window has ended: only blocks deny, each until its end.
        for (user, when) in &breached {
            let got = as_user(&app, user).await;
            assert_eq!(
                got.status,
                StatusCode::TOO_MANY_REQUESTS,
                "{when_full:?} {user}"
            );
            let left = BLOCK.as_secs() - (at - when);
            assert_eq!(got.retry_after(), Some(left), "{when_full:?} {user}");
        }
    }
}

#[tokio::test]
async fn a_full_lockout_table_ends_only_the_block_nearest_its_end() {
    let clock = ManualClock::new();
    let app = app(login().lockout_max_keys(16), &clock);
    let users: Vec<String> = (0..17).map(|i| format!("user-{i}")).collect();
    // Sixteen live blocks fill the lockout table; the seventeenth breach
    // is blocked all the same, in the place of the block that ends first.
    for u in &users {
        breach(&app, &clock, u).await;
    }
    clock.advance(Duration::from_secs(120));
    assert_eq!(
        as_user(&app, &users[0]).await.status,
        StatusCode::OK,
        "the oldest block went"
    );
    for u in &users[1..] {
        let got = as_user(&app, u).await;
        assert_eq!(got.status, StatusCode::TOO_MANY_REQUESTS, "{u}");
    }
}

#[tokio::test]
async fn a_denial_because_the_rule_table_is_full_starts_no_block() {
    let clock = ManualClock::new();
    let app = app(login().when_full(WhenFull::RejectNew), &clock);
    // Eight users (no breach) fill the rule's table until the minute ends.
    for i in 0..8 {
        assert_eq!(
            as_user(&app, &format!("user-{i}")).await.status,
            StatusCode::OK
        );
    }
    let full = as_user(&app, "late").await;
    assert_eq!(
        full.status,
        StatusCode::TOO_MANY_REQUESTS,
        "the table is full"
    );
    assert!(full.retry_after().unwrap() <= 60, "until a key goes idle");
    // A minute on, the late user is served: it never breached.
    clock.advance(Duration::from_secs(60));
    assert_eq!(as_user(&app, "late").await.status, StatusCode::OK);
}
