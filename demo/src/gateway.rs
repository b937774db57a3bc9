//! The demo's gateway row.

use super::*;

/// The gateway: `ratewall-server` started in-process on free loopback
/// ports from an envoyproxy/ratelimit configuration written here, asked
/// over gRPC (`ShouldRateLimit`, as Envoy asks) until its limit answers
/// OVER_LIMIT, then shut down. (`cargo run -p ratewall-server --example
/// demo` shows more of it: ratewall's policies, `/json`.)
pub(super) fn gateway() {
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{rate_limit, Code};
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;

    const CONFIG: &str = "\
domain: edge
descriptors:
  - key: remote_address
    rate_limit: { unit: minute, requests_per_unit: 3 }
";
    let dir = std::env::temp_dir().join(format!("ratewall-demo-gateway-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    std::fs::write(dir.join("edge.yaml"), CONFIG).expect("the configuration file");
    let over_limit = runtime().block_on(async {
        let free: std::net::SocketAddr = "127.0.0.1:0".parse().expect("an address");
        let server = ratewall_server::ServerBuilder::new(&dir)
            .grpc_addr(free)
            .http_addr(free)
            .start()
            .await
            .expect("the gateway starts");
        println!(
            "The gateway: ratewall-server in-process, gRPC on {}, as Envoy asks it",
            server.grpc_addr()
        );
        println!("  edge.yaml (envoyproxy/ratelimit's form): remote_address, 3 per minute");
        println!(
            "  {:>7}  {:>3}  {:>10}  {:>12}  {:>9}  {:>9}",
            "t (ms)", "#", "code", "limit", "remaining", "reset"
        );
        let mut client = RateLimitServiceClient::connect(format!("http://{}", server.grpc_addr()))
            .await
            .expect("a gRPC connection");
        let start = Instant::now();
        let mut over_limit = false;
        // Until the limit answers OVER_LIMIT: the 4th call, or a few more
        // if a minute's window ends between the calls.
        for i in 1..=8 {
            let ask = ratewall_server::request("edge", &[&[("remote_address", "10.0.0.1")]], 1);
            let answer = client.should_rate_limit(ask).await.expect("an answer");
            let answer = answer.into_inner();
            let status = &answer.statuses[0];
            let limit = status.current_limit.as_ref().map_or("none".into(), |l| {
                let unit = rate_limit::Unit::try_from(l.unit).map_or("?", |u| u.as_str_name());
                format!("{} per {}", l.requests_per_unit, unit.to_lowercase())
            });
            let reset = status.duration_until_reset.map_or(Duration::ZERO, |d| {
                Duration::new(
                    d.seconds.try_into().unwrap_or(0),
                    d.nanos.try_into().unwrap_or(0),
                )
            });
            let code = Code::try_from(answer.overall_code).unwrap_or(Code::Unknown);
            println!(
                "  {:>7.1}  {i:>3}  {:>10}  {limit:>12}  {:>9}  {:>9}",
                start.elapsed().as_secs_f64() * 1e3,
                code.as_str_name(),
                status.limit_remaining,
                format!("{:.1} s", reset.as_secs_f64()),
            );
            if code == Code::OverLimit {
                over_limit = true;
                break;
            }
        }
        server.shutdown(Duration::from_secs(5)).await;
        over_limit
    });
    let _ = std::fs::remove_dir_all(&dir);
    assert!(over_limit, "the gateway never answered OVER_LIMIT");
    println!("  OVER_LIMIT is what Envoy turns into a 429; the server is shut down\n");
}
