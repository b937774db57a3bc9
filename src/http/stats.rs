//! Each rule's counters: the atomics the engine bumps per request
//! ([`Counters`]) and the snapshot [`RateLimitLayer::stats`](super::RateLimitLayer::stats)
//! returns ([`RuleStats`]).

use crate::sync::{AtomicU64, Ordering};

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
    /// Requests without a key for the rule.
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
}

/// One rule's live counters.
#[derive(Default)]
pub(super) struct Counters {
    pub(super) allowed: AtomicU64,
    pub(super) denied: AtomicU64,
    pub(super) shadow_denied: AtomicU64,
    pub(super) missing_key: AtomicU64,
    pub(super) unknown_client: AtomicU64,
    pub(super) errors: AtomicU64,
    pub(super) fallbacks: AtomicU64,
    pub(super) untracked: AtomicU64,
    pub(super) refunded: AtomicU64,
}

impl Counters {
    /// A snapshot of the counters of the rule named `name`.
    pub(super) fn snapshot(&self, name: String) -> RuleStats {
        // Relaxed: independent counters; a snapshot may be mid-request.
        RuleStats {
            name,
            allowed: self.allowed.load(Ordering::Relaxed),
            denied: self.denied.load(Ordering::Relaxed),
            shadow_denied: self.shadow_denied.load(Ordering::Relaxed),
            missing_key: self.missing_key.load(Ordering::Relaxed),
            unknown_client: self.unknown_client.load(Ordering::Relaxed),
            errors: self.errors.load(Ordering::Relaxed),
            fallbacks: self.fallbacks.load(Ordering::Relaxed),
            untracked: self.untracked.load(Ordering::Relaxed),
            refunded: self.refunded.load(Ordering::Relaxed),
        }
    }
}

/// Adds one to a counter.
#[inline]
pub(super) fn bump(c: &AtomicU64) {
    // Relaxed: a statistics counter publishes no other memory.
    c.fetch_add(1, Ordering::Relaxed);
}
