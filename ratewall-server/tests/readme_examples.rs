//! envoyproxy/ratelimit's README, "Configuration" examples 1 to 11: each
//! YAML loaded by the real binary from a configuration directory and
//! exercised over gRPC, one test per example, named after what it proves.
//!
//! Where the README writes `unit: second`, these use `unit: minute` (and
//! keep its `requests_per_unit`): a one-second window could end in the
//! middle of a test on a loaded machine and admit a second batch. The
//! server's windows start with its process, so a minute (or an hour, or a
//! day) cannot pass within one of these tests.

mod support;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use support::{call, metric, request, ConfigDir, Server};
use tonic::transport::Channel;

type Client = RateLimitServiceClient<Channel>;
type Entries<'a> = &'a [(&'a str, &'a str)];

const OK: i32 = Code::Ok as i32;
const OVER: i32 = Code::OverLimit as i32;

/// A server on one directory holding `files`; the directory lives as long
/// as the server.
async fn serve(files: &[(&str, &str)], flags: &[&str]) -> (ConfigDir, Server, Client) {
    let dir = ConfigDir::new(files);
    let server = Server::start(&dir.path, flags);
    let client = server.client().await;
    (dir, server, client)
}

/// The status of a one-descriptor request.
async fn one(c: &mut Client, domain: &str, entries: Entries<'_>, hits: u32) -> DescriptorStatus {
    let r = call(c, request(domain, &[entries], hits)).await;
    assert_eq!(r.statuses.len(), 1, "{r:?}");
    assert_eq!(r.overall_code, r.statuses[0].code, "{r:?}");
    r.statuses[0].clone()
}

/// `entries` is limited to `limit` per `unit`: `limit` calls are OK, the
/// limit is reported with the remaining count going down to 0, and the next
/// call is OVER_LIMIT.
async fn assert_limited(
    c: &mut Client,
    domain: &str,
    entries: Entries<'_>,
    limit: u32,
    unit: Unit,
) {
    for i in 0..limit {
        let s = one(c, domain, entries, 1).await;
        let current = s
            .current_limit
            .as_ref()
            .map(|l| (l.requests_per_unit, l.unit));
        assert_eq!(
            (s.code, current, s.limit_remaining),
            (OK, Some((limit, unit as i32)), limit - i - 1),
            "{domain} {entries:?}: call {} of {limit}",
            i + 1
        );
    }
    let s = one(c, domain, entries, 1).await;
    assert_eq!(
        s.code,
        OVER,
        "{domain} {entries:?}: call {} of {limit}",
        limit + 1
    );
    assert_eq!(s.limit_remaining, 0, "{s:?}");
}

/// `entries` matches no limit: OK, no current limit, whatever it costs.
async fn assert_unmatched(c: &mut Client, domain: &str, entries: Entries<'_>) {
    for hits in [1, 1_000_000] {
        let s = one(c, domain, entries, hits).await;
        assert_eq!(
            (s.code, s.current_limit.as_ref()),
            (OK, None),
            "{domain} {entries:?} should match no limit"
        );
    }
}

/// The `requests_per_unit` an answer reports for `entries` (one call).
async fn limit_of(c: &mut Client, domain: &str, entries: Entries<'_>) -> Option<u32> {
    one(c, domain, entries, 1)
        .await
        .current_limit
        .map(|l| l.requests_per_unit)
}

/// `/metrics`'s count of `series` for `descriptor`.
async fn counted(server: &Server, series: &str, descriptor: &str) -> Option<u64> {
    metric(
        server.http,
        &format!("{series}{{descriptor=\"{descriptor}\"}}"),
    )
    .await
}

const EXAMPLE_1: &str = r#"
domain: mongo_cps
descriptors:
  - key: database
    value: users
    rate_limit:
      unit: minute
      requests_per_unit: 500

  - key: database
    value: default
    rate_limit:
      unit: minute
      requests_per_unit: 500
"#;

#[tokio::test]
async fn example_1_each_value_has_its_own_limit_and_other_values_none() {
    let (_dir, _server, mut c) = serve(&[("config.yaml", EXAMPLE_1)], &[]).await;
    assert_limited(
        &mut c,
        "mongo_cps",
        &[("database", "users")],
        500,
        Unit::Minute,
    )
    .await;
    // `default` has a counter of its own, untouched by `users`.
    assert_limited(
        &mut c,
        "mongo_cps",
        &[("database", "default")],
        500,
        Unit::Minute,
    )
    .await;
    // A value the configuration does not name, and another key: no limit.
    assert_unmatched(&mut c, "mongo_cps", &[("database", "orders")]).await;
    assert_unmatched(&mut c, "mongo_cps", &[("table", "users")]).await;
}

const EXAMPLE_2: &str = r#"
domain: messaging
descriptors:
  # Only allow 5 marketing messages a day
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit:
          unit: day
          requests_per_unit: 5

  # Only allow 100 messages a day to any unique phone number
  - key: to_number
    rate_limit:
      unit: day
      requests_per_unit: 100
"#;

#[tokio::test]
async fn example_2_nested_and_top_level_limits_count_apart_and_the_answer_is_their_or() {
    let (_dir, _server, mut c) = serve(&[("config.yaml", EXAMPLE_2)], &[]).await;
    let marketing: Entries<'_> = &[("message_type", "marketing"), ("to_number", "2061111111")];
    let number: Entries<'_> = &[("to_number", "2061111111")];
    // The README's request: both descriptors at once, five times within
    // both limits.
    for i in 0..5 {
        let r = call(&mut c, request("messaging", &[marketing, number], 1)).await;
        assert_eq!(r.overall_code, OK, "call {i}: {r:?}");
        assert_eq!(
            (r.statuses[0].limit_remaining, r.statuses[1].limit_remaining),
            (4 - i, 99 - i)
        );
    }
    // The sixth: the marketing limit is over, so the answer is; the
    // number's own limit still counts the call.
    let r = call(&mut c, request("messaging", &[marketing, number], 1)).await;
    assert_eq!(r.overall_code, OVER, "{r:?}");
    assert_eq!(r.statuses[0].code, OVER);
    assert_eq!(
        (r.statuses[1].code, r.statuses[1].limit_remaining),
        (OK, 94)
    );
    // The number alone: 94 more a day, then over.
    for i in 0..94 {
        let s = one(&mut c, "messaging", number, 1).await;
        assert_eq!((s.code, s.limit_remaining), (OK, 93 - i));
    }
    assert_eq!(one(&mut c, "messaging", number, 1).await.code, OVER);
    // Another number has five marketing messages and 100 messages of its own.
    assert_limited(
        &mut c,
        "messaging",
        &[("message_type", "marketing"), ("to_number", "2062222222")],
        5,
        Unit::Day,
    )
    .await;
    assert_eq!(
        one(&mut c, "messaging", &[("to_number", "2062222222")], 1)
            .await
            .limit_remaining,
        99
    );
    // The placeholder level alone has no limit.
    assert_unmatched(&mut c, "messaging", &[("message_type", "marketing")]).await;
}

const EXAMPLE_3: &str = r#"
domain: edge_proxy_per_ip
descriptors:
  - key: remote_address
    rate_limit:
      unit: minute
      requests_per_unit: 10

  # Black list IP
  - key: remote_address
    value: 50.0.0.5
    rate_limit:
      unit: minute
      requests_per_unit: 0
"#;

#[tokio::test]
async fn example_3_key_value_is_matched_before_key_and_a_limit_of_0_blocks() {
    let (_dir, _server, mut c) = serve(&[("config.yaml", EXAMPLE_3)], &[]).await;
    // The black-listed address: over from its first call, reporting 0.
    for _ in 0..3 {
        let s = one(
            &mut c,
            "edge_proxy_per_ip",
            &[("remote_address", "50.0.0.5")],
            1,
        )
        .await;
        let limit = s.current_limit.as_ref().unwrap();
        assert_eq!((s.code, limit.requests_per_unit), (OVER, 0), "{s:?}");
    }
    // Any other address: 10 each.
    for ip in ["50.0.0.1", "50.0.0.2"] {
        assert_limited(
            &mut c,
            "edge_proxy_per_ip",
            &[("remote_address", ip)],
            10,
            Unit::Minute,
        )
        .await;
    }
}

const EXAMPLE_4_FLAT: &str = r#"
domain: example4
descriptors:
  - key: key
    value: value
    rate_limit:
      requests_per_unit: 300
      unit: minute
"#;

const EXAMPLE_4_NESTED: &str = r#"
domain: example4
descriptors:
  - key: key
    value: value
    descriptors:
      - key: subkey
        rate_limit:
          requests_per_unit: 300
          unit: minute
"#;

#[tokio::test]
async fn example_4_a_descriptor_matches_only_a_level_as_deep_as_its_entries() {
    let two: Entries<'_> = &[("key", "value"), ("subkey", "subvalue")];
    let first: Entries<'_> = &[("key", "value")];
    // The first configuration: two entries do not match a one-level limit.
    let (_dir, server, mut c) = serve(&[("config.yaml", EXAMPLE_4_FLAT)], &[]).await;
    assert_unmatched(&mut c, "example4", two).await;
    assert_limited(&mut c, "example4", first, 300, Unit::Minute).await;
    drop((c, server));
    // The second: they do, and the first entry alone does not.
    let (_dir, _server, mut c) = serve(&[("config.yaml", EXAMPLE_4_NESTED)], &[]).await;
    assert_limited(&mut c, "example4", two, 300, Unit::Minute).await;
    assert_unmatched(&mut c, "example4", first).await;
}

const EXAMPLE_5: &str = r#"
domain: internal
descriptors:
  - key: ldap
    rate_limit:
      unlimited: true

  - key: azure
    rate_limit:
      unit: minute
      requests_per_unit: 100
"#;

#[tokio::test]
async fn example_5_unlimited_is_ok_with_max_remaining_and_its_neighbour_is_limited() {
    let (_dir, server, mut c) = serve(&[("config.yaml", EXAMPLE_5)], &[]).await;
    for hits in [1, 1, 1_000_000, u32::MAX] {
        let s = one(&mut c, "internal", &[("ldap", "any")], hits).await;
        assert_eq!((s.code, s.limit_remaining), (OK, u32::MAX), "{s:?}");
    }
    assert_limited(&mut c, "internal", &[("azure", "any")], 100, Unit::Minute).await;
    // Never counted: no over-limit hits for it.
    assert_eq!(
        counted(&server, "ratewall_server_over_limit_total", "internal.ldap").await,
        Some(0)
    );
}

const EXAMPLE_6: &str = r#"
domain: example6
descriptors:
  - key: service
    descriptors:
      - key: user
        value: user-a
        rate_limit:
          requests_per_unit: 10
          unit: minute
        shadow_mode: true
      - key: user
        value: user-b
        rate_limit:
          requests_per_unit: 20
          unit: minute
"#;

#[tokio::test]
async fn example_6_shadow_mode_answers_ok_over_its_limit_and_counts_the_breach() {
    let (_dir, server, mut c) = serve(&[("config.yaml", EXAMPLE_6)], &[]).await;
    let user_a: Entries<'_> = &[("service", "auth-service"), ("user", "user-a")];
    for i in 0..15 {
        let s = one(&mut c, "example6", user_a, 1).await;
        assert_eq!(s.code, OK, "call {}: {s:?}", i + 1);
        assert_eq!(s.current_limit.as_ref().unwrap().requests_per_unit, 10);
    }
    // Five calls over the limit of 10, each answered OK.
    let key = "example6.service.user_user-a";
    assert_eq!(
        counted(&server, "ratewall_server_shadow_mode_total", key).await,
        Some(5)
    );
    assert_eq!(
        counted(&server, "ratewall_server_within_limit_total", key).await,
        Some(10)
    );
    // user-b is enforced.
    assert_limited(
        &mut c,
        "example6",
        &[("service", "auth-service"), ("user", "user-b")],
        20,
        Unit::Minute,
    )
    .await;
    assert_eq!(
        counted(
            &server,
            "ratewall_server_shadow_mode_total",
            "example6.service.user_user-b"
        )
        .await,
        Some(0)
    );
}

const EXAMPLE_7: &str = r#"
domain: example7
descriptors:
  - key: key_1
    value: value_1
    descriptors:
      - key: user
        value: bkthomps
        rate_limit:
          name: specific_limit
          requests_per_unit: 5
          unit: minute
  - key: key_2
    value: value_2
    descriptors:
      - key: user
        value: bkthomps
        rate_limit:
          replaces:
            - name: specific_limit
          requests_per_unit: 10
          unit: minute
"#;

#[tokio::test]
async fn example_7_replaces_drops_the_named_limit_and_leaves_its_counter_alone() {
    let (_dir, _server, mut c) = serve(&[("config.yaml", EXAMPLE_7)], &[]).await;
    let first: Entries<'_> = &[("key_1", "value_1"), ("user", "bkthomps")];
    let second: Entries<'_> = &[("key_2", "value_2"), ("user", "bkthomps")];
    // Both together: only the replacing limit of 10 applies.
    for i in 0..10 {
        let r = call(&mut c, request("example7", &[first, second], 1)).await;
        assert_eq!(r.overall_code, OK, "call {}: {r:?}", i + 1);
        assert_eq!(r.statuses[0].current_limit, None, "replaced: {r:?}");
        assert_eq!(r.statuses[1].limit_remaining, 9 - i);
    }
    let r = call(&mut c, request("example7", &[first, second], 1)).await;
    assert_eq!((r.overall_code, r.statuses[0].code), (OVER, OK), "{r:?}");
    // The replaced limit was not counted by those 11 calls: 5 whole.
    assert_limited(&mut c, "example7", first, 5, Unit::Minute).await;
    // Alone, the second descriptor is over its own limit.
    assert_eq!(one(&mut c, "example7", second, 1).await.code, OVER);
}

const EXAMPLE_8: &str = r#"
domain: example8
descriptors:
  - key: key1
    detailed_metric: true
    rate_limit:
      unit: minute
      requests_per_unit: 10
  - key: key1
    value: value1
    rate_limit:
      unit: minute
      requests_per_unit: 20
"#;

#[tokio::test]
async fn example_8_detailed_metric_leaves_limiting_as_it_is() {
    let (_dir, _server, mut c) = serve(&[("config.yaml", EXAMPLE_8)], &[]).await;
    assert_limited(
        &mut c,
        "example8",
        &[("key1", "unspecified_value")],
        10,
        Unit::Minute,
    )
    .await;
    assert_limited(
        &mut c,
        "example8",
        &[("key1", "unspecified_value2")],
        10,
        Unit::Minute,
    )
    .await;
    assert_limited(&mut c, "example8", &[("key1", "value1")], 20, Unit::Minute).await;
}

#[tokio::test]
async fn example_8_detailed_metric_names_each_value_in_the_metrics() {
    let (_dir, server, mut c) = serve(&[("config.yaml", EXAMPLE_8)], &[]).await;
    for _ in 0..3 {
        one(&mut c, "example8", &[("key1", "unspecified_value")], 1).await;
    }
    one(&mut c, "example8", &[("key1", "unspecified_value2")], 1).await;
    let within = "ratewall_server_within_limit_total";
    assert_eq!(
        counted(&server, within, "example8.key1_unspecified_value").await,
        Some(3)
    );
    assert_eq!(
        counted(&server, within, "example8.key1_unspecified_value2").await,
        Some(1)
    );
}

// Example 9's three configurations all name the domain `example9`: they
// are three files here, merged as envoyproxy/ratelimit merges them with
// MERGE_DOMAIN_CONFIG.
const EXAMPLE_9_TRAILING: &str = r#"
domain: example9
descriptors:
  - key: key1
    value: value*
    rate_limit:
      unit: minute
      requests_per_unit: 20
"#;

const EXAMPLE_9_MIDDLE: &str = r#"
domain: example9
descriptors:
  - key: path
    value: /api/*/action
    rate_limit:
      unit: minute
      requests_per_unit: 20
"#;

const EXAMPLE_9_MULTIPLE: &str = r#"
domain: example9
descriptors:
  - key: route
    value: /api/*/resource/*/action
    rate_limit:
      unit: minute
      requests_per_unit: 20
"#;

#[tokio::test]
async fn example_9_wildcards_match_anywhere_and_each_value_counts_apart() {
    let files = [
        ("trailing.yaml", EXAMPLE_9_TRAILING),
        ("middle.yaml", EXAMPLE_9_MIDDLE),
        ("multiple.yaml", EXAMPLE_9_MULTIPLE),
    ];
    let (_dir, _server, mut c) = serve(&files, &["--merge-domains"]).await;
    let d = "example9";
    // Trailing: `value1` has 20; `value2` still has 20 of its own.
    assert_limited(&mut c, d, &[("key1", "value1")], 20, Unit::Minute).await;
    assert_limited(&mut c, d, &[("key1", "value2")], 20, Unit::Minute).await;
    for v in ["valueXYZ", "value"] {
        assert_eq!(limit_of(&mut c, d, &[("key1", v)]).await, Some(20), "{v}");
    }
    assert_unmatched(&mut c, d, &[("key1", "valu")]).await;
    assert_unmatched(&mut c, d, &[("key1", "xvalue1")]).await;
    // Middle: a fixed prefix and suffix.
    assert_limited(&mut c, d, &[("path", "/api/123/action")], 20, Unit::Minute).await;
    assert_eq!(
        limit_of(&mut c, d, &[("path", "/api/user-id/action")]).await,
        Some(20)
    );
    assert_unmatched(&mut c, d, &[("path", "/api/123/other")]).await;
    // Multiple: each `*` a segment, in order.
    for v in ["/api/v1/resource/123/action", "/api/v2/resource/456/action"] {
        assert_eq!(limit_of(&mut c, d, &[("route", v)]).await, Some(20), "{v}");
    }
    assert_limited(
        &mut c,
        d,
        &[("route", "/api/v3/resource/7/action")],
        20,
        Unit::Minute,
    )
    .await;
    assert_unmatched(&mut c, d, &[("route", "/api/v1/resource/123/other")]).await;
    assert_unmatched(&mut c, d, &[("route", "/api/v1/action")]).await;
}

const EXAMPLE_10: &str = r#"
domain: example10
descriptors:
  - key: route
    value_to_metric: true
    descriptors:
      - key: http_method
        value_to_metric: true
        descriptors:
          - key: subject_id
            rate_limit:
              unit: minute
              requests_per_unit: 60
"#;

const EXAMPLE_10_WILDCARD: &str = r#"
domain: example10_wildcard
descriptors:
  - key: user
    value_to_metric: true
    descriptors:
      - key: action
        value: read*
        value_to_metric: true
        descriptors:
          - key: resource
            rate_limit:
              unit: minute
              requests_per_unit: 100
"#;

#[tokio::test]
async fn example_10_value_to_metric_leaves_limiting_as_it_is() {
    let files = [("a.yaml", EXAMPLE_10), ("b.yaml", EXAMPLE_10_WILDCARD)];
    let (_dir, _server, mut c) = serve(&files, &[]).await;
    let api: Entries<'_> = &[
        ("route", "api"),
        ("http_method", "GET"),
        ("subject_id", "123"),
    ];
    assert_limited(&mut c, "example10", api, 60, Unit::Minute).await;
    let web: Entries<'_> = &[
        ("route", "web"),
        ("http_method", "POST"),
        ("subject_id", "456"),
    ];
    assert_eq!(one(&mut c, "example10", web, 1).await.limit_remaining, 59);
    assert_unmatched(
        &mut c,
        "example10",
        &[("route", "api"), ("http_method", "GET")],
    )
    .await;
    let read: Entries<'_> = &[
        ("user", "alice"),
        ("action", "readfile"),
        ("resource", "documents"),
    ];
    assert_limited(&mut c, "example10_wildcard", read, 100, Unit::Minute).await;
    let write: Entries<'_> = &[
        ("user", "alice"),
        ("action", "writefile"),
        ("resource", "documents"),
    ];
    assert_unmatched(&mut c, "example10_wildcard", write).await;
}

#[tokio::test]
async fn example_10_value_to_metric_puts_the_runtime_values_in_the_metrics() {
    let files = [("a.yaml", EXAMPLE_10), ("b.yaml", EXAMPLE_10_WILDCARD)];
    let (_dir, server, mut c) = serve(&files, &[]).await;
    let api: Entries<'_> = &[
        ("route", "api"),
        ("http_method", "GET"),
        ("subject_id", "123"),
    ];
    let web: Entries<'_> = &[
        ("route", "web"),
        ("http_method", "POST"),
        ("subject_id", "456"),
    ];
    one(&mut c, "example10", api, 1).await;
    one(&mut c, "example10", web, 1).await;
    one(&mut c, "example10", web, 1).await;
    let read: Entries<'_> = &[
        ("user", "alice"),
        ("action", "readfile"),
        ("resource", "documents"),
    ];
    one(&mut c, "example10_wildcard", read, 1).await;
    let within = "ratewall_server_within_limit_total";
    let keys = [
        ("example10.route_api.http_method_GET.subject_id", 1),
        ("example10.route_web.http_method_POST.subject_id", 2),
        ("example10_wildcard.user_alice.action_readfile.resource", 1),
    ];
    for (key, n) in keys {
        assert_eq!(counted(&server, within, key).await, Some(n), "{key}");
    }
}

const EXAMPLE_11: &str = r#"
domain: example11
descriptors:
  # With share_threshold: true, all files/* matches share the same threshold
  - key: files
    value: files/*
    share_threshold: true
    rate_limit:
      unit: hour
      requests_per_unit: 10

  # Without share_threshold, each files_no_share/* match has its own isolated threshold
  - key: files_no_share
    value: files_no_share/*
    share_threshold: false
    rate_limit:
      unit: hour
      requests_per_unit: 10
"#;

const EXAMPLE_11_METRICS: &str = r#"
domain: example11_metrics
descriptors:
  - key: route
    value: api/*
    share_threshold: true
    value_to_metric: true
    descriptors:
      - key: method
        rate_limit:
          unit: minute
          requests_per_unit: 60
"#;

#[tokio::test]
async fn example_11_share_threshold_makes_every_match_share_one_counter() {
    let files = [("a.yaml", EXAMPLE_11), ("b.yaml", EXAMPLE_11_METRICS)];
    let (_dir, _server, mut c) = serve(&files, &[]).await;
    let d = "example11";
    // Five for a.pdf and five for b.csv use up the shared 10: c.txt is over.
    for (file, left) in [("files/a.pdf", 9), ("files/b.csv", 4)] {
        for i in 0..5 {
            let s = one(&mut c, d, &[("files", file)], 1).await;
            assert_eq!((s.code, s.limit_remaining), (OK, left - i), "{file}");
        }
    }
    assert_eq!(
        one(&mut c, d, &[("files", "files/c.txt")], 1).await.code,
        OVER
    );
    // Without sharing, each file has 10.
    assert_limited(
        &mut c,
        d,
        &[("files_no_share", "files_no_share/a.pdf")],
        10,
        Unit::Hour,
    )
    .await;
    assert_limited(
        &mut c,
        d,
        &[("files_no_share", "files_no_share/b.csv")],
        10,
        Unit::Hour,
    )
    .await;
    // Shared at the first level, per method below it: GET on api/v1 and
    // api/v2 share 60; POST has 60 of its own.
    let m = "example11_metrics";
    for i in 0..60 {
        let route = if i % 2 == 0 { "api/v1" } else { "api/v2" };
        let s = one(&mut c, m, &[("route", route), ("method", "GET")], 1).await;
        assert_eq!((s.code, s.limit_remaining), (OK, 59 - i), "{route}");
    }
    assert_eq!(
        one(&mut c, m, &[("route", "api/v3"), ("method", "GET")], 1)
            .await
            .code,
        OVER
    );
    let s = one(&mut c, m, &[("route", "api/v1"), ("method", "POST")], 1).await;
    assert_eq!((s.code, s.limit_remaining), (OK, 59));
}

/// Not a README example, but the protocol's: a descriptor may carry its own
/// `limit`, which replaces what the configuration says for it. Each rate
/// counts apart, and so does each descriptor under one rate.
#[tokio::test]
async fn a_descriptor_s_own_limit_is_counted_per_rate_and_per_descriptor() {
    let (_dir, _server, mut c) = serve(&[("config.yaml", EXAMPLE_1)], &[]).await;
    let with_limit = |entries: Entries<'_>, rate: u32, unit: Unit| -> RateLimitRequest {
        let mut r = request("mongo_cps", &[entries], 1);
        r.descriptors[0].limit = Some(RateLimitOverride {
            requests_per_unit: rate,
            unit: unit as i32,
        });
        r
    };
    let users: Entries<'_> = &[("database", "users")];
    // Three a minute for `users` (configured at 500)…
    for i in 0..3 {
        let r = call(&mut c, with_limit(users, 3, Unit::Minute)).await;
        let s = &r.statuses[0];
        let limit = s.current_limit.as_ref().unwrap();
        assert_eq!(
            (
                s.code,
                limit.requests_per_unit,
                limit.unit,
                s.limit_remaining
            ),
            (OK, 3, Unit::Minute as i32, 2 - i),
            "{r:?}"
        );
    }
    let r = call(&mut c, with_limit(users, 3, Unit::Minute)).await;
    assert_eq!(r.overall_code, OVER, "{r:?}");
    // …another rate for the same descriptor counts afresh…
    for i in 0..5 {
        let r = call(&mut c, with_limit(users, 5, Unit::Hour)).await;
        assert_eq!((r.overall_code, r.statuses[0].limit_remaining), (OK, 4 - i));
    }
    assert_eq!(
        call(&mut c, with_limit(users, 5, Unit::Hour))
            .await
            .overall_code,
        OVER
    );
    // …another descriptor under the first rate has 3 of its own, even one
    // the configuration does not name…
    let orders: Entries<'_> = &[("database", "orders")];
    for i in 0..3 {
        let r = call(&mut c, with_limit(orders, 3, Unit::Minute)).await;
        assert_eq!((r.overall_code, r.statuses[0].limit_remaining), (OK, 2 - i));
    }
    assert_eq!(
        call(&mut c, with_limit(orders, 3, Unit::Minute))
            .await
            .overall_code,
        OVER
    );
    // …and the configured limit was never touched.
    assert_eq!(
        one(&mut c, "mongo_cps", users, 1).await.limit_remaining,
        499
    );
}

/// A descriptor's own limit and the configured one for the same
/// descriptor are two counters; `/metrics` must not list two series under
/// one name and labels (Prometheus refuses a scrape with a duplicate).
#[tokio::test]
async fn an_own_limit_and_a_configured_limit_never_share_one_metrics_series() {
    let (_dir, server, mut c) = serve(&[("config.yaml", EXAMPLE_1)], &[]).await;
    let users: Entries<'_> = &[("database", "users")];
    one(&mut c, "mongo_cps", users, 1).await;
    let mut r = request("mongo_cps", &[users], 1);
    r.descriptors[0].limit = Some(RateLimitOverride {
        requests_per_unit: 3,
        unit: Unit::Minute as i32,
    });
    call(&mut c, r).await;
    let body = support::http(server.http, "GET", "/metrics", "").await.body;
    let mut series: Vec<&str> = body
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.rsplit_once(' ').map(|(s, _)| s))
        .collect();
    let listed = series.len();
    series.sort_unstable();
    series.dedup();
    assert_eq!(series.len(), listed, "a series is listed twice:\n{body}");
}

/// The README's "Rate limit definition": `requests_per_unit: <uint>`.
/// envoyproxy/ratelimit reads it as a uint32. Here a count above what a
/// fixed window counts (16,777,215) becomes a token bucket of the same rate
/// and burst, and loads and limits; a count no keyed table here holds (a
/// burst above about 2^25, or a rate above about 1,000,000 a second) is
/// refused naming its file, line and field (docs/gateway.md says so).
#[tokio::test]
async fn rate_limit_definition_takes_large_counts_and_refuses_rates_too_fast_to_count() {
    let yaml = "domain: big\ndescriptors:\n  - key: j\n    rate_limit:\n      unit: hour\n      requests_per_unit: 16777216\n";
    let dir = ConfigDir::new(&[("config.yaml", yaml)]);
    let server = match Server::try_start(&dir.path, &[]) {
        Ok(s) => s,
        Err(refused) => panic!("refused: {refused:?}"),
    };
    let mut c = server.client().await;
    for (key, limit) in [("j", 16_777_216)] {
        let s = one(&mut c, "big", &[(key, "v")], limit).await;
        assert_eq!((s.code, s.limit_remaining), (OK, 0), "{key}: {s:?}");
        assert_eq!(s.current_limit.as_ref().unwrap().requests_per_unit, limit);
        // A bucket refills about 4,660 a second: half the count again is
        // over for half an hour.
        assert_eq!(
            one(&mut c, "big", &[(key, "v")], limit / 2).await.code,
            OVER,
            "{key}"
        );
    }
    let fast = "domain: big\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: minute\n      requests_per_unit: 4294967295\n";
    let dir = ConfigDir::new(&[("config.yaml", fast)]);
    let refused = support::refused(&dir.path);
    assert!(
        refused
            .stderr
            .contains("config.yaml:4: `rate_limit.requests_per_unit`"),
        "{}",
        refused.stderr
    );
}
