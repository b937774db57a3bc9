//! An axum API with layered limits: a generous one per client IP, one per
//! API key, and a strict one on `POST /login` that counts only failed
//! attempts and hides its numbers.
//!
//! `cargo run --release --example server --features axum`, then
//! `curl -i http://127.0.0.1:3000/` (`PORT` picks another port).
//!
//! The same limits written as configuration are in
//! `examples/http_limits.toml`; `RATEWALL_LIMITS` names a file to serve
//! instead of the built-in limits (needs the `serde` feature too):
//! `RATEWALL_LIMITS=examples/http_limits.toml cargo run --example server --features axum,serde`.
//!
//! The limits are local (in this process) by default. With the `redis`
//! feature, `RATEWALL_REDIS_URL` names a Redis server that holds the per-IP
//! and per-API-key limits, shared by every instance of the server (the
//! strict login rule stays local, checked in the same all-or-nothing step):
//! `RATEWALL_REDIS_URL=redis://127.0.0.1:6379 cargo run --example server --features axum,redis`.
//! If Redis stops answering, each instance limits with its local share.
//!
//! Operators' routes are served on a second listener, the admin port,
//! bound to `127.0.0.1` only (`ADMIN_PORT`, default 3001), never on the
//! public API's router: `GET /admin/limits` (JSON: each rule's counters and
//! top offenders, which name client addresses) and, with the `metrics`
//! feature, `GET /metrics` (Prometheus text, through
//! `metrics-exporter-prometheus`): `curl http://127.0.0.1:3001/admin/limits`.
//! Scrapes are never rate limited, and a client of the API cannot reach
//! them. With the `tracing`
//! feature the layer's warnings and the store's failover events go to
//! `tracing`, so `main` installs a subscriber (`RUST_LOG` is not read: all
//! events at `info` and above are printed).
//!
//! With both set (features `serde` and `redis`), the file's rules that say
//! `store = "redis"` are kept in that Redis, the others locally
//! (`examples/http_limits_redis.toml` is the Redis variant of the limits):
//! `RATEWALL_LIMITS=examples/http_limits_redis.toml RATEWALL_REDIS_URL=redis://127.0.0.1:6379 cargo run --example server --features axum,serde,redis`.

use axum::http::{HeaderMap, StatusCode};
use axum::routing::{get, post};
use axum::Router;
use ratewall::http::{ClientIp, RateLimitLayer, Rule};
use ratewall::{Clock, Policy, Rate, Window};
use std::net::SocketAddr;

/// The limits: per IP 60/min (bursts of 20), per API key 600/min, and 5
/// failed logins per minute per IP.
pub fn limits<C: Clock + Clone + 'static>(clock: C) -> RateLimitLayer<C> {
    RateLimitLayer::builder()
        .clock(clock)
        // Direct connections; behind a load balancer use
        // `ClientIp::behind_proxies([...])` with its network. A chain that
        // names no believable client then gets 400 from the per-IP rule
        // (`Rule::when_client_unknown` keys it by the proxy instead).
        .client_ip(ClientIp::peer())
        .skip(|_, uri, _| uri.path() == "/health")
        .rule(Rule::per_ip(
            "ip",
            Policy::token_bucket(Rate::per_minute(60).burst(20)),
        ))
        .rule(Rule::per_header(
            "key",
            "x-api-key",
            Policy::sliding_window_counter(Window::per_minute(600)),
        ))
        .rule(
            Rule::per_ip("login", Policy::sliding_window_log(Window::per_minute(5)))
                .on_method(axum::http::Method::POST)
                .on_path_prefix("/login")
                .count_failures_only()
                .hide_headers(),
        )
        .build()
        .expect("valid limits")
}

/// The same limits with the per-IP and per-API-key ones in Redis at `url`
/// (feature `redis`). Every instance that names the same server counts
/// against one limit; when Redis cannot answer within 50 ms, each instance
/// falls back to its own copy of the limit.
#[cfg(feature = "redis")]
#[allow(dead_code)] // the demo includes this file without using it
pub fn redis_limits(url: &str) -> Result<RateLimitLayer, Box<dyn std::error::Error>> {
    use ratewall::http::Key;
    use ratewall::redis::{FailurePolicy, RedisBackend, RedisLimiter};
    let redis = RedisBackend::builder(url)
        .timeout(std::time::Duration::from_millis(50))
        .build()?;
    let shared = |name: &str, policy: Policy| {
        RedisLimiter::builder(policy, &redis)
            .name(name)
            .on_failure(FailurePolicy::FallbackShare { instances: 1 })
            .build()
    };
    let layer = RateLimitLayer::builder()
        .client_ip(ClientIp::peer())
        .skip(|_, uri, _| uri.path() == "/health")
        .rule(Rule::redis(
            Key::ip(),
            shared("ip", Policy::token_bucket(Rate::per_minute(60).burst(20)))?,
        ))
        .rule(Rule::redis(
            Key::header("x-api-key"),
            shared(
                "key",
                Policy::sliding_window_counter(Window::per_minute(600)),
            )?,
        ))
        .rule(
            Rule::per_ip("login", Policy::sliding_window_log(Window::per_minute(5)))
                .on_method(axum::http::Method::POST)
                .on_path_prefix("/login")
                .count_failures_only()
                .hide_headers(),
        )
        .build()?;
    Ok(layer)
}

/// The limits of a configuration file (`ratewall::http::LayerConfig` in
/// TOML, such as `examples/http_limits.toml`), with the same `/health` skip.
#[cfg(feature = "serde")]
pub fn limits_from_file<C: Clock + Clone + 'static>(
    path: &std::path::Path,
    clock: C,
) -> Result<RateLimitLayer<C>, Box<dyn std::error::Error>> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let config: ratewall::http::LayerConfig =
        toml::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    let layer = config
        .to_builder()?
        .clock(clock)
        .skip(|_, uri, _| uri.path() == "/health")
        .build()?;
    Ok(layer)
}

/// The limits of a configuration file whose rules may keep their state in
/// Redis (`store = "redis"`, such as `examples/http_limits_redis.toml`), on
/// the Redis at `url` (features `serde` and `redis`).
#[cfg(all(feature = "serde", feature = "redis"))]
pub fn limits_from_file_on_redis(
    path: &std::path::Path,
    url: &str,
) -> Result<RateLimitLayer, Box<dyn std::error::Error>> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let config: ratewall::http::LayerConfig =
        toml::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    let redis = ratewall::redis::RedisBackend::builder(url)
        .timeout(std::time::Duration::from_millis(50))
        .build()?;
    let layer = config
        .to_builder_with_redis(&redis)?
        .skip(|_, uri, _| uri.path() == "/health")
        .build()?;
    Ok(layer)
}

/// The public API behind the limits. The operators' routes are not on
/// it: serve [`admin`] on a listener of its own, on a private address.
pub fn router<C: Clock + Clone + 'static>(limits: RateLimitLayer<C>) -> Router {
    api(limits)
}

/// The operators' routes, for the admin port only (not rate-limited, and
/// not for clients: the top offenders name client addresses):
/// `/admin/limits` and (feature `metrics`, once [`install_metrics`] ran)
/// `/metrics`.
pub fn admin<C: Clock + Clone + 'static>(limits: RateLimitLayer<C>) -> Router {
    let router = Router::new().route(
        "/admin/limits",
        get(move || {
            let stats = limits.stats();
            async move { axum::Json(limits_json(&stats)) }
        }),
    );
    #[cfg(feature = "metrics")]
    let router = router.route(
        "/metrics",
        get(|| async {
            match PROMETHEUS.get() {
                Some(handle) => (StatusCode::OK, handle.render()),
                None => (
                    StatusCode::NOT_FOUND,
                    "no metrics recorder installed\n".to_string(),
                ),
            }
        }),
    );
    router
}

/// Each rule's counters and top offenders, as JSON.
pub fn limits_json(stats: &[ratewall::http::RuleStats]) -> serde_json::Value {
    let rules: Vec<serde_json::Value> = stats
        .iter()
        .map(|s| {
            serde_json::json!({
                "name": s.name(),
                "allowed": s.allowed(),
                "denied": s.denied(),
                "shadow_denied": s.shadow_denied(),
                "missing_key": s.missing_key(),
                "unknown_client": s.unknown_client(),
                "errors": s.errors(),
                "fallbacks": s.fallbacks(),
                "untracked": s.untracked(),
                "refunded": s.refunded(),
                "offender_denials": s.offender_denials(),
                "top_offenders": s.top_offenders().iter().take(10).map(|o| serde_json::json!({
                    "key": o.key(),
                    "count": o.count(),
                    "error": o.error(),
                })).collect::<Vec<_>>(),
            })
        })
        .collect();
    serde_json::json!({ "rules": rules })
}

/// The Prometheus recorder's handle, once installed.
#[cfg(feature = "metrics")]
static PROMETHEUS: std::sync::OnceLock<metrics_exporter_prometheus::PrometheusHandle> =
    std::sync::OnceLock::new();

/// Installs the Prometheus recorder (feature `metrics`), once per process:
/// before the limits are built, which register their metrics then.
#[cfg(feature = "metrics")]
pub fn install_metrics() {
    PROMETHEUS.get_or_init(|| {
        metrics_exporter_prometheus::PrometheusBuilder::new()
            .install_recorder()
            .expect("no other metrics recorder installed")
    });
}

/// The API itself, behind the limits.
fn api<C: Clock + Clone + 'static>(limits: RateLimitLayer<C>) -> Router {
    Router::new()
        .route("/", get(|| async { "hello\n" }))
        .route("/health", get(|| async { "ok\n" }))
        .route(
            "/items",
            get(|| async { axum::Json(serde_json::json!(["apple", "pear"])) }),
        )
        .route("/login", post(login))
        .layer(limits)
}

async fn login(headers: HeaderMap) -> StatusCode {
    if headers.get("x-password").is_some_and(|p| p == "hunter2") {
        StatusCode::NO_CONTENT
    } else {
        StatusCode::UNAUTHORIZED
    }
}

#[allow(dead_code)] // the demo includes this file for `limits` and `router`
#[tokio::main]
async fn main() {
    // A library's warnings go to `tracing` when its feature is on: they
    // reach the person running the server only through a subscriber.
    #[cfg(feature = "tracing")]
    tracing_subscriber::fmt()
        .with_max_level(tracing::Level::INFO)
        // Colours for a terminal only, never escape codes in a log file.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stdout()))
        .init();
    // Before the limits are built: they register their metrics then.
    #[cfg(feature = "metrics")]
    install_metrics();
    let port: u16 = std::env::var("PORT")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(3000);
    let clock = ratewall::DefaultClock::default();
    let redis_url = std::env::var("RATEWALL_REDIS_URL").ok();
    let layer = match std::env::var_os("RATEWALL_LIMITS") {
        #[cfg(feature = "redis")]
        None if redis_url.is_some() => {
            let url = redis_url.as_deref().unwrap_or_default();
            match redis_limits(url) {
                Ok(layer) => {
                    println!("per-IP and per-key limits in Redis at {url}");
                    layer
                }
                Err(e) => {
                    eprintln!("RATEWALL_REDIS_URL: {e}");
                    std::process::exit(2);
                }
            }
        }
        #[cfg(not(feature = "redis"))]
        None if redis_url.is_some() => {
            eprintln!(
                "RATEWALL_REDIS_URL is set, but Redis-backed limits need the `redis` feature: \
                 cargo run --example server --features axum,redis"
            );
            std::process::exit(2);
        }
        None => limits(clock),
        #[cfg(all(feature = "serde", feature = "redis"))]
        Some(path) if redis_url.is_some() => {
            let url = redis_url.as_deref().unwrap_or_default();
            match limits_from_file_on_redis(std::path::Path::new(&path), url) {
                Ok(layer) => {
                    println!(
                        "limits from {}, its Redis rules in Redis at {url}",
                        path.to_string_lossy()
                    );
                    layer
                }
                Err(e) => {
                    eprintln!("RATEWALL_LIMITS with RATEWALL_REDIS_URL: {e}");
                    std::process::exit(2);
                }
            }
        }
        #[cfg(feature = "serde")]
        Some(path) => match limits_from_file(std::path::Path::new(&path), clock) {
            Ok(layer) => {
                println!("limits from {}", path.to_string_lossy());
                layer
            }
            Err(e) => {
                eprintln!("RATEWALL_LIMITS: {e}");
                if redis_url.is_none() {
                    eprintln!(
                        "(a file with `store = \"redis\"` rules needs RATEWALL_REDIS_URL too, \
                         and the `redis` feature)"
                    );
                }
                std::process::exit(2);
            }
        },
        #[cfg(not(feature = "serde"))]
        Some(_) => {
            eprintln!(
                "RATEWALL_LIMITS is set, but reading limits from a file needs the `serde` feature: \
                 cargo run --example server --features axum,serde"
            );
            std::process::exit(2);
        }
    };
    let admin_port: u16 = std::env::var("ADMIN_PORT")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(3001);
    let listen = |port, env| async move {
        bind(port, env).await.unwrap_or_else(|e| {
            eprintln!("{e}");
            std::process::exit(1);
        })
    };
    let listener = listen(port, "PORT").await;
    // The operators' routes: loopback only, whatever address the API uses.
    let admin_listener = listen(admin_port, "ADMIN_PORT").await;
    println!("listening on http://{}", listener.local_addr().unwrap());
    println!(
        "operators: http://{}/admin/limits, and /metrics with the `metrics` feature",
        admin_listener.local_addr().unwrap()
    );
    let public = axum::serve(
        listener,
        router(layer.clone()).into_make_service_with_connect_info::<SocketAddr>(),
    );
    let private = axum::serve(admin_listener, admin(layer).into_make_service());
    let (public, private) = tokio::join!(public, private);
    for (what, served) in [("server", public), ("admin server", private)] {
        if let Err(e) = served {
            eprintln!("{what}: {e}");
            std::process::exit(1);
        }
    }
}

/// A listener on 127.0.0.1:`port`, or the one line `main` prints before it
/// exits with status 1: what failed and which setting (`env`) to change (a
/// busy port is a user's mistake, not a panic with a backtrace).
pub async fn bind(port: u16, env: &str) -> Result<tokio::net::TcpListener, String> {
    tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .map_err(|e| format!("cannot listen on 127.0.0.1:{port} ({e}): set {env} to a free port"))
}
