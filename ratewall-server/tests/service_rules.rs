//! envoyproxy/ratelimit's answer rules beyond the README's examples, read
//! from its `src/service/ratelimit.go` (`shouldRateLimitWorker`), against
//! the real binary: `quota_mode` descriptors make the answer over only
//! when all of them are over, and the global shadow mode (`--shadow-mode`)
//! answers OK overall while each descriptor's status still says over.

mod support;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use support::{call, metric, request, ConfigDir, Server};

const OK: i32 = Code::Ok as i32;
const OVER: i32 = Code::OverLimit as i32;

const QUOTA: &str = r#"
domain: quota
descriptors:
  - key: daily
    quota_mode: true
    rate_limit: { unit: hour, requests_per_unit: 1 }
  - key: monthly
    quota_mode: true
    rate_limit: { unit: hour, requests_per_unit: 3 }
  - key: user
    rate_limit: { unit: hour, requests_per_unit: 100 }
"#;

/// Go: "The final code is OVER_LIMIT iff at least one rate limit
/// descriptor is over the limit or all quota descriptors are over the
/// limit." Each descriptor's status still says what it is.
#[tokio::test]
async fn quota_mode_is_over_only_when_every_quota_descriptor_is() {
    let dir = ConfigDir::new(&[("quota.yaml", QUOTA)]);
    let server = Server::start(&dir.path, &[]);
    let mut c = server.client().await;
    let both = || request("quota", &[&[("daily", "a")], &[("monthly", "a")]], 1);
    let r = call(&mut c, both()).await;
    assert_eq!(
        (r.overall_code, r.statuses[0].code, r.statuses[1].code),
        (OK, OK, OK)
    );
    // `daily` is over, `monthly` is not: OK overall, twice.
    for remaining in [1, 0] {
        let r = call(&mut c, both()).await;
        assert_eq!(
            (r.overall_code, r.statuses[0].code, r.statuses[1].code),
            (OK, OVER, OK),
            "{r:?}"
        );
        assert_eq!(r.statuses[1].limit_remaining, remaining);
    }
    // Both over: over.
    let r = call(&mut c, both()).await;
    assert_eq!(
        (r.overall_code, r.statuses[0].code, r.statuses[1].code),
        (OVER, OVER, OVER)
    );
    // A quota descriptor alone and over: all of them are over.
    let r = call(&mut c, request("quota", &[&[("daily", "a")]], 1)).await;
    assert_eq!(r.overall_code, OVER);
    // A plain limit over is over whatever the quota descriptors say.
    let r = call(
        &mut c,
        request("quota", &[&[("daily", "b")], &[("user", "u")]], 101),
    )
    .await;
    assert_eq!((r.overall_code, r.statuses[1].code), (OVER, OVER), "{r:?}");
}

const PLAIN: &str = r#"
domain: shadow
descriptors:
  - key: user
    rate_limit: { unit: hour, requests_per_unit: 2 }
"#;

#[tokio::test]
async fn global_shadow_mode_answers_ok_while_statuses_and_stats_say_over() {
    let dir = ConfigDir::new(&[("shadow.yaml", PLAIN)]);
    let server = Server::start(&dir.path, &["--shadow-mode"]);
    let mut c = server.client().await;
    let user = || request("shadow", &[&[("user", "ada")]], 1);
    for _ in 0..2 {
        let r = call(&mut c, user()).await;
        assert_eq!((r.overall_code, r.statuses[0].code), (OK, OK));
    }
    for _ in 0..3 {
        let r = call(&mut c, user()).await;
        assert_eq!((r.overall_code, r.statuses[0].code), (OK, OVER), "{r:?}");
    }
    let over = metric(
        server.http,
        "ratewall_server_over_limit_total{descriptor=\"shadow.user\"}",
    )
    .await;
    assert_eq!(over, Some(3));
    // The same configuration without the flag limits.
    drop((c, server));
    let server = Server::start(&dir.path, &[]);
    let mut c = server.client().await;
    for _ in 0..2 {
        call(&mut c, user()).await;
    }
    assert_eq!(call(&mut c, user()).await.overall_code, OVER);
}

const ORDER: &str = r#"
domain: order
descriptors:
  - key: file
    value: test1
    rate_limit: { unit: hour, requests_per_unit: 50 }
  - key: file
    value: test*
    share_threshold: true
    rate_limit: { unit: hour, requests_per_unit: 100 }
  - key: file
    value: t*
    rate_limit: { unit: hour, requests_per_unit: 7 }
  - key: file
    rate_limit: { unit: hour, requests_per_unit: 3 }
"#;

/// envoyproxy/ratelimit's `GetLimit` at one level: the exact `key_value`
/// first, then the wildcards in the order written (the first that matches
/// wins), then the bare `key`. From its `test/config/share_threshold.yaml`
/// ("explicit value takes precedence over wildcard with share_threshold").
#[tokio::test]
async fn exact_value_then_wildcards_in_written_order_then_bare_key() {
    let dir = ConfigDir::new(&[("order.yaml", ORDER)]);
    let server = Server::start(&dir.path, &[]);
    let mut c = server.client().await;
    let mut limit = async |value: &str| {
        let r = call(&mut c, request("order", &[&[("file", value)]], 1)).await;
        let s = &r.statuses[0];
        (
            s.current_limit.as_ref().unwrap().requests_per_unit,
            s.limit_remaining,
        )
    };
    assert_eq!(limit("test1").await, (50, 49));
    // `test*` before `t*`; shared: test2 and test3 count on one counter.
    assert_eq!(limit("test2").await, (100, 99));
    assert_eq!(limit("test3").await, (100, 98));
    assert_eq!(limit("test1").await, (50, 48));
    // Only `t*` matches; not shared: each value its own.
    assert_eq!(limit("tx").await, (7, 6));
    assert_eq!(limit("ty").await, (7, 6));
    // No value pattern matches: the bare key.
    assert_eq!(limit("other").await, (3, 2));
}

/// A call over its limit takes nothing from it (ratewall's choice, stated
/// in docs/gateway.md): envoyproxy/ratelimit adds `hits_addend` to the
/// window's counter whether or not the call is over (Redis `INCRBY`, then
/// compare), so there a call whose cost did not fit uses the window up and
/// a smaller call after it is over too; here the smaller call fits in what
/// the limit has left.
#[tokio::test]
async fn a_call_over_by_its_cost_takes_nothing_and_a_smaller_one_still_fits() {
    let yaml = "domain: cost\ndescriptors:\n  - key: k\n    rate_limit: { unit: hour, requests_per_unit: 5 }\n";
    let dir = ConfigDir::new(&[("cost.yaml", yaml)]);
    let server = Server::start(&dir.path, &[]);
    let mut c = server.client().await;
    let k = |hits| request("cost", &[&[("k", "v")]], hits);
    let r = call(&mut c, k(3)).await;
    assert_eq!((r.overall_code, r.statuses[0].limit_remaining), (OK, 2));
    assert_eq!(call(&mut c, k(3)).await.overall_code, OVER);
    // The refused 3 took nothing: 2 are left, so a call of 2 passes and
    // leaves none.
    let r = call(&mut c, k(2)).await;
    assert_eq!(
        (r.overall_code, r.statuses[0].limit_remaining),
        (OK, 0),
        "{r:?}"
    );
    assert_eq!(call(&mut c, k(1)).await.overall_code, OVER);
}
