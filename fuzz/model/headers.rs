//! The header target: arbitrary policy names and decisions through
//! `Decision::ratelimit_header` (with the policy each decision came from). Every `Ok` value must parse as an RFC 9651
//! structured-field item (a string with integer parameters `r` and `t`)
//! whose string is the name and whose parameters are the decision's, and
//! must hold no control character; every `Err` must point at the first
//! character an RFC 9651 string cannot carry.

use arbitrary::{Arbitrary, Unstructured};
use ratewall::{
    check_all, Decision, FixedWindow, Limit, ManualClock, Policy, Rate, TokenBucket, Window,
};
use std::time::Duration;

/// The largest RFC 9651 integer: 15 decimal digits.
const SF_INT_MAX: u64 = 999_999_999_999_999;

#[derive(Arbitrary, Debug)]
enum Source {
    /// A token bucket of `count` per `period_ns` ns, burst `burst`, after
    /// `takes` unit checks and an advance of `advance_ns`.
    Bucket {
        count: u64,
        period_ns: u64,
        burst: u64,
        takes: u8,
        advance_ns: u64,
    },
    /// A fixed window of `limit` per `length_ns`, after `takes` checks.
    Fixed {
        limit: u64,
        length_ns: u64,
        takes: u8,
    },
    /// A multi-limit check over no limits (remaining = u64::MAX).
    Empty,
}

/// A decision and the policy it was made under (the check over no limits:
/// a bucket's, which caps nothing).
fn decision(source: &Source) -> Option<(Decision, Policy)> {
    let clock = ManualClock::new();
    Some(match *source {
        Source::Bucket {
            count,
            period_ns,
            burst,
            takes,
            advance_ns,
        } => {
            let rate = Rate::new(count, Duration::from_nanos(period_ns)).burst(burst);
            let b = TokenBucket::with_clock(rate, clock.clone()).ok()?;
            let mut d = b.check();
            for _ in 0..takes % 16 {
                d = b.check();
            }
            clock.advance(Duration::from_nanos(advance_ns % (1 << 62)));
            if takes & 1 == 1 {
                d = b.check();
            }
            (d, Policy::token_bucket(rate))
        }
        Source::Fixed {
            limit,
            length_ns,
            takes,
        } => {
            let window = Window::new(limit, Duration::from_nanos(length_ns));
            let w = FixedWindow::with_clock(window, clock).ok()?;
            let mut d = w.check();
            for _ in 0..takes % 16 {
                d = w.check();
            }
            (d, Policy::fixed_window(window))
        }
        Source::Empty => (
            check_all::<ManualClock>(&[] as &[&dyn Limit<ManualClock>]),
            Policy::token_bucket(Rate::per_second(1)),
        ),
    })
}

/// Parses an RFC 9651 item of the form `sf-string *( ";" *SP key "=" sf-integer )`:
/// the string's content and the parameters. `None`: not such an item.
pub fn parse_item(s: &str) -> Option<(String, Vec<(String, u64)>)> {
    let b = s.as_bytes();
    let mut i = 0;
    if b.first() != Some(&b'"') {
        return None;
    }
    i += 1;
    let mut out = String::new();
    loop {
        let c = *b.get(i)?;
        i += 1;
        match c {
            b'\\' => {
                let e = *b.get(i)?;
                i += 1;
                if e != b'"' && e != b'\\' {
                    return None;
                }
                out.push(e as char);
            }
            b'"' => break,
            0x20..=0x7e => out.push(c as char),
            _ => return None,
        }
    }
    let mut params = Vec::new();
    while i < b.len() {
        if b[i] != b';' {
            return None;
        }
        i += 1;
        while b.get(i) == Some(&b' ') {
            i += 1;
        }
        // key = ( lcalpha / "*" ) *( lcalpha / DIGIT / "_" / "-" / "." / "*" )
        let start = i;
        match b.get(i) {
            Some(c) if c.is_ascii_lowercase() || *c == b'*' => i += 1,
            _ => return None,
        }
        while let Some(c) = b.get(i) {
            if c.is_ascii_lowercase() || c.is_ascii_digit() || b"_-.*".contains(c) {
                i += 1;
            } else {
                break;
            }
        }
        let key = s[start..i].to_string();
        if b.get(i) != Some(&b'=') {
            return None;
        }
        i += 1;
        let digits = b[i..].iter().take_while(|c| c.is_ascii_digit()).count();
        if digits == 0 || digits > 15 {
            return None;
        }
        let value: u64 = s[i..i + digits].parse().ok()?;
        i += digits;
        params.push((key, value));
    }
    Some((out, params))
}

/// Input layout: a `Source` (as `arbitrary` decodes it, from the first 64
/// bytes at most), then the names: the remaining bytes split at 0xFF (never
/// in UTF-8), each decoded lossily (invalid UTF-8 becomes U+FFFD). A
/// hand-written seed is `[kind, numbers...]` padded to 64 bytes, then
/// `name\xFFname...`.
pub fn run_headers(data: &[u8]) {
    let (head, tail) = data.split_at(data.len().min(64));
    let mut u = Unstructured::new(head);
    let Ok(source) = Source::arbitrary(&mut u) else {
        return;
    };
    let Some((d, policy)) = decision(&source) else {
        return;
    };
    for name in tail.split(|&b| b == 0xFF).take(16) {
        let name = String::from_utf8_lossy(name);
        let name: &str = &name;
        let bad = name
            .char_indices()
            .find(|&(_, c)| !(' '..='~').contains(&c));
        match (d.ratelimit_header(name, &policy), bad) {
            (Ok(value), None) => {
                assert!(
                    !value.chars().any(|c| c.is_control()),
                    "{name:?} -> {value:?}: a control character"
                );
                let (parsed, params) = parse_item(&value)
                    .unwrap_or_else(|| panic!("{name:?} -> {value:?}: not an RFC 9651 item"));
                assert_eq!(&parsed, name, "{value:?}");
                let want = vec![
                    ("r".to_string(), d.remaining().min(SF_INT_MAX)),
                    // `t`: time to full when allowed (at most a window
                    // policy's length, rounded up), the retry wait when denied.
                    (
                        "t".to_string(),
                        match (d.is_allowed(), policy.window()) {
                            (true, Some(w)) => d
                                .reset_after_secs()
                                .min(w.length().as_nanos().div_ceil(1_000_000_000) as u64),
                            (true, None) => d.reset_after_secs(),
                            (false, _) => d.retry_after_secs(),
                        }
                        .min(SF_INT_MAX),
                    ),
                ];
                assert_eq!(params, want, "{value:?} for {d:?}");
            }
            (Err(e), Some((position, character))) => {
                assert_eq!((e.position, e.character), (position, character), "{name:?}");
                assert!(!e.to_string().is_empty());
            }
            (got, want) => panic!("{name:?}: got {got:?}, first bad character {want:?}"),
        }
    }
}
