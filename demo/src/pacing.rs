//! The demo's client-pacing row.

use super::*;

/// The client pacing layer (`ratewall::client::PacingLayer`) over a real
/// hyper-util client, calling an in-process server limited to 20/s per
/// client: the same burst of 30 requests from 10 tasks, without the layer
/// and through it.
pub(super) fn client_pacing() {
    use hyper_util::client::legacy::Client;
    use ratewall::client::PacingLayer;
    use ratewall::http::{RateLimitLayer, Rule};
    use ratewall::Policy;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;
    use tower::{Service, ServiceExt};

    type Body = http_body_util::Empty<bytes::Bytes>;

    /// 30 GETs from 10 tasks; returns the time and the 429s.
    async fn burst<S>(svc: S, addr: std::net::SocketAddr) -> (Duration, u64)
    where
        S: Service<http::Request<Body>, Response = http::Response<hyper::body::Incoming>>
            + Clone
            + Send
            + Sync
            + 'static,
        S::Future: Send,
        S::Error: std::fmt::Debug,
    {
        use http_body_util::BodyExt;
        let refused = Arc::new(AtomicU64::new(0));
        let start = Instant::now();
        let tasks: Vec<_> = (0..10)
            .map(|_| {
                let (svc, refused) = (svc.clone(), refused.clone());
                tokio::spawn(async move {
                    for _ in 0..3 {
                        let req = http::Request::get(format!("http://{addr}/"))
                            .body(Body::new())
                            .expect("request");
                        let res = svc.clone().oneshot(req).await.expect("response");
                        if res.status() == http::StatusCode::TOO_MANY_REQUESTS {
                            refused.fetch_add(1, Ordering::Relaxed);
                        }
                        res.into_body().collect().await.expect("body");
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.expect("task");
        }
        (start.elapsed(), refused.load(Ordering::Relaxed))
    }

    println!(
        "The client pacing layer: a hyper-util client calling a server limited to 20/s per client"
    );
    let rt = runtime();
    rt.block_on(async {
        let app = || {
            let limit = RateLimitLayer::builder()
                .rule(Rule::per_ip(
                    "ip",
                    Policy::token_bucket(Rate::per_second(20)),
                ))
                .build()
                .expect("limits");
            axum::Router::new()
                .route("/", axum::routing::get(|| async { "ok" }))
                .layer(limit)
        };
        let client = || Client::builder(hyper_util::rt::TokioExecutor::new()).build_http::<Body>();

        let (addr, stop, serving) = serve(app()).await;
        let (took, refused) = burst(client(), addr).await;
        println!(
            "  without the layer: 30 requests from 10 tasks in {}, {refused} x 429",
            fmt_ms(took)
        );
        drop(stop);
        serving.await.expect("server task");

        let (addr, stop, serving) = serve(app()).await;
        // No pace of its own: it keeps the pace the server announces.
        let pacing = PacingLayer::builder()
            .jitter(Duration::from_millis(5))
            .build()
            .expect("pacing layer");
        let paced = tower::ServiceBuilder::new()
            .layer(pacing.clone())
            .service(client());
        // One request teaches it the quota; then the same burst.
        burst_of_one(&paced, addr).await;
        let (took, refused) = burst(paced, addr).await;
        println!(
            "  through the layer: 30 requests from 10 tasks in {}, {refused} x 429",
            fmt_ms(took)
        );
        for (authority, view) in pacing.views() {
            println!("  learned for {authority}: {view}");
        }
        drop(stop);
        serving.await.expect("server task");
    });
    println!("  the layer keeps the announced quota (q at once, then q per w), lowered to what");
    println!("  the server says is left: its burst, and no 429\n");

    async fn burst_of_one<S>(svc: &S, addr: std::net::SocketAddr)
    where
        S: Service<http::Request<Body>, Response = http::Response<hyper::body::Incoming>> + Clone,
        S::Error: std::fmt::Debug,
    {
        let req = http::Request::get(format!("http://{addr}/"))
            .body(Body::new())
            .expect("request");
        let _ = svc.clone().oneshot(req).await.expect("response");
    }
}
