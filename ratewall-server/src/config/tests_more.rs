//! More matching tests: YAML scalars, the `policy` extension, ids across
//! loads, `replaces`, README examples 1-11, `load_dir`.

use std::sync::Arc;

use ratewall::{Policy, PolicyAlgorithm, Rate, Window};

use super::tests::{counter, load, rate, stats, BASIC};
use super::*;

#[test]
fn scalars_read_as_go_yaml_v2_reads_them() {
    let c = load(
        r#"
domain: 1.0
descriptors:
  - key: zip
    value: 007
    shadow_mode: yes
    rate_limit: { unit: SECOND, requests_per_unit: 0x10 }
  - key: 42
    value: true
    quota_mode: on
    rate_limit: { unit: Minute, requests_per_unit: 010 }
  - key: "quoted"
    value: '1_000'
    rate_limit: { unit: hour, requests_per_unit: 1_000 }
"#,
    );
    let zip = c.find("1.0", &[("zip", "007")], None).unwrap();
    assert!(zip.limit.shadow_mode);
    assert!(matches!(
        zip.limit.kind,
        LimitKind::Limited {
            requests_per_unit: 16,
            unit: Unit::Second,
            ..
        }
    ));
    assert!(c.find("1.0", &[("zip", "7")], None).is_none());
    let n = c.find("1.0", &[("42", "true")], None).unwrap();
    assert!(n.limit.quota_mode);
    assert!(matches!(
        n.limit.kind,
        LimitKind::Limited {
            requests_per_unit: 8,
            unit: Unit::Minute,
            ..
        }
    ));
    assert_eq!(
        rate(&c, "1.0", &[("quoted", "1_000")]),
        Some((1000, Unit::Hour))
    );
}

#[test]
fn policy_extension_for_every_algorithm() {
    let c = load(
        r#"
domain: p
descriptors:
  - key: tb
    rate_limit: { policy: "100/min burst 20", name: tb }
  - key: sw
    rate_limit: { policy: "100/min sliding-window" }
  - key: sl
    rate_limit: { policy: "5/h sliding-log" }
  - key: fw
    rate_limit: { policy: "100/min fixed-window" }
  - key: lb
    rate_limit: { policy: "10/s leaky queue 20", replaces: [{ name: tb }] }
  - key: odd
    rate_limit: { policy: "7/90s" }
  - key: day
    rate_limit: { policy: 1000/d }
"#,
    );
    let kind = |k: &str| c.find("p", &[(k, "v")], None).unwrap().limit.kind.clone();
    let expect = [
        (
            "tb",
            Policy::token_bucket(Rate::per_minute(100).burst(20)),
            100,
            Unit::Minute,
        ),
        (
            "sw",
            Policy::sliding_window_counter(Window::per_minute(100)),
            100,
            Unit::Minute,
        ),
        (
            "sl",
            Policy::sliding_window_log(Window::per_hour(5)),
            5,
            Unit::Hour,
        ),
        (
            "fw",
            Policy::fixed_window(Window::per_minute(100)),
            100,
            Unit::Minute,
        ),
        (
            "lb",
            Policy::leaky_bucket(Rate::per_second(10).burst(20)),
            10,
            Unit::Second,
        ),
        (
            "odd",
            Policy::token_bucket(Rate::new(7, std::time::Duration::from_secs(90))),
            7,
            Unit::Unknown,
        ),
        (
            "day",
            Policy::token_bucket(Rate::per_day(1000)),
            1000,
            Unit::Day,
        ),
    ];
    for (key, policy, requests_per_unit, unit) in expect {
        assert_eq!(
            kind(key),
            LimitKind::Limited {
                policy,
                requests_per_unit,
                unit
            },
            "{key}"
        );
    }
    let algorithms: Vec<PolicyAlgorithm> = ["tb", "sw", "sl", "fw", "lb"]
        .iter()
        .map(|k| match kind(k) {
            LimitKind::Limited { policy, .. } => policy.algorithm(),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(
        algorithms,
        [
            PolicyAlgorithm::TokenBucket,
            PolicyAlgorithm::SlidingWindowCounter,
            PolicyAlgorithm::SlidingWindowLog,
            PolicyAlgorithm::FixedWindow,
            PolicyAlgorithm::LeakyBucket
        ]
    );
    let lb = c.find("p", &[("lb", "v")], None).unwrap();
    assert_eq!(lb.limit.replaces, ["tb"]);
}

#[test]
fn ids_are_stable_across_loads_and_change_with_counting() {
    let base = "domain: d\ndescriptors:\n  - key: a\n    value: x*\n    share_threshold: true\n    rate_limit: { unit: minute, requests_per_unit: 10 }\n  - key: b\n    rate_limit: { policy: 5/s }\n";
    let id = |yaml: &str, key: &str, value: &str| {
        load(yaml)
            .find("d", &[(key, value)], None)
            .unwrap()
            .limit
            .id
            .clone()
    };
    let (a, b) = (id(base, "a", "x1"), id(base, "b", "1"));
    assert_ne!(a, b);
    assert_eq!(a, id(base, "a", "x2"));
    // Reloaded unchanged, or with settings that do not count: same ids.
    assert_eq!(a, id(base, "a", "x1"));
    let cosmetic = base
        .replace(
            "share_threshold: true\n",
            "share_threshold: true\n    shadow_mode: true\n    detailed_metric: true\n",
        )
        .replace("{ policy: 5/s }", "{ policy: 5/s, name: n }");
    assert_eq!(a, id(&cosmetic, "a", "x1"));
    assert_eq!(b, id(&cosmetic, "b", "1"));
    // Reordered: same ids.
    let reordered = "domain: d\ndescriptors:\n  - key: b\n    rate_limit: { policy: 5/s }\n  - key: a\n    value: x*\n    share_threshold: true\n    rate_limit: { unit: minute, requests_per_unit: 10 }\n";
    assert_eq!(a, id(reordered, "a", "x1"));
    // Counting changes: new ids.
    assert_ne!(
        a,
        id(
            &base.replace("requests_per_unit: 10", "requests_per_unit: 11"),
            "a",
            "x1"
        )
    );
    assert_ne!(
        a,
        id(&base.replace("unit: minute", "unit: hour"), "a", "x1")
    );
    assert_ne!(
        a,
        id(
            &base.replace("share_threshold: true", "share_threshold: false"),
            "a",
            "x1"
        )
    );
    assert_ne!(b, id(&base.replace("5/s", "5/s sliding-window"), "b", "1"));
    assert_ne!(
        b,
        id(&base.replace("key: b", "key: b\n    value: 1"), "b", "1")
    );
    let other_domain = load(&base.replace("domain: d", "domain: e"));
    assert_ne!(
        a,
        other_domain
            .find("e", &[("a", "x1")], None)
            .unwrap()
            .limit
            .id
    );
    // Ids are unique within a configuration.
    let c = load(BASIC);
    let mut ids: Vec<String> = c.limits().iter().map(|l| l.id.clone()).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), c.limits().len());
}

#[test]
fn replaces_drops_the_replaced_limits_of_one_request() {
    // README example 7.
    let c = load(
        r#"
domain: example7
descriptors:
  - key: key_1
    value: value_1
    descriptors:
      - key: user
        value: bkthomps
        rate_limit: { name: specific_limit, requests_per_unit: 5, unit: second }
  - key: key_2
    value: value_2
    descriptors:
      - key: user
        value: bkthomps
        rate_limit:
          replaces:
            - name: specific_limit
          requests_per_unit: 10
          unit: second
  - key: free
    rate_limit: { unlimited: true, name: specific_limit }
  - key: chain
    rate_limit: { name: chained, replaces: [{ name: specific_limit }], unit: second, requests_per_unit: 1 }
  - key: chain2
    rate_limit: { replaces: [{ name: chained }], unit: second, requests_per_unit: 1 }
"#,
    );
    let f = |e: &[(&str, &str)]| c.find("example7", e, None);
    let first = [("key_1", "value_1"), ("user", "bkthomps")];
    let second = [("key_2", "value_2"), ("user", "bkthomps")];
    let mut alone = [f(&first)];
    apply_replaces(&mut alone);
    assert!(alone[0].is_some());
    let mut both = [f(&first), f(&second), None];
    apply_replaces(&mut both);
    assert!(both[0].is_none());
    assert!(matches!(
        both[1].as_ref().unwrap().limit.kind,
        LimitKind::Limited {
            requests_per_unit: 10,
            ..
        }
    ));
    assert!(both[2].is_none());
    // An unlimited limit is never dropped.
    let mut free = [f(&[("free", "x")]), f(&second)];
    apply_replaces(&mut free);
    assert!(free[0].is_some());
    // A replacing limit that is itself replaced still replaces (Go).
    let mut chain = [f(&first), f(&[("chain", "x")]), f(&[("chain2", "x")])];
    apply_replaces(&mut chain);
    assert!(chain[0].is_none() && chain[1].is_none() && chain[2].is_some());
}

#[test]
fn readme_examples_1_to_6() {
    let one = load("domain: mongo_cps\ndescriptors:\n  - key: database\n    value: users\n    rate_limit: { unit: second, requests_per_unit: 500 }\n  - key: database\n    value: default\n    rate_limit: { unit: second, requests_per_unit: 500 }\n");
    assert_eq!(
        rate(&one, "mongo_cps", &[("database", "users")]),
        Some((500, Unit::Second))
    );
    assert_eq!(
        rate(&one, "mongo_cps", &[("database", "default")]),
        Some((500, Unit::Second))
    );
    assert!(one
        .find("mongo_cps", &[("database", "other")], None)
        .is_none());

    let two = load("domain: messaging\ndescriptors:\n  - key: message_type\n    value: marketing\n    descriptors:\n      - key: to_number\n        rate_limit: { unit: day, requests_per_unit: 5 }\n  - key: to_number\n    rate_limit: { unit: day, requests_per_unit: 100 }\n");
    let m1 = [("message_type", "marketing"), ("to_number", "2061111111")];
    let m2 = [("message_type", "marketing"), ("to_number", "2062222222")];
    assert_eq!(rate(&two, "messaging", &m1), Some((5, Unit::Day)));
    assert_ne!(
        counter(&two, "messaging", &m1),
        counter(&two, "messaging", &m2)
    );
    assert_eq!(
        rate(&two, "messaging", &[("to_number", "2061111111")]),
        Some((100, Unit::Day))
    );

    let three = load("domain: edge_proxy_per_ip\ndescriptors:\n  - key: remote_address\n    rate_limit: { unit: second, requests_per_unit: 10 }\n  - key: remote_address\n    value: 50.0.0.5\n    rate_limit: { unit: second, requests_per_unit: 0 }\n");
    assert_eq!(
        rate(
            &three,
            "edge_proxy_per_ip",
            &[("remote_address", "50.0.0.1")]
        ),
        Some((10, Unit::Second))
    );
    let blocked = three
        .find("edge_proxy_per_ip", &[("remote_address", "50.0.0.5")], None)
        .unwrap();
    assert_eq!(
        blocked.limit.kind,
        LimitKind::Blocked { unit: Unit::Second }
    );

    let four_a = load("domain: example4\ndescriptors:\n  - key: key\n    value: value\n    rate_limit: { requests_per_unit: 300, unit: second }\n");
    let req = [("key", "value"), ("subkey", "subvalue")];
    assert!(four_a.find("example4", &req, None).is_none());
    let four_b = load("domain: example4\ndescriptors:\n  - key: key\n    value: value\n    descriptors:\n      - key: subkey\n        rate_limit: { requests_per_unit: 300, unit: second }\n");
    assert_eq!(rate(&four_b, "example4", &req), Some((300, Unit::Second)));

    let five = load("domain: internal\ndescriptors:\n  - key: ldap\n    rate_limit: { unlimited: true }\n  - key: azure\n    rate_limit: { unit: minute, requests_per_unit: 100 }\n");
    assert_eq!(
        five.find("internal", &[("ldap", "x")], None)
            .unwrap()
            .limit
            .kind,
        LimitKind::Unlimited
    );
    assert_eq!(
        rate(&five, "internal", &[("azure", "x")]),
        Some((100, Unit::Minute))
    );

    let six = load("domain: example6\ndescriptors:\n  - key: service\n    descriptors:\n      - key: user\n        value: user-a\n        rate_limit: { requests_per_unit: 10, unit: second }\n        shadow_mode: true\n      - key: user\n        value: user-b\n        rate_limit: { requests_per_unit: 20, unit: second }\n");
    let a = six
        .find(
            "example6",
            &[("service", "auth-service"), ("user", "user-a")],
            None,
        )
        .unwrap();
    assert!(a.limit.shadow_mode);
    let b = six
        .find(
            "example6",
            &[("service", "auth-service"), ("user", "user-b")],
            None,
        )
        .unwrap();
    assert!(!b.limit.shadow_mode);
    assert!(six
        .find(
            "example6",
            &[("service", "auth-service"), ("user", "user-c")],
            None
        )
        .is_none());
}

#[test]
fn readme_examples_8_to_11() {
    let eight = load("domain: example8\ndescriptors:\n  - key: key1\n    detailed_metric: true\n    rate_limit: { unit: minute, requests_per_unit: 10 }\n  - key: key1\n    value: value1\n    rate_limit: { unit: minute, requests_per_unit: 20 }\n");
    assert_eq!(
        stats(&eight, "example8", &[("key1", "unspecified_value")]),
        "example8.key1_unspecified_value"
    );
    assert_eq!(
        stats(&eight, "example8", &[("key1", "unspecified_value2")]),
        "example8.key1_unspecified_value2"
    );
    assert_eq!(
        stats(&eight, "example8", &[("key1", "value1")]),
        "example8.key1_value1"
    );
    assert_eq!(
        rate(&eight, "example8", &[("key1", "value1")]),
        Some((20, Unit::Minute))
    );

    let nine = load("domain: example9\ndescriptors:\n  - key: key1\n    value: value*\n    rate_limit: { unit: minute, requests_per_unit: 20 }\n  - key: path\n    value: /api/*/action\n    rate_limit: { unit: minute, requests_per_unit: 20 }\n  - key: route\n    value: /api/*/resource/*/action\n    rate_limit: { unit: minute, requests_per_unit: 20 }\n");
    for (k, v, ok) in [
        ("key1", "value1", true),
        ("key1", "valueXYZ", true),
        ("key1", "valu", false),
        ("path", "/api/123/action", true),
        ("path", "/api/user-id/action", true),
        ("path", "/api/123/other", false),
        ("route", "/api/v1/resource/123/action", true),
        ("route", "/api/v2/resource/456/action", true),
        ("route", "/api/v2/thing/456/action", false),
    ] {
        assert_eq!(
            nine.find("example9", &[(k, v)], None).is_some(),
            ok,
            "{k}={v}"
        );
    }

    let ten = load("domain: example10\ndescriptors:\n  - key: route\n    value_to_metric: true\n    descriptors:\n      - key: http_method\n        value_to_metric: true\n        descriptors:\n          - key: subject_id\n            rate_limit: { unit: minute, requests_per_unit: 60 }\n");
    assert_eq!(
        stats(
            &ten,
            "example10",
            &[
                ("route", "api"),
                ("http_method", "GET"),
                ("subject_id", "123")
            ]
        ),
        "example10.route_api.http_method_GET.subject_id"
    );
    let ten_w = load("domain: example10_wildcard\ndescriptors:\n  - key: user\n    value_to_metric: true\n    descriptors:\n      - key: action\n        value: read*\n        value_to_metric: true\n        descriptors:\n          - key: resource\n            rate_limit: { unit: minute, requests_per_unit: 100 }\n");
    assert_eq!(
        stats(
            &ten_w,
            "example10_wildcard",
            &[
                ("user", "alice"),
                ("action", "readfile"),
                ("resource", "documents")
            ]
        ),
        "example10_wildcard.user_alice.action_readfile.resource"
    );

    let eleven = load("domain: example11\ndescriptors:\n  - key: files\n    value: files/*\n    share_threshold: true\n    rate_limit: { unit: hour, requests_per_unit: 10 }\n  - key: files_no_share\n    value: files_no_share/*\n    share_threshold: false\n    rate_limit: { unit: hour, requests_per_unit: 10 }\n");
    let shared: Vec<_> = ["files/a.pdf", "files/b.csv", "files/c.txt"]
        .iter()
        .map(|v| counter(&eleven, "example11", &[("files", v)]))
        .collect();
    assert!(shared.windows(2).all(|w| w[0] == w[1]));
    assert_ne!(
        counter(
            &eleven,
            "example11",
            &[("files_no_share", "files_no_share/a.pdf")]
        ),
        counter(
            &eleven,
            "example11",
            &[("files_no_share", "files_no_share/b.csv")]
        )
    );
    // The code (and Go's tests) keep the `*` in the stats key; the README's
    // prose says `route_api`, but Go answers `route_api/*`.
    let eleven_m = load("domain: example11_metrics\ndescriptors:\n  - key: route\n    value: api/*\n    share_threshold: true\n    value_to_metric: true\n    descriptors:\n      - key: method\n        rate_limit: { unit: minute, requests_per_unit: 60 }\n");
    assert_eq!(
        stats(
            &eleven_m,
            "example11_metrics",
            &[("route", "api/v1"), ("method", "GET")]
        ),
        "example11_metrics.route_api/*.method"
    );
}

#[test]
fn load_dir_reads_every_file_like_go() {
    let dir = std::env::temp_dir().join(format!("ratewall-cfg-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("sub")).unwrap();
    let file = |name: &str, domain: &str| {
        let text = format!("domain: {domain}\ndescriptors:\n  - key: k\n    rate_limit: {{ unit: second, requests_per_unit: 1 }}\n");
        std::fs::write(dir.join(name), text).unwrap();
    };
    file("a.yaml", "a");
    file("b.conf", "b");
    file("sub/c.yml", "c");
    file(".hidden", "h");
    let c = Config::load_dir(&dir).unwrap();
    for d in ["a", "b", "c", "h"] {
        assert!(c.has_domain(d), "{d}");
    }
    let c = Config::load_dir_with(&dir, &LoadOptions::default().ignore_dot_files(true)).unwrap();
    assert!(c.has_domain("a") && !c.has_domain("h"));
    file("sub/dup.yaml", "a");
    let err = Config::load_dir(&dir).unwrap_err();
    assert!(err.file.ends_with("dup.yaml"), "{err}");
    assert_eq!((err.line, err.field.as_str()), (1, "domain"));
    let _ = std::fs::remove_dir_all(&dir);
    let missing = Config::load_dir(&dir).unwrap_err();
    assert_eq!(missing.line, 0);
    assert!(Config::load_dir(&dir.join("nothing")).is_err());
}

#[test]
fn empty_configuration_finds_nothing() {
    let c = Config::from_sources(&[]).unwrap();
    assert!(c.is_empty());
    assert!(c.limits().is_empty());
    assert!(c
        .find("d", &[("a", "b")], Some((1, Unit::Second)))
        .is_none());
    let c = load("domain: d\n");
    assert!(!c.is_empty() && c.has_domain("d"));
    assert!(c.find("d", &[("a", "b")], None).is_none());
}

#[test]
fn limits_are_shared_not_copied() {
    let c = load(BASIC);
    let a = c.find("shop", &[("path", "/a")], None).unwrap();
    let b = c.find("shop", &[("path", "/b")], None).unwrap();
    assert!(Arc::ptr_eq(&a.limit, &b.limit));
    assert!(c.limits().iter().any(|l| Arc::ptr_eq(l, &a.limit)));
}

#[test]
fn anchors_and_merge_keys_read_as_yaml_v2_does() {
    let c = load(
        r#"
domain: a
descriptors:
  - key: base
    rate_limit: &per_minute { unit: minute, requests_per_unit: 10 }
  - key: same
    rate_limit: *per_minute
  - key: more
    rate_limit:
      <<: *per_minute
      requests_per_unit: 20
  - key: both
    rate_limit:
      <<: [{ name: merged }, *per_minute]
"#,
    );
    assert_eq!(rate(&c, "a", &[("same", "x")]), Some((10, Unit::Minute)));
    assert_eq!(rate(&c, "a", &[("more", "x")]), Some((20, Unit::Minute)));
    assert_eq!(rate(&c, "a", &[("both", "x")]), Some((10, Unit::Minute)));
    let both = c.find("a", &[("both", "x")], None).unwrap();
    assert_eq!(both.limit.name.as_deref(), Some("merged"));
}
