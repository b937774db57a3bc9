//! An HTTP test client's view of a response: status, headers and body,
//! with every emitted rate-limit field checked; and a real axum server with
//! a real HTTP/1.1 client for the end-to-end tests.
#![allow(dead_code)] // each test file uses a part

use axum::body::Bytes;
use axum::Router;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper_util::rt::TokioIo;
use std::net::SocketAddr;
use tokio::net::{TcpListener, TcpStream};

/// A response with its status, headers and body, after every emitted
/// rate-limit field was checked.
#[derive(Debug)]
pub struct Got {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Got {
    /// `RateLimit` items as (name, r, t).
    pub fn ratelimit(&self) -> Vec<(String, i64, i64)> {
        parse_items(&self.headers, "ratelimit", ["r", "t"])
            .into_iter()
            .map(|(n, v)| (n, v[0], v[1]))
            .collect()
    }
    /// `RateLimit-Policy` items as (name, q, w).
    pub fn policy(&self) -> Vec<(String, i64, i64)> {
        parse_items(&self.headers, "ratelimit-policy", ["q", "w"])
            .into_iter()
            .map(|(n, v)| (n, v[0], v[1]))
            .collect()
    }
    pub fn remaining(&self, rule: &str) -> Option<i64> {
        self.ratelimit()
            .into_iter()
            .find(|(n, ..)| n == rule)
            .map(|(_, r, _)| r)
    }
    pub fn retry_after(&self) -> Option<u64> {
        self.headers
            .get("retry-after")
            .map(|v| v.to_str().unwrap().parse().unwrap())
    }
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap()
    }
    pub fn text(&self) -> String {
        String::from_utf8(self.body.to_vec()).unwrap()
    }
    /// Reads a whole response and checks its fields.
    pub async fn read<B>(res: Response<B>) -> Got
    where
        B: http_body::Body,
        B::Error: std::fmt::Debug,
    {
        let (parts, body) = res.into_parts();
        let got = Got {
            status: parts.status,
            headers: parts.headers,
            body: body.collect().await.unwrap().to_bytes(),
        };
        check_fields(&got);
        got
    }
}

/// Parses a field as an RFC 9651 list of string items, each with the two
/// integer parameters (and no others); panics if it does not parse.
fn parse_items(h: &HeaderMap, field: &str, params: [&str; 2]) -> Vec<(String, [i64; 2])> {
    let mut out = Vec::new();
    for v in h.get_all(field) {
        let list: sfv::List = sfv::Parser::new(v.as_bytes())
            .parse_list()
            .unwrap_or_else(|e| panic!("{field}: {v:?} is not a structured-field list: {e}"));
        for entry in list {
            let sfv::ListEntry::Item(item) = entry else {
                panic!("{field}: inner list in {v:?}");
            };
            let name = item
                .bare_item
                .as_string()
                .unwrap_or_else(|| panic!("{field}: item is not a string in {v:?}"))
                .as_str()
                .to_owned();
            let mut vals = [-1i64; 2];
            for (k, p) in &item.params {
                let i = params
                    .iter()
                    .position(|want| *want == k.as_str())
                    .unwrap_or_else(|| panic!("{field}: unexpected parameter {k:?} in {v:?}"));
                vals[i] = i64::from(p.as_integer().expect("integer parameter"));
            }
            assert!(
                vals.iter().all(|&x| x >= 0),
                "{field}: missing parameter in {v:?}"
            );
            out.push((name, vals));
        }
    }
    out
}

/// Checks what every response must satisfy, whatever the test.
pub fn check_fields(got: &Got) {
    let items = got.ratelimit();
    let _ = got.policy();
    if got.status == StatusCode::TOO_MANY_REQUESTS {
        let retry = got.retry_after().expect("a 429 carries Retry-After");
        assert!(retry >= 1, "Retry-After is never 0");
        for (name, _, t) in &items {
            assert!(
                *t as u64 <= retry,
                "Retry-After {retry} is earlier than {name}'s t={t}"
            );
        }
    }
}

/// Serves `app` on `addr` (port 0) until the returned sender is dropped.
pub async fn serve(
    addr: &str,
    app: Router,
) -> (
    SocketAddr,
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<()>,
) {
    let listener = TcpListener::bind(addr)
        .await
        .unwrap_or_else(|e| panic!("cannot bind {addr}: {e}"));
    let local = listener.local_addr().unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .with_graceful_shutdown(async {
            let _ = rx.await;
        })
        .await
        .unwrap();
    });
    (local, tx, server)
}

/// One request over a fresh HTTP/1.1 connection.
pub async fn fetch(addr: SocketAddr, method: &str, path: &str, headers: &[(&str, &str)]) -> Got {
    let bytes: Vec<(&str, &[u8])> = headers.iter().map(|(k, v)| (*k, v.as_bytes())).collect();
    fetch_bytes(addr, method, path, &bytes).await
}

/// One request over a fresh HTTP/1.1 connection, with header values as
/// bytes (obs-text and all).
pub async fn fetch_bytes(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &[u8])],
) -> Got {
    Got::read(send(addr, method, path, headers).await).await
}

/// One request over a fresh HTTP/1.1 connection: the response, its body
/// not read yet (nor its fields checked).
pub async fn send(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &[u8])],
) -> Response<hyper::body::Incoming> {
    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    let mut req = Request::builder()
        .method(method)
        .uri(path)
        .header("host", addr.to_string());
    for (k, v) in headers {
        req = req.header(*k, http::HeaderValue::from_bytes(v).unwrap());
    }
    sender
        .send_request(req.body(http_body_util::Empty::<Bytes>::new()).unwrap())
        .await
        .unwrap()
}

/// One request through `app` in process (`oneshot`), from `peer` (the
/// connection's address), with every emitted rate-limit field checked.
pub async fn call(
    app: &Router,
    method: &str,
    path: &str,
    peer: &str,
    headers: &[(&str, &str)],
) -> Got {
    use tower::ServiceExt;
    let mut req = Request::builder().method(method).uri(path);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let mut req = req.body(axum::body::Body::empty()).unwrap();
    let ip: std::net::IpAddr = peer.parse().unwrap();
    req.extensions_mut()
        .insert(axum::extract::ConnectInfo(SocketAddr::new(ip, 40_000)));
    let got = Got::read(app.clone().oneshot(req).await.unwrap()).await;
    check_fields(&got);
    got
}

/// How many `GET`s of `path` in a row `app` admits before the first 429.
pub async fn admitted(app: &Router, path: &str, peer: &str, headers: &[(&str, &str)]) -> u64 {
    let mut n = 0;
    while call(app, "GET", path, peer, headers).await.status == StatusCode::OK {
        n += 1;
        assert!(n <= 10_000, "never denied");
    }
    n
}

/// For each value of header `name` in `values`, `n` `GET /` over fresh
/// connections to `addr`: how many were admitted, and the quotas (`q` of
/// the first `RateLimit-Policy` item) the admitted ones advertised.
pub async fn admitted_per_value(
    addr: SocketAddr,
    name: &str,
    values: &[&str],
    n: usize,
) -> Vec<(u64, Vec<i64>)> {
    let mut out = Vec::new();
    for value in values {
        let (mut admitted, mut quotas) = (0, Vec::new());
        for _ in 0..n {
            let got = fetch(addr, "GET", "/", &[(name, value)]).await;
            check_fields(&got);
            if got.status == StatusCode::OK {
                admitted += 1;
                let q = got.policy()[0].1;
                if !quotas.contains(&q) {
                    quotas.push(q);
                }
            }
        }
        out.push((admitted, quotas));
    }
    out
}

/// A response as the client saw it: status, headers, body, with no field
/// checked (a concurrency rule's `RateLimit` item has no `t`).
pub struct Seen {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Seen {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(|v| v.to_str().unwrap())
    }
    /// `r` of the `RateLimit` item of `rule`, whatever its other parameters.
    pub fn r(&self, rule: &str) -> Option<i64> {
        let v = self.header("ratelimit")?;
        let list: sfv::List = sfv::Parser::new(v.as_bytes()).parse_list().unwrap();
        list.into_iter().find_map(|e| {
            let sfv::ListEntry::Item(item) = e else {
                return None;
            };
            (item.bare_item.as_string()?.as_str() == rule).then(|| {
                let r = item.params.iter().find(|(k, _)| k.as_str() == "r").unwrap();
                i64::from(r.1.as_integer().unwrap())
            })
        })
    }
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap()
    }
    pub fn retry_after(&self) -> Option<u64> {
        self.header("retry-after")?.parse().ok()
    }
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// A connection to `addr` and the response head of `GET path`, its body
/// not read.
pub async fn head(
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
) -> Response<hyper::body::Incoming> {
    let bytes: Vec<(&str, &[u8])> = headers.iter().map(|(k, v)| (*k, v.as_bytes())).collect();
    send(addr, "GET", path, &bytes).await
}

/// `GET path` to the end of its body.
pub async fn get_seen(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> Seen {
    let (parts, body) = head(addr, path, headers).await.into_parts();
    Seen {
        status: parts.status,
        headers: parts.headers,
        body: body.collect().await.unwrap().to_bytes(),
    }
}

/// A body that sends one chunk, then never ends; it counts its drops.
pub struct Stalling {
    pub sent: bool,
    pub dropped: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl http_body::Body for Stalling {
    type Data = Bytes;
    type Error = std::convert::Infallible;
    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        if self.sent {
            std::task::Poll::Pending
        } else {
            self.sent = true;
            std::task::Poll::Ready(Some(Ok(http_body::Frame::data(Bytes::from_static(
                b"first chunk",
            )))))
        }
    }
}

impl Drop for Stalling {
    fn drop(&mut self) {
        self.dropped
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

impl Stalling {
    /// `GET` answering a `Stalling` body, each counting its drop in `dropped`.
    pub fn route(
        dropped: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    ) -> axum::routing::MethodRouter {
        axum::routing::get(move || {
            let dropped = dropped.clone();
            async move {
                axum::body::Body::new(Stalling {
                    sent: false,
                    dropped,
                })
            }
        })
    }
}

/// Requests in a handler now, and the most seen at once.
#[derive(Default)]
pub struct Gauge {
    pub now: std::sync::atomic::AtomicUsize,
    pub most: std::sync::atomic::AtomicUsize,
}

impl Gauge {
    pub fn enter(&self) {
        use std::sync::atomic::Ordering::SeqCst;
        let n = self.now.fetch_add(1, SeqCst) + 1;
        self.most.fetch_max(n, SeqCst);
    }
    pub fn leave(&self) {
        self.now.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
    /// `GET` answering "ok" after `delay`, counted in the gauge meanwhile.
    pub fn slow_route(
        self: &std::sync::Arc<Self>,
        delay: std::time::Duration,
    ) -> axum::routing::MethodRouter {
        let g = self.clone();
        axum::routing::get(move || {
            let g = g.clone();
            async move {
                g.enter();
                tokio::time::sleep(delay).await;
                g.leave();
                "ok"
            }
        })
    }
}

/// `GET` that waits until the test lets it go (one permit of `gate` each).
pub fn held_route(gate: std::sync::Arc<tokio::sync::Semaphore>) -> axum::routing::MethodRouter {
    axum::routing::get(move || {
        let gate = gate.clone();
        async move {
            gate.acquire().await.unwrap().forget();
            "held"
        }
    })
}
