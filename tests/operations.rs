//! What operators see (issue 22): metrics through the `metrics` facade
//! (checked with metrics-util's debugging recorder against what a real
//! client saw on loopback), each rule's top offenders (addresses in full,
//! header keys only as a fingerprint), and one store event per transition
//! when a real redis-server is killed and restarted.
#![cfg(all(feature = "axum", feature = "redis", feature = "metrics"))]

mod support;

use axum::routing::get;
use axum::Router;
use http::StatusCode;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use ratewall::http::{Headers, Key, RateLimitLayer, Rule};
use ratewall::redis::{DecisionSource, FailurePolicy, RedisBackend, RedisLimiter, StoreEvent};
use ratewall::{Policy, Rate, WhenFull};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use support::http_client::{fetch, serve};
use support::redis_server::RedisServer;

/// One snapshot of the recorder (taking it drains the recorder: counters
/// and gauges read 0 after, so each stage takes one and reads it).
struct Snap(Vec<(metrics_util::CompositeKey, DebugValue)>);

fn take(snap: &Snapshotter) -> Snap {
    Snap(
        snap.snapshot()
            .into_vec()
            .into_iter()
            .map(|(k, _, _, v)| (k, v))
            .collect(),
    )
}

impl Snap {
    /// The value of the metric `name` whose labels include all of `labels`.
    fn value(&self, name: &str, labels: &[(&str, &str)]) -> Option<&DebugValue> {
        self.0.iter().find_map(|(key, v)| {
            let k = key.key();
            let ok = k.name() == name
                && labels
                    .iter()
                    .all(|(l, want)| k.labels().any(|x| x.key() == *l && x.value() == *want));
            ok.then_some(v)
        })
    }

    fn count(&self, name: &str, labels: &[(&str, &str)]) -> u64 {
        match self.value(name, labels) {
            Some(DebugValue::Counter(n)) => *n,
            None => 0,
            other => panic!("{name} {labels:?} is not a counter: {other:?}"),
        }
    }

    fn gauge(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        match self.value(name, labels) {
            Some(DebugValue::Gauge(g)) => Some(g.into_inner()),
            _ => None,
        }
    }
}

/// A real server answering "ok" at `/` behind `layer`.
async fn serve_ok(
    layer: &RateLimitLayer,
) -> (
    std::net::SocketAddr,
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<()>,
) {
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer.clone());
    serve("127.0.0.1:0", app).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_metrics_and_top_offenders_match_what_the_client_saw() {
    let recorder = DebuggingRecorder::new();
    let snap = recorder.snapshotter();
    // Handles are registered at build: build under the recorder.
    let layer = metrics::with_local_recorder(&recorder, || {
        RateLimitLayer::builder()
            .rule(Rule::per_ip(
                "ip",
                Policy::token_bucket(Rate::per_minute(5)),
            ))
            .rule(Rule::new(
                "api-key",
                Key::header("x-api-key"),
                Policy::token_bucket(Rate::per_minute(3)),
            ))
            .build()
            .unwrap()
    });
    let (addr, stop, server) = serve_ok(&layer).await;
    let (mut ok, mut limited) = (0u64, 0u64);
    for i in 0..40 {
        // Two keys: a noisy one (3 in 4 requests) and a quiet one.
        let key = if i % 4 == 3 {
            "quiet-secret"
        } else {
            "noisy-secret-token"
        };
        let got = fetch(addr, "GET", "/", &[("x-api-key", key)]).await;
        match got.status {
            StatusCode::OK => ok += 1,
            StatusCode::TOO_MANY_REQUESTS => limited += 1,
            s => panic!("unexpected {s}"),
        }
    }
    drop(stop);
    server.await.unwrap();
    // The layer's own counters agree with the client.
    let stats = layer.stats();
    let (ip, api) = (&stats[0], &stats[1]);
    assert_eq!(ok, 5, "the per-IP limit admits its burst of 5");
    assert_eq!(limited, 35);
    assert_eq!((ip.allowed(), api.allowed()), (ok, ok), "{stats:?}");
    // Every rejected request was denied by at least one rule.
    assert!(ip.denied() + api.denied() >= limited, "{stats:?}");
    // And the metrics agree with the counters, label by label.
    let snap = take(&snap);
    for s in &stats {
        for (outcome, n) in [("allowed", s.allowed()), ("denied", s.denied())] {
            let got = snap.count(
                "ratewall_http_requests_total",
                &[("rule", s.name()), ("outcome", outcome)],
            );
            assert_eq!(got, n, "{} {outcome}", s.name());
        }
    }
    // No label holds a key.
    for (key, _) in &snap.0 {
        for l in key.key().labels() {
            assert!(
                !l.value().contains("secret") && l.value() != "127.0.0.1",
                "{l:?}"
            );
        }
    }
    assert!(snap
        .gauge("ratewall_http_table_capacity", &[("rule", "ip")])
        .is_some_and(|c| c >= 1.0));
    assert_eq!(
        snap.gauge("ratewall_http_table_keys", &[("rule", "ip")]),
        Some(1.0)
    );
    // Top offenders: the address in full, with its exact count (one key,
    // far below the summary's 64: no error).
    let top = ip.top_offenders();
    assert_eq!(top.len(), 1, "{top:?}");
    assert_eq!(
        (top[0].key(), top[0].count(), top[0].error()),
        ("127.0.0.1", ip.denied(), 0)
    );
    assert_eq!(ip.offender_denials(), ip.denied());
    // The API keys only as fingerprints: never the key itself.
    for o in api.top_offenders() {
        assert!(o.key().starts_with('#') && o.key().len() == 17, "{o:?}");
        assert!(!o.key().contains("secret"));
    }
    assert_eq!(
        api.top_offenders().iter().map(|o| o.count()).sum::<u64>(),
        api.denied()
    );
}

type Seen = Arc<Mutex<Vec<StoreEvent>>>;

fn recording() -> (Seen, impl Fn(&StoreEvent) + Send + Sync + 'static) {
    let seen: Seen = Arc::default();
    let s = seen.clone();
    (seen, move |e: &StoreEvent| {
        s.lock().unwrap().push(e.clone())
    })
}

/// Issue 22 item 3: a Redis outage under load is one `Failing` event and
/// one `Recovered` event per limiter, never one per check, whatever the
/// failure policy; the gauge and the decision metrics follow.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_is_one_failing_and_one_recovered_event() {
    let mut server = RedisServer::start();
    let recorder = DebuggingRecorder::new();
    let snap = recorder.snapshotter();
    let cool_down = Duration::from_millis(200);
    let policies = [
        ("open", FailurePolicy::Open),
        ("closed", FailurePolicy::Closed),
        ("share", FailurePolicy::FallbackShare { instances: 2 }),
    ];
    let mut limiters = Vec::new();
    let mut seen = Vec::new();
    {
        // Built under the local recorder; the handles keep recording after.
        let _guard = metrics::set_default_local_recorder(&recorder);
        let redis = RedisBackend::builder(server.url())
            .name("main")
            .timeout(Duration::from_millis(100))
            .breaker(3, cool_down)
            .build()
            .unwrap();
        for (name, failure) in policies {
            let (events, hook) = recording();
            limiters.push(
                RedisLimiter::builder(Policy::token_bucket(Rate::per_second(1_000_000)), &redis)
                    .prefix("ops")
                    .name(name)
                    .on_failure(failure)
                    .on_store_event(hook)
                    .build()
                    .unwrap(),
            );
            seen.push(events);
        }
    }
    for l in &limiters {
        assert_eq!(
            l.check_key(b"k").await.unwrap().source(),
            DecisionSource::Redis
        );
        assert!(!l.is_failing_over());
    }
    assert!(seen.iter().all(|s| s.lock().unwrap().is_empty()));

    server.kill9();
    for _ in 0..1000 {
        for l in &limiters {
            match l.check_key(b"k").await {
                Ok(d) => assert_ne!(d.source(), DecisionSource::Redis),
                Err(e) => assert!(l.failure_policy() == FailurePolicy::Closed, "{e}"),
            }
        }
    }
    let outage = take(&snap);
    for (l, s) in limiters.iter().zip(&seen) {
        assert!(l.is_failing_over());
        let s = s.lock().unwrap();
        assert_eq!(s.len(), 1, "{}: {s:?}", l.name());
        assert!(matches!(&s[0], StoreEvent::Failing { limiter, .. } if limiter == l.name()));
        assert_eq!(
            outage.gauge("ratewall_redis_failing", &[("limiter", l.name())]),
            Some(1.0)
        );
    }
    assert_eq!(
        outage.gauge("ratewall_redis_breaker_state", &[("backend", "main")]),
        Some(1.0)
    );

    server.restart();
    // Redis answers again within a cool-down or so; check until it does.
    let deadline = Instant::now() + Duration::from_secs(10);
    for l in &limiters {
        while l.check_key(b"k").await.map(|d| d.source()).ok() != Some(DecisionSource::Redis) {
            assert!(Instant::now() < deadline, "{} never recovered", l.name());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        for _ in 0..100 {
            let _ = l.check_key(b"k").await;
        }
    }
    let after = take(&snap);
    for (l, s) in limiters.iter().zip(&seen) {
        assert!(!l.is_failing_over());
        let s = s.lock().unwrap();
        assert_eq!(s.len(), 2, "{}: {s:?}", l.name());
        match &s[1] {
            StoreEvent::Recovered {
                limiter,
                answered_locally,
                policy,
                ..
            } => {
                assert_eq!(limiter, l.name());
                assert_eq!(*policy, l.failure_policy());
                assert!(*answered_locally >= 1000, "{answered_locally}");
            }
            e => panic!("{e:?}"),
        }
    }
    // The decision metrics say where the decisions came from (summed over
    // both snapshots).
    let total = |name: &str, labels: &[(&str, &str)]| {
        outage.count(name, labels) + after.count(name, labels)
    };
    let by = |limiter: &str, source: &str| {
        total(
            "ratewall_redis_decisions_total",
            &[
                ("limiter", limiter),
                ("source", source),
                ("outcome", "allowed"),
            ],
        )
    };
    assert!(by("open", "fail_open") >= 1000);
    assert!(by("share", "fallback") >= 1000);
    assert!(by("open", "redis") >= 101 && by("share", "redis") >= 101);
    assert!(total("ratewall_redis_unavailable_total", &[("limiter", "closed")]) >= 1000);
    assert!(
        outage.count(
            "ratewall_redis_call_errors_total",
            &[("backend", "main"), ("kind", "breaker_open")]
        ) > 0
    );
    assert!(total("ratewall_redis_calls_total", &[("backend", "main")]) >= 3 * 101);
    assert!(matches!(
        after.value("ratewall_redis_call_seconds", &[("backend", "main")]),
        Some(DebugValue::Histogram(h)) if !h.is_empty()
    ));
}

/// A lease limiter's decisions are counted under its `RedisLimiter`'s name:
/// the lease script's answers as `redis`, admissions from a held lease as
/// `lease`, so the series add up to the checks made.
#[tokio::test]
async fn a_lease_limiter_counts_its_local_admissions_as_lease() {
    use ratewall::redis::{RedisLeaseLimiter, RedisLeaseOptions};
    let server = RedisServer::start();
    let recorder = DebuggingRecorder::new();
    let snap = recorder.snapshotter();
    let leased = {
        let _guard = metrics::set_default_local_recorder(&recorder);
        let redis = RedisBackend::builder(server.url()).build().unwrap();
        let limiter = RedisLimiter::builder(Policy::token_bucket(Rate::per_second(1_000)), &redis)
            .prefix("ops-lease")
            .name("leased")
            .build()
            .unwrap();
        RedisLeaseLimiter::new(limiter, RedisLeaseOptions::new()).unwrap()
    };
    let mut by_source = std::collections::HashMap::new();
    for _ in 0..200 {
        let d = leased.check_key(b"k").await.unwrap();
        assert!(d.is_allowed());
        *by_source.entry(d.source()).or_insert(0u64) += 1;
    }
    let local = by_source.get(&DecisionSource::Lease).copied().unwrap_or(0);
    let remote = by_source.get(&DecisionSource::Redis).copied().unwrap_or(0);
    assert!(local > 0 && remote > 0, "{by_source:?}");
    let s = take(&snap);
    let count = |source: &str| {
        s.count(
            "ratewall_redis_decisions_total",
            &[
                ("limiter", "leased"),
                ("source", source),
                ("outcome", "allowed"),
            ],
        )
    };
    assert_eq!((count("lease"), count("redis")), (local, remote));
}

/// A rule with premium tiers has a table per tier: each reports its own
/// capacity under the rule's name and its tier (`""`: the rule's own).
#[test]
fn a_tiered_rule_reports_each_table_under_its_tier() {
    let recorder = DebuggingRecorder::new();
    let snap = recorder.snapshotter();
    let _layer = {
        let _guard = metrics::set_default_local_recorder(&recorder);
        let rule = Rule::per_header(
            "api",
            "x-api-key",
            Policy::token_bucket(Rate::per_minute(10)),
        )
        .tier("gold", Policy::token_bucket(Rate::per_minute(100)))
        .tier_by_header("x-plan")
        .max_keys(1_000);
        RateLimitLayer::builder().rule(rule).build().unwrap()
    };
    let s = take(&snap);
    let capacity = |tier: &str| {
        s.gauge(
            "ratewall_http_table_capacity",
            &[("rule", "api"), ("tier", tier)],
        )
    };
    assert_eq!(
        (capacity(""), capacity("gold")),
        (Some(1_000.0), Some(1_000.0))
    );
}

/// A full table's evictions are counted whether or not the layer writes
/// headers (a layer without headers keeps no decisions for them, but the
/// metrics still read each admitted request's).
#[tokio::test]
async fn evictions_are_counted_whether_or_not_the_layer_writes_headers() {
    let mut counted = Vec::new();
    for headers in [Headers::default(), Headers::None] {
        let recorder = DebuggingRecorder::new();
        let snap = recorder.snapshotter();
        let layer = metrics::with_local_recorder(&recorder, || {
            RateLimitLayer::builder()
                .headers(headers)
                .rule(
                    Rule::per_header(
                        "api",
                        "x-api-key",
                        Policy::token_bucket(Rate::per_minute(10)),
                    )
                    .max_keys(2)
                    .when_full(WhenFull::EvictLeastRecent),
                )
                .build()
                .unwrap()
        });
        let (addr, stop, server) = serve_ok(&layer).await;
        for key in ["k1", "k2", "k3", "k4", "k5", "k6"] {
            let got = fetch(addr, "GET", "/", &[("x-api-key", key)]).await;
            assert_eq!(got.status, StatusCode::OK);
        }
        drop(stop);
        server.await.unwrap();
        counted.push(take(&snap).count("ratewall_http_evictions_total", &[("rule", "api")]));
    }
    assert!(counted[0] >= 1, "{counted:?}");
    assert_eq!(counted[0], counted[1], "with headers, without");
}

/// Concurrency rules (issue 30): an adaptive rule's current maximum as
/// `RuleStats::max_in_flight` and as the gauge `ratewall_http_concurrency_max`
/// (set when a request's acquire finds it changed), following the limit as
/// slow responses shrink it; a table's capacity only where there is a table
/// (a per-key rule's, not one limit shared by every request).
#[tokio::test]
async fn concurrency_rules_report_their_maximum_and_only_real_tables() {
    use ratewall::{Adaptive, ManualClock};
    use tower::ServiceExt;
    // One request through `app` in process, its body read to the end (a
    // concurrency rule's `RateLimit` item has no `t`: no field check).
    async fn call(app: &Router) -> StatusCode {
        let mut req = http::Request::new(axum::body::Body::empty());
        req.extensions_mut()
            .insert(axum::extract::ConnectInfo(std::net::SocketAddr::from((
                [192, 0, 2, 1],
                40_000,
            ))));
        let res = app.clone().oneshot(req).await.unwrap();
        let status = res.status();
        let _ = http_body_util::BodyExt::collect(res.into_body()).await;
        status
    }
    let recorder = DebuggingRecorder::new();
    let snap = recorder.snapshotter();
    let clock = ManualClock::new();
    let layer = metrics::with_local_recorder(&recorder, || {
        RateLimitLayer::builder()
            .clock(clock.clone())
            .rule(
                Rule::concurrent("db", Key::global(), 20).adaptive(Adaptive::aimd(
                    2,
                    40,
                    Duration::from_millis(10),
                )),
            )
            .rule(Rule::concurrent("per-ip", Key::ip(), 3).max_keys(500))
            .build()
            .unwrap()
    });
    let s = take(&snap);
    assert_eq!(
        s.gauge("ratewall_http_concurrency_max", &[("rule", "db")]),
        Some(20.0)
    );
    assert_eq!(
        s.gauge("ratewall_http_concurrency_max", &[("rule", "per-ip")]),
        None
    );
    let capacity = |rule: &str| s.gauge("ratewall_http_table_capacity", &[("rule", rule)]);
    assert_eq!((capacity("db"), capacity("per-ip")), (None, Some(500.0)));
    assert_eq!(
        layer
            .stats()
            .iter()
            .map(|r| r.max_in_flight())
            .collect::<Vec<_>>(),
        vec![Some(20), Some(3)]
    );
    // Every response takes 50 ms, past the 10 ms AIMD threshold: the
    // maximum shrinks.
    let slow = clock.clone();
    let app = Router::new()
        .route(
            "/",
            get(move || {
                slow.advance(Duration::from_millis(50));
                async { "ok" }
            }),
        )
        .layer(layer.clone());
    for _ in 0..60 {
        assert_eq!(call(&app).await, StatusCode::OK);
    }
    let shrunk = layer.stats()[0].max_in_flight().unwrap();
    assert!(shrunk < 20, "{shrunk}");
    // The next request's acquire reports the maximum it met.
    assert_eq!(call(&app).await, StatusCode::OK);
    let s = take(&snap);
    assert_eq!(
        s.gauge("ratewall_http_concurrency_max", &[("rule", "db")]),
        Some(shrunk as f64)
    );
}

/// Redis out of memory is reported like an outage: calls counted as
/// `outage` errors, the breaker open, the limiter's `failing` gauge at 1;
/// a key that holds another policy's data is a `reply` error, and the
/// breaker and the gauge stay at 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_out_of_memory_redis_is_reported_like_an_outage() {
    let server = RedisServer::start_with(&["--maxmemory-policy", "noeviction"]);
    let recorder = DebuggingRecorder::new();
    let snap = recorder.snapshotter();
    let (oom, foreign) = {
        let _guard = metrics::set_default_local_recorder(&recorder);
        let build = |backend: &str, name: &str| {
            let redis = RedisBackend::builder(server.url())
                .name(backend)
                .timeout(Duration::from_millis(200))
                .breaker(3, Duration::from_secs(5))
                .build()
                .unwrap();
            RedisLimiter::builder(Policy::token_bucket(Rate::per_second(10)), &redis)
                .name(name)
                .on_failure(FailurePolicy::Open)
                .build()
                .unwrap()
        };
        (build("full", "oom"), build("mixed", "foreign"))
    };
    // The foreign key first, while Redis has room.
    server.cmd(&["HSET", "ratewall:foreign:k", "f", "v"]);
    for _ in 0..5 {
        assert!(foreign.check_key(b"k").await.is_err());
    }
    support::store_faults::fill_until_oom(&server);
    for i in 0..5 {
        let key = format!("fresh{i}");
        let d = oom.check_key(key.as_bytes()).await.unwrap();
        assert_eq!(d.source(), DecisionSource::FailOpen);
    }
    let s = take(&snap);
    let errors = |backend, kind| {
        s.count(
            "ratewall_redis_call_errors_total",
            &[("backend", backend), ("kind", kind)],
        )
    };
    // Three calls reached Redis (OOM), then the breaker was open.
    assert_eq!(errors("full", "outage"), 3);
    assert_eq!(errors("full", "breaker_open"), 2);
    assert_eq!(errors("full", "reply"), 0);
    assert_eq!(
        s.gauge("ratewall_redis_breaker_state", &[("backend", "full")]),
        Some(1.0)
    );
    assert_eq!(
        s.gauge("ratewall_redis_failing", &[("limiter", "oom")]),
        Some(1.0)
    );
    assert_eq!(errors("mixed", "reply"), 5);
    assert_eq!(errors("mixed", "outage"), 0);
    assert_eq!(
        s.gauge("ratewall_redis_breaker_state", &[("backend", "mixed")]),
        Some(0.0)
    );
    assert_ne!(
        s.gauge("ratewall_redis_failing", &[("limiter", "foreign")]),
        Some(1.0)
    );
}

/// The first day's report (issue 30): a login lockout on Redis (`withblock`,
/// `3/min sliding-log`, `block_for` 30 s) beside a plain Redis rule
/// (`noblock`), through the layer: one login, Redis killed, one login,
/// Redis back, three logins. Both limiters report one `Failing` and one
/// `Recovered`, their failing gauges end at 0, and the lockout rule's
/// decisions count as Redis's. (The lockout script skipped the limiters'
/// accounting: never `Recovered`, the gauge at 1 for ever, no decision
/// counted.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_lockout_accounts_like_any_redis_rule_and_recovers() {
    use ratewall::Window;
    use support::http_client::call;
    let mut server = RedisServer::start();
    let recorder = DebuggingRecorder::new();
    let snap = recorder.snapshotter();
    let (with_seen, with_hook) = recording();
    let (no_seen, no_hook) = recording();
    let layer = {
        let _guard = metrics::set_default_local_recorder(&recorder);
        let redis = RedisBackend::builder(server.url())
            .name("first-day")
            .timeout(Duration::from_millis(100))
            .breaker(3, Duration::from_millis(200))
            .build()
            .unwrap();
        let limiter = |name: &str, policy, hook| {
            RedisLimiter::builder(policy, &redis)
                .prefix("day1")
                .name(name)
                .on_failure(FailurePolicy::Closed)
                .on_store_event(hook)
                .build()
                .unwrap()
        };
        let withblock = limiter(
            "withblock",
            Policy::sliding_window_log(Window::per_minute(3)),
            Box::new(with_hook) as Box<dyn Fn(&StoreEvent) + Send + Sync>,
        );
        let noblock = limiter(
            "noblock",
            Policy::token_bucket(Rate::per_second(100)),
            Box::new(no_hook),
        );
        RateLimitLayer::builder()
            .rule(
                Rule::redis(Key::ip(), withblock)
                    .on_path_prefix("/login")
                    .block_for(Duration::from_secs(30)),
            )
            .rule(Rule::redis(Key::ip(), noblock))
            .build()
            .unwrap()
    };
    let app = Router::new()
        .route("/login", get(|| async { "welcome" }))
        .layer(layer);
    let login = || call(&app, "GET", "/login", "192.0.2.1", &[]);
    assert_eq!(login().await.status, StatusCode::OK);
    server.kill9();
    assert_eq!(login().await.status, StatusCode::SERVICE_UNAVAILABLE);
    server.restart();
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut ok = 0;
    while ok < 2 {
        match login().await.status {
            StatusCode::OK => ok += 1,
            StatusCode::SERVICE_UNAVAILABLE => {
                assert!(Instant::now() < deadline, "never recovered");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            s => panic!("{s}"),
        }
    }
    let s = take(&snap);
    for (name, seen) in [("withblock", &with_seen), ("noblock", &no_seen)] {
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 2, "{name}: {seen:?}");
        assert!(
            matches!(&seen[0], StoreEvent::Failing { .. }),
            "{name}: {seen:?}"
        );
        assert!(
            matches!(&seen[1], StoreEvent::Recovered { .. }),
            "{name}: {seen:?}"
        );
        assert_eq!(
            s.gauge("ratewall_redis_failing", &[("limiter", name)]),
            Some(0.0),
            "{name}"
        );
        assert!(
            s.count(
                "ratewall_redis_decisions_total",
                &[
                    ("limiter", name),
                    ("source", "redis"),
                    ("outcome", "allowed")
                ]
            ) >= 3,
            "{name}: decisions by Redis counted"
        );
    }
}
