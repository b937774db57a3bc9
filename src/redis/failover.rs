//! Failure handling, written once for every Redis limiter: the
//! [`FailurePolicy`], the local fallback it builds (this instance's share
//! of the policy, or a policy of its own), the answer to a call Redis could
//! not take, and the builder options every Redis limiter shares (`prefix`,
//! `name`, `on_failure`, `fallback_max_keys`, `on_store_event`). The
//! transitions into and out of failing over are reported by its
//! [`Watch`] (`events.rs`). Used by
//! [`RedisLimiter`](super::RedisLimiter) (and so by
//! [`RedisLeaseLimiter`](super::RedisLeaseLimiter), which fails over
//! through its limiter) and [`RedisElasticLimiter`](super::RedisElasticLimiter).

use super::events::{Hook, Watch};
use super::key;
use super::{DecisionSource, RedisDecision, RedisError};
use crate::decision::Decision;
use crate::elastic::ElasticLimiter;
use crate::keyed::KeyedPolicyLimiter;
use crate::keyed::{TableOptions, WhenFull};
use crate::policy::{Policy, PolicyAlgorithm};
use crate::quota::{Rate, Window};
use crate::soft::Tolerance;
use std::time::Duration;

/// What a [`RedisLimiter`](super::RedisLimiter) answers when Redis cannot
/// give a decision: refused, lost, no reply within the timeout, the circuit
/// breaker open, or an answer that is not a decision (out of memory,
/// read-only, loading, a reply of the wrong shape; see
/// `docs/distributed.md`, "Failures"). A key that holds another policy's
/// data is [`RedisError::Server`] instead, whatever the policy.
///
/// # Example
///
/// ```
/// use ratewall::redis::FailurePolicy;
/// use ratewall::{Policy, Rate};
///
/// assert_eq!(FailurePolicy::default(), FailurePolicy::FallbackShare { instances: 1 });
/// let strict = FailurePolicy::Closed;
/// let own = FailurePolicy::Fallback(Policy::token_bucket(Rate::per_second(10)));
/// # let _ = (strict, own);
/// ```
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailurePolicy {
    /// Allow every request (the decision's source is
    /// [`DecisionSource::FailOpen`], its tracking `Untracked`). Refunds are
    /// dropped.
    Open,
    /// Return [`RedisError::Unavailable`], which says when Redis is tried
    /// again. The caller decides (a 503, say).
    Closed,
    /// Limit locally, in this process, with this instance's share of the
    /// policy: the limit (or burst) divided by `instances`, at least 1, and
    /// a bucket's rate divided by `instances`. A soft policy's share is
    /// soft: a percentage tolerance stays, a tolerance in units is divided
    /// by `instances` (rounded down). With N instances behind a
    /// load balancer, the fleet then admits about what Redis would.
    ///
    /// Each local share starts full when Redis dies, and knows nothing of
    /// what Redis admitted: over an interval that holds Redis's death the
    /// fleet can admit, beyond what the shared limit allows there,
    /// `instances x max(1, burst / instances)` more (the limit for a
    /// window): about one burst (a shared 10 per second, burst 10, one
    /// instance, admitted 18 in the second Redis died), then about the
    /// shared rate. See docs/distributed.md, "What the fallback admits
    /// when Redis dies".
    ///
    /// ```
    /// use ratewall::redis::FailurePolicy;
    ///
    /// // Three instances: each limits locally at a third of the policy.
    /// let share = FailurePolicy::FallbackShare { instances: 3 };
    /// # let _ = share;
    /// ```
    FallbackShare {
        /// How many instances share the limit.
        instances: u32,
    },
    /// Limit locally with this policy.
    Fallback(Policy),
}

impl Default for FailurePolicy {
    /// A local fallback with the whole limit (`instances: 1`); set the
    /// number of instances with [`FailurePolicy::FallbackShare`].
    fn default() -> Self {
        FailurePolicy::FallbackShare { instances: 1 }
    }
}

/// The per-instance share of `policy` among `instances`. A soft policy
/// stays soft: a percentage tolerance is kept, a tolerance in units is
/// divided like the limit (rounded down).
pub(crate) fn share(policy: &Policy, instances: u32) -> Policy {
    let k = u64::from(instances.max(1));
    let hard = share_hard(policy, k, instances);
    match policy.tolerance() {
        Some(Tolerance::Units(u)) => hard.soft(Tolerance::Units(u / k)),
        Some(t) => hard.soft(t),
        None => hard,
    }
}

fn share_hard(policy: &Policy, k: u64, instances: u32) -> Policy {
    if let Some(r) = policy.rate() {
        // count per (period x k): the same intervals, exactly k times longer.
        let period = r
            .period()
            .checked_mul(instances.max(1))
            .unwrap_or(r.period());
        let rate = Rate::new(r.count(), period).burst((r.burst_size() / k).max(1));
        return match policy.algorithm() {
            PolicyAlgorithm::LeakyBucket => Policy::leaky_bucket(rate),
            _ => Policy::token_bucket(rate),
        };
    }
    let w = policy.window().unwrap_or(Window::per_second(1));
    let window = Window::new((w.limit() / k).max(1), w.length());
    match policy.algorithm() {
        PolicyAlgorithm::FixedWindow => Policy::fixed_window(window),
        PolicyAlgorithm::SlidingWindowCounter => Policy::sliding_window_counter(window),
        _ => Policy::sliding_window_log(window),
    }
}

/// The builder options every Redis limiter shares, with their defaults.
#[derive(Clone, Debug)]
pub(crate) struct Options {
    /// The first part of every key name.
    pub(crate) prefix: String,
    /// The limit's name in key names; `None`: the limiter's default.
    pub(crate) name: Option<String>,
    pub(crate) failure: FailurePolicy,
    /// The local fallback's table (default: 65,536 keys, the least
    /// recently active evicted when full).
    pub(crate) fallback_table: TableOptions,
    /// Where store events go besides `tracing` (none: standard error,
    /// unless `tracing` is on).
    pub(crate) hook: Option<Hook>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            prefix: "ratewall".into(),
            name: None,
            failure: FailurePolicy::default(),
            fallback_table: TableOptions::new()
                .max_keys(65_536)
                .when_full(WhenFull::EvictLeastRecent),
            hook: None,
        }
    }
}

impl Options {
    /// The prefix and the name (`default` when none was set), both checked
    /// as parts of key names.
    pub(crate) fn names(
        &self,
        default: impl FnOnce() -> String,
    ) -> Result<(&str, String), RedisError> {
        let name = self.name.clone().unwrap_or_else(default);
        for part in [&self.prefix, &name] {
            if !key::valid_name(part) {
                return Err(RedisError::InvalidName { name: part.clone() });
            }
        }
        Ok((&self.prefix, name))
    }

    /// The failover these options ask for, for the limiter named `name`.
    /// `share` builds the local limiter of [`FailurePolicy::FallbackShare`]
    /// from the number of instances; [`FailurePolicy::Fallback`] gets a
    /// keyed limiter of its policy.
    pub(crate) fn failover(
        &self,
        name: &str,
        share: impl FnOnce(u32) -> Result<Local, RedisError>,
    ) -> Result<Failover, RedisError> {
        let local = match self.failure {
            FailurePolicy::Open | FailurePolicy::Closed => None,
            FailurePolicy::FallbackShare { instances } => Some(share(instances)?),
            FailurePolicy::Fallback(policy) => Some(self.keyed(policy)?),
        };
        Ok(Failover {
            failure: self.failure,
            local,
            watch: Watch::new(name, self.failure, self.hook.clone()),
        })
    }

    /// A local keyed limiter of `policy` with these options' fallback table.
    pub(crate) fn keyed(&self, policy: Policy) -> Result<Local, RedisError> {
        let limiter = KeyedPolicyLimiter::<Vec<u8>>::builder(policy)
            .table(self.fallback_table)
            .build()?;
        Ok(Local::Keyed(Box::new(limiter)))
    }

    /// A local elastic limiter of these three policies, with these options'
    /// table.
    pub(crate) fn elastic(
        &self,
        guarantee: Policy,
        ceiling: Policy,
        pool: Policy,
    ) -> Result<Local, RedisError> {
        let limiter = ElasticLimiter::<Vec<u8>>::builder(guarantee, ceiling, pool)
            .table(self.fallback_table)
            .build()?;
        Ok(Local::Elastic(Box::new(limiter)))
    }
}

/// The builder methods of the shared [`Options`], written once for the
/// builder of every Redis limiter (which keeps them in a field `options`).
/// `$name_doc` says what the name is to that limiter; `$setup` makes a
/// builder `b()` (with `redis` a backend), and each `$..._check` asserts,
/// on the limiter `l` built with that option, what it does.
macro_rules! option_methods {
    (
        name_doc: $name_doc:literal,
        default_failure: $failure_doc:literal,
        setup: $setup:literal,
        prefix_check: $prefix_check:literal,
        name_check: $name_check:literal,
    ) => {
        /// The first part of every key name (default `ratewall`).
        ///
        /// ```
        #[doc = $setup]
        /// let l = b().prefix("shop").name("e").build()?;
        #[doc = $prefix_check]
        /// # Ok::<(), Box<dyn std::error::Error>>(()) }).unwrap();
        /// ```
        pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
            self.options.prefix = prefix.into();
            self
        }

        #[doc = $name_doc]
        ///
        /// ```
        #[doc = $setup]
        /// let l = b().name("per-ip").build()?;
        #[doc = $name_check]
        /// # Ok::<(), Box<dyn std::error::Error>>(()) }).unwrap();
        /// ```
        pub fn name(mut self, name: impl Into<String>) -> Self {
            self.options.name = Some(name.into());
            self
        }

        /// What to answer when Redis cannot (default
        #[doc = $failure_doc]
        ///
        /// ```
        /// # use ratewall::redis::FailurePolicy;
        #[doc = $setup]
        /// let l = b().on_failure(FailurePolicy::Closed).build()?;
        /// assert_eq!(l.failure_policy(), FailurePolicy::Closed);
        /// # Ok::<(), Box<dyn std::error::Error>>(()) }).unwrap();
        /// ```
        pub fn on_failure(mut self, failure: FailurePolicy) -> Self {
            self.options.failure = failure;
            self
        }

        /// The most keys the local fallback tracks (default 65,536; the least
        /// recently active key is evicted when full).
        ///
        /// ```
        #[doc = $setup]
        /// let l = b().fallback_max_keys(1024).build()?;
        /// # Ok::<(), Box<dyn std::error::Error>>(()) }).unwrap();
        /// ```
        pub fn fallback_max_keys(mut self, max_keys: usize) -> Self {
            self.options.fallback_table = self.options.fallback_table.max_keys(max_keys);
            self
        }

        /// The local fallback's whole table ([`TableOptions`]($crate::TableOptions):
        /// `max_keys`, shards, [`WhenFull`]($crate::WhenFull), seed), replacing
        /// the default of 65,536 keys with the least recently active evicted.
        ///
        /// ```
        #[doc = $setup]
        /// use ratewall::{TableOptions, WhenFull};
        /// let l = b()
        ///     .fallback_table(TableOptions::new().max_keys(1024).when_full(WhenFull::RejectNew))
        ///     .build()?;
        /// # Ok::<(), Box<dyn std::error::Error>>(()) }).unwrap();
        /// ```
        pub fn fallback_table(mut self, options: $crate::TableOptions) -> Self {
            self.options.fallback_table = options;
            self
        }

        /// Calls `hook` once when Redis stops answering this limiter's
        /// checks (its failure policy answers from then on) and once when
        /// Redis answers again: one [`StoreEvent`]($crate::redis::StoreEvent)
        /// per transition, never one per check. The events also go to
        /// `tracing` (feature `tracing`); with neither a hook nor `tracing`,
        /// each is one line on standard error. The hook runs on the
        /// checking task: keep it short (send it on, count it).
        ///
        /// ```
        /// use ratewall::redis::StoreEvent;
        #[doc = $setup]
        /// let l = b()
        ///     .on_store_event(|e: &StoreEvent| eprintln!("{e}"))
        ///     .build()?;
        /// # Ok::<(), Box<dyn std::error::Error>>(()) }).unwrap();
        /// ```
        pub fn on_store_event(
            mut self,
            hook: impl Fn(&$crate::redis::StoreEvent) + Send + Sync + 'static,
        ) -> Self {
            self.options.hook = Some($crate::redis::events::Hook(std::sync::Arc::new(hook)));
            self
        }
    };
}
pub(crate) use option_methods;

/// The local limiter that answers when Redis cannot.
pub(crate) enum Local {
    Keyed(Box<KeyedPolicyLimiter<Vec<u8>>>),
    Elastic(Box<ElasticLimiter<Vec<u8>>>),
}

/// What a limiter answers when Redis cannot: its failure policy and the
/// local limiter that policy built, if any.
pub(crate) struct Failover {
    failure: FailurePolicy,
    local: Option<Local>,
    /// Reports the transitions into and out of failing over.
    watch: Watch,
}

impl Failover {
    pub(crate) fn policy(&self) -> FailurePolicy {
        self.failure
    }

    /// The transitions' reporter (and, feature `metrics`, the limiter's
    /// handles).
    pub(crate) fn watch(&self) -> &Watch {
        &self.watch
    }

    /// The local elastic limiter of a `FallbackShare`, if that is the one.
    pub(crate) fn elastic(&self) -> Option<&ElasticLimiter<Vec<u8>>> {
        match &self.local {
            Some(Local::Elastic(l)) => Some(l),
            _ => None,
        }
    }

    /// The answer to a check (`consume`) or peek of `cost` for `key` that
    /// Redis could not take: the local limiter's decision; fail-open's
    /// `open` decision (untracked); or the error. Accounted by the caller
    /// at the door (`door.rs`).
    pub(crate) fn unavailable(
        &self,
        key: &[u8],
        cost: u64,
        consume: bool,
        open: impl FnOnce() -> Decision,
        retry_in: Duration,
        cause: String,
    ) -> Result<RedisDecision, RedisError> {
        let (decision, source) = match &self.local {
            Some(Local::Keyed(local)) if consume => {
                (local.check_key_n(key, cost)?, DecisionSource::Fallback)
            }
            Some(Local::Keyed(local)) => (local.peek_key_n(key, cost)?, DecisionSource::Fallback),
            // An elastic limit has no peek.
            Some(Local::Elastic(local)) => {
                (local.check_key_n(key, cost)?, DecisionSource::Fallback)
            }
            None if self.failure == FailurePolicy::Open => (open(), DecisionSource::FailOpen),
            None => return Err(RedisError::Unavailable { retry_in, cause }),
        };
        Ok(RedisDecision { decision, source })
    }

    /// A refund of `n` for `key` that Redis could not take: the local
    /// limiter gets it, fail-open drops it (nothing was taken), fail-closed
    /// returns the error.
    pub(crate) fn refund_unavailable(
        &self,
        key: &[u8],
        n: u64,
        retry_in: Duration,
        cause: String,
    ) -> Result<(), RedisError> {
        if self.failure == FailurePolicy::Open {
            return Ok(());
        }
        match &self.local {
            Some(_) => {
                self.refund_local(key, n);
                Ok(())
            }
            None => Err(RedisError::Unavailable { retry_in, cause }),
        }
    }

    /// Gives `n` back to the local limiter only.
    pub(crate) fn refund_local(&self, key: &[u8], n: u64) {
        if let Some(Local::Keyed(local)) = &self.local {
            local.refund_key(key, n);
        }
    }

    /// Forgets `key` in the local limiter.
    pub(crate) fn reset_local(&self, key: &[u8]) {
        if let Some(Local::Keyed(local)) = &self.local {
            local.reset_key(key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_share_divides_the_limit_and_the_rate() {
        let p = share(&Policy::token_bucket(Rate::per_second(30).burst(9)), 3);
        let r = p.rate().unwrap();
        assert_eq!(
            (r.count(), r.period(), r.burst_size()),
            (30, Duration::from_secs(3), 3)
        );
        assert_eq!(p.algorithm(), PolicyAlgorithm::TokenBucket);
        let p = share(&Policy::sliding_window_log(Window::per_minute(10)), 4);
        assert_eq!(p.window(), Some(Window::per_minute(2)));
        assert_eq!(p.algorithm(), PolicyAlgorithm::SlidingWindowLog);
        // Never below one.
        let p = share(&Policy::fixed_window(Window::per_second(2)), 5);
        assert_eq!(p.limit(), 1);
        assert_eq!(
            share(&Policy::leaky_bucket(Rate::per_second(4)), 0).limit(),
            4
        );
        // A soft policy stays soft: a percentage as it is, units divided.
        let soft = Policy::fixed_window(Window::per_second(10));
        let p = share(&soft.soft(Tolerance::Percent(20)), 2);
        assert_eq!((p.limit(), p.soft_limit()), (5, 6));
        let p = share(&soft.soft(Tolerance::Units(6)), 3);
        assert_eq!(p.tolerance(), Some(Tolerance::Units(2)));
        let p = share(
            &Policy::token_bucket(Rate::per_second(9)).soft(Tolerance::Units(4)),
            1,
        );
        assert_eq!((p.limit(), p.soft_limit()), (9, 13));
    }
}
