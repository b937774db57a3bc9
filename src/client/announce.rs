//! What an upstream announces about its limits, read from one response's
//! status and headers: [`Announcement::read`]. docs/client.md ("What the
//! client reads and trusts") has the rules in one table.
//!
//! Every value that is malformed, hostile or absurd is ignored (the field,
//! or the one item, as said below); nothing here panics, overflows or
//! allocates, and the work per response is bounded: a field is read only
//! if it has at most [`MAX_LINES`] lines and [`MAX_FIELD_BYTES`] bytes in
//! all, and a structured list only up to 16 members of 8 parameters
//! (`sf.rs`).

use super::sf::{self, Bare, Member};
use http::header::{HeaderName, RETRY_AFTER};
use http::{HeaderMap, HeaderValue, StatusCode};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The longest wait one response can ask for: one day. A longer
/// `Retry-After`, `t` or `X-RateLimit-Reset` (a hostile or broken upstream
/// saying "come back in ten years") is read as one day, and an announced
/// quota paces at most one request per day (`q=1;w=31622400`, one a
/// year, paces one a day): the one bound on every wait an upstream sets.
pub const MAX_PAUSE: Duration = Duration::from_secs(86_400);

/// The longest quota window read (`w`): 366 days. An item with a longer
/// window (or `w=0`) is ignored: it cannot be shortened, since that would
/// pace faster than the upstream said.
pub const MAX_WINDOW: Duration = Duration::from_secs(366 * 86_400);

/// How long a partition pauses when the upstream says it is out of quota
/// (a 429, or `r=0`) without saying for how long.
pub const DEFAULT_PAUSE: Duration = Duration::from_secs(1);

/// A field with more lines than this is ignored.
pub(crate) const MAX_LINES: usize = 16;
/// A field longer than this (all lines together) is ignored.
pub(crate) const MAX_FIELD_BYTES: usize = 4096;

/// The field and parameter names, in one place (the working group may yet
/// rename `r` and `t`: draft PR #166).
mod names {
    use http::header::HeaderName;
    pub(super) const POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
    pub(super) const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
    pub(super) const X_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
    pub(super) const X_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
    pub(super) const X_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");
    /// `RateLimit-Policy`: the quota, its window in seconds, its unit.
    pub(super) const QUOTA: &str = "q";
    pub(super) const WINDOW: &str = "w";
    pub(super) const UNIT: &str = "qu";
    /// `RateLimit`: what is available, and within how many seconds.
    pub(super) const AVAILABLE: &str = "r";
    pub(super) const WITHIN: &str = "t";
}

/// A legacy `X-RateLimit-Reset` below this is delta seconds; at or above
/// it, a Unix time in seconds (10^9 s is 2001-09-09 as a date, and 31
/// years as a delta).
pub(crate) const EPOCH_SECONDS_FROM: u64 = 1_000_000_000;
/// At or above this, an `X-RateLimit-Reset` is a Unix time in milliseconds.
pub(crate) const EPOCH_MILLIS_FROM: u64 = 1_000_000_000_000;

/// A quota the upstream announces: at most `limit` requests per `window`.
///
/// ```
/// use http::{HeaderMap, HeaderValue, StatusCode};
/// use ratewall::client::Announcement;
/// use std::time::Duration;
///
/// let mut headers = HeaderMap::new();
/// headers.insert("ratelimit-policy", HeaderValue::from_static(r#""default";q=100;w=60"#));
/// let quota = Announcement::read(StatusCode::OK, &headers).quota.unwrap();
/// assert_eq!((quota.limit, quota.window), (100, Some(Duration::from_secs(60))));
/// ```
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Quota {
    /// The most requests in one window (`q`, or `X-RateLimit-Limit`).
    pub limit: u64,
    /// The window (`w`); `None` from `X-RateLimit-Limit`, which has none.
    pub window: Option<Duration>,
}

/// What is left: at most `available` more requests `within` the given
/// time (draft -11's reading of `r` and `t`; under -10, `t` is when the
/// quota resets, which bounds the same wait).
///
/// ```
/// use http::{HeaderMap, HeaderValue, StatusCode};
/// use ratewall::client::Announcement;
/// use std::time::Duration;
///
/// let mut headers = HeaderMap::new();
/// headers.insert("ratelimit", HeaderValue::from_static(r#""default";r=42;t=17"#));
/// let left = Announcement::read(StatusCode::OK, &headers).remaining.unwrap();
/// assert_eq!((left.available, left.within), (42, Some(Duration::from_secs(17))));
/// ```
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Remaining {
    /// How many more requests the upstream admits (`r`, or
    /// `X-RateLimit-Remaining`).
    pub available: u64,
    /// Within how long (`t`, or `X-RateLimit-Reset`), at most
    /// [`MAX_PAUSE`]; `None` if the upstream did not say.
    pub within: Option<Duration>,
}

/// What one response says about the upstream's limits.
///
/// Read with [`Announcement::read`]. Where a field lists several policies,
/// the announcement keeps the one that binds first: the quota with the
/// slowest rate (`q/w`), and the `RateLimit` item with the fewest
/// requests left (of those, the longest `t`). The draft fields win over
/// the legacy `X-RateLimit-*` ones when both are sent.
///
/// ```
/// use http::{HeaderMap, HeaderValue, StatusCode};
/// use ratewall::client::Announcement;
/// use std::time::Duration;
///
/// let mut headers = HeaderMap::new();
/// headers.insert("retry-after", HeaderValue::from_static("30"));
/// let said = Announcement::read(StatusCode::TOO_MANY_REQUESTS, &headers);
/// assert!(said.too_many_requests);
/// assert_eq!(said.retry_after, Some(Duration::from_secs(30)));
/// assert_eq!(said.pause(), Some(Duration::from_secs(30)));
/// ```
#[non_exhaustive]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Announcement {
    /// The binding quota, from `RateLimit-Policy` or `X-RateLimit-Limit`.
    pub quota: Option<Quota>,
    /// The most the upstream admits at once by every policy: the smallest
    /// `q` of the `RateLimit-Policy` items with a window (`None` if none
    /// has one). With several policies it may be below the binding
    /// quota's `q` (`"burst";q=5;w=1, "day";q=1000;w=86400`: the day's
    /// quota binds, 5 at once).
    pub burst: Option<u64>,
    /// What is left, from `RateLimit` or `X-RateLimit-Remaining` and
    /// `X-RateLimit-Reset`.
    pub remaining: Option<Remaining>,
    /// `Retry-After` (delta seconds or an HTTP date), read only on a 429
    /// or a 503, at most [`MAX_PAUSE`].
    pub retry_after: Option<Duration>,
    /// Whether the status was 429 Too Many Requests.
    pub too_many_requests: bool,
    /// Whether the status was 503 Service Unavailable (a refusal too: its
    /// `Retry-After` is read, and a pacing layer retries it).
    pub unavailable: bool,
}

impl Announcement {
    /// Reads the response's status and headers (HTTP dates and Unix times
    /// are measured from [`SystemTime::now`]).
    ///
    /// ```
    /// use http::{HeaderMap, HeaderValue, StatusCode};
    /// use ratewall::client::Announcement;
    ///
    /// let mut headers = HeaderMap::new();
    /// headers.insert("ratelimit-policy", HeaderValue::from_static("garbage;;q=1"));
    /// // Malformed fields are ignored.
    /// assert_eq!(Announcement::read(StatusCode::OK, &headers), Announcement::default());
    /// ```
    pub fn read(status: StatusCode, headers: &HeaderMap) -> Announcement {
        Announcement::read_at(status, headers, SystemTime::now())
    }

    /// [`read`](Self::read) with the wall-clock time given, for HTTP dates
    /// in `Retry-After` and Unix times in `X-RateLimit-Reset`.
    ///
    /// ```
    /// use http::{HeaderMap, HeaderValue, StatusCode};
    /// use ratewall::client::Announcement;
    /// use std::time::{Duration, UNIX_EPOCH};
    ///
    /// let mut headers = HeaderMap::new();
    /// headers.insert("retry-after", HeaderValue::from_static("Sun, 06 Nov 1994 08:49:37 GMT"));
    /// let now = UNIX_EPOCH + Duration::from_secs(784_111_767); // 08:49:27
    /// let said = Announcement::read_at(StatusCode::SERVICE_UNAVAILABLE, &headers, now);
    /// assert_eq!(said.retry_after, Some(Duration::from_secs(10)));
    /// ```
    pub fn read_at(status: StatusCode, headers: &HeaderMap, now: SystemTime) -> Announcement {
        let limited = status == StatusCode::TOO_MANY_REQUESTS;
        let unavailable = status == StatusCode::SERVICE_UNAVAILABLE;
        let retry_after = if limited || unavailable {
            single(headers, &RETRY_AFTER).and_then(|v| retry_after(v, now))
        } else {
            None
        };
        let (quota, burst) = match policy(headers) {
            Some((quota, burst)) => (Some(quota), burst),
            None => (legacy_quota(headers), None),
        };
        Announcement {
            quota,
            burst,
            remaining: ratelimit(headers).or_else(|| legacy_remaining(headers, now)),
            retry_after,
            too_many_requests: limited,
            unavailable,
        }
    }

    /// How long the upstream asks this client to stop, at most
    /// [`MAX_PAUSE`]: the longest of `Retry-After` (on a 429 or a 503); if
    /// nothing is left (`r=0`), `t`, else the quota's window, else
    /// [`DEFAULT_PAUSE`]; and on a 429 that says neither, [`DEFAULT_PAUSE`].
    /// `None` when the response asks for no pause.
    ///
    /// ```
    /// use http::{HeaderMap, HeaderValue, StatusCode};
    /// use ratewall::client::Announcement;
    /// use std::time::Duration;
    ///
    /// let mut headers = HeaderMap::new();
    /// headers.insert("ratelimit", HeaderValue::from_static(r#""burst";r=0;t=3, "day";r=900;t=600"#));
    /// let said = Announcement::read(StatusCode::OK, &headers);
    /// assert_eq!(said.pause(), Some(Duration::from_secs(3)));
    /// ```
    #[must_use]
    pub fn pause(&self) -> Option<Duration> {
        let exhausted = self.remaining.filter(|r| r.available == 0).map(|r| {
            r.within
                .or(self.quota.and_then(|q| q.window))
                .unwrap_or(DEFAULT_PAUSE)
        });
        let unsaid = (self.too_many_requests && self.retry_after.is_none() && exhausted.is_none())
            .then_some(DEFAULT_PAUSE);
        [self.retry_after, exhausted, unsaid]
            .into_iter()
            .flatten()
            .max()
            .map(|p| p.min(MAX_PAUSE))
    }
}

/// A duration of `secs` seconds, at most [`MAX_PAUSE`].
fn pause_secs(secs: u64) -> Duration {
    Duration::from_secs(secs.min(MAX_PAUSE.as_secs()))
}

/// The lines of field `name`, or `None` if it is absent or over the
/// limits (then it is ignored). Counts at most `MAX_LINES + 1` lines, so
/// a response with thousands of lines costs no more than one with 17.
fn lines<'h>(headers: &'h HeaderMap, name: &HeaderName) -> Option<impl Iterator<Item = &'h [u8]>> {
    let all = headers.get_all(name);
    let (mut count, mut bytes) = (0, 0);
    for value in all.iter().take(MAX_LINES + 1) {
        count += 1;
        bytes += value.len();
    }
    let fits = count > 0 && count <= MAX_LINES && bytes <= MAX_FIELD_BYTES;
    fits.then(|| all.into_iter().map(HeaderValue::as_bytes))
}

/// A field that must have one value: its value (trimmed), or `None` if
/// absent, over the limits, or sent more than once with different values.
fn single<'h>(headers: &'h HeaderMap, name: &HeaderName) -> Option<&'h [u8]> {
    let mut all = lines(headers, name)?;
    let first = all.next()?.trim_ascii();
    all.all(|line| line.trim_ascii() == first).then_some(first)
}

/// Folds every member of a structured list through `each`; `None` if the
/// field is absent, over a limit, or fails to parse on any line (RFC 9651
/// §4.2: the whole field is then ignored).
fn fold_list<T>(
    headers: &HeaderMap,
    name: &HeaderName,
    mut each: impl FnMut(Option<T>, &Member<'_>) -> Option<T>,
) -> Option<T> {
    let mut acc = None;
    let mut seen = 0;
    for line in lines(headers, name)? {
        sf::parse_list(line, &mut seen, |m| acc = each(acc.take(), m)).ok()?;
    }
    acc
}

/// `RateLimit-Policy`: the quota with the slowest rate (a quota with a
/// window before one without), and the smallest `q` of the items with a
/// window. An item is ignored unless it is an item with an integer
/// `q` >= 1, a `w`, if given, that is an integer in 1..=366 days, and a
/// unit (`qu`), if given, of `requests`.
fn policy(headers: &HeaderMap) -> Option<(Quota, Option<u64>)> {
    fold_list(
        headers,
        &names::POLICY,
        |best: Option<(Quota, Option<u64>)>, m| {
            let Some(quota) = policy_item(m) else {
                return best;
            };
            let burst = quota.window.map(|_| quota.limit);
            Some(match best {
                Some((b, least)) => {
                    let least = match (least, burst) {
                        (Some(l), Some(q)) => Some(l.min(q)),
                        (l, q) => l.or(q),
                    };
                    (if slower(&quota, &b) { quota } else { b }, least)
                }
                None => (quota, burst),
            })
        },
    )
}

fn policy_item(m: &Member<'_>) -> Option<Quota> {
    if m.inner_list {
        return None;
    }
    match m.param(names::UNIT) {
        None => {}
        Some(Bare::Text(b"requests")) => {}
        Some(_) => return None,
    }
    let limit = m.uint(names::QUOTA).filter(|&q| q > 0)?;
    // `w` is optional in the draft: without it the quota is shown but
    // cannot pace; a `w` that is there but unusable drops the item.
    let window = match m.param(names::WINDOW) {
        None => None,
        Some(_) => {
            let w = Duration::from_secs(m.uint(names::WINDOW)?);
            Some(w).filter(|w| !w.is_zero() && *w <= MAX_WINDOW)?;
            Some(w)
        }
    };
    Some(Quota { limit, window })
}

/// Whether quota `a` admits fewer requests per second than `b`.
fn slower(a: &Quota, b: &Quota) -> bool {
    match (a.window, b.window) {
        // q_a / w_a < q_b / w_b; q < 10^15 and w < 2^35 s: no overflow in u128.
        (Some(wa), Some(wb)) => {
            u128::from(a.limit) * u128::from(wb.as_secs())
                < u128::from(b.limit) * u128::from(wa.as_secs())
        }
        (None, None) => a.limit < b.limit,
        // A quota with a window can pace; one without cannot.
        (wa, _) => wa.is_some(),
    }
}

/// `RateLimit`: the item with the fewest requests left (of those, the
/// longest `t`). An item is ignored unless it is an item with an integer
/// `r` >= 0; `t`, if not a non-negative integer, is left unsaid.
fn ratelimit(headers: &HeaderMap) -> Option<Remaining> {
    fold_list(headers, &names::RATELIMIT, |best: Option<Remaining>, m| {
        if m.inner_list {
            return best;
        }
        let Some(available) = m.uint(names::AVAILABLE) else {
            return best;
        };
        let item = Remaining {
            available,
            within: m.uint(names::WITHIN).map(pause_secs),
        };
        Some(match best {
            Some(b) if (b.available, item.within) <= (item.available, b.within) => b,
            _ => item,
        })
    })
}

/// A decimal integer (ASCII digits only), saturating at `u64::MAX`.
fn digits(v: &[u8]) -> Option<u64> {
    if v.is_empty() || !v.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(v.iter().fold(0u64, |n, &c| {
        n.saturating_mul(10).saturating_add(u64::from(c - b'0'))
    }))
}

fn legacy_quota(headers: &HeaderMap) -> Option<Quota> {
    let limit = digits(single(headers, &names::X_LIMIT)?)?;
    Some(Quota {
        limit,
        window: None,
    })
}

fn legacy_remaining(headers: &HeaderMap, now: SystemTime) -> Option<Remaining> {
    let available = digits(single(headers, &names::X_REMAINING)?)?;
    let within = single(headers, &names::X_RESET)
        .and_then(digits)
        .map(|v| reset(v, now));
    Some(Remaining { available, within })
}

/// `X-RateLimit-Reset`: below [`EPOCH_SECONDS_FROM`] delta seconds; then
/// a Unix time in seconds; from [`EPOCH_MILLIS_FROM`] a Unix time in
/// milliseconds. A time in the past is no wait; at most [`MAX_PAUSE`].
fn reset(v: u64, now: SystemTime) -> Duration {
    let at = match v {
        v if v < EPOCH_SECONDS_FROM => return pause_secs(v),
        v if v < EPOCH_MILLIS_FROM => Duration::from_secs(v),
        v => Duration::from_millis(v),
    };
    until(UNIX_EPOCH.checked_add(at), now)
}

/// The wait from `now` until `at` (`None`: beyond what `SystemTime`
/// holds, so far away), at most [`MAX_PAUSE`].
fn until(at: Option<SystemTime>, now: SystemTime) -> Duration {
    match at {
        Some(at) => at
            .duration_since(now)
            .unwrap_or(Duration::ZERO)
            .min(MAX_PAUSE),
        None => MAX_PAUSE,
    }
}

/// `Retry-After` (RFC 9110 §10.2.3): delta seconds, or an HTTP date (any
/// of the three formats of §5.6.7); anything else is ignored.
fn retry_after(v: &[u8], now: SystemTime) -> Option<Duration> {
    if let Some(secs) = digits(v) {
        return Some(pause_secs(secs));
    }
    let text = std::str::from_utf8(v).ok()?;
    let at = httpdate::parse_http_date(text).ok()?;
    Some(until(Some(at), now))
}

#[cfg(test)]
#[path = "announce_tests.rs"]
mod tests;
