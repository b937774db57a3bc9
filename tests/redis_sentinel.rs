//! Redis Sentinel (feature `redis-sentinel`) against real servers: a
//! master, its replica and one sentinel (`redis-server --sentinel`). Checks
//! go to the master; when it dies, the failure policy answers (bounded by
//! the per-call timeout) while the sentinel promotes the replica; then the
//! new master decides, continuing the counts it replicated, and the limiter
//! reports `Recovered`.
#![cfg(feature = "redis-sentinel")]

mod support;

use ratewall::redis::{
    DecisionSource, FailurePolicy, RedisBackend, RedisError, RedisLimiter, StoreEvent,
};
use ratewall::{Policy, Window};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use support::redis_server::{RedisSentinel, RedisServer};

const TIMEOUT: Duration = Duration::from_millis(200);
const LIMIT: u64 = 100;

type Events = Arc<Mutex<Vec<StoreEvent>>>;

fn limiter(b: &RedisBackend, name: &str, failure: FailurePolicy) -> (RedisLimiter, Events) {
    let events: Events = Arc::default();
    let seen = events.clone();
    let l = RedisLimiter::builder(
        Policy::fixed_window(Window::new(LIMIT, Duration::from_secs(3600))),
        b,
    )
    .prefix("sent")
    .name(name)
    .on_failure(failure)
    .on_store_event(move |e: &StoreEvent| seen.lock().unwrap().push(e.clone()))
    .build()
    .unwrap();
    (l, events)
}

/// Waits (bounded) until `what` holds.
fn wait_until(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !done() {
        assert!(Instant::now() < deadline, "{what} within {limit:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A replication offset from `INFO replication` (`field:<n>`).
fn offset(s: &RedisServer, field: &str) -> u64 {
    let info = s.cmd(&["INFO", "replication"]);
    let line = info
        .lines()
        .find(|l| l.starts_with(field))
        .unwrap_or_else(|| panic!("{field} in {info}"));
    line[field.len() + 1..].trim().parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checks_follow_the_master_through_a_failover() {
    let test_start = Instant::now();
    // Redis 7 waits 5 s by default before a diskless full sync, for more
    // replicas to join it: none will.
    let mut master = RedisServer::start_with(&["--repl-diskless-sync-delay", "0"]);
    let replica = RedisServer::start_with(&[
        "--replicaof",
        "127.0.0.1",
        &master.port().to_string(),
        "--repl-diskless-sync-delay",
        "0",
    ]);
    wait_until("the replica syncs", Duration::from_secs(10), || {
        replica
            .cmd(&["INFO", "replication"])
            .contains("master_link_status:up")
    });
    let sentinel = RedisSentinel::start("m", master.port());
    // The sentinel learns the replica from the master's INFO.
    wait_until(
        "the sentinel sees the replica",
        Duration::from_secs(5),
        || {
            support::redis_server::raw_command(sentinel.port(), &["SENTINEL", "replicas", "m"])
                .is_ok_and(|r| r.contains(&replica.port().to_string()))
        },
    );
    assert_eq!(sentinel.master_port("m"), Some(master.port()));

    let b = RedisBackend::sentinel_builder([sentinel.url()], "m")
        .timeout(TIMEOUT)
        .connect_timeout(TIMEOUT)
        .breaker(3, Duration::from_millis(200))
        .build()
        .unwrap();
    let (closed, events) = limiter(&b, "counts", FailurePolicy::Closed);
    let (open, _) = limiter(&b, "counts", FailurePolicy::Open);
    for i in 0..5u64 {
        let d = closed.check_key(b"k").await.unwrap();
        assert_eq!(d.source(), DecisionSource::Redis, "{i}");
        assert_eq!(d.remaining(), LIMIT - 1 - i, "{i}");
    }
    // Calls went to the master, never the replica: its key is there.
    assert!(master.cmd(&["KEYS", "sent:*"]).contains("sent:"));
    // The replica has the counts before the master dies. (WAIT from the
    // test's own connection would wait for nothing: it wrote nothing.)
    let target = offset(&master, "master_repl_offset");
    wait_until("the replica catches up", Duration::from_secs(10), || {
        offset(&replica, "slave_repl_offset") >= target
    });
    assert!(replica.cmd(&["KEYS", "sent:*"]).contains("sent:"));

    let old = master.port();
    master.kill9();
    let killed = Instant::now();
    let mut answered_locally = 0;
    let promoted = loop {
        assert!(
            killed.elapsed() < Duration::from_secs(10),
            "no new master within 10 s"
        );
        let t = Instant::now();
        let got = closed.check_key(b"k").await;
        assert!(
            t.elapsed() < 3 * TIMEOUT,
            "a check took {:?} during the failover",
            t.elapsed()
        );
        match got {
            Ok(d) if d.source() == DecisionSource::Redis => break d,
            Err(RedisError::Unavailable { .. }) => {
                answered_locally += 1;
                let d = open.check_key(b"k").await.unwrap();
                assert!(
                    matches!(d.source(), DecisionSource::FailOpen | DecisionSource::Redis),
                    "{d:?}"
                );
            }
            other => panic!("during the failover: {other:?}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(answered_locally > 0, "the failure policy never answered");
    let new = sentinel.master_port("m");
    assert_eq!(
        new,
        Some(replica.port()),
        "the sentinel promoted the replica"
    );
    assert_ne!(new, Some(old));
    // The new master continued the replicated count (the open limiter may
    // have added some once it was up).
    assert!(
        promoted.remaining() <= LIMIT - 6,
        "remaining {} after 5 checks before the failover",
        promoted.remaining()
    );
    assert!(replica
        .cmd(&["INFO", "replication"])
        .contains("role:master"));
    assert!(replica.cmd(&["KEYS", "sent:*"]).contains("sent:"));
    let events = events.lock().unwrap();
    assert!(
        matches!(
            &events[..],
            [StoreEvent::Failing { .. }, StoreEvent::Recovered { .. }]
        ),
        "{events:?}"
    );
    drop(sentinel);
    drop(replica);
    assert!(
        test_start.elapsed() < Duration::from_secs(20),
        "{:?}",
        test_start.elapsed()
    );
}

/// A master whose ACL user has a password (its default user may only
/// PING): the sentinel is told them (`auth-user`, `auth-pass`), the backend
/// too (`sentinel_master_auth`). Without them, the master is a store that
/// cannot decide, whose cause says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_masters_credentials_come_from_the_builder() {
    let master = RedisServer::start_with(&[
        "--user", "default", "on", "nopass", "-@all", "+ping", "--user", "limiter", "on",
        ">s3cret", "~*", "&*", "+@all",
    ]);
    let sentinel = RedisSentinel::start_with(
        "m",
        master.port(),
        &[
            "sentinel auth-user m limiter",
            "sentinel auth-pass m s3cret",
        ],
    );
    let build = |password: Option<&str>| {
        let b = RedisBackend::sentinel_builder([sentinel.url()], "m")
            .timeout(Duration::from_secs(2))
            .connect_timeout(Duration::from_secs(1));
        match password {
            Some(p) => b.sentinel_master_auth(Some("limiter"), p),
            None => b,
        }
        .build()
        .unwrap()
    };
    let with = build(Some("s3cret"));
    assert!(!format!("{with:?}").contains("s3cret"), "{with:?}");
    let (l, _) = limiter(&with, "auth", FailurePolicy::Closed);
    for i in 0..3u64 {
        let d = l.check_key(b"k").await.unwrap();
        assert_eq!(d.source(), DecisionSource::Redis, "{i}");
        assert_eq!(d.remaining(), LIMIT - 1 - i, "{i}");
    }
    let (without, _) = limiter(&build(None), "auth", FailurePolicy::Closed);
    match without.check_key(b"k").await {
        Err(RedisError::Unavailable { cause, .. }) => {
            assert!(cause.to_lowercase().contains("perm"), "{cause}")
        }
        other => panic!("without the password: {other:?}"),
    }
}

/// A sentinel that accepts connections and never answers: each lookup
/// waits its whole bound. Calls in flight together share one lookup, so
/// the sentinel sees one connection per wave of callers, not one per
/// caller, queued one after the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_in_flight_together_share_one_sentinel_lookup() {
    use std::net::TcpListener;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let accepted = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let silent = {
        let (accepted, stop) = (accepted.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut held = Vec::new();
            let deadline = Instant::now() + Duration::from_secs(20);
            // Relaxed: a flag that publishes no other memory (join() syncs the rest).
            while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
                match listener.accept() {
                    Ok((stream, _)) => {
                        // Relaxed: a counter; read after the callers are done.
                        accepted.fetch_add(1, Ordering::Relaxed);
                        held.push(stream);
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        })
    };
    let timeout = Duration::from_millis(100);
    let b = RedisBackend::sentinel_builder([format!("redis://127.0.0.1:{port}")], "m")
        .timeout(timeout)
        .connect_timeout(timeout)
        .breaker(1000, Duration::from_millis(100))
        .max_batch(1)
        .build()
        .unwrap();
    let (l, _) = limiter(&b, "silent", FailurePolicy::Closed);
    let keys: Vec<Vec<u8>> = (0..20).map(|i| format!("k{i}").into_bytes()).collect();
    let start = Instant::now();
    let results = futures_util::future::join_all(keys.iter().map(|k| l.check_key(k))).await;
    assert!(start.elapsed() < 5 * timeout, "{:?}", start.elapsed());
    for r in results {
        assert!(matches!(r, Err(RedisError::Unavailable { .. })), "{r:?}");
    }
    // One lookup is bounded by twice the connect timeout (200 ms); 20
    // queued lookups would keep connecting for 4 s.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    // Relaxed: a counter and a flag that publish no other memory.
    let seen = accepted.load(Ordering::Relaxed);
    stop.store(true, Ordering::Relaxed);
    silent.join().unwrap();
    assert!(
        (1..=2).contains(&seen),
        "{seen} sentinel connections for one wave of 20 callers"
    );
}
