//! The layer's rules as built, and a request's matching rules: what the
//! engine checks and what the headers and responses are made from.
//!
//! Each [`Compiled`] rule holds its limit (a local table or a Redis
//! limiter), its `RateLimit-Policy` item and `RateLimit` prefix rendered
//! once at build, and its counters. Each [`Entry`] is one rule that matched
//! one request: its key, cost and decision.

use super::concurrent::ConcLimit;
use super::lockout::Lockout;
use super::rule::Rule;
use super::stats::{Counters, RuleStats};
use super::tier::TierPick;
use crate::clock::Clock;
use crate::decision::Decision;
use crate::keyed::KeyedPolicyLimiter;
#[cfg(feature = "redis")]
use crate::redis::RedisLimiter;
use crossbeam_utils::CachePadded;
use http::HeaderValue;
use smallvec::SmallVec;
#[cfg(feature = "redis")]
use std::sync::Arc;

/// How many matching rules fit on the stack; more spill to the heap.
pub(super) const INLINE_RULES: usize = 4;

/// Where a rule's state lives: a local table, checked synchronously, or
/// (feature `redis`) Redis, checked on the asynchronous path (see the
/// module docs).
// One per rule, built once: boxing the local table would cost a pointer
// chase on every local check.
#[allow(clippy::large_enum_variant)]
pub(super) enum RuleLimit<C: Clock> {
    Local(KeyedPolicyLimiter<u128, C>),
    #[cfg(feature = "redis")]
    Redis(Arc<RedisLimiter>),
    /// A Redis concurrency rule (its limiter in `Compiled::conc`): keyed by
    /// bytes, like a Redis rule, and checked on the Redis path.
    #[cfg(feature = "redis")]
    RedisConcurrent,
}

/// A rule as built.
pub(super) struct Compiled<C: Clock> {
    pub(super) rule: Rule,
    pub(super) limit: RuleLimit<C>,
    pub(super) policy_item: Option<HeaderValue>,
    /// `"name";r=`: the start of the rule's `RateLimit` item.
    pub(super) ratelimit_prefix: Box<[u8]>,
    pub(super) counters: CachePadded<Counters>,
    /// Applies to every request: on (not `Mode::Off`), with no matcher.
    pub(super) always: bool,
    /// The index of the rule this limit belongs to: its own, or for a
    /// tier's limit the rule's. A tier's limit sits after every rule, in
    /// `Mode::Off` (the scan of a request's rules passes it by); entries
    /// reach it through the rule's [`TierPick`].
    pub(super) base: u16,
    /// The rule's tiers (on the rule's own entry only).
    pub(super) tiers: Option<Box<TierPick>>,
    /// The rule's lockout (local rules, on the rule's own entry only).
    pub(super) lockout: Option<Lockout<C>>,
    /// A concurrency rule's limit. Such a rule's `limit` is an unused
    /// one-key table: keeping [`RuleLimit`] a single variant without Redis
    /// keeps `local()` free of a branch on every rate check. Boxed: inline,
    /// it would grow every rule past its cache lines (1,920 bytes), and
    /// the rate-only check's cost with the stride.
    pub(super) conc: Option<Box<ConcLimit<C>>>,
}

impl<C: Clock> Compiled<C> {
    /// Whether this is a concurrency rule (its headers have no `t`).
    #[inline]
    pub(super) fn is_concurrent(&self) -> bool {
        self.conc.is_some()
    }

    #[inline]
    pub(super) fn local(&self) -> Option<&KeyedPolicyLimiter<u128, C>> {
        match &self.limit {
            RuleLimit::Local(l) => Some(l),
            #[cfg(feature = "redis")]
            RuleLimit::Redis(_) | RuleLimit::RedisConcurrent => None,
        }
    }

    #[cfg(feature = "redis")]
    #[inline]
    pub(super) fn remote(&self) -> Option<&RedisLimiter> {
        match &self.limit {
            RuleLimit::Redis(l) => Some(l),
            RuleLimit::Local(_) | RuleLimit::RedisConcurrent => None,
        }
    }

    /// The backend of a Redis rule (rate or concurrency).
    #[cfg(feature = "redis")]
    pub(super) fn redis_backend(&self) -> Option<&crate::redis::RedisBackend> {
        match &self.limit {
            RuleLimit::Redis(l) => Some(l.backend()),
            RuleLimit::RedisConcurrent => self.conc.as_ref()?.redis().map(|l| l.backend()),
            RuleLimit::Local(_) => None,
        }
    }
}

/// Each rule's counters, its tiers' counted in: one [`RuleStats`] per rule.
pub(super) fn stats<C: Clock>(rules: &[Compiled<C>]) -> Vec<RuleStats> {
    rules
        .iter()
        .enumerate()
        .filter(|&(i, r)| usize::from(r.base) == i)
        .map(|(i, r)| {
            let tiers = rules
                .iter()
                .filter(|t| usize::from(t.base) == i && !std::ptr::eq(*t, r));
            let mut sum = r.counters.snapshot(r.rule.name.clone());
            if let Some(c) = &r.conc {
                sum.in_flight = c.in_flight();
                sum.max_in_flight = Some(c.max());
                sum.shed = c.shed.get();
            }
            for t in tiers {
                sum.absorb(t.counters.snapshot(r.rule.name.clone()));
            }
            sum
        })
        .collect()
}

/// One matching rule of one request.
#[derive(Clone, Copy)]
pub(super) struct Entry {
    pub(super) rule: u16,
    pub(super) key: u128,
    pub(super) cost: u64,
    pub(super) shadow: bool,
    /// The table did not track the key (its decision's `Tracking`), for
    /// the `untracked` counter: kept even when the decision is not.
    pub(super) untracked: bool,
    pub(super) decision: Option<Decision>,
}

/// A request's matching rules, on the stack up to [`INLINE_RULES`].
pub(super) type Entries = SmallVec<[Entry; INLINE_RULES]>;
