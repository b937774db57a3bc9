//! `ratewall::client`: what an upstream announces, read through the public
//! API. Property tests: any bytes in any field never panic and never ask
//! for a pause past `MAX_PAUSE`; and `RateLimit-Policy` is read exactly as
//! an independent RFC 9651 parser (the `sfv` crate) plus the documented
//! item rules say.

use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use proptest::prelude::*;
use ratewall::client::{Announcement, Partitions, Quota, Remaining, MAX_PAUSE, MAX_WINDOW};
use ratewall::{ManualClock, Rate};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The fuzz target's model, for its list of fields.
#[allow(dead_code)]
#[path = "../fuzz/model/announce.rs"]
mod model;
use model::FIELDS;

fn map(fields: &[(usize, Vec<u8>)]) -> HeaderMap {
    let mut map = HeaderMap::new();
    for (i, bytes) in fields {
        // Bytes `http` refuses in a field value never reach a client.
        if let Ok(v) = HeaderValue::from_bytes(bytes) {
            map.append(HeaderName::from_static(FIELDS[i % FIELDS.len()]), v);
        }
    }
    map
}

/// Bytes that look like the fields' values more often than random bytes do.
fn field_bytes() -> impl Strategy<Value = Vec<u8>> {
    let fixed = prop::sample::select(vec![
        "\"a\"",
        "tok",
        ";q=",
        ";w=",
        ";r=",
        ";t=",
        ";qu=\"requests\"",
        ", ",
        "(",
        ")",
        "GMT",
        "Tue, 14 Nov 2023 22:13:50 GMT",
    ]);
    let piece = prop_oneof![
        fixed.prop_map(|s| s.as_bytes().to_vec()),
        any::<u64>().prop_map(|n| n.to_string().into_bytes()),
        "[0-9]{1,20}".prop_map(String::into_bytes),
        proptest::collection::vec(any::<u8>(), 0..8),
    ];
    proptest::collection::vec(piece, 0..12).prop_map(|v| v.concat())
}

fn status() -> impl Strategy<Value = StatusCode> {
    prop_oneof![Just(200u16), Just(429), Just(503), 100u16..600]
        .prop_map(|s| StatusCode::from_u16(s).unwrap())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    /// Any field values: no panic, every duration within its clamp, a
    /// quota always usable, and `Retry-After` read only on a 429 or 503.
    #[test]
    fn reading_never_panics_and_stays_within_the_clamps(
        status in status(),
        fields in proptest::collection::vec((0usize..6, field_bytes()), 0..8),
        now_secs in any::<u64>(),
    ) {
        let headers = map(&fields);
        let now = UNIX_EPOCH.checked_add(Duration::from_secs(now_secs)).unwrap_or(UNIX_EPOCH);
        let said = Announcement::read_at(status, &headers, now);
        prop_assert_eq!(said, Announcement::read_at(status, &headers, now));
        prop_assert!(said.pause().unwrap_or_default() <= MAX_PAUSE);
        prop_assert!(said.retry_after.unwrap_or_default() <= MAX_PAUSE);
        let limited = status == StatusCode::TOO_MANY_REQUESTS;
        prop_assert_eq!(said.too_many_requests, limited);
        if !limited && status != StatusCode::SERVICE_UNAVAILABLE {
            prop_assert_eq!(said.retry_after, None);
        }
        if let Some(r) = said.remaining {
            prop_assert!(r.within.unwrap_or_default() <= MAX_PAUSE);
        }
        if let Some(q) = said.quota {
            if let Some(w) = q.window {
                prop_assert!(q.limit > 0 && !w.is_zero() && w <= MAX_WINDOW);
            }
        }
        // What a table learns from it keeps the clamp, and never paces
        // faster than the user.
        let clock = ManualClock::new();
        let table = Partitions::with_clock(4, clock.clone()).unwrap();
        table.learn(&"up", &said);
        prop_assert_eq!(table.paused_for(&"up"), said.pause().filter(|p| !p.is_zero()));
        let user = Rate::per_second(1000);
        let pace = table.pace(&"up", Some(user)).unwrap();
        prop_assert!(pace.period().as_nanos() * u128::from(user.count()) >= user.period().as_nanos() * u128::from(pace.count()));
        clock.advance(MAX_PAUSE);
        prop_assert_eq!(table.paused_for(&"up"), None);
    }
}

// ---------------------------------------------------------------------------
// Differential: `RateLimit-Policy` against `sfv`.

/// Structured-field-like text: mostly valid members, sometimes broken.
fn sf_text(a: &'static str, b: &'static str) -> impl Strategy<Value = String> {
    let bare = prop_oneof![
        60 => (-20i64..2000).prop_map(|n| n.to_string()),
        10 => "\"[a-z ]{0,6}\"",
        10 => "[a-zA-Z*][a-z0-9:/!#]{0,5}",
        4 => Just("?1".to_string()),
        4 => Just(":aGk=:".to_string()),
        4 => Just("@1700000000".to_string()),
        8 => Just("\"requests\"".to_string()),
        8 => Just("requests".to_string()),
        4 => "-?[0-9]{1,3}\\.[0-9]{1,3}",
        2 => "[0-9]{14,16}",
        1 => prop::sample::select(vec!["?2", "\"a\\\"", "1.2345", "--1", "\"\\x\""])
            .prop_map(String::from),
    ];
    let key = prop_oneof![
        100 => prop::sample::select(vec!["q", "r", "t", "w", "qu", "pk", "x", "a1", "b-", "c.", "d*", "e_", "f", "g", "h", "i"]),
        1 => prop::sample::select(vec!["Q", "1", ""]),
    ];
    let param = (key, proptest::option::of(bare.clone())).prop_map(|(k, v)| match v {
        Some(v) => format!(";{k}={v}"),
        None => format!(";{k}"),
    });
    let params = prop_oneof![
        9 => proptest::collection::vec(param.clone(), 0..4),
        1 => proptest::collection::vec(param, 4..10),
    ]
    .prop_map(|v| v.concat());
    let policy = (
        proptest::option::weighted(0.8, bare.clone()),
        proptest::option::weighted(0.8, bare.clone()),
        params.clone(),
    )
        .prop_map(move |(q, w, p)| {
            let q = q.map(|v| format!(";{a}={v}")).unwrap_or_default();
            let w = w.map(|v| format!(";{b}={v}")).unwrap_or_default();
            format!("{q}{w}{p}")
        });
    let item = (bare.clone(), policy).prop_map(|(b, p)| format!("{b}{p}"));
    let inner = (proptest::collection::vec(item.clone(), 0..4), params)
        .prop_map(|(items, p)| format!("({}){p}", items.join(" ")));
    let member = prop_oneof![4 => item, 1 => inner];
    let sep = prop_oneof![
        30 => Just(","), 30 => Just(", "), 3 => Just(" ,"), 1 => Just(",,"), 1 => Just(" "), 3 => Just(",\t"),
    ];
    (
        prop_oneof![
            9 => proptest::collection::vec((member.clone(), sep.clone()), 1..6),
            1 => proptest::collection::vec((member, sep), 6..18),
        ],
        proptest::bool::weighted(0.03),
    )
        .prop_map(|(v, trailing)| {
            let mut s = String::new();
            for (i, (m, sep)) in v.iter().enumerate() {
                if i > 0 {
                    s.push_str(sep);
                }
                s.push_str(m);
            }
            if trailing {
                s.push(',');
            }
            s
        })
}

/// `sfv`'s parse of a list within the documented caps (16 members, 8
/// distinct parameters per item): the items' parameters; `None` if the
/// field is not a valid list or is over a cap.
fn sfv_items(field: &str) -> Option<Vec<sfv::Parameters>> {
    let list: sfv::List = sfv::Parser::new(field.as_bytes()).parse().ok()?;
    if list.len() > 16 {
        return None;
    }
    let mut items = Vec::new();
    for entry in list {
        match entry {
            sfv::ListEntry::Item(item) if item.params.len() <= 8 => items.push(item.params),
            sfv::ListEntry::InnerList(inner)
                if inner.params.len() <= 8
                    && inner.items.len() <= 16
                    && inner.items.iter().all(|i| i.params.len() <= 8) => {}
            _ => return None,
        }
    }
    Some(items)
}

/// A non-negative Integer parameter.
fn uint(params: &sfv::Parameters, key: &str) -> Option<u64> {
    let i = params.get(key)?.as_integer()?;
    u64::try_from(i64::from(i)).ok()
}

/// The documented rules for `RateLimit`, applied to `sfv`'s parse.
fn reference_remaining(field: &str) -> Option<Remaining> {
    let mut best: Option<(u64, Option<u64>)> = None;
    for params in sfv_items(field)? {
        let Some(r) = uint(&params, "r") else {
            continue;
        };
        let t = uint(&params, "t").map(|t| t.min(MAX_PAUSE.as_secs()));
        best = match best {
            Some((br, bt)) if br < r || (br == r && bt >= t) => Some((br, bt)),
            _ => Some((r, t)),
        };
    }
    let (r, t) = best?;
    let v = match t {
        Some(t) => format!("a;r={r};t={t}"),
        None => format!("a;r={r}"),
    };
    let mut headers = HeaderMap::new();
    headers.insert("ratelimit", HeaderValue::from_str(&v).unwrap());
    Announcement::read(StatusCode::OK, &headers).remaining
}

/// The documented rules for `RateLimit-Policy`, applied to `sfv`'s parse.
fn reference_policy(field: &str) -> Option<Quota> {
    let mut best: Option<(u64, Option<u64>)> = None;
    for params in sfv_items(field)? {
        let unit_ok = match params.get("qu") {
            None => true,
            Some(v) => {
                v.as_string().map(|s| s.as_str()) == Some("requests")
                    || v.as_token().map(|t| t.as_str()) == Some("requests")
            }
        };
        let Some(q) = uint(&params, "q").filter(|&q| q > 0) else {
            continue;
        };
        let w = match (params.get("w"), uint(&params, "w")) {
            (None, _) => None,
            (Some(_), Some(w)) if w > 0 && w <= MAX_WINDOW.as_secs() => Some(w),
            _ => continue,
        };
        if !unit_ok {
            continue;
        }
        // The slowest rate binds; a quota with a window before one without.
        let keep = match (best, w) {
            (None, _) => false,
            (Some((_, Some(_))), None) => true,
            (Some((_, None)), Some(_)) => false,
            (Some((bq, None)), None) => bq <= q,
            (Some((bq, Some(bw))), Some(w)) => {
                u128::from(bq) * u128::from(w) <= u128::from(q) * u128::from(bw)
            }
        };
        if !keep {
            best = Some((q, w));
        }
    }
    let (limit, w) = best?;
    Some(quota(limit, w))
}

fn quota(limit: u64, w: Option<u64>) -> Quota {
    let mut headers = HeaderMap::new();
    let v = match w {
        Some(w) => format!("a;q={limit};w={w}"),
        None => format!("a;q={limit}"),
    };
    headers.insert("ratelimit-policy", HeaderValue::from_str(&v).unwrap());
    Announcement::read(StatusCode::OK, &headers).quota.unwrap()
}

/// The announcement read from one `name: field` line at the epoch.
fn read_one(name: &'static str, field: &str) -> Option<Announcement> {
    let value = HeaderValue::from_str(field).ok()?;
    let mut headers = HeaderMap::new();
    headers.insert(name, value);
    Some(Announcement::read_at(
        StatusCode::OK,
        &headers,
        SystemTime::UNIX_EPOCH,
    ))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1000, ..ProptestConfig::default() })]

    /// Both structured fields, each against its reference.
    #[test]
    fn lists_read_as_sfv_and_the_rules_say(
        policy in sf_text("q", "w"),
        ratelimit in sf_text("r", "t"),
    ) {
        if let Some(said) = read_one("ratelimit-policy", &policy) {
            prop_assert_eq!(said.quota, reference_policy(&policy), "policy {:?}", policy);
        }
        if let Some(said) = read_one("ratelimit", &ratelimit) {
            prop_assert_eq!(said.remaining, reference_remaining(&ratelimit), "ratelimit {:?}", ratelimit);
        }
    }
}

#[test]
fn the_differential_sees_both_outcomes() {
    // The generator is not vacuous: some fields parse to a quota, some do not.
    assert_eq!(
        reference_policy("a;q=5;w=1, b;q=1;w=1"),
        Some(quota(1, Some(1)))
    );
    assert_eq!(reference_policy("a;q=5, b;q=1"), Some(quota(1, None)));
    assert_eq!(reference_policy("a;q=5;w=1,"), None);
    assert_eq!(reference_policy(r#"a;q=5;w=1;qu="content-bytes""#), None);
}

/// How often the generator's fields parse, and to a quota: a property test
/// over fields that all fail would prove little.
#[test]
fn the_generator_reaches_every_outcome() {
    use proptest::strategy::ValueTree;
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let (mut valid, mut quota) = (0, 0);
    for _ in 0..300 {
        let field = sf_text("q", "w").new_tree(&mut runner).unwrap().current();
        valid += usize::from(
            sfv::Parser::new(field.as_bytes())
                .parse::<sfv::List>()
                .is_ok(),
        );
        quota += usize::from(reference_policy(&field).is_some());
    }
    assert!(valid > 60 && valid < 270, "{valid} of 300 parse");
    assert!(quota > 30, "{quota} of 300 hold a quota");
}
