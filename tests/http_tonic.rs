//! The layer in front of a real tonic server (feature `tonic`): the client
//! address comes from tonic's `TcpConnectInfo`, and a denied call is a gRPC
//! `RESOURCE_EXHAUSTED`. The service is tonic-health's pre-generated health
//! service, so no protoc is needed.

use ratewall::http::{RateLimitLayer, Rule};
use ratewall::{Policy, Rate};
use std::net::SocketAddr;
use tokio::sync::oneshot;
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Channel, Server};
use tonic::Code;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

/// Serves the health service behind `layer` on a free port of `ip`; the
/// sender stops the server.
async fn serve(
    layer: RateLimitLayer,
    ip: &str,
) -> (SocketAddr, oneshot::Sender<()>, tokio::task::JoinHandle<()>) {
    let (_reporter, health) = tonic_health::server::health_reporter();
    let listener = tokio::net::TcpListener::bind((ip, 0)).await.expect("bind");
    let addr = listener.local_addr().expect("local addr");
    let (stop, stopped) = oneshot::channel::<()>();
    let server = tokio::spawn(async move {
        Server::builder()
            .layer(layer)
            .add_service(health)
            .serve_with_incoming_shutdown(TcpIncoming::from(listener), async {
                let _ = stopped.await;
            })
            .await
            .expect("server");
    });
    (addr, stop, server)
}

async fn client(addr: SocketAddr) -> HealthClient<Channel> {
    let channel = Channel::from_shared(format!("http://{addr}"))
        .expect("uri")
        .connect()
        .await
        .expect("connect");
    HealthClient::new(channel)
}

/// The status codes of `n` health checks, in order.
async fn codes(client: &mut HealthClient<Channel>, n: usize) -> Vec<Code> {
    let mut out = Vec::new();
    for _ in 0..n {
        let res = client
            .check(HealthCheckRequest {
                service: String::new(),
            })
            .await;
        out.push(match res {
            Ok(_) => Code::Ok,
            Err(status) => status.code(),
        });
    }
    out
}

fn per_ip_three_a_minute() -> RateLimitLayer {
    RateLimitLayer::builder()
        .rule(Rule::per_ip(
            "ip",
            Policy::token_bucket(Rate::per_minute(3)),
        ))
        .build()
        .expect("layer")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fourth_call_from_one_peer_is_resource_exhausted() {
    let layer = per_ip_three_a_minute();
    let (addr, stop, server) = serve(layer.clone(), "127.0.0.1").await;
    let mut c = client(addr).await;
    assert_eq!(
        codes(&mut c, 4).await,
        [Code::Ok, Code::Ok, Code::Ok, Code::ResourceExhausted]
    );
    // Counted under a peer address (a missing one would be an error, not
    // a count), and the denial took nothing.
    let s = &layer.stats()[0];
    assert_eq!((s.allowed(), s.denied(), s.missing_key()), (3, 1, 0));
    // A second connection from the same address shares the bucket.
    let mut again = client(addr).await;
    assert_eq!(codes(&mut again, 1).await, [Code::ResourceExhausted]);
    drop(stop);
    server.await.expect("server task");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_key_is_the_real_peer_address() {
    // The allow list is matched against the client address the layer
    // found: 127.0.0.1 passes unlimited, 127.0.0.2 changes nothing.
    for (allowed, unlimited) in [("127.0.0.1", true), ("127.0.0.2", false)] {
        let layer = RateLimitLayer::builder()
            .allow([allowed.parse().expect("cidr")])
            .rule(Rule::per_ip(
                "ip",
                Policy::token_bucket(Rate::per_minute(3)),
            ))
            .build()
            .expect("layer");
        let (addr, stop, server) = serve(layer.clone(), "127.0.0.1").await;
        let mut c = client(addr).await;
        let got = codes(&mut c, 5).await;
        let denied = got
            .iter()
            .filter(|&&c| c == Code::ResourceExhausted)
            .count();
        assert_eq!(
            denied,
            if unlimited { 0 } else { 2 },
            "allow {allowed}: {got:?}"
        );
        assert!(
            got.iter()
                .all(|&c| c == Code::Ok || c == Code::ResourceExhausted),
            "{got:?}"
        );
        drop(stop);
        server.await.expect("server task");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ipv6_peers_are_keyed_too() {
    let layer = per_ip_three_a_minute();
    // Skipped where the machine has no IPv6 loopback.
    let Ok(probe) = std::net::TcpListener::bind("[::1]:0") else {
        eprintln!("no [::1] here: skipped");
        return;
    };
    drop(probe);
    let (addr, stop, server) = serve(layer.clone(), "::1").await;
    let mut c = client(addr).await;
    assert_eq!(
        codes(&mut c, 4).await,
        [Code::Ok, Code::Ok, Code::Ok, Code::ResourceExhausted]
    );
    drop(stop);
    server.await.expect("server task");
}
