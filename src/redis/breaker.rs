//! The circuit breaker in front of Redis.
//!
//! ```text
//!            threshold failures in a row
//!  Closed ---------------------------------> Open (for cool_down)
//!    ^                                        | cool_down over: the next call
//!    | the probe succeeds                     v is the one probe
//!    +------------------------------------ HalfOpen --- the probe fails --> Open
//! ```
//!
//! While open, calls do not reach Redis: they get the failure policy at
//! once. A probe that never reports (its caller dropped the future) stops
//! counting after one call timeout, and the next call probes again.

use crate::sync::{lock, Mutex};
use std::fmt;
use std::time::{Duration, Instant};

#[derive(Clone, Copy, Debug)]
enum State {
    Closed { failures: u32 },
    Open { until: Instant },
    HalfOpen { since: Instant },
}

/// What the breaker lets a caller do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Permit {
    /// Call Redis.
    Call,
    /// Do not call Redis; it will be tried again in this long.
    Rejected { retry_in: Duration },
}

pub(crate) struct Breaker {
    state: Mutex<State>,
    threshold: u32,
    cool_down: Duration,
    probe_timeout: Duration,
    /// The state as a metric (feature `metrics`): 0 closed, 1 open, 2
    /// half-open; set at each change, under the lock.
    #[cfg(feature = "metrics")]
    gauge: Option<metrics::Gauge>,
}

impl Breaker {
    pub(crate) fn new(threshold: u32, cool_down: Duration, probe_timeout: Duration) -> Self {
        Breaker {
            state: Mutex::new(State::Closed { failures: 0 }),
            threshold: threshold.max(1),
            cool_down,
            probe_timeout,
            #[cfg(feature = "metrics")]
            gauge: None,
        }
    }

    /// The breaker, reporting its state to `gauge`.
    #[cfg(feature = "metrics")]
    pub(crate) fn with_gauge(mut self, gauge: metrics::Gauge) -> Self {
        gauge.set(0.0);
        self.gauge = Some(gauge);
        self
    }

    /// Reports a change of state to the gauge (feature `metrics`).
    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    #[inline]
    fn changed(&self, to: &State) {
        #[cfg(feature = "metrics")]
        if let Some(g) = &self.gauge {
            g.set(match to {
                State::Closed { .. } => 0.0,
                State::Open { .. } => 1.0,
                State::HalfOpen { .. } => 2.0,
            });
        }
    }

    pub(crate) fn acquire(&self, now: Instant) -> Permit {
        let mut state = lock(&self.state);
        match *state {
            State::Closed { .. } => Permit::Call,
            State::Open { until } if now < until => Permit::Rejected {
                retry_in: until - now,
            },
            State::HalfOpen { since } if now < since + self.probe_timeout => Permit::Rejected {
                retry_in: since + self.probe_timeout - now,
            },
            // Cool-down over, or the last probe went silent: this call probes.
            State::Open { .. } | State::HalfOpen { .. } => {
                *state = State::HalfOpen { since: now };
                self.changed(&state);
                Permit::Call
            }
        }
    }

    pub(crate) fn success(&self) {
        let mut state = lock(&self.state);
        if !matches!(*state, State::Closed { .. }) {
            self.changed(&State::Closed { failures: 0 });
        }
        *state = State::Closed { failures: 0 };
    }

    pub(crate) fn failure(&self, now: Instant) {
        let mut state = lock(&self.state);
        *state = match *state {
            State::Closed { failures } if failures + 1 < self.threshold => State::Closed {
                failures: failures + 1,
            },
            State::Open { until } => State::Open { until },
            _ => State::Open {
                until: now + self.cool_down,
            },
        };
        if matches!(*state, State::Open { until } if until == now + self.cool_down) {
            self.changed(&state);
        }
    }

    /// Whether calls are going to Redis now (closed), for reports.
    pub(crate) fn is_closed(&self) -> bool {
        matches!(*lock(&self.state), State::Closed { .. })
    }

    /// How long until Redis is tried again (zero when closed).
    pub(crate) fn retry_in(&self, now: Instant) -> Duration {
        match *lock(&self.state) {
            State::Closed { .. } => Duration::ZERO,
            State::Open { until } => until.saturating_duration_since(now),
            State::HalfOpen { since } => {
                (since + self.probe_timeout).saturating_duration_since(now)
            }
        }
    }
}

impl fmt::Debug for Breaker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Breaker")
            .field("state", &*lock(&self.state))
            .field("threshold", &self.threshold)
            .field("cool_down", &self.cool_down)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn opens_after_threshold_failures_then_probes_once_and_recovers() {
        let b = Breaker::new(3, 100 * MS, 10 * MS);
        let t0 = Instant::now();
        for _ in 0..2 {
            assert_eq!(b.acquire(t0), Permit::Call);
            b.failure(t0);
        }
        assert!(b.is_closed());
        b.failure(t0);
        assert!(!b.is_closed());
        assert_eq!(
            b.acquire(t0 + 40 * MS),
            Permit::Rejected { retry_in: 60 * MS }
        );
        // Cool-down over: exactly one probe goes through.
        assert_eq!(b.acquire(t0 + 100 * MS), Permit::Call);
        assert_eq!(
            b.acquire(t0 + 101 * MS),
            Permit::Rejected { retry_in: 9 * MS }
        );
        // The probe fails: open again for a whole cool-down.
        b.failure(t0 + 102 * MS);
        assert_eq!(
            b.acquire(t0 + 150 * MS),
            Permit::Rejected { retry_in: 52 * MS }
        );
        assert_eq!(b.acquire(t0 + 202 * MS), Permit::Call);
        b.success();
        assert!(b.is_closed());
        assert_eq!(b.acquire(t0 + 203 * MS), Permit::Call);
        assert_eq!(b.retry_in(t0), Duration::ZERO);
    }

    #[test]
    fn a_silent_probe_is_replaced_after_the_probe_timeout() {
        let b = Breaker::new(1, 100 * MS, 10 * MS);
        let t0 = Instant::now();
        b.failure(t0);
        assert_eq!(b.acquire(t0 + 100 * MS), Permit::Call); // the probe, then dropped
        assert!(matches!(b.acquire(t0 + 105 * MS), Permit::Rejected { .. }));
        assert_eq!(b.acquire(t0 + 110 * MS), Permit::Call);
    }

    #[test]
    fn a_success_resets_the_failure_count() {
        let b = Breaker::new(2, 100 * MS, 10 * MS);
        let t0 = Instant::now();
        b.failure(t0);
        b.success();
        b.failure(t0);
        assert!(b.is_closed(), "failures must be in a row");
        b.failure(t0);
        assert!(!b.is_closed());
    }
}
