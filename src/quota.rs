//! Rates for the bucket algorithms (GCRA) and windows for the window algorithms.

use crate::clock::duration_nanos;
use crate::error::ConfigError;
use std::time::Duration;

/// The largest GCRA tolerance (`burst x interval`) and the longest period:
/// 2^62 ns, about 146 years. `HORIZON + MAX_TOLERANCE` fits in a `u64`.
pub(crate) const MAX_TOLERANCE: u64 = 1 << 62;

/// A rate for the token and leaky buckets: `count` requests per `period`,
/// with up to `burst` admitted at once (the bucket's capacity).
///
/// The burst defaults to `count`: `Rate::per_second(100)` admits 100 at once,
/// then one every 10 ms.
///
/// # Precision
///
/// The emission interval `period / count` is kept in whole nanoseconds. When
/// `count` divides the period it is exact. Otherwise it is rounded **up**
/// (the limiter is never more permissive than asked), which is accepted only
/// while it changes the rate by at most 0.1%: any rate up to 1,000,000 per
/// second qualifies, as does any rate whose interval is a whole number of ns
/// (1e9/s included). Rates above one per nanosecond are rejected with
/// [`ConfigError::RateTooHigh`]; count in larger units instead.
///
/// # Example
///
/// ```
/// use ratewall::{Rate, TokenBucket};
/// use std::time::Duration;
///
/// let api = Rate::per_second(100).burst(20);
/// assert_eq!(api.burst_size(), 20);
/// let slow = Rate::new(3, Duration::from_millis(100)); // 3 per 100 ms, burst 3
/// let trickle = Rate::every(Duration::from_secs(6)); // 10 per minute, burst 1
/// for rate in [api, slow, trickle] {
///     assert!(TokenBucket::new(rate).is_ok());
/// }
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Rate {
    count: u64,
    period: Duration,
    burst: Option<u64>,
}

impl Rate {
    /// `count` requests per `period`, burst `count`.
    ///
    /// ```
    /// # use ratewall::Rate; use std::time::Duration;
    /// let r = Rate::new(5, Duration::from_millis(10));
    /// assert_eq!((r.count(), r.period(), r.burst_size()), (5, Duration::from_millis(10), 5));
    /// ```
    pub const fn new(count: u64, period: Duration) -> Rate {
        Rate {
            count,
            period,
            burst: None,
        }
    }

    /// `count` requests per second, burst `count`.
    ///
    /// **The burst is `count` by default, so "at most 10 a second" lets
    /// up to 19 through in the first second**: a full bucket of 10 at
    /// once, then one every 100 ms as it refills (`burst + rate * d` in any
    /// interval `d`). Calling an upstream API that allows at most `count`
    /// in any second, choose the burst: `.burst(1)` spaces requests
    /// strictly (one every `1/count` s, never more than `count` in any
    /// second), a small burst absorbs jitter at the cost of that many
    /// extra. A [`Window`] policy (`SlidingWindowLog`) counts "at most
    /// `count` in any second" exactly instead.
    ///
    /// ```
    /// # use ratewall::{ManualClock, Rate, TokenBucket};
    /// # use std::time::Duration;
    /// assert_eq!(Rate::per_second(10).period(), Duration::from_secs(1));
    ///
    /// // A client sending as fast as it is let through, for one second
    /// // (every 10 ms from 0 to 990 ms):
    /// let first_second = |rate: Rate| {
    ///     let clock = ManualClock::new();
    ///     let bucket = TokenBucket::with_clock(rate, clock.clone()).unwrap();
    ///     let mut admitted = 0;
    ///     for _ in 0..100 {
    ///         while bucket.check().is_allowed() {
    ///             admitted += 1;
    ///         }
    ///         clock.advance(Duration::from_millis(10));
    ///     }
    ///     admitted
    /// };
    /// assert_eq!(first_second(Rate::per_second(10)), 19); // burst 10
    /// assert_eq!(first_second(Rate::per_second(10).burst(1)), 10);
    /// ```
    pub const fn per_second(count: u64) -> Rate {
        Rate::new(count, Duration::from_secs(1))
    }

    /// `count` requests per minute.
    ///
    /// ```
    /// # use ratewall::Rate; use std::time::Duration;
    /// assert_eq!(Rate::per_minute(10).period(), Duration::from_secs(60));
    /// ```
    pub const fn per_minute(count: u64) -> Rate {
        Rate::new(count, Duration::from_secs(60))
    }

    /// `count` requests per hour.
    ///
    /// ```
    /// # use ratewall::Rate; use std::time::Duration;
    /// assert_eq!(Rate::per_hour(10).period(), Duration::from_secs(3600));
    /// ```
    pub const fn per_hour(count: u64) -> Rate {
        Rate::new(count, Duration::from_secs(3600))
    }

    /// `count` requests per day.
    ///
    /// ```
    /// # use ratewall::Rate; use std::time::Duration;
    /// assert_eq!(Rate::per_day(10).period(), Duration::from_secs(86_400));
    /// ```
    pub const fn per_day(count: u64) -> Rate {
        Rate::new(count, Duration::from_secs(86_400))
    }

    /// One request every `interval`, burst 1.
    ///
    /// ```
    /// # use ratewall::Rate; use std::time::Duration;
    /// let r = Rate::every(Duration::from_millis(250));
    /// assert_eq!((r.count(), r.burst_size()), (1, 1));
    /// ```
    pub const fn every(interval: Duration) -> Rate {
        Rate::new(1, interval)
    }

    /// Sets the burst: how many requests may pass at once after the limiter
    /// has been idle (the bucket's capacity).
    ///
    /// ```
    /// # use ratewall::Rate;
    /// assert_eq!(Rate::per_second(100).burst(5).burst_size(), 5);
    /// ```
    pub const fn burst(mut self, burst: u64) -> Rate {
        self.burst = Some(burst);
        self
    }

    /// Requests per period.
    ///
    /// ```
    /// # use ratewall::Rate;
    /// assert_eq!(Rate::per_minute(7).count(), 7);
    /// ```
    pub const fn count(&self) -> u64 {
        self.count
    }

    /// The period.
    ///
    /// ```
    /// # use ratewall::Rate; use std::time::Duration;
    /// assert_eq!(Rate::per_hour(7).period(), Duration::from_secs(3600));
    /// ```
    pub const fn period(&self) -> Duration {
        self.period
    }

    /// The burst (defaults to `count`).
    ///
    /// ```
    /// # use ratewall::Rate;
    /// assert_eq!(Rate::per_minute(7).burst_size(), 7);
    /// ```
    pub const fn burst_size(&self) -> u64 {
        match self.burst {
            Some(b) => b,
            None => self.count,
        }
    }

    /// The burst as set (`None`: it follows the count).
    pub(crate) const fn burst_setting(&self) -> Option<u64> {
        self.burst
    }
}

/// A period or window length as whole nanoseconds, validated: not zero,
/// at most [`MAX_TOLERANCE`]. The one check every rate and window makes.
pub(crate) fn period_ns(period: Duration) -> Result<u64, ConfigError> {
    let ns = duration_nanos(period);
    if ns == 0 {
        return Err(ConfigError::ZeroPeriod);
    }
    if ns > MAX_TOLERANCE {
        return Err(ConfigError::PeriodTooLong {
            max: Duration::from_nanos(MAX_TOLERANCE),
        });
    }
    Ok(ns)
}

/// A window quota for the window algorithms: at most `limit` cost units per
/// window of `length`.
///
/// Windows are aligned to the clock's epoch: the `k`-th window is
/// `[k*length, (k+1)*length)` in nanoseconds. The length is kept in whole
/// nanoseconds. Each algorithm validates the window into its own parameters
/// at construction and says what to change if it does not fit (see
/// [`ConfigError`]): [`FixedWindow`](crate::FixedWindow) accepts limits up to
/// 2^24 - 1 and windows from about 8.4 ms,
/// [`SlidingWindowCounter`](crate::SlidingWindowCounter) limits up to
/// 2^14 - 1 and windows from about 134 ms, and
/// [`SlidingWindowLog`](crate::SlidingWindowLog) limits up to 2^20 with any
/// window of at least 1 ns.
///
/// # Example
///
/// ```
/// use ratewall::{FixedWindow, SlidingWindowCounter, SlidingWindowLog, Window};
/// use std::time::Duration;
///
/// let w = Window::new(100, Duration::from_secs(60));
/// assert_eq!((w.limit(), w.length()), (100, Duration::from_secs(60)));
/// assert_eq!(w, Window::per_minute(100));
/// assert!(FixedWindow::new(w).is_ok());
/// assert!(SlidingWindowCounter::new(w).is_ok());
/// assert!(SlidingWindowLog::new(w).is_ok());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Window {
    limit: u64,
    length: Duration,
}

impl Window {
    /// At most `limit` per window of `length`.
    ///
    /// ```
    /// # use ratewall::Window; use std::time::Duration;
    /// let w = Window::new(5, Duration::from_millis(500));
    /// assert_eq!(w.limit(), 5);
    /// ```
    pub const fn new(limit: u64, length: Duration) -> Window {
        Window { limit, length }
    }

    /// At most `limit` per one-second window.
    ///
    /// ```
    /// # use ratewall::Window; use std::time::Duration;
    /// assert_eq!(Window::per_second(10).length(), Duration::from_secs(1));
    /// ```
    pub const fn per_second(limit: u64) -> Window {
        Window::new(limit, Duration::from_secs(1))
    }

    /// At most `limit` per one-minute window.
    ///
    /// ```
    /// # use ratewall::Window; use std::time::Duration;
    /// assert_eq!(Window::per_minute(10).length(), Duration::from_secs(60));
    /// ```
    pub const fn per_minute(limit: u64) -> Window {
        Window::new(limit, Duration::from_secs(60))
    }

    /// At most `limit` per one-hour window.
    ///
    /// ```
    /// # use ratewall::Window; use std::time::Duration;
    /// assert_eq!(Window::per_hour(10).length(), Duration::from_secs(3600));
    /// ```
    pub const fn per_hour(limit: u64) -> Window {
        Window::new(limit, Duration::from_secs(3600))
    }

    /// The most cost units admitted per window.
    ///
    /// ```
    /// # use ratewall::Window;
    /// assert_eq!(Window::per_hour(7).limit(), 7);
    /// ```
    pub const fn limit(&self) -> u64 {
        self.limit
    }

    /// The window length.
    ///
    /// ```
    /// # use ratewall::Window; use std::time::Duration;
    /// assert_eq!(Window::per_hour(7).length(), Duration::from_secs(3600));
    /// ```
    pub const fn length(&self) -> Duration {
        self.length
    }

    /// Validates the limit against `max_limit` and the length against
    /// `min_ns ..= MAX_TOLERANCE`, returning `(limit, length_ns)`.
    pub(crate) fn validate(self, max_limit: u64, min_ns: u64) -> Result<(u64, u64), ConfigError> {
        if self.limit == 0 {
            return Err(ConfigError::ZeroLimit);
        }
        let length = period_ns(self.length)?;
        if length < min_ns {
            return Err(ConfigError::WindowTooShort {
                min: Duration::from_nanos(min_ns),
            });
        }
        if self.limit > max_limit {
            return Err(ConfigError::LimitTooLarge {
                limit: self.limit,
                max: max_limit,
            });
        }
        Ok((self.limit, length))
    }
}

#[cfg(all(test, not(ratewall_loom)))]
mod tests {
    use super::*;

    #[test]
    fn window_validation_names_each_bad_input() {
        let ok = Window::new(5, Duration::from_secs(1));
        assert_eq!(ok.validate(10, 100), Ok((5, 1_000_000_000)));
        assert_eq!(
            Window::new(0, Duration::from_secs(1)).validate(10, 1),
            Err(ConfigError::ZeroLimit)
        );
        assert_eq!(
            Window::new(1, Duration::ZERO).validate(10, 1),
            Err(ConfigError::ZeroPeriod)
        );
        assert!(matches!(
            Window::new(1, Duration::MAX).validate(10, 1),
            Err(ConfigError::PeriodTooLong { .. })
        ));
        assert_eq!(
            Window::new(1, Duration::from_nanos(99)).validate(10, 100),
            Err(ConfigError::WindowTooShort {
                min: Duration::from_nanos(100)
            })
        );
        assert_eq!(
            Window::new(11, Duration::from_secs(1)).validate(10, 1),
            Err(ConfigError::LimitTooLarge { limit: 11, max: 10 })
        );
    }
}
