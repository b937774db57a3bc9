//! `rediss://` with a private CA and mutual TLS: the real binary on a real
//! TLS `redis-server` (Debian's serves TLS), certificates made here.

#[path = "../../tests/support/redis_server.rs"]
mod redis_server;
mod support;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
use redis_server::{RedisServer, TlsFiles};
use support::{call, request, ConfigDir, Server};

/// (CA PEM, server cert PEM, server key PEM, client cert PEM, client key PEM).
fn certificates() -> [String; 5] {
    let ca_key = KeyPair::generate().unwrap();
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name.push(DnType::CommonName, "test ca");
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let leaf = |name: &str| {
        let key = KeyPair::generate().unwrap();
        let mut p = CertificateParams::new(vec![name.to_owned()]).unwrap();
        p.distinguished_name.push(DnType::CommonName, name);
        let cert = p.signed_by(&key, &ca_cert, &ca_key).unwrap();
        (cert.pem(), key.serialize_pem())
    };
    let (server_cert, server_key) = leaf("127.0.0.1");
    let (client_cert, client_key) = leaf("ratewall-server");
    [
        ca_cert.pem(),
        server_cert,
        server_key,
        client_cert,
        client_key,
    ]
}

#[tokio::test]
async fn counts_on_redis_over_mutual_tls_with_a_private_ca() {
    let [ca, cert, key, client_cert, client_key] = certificates();
    let redis = RedisServer::start_tls(
        &TlsFiles {
            cert: cert.as_bytes(),
            key: key.as_bytes(),
            ca: ca.as_bytes(),
            clients_must_authenticate: true,
        },
        &[],
    );
    let pems = ConfigDir::new(&[
        ("ca.pem", &ca),
        ("client.pem", &client_cert),
        ("client.key", &client_key),
    ]);
    let file = |name: &str| pems.path.join(name).to_string_lossy().into_owned();
    let yaml = "domain: tls\ndescriptors:\n  - key: k\n    rate_limit: { unit: hour, requests_per_unit: 2 }\n";
    let dir = ConfigDir::new(&[("tls.yaml", yaml)]);
    let url = redis.tls_url();
    let flags = [
        "--redis-url",
        url.as_str(),
        "--redis-on-failure",
        "closed",
        "--redis-tls-ca",
        &file("ca.pem"),
        "--redis-tls-cert",
        &file("client.pem"),
        "--redis-tls-key",
        &file("client.key"),
    ];
    let server = Server::start(&dir.path, &flags);
    let mut c = server.client().await;
    let k = || request("tls", &[&[("k", "v")]], 1);
    // `closed`: an answer at all means Redis (over TLS) gave it.
    assert_eq!(call(&mut c, k()).await.statuses[0].limit_remaining, 1);
    assert_eq!(call(&mut c, k()).await.statuses[0].limit_remaining, 0);
    assert_eq!(call(&mut c, k()).await.overall_code, Code::OverLimit as i32);

    // Without the client certificate Redis refuses the connection: a
    // closed failure policy answers UNAVAILABLE.
    let no_cert = Server::start(&dir.path, &flags[..6]);
    let err = no_cert
        .client()
        .await
        .should_rate_limit(k())
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unavailable, "{err:?}");
}

#[test]
fn a_certificate_file_that_cannot_be_read_stops_the_start() {
    let dir = ConfigDir::new(&[("t.yaml", "domain: t\ndescriptors:\n  - key: k\n    rate_limit: { unit: hour, requests_per_unit: 1 }\n")]);
    let refused = match Server::try_start(
        &dir.path,
        &[
            "--redis-url",
            "rediss://127.0.0.1:1",
            "--redis-tls-ca",
            "/nonexistent/ca.pem",
        ],
    ) {
        Ok(_) => panic!("started"),
        Err(r) => r,
    };
    assert_eq!(refused.code, Some(1));
    assert!(
        refused
            .stderr
            .contains("--redis-tls-ca /nonexistent/ca.pem"),
        "{}",
        refused.stderr
    );
}
