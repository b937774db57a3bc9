//! Loads `examples/limits.toml` into local keyed limiters and an elastic
//! limiter, then plays a few requests through them on a manual clock.
//!
//! ```text
//! cargo run --example limits --features serde
//! ```
//!
//! These are limiters for code of your own. For the HTTP layer, its rules
//! (per IP, per API key, login) are in `examples/http_limits.toml`, read by
//! `ratewall::http::LayerConfig` (`RATEWALL_LIMITS=examples/http_limits.toml
//! cargo run --example server --features axum,serde`).

use ratewall::{ElasticLimiter, KeyedPolicyLimiter, ManualClock, Policy};
use serde::Deserialize;
use std::collections::BTreeMap;

#[derive(Debug, Deserialize)]
struct Config {
    limits: BTreeMap<String, Keyed>,
    #[serde(default)]
    elastic: BTreeMap<String, Elastic>,
}

#[derive(Debug, Deserialize)]
struct Keyed {
    key: String,
    policy: Policy,
    max_keys: usize,
}

#[derive(Debug, Deserialize)]
struct Elastic {
    key: String,
    guarantee: Policy,
    ceiling: Policy,
    pool: Policy,
    max_keys: usize,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let text = include_str!("limits.toml");
    let config: Config = toml::from_str(text)?;
    let clock = ManualClock::new();

    let mut limiters = BTreeMap::new();
    for (name, l) in &config.limits {
        let limiter = KeyedPolicyLimiter::<String, _>::builder(l.policy)
            .max_keys(l.max_keys)
            .clock(clock.clone())
            .build()?;
        println!(
            "{name:<12} per {:<8} {:<36} limit {} (admits up to {})",
            l.key,
            l.policy.to_string(),
            l.policy.limit(),
            l.policy.soft_limit()
        );
        limiters.insert(name.clone(), limiter);
    }
    let mut elastic = BTreeMap::new();
    for (name, e) in &config.elastic {
        let limiter = ElasticLimiter::<String, _>::builder(e.guarantee, e.ceiling, e.pool)
            .max_keys(e.max_keys)
            .clock(clock.clone())
            .build()?;
        println!(
            "{name:<12} per {:<8} guarantee {}, ceiling {}, pool {}",
            e.key, e.guarantee, e.ceiling, e.pool
        );
        elastic.insert(name.clone(), limiter);
    }

    println!();
    let login = &limiters["login"];
    let attempts: Vec<bool> = (0..7)
        .map(|_| login.check_key("alice").is_allowed())
        .collect();
    println!("login: 7 attempts by alice at once -> {attempts:?}");

    let api = &limiters["per_api_key"];
    let (mut allowed, mut above) = (0, 0);
    for _ in 0..7000 {
        let d = api.check_key("key-1");
        allowed += u32::from(d.is_allowed());
        above += u32::from(d.is_above_limit());
    }
    println!("per_api_key: 7000 requests in one instant -> {allowed} allowed, {above} of them above the limit");

    let search = &elastic["search"];
    let count = |key: &str| {
        (0..400)
            .map(|_| search.check_key(key))
            .filter(|d| d.is_allowed())
            .count()
    };
    println!(
        "search: 400 requests each from key-1 and key-2 -> {} and {} allowed",
        count("key-1"),
        count("key-2")
    );

    // A bad limit names its token and the field.
    let bad = "[limits.x]\nkey = \"ip\"\npolicy = \"100/s brust 5\"\nmax_keys = 1\n";
    if let Err(e) = toml::from_str::<Config>(bad) {
        println!("\na bad file:\n{e}");
    }
    Ok(())
}
