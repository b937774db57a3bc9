//! Unit tests of the configuration's parsers (`config.rs`).

use super::*;

#[test]
fn keys_parse_alone_and_joined() {
    for ok in [
        "ip",
        "IP",
        "route",
        "global",
        "header:x-api-key",
        " ip + header : X-Key ",
    ] {
        assert!(parse_key(ok).is_some(), "{ok}");
    }
    assert!(parse_key("ip + route").unwrap().needs_client_ip());
    assert!(!parse_key("header:x-api-key").unwrap().needs_client_ip());
    for bad in [
        "",
        "ip +",
        "user",
        "header:",
        "header:bad name",
        "cookie:x",
        "ip route",
    ] {
        assert!(parse_key(bad).is_none(), "{bad}");
    }
}

#[cfg(feature = "redis")]
#[test]
fn failure_policies_parse_strictly() {
    use crate::redis::FailurePolicy;
    use crate::{Policy, Rate};
    assert_eq!(parse_failure("open"), Some(FailurePolicy::Open));
    assert_eq!(parse_failure(" Closed "), Some(FailurePolicy::Closed));
    assert_eq!(
        parse_failure("fallback-share 4"),
        Some(FailurePolicy::FallbackShare { instances: 4 })
    );
    assert_eq!(
        parse_failure("fallback 10/s"),
        Some(FailurePolicy::Fallback(Policy::token_bucket(
            Rate::per_second(10)
        )))
    );
    for bad in [
        "",
        "opened",
        "open now",
        "closed 1",
        "fallback",
        "fallback 10/lightyear",
        "fallback-share",
        "fallback-share 0",
        "fallback-share -1",
        "fallback-share four",
    ] {
        assert_eq!(parse_failure(bad), None, "{bad}");
    }
    assert!(redis_name("shop-1"));
    for bad in ["", "a:b", "a b", "{x}", &"x".repeat(65)] {
        assert!(!redis_name(bad), "{bad}");
    }
}

#[test]
fn missing_and_methods_parse_strictly() {
    assert_eq!(parse_missing("skip"), Some(Missing::Skip));
    assert_eq!(
        parse_missing("reject 401"),
        Some(Missing::Reject(StatusCode::UNAUTHORIZED))
    );
    for bad in [
        "",
        "reject",
        "reject 200",
        "reject 600",
        "reject 401 now",
        "drop",
    ] {
        assert_eq!(parse_missing(bad), None, "{bad}");
    }
    assert_eq!(parse_method("POST"), Some(Method::POST));
    assert_eq!(
        parse_method("PURGE").map(|m| m.to_string()),
        Some("PURGE".into())
    );
    for bad in ["post", "", "GE T"] {
        assert_eq!(parse_method(bad), None, "{bad}");
    }
}

#[test]
fn a_rule_from_a_file_evicts_when_full_unless_it_says_otherwise() {
    use crate::keyed::WhenFull;
    let header = RuleConfig::new("key", "header:x-api-key", "1000/day");
    assert_eq!(
        header.to_rule().unwrap().table.when_full,
        WhenFull::EvictLeastRecent
    );
    let reject = RuleConfig {
        when_full: Some("reject-new".into()),
        lockout_max_keys: Some(9),
        ..header
    };
    let rule = reject.to_rule().unwrap();
    assert_eq!(rule.table.when_full, WhenFull::RejectNew);
    assert_eq!(rule.lockout_max_keys, Some(9));
}
