//! Hardening: a client spells a limited path another way (`//login`,
//! `/%6cogin`, `/LOGIN`) that a normalizing router still sends to the
//! login handler; and slow readers hold a global concurrency rule's
//! permits while their bodies stall, shedding everyone else.

use crate::support::http_client::{head, held_route, serve, Stalling};
use axum::body::Body;
use axum::routing::get;
use axum::Router;
use http::{Request, StatusCode};
use ratewall::http::{Key, LayerConfig, PermitRelease, RateLimitLayer, Rule};
use ratewall::{Policy, Rate};
use std::net::SocketAddr;
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The spellings of `/login` a client may send.
const SPELLINGS: [&str; 6] = [
    "/LOGIN",
    "//login",
    "/./login",
    "/%6cogin",
    "/login/../login",
    "/static/%2e%2e/Login",
];

/// `GET path` written as is on a fresh connection (no client library
/// rewrites the target): the status, and the response as text.
async fn raw_get(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let req = format!("GET {path} HTTP/1.1\r\nhost: test\r\nconnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut text = String::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_string(&mut text))
        .await
        .expect("the server answers")
        .unwrap();
    let status = text[9..12].parse().unwrap();
    (status, text.to_ascii_lowercase())
}

/// What a normalizing router does before routing (written apart from the
/// library's: every escape decoded, letters lowered, `//`, `.` and `..`
/// resolved).
fn normalizing(mut req: Request<Body>) -> Request<Body> {
    let raw = req.uri().path().as_bytes();
    let mut bytes = Vec::new();
    let mut i = 0;
    while i < raw.len() {
        let hex = raw
            .get(i + 1..i + 3)
            .and_then(|h| u8::from_str_radix(std::str::from_utf8(h).ok()?, 16).ok());
        match (raw[i], hex) {
            (b'%', Some(v)) => {
                bytes.push(v);
                i += 3;
            }
            (c, _) => {
                bytes.push(c);
                i += 1;
            }
        }
    }
    let text = String::from_utf8_lossy(&bytes).to_lowercase();
    let mut segs: Vec<&str> = Vec::new();
    for seg in text.split('/') {
        match seg {
            "" | "." => {}
            ".." => {
                segs.pop();
            }
            s => segs.push(s),
        }
    }
    *req.uri_mut() = format!("/{}", segs.join("/")).parse().unwrap();
    req
}

/// The login route behind `layer`, with (or without) a normalizing step
/// between the layer and the router.
fn login_app(layer: RateLimitLayer, normalize: bool) -> Router {
    let routes = Router::new()
        .route("/login", get(|| async { "login handler" }))
        .route("/", get(|| async { "home" }));
    if !normalize {
        return routes.layer(layer);
    }
    let svc = tower::ServiceBuilder::new()
        .layer(layer)
        .map_request(normalizing)
        .service(routes);
    Router::new().fallback_service(svc)
}

/// Sends each spelling `rounds` times: how many reached the login handler,
/// and how many of those were limited by the `login` rule (its
/// `RateLimit-Policy` item on the answer, or a 429).
async fn spelled(addr: SocketAddr, rounds: usize) -> (usize, usize, usize) {
    let (mut handled, mut limited, mut refused) = (0, 0, 0);
    for _ in 0..rounds {
        for path in SPELLINGS {
            let (status, text) = raw_get(addr, path).await;
            if status == 429 {
                refused += 1;
            } else if text.contains("login handler") {
                handled += 1;
                if text.contains("ratelimit-policy: \"login\"") {
                    limited += 1;
                }
            }
        }
    }
    (handled, limited, refused)
}

fn login_rule() -> Rule {
    Rule::per_ip("login", Policy::token_bucket(Rate::per_hour(4).burst(4)))
        .on_path_prefix("/login")
        .ignore_path_case()
}

#[tokio::test]
async fn every_spelling_a_normalizing_router_sends_to_login_is_limited() {
    let in_rust = RateLimitLayer::builder()
        .rule(login_rule())
        .build()
        .unwrap();
    let config: LayerConfig = toml::from_str(
        "[[rules]]\nname = \"login\"\nkey = \"ip\"\npolicy = \"4/hour burst 4\"\n\
         path_prefix = \"/login\"\nignore_path_case = true\n",
    )
    .unwrap();
    let from_file = config.to_builder().unwrap().build().unwrap();
    for layer in [in_rust, from_file] {
        let (addr, stop, server) = serve("127.0.0.1:0", login_app(layer, true)).await;
        // Every spelling reaches the handler, under the rule, until the
        // client's 4 attempts are spent: then each is refused.
        let (handled, limited, refused) = spelled(addr, 2).await;
        assert_eq!((handled, limited), (4, 4));
        assert_eq!(refused, 2 * SPELLINGS.len() - 4);
        // Other paths are not under the rule.
        assert_eq!(raw_get(addr, "/").await.0, 200);
        drop(stop);
        server.await.unwrap();
    }
}

#[tokio::test]
async fn axum_alone_and_a_case_sensitive_rule_agree() {
    // Without a normalizing step, every spelling that axum itself routes
    // to the login handler is under the (case-sensitive) rule. (axum 0.8
    // matches the raw path: it answers all of `SPELLINGS` with 404, so the
    // rule covers more than the router; a router that normalizes is the
    // case the test above holds.)
    let rule =
        Rule::per_ip("login", Policy::token_bucket(Rate::per_hour(100))).on_path_prefix("/login");
    let layer = RateLimitLayer::builder().rule(rule).build().unwrap();
    let (addr, stop, server) = serve("127.0.0.1:0", login_app(layer, false)).await;
    let (handled, limited, refused) = spelled(addr, 1).await;
    assert_eq!((limited, refused), (handled, 0));
    let (status, text) = raw_get(addr, "/login").await;
    assert!(status == 200 && text.contains("ratelimit-policy: \"login\""));
    drop(stop);
    server.await.unwrap();
}

/// The server of a slow-reader test: its address, the slow readers'
/// responses (heads read, bodies never), the gate of `/held`, and what
/// stops it.
struct Slow {
    addr: SocketAddr,
    readers: Vec<http::Response<hyper::body::Incoming>>,
    gate: Arc<tokio::sync::Semaphore>,
    stop: tokio::sync::oneshot::Sender<()>,
    server: tokio::task::JoinHandle<()>,
}

/// A stalling route, a held route and `/` behind `layer`; `stalled` slow
/// readers take a response head each and never read on.
async fn slow_readers(layer: RateLimitLayer, stalled: usize) -> Slow {
    let dropped = Arc::new(AtomicUsize::new(0));
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let app = Router::new()
        .route("/stream", Stalling::route(dropped))
        .route("/held", held_route(gate.clone()))
        .route("/", get(|| async { "ok" }))
        .layer(layer);
    let (addr, stop, server) = serve("127.0.0.1:0", app).await;
    let mut readers = Vec::new();
    for _ in 0..stalled {
        let res = head(addr, "/stream", &[]).await;
        assert_eq!(res.status(), StatusCode::OK);
        readers.push(res);
    }
    Slow {
        addr,
        readers,
        gate,
        stop,
        server,
    }
}

async fn in_flight_becomes(layer: &RateLimitLayer, want: u64) {
    for _ in 0..200 {
        if layer.stats()[0].in_flight() == want {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!(
        "in flight {} never became {want}",
        layer.stats()[0].in_flight()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_readers_hold_no_permit_released_at_the_response_head() {
    let rule = || Rule::concurrent("all", Key::global(), 2);
    // By default, two readers that never finish hold both permits: every
    // other request is shed (docs/concurrency.md says so).
    let by_body = RateLimitLayer::builder().rule(rule()).build().unwrap();
    let slow = slow_readers(by_body.clone(), 2).await;
    assert_eq!(by_body.stats()[0].in_flight(), 2);
    assert_eq!(raw_get(slow.addr, "/").await.0, 503);
    drop(slow.readers);
    in_flight_becomes(&by_body, 0).await;
    drop(slow.stop);
    slow.server.abort();

    // Released at the head (in Rust, and in a file): the same readers
    // hold nothing.
    let in_rust = RateLimitLayer::builder()
        .rule(rule().release_permit(PermitRelease::ResponseHead))
        .build()
        .unwrap();
    let config: LayerConfig = toml::from_str(
        "[[rules]]\nname = \"all\"\nkey = \"global\"\nconcurrent = 2\n\
         release_permit = \"response-head\"\n",
    )
    .unwrap();
    let from_file = config.to_builder().unwrap().build().unwrap();
    for by_head in [in_rust, from_file] {
        let slow = slow_readers(by_head.clone(), 8).await;
        let addr = slow.addr;
        in_flight_becomes(&by_head, 0).await;
        assert_eq!(raw_get(addr, "/").await.0, 200);
        // Each permit was given back once: the rule still admits exactly
        // two handlers at once (none lost, none given back twice).
        let (a, b) = (
            tokio::spawn(async move { raw_get(addr, "/held").await.0 }),
            tokio::spawn(async move { raw_get(addr, "/held").await.0 }),
        );
        in_flight_becomes(&by_head, 2).await;
        assert_eq!(raw_get(addr, "/").await.0, 503);
        slow.gate.add_permits(2);
        assert_eq!((a.await.unwrap(), b.await.unwrap()), (200, 200));
        in_flight_becomes(&by_head, 0).await;
        drop(slow.readers);
        drop(slow.stop);
        slow.server.abort();
    }
}
