//! Forged `X-Forwarded-For` from a client that reaches the server directly:
//! behind a hop count, it wrote a victim's address to spend the victim's
//! quota, or an allowed address to pass unlimited. With the proxies named
//! (`from_peers`, `trusted_peers`), a direct client is keyed by its own
//! address and its proxy headers are ignored.

use crate::support::http_client::serve;
use axum::routing::get;
use axum::Router;
use http::{Request, StatusCode};
use hyper_util::rt::TokioIo;
use ratewall::http::{ClientIp, LayerConfig, RateLimitLayer, Rule};
use ratewall::{Policy, Rate};
use std::net::SocketAddr;
use tokio::net::TcpSocket;

/// The load balancer's address: a second loopback address, so the server
/// sees a different TCP peer than the direct client's `127.0.0.1`.
const PROXY: &str = "127.0.0.2";
const DIRECT: &str = "127.0.0.1";
const VICTIM: &str = "198.51.100.7";
const ALLOWED: &str = "192.0.2.1";
const BURST: usize = 3;

/// `GET /` to `addr` over a fresh connection from `local`, with an
/// `X-Forwarded-For` of `xff`: the status.
async fn get_from(local: &str, addr: SocketAddr, xff: &str) -> StatusCode {
    let socket = TcpSocket::new_v4().unwrap();
    socket
        .bind(SocketAddr::new(local.parse().unwrap(), 0))
        .unwrap();
    let stream = socket.connect(addr).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    let req = Request::get("/")
        .header("host", addr.to_string())
        .header("x-forwarded-for", xff)
        .body(http_body_util::Empty::<axum::body::Bytes>::new())
        .unwrap();
    sender.send_request(req).await.unwrap().status()
}

/// How many of `n` requests from `local` claiming `xff` are admitted.
async fn admitted(local: &str, addr: SocketAddr, xff: &str, n: usize) -> usize {
    let mut ok = 0;
    for _ in 0..n {
        if get_from(local, addr, xff).await == StatusCode::OK {
            ok += 1;
        }
    }
    ok
}

fn rule() -> Rule {
    Rule::per_ip(
        "ip",
        Policy::token_bucket(Rate::per_hour(BURST as u64).burst(BURST as u64)),
    )
}

/// The attack against one layer: a direct client forges the victim's and
/// an allowed address; then the victim and the allowed client come
/// through the proxy.
async fn forged_addresses_buy_nothing(layer: RateLimitLayer) {
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer);
    let (addr, stop, server) = serve("127.0.0.1:0", app).await;

    // The direct client, claiming to be the victim: its own bucket.
    assert_eq!(admitted(DIRECT, addr, VICTIM, 2 * BURST).await, BURST);
    // ...so the victim, through the proxy, still has all of its own.
    assert_eq!(admitted(PROXY, addr, VICTIM, 2 * BURST).await, BURST);
    // The direct client, claiming an allowed address: still limited (its
    // bucket is spent), never unlimited.
    assert_eq!(admitted(DIRECT, addr, ALLOWED, 2 * BURST).await, 0);
    // Through the proxy, the allowed address passes unlimited, as before.
    assert_eq!(admitted(PROXY, addr, ALLOWED, 4 * BURST).await, 4 * BURST);
    drop(stop);
    server.await.unwrap();
}

#[tokio::test]
async fn a_direct_client_cannot_forge_its_way_into_another_key_or_the_allow_list() {
    let proxy = format!("{PROXY}/32").parse().unwrap();
    let in_rust = RateLimitLayer::builder()
        .client_ip(ClientIp::behind_hops(1).from_peers([proxy]))
        .allow([ALLOWED.parse().unwrap()])
        .rule(rule())
        .build()
        .unwrap();
    forged_addresses_buy_nothing(in_rust).await;

    let config: LayerConfig = toml::from_str(&format!(
        "trusted_hops = 1\ntrusted_peers = [\"{PROXY}\"]\nallow = [\"{ALLOWED}\"]\n\
         [[rules]]\nname = \"ip\"\nkey = \"ip\"\npolicy = \"{BURST}/hour burst {BURST}\"\n"
    ))
    .unwrap();
    forged_addresses_buy_nothing(config.to_builder().unwrap().build().unwrap()).await;
}
