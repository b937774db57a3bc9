//! [`Policy`]: an algorithm plus its quota, as one value, and its
//! validation. The same policy builds a local keyed limiter
//! ([`KeyedPolicyLimiter`](crate::KeyedPolicyLimiter), `keyed/policy.rs`) and, with the
//! `redis` feature, a limiter whose state lives in Redis, so one
//! configuration serves a single process and a fleet.

use crate::algo::sealed::Core;
use crate::algo::{FixedCounter, Gcra, LeakyGcra, SlidingCounter, SlidingLog};
use crate::decision::Decision;
use crate::error::ConfigError;
use crate::quota::{Rate, Window};
use crate::soft::{widened_error, Soft, Tolerance};
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
pub(crate) enum Quota {
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
    pub(crate) algorithm: PolicyAlgorithm,
    pub(crate) quota: Quota,
    /// A soft policy's tolerance (see [`Policy::soft`]).
    pub(crate) soft: Option<Tolerance>,
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
    /// ([`Decision::is_above_limit`](crate::Decision::is_above_limit)). Decisions report the nominal
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
    /// limit of a window. This is a decision's [`limit`](crate::Decision::limit).
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

// The `RateLimit` header needs the policy's window (its `t` is capped by
// it), and `decision.rs` sits below this file: the method lives here, its
// writer (`Decision::ratelimit_item`) and `t` there.
impl Decision {
    /// The value of the `RateLimit` header field of
    /// draft-ietf-httpapi-ratelimit-headers-11 (the wire format of -10) for
    /// a decision of `policy`, named `name`: `"name";r=<remaining>;t=<seconds>`,
    /// as the HTTP layer writes it (docs/http.md has the table per
    /// algorithm).
    ///
    /// `t` is the window within which at most `r` more are available. For
    /// an allowed decision, the time until the quota is back
    /// ([`reset_after_secs`](Self::reset_after_secs)), never more than the
    /// window of a window policy (a sliding-window counter's previous
    /// window weighs for up to one more window, so its time to full is up
    /// to twice the window); for a denial, the time until the same request
    /// can pass ([`retry_after_secs`](Self::retry_after_secs), the
    /// `Retry-After` of the 429), never capped, so `t` never ends after
    /// the `Retry-After` sent with it.
    ///
    /// The name becomes an RFC 9651 structured-field string: `"` and `\` are
    /// escaped (`\"`, `\\`), and a name with any other character outside
    /// printable ASCII (`0x20..=0x7E`: control characters such as CR and LF,
    /// DEL, non-ASCII) is refused with [`InvalidPolicyName`](crate::InvalidPolicyName),
    /// so that no name can inject a header. `r` and `t` are capped at
    /// 999,999,999,999,999, the largest RFC 9651 integer.
    ///
    /// ```
    /// use ratewall::{ManualClock, Policy, Rate, SlidingWindowCounter, TokenBucket, Window};
    /// use std::time::Duration;
    ///
    /// let policy = Policy::token_bucket(Rate::per_minute(60));
    /// let bucket = TokenBucket::with_clock(Rate::per_minute(60), ManualClock::new()).unwrap();
    /// let d = bucket.check();
    /// assert_eq!(d.ratelimit_header("default", &policy).unwrap(), "\"default\";r=59;t=1");
    /// assert_eq!(d.ratelimit_header("a\"b", &policy).unwrap(), "\"a\\\"b\";r=59;t=1");
    /// assert!(d.ratelimit_header("a\r\nSet-Cookie: x=1", &policy).is_err());
    /// for _ in 0..59 {
    ///     let _ = bucket.check();
    /// }
    /// let denied = bucket.check();
    /// assert_eq!(denied.reset_after_secs(), 60);
    /// assert_eq!(denied.ratelimit_header("default", &policy).unwrap(), "\"default\";r=0;t=1");
    ///
    /// // A sliding-window counter: a request 1 s into a window still weighs
    /// // through the next window, so the quota is back only 119 s later;
    /// // `t` stops at the window.
    /// let window = Window::per_minute(10);
    /// let clock = ManualClock::new();
    /// let counter = SlidingWindowCounter::with_clock(window, clock.clone()).unwrap();
    /// clock.advance(Duration::from_secs(1));
    /// let d = counter.check();
    /// assert_eq!(d.reset_after_secs(), 119);
    /// let policy = Policy::sliding_window_counter(window);
    /// assert_eq!(d.ratelimit_header("api", &policy).unwrap(), "\"api\";r=9;t=60");
    /// ```
    pub fn ratelimit_header(
        &self,
        name: &str,
        policy: &Policy,
    ) -> Result<String, crate::error::InvalidPolicyName> {
        self.ratelimit_item(name, policy.window().map(|w| w.length()))
    }
}
