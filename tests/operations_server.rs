//! Issue 22 item 4, end to end: the example server (`examples/server.rs`)
//! with its limits in a real `redis-server`, a real client on loopback
//! sending traffic while Redis is killed and restarted, and its operators'
//! routes scraped meanwhile on the admin port: `/metrics` (Prometheus text
//! through `metrics-exporter-prometheus`) and `/admin/limits` (JSON). Their
//! counts must match what the client saw, the scrapes are never rate
//! limited, and the public port does not serve them (issue 34).
#![cfg(all(feature = "axum", feature = "redis", feature = "metrics"))]

mod support;

#[allow(dead_code)] // the test uses its routes and limits, not its `main`
#[path = "../examples/server.rs"]
mod server;

use http::StatusCode;
use std::collections::HashMap;
use std::time::{Duration, Instant};
use support::http_client::{fetch, serve};
use support::redis_server::RedisServer;

/// Prometheus text: `name{labels} value` lines into a map keyed by the
/// line's name and labels as written (the exporter sorts nothing we rely
/// on: look series up with [`series`]).
fn parse(text: &str) -> HashMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| {
            let (k, v) = l.rsplit_once(' ')?;
            Some((k.to_string(), v.parse().ok()?))
        })
        .collect()
}

/// The value of the series `name` whose labels include all of `labels`.
fn series(m: &HashMap<String, f64>, name: &str, labels: &[(&str, &str)]) -> f64 {
    m.iter()
        .filter(|(k, _)| {
            k.split('{').next() == Some(name)
                && labels
                    .iter()
                    .all(|(l, v)| k.contains(&format!("{l}=\"{v}\"")))
        })
        .map(|(_, v)| *v)
        .sum()
}

/// `n` requests from the client, one after the other; their statuses.
async fn send(addr: std::net::SocketAddr, n: usize) -> Vec<StatusCode> {
    let mut statuses = Vec::with_capacity(n);
    for _ in 0..n {
        let got = fetch(addr, "GET", "/", &[("x-api-key", "sk-live-secret-123")]).await;
        statuses.push(got.status);
    }
    statuses
}

async fn scrape(addr: std::net::SocketAddr) -> (HashMap<String, f64>, serde_json::Value) {
    let m = fetch(addr, "GET", "/metrics", &[]).await;
    assert_eq!(m.status, StatusCode::OK, "{}", m.text());
    let a = fetch(addr, "GET", "/admin/limits", &[]).await;
    assert_eq!(a.status, StatusCode::OK);
    (parse(&m.text()), a.json())
}

fn rule<'a>(admin: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    admin["rules"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == name)
        .unwrap_or_else(|| panic!("no rule {name} in {admin}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scrapes_match_the_client_through_a_redis_outage() {
    let mut redis = RedisServer::start();
    // Before the limits are built: they register their metrics then.
    server::install_metrics();
    let layer = server::redis_limits(&redis.url()).unwrap();
    let (addr, stop, task) = serve("127.0.0.1:0", server::router(layer.clone())).await;
    let (admin_addr, stop_admin, admin_task) = serve("127.0.0.1:0", server::admin(layer)).await;

    let (mut ok, mut limited) = (0u64, 0u64);
    let mut tally = |statuses: Vec<StatusCode>| {
        for s in statuses {
            match s {
                StatusCode::OK => ok += 1,
                StatusCode::TOO_MANY_REQUESTS => limited += 1,
                s => panic!("unexpected {s}"),
            }
        }
    };
    // Healthy: the per-IP burst of 20, then denials, from Redis.
    tally(send(addr, 30).await);
    let (m, _) = scrape(admin_addr).await;
    assert_eq!(
        series(&m, "ratewall_redis_failing", &[("limiter", "ip")]),
        0.0
    );

    // Redis dies: the local share answers (a fresh burst), reported once.
    redis.kill9();
    tally(send(addr, 40).await);
    let (m, admin) = scrape(admin_addr).await;
    assert_eq!(
        series(&m, "ratewall_redis_failing", &[("limiter", "ip")]),
        1.0
    );
    assert!(
        series(
            &m,
            "ratewall_http_requests_total",
            &[("rule", "ip"), ("outcome", "fallback")]
        ) > 0.0
    );
    assert!(rule(&admin, "ip")["fallbacks"].as_u64().unwrap() > 0);
    // Scrapes are not rate limited, however many.
    for _ in 0..30 {
        assert_eq!(
            fetch(admin_addr, "GET", "/admin/limits", &[]).await.status,
            StatusCode::OK
        );
    }

    // Redis comes back: checks until it answers again.
    redis.restart();
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        tally(send(addr, 5).await);
        let (m, _) = scrape(admin_addr).await;
        if series(&m, "ratewall_redis_failing", &[("limiter", "ip")]) == 0.0 {
            break;
        }
        assert!(Instant::now() < deadline, "Redis never answered again");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tally(send(addr, 10).await);

    // The counts match what the client saw.
    let (m, admin) = scrape(admin_addr).await;
    let count = |rule: &str, outcome: &str| {
        series(
            &m,
            "ratewall_http_requests_total",
            &[("rule", rule), ("outcome", outcome)],
        ) as u64
    };
    assert!(ok > 0 && limited > 0, "ok {ok}, limited {limited}");
    for r in ["ip", "key"] {
        // Every request matched both rules: each admitted request is in
        // both rules' `allowed`.
        assert_eq!(count(r, "allowed"), ok, "{r}");
        assert_eq!(rule(&admin, r)["allowed"].as_u64(), Some(ok), "{r}");
        assert_eq!(
            rule(&admin, r)["denied"].as_u64(),
            Some(count(r, "denied")),
            "{r}"
        );
    }
    // Each rejected request was denied by a rule (the per-key limit never
    // denies here: 600 a minute).
    assert_eq!(count("ip", "denied"), limited);
    assert_eq!(count("key", "denied"), 0);
    // The top offender is this client, in full, with every denial counted.
    let top = &rule(&admin, "ip")["top_offenders"][0];
    assert_eq!(top["key"], "127.0.0.1");
    assert_eq!(top["count"].as_u64(), Some(limited));
    // No label and no admin field holds the API key.
    let text = fetch(admin_addr, "GET", "/metrics", &[]).await.text();
    assert!(!text.contains("sk-live") && !admin.to_string().contains("sk-live"));
    // The Redis limiter's own series: fallback decisions while Redis was
    // down, Redis decisions before and after, calls and the breaker.
    let redis_allowed = |source: &str| {
        series(
            &m,
            "ratewall_redis_decisions_total",
            &[
                ("limiter", "ip"),
                ("source", source),
                ("outcome", "allowed"),
            ],
        )
    };
    assert!(redis_allowed("fallback") > 0.0 && redis_allowed("redis") > 0.0);
    assert!(series(&m, "ratewall_redis_calls_total", &[("backend", "redis")]) > 0.0);
    assert_eq!(
        series(&m, "ratewall_redis_breaker_state", &[("backend", "redis")]),
        0.0
    );
    // The public API does not serve the operators' routes (asked last: its
    // limits count these requests too, and may refuse them).
    for path in ["/admin/limits", "/metrics"] {
        let got = fetch(addr, "GET", path, &[]).await;
        assert!(
            matches!(
                got.status,
                StatusCode::NOT_FOUND | StatusCode::TOO_MANY_REQUESTS
            ),
            "{path} on the public port: {} {}",
            got.status,
            got.text()
        );
    }
    drop((stop, stop_admin));
    task.await.unwrap();
    admin_task.await.unwrap();
}

/// A busy port is one line that names the setting to change (the example
/// prints it and exits with status 1), not a panic with a backtrace.
#[tokio::test]
async fn a_busy_port_is_a_one_line_error_naming_the_setting() {
    let taken = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = taken.local_addr().unwrap().port();
    let e = server::bind(port, "PORT").await.unwrap_err();
    assert!(!e.contains('\n'), "{e}");
    assert!(
        e.contains(&format!("127.0.0.1:{port}")) && e.contains("set PORT"),
        "{e}"
    );
}

#[cfg(feature = "tracing")]
/// Issue 30's first day, against the example server: a login lockout on
/// Redis with a fail-closed policy beside a plain Redis rule; one login,
/// Redis killed, one login, Redis back, three logins. Then every failing
/// gauge is 0, the lockout rule's decisions are counted from Redis, and
/// the outage is at most two log lines per limiter (it was a gauge at 1 for
/// ever, no Redis decision counted, and one warning per request).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_day_ends_with_every_failing_gauge_at_0() {
    let logs = support::logs::Captured::default();
    tracing::subscriber::set_global_default(logs.subscriber()).unwrap();
    let mut redis = RedisServer::start();
    server::install_metrics();
    let limits =
        std::env::temp_dir().join(format!("ratewall-first-day-{}.toml", std::process::id()));
    std::fs::write(
        &limits,
        r#"
[[rules]]
name = "withblock"
key = "ip"
policy = "3/min sliding-log"
path_prefix = "/login"
block_for = "30s"
store = "redis"
on_failure = "closed"

[[rules]]
name = "noblock"
key = "ip"
policy = "100/s"
store = "redis"
"#,
    )
    .unwrap();
    let layer = server::limits_from_file_on_redis(&limits, &redis.url()).unwrap();
    std::fs::remove_file(&limits).unwrap();
    let (addr, stop, task) = serve("127.0.0.1:0", server::router(layer.clone())).await;
    let (admin_addr, stop_admin, admin_task) = serve("127.0.0.1:0", server::admin(layer)).await;
    let login = || fetch(addr, "POST", "/login", &[("x-password", "hunter2")]);
    let failing = |m: &HashMap<String, f64>, limiter: &str| {
        series(m, "ratewall_redis_failing", &[("limiter", limiter)])
    };

    assert_eq!(login().await.status, StatusCode::NO_CONTENT);
    redis.kill9();
    // Closed: the documented 503 while Redis is down.
    assert_eq!(login().await.status, StatusCode::SERVICE_UNAVAILABLE);
    let (m, _) = scrape(admin_addr).await;
    assert_eq!(failing(&m, "withblock"), 1.0);
    redis.restart();
    // The first login after the restart may meet the breaker's cool-down;
    // none after it is answered by anything but Redis.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut statuses = Vec::new();
    while statuses.len() < 3 {
        let got = login().await.status;
        if got == StatusCode::SERVICE_UNAVAILABLE {
            assert!(Instant::now() < deadline, "Redis never answered again");
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        }
        statuses.push(got);
    }
    // A fresh server (its data died with it): 3 a minute, so all three pass.
    assert_eq!(statuses, [StatusCode::NO_CONTENT; 3]);

    let (m, admin) = scrape(admin_addr).await;
    for limiter in ["withblock", "noblock"] {
        assert_eq!(failing(&m, limiter), 0.0, "{limiter} still failing");
        let from_redis = series(
            &m,
            "ratewall_redis_decisions_total",
            &[("limiter", limiter), ("source", "redis")],
        );
        assert!(
            from_redis >= 4.0,
            "{limiter}: {from_redis} decisions from Redis"
        );
        // One Failing and one Recovered line, nothing per request.
        let lines = logs
            .text()
            .lines()
            .filter(|l| l.contains(&format!("`{limiter}`")))
            .count();
        assert!(lines <= 2, "{limiter}: {lines} lines:\n{}", logs.text());
    }
    assert_eq!(rule(&admin, "withblock")["allowed"].as_u64(), Some(4));
    drop((stop, stop_admin));
    task.await.unwrap();
    admin_task.await.unwrap();
}
