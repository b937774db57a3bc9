use super::*;
use http::HeaderValue;

/// The wall-clock time the tests read at: 2023-11-14 22:13:20 UTC.
const NOW_SECS: u64 = 1_700_000_000;

fn now() -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(NOW_SECS)
}

fn headers(fields: &[(&str, &[u8])]) -> HeaderMap {
    let mut map = HeaderMap::new();
    for (name, value) in fields {
        let name = HeaderName::from_bytes(name.as_bytes()).unwrap();
        map.append(name, HeaderValue::from_bytes(value).unwrap());
    }
    map
}

fn said(status: u16, fields: &[(&str, &[u8])]) -> Announcement {
    let status = StatusCode::from_u16(status).unwrap();
    Announcement::read_at(status, &headers(fields), now())
}

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

fn quota(limit: u64, window: u64) -> Option<Quota> {
    Some(Quota {
        limit,
        window: Some(secs(window)),
    })
}

fn left(available: u64, within: Option<u64>) -> Option<Remaining> {
    Some(Remaining {
        available,
        within: within.map(secs),
    })
}

#[test]
fn draft_single_policy_and_its_counter() {
    let a = said(
        200,
        &[
            ("ratelimit-policy", br#""default";q=100;w=10"#),
            ("ratelimit", br#""default";r=50;t=5"#),
        ],
    );
    assert_eq!(a.quota, quota(100, 10));
    assert_eq!(a.remaining, left(50, Some(5)));
    assert_eq!(
        (a.retry_after, a.too_many_requests, a.pause()),
        (None, false, None)
    );
}

#[test]
fn the_slowest_of_several_policies_binds() {
    // (lines, the binding quota, the smallest windowed q: the burst)
    for (lines, want, burst) in [
        // 50 per minute (0.83/s) is faster than 1000 per hour (0.28/s),
        // but lets only 50 through at once.
        (
            &[r#""permin";q=50;w=60, "perhr";q=1000;w=3600"#][..],
            quota(1000, 3600),
            Some(50),
        ),
        (
            &[r#""perhr";q=1000;w=3600, "permin";q=5;w=60"#],
            quota(5, 60),
            Some(5),
        ),
        // Across lines of one field, too.
        (&[r#""a";q=10;w=1"#, r#""b";q=2;w=1"#], quota(2, 1), Some(2)),
        // A windowless item is no burst; nor is a lone one.
        (&[r#""a";q=3, "b";q=20;w=1"#], quota(20, 1), Some(20)),
        (
            &[r#""a";q=3"#],
            Some(Quota {
                limit: 3,
                window: None,
            }),
            None,
        ),
    ] {
        let fields: Vec<(&str, &[u8])> = lines
            .iter()
            .map(|l| ("ratelimit-policy", l.as_bytes()))
            .collect();
        let a = said(200, &fields);
        assert_eq!((a.quota, a.burst), (want, burst), "{lines:?}");
    }
    // The legacy limit has no window: no burst.
    assert_eq!(said(200, &[("x-ratelimit-limit", b"7")]).burst, None);
}

#[test]
fn policy_parameters_from_the_draft() {
    // A partition key (a byte sequence) and other parameters do not matter.
    let a = said(
        200,
        &[(
            "ratelimit-policy",
            br#""peruser";q=100;w=60;pk=:cHsdsRa894==:;x=?1"#,
        )],
    );
    assert_eq!(a.quota, quota(100, 60));
    // A unit other than requests is not a request quota.
    let a = said(
        200,
        &[(
            "ratelimit-policy",
            br#""bandwidth";q=65535;qu="content-bytes";w=10, "conc";q=1;qu="concurrent-requests";w=1"#,
        )],
    );
    assert_eq!(a.quota, None);
    let a = said(
        200,
        &[(
            "ratelimit-policy",
            br#""r";q=7;qu="requests";w=1, "t";q=9;qu=requests;w=1"#,
        )],
    );
    assert_eq!(a.quota, quota(7, 1));
    // Token names (older drafts) are items too.
    let a = said(200, &[("ratelimit-policy", b"default;q=100;w=60")]);
    assert_eq!(a.quota, quota(100, 60));
}

#[test]
fn bad_policy_items_are_ignored_one_by_one() {
    for item in [
        r#""a";q=0;w=1"#,
        r#""a";q=-5;w=1"#,
        r#""a";q=1.5;w=1"#,
        r#""a";q="10";w=1"#,
        r#""a";w=1"#,
        r#""a";q=10;w=0"#,
        r#""a";q=10;w=1.5"#,
        r#""a";q=10;w="60""#,
        r#""a";q=10;w=-1"#,
        r#"("a" "b");q=10;w=1"#,
    ] {
        let field = format!("{item}, \"ok\";q=100;w=100");
        let a = said(200, &[("ratelimit-policy", field.as_bytes())]);
        assert_eq!(a.quota, quota(100, 100), "{item}");
    }
    let longest = MAX_WINDOW.as_secs();
    let field = format!(r#""a";q=1;w={longest}"#);
    assert_eq!(
        said(200, &[("ratelimit-policy", field.as_bytes())]).quota,
        quota(1, longest)
    );
    let field = format!(r#""a";q=1;w={}"#, longest + 1);
    assert_eq!(
        said(200, &[("ratelimit-policy", field.as_bytes())]).quota,
        None
    );
}

#[test]
fn a_policy_without_a_window_counts_only_when_none_has_one() {
    let windowless = Some(Quota {
        limit: 10,
        window: None,
    });
    let a = said(200, &[("ratelimit-policy", br#""a";q=10"#)]);
    assert_eq!(a.quota, windowless);
    let a = said(200, &[("ratelimit-policy", br#""a";q=20, "b";q=10"#)]);
    assert_eq!(a.quota, windowless);
    let a = said(200, &[("ratelimit-policy", br#""a";q=10, "b";q=1000;w=1"#)]);
    assert_eq!(a.quota, quota(1000, 1));
    // With r=0 and no t, a windowless quota gives the default pause.
    let a = said(
        200,
        &[
            ("ratelimit-policy", br#""a";q=10"#),
            ("ratelimit", b"a;r=0"),
        ],
    );
    assert_eq!(a.pause(), Some(DEFAULT_PAUSE));
}

#[test]
fn ratelimit_keeps_the_item_with_the_fewest_left() {
    let a = said(
        200,
        &[("ratelimit", br#""day";r=900;t=600, "burst";r=3;t=2"#)],
    );
    assert_eq!(a.remaining, left(3, Some(2)));
    // Equal counts: the longer wait binds.
    let a = said(
        200,
        &[("ratelimit", br#""a";r=0;t=2, "b";r=0;t=9, "c";r=0;t=4"#)],
    );
    assert_eq!(a.remaining, left(0, Some(9)));
    assert_eq!(a.pause(), Some(secs(9)));
    let a = said(200, &[("ratelimit", br#""a";r=0;t=2, "b";r=0"#)]);
    assert_eq!(a.remaining, left(0, Some(2)));
    // No r: ignored; a t that is not a non-negative integer: unsaid.
    let a = said(
        200,
        &[("ratelimit", br#""a";t=2, "b";r=4;t=-1, "c";r=5;t=1.5"#)],
    );
    assert_eq!(a.remaining, left(4, None));
    // t is clamped to MAX_PAUSE.
    let a = said(200, &[("ratelimit", br#""a";r=1;t=999999999999999"#)]);
    assert_eq!(
        a.remaining,
        Some(Remaining {
            available: 1,
            within: Some(MAX_PAUSE)
        })
    );
}

#[test]
fn retry_after_in_seconds_on_429_and_503_only() {
    for status in [429, 503] {
        let a = said(status, &[("retry-after", b"120")]);
        assert_eq!(a.retry_after, Some(secs(120)), "{status}");
        assert_eq!(a.pause(), Some(secs(120)));
        // Each refusal says which it was.
        assert_eq!(
            (a.too_many_requests, a.unavailable),
            (status == 429, status == 503)
        );
    }
    for status in [200, 301, 500] {
        let a = said(status, &[("retry-after", b"120")]);
        assert_eq!((a.retry_after, a.pause()), (None, None), "{status}");
        assert!(!a.too_many_requests && !a.unavailable, "{status}");
    }
    assert_eq!(
        said(429, &[("retry-after", b"  7 ")]).retry_after,
        Some(secs(7))
    );
    assert_eq!(
        said(429, &[("retry-after", b"0")]).retry_after,
        Some(secs(0))
    );
}

#[test]
fn retry_after_as_an_http_date_in_all_three_formats() {
    // NOW is Tue, 14 Nov 2023 22:13:20 GMT.
    for date in [
        "Tue, 14 Nov 2023 22:13:50 GMT",
        "Tuesday, 14-Nov-23 22:13:50 GMT",
        "Tue Nov 14 22:13:50 2023",
    ] {
        let a = said(429, &[("retry-after", date.as_bytes())]);
        assert_eq!(a.retry_after, Some(secs(30)), "{date}");
    }
    // In the past: no wait.
    let a = said(429, &[("retry-after", b"Tue, 14 Nov 2023 22:13:19 GMT")]);
    assert_eq!(a.retry_after, Some(Duration::ZERO));
    // Ten years ahead: clamped.
    let a = said(503, &[("retry-after", b"Mon, 14 Nov 2033 22:13:20 GMT")]);
    assert_eq!(a.retry_after, Some(MAX_PAUSE));
    // Not a date, or a date with a wrong weekday or day.
    for bad in [
        "tomorrow",
        "Mon, 14 Nov 2023 22:13:50 GMT",
        "Tue, 31 Nov 2023 22:13:50 GMT",
        "Tue, 14 Nov 2023 22:13:50 UTC",
        "-5",
        "1.5",
        "0x10",
        "",
    ] {
        assert_eq!(
            said(429, &[("retry-after", bad.as_bytes())]).retry_after,
            None,
            "{bad}"
        );
    }
}

#[test]
fn huge_retry_after_is_clamped() {
    let ten_years = (10 * 366 * 86_400u64).to_string();
    assert_eq!(
        said(429, &[("retry-after", ten_years.as_bytes())]).retry_after,
        Some(MAX_PAUSE)
    );
    let huge = "9".repeat(400);
    assert_eq!(
        said(429, &[("retry-after", huge.as_bytes())]).retry_after,
        Some(MAX_PAUSE)
    );
}

#[test]
fn singleton_fields_repeated_with_different_values_are_ignored() {
    let a = said(429, &[("retry-after", b"5"), ("retry-after", b"6")]);
    assert_eq!(a.retry_after, None);
    let a = said(429, &[("retry-after", b"5"), ("retry-after", b" 5")]);
    assert_eq!(a.retry_after, Some(secs(5)));
    let a = said(
        200,
        &[("x-ratelimit-limit", b"10"), ("x-ratelimit-limit", b"20")],
    );
    assert_eq!(a.quota, None);
}

#[test]
fn legacy_fields_with_a_delta_reset() {
    let a = said(
        200,
        &[
            ("x-ratelimit-limit", b"60"),
            ("x-ratelimit-remaining", b"0"),
            ("x-ratelimit-reset", b"42"),
        ],
    );
    assert_eq!(
        a.quota,
        Some(Quota {
            limit: 60,
            window: None
        })
    );
    assert_eq!(a.remaining, left(0, Some(42)));
    assert_eq!(a.pause(), Some(secs(42)));
    // Remaining without a reset: when it refills is unsaid.
    let a = said(200, &[("x-ratelimit-remaining", b"3")]);
    assert_eq!(a.remaining, left(3, None));
    // A reset without remaining says nothing by itself.
    assert_eq!(said(200, &[("x-ratelimit-reset", b"3")]).remaining, None);
}

#[test]
fn legacy_reset_is_delta_or_unix_time_by_magnitude() {
    let reset = |v: String| {
        said(
            200,
            &[
                ("x-ratelimit-remaining", b"1"),
                ("x-ratelimit-reset", v.as_bytes()),
            ],
        )
        .remaining
        .unwrap()
        .within
    };
    // Below 10^9: delta seconds (clamped).
    assert_eq!(reset("0".into()), Some(secs(0)));
    assert_eq!(reset("86400".into()), Some(MAX_PAUSE));
    assert_eq!(reset((EPOCH_SECONDS_FROM - 1).to_string()), Some(MAX_PAUSE));
    // From 10^9: a Unix time in seconds.
    assert_eq!(reset((NOW_SECS + 30).to_string()), Some(secs(30)));
    assert_eq!(reset((NOW_SECS - 30).to_string()), Some(secs(0)));
    assert_eq!(reset(EPOCH_SECONDS_FROM.to_string()), Some(secs(0)));
    // From 10^12: a Unix time in milliseconds.
    assert_eq!(
        reset((NOW_SECS * 1000 + 2500).to_string()),
        Some(Duration::from_millis(2500))
    );
    assert_eq!(reset((EPOCH_MILLIS_FROM - 1).to_string()), Some(MAX_PAUSE));
    // Past anything SystemTime holds: as far as it gets.
    assert_eq!(reset(u64::MAX.to_string()), Some(MAX_PAUSE));
    assert_eq!(reset("9".repeat(100)), Some(MAX_PAUSE));
    // Not a number: unsaid.
    assert_eq!(reset("soon".into()), None);
    assert_eq!(reset("1.5".into()), None);
}

#[test]
fn draft_fields_win_over_legacy_ones() {
    let a = said(
        200,
        &[
            ("ratelimit-policy", br#""d";q=10;w=1"#),
            ("ratelimit", br#""d";r=4;t=1"#),
            ("x-ratelimit-limit", b"99"),
            ("x-ratelimit-remaining", b"98"),
        ],
    );
    assert_eq!((a.quota, a.remaining), (quota(10, 1), left(4, Some(1))));
    // A malformed draft field falls back to the legacy one.
    let a = said(
        200,
        &[
            ("ratelimit-policy", br#""d";q=10;;w=1"#),
            ("x-ratelimit-limit", b"99"),
        ],
    );
    assert_eq!(
        a.quota,
        Some(Quota {
            limit: 99,
            window: None
        })
    );
}

#[test]
fn pause_rules() {
    // A 429 that says nothing: the default pause.
    assert_eq!(said(429, &[]).pause(), Some(DEFAULT_PAUSE));
    assert!(said(429, &[]).too_many_requests);
    // A 503 that says nothing: no pause (it is not about rate).
    assert_eq!(said(503, &[]).pause(), None);
    // r=0 on a 429: its t.
    assert_eq!(
        said(429, &[("ratelimit", b"a;r=0;t=7")]).pause(),
        Some(secs(7))
    );
    // Retry-After and r=0 both: the longer.
    let both = said(429, &[("ratelimit", b"a;r=0;t=7"), ("retry-after", b"3")]);
    assert_eq!(both.pause(), Some(secs(7)));
    let both = said(429, &[("ratelimit", b"a;r=0;t=7"), ("retry-after", b"30")]);
    assert_eq!(both.pause(), Some(secs(30)));
    // r=0 without t: the quota's window, clamped; else the default.
    let a = said(
        200,
        &[("ratelimit", b"a;r=0"), ("ratelimit-policy", b"a;q=5;w=20")],
    );
    assert_eq!(a.pause(), Some(secs(20)));
    let a = said(
        200,
        &[
            ("ratelimit", b"a;r=0"),
            ("ratelimit-policy", b"a;q=5;w=604800"),
        ],
    );
    assert_eq!(a.pause(), Some(MAX_PAUSE));
    assert_eq!(
        said(200, &[("ratelimit", b"a;r=0")]).pause(),
        Some(DEFAULT_PAUSE)
    );
    // Something left: no pause.
    assert_eq!(said(200, &[("ratelimit", b"a;r=1;t=60")]).pause(), None);
    // A 429 with r>0 and no Retry-After still pauses.
    assert_eq!(
        said(429, &[("ratelimit", b"a;r=1;t=60")]).pause(),
        Some(DEFAULT_PAUSE)
    );
}

#[test]
fn non_utf8_and_control_bytes_are_ignored() {
    let a = said(
        429,
        &[
            ("ratelimit-policy", b"\"caf\xc3\xa9\";q=1;w=1"),
            ("ratelimit", b"a;r=\xff"),
            ("retry-after", b"Tue, 14 Nov 2023 22:13:50 GMT\xe2\x80\x8b"),
            ("x-ratelimit-remaining", b"\x80"),
        ],
    );
    assert_eq!(
        a,
        Announcement {
            too_many_requests: true,
            ..Announcement::default()
        }
    );
}

#[test]
fn oversized_fields_are_ignored() {
    // 64 KB in one line.
    let long = format!("a;q=1;w=1, {}", "b, ".repeat(22_000));
    assert!(long.len() > 64_000);
    assert_eq!(
        said(200, &[("ratelimit-policy", long.as_bytes())]).quota,
        None
    );
    // Just under the byte cap, but too many members.
    let many = vec!["a;q=1;w=1"; 17].join(",");
    assert!(many.len() < MAX_FIELD_BYTES);
    assert_eq!(
        said(200, &[("ratelimit-policy", many.as_bytes())]).quota,
        None
    );
    let sixteen = vec!["a;q=1;w=1"; 16].join(",");
    assert_eq!(
        said(200, &[("ratelimit-policy", sixteen.as_bytes())]).quota,
        quota(1, 1)
    );
    // Too many lines, each fine.
    let lines: Vec<(&str, &[u8])> = vec![("retry-after", b"5"); MAX_LINES + 1];
    assert_eq!(said(429, &lines).retry_after, None);
    assert_eq!(said(429, &lines[..MAX_LINES]).retry_after, Some(secs(5)));
    // A 64 KB Retry-After of digits: over the byte cap.
    let digits = "1".repeat(65_536);
    assert_eq!(
        said(429, &[("retry-after", digits.as_bytes())]).retry_after,
        None
    );
}

#[test]
fn malformed_structured_fields_are_ignored_whole() {
    for bad in [
        r#""a";q=10;w=1,"#,
        r#""a";q=10;w=1,,"b";q=1;w=1"#,
        r#""a";q=10;w=1 "b""#,
        r#"(("a"));q=1;w=1"#,
        r#"("a" ("b"));q=1;w=1"#,
        r#""a";q=10;w=1;Q=2"#,
        r#""a;q=10;w=1"#,
        r#""a";q=1234567890123456;w=1"#,
        r#""a";q=10;w=1, %"x""#,
    ] {
        let a = said(200, &[("ratelimit-policy", bad.as_bytes())]);
        assert_eq!(a.quota, None, "{bad}");
    }
    // One bad line fails the whole field.
    let a = said(
        200,
        &[
            ("ratelimit", br#""a";r=5;t=1"#),
            ("ratelimit", br#""b";r=0;t=9,"#),
        ],
    );
    assert_eq!(a.remaining, None);
}

#[test]
fn a_clean_response_announces_nothing() {
    let a = said(200, &[("content-type", b"text/plain")]);
    assert_eq!(a, Announcement::default());
    assert_eq!(a.pause(), None);
}
