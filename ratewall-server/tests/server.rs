//! The real binary over TCP: gRPC from Envoy's published protos, `/json`,
//! health, reload, shutdown, concurrency and hostile requests.

mod support;

use std::time::Duration;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use support::{call, http, request, ConfigDir, Server};

const CONFIG: &str = r#"
domain: test
descriptors:
  - key: user
    rate_limit:
      unit: minute
      requests_per_unit: 3
  - key: api_key
    rate_limit:
      name: keys
      policy: "5/min"
  - key: path
    value: /health
    rate_limit:
      unlimited: true
  - key: plan
    value: trial
    shadow_mode: true
    rate_limit:
      unit: minute
      requests_per_unit: 1
"#;

const OK: i32 = Code::Ok as i32;
const OVER: i32 = Code::OverLimit as i32;

#[tokio::test]
async fn grpc_answers_as_envoyproxy_ratelimit_does() {
    let dir = ConfigDir::new(&[("config.yaml", CONFIG)]);
    let server = Server::start(&dir.path, &[]);
    let mut c = server.client().await;

    // Three a minute: remaining 2, 1, 0, then over.
    for left in [2, 1, 0] {
        let r = call(&mut c, request("test", &[&[("user", "ada")]], 0)).await;
        assert_eq!(r.overall_code, OK);
        let s = &r.statuses[0];
        assert_eq!((s.code, s.limit_remaining), (OK, left));
        let limit = s.current_limit.as_ref().unwrap();
        assert_eq!(
            (limit.requests_per_unit, limit.unit),
            (3, Unit::Minute as i32)
        );
        let reset = s.duration_until_reset.unwrap();
        assert!((0..=60).contains(&reset.seconds), "{reset:?}");
    }
    let r = call(&mut c, request("test", &[&[("user", "ada")]], 1)).await;
    assert_eq!((r.overall_code, r.statuses[0].code), (OVER, OVER));
    assert_eq!(r.statuses[0].limit_remaining, 0);
    let retry = r.statuses[0].duration_until_reset.unwrap();
    assert!(retry.seconds > 0 || retry.nanos > 0, "{retry:?}");
    // Another user has a counter of its own.
    let r = call(&mut c, request("test", &[&[("user", "bob")]], 1)).await;
    assert_eq!(r.overall_code, OK);

    // No limit matches: OK with no current limit.
    let r = call(&mut c, request("test", &[&[("nothing", "here")]], 1)).await;
    assert_eq!(r.overall_code, OK);
    assert_eq!(r.statuses[0].current_limit, None);
    let r = call(&mut c, request("other-domain", &[&[("user", "ada")]], 1)).await;
    assert_eq!(
        (r.overall_code, r.statuses[0].current_limit.is_none()),
        (OK, true)
    );

    // Unlimited: always OK, remaining u32::MAX.
    for _ in 0..10 {
        let r = call(&mut c, request("test", &[&[("path", "/health")]], 1)).await;
        assert_eq!(
            (r.statuses[0].code, r.statuses[0].limit_remaining),
            (OK, u32::MAX)
        );
    }

    // Shadow mode: over its limit of 1, yet OK.
    for _ in 0..3 {
        let r = call(&mut c, request("test", &[&[("plan", "trial")]], 1)).await;
        assert_eq!((r.overall_code, r.statuses[0].code), (OK, OK));
    }

    // Several descriptors: each counted on its own; one over makes the
    // whole answer over, and the others still count.
    let r = call(
        &mut c,
        request("test", &[&[("user", "ada")], &[("api_key", "k1")]], 1),
    )
    .await;
    assert_eq!(r.overall_code, OVER);
    assert_eq!(r.statuses.len(), 2);
    assert_eq!(r.statuses[0].code, OVER);
    assert_eq!((r.statuses[1].code, r.statuses[1].limit_remaining), (OK, 4));
    assert_eq!(r.statuses[1].current_limit.as_ref().unwrap().name, "keys");

    // hits_addend is the cost.
    let r = call(&mut c, request("test", &[&[("api_key", "k1")]], 4)).await;
    assert_eq!((r.statuses[0].code, r.statuses[0].limit_remaining), (OK, 0));
    let r = call(&mut c, request("test", &[&[("api_key", "k1")]], 1)).await;
    assert_eq!(r.statuses[0].code, OVER);
    // A cost above the limit is over, not an error.
    let r = call(&mut c, request("test", &[&[("api_key", "k2")]], 6)).await;
    assert_eq!(r.statuses[0].code, OVER);

    // The stats say the same.
    let metrics = http(server.http, "GET", "/metrics", "").await;
    assert_eq!(metrics.status, 200);
    let line = |name: &str, key: &str| -> u64 {
        let prefix = format!("{name}{{descriptor=\"{key}\"}} ");
        metrics
            .body
            .lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .unwrap_or_else(|| panic!("no {prefix} in\n{}", metrics.body))
            .parse()
            .unwrap()
    };
    assert_eq!(
        line("ratewall_server_shadow_mode_total", "test.plan_trial"),
        2
    );
    assert_eq!(line("ratewall_server_over_limit_total", "test.user"), 2);
    assert_eq!(line("ratewall_server_within_limit_total", "test.user"), 4);
}

#[tokio::test]
async fn response_headers_are_added_when_asked_for() {
    let dir = ConfigDir::new(&[("config.yaml", CONFIG)]);
    let headers = |r: &envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse| {
        r.response_headers_to_add
            .iter()
            .map(|h| (h.key.clone(), h.value.clone()))
            .collect::<Vec<_>>()
    };
    let both = || request("test", &[&[("user", "h")], &[("api_key", "h")]], 1);

    let off = Server::start(&dir.path, &[]);
    let r = call(&mut off.client().await, both()).await;
    assert!(headers(&r).is_empty(), "{:?}", headers(&r));

    let ietf = Server::start(&dir.path, &["--response-headers", "ietf"]);
    let r = call(&mut ietf.client().await, both()).await;
    assert_eq!(
        headers(&r),
        [
            (
                "RateLimit-Policy".to_owned(),
                "\"test.user\";q=3;w=60, \"keys\";q=5;w=60".to_owned()
            ),
            (
                "RateLimit".to_owned(),
                "\"test.user\";r=2;t=60, \"keys\";r=4;t=12".to_owned()
            ),
        ]
    );

    let draft = Server::start(&dir.path, &["--response-headers", "draft03"]);
    let mut c = draft.client().await;
    let r = call(&mut c, both()).await;
    let h = headers(&r);
    assert_eq!(h[0], ("RateLimit-Limit".to_owned(), "3".to_owned()));
    assert_eq!(h[1], ("RateLimit-Remaining".to_owned(), "2".to_owned()));
    assert_eq!(h[2].0, "RateLimit-Reset");
}

#[tokio::test]
async fn json_health_and_a_drain_on_sigterm() {
    let dir = ConfigDir::new(&[("config.yaml", CONFIG)]);
    let mut server = Server::start(&dir.path, &[]);
    let body = r#"{"domain":"test","descriptors":[{"entries":[{"key":"user","value":"eve"}]}]}"#;
    for left in [2, 1, 0] {
        let got = http(server.http, "POST", "/json", body).await;
        assert_eq!(got.status, 200, "{}", got.body);
        let v: serde_json::Value = serde_json::from_str(&got.body).unwrap();
        assert_eq!(v["overallCode"], "OK");
        let s = &v["statuses"][0];
        assert_eq!(s["currentLimit"]["requestsPerUnit"], 3);
        assert_eq!(s["currentLimit"]["unit"], "MINUTE");
        if left == 0 {
            // Fields at their default are left out, as the JSON mapping does.
            assert!(s.get("limitRemaining").is_none(), "{s}");
        } else {
            assert_eq!(s["limitRemaining"], left);
        }
        assert!(s["durationUntilReset"].as_str().unwrap().ends_with('s'));
    }
    let got = http(server.http, "POST", "/json", body).await;
    assert_eq!(got.status, 429);
    let v: serde_json::Value = serde_json::from_str(&got.body).unwrap();
    assert_eq!(v["overallCode"], "OVER_LIMIT");
    // A body that does not read, and a request without a domain: 400.
    assert_eq!(http(server.http, "POST", "/json", "{").await.status, 400);
    let empty = http(
        server.http,
        "POST",
        "/json",
        r#"{"domain":"","descriptors":[]}"#,
    )
    .await;
    assert_eq!(empty.status, 400);
    assert!(empty.body.contains("domain"), "{}", empty.body);

    let health = http(server.http, "GET", "/healthcheck", "").await;
    assert_eq!((health.status, health.body.as_str()), (200, "OK"));
    let channel = tonic::transport::Channel::from_shared(format!("http://{}", server.grpc))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut h = tonic_health::pb::health_client::HealthClient::new(channel);
    let serving = h
        .check(tonic_health::pb::HealthCheckRequest {
            service: "envoy.service.ratelimit.v3.RateLimitService".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        serving.status,
        tonic_health::pb::health_check_response::ServingStatus::Serving as i32
    );

    let status = server.terminate(Duration::from_secs(10)).await;
    assert!(
        status.is_some_and(|s| s.success()),
        "{status:?}\n{}",
        server.log.lock().unwrap().join("\n")
    );
}

/// A client that never answers the server's GOAWAY (its runtime is
/// blocked) cannot hold the exit past the drain time.
#[tokio::test]
async fn a_client_that_never_answers_cannot_hold_the_exit_past_the_drain() {
    let dir = ConfigDir::new(&[("config.yaml", CONFIG)]);
    let mut server = Server::start(&dir.path, &["--drain-ms", "300"]);
    let mut c = server.client().await;
    assert_eq!(
        call(&mut c, request("test", &[&[("user", "u")]], 1))
            .await
            .overall_code,
        OK
    );
    let start = std::time::Instant::now();
    let status = server.terminate_blocking(Duration::from_secs(20));
    assert!(status.is_some_and(|s| s.success()), "{status:?}");
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
    drop(c);
}

#[tokio::test]
async fn thirty_two_concurrent_callers_are_admitted_exactly() {
    let yaml = "domain: load\ndescriptors:\n  - key: tenant\n    rate_limit:\n      policy: \"100/min fixed-window\"\n";
    let dir = ConfigDir::new(&[("load.yaml", yaml)]);
    let server = Server::start(&dir.path, &[]);
    let mut tasks = Vec::new();
    for _ in 0..32 {
        let mut c = server.client().await;
        tasks.push(tokio::spawn(async move {
            let mut ok = 0;
            for _ in 0..10 {
                let r = call(&mut c, request("load", &[&[("tenant", "t")]], 1)).await;
                ok += u32::from(r.overall_code == OK);
            }
            ok
        }));
    }
    let mut admitted = 0;
    for t in tasks {
        admitted += t.await.unwrap();
    }
    assert_eq!(admitted, 100);
}

#[tokio::test]
async fn hostile_requests_are_answered_and_the_server_keeps_serving() {
    let dir = ConfigDir::new(&[("config.yaml", CONFIG)]);
    let server = Server::start(&dir.path, &[]);
    let mut c = server.client().await;
    // An empty domain, no descriptors, an empty descriptor: refused.
    for bad in [
        request("", &[&[("user", "x")]], 1),
        request("test", &[], 1),
        request("test", &[&[]], 1),
    ] {
        let err = c.should_rate_limit(bad).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
    }
    // 1,000 descriptors: each answered.
    let values: Vec<String> = (0..1000).map(|i| format!("u{i}")).collect();
    let entries: Vec<[(&str, &str); 1]> = values.iter().map(|v| [("user", v.as_str())]).collect();
    let descriptors: Vec<&[(&str, &str)]> = entries.iter().map(|e| &e[..]).collect();
    let r = call(&mut c, request("test", &descriptors, 1)).await;
    assert_eq!(r.statuses.len(), 1000);
    assert!(r
        .statuses
        .iter()
        .all(|s| s.code == OK && s.limit_remaining == 2));
    // 64 KB values, keys and domains.
    let big = "v".repeat(64 * 1024);
    let r = call(&mut c, request("test", &[&[("user", &big)]], 1)).await;
    assert_eq!((r.overall_code, r.statuses[0].limit_remaining), (OK, 2));
    let r = call(&mut c, request(&big, &[&[(&big, &big)]], 1)).await;
    assert_eq!(r.overall_code, OK);
    // hits_addend at its largest is over the limit, not a crash.
    let r = call(&mut c, request("test", &[&[("user", "max")]], u32::MAX)).await;
    assert_eq!(r.overall_code, OVER);
    // Still serving.
    let r = call(&mut c, request("test", &[&[("user", "after")]], 1)).await;
    assert_eq!(r.overall_code, OK);
}

#[tokio::test]
async fn reload_keeps_unchanged_limits_and_a_broken_file_keeps_the_old_one() {
    let dir = ConfigDir::new(&[("config.yaml", CONFIG)]);
    let server = Server::start(&dir.path, &[]);
    let mut c = server.client().await;
    let user = |c: &str| request("test", &[&[("user", c)]], 1);
    for _ in 0..3 {
        assert_eq!(call(&mut c, user("ada")).await.overall_code, OK);
    }
    assert_eq!(call(&mut c, user("ada")).await.overall_code, OVER);

    // Another file and a change elsewhere: `user`'s limit is unchanged and
    // keeps its count.
    let more = "domain: more\ndescriptors:\n  - key: k\n    rate_limit: { unit: minute, requests_per_unit: 1 }\n";
    dir.write("more.yaml", more);
    let reloaded = wait_for(
        &mut c,
        |r| r.statuses[0].current_limit.is_some(),
        || request("more", &[&[("k", "v")]], 1),
    )
    .await;
    assert!(reloaded, "the new file was not loaded");
    assert_eq!(call(&mut c, user("ada")).await.overall_code, OVER);

    // A changed limit counts afresh.
    dir.write(
        "config.yaml",
        &CONFIG.replace("requests_per_unit: 3", "requests_per_unit: 4"),
    );
    let changed = wait_for(
        &mut c,
        |r| {
            r.statuses[0]
                .current_limit
                .as_ref()
                .is_some_and(|l| l.requests_per_unit == 4)
        },
        || user("new"),
    )
    .await;
    assert!(changed, "the changed file was not loaded");
    assert_eq!(call(&mut c, user("ada")).await.overall_code, OK);

    // A broken file: the old configuration keeps serving, one error logged.
    dir.write("config.yaml", "domain: test\ndescriptors:\n  - key: user\n    rate_limit: { unit: fortnight, requests_per_unit: 1 }\n");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while server.log_lines("not reloaded").is_empty() && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let errors = server.log_lines("not reloaded");
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(errors[0].contains("config.yaml:4"), "{}", errors[0]);
    let r = call(&mut c, user("zed")).await;
    assert_eq!(
        r.statuses[0]
            .current_limit
            .as_ref()
            .unwrap()
            .requests_per_unit,
        4
    );
    // No more errors while the file stays as it is.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(server.log_lines("not reloaded").len(), 1);
}

/// Calls `make()` until `done` holds for the answer (at most 10 s).
async fn wait_for(
    c: &mut envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient<tonic::transport::Channel>,
    done: impl Fn(&envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse) -> bool,
    make: impl Fn() -> envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest,
) -> bool {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while std::time::Instant::now() < deadline {
        if done(&call(c, make()).await) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

#[test]
fn a_configuration_it_cannot_load_stops_the_start_with_the_file_and_line() {
    let dir = ConfigDir::new(&[(
        "bad.yaml",
        "domain: test\ndescriptors:\n  - key: user\n    rate_limit:\n      unit: fortnight\n      requests_per_unit: 3\n",
    )]);
    let refused = support::refused(&dir.path);
    assert_eq!(refused.code, Some(1), "{refused:?}");
    assert!(refused.stderr.contains("bad.yaml:5"), "{}", refused.stderr);
    assert!(refused.stderr.contains("unit"), "{}", refused.stderr);
}
