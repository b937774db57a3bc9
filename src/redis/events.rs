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
//! While the word stays 1, a failed call compares the time with the next
//! summary's (one relaxed load) and, when it is due, takes the lock, reads
//! both again and reports [`StoreEvent::StillFailing`]: at most one line a
//! minute however long the outage and however many calls fail. The calls
//! of every limiter come through one door (`door.rs`), which tells the
//! watch what each call came to.
//!
//! # Where events go
//!
//! With the `tracing` feature, to `tracing` (target `ratewall::redis`:
//! `warn` when failing and still failing, `info` on recovery). To the hook set with
//! `on_store_event`, if any. With neither, one line on standard error per
//! transition (a library should not print, but a limit that silently stops
//! being shared is worse; set a hook to silence it). With the `metrics`
//! feature, the gauge `ratewall_redis_failing{limiter}` too.

use super::FailurePolicy;
#[cfg(feature = "metrics")]
use super::{DecisionSource, RedisDecision};
use crate::sync::{lock, AtomicU64, Mutex, Ordering};
use crate::wording::{plural, Millis};
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
    /// Redis still does not answer: one summary per minute of an outage
    /// that goes on (never one per check).
    #[non_exhaustive]
    StillFailing {
        /// The limiter's name.
        limiter: String,
        /// What answers instead.
        policy: FailurePolicy,
        /// Why the latest call could not reach Redis.
        cause: String,
        /// How long since the `Failing` event.
        after: Duration,
        /// How many checks the failure policy answered so far in this
        /// outage.
        answered_locally: u64,
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
                "rate limiter `{limiter}`: Redis unavailable ({cause}); failing over to {}",
                FailingOver(policy)
            ),
            StoreEvent::StillFailing {
                limiter,
                cause,
                after,
                answered_locally,
                ..
            } => write!(
                f,
                "rate limiter `{limiter}`: Redis still unavailable after {} ({cause}); {} answered by the failure policy so far",
                plural(after.as_secs(), "second"),
                plural(*answered_locally, "check")
            ),
            StoreEvent::Recovered {
                limiter,
                after,
                answered_locally,
                ..
            } => write!(
                f,
                "rate limiter `{limiter}`: Redis answers again after {} ({} answered by the failure policy)",
                Millis(*after),
                plural(*answered_locally, "check")
            ),
        }
    }
}

/// What a failure policy does, in the words of a configuration file's
/// `on_failure` (which a reader who wrote Rust understands as well): "open:
/// admitting every check", not `Open`.
struct FailingOver<'a>(&'a FailurePolicy);

impl fmt::Display for FailingOver<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            FailurePolicy::Open => f.write_str("open: admitting every check"),
            FailurePolicy::Closed => f.write_str("closed: every check fails as unavailable"),
            FailurePolicy::FallbackShare { instances } => write!(
                f,
                "fallback-share {instances}: limiting locally at this instance's share of the limit among {}",
                plural(u64::from(*instances), "instance")
            ),
            FailurePolicy::Fallback(p) => write!(f, "fallback {p}: limiting locally at {p}"),
        }
    }
}

/// How often an outage that goes on is summarized
/// ([`StoreEvent::StillFailing`]).
const SUMMARY_EVERY: Duration = Duration::from_secs(60);

fn duration_ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
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
    /// When (ns since `base`) the next summary line of an outage is due.
    next_summary: AtomicU64,
    base: Instant,
    summary_every: Duration,
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
            next_summary: AtomicU64::new(u64::MAX),
            base: Instant::now(),
            summary_every: SUMMARY_EVERY,
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

    /// A call Redis did not answer (see `door.rs`): the transition into
    /// failing over, reported once; while failing, at most one summary
    /// line per [`SUMMARY_EVERY`].
    pub(crate) fn failed(&self, cause: &str) {
        // Relaxed: a hint; the word is written only under the lock, and
        // read again there before a transition.
        if self.failing.load(Ordering::Relaxed) == 0 {
            self.start_failing(cause);
        } else if self.since_base() >= self.next_summary.load(Ordering::Relaxed) {
            // Relaxed: a hint too; `summary` reads it again under the lock.
            self.summary(cause);
        }
    }

    /// A check the failure policy answered because Redis could not.
    pub(crate) fn answered_locally(&self) {
        // Relaxed: a count, read at recovery and in summaries; it
        // publishes nothing.
        self.local.fetch_add(1, Ordering::Relaxed);
    }

    /// Nanoseconds since this watch was made (the summaries' time base).
    fn since_base(&self) -> u64 {
        u64::try_from(self.base.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    #[cold]
    fn start_failing(&self, cause: &str) {
        let mut outage = lock(&self.outage);
        // Relaxed: under the lock, which orders every write of the word.
        if self.failing.load(Ordering::Relaxed) == 1 {
            return; // another call reported it first
        }
        self.failing.store(1, Ordering::Relaxed);
        *outage = Some(Outage {
            since: Instant::now(),
        });
        // Relaxed: written and read again under the lock; elsewhere a hint.
        self.next_summary.store(
            self.since_base()
                .saturating_add(duration_ns(self.summary_every)),
            Ordering::Relaxed,
        );
        // Reported under the lock: the next transition's event follows it.
        self.report(&StoreEvent::Failing {
            limiter: self.name.clone(),
            policy: self.policy,
            cause: cause.to_owned(),
        });
    }

    /// The line that says an outage goes on: one per `summary_every`,
    /// however many calls fail meanwhile.
    #[cold]
    fn summary(&self, cause: &str) {
        let outage = lock(&self.outage);
        let now = self.since_base();
        // Relaxed: under the lock, as in `start_failing`.
        if self.failing.load(Ordering::Relaxed) == 0
            || now < self.next_summary.load(Ordering::Relaxed)
        {
            return; // recovered meanwhile, or another call said it
        }
        self.next_summary.store(
            now.saturating_add(duration_ns(self.summary_every)),
            Ordering::Relaxed,
        );
        let event = StoreEvent::StillFailing {
            limiter: self.name.clone(),
            policy: self.policy,
            cause: cause.to_owned(),
            // Relaxed: see `answered_locally`.
            answered_locally: self.local.load(Ordering::Relaxed),
            after: outage
                .as_ref()
                .map_or(Duration::ZERO, |o| o.since.elapsed()),
        };
        self.report(&event);
    }

    /// A call Redis answered (see `door.rs`): the transition out of
    /// failing over, reported once.
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
            return; // another call reported it first
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
        match event {
            StoreEvent::Failing { .. } => self.metrics.failing(true),
            StoreEvent::Recovered { .. } => self.metrics.failing(false),
            StoreEvent::StillFailing { .. } => {}
        }
        #[cfg(feature = "tracing")]
        match event {
            StoreEvent::Failing { .. } | StoreEvent::StillFailing { .. } => {
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

    /// A check the failure policy answered, as the door reports it.
    fn unavailable(w: &Watch, cause: &str) {
        w.failed(cause);
        w.answered_locally();
    }

    /// An outage that goes on is summarized once per interval, however
    /// many calls fail; a recovery ends the summaries and says the total.
    #[test]
    fn a_long_outage_is_summarized_once_per_interval() {
        let (mut w, seen) = watched();
        w.summary_every = Duration::from_millis(40);
        for _ in 0..500 {
            unavailable(&w, "refused");
        }
        assert_eq!(
            seen.lock().unwrap().len(),
            1,
            "only the Failing event so far"
        );
        std::thread::sleep(Duration::from_millis(60));
        for _ in 0..500 {
            unavailable(&w, "refused");
        }
        w.answered();
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 3, "{seen:?}");
        match &seen[1] {
            StoreEvent::StillFailing {
                answered_locally,
                after,
                ..
            } => {
                assert_eq!(
                    *answered_locally, 500,
                    "said by the first call past the interval"
                );
                assert!(*after >= Duration::from_millis(40), "{after:?}");
            }
            other => panic!("{other:?}"),
        }
        assert!(
            seen[1].to_string().contains("still unavailable"),
            "{}",
            seen[1]
        );
        assert!(matches!(
            seen[2],
            StoreEvent::Recovered {
                answered_locally: 1000,
                ..
            }
        ));
        // One check is one check.
        let one = StoreEvent::Recovered {
            limiter: "api".into(),
            policy: FailurePolicy::Open,
            after: Duration::from_millis(3),
            answered_locally: 1,
        };
        assert!(one.to_string().contains("(1 check answered"), "{one}");
    }

    /// A summary rechecks under the lock: none after a recovery, none
    /// before it is due (another call said it), whatever the hint said.
    #[test]
    fn a_summary_says_nothing_after_a_recovery_or_before_it_is_due() {
        let (mut w, seen) = watched();
        w.summary_every = Duration::from_millis(20);
        unavailable(&w, "refused");
        w.answered();
        std::thread::sleep(Duration::from_millis(30));
        // Due, but recovered: a call that read the word before the
        // recovery and reaches the lock after it.
        w.summary("refused");
        let after_recovery = seen.lock().unwrap().clone();
        assert_eq!(after_recovery.len(), 2, "{after_recovery:?}");
        // Failing again, not yet due.
        w.summary_every = Duration::from_secs(3600);
        unavailable(&w, "refused");
        w.summary("refused");
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 3, "{seen:?}");
        assert!(matches!(seen[2], StoreEvent::Failing { .. }));
    }

    /// To `tracing`: failing and still failing are warnings, a recovery is
    /// information; `Debug` names the limiter and its state.
    #[cfg(feature = "tracing")]
    #[test]
    fn events_go_to_tracing_at_their_levels() {
        #[derive(Clone, Default)]
        struct Lines(Arc<StdMutex<Vec<u8>>>);
        impl std::io::Write for Lines {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let lines = Lines::default();
        let writer = lines.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .with_max_level(tracing::Level::INFO)
            .finish();
        let mut w = Watch::new("logged", FailurePolicy::Closed, None);
        w.summary_every = Duration::ZERO;
        tracing::subscriber::with_default(subscriber, || {
            unavailable(&w, "refused");
            unavailable(&w, "refused");
            w.answered();
        });
        let text = String::from_utf8(lines.0.lock().unwrap().clone()).unwrap();
        let levels: Vec<&str> = text
            .lines()
            .map(|l| {
                if l.contains(" WARN ") {
                    "warn"
                } else if l.contains(" INFO ") {
                    "info"
                } else {
                    "?"
                }
            })
            .collect();
        assert_eq!(levels, ["warn", "warn", "info"], "{text}");
        assert!(text.contains("still unavailable"), "{text}");
        let shown = format!("{w:?}");
        assert!(
            shown.contains("logged") && shown.contains("failing: false"),
            "{shown}"
        );
    }

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
            unavailable(&w, "refused");
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
        // The policy in words, not its Rust Debug form.
        assert_eq!(
            seen[0].to_string(),
            "rate limiter `api`: Redis unavailable (refused); failing over to open: admitting every check"
        );
        let share = StoreEvent::Failing {
            limiter: "api".into(),
            policy: FailurePolicy::FallbackShare { instances: 1 },
            cause: "refused".into(),
        };
        assert!(share.to_string().ends_with("fallback-share 1: limiting locally at this instance's share of the limit among 1 instance"), "{share}");
    }

    /// Failing and answered checks racing: the events still alternate,
    /// and the last one says what the state is.
    #[test]
    fn racing_transitions_alternate() {
        let (w, seen) = watched();
        std::thread::scope(|s| {
            s.spawn(|| {
                for _ in 0..2000 {
                    unavailable(&w, "timeout");
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
                        unavailable(&w, "timeout");
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
