//! [`KeyedPolicyLimiter`]: a keyed limiter built from a [`Policy`] (any
//! of the five algorithms, chosen at run time), and its builder. It
//! dispatches once on the algorithm to a typed table (`limiter.rs`,
//! `log.rs`); the method family comes from `family.rs`.

use super::builder::{table_setters, KeyedBuilder, TableOptions, WhenFull};
use super::family::{
    keyed_methods, refund_methods, table_methods, Checked, KeyedCore, KeyedRefund, KeyedTable,
};
use super::limiter::KeyedLimiter;
use super::log::KeyedSlidingWindowLog;
use crate::algo::{FixedCounter, Gcra, LeakyGcra, SlidingCounter};
use crate::clock::Clock;
use crate::decision::Decision;
use crate::error::ConfigError;
use crate::limiter::DefaultClock;
use crate::policy::{Policy, PolicyAlgorithm, Quota};
use crate::soft::Soft;
use std::fmt;
use std::hash::Hash;

/// A keyed limiter built from a [`Policy`]: any of the five algorithms,
/// chosen at run time, behind one type. Each check dispatches once on the
/// algorithm and then runs the same code as the typed keyed limiters
/// ([`KeyedLimiter`], [`KeyedSlidingWindowLog`]).
///
/// # Example
///
/// ```
/// use ratewall::{check_all, KeyedPolicyLimiter, ManualClock, Policy, Rate, Window, WhenFull};
///
/// let clock = ManualClock::new();
/// let per_ip = KeyedPolicyLimiter::<u32, _>::builder(Policy::token_bucket(Rate::per_second(10)))
///     .max_keys(100_000)
///     .when_full(WhenFull::EvictLeastRecent)
///     .clock(clock.clone())
///     .build()?;
/// let login = KeyedPolicyLimiter::<u32, _>::builder(Policy::sliding_window_log(Window::per_minute(1)))
///     .clock(clock)
///     .build()?;
/// assert!(check_all(&[&per_ip.with_key(&1), &login.with_key(&1)]).is_allowed());
/// // The login limit denies: nothing is taken from the per-IP limit.
/// assert!(!check_all(&[&per_ip.with_key(&1), &login.with_key(&1)]).is_allowed());
/// assert_eq!(per_ip.peek_key(&1).remaining(), 8); // 9 left; a unit request would leave 8
/// # Ok::<(), ratewall::ConfigError>(())
/// ```
pub struct KeyedPolicyLimiter<K, C: Clock = DefaultClock> {
    policy: Policy,
    /// How to read the (widened) limiter's decisions; a no-op for a hard policy.
    soft: Soft,
    inner: Inner<K, C>,
}

// The keyed method family (`family.rs`), from this type's core below.
keyed_methods!([K, C: Clock] KeyedPolicyLimiter<K, C>, K);
refund_methods!([K, C: Clock] KeyedPolicyLimiter<K, C>, K);
table_methods!([K, C: Clock] KeyedPolicyLimiter<K, C>);

enum Inner<K, C: Clock> {
    Token(KeyedLimiter<K, Gcra, C>),
    Leaky(KeyedLimiter<K, LeakyGcra, C>),
    Fixed(KeyedLimiter<K, FixedCounter, C>),
    Sliding(KeyedLimiter<K, SlidingCounter, C>),
    Log(KeyedSlidingWindowLog<K, C>),
}

/// Runs `$body` with `$l` bound to the typed limiter inside.
macro_rules! dispatch {
    ($inner:expr, $l:ident => $body:expr) => {
        match $inner {
            Inner::Token($l) => $body,
            Inner::Leaky($l) => $body,
            Inner::Fixed($l) => $body,
            Inner::Sliding($l) => $body,
            Inner::Log($l) => $body,
        }
    };
}

/// Configures a [`KeyedPolicyLimiter`]: `max_keys`, shards, policy when
/// full, hash seed and clock, as [`KeyedBuilder`] does for the typed
/// limiters.
///
/// # Example
///
/// ```
/// use ratewall::{KeyedPolicyLimiter, ManualClock, Policy, Rate, WhenFull};
///
/// let limiter = KeyedPolicyLimiter::<u64, _>::builder(Policy::leaky_bucket(Rate::per_second(5)))
///     .max_keys(1024)
///     .shards(4)
///     .when_full(WhenFull::AdmitUntracked)
///     .seed(7)
///     .clock(ManualClock::new())
///     .build()?;
/// assert_eq!(limiter.max_keys(), 1024);
/// # Ok::<(), ratewall::ConfigError>(())
/// ```
#[must_use = "a builder does nothing until `build`"]
pub struct KeyedPolicyBuilder<K, C: Clock = DefaultClock> {
    policy: Policy,
    table: TableOptions,
    clock: C,
    _key: std::marker::PhantomData<fn(&K)>,
}

impl<K> KeyedPolicyLimiter<K, DefaultClock> {
    /// A limiter for `policy` with the builder's defaults (65,536 keys,
    /// [`WhenFull::RejectNew`], the default clock).
    ///
    /// ```
    /// # use ratewall::{KeyedPolicyLimiter, Policy, Window};
    /// let l = KeyedPolicyLimiter::<&str>::new(Policy::fixed_window(Window::per_second(2)))?;
    /// assert!(l.check_key("a").is_allowed());
    /// # Ok::<(), ratewall::ConfigError>(())
    /// ```
    pub fn new(policy: Policy) -> Result<Self, ConfigError> {
        Self::builder(policy).build()
    }

    /// A builder for `policy`.
    ///
    /// ```
    /// # use ratewall::{KeyedPolicyLimiter, Policy, Rate};
    /// let l = KeyedPolicyLimiter::<u64>::builder(Policy::token_bucket(Rate::per_second(1)))
    ///     .max_keys(10)
    ///     .build()?;
    /// assert_eq!(l.max_keys(), 10);
    /// # Ok::<(), ratewall::ConfigError>(())
    /// ```
    pub fn builder(policy: Policy) -> KeyedPolicyBuilder<K, DefaultClock> {
        KeyedPolicyBuilder {
            policy,
            table: TableOptions::new(),
            clock: DefaultClock::default(),
            _key: std::marker::PhantomData,
        }
    }
}

table_setters!([K, C: Clock] KeyedPolicyBuilder<K, C>);

impl<K, C: Clock> KeyedPolicyBuilder<K, C> {
    /// The clock.
    ///
    /// ```
    /// # use ratewall::{KeyedPolicyLimiter, ManualClock, Policy, Rate};
    /// let clock = ManualClock::new();
    /// let l = KeyedPolicyLimiter::<u64, _>::builder(Policy::token_bucket(Rate::per_second(1)))
    ///     .clock(clock.clone()).build()?;
    /// clock.advance(std::time::Duration::from_secs(1));
    /// assert_eq!(l.now(), 1_000_000_000);
    /// # Ok::<(), ratewall::ConfigError>(())
    /// ```
    pub fn clock<C2: Clock>(self, clock: C2) -> KeyedPolicyBuilder<K, C2> {
        KeyedPolicyBuilder {
            policy: self.policy,
            table: self.table,
            clock,
            _key: std::marker::PhantomData,
        }
    }

    /// Applies the knobs that were set to a typed builder.
    fn configure<A: crate::algo::Algorithm>(
        &self,
        b: KeyedBuilder<K, A, DefaultClock>,
    ) -> KeyedBuilder<K, A, C>
    where
        C: Clone,
    {
        b.table(self.table).clock(self.clock.clone())
    }

    /// Validates the policy and the table's knobs, and allocates the table.
    ///
    /// ```
    /// # use ratewall::{ConfigError, KeyedPolicyLimiter, Policy, Rate};
    /// let err = KeyedPolicyLimiter::<u64>::builder(Policy::token_bucket(Rate::per_second(0))).build();
    /// assert_eq!(err.unwrap_err(), ConfigError::ZeroRate);
    /// ```
    pub fn build(self) -> Result<KeyedPolicyLimiter<K, C>, ConfigError>
    where
        C: Clone,
    {
        let policy = self.policy;
        policy.validate()?;
        let (hard, soft) = policy.widened()?;
        let inner = match (hard.algorithm, hard.quota) {
            (PolicyAlgorithm::TokenBucket, Quota::Rate(r)) => Inner::Token(
                self.configure(KeyedLimiter::<K, Gcra>::builder(r))
                    .build()?,
            ),
            (PolicyAlgorithm::LeakyBucket, Quota::Rate(r)) => Inner::Leaky(
                self.configure(KeyedLimiter::<K, LeakyGcra>::builder(r))
                    .build()?,
            ),
            (PolicyAlgorithm::FixedWindow, Quota::Window(w)) => Inner::Fixed(
                self.configure(KeyedLimiter::<K, FixedCounter>::builder(w))
                    .build()?,
            ),
            (PolicyAlgorithm::SlidingWindowCounter, Quota::Window(w)) => Inner::Sliding(
                self.configure(KeyedLimiter::<K, SlidingCounter>::builder(w))
                    .build()?,
            ),
            (PolicyAlgorithm::SlidingWindowLog, Quota::Window(w)) => {
                Inner::Log(self.configure(KeyedSlidingWindowLog::builder(w)).build()?)
            }
            _ => unreachable!("a policy's quota always matches its algorithm"),
        };
        Ok(KeyedPolicyLimiter {
            policy,
            soft,
            inner,
        })
    }
}

impl<K, C: Clock> KeyedPolicyLimiter<K, C> {
    /// The policy this limiter was built from.
    ///
    /// ```
    /// # use ratewall::{KeyedPolicyLimiter, Policy, Rate};
    /// let p = Policy::token_bucket(Rate::per_second(3));
    /// assert_eq!(KeyedPolicyLimiter::<u8>::new(p)?.policy(), p);
    /// # Ok::<(), ratewall::ConfigError>(())
    /// ```
    pub fn policy(&self) -> Policy {
        if self.policy.soft.is_some() {
            // A soft policy's quota never changes (see `set_quota`).
            return self.policy;
        }
        match &self.inner {
            Inner::Token(l) => Policy::token_bucket(l.quota()),
            Inner::Leaky(l) => Policy::leaky_bucket(l.quota()),
            Inner::Fixed(l) => Policy::fixed_window(l.quota()),
            Inner::Sliding(l) => Policy::sliding_window_counter(l.quota()),
            Inner::Log(l) => Policy::sliding_window_log(l.quota()),
        }
    }

    /// Changes the quota of every key at run time, keeping each key's usage
    /// rescaled (as [`KeyedLimiter::set_quota`] does). The new policy must
    /// run the same algorithm, and neither may be soft; otherwise nothing
    /// changes and the error says why. An elastic limit's pool follows a
    /// capacity signal this way.
    ///
    /// ```
    /// # use ratewall::{KeyedPolicyLimiter, ManualClock, Policy, Rate, Window};
    /// let l = KeyedPolicyLimiter::<u8, _>::builder(Policy::token_bucket(Rate::per_second(10)))
    ///     .clock(ManualClock::new()).build()?;
    /// let _ = l.check_key_n(&1, 4);
    /// l.set_quota(Policy::token_bucket(Rate::per_second(20)))?;
    /// assert_eq!(l.peek_key(&1).remaining(), 15); // 4 still in use
    /// assert_eq!(l.policy(), Policy::token_bucket(Rate::per_second(20)));
    /// assert!(l.set_quota(Policy::fixed_window(Window::per_second(5))).is_err());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn set_quota(&self, policy: Policy) -> Result<(), ConfigError> {
        if policy.algorithm != self.policy.algorithm {
            return Err(ConfigError::Incompatible {
                reason: "a quota change keeps the algorithm; build a new limiter to change it",
            });
        }
        if policy.soft.is_some() || self.policy.soft.is_some() {
            return Err(ConfigError::Incompatible {
                reason: "a soft policy's quota cannot change at run time; build a new limiter",
            });
        }
        match (&self.inner, policy.quota) {
            (Inner::Token(l), Quota::Rate(r)) => l.set_quota(r),
            (Inner::Leaky(l), Quota::Rate(r)) => l.set_quota(r),
            (Inner::Fixed(l), Quota::Window(w)) => l.set_quota(w),
            (Inner::Sliding(l), Quota::Window(w)) => l.set_quota(w),
            (Inner::Log(l), Quota::Window(w)) => l.set_quota(w),
            _ => unreachable!("a policy's quota always matches its algorithm"),
        }
    }
}

impl<K, C: Clock> fmt::Debug for KeyedPolicyLimiter<K, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut s = f.debug_struct("KeyedPolicyLimiter");
        s.field("policy", &self.policy());
        dispatch!(&self.inner, l => s.field("limiter", l));
        s.finish()
    }
}

impl<K, C: Clock> fmt::Debug for KeyedPolicyBuilder<K, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedPolicyBuilder")
            .field("policy", &self.policy)
            .field("table", &self.table)
            .field("clock", &self.clock)
            .finish()
    }
}

impl<K, C: Clock> KeyedPolicyLimiter<K, C> {
    /// Whether a batch loads this table's slots ahead (a table that
    /// outgrows the caches; the sliding log keeps its own lists: no).
    // The HTTP layer's build asks (feature `tower`).
    #[cfg_attr(not(feature = "tower"), allow(dead_code))]
    pub(crate) fn prefetches(&self) -> bool {
        match &self.inner {
            Inner::Token(l) => l.prefetches(),
            Inner::Leaky(l) => l.prefetches(),
            Inner::Fixed(l) => l.prefetches(),
            Inner::Sliding(l) => l.prefetches(),
            Inner::Log(_) => false,
        }
    }
}

impl<K, C: Clock> KeyedCore for KeyedPolicyLimiter<K, C> {
    type Key = K;
    type Clock = C;
    type Memo = ();

    #[inline]
    fn key_now(&self) -> u64 {
        dispatch!(&self.inner, l => l.key_now())
    }

    #[inline]
    fn key_batch_now(&self) -> u64 {
        dispatch!(&self.inner, l => l.key_batch_now())
    }

    fn key_clock(&self) -> &C {
        dispatch!(&self.inner, l => l.key_clock())
    }

    #[inline]
    fn key_run<Q: Hash + ?Sized>(&self, key: &Q, now: Option<u64>, n: u64, take: bool) -> Checked {
        dispatch!(&self.inner, l => l.key_run(key, now, n, take)).map(|d| self.soft.view(d))
    }

    #[inline]
    fn check_key_with<Q: Hash + ?Sized>(&self, key: &Q, now: Option<u64>) -> Decision {
        self.soft
            .view(dispatch!(&self.inner, l => l.check_key_with(key, now)))
    }

    #[inline]
    fn key_touch<Q: Hash + ?Sized>(&self, key: &Q) {
        dispatch!(&self.inner, l => l.key_touch(key))
    }

    #[inline]
    fn key_prepare<Q: Hash + ?Sized>(&self, key: &Q) -> u64 {
        dispatch!(&self.inner, l => l.key_prepare(key))
    }

    #[inline]
    fn check_prepared<Q: Hash + ?Sized>(&self, key: &Q, prepared: u64, now: u64) -> Decision {
        self.soft
            .view(dispatch!(&self.inner, l => l.check_prepared(key, prepared, now)))
    }

    fn key_capacity<Q: Hash + ?Sized>(&self, key: &Q) -> u64 {
        dispatch!(&self.inner, l => l.key_capacity(key))
    }

    fn key_give_back<Q: Hash + ?Sized>(&self, key: &Q, now: u64, n: u64, _: &()) {
        self.key_refund(key, now, n);
    }
}

impl<K, C: Clock> KeyedRefund for KeyedPolicyLimiter<K, C> {
    fn key_refund<Q: Hash + ?Sized>(&self, key: &Q, now: u64, n: u64) {
        dispatch!(&self.inner, l => l.key_refund(key, now, n))
    }

    fn key_reset<Q: Hash + ?Sized>(&self, key: &Q) {
        dispatch!(&self.inner, l => l.key_reset(key))
    }
}

impl<K, C: Clock> KeyedTable for KeyedPolicyLimiter<K, C> {
    fn table_len(&self) -> usize {
        dispatch!(&self.inner, l => l.table_len())
    }

    fn table_max_keys(&self) -> usize {
        dispatch!(&self.inner, l => l.table_max_keys())
    }

    fn table_when_full(&self) -> WhenFull {
        dispatch!(&self.inner, l => l.table_when_full())
    }

    fn table_retain_active(&self) -> usize {
        dispatch!(&self.inner, l => l.table_retain_active())
    }
}

#[cfg(test)]
#[path = "policy_tests.rs"]
mod tests;
