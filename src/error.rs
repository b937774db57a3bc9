//! Typed errors. Configuration is validated once, at construction; the only
//! error a check can return is a cost that could never pass.

use std::fmt;
use std::time::Duration;

/// A limiter configuration that cannot be built, and what to change.
///
/// # Example
///
/// ```
/// use ratewall::{ConfigError, Rate, TokenBucket};
///
/// let err = TokenBucket::new(Rate::per_second(0)).unwrap_err();
/// assert_eq!(err, ConfigError::ZeroRate);
/// println!("{err}"); // the message says what to change
/// ```
#[non_exhaustive]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ConfigError {
    /// A rate of 0 requests per period admits nothing.
    ZeroRate,
    /// The period (or window) is zero.
    ZeroPeriod,
    /// The period (or window) does not fit the 292-year time horizon.
    PeriodTooLong {
        /// The longest period accepted.
        max: Duration,
    },
    /// A burst of 0 admits nothing.
    ZeroBurst,
    /// The burst times the emission interval exceeds the largest tolerance
    /// the state word holds.
    BurstTooLarge {
        /// The burst asked for.
        burst: u64,
        /// The largest burst accepted at this rate.
        max: u64,
    },
    /// More than one request per nanosecond: the clock cannot tell them apart.
    RateTooHigh {
        /// Requests asked for per period.
        count: u64,
        /// The period, in nanoseconds.
        period_ns: u64,
    },
    /// The emission interval (period / count) is not a whole number of
    /// nanoseconds and rounding it would change the rate by more than 0.1%.
    RateImprecise {
        /// Requests asked for per period.
        count: u64,
        /// The period, in nanoseconds.
        period_ns: u64,
    },
    /// A limit of 0 (a window's limit, a concurrency maximum) admits nothing.
    ZeroLimit,
    /// The window limit does not fit the bits its packed word gives it.
    LimitTooLarge {
        /// The limit asked for.
        limit: u64,
        /// The largest limit this algorithm accepts.
        max: u64,
    },
    /// The window is shorter than this algorithm's packed window id allows
    /// (the id must not wrap within the 292-year time horizon).
    WindowTooShort {
        /// The shortest window accepted.
        min: Duration,
    },
    /// A keyed limiter's capacity (`max_keys`) is zero or too large.
    InvalidCapacity {
        /// The capacity asked for.
        max_keys: usize,
        /// The largest capacity accepted.
        max: usize,
    },
    /// The shard count is not a power of two, or is zero or too large.
    InvalidShards {
        /// The shard count asked for.
        shards: usize,
    },
    /// A soft policy's limit plus its tolerance does not fit the algorithm.
    ToleranceTooLarge {
        /// The nominal limit (a bucket's burst, a window's limit).
        limit: u64,
        /// The tolerance, in units.
        tolerance: u64,
        /// The largest tolerance accepted on this limit.
        max: u64,
    },
    /// A keyed table's 8-byte slot cannot hold this quota's state: 40 bits
    /// of state per key bound the value named (`docs/design.md`, "Keyed
    /// table").
    KeyedSlot {
        /// What does not fit.
        what: &'static str,
        /// The value asked for.
        value: u64,
        /// The bound the table accepts (a maximum; for an interval, a minimum).
        bound: u64,
        /// What to change, in words.
        fix: &'static str,
    },
    /// An adaptive maximum's bounds ([`Adaptive`](crate::Adaptive)) that
    /// cannot hold it: a floor of 0, or a starting maximum (the limiter's
    /// maximum) outside `floor..=ceiling`.
    ///
    /// ```
    /// use ratewall::{Adaptive, ConcurrencyLimiter, ConfigError};
    ///
    /// let err = ConcurrencyLimiter::builder(100).adaptive(Adaptive::vegas(10, 50)).build().unwrap_err();
    /// assert_eq!(err, ConfigError::AdaptiveBounds { floor: 10, initial: 100, ceiling: 50 });
    /// assert!(err.to_string().contains("100") && err.to_string().contains("10..50"));
    /// ```
    AdaptiveBounds {
        /// The floor asked for.
        floor: u64,
        /// Where the adaptive maximum starts: the limiter's maximum.
        initial: u64,
        /// The ceiling asked for.
        ceiling: u64,
    },
    /// An AIMD adaptive maximum's backoff is not strictly between 0 and 1.
    ///
    /// ```
    /// use ratewall::{Adaptive, ConcurrencyLimiter, ConfigError};
    /// use std::time::Duration;
    ///
    /// let aimd = Adaptive::aimd(5, 200, Duration::from_millis(100)).backoff(1.5);
    /// let err = ConcurrencyLimiter::builder(50).adaptive(aimd).build().unwrap_err();
    /// assert_eq!(err, ConfigError::AimdBackoff { backoff: "1.5".into() });
    /// assert!(err.to_string().contains("1.5"));
    /// ```
    AimdBackoff {
        /// The ratio asked for, as `f64`'s `Display` writes it (text, so
        /// that the error keeps `Eq`).
        backoff: String,
    },
    /// The parts of an elastic limit do not fit together, or a quota change
    /// asks for something the limiter cannot change at run time.
    Incompatible {
        /// What to change, in words.
        reason: &'static str,
    },
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::ZeroRate => f.write_str(
                "rate is zero requests per period; use a count of at least 1 (to block everything, deny without a limiter)",
            ),
            ConfigError::ZeroPeriod => {
                f.write_str("period or window is zero; use a duration of at least 1 ns")
            }
            ConfigError::PeriodTooLong { max } => write!(
                f,
                "period or window is longer than the time horizon; use at most {} s",
                max.as_secs()
            ),
            ConfigError::ZeroBurst => f.write_str("burst is zero; use a burst of at least 1"),
            ConfigError::BurstTooLarge { burst, max } => write!(
                f,
                "burst {burst} is too large at this rate (burst x interval must stay under 2^62 ns, about 146 years); use a burst of at most {max}"
            ),
            ConfigError::RateTooHigh { count, period_ns } => write!(
                f,
                "{count} per {period_ns} ns is more than one request per nanosecond; count in larger units (for example kilobytes instead of bytes)"
            ),
            ConfigError::RateImprecise { count, period_ns } => write!(
                f,
                "{count} per {period_ns} ns gives an interval of {:.3} ns, which rounding would change by more than 0.1%; pick a count that divides the period, or a rate under 1,000,000 per second",
                *period_ns as f64 / *count as f64
            ),
            ConfigError::ZeroLimit => {
                f.write_str("the limit is 0, which admits nothing; use a limit of at least 1")
            }
            ConfigError::LimitTooLarge { limit, max } => write!(
                f,
                "limit {limit} does not fit this algorithm's packed state; use a limit of at most {max}"
            ),
            ConfigError::WindowTooShort { min } => write!(
                f,
                "window is too short for this algorithm's packed window id; use a window of at least {} ns, or a token bucket for shorter periods",
                min.as_nanos()
            ),
            ConfigError::InvalidCapacity { max_keys, max } => write!(
                f,
                "max_keys {max_keys} is out of range; use between 1 and {max}"
            ),
            ConfigError::InvalidShards { shards } => write!(
                f,
                "shard count {shards} is not a power of two between 1 and 65536; use for example 64"
            ),
            ConfigError::ToleranceTooLarge { limit, tolerance, max } => write!(
                f,
                "limit {limit} with a tolerance of {tolerance} does not fit this algorithm's state; use a tolerance of at most {max}"
            ),
            ConfigError::KeyedSlot {
                what,
                value,
                bound,
                fix,
            } => write!(
                f,
                "{what} {value} does not fit a keyed table's 8-byte slot (bound {bound}); {fix}"
            ),
            ConfigError::AdaptiveBounds {
                floor: 0,
                initial,
                ceiling,
            } => write!(
                f,
                "an adaptive maximum's floor is 0 (bounds 0..{ceiling}, starting at {initial}): use a floor of at least 1"
            ),
            ConfigError::AdaptiveBounds {
                floor,
                initial,
                ceiling,
            } => write!(
                f,
                "an adaptive maximum starts at the limiter's maximum, {initial}, which lies outside its bounds {floor}..{ceiling}: the floor, the maximum and the ceiling must be in that order (floor <= maximum <= ceiling); change the maximum or the bounds"
            ),
            ConfigError::AimdBackoff { backoff } => write!(
                f,
                "AIMD's backoff is {backoff}, but it must lie strictly between 0 and 1 (the share of the maximum kept after an overloaded window): use for example 0.9"
            ),
            ConfigError::Incompatible { reason } => f.write_str(reason),
        }
    }
}

impl std::error::Error for ConfigError {}

/// A request whose cost exceeds what the limiter can ever admit at once: it
/// would be denied forever, so it is an error rather than a denial.
///
/// # Example
///
/// ```
/// use ratewall::{InsufficientCapacity, Rate, TokenBucket};
///
/// let bucket = TokenBucket::new(Rate::per_second(10).burst(5)).unwrap();
/// let err = bucket.check_n(6).unwrap_err();
/// assert_eq!(err, InsufficientCapacity { requested: 6, capacity: 5 });
/// assert!(err.to_string().starts_with("cost 6 can never pass: the limiter admits at most 5 at once"));
/// // The advice fits every limiter: a concurrency limiter has no burst.
/// assert!(err.to_string().contains("or the maximum"));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct InsufficientCapacity {
    /// The cost asked for.
    pub requested: u64,
    /// The largest cost the limiter admits at once (its burst or limit).
    pub capacity: u64,
}

impl InsufficientCapacity {
    /// The one check every limiter makes before a cost is tried: `Ok` if
    /// `requested` fits in `capacity`, else this error naming both.
    #[inline]
    pub(crate) fn check(requested: u64, capacity: u64) -> Result<(), Self> {
        if requested > capacity {
            Err(Self {
                requested,
                capacity,
            })
        } else {
            Ok(())
        }
    }
}

impl fmt::Display for InsufficientCapacity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "cost {} can never pass: the limiter admits at most {} at once; split the request, or raise the burst, the limit or the maximum (a concurrency limiter's)",
            self.requested, self.capacity
        )
    }
}

impl std::error::Error for InsufficientCapacity {}

/// A policy name that cannot be written into a header: it holds a character
/// outside printable ASCII (`0x20..=0x7E`), such as CR or LF, which an RFC
/// 9651 string cannot carry. Returned by
/// [`Decision::ratelimit_header`](crate::Decision::ratelimit_header).
///
/// ```
/// use ratewall::{InvalidPolicyName, ManualClock, Policy, Rate, TokenBucket};
///
/// let bucket = TokenBucket::with_clock(Rate::per_second(1), ManualClock::new()).unwrap();
/// let policy = Policy::token_bucket(Rate::per_second(1));
/// let err = bucket.check().ratelimit_header("a\nb", &policy).unwrap_err();
/// assert_eq!((err.position, err.character), (1, '\n'));
/// let _: &InvalidPolicyName = &err;
/// ```
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct InvalidPolicyName {
    /// The byte offset of the first character refused.
    pub position: usize,
    /// That character.
    pub character: char,
}

impl fmt::Display for InvalidPolicyName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "policy name has {:?} at byte {}: a header policy name may hold only printable ASCII (0x20 to 0x7E); remove or replace that character",
            self.character, self.position
        )
    }
}

impl std::error::Error for InvalidPolicyName {}
