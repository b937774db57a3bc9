//! The gateway in one screen: `ratewall-server` started in-process on free
//! loopback ports from a configuration written here, then asked over gRPC
//! (Envoy's own protocol) and over `/json`, until a limit says OVER_LIMIT.
//!
//! ```text
//! cargo run -p ratewall-server --example demo
//! ```

use std::time::{Duration, Instant};

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{rate_limit::Unit, Code};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use ratewall_server::{request, ServerBuilder};

const CONFIG: &str = r#"
domain: edge
descriptors:
  # envoyproxy/ratelimit's own form: a fixed window.
  - key: remote_address
    rate_limit: { unit: minute, requests_per_unit: 3 }
  # ratewall's policy text: any algorithm in one line.
  - key: api_key
    rate_limit: { name: api-key, policy: "2/s sliding-log" }
  - key: path
    value: /healthz
    rate_limit: { unlimited: true }
"#;

fn describe(r: &RateLimitResponse) -> String {
    let s = &r.statuses[0];
    let code = |c: i32| Code::try_from(c).map_or("UNKNOWN", |c| c.as_str_name());
    let limit = s.current_limit.as_ref().map_or("no limit".to_owned(), |l| {
        let unit = Unit::try_from(l.unit).map_or("?", |u| u.as_str_name());
        format!("{} per {}", l.requests_per_unit, unit.to_lowercase())
    });
    let reset = s.duration_until_reset.map_or(String::new(), |d| {
        format!(", reset in {}.{:03} s", d.seconds, d.nanos / 1_000_000)
    });
    let left = if s.limit_remaining == u32::MAX {
        "unlimited".to_owned()
    } else {
        format!("{} left", s.limit_remaining)
    };
    format!("{:<10} ({limit}, {left}{reset})", code(r.overall_code))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::temp_dir().join(format!("ratewall-gateway-demo-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join("edge.yaml"), CONFIG)?;
    let server = ServerBuilder::new(&dir)
        .grpc_addr("127.0.0.1:0".parse()?)
        .http_addr("127.0.0.1:0".parse()?)
        .start()
        .await?;
    println!(
        "ratewall-server in-process: gRPC on {}, HTTP on {}; configuration:{CONFIG}",
        server.grpc_addr(),
        server.http_addr()
    );
    let client = RateLimitServiceClient::connect(format!("http://{}", server.grpc_addr())).await?;
    let start = Instant::now();
    let ask = |what: &'static str, entries: &'static [(&'static str, &'static str)]| {
        let req = request("edge", &[entries], 1);
        let mut c = client.clone();
        async move {
            let r = c.should_rate_limit(req).await?.into_inner();
            println!(
                "{:>7.3} s  {what:<34} {}",
                start.elapsed().as_secs_f64(),
                describe(&r)
            );
            Ok::<_, tonic::Status>(r.overall_code == Code::OverLimit as i32)
        }
    };
    println!("over gRPC, as Envoy asks:");
    let mut over = false;
    for _ in 0..4 {
        over |= ask("remote_address=10.0.0.1", &[("remote_address", "10.0.0.1")]).await?;
    }
    ask(
        "remote_address=10.0.0.2 (its own)",
        &[("remote_address", "10.0.0.2")],
    )
    .await?;
    for _ in 0..3 {
        over |= ask("api_key=k1 (sliding log)", &[("api_key", "k1")]).await?;
    }
    tokio::time::sleep(Duration::from_millis(1_050)).await;
    ask("api_key=k1, a second later", &[("api_key", "k1")]).await?;
    ask("path=/healthz", &[("path", "/healthz")]).await?;
    ask("user=ada (no limit matches)", &[("user", "ada")]).await?;
    assert!(over, "a limit should have said OVER_LIMIT");

    // The same request as JSON, as envoyproxy/ratelimit's /json takes it.
    let body = r#"{"domain":"edge","descriptors":[{"entries":[{"key":"remote_address","value":"10.0.0.1"}]}]}"#;
    let mut stream = tokio::net::TcpStream::connect(server.http_addr()).await?;
    let request_text = format!(
        "POST /json HTTP/1.1\r\nHost: demo\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    tokio::io::AsyncWriteExt::write_all(&mut stream, request_text.as_bytes()).await?;
    let mut answer = String::new();
    tokio::io::AsyncReadExt::read_to_string(&mut stream, &mut answer).await?;
    let status = answer.lines().next().unwrap_or_default();
    let json = answer.split("\r\n\r\n").nth(1).unwrap_or_default();
    println!("\nover HTTP, POST /json: {status}\n  {json}");

    server.shutdown(Duration::from_secs(5)).await;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
