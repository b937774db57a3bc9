//! Store failure and recovery, reported once per transition: the
//! [`StoreEvent`] a Redis limiter reports when Redis stops answering its
//! checks (its [`FailurePolicy`] answers from then on) and when Redis
//! answers again, and the [`Watch`] that sees the transitions.
//!
//! # Protocol
//!
//! One word per limiter, 0 (Redis answers) or 1 (failing over), written
//! only under the limiter's outage lock. A check the failure policy
//! answers reads the word (one relaxed load while already failing) and,
//! seeing 0, takes the lock, reads it again, and if still 0 writes 1 and
//! reports [`StoreEvent::Failing`] before letting go of the lock. A check
//! Redis answers does the same the other way (one relaxed load on the
//! healthy path) and reports [`StoreEvent::Recovered`]. So however many
//! checks run during an outage, each transition is reported once, and
//! because a transition and its report happen under one lock, the events
//! alternate (`Failing`, `Recovered`, `Failing`, ...) even when a failing
//! call and an answered one race.
//!
//! # Where events go
//!
//! With the `tracing` feature, to `tracing` (target `ratewall::redis`:
//! `warn` when failing, `info` on recovery). To the hook set with
//! `on_store_event`, if any. With neither, one line on standard error per
//! transition (a library should not print, but a limit that silently stops
//! being shared is worse; set a hook to silence it). With the `metrics`
//! feature, the gauge `ratewall_redis_failing{limiter}` too.

use super::FailurePolicy;
#[cfg(feature = "metrics")]
use super::{DecisionSource, RedisDecision};
use crate::sync::{lock, AtomicU64, Mutex, Ordering};
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A Redis-backed limiter's change of state, reported once per transition
/// (never per check) to `tracing` (feature `tracing`), to the hook set with
/// `on_store_event`, or else on standard error. See `docs/operations.md`.
///
/// # Example
///
/// ```
/// use ratewall::redis::StoreEvent;
///
/// fn page(e: &StoreEvent) {
///     match e {
///         StoreEvent::Failing { limiter, cause, .. } => eprintln!("{limiter} lost Redis: {cause}"),
///         StoreEvent::Recovered { limiter, after, .. } => eprintln!("{limiter} back after {after:?}"),
///         _ => {}
///     }
/// }
/// # let _ = page;
/// ```
#[non_exhaustive]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreEvent {
    /// Redis stopped giving the limiter's checks decisions (refused, lost,
    /// no reply in time, the circuit breaker open, or an answer that is not
    /// a decision, such as `OOM`): its failure policy answers them from now
    /// on.
    #[non_exhaustive]
    Failing {
        /// The limiter's name.
        limiter: String,
        /// What answers instead: allow all (`Open`), errors (`Closed`), or
        /// a local limiter (`FallbackShare`, `Fallback`).
        policy: FailurePolicy,
        /// Why the first check could not reach Redis.
        cause: String,
    },
    /// Redis answers the limiter's checks again.
    #[non_exhaustive]
    Recovered {
        /// The limiter's name.
        limiter: String,
        /// The failure policy that answered meanwhile.
        policy: FailurePolicy,
        /// How long since the `Failing` event.
        after: Duration,
        /// How many checks the failure policy answered meanwhile.
        answered_locally: u64,
    },
}

impl fmt::Display for StoreEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreEvent::Failing {
                limiter,
                policy,
                cause,
            } => write!(
                f,
                "rate limiter `{limiter}`: Redis unavailable ({cause}); failing over to {policy:?}"
            ),
            StoreEvent::Recovered {
                limiter,
                after,
                answered_locally,
                ..
            } => write!(
                f,
                "rate limiter `{limiter}`: Redis answers again after {} ms ({answered_locally} checks answered by the failure policy)",
                after.as_millis()
            ),
        }
    }
}

/// A user's hook for [`StoreEvent`]s.
#[derive(Clone)]
pub(crate) struct Hook(pub(crate) Arc<dyn Fn(&StoreEvent) + Send + Sync>);

impl fmt::Debug for Hook {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Hook(..)")
    }
}

/// The state of an outage, under the lock (touched at transitions only).
struct Outage {
    since: Instant,
}

/// One limiter's transition detector and its reporting.
pub(crate) struct Watch {
    name: String,
    policy: FailurePolicy,
    /// 0: Redis answers; 1: failing over.
    failing: AtomicU64,
    /// Checks the failure policy answered in the current outage.
    local: AtomicU64,
    outage: Mutex<Option<Outage>>,
    hook: Option<Hook>,
    #[cfg(feature = "metrics")]
    metrics: crate::metrics::LimiterMetrics,
}

impl Watch {
    pub(crate) fn new(name: &str, policy: FailurePolicy, hook: Option<Hook>) -> Watch {
        Watch {
            name: name.to_owned(),
            policy,
            failing: AtomicU64::new(0),
            local: AtomicU64::new(0),
            outage: Mutex::new(None),
            hook,
            #[cfg(feature = "metrics")]
            metrics: crate::metrics::LimiterMetrics::new(name),
        }
    }

    #[cfg(feature = "metrics")]
    pub(crate) fn metrics(&self) -> &crate::metrics::LimiterMetrics {
        &self.metrics
    }

    /// Counts a decision by its source and outcome (feature `metrics`).
    #[cfg(feature = "metrics")]
    #[inline]
    pub(crate) fn decided(&self, d: &RedisDecision) {
        let source = match d.source() {
            DecisionSource::Redis => 0,
            DecisionSource::DenyCache => 1,
            DecisionSource::Fallback => 2,
            DecisionSource::FailOpen => 3,
            DecisionSource::Lease => 4,
        };
        self.metrics.decided(source, d.is_allowed());
    }

    /// Whether the limiter is failing over now.
    pub(crate) fn is_failing(&self) -> bool {
        // Relaxed: a report; it orders nothing else.
        self.failing.load(Ordering::Relaxed) == 1
    }

    /// A check the failure policy answered because Redis could not.
    pub(crate) fn unavailable(&self, cause: &str) {
        // Relaxed: a count, read at recovery; it publishes nothing.
        self.local.fetch_add(1, Ordering::Relaxed);
        // Relaxed: a hint; the word is written only under the lock, and
        // read again there before a transition.
        if self.failing.load(Ordering::Relaxed) == 0 {
            self.failed(cause);
        }
    }

    #[cold]
    fn failed(&self, cause: &str) {
        let mut outage = lock(&self.outage);
        // Relaxed: under the lock, which orders every write of the word.
        if self.failing.load(Ordering::Relaxed) == 1 {
            return; // another check reported it first
        }
        self.failing.store(1, Ordering::Relaxed);
        *outage = Some(Outage {
            since: Instant::now(),
        });
        // Reported under the lock: the next transition's event follows it.
        self.report(&StoreEvent::Failing {
            limiter: self.name.clone(),
            policy: self.policy,
            cause: cause.to_owned(),
        });
    }

    /// A check Redis answered.
    #[inline]
    pub(crate) fn answered(&self) {
        // Relaxed: as in `unavailable`; the healthy path is this one load.
        if self.failing.load(Ordering::Relaxed) == 1 {
            self.recovered();
        }
    }

    #[cold]
    fn recovered(&self) {
        let mut outage = lock(&self.outage);
        // Relaxed: under the lock, as in `failed`.
        if self.failing.load(Ordering::Relaxed) == 0 {
            return; // another check reported it first
        }
        self.failing.store(0, Ordering::Relaxed);
        let since = outage.take().map(|o| o.since);
        // Relaxed: see `unavailable`.
        let answered_locally = self.local.swap(0, Ordering::Relaxed);
        self.report(&StoreEvent::Recovered {
            limiter: self.name.clone(),
            policy: self.policy,
            after: since.map_or(Duration::ZERO, |s| s.elapsed()),
            answered_locally,
        });
    }

    fn report(&self, event: &StoreEvent) {
        #[cfg(feature = "metrics")]
        self.metrics
            .failing(matches!(event, StoreEvent::Failing { .. }));
        #[cfg(feature = "tracing")]
        match event {
            StoreEvent::Failing { .. } => {
                tracing::warn!(target: "ratewall::redis", limiter = %self.name, "{event}")
            }
            _ => tracing::info!(target: "ratewall::redis", limiter = %self.name, "{event}"),
        }
        match &self.hook {
            Some(hook) => (hook.0)(event),
            #[cfg(not(feature = "tracing"))]
            None => eprintln!("ratewall::redis: {event}"),
            #[cfg(feature = "tracing")]
            None => {}
        }
    }
}

impl fmt::Debug for Watch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Watch")
            .field("name", &self.name)
            .field("failing", &self.is_failing())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex as StdMutex;

    fn watched() -> (Watch, Arc<StdMutex<Vec<StoreEvent>>>) {
        let seen = Arc::new(StdMutex::new(Vec::new()));
        let s = seen.clone();
        let hook = Hook(Arc::new(move |e: &StoreEvent| {
            s.lock().unwrap().push(e.clone())
        }));
        (Watch::new("api", FailurePolicy::Open, Some(hook)), seen)
    }

    #[test]
    fn each_transition_is_reported_once() {
        let (w, seen) = watched();
        w.answered();
        assert!(seen.lock().unwrap().is_empty(), "healthy: nothing to say");
        for _ in 0..1000 {
            w.unavailable("refused");
        }
        assert!(w.is_failing());
        for _ in 0..1000 {
            w.answered();
        }
        assert!(!w.is_failing());
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 2, "{seen:?}");
        assert_eq!(
            seen[0],
            StoreEvent::Failing {
                limiter: "api".into(),
                policy: FailurePolicy::Open,
                cause: "refused".into()
            }
        );
        assert!(matches!(
            seen[1],
            StoreEvent::Recovered { answered_locally: 1000, ref limiter, .. } if limiter == "api"
        ));
        assert!(seen[1].to_string().contains("1000 checks"), "{}", seen[1]);
    }

    /// Failing and answered checks racing: the events still alternate,
    /// and the last one says what the state is.
    #[test]
    fn racing_transitions_alternate() {
        let (w, seen) = watched();
        std::thread::scope(|s| {
            s.spawn(|| {
                for _ in 0..2000 {
                    w.unavailable("timeout");
                }
            });
            s.spawn(|| {
                for _ in 0..2000 {
                    w.answered();
                }
            });
        });
        let seen = seen.lock().unwrap();
        for (i, e) in seen.iter().enumerate() {
            let failing = matches!(e, StoreEvent::Failing { .. });
            assert_eq!(failing, i % 2 == 0, "event {i} out of turn: {seen:?}");
        }
        assert_eq!(w.is_failing(), seen.len() % 2 == 1);
    }

    #[test]
    fn concurrent_failures_report_one_event() {
        let (w, seen) = watched();
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..500 {
                        w.unavailable("timeout");
                    }
                });
            }
        });
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..500 {
                        w.answered();
                    }
                });
            }
        });
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 2, "{seen:?}");
        assert!(matches!(
            seen[1],
            StoreEvent::Recovered {
                answered_locally: 2000,
                ..
            }
        ));
    }
}
