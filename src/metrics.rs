//! Glue to the `metrics` facade (feature `metrics`): the name of every
//! metric ratewall reports, in one place, and the handle sets the HTTP
//! layer and the Redis limiters register once, when they are built. Users
//! install the recorder (exporter) they like: Prometheus, OpenTelemetry,
//! statsd. `docs/operations.md` says what each metric means and what to
//! alert on.
//!
//! Handles are registered with the recorder installed **when the layer or
//! limiter is built** (`metrics` hands out no-op handles before a recorder
//! is installed): install the exporter first.
//!
//! Labels are bounded: a rule, limiter or backend name, an outcome, a
//! decision source; never a key.

#[cfg(feature = "tower")]
use crate::decision::{Decision, Tracking};
#[cfg(feature = "redis")]
use ::metrics::histogram;
#[allow(unused_imports)] // which are used depends on `tower` and `redis`
use ::metrics::{counter, gauge, Counter, Gauge, Histogram};

/// HTTP requests per rule and outcome (`rule`, `outcome`).
#[cfg(feature = "tower")]
pub(crate) const HTTP_REQUESTS: &str = "ratewall_http_requests_total";
/// Keys a rule's full table evicted to make room (`rule`).
#[cfg(feature = "tower")]
pub(crate) const HTTP_EVICTIONS: &str = "ratewall_http_evictions_total";
/// Keys a rule's table holds, sampled every [`OCCUPANCY_EVERY`] admitted
/// requests (`rule`, `tier`).
#[cfg(feature = "tower")]
pub(crate) const HTTP_TABLE_KEYS: &str = "ratewall_http_table_keys";
/// The most keys a rule's table holds (`rule`, `tier`), set once at build.
#[cfg(feature = "tower")]
pub(crate) const HTTP_TABLE_CAPACITY: &str = "ratewall_http_table_capacity";
/// Decisions of a Redis limiter (`limiter`, `source`, `outcome`).
#[cfg(feature = "redis")]
pub(crate) const REDIS_DECISIONS: &str = "ratewall_redis_decisions_total";
/// Checks a fail-closed Redis limiter answered with an error (`limiter`).
#[cfg(feature = "redis")]
pub(crate) const REDIS_UNAVAILABLE: &str = "ratewall_redis_unavailable_total";
/// 1 while a Redis limiter fails over, 0 once Redis answers (`limiter`).
#[cfg(feature = "redis")]
pub(crate) const REDIS_FAILING: &str = "ratewall_redis_failing";
/// Calls a backend sent to Redis (`backend`): scripts, batches, commands.
#[cfg(feature = "redis")]
pub(crate) const STORE_CALLS: &str = "ratewall_redis_calls_total";
/// Calls that failed (`backend`, `kind`: `outage` (the store could not
/// give a decision), `reply` (an error about the call's own key),
/// `breaker_open`).
#[cfg(feature = "redis")]
pub(crate) const STORE_ERRORS: &str = "ratewall_redis_call_errors_total";
/// Seconds from sending a call to its reply or failure (`backend`).
#[cfg(feature = "redis")]
pub(crate) const STORE_LATENCY: &str = "ratewall_redis_call_seconds";
/// Checks per batched script call (`backend`).
#[cfg(feature = "redis")]
pub(crate) const STORE_BATCH: &str = "ratewall_redis_batch_size";
/// The circuit breaker: 0 closed, 1 open, 2 half-open (`backend`).
#[cfg(feature = "redis")]
pub(crate) const STORE_BREAKER: &str = "ratewall_redis_breaker_state";

/// A concurrency rule's maximum permits in flight (`rule`): an adaptive
/// rule's current maximum.
#[cfg(feature = "tower")]
pub(crate) const HTTP_CONCURRENCY_MAX: &str = "ratewall_http_concurrency_max";

/// How often (in admitted requests of a rule) its table's occupancy is read.
#[cfg(feature = "tower")]
pub(crate) const OCCUPANCY_EVERY: u64 = 1024;

/// A counter of [`HTTP_REQUESTS`] for one rule and outcome.
#[cfg(feature = "tower")]
pub(crate) fn http_outcome(rule: &str, outcome: &'static str) -> Counter {
    counter!(HTTP_REQUESTS, "rule" => rule.to_owned(), "outcome" => outcome)
}

/// What an HTTP rule reports beyond its `RuleStats` counters (the HTTP
/// layer's): requests above the nominal limit, a full table's rejections
/// (`outcome` `above_limit` and `rejected_full`, each also counted in
/// `allowed` or `denied`), evictions and occupancy.
#[cfg(feature = "tower")]
pub(crate) struct HttpExtra {
    above_limit: Counter,
    rejected_full: Counter,
    evictions: Counter,
    keys: Gauge,
}

#[cfg(feature = "tower")]
impl HttpExtra {
    /// `tier`: which of the rule's tables this is (`""`: the rule's own
    /// policy; a premium tier has a table of its own, so its occupancy is
    /// its own gauge).
    pub(crate) fn new(rule: &str, tier: &str, max_keys: Option<usize>) -> HttpExtra {
        let table =
            |name: &'static str| gauge!(name, "rule" => rule.to_owned(), "tier" => tier.to_owned());
        if let Some(max) = max_keys {
            table(HTTP_TABLE_CAPACITY).set(max as f64);
        }
        HttpExtra {
            above_limit: http_outcome(rule, "above_limit"),
            rejected_full: http_outcome(rule, "rejected_full"),
            evictions: counter!(HTTP_EVICTIONS, "rule" => rule.to_owned()),
            keys: table(HTTP_TABLE_KEYS),
        }
    }

    /// A denial, with the rule's decision if it has one.
    pub(crate) fn denied(&self, decision: Option<Decision>) {
        if decision.is_some_and(|d| d.tracking() == Tracking::Rejected) {
            self.rejected_full.increment(1);
        }
    }

    /// An admitted request's decision (if kept), the rule's `allowed`
    /// count after it, and the table's length on demand.
    #[inline]
    pub(crate) fn admitted(
        &self,
        decision: Option<Decision>,
        allowed: u64,
        len: impl FnOnce() -> Option<usize>,
    ) {
        if let Some(d) = decision {
            if d.is_above_limit() {
                self.above_limit.increment(1);
            }
            if d.tracking() == Tracking::EvictedOther {
                self.evictions.increment(1);
            }
        }
        if allowed % OCCUPANCY_EVERY == 1 {
            if let Some(n) = len() {
                self.keys.set(n as f64);
            }
        }
    }
}

/// The `source` label of [`REDIS_DECISIONS`], by index.
#[cfg(feature = "redis")]
pub(crate) const SOURCES: [&str; 5] = ["redis", "deny_cache", "fallback", "fail_open", "lease"];

/// A Redis limiter's handles: decisions by source and outcome, errors of
/// a fail-closed limiter, and whether it is failing over.
#[cfg(feature = "redis")]
pub(crate) struct LimiterMetrics {
    /// `[source][allowed as usize]`.
    decisions: [[Counter; 2]; SOURCES.len()],
    unavailable: Counter,
    failing: Gauge,
}

#[cfg(feature = "redis")]
impl LimiterMetrics {
    pub(crate) fn new(limiter: &str) -> LimiterMetrics {
        let one = |source: &'static str, outcome: &'static str| counter!(REDIS_DECISIONS, "limiter" => limiter.to_owned(), "source" => source, "outcome" => outcome);
        let failing = gauge!(REDIS_FAILING, "limiter" => limiter.to_owned());
        failing.set(0.0);
        LimiterMetrics {
            decisions: SOURCES.map(|s| [one(s, "denied"), one(s, "allowed")]),
            unavailable: counter!(REDIS_UNAVAILABLE, "limiter" => limiter.to_owned()),
            failing,
        }
    }

    /// A decision from source `SOURCES[source]`.
    pub(crate) fn decided(&self, source: usize, allowed: bool) {
        self.decisions[source][usize::from(allowed)].increment(1);
    }

    /// A check answered with an error because Redis could not (fail-closed).
    pub(crate) fn unavailable(&self) {
        self.unavailable.increment(1);
    }

    /// Failing over now (or not).
    pub(crate) fn failing(&self, on: bool) {
        self.failing.set(if on { 1.0 } else { 0.0 });
    }
}

/// A Redis backend's handles: calls, errors, latency, batch sizes, and its
/// circuit breaker's state.
#[cfg(feature = "redis")]
pub(crate) struct StoreMetrics {
    calls: Counter,
    outage: Counter,
    reply: Counter,
    breaker_open: Counter,
    latency: Histogram,
    batch: Histogram,
    pub(crate) breaker: Gauge,
}

/// What became of one call to Redis.
#[cfg(feature = "redis")]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CallEnd {
    /// Redis gave a decision, or (`error`) an error about the call's own
    /// key.
    Replied { error: bool },
    /// Redis could not be reached, did not reply in time, or answered
    /// with something that is not a decision (`OOM`, garbage, ...).
    Outage,
    /// The breaker was open: nothing was sent.
    BreakerOpen,
}

#[cfg(feature = "redis")]
impl StoreMetrics {
    pub(crate) fn new(backend: &str) -> StoreMetrics {
        let err = |kind: &'static str| counter!(STORE_ERRORS, "backend" => backend.to_owned(), "kind" => kind);
        let breaker = gauge!(STORE_BREAKER, "backend" => backend.to_owned());
        breaker.set(0.0);
        StoreMetrics {
            calls: counter!(STORE_CALLS, "backend" => backend.to_owned()),
            outage: err("outage"),
            reply: err("reply"),
            breaker_open: err("breaker_open"),
            latency: histogram!(STORE_LATENCY, "backend" => backend.to_owned()),
            batch: histogram!(STORE_BATCH, "backend" => backend.to_owned()),
            breaker,
        }
    }

    /// One call that ended as `end` after `seconds` (not sent: 0).
    pub(crate) fn call(&self, end: CallEnd, seconds: f64) {
        match end {
            CallEnd::BreakerOpen => {
                self.breaker_open.increment(1);
                return;
            }
            CallEnd::Outage => self.outage.increment(1),
            CallEnd::Replied { error: true } => self.reply.increment(1),
            CallEnd::Replied { error: false } => {}
        }
        self.calls.increment(1);
        self.latency.record(seconds);
    }

    /// A batch of `n` checks sent as one script call.
    pub(crate) fn batch(&self, n: usize) {
        self.batch.record(n as f64);
    }
}

/// [`HTTP_CONCURRENCY_MAX`] of an adaptive rule, and the value it last
/// set: a request that finds the maximum unchanged writes nothing.
#[cfg(feature = "tower")]
pub(crate) struct MaxGauge {
    gauge: Gauge,
    last: crate::sync::AtomicU64,
}

#[cfg(feature = "tower")]
impl MaxGauge {
    /// The gauge of rule `rule`, set to `max`.
    pub(crate) fn new(rule: &str, max: u64) -> MaxGauge {
        let gauge = gauge!(HTTP_CONCURRENCY_MAX, "rule" => rule.to_owned());
        gauge.set(max as f64);
        MaxGauge {
            gauge,
            last: crate::sync::AtomicU64::new(max),
        }
    }

    /// Sets the gauge to `max` if it changed.
    #[inline]
    pub(crate) fn observe(&self, max: u64) {
        // Relaxed: a reporting cache that publishes nothing; two requests
        // racing may both set the gauge, each to a maximum that held.
        if self.last.load(crate::sync::Ordering::Relaxed) != max {
            self.last.store(max, crate::sync::Ordering::Relaxed);
            self.gauge.set(max as f64);
        }
    }
}
