//! A store that answers but cannot do its job: Redis out of memory (a real
//! server with `--maxmemory` and `noeviction`), an error reply that says
//! the store is unwell (`MISCONF`, `READONLY`, `LOADING`, ...), or a reply
//! that is not a decision (a fake server that answers garbage). Each is a
//! failure of the store: the failure policy answers, the breaker counts it,
//! and the limiter reports it like an outage. A key that holds another
//! policy's data is the caller's error instead: Redis stays up for
//! everyone else.

#![cfg(feature = "redis")]

mod support;

use ratewall::redis::{
    check_all, DecisionSource, FailurePolicy, RedisBackend, RedisConcurrencyLimiter,
    RedisElasticLimiter, RedisError, RedisLeaseLimiter, RedisLeaseOptions, RedisLimiter,
    StoreEvent,
};
use ratewall::{Policy, Rate, Window};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use support::redis_server::RedisServer;
use support::store_faults::{fill_until_oom, FakeRedis};

/// No eviction (Redis' default policy): writes fail with `OOM` once it is
/// full (`fill_until_oom`).
const OOM_ARGS: &[&str] = &["--maxmemory-policy", "noeviction"];
const TIMEOUT: Duration = Duration::from_millis(200);
const COOL_DOWN: Duration = Duration::from_millis(300);

fn backend(url: String) -> RedisBackend {
    RedisBackend::builder(url)
        .timeout(TIMEOUT)
        .breaker(3, COOL_DOWN)
        .build()
        .unwrap()
}

type Events = Arc<Mutex<Vec<StoreEvent>>>;

fn limiter(b: &RedisBackend, name: &str, failure: FailurePolicy) -> (RedisLimiter, Events) {
    let events: Events = Arc::default();
    let seen = events.clone();
    let l = RedisLimiter::builder(Policy::token_bucket(Rate::per_minute(2).burst(2)), b)
        .name(name)
        .on_failure(failure)
        .on_store_event(move |e: &StoreEvent| seen.lock().unwrap().push(e.clone()))
        .build()
        .unwrap();
    (l, events)
}

const POLICIES: [(&str, FailurePolicy); 3] = [
    ("open", FailurePolicy::Open),
    ("closed", FailurePolicy::Closed),
    ("share", FailurePolicy::FallbackShare { instances: 1 }),
];

/// What each failure policy answers to four checks of `key` (fresh in
/// Redis) while the store fails: Open admits untracked, Closed is
/// `Unavailable` with `says` in its first cause (the breaker, open after
/// three, answers the last), the fallback admits its burst (2) locally and
/// then denies.
async fn assert_failure_policy(l: &RedisLimiter, key: &[u8], says: &str) {
    for i in 0..4 {
        let t = Instant::now();
        let got = l.check_key(key).await;
        assert!(t.elapsed() < 2 * TIMEOUT, "{}: {:?}", l.name(), t.elapsed());
        match l.failure_policy() {
            FailurePolicy::Open => {
                let d = got.unwrap();
                assert!(d.is_allowed());
                assert_eq!(d.source(), DecisionSource::FailOpen);
            }
            FailurePolicy::Closed => match got {
                Err(RedisError::Unavailable { cause, .. }) => assert!(
                    cause.contains(says) || (i == 3 && cause.contains("circuit open")),
                    "{i}: {cause}"
                ),
                other => panic!("closed {i}: {other:?}"),
            },
            _ => {
                let d = got.unwrap();
                assert_eq!(d.source(), DecisionSource::Fallback, "{i}");
                assert_eq!(d.is_allowed(), i < 2, "{i}");
            }
        }
    }
}

/// Redis out of memory (`noeviction`, the default): a check that must
/// write gets `OOM`. Each failure policy answers, each limiter reports
/// `Failing` once with the cause, the breaker opens; once Redis has room
/// again, Redis decides and each limiter reports `Recovered`.
#[tokio::test]
async fn an_out_of_memory_redis_takes_each_failure_policy_and_recovers() {
    let server = RedisServer::start_with(OOM_ARGS);
    // A backend (and so a breaker) each.
    let limiters: Vec<_> = POLICIES
        .iter()
        .map(|(name, failure)| (backend(server.url()), name, *failure))
        .map(|(b, name, failure)| (limiter(&b, name, failure), b))
        .map(|((l, events), b)| (l, events, b))
        .collect();
    for (l, _, _) in &limiters {
        assert_eq!(
            l.check_key(b"warm").await.unwrap().source(),
            DecisionSource::Redis
        );
    }
    fill_until_oom(&server);
    for (l, events, b) in &limiters {
        assert_failure_policy(l, b"fresh", "out of memory").await;
        assert!(l.is_failing_over(), "{}", l.name());
        let events = events.lock().unwrap();
        assert!(
            matches!(&events[..], [StoreEvent::Failing { cause, .. }] if cause.contains("OOM")),
            "{}: {events:?}",
            l.name()
        );
        // Three store failures in a row opened the breaker.
        assert!(!b.is_available(), "{}", l.name());
    }
    // Concurrent checks go out as one batch: it fails alike.
    let keys: Vec<Vec<u8>> = (0..8).map(|i| format!("batch{i}").into_bytes()).collect();
    let open = &limiters[0].0;
    for r in futures_util::future::join_all(keys.iter().map(|k| open.check_key(k))).await {
        assert_eq!(r.unwrap().source(), DecisionSource::FailOpen);
    }

    // Room again: Redis decides after the cool-down.
    assert!(server
        .cmd(&["CONFIG", "SET", "maxmemory", "0"])
        .starts_with("+OK"));
    let deadline = Instant::now() + Duration::from_secs(5);
    for (l, events, b) in &limiters {
        while l.check_key(b"again").await.ok().map(|d| d.source()) != Some(DecisionSource::Redis) {
            assert!(Instant::now() < deadline, "{} never recovered", l.name());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(!l.is_failing_over());
        let events = events.lock().unwrap();
        assert!(
            matches!(&events[..], [StoreEvent::Failing { .. }, StoreEvent::Recovered { answered_locally, .. }] if *answered_locally >= 4),
            "{}: {events:?}",
            l.name()
        );
        assert!(b.is_available());
    }
}

/// Under `OOM` a denial still comes from Redis (it writes nothing); only
/// the checks that must write fail over. In a batch too: each call's
/// answer is its own.
// One thread: the calls of the batch all queue while the first is alone
// on the wire, so the batch is the same on every run.
#[tokio::test(flavor = "current_thread")]
async fn under_oom_redis_still_denies_what_it_would_deny() {
    let server = RedisServer::start_with(OOM_ARGS);
    let b = backend(server.url());
    let (l, _) = limiter(&b, "open", FailurePolicy::Open);
    // Spends "spent", and loads the batch script (a call alone, then a
    // batch of two).
    let warm = [&b"spent"[..], b"spent", b"warm"];
    for r in futures_util::future::join_all(warm.iter().map(|k| l.check_key(k))).await {
        assert!(r.unwrap().is_allowed());
    }
    // Let the warm-up's batch runner see its queue empty and give its slot
    // back (it yields once after a batch before it looks again): with no
    // call in flight, the first call below goes alone. (Without this, a
    // loaded machine could still find the runner holding its slot here, and
    // all five calls would queue behind it and go as one batch.)
    tokio::time::sleep(Duration::from_millis(50)).await;
    fill_until_oom(&server);
    // The first alone, then a batch of four: two script calls.
    let before = evalsha_calls(&server);
    let keys = [&b"spent"[..], b"spent", b"fresh1", b"spent", b"fresh2"];
    let got: Vec<_> = futures_util::future::join_all(keys.iter().map(|k| l.check_key(k)))
        .await
        .into_iter()
        .map(|r| {
            let d = r.unwrap();
            (d.is_allowed(), d.source())
        })
        .collect();
    let denied = (false, DecisionSource::Redis);
    let open = (true, DecisionSource::FailOpen);
    assert_eq!(got, [denied, denied, open, denied, open]);
    assert_eq!(evalsha_calls(&server) - before, 2);
    let d = l.check_key(b"fresh3").await.unwrap();
    assert_eq!((d.is_allowed(), d.source()), open);
}

/// How many `EVALSHA`s the server ran (`INFO commandstats`).
fn evalsha_calls(server: &RedisServer) -> u64 {
    let stats = server.cmd(&["INFO", "commandstats"]);
    stats
        .lines()
        .find_map(|l| l.strip_prefix("cmdstat_evalsha:calls="))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |n| n.parse().unwrap())
}

/// Replies that are not a decision: each policy answers, within the
/// timeout, for a call alone and for a batch, and nothing panics.
#[tokio::test]
async fn garbage_replies_take_the_failure_policy_in_time() {
    let garbage: [&[u8]; 6] = [
        b"+OK\r\n",
        b"*2\r\n:1\r\n:2\r\n",
        b"$7\r\ngarbage\r\n",
        b"*5\r\n:7\r\n:10\r\n:1\r\n:0\r\n:0\r\n", // allowed = 7
        b"*5\r\n:1\r\n:2\r\n:9\r\n:0\r\n:0\r\n",  // remaining > limit
        b"*5\r\n:1\r\n:-2\r\n:1\r\n:0\r\n:0\r\n", // a negative limit
    ];
    for reply in garbage {
        let fake = FakeRedis::start(reply).await;
        for (name, failure) in POLICIES {
            let b = backend(fake.url());
            let (l, events) = limiter(&b, name, failure);
            assert_failure_policy(&l, b"k", "did not give a decision").await;
            let keys: Vec<Vec<u8>> = (0..8).map(|i| format!("b{i}").into_bytes()).collect();
            for r in futures_util::future::join_all(keys.iter().map(|k| l.check_key(k))).await {
                match r {
                    Ok(d) => assert_ne!(d.source(), DecisionSource::Redis),
                    Err(e) => assert!(matches!(e, RedisError::Unavailable { .. }), "{e}"),
                }
            }
            let events = events.lock().unwrap();
            assert!(
                matches!(&events[..], [StoreEvent::Failing { .. }]),
                "{events:?}"
            );
            assert!(!b.is_available(), "{}", String::from_utf8_lossy(reply));
        }
        assert!(
            fake.script_calls() >= 9,
            "{}",
            String::from_utf8_lossy(reply)
        );
    }
}

/// Error replies that say the store cannot serve take the failure policy,
/// with a cause that says what to do; the breaker opens.
#[tokio::test]
async fn store_error_replies_take_the_failure_policy_and_say_what_to_do() {
    for (reply, says) in [
        (
            &b"-OOM command not allowed when used memory > 'maxmemory'.\r\n"[..],
            "raise maxmemory",
        ),
        (
            b"-MISCONF Redis is configured to save RDB snapshots\r\n",
            "persistence",
        ),
        (
            b"-READONLY You can't write against a read only replica.\r\n",
            "primary",
        ),
        (
            b"-LOADING Redis is loading the dataset in memory\r\n",
            "loading",
        ),
        (
            b"-MASTERDOWN Link with MASTER is down\r\n",
            "primary is down",
        ),
        (b"-BUSY Redis is busy running a script\r\n", "time limit"),
        (b"-NOPERM this user has no permissions\r\n", "grant"),
        (
            b"-ERR user_script:1: attempt to compare nil\r\n",
            "did not give a decision",
        ),
    ] {
        let fake = FakeRedis::start(reply).await;
        let b = backend(fake.url());
        let (closed, _) = limiter(&b, "closed", FailurePolicy::Closed);
        match closed.check_key(b"k").await {
            Err(e @ RedisError::Unavailable { .. }) => {
                let text = e.to_string();
                assert!(text.contains(says), "{text}");
                assert!(text.contains("FailurePolicy::Open"), "{text}");
            }
            other => panic!("{}: {other:?}", String::from_utf8_lossy(reply)),
        }
        let (open, _) = limiter(&b, "open", FailurePolicy::Open);
        for _ in 0..3 {
            let d = open.check_key(b"k").await.unwrap();
            assert_eq!(d.source(), DecisionSource::FailOpen);
        }
        assert!(!b.is_available(), "{}", String::from_utf8_lossy(reply));
    }
}

/// A key that holds another policy's state, or another data type, is the
/// caller's error: a `Server` error that says so, whatever the failure
/// policy; Redis counts as up (no breaker failure, no `Failing` event),
/// and every other key is decided by Redis.
#[tokio::test]
async fn a_foreign_key_is_the_callers_error_and_leaves_redis_up() {
    let server = RedisServer::start();
    let b = backend(server.url());
    let (l, events) = limiter(&b, "mine", FailurePolicy::Open);
    server.cmd(&["SET", "ratewall:mine:text", "not-a-number"]);
    server.cmd(&["HSET", "ratewall:mine:hash", "f", "v"]);
    for _ in 0..10 {
        match l.check_key(b"text").await {
            Err(RedisError::Server { message }) => {
                assert!(message.contains("state of another policy"), "{message}")
            }
            other => panic!("{other:?}"),
        }
        match l.check_key(b"hash").await {
            Err(RedisError::Server { message }) => {
                assert!(message.contains("WRONGTYPE"), "{message}")
            }
            other => panic!("{other:?}"),
        }
    }
    assert!(b.is_available());
    assert!(!l.is_failing_over());
    assert!(events.lock().unwrap().is_empty());
    let d = l.check_key(b"other").await.unwrap();
    assert_eq!(d.source(), DecisionSource::Redis);
    // In a batch too: only those calls fail.
    let keys: [&[u8]; 4] = [b"text", b"a", b"hash", b"b"];
    let got = futures_util::future::join_all(keys.iter().map(|k| l.check_key(k))).await;
    assert!(matches!(got[0], Err(RedisError::Server { .. })));
    assert!(matches!(got[2], Err(RedisError::Server { .. })));
    assert_eq!(got[1].as_ref().unwrap().source(), DecisionSource::Redis);
    assert_eq!(got[3].as_ref().unwrap().source(), DecisionSource::Redis);
    assert!(b.is_available());
}

/// Every other Redis limiter (elastic, lease, concurrency, and several
/// limits at once) takes its failure policy on a store error or a garbage
/// reply too: Open admits, Closed is `Unavailable`.
#[tokio::test]
async fn every_redis_limiter_takes_its_failure_policy() {
    for reply in [
        &b"-OOM command not allowed when used memory > 'maxmemory'.\r\n"[..],
        b"$7\r\ngarbage\r\n",
        b"*1\r\n:1\r\n",
    ] {
        let fake = FakeRedis::start(reply).await;
        let b = backend(fake.url());
        for failure in [FailurePolicy::Open, FailurePolicy::Closed] {
            let open = failure == FailurePolicy::Open;
            let expect = |what: &str, got: Result<DecisionSource, RedisError>| match got {
                Ok(source) => assert!(
                    open && source == DecisionSource::FailOpen,
                    "{what}: {source:?}"
                ),
                Err(RedisError::Unavailable { .. }) => assert!(!open, "{what}"),
                Err(e) => panic!("{what}: {e}"),
            };
            let p = |s: &str| s.parse::<Policy>().unwrap();
            let elastic = RedisElasticLimiter::builder(p("5/h"), p("10/h"), p("100/h"), &b)
                .on_failure(failure)
                .build()
                .unwrap();
            expect("elastic", elastic.check_key(b"k").await.map(|d| d.source()));
            let plain = RedisLimiter::builder(Policy::token_bucket(Rate::per_second(50)), &b)
                .on_failure(failure)
                .build()
                .unwrap();
            let lease = RedisLeaseLimiter::new(plain, RedisLeaseOptions::new()).unwrap();
            expect("lease", lease.check_key(b"k").await.map(|d| d.source()));
            expect(
                "lease n",
                lease.check_key_n(b"k", 3).await.map(|d| d.source()),
            );
            let conc = RedisConcurrencyLimiter::builder(2, &b)
                .on_failure(failure)
                .build()
                .unwrap();
            expect(
                "concurrency",
                conc.try_acquire_key_n(b"k", 1)
                    .await
                    .map(|a| a.decision().source()),
            );
            let (x, _) = limiter(&b, "x", failure);
            let y = RedisLimiter::builder(Policy::fixed_window(Window::per_minute(5)), &b)
                .name("y")
                .on_failure(failure)
                .build()
                .unwrap();
            let all = check_all(&[(&x, b"k", 1), (&y, b"k", 1)]).await;
            expect(
                "check_all",
                all.map(|(ok, d)| {
                    assert!(ok);
                    d[0].source()
                }),
            );
        }
    }
}

/// A call that waited out a timeout under a millisecond says "within 1 ms",
/// rounded up as every wait is, never "within 0 ms".
#[tokio::test]
async fn a_timeout_under_a_millisecond_is_said_in_whole_milliseconds() {
    // Accepts connections and never answers.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = silent.local_addr().unwrap().port();
    let held = tokio::spawn(async move {
        let mut conns = Vec::new();
        while let Ok((c, _)) = silent.accept().await {
            conns.push(c);
        }
    });
    let b = RedisBackend::builder(format!("redis://127.0.0.1:{port}"))
        .timeout(Duration::from_micros(500))
        .build()
        .unwrap();
    let l = RedisLimiter::builder(Policy::token_bucket(Rate::per_second(5)), &b)
        .name("silent")
        .on_failure(FailurePolicy::Closed)
        .build()
        .unwrap();
    match l.check_key(b"k").await {
        Err(RedisError::Unavailable { cause, .. }) => {
            assert!(cause.contains("no reply within 1 ms"), "{cause}")
        }
        other => panic!("{other:?}"),
    }
    held.abort();
}
