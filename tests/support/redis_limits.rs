//! Redis backends and limiters for the tests that run against a real
//! server (feature `redis`).
#![allow(dead_code)] // each test file uses a part

use super::redis_server::RedisServer;
use ratewall::redis::{FailurePolicy, RedisBackend, RedisLimiter};
use ratewall::Policy;
use std::time::Duration;

/// A backend on `server` with a 300 ms timeout.
pub fn backend(server: &RedisServer) -> RedisBackend {
    RedisBackend::builder(server.url())
        .timeout(Duration::from_millis(300))
        .build()
        .unwrap()
}

/// A limiter named `name` on `b`.
pub fn limiter(
    b: &RedisBackend,
    name: &str,
    policy: Policy,
    failure: FailurePolicy,
) -> RedisLimiter {
    RedisLimiter::builder(policy, b)
        .name(name)
        .on_failure(failure)
        .build()
        .unwrap()
}

/// The name a Redis rule of the HTTP layer gives client key material
/// (`h:` and a header value, `r:` and a route, ...) in Redis by default:
/// `~` and the first 128 bits of its SHA-1, in hex (no secret set).
pub fn hashed(material: &str) -> String {
    let digest = sha1_smol::Sha1::from(material).digest().bytes();
    let hex: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
    format!("~{hex}")
}
