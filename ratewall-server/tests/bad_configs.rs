//! Configurations the real binary must refuse: every error case of
//! envoyproxy/ratelimit's `test/config/*.yaml` (same YAML, same file names)
//! and the README's rules, plus ratewall's `policy` rules. For each, the
//! binary exits with code 1 before serving, and its stderr names the file,
//! the line and the field, and says what envoyproxy/ratelimit says.

mod support;

use support::{ConfigDir, Server};

/// One refused configuration.
struct Case {
    name: &'static str,
    /// The directory's files; the first one is the file the error names.
    files: &'static [(&'static str, &'static str)],
    /// The lines the error may name (YAML parsers differ on where a broken
    /// document ends; every other case has one).
    lines: &'static [usize],
    /// The field, shown as `` `field` ``; `None` where the error is about
    /// the text itself (not YAML, or a key that is not text).
    field: Option<&'static str>,
    /// What the message says (envoyproxy/ratelimit's words where it has
    /// the case).
    says: &'static str,
}

const BASIC: &str = "domain: test-domain\ndescriptors:\n  - key: key1\n    value: value1\n    rate_limit:\n      unit: second\n      requests_per_unit: 5\n";

const CASES: &[Case] = &[
    Case {
        name: "duplicate domain (duplicate_domain.yaml beside basic_config.yaml)",
        files: &[
            ("duplicate_domain.yaml", "domain: test-domain\ndescriptors:\n"),
            ("basic_config.yaml", BASIC),
        ],
        lines: &[1],
        field: Some("domain"),
        says: "duplicate domain 'test-domain'",
    },
    Case {
        name: "duplicate key (duplicate_key.yaml)",
        files: &[(
            "duplicate_key.yaml",
            "domain: test-domain\ndescriptors:\n  - key: key1\n    value: value1\n\n  - key: key1\n    value: value1\n",
        )],
        lines: &[6],
        field: Some("key"),
        says: "duplicate descriptor composite key 'test-domain.key1_value1'",
    },
    Case {
        name: "empty key (empty_key.yaml)",
        files: &[(
            "empty_key.yaml",
            "domain: test-domain\ndescriptors:\n  - value: value1\n",
        )],
        lines: &[3],
        field: Some("key"),
        says: "descriptor has empty key",
    },
    Case {
        // No `domain` line to point at: line 0 is "the file as a whole".
        name: "missing domain (empty_domain.yaml)",
        files: &[("empty_domain.yaml", "descriptors:\n")],
        lines: &[0],
        field: Some("domain"),
        says: "config file cannot have empty domain",
    },
    Case {
        name: "empty domain text",
        files: &[(
            "empty_text.yaml",
            "domain: \"\"\ndescriptors:\n  - key: k\n",
        )],
        lines: &[1],
        field: Some("domain"),
        says: "cannot have empty domain",
    },
    Case {
        name: "bad unit (bad_limit_unit.yaml)",
        files: &[(
            "bad_limit_unit.yaml",
            "domain: test-domain\ndescriptors:\n  - key: key1\n    value: value1\n    rate_limit:\n      unit: foo\n      requests_per_unit: 5\n",
        )],
        lines: &[6],
        field: Some("rate_limit.unit"),
        says: "invalid rate limit unit 'foo'",
    },
    Case {
        name: "unknown descriptor field (misspelled_key.yaml)",
        files: &[(
            "misspelled_key.yaml",
            "domain: test-domain\ndescriptors:\n  - key: key1\n    value: value1\n    ratelimit:\n      unit: day\n      requests_per_unit: 5\n",
        )],
        lines: &[5],
        field: Some("ratelimit"),
        says: "unknown key 'ratelimit'",
    },
    Case {
        name: "unknown rate_limit field (misspelled_key2.yaml)",
        files: &[(
            "misspelled_key2.yaml",
            "domain: test-domain\ndescriptors:\n  - key: key1\n    value: value1\n    rate_limit:\n      unit: day\n      requestsperunit: 5\n",
        )],
        lines: &[7],
        field: Some("rate_limit.requestsperunit"),
        says: "unknown key 'requestsperunit'",
    },
    Case {
        name: "replaces itself (replaces_self.yaml)",
        files: &[(
            "replaces_self.yaml",
            "domain: test-domain\ndescriptors:\n  - key: key1\n    value: value1\n    descriptors:\n      - key: subkey1\n        rate_limit:\n          name: self\n          replaces:\n            - name: self\n          unit: second\n          requests_per_unit: 5\n",
        )],
        lines: &[10],
        field: Some("rate_limit.replaces.name"),
        says: "replaces should not contain name of same descriptor",
    },
    Case {
        name: "empty replaces name (replaces_empty.yaml)",
        files: &[(
            "replaces_empty.yaml",
            "domain: test-domain\ndescriptors:\n  - key: key1\n    value: value1\n    descriptors:\n      - key: subkey1\n        rate_limit:\n          name: self\n          replaces:\n            - name:\n          unit: second\n          requests_per_unit: 5\n",
        )],
        lines: &[10],
        field: Some("rate_limit.replaces.name"),
        says: "should not have an empty replaces entry",
    },
    Case {
        name: "unlimited with a unit (unlimited_with_unit.yaml)",
        files: &[(
            "unlimited_with_unit.yaml",
            "domain: test-domain\ndescriptors:\n  - key: foo\n    rate_limit:\n      unlimited: true\n      unit: day\n      requests_per_unit: 25\n",
        )],
        lines: &[6],
        field: Some("rate_limit.unit"),
        says: "should not specify rate limit unit when unlimited",
    },
    Case {
        name: "non-map list (non_map_list.yaml)",
        files: &[(
            "non_map_list.yaml",
            "domain: test-domain\ndescriptors:\n  - a\n  - b\n  - c\n",
        )],
        lines: &[3],
        field: Some("descriptors"),
        says: "yaml file contains list of type other than map: a",
    },
    Case {
        name: "non-string key (non_string_key.yaml)",
        files: &[(
            "non_string_key.yaml",
            "0.25: test-domain\ndescriptors:\n  - key: key1\n    value: value1\n    rate_limit:\n      unit: day\n      requests_per_unit: 5\n",
        )],
        lines: &[1],
        field: None,
        says: "key is not of type string: 0.25",
    },
    Case {
        name: "bad YAML (bad_yaml.yaml)",
        files: &[("bad_yaml.yaml", "'''\n")],
        lines: &[1, 2],
        field: None,
        says: "not valid YAML",
    },
    Case {
        name: "share_threshold without a wildcard (README)",
        files: &[(
            "share.yaml",
            "domain: d\ndescriptors:\n  - key: files\n    value: files/a.pdf\n    share_threshold: true\n    rate_limit:\n      unit: hour\n      requests_per_unit: 10\n",
        )],
        lines: &[5],
        field: Some("share_threshold"),
        says: "share_threshold can only be used with wildcard values",
    },
    Case {
        name: "policy and unit together (ratewall)",
        files: &[(
            "policy_unit.yaml",
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: minute\n      policy: \"5/min\"\n",
        )],
        lines: &[6],
        field: Some("rate_limit.policy"),
        says: "`policy` excludes `unit` and `requests_per_unit`",
    },
    Case {
        name: "policy and requests_per_unit together (ratewall)",
        files: &[(
            "policy_rpu.yaml",
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      policy: \"5/min\"\n      requests_per_unit: 5\n",
        )],
        lines: &[5],
        field: Some("rate_limit.policy"),
        says: "`policy` excludes `unit` and `requests_per_unit`",
    },
    Case {
        name: "a policy text that does not read (ratewall)",
        files: &[(
            "policy_text.yaml",
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      policy: \"5 per fortnight\"\n",
        )],
        lines: &[5],
        field: Some("rate_limit.policy"),
        says: "a policy reads like `100/min`",
    },
    Case {
        name: "a unit without requests_per_unit (ratewall: write 0 to block)",
        files: &[(
            "no_rpu.yaml",
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: minute\n",
        )],
        lines: &[4],
        field: Some("rate_limit.requests_per_unit"),
        says: "needs `requests_per_unit`",
    },
];

/// What is wrong with the binary's answer to `case`, if anything.
fn check(case: &Case) -> Option<String> {
    let dir = ConfigDir::new(case.files);
    let refused = match Server::try_start(&dir.path, &[]) {
        Ok(_) => return Some("the server started".into()),
        Err(r) => r,
    };
    let stderr = &refused.stderr;
    let mut wrong = Vec::new();
    if refused.code != Some(1) {
        wrong.push(format!("exit code {:?}, not 1", refused.code));
    }
    let file = dir.path.join(case.files[0].0).display().to_string();
    if !case
        .lines
        .iter()
        .any(|line| stderr.contains(&format!("{file}:{line}: ")))
    {
        wrong.push(format!(
            "no `{file}:<line>: ` with a line in {:?}",
            case.lines
        ));
    }
    if let Some(field) = case.field {
        if !stderr.contains(&format!("`{field}`")) {
            wrong.push(format!("the field `{field}` is not named"));
        }
    }
    if !stderr.contains(case.says) {
        wrong.push(format!("it does not say {:?}", case.says));
    }
    (!wrong.is_empty()).then(|| format!("{}: {}\n  stderr: {stderr}", case.name, wrong.join("; ")))
}

#[test]
fn every_bad_configuration_stops_the_start_naming_its_file_line_and_field() {
    let failures: Vec<String> = CASES.iter().filter_map(check).collect();
    assert!(
        failures.is_empty(),
        "{} of {} cases:\n{}",
        failures.len(),
        CASES.len(),
        failures.join("\n")
    );
}

/// The file named is the one at fault, wherever it sorts: a good file
/// before and after it changes nothing.
#[test]
fn the_error_names_the_bad_file_among_good_ones() {
    let bad = "domain: bad\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: fortnight\n      requests_per_unit: 1\n";
    let good = |d: &str| {
        format!("domain: {d}\ndescriptors:\n  - key: k\n    rate_limit: {{ unit: minute, requests_per_unit: 1 }}\n")
    };
    let (a, z) = (good("a"), good("z"));
    let dir = ConfigDir::new(&[("a.yaml", &a), ("m.yaml", bad), ("z.yaml", &z)]);
    let refused = support::refused(&dir.path);
    assert_eq!(refused.code, Some(1), "{refused:?}");
    let named = format!("{}:5: `rate_limit.unit`", dir.path.join("m.yaml").display());
    assert!(refused.stderr.contains(&named), "{}", refused.stderr);
    for good in ["a.yaml", "z.yaml"] {
        assert!(!refused.stderr.contains(good), "{}", refused.stderr);
    }
}

/// A policy that reads, but that no limiter can hold (a keyed bucket's
/// burst past its slot), is refused like any other bad configuration:
/// naming the file, the line and the field, not only the limit.
#[test]
fn a_policy_no_limiter_can_hold_names_its_file_line_and_field() {
    let yaml = "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      policy: \"1000000/s burst 100000000\"\n";
    let dir = ConfigDir::new(&[("burst.yaml", yaml)]);
    let refused = support::refused(&dir.path);
    assert_eq!(refused.code, Some(1), "{refused:?}");
    let named = format!(
        "{}:5: `rate_limit.policy`",
        dir.path.join("burst.yaml").display()
    );
    assert!(refused.stderr.contains(&named), "{}", refused.stderr);
}
