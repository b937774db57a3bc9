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

/// Allocations for one request to `path` under a path-prefix rule.
fn prefix_allocations(path: &str) -> u64 {
    let layer = RateLimitLayer::builder()
        .clock(ManualClock::new())
        .headers(Headers::None)
        .rule(
            Rule::per_ip("login", Policy::token_bucket(Rate::per_second(1000)))
                .on_path_prefix("/login")
                .ignore_path_case(),
        )
        .build()
        .unwrap();
    let mut svc = layer.layer(tower::service_fn(|_req: Request<()>| {
        std::future::ready(Ok::<_, Infallible>(Response::new(String::new())))
    }));
    let waker = Waker::from(Arc::new(Noop));
    let mut cx = Context::from_waker(&waker);
    let mut one = || {
        let mut req = Request::builder().uri(path).body(()).unwrap();
        req.extensions_mut()
            .insert(SocketAddr::from(([192, 0, 2, 1], 4000)));
        let counted = allocation_counter::measure(|| {
            assert!(svc.poll_ready(&mut cx).is_ready());
            let fut = pin!(svc.call(req));
            let Poll::Ready(Ok(r)) = fut.poll(&mut cx) else {
                panic!("not ready")
            };
            assert_eq!(r.status(), 200);
        });
        counted.count_total
    };
    let _ = one(); // the key's first request claims its slot
    one()
}

#[test]
fn a_path_prefix_allocates_only_for_a_path_that_is_not_normal() {
    // Already normal (matched or not, any case): matched in place.
    for path in ["/login", "/LOGIN/otp", "/items/1", "/"] {
        assert_eq!(prefix_allocations(path), 0, "{path}");
    }
    // Another spelling is normalized into a new string (the escapes
    // decoded, then the segments), for this request only.
    for path in ["//login", "/%6Cogin", "/a/../login"] {
        let n = prefix_allocations(path);
        assert!((1..=2).contains(&n), "{path}: {n}");
    }
}
