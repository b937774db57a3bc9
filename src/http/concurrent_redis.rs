//! Redis concurrency rules (features `tower` and `redis`): a concurrency
//! rule whose permits live in Redis ([`RedisConcurrencyLimiter`]), so its
//! bound holds across every instance of the service, and its step on the
//! Redis path of the check (`remote_check.rs`).
//!
//! Order of the takes (docs/http.md, "Redis concurrency rules"): the Redis
//! rate rules (one script, all or nothing), then these permits, one call
//! each, then the local rules. A denial or a failure here gives back the
//! permits taken before it (awaited, so the request holds none when it is
//! answered) and the caller gives back the Redis rate units; a local
//! denial after them releases them the same way.

use super::compiled::Entries;
use super::concurrent::Concurrency;
use super::engine::Shared;
use super::key::Key;
use super::rule::Rule;
use super::stats::{self, bump};
use crate::clock::Clock;
use crate::decision::Decision;
use crate::redis::{DecisionSource, RedisConcurrencyLimiter, RedisPermit};
use crate::{Policy, Window};
use bytes::Bytes;
use futures_util::future::join_all;
use http::Response;
use std::sync::Arc;

impl Rule {
    /// The default name of the Redis limiter this rule is on, if it kept
    /// one (a rule takes its limiter's name; see [`Rule::redis`]).
    pub(super) fn unnamed_redis_limiter(&self) -> Option<String> {
        let conc = self.concurrency.as_ref().and_then(|c| c.redis.as_ref());
        match (&self.remote, conc) {
            (Some(l), _) if !l.has_own_name() => Some(l.name().to_owned()),
            (_, Some(l)) if !l.has_own_name() => Some(l.name().to_owned()),
            _ => None,
        }
    }

    /// A concurrency rule whose permits live in Redis (features `tower`
    /// and `redis`): at most [`limiter.max()`](RedisConcurrencyLimiter::max)
    /// of the requests it matches in flight at once under `key`, counted
    /// across every instance that shares the limiter's Redis keys (same
    /// backend, same name). Otherwise as [`Rule::concurrent`]: in the
    /// same all-or-nothing step as the other rules, `429` when keyed by
    /// the client and `503` (shed) under [`Key::global`], the permit held
    /// by the response body. The rule is named after the limiter
    /// ([`RedisConcurrencyLimiter::name`]), as [`Rule::redis`] is: one name
    /// in headers, stats, metrics, logs, store events and Redis keys. A
    /// limiter left with its default name fails the layer's `build`
    /// ([`HttpConfigError::RedisLimiterUnnamed`](super::HttpConfigError::RedisLimiterUnnamed)).
    ///
    /// When Redis cannot answer, the limiter's
    /// [`FailurePolicy`](crate::redis::FailurePolicy) decides: `Open`
    /// admits the request holding nothing, `Closed` answers `503` with
    /// `Retry-After` (the store cannot vouch for the bound),
    /// `FallbackShare` takes a local permit of the limiter's share.
    /// `adaptive`, `keep_for` and `priority_by_header` do not apply
    /// ([`HttpConfigError::Policy`](super::HttpConfigError::Policy)).
    ///
    /// ```no_run
    /// use ratewall::http::{Key, RateLimitLayer, Rule};
    /// use ratewall::redis::{RedisBackend, RedisConcurrencyLimiter};
    ///
    /// # fn f() -> Result<(), Box<dyn std::error::Error>> {
    /// let redis = RedisBackend::builder("redis://127.0.0.1:6379").build()?;
    /// // At most 4 reports per API key at once, across the fleet.
    /// let reports = RedisConcurrencyLimiter::builder(4, &redis).name("reports").build()?;
    /// let layer = RateLimitLayer::builder()
    ///     .rule(Rule::redis_concurrent(Key::header("x-api-key"), reports))
    ///     .build()?;
    /// # let _ = layer;
    /// # Ok(()) }
    /// ```
    pub fn redis_concurrent(key: Key, limiter: impl Into<Arc<RedisConcurrencyLimiter>>) -> Rule {
        let limiter = limiter.into();
        let max = limiter.max();
        let name = limiter.name().to_owned();
        let mut rule = Rule::new(name, key, Policy::fixed_window(Window::per_second(max)));
        let mut c = Concurrency::new(max);
        c.redis = Some(limiter);
        rule.concurrency = Some(Box::new(c));
        rule
    }
}

/// A Redis permit denial as a client is told it: the same wait as a local
/// concurrency rule's denial, the mean time a permit is held here (the
/// script's hint, when the first held permit would lapse, is an upper bound
/// of the expiry's order: 30 s where the route takes 200 ms).
fn told(d: Decision, mean_hold: std::time::Duration) -> Decision {
    if d.is_allowed() {
        return d;
    }
    let hold = u64::try_from(mean_hold.as_nanos()).unwrap_or(u64::MAX);
    Decision::deny(d.limit(), d.remaining(), hold, hold)
}

/// The Redis permits of a request, in rule order.
pub(super) type RedisPermits = Vec<RedisPermit>;

impl<C: Clock + 'static> Shared<C> {
    /// Takes the permits of the request's Redis concurrency rules, in rule
    /// order, writing each decision into its entry and its source into
    /// `sources`. A denial answers `429` (`503` under a rule shared by
    /// every client), a failure what a Redis failure answers; either way
    /// the permits taken before are released first.
    pub(super) async fn take_redis_permits(
        &self,
        entries: &mut Entries,
        keys: &[(usize, Vec<u8>)],
        grpc: bool,
        sources: &mut Vec<(usize, DecisionSource)>,
    ) -> Result<RedisPermits, Response<Bytes>> {
        let mut taken = RedisPermits::new();
        for (i, k) in keys {
            let e = entries[*i];
            let r = &self.rules[usize::from(e.rule)];
            let Some(l) = r.conc.as_ref().and_then(|c| c.redis()) else {
                continue;
            };
            match l.try_acquire_key_n(k, e.cost).await {
                Ok(a) => {
                    let d = a.decision();
                    entries[*i].decision = Some(told(d.decision(), l.mean_hold_time()));
                    sources.push((*i, d.source()));
                    self.count_source(r, d.source());
                    if let Some(p) = a.into_permit() {
                        taken.push(p);
                        continue;
                    }
                    release(taken).await;
                    match r.conc.as_ref().filter(|c| c.sheds) {
                        Some(c) => bump(&c.shed),
                        None => {
                            let key = r.counters.remote_key(k, &self.fp);
                            stats::denied(&r.counters, key, false, entries[*i].decision);
                        }
                    }
                    return Err(self.reject(grpc, entries));
                }
                Err(err) => {
                    release(taken).await;
                    return Err(self.remote_error(grpc, entries, &[*i], err));
                }
            }
        }
        Ok(taken)
    }

    /// Counts the Redis concurrency entries of an admitted request.
    pub(super) fn count_redis_permits(&self, entries: &Entries, keys: &[(usize, Vec<u8>)]) {
        for (i, _) in keys {
            let r = &self.rules[usize::from(entries[*i].rule)];
            if r.conc.as_ref().is_some_and(|c| c.redis().is_some()) {
                bump(&r.counters.allowed);
            }
        }
    }
}

/// Releases permits a request will not use, before it is answered (a
/// release Redis cannot take leaves the permit to its expiry).
pub(super) async fn release(permits: RedisPermits) {
    if !permits.is_empty() {
        let _ = join_all(permits.into_iter().map(RedisPermit::release)).await;
    }
}
