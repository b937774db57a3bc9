//! Matching: envoyproxy/ratelimit's configuration tests and README
//! examples, rewritten as our own YAML, plus ratewall's `policy`.

use ratewall::{Policy, Window};

use super::*;

pub(super) fn load(yaml: &str) -> Config {
    match Config::from_sources(&[("t.yaml".to_string(), yaml.to_string())]) {
        Ok(c) => c,
        Err(e) => panic!("{e}"),
    }
}

/// `(requests_per_unit, unit)` of a counted limit, `None` when unmatched;
/// panics on another kind.
pub(super) fn rate(c: &Config, domain: &str, entries: &[(&str, &str)]) -> Option<(u32, Unit)> {
    let found = c.find(domain, entries, None)?;
    match found.limit.kind {
        LimitKind::Limited {
            requests_per_unit,
            unit,
            ..
        } => Some((requests_per_unit, unit)),
        ref other => panic!("not counted: {other:?}"),
    }
}

pub(super) fn stats(c: &Config, domain: &str, entries: &[(&str, &str)]) -> String {
    match c.find(domain, entries, None) {
        Some(f) => f.stats_key,
        None => panic!("no limit for {entries:?}"),
    }
}

pub(super) fn counter(c: &Config, domain: &str, entries: &[(&str, &str)]) -> Vec<u8> {
    match c.find(domain, entries, None) {
        Some(f) => f.counter_key,
        None => panic!("no limit for {entries:?}"),
    }
}

pub(super) const BASIC: &str = r#"
domain: shop
descriptors:
  - key: tenant
    value: acme
    descriptors:
      - key: user                 # any user of acme
        rate_limit: { unit: second, requests_per_unit: 5 }
      - key: user
        value: vip                # one user of acme
        rate_limit: { unit: second, requests_per_unit: 10 }
  - key: path
    rate_limit: { unit: minute, requests_per_unit: 20 }
  - key: path
    value: /cart
    rate_limit: { unit: minute, requests_per_unit: 30 }
  - key: path
    value: /health                # no limit: allowed without counting
  - key: ip
    rate_limit: { unit: hour, requests_per_unit: 1 }
  - key: token
    rate_limit: { name: token_limit, unit: day, requests_per_unit: 1 }
  - key: region
    value: eu
    rate_limit: { unit: day, requests_per_unit: 15 }
    descriptors:
      - key: zone
        value: a
        rate_limit: { unit: day, requests_per_unit: 25 }
  - key: internal
    rate_limit: { unlimited: true }
  - key: client
    detailed_metric: true
    rate_limit: { unit: minute, requests_per_unit: 70 }
"#;

#[test]
fn basic_tree_matches_as_go_does() {
    let c = load(BASIC);
    assert!(c.find("nope", &[("path", "/x")], None).is_none());
    assert!(c.find("shop", &[], None).is_none());
    // A level without limit, and a request deeper than the tree.
    assert!(c.find("shop", &[("tenant", "acme")], None).is_none());
    assert!(c
        .find(
            "shop",
            &[("tenant", "acme"), ("user", "u"), ("x", "y")],
            None
        )
        .is_none());
    assert_eq!(
        rate(&c, "shop", &[("tenant", "acme"), ("user", "bob")]),
        Some((5, Unit::Second))
    );
    assert_eq!(
        stats(&c, "shop", &[("tenant", "acme"), ("user", "bob")]),
        "shop.tenant_acme.user"
    );
    assert_eq!(
        rate(&c, "shop", &[("tenant", "acme"), ("user", "vip")]),
        Some((10, Unit::Second))
    );
    assert_eq!(
        stats(&c, "shop", &[("tenant", "acme"), ("user", "vip")]),
        "shop.tenant_acme.user_vip"
    );
    assert_eq!(
        rate(&c, "shop", &[("path", "/a")]),
        Some((20, Unit::Minute))
    );
    assert_eq!(stats(&c, "shop", &[("path", "/a")]), "shop.path");
    assert_eq!(
        rate(&c, "shop", &[("path", "/cart")]),
        Some((30, Unit::Minute))
    );
    assert_eq!(stats(&c, "shop", &[("path", "/cart")]), "shop.path_/cart");
    assert!(c.find("shop", &[("path", "/health")], None).is_none());
    assert_eq!(rate(&c, "shop", &[("ip", "1")]), Some((1, Unit::Hour)));
    let token = c.find("shop", &[("token", "t")], None).unwrap();
    assert_eq!(token.limit.name.as_deref(), Some("token_limit"));
    assert_eq!(rate(&c, "shop", &[("region", "eu")]), Some((15, Unit::Day)));
    assert_eq!(
        rate(&c, "shop", &[("region", "eu"), ("zone", "a")]),
        Some((25, Unit::Day))
    );
    let internal = c.find("shop", &[("internal", "x")], None).unwrap();
    assert_eq!(internal.limit.kind, LimitKind::Unlimited);
    assert_eq!(internal.stats_key, "shop.internal");
    assert_eq!(stats(&c, "shop", &[("client", "c1")]), "shop.client_c1");
    assert_eq!(stats(&c, "shop", &[("client", "c2")]), "shop.client_c2");
    assert_eq!(c.limits().len(), 10);
    // A unit+requests_per_unit limit counts as Go does: a fixed window.
    let path = c.find("shop", &[("path", "/a")], None).unwrap();
    assert!(matches!(path.limit.kind, LimitKind::Limited { policy, .. }
        if policy == Policy::fixed_window(Window::per_minute(20))));
    assert_eq!(path.limit.full_key, "shop.path");
}

#[test]
fn merged_domains_take_both_files() {
    let a = "domain: d\ndescriptors:\n  - key: a\n    value: 1\n    rate_limit: { unit: minute, requests_per_unit: 10 }\n";
    let b = "domain: d\ndescriptors:\n  - key: b\n    value: 2\n    rate_limit: { unit: minute, requests_per_unit: 20 }\n";
    let files = [
        ("a.yaml".to_string(), a.to_string()),
        ("b.yaml".to_string(), b.to_string()),
    ];
    let c = Config::from_sources_with(&files, &LoadOptions::default().merge_domains(true)).unwrap();
    assert_eq!(rate(&c, "d", &[("a", "1")]), Some((10, Unit::Minute)));
    assert_eq!(rate(&c, "d", &[("b", "2")]), Some((20, Unit::Minute)));
    assert!(c.find("d", &[], None).is_none());
    assert_eq!(c.limits().len(), 2);
}

#[test]
fn a_limit_override_counts_per_descriptor_and_rate() {
    let c = load(BASIC);
    assert!(c
        .find("nope", &[("a", "b")], Some((10, Unit::Day)))
        .is_none());
    let entries = [("tenant", "acme"), ("user", "someone")];
    let a = c.find("shop", &entries, Some((10, Unit::Day))).unwrap();
    assert_eq!(a.stats_key, "shop.tenant_acme.user_someone");
    assert_eq!(a.limit.full_key, a.stats_key);
    assert!(matches!(
        a.limit.kind,
        LimitKind::Limited {
            requests_per_unit: 10,
            unit: Unit::Day,
            ..
        }
    ));
    assert!(!a.limit.shadow_mode && a.limit.name.is_none());
    // The same override: the same limit id and counter.
    let again = c.find("shop", &entries, Some((10, Unit::Day))).unwrap();
    assert_eq!(
        (a.limit.id.as_str(), &a.counter_key),
        (again.limit.id.as_str(), &again.counter_key)
    );
    // Another rate: another limit; the stats key stays (as in Go).
    let other = c.find("shop", &entries, Some((42, Unit::Hour))).unwrap();
    assert_ne!(other.limit.id, a.limit.id);
    assert_eq!(other.stats_key, a.stats_key);
    // Another value: another counter.
    let else_ = c
        .find(
            "shop",
            &[("tenant", "acme"), ("user", "else")],
            Some((10, Unit::Day)),
        )
        .unwrap();
    assert_ne!(else_.counter_key, a.counter_key);
    assert_eq!(else_.stats_key, "shop.tenant_acme.user_else");
    // Unmatched descriptors take the override too; an empty value is left out.
    let free = c
        .find("shop", &[("free", ""), ("k", "v")], Some((1, Unit::Second)))
        .unwrap();
    assert_eq!(free.stats_key, "shop.free.k_v");
    // Ids of overrides never equal configured ids, and name the domain.
    assert!(c.limits().iter().all(|l| l.id != a.limit.id));
    let d2 = load("domain: other\ndescriptors: []\n");
    let b = d2.find("other", &entries, Some((10, Unit::Day))).unwrap();
    assert_ne!(b.limit.id, a.limit.id);
    assert_eq!(
        c.find("shop", &entries, Some((0, Unit::Minute)))
            .unwrap()
            .limit
            .kind,
        LimitKind::Blocked { unit: Unit::Minute }
    );
    assert!(c.find("shop", &entries, Some((5, Unit::Unknown))).is_none());
}

#[test]
fn shadow_mode_is_per_limit() {
    let c = load(
        r#"
domain: d
descriptors:
  - key: a
    value: 1
    descriptors:
      - key: b
        rate_limit: { unit: second, requests_per_unit: 5 }
      - key: b
        value: 2
        shadow_mode: true
        rate_limit: { unit: second, requests_per_unit: 10 }
  - key: c
    shadow_mode: true
    rate_limit: { unit: minute, requests_per_unit: 20 }
  - key: c
    value: 3
    rate_limit: { unit: minute, requests_per_unit: 30 }
"#,
    );
    let shadow = |e: &[(&str, &str)]| c.find("d", e, None).unwrap().limit.shadow_mode;
    assert!(!shadow(&[("a", "1"), ("b", "x")]));
    assert!(shadow(&[("a", "1"), ("b", "2")]));
    assert!(shadow(&[("c", "x")]));
    assert!(!shadow(&[("c", "3")]));
}

const WILDCARDS: &str = r#"
domain: w
descriptors:
  - key: wild
    value: foo*
    rate_limit: { unit: minute, requests_per_unit: 20 }
  - key: noWild
    value: foo
    rate_limit: { unit: minute, requests_per_unit: 21 }
  - key: noVal
    rate_limit: { unit: minute, requests_per_unit: 22 }
  - key: midWild
    value: bar*b
    rate_limit: { unit: minute, requests_per_unit: 23 }
  - key: multiWild
    value: foo*bar*baz
    rate_limit: { unit: minute, requests_per_unit: 10 }
  - key: nestedWild
    value: val1
    descriptors:
      - key: wild
        value: goo*
        rate_limit: { unit: minute, requests_per_unit: 24 }
"#;

#[test]
fn wildcards_match_anywhere_in_the_value() {
    let c = load(WILDCARDS);
    assert_eq!(stats(&c, "w", &[("noVal", "x")]), "w.noVal");
    assert_eq!(stats(&c, "w", &[("noVal", "y")]), "w.noVal");
    assert_eq!(
        rate(&c, "w", &[("noWild", "foo")]),
        Some((21, Unit::Minute))
    );
    assert!(c.find("w", &[("noWild", "foo1")], None).is_none());
    for v in ["foo", "foo1", "foo/bar"] {
        assert_eq!(stats(&c, "w", &[("wild", v)]), "w.wild_foo*", "{v}");
    }
    assert!(c.find("w", &[("wild", "fo")], None).is_none());
    assert!(c.find("w", &[("wild", "xfoo")], None).is_none());
    assert_eq!(
        stats(&c, "w", &[("nestedWild", "val1"), ("wild", "goo2")]),
        "w.nestedWild_val1.wild_goo*"
    );
    for (v, ok) in [
        ("barb", true),
        ("barXb", true),
        ("barXYb", true),
        ("barba", false),
        ("bar", false),
    ] {
        assert_eq!(c.find("w", &[("midWild", v)], None).is_some(), ok, "{v}");
    }
    assert_eq!(stats(&c, "w", &[("midWild", "bar1b")]), "w.midWild_bar*b");
    for (v, ok) in [
        ("foobarbaz", true),
        ("foo1bar2baz", true),
        ("foo-bar-bar-baz", true),
        ("foobaz", false),
        ("foo1baz2bar", false),
        ("foobarba", false),
    ] {
        assert_eq!(c.find("w", &[("multiWild", v)], None).is_some(), ok, "{v}");
    }
    assert_eq!(
        stats(&c, "w", &[("multiWild", "foo1bar2baz")]),
        "w.multiWild_foo*bar*baz"
    );
    // Without share_threshold, each value keeps its own counter.
    assert_ne!(
        counter(&c, "w", &[("wild", "foo1")]),
        counter(&c, "w", &[("wild", "foo2")])
    );
}

#[test]
fn exact_value_then_first_wildcard_then_key() {
    let c = load(
        r#"
domain: p
descriptors:
  - key: k
    rate_limit: { unit: second, requests_per_unit: 1 }
  - key: k
    value: ab*
    rate_limit: { unit: second, requests_per_unit: 2 }
  - key: k
    value: a*
    rate_limit: { unit: second, requests_per_unit: 3 }
  - key: k
    value: abc
    rate_limit: { unit: second, requests_per_unit: 4 }
"#,
    );
    assert_eq!(rate(&c, "p", &[("k", "abc")]), Some((4, Unit::Second)));
    assert_eq!(rate(&c, "p", &[("k", "abd")]), Some((2, Unit::Second)));
    assert_eq!(rate(&c, "p", &[("k", "ax")]), Some((3, Unit::Second)));
    assert_eq!(rate(&c, "p", &[("k", "x")]), Some((1, Unit::Second)));
    // A wildcard node without limit still wins over the key: no limit.
    let c = load("domain: p\ndescriptors:\n  - key: k\n    rate_limit: { unit: second, requests_per_unit: 1 }\n  - key: k\n    value: a*\n");
    assert!(c.find("p", &[("k", "ab")], None).is_none());
    assert_eq!(rate(&c, "p", &[("k", "b")]), Some((1, Unit::Second)));
}

#[test]
fn detailed_metric_names_every_value() {
    let c = load(
        r#"
domain: nested
descriptors:
  - key: key_1
    detailed_metric: true
    rate_limit: { unit: minute, requests_per_unit: 500 }
  - key: key_1
    value: some-value-for-key-1
    rate_limit: { unit: minute, requests_per_unit: 500 }
  - key: key_2
    detailed_metric: true
    rate_limit: { unit: minute, requests_per_unit: 5000 }
    descriptors:
      - key: key_3
        detailed_metric: true
      - key: key_3
        value: requested-key3-value
        detailed_metric: true
        rate_limit: { unit: minute, requests_per_unit: 5 }
  - key: key-1
    detailed_metric: true
    rate_limit: { unit: minute, requests_per_unit: 100 }
    descriptors:
      - key: key-2
        detailed_metric: true
        rate_limit: { unit: minute, requests_per_unit: 5 }
  - key: plain-1
    rate_limit: { unit: minute, requests_per_unit: 100 }
    descriptors:
      - key: plain-2
        rate_limit: { unit: minute, requests_per_unit: 5 }
"#,
    );
    let cases: [(&[(&str, &str)], &str); 8] = [
        (&[("key-1", "value-1")], "nested.key-1_value-1"),
        (&[("plain-1", "value-1")], "nested.plain-1"),
        (
            &[("key-1", "value-1"), ("key-2", "value-2")],
            "nested.key-1_value-1.key-2_value-2",
        ),
        (
            &[("plain-1", "value-1"), ("plain-2", "value-2")],
            "nested.plain-1.plain-2",
        ),
        (
            &[("key_1", "value-for-key-1")],
            "nested.key_1_value-for-key-1",
        ),
        (&[("key_2", "key-2-value")], "nested.key_2_key-2-value"),
        (
            &[("key_2", "key-2-value"), ("key_3", "requested-key3-value")],
            "nested.key_2_key-2-value.key_3_requested-key3-value",
        ),
        // Go writes `key_` for an empty value under detailed_metric.
        (&[("key-1", "")], "nested.key-1_"),
    ];
    for (entries, want) in cases {
        assert_eq!(stats(&c, "nested", entries), want, "{entries:?}");
    }
}

const VALUE_TO_METRIC: &str = r#"
domain: d
descriptors:
  - key: route
    value_to_metric: true
    descriptors:
      - key: http_method
        value_to_metric: true
        descriptors:
          - key: subject_id
            rate_limit: { unit: minute, requests_per_unit: 60 }
      - key: verb
        value: GET
        value_to_metric: true
        descriptors:
          - key: subject_id
            rate_limit: { unit: minute, requests_per_unit: 60 }
      - key: act
        value: read*
        value_to_metric: true
        descriptors:
          - key: resource
            rate_limit: { unit: minute, requests_per_unit: 100 }
      - key: leaf
        descriptors:
          - key: subject_id
            detailed_metric: true
            rate_limit: { unit: minute, requests_per_unit: 60 }
  - key: k1
    descriptors:
      - key: k2
        value_to_metric: true
        descriptors:
          - key: k3
            rate_limit: { unit: second, requests_per_unit: 1 }
      - key: plain
        rate_limit: { unit: second, requests_per_unit: 1 }
"#;

#[test]
fn value_to_metric_puts_runtime_values_in_stats() {
    let c = load(VALUE_TO_METRIC);
    let cases: [(&[(&str, &str)], &str); 9] = [
        (
            &[
                ("route", "draw"),
                ("http_method", "GET"),
                ("subject_id", "123"),
            ],
            "d.route_draw.http_method_GET.subject_id",
        ),
        (
            &[
                ("route", "web"),
                ("http_method", "POST"),
                ("subject_id", "4"),
            ],
            "d.route_web.http_method_POST.subject_id",
        ),
        (&[("k1", "X"), ("k2", "Y"), ("k3", "Z")], "d.k1.k2_Y.k3"),
        (&[("k1", "X"), ("plain", "Y")], "d.k1.plain"),
        (
            &[("route", "api"), ("verb", "GET"), ("subject_id", "u1")],
            "d.route_api.verb_GET.subject_id",
        ),
        (
            &[
                ("route", "alice"),
                ("act", "readfile"),
                ("resource", "docs"),
            ],
            "d.route_alice.act_readfile.resource",
        ),
        (
            &[("route", ""), ("http_method", "GET"), ("subject_id", "1")],
            "d.route.http_method_GET.subject_id",
        ),
        (
            &[("route", "draw"), ("http_method", ""), ("subject_id", "1")],
            "d.route_draw.http_method.subject_id",
        ),
        // detailed_metric wins over value_to_metric.
        (
            &[("route", "draw"), ("leaf", "x"), ("subject_id", "123")],
            "d.route_draw.leaf_x.subject_id_123",
        ),
    ];
    for (entries, want) in cases {
        assert_eq!(stats(&c, "d", entries), want, "{entries:?}");
    }
}

#[test]
fn wildcard_stats_follow_the_flags() {
    let c = load(
        r#"
domain: t
descriptors:
  - key: plain
    value: foo*
    rate_limit: { unit: minute, requests_per_unit: 20 }
  - key: v2m
    value: foo*
    value_to_metric: true
    rate_limit: { unit: minute, requests_per_unit: 20 }
  - key: shared
    value: foo*
    share_threshold: true
    rate_limit: { unit: minute, requests_per_unit: 20 }
  - key: both
    value: foo*
    share_threshold: true
    value_to_metric: true
    rate_limit: { unit: minute, requests_per_unit: 20 }
  - key: wild
    value: foo*
    descriptors:
      - key: other
        value_to_metric: true
        descriptors:
          - key: limit
            rate_limit: { unit: minute, requests_per_unit: 20 }
  - key: mid
    value: foo*bar*
    rate_limit: { unit: minute, requests_per_unit: 20 }
  - key: midv
    value: foo*bar*
    value_to_metric: true
    rate_limit: { unit: minute, requests_per_unit: 20 }
"#,
    );
    assert_eq!(stats(&c, "t", &[("plain", "foo1")]), "t.plain_foo*");
    assert_eq!(stats(&c, "t", &[("v2m", "foo1")]), "t.v2m_foo1");
    assert_eq!(stats(&c, "t", &[("shared", "foo1")]), "t.shared_foo*");
    assert_eq!(stats(&c, "t", &[("both", "foo1")]), "t.both_foo*");
    assert_eq!(
        stats(
            &c,
            "t",
            &[("wild", "foo1"), ("other", "bar"), ("limit", "X")]
        ),
        "t.wild_foo*.other_bar.limit"
    );
    assert_eq!(stats(&c, "t", &[("mid", "foo123bar456")]), "t.mid_foo*bar*");
    assert_eq!(stats(&c, "t", &[("mid", "fooXbarY")]), "t.mid_foo*bar*");
    assert_eq!(
        stats(&c, "t", &[("midv", "foo123bar456")]),
        "t.midv_foo123bar456"
    );
}

const SHARE: &str = r#"
domain: s
descriptors:
  - key: files
    value: files/*
    share_threshold: true
    rate_limit: { unit: minute, requests_per_unit: 100 }
  - key: nested
    value: parent
    descriptors:
      - key: files
        value: nested/*
        share_threshold: true
        rate_limit: { unit: minute, requests_per_unit: 200 }
  - key: files
    value: top/*
    share_threshold: true
    descriptors:
      - key: files
        value: nested/*
        share_threshold: true
        rate_limit: { unit: minute, requests_per_unit: 300 }
  - key: route
    value: api/*
    share_threshold: true
    value_to_metric: true
    descriptors:
      - key: method
        rate_limit: { unit: minute, requests_per_unit: 60 }
  - key: service
    value: svc/*
    share_threshold: true
    descriptors:
      - key: endpoint
        detailed_metric: true
        rate_limit: { unit: minute, requests_per_unit: 80 }
  - key: path
    value: path/*
    share_threshold: true
    descriptors:
      - key: file
        value: file/*
        share_threshold: false
        descriptors:
          - key: type
            rate_limit: { unit: minute, requests_per_unit: 120 }
  - key: user
    value: user/*
    share_threshold: true
    descriptors:
      - key: resource
        value: res/*
        share_threshold: true
        descriptors:
          - key: action
            rate_limit: { unit: minute, requests_per_unit: 150 }
  - key: file
    value: test1
    rate_limit: { unit: minute, requests_per_unit: 50 }
  - key: file
    value: test*
    share_threshold: true
    rate_limit: { unit: minute, requests_per_unit: 100 }
  - key: midpath
    value: /api*v1
    share_threshold: true
    rate_limit: { unit: minute, requests_per_unit: 100 }
  - key: multiroute
    value: svc*ep*rpc
    share_threshold: true
    rate_limit: { unit: minute, requests_per_unit: 50 }
  - key: midroute
    value: /api*v2
    share_threshold: true
    value_to_metric: true
    rate_limit: { unit: minute, requests_per_unit: 80 }
  - key: tenant
    value: t*prod
    share_threshold: true
    descriptors:
      - key: resource
        value: res*v2
        share_threshold: true
        rate_limit: { unit: minute, requests_per_unit: 60 }
"#;

#[test]
fn share_threshold_shares_one_counter_per_pattern() {
    let c = load(SHARE);
    let a = counter(&c, "s", &[("files", "files/a.pdf")]);
    assert_eq!(a, counter(&c, "s", &[("files", "files/b.csv")]));
    assert_eq!(
        stats(&c, "s", &[("files", "files/a.pdf")]),
        "s.files_files/*"
    );
    // Explicit value first, then the shared wildcard.
    assert_eq!(
        rate(&c, "s", &[("file", "test1")]),
        Some((50, Unit::Minute))
    );
    assert_eq!(stats(&c, "s", &[("file", "test1")]), "s.file_test1");
    assert_eq!(stats(&c, "s", &[("file", "test2")]), "s.file_test*");
    assert_ne!(
        counter(&c, "s", &[("file", "test1")]),
        counter(&c, "s", &[("file", "test2")])
    );
    assert_eq!(
        counter(&c, "s", &[("file", "test2")]),
        counter(&c, "s", &[("file", "test3")])
    );
    let cases: [(&[(&str, &str)], &str); 9] = [
        (
            &[("route", "api/v1"), ("method", "GET")],
            "s.route_api/*.method",
        ),
        (
            &[("service", "svc/a"), ("endpoint", "get")],
            "s.service_svc/*.endpoint_get",
        ),
        (
            &[("nested", "parent"), ("files", "nested/x")],
            "s.nested_parent.files_nested/*",
        ),
        (
            &[("files", "top/1"), ("files", "nested/2")],
            "s.files_top/*.files_nested/*",
        ),
        (
            &[("path", "path/1"), ("file", "file/2"), ("type", "pdf")],
            "s.path_path/*.file_file/*.type",
        ),
        (
            &[
                ("user", "user/1"),
                ("resource", "res/2"),
                ("action", "read"),
            ],
            "s.user_user/*.resource_res/*.action",
        ),
        (&[("midpath", "/api/x/v1")], "s.midpath_/api*v1"),
        (&[("multiroute", "svcAepBrpc")], "s.multiroute_svc*ep*rpc"),
        (
            &[("tenant", "t1prod"), ("resource", "resXv2")],
            "s.tenant_t*prod.resource_res*v2",
        ),
    ];
    for (entries, want) in cases {
        assert_eq!(stats(&c, "s", entries), want, "{entries:?}");
    }
    assert_eq!(
        stats(&c, "s", &[("midroute", "/api/x/v2")]),
        "s.midroute_/api*v2"
    );
    // detailed_metric with a shared level leaves an empty value out.
    assert_eq!(
        stats(&c, "s", &[("service", "svc/a"), ("endpoint", "")]),
        "s.service_svc/*.endpoint"
    );
    // Shared levels share, other levels keep their values.
    let p = |f: &str, t: &str| counter(&c, "s", &[("path", "path/1"), ("file", f), ("type", t)]);
    assert_ne!(p("file/1", "pdf"), p("file/2", "pdf"));
    assert_eq!(
        counter(
            &c,
            "s",
            &[("path", "path/1"), ("file", "file/1"), ("type", "pdf")]
        ),
        counter(
            &c,
            "s",
            &[("path", "path/2"), ("file", "file/1"), ("type", "pdf")]
        )
    );
    assert_eq!(
        counter(&c, "s", &[("midpath", "/api/x/v1")]),
        counter(&c, "s", &[("midpath", "/apiYv1")])
    );
}

#[test]
fn counter_keys_are_unambiguous() {
    let c = load("domain: d\ndescriptors:\n  - key: a\n    descriptors:\n      - key: b\n        rate_limit: { unit: second, requests_per_unit: 1 }\n");
    // Written back to back, both read `a` `xb1` `b` `2` = `axb1b2`.
    let one = counter(&c, "d", &[("a", "xb1"), ("b", "2")]);
    let two = counter(&c, "d", &[("a", "x"), ("b", "1b2")]);
    assert_ne!(one, two);
    let three = counter(&c, "d", &[("a", "x|b"), ("b", "c")]);
    let four = counter(&c, "d", &[("a", "x"), ("b", "b|c")]);
    assert_ne!(three, four);
    assert_eq!(one, counter(&c, "d", &[("a", "xb1"), ("b", "2")]));
}

#[test]
fn metadata_is_kept_as_json() {
    let c = load(
        r#"
domain: m
descriptors:
  - key: a
    rate_limit: { unit: second, requests_per_unit: 5 }
    metadata:
      name: service_1
      nested: { count: 3, on: true, list: [1, "two", 3.5, ~] }
  - key: b
    rate_limit: { unit: second, requests_per_unit: 5 }
"#,
    );
    let a = c.find("m", &[("a", "1")], None).unwrap();
    assert_eq!(
        a.limit.metadata,
        Some(serde_json::json!({
            "name": "service_1",
            "nested": { "count": 3, "on": true, "list": [1, "two", 3.5, null] }
        }))
    );
    assert_eq!(
        c.find("m", &[("b", "1")], None).unwrap().limit.metadata,
        None
    );
}

#[test]
fn long_descriptors_match_past_the_inline_steps() {
    // Ten levels: more entries than the walk keeps on the stack.
    let mut yaml = String::from("domain: deep\ndescriptors:\n");
    for level in 0..10 {
        let pad = "    ".repeat(level);
        yaml.push_str(&format!("{pad}  - key: k{level}\n"));
        if level == 9 {
            yaml.push_str(&format!(
                "{pad}    rate_limit: {{ unit: second, requests_per_unit: 9 }}\n"
            ));
        } else {
            yaml.push_str(&format!("{pad}    value_to_metric: {}\n", level % 2 == 0));
            yaml.push_str(&format!("{pad}    descriptors:\n"));
        }
    }
    let c = load(&yaml);
    let values: Vec<String> = (0..10).map(|i| format!("v{i}")).collect();
    let entries: Vec<(String, &str)> = values
        .iter()
        .enumerate()
        .map(|(i, v)| (format!("k{i}"), v.as_str()))
        .collect();
    let entries: Vec<(&str, &str)> = entries.iter().map(|(k, v)| (k.as_str(), *v)).collect();
    assert_eq!(rate(&c, "deep", &entries), Some((9, Unit::Second)));
    let want: String = std::iter::once("deep".to_string())
        // value_to_metric on even levels only; the leaf shows its key.
        .chain((0..10).map(|i| match i % 2 == 0 && i < 9 {
            true => format!(".k{i}_v{i}"),
            false => format!(".k{i}"),
        }))
        .collect();
    assert_eq!(stats(&c, "deep", &entries), want);
    assert!(c.find("deep", &entries[..9], None).is_none());
    let mut other = entries.clone();
    other[9].1 = "w";
    assert_ne!(counter(&c, "deep", &entries), counter(&c, "deep", &other));
}
