//! What TLS costs a check: one `redis-server` serving plain TCP and TLS
//! (certificates made here, rcgen), one `RedisLimiter` (token bucket,
//! never denying) over each, sequential checks of fresh keys, alternating
//! rounds; the per-check time of each and their ratio, with the median and
//! spread over the rounds. Loopback, so it shows the CPU TLS adds, not a
//! network's round trip:
//! `cargo run --release --example redis_tls_bench --features redis-tls [-- ROUNDS CHECKS]`.

#[path = "../tests/support/redis_server.rs"]
mod redis_server;

use ratewall::redis::{RedisBackend, RedisLimiter};
use ratewall::{Policy, Rate};
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
use redis_server::{RedisServer, TlsFiles};
use std::time::{Duration, Instant};

async fn round(l: &RedisLimiter, round: usize, checks: usize) -> f64 {
    let start = Instant::now();
    for i in 0..checks {
        let key = format!("r{round}-{i}");
        let d = l.check_key(key.as_bytes()).await.expect("a decision");
        assert!(d.is_allowed());
    }
    start.elapsed().as_secs_f64() * 1e6 / checks as f64
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let rounds = args.first().copied().unwrap_or(5);
    let checks = args.get(1).copied().unwrap_or(2000);

    let ca_key = KeyPair::generate().unwrap();
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name.push(DnType::CommonName, "bench CA");
    let ca = ca.self_signed(&ca_key).unwrap();
    let key = KeyPair::generate().unwrap();
    let leaf = CertificateParams::new(vec!["127.0.0.1".to_string()])
        .unwrap()
        .signed_by(&key, &ca, &ca_key)
        .unwrap();
    let server = RedisServer::start_tls(
        &TlsFiles {
            cert: leaf.pem().as_bytes(),
            key: key.serialize_pem().as_bytes(),
            ca: ca.pem().as_bytes(),
            clients_must_authenticate: false,
        },
        &[],
    );
    let policy = Policy::token_bucket(Rate::per_second(1_000_000));
    let build = |url: String, tls: bool| {
        let b = RedisBackend::builder(url).timeout(Duration::from_secs(2));
        let b = if tls {
            b.tls_root_certificate(ca.pem())
        } else {
            b
        };
        let b = b.build().unwrap();
        RedisLimiter::builder(policy, &b)
            .name(if tls { "tls" } else { "tcp" })
            .build()
            .unwrap()
    };
    let tcp = build(server.url(), false);
    let tls = build(server.tls_url(), true);
    // Warm both: connections made, scripts loaded.
    round(&tcp, 0, 200).await;
    round(&tls, 0, 200).await;
    let (mut t, mut s, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    for r in 1..=rounds {
        let plain = round(&tcp, r, checks).await;
        let secure = round(&tls, r, checks).await;
        println!(
            "round {r}: tcp {plain:.1} us/check, tls {secure:.1} us/check, ratio {:.3}",
            secure / plain
        );
        t.push(plain);
        s.push(secure);
        ratios.push(secure / plain);
    }
    let (lo, hi) = ratios
        .iter()
        .fold((f64::MAX, f64::MIN), |(lo, hi), &r| (lo.min(r), hi.max(r)));
    println!(
        "median: tcp {:.1} us/check, tls {:.1} us/check, ratio {:.3} (spread {lo:.3}..{hi:.3}) over {rounds} rounds of {checks} sequential checks",
        median(&mut t),
        median(&mut s),
        median(&mut ratios.clone()),
    );
}
