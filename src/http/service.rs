//! The tower layer and service: [`RateLimitLayer`] (shared by every clone),
//! the [`RateLimitService`] it wraps an inner service in, and the
//! [`ResponseFuture`] that waits for the Redis rules (if any matched),
//! calls the inner service, and writes the headers and refunds into its
//! response.

use super::concurrent::Held;
#[cfg(feature = "redis")]
use super::engine::RemoteCheck;
use super::engine::{After, RequestHead, Shared, Verdict};
#[cfg(feature = "redis")]
use super::info::RateLimitInfo;
use super::response::ResponseBody;
use super::stats::RuleStats;
use crate::clock::Clock;
use crate::limiter::DefaultClock;
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use pin_project_lite::pin_project;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use tower_layer::Layer;
use tower_service::Service;

/// The rate-limiting layer. Cheap to clone: every clone shares the limits.
///
/// ```
/// use ratewall::http::{RateLimitLayer, Rule};
/// use ratewall::{Policy, Rate};
///
/// let layer = RateLimitLayer::builder()
///     .rule(Rule::per_ip("ip", Policy::token_bucket(Rate::per_minute(100))))
///     .build()?;
/// assert_eq!(layer.stats()[0].name(), "ip");
/// # Ok::<(), ratewall::http::HttpConfigError>(())
/// ```
pub struct RateLimitLayer<C: Clock = DefaultClock> {
    pub(super) shared: Arc<Shared<C>>,
}

impl<C: Clock> Clone for RateLimitLayer<C> {
    fn clone(&self) -> Self {
        RateLimitLayer {
            shared: self.shared.clone(),
        }
    }
}

impl<C: Clock> fmt::Debug for RateLimitLayer<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayer")
            .field("rules", &self.shared.rules.len())
            .field("client_ip", &self.shared.client_ip)
            .field("headers", &self.shared.headers)
            .finish()
    }
}

impl<C: Clock> RateLimitLayer<C> {
    /// Each rule's counters, in rule order.
    ///
    /// ```
    /// # use ratewall::http::{RateLimitLayer, Rule};
    /// # use ratewall::{Policy, Rate};
    /// let layer = RateLimitLayer::builder()
    ///     .rule(Rule::global("all", Policy::token_bucket(Rate::per_second(1))))
    ///     .build()?;
    /// assert_eq!(layer.stats()[0].allowed(), 0);
    /// # Ok::<(), ratewall::http::HttpConfigError>(())
    /// ```
    pub fn stats(&self) -> Vec<RuleStats> {
        super::compiled::stats(&self.shared.rules)
    }
}

impl<S, C: Clock> Layer<S> for RateLimitLayer<C> {
    type Service = RateLimitService<S, C>;

    fn layer(&self, inner: S) -> RateLimitService<S, C> {
        RateLimitService {
            inner,
            shared: self.shared.clone(),
        }
    }
}

/// The service made by [`RateLimitLayer`].
///
/// ```
/// use ratewall::http::{RateLimitLayer, RateLimitService, Rule};
/// use ratewall::{Policy, Rate};
/// use tower::ServiceBuilder;
///
/// let svc = ServiceBuilder::new()
///     .layer(RateLimitLayer::builder().rule(Rule::global("all", Policy::token_bucket(Rate::per_second(5)))).build()?)
///     .service_fn(|_req: http::Request<String>| async { Ok::<_, std::convert::Infallible>(http::Response::new(String::new())) });
/// # let _ = svc;
/// # Ok::<(), ratewall::http::HttpConfigError>(())
/// ```
pub struct RateLimitService<S, C: Clock = DefaultClock> {
    inner: S,
    shared: Arc<Shared<C>>,
}

impl<S: Clone, C: Clock> Clone for RateLimitService<S, C> {
    fn clone(&self) -> Self {
        RateLimitService {
            inner: self.inner.clone(),
            shared: self.shared.clone(),
        }
    }
}

impl<S: fmt::Debug, C: Clock> fmt::Debug for RateLimitService<S, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitService")
            .field("inner", &self.inner)
            .field("rules", &self.shared.rules.len())
            .finish()
    }
}

/// The inner service must be `Clone + Send + 'static` (axum routers, tonic
/// services and `service_fn` closures are): a request that matches a Redis
/// rule is passed on after an await, so the readied service moves into the
/// response future and a clone stays. The bounds hold with every feature
/// set, so turning on `redis` never breaks a build that compiled without it.
impl<S, C, ReqB, ResB> Service<Request<ReqB>> for RateLimitService<S, C>
where
    S: Service<Request<ReqB>, Response = Response<ResB>> + Clone + Send + 'static,
    C: Clock + 'static,
    ReqB: Send + 'static,
{
    type Response = Response<ResponseBody<ResB>>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<ReqB>) -> ResponseFuture<S::Future> {
        // The decisions extension, when on, is written here by the check
        // (not returned with the verdict: a large value moved on every request).
        let mut insert = None;
        let verdict = self.shared.check(
            &RequestHead {
                method: req.method(),
                uri: req.uri(),
                headers: req.headers(),
                extensions: req.extensions(),
            },
            &mut insert,
        );
        match verdict {
            // Apart from the other case: with nothing to do after the
            // response, no `After` is moved (it is large) on its way into the
            // future.
            Verdict::Pass(None) if insert.is_none() => ResponseFuture {
                state: State::Plain {
                    fut: self.inner.call(req),
                },
            },
            Verdict::Pass(after) => {
                if let Some(info) = insert {
                    req.extensions_mut().insert(info);
                }
                ResponseFuture {
                    state: State::after(self.inner.call(req), after),
                }
            }
            Verdict::Reject(res) => ResponseFuture {
                state: State::Ready { res: Some(res) },
            },
            #[cfg(feature = "redis")]
            Verdict::Remote(check) => {
                let clone = self.inner.clone();
                let mut inner = std::mem::replace(&mut self.inner, clone);
                ResponseFuture {
                    state: State::Remote {
                        check,
                        call: Some(Box::new(move |info| {
                            if let Some(info) = info {
                                req.extensions_mut().insert(info);
                            }
                            inner.call(req)
                        })),
                    },
                }
            }
        }
    }
}

/// Passes the request on once the Redis rules admitted it.
#[cfg(feature = "redis")]
type PendingCall<F> = Box<dyn FnOnce(Option<RateLimitInfo>) -> F + Send>;

pin_project! {
    /// The response future of [`RateLimitService`].
    pub struct ResponseFuture<F> {
        #[pin]
        state: State<F>,
    }
}

pin_project! {
    #[project = StateProj]
    #[allow(dead_code)] // `Remote` is built only with the `redis` feature.
    enum State<F> {
        // Nothing to do after the response but wrap its body: no `After`
        // written into the future, moved with it or dropped with it.
        Plain { #[pin] fut: F },
        Inner { #[pin] fut: F, after: Option<After> },
        Ready { res: Option<Response<Bytes>> },
        Remote { check: RemoteSlot, call: Option<CallSlot<F>> },
    }
}

impl<F> State<F> {
    /// The inner service's future, with what its response gets if anything.
    #[inline]
    fn after(fut: F, after: Option<After>) -> State<F> {
        match after {
            None => State::Plain { fut },
            after => State::Inner { fut, after },
        }
    }
}

impl<F> fmt::Debug for ResponseFuture<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self.state {
            State::Plain { .. } | State::Inner { .. } => "ResponseFuture::Inner",
            State::Ready { .. } => "ResponseFuture::Ready",
            State::Remote { .. } => "ResponseFuture::Remote",
        })
    }
}

impl<F, B, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<Response<B>, E>>,
{
    type Output = Result<Response<ResponseBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut state = self.project().state;
        loop {
            let next = match state.as_mut().project() {
                StateProj::Remote { check, call } => remote_done(check, call, cx),
                other => return poll_done(other, cx),
            };
            state.set(ready!(next));
        }
    }
}

/// The remote check finished: pass the request on, or answer.
#[cfg(feature = "redis")]
fn remote_done<F>(
    check: &mut RemoteSlot,
    call: &mut Option<CallSlot<F>>,
    cx: &mut Context<'_>,
) -> Poll<State<F>> {
    let (verdict, info) = ready!(check.as_mut().poll(cx));
    Poll::Ready(match (verdict, call.take()) {
        (Verdict::Pass(after), Some(call)) => State::after(call(info), after),
        (Verdict::Reject(res), _) => State::Ready { res: Some(res) },
        // Polled after completion, or a nested remote verdict (never
        // returned by the remote check): an empty 500.
        _ => State::Ready { res: None },
    })
}

#[cfg(not(feature = "redis"))]
fn remote_done<F>(
    check: &mut RemoteSlot,
    _: &mut Option<CallSlot<F>>,
    _: &mut Context<'_>,
) -> Poll<State<F>> {
    match *check {}
}

#[cfg(feature = "redis")]
type RemoteSlot = RemoteCheck;
#[cfg(feature = "redis")]
type CallSlot<F> = PendingCall<F>;
#[cfg(not(feature = "redis"))]
type RemoteSlot = std::convert::Infallible;
#[cfg(not(feature = "redis"))]
type CallSlot<F> = std::marker::PhantomData<F>;

/// Writes an admitted request's headers into its response, gives back the
/// units of count-only-failures rules when the response succeeded, and
/// returns the permits of concurrency rules, for the body to hold. (The
/// response is written in place: moving it in and out cost the rate-only
/// path about 40 instructions per request.)
fn apply_after<B>(res: &mut Response<B>, after: &mut Option<After>) -> Option<Held> {
    let after = after.take()?;
    after.headers.write(res.headers_mut());
    if let Some(later) = after.later {
        let s = res.status();
        if s.is_success() || s.is_redirection() {
            for (rule, key, cost) in later.list {
                later.shared.refund(rule, key, cost);
            }
            #[cfg(feature = "redis")]
            if !later.remote.is_empty() {
                later.shared.refund_remote(later.remote);
            }
        }
        if let Some(mut held) = later.held {
            // Nothing left for the body to hold: the body goes unwrapped.
            return held.responded(s).then_some(held);
        }
    }
    None
}

fn poll_done<F, B, E>(
    state: StateProj<'_, F>,
    cx: &mut Context<'_>,
) -> Poll<Result<Response<ResponseBody<B>>, E>>
where
    F: Future<Output = Result<Response<B>, E>>,
{
    {
        match state {
            StateProj::Plain { fut } => {
                let res = ready!(fut.poll(cx))?;
                Poll::Ready(Ok(res.map(ResponseBody::new)))
            }
            StateProj::Inner { fut, after } => {
                // An error leaves the permits in `after`: dropped with this
                // future, as a request that got no response.
                let mut res = ready!(fut.poll(cx))?;
                // Tested before it is taken: `take` would read the whole
                // (large) value even when there is none.
                if after.is_some() {
                    if let Some(held) = apply_after(&mut res, after) {
                        return Poll::Ready(Ok(res.map(|b| ResponseBody::holding(b, held))));
                    }
                }
                Poll::Ready(Ok(res.map(ResponseBody::new)))
            }
            StateProj::Ready { res } => {
                // Polled again after completion: an empty 500, not a panic.
                let res = res.take().unwrap_or_else(|| {
                    let mut r = Response::new(Bytes::new());
                    *r.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
                    r
                });
                Poll::Ready(Ok(res.map(ResponseBody::full)))
            }
            // Never: `poll` handles this state.
            StateProj::Remote { .. } => {
                let mut r = Response::new(ResponseBody::full(Bytes::new()));
                *r.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
                Poll::Ready(Ok(r))
            }
        }
    }
}
