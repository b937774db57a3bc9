//! Premium tiers and lockouts in a configuration file (issue 23): the TOML
//! settings `tiers`, `tier_keys`, `tier_header` and `block_for`, their round
//! trip, what they do, and a typed error naming the rule, the field and the
//! tier for each bad value.

mod support;

use axum::routing::get;
use axum::Router;
use http::StatusCode;
use ratewall::http::{HttpConfigError, LayerConfig, RateLimitLayer, Rule};
use ratewall::{ConfigError, ManualClock, Policy, Rate};
use std::time::Duration;
use support::http_client::{call, Got};

const CONFIG: &str = r#"
[[rules]]
name = "api"
key = "header:x-api-key"
policy = "10/min fixed-window"
tiers = { premium = "100/min fixed-window", partner = "30/min fixed-window" }
tier_keys = { premium = ["gold-1", "gold-2"] }
tier_header = "x-plan"

[[rules]]
name = "login"
key = "ip"
policy = "3/min fixed-window"
path_prefix = "/login"
block_for = "15min"
"#;

fn layer(config: &LayerConfig, clock: &ManualClock) -> RateLimitLayer<ManualClock> {
    config
        .to_builder()
        .unwrap()
        .clock(clock.clone())
        .build()
        .unwrap()
}

async fn send(app: &Router, path: &str, headers: &[(&str, &str)]) -> Got {
    call(app, "GET", path, "192.0.2.1", headers).await
}

async fn admitted(app: &Router, path: &str, headers: &[(&str, &str)]) -> u64 {
    support::http_client::admitted(app, path, "192.0.2.1", headers).await
}

#[test]
fn tiers_and_lockouts_round_trip_through_toml() {
    let config: LayerConfig = toml::from_str(CONFIG).unwrap();
    let api = &config.rules[0];
    assert_eq!(
        api.tiers.get("premium").map(String::as_str),
        Some("100/min fixed-window")
    );
    assert_eq!(api.tier_keys["premium"], ["gold-1", "gold-2"]);
    assert_eq!(api.tier_header.as_deref(), Some("x-plan"));
    assert_eq!(config.rules[1].block_for.as_deref(), Some("15min"));
    let text = toml::to_string(&config).unwrap();
    let again: LayerConfig = toml::from_str(&text).unwrap();
    assert_eq!(again, config, "{text}");
}

#[tokio::test]
async fn the_configured_tiers_and_lockout_do_what_they_say() {
    let config: LayerConfig = toml::from_str(CONFIG).unwrap();
    let clock = ManualClock::new();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .route("/login", get(|| async { "ok" }))
        .layer(layer(&config, &clock));
    assert_eq!(admitted(&app, "/", &[("x-api-key", "gold-1")]).await, 100);
    assert_eq!(
        admitted(&app, "/", &[("x-api-key", "k"), ("x-plan", "partner")]).await,
        30
    );
    assert_eq!(admitted(&app, "/", &[("x-api-key", "k2")]).await, 10);
    assert_eq!(admitted(&app, "/login", &[]).await, 3);
    clock.advance(Duration::from_secs(60));
    let blocked = send(&app, "/login", &[]).await;
    assert_eq!(blocked.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(blocked.retry_after(), Some(840));
    clock.advance(Duration::from_secs(840));
    assert_eq!(send(&app, "/login", &[]).await.status, StatusCode::OK);
}

/// The error a configuration with `edit` applied to its first rule gets.
fn error_of(edit: &str) -> HttpConfigError {
    let text = format!(
        "[[rules]]\nname = \"api\"\nkey = \"header:x-api-key\"\npolicy = \"10/min\"\n{edit}\n"
    );
    let config: LayerConfig = toml::from_str(&text).unwrap();
    match config.to_builder() {
        Err(e) => e,
        Ok(b) => b.build().map(|_| ()).unwrap_err(),
    }
}

#[test]
fn bad_tiers_and_blocks_are_typed_errors_that_say_what_to_change() {
    let e = error_of("tiers = { premium = \"100/min\" }\ntier_keys = { premuim = [\"k\"] }");
    assert_eq!(
        e,
        HttpConfigError::UnknownTier {
            rule: "api".into(),
            tier: "premuim".into()
        }
    );
    assert!(e.to_string().contains("\"premuim\""), "{e}");
    let e = error_of("tiers = { premium = \"100/mni\" }\ntier_header = \"x-plan\"");
    assert!(
        matches!(&e, HttpConfigError::TierPolicyText { rule, tier, .. } if rule == "api" && tier == "premium"),
        "{e:?}"
    );
    assert!(e.to_string().contains("`mni`"), "{e}");
    // A tier rate outside the algorithm's range: the rule's own error, naming the tier.
    let e = error_of("tiers = { free = \"0/s\" }\ntier_header = \"x-plan\"");
    assert!(
        matches!(&e, HttpConfigError::TierPolicyText { tier, error, .. }
            if tier == "free" && error.to_string().contains(&ConfigError::ZeroRate.to_string())),
        "{e:?}"
    );
    let e = error_of("tiers = { \"pre mium\" = \"100/min\" }\ntier_header = \"x-plan\"");
    assert!(
        matches!(&e, HttpConfigError::InvalidTierName { tier, .. } if tier == "pre mium"),
        "{e:?}"
    );
    let e = error_of("tiers = { premium = \"100/min\" }");
    assert!(
        matches!(&e, HttpConfigError::InvalidValue { field: "tiers", .. }),
        "{e:?}"
    );
    // Told in the file's words; the same rule made in Rust, in the API's.
    assert!(
        e.to_string().contains("`tier_keys` or `tier_header`")
            && !e.to_string().contains("tier_by"),
        "{e}"
    );
    let rust = RateLimitLayer::builder()
        .rule(
            Rule::per_header(
                "api",
                "x-api-key",
                Policy::token_bucket(Rate::per_minute(10)),
            )
            .tier("premium", Policy::token_bucket(Rate::per_minute(100))),
        )
        .build()
        .unwrap_err();
    assert!(rust.to_string().contains("`tier_by_header`"), "{rust}");
    let e = error_of("tiers = { premium = \"100/min\" }\ntier_header = \"x plan\"");
    assert!(
        matches!(
            &e,
            HttpConfigError::InvalidValue {
                field: "tier_header",
                ..
            }
        ),
        "{e:?}"
    );
    for bad in ["15", "15 min", "fortnight", "0s", "-1s", "1__0s"] {
        let e = error_of(&format!("block_for = \"{bad}\""));
        assert!(
            matches!(&e, HttpConfigError::InvalidValue { rule: Some(r), field: "block_for", value, .. } if r == "api" && value == bad),
            "{bad}: {e:?}"
        );
        assert!(e.to_string().contains("block_for"), "{e}");
    }
}
