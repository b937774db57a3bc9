//! Loader errors: each of envoyproxy/ratelimit's error cases (file, line,
//! field, and a message that says the same thing), ours, and no panic on
//! garbage.

use super::*;

fn error(yaml: &str) -> ConfigError {
    match Config::from_sources(&[("bad.yaml".to_string(), yaml.to_string())]) {
        Ok(c) => panic!("loaded: {c:?}"),
        Err(e) => e,
    }
}

/// Asserts the error's file, line and field, and that its message holds
/// `says`.
fn assert_error(yaml: &str, line: usize, field: &str, says: &str) {
    let e = error(yaml);
    assert_eq!(
        (e.file.as_str(), e.line, e.field.as_str()),
        ("bad.yaml", line, field),
        "{e}"
    );
    assert!(e.message.contains(says), "{e}\nshould say: {says}");
}

#[test]
fn go_error_cases() {
    assert_error(
        "descriptors:\n",
        0,
        "domain",
        "config file cannot have empty domain",
    );
    assert_error(
        "domain: ''\ndescriptors:\n",
        1,
        "domain",
        "cannot have empty domain",
    );
    assert_error("", 0, "domain", "empty domain");
    assert_error(
        "domain: d\ndescriptors:\n  - value: value1\n",
        3,
        "key",
        "descriptor has empty key",
    );
    assert_error(
        "domain: test-domain\ndescriptors:\n  - key: key1\n    value: value1\n\n  - key: key1\n    value: value1\n",
        6,
        "key",
        "duplicate descriptor composite key 'test-domain.key1_value1'",
    );
    assert_error(
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: foo\n      requests_per_unit: 5\n",
        5,
        "rate_limit.unit",
        "invalid rate limit unit 'foo'",
    );
    assert_error(
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      name: self\n      replaces:\n        - name: self\n      unit: second\n      requests_per_unit: 5\n",
        7,
        "rate_limit.replaces.name",
        "replaces should not contain name of same descriptor",
    );
    assert_error(
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      name: self\n      replaces:\n        - name:\n      unit: second\n      requests_per_unit: 5\n",
        7,
        "rate_limit.replaces.name",
        "should not have an empty replaces entry",
    );
    assert_error(
        "domain: d\ndescriptors:\n  - key: k\n    value: v\n    ratelimit:\n      unit: day\n",
        5,
        "ratelimit",
        "unknown key 'ratelimit'",
    );
    assert_error(
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: day\n      requestsperunit: 5\n",
        6,
        "rate_limit.requestsperunit",
        "unknown key 'requestsperunit'",
    );
    assert_error(
        "0.25: test-domain\ndescriptors:\n  - key: key1\n",
        1,
        "",
        "key is not of type string: 0.25",
    );
    assert_error(
        "domain: d\ndescriptors:\n  - a\n  - b\n",
        3,
        "descriptors",
        "list of type other than map: a",
    );
    assert_error(
        "domain: d\ndescriptors:\n  - key: foo\n    rate_limit:\n      unlimited: true\n      unit: day\n      requests_per_unit: 25\n",
        6,
        "rate_limit.unit",
        "should not specify rate limit unit when unlimited",
    );
    assert_error(
        "domain: d\ndescriptors:\n  - key: k\n    share_threshold: true\n    rate_limit: { unit: day, requests_per_unit: 1 }\n",
        4,
        "share_threshold",
        "share_threshold can only be used with wildcard values",
    );
}

#[test]
fn bad_yaml_names_its_line() {
    let e = error("'''\n");
    assert_eq!((e.file.as_str(), e.field.as_str()), ("bad.yaml", ""));
    assert!(e.line >= 1 && e.line <= 2, "{e}");
    assert!(e.message.contains("not valid YAML"), "{e}");
    let e = error("domain: d\ndescriptors:\n  - key: [unclosed\n");
    assert!(e.line >= 3, "{e}");
}

#[test]
fn duplicate_domains_unless_merged() {
    let a = (
        "first.yaml".to_string(),
        "domain: d\ndescriptors:\n  - key: a\n".to_string(),
    );
    let b = (
        "second.yaml".to_string(),
        "# again\ndomain: d\ndescriptors:\n  - key: b\n".to_string(),
    );
    let e = Config::from_sources(&[a.clone(), b.clone()]).unwrap_err();
    assert_eq!(
        (e.file.as_str(), e.line, e.field.as_str()),
        ("second.yaml", 2, "domain")
    );
    assert!(e.message.contains("duplicate domain 'd'"), "{e}");
    assert!(e.message.contains("merge_domains"), "{e}");
    // Merged, a key defined twice at the top is still a duplicate.
    let merge = LoadOptions::default().merge_domains(true);
    let e = Config::from_sources_with(&[a.clone(), a.clone()], &merge).unwrap_err();
    assert_eq!(
        (e.file.as_str(), e.line, e.field.as_str()),
        ("first.yaml", 3, "key")
    );
    assert!(
        e.message
            .contains("duplicate descriptor composite key 'd.a'"),
        "{e}"
    );
    assert!(Config::from_sources_with(&[a, b], &merge).is_ok());
}

#[test]
fn our_stricter_errors() {
    // A field in the wrong place is named, with where it belongs.
    assert_error(
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: day\n      requests_per_unit: 5\n      shadow_mode: true\n",
        7,
        "rate_limit.shadow_mode",
        "belongs to a descriptor",
    );
    assert_error(
        "domain: d\ndescriptors:\n  - key: k\n    unit: day\n",
        4,
        "unit",
        "belongs to `rate_limit`",
    );
    assert_error("domain: d\nfoo: 1\n", 2, "foo", "unknown key 'foo'");
    // requests_per_unit is required (README), and must be a u32.
    assert_error(
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: day\n",
        4,
        "rate_limit.requests_per_unit",
        "needs `requests_per_unit`",
    );
    assert_error(
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { unit: day, requests_per_unit: -1 }\n",
        4,
        "rate_limit.requests_per_unit",
        "whole number",
    );
    assert_error(
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { unit: day, requests_per_unit: 4294967296 }\n",
        4,
        "rate_limit.requests_per_unit",
        "whole number",
    );
    assert_error(
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { unit: day, requests_per_unit: '5' }\n",
        4,
        "rate_limit.requests_per_unit",
        "whole number",
    );
    assert_error(
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      requests_per_unit: 5\n",
        4,
        "rate_limit.unit",
        "invalid rate limit unit ''",
    );
    assert_error(
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { unit: unknown, requests_per_unit: 5 }\n",
        4,
        "rate_limit.unit",
        "invalid rate limit unit 'unknown'",
    );
    assert_error(
        "domain: d\ndescriptors:\n  - key: k\n    shadow_mode: maybe\n",
        4,
        "shadow_mode",
        "`true` or `false`",
    );
    assert_error("domain: [d]\n", 1, "domain", "expected a text");
    assert_error("- domain: d\n", 1, "", "a configuration file is a mapping");
    assert_error(
        "domain: d\ndescriptors: nope\n",
        2,
        "descriptors",
        "a list of descriptors",
    );
    assert_error("domain: d\n---\ndomain: e\n", 3, "", "second YAML document");
    assert_error(
        "domain: d\ndescriptors:\n  - key: k\n    metadata: [1]\n",
        4,
        "metadata",
        "expected a mapping",
    );
    assert_error(
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      replaces: [x]\n      unit: day\n      requests_per_unit: 1\n",
        5,
        "rate_limit.replaces",
        "list of type other than map: x",
    );
    // A trailing `---` is not a second document.
    assert!(Config::from_sources(&[("ok.yaml".into(), "domain: d\n---\n".into())]).is_ok());
}

#[test]
fn policy_errors() {
    assert_error(
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      policy: 100/min\n      unit: minute\n",
        5,
        "rate_limit.policy",
        "`policy` excludes `unit` and `requests_per_unit`",
    );
    assert_error(
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      requests_per_unit: 3\n      policy: 100/min\n",
        6,
        "rate_limit.policy",
        "`policy` excludes `unit` and `requests_per_unit`",
    );
    assert_error(
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unlimited: true\n      policy: 100/min\n",
        6,
        "rate_limit.policy",
        "excludes `unlimited: true`",
    );
    // ratewall's own message, as ratewall words it.
    let parse = "100/s brust 20"
        .parse::<ratewall::Policy>()
        .unwrap_err()
        .to_string();
    assert_error(
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      policy: 100/s brust 20\n",
        5,
        "rate_limit.policy",
        &parse,
    );
    let zero = "0/s".parse::<ratewall::Policy>().unwrap_err().to_string();
    assert_error(
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { policy: 0/s }\n",
        4,
        "rate_limit.policy",
        &zero,
    );
    // name and replaces go with a policy.
    assert!(Config::from_sources(&[(
        "ok.yaml".into(),
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { policy: 1/s, name: a, replaces: [{ name: b }] }\n".into()
    )])
    .is_ok());
}

/// A small deterministic generator (xorshift), so the loop needs no
/// dependency and replays the same inputs.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[(self.next() % items.len() as u64) as usize]
    }
}

#[test]
fn garbage_never_panics() {
    const PIECES: &[&str] = &[
        "domain: d\n",
        "descriptors:\n",
        "  - key: k\n",
        "    value: v*\n",
        "    value: *a\n",
        "    rate_limit:\n",
        "      unit: second\n",
        "      requests_per_unit: 5\n",
        "      policy: 5/s\n",
        "      unlimited: true\n",
        "      replaces: [{name: x}]\n",
        "    descriptors:\n",
        "      - key: j\n",
        "    share_threshold: true\n",
        "- ",
        ": ",
        "{",
        "}",
        "[",
        "]",
        "'",
        "\"",
        "&a ",
        "*a",
        "!!str ",
        "? ",
        "---\n",
        "\t",
        "#c\n",
        "\u{e9}",
        "\u{1F600}",
        "0x",
        "~",
        "\n",
        "    metadata: {a: [1, {b: .nan}]}\n",
        "      name: n\n",
    ];
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut loaded = 0;
    for _ in 0..3000 {
        let n = 1 + rng.next() % 24;
        let text: String = (0..n).map(|_| rng.pick(PIECES)).collect();
        if let Ok(c) = Config::from_sources(&[("g.yaml".into(), text)]) {
            loaded += 1;
            let _ = c.find("d", &[("k", "v1"), ("j", "")], None);
            let _ = c.find("d", &[("k", "")], Some((3, Unit::Minute)));
        }
    }
    // The loop reaches the walk, not only the parser's errors.
    assert!(loaded > 0);
}

#[test]
fn what_go_accepts_loads() {
    let ok = |yaml: &str| match Config::from_sources(&[("ok.yaml".to_string(), yaml.to_string())]) {
        Ok(c) => c,
        Err(e) => panic!("{e}"),
    };
    // `unlimited` ignores a `requests_per_unit` (not a `unit`), as in Go.
    let c = ok("domain: d\ndescriptors:\n  - key: k\n    rate_limit: { unlimited: true, requests_per_unit: 25 }\n");
    assert_eq!(
        c.find("d", &[("k", "v")], None).unwrap().limit.kind,
        LimitKind::Unlimited
    );
    // An empty `rate_limit`, `descriptors`, `value` or `metadata` is absent.
    let c = ok("domain: d\ndescriptors:\n  - key: k\n    value:\n    rate_limit:\n    metadata:\n    descriptors:\n");
    assert!(c.limits().is_empty());
    assert!(c.has_domain("d"));
    // Units in any letter case; `unlimited: false` is counted.
    let c = ok("domain: d\ndescriptors:\n  - key: k\n    rate_limit: { unlimited: false, unit: WEEK, requests_per_unit: 3 }\n");
    assert!(matches!(
        c.find("d", &[("k", "v")], None).unwrap().limit.kind,
        LimitKind::Limited {
            requests_per_unit: 3,
            unit: Unit::Week,
            ..
        }
    ));
}

#[test]
fn random_bytes_never_panic() {
    let mut rng = Rng(0xD1B5_4A32_D192_ED03);
    for _ in 0..2000 {
        let n = rng.next() % 200;
        let bytes: Vec<u8> = (0..n).map(|_| (rng.next() % 256) as u8).collect();
        let text = String::from_utf8_lossy(&bytes).into_owned();
        let _ = Config::from_sources(&[("r.yaml".into(), text)]);
    }
}

/// A plain backtracking glob (`*` is any run of bytes), the reference for
/// the matcher's allocation-free scan.
fn glob(pattern: &[u8], text: &[u8]) -> bool {
    match pattern.split_first() {
        None => text.is_empty(),
        Some((b'*', rest)) => (0..=text.len()).any(|i| glob(rest, &text[i..])),
        Some((c, rest)) => text.first() == Some(c) && glob(rest, &text[1..]),
    }
}

#[test]
fn wildcard_matching_agrees_with_a_plain_glob() {
    let mut rng = Rng(0x2545_F491_4F6C_DD1D);
    let mut word = |len: u64, alphabet: &[u8]| -> String {
        (0..rng.next() % len)
            .map(|_| alphabet[(rng.next() % alphabet.len() as u64) as usize] as char)
            .collect()
    };
    let mut matched = 0;
    for _ in 0..20_000 {
        let pattern = word(7, b"ab*");
        let text = word(9, b"ab");
        let ours = super::matcher::Wildcard::new(&pattern).matches(&text);
        assert_eq!(
            ours,
            glob(pattern.as_bytes(), text.as_bytes()),
            "{pattern:?} {text:?}"
        );
        matched += usize::from(ours);
    }
    assert!(matched > 100);
}
