//! The real binary on a real `redis-server` (and a real 3-node Cluster)
//! started on free loopback ports: replicas share limits exactly, and a
//! Redis that dies under load costs no call more than its timeout.

#[path = "../../tests/support/redis_server.rs"]
mod redis_server;
mod support;

use std::time::{Duration, Instant};

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use redis_server::{RedisCluster, RedisServer};
use support::{call, request, ConfigDir, Server};

const OK: i32 = Code::Ok as i32;

/// Window limits count by the hour: a window boundary (Redis aligns them
/// to its clock) cannot fall inside a test but once in hours.
fn config(policy: &str) -> String {
    format!("domain: shared\ndescriptors:\n  - key: tenant\n    rate_limit:\n      policy: \"{policy}\"\n  - key: plain\n    rate_limit:\n      unit: hour\n      requests_per_unit: 7\n")
}

/// 16 callers, each calling both replicas in turn: `calls` in all.
async fn admitted_by(replicas: &[&Server], descriptor: (&str, &str), calls: usize) -> usize {
    let mut tasks = Vec::new();
    for t in 0..16 {
        let mut clients = Vec::new();
        for r in replicas {
            clients.push(r.client().await);
        }
        let (k, v) = (descriptor.0.to_owned(), descriptor.1.to_owned());
        tasks.push(tokio::spawn(async move {
            let mut ok = 0;
            for i in 0..calls / 16 {
                let n = clients.len();
                let c = &mut clients[(t + i) % n];
                let r = call(c, request("shared", &[&[(k.as_str(), v.as_str())]], 1)).await;
                ok += usize::from(r.overall_code == OK);
            }
            ok
        }));
    }
    let mut total = 0;
    for t in tasks {
        total += t.await.unwrap();
    }
    total
}

#[tokio::test]
async fn two_replicas_on_one_redis_admit_exactly_the_limit_together() {
    let redis = RedisServer::start();
    let dir = ConfigDir::new(&[("shared.yaml", &config("40/h sliding-window"))]);
    let url = redis.url();
    let a = Server::start(&dir.path, &["--redis-url", &url]);
    // The other unbatched, with more batches in flight: the same count.
    let b = Server::start(
        &dir.path,
        &[
            "--redis-url",
            &url,
            "--redis-max-batch",
            "1",
            "--redis-batches-in-flight",
            "4",
        ],
    );
    assert_eq!(admitted_by(&[&a, &b], ("tenant", "t1"), 160).await, 40);
    // envoyproxy/ratelimit's own form (a fixed window) too.
    assert_eq!(admitted_by(&[&a, &b], ("plain", "p"), 64).await, 7);
}

#[tokio::test]
async fn two_replicas_on_a_redis_cluster_admit_exactly_the_limit_together() {
    let cluster = RedisCluster::start(3);
    let dir = ConfigDir::new(&[("shared.yaml", &config("30/min burst 30"))]);
    let urls = cluster.urls().join(",");
    let flags = ["--redis-url", urls.as_str()];
    let a = Server::start(&dir.path, &flags);
    let b = Server::start(&dir.path, &flags);
    // Keys spread over the nodes; each admitted exactly.
    for tenant in ["a", "b", "c", "d"] {
        assert_eq!(
            admitted_by(&[&a, &b], ("tenant", tenant), 64).await,
            30,
            "{tenant}"
        );
    }
}

/// Redis killed under gRPC load: no call waits past the Redis timeout
/// (plus scheduling slack), each failure policy answers as it says, and
/// once Redis is back the limits count there again.
#[tokio::test]
async fn redis_killed_under_load_costs_no_call_more_than_its_timeout() {
    let mut redis = RedisServer::start();
    let dir = ConfigDir::new(&[("shared.yaml", &config("1000/min burst 1000"))]);
    let url = redis.url();
    let open = Server::start(
        &dir.path,
        &["--redis-url", &url, "--redis-timeout-ms", "50"],
    );
    let closed = Server::start(
        &dir.path,
        &[
            "--redis-url",
            &url,
            "--redis-timeout-ms",
            "50",
            "--redis-on-failure",
            "closed",
        ],
    );
    let mut oc = open.client().await;
    let mut cc = closed.client().await;
    let tenant = || request("shared", &[&[("tenant", "t")]], 1);
    assert_eq!(
        call(&mut oc, tenant()).await.statuses[0].limit_remaining,
        999
    );
    assert_eq!(
        call(&mut cc, tenant()).await.statuses[0].limit_remaining,
        998
    );

    redis.kill9();
    let (mut slowest, mut unavailable, mut admitted) = (Duration::ZERO, 0, 0);
    let end = Instant::now() + Duration::from_secs(2);
    while Instant::now() < end {
        let t = Instant::now();
        let r = call(&mut oc, tenant()).await;
        admitted += usize::from(r.overall_code == OK);
        slowest = slowest.max(t.elapsed());
        let t = Instant::now();
        match cc.should_rate_limit(tenant()).await {
            Err(s) => {
                assert_eq!(s.code(), tonic::Code::Unavailable, "{s:?}");
                unavailable += 1;
            }
            Ok(r) => panic!("a closed limiter answered without Redis: {r:?}"),
        }
        slowest = slowest.max(t.elapsed());
    }
    assert!(admitted > 0 && unavailable > 0, "{admitted} {unavailable}");
    // 50 ms timeout, plus the machine's scheduling slack under load.
    assert!(
        slowest < Duration::from_millis(1000),
        "slowest call {slowest:?}"
    );

    redis.restart();
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut back = false;
    while Instant::now() < deadline && !back {
        back =
            matches!(cc.should_rate_limit(tenant()).await, Ok(r) if r.get_ref().overall_code == OK);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        back,
        "the closed replica did not recover once Redis came back"
    );
}

/// All or nothing on Redis: a request the `plain` limit refuses takes
/// nothing from the tenant's limit.
#[tokio::test]
async fn all_or_nothing_on_redis_takes_nothing_from_the_others_when_one_refuses() {
    let redis = RedisServer::start();
    let dir = ConfigDir::new(&[("shared.yaml", &config("1000/min burst 1000"))]);
    let server = Server::start(
        &dir.path,
        &["--redis-url", &redis.url(), "--all-or-nothing"],
    );
    let mut c = server.client().await;
    let mut admitted = 0;
    for _ in 0..10 {
        let r = call(
            &mut c,
            request("shared", &[&[("tenant", "t")], &[("plain", "p")]], 1),
        )
        .await;
        admitted += usize::from(r.overall_code == OK);
    }
    assert_eq!(admitted, 7);
    // 7 taken from the tenant, then this one.
    let r = call(&mut c, request("shared", &[&[("tenant", "t")]], 1)).await;
    assert_eq!(r.statuses[0].limit_remaining, 1000 - 8);
}
