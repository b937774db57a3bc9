//! `rediss://` (feature `redis-tls`) against a real `redis-server` serving
//! TLS with a CA and certificates this test makes (rcgen): checks decide as
//! over plain TCP, a client that does not trust the CA gets its failure
//! policy's answer, an ACL user from the URL, mutual TLS, and typed errors
//! for bad PEM.
#![cfg(feature = "redis-tls")]

mod support;

use ratewall::redis::{DecisionSource, FailurePolicy, RedisBackend, RedisError, RedisLimiter};
use ratewall::{Policy, Rate};
use rcgen::{BasicConstraints, Certificate, CertificateParams, DnType, IsCa, KeyPair};
use std::time::{Duration, Instant};
use support::redis_server::{RedisCluster, RedisServer, TlsFiles};

/// A CA, and certificates it signs.
struct Ca {
    cert: Certificate,
    key: KeyPair,
}

/// A certificate and its key, as PEM.
struct Leaf {
    cert: String,
    key: String,
}

impl Ca {
    fn new(name: &str) -> Ca {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        let cert = params.self_signed(&key).unwrap();
        Ca { cert, key }
    }

    fn pem(&self) -> String {
        self.cert.pem()
    }

    /// A certificate for `names` (an IP address becomes an IP SAN).
    fn sign(&self, names: &[&str]) -> Leaf {
        let key = KeyPair::generate().unwrap();
        let mut params =
            CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>())
                .unwrap();
        params.distinguished_name.push(DnType::CommonName, names[0]);
        let cert = params.signed_by(&key, &self.cert, &self.key).unwrap();
        Leaf {
            cert: cert.pem(),
            key: key.serialize_pem(),
        }
    }
}

fn tls_server(ca: &Ca, clients_must_authenticate: bool, extra: &[&str]) -> RedisServer {
    let leaf = ca.sign(&["127.0.0.1"]);
    RedisServer::start_tls(
        &TlsFiles {
            cert: leaf.cert.as_bytes(),
            key: leaf.key.as_bytes(),
            ca: ca.pem().as_bytes(),
            clients_must_authenticate,
        },
        extra,
    )
}

fn limiter(b: &RedisBackend, name: &str, failure: FailurePolicy) -> RedisLimiter {
    RedisLimiter::builder(Policy::token_bucket(Rate::per_hour(3)), b)
        .prefix("tls")
        .name(name)
        .on_failure(failure)
        .build()
        .unwrap()
}

/// Five checks of one key: whether each was allowed, and from where.
async fn five_checks(l: &RedisLimiter) -> Vec<(bool, DecisionSource)> {
    let mut out = Vec::new();
    for _ in 0..5 {
        let d = l.check_key(b"k").await.unwrap();
        out.push((d.is_allowed(), d.source()));
    }
    out
}

/// The cause of the store failure a `Closed` limiter reports.
async fn store_failure(l: &RedisLimiter) -> String {
    match l.check_key(b"k").await {
        Err(RedisError::Unavailable { cause, .. }) => cause,
        other => panic!("expected a store failure, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checks_over_tls_decide_as_over_plain_tcp() {
    let ca = Ca::new("ratewall test CA");
    let server = tls_server(&ca, false, &[]);
    let over_tls = RedisBackend::builder(server.tls_url())
        .timeout(Duration::from_secs(2))
        .tls_root_certificate(ca.pem())
        .build()
        .unwrap();
    let over_tcp = RedisBackend::builder(server.url())
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    let tls = five_checks(&limiter(&over_tls, "tls", FailurePolicy::Closed)).await;
    let tcp = five_checks(&limiter(&over_tcp, "tcp", FailurePolicy::Closed)).await;
    assert_eq!(tls, tcp);
    let expected: Vec<_> = (0..5).map(|i| (i < 3, DecisionSource::Redis)).collect();
    assert_eq!(tls, expected);
    // Both wrote to the same server: the TLS limiter's key is there.
    assert!(
        server.cmd(&["KEYS", "tls:*"]).matches("tls:").count() >= 2,
        "{}",
        server.cmd(&["KEYS", "*"])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_does_not_trust_the_ca_gets_the_failure_policy_answer() {
    let ca = Ca::new("ratewall test CA");
    let server = tls_server(&ca, false, &[]);
    let other_ca = Ca::new("some other CA");
    let untrusting = [
        // The platform's trust store, which has never heard of the test CA.
        RedisBackend::builder(server.tls_url())
            .timeout(Duration::from_millis(500))
            .build()
            .unwrap(),
        // A private CA, but not the one that signed the server's certificate.
        RedisBackend::builder(server.tls_url())
            .timeout(Duration::from_millis(500))
            .tls_root_certificate(other_ca.pem())
            .build()
            .unwrap(),
    ];
    for (i, b) in untrusting.iter().enumerate() {
        let start = Instant::now();
        let cause = store_failure(&limiter(b, "closed", FailurePolicy::Closed)).await;
        assert!(
            cause.contains("certificate is not trusted") && cause.contains("tls_root_certificate"),
            "{i}: the cause should say the certificate is not trusted: {cause}"
        );
        let d = limiter(b, "open", FailurePolicy::Open)
            .check_key(b"k")
            .await
            .unwrap();
        assert_eq!(d.source(), DecisionSource::FailOpen, "{i}");
        assert!(
            start.elapsed() < Duration::from_secs(3),
            "{i}: took {:?}",
            start.elapsed()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acl_user_and_its_password_from_the_url_work_over_tls() {
    let ca = Ca::new("ratewall test CA");
    let server = tls_server(
        &ca,
        false,
        &[
            "--user", "limiter", "on", ">s3cret", "~tls:*", "&*", "+@all",
        ],
    );
    let port = server.tls_url().rsplit(':').next().unwrap().to_string();
    let build = |password: &str| {
        RedisBackend::builder(format!("rediss://limiter:{password}@127.0.0.1:{port}"))
            .timeout(Duration::from_secs(2))
            .tls_root_certificate(ca.pem())
            .build()
            .unwrap()
    };
    let good = build("s3cret");
    assert!(!format!("{good:?}").contains("s3cret"), "{good:?}");
    let checks = five_checks(&limiter(&good, "acl", FailurePolicy::Closed)).await;
    let expected: Vec<_> = (0..5).map(|i| (i < 3, DecisionSource::Redis)).collect();
    assert_eq!(checks, expected);
    let cause = store_failure(&limiter(&build("wrong"), "acl", FailurePolicy::Closed)).await;
    assert!(cause.to_lowercase().contains("pass"), "{cause}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_admits_only_a_client_with_a_certificate_the_ca_signed() {
    let ca = Ca::new("ratewall test CA");
    let server = tls_server(&ca, true, &[]);
    let client = ca.sign(&["ratewall-client"]);
    let with_cert = RedisBackend::builder(server.tls_url())
        .timeout(Duration::from_secs(2))
        .tls_root_certificate(ca.pem())
        .tls_client_certificate(client.cert.clone(), client.key.clone())
        .build()
        .unwrap();
    assert!(!format!("{with_cert:?}").contains("PRIVATE"));
    let checks = five_checks(&limiter(&with_cert, "mtls", FailurePolicy::Closed)).await;
    let expected: Vec<_> = (0..5).map(|i| (i < 3, DecisionSource::Redis)).collect();
    assert_eq!(checks, expected);

    let without = RedisBackend::builder(server.tls_url())
        .timeout(Duration::from_millis(500))
        .tls_root_certificate(ca.pem())
        .build()
        .unwrap();
    let start = Instant::now();
    store_failure(&limiter(&without, "mtls", FailurePolicy::Closed)).await;
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "{:?}",
        start.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_certificates_are_typed_errors_at_build() {
    let ca = Ca::new("ratewall test CA");
    let client = ca.sign(&["ratewall-client"]);
    let other = ca.sign(&["someone-else"]);
    let url = "rediss://127.0.0.1:6380";
    let cases: Vec<(&str, Result<RedisBackend, RedisError>)> = vec![
        (
            "tls_root_certificate",
            RedisBackend::builder(url)
                .tls_root_certificate("not PEM at all")
                .build(),
        ),
        (
            "tls_client_certificate",
            RedisBackend::builder(url)
                .tls_client_certificate(client.cert.clone(), "no key here")
                .build(),
        ),
        (
            // A key that is not the certificate's.
            "tls_client_certificate",
            RedisBackend::builder(url)
                .tls_client_certificate(client.cert.clone(), other.key.clone())
                .build(),
        ),
        (
            "rediss://",
            RedisBackend::builder("redis://127.0.0.1:6379")
                .tls_root_certificate(ca.pem())
                .build(),
        ),
    ];
    for (i, (names, built)) in cases.into_iter().enumerate() {
        match built {
            Err(e @ RedisError::InvalidTls { .. }) => {
                let text = e.to_string();
                assert!(text.contains(names), "{i}: {text}");
            }
            other => panic!("{i}: expected InvalidTls, got {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_over_tls_limits_exactly_on_every_master() {
    let ca = Ca::new("ratewall test CA");
    let leaf = ca.sign(&["127.0.0.1"]);
    let cluster = RedisCluster::start_tls(
        3,
        &TlsFiles {
            cert: leaf.cert.as_bytes(),
            key: leaf.key.as_bytes(),
            ca: ca.pem().as_bytes(),
            clients_must_authenticate: false,
        },
    );
    let b = RedisBackend::cluster_builder(cluster.tls_urls())
        .timeout(Duration::from_secs(2))
        .tls_root_certificate(ca.pem())
        .build()
        .unwrap();
    let l = limiter(&b, "cluster", FailurePolicy::Closed);
    let keys: Vec<String> = (0..24).map(|i| format!("key-{i}")).collect();
    for key in &keys {
        let mut allowed = 0;
        for _ in 0..5 {
            let d = l.check_key(key.as_bytes()).await.unwrap();
            assert_eq!(d.source(), DecisionSource::Redis, "{key}");
            allowed += u32::from(d.is_allowed());
        }
        assert_eq!(allowed, 3, "{key}");
    }
    // The keys spread over every master, each reached over TLS.
    for (i, node) in cluster.nodes.iter().enumerate() {
        assert!(
            node.cmd(&["DBSIZE"])
                .trim_start_matches(':')
                .trim()
                .parse::<u64>()
                .unwrap()
                > 0,
            "master {i} holds no key"
        );
    }
    // A client that does not trust the CA gets the failure policy's answer.
    let untrusting = RedisBackend::cluster_builder(cluster.tls_urls())
        .timeout(Duration::from_millis(500))
        .build()
        .unwrap();
    let start = Instant::now();
    let d = limiter(&untrusting, "cluster", FailurePolicy::Open)
        .check_key(b"k")
        .await
        .unwrap();
    assert_eq!(d.source(), DecisionSource::FailOpen);
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "{:?}",
        start.elapsed()
    );
}
