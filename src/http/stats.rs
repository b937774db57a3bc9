//! Each rule's counters: the atomics the engine bumps per request
//! ([`Counters`]) and the snapshot [`RateLimitLayer::stats`](super::RateLimitLayer::stats)
//! returns ([`RuleStats`]).

#[cfg(feature = "redis")]
use super::key::Fingerprint;
use super::key::Shown;
use crate::decision::Decision;
use crate::offenders::TopOffenders;
use crate::sync::{AtomicU64, Ordering};
#[cfg(feature = "redis")]
use std::net::IpAddr;
use std::net::Ipv6Addr;

/// One rule's counters (a snapshot from [`RateLimitLayer::stats`](super::RateLimitLayer::stats)).
///
/// ```
/// # use ratewall::http::{RateLimitLayer, Rule};
/// # use ratewall::{Policy, Rate};
/// let layer = RateLimitLayer::builder()
///     .rule(Rule::global("all", Policy::token_bucket(Rate::per_second(1))))
///     .build()?;
/// let s = &layer.stats()[0];
/// assert_eq!((s.denied(), s.shadow_denied(), s.missing_key(), s.errors(), s.untracked(), s.refunded()), (0, 0, 0, 0, 0, 0));
/// assert_eq!(s.unknown_client(), 0);
/// # Ok::<(), ratewall::http::HttpConfigError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuleStats {
    name: String,
    allowed: u64,
    denied: u64,
    shadow_denied: u64,
    missing_key: u64,
    unknown_client: u64,
    errors: u64,
    fallbacks: u64,
    untracked: u64,
    refunded: u64,
    pub(super) shed: u64,
    pub(super) in_flight: u64,
    pub(super) max_in_flight: Option<u64>,
    top_offenders: Vec<Offender>,
    offender_denials: u64,
}

impl RuleStats {
    /// The rule's name.
    ///
    /// ```
    /// # fn f(s: &ratewall::http::RuleStats) { let _ = s.name(); }
    /// ```
    pub fn name(&self) -> &str {
        &self.name
    }
    /// Requests the rule admitted (enforced or shadow).
    ///
    /// ```
    /// # fn f(s: &ratewall::http::RuleStats) { let _ = s.allowed(); }
    /// ```
    pub fn allowed(&self) -> u64 {
        self.allowed
    }
    /// Requests the rule denied (and the layer rejected).
    ///
    /// ```
    /// # fn f(s: &ratewall::http::RuleStats) { let _ = s.denied(); }
    /// ```
    pub fn denied(&self) -> u64 {
        self.denied
    }
    /// Requests a shadow rule would have denied.
    ///
    /// ```
    /// # fn f(s: &ratewall::http::RuleStats) { let _ = s.shadow_denied(); }
    /// ```
    pub fn shadow_denied(&self) -> u64 {
        self.shadow_denied
    }
    /// Requests the rule matched that had no key for it (no key header,
    /// a key header sent twice, no client address), whatever the rule did
    /// with them: rejected (`when_missing = "reject 401"`,
    /// [`Missing::Reject`](super::Missing::Reject)) or skipped (`"skip"`,
    /// [`Missing::Skip`](super::Missing::Skip)). A skip rule on an optional
    /// header (`key = "header:x-api-key"` beside a per-IP rule) therefore
    /// counts every request without that header: not an error, but the
    /// traffic the rule leaves to the others. Requests the rule does not
    /// match (method, path, route, mode `off`) are never counted.
    ///
    /// ```
    /// # fn f(s: &ratewall::http::RuleStats) { let _ = s.missing_key(); }
    /// ```
    pub fn missing_key(&self) -> u64 {
        self.missing_key
    }
    /// Requests the rule matched whose client address was unknown: the
    /// proxy chain held an unknown, obfuscated or malformed entry where the
    /// walk landed, was longer than [`MAX_HOPS`](super::MAX_HOPS), or a
    /// trusted CDN sent no single client header. Counted whatever the rule
    /// did with them ([`UnknownClient`](super::UnknownClient)); those it
    /// rejected or skipped are also in [`missing_key`](Self::missing_key).
    /// A rule that does not key by the client address never counts any.
    ///
    /// ```
    /// # fn f(s: &ratewall::http::RuleStats) { let _ = s.unknown_client(); }
    /// ```
    pub fn unknown_client(&self) -> u64 {
        self.unknown_client
    }
    /// Requests that cost more than the rule can ever admit, and (Redis
    /// rules) requests Redis could not decide that were failed open or
    /// closed by the limiter's failure policy.
    ///
    /// ```
    /// # fn f(s: &ratewall::http::RuleStats) { let _ = s.errors(); }
    /// ```
    pub fn errors(&self) -> u64 {
        self.errors
    }
    /// Requests of a Redis rule that its local fallback limiter decided
    /// because Redis could not (always 0 for a local rule).
    ///
    /// ```
    /// # fn f(s: &ratewall::http::RuleStats) { assert!(s.fallbacks() <= s.allowed() + s.denied() + s.shadow_denied()); }
    /// ```
    pub fn fallbacks(&self) -> u64 {
        self.fallbacks
    }
    /// Requests admitted untracked because the rule's key table was full.
    ///
    /// ```
    /// # fn f(s: &ratewall::http::RuleStats) { let _ = s.untracked(); }
    /// ```
    pub fn untracked(&self) -> u64 {
        self.untracked
    }
    /// Requests whose units were given back (count-only-failures rules).
    ///
    /// ```
    /// # fn f(s: &ratewall::http::RuleStats) { let _ = s.refunded(); }
    /// ```
    pub fn refunded(&self) -> u64 {
        self.refunded
    }
    /// Requests a concurrency rule shared by every client (global or per
    /// route) shed with `503`: the server protecting itself. A per-client
    /// concurrency rule's denials (`429`) are [`denied`](Self::denied).
    ///
    /// ```
    /// # use ratewall::http::{Key, RateLimitLayer, Rule};
    /// let layer = RateLimitLayer::builder().rule(Rule::concurrent("db", Key::global(), 4)).build()?;
    /// assert_eq!(layer.stats()[0].shed(), 0);
    /// # Ok::<(), ratewall::http::HttpConfigError>(())
    /// ```
    pub fn shed(&self) -> u64 {
        self.shed
    }
    /// A concurrency rule's permits in flight when the stats were read (0
    /// for a rate rule).
    ///
    /// ```
    /// # use ratewall::http::{Key, RateLimitLayer, Rule};
    /// let layer = RateLimitLayer::builder().rule(Rule::concurrent("db", Key::global(), 4)).build()?;
    /// assert_eq!(layer.stats()[0].in_flight(), 0);
    /// # Ok::<(), ratewall::http::HttpConfigError>(())
    /// ```
    pub fn in_flight(&self) -> u64 {
        self.in_flight
    }

    /// A concurrency rule's maximum when the stats were read: the most
    /// permits it admits at once (per key, for a per-key rule), which for
    /// an adaptive rule is its current maximum, between its floor and
    /// ceiling. `None` for a rate rule.
    ///
    /// ```
    /// # use ratewall::http::{Key, RateLimitLayer, Rule};
    /// # use ratewall::{Adaptive, Policy, Rate};
    /// let layer = RateLimitLayer::builder()
    ///     .rule(Rule::concurrent("db", Key::global(), 16).adaptive(Adaptive::vegas(4, 64)))
    ///     .rule(Rule::per_ip("ip", Policy::token_bucket(Rate::per_second(10))))
    ///     .build()?;
    /// assert_eq!(layer.stats()[0].max_in_flight(), Some(16));
    /// assert_eq!(layer.stats()[1].max_in_flight(), None);
    /// # Ok::<(), ratewall::http::HttpConfigError>(())
    /// ```
    pub fn max_in_flight(&self) -> Option<u64> {
        self.max_in_flight
    }

    /// The keys this rule denied most (shadow rules: would have denied),
    /// highest count first: a fixed-memory Space-Saving summary of the
    /// rule's denials that monitors 64 keys. Each count overestimates the
    /// key's true number of denials by at most its
    /// [`error`](Offender::error), which is at most
    /// [`offender_denials`](Self::offender_denials)` / 64`; every key denied
    /// more often than that is listed. Client addresses are shown in full,
    /// every other key (API keys, tokens, ...) as a fingerprint (see
    /// [`Offender::key`]).
    ///
    /// ```
    /// # use ratewall::http::{RateLimitLayer, Rule};
    /// # use ratewall::{Policy, Rate};
    /// let layer = RateLimitLayer::builder()
    ///     .rule(Rule::per_ip("ip", Policy::token_bucket(Rate::per_second(1))))
    ///     .build()?;
    /// // Nothing denied yet.
    /// assert!(layer.stats()[0].top_offenders().is_empty());
    /// # Ok::<(), ratewall::http::HttpConfigError>(())
    /// ```
    pub fn top_offenders(&self) -> &[Offender] {
        &self.top_offenders
    }

    /// The denials the top offenders summarize (`denied` plus
    /// `shadow_denied` of requests that had a key): the `n` of the error
    /// bound `n / 64`.
    ///
    /// ```
    /// # fn f(s: &ratewall::http::RuleStats) {
    /// let bound = s.offender_denials() / 64;
    /// assert!(s.top_offenders().iter().all(|o| o.error() <= bound));
    /// # }
    /// ```
    pub fn offender_denials(&self) -> u64 {
        self.offender_denials
    }
}

impl RuleStats {
    /// Adds `other`, the stats of another limit of the same rule (one of
    /// its premium tiers), to these: the counters add up, and the top
    /// offenders are the two summaries' union (a key in both: counts and
    /// errors added, so `count - error <= true <= count` still holds), the
    /// largest [`TOP_OFFENDERS`] kept.
    pub(super) fn absorb(&mut self, other: RuleStats) {
        self.allowed += other.allowed;
        self.denied += other.denied;
        self.shadow_denied += other.shadow_denied;
        self.missing_key += other.missing_key;
        self.unknown_client += other.unknown_client;
        self.errors += other.errors;
        self.fallbacks += other.fallbacks;
        self.untracked += other.untracked;
        self.refunded += other.refunded;
        self.shed += other.shed;
        self.in_flight += other.in_flight;
        self.offender_denials += other.offender_denials;
        for o in other.top_offenders {
            match self.top_offenders.iter_mut().find(|m| m.key == o.key) {
                Some(m) => {
                    m.count += o.count;
                    m.error += o.error;
                }
                None => self.top_offenders.push(o),
            }
        }
        // Largest first; ties by key, so the order does not depend on
        // which limit was read first.
        self.top_offenders
            .sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.key.cmp(&b.key)));
        self.top_offenders.truncate(TOP_OFFENDERS);
    }
}

/// A key among a rule's top offenders ([`RuleStats::top_offenders`]).
///
/// ```
/// # fn f(s: &ratewall::http::RuleStats) {
/// for o in s.top_offenders() {
///     // At least count - error denials, at most count.
///     println!("{} denied {}..={} times", o.key(), o.count() - o.error(), o.count());
/// }
/// # }
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Offender {
    key: String,
    count: u64,
    error: u64,
}

impl Offender {
    /// The key as operators may see it: a client address in full
    /// (`192.0.2.7`, or `2001:db8::/64` for a prefix-keyed rule); any other
    /// key, which may be a secret (an API key or token from a header, an
    /// extension's value), only as `#` and 16 hex digits of the layer's
    /// 128-bit fingerprint of it (seeded per layer: the same key shows the
    /// same fingerprint within one layer's life, and nothing of the key).
    ///
    /// ```
    /// # fn f(o: &ratewall::http::Offender) { let _ = o.key(); }
    /// ```
    pub fn key(&self) -> &str {
        &self.key
    }

    /// Denials counted for the key: at least its true number, at most that
    /// plus [`error`](Self::error).
    ///
    /// ```
    /// # fn f(o: &ratewall::http::Offender) { assert!(o.count() >= o.error()); }
    /// ```
    pub fn count(&self) -> u64 {
        self.count
    }

    /// The most [`count`](Self::count) may overestimate (0: exact).
    ///
    /// ```
    /// # fn f(o: &ratewall::http::Offender) { let exact_at_least = o.count() - o.error(); }
    /// ```
    pub fn error(&self) -> u64 {
        self.error
    }
}

/// One live counter: the atomic the snapshot reads and, with the
/// `metrics` feature, the facade handle registered once at build.
pub(super) struct Counter {
    n: AtomicU64,
    #[cfg(feature = "metrics")]
    metric: ::metrics::Counter,
}

impl Counter {
    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    pub(super) fn new(rule: &str, outcome: &'static str) -> Counter {
        Counter {
            n: AtomicU64::new(0),
            #[cfg(feature = "metrics")]
            metric: crate::metrics::http_outcome(rule, outcome),
        }
    }

    pub(super) fn get(&self) -> u64 {
        // Relaxed: independent counters; a snapshot may be mid-request.
        self.n.load(Ordering::Relaxed)
    }
}

/// How many keys each rule's top-offender summary monitors.
pub(super) const TOP_OFFENDERS: usize = 64;

/// One rule's live counters, its top offenders and (feature `metrics`)
/// the facade handles of what the counters do not cover.
pub(super) struct Counters {
    pub(super) allowed: Counter,
    pub(super) denied: Counter,
    pub(super) shadow_denied: Counter,
    pub(super) missing_key: Counter,
    pub(super) unknown_client: Counter,
    pub(super) errors: Counter,
    pub(super) fallbacks: Counter,
    pub(super) untracked: Counter,
    pub(super) refunded: Counter,
    shown: Shown,
    offenders: TopOffenders<u128>,
    #[cfg(feature = "metrics")]
    extra: crate::metrics::HttpExtra,
}

impl Counters {
    /// The counters of the rule named `name` (of its premium tier `tier`,
    /// `""` for its own policy), whose keys are shown as `shown`;
    /// `max_keys`: its table's capacity (none for a Redis rule).
    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    pub(super) fn new(name: &str, tier: &str, shown: Shown, max_keys: Option<usize>) -> Counters {
        Counters {
            allowed: Counter::new(name, "allowed"),
            denied: Counter::new(name, "denied"),
            shadow_denied: Counter::new(name, "shadow_denied"),
            missing_key: Counter::new(name, "missing_key"),
            unknown_client: Counter::new(name, "unknown_client"),
            errors: Counter::new(name, "error"),
            fallbacks: Counter::new(name, "fallback"),
            untracked: Counter::new(name, "untracked"),
            refunded: Counter::new(name, "refunded"),
            shown,
            offenders: TopOffenders::new(TOP_OFFENDERS),
            #[cfg(feature = "metrics")]
            extra: crate::metrics::HttpExtra::new(name, tier, max_keys),
        }
    }

    /// A snapshot of the counters of the rule named `name`.
    pub(super) fn snapshot(&self, name: String) -> RuleStats {
        let (top, n) = self.offenders.top();
        RuleStats {
            name,
            allowed: self.allowed.get(),
            denied: self.denied.get(),
            shadow_denied: self.shadow_denied.get(),
            missing_key: self.missing_key.get(),
            unknown_client: self.unknown_client.get(),
            errors: self.errors.get(),
            fallbacks: self.fallbacks.get(),
            untracked: self.untracked.get(),
            refunded: self.refunded.get(),
            shed: 0,
            in_flight: 0,
            max_in_flight: None,
            top_offenders: top
                .into_iter()
                .map(|c| Offender {
                    key: show(self.shown, c.key),
                    count: c.count,
                    error: c.error,
                })
                .collect(),
            offender_denials: n,
        }
    }

    /// The key under which a Redis rule's key bytes are summarized: an
    /// address (the text `extract_bytes` wrote) as `ip_key` has it, any
    /// other key as its fingerprint.
    #[cfg(feature = "redis")]
    pub(super) fn remote_key(&self, bytes: &[u8], fp: &Fingerprint) -> u128 {
        let ip = std::str::from_utf8(bytes).ok().and_then(|t| {
            let addr = t.split('/').next()?;
            addr.parse::<IpAddr>().ok()
        });
        match (self.shown, ip) {
            (Shown::Ip { .. }, Some(IpAddr::V4(v4))) => u128::from(v4.to_ipv6_mapped()),
            (Shown::Ip { .. }, Some(IpAddr::V6(v6))) => u128::from(v6),
            _ => fp.of_bytes(bytes),
        }
    }
}

/// An offender's key as operators see it.
fn show(shown: Shown, key: u128) -> String {
    match shown {
        Shown::Ip {
            v4_prefix,
            v6_prefix,
        } => {
            let v6 = Ipv6Addr::from(key);
            match v6.to_ipv4_mapped() {
                Some(v4) if v4_prefix >= 32 => v4.to_string(),
                Some(v4) => format!("{v4}/{v4_prefix}"),
                None if v6_prefix >= 128 => v6.to_string(),
                None => format!("{v6}/{v6_prefix}"),
            }
        }
        Shown::Fingerprint => format!("#{:016x}", (key >> 64) as u64),
    }
}

/// Adds one to a counter.
#[inline]
pub(super) fn bump(c: &Counter) {
    // Relaxed: a statistics counter publishes no other memory.
    c.n.fetch_add(1, Ordering::Relaxed);
    #[cfg(feature = "metrics")]
    c.metric.increment(1);
}

/// Counts a request the rule denied (`shadow`: would have denied) for
/// `key`, and the key among the rule's top offenders. `decision`: the
/// rule's decision, if there is one (a full table's rejection is counted
/// apart too, with the `metrics` feature).
// Out of line and cold: the admitted path's code stays as it was.
#[cold]
#[inline(never)]
#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
pub(super) fn denied(c: &Counters, key: u128, shadow: bool, decision: Option<Decision>) {
    bump(if shadow { &c.shadow_denied } else { &c.denied });
    c.offenders.record(key);
    #[cfg(feature = "metrics")]
    c.extra.denied(decision);
}

/// With the `metrics` feature, what an admitted request's decision says
/// beyond the counters: above the nominal limit, an eviction, and every so
/// often the table's occupancy.
#[cfg(feature = "metrics")]
#[inline]
pub(super) fn observe<C: crate::clock::Clock>(
    c: &Counters,
    decision: Option<Decision>,
    table: Option<&crate::keyed::KeyedPolicyLimiter<u128, C>>,
) {
    c.extra
        .admitted(decision, c.allowed.get(), || table.map(|t| t.len()));
}
