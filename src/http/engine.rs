//! The check: which rules a request matches, its key and cost under each,
//! and the all-or-nothing decision over them, with the local rules checked
//! synchronously and (features `tower` and `redis`) the Redis rules on an
//! asynchronous path that the service polls.
//!
//! A request's path through the layer: `Shared::check` resolves the
//! client address (`client_ip.rs`), keys each matching rule (`key.rs`),
//! charges the local enforced rules through [`check_set`] (one clock read,
//! all or nothing), then shadow rules, then renders the headers
//! (`headers.rs`) or the 429 (`response.rs`). The Redis branch
//! (`Shared::check_remote`, `remote_check.rs`) runs the Redis rules first, all or nothing
//! among themselves, then the same local check; a local denial gives the
//! Redis units back.

use super::client_ip::{Cidr, ClientIp, Resolved};
use super::compiled::{Compiled, Entries, Entry, INLINE_RULES};
use super::concurrent::Held;
use super::headers::{Admitted, Headers};
use super::info::RateLimitInfo;
use super::key::{Absent, Fingerprint, RequestParts, RuleKey};
use super::lockout::no_sooner_than;
use super::origin::{self, Origin};
use super::response::{self, Responder};
use super::rule::{Missing, Mode, UnknownClient};
use super::stats::{self, bump};
use crate::clock::Clock;
use crate::decision::{Decision, Tracking};
use crate::error::InsufficientCapacity;
use crate::keyed::{KeyedPolicyLimiter, KeyedRef};
use crate::multi::{check_set, LimitCalls, LimitSet};
use crate::sync::{AtomicU64, Ordering};
use bytes::Bytes;
use http::header::{HeaderName, HeaderValue};
use http::{HeaderMap, Method, Response, StatusCode, Uri};
use smallvec::SmallVec;
#[cfg(feature = "redis")]
use std::future::Future;
#[cfg(feature = "redis")]
use std::pin::Pin;
use std::sync::{Arc, Once};

/// How many requests are looked at for `X-Forwarded-For` when no proxy is
/// trusted (the misconfiguration warning).
const XFF_CHECKS: u64 = 4096;

const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

/// What a request is checked against: a skip predicate over the request head.
pub(super) type SkipFn = Arc<dyn Fn(&Method, &Uri, &HeaderMap) -> bool + Send + Sync>;

/// Warns through `tracing` (feature `tracing`) or on standard error.
pub(super) fn warn_now(message: &str) {
    #[cfg(feature = "tracing")]
    tracing::warn!(target: "ratewall::http", "{message}");
    #[cfg(not(feature = "tracing"))]
    eprintln!("ratewall::http warning: {message}");
}

/// The compiled layer that every clone of the layer and its services
/// share: the rules, the settings, and the one-time warnings.
pub(super) struct Shared<C: Clock> {
    pub(super) rules: Vec<Compiled<C>>,
    pub(super) names: Arc<[Box<str>]>,
    pub(super) client_ip: ClientIp,
    pub(super) needs_ip: bool,
    pub(super) headers: Headers,
    pub(super) skip: Option<SkipFn>,
    pub(super) allow: Vec<Cidr>,
    pub(super) responder: Option<Responder>,
    pub(super) decisions_extension: bool,
    pub(super) any_refund: bool,
    /// Some rule counts requests other rules refuse (`Rule::count_refused`).
    pub(super) any_count_refused: bool,
    /// Where the layer's client-address settings were written.
    pub(super) origin: Origin,
    /// No rule is in shadow mode and every rule is local: every entry of a
    /// request takes part in the all-or-nothing check (known at build, so
    /// no request scans its entries to find out).
    pub(super) plain: bool,
    /// Every rule costs a constant of at most one unit.
    pub(super) unit_costs: bool,
    /// Some local rule's table outgrows the caches, so a request loads
    /// each rule's slot ahead as soon as it has the rule's key (`check`).
    pub(super) prefetch: bool,
    /// An admitted request's decisions are read after the check (headers,
    /// the decisions extension, refunds or shadow rules).
    pub(super) keep_decisions: bool,
    /// The mask of the shown rules and their joint `RateLimit-Policy` value.
    pub(super) all_policy: Option<(u64, HeaderValue)>,
    /// Some rule has tiers or a lockout (`tiers_and_blocks`), or the
    /// layer has concurrency rules.
    pub(super) extras: bool,
    /// Some rule is a concurrency rule: requests take `check_concurrent`.
    pub(super) concurrent: bool,
    pub(super) fp: Fingerprint,
    pub(super) warn_xff: Once,
    pub(super) xff_checks: AtomicU64,
    pub(super) warn_no_peer: Once,
    /// A Redis key holding another policy's data (a configuration error).
    #[cfg(feature = "redis")]
    pub(super) warn_foreign_key: Once,
}

/// The asynchronous check of a request that matched Redis rules: the
/// verdict and the decisions extension.
#[cfg(feature = "redis")]
pub(super) type RemoteCheck =
    Pin<Box<dyn Future<Output = (Verdict, Option<RateLimitInfo>)> + Send>>;

/// What the check decided. `Pass` is the large variant and the common
/// one; boxing it would allocate on every request.
#[allow(clippy::large_enum_variant)]
pub(super) enum Verdict {
    Pass(Option<After>),
    Reject(Response<Bytes>),
    /// Redis rules matched: decided when this future completes.
    #[cfg(feature = "redis")]
    Remote(RemoteCheck),
}

/// What an admitted request's response gets: headers, refunds and permits.
pub(super) struct After {
    pub(super) headers: Admitted,
    /// Boxed: only count-only-failures and concurrency rules need it (one
    /// allocation per request they match).
    pub(super) later: Option<Box<Later>>,
}

/// What waits for the response: the units of count-only-failures rules,
/// given back when it succeeds, and the permits of concurrency rules,
/// which its body holds until its end.
pub(super) struct Later {
    pub(super) shared: Arc<dyn Refunds>,
    pub(super) list: RefundList,
    /// The Redis rules' units (given back in a task).
    #[cfg(feature = "redis")]
    pub(super) remote: RemoteRefunds,
    pub(super) held: Option<Held>,
}

impl Later {
    pub(super) fn new(shared: Arc<dyn Refunds>) -> Later {
        Later {
            shared,
            list: RefundList::new(),
            #[cfg(feature = "redis")]
            remote: Vec::new(),
            held: None,
        }
    }
}

/// A Redis rule's units to give back when the response succeeds
/// (count-only-failures): rule, key, cost, and where they were taken.
#[cfg(feature = "redis")]
pub(super) type RemoteRefunds = Vec<(u16, Vec<u8>, u64, crate::redis::DecisionSource)>;

/// (rule, key, cost) of each unit taken by a count-only-failures rule.
pub(super) type RefundList = SmallVec<[(u16, u128, u64); 2]>;

/// Gives units back to the layer's rules (the layer's clock type erased).
pub(super) trait Refunds: Send + Sync {
    fn refund(&self, rule: u16, key: u128, cost: u64);
    #[cfg(feature = "redis")]
    fn refund_remote(self: Arc<Self>, list: RemoteRefunds);
}

impl<C: Clock + 'static> Refunds for Shared<C> {
    fn refund(&self, rule: u16, key: u128, cost: u64) {
        if let Some(r) = self.rules.get(usize::from(rule)) {
            if let Some(l) = r.local() {
                l.refund_key(&key, cost);
                bump(&r.counters.refunded);
            }
        }
    }

    #[cfg(feature = "redis")]
    fn refund_remote(self: Arc<Self>, list: RemoteRefunds) {
        self.refund_remote_now(list);
    }
}

/// The local enforced entries of one request as the limits of one
/// all-or-nothing check ([`check_set`]): each entry's rule table with the
/// entry's key and cost, statically dispatched, and each decision written
/// into its entry. `map` lists the entries that take part when not all do.
pub(super) struct LocalSet<'a, C: Clock> {
    pub(super) rules: &'a [Compiled<C>],
    pub(super) entries: &'a mut [Entry],
    pub(super) map: Option<&'a [u16]>,
    /// Every cost is at most one unit.
    pub(super) unit_costs: bool,
    /// Whether the decisions of an admitted request are kept in the
    /// entries (headers, the extension, refunds and Redis rules read them).
    pub(super) keep: bool,
}

impl<C: Clock> LocalSet<'_, C> {
    #[inline]
    fn entry(&self, i: usize) -> &Entry {
        match self.map {
            None => &self.entries[i],
            Some(m) => &self.entries[usize::from(m[i])],
        }
    }

    /// Entry `i`'s table with its key. Every entry in the set is local
    /// (`check_enforced` picks them).
    #[inline]
    fn limit(&self, i: usize) -> Option<KeyedRef<'_, KeyedPolicyLimiter<u128, C>, u128>> {
        let e = self.entry(i);
        Some(self.rules[usize::from(e.rule)].local()?.with_key(&e.key))
    }
}

impl<C: Clock> LimitSet<C> for LocalSet<'_, C> {
    #[inline]
    fn len(&self) -> usize {
        self.map.map_or(self.entries.len(), <[u16]>::len)
    }
    #[inline]
    fn cost(&self, i: usize) -> u64 {
        self.entry(i).cost
    }
    #[inline]
    fn read_clock(&self) -> u64 {
        self.limit(0).map_or(0, |l| l.read_clock())
    }
    #[inline]
    fn take_at(&self, i: usize, now: u64, n: u64) -> Result<Decision, InsufficientCapacity> {
        match self.limit(i) {
            Some(l) => l.take_at(now, n),
            None => Ok(Decision::allow(u64::MAX, u64::MAX, 0)),
        }
    }
    fn peek_at(&self, i: usize, now: u64, n: u64) -> Result<Decision, InsufficientCapacity> {
        match self.limit(i) {
            Some(l) => l.peek_at(now, n),
            None => Ok(Decision::allow(u64::MAX, u64::MAX, 0)),
        }
    }
    fn give_back_at(&self, i: usize, now: u64, n: u64) {
        if let Some(l) = self.limit(i) {
            l.give_back_at(now, n);
        }
    }
    fn capacity(&self, i: usize) -> u64 {
        self.limit(i).map_or(u64::MAX, |l| l.capacity())
    }
    /// No: `Shared::check` loaded each entry's slot ahead already, as
    /// soon as it had the entry's key.
    #[inline]
    fn prefetches(&self) -> bool {
        false
    }
    #[inline]
    fn max_cost(&self) -> u64 {
        if self.unit_costs {
            1
        } else {
            u64::MAX
        }
    }
    #[inline]
    fn decide_taken(&mut self, i: usize, d: Decision) {
        let at = match self.map {
            None => i,
            Some(m) => usize::from(m[i]),
        };
        let e = &mut self.entries[at];
        e.untracked = d.tracking() == Tracking::Untracked;
        if self.keep {
            e.decision = Some(d);
        }
    }
    #[inline]
    fn decide(&mut self, i: usize, d: Option<Decision>) {
        let at = match self.map {
            None => i,
            Some(m) => usize::from(m[i]),
        };
        self.entries[at].decision = d;
    }
}

/// Starts loading `key`'s slot in a local rule's table (`Shared::check`,
/// when some table outgrows the caches). Out of line: the rule loop of a
/// layer whose tables stay in the caches keeps its registers.
#[inline(never)]
fn load_ahead<C: Clock>(local: Option<&KeyedPolicyLimiter<u128, C>>, key: u128) {
    if let Some(l) = local {
        l.prefetch_key(&key);
    }
}

impl<C: Clock + 'static> Shared<C> {
    pub(super) fn warn(&self, once: &Once, message: &'static str) {
        once.call_once(|| warn_now(message));
    }

    // Inlined into the service's `call` (another file, so another codegen
    // unit): as a separate call it moves the verdict, and the layer's
    // per-request cost grows measurably (`benches/http.sh`).
    #[inline]
    pub(super) fn check(
        self: &Arc<Self>,
        req: &RequestHead<'_>,
        insert: &mut Option<RateLimitInfo>,
    ) -> Verdict {
        if let Some(skip) = &self.skip {
            if skip(req.method, req.uri, req.headers) {
                return Verdict::Pass(None);
            }
        }
        let client = if self.needs_ip {
            let c = self.client_ip.resolve(req.headers, req.extensions);
            if c == Resolved::NoPeer {
                self.warn(
                    &self.warn_no_peer,
                    "a request reached the rate-limit layer without a peer address: with axum, enable \
                     ratewall's `axum` feature and serve with `into_make_service_with_connect_info::<SocketAddr>()`; \
                     with tonic, enable the `tonic` feature; otherwise insert a `SocketAddr` extension",
                );
            }
            c
        } else {
            Resolved::NoPeer
        };
        // Looked for in the first requests only: a header lookup per request
        // is a good part of the layer's cost, and one sighting is enough.
        if !self.client_ip.trusts_proxies()
            && self.needs_ip
            // Relaxed: a sampling counter; it publishes nothing.
            && self.xff_checks.load(Ordering::Relaxed) < XFF_CHECKS
            && !self.warn_xff.is_completed()
        {
            // Relaxed: as above; an overshoot by concurrent requests is harmless.
            self.xff_checks.fetch_add(1, Ordering::Relaxed);
            if req.headers.contains_key(X_FORWARDED_FOR) {
                self.warn(&self.warn_xff, self.origin.pick(origin::XFF_UNTRUSTED));
            }
        }
        if let Resolved::Ip(ip) = client {
            if self.allow.iter().any(|n| n.contains(ip)) {
                return Verdict::Pass(None);
            }
        }
        let parts = RequestParts {
            method: req.method,
            uri: req.uri,
            headers: req.headers,
            extensions: req.extensions,
            client,
        };
        let mut entries = Entries::new();
        let prefetch = self.prefetch;
        #[cfg(feature = "redis")]
        let mut remote_keys: Vec<(usize, Vec<u8>)> = Vec::new();
        for (i, r) in self.rules.iter().enumerate() {
            let rule = &r.rule;
            if !r.always && (rule.mode == Mode::Off || !rule.matcher.matches(&parts)) {
                continue;
            }
            let key = match rule.key.key_of(&parts, &self.fp, r.local().is_none()) {
                Ok(k) => k,
                Err(why) => match self.key_missing(r, &parts, why) {
                    Ok(k) => k,
                    Err(Some((status, why))) => {
                        return Verdict::Reject(response::missing_key(
                            status,
                            &rule.name,
                            why.describe(),
                        ))
                    }
                    Err(None) => continue,
                },
            };
            #[cfg(feature = "redis")]
            let key = match key {
                RuleKey::Local(k) => k,
                RuleKey::Remote(bytes) => {
                    // Client material is named by a hash in Redis, never
                    // by its value (`RedisBackendBuilder::key_secret`).
                    let name = match r.redis_backend() {
                        Some(b) if !rule.key.readable_in_redis() => b.key_name(bytes),
                        _ => bytes,
                    };
                    remote_keys.push((entries.len(), name));
                    0
                }
            };
            #[cfg(not(feature = "redis"))]
            let key = key.into_local();
            // A table larger than the caches: start loading the key's slot
            // now, so that its miss overlaps the next rules' keys, the clock
            // read and the set-up of the check, not only the other rules'
            // misses (the check itself loads nothing ahead).
            if prefetch {
                load_ahead(r.local(), key);
            }
            entries.push(Entry {
                // Fits: `build` caps the rule count at u16::MAX.
                rule: i as u16,
                key,
                cost: rule.cost_of(&parts),
                shadow: rule.mode == Mode::Shadow,
                untracked: false,
                decision: None,
            });
        }
        if entries.is_empty() {
            return Verdict::Pass(None);
        }
        if self.extras {
            if let Some(blocked) = self.tiers_and_blocks(&mut entries, req) {
                return Verdict::Reject(blocked);
            }
            // A layer with concurrency rules (`concurrent_check.rs`).
            #[cfg(feature = "redis")]
            let local_only = remote_keys.is_empty();
            #[cfg(not(feature = "redis"))]
            let local_only = true;
            if self.concurrent && local_only {
                return self.check_concurrent(entries, req, insert);
            }
        }
        #[cfg(feature = "redis")]
        if !remote_keys.is_empty() {
            let shared = self.clone();
            let grpc = response::is_grpc(req.headers);
            let classes = self.classes(&entries, req.headers);
            return Verdict::Remote(Box::pin(async move {
                shared
                    .check_remote(entries, remote_keys, grpc, classes)
                    .await
            }));
        }
        match self.check_enforced(&mut entries, self.keep_decisions) {
            Ok(true) => {}
            Ok(false) => {
                if self.extras {
                    self.start_blocks(&mut entries);
                }
                return Verdict::Reject(self.reject(response::is_grpc(req.headers), &entries));
            }
            Err((rule, e)) => {
                bump(&self.rules[usize::from(rule)].counters.errors);
                return Verdict::Reject(response::cost_too_high(
                    &self.rules[usize::from(rule)].rule.name,
                    e.requested,
                    e.capacity,
                ));
            }
        }
        if !self.plain && entries.iter().any(|e| e.shadow) {
            self.check_shadow(&mut entries);
        }
        if self.decisions_extension {
            *insert = Some(RateLimitInfo::of(&self.names, &entries));
        }
        Verdict::Pass(if self.headers == Headers::None && !self.any_refund {
            None
        } else {
            self.after::<false>(&entries)
        })
    }

    /// A request without a key for a rule: the key at the nearest trusted
    /// hop (an unknown client, [`UnknownClient::NearestHop`]), or what the
    /// rule's [`Missing`] says: `Err(Some((status, why)))` rejects,
    /// `Err(None)` skips the rule. Never a 5xx for a request-borne problem.
    #[cold]
    #[inline(never)]
    fn key_missing(
        &self,
        r: &Compiled<C>,
        parts: &RequestParts<'_>,
        mut why: Absent,
    ) -> Result<RuleKey, Option<(StatusCode, Absent)>> {
        let rule = &r.rule;
        if why == Absent::UnknownClient {
            bump(&r.counters.unknown_client);
            if let (UnknownClient::NearestHop, Resolved::Unknown(hop)) =
                (rule.unknown_client, parts.client)
            {
                let at_hop = RequestParts {
                    client: Resolved::Ip(hop),
                    ..*parts
                };
                // A composite key may still lack another part.
                match rule.key.key_of(&at_hop, &self.fp, r.local().is_none()) {
                    Ok(k) => return Ok(k),
                    Err(w) => why = w,
                }
            }
        }
        bump(&r.counters.missing_key);
        match rule.missing {
            // Never skipped: a key header sent twice must not be a way
            // around the rule, whatever it does with a missing key.
            _ if why == Absent::Repeated && rule.mode == Mode::Enforce => {
                Err(Some((StatusCode::BAD_REQUEST, why)))
            }
            Missing::Reject(status) if rule.mode == Mode::Enforce => {
                let status = if why != Absent::NoPeer && status.is_server_error() {
                    StatusCode::BAD_REQUEST
                } else {
                    status
                };
                Err(Some((status, why)))
            }
            _ => Err(None),
        }
    }

    /// The all-or-nothing check of the local enforced entries. `Err` names the
    /// rule whose cost can never pass.
    ///
    /// `keep`: whether an admitted request's decisions are kept in its
    /// entries (a denied request's always are, for the 429).
    // Inlined into `check` (and so into the service's `call`) as when they
    // shared a file.
    #[inline]
    pub(super) fn check_enforced(
        &self,
        entries: &mut [Entry],
        keep: bool,
    ) -> Result<bool, (u16, InsufficientCapacity)> {
        let counted = |e: &Entry| !e.shadow && self.rules[usize::from(e.rule)].local().is_some();
        // Usually every matching rule is a local enforced one: the set is
        // the entries themselves. Otherwise it maps to the entries that are.
        let map: Option<SmallVec<[u16; INLINE_RULES]>> =
            if self.plain || entries.iter().all(counted) {
                None
            } else {
                Some(
                    (0..entries.len())
                        .filter(|&i| counted(&entries[i]))
                        // Fits: at most one entry per rule, and at most u16::MAX rules.
                        .map(|i| i as u16)
                        .collect(),
                )
            };
        let mut set = LocalSet {
            rules: &self.rules,
            entries,
            map: map.as_deref(),
            unit_costs: self.unit_costs,
            // With metrics, an admitted request's decisions are read too.
            keep: keep || cfg!(feature = "metrics"),
        };
        let allowed = match check_set(&mut set) {
            Ok(allowed) => allowed,
            Err(e) => {
                let culprit = entries
                    .iter()
                    .filter(|e| counted(e))
                    .find(|e2| e2.cost > self.rules[usize::from(e2.rule)].rule.policy.limit())
                    .map_or(entries[0].rule, |e2| e2.rule);
                return Err((culprit, e));
            }
        };
        if !allowed && self.any_count_refused {
            self.charge_refused(entries);
        }
        for e in entries.iter().filter(|e| self.plain || counted(e)) {
            let c = &self.rules[usize::from(e.rule)].counters;
            if allowed {
                // Every entry took its cost and allowed.
                bump(&c.allowed);
                if e.untracked {
                    bump(&c.untracked);
                }
                #[cfg(feature = "metrics")]
                stats::observe(c, e.decision, self.rules[usize::from(e.rule)].local());
            } else if e.decision.is_some_and(|d| !d.is_allowed()) {
                stats::denied(c, e.key, false, e.decision);
            }
        }
        Ok(allowed)
    }

    /// Points each entry of a rule with tiers at its tier's limit, then
    /// answers a request that a local rule's lockout blocks: the 429 of
    /// the blocked rules, with nothing taken from any rule.
    #[inline(never)]
    fn tiers_and_blocks(
        &self,
        entries: &mut Entries,
        req: &RequestHead<'_>,
    ) -> Option<Response<Bytes>> {
        let mut blocked = false;
        for e in entries.iter_mut() {
            let own = &self.rules[usize::from(e.rule)];
            if let Some(t) = &own.tiers {
                e.rule = t.pick(e.rule, req.headers, req.extensions);
            }
            if let (false, Some(l)) = (e.shadow, &own.lockout) {
                let r = &self.rules[usize::from(e.rule)];
                if let Some(local) = r.local() {
                    if let Some(d) = l.blocked(&e.key, r.rule.policy.limit()) {
                        // Told no sooner than the rule's own wait (one peek,
                        // for blocked requests only).
                        let d = match local.peek_key_n(&e.key, e.cost) {
                            Ok(own) => no_sooner_than(d, own),
                            Err(_) => d,
                        };
                        // A refusal like any other: counted, and the key
                        // among the rule's offenders.
                        stats::denied(&r.counters, e.key, false, Some(d));
                        e.decision = Some(d);
                        blocked = true;
                    }
                }
            }
        }
        blocked.then(|| self.reject(response::is_grpc(req.headers), entries))
    }

    /// After the all-or-nothing step refused a request (and gave back what
    /// it took): each local rate rule that counts refused requests
    /// ([`Rule::count_refused`](super::Rule::count_refused)) and did not
    /// deny takes its cost anyway, keeping the decision of that take. Out
    /// of the step itself, so that every other check runs the step's code
    /// unchanged (inside it, the loop cost the admitted path 38
    /// instructions, callgrind).
    #[cold]
    #[inline(never)]
    pub(super) fn charge_refused(&self, entries: &mut [Entry]) {
        for e in entries.iter_mut().filter(|e| !e.shadow) {
            let r = &self.rules[usize::from(e.rule)];
            if !r.rule.count_refused
                || r.conc.is_some()
                || e.decision.is_some_and(|d| !d.is_allowed())
            {
                continue;
            }
            if let Some(l) = r.local() {
                if let Ok(d) = l.check_key_n(&e.key, e.cost) {
                    e.decision = Some(d);
                }
            }
        }
    }

    /// Starts the lockout of each local rule with one that denied this
    /// request: its decision becomes the block's (until the block's end).
    #[cold]
    pub(super) fn start_blocks(&self, entries: &mut [Entry]) {
        for e in entries.iter_mut().filter(|e| !e.shadow) {
            let r = &self.rules[usize::from(e.rule)];
            let base = &self.rules[usize::from(r.base)];
            if let (Some(l), Some(d), Some(_)) = (&base.lockout, e.decision, r.local()) {
                if !d.is_allowed() {
                    e.decision = Some(l.start(&e.key, d));
                }
            }
        }
    }

    /// Shadow rules, each on its own, after the enforced ones admitted the
    /// request: charged like an enforced rule, never rejecting.
    #[inline(never)]
    pub(super) fn check_shadow(&self, entries: &mut [Entry]) {
        for e in entries.iter_mut().filter(|e| e.shadow) {
            let r = &self.rules[usize::from(e.rule)];
            let Some(local) = r.local() else { continue };
            match local.check_key_n(&e.key, e.cost) {
                Ok(d) => {
                    if d.is_allowed() {
                        bump(&r.counters.allowed);
                    } else {
                        stats::denied(&r.counters, e.key, true, Some(d));
                    }
                    e.decision = Some(d);
                }
                Err(_) => stats::denied(&r.counters, e.key, true, None),
            }
        }
    }

    /// Headers and refunds for an admitted request.
    // Not inlined (nor `reject`, `check_shadow`): the check that every
    // request runs stays small, and its cost does not depend on the code
    // of the header generations it does not use.
    /// `CONC`: the layer has concurrency rules (whose items have no `t`).
    #[inline(never)]
    pub(super) fn after<const CONC: bool>(self: &Arc<Self>, entries: &[Entry]) -> Option<After> {
        let mut after = After {
            headers: Admitted::of::<C, CONC>(
                self.headers,
                &self.rules,
                entries,
                self.all_policy.as_ref(),
            ),
            later: None,
        };
        if self.any_refund {
            let list: RefundList = entries
                .iter()
                .filter(|e| {
                    !e.shadow
                        && e.cost > 0
                        && self.rules[usize::from(e.rule)].rule.refund_on_success
                        && self.rules[usize::from(e.rule)].local().is_some()
                        && e.decision.is_some_and(|d| {
                            matches!(d.tracking(), Tracking::Tracked | Tracking::EvictedOther)
                        })
                })
                .map(|e| (e.rule, e.key, e.cost))
                .collect();
            if !list.is_empty() {
                let mut later = Later::new(self.clone());
                later.list = list;
                after.later = Some(Box::new(later));
            }
        }
        if after.headers.is_empty() && after.later.is_none() {
            None
        } else {
            Some(after)
        }
    }

    /// The answer to a request the local enforced rules did not admit
    /// (`checked`: a denial, or a cost that can never pass): its lockouts
    /// started, then the 429 (or a shed request's 503), or the 413.
    #[cold]
    #[inline(never)]
    pub(super) fn refused(
        &self,
        checked: Result<bool, (u16, InsufficientCapacity)>,
        entries: &mut [Entry],
        grpc: bool,
    ) -> Response<Bytes> {
        match checked {
            Err((rule, e)) => {
                bump(&self.rules[usize::from(rule)].counters.errors);
                response::cost_too_high(
                    &self.rules[usize::from(rule)].rule.name,
                    e.requested,
                    e.capacity,
                )
            }
            _ => {
                if self.extras {
                    self.start_blocks(entries);
                }
                self.reject(grpc, entries)
            }
        }
    }

    /// What waits for an admitted request's response, made if need be.
    pub(super) fn later_of<'a>(self: &Arc<Self>, after: &'a mut Option<After>) -> &'a mut Later {
        let a = after.get_or_insert_with(|| After {
            headers: Admitted::NONE,
            later: None,
        });
        let shared: Arc<dyn Refunds> = self.clone();
        a.later.get_or_insert_with(|| Box::new(Later::new(shared)))
    }

    /// The 429 for a request the enforced rules denied (the 503 of one a
    /// concurrency rule shared by every client shed).
    #[inline]
    pub(super) fn reject(&self, grpc: bool, entries: &[Entry]) -> Response<Bytes> {
        response::reject(
            &self.rules,
            self.headers,
            self.responder.as_ref(),
            grpc,
            self.concurrent && self.shed(entries),
            entries,
        )
    }
}

/// The request head the check reads.
pub(super) struct RequestHead<'a> {
    pub(super) method: &'a Method,
    pub(super) uri: &'a Uri,
    pub(super) headers: &'a HeaderMap,
    pub(super) extensions: &'a http::Extensions,
}
