//! The attack: pick API key values whose Redis key name lands in one
//! Redis Cluster slot (the names were `prefix:rule:h:<value>`, and CRC16
//! is public: about 16,000 tries a slot; `x-api-key: k5362` lands on slot
//! 42), and send them all to load one master. With a `key_secret` the
//! layer names client material by a keyed hash: the values aimed at slot
//! 42 scatter, and no one without the secret can aim. (Without a secret
//! the names are an unkeyed hash: the value is hidden, but a patient
//! client can still aim; docs/security.md says so.)

use crate::support::http_client::call;
use crate::support::redis_server::RedisCluster;
use axum::routing::get;
use axum::Router;
use http::StatusCode;
use ratewall::http::{Key, RateLimitLayer, Rule};
use ratewall::redis::{FailurePolicy, RedisBackend, RedisLimiter};
use ratewall::{Policy, Window};
use redis::cluster_routing::Slot;
use std::time::Duration;

/// The values whose old, clear name (`ratewall:key:h:<value>`) is in slot 42.
fn aimed_at_42() -> Vec<String> {
    let target = Slot::new(42).unwrap();
    let found: Vec<String> = (0..2_000_000u32)
        .map(|i| format!("k{i}"))
        .filter(|v| Slot::for_key(format!("ratewall:key:h:{v}").as_bytes()) == target)
        .take(4)
        .collect();
    assert_eq!(found[0], "k5362", "the report's example");
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_key_secret_values_aimed_at_one_slot_scatter() {
    let cluster = RedisCluster::start(3);
    let aimed = aimed_at_42();
    let mut slots_by_secret = Vec::new();
    for secret in [
        "first secret, 32 bytes long ....",
        "another secret of the same size.",
    ] {
        let b = RedisBackend::cluster_builder(cluster.urls())
            .timeout(Duration::from_secs(5))
            .key_secret(secret)
            .build()
            .unwrap();
        let l = RedisLimiter::builder(Policy::fixed_window(Window::per_hour(2)), &b)
            .name("key")
            .on_failure(FailurePolicy::Closed)
            .build()
            .unwrap();
        let layer = RateLimitLayer::builder()
            .rule(Rule::redis(Key::header("x-api-key"), l))
            .build()
            .unwrap();
        let app = Router::new()
            .route("/", get(|| async { "ok" }))
            .layer(layer);
        for v in &aimed {
            let got = call(&app, "GET", "/", "192.0.2.1", &[("x-api-key", v)]).await;
            assert_eq!(got.status, StatusCode::OK);
        }
        // Every name the layer wrote, with its slot: none holds a value.
        let mut slots = Vec::new();
        for node in 0..3 {
            let keys = cluster.nodes[node].cmd(&["KEYS", "ratewall:key:*"]);
            for name in keys.lines().filter(|l| l.starts_with("ratewall:key:")) {
                assert!(!aimed.iter().any(|v| name.contains(v.as_str())), "{name}");
                slots.push(cluster.slot(name));
            }
        }
        slots.sort_unstable();
        assert_eq!(slots.len(), aimed.len(), "one name per value");
        assert!(
            slots.iter().filter(|&&s| s == 42).count() < aimed.len(),
            "the aimed values all landed in slot 42: {slots:?}"
        );
        slots_by_secret.push(slots);
        for node in 0..3 {
            let _ = cluster.nodes[node].cmd(&["FLUSHALL"]);
        }
    }
    assert_ne!(
        slots_by_secret[0], slots_by_secret[1],
        "the secret decides the slots"
    );
}
