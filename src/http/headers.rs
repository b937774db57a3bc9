//! Header rendering: `Retry-After`, the IETF `RateLimit-Policy` and
//! `RateLimit` fields (draft-ietf-httpapi-ratelimit-headers-11, whose wire
//! format is -10's: RFC 9651 structured-field lists), and the legacy
//! `X-RateLimit-*` trio. docs/http.md has the table of every field's value
//! for each algorithm.
//!
//! Values are written into a stack buffer and copied once into a
//! `HeaderValue` (the one allocation `http` makes per header value).
//!
//! # `q` and `w`
//!
//! `q` is the most a client can spend at once and `w` the span over which
//! it is counted: a window's limit and length; a bucket's burst and the
//! time to refill it (`100/min burst 20` is `q=20;w=12`). That pair is the
//! one promise a client can rely on: a client that sends at most `q` in
//! any `w` seconds is never denied, by every algorithm but the
//! sliding-window counter, which estimates. `q=100;w=60` would not hold
//! for that bucket: 100 requests at once are denied after 20.
//!
//! # `t`
//!
//! `t` is the window within which at most `r` more are available: on an
//! allowed response the seconds until the quota is back (`reset_after`,
//! rounded up), never more than `w`; for a rule that denied (`r=0`),
//! until the request could pass (`retry_after`, rounded up, at least 1).
//! A 429 lists only the rules that denied, and its `Retry-After` is the
//! largest of their `t`, so no `t` it sends ends after `Retry-After`.
//! `X-RateLimit-Reset` is the same number.
//!
//! # Concurrency rules
//!
//! A concurrency rule's `RateLimit-Policy` item is
//! `"name";q=<max>;qu="concurrent-requests"` (an adaptive rule's `q` is its
//! ceiling), with no `w`: the quota is requests in flight, not per time.
//! Its `RateLimit` item is `"name";r=<remaining>` with no `t`: permits come
//! back when requests in flight end, at no time the server can promise, and
//! the draft makes `t` optional. On a `429` or `503` that it caused,
//! `Retry-After` is the rule's mean hold time, rounded up: a hint. The
//! legacy trio has no way to say "in flight" and leaves these rules out of
//! allowed responses.

use super::compiled::{Compiled, Entry};
use super::rule::{valid_name, Visibility};
use crate::clock::Clock;
use crate::decision::Decision;
use crate::policy::Policy;
use http::header::HeaderName;
use http::{HeaderMap, HeaderValue};
use std::time::Duration;

pub(super) const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
pub(super) const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
pub(super) const X_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
const X_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
const X_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");

/// Which rate-limit headers the layer sends.
///
/// ```
/// use ratewall::http::{Headers, Items};
///
/// let draft = Headers::Draft(Items::All);
/// let closest = Headers::Draft(Items::ClosestToExhaustion);
/// # let _ = (draft, closest, Headers::Legacy, Headers::None);
/// ```
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Headers {
    /// Only `Retry-After` on a 429.
    None,
    /// `X-RateLimit-Limit`, `X-RateLimit-Remaining` and `X-RateLimit-Reset`
    /// (seconds from now) of the rule closest to exhaustion: the draft's
    /// `q`, `r` and `t`.
    Legacy,
    /// `RateLimit-Policy` and `RateLimit` of
    /// draft-ietf-httpapi-ratelimit-headers-11 (the wire format of -10),
    /// with the items chosen by [`Items`]. The default is
    /// `Draft(Items::All)`.
    Draft(Items),
}

impl Default for Headers {
    fn default() -> Self {
        Headers::Draft(Items::All)
    }
}

/// Which rules the draft fields list.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Items {
    /// One item per matching rule whose headers are shown.
    #[default]
    All,
    /// Only the rule with the smallest share of its quota left.
    ClosestToExhaustion,
}

/// A byte buffer on the stack for one header value; past 384 bytes (many
/// rules with long names) it moves to the heap.
pub(super) struct Buf {
    stack: [u8; 384],
    len: usize,
    heap: Vec<u8>,
}

impl Buf {
    pub(super) fn new() -> Buf {
        Buf {
            stack: [0; 384],
            len: 0,
            heap: Vec::new(),
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.len == 0 && self.heap.is_empty()
    }

    fn as_slice(&self) -> &[u8] {
        if self.heap.is_empty() {
            &self.stack[..self.len]
        } else {
            &self.heap
        }
    }

    #[inline]
    fn bytes(&mut self, b: &[u8]) {
        if let Some(dst) = self.stack.get_mut(self.len..self.len + b.len()) {
            if self.heap.is_empty() {
                dst.copy_from_slice(b);
                self.len += b.len();
                return;
            }
        }
        self.bytes_on_heap(b);
    }

    /// Past the stack buffer: everything moves to the heap, once.
    #[cold]
    fn bytes_on_heap(&mut self, b: &[u8]) {
        if self.heap.is_empty() {
            self.heap.extend_from_slice(&self.stack[..self.len]);
        }
        self.heap.extend_from_slice(b);
    }

    /// `n` in decimal, two digits per division (the digit pairs come from
    /// a table).
    #[inline]
    fn num(&mut self, mut n: u64) {
        let mut digits = [0u8; 20];
        let mut i = digits.len();
        while n >= 100 {
            let pair = usize::try_from(n % 100).unwrap_or(0) * 2;
            n /= 100;
            i -= 2;
            digits[i..i + 2].copy_from_slice(&DIGIT_PAIRS[pair..pair + 2]);
        }
        if n >= 10 {
            let pair = usize::try_from(n).unwrap_or(0) * 2;
            i -= 2;
            digits[i..i + 2].copy_from_slice(&DIGIT_PAIRS[pair..pair + 2]);
        } else {
            i -= 1;
            digits[i] = b'0' + n as u8;
        }
        self.bytes(&digits[i..]);
    }

    fn separator(&mut self) {
        if !self.is_empty() {
            self.bytes(b", ");
        }
    }

    /// A `RateLimit-Policy` item: `"name";q=<limit>;w=<span secs>`.
    pub(super) fn policy_item(&mut self, name: &str, policy: &Policy) {
        debug_assert!(valid_name(name));
        self.separator();
        self.bytes(b"\"");
        self.bytes(name.as_bytes());
        self.bytes(b"\";q=");
        self.num(sf_int(policy.limit()));
        self.bytes(b";w=");
        self.num(sf_int(window_secs(policy)));
    }

    /// A concurrency rule's `RateLimit-Policy` item:
    /// `"name";q=<max>;qu="concurrent-requests"`.
    pub(super) fn concurrency_policy_item(&mut self, name: &str, max: u64) {
        debug_assert!(valid_name(name));
        self.separator();
        self.bytes(b"\"");
        self.bytes(name.as_bytes());
        self.bytes(b"\";q=");
        self.num(sf_int(max));
        self.bytes(b";qu=\"concurrent-requests\"");
    }

    /// A concurrency rule's `RateLimit` item after its prefix `"name";r=`:
    /// the remaining permits, and no `t`.
    pub(super) fn ratelimit_item_untimed(&mut self, prefix: &[u8], d: &Decision) {
        self.separator();
        self.bytes(prefix);
        self.num(sf_int(d.remaining()));
    }

    /// An item rendered once at build (a rule's `RateLimit-Policy` item).
    pub(super) fn item(&mut self, rendered: &[u8]) {
        self.separator();
        self.bytes(rendered);
    }

    /// A `RateLimit` item after its prefix `"name";r=`, rendered at build.
    pub(super) fn ratelimit_item_prefixed(&mut self, prefix: &[u8], d: &Decision, policy: &Policy) {
        self.separator();
        self.bytes(prefix);
        self.num(sf_int(d.remaining()));
        self.bytes(b";t=");
        self.num(sf_int(t_secs(d, policy)));
    }

    /// A `RateLimit` item: `"name";r=<remaining>;t=<secs>`.
    pub(super) fn ratelimit_item(&mut self, name: &str, d: &Decision, policy: &Policy) {
        debug_assert!(valid_name(name));
        self.separator();
        self.bytes(b"\"");
        self.bytes(name.as_bytes());
        self.bytes(b"\";r=");
        self.num(sf_int(d.remaining()));
        self.bytes(b";t=");
        self.num(sf_int(t_secs(d, policy)));
    }

    /// The header value. Only digits, ASCII punctuation and validated
    /// names are ever written, so this cannot fail; if it did, the header
    /// is left out rather than the request failing.
    pub(super) fn value(&self) -> Option<HeaderValue> {
        HeaderValue::from_bytes(self.as_slice()).ok()
    }
}

/// "00" to "99": the two decimal digits of each number below 100.
const DIGIT_PAIRS: &[u8; 200] = b"\
    0001020304050607080910111213141516171819\
    2021222324252627282930313233343536373839\
    4041424344454647484950515253545556575859\
    6061626364656667686970717273747576777879\
    8081828384858687888990919293949596979899";

/// The largest structured-field integer (15 decimal digits).
const SF_INT_MAX: u64 = 999_999_999_999_999;

#[inline]
fn sf_int(n: u64) -> u64 {
    n.min(SF_INT_MAX)
}

/// `w`: the policy's span in whole seconds, rounded up, at least 1.
pub(super) fn window_secs(policy: &Policy) -> u64 {
    ceil_secs(policy.span())
}

/// A duration in whole seconds, rounded up, at least 1.
#[inline]
fn ceil_secs(span: Duration) -> u64 {
    let secs = span.as_secs() + u64::from(span.subsec_nanos() > 0);
    secs.max(1)
}

/// `t` of a rule's `RateLimit` item and its `X-RateLimit-Reset` (see the
/// module docs): [`Decision::ratelimit_t_secs_within`] the policy's window,
/// the one `t` that `Decision::ratelimit_header` writes too.
#[inline]
pub(super) fn t_secs(d: &Decision, policy: &Policy) -> u64 {
    d.ratelimit_t_secs_within(policy.window().map(|w| w.length()))
}

/// Whether `a` has a smaller share of its quota left than `b`
/// (`remaining / limit`, compared without division).
pub(super) fn closer_to_exhaustion(a: &Decision, b: &Decision) -> bool {
    let lhs = u128::from(a.remaining()) * u128::from(b.limit().max(1));
    let rhs = u128::from(b.remaining()) * u128::from(a.limit().max(1));
    lhs < rhs || (lhs == rhs && a.ratelimit_t_secs() > b.ratelimit_t_secs())
}

/// The legacy trio: `X-RateLimit-Limit`, `-Remaining` and `-Reset`.
pub(super) fn legacy(h: &mut HeaderMap, [limit, remaining, reset]: [u64; 3]) {
    h.insert(X_LIMIT, HeaderValue::from(limit));
    h.insert(X_REMAINING, HeaderValue::from(remaining));
    h.insert(X_RESET, HeaderValue::from(reset));
}

/// The rate-limit headers of an admitted request: rendered by the check,
/// written into the response when it comes.
pub(super) struct Admitted {
    pub(super) policy: Option<HeaderValue>,
    pub(super) ratelimit: Option<HeaderValue>,
    /// `X-RateLimit-Limit`, `-Remaining`, `-Reset`.
    pub(super) legacy: Option<[u64; 3]>,
}

impl Admitted {
    /// No header.
    pub(super) const NONE: Admitted = Admitted {
        policy: None,
        ratelimit: None,
        legacy: None,
    };

    #[inline]
    pub(super) fn is_empty(&self) -> bool {
        self.policy.is_none() && self.ratelimit.is_none() && self.legacy.is_none()
    }

    /// Writes the headers into a response's.
    #[inline]
    pub(super) fn write(self, h: &mut HeaderMap) {
        if let Some(v) = self.policy {
            h.insert(RATELIMIT_POLICY, v);
        }
        if let Some(v) = self.ratelimit {
            h.insert(RATELIMIT, v);
        }
        if let Some(l) = self.legacy {
            legacy(h, l);
        }
    }

    /// The headers `which` asks for, from the decisions of an admitted
    /// request's entries. `all_policy` is the mask of the shown rules and
    /// their joint `RateLimit-Policy` value, rendered at build. `CONC`:
    /// some rules may be concurrency rules (a separate copy, so that a
    /// rate-only layer's code has no test for them).
    #[inline]
    pub(super) fn of<C: Clock, const CONC: bool>(
        which: Headers,
        rules: &[Compiled<C>],
        entries: &[Entry],
        all_policy: Option<&(u64, HeaderValue)>,
    ) -> Admitted {
        let mut after = Admitted::NONE;
        let shown = || {
            entries.iter().filter_map(|e| {
                let r = &rules[usize::from(e.rule)];
                match (r.rule.visibility, e.decision) {
                    (Visibility::Shown, Some(d)) => Some((r, d)),
                    _ => None,
                }
            })
        };
        let closest = |legacy: bool| {
            shown()
                .filter(move |(r, _)| !(CONC && legacy && r.is_concurrent()))
                .reduce(|a, b| {
                    if closer_to_exhaustion(&b.1, &a.1) {
                        b
                    } else {
                        a
                    }
                })
        };
        match which {
            Headers::None => {}
            Headers::Legacy => {
                if let Some((r, d)) = closest(true) {
                    after.legacy = Some([d.limit(), d.remaining(), t_secs(&d, &r.rule.policy)]);
                }
            }
            Headers::Draft(Items::ClosestToExhaustion) => {
                if let Some((r, d)) = closest(false) {
                    let mut limit = Buf::new();
                    if CONC && r.is_concurrent() {
                        limit.ratelimit_item_untimed(&r.ratelimit_prefix, &d);
                    } else {
                        limit.ratelimit_item(&r.rule.name, &d, &r.rule.policy);
                    }
                    after.policy = r.policy_item.clone();
                    after.ratelimit = limit.value();
                }
            }
            Headers::Draft(_) => {
                let mut limit = Buf::new();
                let mut count = 0;
                let mut last = None;
                let mut mask = 0u64;
                for e in entries {
                    let r = &rules[usize::from(e.rule)];
                    let Some(d) = e.decision else { continue };
                    if r.rule.visibility != Visibility::Shown {
                        continue;
                    }
                    if CONC && r.is_concurrent() {
                        limit.ratelimit_item_untimed(&r.ratelimit_prefix, &d);
                    } else {
                        limit.ratelimit_item_prefixed(&r.ratelimit_prefix, &d, &r.rule.policy);
                    }
                    count += 1;
                    last = Some(r);
                    if e.rule < 64 {
                        mask |= 1 << e.rule;
                    }
                }
                after.policy = match (count, all_policy) {
                    (0, _) => None,
                    // One rule: its policy item was rendered once, at build.
                    (1, _) => last.and_then(|r| r.policy_item.clone()),
                    // Every shown rule: rendered once, at build.
                    (_, Some((all, v))) if *all == mask => Some(v.clone()),
                    _ => {
                        let mut policy = Buf::new();
                        for (r, _) in shown() {
                            policy.item(r.policy_item.as_ref().map_or(&[][..], |v| v.as_bytes()));
                        }
                        policy.value()
                    }
                };
                if count > 0 {
                    after.ratelimit = limit.value();
                }
            }
        }
        after
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ManualClock, Rate, TokenBucket, Window};

    #[test]
    fn items_render_as_the_draft_writes_them() {
        let mut b = Buf::new();
        b.policy_item("default", &Policy::fixed_window(Window::per_minute(100)));
        assert_eq!(b.as_slice(), b"\"default\";q=100;w=60");
        b.policy_item(
            "burst",
            &Policy::token_bucket(Rate::per_second(10).burst(5)),
        );
        assert_eq!(
            std::str::from_utf8(b.as_slice()).unwrap(),
            "\"default\";q=100;w=60, \"burst\";q=5;w=1"
        );
        let bucket = TokenBucket::with_clock(Rate::per_minute(60), ManualClock::new()).unwrap();
        let d = bucket.check();
        let mut b = Buf::new();
        b.ratelimit_item("default", &d, &Policy::token_bucket(Rate::per_minute(60)));
        assert_eq!(b.as_slice(), b"\"default\";r=59;t=1");
        assert!(b.value().is_some());
    }

    #[test]
    fn prefixed_and_prerendered_items_match_the_plain_ones() {
        let bucket = TokenBucket::with_clock(Rate::per_minute(60), ManualClock::new()).unwrap();
        let d = bucket.check();
        let p = Policy::token_bucket(Rate::per_minute(60));
        let (mut a, mut b) = (Buf::new(), Buf::new());
        a.ratelimit_item("x", &d, &p);
        a.ratelimit_item("y", &d, &p);
        b.ratelimit_item_prefixed(b"\"x\";r=", &d, &p);
        b.ratelimit_item_prefixed(b"\"y\";r=", &d, &p);
        assert_eq!(a.as_slice(), b.as_slice());
        let p = Policy::fixed_window(Window::per_minute(100));
        let (mut a, mut b) = (Buf::new(), Buf::new());
        a.policy_item("x", &p);
        a.policy_item("y", &p);
        b.item(b"\"x\";q=100;w=60");
        b.item(b"\"y\";q=100;w=60");
        assert_eq!(a.as_slice(), b.as_slice());
    }

    #[test]
    fn t_of_a_denial_is_its_retry_after_not_its_time_to_full() {
        let bucket =
            TokenBucket::with_clock(Rate::per_second(1).burst(10), ManualClock::new()).unwrap();
        let _ = bucket.check_n(10).unwrap();
        let denied = bucket.check();
        assert!(!denied.is_allowed());
        assert_eq!(denied.reset_after_secs(), 10);
        assert_eq!(denied.ratelimit_t_secs(), 1);
        assert_eq!(denied.ratelimit_t_secs(), denied.retry_after_secs());
    }

    #[test]
    fn long_values_move_to_the_heap_intact() {
        let mut b = Buf::new();
        let mut want = String::new();
        for i in 0..40 {
            let name = format!("rule-number-{i}");
            b.policy_item(&name, &Policy::fixed_window(Window::per_minute(100)));
            if i > 0 {
                want.push_str(", ");
            }
            want.push_str(&format!("\"{name}\";q=100;w=60"));
        }
        assert!(want.len() > 384);
        assert_eq!(std::str::from_utf8(b.as_slice()).unwrap(), want);
        assert!(b.value().is_some());
    }

    #[test]
    fn numbers_render_as_decimal() {
        let mut cases: Vec<u64> = vec![0, 1, 9, 10, 11, 99, 100, 101, 999, 1000, 65_535];
        cases.extend((0..20).map(|k| 10u64.pow(k)));
        cases.extend((1..20).map(|k| 10u64.pow(k) - 1));
        cases.extend([u64::MAX, u64::MAX - 1, 123_456_789_012_345_678]);
        let mut x = 0x9e37_79b9_7f4a_7c15_u64;
        for _ in 0..1000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            cases.push(x >> (x % 64));
        }
        for n in cases {
            let mut b = Buf::new();
            b.num(n);
            assert_eq!(b.as_slice(), n.to_string().as_bytes(), "{n}");
        }
    }

    #[test]
    fn numbers_are_clamped_to_structured_field_integers() {
        let mut b = Buf::new();
        b.num(sf_int(u64::MAX));
        assert_eq!(b.as_slice(), b"999999999999999");
        let mut b = Buf::new();
        b.num(sf_int(0));
        assert_eq!(b.as_slice(), b"0");
    }

    #[test]
    fn exhaustion_compares_shares_not_counts() {
        let clock = ManualClock::new();
        let big = TokenBucket::with_clock(Rate::per_hour(100), clock.clone()).unwrap();
        let small = TokenBucket::with_clock(Rate::per_hour(4), clock).unwrap();
        let b = big.check_n(50).unwrap(); // 50 of 100 left: half
        let s = small.check_n(1).unwrap(); // 3 of 4 left: three quarters
        assert!(closer_to_exhaustion(&b, &s));
        assert!(!closer_to_exhaustion(&s, &b));
    }
}

#[cfg(test)]
#[path = "headers_tests.rs"]
mod writer_tests;
