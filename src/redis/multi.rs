//! All-or-nothing checks across several Redis limits (per IP + per user +
//! per route), for the HTTP layer.
//!
//! # Protocol
//!
//! Every (limit, key, cost) is validated first: an empty key or a cost a
//! limit can never admit is an error, and nothing is taken. Then:
//!
//! - **One server** (every limit on the same backend, distinct keys in one
//!   hash slot if it is a Cluster (see
//!   [`hash_tag_keys`](super::RedisLimiterBuilder::hash_tag_keys)), costs
//!   of at least 1, no live deny-cache entry): one script
//!   (`lua/multi.lua`) decides every limit at one server time and writes
//!   only if all allow. One round trip, atomic, no window.
//! - **Otherwise** (Cluster keys in different slots, or limits on
//!   different backends): every limit is checked **in parallel**
//!   (one script call each); if any denies (or fails with an error), what
//!   the others took is given back, each to where it was taken (Redis or
//!   the local fallback), in parallel, before returning.
//!
//! When Redis cannot answer, each limit's failure policy decides, and the
//! result is still all or nothing (a fallback that took is given back).
//!
//! # The window the parallel path leaves
//!
//! Between the parallel checks and the end of the give-backs (one round trip on a healthy
//! server), the capacity taken from the limits that allowed is visible to
//! other callers: a concurrent request may be **denied** by it. Nobody is
//! ever admitted beyond a limit: units are taken before they count as
//! used, and a rollback only gives back what this call took. If Redis fails
//! between the take and the give-back, the refund follows the limit's
//! failure policy (with `FailurePolicy::Closed` it is lost, and the capacity
//! comes back as the limit refills).

use super::door;
use super::events::Watch;
use super::limiter::RedisLimiter;
use super::wire::{multi_call, parse_multi};
use super::{DecisionSource, RedisDecision, RedisError};
use futures_util::future::join_all;
use redis::cluster_routing::Slot;

/// Checks `(limit, key, cost)` triples all or nothing: each cost is taken
/// from every limit, or from none. Returns whether the request may proceed
/// and one decision per limit, in order (a limit that allowed reports its
/// decision as taken, even when another limit's denial gave it back).
///
/// Limits on one standalone server are decided by one script call (one
/// round trip, atomic). Otherwise the checks run in parallel, one round
/// trip each, and on a denial the give-backs take one more. An empty list
/// allows. See the module notes for the brief window of the parallel path.
///
/// # Example
///
/// ```no_run
/// use ratewall::redis::{check_all, RedisBackend, RedisLimiter};
/// use ratewall::{Policy, Rate, Window};
///
/// # async fn f() -> Result<(), ratewall::redis::RedisError> {
/// let redis = RedisBackend::builder("redis://127.0.0.1:6379").build()?;
/// let per_ip = RedisLimiter::builder(Policy::token_bucket(Rate::per_second(20)), &redis).name("ip").build()?;
/// let per_user = RedisLimiter::builder(Policy::sliding_window_log(Window::per_minute(60)), &redis).name("user").build()?;
/// let (allowed, decisions) = check_all(&[(&per_ip, b"192.0.2.7", 1), (&per_user, b"alice", 1)]).await?;
/// if !allowed {
///     let wait = decisions.iter().map(|d| d.retry_after_secs()).max();
///     // 429 with Retry-After: wait
/// }
/// # Ok(()) }
/// ```
pub async fn check_all(
    limits: &[(&RedisLimiter, &[u8], u64)],
) -> Result<(bool, Vec<RedisDecision>), RedisError> {
    for &(limit, key, cost) in limits {
        limit.validate(key, cost)?;
    }
    if let Some(rkeys) = one_server(limits)? {
        return one_script(limits, &rkeys).await;
    }
    parallel(limits).await
}

/// The limits' Redis keys, if one script can decide them all.
fn one_server(limits: &[(&RedisLimiter, &[u8], u64)]) -> Result<Option<Vec<Vec<u8>>>, RedisError> {
    let Some(&(first, _, _)) = limits.first() else {
        return Ok(None);
    };
    if limits.len() < 2 {
        return Ok(None);
    }
    let mut rkeys = Vec::with_capacity(limits.len());
    for &(limit, key, cost) in limits {
        if cost == 0 || !limit.backend().same(first.backend()) {
            return Ok(None);
        }
        let rkey = limit.redis_key(key)?;
        if rkeys.contains(&rkey) || limit.cached_denial(&rkey) {
            return Ok(None);
        }
        rkeys.push(rkey);
    }
    // A Cluster runs a script only if all its keys share one hash slot
    // (limits built with `hash_tag_keys`, checked on one key, do).
    if first.backend().is_cluster() {
        let slot = Slot::for_key(&rkeys[0]);
        if rkeys.iter().any(|k| Slot::for_key(k) != slot) {
            return Ok(None);
        }
    }
    Ok(Some(rkeys))
}

async fn one_script(
    limits: &[(&RedisLimiter, &[u8], u64)],
    rkeys: &[Vec<u8>],
) -> Result<(bool, Vec<RedisDecision>), RedisError> {
    let invocation = multi_call(
        rkeys,
        limits
            .iter()
            .map(|&(limit, _, cost)| (limit.program(), cost)),
    );
    let watches: Vec<&Watch> = limits.iter().map(|&(limit, _, _)| limit.watch()).collect();
    let got = limits[0]
        .0
        .backend()
        .invoke(&watches, &invocation, |v| parse_multi(&v, limits.len()))
        .await;
    match got {
        Ok((all, raw)) => {
            let mut decisions = Vec::with_capacity(limits.len());
            for (i, (&(limit, _, cost), raw)) in limits.iter().zip(raw).enumerate() {
                limit.note(&rkeys[i], cost, &raw);
                decisions.push(door::decided(limit.watch(), limit.redis_decision(raw)));
            }
            Ok((all, decisions))
        }
        Err(RedisError::Unavailable { retry_in, cause }) => {
            finish(limits, failed_over(limits, retry_in, &cause)).await
        }
        Err(e) => Err(e),
    }
}

/// Each limit's failure policy's answer to a script call for them all
/// that the store failed (settled at the door, each limit's own); all or
/// nothing is [`finish`]'s.
pub(super) fn failed_over(
    limits: &[(&RedisLimiter, &[u8], u64)],
    retry_in: std::time::Duration,
    cause: &str,
) -> Vec<Result<RedisDecision, RedisError>> {
    limits
        .iter()
        .map(|&(limit, key, cost)| {
            let failed = Err(RedisError::Unavailable {
                retry_in,
                cause: cause.to_owned(),
            });
            door::settle(limit.watch(), failed, |retry_in, cause| {
                limit.unavailable(key, cost, true, retry_in, cause)
            })
        })
        .collect()
}

async fn parallel(
    limits: &[(&RedisLimiter, &[u8], u64)],
) -> Result<(bool, Vec<RedisDecision>), RedisError> {
    let results = join_all(
        limits
            .iter()
            .map(|&(limit, key, cost)| limit.check_key_n(key, cost)),
    )
    .await;
    finish(limits, results).await
}

/// All or nothing over per-limit results: if any denied or failed, give
/// back what the others took.
pub(super) async fn finish(
    limits: &[(&RedisLimiter, &[u8], u64)],
    results: Vec<Result<RedisDecision, RedisError>>,
) -> Result<(bool, Vec<RedisDecision>), RedisError> {
    let all_allowed = results.iter().all(|r| matches!(r, Ok(d) if d.is_allowed()));
    if !all_allowed {
        // Give back what was taken, to where it was taken.
        let give_backs =
            limits
                .iter()
                .zip(&results)
                .filter_map(|(&(limit, key, cost), r)| match r {
                    Ok(d) if d.is_allowed() && cost > 0 => {
                        Some(limit.give_back(key, cost, d.source()))
                    }
                    _ => None,
                });
        // A give-back that fails is already handled by the limit's failure
        // policy; the capacity then comes back as the limit refills.
        let _ = join_all(give_backs).await;
    }
    let mut decisions = Vec::with_capacity(results.len());
    for r in results {
        decisions.push(r?);
    }
    Ok((all_allowed, decisions))
}

impl RedisLimiter {
    /// Gives `n` back to where a check of `key` took it.
    pub(crate) async fn give_back(
        &self,
        key: &[u8],
        n: u64,
        source: DecisionSource,
    ) -> Result<(), RedisError> {
        match source {
            DecisionSource::Redis => self.refund_key(key, n).await,
            DecisionSource::Fallback => {
                self.refund_fallback(key, n);
                Ok(())
            }
            // `check_all` takes plain limiters: no lease decision reaches here.
            DecisionSource::FailOpen | DecisionSource::DenyCache | DecisionSource::Lease => Ok(()),
        }
    }
}
