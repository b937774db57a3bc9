//! Concurrency rules in the layer: what a rule declares, the limit it is
//! built into, the all-or-nothing check of a request that matches one, and
//! the permits an admitted request holds until its response body ends.
//!
//! A request of a layer with concurrency rules takes this path
//! (`Shared::check_concurrent`, reached from the check's rarely taken
//! "extras" branch, so a rate-only layer runs none of it). Its rate entries
//! and its concurrency entries form one [`check_set`] set, rate entries
//! first: the permits are taken only once every rate rule allowed, and a
//! denial by a later concurrency rule gives back the permits taken before
//! it and the rate units (one clock reading, the engine's rollback). The
//! permits move into the response body (`ResponseBody`), which releases
//! them once, at the body's end, on a body error, or when it is dropped;
//! a request whose inner service fails or is cancelled before a response
//! releases them with its future.
//!
//! What an adaptive rule learns: the hold time (check to body end) and an
//! outcome from the response: `2xx`/`3xx` success, `5xx` or an inner
//! service or body error dropped, `4xx` or a client that went away ignored.

use super::compiled::{Compiled, Entries, Entry, INLINE_RULES};
use super::engine::{After, Later, LocalSet, RequestHead, Shared, Verdict};
use super::headers::Admitted;
use super::info::RateLimitInfo;
use super::response;
use super::stats::{self, bump};
use crate::clock::Clock;
use crate::concurrency::{Adaptive, ConcurrencyLimiter, Outcome, OwnedPermit, Priority};
use crate::decision::Decision;
use crate::error::{ConfigError, InsufficientCapacity};
use crate::keyed::{KeyedConcurrencyLimiter, OwnedKeyedPermit};
use crate::multi::{check_set, LimitSet};
use http::header::HeaderName;
use http::{HeaderMap, StatusCode};
use smallvec::SmallVec;
use std::cell::RefCell;
use std::fmt;
use std::sync::Arc;

/// A concurrency rule's settings, as declared ([`Rule::concurrent`](super::Rule::concurrent)).
#[derive(Clone, Debug)]
pub(super) struct Concurrency {
    pub(super) max: u64,
    pub(super) adaptive: Option<Adaptive>,
    pub(super) reserved: Vec<(Priority, u8)>,
    pub(super) priority_header: Option<String>,
    /// A concurrency setting was given to a rate rule: `build` says so.
    pub(super) on_rate_rule: bool,
}

impl Concurrency {
    pub(super) fn new(max: u64) -> Concurrency {
        Concurrency {
            max,
            adaptive: None,
            reserved: Vec::new(),
            priority_header: None,
            on_rate_rule: false,
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
}

/// One limit for every request the rule matches, or one per key.
enum Limiter<C: Clock> {
    One(Arc<ConcurrencyLimiter<C>>),
    Keyed(Arc<KeyedConcurrencyLimiter<u128, C>>),
}

/// A permit of either kind.
enum Permit<C: Clock> {
    One(OwnedPermit<C>),
    Keyed(OwnedKeyedPermit<u128, C>),
}

impl<C: Clock> Permit<C> {
    /// Releases the permit; the outcome feeds an adaptive maximum (keyed
    /// limits have none).
    fn release(self, outcome: Outcome) {
        match self {
            Permit::One(p) => p.release(outcome),
            Permit::Keyed(p) => drop(p),
        }
    }
}

/// Why a concurrency rule cannot be built: the error `build` reports.
pub(super) enum ConcError {
    Config(ConfigError),
    BadHeader,
}

impl<C: Clock + Clone> ConcLimit<C> {
    /// Builds rule `rule`'s limit: one limiter for a global key, with the
    /// rule's reserves and adaptive maximum; a keyed table (the rule's
    /// table options) for any other key. Settings the layer cannot honour
    /// are errors that say what to change.
    pub(super) fn build(
        clock: &C,
        rule: &super::Rule,
        c: &Concurrency,
    ) -> Result<ConcLimit<C>, ConcError> {
        let refuse = |reason| Err(ConcError::Config(ConfigError::Incompatible { reason }));
        if c.on_rate_rule {
            return refuse("`adaptive`, `reserve` and `priority_by_header` apply to concurrency rules only: make the rule with `Rule::concurrent` (in a file, `concurrent = N` instead of `policy`)");
        }
        if rule.mode == super::Mode::Shadow {
            return refuse("a concurrency rule cannot be in shadow mode: a dry run would have to hold permits it never enforces; enforce it with a high maximum instead");
        }
        if rule.refund_on_success || !rule.tiers.is_empty() || rule.block_for.is_some() {
            return refuse("`count_failures_only`, tiers and `block_for` apply to rate rules only: put them on a rate rule beside the concurrency rule");
        }
        #[cfg(feature = "redis")]
        if rule.remote.is_some() {
            return refuse("a Redis rule cannot be a concurrency rule");
        }
        let priority = match &c.priority_header {
            None => None,
            Some(h) => {
                Some(HeaderName::from_bytes(h.as_bytes()).map_err(|_| ConcError::BadHeader)?)
            }
        };
        let limiter = if rule.key.is_global() {
            let mut b = ConcurrencyLimiter::builder(c.max).clock(clock.clone());
            for &(class, pct) in &c.reserved {
                b = b.reserve(class, pct);
            }
            if let Some(a) = c.adaptive {
                b = b.adaptive(a);
            }
            Limiter::One(Arc::new(b.build().map_err(ConcError::Config)?))
        } else if c.adaptive.is_some() || !c.reserved.is_empty() || priority.is_some() {
            return refuse("an adaptive maximum, reserved shares and request classes apply to one limit shared by all requests: give the rule `Key::global()` (narrowed with `on_route` or `on_path_prefix`), or drop them from the per-key rule");
        } else {
            let b = KeyedConcurrencyLimiter::<u128>::builder(c.max)
                .table(rule.table)
                .clock(clock.clone());
            Limiter::Keyed(Arc::new(b.build().map_err(ConcError::Config)?))
        };
        Ok(ConcLimit {
            limiter,
            priority,
            sheds: !rule.key.names_client(),
        })
    }
}

impl<C: Clock> ConcLimit<C> {
    /// The class of a request: from the rule's header, else normal.
    fn class_of(&self, headers: &HeaderMap) -> Priority {
        let Some(name) = &self.priority else {
            return Priority::Normal;
        };
        match headers.get(name).map(|v| v.as_bytes()) {
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
        }
    }

    /// The maximum now (per key).
    fn max(&self) -> u64 {
        match &self.limiter {
            Limiter::One(l) => l.max(),
            Limiter::Keyed(l) => l.max(),
        }
    }

    /// The permits in flight now (0 for a per-key rule: its keys are not
    /// summed).
    pub(super) fn in_flight(&self) -> u64 {
        match &self.limiter {
            Limiter::One(l) => l.in_flight(),
            Limiter::Keyed(_) => 0,
        }
    }

    /// Takes `n` permits for `key` (a request whose headers are
    /// `headers`), if they fit.
    fn acquire(
        &self,
        key: u128,
        n: u64,
        headers: &HeaderMap,
    ) -> Result<(Decision, Option<Permit<C>>), InsufficientCapacity> {
        Ok(match &self.limiter {
            Limiter::One(l) => {
                let a = l.try_acquire_owned_with(n, self.class_of(headers))?;
                (a.decision(), a.into_permit().map(Permit::One))
            }
            Limiter::Keyed(l) => {
                let a = l.try_acquire_key_owned(&key, n)?;
                (a.decision(), a.into_permit().map(Permit::Keyed))
            }
        })
    }

    /// What a request of `n` for `key` would be told now, taking nothing.
    fn peek(&self, key: u128, n: u64) -> Result<Decision, InsufficientCapacity> {
        let l = match &self.limiter {
            Limiter::Keyed(l) => return l.peek_key_n(&key, n),
            Limiter::One(l) => l,
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
    fn release(&mut self, outcome: Outcome);
}

type Permits<C> = SmallVec<[Permit<C>; 2]>;

impl<C: Clock + 'static> Release for Permits<C> {
    fn release(&mut self, outcome: Outcome) {
        for p in self.drain(..) {
            p.release(outcome);
        }
    }
}

/// An admitted request's permits, released exactly once: when dropped,
/// with the outcome set so far. Before a response (the request was
/// cancelled) that is `Ignored`; once the head has come, the status's
/// outcome, also when the body is dropped before its end (hyper drops a
/// body it knows to be complete without polling it to its end); during a
/// panic, `Dropped`.
pub(crate) struct Held {
    permits: Box<dyn Release>,
    /// What a drop reports.
    outcome: Outcome,
}

impl Held {
    /// The response head arrived with `status`.
    pub(super) fn responded(&mut self, status: StatusCode) {
        self.outcome = if status.is_server_error() {
            Outcome::Dropped
        } else if status.is_client_error() {
            Outcome::Ignored
        } else {
            Outcome::Success
        };
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
    }
}

impl fmt::Debug for Held {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Held")
            .field("outcome", &self.outcome)
            .finish()
    }
}

/// A request's rate entries (through [`LocalSet`]) followed by its
/// concurrency entries, as one all-or-nothing set. The permits taken so
/// far wait in `taken`, one slot per concurrency entry.
struct MixedSet<'a, C: Clock> {
    rate: LocalSet<'a, C>,
    /// The number of rate entries (the first limits of the set).
    rates: usize,
    /// The entry index of each concurrency entry.
    conc: &'a [u16],
    headers: &'a HeaderMap,
    taken: RefCell<SmallVec<[Option<Permit<C>>; 2]>>,
}

impl<C: Clock> MixedSet<'_, C> {
    fn entry(&self, j: usize) -> &Entry {
        &self.rate.entries[usize::from(self.conc[j])]
    }

    fn limit(&self, j: usize) -> Option<&ConcLimit<C>> {
        self.rate.rules[usize::from(self.entry(j).rule)]
            .conc
            .as_ref()
    }
}

impl<C: Clock> LimitSet<C> for MixedSet<'_, C> {
    fn len(&self) -> usize {
        self.rates + self.conc.len()
    }
    fn cost(&self, i: usize) -> u64 {
        match i.checked_sub(self.rates) {
            None => self.rate.cost(i),
            Some(j) => self.entry(j).cost,
        }
    }
    fn read_clock(&self) -> u64 {
        // Permits need no clock reading.
        if self.rates == 0 {
            0
        } else {
            self.rate.read_clock()
        }
    }
    fn take_at(&self, i: usize, now: u64, n: u64) -> Result<Decision, InsufficientCapacity> {
        let Some(j) = i.checked_sub(self.rates) else {
            return self.rate.take_at(i, now, n);
        };
        let Some(l) = self.limit(j) else {
            return Ok(Decision::allow(u64::MAX, u64::MAX, 0));
        };
        let (d, permit) = l.acquire(self.entry(j).key, n, self.headers)?;
        self.taken.borrow_mut()[j] = permit;
        Ok(d)
    }
    fn peek_at(&self, i: usize, now: u64, n: u64) -> Result<Decision, InsufficientCapacity> {
        match i.checked_sub(self.rates) {
            None => self.rate.peek_at(i, now, n),
            Some(j) => match self.limit(j) {
                Some(l) => l.peek(self.entry(j).key, n),
                None => Ok(Decision::allow(u64::MAX, u64::MAX, 0)),
            },
        }
    }
    fn give_back_at(&self, i: usize, now: u64, n: u64) {
        match i.checked_sub(self.rates) {
            None => self.rate.give_back_at(i, now, n),
            // Given back unused: no sample for an adaptive maximum.
            Some(j) => {
                if let Some(p) = self.taken.borrow_mut()[j].take() {
                    p.release(Outcome::Ignored);
                }
            }
        }
    }
    fn capacity(&self, i: usize) -> u64 {
        match i.checked_sub(self.rates) {
            None => self.rate.capacity(i),
            Some(j) => self.limit(j).map_or(u64::MAX, ConcLimit::max),
        }
    }
    fn decide(&mut self, i: usize, d: Option<Decision>) {
        match i.checked_sub(self.rates) {
            None => self.rate.decide(i, d),
            Some(j) => {
                let at = usize::from(self.conc[j]);
                self.rate.entries[at].decision = d;
            }
        }
    }
    fn decide_taken(&mut self, i: usize, d: Decision) {
        match i.checked_sub(self.rates) {
            None => self.rate.decide_taken(i, d),
            Some(_) => self.decide(i, Some(d)),
        }
    }
}

impl<C: Clock + 'static> Shared<C> {
    /// The check of a request in a layer with concurrency rules (the
    /// module docs): rate and concurrency rules all or nothing, then
    /// shadow rules, the extension, the headers and the permits.
    #[inline(never)]
    pub(super) fn check_concurrent(
        self: &Arc<Self>,
        mut entries: Entries,
        req: &RequestHead<'_>,
        insert: &mut Option<RateLimitInfo>,
    ) -> Verdict {
        let is_conc = |e: &Entry| self.rules[usize::from(e.rule)].conc.is_some();
        let pick = |conc: bool| -> SmallVec<[u16; INLINE_RULES]> {
            (0..entries.len())
                .filter(|&i| !entries[i].shadow && is_conc(&entries[i]) == conc)
                // Fits: at most one entry per rule, and at most u16::MAX rules.
                .map(|i| i as u16)
                .collect()
        };
        let (rate_map, conc_map) = (pick(false), pick(true));
        let mut set = MixedSet {
            rate: LocalSet {
                rules: &self.rules,
                entries: &mut entries,
                map: Some(&rate_map),
                unit_costs: false,
                keep: true,
            },
            rates: rate_map.len(),
            conc: &conc_map,
            headers: req.headers,
            taken: RefCell::new(conc_map.iter().map(|_| None).collect()),
        };
        let checked = check_set(&mut set);
        let taken = set.taken.into_inner();
        let grpc = response::is_grpc(req.headers);
        let allowed = match checked {
            Ok(allowed) => allowed,
            Err(e) => {
                let culprit = self.culprit(&entries, e.capacity);
                bump(&self.rules[usize::from(culprit)].counters.errors);
                return Verdict::Reject(response::cost_too_high(
                    &self.rules[usize::from(culprit)].rule.name,
                    e.requested,
                    e.capacity,
                ));
            }
        };
        let counted = rate_map.iter().chain(&conc_map).map(|&i| usize::from(i));
        if !allowed {
            let mut shed = false;
            for i in counted {
                let e = &entries[i];
                let r = &self.rules[usize::from(e.rule)];
                if e.decision.is_some_and(|d| !d.is_allowed()) {
                    if r.conc.as_ref().is_some_and(|c| c.sheds) {
                        shed = true;
                        bump(&r.counters.shed);
                    } else {
                        stats::denied(&r.counters, e.key, false, e.decision);
                    }
                }
            }
            self.start_blocks(&mut entries);
            return Verdict::Reject(response::reject(
                &self.rules,
                self.headers,
                self.responder.as_ref(),
                grpc,
                shed,
                &entries,
            ));
        }
        for i in counted {
            let e = &entries[i];
            let r = &self.rules[usize::from(e.rule)];
            bump(&r.counters.allowed);
            if e.untracked {
                bump(&r.counters.untracked);
            }
            #[cfg(feature = "metrics")]
            stats::observe(
                &r.counters,
                e.decision,
                if r.conc.is_some() { None } else { r.local() },
            );
        }
        if entries.iter().any(|e| e.shadow) {
            self.check_shadow(&mut entries);
        }
        if self.decisions_extension {
            *insert = Some(RateLimitInfo::of(&self.names, &entries));
        }
        let mut after = self.after::<true>(&entries);
        let permits: Permits<C> = taken.into_iter().flatten().collect();
        if !permits.is_empty() {
            let a = after.get_or_insert_with(|| After {
                headers: Admitted::NONE,
                later: None,
            });
            let shared: Arc<dyn super::engine::Refunds> = self.clone();
            a.later
                .get_or_insert_with(|| Box::new(Later::new(shared)))
                .held = Some(Held {
                permits: Box::new(permits),
                outcome: Outcome::Ignored,
            });
        }
        Verdict::Pass(after)
    }

    /// The rule of the entry whose cost can never pass: its cost is above
    /// `capacity` (a concurrency rule's maximum now, or a policy's limit).
    fn culprit(&self, entries: &[Entry], capacity: u64) -> u16 {
        entries
            .iter()
            .filter(|e| !e.shadow)
            .find(|e| {
                let r = &self.rules[usize::from(e.rule)];
                let cap = r
                    .conc
                    .as_ref()
                    .map_or(r.rule.policy.limit(), ConcLimit::max);
                e.cost > cap || (r.conc.is_some() && e.cost > capacity)
            })
            .map_or(entries[0].rule, |e| e.rule)
    }
}

/// Whether rule `r` is a concurrency rule (its headers have no `t`).
#[inline]
pub(super) fn is_concurrent<C: Clock>(r: &Compiled<C>) -> bool {
    r.conc.is_some()
}
