//! The asynchronous check of a request that matches Redis rules (features
//! `tower` and `redis`), reached from `Shared::check` (`engine.rs`): the
//! Redis rules first, all or nothing among themselves; then the local
//! rules through the synchronous check; a local denial gives the Redis
//! units back. Also what a Redis failure answers, and the refunds of
//! count-only-failures Redis rules.

use super::compiled::{Compiled, Entries, Entry, INLINE_RULES};
use super::concurrent::{Classes, Permit, Taken};
use super::concurrent_redis::release;
use super::engine::{RemoteRefunds, Shared, Verdict};
use super::info::RateLimitInfo;
use super::response;
use super::stats::{self, bump};
use crate::clock::Clock;
use crate::decision::Tracking;
use crate::redis::{check_all, check_all_locked, DecisionSource, Locked, RedisError, RedisLimiter};
use bytes::Bytes;
use futures_util::future::join_all;
use http::header::{HeaderValue, RETRY_AFTER};
use http::Response;
use smallvec::SmallVec;
use std::sync::Arc;

impl<C: Clock + 'static> Shared<C> {
    /// Decides a request whose matching rules include Redis rules.
    /// `keys` holds (entry index, key bytes) of each Redis entry.
    pub(super) async fn check_remote(
        self: Arc<Self>,
        mut entries: Entries,
        keys: Vec<(usize, Vec<u8>)>,
        grpc: bool,
        classes: Classes,
    ) -> (Verdict, Option<RateLimitInfo>) {
        let rule_of = |e: &Entry| &self.rules[usize::from(e.rule)];
        let mut sources: Vec<(usize, DecisionSource)> = Vec::with_capacity(keys.len());
        // 1. The enforced Redis rules, all or nothing (one script on one server).
        let mut idx = Vec::with_capacity(keys.len());
        let mut triples: Vec<(&RedisLimiter, &[u8], u64)> = Vec::with_capacity(keys.len());
        for (i, k) in &keys {
            let e = &entries[*i];
            if let (false, Some(l)) = (e.shadow, rule_of(e).remote()) {
                idx.push(*i);
                triples.push((l, &k[..], e.cost));
            }
        }
        if !triples.is_empty() {
            let locked = idx.iter().any(|&i| self.redis_block(&entries[i]).is_some());
            let checked = if locked {
                let limits: Vec<Locked<'_>> = idx
                    .iter()
                    .zip(&triples)
                    .map(|(&i, &(limit, key, cost))| Locked {
                        limit,
                        key,
                        cost,
                        block: self.redis_block(&entries[i]),
                    })
                    .collect();
                check_all_locked(&limits).await
            } else {
                check_all(&triples).await
            };
            match checked {
                Ok((allowed, decisions)) => {
                    for (&i, d) in idx.iter().zip(&decisions) {
                        entries[i].decision = Some(d.decision());
                        sources.push((i, d.source()));
                        self.count_source(rule_of(&entries[i]), d.source());
                    }
                    if !allowed {
                        for (&i, &(_, k, _)) in idx.iter().zip(&triples) {
                            if entries[i].decision.is_some_and(|d| !d.is_allowed()) {
                                let c = &rule_of(&entries[i]).counters;
                                stats::denied(
                                    c,
                                    c.remote_key(k, &self.fp),
                                    false,
                                    entries[i].decision,
                                );
                            }
                        }
                        return (Verdict::Reject(self.reject(grpc, &entries)), None);
                    }
                }
                Err(e) => {
                    return (
                        Verdict::Reject(self.remote_error(grpc, &entries, &idx, e)),
                        None,
                    )
                }
            }
        }
        // 2. The Redis concurrency rules' permits (`concurrent_redis.rs`); a
        // denial or a failure gives the Redis units back.
        let redis_permits = if self.concurrent {
            match self
                .take_redis_permits(&mut entries, &keys, grpc, &mut sources)
                .await
            {
                Ok(p) => p,
                Err(res) => {
                    self.give_back_units(&entries, &idx, &triples, &sources)
                        .await;
                    return (Verdict::Reject(res), None);
                }
            }
        } else {
            Vec::new()
        };
        // 3. The local enforced rules (with concurrency rules, all or nothing
        // with them), synchronously; a denial releases the Redis permits and
        // gives the Redis units back (to where they were taken).
        let (local, mut permits) = if self.concurrent {
            self.check_mixed(&mut entries, &classes)
        } else {
            (self.check_enforced(&mut entries, true), Taken::none())
        };
        if !matches!(local, Ok(true)) {
            release(redis_permits).await;
            self.give_back_units(&entries, &idx, &triples, &sources)
                .await;
            return (
                Verdict::Reject(self.refused(local, &mut entries, grpc)),
                None,
            );
        }
        if !redis_permits.is_empty() {
            self.count_redis_permits(&entries, &keys);
            permits
                .body
                .extend(redis_permits.into_iter().map(Permit::Redis));
        }
        let held = permits.held();
        for &i in &idx {
            let c = &rule_of(&entries[i]).counters;
            bump(&c.allowed);
            if entries[i].decision.map(|d| d.tracking()) == Some(Tracking::Untracked) {
                bump(&c.untracked);
            }
            #[cfg(feature = "metrics")]
            stats::observe(c, entries[i].decision, rule_of(&entries[i]).local());
        }
        drop(triples);
        // 4. Shadow rules, local then Redis, never rejecting.
        self.check_shadow(&mut entries);
        let shadow: Vec<(usize, &RedisLimiter, &[u8], u64)> = keys
            .iter()
            .filter_map(|(i, k)| {
                let e = &entries[*i];
                let l = rule_of(e).remote()?;
                e.shadow.then_some((*i, l, &k[..], e.cost))
            })
            .collect();
        if !shadow.is_empty() {
            let results =
                join_all(shadow.iter().map(|&(_, l, k, cost)| l.check_key_n(k, cost))).await;
            for (&(i, _, k, _), r) in shadow.iter().zip(results) {
                let c = &rule_of(&entries[i]).counters;
                match r {
                    Ok(d) => {
                        if d.is_allowed() {
                            bump(&c.allowed);
                        } else {
                            stats::denied(c, c.remote_key(k, &self.fp), true, Some(d.decision()));
                        }
                        self.count_source(rule_of(&entries[i]), d.source());
                        entries[i].decision = Some(d.decision());
                        sources.push((i, d.source()));
                    }
                    Err(_) => bump(&c.errors),
                }
            }
        }
        let info = self.decisions_extension.then(|| {
            let mut info = RateLimitInfo::of(&self.names, &entries);
            info.sources = sources.iter().map(|&(i, s)| (entries[i].rule, s)).collect();
            info
        });
        // 5. Headers, and the refunds of count-only-failures rules.
        let mut after = if self.concurrent {
            self.after::<true>(&entries)
        } else {
            self.after::<false>(&entries)
        };
        self.hold(&mut after, held);
        let refunds: RemoteRefunds = keys
            .iter()
            .filter_map(|(i, k)| {
                let e = &entries[*i];
                let r = rule_of(e);
                let (_, source) = *sources.iter().find(|(j, _)| j == i)?;
                let d = e.decision?;
                let taken = matches!(source, DecisionSource::Redis | DecisionSource::Fallback)
                    && d.is_allowed();
                (!e.shadow && e.cost > 0 && r.rule.refund_on_success && taken)
                    .then(|| (e.rule, k.clone(), e.cost, source))
            })
            .collect();
        if !refunds.is_empty() {
            self.later_of(&mut after).remote = refunds;
        }
        (Verdict::Pass(after), info)
    }

    /// Gives back the units the Redis rate rules took for a request that
    /// is then denied (to where they were taken). A give-back Redis cannot
    /// take follows the limiter's failure policy; the capacity then comes
    /// back as the limit refills.
    async fn give_back_units(
        &self,
        entries: &Entries,
        idx: &[usize],
        triples: &[(&RedisLimiter, &[u8], u64)],
        sources: &[(usize, DecisionSource)],
    ) {
        let give_backs = idx.iter().zip(triples).zip(sources).filter_map(
            |((&i, &(l, k, cost)), &(_, source))| {
                let taken = entries[i].decision.is_some_and(|d| d.is_allowed());
                (taken && cost > 0).then(|| l.give_back(k, cost, source))
            },
        );
        let _ = join_all(give_backs).await;
    }

    /// The lockout of a Redis entry's rule: the rule's own limiter (whose
    /// keys name the block, for every tier) and the block's length.
    fn redis_block(&self, e: &Entry) -> Option<(&RedisLimiter, std::time::Duration)> {
        let base = &self.rules[usize::from(self.rules[usize::from(e.rule)].base)];
        Some((base.remote()?, base.rule.block_for?))
    }

    /// Counts where a Redis rule's decision came from.
    pub(super) fn count_source(&self, r: &Compiled<C>, source: DecisionSource) {
        match source {
            DecisionSource::Fallback => bump(&r.counters.fallbacks),
            DecisionSource::FailOpen => bump(&r.counters.errors),
            _ => {}
        }
    }

    /// The response when the Redis rules could not be decided.
    pub(super) fn remote_error(
        &self,
        grpc: bool,
        entries: &Entries,
        idx: &[usize],
        e: RedisError,
    ) -> Response<Bytes> {
        let rule_of = |i: usize| &self.rules[usize::from(entries[i].rule)];
        match e {
            RedisError::InsufficientCapacity(c) => {
                let culprit = idx
                    .iter()
                    .map(|&i| rule_of(i))
                    .find(|r| c.requested > r.rule.policy.limit())
                    .or_else(|| idx.first().map(|&i| rule_of(i)));
                if let Some(r) = culprit {
                    bump(&r.counters.errors);
                }
                let name = culprit.map_or("", |r| r.rule.name.as_str());
                response::cost_too_high(name, c.requested, c.capacity)
            }
            e => {
                // Only a fail-closed limiter returns `Unavailable` (the store
                // failed: see `redis/fault.rs`); the other error, `Server`
                // (a key holding another policy's data), is every rule's.
                let closed: SmallVec<[&Compiled<C>; INLINE_RULES]> = idx
                    .iter()
                    .map(|&i| rule_of(i))
                    .filter(|r| {
                        r.remote().is_some_and(|l| {
                            l.failure_policy() == crate::redis::FailurePolicy::Closed
                        })
                    })
                    .collect();
                let blamed: SmallVec<[&Compiled<C>; INLINE_RULES]> =
                    if matches!(e, RedisError::Unavailable { .. }) && !closed.is_empty() {
                        closed
                    } else {
                        idx.iter().map(|&i| rule_of(i)).collect()
                    };
                for r in &blamed {
                    bump(&r.counters.errors);
                }
                let retry = match e {
                    RedisError::Unavailable { retry_in, .. } => {
                        retry_in.as_nanos().div_ceil(1_000_000_000).max(1) as u64
                    }
                    _ => 1,
                };
                let names: SmallVec<[&str; INLINE_RULES]> =
                    blamed.iter().map(|r| r.rule.name.as_str()).collect();
                // Never a warning per request: a store that starts failing
                // and recovers is reported once each, by its limiters' store
                // events (`on_store_event`, and `tracing` warnings); a key
                // that holds another policy's data is a configuration
                // error, warned about once per layer.
                if let RedisError::Server { .. } = e {
                    self.warn(
                        &self.warn_foreign_key,
                        "a Redis rule's key holds another policy's data (two rules or programs share a key prefix and name): \
                         give each Redis limiter its own name or prefix; such requests are answered 503",
                    );
                }
                #[cfg(feature = "tracing")]
                tracing::debug!(target: "ratewall::http", rules = ?names, error = %e, "rate-limit store could not decide");
                if grpc {
                    // UNAVAILABLE: the client may retry.
                    let mut res = response::grpc_status("14", "rate-limit store unavailable");
                    res.headers_mut()
                        .insert(RETRY_AFTER, HeaderValue::from(retry));
                    res
                } else {
                    let unchecked =
                        response::Unchecked::of(blamed.iter().map(|r| r.conc.is_some()));
                    response::store_unavailable(&names, retry, unchecked)
                }
            }
        }
    }

    /// Gives the units of count-only-failures Redis rules back, in a task
    /// on the current tokio runtime (the response is not held for it).
    pub(super) fn refund_remote_now(self: Arc<Self>, list: RemoteRefunds) {
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                handle.spawn(async move {
                    for (rule, key, cost, source) in list {
                        let Some(r) = self.rules.get(usize::from(rule)) else {
                            continue;
                        };
                        if let Some(l) = r.remote() {
                            match l.give_back(&key, cost, source).await {
                                Ok(()) => bump(&r.counters.refunded),
                                Err(_) => bump(&r.counters.errors),
                            }
                        }
                    }
                });
            }
            // No runtime to send the refund from: it is lost (counted).
            Err(_) => {
                for (rule, ..) in list {
                    if let Some(r) = self.rules.get(usize::from(rule)) {
                        bump(&r.counters.errors);
                    }
                }
            }
        }
    }
}
