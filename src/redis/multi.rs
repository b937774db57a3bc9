//! All-or-nothing checks across several Redis limits (per IP + per user +
//! per route), for the HTTP layer.
//!
//! # Protocol
//!
//! 1. Validate every (limit, key, cost) first: an empty key or a cost a
//!    limit can never admit is an error, and nothing is taken.
//! 2. Check every limit **in parallel** (one script call each; their keys
//!    usually live on different Cluster slots).
//! 3. If all allow: done. If any denies (or fails with an error), give back
//!    what the others took, each to where it was taken (Redis or the local
//!    fallback), in parallel, before returning.
//!
//! # The window this leaves
//!
//! Between step 2 and the end of step 3 (one round trip on a healthy
//! server), the capacity taken from the limits that allowed is visible to
//! other callers: a concurrent request may be **denied** by it. Nobody is
//! ever admitted beyond a limit: units are taken before they count as
//! used, and a rollback only gives back what this call took. If Redis fails
//! between the take and the give-back, the refund follows the limit's
//! failure policy (with `FailurePolicy::Closed` it is lost, and the capacity
//! comes back as the limit refills).

use super::limiter::RedisLimiter;
use super::{DecisionSource, RedisDecision, RedisError};
use futures_util::future::join_all;

/// Checks `(limit, key, cost)` triples all or nothing: each cost is taken
/// from every limit, or from none. Returns whether the request may proceed
/// and one decision per limit, in order (a limit that allowed reports its
/// decision as taken, even when another limit's denial gave it back).
///
/// The checks run in parallel, one round trip each; on a denial, the
/// give-backs take one more. An empty list allows. See the module notes for
/// the brief window between take and give-back.
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
    let results = join_all(
        limits
            .iter()
            .map(|&(limit, key, cost)| limit.check_n(key, cost)),
    )
    .await;
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
            DecisionSource::Redis => self.refund(key, n).await,
            DecisionSource::Fallback => {
                self.refund_fallback(key, n);
                Ok(())
            }
            DecisionSource::FailOpen | DecisionSource::DenyCache => Ok(()),
        }
    }
}
