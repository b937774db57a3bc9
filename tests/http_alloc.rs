//! The layer allocates nothing per request with local limits: allocations
//! counted (per thread, by `allocation-counter`'s global allocator) around
//! `call` + poll of one request.

use http::{Request, Response};
use ratewall::http::{Headers, RateLimitLayer, Rule};
use ratewall::{ManualClock, Policy, Rate};
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use tower::{Layer, Service};

struct Noop;
impl Wake for Noop {
    fn wake(self: Arc<Self>) {}
}

fn request() -> Request<()> {
    let mut req = Request::builder()
        .uri("/")
        .header("x-api-key", "key-1")
        .body(())
        .unwrap();
    req.extensions_mut()
        .insert(SocketAddr::from(([192, 0, 2, 1], 4000)));
    req
}

/// Allocations made by the layer and the inner service for one request
/// (the request is built before counting starts).
fn allocations(headers: Headers) -> u64 {
    let clock = ManualClock::new();
    let layer = RateLimitLayer::builder()
        .clock(clock)
        .headers(headers)
        .rule(Rule::per_ip(
            "ip",
            Policy::token_bucket(Rate::per_second(1000)),
        ))
        .rule(Rule::per_header(
            "key",
            "x-api-key",
            Policy::token_bucket(Rate::per_second(1000)),
        ))
        .rule(Rule::global(
            "all",
            Policy::token_bucket(Rate::per_second(1000)),
        ))
        .build()
        .unwrap();
    let mut svc = layer.layer(tower::service_fn(|_req: Request<()>| {
        std::future::ready(Ok::<_, Infallible>(Response::new(String::new())))
    }));
    let waker = Waker::from(Arc::new(Noop));
    let mut cx = Context::from_waker(&waker);
    let mut one = || {
        let req = request();
        let mut res = None;
        let counted = allocation_counter::measure(|| {
            assert!(svc.poll_ready(&mut cx).is_ready());
            let fut = pin!(svc.call(req));
            let Poll::Ready(Ok(r)) = fut.poll(&mut cx) else {
                panic!("not ready")
            };
            res = Some(r);
        });
        assert_eq!(res.expect("a response").status(), 200);
        counted.count_total
    };
    let _ = one(); // the keys' first request claims their slots
    one()
}

#[test]
fn three_local_rules_allocate_nothing_without_headers() {
    assert_eq!(allocations(Headers::None), 0);
}

#[test]
fn with_draft_headers_only_http_allocates() {
    // Two header values (copied into `Bytes` by `http`) and the response's
    // `HeaderMap` growing from empty: nothing of the layer's own.
    let n = allocations(Headers::default());
    assert!((1..=4).contains(&n), "{n} allocations");
}
