//! The announce target: hostile response headers through
//! `ratewall::client::Announcement::read_at`, and a sequence of responses
//! learned by a `Partitions` table on a `ManualClock`, against a model.
//!
//! The input is text-like, so corpus files can be written by hand: lines
//! split on `\n`. A line `#<status> <advance ms>` starts a response
//! (status 100..=599, else 200) after moving both clocks by the advance; a
//! line whose first byte is `0`..`5` appends the rest of the line as a
//! value of `RateLimit-Policy`, `RateLimit`, `Retry-After`,
//! `X-RateLimit-Limit`, `-Remaining` or `-Reset`. Other lines are skipped.
//!
//! Checked after every response: nothing panics (fuzz builds keep
//! overflow checks); reading is deterministic; every duration read is
//! within its documented clamp; `Retry-After` is read only on a 429 or a
//! 503; and the table's pause is exactly the model's (the latest end of
//! every pause asked for, never more than `MAX_PAUSE` away), its 429
//! count is the model's, and its pace is never faster than the user's.

use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use ratewall::client::{Announcement, Partitions, MAX_PAUSE, MAX_WINDOW};
use ratewall::{ManualClock, Rate};
use std::time::{Duration, UNIX_EPOCH};

/// The fields read, in the order the input's field digits pick them.
pub const FIELDS: [&str; 6] = [
    "ratelimit-policy",
    "ratelimit",
    "retry-after",
    "x-ratelimit-limit",
    "x-ratelimit-remaining",
    "x-ratelimit-reset",
];

/// The wall-clock time at the start: 2023-11-14 22:13:20 UTC.
const START_SECS: u64 = 1_700_000_000;
/// Responses per input, so one input stays fast.
const MAX_RESPONSES: usize = 64;
/// Field lines per response (the reader itself caps at 16 per field).
const MAX_FIELD_LINES: usize = 64;

struct Response {
    status: StatusCode,
    advance_ms: u64,
    headers: HeaderMap,
}

fn digits(b: &[u8]) -> Option<u64> {
    let s = std::str::from_utf8(b).ok()?;
    s.trim().parse().ok()
}

fn responses(data: &[u8]) -> Vec<Response> {
    let mut out: Vec<Response> = Vec::new();
    let mut lines = 0;
    for line in data.split(|&b| b == b'\n') {
        match line.first() {
            Some(b'#') => {
                if out.len() == MAX_RESPONSES {
                    break;
                }
                let mut parts = line[1..].splitn(2, |&b| b == b' ');
                let status = parts
                    .next()
                    .and_then(digits)
                    .and_then(|s| u16::try_from(s).ok())
                    .and_then(|s| StatusCode::from_u16(s).ok())
                    .unwrap_or(StatusCode::OK);
                let advance_ms = parts.next().and_then(digits).unwrap_or(0) % (1 << 30);
                out.push(Response {
                    status,
                    advance_ms,
                    headers: HeaderMap::new(),
                });
                lines = 0;
            }
            Some(&c @ b'0'..=b'5') => {
                if out.is_empty() {
                    out.push(Response {
                        status: StatusCode::OK,
                        advance_ms: 0,
                        headers: HeaderMap::new(),
                    });
                }
                lines += 1;
                if lines > MAX_FIELD_LINES {
                    continue;
                }
                // Bytes `http` refuses in a value never reach a client.
                if let Ok(v) = HeaderValue::from_bytes(&line[1..]) {
                    let name = HeaderName::from_static(FIELDS[usize::from(c - b'0')]);
                    out.last_mut().unwrap().headers.append(name, v);
                }
            }
            _ => {}
        }
    }
    out
}

/// Decodes and runs one scenario; panics on any broken rule.
pub fn run_announce(data: &[u8]) {
    let clock = ManualClock::new();
    let table = Partitions::with_clock(4, clock.clone()).unwrap();
    let user = Rate::per_second(50);
    let mut wall = UNIX_EPOCH + Duration::from_secs(START_SECS);
    let mut now_ns: u64 = 0;
    // The model: when the pause ends (ns on the clock), and 429s and 503s seen.
    let mut pause_end: u64 = 0;
    let mut limited: u64 = 0;
    let mut unavailable: u64 = 0;
    for (i, r) in responses(data).into_iter().enumerate() {
        let advance = Duration::from_millis(r.advance_ms);
        clock.advance(advance);
        wall += advance;
        now_ns += r.advance_ms * 1_000_000;
        let said = Announcement::read_at(r.status, &r.headers, wall);
        let ctx = (i, r.status, &r.headers, said);
        assert_eq!(
            said,
            Announcement::read_at(r.status, &r.headers, wall),
            "{ctx:?}"
        );
        let is_429 = r.status == StatusCode::TOO_MANY_REQUESTS;
        assert_eq!(said.too_many_requests, is_429, "{ctx:?}");
        let is_503 = r.status == StatusCode::SERVICE_UNAVAILABLE;
        assert_eq!(said.unavailable, is_503, "{ctx:?}");
        unavailable += u64::from(is_503);
        if !is_429 && r.status != StatusCode::SERVICE_UNAVAILABLE {
            assert_eq!(said.retry_after, None, "{ctx:?}");
        }
        assert!(said.retry_after.unwrap_or_default() <= MAX_PAUSE, "{ctx:?}");
        if let Some(rem) = said.remaining {
            assert!(rem.within.unwrap_or_default() <= MAX_PAUSE, "{ctx:?}");
        }
        if let Some(q) = said.quota {
            if let Some(w) = q.window {
                assert!(q.limit > 0 && !w.is_zero() && w <= MAX_WINDOW, "{ctx:?}");
            }
        }
        let pause = said.pause();
        assert!(pause.unwrap_or_default() <= MAX_PAUSE, "{ctx:?}");
        if is_429 {
            assert!(pause.is_some(), "a 429 always pauses: {ctx:?}");
            limited += 1;
        }

        table.learn(&"upstream", &said);
        if let Some(p) = pause {
            pause_end = pause_end.max(now_ns + p.as_nanos() as u64);
        }
        let want = (pause_end > now_ns).then(|| Duration::from_nanos(pause_end - now_ns));
        assert_eq!(table.paused_for(&"upstream"), want, "{ctx:?}");
        let view = table.view(&"upstream").unwrap();
        assert_eq!(view.refusals.too_many_requests, limited, "{ctx:?}");
        assert_eq!(view.refusals.unavailable, unavailable, "{ctx:?}");
        if said.quota.is_some() {
            assert_eq!(view.quota, said.quota, "the latest quota is kept: {ctx:?}");
        }
        let pace = table.pace(&"upstream", Some(user)).unwrap();
        assert!(
            pace.period().as_nanos() * u128::from(user.count())
                >= user.period().as_nanos() * u128::from(pace.count()),
            "{pace:?} is faster than the user's {user:?}: {ctx:?}"
        );
    }
}
