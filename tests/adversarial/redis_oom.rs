//! Redis out of memory, or answering garbage: clients who create keys
//! enough push a `noeviction` Redis (its default) into `OOM`. The store's
//! failure must take each rule's failure policy (`Open` admits, `Closed`
//! answers its documented 503, a fallback limits locally), not a 503 for
//! every request whatever the policy.

use super::support::http_client::{fetch, serve, Got};
use super::support::redis_server::RedisServer;
use super::support::store_faults::{fill_until_oom, FakeRedis};
use axum::routing::get;
use axum::Router;
use http::StatusCode;
use ratewall::http::{Key, RateLimitLayer, Rule};
use ratewall::redis::{FailurePolicy, RedisBackend, RedisLimiter};
use ratewall::{Policy, Window};
use std::time::{Duration, Instant};

const POLICIES: [(&str, FailurePolicy); 3] = [
    ("open", FailurePolicy::Open),
    ("closed", FailurePolicy::Closed),
    ("share", FailurePolicy::FallbackShare { instances: 1 }),
];

/// One app per failure policy: a Redis rule per client IP (2 per hour)
/// named after its policy, and (`locked`) a lockout on it, which takes
/// another script.
async fn apps(url: &str, locked: bool) -> Vec<(&'static str, std::net::SocketAddr, impl Drop)> {
    let mut out = Vec::new();
    for (name, failure) in POLICIES {
        let b = RedisBackend::builder(url)
            .timeout(Duration::from_millis(200))
            .build()
            .unwrap();
        let l = RedisLimiter::builder(Policy::fixed_window(Window::per_hour(2)), &b)
            .name(name)
            .on_failure(failure)
            .build()
            .unwrap();
        let mut rule = Rule::redis(Key::ip(), l);
        if locked {
            rule = rule.block_for(Duration::from_secs(60));
        }
        let layer = RateLimitLayer::builder().rule(rule).build().unwrap();
        let app = Router::new()
            .route("/", get(|| async { "ok" }))
            .layer(layer);
        let (addr, stop, _) = serve("127.0.0.1:0", app).await;
        out.push((name, addr, stop_on_drop(stop)));
    }
    out
}

/// Stops a server when dropped.
fn stop_on_drop(stop: tokio::sync::oneshot::Sender<()>) -> impl Drop {
    struct Stop(Option<tokio::sync::oneshot::Sender<()>>);
    impl Drop for Stop {
        fn drop(&mut self) {
            if let Some(s) = self.0.take() {
                let _ = s.send(());
            }
        }
    }
    Stop(Some(stop))
}

/// Four requests from one client to the app of policy `name` while the
/// store fails: each within the timeout and what its policy says.
async fn assert_policy(name: &str, addr: std::net::SocketAddr) {
    for i in 0..4 {
        let t = Instant::now();
        let got: Got = fetch(addr, "GET", "/", &[]).await;
        assert!(
            t.elapsed() < Duration::from_secs(2),
            "{name} {i}: {:?}",
            t.elapsed()
        );
        match name {
            "open" => assert_eq!(got.status, StatusCode::OK, "{name} {i}: {}", got.text()),
            "closed" => {
                assert_eq!(got.status, StatusCode::SERVICE_UNAVAILABLE, "{i}");
                assert!(got.retry_after().is_some_and(|r| r >= 1));
                assert_eq!(
                    got.json()["violated-policies"],
                    serde_json::json!(["closed"])
                );
            }
            _ => {
                // The local fallback holds the whole limit: 2 per hour.
                let want = if i < 2 {
                    StatusCode::OK
                } else {
                    StatusCode::TOO_MANY_REQUESTS
                };
                assert_eq!(got.status, want, "{name} {i}: {}", got.text());
            }
        }
    }
}

#[tokio::test]
async fn an_out_of_memory_redis_answers_each_rules_failure_policy() {
    let server = RedisServer::start_with(&["--maxmemory-policy", "noeviction"]);
    let plain = apps(&server.url(), false).await;
    let locked = apps(&server.url(), true).await;
    fill_until_oom(&server);
    for (name, addr, _stop) in plain.iter().chain(&locked) {
        assert_policy(name, *addr).await;
    }
}

#[tokio::test]
async fn a_redis_answering_garbage_answers_each_rules_failure_policy() {
    let fake = FakeRedis::start(b"$7\r\ngarbage\r\n").await;
    for locked in [false, true] {
        for (name, addr, _stop) in apps(&fake.url(), locked).await {
            assert_policy(name, addr).await;
        }
    }
    assert!(fake.script_calls() > 0);
}
