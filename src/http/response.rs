//! What the layer answers: the response body wrapper (the inner service's
//! body, or the layer's own), problem+json bodies, the gRPC status, and
//! the custom responder's view of a rejection.

use super::compiled::{Compiled, Entry, INLINE_RULES};
use super::concurrent::Held;
use super::headers::{legacy, Buf, Headers, Items, RATELIMIT, RATELIMIT_POLICY, X_LIMIT};
use super::rule::Visibility;
use crate::clock::Clock;
use crate::decision::Decision;
#[cfg(feature = "redis")]
use crate::wording::plural;
use bytes::Bytes;
use http::header::{HeaderValue, CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderMap, Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use smallvec::SmallVec;
use std::fmt;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

pin_project! {
    /// The response body of the layer: the inner service's body, or the
    /// layer's own (a 429 or a missing-key rejection). Wrapping the body
    /// means the inner service needs no `From<Error>` bound.
    ///
    /// ```
    /// use http_body::Body;
    /// use ratewall::http::ResponseBody;
    ///
    /// let body: ResponseBody<String> = ResponseBody::full("too many".into());
    /// assert_eq!(body.size_hint().exact(), Some(8));
    /// ```
    pub struct ResponseBody<B> {
        #[pin]
        inner: Inner<B>,
    }
}

pin_project! {
    #[project = InnerProj]
    enum Inner<B> {
        Body { #[pin] body: B },
        Full { data: Option<Bytes> },
        // The inner service's body and the permits it holds until its end
        // (concurrency rules). Boxed, so that the body's drop stays a
        // one-byte tag and one call per variant: inline, its niche made
        // every body's drop, the rate-only layer's too, cost about 20
        // instructions more.
        Held { holding: Pin<Box<Holding<B>>> },
    }
}

pin_project! {
    #[project = Projected]
    struct Holding<B> {
        #[pin]
        body: B,
        // `None` once released.
        held: Option<Held>,
    }
}

impl<B> ResponseBody<B> {
    /// The inner service's body.
    ///
    /// ```
    /// # use ratewall::http::ResponseBody;
    /// let body = ResponseBody::new(String::from("hello"));
    /// # let _ = body;
    /// ```
    pub fn new(body: B) -> Self {
        ResponseBody {
            inner: Inner::Body { body },
        }
    }

    /// The inner service's body holding an admitted request's permits: they
    /// are released at its end, on its error, or when it is dropped.
    pub(super) fn holding(body: B, held: Held) -> Self {
        ResponseBody {
            inner: Inner::Held {
                holding: Box::pin(Holding {
                    body,
                    held: Some(held),
                }),
            },
        }
    }

    /// A body of the layer's own.
    ///
    /// ```
    /// # use ratewall::http::ResponseBody;
    /// let body: ResponseBody<String> = ResponseBody::full("{}".into());
    /// # let _ = body;
    /// ```
    pub fn full(data: Bytes) -> Self {
        ResponseBody {
            inner: Inner::Full {
                data: if data.is_empty() { None } else { Some(data) },
            },
        }
    }
}

impl<B: fmt::Debug> fmt::Debug for ResponseBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.inner {
            Inner::Body { body } => f.debug_tuple("ResponseBody").field(body).finish(),
            Inner::Full { data } => f.debug_tuple("ResponseBody::Full").field(data).finish(),
            Inner::Held { holding } => f
                .debug_tuple("ResponseBody::Held")
                .field(&holding.body)
                .field(&holding.held)
                .finish(),
        }
    }
}

impl<B> Body for ResponseBody<B>
where
    B: Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        match self.project().inner.project() {
            InnerProj::Body { body } => body.poll_frame(cx),
            InnerProj::Full { data } => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
            InnerProj::Held { holding } => {
                let Projected { mut body, held } = holding.as_mut().project();
                let polled = body.as_mut().poll_frame(cx);
                match &polled {
                    Poll::Ready(Some(Err(_))) => {
                        if let Some(h) = held.take() {
                            h.failed();
                        }
                    }
                    Poll::Ready(None) => {
                        if let Some(h) = held.take() {
                            h.ended();
                        }
                    }
                    Poll::Ready(Some(Ok(_))) if body.is_end_stream() => {
                        if let Some(h) = held.take() {
                            h.ended();
                        }
                    }
                    _ => {}
                }
                polled
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.inner {
            Inner::Body { body } => body.is_end_stream(),
            Inner::Held { holding } => holding.body.is_end_stream(),
            Inner::Full { data } => data.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.inner {
            Inner::Body { body } => body.size_hint(),
            Inner::Held { holding } => holding.body.size_hint(),
            Inner::Full { data } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
        }
    }
}

/// One rule's part in a request: its name and decision, and whether it
/// denied the request.
///
/// ```
/// # use ratewall::http::RuleDecision;
/// fn describe(d: &RuleDecision<'_>) -> String {
///     format!("{}: {} left", d.name(), d.decision().remaining())
/// }
/// # let _ = describe;
/// ```
#[derive(Clone, Copy, Debug)]
pub struct RuleDecision<'a> {
    pub(super) name: &'a str,
    pub(super) decision: Decision,
    pub(super) denied: bool,
}

impl<'a> RuleDecision<'a> {
    /// The rule's name.
    ///
    /// ```
    /// # fn f(d: ratewall::http::RuleDecision<'_>) { let _ = d.name(); }
    /// ```
    pub fn name(&self) -> &'a str {
        self.name
    }

    /// The rule's decision (for a rule that did not deny a rejected
    /// request: what it decides after the rollback).
    ///
    /// ```
    /// # fn f(d: ratewall::http::RuleDecision<'_>) { let _ = d.decision().remaining(); }
    /// ```
    pub fn decision(&self) -> Decision {
        self.decision
    }

    /// Whether this rule denied the request.
    ///
    /// ```
    /// # fn f(d: ratewall::http::RuleDecision<'_>) { let _ = d.denied(); }
    /// ```
    pub fn denied(&self) -> bool {
        self.denied
    }
}

/// A rejected request, as a custom responder sees it: every enforced rule
/// that matched, with its decision, and the `Retry-After` the layer sends.
///
/// ```
/// use bytes::Bytes;
/// use ratewall::http::Rejection;
///
/// fn plain(r: &Rejection<'_>) -> http::Response<Bytes> {
///     let names: Vec<&str> = r.denied().map(|d| d.name()).collect();
///     http::Response::builder()
///         .status(429)
///         .body(Bytes::from(format!("slow down ({}), retry in {} s", names.join(", "), r.retry_after_secs())))
///         .unwrap()
/// }
/// # let _ = plain;
/// ```
#[derive(Debug)]
pub struct Rejection<'a> {
    pub(super) rules: &'a [RuleDecision<'a>],
    pub(super) retry_after_secs: u64,
    pub(super) shed: bool,
}

impl<'a> Rejection<'a> {
    /// Every enforced rule that matched the request.
    ///
    /// ```
    /// # fn f(r: &ratewall::http::Rejection<'_>) { for d in r.rules() { let _ = d.name(); } }
    /// ```
    pub fn rules(&self) -> impl Iterator<Item = &RuleDecision<'a>> {
        self.rules.iter()
    }

    /// The rules that denied the request.
    ///
    /// ```
    /// # fn f(r: &ratewall::http::Rejection<'_>) { let _ = r.denied().count(); }
    /// ```
    pub fn denied(&self) -> impl Iterator<Item = &RuleDecision<'a>> {
        self.rules.iter().filter(|r| r.denied)
    }

    /// The `Retry-After` the layer sends (whole seconds, at least 1).
    ///
    /// ```
    /// # fn f(r: &ratewall::http::Rejection<'_>) { assert!(r.retry_after_secs() >= 1); }
    /// ```
    pub fn retry_after_secs(&self) -> u64 {
        self.retry_after_secs
    }

    /// Whether the request was shed by a concurrency rule shared by every
    /// client (the server over its capacity): the layer's own answer is
    /// then `503` with the `temporary-reduced-capacity` problem type, not
    /// `429`. A responder should answer likewise.
    ///
    /// ```
    /// # fn f(r: &ratewall::http::Rejection<'_>) {
    /// let status = if r.shed() { 503 } else { 429 };
    /// # let _ = status; }
    /// ```
    pub fn shed(&self) -> bool {
        self.shed
    }
}

/// The problem type of draft-ietf-httpapi-ratelimit-headers for a request
/// over quota.
pub(super) const QUOTA_EXCEEDED: &str =
    "https://iana.org/assignments/http-problem-types#quota-exceeded";

/// The default body of a 429: `application/problem+json` with the
/// `quota-exceeded` type and the `violated-policies` member.
pub(super) fn quota_exceeded(rejection: &Rejection<'_>) -> Response<Bytes> {
    let mut body = String::with_capacity(256);
    body.push_str("{\"type\":\"");
    body.push_str(QUOTA_EXCEEDED);
    body.push_str("\",\"title\":\"Request quota exceeded\",\"status\":429,\"detail\":\"");
    body.push_str("Too many requests; retry after ");
    body.push_str(&rejection.retry_after_secs.to_string());
    body.push_str(" s.\",\"violated-policies\":[");
    for (i, d) in rejection.denied().enumerate() {
        if i > 0 {
            body.push(',');
        }
        // Rule names are validated tokens: nothing to escape.
        body.push('"');
        body.push_str(d.name);
        body.push('"');
    }
    body.push_str("]}");
    problem(StatusCode::TOO_MANY_REQUESTS, body)
}

/// The problem type of draft-ietf-httpapi-ratelimit-headers for a request
/// the server sheds to protect itself.
pub(super) const TEMPORARY_REDUCED_CAPACITY: &str =
    "https://iana.org/assignments/http-problem-types#temporary-reduced-capacity";

/// The default body of a shed request's `503`: the
/// `temporary-reduced-capacity` type and the `violated-policies` member.
pub(super) fn reduced_capacity(rejection: &Rejection<'_>) -> Response<Bytes> {
    let names: Vec<String> = rejection
        .denied()
        .map(|d| format!("\"{}\"", d.name))
        .collect();
    // Rule names are validated tokens: nothing to escape.
    let body = format!(
        "{{\"type\":\"{TEMPORARY_REDUCED_CAPACITY}\",\"title\":\"Temporarily reduced capacity\",\
         \"status\":503,\"detail\":\"The server is at its concurrency limit; retry after {} s.\",\
         \"violated-policies\":[{}]}}",
        rejection.retry_after_secs,
        names.join(",")
    );
    problem(StatusCode::SERVICE_UNAVAILABLE, body)
}

/// A request that costs more than a rule can ever admit.
pub(super) fn cost_too_high(rule: &str, requested: u64, capacity: u64) -> Response<Bytes> {
    let body = format!(
        "{{\"title\":\"Request costs more than the quota\",\"status\":413,\
         \"detail\":\"This request costs {requested} units; policy {rule} admits at most {capacity} at once, so retrying will not help.\",\
         \"violated-policies\":[\"{rule}\"]}}"
    );
    problem(StatusCode::PAYLOAD_TOO_LARGE, body)
}

/// A request with no key for a rule that rejects such requests.
pub(super) fn missing_key(status: StatusCode, rule: &str, why: &str) -> Response<Bytes> {
    let body = format!(
        "{{\"title\":\"No rate-limit key\",\"status\":{},\"detail\":\"Rate-limit rule {rule}: {}.\"}}",
        status.as_u16(),
        why.replace(['"', '`'], "'")
    );
    problem(status, body)
}

/// Which limits of a request a store outage left unchecked.
#[cfg(feature = "redis")]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Unchecked {
    /// Rate rules only.
    Rates,
    /// Concurrency rules only: the requests in flight could not be counted.
    Concurrency,
    /// Both kinds.
    Both,
}

#[cfg(feature = "redis")]
impl Unchecked {
    /// What the outage left unchecked, for rules that are concurrency
    /// rules (`true`) or rate rules (`false`).
    pub(super) fn of(concurrency: impl IntoIterator<Item = bool>) -> Unchecked {
        let (mut conc, mut rate) = (false, false);
        for c in concurrency {
            conc |= c;
            rate |= !c;
        }
        match (rate, conc) {
            (false, true) => Unchecked::Concurrency,
            (true, true) => Unchecked::Both,
            _ => Unchecked::Rates,
        }
    }

    fn says(self) -> &'static str {
        match self {
            Unchecked::Rates => "the rate limits of this request could not be checked",
            Unchecked::Concurrency => {
                "the requests in flight could not be counted, so the concurrency limit of this request could not be checked"
            }
            Unchecked::Both => {
                "the rate and concurrency limits of this request could not be checked"
            }
        }
    }
}

/// A 503 when the Redis rules could not be decided and their limiters
/// fail closed.
#[cfg(feature = "redis")]
pub(super) fn store_unavailable(
    rules: &[&str],
    retry_after: u64,
    unchecked: Unchecked,
) -> Response<Bytes> {
    let mut list = String::new();
    for (i, r) in rules.iter().enumerate() {
        if i > 0 {
            list.push(',');
        }
        list.push('"');
        list.push_str(r);
        list.push('"');
    }
    // `about:blank`: the problem is the status itself (RFC 9457 4.2.1), so
    // the title is the status phrase; the detail says which store.
    let body = format!(
        "{{\"type\":\"about:blank\",\"title\":\"Service Unavailable\",\"status\":503,\
         \"detail\":\"The rate-limit store is unavailable: {}; retry after {}.\",\
         \"violated-policies\":[{list}]}}",
        unchecked.says(),
        plural(retry_after, "second")
    );
    let mut res = problem(StatusCode::SERVICE_UNAVAILABLE, body);
    res.headers_mut()
        .insert(http::header::RETRY_AFTER, HeaderValue::from(retry_after));
    res
}

fn problem(status: StatusCode, body: String) -> Response<Bytes> {
    let mut res = Response::new(Bytes::from(body));
    *res.status_mut() = status;
    res.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("application/problem+json"),
    );
    res
}

/// Whether the request is a gRPC call (`application/grpc`, `+proto`, ...).
pub(super) fn is_grpc(headers: &HeaderMap) -> bool {
    headers
        .get(CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"))
}

/// A gRPC trailers-only response with `RESOURCE_EXHAUSTED` (8).
pub(super) fn grpc_exhausted(message: &'static str) -> Response<Bytes> {
    grpc_status("8", message)
}

/// A gRPC trailers-only response with this status code.
pub(super) fn grpc_status(code: &'static str, message: &'static str) -> Response<Bytes> {
    let mut res = Response::new(Bytes::new());
    let h = res.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    h.insert("grpc-status", HeaderValue::from_static(code));
    h.insert("grpc-message", HeaderValue::from_static(message));
    res
}

/// A user's 429 builder ([`RateLimitBuilder::responder`](super::RateLimitBuilder::responder)).
pub(super) type Responder = Arc<dyn Fn(&Rejection<'_>) -> Response<Bytes> + Send + Sync>;

/// The 429 for a request the enforced rules denied; the 503 (`shed`) for
/// one a concurrency rule shared by every client shed.
#[cold]
#[inline(never)]
pub(super) fn reject<C: Clock>(
    rules_of: &[Compiled<C>],
    which: Headers,
    responder: Option<&Responder>,
    grpc: bool,
    shed: bool,
    entries: &[Entry],
) -> Response<Bytes> {
    let rules: SmallVec<[RuleDecision<'_>; INLINE_RULES]> = entries
        .iter()
        .filter(|e| !e.shadow)
        .filter_map(|e| {
            let d = e.decision?;
            Some(RuleDecision {
                name: &rules_of[usize::from(e.rule)].rule.name,
                decision: d,
                denied: !d.is_allowed(),
            })
        })
        .collect();
    let retry_after = rules
        .iter()
        .filter(|r| r.denied)
        .map(|r| r.decision.ratelimit_t_secs())
        .max()
        .unwrap_or(1);
    let rejection = Rejection {
        rules: &rules,
        retry_after_secs: retry_after,
        shed,
    };
    #[cfg(feature = "tracing")]
    tracing::debug!(
        target: "ratewall::http",
        denied = ?rejection.denied().map(|r| r.name()).collect::<Vec<_>>(),
        retry_after,
        "request over its rate limit"
    );
    let mut res = if grpc && shed {
        // UNAVAILABLE: the client may retry.
        grpc_status("14", "server over its concurrency limit")
    } else if grpc {
        grpc_exhausted("rate limit exceeded")
    } else if let Some(responder) = responder {
        responder(&rejection)
    } else if shed {
        reduced_capacity(&rejection)
    } else {
        quota_exceeded(&rejection)
    };
    let h = res.headers_mut();
    if !h.contains_key(RETRY_AFTER) {
        h.insert(RETRY_AFTER, HeaderValue::from(retry_after));
    }
    // Only the rules that denied, and only those whose numbers are shown:
    // every `t` sent is at most `Retry-After`.
    let denied_shown = || {
        entries.iter().filter_map(|e| {
            let r = &rules_of[usize::from(e.rule)];
            match e.decision {
                Some(d)
                    if !e.shadow && !d.is_allowed() && r.rule.visibility == Visibility::Shown =>
                {
                    Some((r, d))
                }
                _ => None,
            }
        })
    };
    match which {
        Headers::None => {}
        Headers::Legacy => {
            if let Some((_, d)) = denied_shown().next() {
                if !h.contains_key(X_LIMIT) {
                    legacy(h, [d.limit(), d.remaining(), retry_after]);
                }
            }
        }
        Headers::Draft(items) => {
            let (mut policy, mut limit) = (Buf::new(), Buf::new());
            let iter = denied_shown().take(match items {
                Items::ClosestToExhaustion => 1,
                _ => usize::MAX,
            });
            for (r, d) in iter {
                policy.item(r.policy_item.as_ref().map_or(&[][..], |v| v.as_bytes()));
                if r.is_concurrent() {
                    limit.ratelimit_item_untimed(&r.ratelimit_prefix, &d);
                } else {
                    limit.ratelimit_item(&r.rule.name, &d, &r.rule.policy);
                }
            }
            if !policy.is_empty() && !h.contains_key(RATELIMIT) {
                if let (Some(p), Some(l)) = (policy.value(), limit.value()) {
                    h.insert(RATELIMIT_POLICY, p);
                    h.insert(RATELIMIT, l);
                }
            }
        }
    }
    res
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ManualClock, Rate, TokenBucket};

    #[test]
    fn problem_bodies_are_json_with_the_violated_policies() {
        let b = TokenBucket::with_clock(Rate::per_second(1).burst(1), ManualClock::new()).unwrap();
        let ok = b.check();
        let denied = b.check();
        let rules = [
            RuleDecision {
                name: "ip",
                decision: ok,
                denied: false,
            },
            RuleDecision {
                name: "login",
                decision: denied,
                denied: true,
            },
        ];
        let res = quota_exceeded(&Rejection {
            rules: &rules,
            retry_after_secs: 1,
            shed: false,
        });
        assert_eq!(res.status(), 429);
        assert_eq!(res.headers()[CONTENT_TYPE], "application/problem+json");
        let v: serde_json::Value = serde_json::from_slice(res.body()).unwrap();
        assert_eq!(v["type"], QUOTA_EXCEEDED);
        assert_eq!(v["violated-policies"], serde_json::json!(["login"]));
        let v: serde_json::Value =
            serde_json::from_slice(cost_too_high("bulk", 20, 10).body()).unwrap();
        assert_eq!(v["violated-policies"], serde_json::json!(["bulk"]));
        let res = missing_key(StatusCode::UNAUTHORIZED, "key", "a \"quoted\" `reason`");
        let v: serde_json::Value = serde_json::from_slice(res.body()).unwrap();
        assert_eq!(v["status"], 401);
    }

    #[cfg(feature = "redis")]
    #[test]
    fn the_503_body_has_a_type_like_the_429() {
        let res = store_unavailable(&["ip", "key"], 7, Unchecked::Rates);
        assert_eq!(res.status(), 503);
        assert_eq!(res.headers()[http::header::RETRY_AFTER], "7");
        let v: serde_json::Value = serde_json::from_slice(res.body()).unwrap();
        assert_eq!(v["type"], "about:blank");
        assert_eq!(v["title"], "Service Unavailable");
        assert_eq!(v["status"], 503);
        assert_eq!(v["violated-policies"], serde_json::json!(["ip", "key"]));
        assert_eq!(
            v["detail"],
            "The rate-limit store is unavailable: the rate limits of this request could not be \
             checked; retry after 7 seconds."
        );
    }

    /// The detail says what the outage left unchecked (a concurrency
    /// rule's is not a rate limit) and agrees with `Retry-After` in number.
    #[cfg(feature = "redis")]
    #[test]
    fn the_503_detail_names_what_was_not_checked_and_its_plural() {
        let detail = |unchecked, retry| {
            let res = store_unavailable(&["jobs"], retry, unchecked);
            let v: serde_json::Value = serde_json::from_slice(res.body()).unwrap();
            v["detail"].as_str().unwrap().to_owned()
        };
        let one = detail(Unchecked::of([true]), 1);
        assert!(one.contains("concurrency limit"), "{one}");
        assert!(!one.contains("rate limits"), "{one}");
        assert!(one.ends_with("retry after 1 second."), "{one}");
        let both = detail(Unchecked::of([true, false]), 2);
        assert!(both.contains("the rate and concurrency limits"), "{both}");
        assert!(both.ends_with("retry after 2 seconds."), "{both}");
        assert_eq!(Unchecked::of([false, false]), Unchecked::Rates);
    }
}
