//! Concurrency rules' limits and permits: the limit a rule is built into
//! (one `ConcurrencyLimiter` for a global key, a `KeyedConcurrencyLimiter`
//! for any other), and the permits an admitted request holds until its
//! response body ends. The check that takes them, beside the rate rules,
//! is `concurrent_check.rs`.
//!
//! What an adaptive rule learns: the hold time (check to body end) and an
//! outcome: `1xx`-`3xx` success; `5xx`, a body error, or no response at
//! all (the inner service failed, panicked or was cancelled, often by a
//! timeout) dropped; `4xx` ignored.

use super::key::{single_header, Key};
use super::origin::{self, Origin};
use super::stats::Counter;
use crate::clock::Clock;
use crate::concurrency::{Adaptive, ConcurrencyLimiter, Outcome, OwnedPermit, Priority};
use crate::decision::Decision;
use crate::error::{ConfigError, InsufficientCapacity};
use crate::keyed::{KeyedConcurrencyLimiter, OwnedKeyedPermit, TableOptions};
#[cfg(feature = "redis")]
use crate::redis::{RedisConcurrencyLimiter, RedisPermit};
use http::header::HeaderName;
use http::{HeaderMap, StatusCode};
use smallvec::SmallVec;
use std::fmt;
use std::sync::Arc;

/// A concurrency rule's settings, as declared ([`Rule::concurrent`](super::Rule::concurrent)).
#[derive(Clone, Debug)]
pub(super) struct Concurrency {
    pub(super) max: u64,
    pub(super) adaptive: Option<Adaptive>,
    pub(super) kept: Vec<(Priority, u8)>,
    pub(super) priority_header: Option<String>,
    /// A concurrency setting was given to a rate rule: `build` says so.
    pub(super) on_rate_rule: bool,
    /// When a permit is given back ([`Rule::release_permit`](super::Rule::release_permit)).
    pub(super) release: PermitRelease,
    /// The permits live in Redis ([`Rule::redis_concurrent`](super::Rule::redis_concurrent)).
    #[cfg(feature = "redis")]
    pub(super) redis: Option<Arc<RedisConcurrencyLimiter>>,
}

/// When a concurrency rule gives an admitted request's permit back
/// ([`Rule::release_permit`](super::Rule::release_permit)).
///
/// By default a permit is held until the response body ends, so a rule
/// bounds the responses being streamed as well as the handlers running.
/// A client that reads slowly, or not at all, then holds its permit for
/// as long as the body takes to send (the server's own write timeouts,
/// if any, are the only end): enough such clients hold all of a global
/// rule's permits and every other request is shed. `ResponseHead` gives
/// the permit back when the inner service returns the response head, so
/// the rule bounds the handlers only and a reader's pace costs it nothing.
///
/// ```
/// use ratewall::http::{Key, PermitRelease, Rule};
///
/// // At most 64 handlers at once, however slowly clients read.
/// let handlers = Rule::concurrent("handlers", Key::global(), 64)
///     .release_permit(PermitRelease::ResponseHead);
/// # let _ = handlers;
/// ```
#[non_exhaustive]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum PermitRelease {
    /// When the response body ends, fails or is dropped (the default):
    /// streaming a response counts as in flight.
    #[default]
    BodyEnd,
    /// When the inner service returns the response head (or fails without
    /// one): only the handler's work counts as in flight, and an adaptive
    /// maximum learns the time to the head.
    ResponseHead,
}

impl Concurrency {
    pub(super) fn new(max: u64) -> Concurrency {
        Concurrency {
            max,
            adaptive: None,
            kept: Vec::new(),
            priority_header: None,
            on_rate_rule: false,
            release: PermitRelease::BodyEnd,
            #[cfg(feature = "redis")]
            redis: None,
        }
    }
}

/// A concurrency rule as built: its limiter, where a request's class
/// comes from, and whether its denials shed (`503`) or meter a client (`429`).
pub(super) struct ConcLimit<C: Clock> {
    limiter: Limiter<C>,
    priority: Option<HeaderName>,
    /// One limit shared by every client (not keyed by the client): the
    /// server protecting itself, so a denial is `503`.
    pub(super) sheds: bool,
    /// The requests it shed (here, not in the rule's `Counters`: one
    /// counter more would grow every rule's cache-padded counters past a
    /// line, and the rate-only check's cost with it).
    pub(super) shed: Counter,
    /// Its permits are given back at the response head.
    pub(super) at_head: bool,
    /// An adaptive rule's maximum as a gauge, set when an acquire sees it
    /// changed.
    #[cfg(feature = "metrics")]
    max_gauge: Option<crate::metrics::MaxGauge>,
}

/// One limit for every request the rule matches, or one per key, or
/// (feature `redis`) one per key in Redis, taken on the Redis path
/// (`remote_check.rs`), never by the local check.
enum Limiter<C: Clock> {
    One(Arc<ConcurrencyLimiter<C>>),
    Keyed(Arc<KeyedConcurrencyLimiter<u128, C>>),
    #[cfg(feature = "redis")]
    Redis(Arc<RedisConcurrencyLimiter>),
}

/// A permit of any kind.
pub(super) enum Permit<C: Clock> {
    One(OwnedPermit<C>),
    Keyed(OwnedKeyedPermit<u128, C>),
    /// Released by its drop: a call spawned on the tokio runtime; dropped
    /// outside one, the permit's expiry in Redis reclaims it.
    #[cfg(feature = "redis")]
    Redis(RedisPermit),
}

impl<C: Clock> Permit<C> {
    /// Gives back a permit the request never used (the rollback of an
    /// all-or-nothing check): an adaptive maximum learns nothing from it.
    pub(super) fn give_back(self) {
        self.release(Outcome::Ignored);
    }

    /// Releases the permit; the outcome feeds an adaptive maximum (keyed
    /// limits have none).
    fn release(self, outcome: Outcome) {
        match self {
            Permit::One(p) => p.release(outcome),
            Permit::Keyed(p) => drop(p),
            #[cfg(feature = "redis")]
            Permit::Redis(p) => drop(p),
        }
    }
}

/// Why a concurrency rule cannot be built: the error `build` reports.
pub(super) enum ConcError {
    Config(ConfigError),
    BadHeader,
}

impl<C: Clock + Clone> ConcLimit<C> {
    /// Builds the limit of a rule keyed by `key` with `table`'s options:
    /// one limiter for a global key, with the rule's kept shares and adaptive
    /// maximum; a keyed table for any other key. Settings the layer cannot
    /// honour are errors that say what to change (`builder.rs` checks the
    /// rule's other options).
    pub(super) fn build(
        clock: &C,
        name: &str,
        key: &Key,
        table: TableOptions,
        c: &Concurrency,
        origin: Origin,
    ) -> Result<ConcLimit<C>, ConcError> {
        let refuse = |said| {
            Err(ConcError::Config(ConfigError::Incompatible {
                reason: origin.pick(said),
            }))
        };
        if c.on_rate_rule {
            return refuse(origin::CONCURRENCY_ONLY);
        }
        let priority = match &c.priority_header {
            None => None,
            Some(h) => {
                Some(HeaderName::from_bytes(h.as_bytes()).map_err(|_| ConcError::BadHeader)?)
            }
        };
        #[cfg(feature = "redis")]
        if let Some(l) = &c.redis {
            if c.adaptive.is_some()
                || !c.kept.is_empty()
                || priority.is_some()
                || c.release != PermitRelease::BodyEnd
            {
                return refuse(origin::LOCAL_ONLY);
            }
            return Ok(ConcLimit {
                limiter: Limiter::Redis(l.clone()),
                priority,
                sheds: !key.names_client(),
                shed: Counter::new(name, "shed"),
                at_head: false,
                #[cfg(feature = "metrics")]
                max_gauge: None,
            });
        }
        let limiter = if key.is_global() {
            let mut b = ConcurrencyLimiter::builder(c.max).clock(clock.clone());
            for &(class, pct) in &c.kept {
                b = b.keep_for(class, pct);
            }
            if let Some(a) = c.adaptive {
                b = b.adaptive(a);
            }
            Limiter::One(Arc::new(b.build().map_err(ConcError::Config)?))
        } else if c.adaptive.is_some() || !c.kept.is_empty() || priority.is_some() {
            return refuse(origin::SHARED_ONLY);
        } else {
            let b = KeyedConcurrencyLimiter::<u128>::builder(c.max)
                .table(table)
                .clock(clock.clone());
            Limiter::Keyed(Arc::new(b.build().map_err(ConcError::Config)?))
        };
        #[cfg(feature = "metrics")]
        let max_gauge = match (&limiter, c.adaptive) {
            (Limiter::One(l), Some(_)) => Some(crate::metrics::MaxGauge::new(name, l.max())),
            _ => None,
        };
        Ok(ConcLimit {
            limiter,
            priority,
            sheds: !key.names_client(),
            shed: Counter::new(name, "shed"),
            at_head: c.release == PermitRelease::ResponseHead,
            #[cfg(feature = "metrics")]
            max_gauge,
        })
    }
}

impl<C: Clock> ConcLimit<C> {
    /// The class of a request: from the rule's header, else normal.
    pub(super) fn class_of(&self, headers: &HeaderMap) -> Priority {
        let Some(name) = &self.priority else {
            return Priority::Normal;
        };
        // Sent more than once: no class of the client's choosing.
        match single_header(headers, name).ok().map(|v| v.as_bytes()) {
            Some(v) if v.eq_ignore_ascii_case(b"critical") => Priority::Critical,
            Some(v) if v.eq_ignore_ascii_case(b"sheddable") => Priority::Sheddable,
            _ => Priority::Normal,
        }
    }

    /// The most the rule admits: the `RateLimit-Policy` `q` of an
    /// adaptive rule is its ceiling, of another its maximum (per key).
    pub(super) fn quota(&self) -> u64 {
        match &self.limiter {
            Limiter::One(l) => l.adaptive_bounds().map_or(l.max(), |(_, ceiling)| ceiling),
            Limiter::Keyed(l) => l.max(),
            #[cfg(feature = "redis")]
            Limiter::Redis(l) => l.max(),
        }
    }

    /// The capacity of the rule's key table: a per-key rule's; none for
    /// one limit shared by all, or for a Redis rule.
    pub(super) fn max_keys(&self) -> Option<usize> {
        match &self.limiter {
            Limiter::Keyed(l) => Some(l.max_keys()),
            _ => None,
        }
    }

    /// The maximum now (per key).
    pub(super) fn max(&self) -> u64 {
        match &self.limiter {
            Limiter::One(l) => l.max(),
            Limiter::Keyed(l) => l.max(),
            #[cfg(feature = "redis")]
            Limiter::Redis(l) => l.max(),
        }
    }

    /// The permits in flight now (0 for a per-key rule: its keys are not
    /// summed; 0 for a Redis rule: its count is in Redis).
    pub(super) fn in_flight(&self) -> u64 {
        match &self.limiter {
            Limiter::One(l) => l.in_flight(),
            _ => 0,
        }
    }

    /// The Redis limiter of a Redis concurrency rule.
    #[cfg(feature = "redis")]
    pub(super) fn redis(&self) -> Option<&Arc<RedisConcurrencyLimiter>> {
        match &self.limiter {
            Limiter::Redis(l) => Some(l),
            _ => None,
        }
    }

    /// Takes `n` permits for `key` (a request of class `class`), if they
    /// fit.
    pub(super) fn try_acquire_n(
        &self,
        key: u128,
        n: u64,
        class: Priority,
    ) -> Result<(Decision, Option<Permit<C>>), InsufficientCapacity> {
        Ok(match &self.limiter {
            Limiter::One(l) => {
                let a = l.try_acquire_owned_n_with(n, class)?;
                // The maximum moves on releases; the next acquire reports it.
                #[cfg(feature = "metrics")]
                if let Some(g) = &self.max_gauge {
                    g.observe(l.max());
                }
                (a.decision(), a.into_permit().map(Permit::One))
            }
            Limiter::Keyed(l) => {
                let a = l.try_acquire_key_owned_n(&key, n)?;
                (a.decision(), a.into_permit().map(Permit::Keyed))
            }
            // Not reached: the local check leaves Redis rules out
            // (`check_mixed`); were it reached, the rule takes nothing here.
            #[cfg(feature = "redis")]
            Limiter::Redis(_) => (Decision::allow(u64::MAX, u64::MAX, 0), None),
        })
    }

    /// What a request of `n` for `key` would be told now, taking nothing.
    pub(super) fn peek(&self, key: u128, n: u64) -> Result<Decision, InsufficientCapacity> {
        let l = match &self.limiter {
            Limiter::Keyed(l) => return l.peek_key_n(&key, n),
            Limiter::One(l) => l,
            // Not reached, as in `acquire`.
            #[cfg(feature = "redis")]
            Limiter::Redis(_) => return Ok(Decision::allow(u64::MAX, u64::MAX, 0)),
        };
        let (max, out) = (l.max(), l.in_flight());
        InsufficientCapacity::check(n, max)?;
        let hold = u64::try_from(l.mean_hold_time().as_nanos()).unwrap_or(u64::MAX);
        Ok(if out + n <= max {
            Decision::allow(max, max - out - n, 0)
        } else {
            Decision::deny(max, max.saturating_sub(out), hold, hold)
        })
    }
}

/// The permits one admitted request holds, type-erased so the response
/// body need not know the layer's clock.
trait Release: Send + Sync {
    /// Releases every permit still held (each once: they are drained).
    fn release(&mut self, outcome: Outcome);
    fn is_empty(&self) -> bool;
}

/// The request class of each entry of a request (a concurrency rule's,
/// from its priority header; `Normal` for the others), read before the
/// check so that the Redis path need not keep the request's headers.
pub(super) type Classes = SmallVec<[Priority; 4]>; // 4: `compiled::INLINE_RULES`

/// The permits of one request, one per concurrency rule it matched.
pub(super) type Permits<C> = SmallVec<[Permit<C>; 2]>;

/// An admitted request's permits: those its response body holds, and
/// those given back at the response head ([`PermitRelease`]).
pub(super) struct Taken<C: Clock> {
    pub(super) body: Permits<C>,
    pub(super) head: Permits<C>,
}

impl<C: Clock + 'static> Taken<C> {
    pub(super) fn none() -> Taken<C> {
        Taken {
            body: Permits::new(),
            head: Permits::new(),
        }
    }

    /// What the response will hold, if anything.
    pub(super) fn held(self) -> Option<Held> {
        if self.body.is_empty() && self.head.is_empty() {
            return None;
        }
        Some(Held {
            permits: Box::new(self.body),
            at_head: (!self.head.is_empty()).then(|| Box::new(self.head) as Box<dyn Release>),
            outcome: Outcome::Dropped,
        })
    }
}

impl<C: Clock + 'static> Release for Permits<C> {
    fn release(&mut self, outcome: Outcome) {
        for p in self.drain(..) {
            p.release(outcome);
        }
    }

    fn is_empty(&self) -> bool {
        SmallVec::is_empty(self)
    }
}

/// An admitted request's permits, released exactly once: when dropped,
/// with the outcome set so far. Before a response head that is `Dropped`:
/// the inner service failed, panicked, or the request was cancelled
/// before its response (often a timeout above the layer); once the head
/// has come, the status's outcome, also when the body is dropped before
/// its end (hyper drops a body it knows to be complete without polling it
/// to its end); during a panic, `Dropped`.
pub(crate) struct Held {
    permits: Box<dyn Release>,
    /// The permits given back at the response head; `None` once they are
    /// (or when there are none).
    at_head: Option<Box<dyn Release>>,
    /// What a drop reports.
    outcome: Outcome,
}

impl Held {
    /// The response head arrived with `status`: the permits of
    /// [`PermitRelease::ResponseHead`] rules are given back now, with the
    /// status's outcome. Whether the body still holds any permit.
    pub(super) fn responded(&mut self, status: StatusCode) -> bool {
        self.outcome = if status.is_server_error() {
            Outcome::Dropped
        } else if status.is_client_error() {
            Outcome::Ignored
        } else {
            Outcome::Success
        };
        if let Some(mut head) = self.at_head.take() {
            head.release(self.outcome);
        }
        !self.permits.is_empty()
    }

    /// The response body ended: release with the response's outcome.
    pub(super) fn ended(self) {}

    /// The inner service or the body failed: release as dropped.
    pub(super) fn failed(mut self) {
        self.outcome = Outcome::Dropped;
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let outcome = if std::thread::panicking() {
            Outcome::Dropped
        } else {
            self.outcome
        };
        self.permits.release(outcome);
        if let Some(mut head) = self.at_head.take() {
            head.release(outcome);
        }
    }
}

impl fmt::Debug for Held {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Held")
            .field("outcome", &self.outcome)
            .finish()
    }
}
