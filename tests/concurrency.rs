//! `ConcurrencyLimiter`: the bound against a reference model, permits
//! released exactly once (drop, panic, a dropped future), priorities under
//! overload, bad input, and threads.

use proptest::prelude::*;
use ratewall::{
    Adaptive, ConcurrencyLimiter, ConfigError, InsufficientCapacity, ManualClock, OwnedPermit,
    Permit, Priority, MAX_PERMITS,
};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

fn limiter(max: u64) -> ConcurrencyLimiter<ManualClock> {
    ConcurrencyLimiter::builder(max)
        .clock(ManualClock::new())
        .build()
        .unwrap()
}

#[derive(Clone, Debug)]
enum Op {
    Acquire(u64, Priority),
    Release(usize),
    SetMax(u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0u64..8, prop_oneof![Just(Priority::Sheddable), Just(Priority::Normal), Just(Priority::Critical)])
            .prop_map(|(n, p)| Op::Acquire(n, p)),
        2 => (0usize..16).prop_map(Op::Release),
        1 => (1u64..12).prop_map(Op::SetMax),
    ]
}

/// The reference: a count, a maximum and the percent each class may fill.
struct Model {
    in_flight: u64,
    max: u64,
    cap_pct: [u64; 3],
}

impl Model {
    fn cap(&self, class: Priority) -> u64 {
        let pct = self.cap_pct[match class {
            Priority::Sheddable => 0,
            Priority::Normal => 1,
            _ => 2,
        }];
        if pct == 100 {
            self.max
        } else {
            (self.max * pct / 100).max(1)
        }
    }
}

proptest! {
    /// Any sequence of acquires, releases and maximum changes: the limiter
    /// admits exactly what the model admits, reports the same remaining,
    /// errors where the model says the cost can never pass, and the count
    /// returns to 0 when every permit is gone.
    #[test]
    fn matches_the_reference_model(
        max in 1u64..12,
        critical in 0u8..40,
        normal in 0u8..40,
        ops in proptest::collection::vec(op(), 1..60),
    ) {
        let l = ConcurrencyLimiter::builder(max)
            .keep_for(Priority::Critical, critical)
            .keep_for(Priority::Normal, normal)
            .clock(ManualClock::new())
            .build()
            .unwrap();
        let mut m = Model {
            in_flight: 0,
            max,
            cap_pct: [u64::from(100 - critical - normal), u64::from(100 - critical), 100],
        };
        let mut held: Vec<Permit<'_, ManualClock>> = Vec::new();
        for op in ops {
            match op {
                Op::Acquire(n, class) => {
                    let cap = m.cap(class);
                    match l.try_acquire_n_with(n, class) {
                        Err(e) => {
                            prop_assert!(n > cap);
                            prop_assert_eq!(e, InsufficientCapacity { requested: n, capacity: cap });
                        }
                        Ok(a) => {
                            prop_assert!(n <= cap);
                            let fits = m.in_flight + n <= cap;
                            prop_assert_eq!(a.is_allowed(), fits);
                            prop_assert_eq!(a.decision().limit(), m.max);
                            if fits {
                                m.in_flight += n;
                            }
                            prop_assert_eq!(a.decision().remaining(), cap.saturating_sub(m.in_flight));
                            // At the moment of admission, never above the maximum.
                            prop_assert!(!fits || m.in_flight <= m.max);
                            held.extend(a.into_permit());
                        }
                    }
                }
                Op::Release(i) => {
                    if !held.is_empty() {
                        let p = held.swap_remove(i % held.len());
                        m.in_flight -= p.units();
                    }
                }
                Op::SetMax(new) => {
                    l.set_max(new).unwrap();
                    m.max = new;
                }
            }
            prop_assert_eq!((l.in_flight(), l.max()), (m.in_flight, m.max));
        }
        drop(held);
        prop_assert_eq!(l.in_flight(), 0);
    }
}

#[test]
fn lowering_the_maximum_strands_nothing_and_raising_admits_at_once() {
    let l = limiter(4);
    let held: Vec<_> = (0..4).map(|_| l.try_acquire()).collect();
    assert!(held.iter().all(|a| a.is_allowed()));
    l.set_max(2).unwrap();
    let mut held: Vec<_> = held.into_iter().filter_map(|a| a.into_permit()).collect();
    // 4 out, max 2: nothing until 3 are back.
    for _ in 0..2 {
        held.pop();
        assert!(!l.try_acquire().is_allowed());
    }
    held.pop();
    let a = l.try_acquire();
    assert!(a.is_allowed());
    assert_eq!((a.decision().limit(), a.decision().remaining()), (2, 0));
    l.set_max(5).unwrap();
    assert!(l.try_acquire_n(3).unwrap().is_allowed());
}

#[test]
fn bad_input_gets_typed_errors() {
    assert_eq!(
        ConcurrencyLimiter::new(0).unwrap_err(),
        ConfigError::ZeroLimit
    );
    assert_eq!(
        ConcurrencyLimiter::new(MAX_PERMITS + 1).unwrap_err(),
        ConfigError::LimitTooLarge {
            limit: MAX_PERMITS + 1,
            max: MAX_PERMITS
        }
    );
    assert!(ConcurrencyLimiter::new(MAX_PERMITS).is_ok());
    let l = limiter(3);
    assert_eq!(
        l.try_acquire_n(4).unwrap_err(),
        InsufficientCapacity {
            requested: 4,
            capacity: 3
        }
    );
    assert_eq!(l.try_acquire_n(u64::MAX).unwrap_err().capacity, 3);
    assert_eq!(l.set_max(0).unwrap_err(), ConfigError::ZeroLimit);
    assert!(matches!(
        ConcurrencyLimiter::builder(3)
            .keep_for(Priority::Critical, 60)
            .keep_for(Priority::Normal, 40)
            .build(),
        Err(ConfigError::Incompatible { .. })
    ));
    let adaptive = ConcurrencyLimiter::builder(3)
        .adaptive(Adaptive::vegas(1, 10))
        .build()
        .unwrap();
    assert!(matches!(
        adaptive.set_max(4),
        Err(ConfigError::Incompatible { .. })
    ));
    for msg in [
        ConfigError::ZeroLimit.to_string(),
        l.try_acquire_n(9).unwrap_err().to_string(),
    ] {
        assert!(msg.contains("use") || msg.contains("raise"), "{msg}");
    }
}

#[test]
fn a_panic_releases_the_permit_once() {
    let l = Arc::new(limiter(2));
    let l2 = Arc::clone(&l);
    let r = std::thread::spawn(move || {
        let _p = l2.try_acquire_n(2).unwrap().into_permit().unwrap();
        assert_eq!(l2.in_flight(), 2);
        panic!("handler failed");
    })
    .join();
    assert!(r.is_err());
    assert_eq!(l.in_flight(), 0);
    assert!(l.try_acquire_n(2).unwrap().is_allowed());
}

#[test]
fn a_dropped_future_releases_its_permit() {
    let l = Arc::new(limiter(1));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let inner = Arc::clone(&l);
    let r = rt.block_on(async move {
        let held = async move {
            let _permit: OwnedPermit<ManualClock> =
                inner.try_acquire_owned().into_permit().unwrap();
            tokio::time::sleep(Duration::from_secs(3600)).await;
        };
        tokio::time::timeout(Duration::from_millis(20), held).await
    });
    assert!(r.is_err(), "the timeout cancelled the future");
    assert_eq!(l.in_flight(), 0);
    // And a permit moved into a spawned task comes back when the task ends.
    let p = l.try_acquire_owned().into_permit().unwrap();
    rt.block_on(async move { tokio::spawn(async move { drop(p) }).await })
        .unwrap();
    assert_eq!(l.in_flight(), 0);
}

#[test]
fn permits_are_send_and_owned_ones_static() {
    fn send<T: Send>() {}
    fn send_static<T: Send + 'static>() {}
    send::<Permit<'_, ManualClock>>();
    send_static::<OwnedPermit<ManualClock>>();
    send_static::<OwnedPermit>();
    send_static::<Arc<ConcurrencyLimiter>>();
}

/// Under overload by normal and sheddable traffic, every critical request
/// is admitted up to the critical share; sheddable requests are shed first.
#[test]
fn critical_requests_keep_their_share_under_overload() {
    let l = ConcurrencyLimiter::builder(100)
        .keep_for(Priority::Critical, 20)
        .keep_for(Priority::Normal, 30)
        .clock(ManualClock::new())
        .build()
        .unwrap();
    let mut held = Vec::new();
    let (mut normal, mut sheddable) = (0, 0);
    // 500 low-priority requests arrive first, interleaved.
    for i in 0..500 {
        let class = if i % 2 == 0 {
            Priority::Normal
        } else {
            Priority::Sheddable
        };
        let a = l.try_acquire_with(class);
        if a.is_allowed() {
            *if class == Priority::Normal {
                &mut normal
            } else {
                &mut sheddable
            } += 1;
        }
        held.extend(a.into_permit());
    }
    assert_eq!(l.in_flight(), 80, "the lower classes stop at 80%");
    // Sheddable requests stop once 50% is out (then 25 of each class),
    // normal ones go on to 80%.
    assert_eq!((sheddable, normal), (25, 55));
    // Now 20 critical requests: all admitted; the 21st is not.
    for _ in 0..20 {
        let a = l.try_acquire_with(Priority::Critical);
        assert!(a.is_allowed());
        held.extend(a.into_permit());
    }
    assert!(!l
        .try_acquire_n_with(1, Priority::Critical)
        .unwrap()
        .is_allowed());
    // A normal request still finds nothing, even after a critical one leaves.
    held.pop();
    assert!(!l.try_acquire().is_allowed());
    assert!(l
        .try_acquire_n_with(1, Priority::Critical)
        .unwrap()
        .is_allowed());
}

#[test]
fn a_denial_hints_the_mean_hold_time() {
    let clock = ManualClock::new();
    let l = ConcurrencyLimiter::builder(1)
        .clock(clock.clone())
        .build()
        .unwrap();
    assert_eq!(l.mean_hold_time(), Duration::ZERO);
    let p = l.try_acquire();
    clock.advance(Duration::from_millis(80));
    drop(p);
    assert_eq!(l.mean_hold_time(), Duration::from_millis(80));
    let _p = l.try_acquire();
    let denied = l.try_acquire().decision();
    assert!(!denied.is_allowed());
    assert_eq!(denied.retry_after(), Duration::from_millis(80));
    assert_eq!(denied.retry_after_secs(), 1);
}

/// Threads hammer a limit of 3 with permits of 1 and 2 units: a counter
/// raised after each admission and lowered before each release never
/// exceeds 3, and everything comes back.
#[test]
fn threads_never_exceed_the_maximum() {
    let l = Arc::new(ConcurrencyLimiter::new(3).unwrap());
    let out = Arc::new(AtomicU64::new(0));
    let peak = Arc::new(AtomicU64::new(0));
    let handles: Vec<_> = (0..4)
        .map(|t| {
            let (l, out, peak) = (Arc::clone(&l), Arc::clone(&out), Arc::clone(&peak));
            std::thread::spawn(move || {
                let mut admitted = 0u64;
                for i in 0..20_000u64 {
                    let n = 1 + (i + t) % 2;
                    if let Some(p) = l.try_acquire_n(n).unwrap().into_permit() {
                        let now = out.fetch_add(n, Ordering::SeqCst) + n;
                        peak.fetch_max(now, Ordering::SeqCst);
                        out.fetch_sub(n, Ordering::SeqCst);
                        drop(p);
                        admitted += 1;
                    }
                }
                admitted
            })
        })
        .collect();
    let admitted: u64 = handles.into_iter().map(|h| h.join().unwrap()).sum();
    assert!(admitted > 0);
    assert!(peak.load(Ordering::SeqCst) <= 3);
    assert_eq!(l.in_flight(), 0);
}

/// Issue 32, item 1: one permit needs no `Result` (a maximum is at least
/// 1), as `check()` needs none; `try_acquire_n` keeps it for costs.
#[test]
fn one_permit_is_an_acquisition_not_a_result() {
    use ratewall::{Acquisition, KeyedConcurrencyLimiter, OwnedPermit, Permit, Priority};
    use std::sync::Arc;
    let l = Arc::new(
        ConcurrencyLimiter::builder(2)
            .keep_for(Priority::Critical, 50)
            .build()
            .unwrap(),
    );
    let a: Acquisition<Permit<'_>> = l.try_acquire();
    assert!(a.is_allowed());
    let b: Acquisition<OwnedPermit> = l.try_acquire_owned();
    assert!(!b.is_allowed(), "Normal may fill 1 of 2");
    let c: Acquisition<Permit<'_>> = l.try_acquire_with(Priority::Critical);
    assert!(c.is_allowed());
    let d: Acquisition<OwnedPermit> = l.try_acquire_owned_with(Priority::Critical);
    assert!(!d.is_allowed());
    assert!(l.try_acquire_n(3).is_err());
    let keyed = KeyedConcurrencyLimiter::<u8>::new(1).unwrap();
    assert!(keyed.try_acquire_key(&1).is_allowed());
    assert!(keyed.try_acquire_key_n(&1, 2).is_err());
}
