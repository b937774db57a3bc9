//! The HTTP layer's overhead per request, in process: `ratewall::http` with
//! 1 and 3 rules against `tower_governor` with 1, on one inner service that
//! answers at once.
//!
//! `cargo bench --bench http --features axum` (one round), or
//! `sh benches/http.sh` (alternating rounds and the median ratios).
//!
//! Every request is built the same way for every contender (a `GET /` with
//! an `x-api-key` header and the peer address in axum's `ConnectInfo`),
//! then `poll_ready` + `call` + one poll of the future (every contender's
//! future is ready at once). `bare` is the inner service alone: subtract it
//! to get a layer's overhead. Every quota is so large that each request is
//! admitted (the path production traffic takes), from one client address.
//!
//! - `tower_governor 1`: `PeerIpKeyExtractor`, no headers (its default);
//! - `tower_governor 1 headers`: the same with `use_headers()` (`x-ratelimit-*`);
//! - `ratewall 1`/`ratewall 3`: per IP / per IP + per API key + global, with
//!   the default draft `RateLimit` and `RateLimit-Policy` headers;
//! - `ratewall 1 no headers`/`ratewall 3 no headers`: the same rules with
//!   `Headers::None` (compare with `tower_governor 1`, which sends none);
//! - `..., 1M clients`: `tower_governor 1`, `ratewall 1 no headers` and
//!   `ratewall 3 no headers` on requests from 1,000,000 client addresses and
//!   API keys in turn (a splitmix64 order), ratewall's tables built for 1M
//!   keys: each rule's lookup misses the caches, as with many real
//!   clients.

use axum::body::Body;
use axum::extract::ConnectInfo;
use criterion::{criterion_group, Criterion};
use http::{Request, Response};
use ratewall::http::{Headers, RateLimitLayer, Rule};
use ratewall::{Policy, Rate};
use std::convert::Infallible;
use std::future::Future;
use std::hint::black_box;
use std::net::SocketAddr;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use tower::{Layer, Service};
use tower_governor::governor::GovernorConfigBuilder;
use tower_governor::key_extractor::PeerIpKeyExtractor;
use tower_governor::GovernorLayer;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn request() -> Request<Body> {
    client_request(0xc000_0201, "key-0123456789abcdef")
}

/// A request from client `ip` (its low 32 bits, an IPv4 address) with API
/// key `key`.
fn client_request(ip: u64, key: &str) -> Request<Body> {
    let mut req = Request::builder()
        .uri("/")
        .header("x-api-key", key)
        .body(Body::empty())
        .unwrap();
    // axum's connect info: what both layers read under axum.
    let ip = (ip as u32).to_be_bytes();
    req.extensions_mut()
        .insert(ConnectInfo(SocketAddr::from((ip, 40_000))));
    req
}

/// Clients of the `1M clients` contenders.
const CLIENTS: u64 = 1_000_000;

/// The `c`-th request of the `1M clients` contenders: client and API key
/// `i` of 1M, drawn in a splitmix64 order (the same for every contender).
fn many_clients_request(c: u64) -> Request<Body> {
    let mut z = c.wrapping_add(1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    let i = ((u128::from(z ^ (z >> 31)) * u128::from(CLIENTS)) >> 64) as u64;
    // 10.0.0.0/8 holds them all; the key's text is built per request, as a
    // server reads it from the request.
    client_request(0x0a00_0000 | i, &format!("key-{i:016x}"))
}

#[derive(Clone)]
struct Inner;

impl Service<Request<Body>> for Inner {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = std::future::Ready<Result<Response<Body>, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        drop(black_box(req));
        std::future::ready(Ok(Response::new(Body::empty())))
    }
}

/// One request through `svc`, to completion; returns the status.
fn once<S>(svc: &mut S) -> u16
where
    S: Service<Request<Body>>,
    S::Response: Status,
    S::Error: std::fmt::Debug,
{
    once_with(svc, request)
}

/// One request `make` builds through `svc`, to completion; the status.
fn once_with<S>(svc: &mut S, make: impl FnOnce() -> Request<Body>) -> u16
where
    S: Service<Request<Body>>,
    S::Response: Status,
    S::Error: std::fmt::Debug,
{
    let waker = Waker::from(Arc::new(Noop));
    let mut cx = Context::from_waker(&waker);
    match svc.poll_ready(&mut cx) {
        Poll::Ready(Ok(())) => {}
        _ => panic!("not ready"),
    }
    let fut = pin!(svc.call(make()));
    match fut.poll(&mut cx) {
        Poll::Ready(Ok(res)) => res.status_code(),
        _ => panic!("not ready"),
    }
}

/// A waker for futures that are ready at once.
struct Noop;

impl Wake for Noop {
    fn wake(self: Arc<Self>) {}
}

trait Status {
    fn status_code(&self) -> u16;
}

impl<B> Status for Response<B> {
    fn status_code(&self) -> u16 {
        self.status().as_u16()
    }
}

fn unlimited() -> Policy {
    Policy::token_bucket(Rate::per_second(1_000_000_000).burst(1_000_000_000))
}

type OneRequest = Box<dyn FnMut() -> u16>;

/// Every contender, as a closure that sends one request and returns the status.
fn contenders() -> Vec<(&'static str, OneRequest)> {
    let mut out: Vec<(&'static str, OneRequest)> = Vec::new();
    let mut bare = Inner;
    out.push(("bare", Box::new(move || once(&mut bare))));

    let gov = GovernorConfigBuilder::default()
        .per_nanosecond(1)
        .burst_size(u32::MAX)
        .key_extractor(PeerIpKeyExtractor)
        .finish()
        .unwrap();
    let mut tg = GovernorLayer::new(gov).layer(Inner);
    out.push(("tower_governor 1", Box::new(move || once(&mut tg))));

    let gov_h = GovernorConfigBuilder::default()
        .per_nanosecond(1)
        .burst_size(u32::MAX)
        .key_extractor(PeerIpKeyExtractor)
        .use_headers()
        .finish()
        .unwrap();
    let mut tgh = GovernorLayer::new(gov_h).layer(Inner);
    out.push(("tower_governor 1 headers", Box::new(move || once(&mut tgh))));

    let one = RateLimitLayer::builder()
        .rule(Rule::per_ip("ip", unlimited()))
        .build()
        .unwrap();
    let mut rw1 = one.layer(Inner);
    out.push(("ratewall 1", Box::new(move || once(&mut rw1))));
    let one_bare = RateLimitLayer::builder()
        .headers(Headers::None)
        .rule(Rule::per_ip("ip", unlimited()))
        .build()
        .unwrap();
    let mut rw1n = one_bare.layer(Inner);
    out.push(("ratewall 1 no headers", Box::new(move || once(&mut rw1n))));

    let three = |headers: Headers| {
        RateLimitLayer::builder()
            .headers(headers)
            .rule(Rule::per_ip("ip", unlimited()))
            .rule(Rule::per_header("key", "x-api-key", unlimited()))
            .rule(Rule::global("all", unlimited()))
            .build()
            .unwrap()
    };
    let mut rw3 = three(Headers::default()).layer(Inner);
    out.push(("ratewall 3", Box::new(move || once(&mut rw3))));
    let mut rw3n = three(Headers::None).layer(Inner);
    out.push(("ratewall 3 no headers", Box::new(move || once(&mut rw3n))));

    // The same, on requests from 1M clients (tables built for them).
    let tgm = GovernorLayer::new(
        GovernorConfigBuilder::default()
            .per_nanosecond(1)
            .burst_size(u32::MAX)
            .key_extractor(PeerIpKeyExtractor)
            .finish()
            .unwrap(),
    )
    .layer(Inner);
    out.push(many_clients("tower_governor 1, 1M clients", tgm));
    let n = CLIENTS as usize;
    let rw1m = RateLimitLayer::builder()
        .headers(Headers::None)
        .rule(Rule::per_ip("ip", unlimited()).max_keys(n))
        .build()
        .unwrap()
        .layer(Inner);
    out.push(many_clients("ratewall 1 no headers, 1M clients", rw1m));
    let rw3m = RateLimitLayer::builder()
        .headers(Headers::None)
        .rule(Rule::per_ip("ip", unlimited()).max_keys(n))
        .rule(Rule::per_header("key", "x-api-key", unlimited()).max_keys(n))
        .rule(Rule::global("all", unlimited()))
        .build()
        .unwrap()
        .layer(Inner);
    out.push(many_clients("ratewall 3 no headers, 1M clients", rw3m));
    out
}

/// A contender sending `svc` the requests of 1M clients in turn.
fn many_clients<S>(name: &'static str, mut svc: S) -> (&'static str, OneRequest)
where
    S: Service<Request<Body>> + 'static,
    S::Response: Status,
    S::Error: std::fmt::Debug,
{
    let mut c = 0;
    (
        name,
        Box::new(move || {
            c += 1;
            once_with(&mut svc, || many_clients_request(c))
        }),
    )
}

fn overhead(c: &mut Criterion) {
    let mut g = c.benchmark_group("http layer");
    for (name, mut f) in contenders() {
        g.bench_function(name, |b| b.iter(|| assert_eq!(f(), 200)));
    }
    g.finish();
}

criterion_group!(benches, overhead);

/// The requests of `--ops`, in a function of their own: `benches/http.sh`
/// counts the instructions inside it only (`--toggle-collect`), so the set-up
/// (building the layers, calibrating the TSC clock, which takes a varying
/// number of instructions) stays out of the figures.
#[inline(never)]
fn run_ops(f: &mut OneRequest, n: u64) {
    for _ in 0..n {
        assert_eq!(f(), 200);
    }
}

/// `--ops NAME N`: N requests through one contender and nothing else, for
/// instruction counts under callgrind (`sh benches/http.sh callgrind`).
fn main() {
    let args: Vec<String> = std::env::args().collect();
    // With the `metrics` feature, the layers count into a real recorder
    // (metrics-util's debugging one keeps an atomic per counter, as
    // exporters do), so the counts include the facade's increments.
    #[cfg(feature = "metrics")]
    metrics_util::debugging::DebuggingRecorder::new()
        .install()
        .unwrap();
    if let Some(i) = args.iter().position(|a| a == "--ops") {
        let (name, n) = (&args[i + 1], args[i + 2].parse::<u64>().unwrap());
        let (_, mut f) = contenders()
            .into_iter()
            .find(|(c, _)| c == name)
            .unwrap_or_else(|| panic!("unknown contender {name}"));
        run_ops(&mut f, n);
        return;
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
