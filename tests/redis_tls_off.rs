//! Without the `redis-tls` feature, a `rediss://` URL is a typed error at
//! `build()` that names the feature to turn on (run it with
//! `cargo test --features redis --test redis_tls_off`; with `redis-tls`
//! on, tests/redis_tls.rs covers TLS and this file is empty).
#![cfg(all(feature = "redis", not(feature = "redis-tls")))]

use ratewall::redis::{RedisBackend, RedisError};

#[tokio::test]
async fn a_tls_url_without_the_feature_names_the_feature() {
    let single = RedisBackend::builder("rediss://127.0.0.1:6380").build();
    let cluster =
        RedisBackend::cluster_builder(["redis://127.0.0.1:7000", "rediss://127.0.0.1:7001"])
            .build();
    for (i, built) in [single, cluster].into_iter().enumerate() {
        match built {
            Err(e @ RedisError::FeatureDisabled { feature, .. }) => {
                assert_eq!(feature, "redis-tls", "{i}");
                let text = e.to_string();
                assert!(
                    text.contains("`redis-tls`") && text.contains("rediss://"),
                    "{i}: {text}"
                );
            }
            other => panic!("{i}: expected FeatureDisabled, got {other:?}"),
        }
    }
    // A plain URL still builds.
    assert!(RedisBackend::builder("redis://127.0.0.1:6379")
        .build()
        .is_ok());
}
