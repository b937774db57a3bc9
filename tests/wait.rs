//! Waiting for capacity (`ratewall::wait`): the async waits on paused tokio
//! time with a limiter clock that follows it (deterministic), fairness and
//! its measurement under 64 waiters, the issue's worker (global 10/s,
//! per-customer 2/s, 60 calls), and every limiter kind on real time.
//! The blocking waits run on real threads in `tests/wait_blocking.rs`.

use ratewall::wait::{FairKeys, FairQueue, Wait, WaitError};
use ratewall::{
    check_all, check_all_n, Clock, ElasticLimiter, HotKeys, KeyedPolicyLimiter,
    KeyedSlidingWindowLog, KeyedTokenBucket, Limit, Rate, StripedLimiter, TokenBucket, Window,
};
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// A limiter clock that follows tokio's (paused) time.
#[derive(Clone, Debug)]
struct TokioClock(Instant);

impl TokioClock {
    fn new() -> Self {
        TokioClock(Instant::now())
    }
}

impl Clock for TokioClock {
    fn now(&self) -> u64 {
        self.0.elapsed().as_nanos() as u64
    }
    fn is_monotonic(&self) -> bool {
        true
    }
}

fn bucket(rate: Rate, clock: &TokioClock) -> TokenBucket<TokioClock> {
    TokenBucket::with_clock(rate, clock.clone()).unwrap()
}

fn keyed(rate: Rate, clock: &TokioClock) -> KeyedTokenBucket<u32, TokioClock> {
    KeyedTokenBucket::<u32, _>::builder(rate)
        .clock(clock.clone())
        .build()
        .unwrap()
}

const MS: Duration = Duration::from_millis(1);

#[tokio::test(start_paused = true)]
async fn a_wait_sleeps_exactly_until_retry_after_and_takes_once() {
    let clock = TokioClock::new();
    let b = bucket(Rate::per_second(10).burst(1), &clock);
    let start = Instant::now();
    let tries = Cell::new(0);
    for k in 0..5u32 {
        let d = Wait::new()
            .until(|| {
                tries.set(tries.get() + 1);
                b.check()
            })
            .await
            .unwrap();
        assert!(d.is_allowed());
        assert_eq!(
            start.elapsed(),
            100 * MS * k,
            "admission {k} at its ideal time"
        );
    }
    // One try for the first, then a denial and one admitted try for each other.
    assert_eq!(tries.get(), 1 + 2 * 4);
    assert!(!b.peek().is_allowed(), "exactly five taken");
}

#[tokio::test(start_paused = true)]
async fn a_cost_n_waits_for_n_units_and_a_cost_above_the_burst_fails_at_once() {
    let clock = TokioClock::new();
    let b = bucket(Rate::per_second(10).burst(5), &clock);
    let start = Instant::now();
    assert!(b.check_n(5).unwrap().is_allowed());
    let d = Wait::new().until(|| b.check_n(3)).await.unwrap();
    assert!(d.is_allowed());
    assert_eq!(start.elapsed(), 300 * MS);
    let err = Wait::new().until(|| b.check_n(6)).await.unwrap_err();
    assert!(
        matches!(err, WaitError::InsufficientCapacity(e) if e.requested == 6 && e.capacity == 5)
    );
    assert_eq!(
        start.elapsed(),
        300 * MS,
        "no sleep for a cost that can never pass"
    );
}

#[tokio::test(start_paused = true)]
async fn a_deadline_shorter_than_retry_after_fails_at_once_with_the_decision() {
    let clock = TokioClock::new();
    let b = bucket(Rate::per_minute(1).burst(1), &clock);
    let _ = b.check();
    let start = Instant::now();
    let err = Wait::new()
        .timeout(Duration::from_secs(59))
        .until(|| b.check())
        .await
        .unwrap_err();
    assert_eq!(
        start.elapsed(),
        Duration::ZERO,
        "decided up front, no sleep"
    );
    let last = err.last_decision().expect("the denial");
    assert_eq!(last.retry_after(), Duration::from_secs(60));
    // A deadline the retry fits in waits and passes.
    let d = Wait::new()
        .timeout(Duration::from_secs(60))
        .until(|| b.check())
        .await;
    assert!(d.unwrap().is_allowed());
    assert_eq!(start.elapsed(), Duration::from_secs(60));
}

#[tokio::test(start_paused = true)]
async fn a_wait_never_sleeps_past_its_deadline_even_with_jitter() {
    let clock = TokioClock::new();
    let b = bucket(Rate::per_second(10).burst(1), &clock);
    let _ = b.check();
    for jitter in [Duration::ZERO, Duration::from_secs(10)] {
        let start = Instant::now();
        let tries = Cell::new(0);
        // A thief inside the try takes every unit first: the wait is always denied.
        let err = Wait::new()
            .timeout(250 * MS)
            .jitter(jitter)
            .until(|| {
                tries.set(tries.get() + 1);
                let _ = b.check();
                b.check()
            })
            .await
            .unwrap_err();
        assert!(matches!(err, WaitError::Deadline { last: Some(_) }));
        assert!(
            start.elapsed() <= 250 * MS,
            "{:?} with jitter {jitter:?}",
            start.elapsed()
        );
        assert!(tries.get() >= 2, "it waited and tried again");
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

#[tokio::test(start_paused = true)]
async fn jitter_only_lengthens_a_wait_and_stays_within_its_max() {
    let clock = TokioClock::new();
    let b = bucket(Rate::per_second(10).burst(1), &clock);
    let mut waits = Vec::new();
    for _ in 0..50 {
        let _ = b.check();
        let start = Instant::now();
        let wait = Wait::new().jitter(20 * MS);
        assert!(wait.until(|| b.check()).await.unwrap().is_allowed());
        waits.push(start.elapsed());
    }
    assert!(
        waits.iter().all(|w| *w >= 100 * MS && *w <= 120 * MS),
        "{waits:?}"
    );
    assert!(
        waits.iter().any(|w| *w > 100 * MS),
        "jitter drawn: {waits:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_dropped_wait_takes_nothing() {
    let clock = TokioClock::new();
    let b = bucket(Rate::per_second(10).burst(5), &clock);
    assert!(b.check_n(5).unwrap().is_allowed());
    let start = Instant::now();
    // Dropped mid-wait (the retry is 500 ms away).
    let cut = tokio::time::timeout(200 * MS, Wait::new().until(|| b.check_n(5))).await;
    assert!(cut.is_err());
    // And a fair waiter dropped while it holds the head of its queue.
    let queue = FairQueue::new();
    let cut = tokio::time::timeout(100 * MS, queue.until(&Wait::new(), || b.check_n(5))).await;
    assert!(cut.is_err());
    tokio::time::sleep_until(start + 500 * MS).await;
    // The whole burst is back: neither dropped wait took anything.
    assert!(b.check_n(5).unwrap().is_allowed());
    // The queue was left: the next waiter is served.
    let d = queue.until(&Wait::new(), || b.check_n(1)).await.unwrap();
    assert!(d.is_allowed());
    assert_eq!(start.elapsed(), 600 * MS);
}

/// A keyed bucket of 1/s (burst 1) whose key 1 is drained, and per-key
/// queues for `max_keys` keys.
fn key_one_drained(max_keys: usize) -> (KeyedTokenBucket<u32, TokioClock>, FairKeys<u32>) {
    let l = keyed(Rate::per_second(1).burst(1), &TokioClock::new());
    assert!(l.check_key(&1).is_allowed());
    (l, FairKeys::new(max_keys))
}

#[tokio::test(start_paused = true)]
async fn a_dropped_per_key_waiter_leaves_no_queue_behind() {
    let (l, queues) = key_one_drained(2);
    let w = Wait::new();
    let waiting = queues.until(&1, &w, || l.check_key(&1));
    let cut = tokio::time::timeout(100 * MS, waiting).await;
    assert!(cut.is_err());
    assert_eq!(queues.queued_keys(), 0);
    // While keys wait, each has a queue, up to max_keys; a third shares the overflow.
    let (a, b, c) = (
        queues.until(&1, &w, || l.check_key(&1)),
        queues.until(&2, &w, || l.check_key_n(&2, 1)),
        queues.until(&3, &w, || l.check_key(&3)),
    );
    let (a, b, c) = tokio::join!(a, b, c);
    assert!(a.unwrap().is_allowed() && b.unwrap().is_allowed() && c.unwrap().is_allowed());
    assert_eq!(queues.queued_keys(), 0);
}

#[tokio::test(start_paused = true)]
async fn keys_do_not_wait_for_each_other() {
    let (l, queues) = key_one_drained(8);
    let start = Instant::now();
    let admitted_at = |key: u32| {
        let (l, queues) = (&l, &queues);
        async move {
            let d = queues.until(&key, &Wait::new(), || l.check_key(&key)).await;
            assert!(d.unwrap().is_allowed());
            start.elapsed()
        }
    };
    let slow = admitted_at(1);
    let fast = async {
        tokio::time::sleep(MS).await;
        assert_eq!(queues.queued_keys(), 1, "key 1 waits in its own queue");
        admitted_at(2).await
    };
    let (slow, fast) = tokio::join!(slow, fast);
    assert_eq!((slow, fast), (Duration::from_secs(1), MS));
}

#[tokio::test(start_paused = true)]
async fn per_key_queues_are_bounded_by_max_keys() {
    let clock = TokioClock::new();
    let l = keyed(Rate::per_second(1).burst(1), &clock);
    let queues = Arc::new(FairKeys::<u32>::new(3));
    for k in 0..10 {
        let _ = l.check_key(&k);
    }
    let l = Arc::new(l);
    let mut tasks = Vec::new();
    for k in 0..10u32 {
        let (l, queues) = (l.clone(), queues.clone());
        tasks.push(tokio::spawn(async move {
            queues
                .until(&k, &Wait::new(), || l.check_key(&k))
                .await
                .unwrap()
        }));
    }
    tokio::time::sleep(MS).await;
    assert_eq!(queues.queued_keys(), 3, "three keys have their own queue");
    for t in tasks {
        assert!(t.await.unwrap().is_allowed());
    }
    assert_eq!(queues.queued_keys(), 0);
}

/// A large request (cost 10) against a stream of small ones (cost 1, one
/// every 100 ms, the refill rate): without fairness the small ones take
/// every unit as it comes and the large one never passes; in a fair queue
/// it passes in its turn.
async fn large_among_small(fair: bool) -> Result<Duration, WaitError> {
    let clock = TokioClock::new();
    let b = Arc::new(bucket(Rate::per_second(10).burst(10), &clock));
    let queue = Arc::new(FairQueue::new());
    assert!(b.check_n(10).unwrap().is_allowed());
    let stream = {
        let (b, queue) = (b.clone(), queue.clone());
        tokio::spawn(async move {
            for _ in 0..200 {
                let (b, queue) = (b.clone(), queue.clone());
                tokio::spawn(async move {
                    if fair {
                        assert!(queue
                            .until(&Wait::new(), || b.check_n(1))
                            .await
                            .unwrap()
                            .is_allowed());
                    } else {
                        assert!(Wait::new()
                            .until(|| b.check_n(1))
                            .await
                            .unwrap()
                            .is_allowed());
                    }
                });
                tokio::time::sleep(100 * MS).await;
            }
        })
    };
    tokio::time::sleep(50 * MS).await;
    let start = Instant::now();
    let wait = Wait::new().timeout(Duration::from_secs(5));
    let large = if fair {
        queue.until(&wait, || b.check_n(10)).await
    } else {
        wait.until(|| b.check_n(10)).await
    };
    stream.abort();
    large.map(|_| start.elapsed())
}

#[tokio::test(start_paused = true)]
async fn a_large_request_is_starved_by_small_ones_unless_waiting_is_fair() {
    let unfair = large_among_small(false).await;
    assert!(
        matches!(unfair, Err(WaitError::Deadline { .. })),
        "{unfair:?}"
    );
    let fair = large_among_small(true).await.expect("admitted in its turn");
    println!("a large request among small ones: fair admitted after {fair:?}, unfair {unfair:?}");
    // Queued behind the one small request that arrived first, then 10 units.
    assert!(fair <= Duration::from_millis(1_100), "{fair:?}");
}

/// 64 waiters arrive 1 ms apart at a bucket of 10/s, burst 4; every
/// fourth costs 4, the others 1. The ideal is first come, first served at
/// the bucket's pace (`ideal`). Returns the largest lateness against it,
/// the longest wait, and the denied wake-ups.
async fn sixty_four(fair: bool, jitter: Duration) -> (Duration, Duration, u64) {
    let clock = TokioClock::new();
    let b = Arc::new(bucket(Rate::per_second(10).burst(4), &clock));
    let queue = Arc::new(FairQueue::new());
    let denied = Arc::new(AtomicU64::new(0));
    let origin = Instant::now();
    let ideal = ideal_fifo();
    let mut tasks = Vec::new();
    for (k, ideal_at) in ideal.into_iter().enumerate() {
        let (b, queue, denied) = (b.clone(), queue.clone(), denied.clone());
        tasks.push(tokio::spawn(async move {
            let arrived = Instant::now();
            let mut first = true;
            let attempt = move || {
                let d = b.check_n(cost(k)).unwrap();
                if !d.is_allowed() && !first {
                    denied.fetch_add(1, Ordering::Relaxed);
                }
                first = false;
                d
            };
            let wait = Wait::new().jitter(jitter);
            if fair {
                assert!(queue.until(&wait, attempt).await.unwrap().is_allowed());
            } else {
                assert!(wait.until(attempt).await.unwrap().is_allowed());
            }
            let admitted = Instant::now();
            (
                (admitted - origin).saturating_sub(ideal_at),
                admitted - arrived,
            )
        }));
        tokio::time::sleep(MS).await;
    }
    let (mut late, mut longest) = (Duration::ZERO, Duration::ZERO);
    for t in tasks {
        let (l, w) = t.await.unwrap();
        late = late.max(l);
        longest = longest.max(w);
    }
    (late, longest, denied.load(Ordering::Relaxed))
}

fn cost(k: usize) -> u64 {
    if k % 4 == 3 {
        4
    } else {
        1
    }
}

/// The reference: GCRA (T = 100 ms, burst 4) serving the 64 waiters in
/// arrival order (`k` ms), each as soon as the bucket allows.
fn ideal_fifo() -> Vec<Duration> {
    let (t_ns, burst) = (100_000_000u64, 4u64);
    let (mut tat, mut prev) = (0u64, 0u64);
    (0..64)
        .map(|k| {
            let n = cost(k);
            let mut at = prev.max(k as u64 * 1_000_000);
            let new = tat.max(at) + n * t_ns;
            at = at.max(new.saturating_sub(burst * t_ns));
            tat = tat.max(at) + n * t_ns;
            prev = at;
            Duration::from_nanos(at)
        })
        .collect()
}

#[tokio::test(start_paused = true)]
async fn sixty_four_waiters_fair_are_each_admitted_at_their_ideal_time() {
    let ideal_longest = ideal_fifo()
        .iter()
        .enumerate()
        .map(|(k, at)| *at - MS * k as u32)
        .max()
        .unwrap();
    let (late, longest, denied) = sixty_four(true, Duration::ZERO).await;
    let (u_late, u_longest, u_denied) = sixty_four(false, Duration::ZERO).await;
    let (j_late, j_longest, j_denied) = sixty_four(false, 10 * MS).await;
    println!(
        "64 waiters (every 4th of cost 4), 10/s burst 4, ideal longest wait {ideal_longest:?}:\n\
         fair:          latest vs ideal {late:?}, longest wait {longest:?}, denied wake-ups {denied}\n\
         unfair:        latest vs ideal {u_late:?}, longest wait {u_longest:?}, denied wake-ups {u_denied}\n\
         unfair+jitter: latest vs ideal {j_late:?}, longest wait {j_longest:?}, denied wake-ups {j_denied}"
    );
    assert_eq!(late, Duration::ZERO, "fair: every waiter at its ideal time");
    assert_eq!(longest, ideal_longest);
    assert_eq!(
        denied, 0,
        "fair: only the head tries, and it sleeps exactly its retry_after"
    );
    assert!(
        u_denied > 63,
        "unfair: a herd wakes for each unit ({u_denied})"
    );
    assert!(
        u_late > Duration::from_secs(1),
        "unfair: the large ones are overtaken ({u_late:?})"
    );
}

/// The issue's worker: 60 calls for 6 customers (call `i` for customer
/// `i % 6`), all started at once, under a global 10/s (burst 10) and a
/// per-customer 2/s (burst 2), all or nothing. The ideal finishes at 5 s
/// (the global limit: 10 at once, then one per 100 ms).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Worker {
    HandLoop,
    Until,
    Jitter,
    Fair,
}

async fn worker(mode: Worker) -> (u64, Duration) {
    let clock = TokioClock::new();
    let global = Arc::new(bucket(Rate::per_second(10).burst(10), &clock));
    let per_customer = Arc::new(keyed(Rate::per_second(2).burst(2), &clock));
    let queue = Arc::new(FairQueue::new());
    let denied = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..60u32 {
        let (global, per_customer, queue, denied) = (
            global.clone(),
            per_customer.clone(),
            queue.clone(),
            denied.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let customer = i % 6;
            let mut tries = 0u64;
            let mut attempt = move || {
                let d = check_all(&[&per_customer.with_key(&customer), &*global]);
                if !d.is_allowed() && tries > 0 {
                    denied.fetch_add(1, Ordering::Relaxed);
                }
                tries += 1;
                d
            };
            match mode {
                Worker::HandLoop => loop {
                    let d = attempt();
                    if d.is_allowed() {
                        break;
                    }
                    tokio::time::sleep(d.retry_after()).await;
                },
                Worker::Until => {
                    assert!(Wait::new().until(attempt).await.unwrap().is_allowed());
                }
                Worker::Jitter => {
                    assert!(Wait::new()
                        .jitter(100 * MS)
                        .until(attempt)
                        .await
                        .unwrap()
                        .is_allowed());
                }
                Worker::Fair => {
                    assert!(queue
                        .until(&Wait::new(), attempt)
                        .await
                        .unwrap()
                        .is_allowed());
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    (denied.load(Ordering::Relaxed), start.elapsed())
}

#[tokio::test(start_paused = true)]
async fn the_issues_worker_global_and_per_customer_waited_on_together() {
    let mut figures = Vec::new();
    for mode in [
        Worker::HandLoop,
        Worker::Until,
        Worker::Jitter,
        Worker::Fair,
    ] {
        let (denied, took) = worker(mode).await;
        println!("worker {mode:?}: {denied} denied wake-ups, 60 calls in {took:?} (ideal 5 s)");
        assert!(
            took >= Duration::from_secs(5),
            "never faster than the limits allow"
        );
        figures.push((denied, took));
    }
    assert_eq!(
        figures[0], figures[1],
        "Wait::until is the hand loop, written once"
    );
    let (fair_denied, fair_took) = figures[3];
    assert!(
        fair_denied * 4 < figures[0].0,
        "fair: {fair_denied} vs {}",
        figures[0].0
    );
    assert!(fair_took <= Duration::from_millis(5_500), "{fair_took:?}");
}

#[tokio::test(start_paused = true)]
async fn an_all_or_nothing_wait_takes_from_neither_until_both_admit() {
    let clock = TokioClock::new();
    let global = bucket(Rate::per_second(10).burst(10), &clock);
    let per_customer = keyed(Rate::per_second(1).burst(1), &clock);
    let _ = per_customer.check_key(&7);
    let start = Instant::now();
    let limits: [&dyn Limit<_>; 2] = [&per_customer.with_key(&7), &global];
    // The customer denies for a second; the global limit gave back each time.
    let fast = Wait::new()
        .timeout(500 * MS)
        .until(|| check_all_n(&limits, 1))
        .await;
    assert!(
        matches!(fast, Err(WaitError::Deadline { last: Some(d) }) if d.retry_after() == Duration::from_secs(1))
    );
    // `remaining` is after the peeked request: 9 of a full burst of 10.
    assert_eq!(
        global.peek().remaining(),
        9,
        "nothing taken from the global limit"
    );
    let d = Wait::new().until(|| check_all_n(&limits, 1)).await.unwrap();
    assert!(d.is_allowed());
    assert_eq!(start.elapsed(), Duration::from_secs(1));
    assert_eq!(global.peek().remaining(), 8);
}

/// Every local kind waits through the same call, on real time (1 ms apart).
#[tokio::test]
async fn every_limiter_kind_waits_through_the_one_call() {
    let rate = || Rate::per_second(1000).burst(1);
    let wait = Wait::new().timeout(Duration::from_secs(5));
    let single = TokenBucket::new(rate()).unwrap();
    let striped = StripedLimiter::new(rate()).unwrap();
    let keyed = KeyedTokenBucket::<u32>::builder(rate()).build().unwrap();
    let hot = KeyedTokenBucket::<u32>::builder(rate())
        .hot_keys(HotKeys::new(4))
        .build()
        .unwrap();
    let log = KeyedSlidingWindowLog::<u32>::builder(Window::new(1, MS))
        .build()
        .unwrap();
    let policy = KeyedPolicyLimiter::<u32>::new("1000/s soft 10%".parse().unwrap()).unwrap();
    let elastic = ElasticLimiter::<u32>::builder(
        "500/s".parse().unwrap(),
        "1000/s".parse().unwrap(),
        "1000/s".parse().unwrap(),
    )
    .build()
    .unwrap();
    let kinds: [(&str, &dyn Fn() -> ratewall::Decision); 7] = [
        ("single", &|| single.check()),
        ("striped", &|| striped.check()),
        ("keyed", &|| keyed.check_key(&1)),
        ("hot keys", &|| hot.check_key_n(&1, 1).unwrap()),
        ("sliding log", &|| log.check_key(&1)),
        ("policy, soft", &|| policy.check_key(&1)),
        ("elastic", &|| elastic.check_key(&1)),
    ];
    let start = std::time::Instant::now();
    for _ in 0..3 {
        for (name, try_once) in kinds {
            let d = wait.until(try_once).await.unwrap();
            assert!(d.is_allowed(), "{name}");
        }
    }
    // Each kind admitted 3 in a row at 1 per ms: at least 2 ms of waiting.
    assert!(start.elapsed() >= 2 * MS, "{:?}", start.elapsed());
}

/// Issue 32, item 1: one shape for a wait with a deadline. A rate, local
/// permits and keyed permits are all written `wait.until(x)`, and each
/// still keeps its deadline (a rate fails at once past it; a permit waits
/// to it and says no permit was released).
#[tokio::test(start_paused = true)]
async fn rates_local_permits_and_keyed_permits_wait_in_one_shape() {
    use ratewall::{ConcurrencyLimiter, KeyedConcurrencyLimiter};
    let clock = TokioClock(Instant::now());
    let wait = Wait::new().timeout(Duration::from_millis(100));

    let rate = bucket(Rate::per_second(10).burst(1), &clock);
    assert!(wait.until(|| rate.check()).await.unwrap().is_allowed());
    let started = Instant::now();
    assert!(wait.until(|| rate.check()).await.unwrap().is_allowed()); // 100 ms later
    assert_eq!(started.elapsed(), Duration::from_millis(100));
    assert!(matches!(
        Wait::new()
            .timeout(Duration::from_millis(10))
            .until(|| rate.check())
            .await,
        Err(WaitError::Deadline { last: Some(_) })
    ));

    let pool = ConcurrencyLimiter::new(2).unwrap();
    let two = wait.until(pool.acquire_n(2)).await.unwrap();
    assert_eq!(two.units(), 2);
    let started = Instant::now();
    let late = wait.until(pool.acquire()).await;
    assert!(matches!(
        late,
        Err(WaitError::NoPermit {
            requested: 1,
            max: 2,
            ..
        })
    ));
    assert_eq!(started.elapsed(), Duration::from_millis(100));
    drop(two);
    assert_eq!(wait.until(pool.acquire()).await.unwrap().units(), 1);

    let per_tenant = KeyedConcurrencyLimiter::<u32>::new(1).unwrap();
    let held = wait.until(|| per_tenant.try_acquire_key(&7)).await.unwrap();
    assert!(matches!(
        wait.until(|| per_tenant.try_acquire_key(&7)).await,
        Err(WaitError::NoPermit { requested: 1, .. })
    ));
    drop(held);
    assert!(wait
        .until(|| per_tenant.try_acquire_key_n(&7, 1))
        .await
        .is_ok());
}
