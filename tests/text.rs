//! Limits as text: the parse/print round trip (property tests) and, with the
//! `serde` feature, the string forms in a TOML file.

use proptest::prelude::*;
use ratewall::{ParseError, Policy, Rate, Tolerance, Window};
use std::time::Duration;

/// Any duration, with the whole-unit ones (what people write) made common.
fn period() -> impl Strategy<Value = Duration> {
    let unit = prop::sample::select(vec![
        1u64,
        1_000,
        1_000_000,
        1_000_000_000,
        60_000_000_000,
        3_600_000_000_000,
        86_400_000_000_000,
    ]);
    prop_oneof![
        (1u64..1000, unit).prop_map(|(k, u)| Duration::from_nanos(k * u)),
        (any::<u64>(), 0u32..1_000_000_000).prop_map(|(s, n)| Duration::new(s, n)),
        Just(Duration::ZERO),
    ]
}

fn rate() -> impl Strategy<Value = Rate> {
    (any::<u64>(), period(), prop::option::of(any::<u64>())).prop_map(|(c, p, b)| match b {
        Some(b) => Rate::new(c, p).burst(b),
        None => Rate::new(c, p),
    })
}

fn window() -> impl Strategy<Value = Window> {
    (any::<u64>(), period()).prop_map(|(l, p)| Window::new(l, p))
}

fn tolerance() -> impl Strategy<Value = Option<Tolerance>> {
    prop::option::of(prop_oneof![
        (0u64..100_000).prop_map(Tolerance::Units),
        (0u32..300).prop_map(Tolerance::Percent),
    ])
}

/// Policies that validate (parsing validates), in the ranges configs use.
fn policy() -> impl Strategy<Value = Policy> {
    let small_rate =
        (1u64..100_000, 1u64..1000, prop::option::of(1u64..100_000)).prop_map(|(c, secs, b)| {
            let r = Rate::new(c, Duration::from_secs(secs));
            b.map_or(r, |b| r.burst(b))
        });
    let small_window =
        (1u64..16_000, 1u64..100_000).prop_map(|(l, ms)| Window::new(l, Duration::from_millis(ms)));
    (0usize..5, small_rate, small_window, tolerance())
        .prop_map(|(alg, r, w, t)| {
            let p = match alg {
                0 => Policy::token_bucket(r),
                1 => Policy::leaky_bucket(r),
                2 => Policy::fixed_window(w),
                3 => Policy::sliding_window_counter(w),
                _ => Policy::sliding_window_log(w),
            };
            t.map_or(p, |t| p.soft(t))
        })
        .prop_filter("parsing validates", |p| p.validate().is_ok())
}

proptest! {
    #[test]
    fn rate_round_trips(r in rate()) {
        let text = r.to_string();
        prop_assert_eq!(text.parse::<Rate>(), Ok(r), "{}", text);
    }

    #[test]
    fn window_round_trips(w in window()) {
        let text = w.to_string();
        prop_assert_eq!(text.parse::<Window>(), Ok(w), "{}", text);
    }

    #[test]
    fn policy_round_trips(p in policy()) {
        let text = p.to_string();
        let back: Policy = text.parse().map_err(|e: ParseError| TestCaseError::fail(format!("{text}: {e}")))?;
        prop_assert_eq!(back, p, "{}", text);
        prop_assert_eq!(back.to_string(), text);
    }

    /// Garbage never panics, and an error names a token that is in the text.
    #[test]
    fn bad_text_is_an_error_naming_its_token(s in "[0-9a-z/% _.-]{0,24}") {
        if let Err(ParseError::Unexpected { token, at, .. }) = s.parse::<Policy>() {
            prop_assert_eq!(&s[at..at + token.len()], token.as_str());
        }
    }
}

/// The grammar's `count = digit { digit | "_" digit }`: a `_` stands between
/// two digits, never doubled, leading or trailing, in every numeric
/// position (issue 23, item 2). Each bad text names the token holding the
/// bad number; the good one beside it parses.
#[test]
fn separators_stand_between_two_digits_in_every_numeric_position() {
    // (good text, bad texts, the token each bad text is refused at)
    let cases: [(&str, [(&str, &str); 3]); 5] = [
        // a count
        (
            "1_0/s",
            [("1__0/s", "1__0"), ("_10/s", "_10"), ("10_/s", "10_")],
        ),
        // a burst
        (
            "10/s burst 2_0",
            [
                ("10/s burst 2__0", "2__0"),
                ("10/s burst _20", "_20"),
                ("10/s burst 20_", "20_"),
            ],
        ),
        // a duration (the count of a period)
        (
            "10/1_0s",
            [
                ("10/1__0s", "1__0s"),
                ("10/_10s", "_10s"),
                ("10/10_s", "10_s"),
            ],
        ),
        // a percentage
        (
            "10/s soft 1_0%",
            [
                ("10/s soft 1__0%", "1__0"),
                ("10/s soft _10%", "_10"),
                ("10/s soft 10_%", "10_"),
            ],
        ),
        // a tolerance in units
        (
            "10/s soft 1_0",
            [
                ("10/s soft 1__0", "1__0"),
                ("10/s soft _10", "_10"),
                ("10/s soft 10_", "10_"),
            ],
        ),
    ];
    for (good, bad) in cases {
        assert!(good.parse::<Policy>().is_ok(), "{good}");
        for (text, token) in bad {
            match text.parse::<Policy>() {
                Err(ParseError::Unexpected { token: t, at, .. }) => {
                    assert_eq!(
                        (t.as_str(), &text[at..at + t.len()]),
                        (token, token),
                        "{text}"
                    );
                }
                other => panic!("{text}: {other:?}"),
            }
        }
    }
    // The same rule in `Rate` and `Window`, which share the parser.
    for text in ["1__0/s", "10/1__0s"] {
        assert!(text.parse::<Rate>().is_err(), "{text}");
        assert!(text.parse::<Window>().is_err(), "{text}");
    }
}

#[cfg(feature = "serde")]
mod serde_forms {
    use super::*;
    use serde::{Deserialize, Serialize};

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Limits {
        per_ip: Policy,
        login: Policy,
        upload: Rate,
        reports: Window,
    }

    #[test]
    fn toml_reads_and_writes_the_text_forms() {
        let text = r#"
            per_ip = "100/s burst 20"
            login = "5/min sliding-log soft 1"
            upload = "1000/s"
            reports = "10/h"
        "#;
        let limits: Limits = toml::from_str(text).unwrap();
        let expected = Limits {
            per_ip: Policy::token_bucket(Rate::per_second(100).burst(20)),
            login: Policy::sliding_window_log(Window::per_minute(5)).soft(Tolerance::Units(1)),
            upload: Rate::per_second(1000),
            reports: Window::per_hour(10),
        };
        assert_eq!(limits, expected);
        let written = toml::to_string(&limits).unwrap();
        assert!(
            written.contains("login = \"5/min sliding-log soft 1\""),
            "{written}"
        );
        assert_eq!(toml::from_str::<Limits>(&written).unwrap(), expected);
    }

    #[test]
    fn a_bad_limit_in_toml_says_which_token() {
        let err = toml::from_str::<Limits>(
            "per_ip = \"100/s brust 20\"\nlogin = \"5/min\"\nupload = \"1/s\"\nreports = \"1/h\"",
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("unexpected `brust`"), "{err}");
        assert!(err.contains("per_ip"), "{err}");
    }
}
