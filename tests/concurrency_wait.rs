//! Waiting for a concurrency permit (`ConcurrencyLimiter::acquire`): woken
//! by releases, fair or not, classes, deadlines, cancellation; and a
//! property test of the queue against a reference model.

use proptest::prelude::*;
use ratewall::wait::{Wait, WaitError};
use ratewall::{ConcurrencyLimiter, InsufficientCapacity, ManualClock, Permit, Priority};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

/// A waker that counts its wakes.
#[derive(Default)]
struct Count(AtomicUsize);
impl Wake for Count {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

fn counter() -> (Arc<Count>, Waker) {
    let c = Arc::new(Count::default());
    (Arc::clone(&c), Waker::from(c))
}

fn poll<F: Future + Unpin>(f: &mut F, w: &Waker) -> Poll<F::Output> {
    Pin::new(f).poll(&mut Context::from_waker(w))
}

fn limiter(max: u64) -> ConcurrencyLimiter<ManualClock> {
    ConcurrencyLimiter::builder(max)
        .clock(ManualClock::new())
        .build()
        .unwrap()
}

fn fair(max: u64) -> ConcurrencyLimiter<ManualClock> {
    ConcurrencyLimiter::builder(max)
        .fair_waiting()
        .clock(ManualClock::new())
        .build()
        .unwrap()
}

fn held<C: ratewall::Clock>(l: &ConcurrencyLimiter<C>, n: u64) -> Permit<'_, C> {
    l.try_acquire_n(n).unwrap().into_permit().unwrap()
}

#[test]
fn a_release_wakes_the_waiter_once_and_hands_it_the_units() {
    let l = limiter(1);
    let first = held(&l, 1);
    let (count, w) = counter();
    let mut waiting = l.acquire();
    assert!(poll(&mut waiting, &w).is_pending());
    assert!(poll(&mut waiting, &w).is_pending());
    assert_eq!(count.0.load(Ordering::SeqCst), 0, "nobody polls: no wake");
    drop(first);
    assert_eq!(count.0.load(Ordering::SeqCst), 1, "the release wakes it");
    // The units moved to the waiter in the release: nobody can take them.
    assert_eq!(l.in_flight(), 1);
    assert!(!l.try_acquire().is_allowed());
    let Poll::Ready(Ok(permit)) = poll(&mut waiting, &w) else {
        panic!("served")
    };
    assert_eq!(permit.units(), 1);
    drop(permit);
    assert_eq!(l.in_flight(), 0);
    assert!(l.try_acquire().is_allowed());
}

#[test]
fn a_waiter_dropped_while_handed_a_permit_passes_it_on() {
    for fair_mode in [false, true] {
        let l = if fair_mode { fair(1) } else { limiter(1) };
        let first = held(&l, 1);
        let (a_count, a_w) = counter();
        let (b_count, b_w) = counter();
        let mut a = l.acquire();
        let mut b = l.acquire();
        assert!(poll(&mut a, &a_w).is_pending());
        assert!(poll(&mut b, &b_w).is_pending());
        drop(first); // served to `a` (first in line)
        assert_eq!(a_count.0.load(Ordering::SeqCst), 1);
        assert_eq!(b_count.0.load(Ordering::SeqCst), 0);
        drop(a); // never collected: back, and on to `b`
        assert_eq!(b_count.0.load(Ordering::SeqCst), 1, "fair={fair_mode}");
        assert_eq!(l.in_flight(), 1);
        drop(b); // collected by nobody either: back to the limiter
        assert_eq!(l.in_flight(), 0, "fair={fair_mode}");
        assert!(l.try_acquire().is_allowed());
    }
}

#[test]
fn a_waiter_dropped_while_queued_takes_nothing() {
    let l = fair(2);
    let first = held(&l, 2);
    let (_, w) = counter();
    let mut big = l.acquire_n(2);
    let (small_count, sw) = counter();
    let mut small = l.acquire();
    assert!(poll(&mut big, &w).is_pending());
    assert!(poll(&mut small, &sw).is_pending());
    drop(big);
    assert_eq!(small_count.0.load(Ordering::SeqCst), 0);
    drop(first);
    assert_eq!(small_count.0.load(Ordering::SeqCst), 1);
    let Poll::Ready(Ok(p)) = poll(&mut small, &sw) else {
        panic!("served")
    };
    assert_eq!((p.units(), l.in_flight()), (1, 1));
}

#[test]
fn fair_waiting_keeps_arrival_order_and_unfair_lets_small_ones_pass() {
    for fair_mode in [false, true] {
        let l = if fair_mode { fair(4) } else { limiter(4) };
        let ones: Vec<_> = (0..4).map(|_| held(&l, 1)).collect();
        let (_, w) = counter();
        let mut big = l.acquire_n(4);
        let mut small = l.acquire();
        assert!(poll(&mut big, &w).is_pending());
        assert!(poll(&mut small, &w).is_pending());
        let mut ones = ones.into_iter();
        drop(ones.next());
        // Fair: the big one is first and does not fit; the small one waits
        // behind it. Unfair: the small one fits and goes.
        let small_served = match poll(&mut small, &w) {
            Poll::Ready(r) => Some(r.unwrap()),
            Poll::Pending => None,
        };
        assert_eq!(small_served.is_some(), !fair_mode);
        // A fair newcomer does not pass the queue even when its unit is free.
        let mut newcomer = l.acquire();
        assert!(poll(&mut newcomer, &w).is_pending(), "fair={fair_mode}");
        drop(newcomer);
        drop(small);
        drop(small_served);
        drop(ones);
        let Poll::Ready(Ok(p)) = poll(&mut big, &w) else {
            panic!("the big one is served when all four are back")
        };
        assert_eq!((p.units(), l.in_flight()), (4, 4));
    }
}

#[test]
fn a_higher_class_is_served_first() {
    let l = limiter(2);
    let first = held(&l, 2);
    let (_, w) = counter();
    let mut normal = l.acquire();
    let mut critical = l.acquire().priority(Priority::Critical);
    assert!(poll(&mut normal, &w).is_pending());
    assert!(poll(&mut critical, &w).is_pending());
    let mut first = Some(first);
    // One unit back: to the critical waiter, though it came second.
    drop(first.take());
    assert!(poll(&mut critical, &w).is_ready());
    assert!(poll(&mut normal, &w).is_ready());
}

#[test]
fn a_class_waits_only_for_its_share() {
    let l = ConcurrencyLimiter::builder(10)
        .keep_for(Priority::Critical, 50)
        .clock(ManualClock::new())
        .build()
        .unwrap();
    let held5 = held(&l, 5); // Normal may fill 5 of 10
    let (_, w) = counter();
    let mut normal = l.acquire();
    assert!(poll(&mut normal, &w).is_pending());
    let critical = l.acquire_n(5).priority(Priority::Critical);
    let p = Wait::new().blocking(critical).unwrap();
    assert_eq!(l.in_flight(), 10);
    drop(p);
    assert!(
        poll(&mut normal, &w).is_pending(),
        "still over Normal's share"
    );
    drop(held5);
    assert!(poll(&mut normal, &w).is_ready());
}

#[test]
fn raising_the_maximum_serves_waiters_and_lowering_it_rules_out_those_that_cannot_fit() {
    let l = limiter(2);
    let first = held(&l, 2);
    let (count, w) = counter();
    let mut two = l.acquire_n(2);
    assert!(poll(&mut two, &w).is_pending());
    l.set_max(4).unwrap();
    assert_eq!(count.0.load(Ordering::SeqCst), 1);
    let Poll::Ready(Ok(two)) = poll(&mut two, &w) else {
        panic!("served")
    };
    let mut three = l.acquire_n(3);
    assert!(poll(&mut three, &w).is_pending());
    l.set_max(2).unwrap();
    assert_eq!(
        poll(&mut three, &w).map(|r| r.map(|p| p.units())),
        Poll::Ready(Err(InsufficientCapacity {
            requested: 3,
            capacity: 2
        }))
    );
    drop(first);
    assert_eq!((two.units(), l.in_flight()), (2, 2));
}

/// An adaptive limit that grows serves a waiter the release alone could
/// not: AIMD at 2, two permits of 1 out, a waiter of 2; one permit comes
/// back fast and busy, the limit grows to 2.5 (3 permits), and the
/// re-size serves the waiter (1 + 2 = 3).
#[test]
fn an_adaptive_limit_that_grows_serves_waiters() {
    let clock = ManualClock::new();
    let l = ConcurrencyLimiter::builder(2)
        .adaptive(ratewall::Adaptive::aimd(1, 10, Duration::from_secs(1)))
        .clock(clock.clone())
        .build()
        .unwrap();
    let (a, b) = (held(&l, 1), held(&l, 1));
    let (count, w) = counter();
    let mut two = l.acquire_n(2);
    assert!(poll(&mut two, &w).is_pending());
    clock.advance(Duration::from_millis(1));
    drop(a);
    assert_eq!(l.max(), 3);
    assert_eq!(count.0.load(Ordering::SeqCst), 1);
    let Poll::Ready(Ok(p)) = poll(&mut two, &w) else {
        panic!("served by the growth")
    };
    assert_eq!((p.units(), l.in_flight()), (2, 3));
    drop((p, b));
}

#[test]
fn a_cost_that_never_fits_is_an_error_at_once() {
    let l = limiter(2);
    let e = Wait::new().blocking(l.acquire_n(3)).unwrap_err();
    assert_eq!(
        e,
        WaitError::InsufficientCapacity(InsufficientCapacity {
            requested: 3,
            capacity: 2
        })
    );
}

#[test]
fn a_blocking_wait_never_passes_its_deadline_and_takes_nothing() {
    let l = ConcurrencyLimiter::new(1).unwrap();
    let first = held(&l, 1);
    let t = Instant::now();
    let e = Wait::new()
        .timeout(Duration::from_millis(30))
        .blocking(l.acquire())
        .unwrap_err();
    let took = t.elapsed();
    assert!(took >= Duration::from_millis(30), "{took:?}");
    assert!(took < Duration::from_secs(2), "{took:?}");
    let last = e.last_decision().expect("it tried at once");
    assert!(!last.is_allowed());
    assert_eq!(l.in_flight(), 1);
    drop(first);
    assert_eq!(l.in_flight(), 0);
    assert!(l.try_acquire().is_allowed());
}

#[test]
fn blocked_threads_are_woken_by_releases_and_never_exceed_the_maximum() {
    let l = ConcurrencyLimiter::builder(2)
        .fair_waiting()
        .build()
        .unwrap();
    let holders = AtomicU64::new(0);
    let most = AtomicU64::new(0);
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                for _ in 0..200 {
                    let p = Wait::new().blocking(l.acquire()).unwrap();
                    let now = holders.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    std::thread::yield_now();
                    holders.fetch_sub(1, Ordering::SeqCst);
                    drop(p);
                }
            });
        }
    });
    assert!(most.load(Ordering::SeqCst) <= 2);
    assert_eq!(l.in_flight(), 0);
    assert!(l.try_acquire_n(2).unwrap().is_allowed());
}

#[cfg(feature = "wait")]
mod with_tokio {
    use super::*;

    /// 8 tasks on a limit of 2, each holding 10 ms: every one gets through,
    /// at most 2 at once, and the run takes the ideal 40 ms (paused time).
    #[tokio::test(start_paused = true)]
    async fn eight_tasks_on_a_limit_of_two_go_through_two_at_a_time() {
        let l = Arc::new(ConcurrencyLimiter::new(2).unwrap());
        let holders = Arc::new(AtomicU64::new(0));
        let most = Arc::new(AtomicU64::new(0));
        let t = tokio::time::Instant::now();
        let tasks: Vec<_> = (0..8)
            .map(|_| {
                let (l, holders, most) = (Arc::clone(&l), Arc::clone(&holders), Arc::clone(&most));
                tokio::spawn(async move {
                    // `wait`'s future is `Send` too: it runs in a spawned task.
                    let wait = Wait::new().timeout(Duration::from_secs(1));
                    let p = wait.until(l.acquire_owned()).await.unwrap();
                    let now = holders.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    holders.fetch_sub(1, Ordering::SeqCst);
                    drop(p);
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(most.load(Ordering::SeqCst), 2);
        assert_eq!(t.elapsed(), Duration::from_millis(40));
        assert_eq!(l.in_flight(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn the_deadline_is_kept_to_the_tick_and_a_late_release_is_not_lost() {
        let l = ConcurrencyLimiter::new(1).unwrap();
        let first = held(&l, 1);
        let t = tokio::time::Instant::now();
        let wait = Wait::new().timeout(Duration::from_millis(50));
        let e = wait.until(l.acquire()).await.unwrap_err();
        assert!(matches!(e, WaitError::NoPermit { last: Some(_), .. }));
        assert_eq!(t.elapsed(), Duration::from_millis(50));
        assert_eq!(l.in_flight(), 1);
        // Released during the next wait: admitted then, not at the deadline.
        let (p, ()) = tokio::join!(wait.until(l.acquire()), async {
            tokio::time::sleep(Duration::from_millis(20)).await;
            drop(first);
        });
        assert!(p.is_ok());
        assert_eq!(t.elapsed(), Duration::from_millis(70));
    }

    #[tokio::test(start_paused = true)]
    async fn a_wait_cancelled_by_select_takes_nothing() {
        let l = ConcurrencyLimiter::new(1).unwrap();
        let first = held(&l, 1);
        tokio::select! {
            _ = l.acquire() => panic!("no room"),
            _ = tokio::time::sleep(Duration::from_millis(5)) => {}
        }
        drop(first);
        assert_eq!(l.in_flight(), 0);
        assert!(l.try_acquire().is_allowed());
    }
}

/// What the test does next, to the limiter and to the model alike.
#[derive(Clone, Debug)]
enum Op {
    /// A new waiter of `n` units and class `c` (0..3), polled once.
    Wait(u64, u8),
    /// The holder at this index (mod the count) releases.
    Release(usize),
    /// The waiter at this index (mod the count) is dropped.
    Cancel(usize),
    /// A new maximum.
    SetMax(u64),
}

fn class(c: u8) -> Priority {
    [Priority::Sheddable, Priority::Normal, Priority::Critical][usize::from(c % 3)]
}

/// The reference model: a list of waiters in service order, served in a
/// loop after every change, fair (stop at the first that does not fit) or
/// not; a waiter over its cap is ruled out.
#[derive(Debug, Default)]
struct Model {
    max: u64,
    in_flight: u64,
    /// (id, units, class index, share of max in percent)
    queue: Vec<(usize, u64, u8)>,
    fair: bool,
}

impl Model {
    fn cap(&self, c: u8) -> u64 {
        // Shares as the limiter below is built: Critical 100%, Normal 80%, Sheddable 50%.
        let pct = [50, 80, 100][usize::from(c % 3)];
        if pct == 100 {
            self.max
        } else {
            (self.max * pct / 100).max(1)
        }
    }
    /// Serves whoever fits; returns (id, Ok(units) | Err(())).
    fn drain(&mut self) -> Vec<(usize, Result<u64, ()>)> {
        let mut out = Vec::new();
        let mut i = 0;
        while i < self.queue.len() {
            let (id, n, c) = self.queue[i];
            let cap = self.cap(c);
            if n > cap {
                self.queue.remove(i);
                out.push((id, Err(())));
            } else if self.in_flight + n <= cap {
                self.queue.remove(i);
                self.in_flight += n;
                out.push((id, Ok(n)));
            } else if self.fair {
                break;
            } else {
                i += 1;
            }
        }
        out
    }
    fn enqueue(&mut self, id: usize, n: u64, c: u8) {
        let at = self
            .queue
            .iter()
            .position(|&(_, _, q)| (q % 3) < (c % 3))
            .unwrap_or(self.queue.len());
        self.queue.insert(at, (id, n, c));
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Every waiter is served exactly when the model serves it, with the
    /// same units, the count always matches, and at the end (everything
    /// released or dropped) the count is back to 0 with nobody queued.
    #[test]
    fn the_queue_serves_as_the_model_does(
        fair_mode in any::<bool>(),
        ops in proptest::collection::vec(prop_oneof![
            (1..=4u64, 0..3u8).prop_map(|(n, c)| Op::Wait(n, c)),
            any::<usize>().prop_map(Op::Release),
            any::<usize>().prop_map(Op::Cancel),
            (1..=6u64).prop_map(Op::SetMax),
        ], 1..40)
    ) {
        let mut b = ConcurrencyLimiter::builder(4)
            .keep_for(Priority::Critical, 20)
            .keep_for(Priority::Normal, 30)
            .clock(ManualClock::new());
        if fair_mode {
            b = b.fair_waiting();
        }
        let l = b.build().unwrap();
        let mut m = Model { max: 4, fair: fair_mode, ..Model::default() };
        let (_, w) = counter();
        let mut holders: Vec<Permit<'_, ManualClock>> = Vec::new();
        let mut waiting: Vec<(usize, ratewall::Acquire<'_, ManualClock>)> = Vec::new();
        let mut next_id = 0;
        for op in ops {
            let served = match op {
                Op::Wait(n, c) => {
                    let id = next_id;
                    next_id += 1;
                    let mut a = l.acquire_n(n).priority(class(c));
                    // The limiter tries at once (unless fair with a queue),
                    // else queues; the model: join, then serve.
                    let model_try_at_once = !fair_mode || m.queue.is_empty();
                    let cap = m.cap(c);
                    let expect = if n > cap {
                        vec![(id, Err(()))]
                    } else if model_try_at_once && m.in_flight + n <= cap {
                        m.in_flight += n;
                        vec![(id, Ok(n))]
                    } else {
                        m.enqueue(id, n, c);
                        m.drain()
                    };
                    let mine = expect.iter().position(|&(e, _)| e == id);
                    match poll(&mut a, &w) {
                        Poll::Ready(Ok(p)) => {
                            prop_assert_eq!(mine.map(|i| expect[i].1), Some(Ok(p.units())), "waiter {} served at once", id);
                            holders.push(p);
                        }
                        Poll::Ready(Err(_)) => prop_assert_eq!(mine.map(|i| expect[i].1), Some(Err(())), "waiter {} ruled out", id),
                        Poll::Pending => {
                            prop_assert!(mine.is_none(), "waiter {} queued, the model served it", id);
                            waiting.push((id, a));
                        }
                    }
                    expect
                }
                Op::Release(i) if !holders.is_empty() => {
                    let p = holders.swap_remove(i % holders.len());
                    m.in_flight -= p.units();
                    drop(p);
                    m.drain()
                }
                Op::Cancel(i) if !waiting.is_empty() => {
                    let (id, a) = waiting.swap_remove(i % waiting.len());
                    m.queue.retain(|&(q, _, _)| q != id);
                    drop(a);
                    m.drain()
                }
                Op::SetMax(max) => {
                    l.set_max(max).unwrap();
                    m.max = max;
                    m.drain()
                }
                _ => Vec::new(),
            };
            // Collect what the limiter served; compare with the model.
            for (id, expect) in served {
                if let Some(at) = waiting.iter().position(|(q, _)| *q == id) {
                    let (_, mut a) = waiting.swap_remove(at);
                    match (poll(&mut a, &w), expect) {
                        (Poll::Ready(Ok(p)), Ok(n)) => {
                            prop_assert_eq!(p.units(), n);
                            holders.push(p);
                        }
                        (Poll::Ready(Err(_)), Err(())) => {}
                        (got, want) => prop_assert!(false, "waiter {}: got {:?}, model {:?}", id, got.map(|r| r.map(|p| p.units())), want),
                    }
                }
            }
            for (id, a) in &mut waiting {
                prop_assert!(poll(a, &w).is_pending(), "waiter {} served early", id);
            }
            prop_assert_eq!(l.in_flight(), m.in_flight);
        }
        drop(waiting);
        drop(holders);
        prop_assert_eq!(l.in_flight(), 0);
        // Nobody queued: a fair newcomer tries at once.
        prop_assert!(Wait::new().timeout(Duration::ZERO).blocking(l.acquire().priority(Priority::Critical)).is_ok());
    }
}
