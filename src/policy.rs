//! [`Policy`]: an algorithm plus its quota, as one value. The same policy
//! builds a local keyed limiter ([`KeyedPolicyLimiter`]) and, with the
//! `redis` feature, a limiter whose state lives in Redis, so one
//! configuration serves a single process and a fleet.

use crate::algo::sealed::Core;
use crate::algo::{FixedCounter, Gcra, LeakyGcra, SlidingCounter, SlidingLog};
use crate::clock::Clock;
use crate::decision::Decision;
use crate::error::{ConfigError, InsufficientCapacity};
use crate::keyed::{KeyedBuilder, KeyedLimiter, KeyedSlidingWindowLog, WhenFull};
use crate::limiter::DefaultClock;
use crate::multi::{LimitCalls, LimitCore, Token};
use crate::quota::{Rate, Window};
use crate::soft::{widened_error, Soft, Tolerance};
use std::borrow::Borrow;
use std::fmt;
use std::hash::Hash;
use std::time::Duration;

/// Which of the five algorithms a [`Policy`] runs.
///
/// # Example
///
/// ```
/// use ratewall::{Policy, PolicyAlgorithm, Window};
///
/// let p = Policy::sliding_window_log(Window::per_minute(100));
/// assert_eq!(p.algorithm(), PolicyAlgorithm::SlidingWindowLog);
/// assert_eq!(PolicyAlgorithm::SlidingWindowLog.name(), "sliding window log");
/// ```
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PolicyAlgorithm {
    /// GCRA token bucket ([`TokenBucket`](crate::TokenBucket)).
    TokenBucket,
    /// GCRA leaky bucket as a meter ([`LeakyBucket`](crate::LeakyBucket)).
    LeakyBucket,
    /// Fixed window counter ([`FixedWindow`](crate::FixedWindow)).
    FixedWindow,
    /// Sliding window counter ([`SlidingWindowCounter`](crate::SlidingWindowCounter)).
    SlidingWindowCounter,
    /// Exact sliding window log ([`SlidingWindowLog`](crate::SlidingWindowLog)).
    SlidingWindowLog,
}

impl PolicyAlgorithm {
    /// A short human-readable name, such as `"token bucket"`.
    ///
    /// ```
    /// # use ratewall::PolicyAlgorithm;
    /// assert_eq!(PolicyAlgorithm::FixedWindow.name(), "fixed window");
    /// ```
    pub const fn name(self) -> &'static str {
        match self {
            PolicyAlgorithm::TokenBucket => <Gcra as crate::algo::Algorithm>::NAME,
            PolicyAlgorithm::LeakyBucket => <LeakyGcra as crate::algo::Algorithm>::NAME,
            PolicyAlgorithm::FixedWindow => <FixedCounter as crate::algo::Algorithm>::NAME,
            PolicyAlgorithm::SlidingWindowCounter => {
                <SlidingCounter as crate::algo::Algorithm>::NAME
            }
            PolicyAlgorithm::SlidingWindowLog => <SlidingLog as crate::algo::Algorithm>::NAME,
        }
    }
}

/// The quota of a [`Policy`]: a rate for the buckets, a window for the
/// window algorithms.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Quota {
    Rate(Rate),
    Window(Window),
}

/// An algorithm plus its quota: "100 per second, burst 20, token bucket",
/// "1000 per hour, sliding window".
///
/// A policy is validated when it is built ([`Policy::validate`] runs the
/// same checks as the limiter constructors), so a configuration error is
/// reported once, with a message that says what to change.
///
/// # Example
///
/// ```
/// use ratewall::{KeyedPolicyLimiter, Policy, Rate, Window};
///
/// let api = Policy::token_bucket(Rate::per_second(100).burst(20));
/// assert_eq!(api.limit(), 20);
/// let login = Policy::sliding_window_log(Window::per_minute(5));
/// assert_eq!(login.limit(), 5);
///
/// let per_user = KeyedPolicyLimiter::<u64>::new(login)?;
/// for _ in 0..5 {
///     assert!(per_user.check_key(&7).is_allowed());
/// }
/// assert!(!per_user.check_key(&7).is_allowed());
/// # Ok::<(), ratewall::ConfigError>(())
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Policy {
    algorithm: PolicyAlgorithm,
    quota: Quota,
    /// A soft policy's tolerance (see [`Policy::soft`]).
    soft: Option<Tolerance>,
}

impl Policy {
    /// A GCRA token bucket with `rate` (its burst is the bucket's capacity).
    ///
    /// ```
    /// # use ratewall::{Policy, Rate};
    /// assert_eq!(Policy::token_bucket(Rate::per_second(10).burst(3)).limit(), 3);
    /// ```
    pub const fn token_bucket(rate: Rate) -> Policy {
        Policy {
            algorithm: PolicyAlgorithm::TokenBucket,
            quota: Quota::Rate(rate),
            soft: None,
        }
    }

    /// A GCRA leaky bucket (a meter) that leaks at `rate` and holds its burst.
    ///
    /// ```
    /// # use ratewall::{Policy, Rate};
    /// assert_eq!(Policy::leaky_bucket(Rate::per_second(10).burst(4)).limit(), 4);
    /// ```
    pub const fn leaky_bucket(rate: Rate) -> Policy {
        Policy {
            algorithm: PolicyAlgorithm::LeakyBucket,
            quota: Quota::Rate(rate),
            soft: None,
        }
    }

    /// A fixed window counter: at most the window's limit per aligned window.
    ///
    /// ```
    /// # use ratewall::{Policy, Window};
    /// assert_eq!(Policy::fixed_window(Window::per_minute(60)).limit(), 60);
    /// ```
    pub const fn fixed_window(window: Window) -> Policy {
        Policy {
            algorithm: PolicyAlgorithm::FixedWindow,
            quota: Quota::Window(window),
            soft: None,
        }
    }

    /// A sliding window counter (the weighted estimate of two windows).
    ///
    /// ```
    /// # use ratewall::{Policy, Window};
    /// assert_eq!(Policy::sliding_window_counter(Window::per_hour(1000)).limit(), 1000);
    /// ```
    pub const fn sliding_window_counter(window: Window) -> Policy {
        Policy {
            algorithm: PolicyAlgorithm::SlidingWindowCounter,
            quota: Quota::Window(window),
            soft: None,
        }
    }

    /// The exact sliding window log: at most the limit in every rolling window.
    ///
    /// ```
    /// # use ratewall::{Policy, Window};
    /// assert_eq!(Policy::sliding_window_log(Window::per_minute(5)).limit(), 5);
    /// ```
    pub const fn sliding_window_log(window: Window) -> Policy {
        Policy {
            algorithm: PolicyAlgorithm::SlidingWindowLog,
            quota: Quota::Window(window),
            soft: None,
        }
    }

    /// This policy as a **soft** limit: it admits up to `tolerance` above
    /// its nominal limit, and marks what it admits there
    /// ([`Decision::is_above_limit`]). Decisions report the nominal
    /// [`limit`](Self::limit), and `remaining` below it.
    ///
    /// Every algorithm runs unchanged with its capacity widened to
    /// [`soft_limit`](Self::soft_limit): a bucket's burst (its rate stays),
    /// a window's limit (its length stays). So a soft token bucket admits at
    /// most `burst + u + rate * d` in any interval `d`, a soft window at most
    /// `limit + u` per window (`u` the tolerance in units). See
    /// `docs/algorithms.md`.
    ///
    /// ```
    /// use ratewall::{KeyedPolicyLimiter, ManualClock, Policy, Rate, Tolerance};
    ///
    /// let p = Policy::token_bucket(Rate::per_minute(100)).soft(Tolerance::Percent(10));
    /// let l = KeyedPolicyLimiter::<u8, _>::builder(p).clock(ManualClock::new()).build()?;
    /// let decisions: Vec<_> = (0..111).map(|_| l.check_key(&1)).collect();
    /// assert_eq!(decisions.iter().filter(|d| d.is_allowed()).count(), 110);
    /// assert_eq!(decisions.iter().filter(|d| d.is_above_limit()).count(), 10);
    /// assert_eq!(decisions[0].limit(), 100);
    /// # Ok::<(), ratewall::ConfigError>(())
    /// ```
    pub const fn soft(mut self, tolerance: Tolerance) -> Policy {
        self.soft = Some(tolerance);
        self
    }

    /// The soft tolerance, if this is a soft policy.
    ///
    /// ```
    /// # use ratewall::{Policy, Tolerance, Window};
    /// let p = Policy::fixed_window(Window::per_second(10));
    /// assert_eq!(p.tolerance(), None);
    /// assert_eq!(p.soft(Tolerance::Units(2)).tolerance(), Some(Tolerance::Units(2)));
    /// ```
    pub const fn tolerance(&self) -> Option<Tolerance> {
        self.soft
    }

    /// The most cost units admitted at once, tolerance included:
    /// [`limit`](Self::limit) plus the tolerance in units (saturating).
    ///
    /// ```
    /// # use ratewall::{Policy, Rate, Tolerance};
    /// let p = Policy::token_bucket(Rate::per_second(50)).soft(Tolerance::Percent(20));
    /// assert_eq!((p.limit(), p.soft_limit()), (50, 60));
    /// ```
    pub const fn soft_limit(&self) -> u64 {
        self.limit().saturating_add(self.tolerance_units())
    }

    /// The tolerance in units (0 for a hard policy).
    pub(crate) const fn tolerance_units(&self) -> u64 {
        match self.soft {
            Some(t) => t.units(self.limit()),
            None => 0,
        }
    }

    /// The hard policy the limiter runs (capacity widened by the
    /// tolerance), and how to read its decisions back.
    pub(crate) fn widened(&self) -> Result<(Policy, Soft), ConfigError> {
        let limit = self.limit();
        let units = self.tolerance_units();
        let soft = Soft { limit, units };
        let hard = Policy {
            soft: None,
            ..*self
        };
        if units == 0 {
            return Ok((hard, soft));
        }
        let too_large = || ConfigError::ToleranceTooLarge {
            limit,
            tolerance: units,
            max: u64::MAX - limit,
        };
        let wide = limit.checked_add(units).ok_or_else(too_large)?;
        let quota = match self.quota {
            Quota::Rate(r) => Quota::Rate(Rate::new(r.count(), r.period()).burst(wide)),
            Quota::Window(w) => Quota::Window(Window::new(wide, w.length())),
        };
        Ok((Policy { quota, ..hard }, soft))
    }

    /// The algorithm.
    ///
    /// ```
    /// # use ratewall::{Policy, PolicyAlgorithm, Rate};
    /// let p = Policy::leaky_bucket(Rate::per_second(1));
    /// assert_eq!(p.algorithm(), PolicyAlgorithm::LeakyBucket);
    /// ```
    pub const fn algorithm(&self) -> PolicyAlgorithm {
        self.algorithm
    }

    /// The rate, for the bucket algorithms (`None` for the windows).
    ///
    /// ```
    /// # use ratewall::{Policy, Rate, Window};
    /// assert_eq!(Policy::token_bucket(Rate::per_second(1)).rate(), Some(Rate::per_second(1)));
    /// assert_eq!(Policy::fixed_window(Window::per_second(1)).rate(), None);
    /// ```
    pub const fn rate(&self) -> Option<Rate> {
        match self.quota {
            Quota::Rate(r) => Some(r),
            Quota::Window(_) => None,
        }
    }

    /// The window, for the window algorithms (`None` for the buckets).
    ///
    /// ```
    /// # use ratewall::{Policy, Rate, Window};
    /// assert_eq!(Policy::fixed_window(Window::per_second(1)).window(), Some(Window::per_second(1)));
    /// assert_eq!(Policy::token_bucket(Rate::per_second(1)).window(), None);
    /// ```
    pub const fn window(&self) -> Option<Window> {
        match self.quota {
            Quota::Window(w) => Some(w),
            Quota::Rate(_) => None,
        }
    }

    /// The most cost units admitted at once: the burst of a bucket, the
    /// limit of a window. This is a decision's [`limit`](Decision::limit).
    ///
    /// ```
    /// # use ratewall::{Policy, Rate};
    /// assert_eq!(Policy::token_bucket(Rate::per_minute(60)).limit(), 60);
    /// ```
    pub const fn limit(&self) -> u64 {
        match self.quota {
            Quota::Rate(r) => r.burst_size(),
            Quota::Window(w) => w.limit(),
        }
    }

    /// The span over which [`limit`](Self::limit) is counted: the window
    /// length, or for a bucket the time to refill its whole burst
    /// (`burst * period / count`). This is the `w` of the IETF
    /// `RateLimit-Policy` field.
    ///
    /// ```
    /// # use ratewall::{Policy, Rate, Window};
    /// # use std::time::Duration;
    /// assert_eq!(Policy::fixed_window(Window::per_minute(10)).span(), Duration::from_secs(60));
    /// let bucket = Policy::token_bucket(Rate::per_second(10).burst(5));
    /// assert_eq!(bucket.span(), Duration::from_millis(500));
    /// ```
    pub fn span(&self) -> Duration {
        match self.quota {
            Quota::Window(w) => w.length(),
            Quota::Rate(r) if r.count() == 0 => r.period(),
            Quota::Rate(r) => {
                let ns = r.period().as_nanos() * u128::from(r.burst_size()) / u128::from(r.count());
                Duration::from_nanos(u64::try_from(ns).unwrap_or(u64::MAX))
            }
        }
    }

    /// Checks the policy as the limiter constructors do: the same
    /// [`ConfigError`]s, with the same advice.
    ///
    /// ```
    /// # use ratewall::{ConfigError, Policy, Rate, Window};
    /// assert!(Policy::token_bucket(Rate::per_second(10)).validate().is_ok());
    /// assert_eq!(Policy::fixed_window(Window::per_second(0)).validate(), Err(ConfigError::ZeroLimit));
    /// ```
    pub fn validate(&self) -> Result<(), ConfigError> {
        Policy {
            soft: None,
            ..*self
        }
        .validate_hard()?;
        let (hard, soft) = self.widened()?;
        if soft.units > 0 {
            hard.validate_hard()
                .map_err(|e| widened_error(soft.limit, soft.units, e))?;
        }
        Ok(())
    }

    fn validate_hard(&self) -> Result<(), ConfigError> {
        match (self.algorithm, self.quota) {
            (PolicyAlgorithm::TokenBucket, Quota::Rate(r)) => Gcra::from_config(&r).map(drop),
            (PolicyAlgorithm::LeakyBucket, Quota::Rate(r)) => LeakyGcra::from_config(&r).map(drop),
            (PolicyAlgorithm::FixedWindow, Quota::Window(w)) => {
                FixedCounter::from_config(&w).map(drop)
            }
            (PolicyAlgorithm::SlidingWindowCounter, Quota::Window(w)) => {
                SlidingCounter::from_config(&w).map(drop)
            }
            (PolicyAlgorithm::SlidingWindowLog, Quota::Window(w)) => {
                SlidingLog::from_config(&w).map(drop)
            }
            // The constructors pair each algorithm with its quota kind.
            _ => unreachable!("a policy's quota always matches its algorithm"),
        }
    }
}

impl fmt::Debug for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut s = f.debug_struct("Policy");
        s.field("algorithm", &self.algorithm);
        match self.quota {
            Quota::Rate(r) => s.field("rate", &r),
            Quota::Window(w) => s.field("window", &w),
        };
        if let Some(t) = self.soft {
            s.field("tolerance", &t);
        }
        s.finish()
    }
}

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
    max_keys: Option<usize>,
    shards: Option<usize>,
    when_full: Option<WhenFull>,
    seed: Option<u64>,
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
            max_keys: None,
            shards: None,
            when_full: None,
            seed: None,
            clock: DefaultClock::default(),
            _key: std::marker::PhantomData,
        }
    }
}

impl<K, C: Clock> KeyedPolicyBuilder<K, C> {
    /// The most keys tracked at once (see [`KeyedBuilder::max_keys`]).
    ///
    /// ```
    /// # use ratewall::{KeyedPolicyLimiter, Policy, Rate};
    /// let b = KeyedPolicyLimiter::<u64>::builder(Policy::token_bucket(Rate::per_second(1))).max_keys(8);
    /// assert_eq!(b.build()?.max_keys(), 8);
    /// # Ok::<(), ratewall::ConfigError>(())
    /// ```
    pub fn max_keys(mut self, max_keys: usize) -> Self {
        self.max_keys = Some(max_keys);
        self
    }

    /// The shard count, a power of two (see [`KeyedBuilder::shards`]).
    ///
    /// ```
    /// # use ratewall::{KeyedPolicyLimiter, Policy, Rate};
    /// let l = KeyedPolicyLimiter::<u64>::builder(Policy::token_bucket(Rate::per_second(1)))
    ///     .max_keys(4096).shards(2).build()?;
    /// assert_eq!(l.max_keys(), 4096);
    /// # Ok::<(), ratewall::ConfigError>(())
    /// ```
    pub fn shards(mut self, shards: usize) -> Self {
        self.shards = Some(shards);
        self
    }

    /// What to do with a new key when the table is full of active keys.
    ///
    /// ```
    /// # use ratewall::{KeyedPolicyLimiter, Policy, Rate, WhenFull};
    /// let l = KeyedPolicyLimiter::<u64>::builder(Policy::token_bucket(Rate::per_second(1)))
    ///     .when_full(WhenFull::AdmitUntracked).build()?;
    /// assert_eq!(l.when_full(), WhenFull::AdmitUntracked);
    /// # Ok::<(), ratewall::ConfigError>(())
    /// ```
    pub fn when_full(mut self, policy: WhenFull) -> Self {
        self.when_full = Some(policy);
        self
    }

    /// A fixed hash seed (reproducible tests); random by default.
    ///
    /// ```
    /// # use ratewall::{KeyedPolicyLimiter, Policy, Rate};
    /// let l = KeyedPolicyLimiter::<u64>::builder(Policy::token_bucket(Rate::per_second(1)))
    ///     .seed(1).build()?;
    /// assert!(l.check_key(&1).is_allowed());
    /// # Ok::<(), ratewall::ConfigError>(())
    /// ```
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

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
            max_keys: self.max_keys,
            shards: self.shards,
            when_full: self.when_full,
            seed: self.seed,
            clock,
            _key: std::marker::PhantomData,
        }
    }

    /// Applies the knobs that were set to a typed builder.
    fn configure<A: crate::algo::Algorithm>(
        &self,
        mut b: KeyedBuilder<K, A, DefaultClock>,
    ) -> KeyedBuilder<K, A, C>
    where
        C: Clone,
    {
        if let Some(m) = self.max_keys {
            b = b.max_keys(m);
        }
        if let Some(s) = self.shards {
            b = b.shards(s);
        }
        if let Some(w) = self.when_full {
            b = b.when_full(w);
        }
        if let Some(s) = self.seed {
            b = b.seed(s);
        }
        b.clock(self.clock.clone())
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

    /// Checks one request of cost 1 for `key`.
    ///
    /// ```
    /// # use ratewall::{KeyedPolicyLimiter, Policy, Window};
    /// let l = KeyedPolicyLimiter::<u8>::new(Policy::fixed_window(Window::per_hour(1)))?;
    /// assert!(l.check_key(&1).is_allowed());
    /// assert!(!l.check_key(&1).is_allowed());
    /// # Ok::<(), ratewall::ConfigError>(())
    /// ```
    #[inline]
    pub fn check_key<Q>(&self, key: &Q) -> Decision
    where
        K: Borrow<Q>,
        Q: Hash + ?Sized,
    {
        self.soft
            .view(dispatch!(&self.inner, l => l.check_key(key)))
    }

    /// Checks a request of cost `n` for `key`. A cost above the limit can
    /// never pass and is an error.
    ///
    /// ```
    /// # use ratewall::{KeyedPolicyLimiter, Policy, Rate};
    /// let l = KeyedPolicyLimiter::<u8>::new(Policy::token_bucket(Rate::per_hour(10)))?;
    /// assert_eq!(l.check_key_n(&1, 4).unwrap().remaining(), 6);
    /// assert!(l.check_key_n(&1, 11).is_err());
    /// # Ok::<(), ratewall::ConfigError>(())
    /// ```
    #[inline]
    pub fn check_key_n<Q>(&self, key: &Q, n: u64) -> Result<Decision, InsufficientCapacity>
    where
        K: Borrow<Q>,
        Q: Hash + ?Sized,
    {
        dispatch!(&self.inner, l => l.check_key_n(key, n)).map(|d| self.soft.view(d))
    }

    /// [`check_key_n`](Self::check_key_n) at the time `now` (nanoseconds on
    /// this limiter's clock), for one clock read shared by several limiters.
    ///
    /// ```
    /// # use ratewall::{KeyedPolicyLimiter, ManualClock, Policy, Rate};
    /// let l = KeyedPolicyLimiter::<u8, _>::builder(Policy::token_bucket(Rate::per_second(1).burst(1)))
    ///     .clock(ManualClock::new()).build()?;
    /// assert!(l.check_key_n_at(&1, 0, 1)?.is_allowed());
    /// assert!(l.check_key_n_at(&1, 1_000_000_000, 1)?.is_allowed());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline]
    pub fn check_key_n_at<Q>(
        &self,
        key: &Q,
        now: u64,
        n: u64,
    ) -> Result<Decision, InsufficientCapacity>
    where
        K: Borrow<Q>,
        Q: Hash + ?Sized,
    {
        dispatch!(&self.inner, l => l.check_key_n_at(key, now, n)).map(|d| self.soft.view(d))
    }

    /// The decision a unit request for `key` would get, without taking it.
    ///
    /// ```
    /// # use ratewall::{KeyedPolicyLimiter, Policy, Rate};
    /// let l = KeyedPolicyLimiter::<u8>::new(Policy::token_bucket(Rate::per_hour(10)))?;
    /// assert_eq!(l.peek_key(&1).remaining(), 9);
    /// assert_eq!(l.peek_key(&1).remaining(), 9); // nothing taken
    /// # Ok::<(), ratewall::ConfigError>(())
    /// ```
    pub fn peek_key<Q>(&self, key: &Q) -> Decision
    where
        K: Borrow<Q>,
        Q: Hash + ?Sized,
    {
        match self.peek_key_n(key, 1) {
            Ok(d) => d,
            // Every limit admits at least one unit.
            Err(_) => unreachable!("a cost of 1 always fits"),
        }
    }

    /// The decision a request of cost `n` for `key` would get, without
    /// taking it.
    ///
    /// ```
    /// # use ratewall::{KeyedPolicyLimiter, Policy, Window};
    /// let l = KeyedPolicyLimiter::<u8>::new(Policy::sliding_window_counter(Window::per_hour(10)))?;
    /// assert!(l.peek_key_n(&1, 10)?.is_allowed());
    /// assert!(l.peek_key_n(&1, 11).is_err());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn peek_key_n<Q>(&self, key: &Q, n: u64) -> Result<Decision, InsufficientCapacity>
    where
        K: Borrow<Q>,
        Q: Hash + ?Sized,
    {
        dispatch!(&self.inner, l => l.peek_key_n(key, n)).map(|d| self.soft.view(d))
    }

    /// Gives back `n` units that an earlier check of `key` took.
    ///
    /// ```
    /// # use ratewall::{KeyedPolicyLimiter, Policy, Rate};
    /// let l = KeyedPolicyLimiter::<u8>::new(Policy::leaky_bucket(Rate::per_hour(2)))?;
    /// let _ = l.check_key(&1);
    /// l.refund_key(&1, 1);
    /// assert_eq!(l.peek_key(&1).remaining(), 1);
    /// # Ok::<(), ratewall::ConfigError>(())
    /// ```
    pub fn refund_key<Q>(&self, key: &Q, n: u64)
    where
        K: Borrow<Q>,
        Q: Hash + ?Sized,
    {
        dispatch!(&self.inner, l => l.refund_key(key, n))
    }

    /// [`refund_key`](Self::refund_key) at the time `now` of the check it
    /// gives back.
    ///
    /// ```
    /// # use ratewall::{KeyedPolicyLimiter, ManualClock, Policy, Window};
    /// let l = KeyedPolicyLimiter::<u8, _>::builder(Policy::fixed_window(Window::per_second(1)))
    ///     .clock(ManualClock::new()).build()?;
    /// assert!(l.check_key_n_at(&1, 5, 1)?.is_allowed());
    /// l.refund_key_at(&1, 5, 1);
    /// assert!(l.check_key_n_at(&1, 6, 1)?.is_allowed());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn refund_key_at<Q>(&self, key: &Q, now: u64, n: u64)
    where
        K: Borrow<Q>,
        Q: Hash + ?Sized,
    {
        dispatch!(&self.inner, l => l.refund_key_at(key, now, n))
    }

    /// Forgets `key`'s state: its next request sees a fresh limit.
    ///
    /// ```
    /// # use ratewall::{KeyedPolicyLimiter, Policy, Window};
    /// let l = KeyedPolicyLimiter::<u8>::new(Policy::sliding_window_log(Window::per_hour(1)))?;
    /// let _ = l.check_key(&1);
    /// l.reset_key(&1);
    /// assert!(l.check_key(&1).is_allowed());
    /// # Ok::<(), ratewall::ConfigError>(())
    /// ```
    pub fn reset_key<Q>(&self, key: &Q)
    where
        K: Borrow<Q>,
        Q: Hash + ?Sized,
    {
        dispatch!(&self.inner, l => l.reset_key(key))
    }

    /// How many keys the table holds now (active or not yet reclaimed).
    ///
    /// ```
    /// # use ratewall::{KeyedPolicyLimiter, Policy, Rate};
    /// let l = KeyedPolicyLimiter::<u8>::new(Policy::token_bucket(Rate::per_hour(2)))?;
    /// let _ = l.check_key(&1);
    /// assert_eq!(l.len(), 1);
    /// # Ok::<(), ratewall::ConfigError>(())
    /// ```
    pub fn len(&self) -> usize {
        dispatch!(&self.inner, l => l.len())
    }

    /// Whether the table holds no key.
    ///
    /// ```
    /// # use ratewall::{KeyedPolicyLimiter, Policy, Rate};
    /// let l = KeyedPolicyLimiter::<u8>::new(Policy::token_bucket(Rate::per_hour(2)))?;
    /// assert!(l.is_empty());
    /// # Ok::<(), ratewall::ConfigError>(())
    /// ```
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The most keys tracked at once.
    ///
    /// ```
    /// # use ratewall::{KeyedPolicyLimiter, Policy, Rate};
    /// let l = KeyedPolicyLimiter::<u8>::builder(Policy::token_bucket(Rate::per_hour(2)))
    ///     .max_keys(3).build()?;
    /// assert_eq!(l.max_keys(), 3);
    /// # Ok::<(), ratewall::ConfigError>(())
    /// ```
    pub fn max_keys(&self) -> usize {
        dispatch!(&self.inner, l => l.max_keys())
    }

    /// The policy for new keys when the table is full of active keys.
    ///
    /// ```
    /// # use ratewall::{KeyedPolicyLimiter, Policy, Rate, WhenFull};
    /// let l = KeyedPolicyLimiter::<u8>::new(Policy::token_bucket(Rate::per_hour(2)))?;
    /// assert_eq!(l.when_full(), WhenFull::RejectNew);
    /// # Ok::<(), ratewall::ConfigError>(())
    /// ```
    pub fn when_full(&self) -> WhenFull {
        match &self.inner {
            Inner::Log(l) => l.when_full(),
            Inner::Token(l) => l.when_full(),
            Inner::Leaky(l) => l.when_full(),
            Inner::Fixed(l) => l.when_full(),
            Inner::Sliding(l) => l.when_full(),
        }
    }

    /// Drops every idle key now; returns how many it dropped (then
    /// [`len`](Self::len) is exact).
    ///
    /// ```
    /// # use ratewall::{KeyedPolicyLimiter, ManualClock, Policy, Rate};
    /// let clock = ManualClock::new();
    /// let l = KeyedPolicyLimiter::<u8, _>::builder(Policy::token_bucket(Rate::per_second(1)))
    ///     .clock(clock.clone()).build()?;
    /// let _ = l.check_key(&1);
    /// clock.advance(std::time::Duration::from_secs(2));
    /// assert_eq!(l.retain_active(), 1);
    /// assert_eq!(l.len(), 0);
    /// # Ok::<(), ratewall::ConfigError>(())
    /// ```
    pub fn retain_active(&self) -> usize {
        dispatch!(&self.inner, l => l.retain_active())
    }

    /// The current time on this limiter's clock, in nanoseconds.
    ///
    /// ```
    /// # use ratewall::{KeyedPolicyLimiter, ManualClock, Policy, Rate};
    /// let l = KeyedPolicyLimiter::<u8, _>::builder(Policy::token_bucket(Rate::per_second(1)))
    ///     .clock(ManualClock::new()).build()?;
    /// assert_eq!(l.now(), 0);
    /// # Ok::<(), ratewall::ConfigError>(())
    /// ```
    pub fn now(&self) -> u64 {
        dispatch!(&self.inner, l => l.now())
    }

    /// This limiter with one key, as one limit of a multi-limit
    /// [`check_all`](crate::check_all) or [`check_each`](crate::check_each).
    ///
    /// ```
    /// # use ratewall::{check_all, KeyedPolicyLimiter, Policy, Window};
    /// let l = KeyedPolicyLimiter::<u8>::new(Policy::fixed_window(Window::per_hour(1)))?;
    /// assert!(check_all(&[&l.with_key(&1)]).is_allowed());
    /// assert!(!check_all(&[&l.with_key(&1)]).is_allowed());
    /// # Ok::<(), ratewall::ConfigError>(())
    /// ```
    pub fn with_key<'a, Q>(&'a self, key: &'a Q) -> KeyedPolicyRef<'a, K, Q, C>
    where
        K: Borrow<Q>,
        Q: Hash + ?Sized,
    {
        KeyedPolicyRef { limiter: self, key }
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
            .field("max_keys", &self.max_keys)
            .field("shards", &self.shards)
            .field("when_full", &self.when_full)
            .field("seed", &self.seed.map(|_| "set"))
            .field("clock", &self.clock)
            .finish()
    }
}

/// One key of a [`KeyedPolicyLimiter`], as one limit of a multi-limit
/// check. Made by [`KeyedPolicyLimiter::with_key`].
///
/// # Example
///
/// ```
/// use ratewall::{check_all, KeyedPolicyLimiter, Policy, Rate};
/// let l = KeyedPolicyLimiter::<u32>::new(Policy::token_bucket(Rate::per_second(2)))?;
/// let alice = l.with_key(&1);
/// println!("{alice:?}");
/// assert!(check_all(&[&alice]).is_allowed());
/// # Ok::<(), ratewall::ConfigError>(())
/// ```
pub struct KeyedPolicyRef<'a, K, Q: ?Sized, C: Clock> {
    limiter: &'a KeyedPolicyLimiter<K, C>,
    key: &'a Q,
}

impl<K, Q: ?Sized + fmt::Debug, C: Clock> fmt::Debug for KeyedPolicyRef<'_, K, Q, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedPolicyRef")
            .field("policy", &self.limiter.policy())
            .field("key", &self.key)
            .finish()
    }
}

impl<K, Q, C> LimitCore<C> for KeyedPolicyRef<'_, K, Q, C>
where
    K: Borrow<Q>,
    Q: Hash + ?Sized,
    C: Clock,
{
    #[inline]
    fn core_read_clock(&self, _: Token) -> u64 {
        self.limiter.now()
    }
    #[inline]
    fn core_take(&self, _: Token, now: u64, n: u64) -> Result<Decision, InsufficientCapacity> {
        dispatch!(&self.limiter.inner, l => l.with_key(self.key).take_at(now, n))
            .map(|d| self.limiter.soft.view(d))
    }
    fn core_peek(&self, _: Token, now: u64, n: u64) -> Result<Decision, InsufficientCapacity> {
        dispatch!(&self.limiter.inner, l => l.with_key(self.key).peek_at(now, n))
            .map(|d| self.limiter.soft.view(d))
    }
    fn core_give_back(&self, _: Token, now: u64, n: u64) {
        dispatch!(&self.limiter.inner, l => l.with_key(self.key).give_back_at(now, n))
    }
    fn core_capacity(&self, _: Token) -> u64 {
        dispatch!(&self.limiter.inner, l => l.with_key(self.key).capacity())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ManualClock;

    fn all_policies() -> [Policy; 5] {
        [
            Policy::token_bucket(Rate::per_second(4)),
            Policy::leaky_bucket(Rate::per_second(4)),
            Policy::fixed_window(Window::per_second(4)),
            Policy::sliding_window_counter(Window::per_second(4)),
            Policy::sliding_window_log(Window::per_second(4)),
        ]
    }

    #[test]
    fn each_policy_builds_its_own_algorithm_and_limits_at_its_limit() {
        for policy in all_policies() {
            let l = KeyedPolicyLimiter::<u8, _>::builder(policy)
                .max_keys(64)
                .clock(ManualClock::new())
                .build()
                .unwrap();
            assert_eq!(l.policy(), policy);
            for i in 0..4 {
                let d = l.check_key(&1);
                assert!(d.is_allowed(), "{policy:?} check {i}");
                assert_eq!(d.limit(), 4);
                assert_eq!(d.remaining(), 3 - i);
            }
            assert!(!l.check_key(&1).is_allowed(), "{policy:?}");
            assert!(
                l.check_key(&2).is_allowed(),
                "{policy:?}: keys are separate"
            );
            let inner_name = dispatch!(&l.inner, x => format!("{x:?}"));
            let expected = match policy.algorithm() {
                PolicyAlgorithm::SlidingWindowLog => "KeyedSlidingWindowLog",
                _ => "KeyedLimiter",
            };
            assert!(inner_name.starts_with(expected), "{inner_name}");
        }
    }

    #[test]
    fn builder_knobs_reach_the_table() {
        for policy in all_policies() {
            let l = KeyedPolicyLimiter::<u8, _>::builder(policy)
                .max_keys(1)
                .shards(1)
                .when_full(WhenFull::AdmitUntracked)
                .seed(3)
                .clock(ManualClock::new())
                .build()
                .unwrap();
            assert_eq!((l.max_keys(), l.when_full()), (1, WhenFull::AdmitUntracked));
            let _ = l.check_key(&1);
            assert_eq!(
                l.check_key(&2).tracking(),
                crate::Tracking::Untracked,
                "{policy:?}"
            );
            assert_eq!(l.len(), 1);
            assert!(!l.is_empty());
        }
    }

    #[test]
    fn validation_matches_the_typed_constructors() {
        let bad = [
            (
                Policy::token_bucket(Rate::per_second(0)),
                ConfigError::ZeroRate,
            ),
            (
                Policy::leaky_bucket(Rate::per_second(1).burst(0)),
                ConfigError::ZeroBurst,
            ),
            (
                Policy::fixed_window(Window::per_second(0)),
                ConfigError::ZeroLimit,
            ),
            (
                Policy::sliding_window_counter(Window::new(5, Duration::ZERO)),
                ConfigError::ZeroPeriod,
            ),
            (
                Policy::sliding_window_log(Window::per_second(0)),
                ConfigError::ZeroLimit,
            ),
        ];
        for (policy, err) in bad {
            assert_eq!(policy.validate(), Err(err.clone()), "{policy:?}");
            assert_eq!(
                KeyedPolicyLimiter::<u8>::builder(policy)
                    .max_keys(64)
                    .build()
                    .unwrap_err(),
                err,
                "{policy:?}"
            );
        }
        for policy in all_policies() {
            assert_eq!(policy.validate(), Ok(()));
        }
    }

    #[test]
    fn span_is_the_window_or_the_time_to_refill_the_burst() {
        assert_eq!(
            Policy::token_bucket(Rate::per_minute(60).burst(10)).span(),
            Duration::from_secs(10)
        );
        assert_eq!(
            Policy::sliding_window_log(Window::per_hour(3)).span(),
            Duration::from_secs(3600)
        );
        assert_eq!(
            Policy::token_bucket(Rate::per_second(0)).span(),
            Duration::from_secs(1)
        );
    }

    #[test]
    fn refund_reset_and_peek_reach_every_algorithm() {
        for policy in all_policies() {
            let clock = ManualClock::new();
            let l = KeyedPolicyLimiter::<u8, _>::builder(policy)
                .max_keys(64)
                .clock(clock.clone())
                .build()
                .unwrap();
            assert_eq!(l.check_key_n(&1, 3).unwrap().remaining(), 1);
            assert_eq!(l.peek_key(&1).remaining(), 0, "{policy:?}");
            l.refund_key(&1, 2);
            assert_eq!(l.peek_key_n(&1, 1).unwrap().remaining(), 2, "{policy:?}");
            l.refund_key_at(&1, l.now(), 1);
            assert_eq!(l.peek_key(&1).remaining(), 3, "{policy:?}");
            l.reset_key(&1);
            assert_eq!(l.peek_key(&1).remaining(), 3, "{policy:?}");
            assert!(l.check_key_n(&1, 5).is_err());
            assert!(l.check_key_n_at(&1, 0, 4).unwrap().is_allowed());
            clock.advance(Duration::from_secs(3));
            assert_eq!(l.retain_active(), 1, "{policy:?}");
            assert_eq!(l.len(), 0, "{policy:?}");
        }
    }
}
