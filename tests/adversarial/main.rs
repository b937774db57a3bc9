//! The adversarial suite: one file per attack that docs/security.md
//! names, each run through the real tower layer (and a real Redis where
//! the attack reaches the store). Every test here failed before the fix it
//! holds; docs/security.md cites each one beside the promise it keeps.

#[path = "../support/mod.rs"]
mod support;

mod cluster_slot;
mod forged_forwarded;
mod hardening;
mod hostile_upstream;
mod key_spray;
mod lockout_wear;
mod log_memory;
mod redis_oom;
mod repeated_header;

/// `GET /` answering "ok" behind a layer of one `rule` on `clock`.
fn one_rule_app(rule: ratewall::http::Rule, clock: &ratewall::ManualClock) -> axum::Router {
    let layer = ratewall::http::RateLimitLayer::builder()
        .clock(clock.clone())
        .rule(rule)
        .build()
        .unwrap();
    axum::Router::new()
        .route("/", axum::routing::get(|| async { "ok" }))
        .layer(layer)
}
