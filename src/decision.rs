//! The answer every check returns.

use crate::error::InvalidPolicyName;
use std::fmt;
use std::fmt::Write as _;
use std::time::Duration;

/// The largest RFC 9651 structured-field integer (15 digits).
const SF_INTEGER_MAX: u64 = 999_999_999_999_999;

/// The outcome of one check: whether the request may proceed, and what an
/// HTTP server needs for its `Retry-After` and `RateLimit` headers.
///
/// All durations are exact to the nanosecond; the `*_secs` helpers round
/// **up**, so a client told to wait is never told to come back too early.
///
/// # Example
///
/// ```
/// use ratewall::{ManualClock, Rate, TokenBucket};
///
/// let bucket = TokenBucket::with_clock(Rate::per_second(2).burst(2), ManualClock::new()).unwrap();
/// let first = bucket.check();
/// assert!(first.is_allowed());
/// assert_eq!((first.limit(), first.remaining()), (2, 1));
/// let _ = bucket.check();
/// let denied = bucket.check();
/// assert!(!denied.is_allowed());
/// assert_eq!(denied.retry_after().as_millis(), 500);
/// assert_eq!(denied.retry_after_secs(), 1); // rounded up, never 0 on a denial
/// assert_eq!(denied.reset_after().as_millis(), 1000);
/// ```
#[must_use = "a decision that is not looked at does not limit anything"]
#[derive(Clone, Copy)]
pub struct Decision {
    pub(crate) allowed: bool,
    pub(crate) tracking: Tracking,
    pub(crate) limit: u64,
    /// `remaining = credit / unit`, divided only when asked: a 64-bit
    /// division would otherwise be a good part of a check's cost.
    credit: u64,
    unit: u64,
    pub(crate) retry_after_ns: u64,
    pub(crate) reset_after_ns: u64,
    /// Allowed above the nominal `limit` (a soft tolerance or an elastic
    /// pool admitted it); see [`Decision::is_above_limit`].
    pub(crate) above_limit: bool,
}

/// How a keyed limiter handled the key of a decision. Single limiters always
/// report [`Tracking::Tracked`].
///
/// # Example
///
/// ```
/// use ratewall::{Rate, TokenBucket, Tracking};
///
/// let bucket = TokenBucket::new(Rate::per_second(5)).unwrap();
/// assert_eq!(bucket.check().tracking(), Tracking::Tracked);
/// ```
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Tracking {
    /// The key has state in the limiter, and the decision was made on it.
    Tracked,
    /// The table was full of active keys and the policy is to fail open: the
    /// request was allowed without being counted.
    Untracked,
    /// The table was full of active keys and the policy is to fail closed:
    /// the request was denied without being counted.
    Rejected,
    /// The table was full of active keys, and the least recently active key
    /// was evicted to make room for this one.
    EvictedOther,
}

impl Decision {
    #[allow(dead_code)] // used by the window algorithms
    pub(crate) const fn allow(limit: u64, remaining: u64, reset_after_ns: u64) -> Self {
        Self::allow_credit(limit, remaining, 1, reset_after_ns)
    }

    pub(crate) const fn deny(
        limit: u64,
        remaining: u64,
        retry_after_ns: u64,
        reset_after_ns: u64,
    ) -> Self {
        Self::deny_credit(limit, remaining, 1, retry_after_ns, reset_after_ns)
    }

    /// An allowed decision whose `remaining` is `credit / unit` (`unit > 0`).
    #[inline]
    pub(crate) const fn allow_credit(
        limit: u64,
        credit: u64,
        unit: u64,
        reset_after_ns: u64,
    ) -> Self {
        Decision {
            allowed: true,
            tracking: Tracking::Tracked,
            limit,
            credit,
            unit,
            retry_after_ns: 0,
            reset_after_ns,
            above_limit: false,
        }
    }

    /// A denial whose `remaining` is `credit / unit` (`unit > 0`).
    #[inline]
    pub(crate) const fn deny_credit(
        limit: u64,
        credit: u64,
        unit: u64,
        retry_after_ns: u64,
        reset_after_ns: u64,
    ) -> Self {
        Decision {
            allowed: false,
            tracking: Tracking::Tracked,
            limit,
            credit,
            unit,
            // A denial always has something to wait for.
            retry_after_ns: if retry_after_ns == 0 {
                1
            } else {
                retry_after_ns
            },
            reset_after_ns,
            above_limit: false,
        }
    }

    #[allow(dead_code)] // used by the keyed limiters
    pub(crate) const fn with_tracking(mut self, tracking: Tracking) -> Self {
        self.tracking = tracking;
        self
    }

    /// Whether the request may proceed.
    ///
    /// ```
    /// # use ratewall::{Rate, TokenBucket};
    /// let bucket = TokenBucket::new(Rate::per_second(1).burst(1)).unwrap();
    /// assert!(bucket.check().is_allowed());
    /// assert!(!bucket.check().is_allowed());
    /// ```
    #[inline]
    pub const fn is_allowed(&self) -> bool {
        self.allowed
    }

    /// The most requests (cost units) the limiter can admit at once: the
    /// burst of a bucket, the limit of a window.
    ///
    /// ```
    /// # use ratewall::{Rate, TokenBucket};
    /// let bucket = TokenBucket::new(Rate::per_second(100).burst(20)).unwrap();
    /// assert_eq!(bucket.check().limit(), 20);
    /// ```
    #[inline]
    pub const fn limit(&self) -> u64 {
        self.limit
    }

    /// How many more unit-cost requests would be admitted right now, after
    /// this one.
    ///
    /// ```
    /// # use ratewall::{Rate, TokenBucket};
    /// let bucket = TokenBucket::new(Rate::per_minute(60).burst(3)).unwrap();
    /// assert_eq!(bucket.check().remaining(), 2);
    /// ```
    #[inline]
    pub const fn remaining(&self) -> u64 {
        self.credit / self.unit
    }

    /// Zero when allowed; otherwise the earliest wait after which the same
    /// request could pass (if nothing else is admitted meanwhile).
    ///
    /// ```
    /// # use ratewall::{ManualClock, Rate, TokenBucket};
    /// # use std::time::Duration;
    /// let bucket = TokenBucket::with_clock(Rate::per_second(4).burst(1), ManualClock::new()).unwrap();
    /// assert_eq!(bucket.check().retry_after(), Duration::ZERO);
    /// assert_eq!(bucket.check().retry_after(), Duration::from_millis(250));
    /// ```
    #[inline]
    pub const fn retry_after(&self) -> Duration {
        Duration::from_nanos(self.retry_after_ns)
    }

    /// The time until the limiter is back to full capacity for this key.
    ///
    /// ```
    /// # use ratewall::{ManualClock, Rate, TokenBucket};
    /// # use std::time::Duration;
    /// let bucket = TokenBucket::with_clock(Rate::per_second(10).burst(5), ManualClock::new()).unwrap();
    /// let d = bucket.check_n(3).unwrap(); // 3 of 5 used, one comes back every 100 ms
    /// assert_eq!(d.reset_after(), Duration::from_millis(300));
    /// ```
    #[inline]
    pub const fn reset_after(&self) -> Duration {
        Duration::from_nanos(self.reset_after_ns)
    }

    /// `retry_after` in whole seconds, rounded up, for the `Retry-After`
    /// header: 0 when allowed, at least 1 when denied.
    ///
    /// ```
    /// # use ratewall::{ManualClock, Rate, TokenBucket};
    /// let bucket = TokenBucket::with_clock(Rate::per_second(1000).burst(1), ManualClock::new()).unwrap();
    /// let _ = bucket.check();
    /// let denied = bucket.check();
    /// assert_eq!(denied.retry_after().as_millis(), 1);
    /// assert_eq!(denied.retry_after_secs(), 1);
    /// ```
    #[inline]
    pub const fn retry_after_secs(&self) -> u64 {
        ceil_secs(self.retry_after_ns)
    }

    /// `reset_after` in whole seconds, rounded up: `X-RateLimit-Reset` as a
    /// delta, and the `t` of the `RateLimit` header when allowed.
    ///
    /// ```
    /// # use ratewall::{ManualClock, Rate, TokenBucket};
    /// let bucket = TokenBucket::with_clock(Rate::per_second(2).burst(2), ManualClock::new()).unwrap();
    /// assert_eq!(bucket.check().reset_after_secs(), 1); // 0.5 s rounds up
    /// ```
    #[inline]
    pub const fn reset_after_secs(&self) -> u64 {
        ceil_secs(self.reset_after_ns)
    }

    /// How a keyed limiter treated the key (always `Tracked` elsewhere).
    ///
    /// ```
    /// # use ratewall::{Rate, TokenBucket, Tracking};
    /// let bucket = TokenBucket::new(Rate::per_second(5)).unwrap();
    /// assert_eq!(bucket.check().tracking(), Tracking::Tracked);
    /// ```
    #[inline]
    pub const fn tracking(&self) -> Tracking {
        self.tracking
    }

    /// Whether the request was allowed **above** the nominal
    /// [`limit`](Self::limit): a soft policy's tolerance or an elastic
    /// limit's shared pool admitted it where the nominal limit would have
    /// denied it. Warn, log or bill it. Always `false` on a denial.
    ///
    /// `limit` and `remaining` stay nominal: `remaining` counts what is left
    /// below the nominal limit, and is 0 while a key is above it.
    ///
    /// ```
    /// # use ratewall::{KeyedPolicyLimiter, ManualClock, Policy, Tolerance, Window};
    /// let soft = Policy::fixed_window(Window::per_minute(2)).soft(Tolerance::Units(1));
    /// let l = KeyedPolicyLimiter::<u8, _>::builder(soft).clock(ManualClock::new()).build()?;
    /// let d = [l.check_key(&1), l.check_key(&1), l.check_key(&1), l.check_key(&1)];
    /// assert_eq!(d.map(|d| d.is_allowed()), [true, true, true, false]);
    /// assert_eq!(d.map(|d| d.is_above_limit()), [false, false, true, false]);
    /// assert_eq!(d.map(|d| (d.limit(), d.remaining())), [(2, 1), (2, 0), (2, 0), (2, 0)]);
    /// # Ok::<(), ratewall::ConfigError>(())
    /// ```
    #[inline]
    pub const fn is_above_limit(&self) -> bool {
        self.above_limit
    }

    /// Marks an allowed decision as admitted above its nominal limit.
    pub(crate) const fn with_above_limit(mut self, above: bool) -> Self {
        self.above_limit = above && self.allowed;
        self
    }

    /// The `RateLimit` item `"name";r=<remaining>;t=<seconds>` of
    /// [`Decision::ratelimit_header`] (written in `policy.rs`, beside the
    /// policy it reads), `t` capped at `window` when admitted
    /// ([`Self::ratelimit_t_secs_within`]). The name is escaped or refused
    /// as that method's docs say.
    pub(crate) fn ratelimit_item(
        &self,
        name: &str,
        window: Option<Duration>,
    ) -> Result<String, InvalidPolicyName> {
        let mut out = String::with_capacity(name.len() + 32);
        out.push('"');
        for (position, character) in name.char_indices() {
            match character {
                '"' | '\\' => {
                    out.push('\\');
                    out.push(character);
                }
                ' '..='~' => out.push(character),
                _ => {
                    return Err(InvalidPolicyName {
                        position,
                        character,
                    })
                }
            }
        }
        out.push('"');
        // RFC 9651 integers have at most 15 digits: larger values (an
        // unlimited `remaining`, a wait centuries away) are capped there.
        // Writing to a String cannot fail.
        let _ = write!(
            out,
            ";r={};t={}",
            self.remaining().min(SF_INTEGER_MAX),
            self.ratelimit_t_secs_within(window).min(SF_INTEGER_MAX)
        );
        Ok(out)
    }

    /// The `t` of a `RateLimit` item, uncapped: `reset_after_secs` when
    /// allowed, `retry_after_secs` (at least 1) when denied. Headers use
    /// [`Self::ratelimit_t_secs_within`]; this orders rules by their wait.
    #[inline]
    pub(crate) fn ratelimit_t_secs(&self) -> u64 {
        if self.is_allowed() {
            self.reset_after_secs()
        } else {
            self.retry_after_secs()
        }
    }

    /// The `t` of a `RateLimit` item under draft -11, the window within
    /// which at most `r` more are available, for the HTTP layer's header
    /// writer and [`Decision::ratelimit_header`] alike. Denied: the wait
    /// until the request can pass (`retry_after_secs`, never capped: a
    /// `Retry-After` must not be earlier). Allowed: the time until the
    /// quota is back (`reset_after_secs`), capped at `window` (a window
    /// policy's length, rounded up; `None` for a bucket). Only a
    /// sliding-window counter needs the cap: its previous window weighs for
    /// up to one more window, so its time to full is up to `2w`; a bucket
    /// is full within the time to refill its burst, a fixed window at its
    /// end, a log when its newest entry leaves.
    #[inline]
    pub(crate) fn ratelimit_t_secs_within(&self, window: Option<Duration>) -> u64 {
        let t = self.ratelimit_t_secs();
        match window {
            Some(w) if self.allowed => {
                t.min(w.as_secs().saturating_add(u64::from(w.subsec_nanos() > 0)))
            }
            _ => t,
        }
    }

    /// Combines two decisions into the most restrictive one: denied if either
    /// is, the lower `remaining`, the longer waits. Used by multi-limit checks.
    #[allow(dead_code)] // used by multi-limit checks
    pub(crate) fn most_restrictive(self, other: Decision) -> Decision {
        let (primary, secondary) = if self.allowed != other.allowed {
            if self.allowed {
                (other, self)
            } else {
                (self, other)
            }
        } else if self.remaining() <= other.remaining() {
            (self, other)
        } else {
            (other, self)
        };
        Decision {
            allowed: primary.allowed,
            tracking: primary.tracking,
            limit: primary.limit,
            credit: primary.remaining().min(secondary.remaining()),
            unit: 1,
            retry_after_ns: if primary.allowed {
                0
            } else {
                primary.retry_after_ns.max(if secondary.allowed {
                    0
                } else {
                    secondary.retry_after_ns
                })
            },
            reset_after_ns: primary.reset_after_ns.max(secondary.reset_after_ns),
            // An allowed combination is above a limit if any part is.
            above_limit: primary.allowed && (primary.above_limit || secondary.above_limit),
        }
    }
}

impl Decision {
    fn key(&self) -> (bool, Tracking, u64, u64, u64, u64, bool) {
        (
            self.allowed,
            self.tracking,
            self.limit,
            self.remaining(),
            self.retry_after_ns,
            self.reset_after_ns,
            self.above_limit,
        )
    }
}

impl PartialEq for Decision {
    fn eq(&self, other: &Self) -> bool {
        self.key() == other.key()
    }
}

impl Eq for Decision {}

impl std::hash::Hash for Decision {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.key().hash(state);
    }
}

const fn ceil_secs(ns: u64) -> u64 {
    ns.div_ceil(1_000_000_000)
}

impl fmt::Debug for Decision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Decision")
            .field("allowed", &self.allowed)
            .field("limit", &self.limit)
            .field("remaining", &self.remaining())
            .field("retry_after", &self.retry_after())
            .field("reset_after", &self.reset_after())
            .field("tracking", &self.tracking)
            .field("above_limit", &self.above_limit)
            .finish()
    }
}

#[cfg(all(test, not(ratewall_loom)))]
mod tests {
    use super::*;

    #[test]
    fn seconds_round_up() {
        let d = Decision::deny(10, 0, 1, 1_000_000_001);
        assert_eq!(d.retry_after_secs(), 1);
        assert_eq!(d.reset_after_secs(), 2);
        let d = Decision::deny(10, 0, 2_000_000_000, 2_000_000_000);
        assert_eq!(d.retry_after_secs(), 2);
        let a = Decision::allow(10, 9, 0);
        assert_eq!(a.retry_after_secs(), 0);
        assert_eq!(a.reset_after_secs(), 0);
    }

    #[test]
    fn a_denial_never_says_retry_now() {
        let d = Decision::deny(1, 0, 0, 0);
        assert!(d.retry_after_ns > 0);
        assert_eq!(d.retry_after_secs(), 1);
    }

    #[test]
    fn most_restrictive_prefers_denials_then_lowest_remaining() {
        let a = Decision::allow(10, 7, 100);
        let b = Decision::allow(5, 2, 300);
        let c = Decision::deny(20, 4, 50, 80);
        let d = Decision::deny(20, 1, 90, 10);
        let ab = a.most_restrictive(b);
        assert!(ab.allowed);
        assert_eq!((ab.limit, ab.remaining(), ab.reset_after_ns), (5, 2, 300));
        let ac = a.most_restrictive(c);
        assert!(!ac.allowed);
        assert_eq!((ac.limit, ac.remaining(), ac.retry_after_ns), (20, 4, 50));
        let cd = c.most_restrictive(d);
        assert_eq!(
            (cd.remaining(), cd.retry_after_ns, cd.reset_after_ns),
            (1, 90, 80)
        );
        assert_eq!(b.most_restrictive(a), ab);
    }

    #[test]
    fn header_value_escapes_quotes_and_backslashes() {
        let d = Decision::allow(10, 3, 2_500_000_000);
        assert_eq!(
            d.ratelimit_item("a\"b\\c", None).unwrap(),
            "\"a\\\"b\\\\c\";r=3;t=3"
        );
        assert_eq!(d.ratelimit_item("", None).unwrap(), "\"\";r=3;t=3");
        assert_eq!(d.ratelimit_item(" ~", None).unwrap(), "\" ~\";r=3;t=3");
        let unlimited = Decision::allow(u64::MAX, u64::MAX, u64::MAX);
        assert_eq!(
            unlimited.ratelimit_item("x", None).unwrap(),
            "\"x\";r=999999999999999;t=18446744074"
        );
    }

    /// Issue 23: `t` follows draft -11 as the HTTP layer writes it.
    #[test]
    fn t_is_the_wait_when_denied_and_the_time_to_full_within_the_window_when_allowed() {
        const S: u64 = 1_000_000_000;
        let secs = |s: u64| Some(Duration::from_secs(s));
        let allowed = Decision::allow(10, 3, 119 * S);
        assert_eq!(allowed.ratelimit_t_secs(), 119);
        assert_eq!(allowed.ratelimit_t_secs_within(None), 119);
        assert_eq!(allowed.ratelimit_t_secs_within(secs(60)), 60);
        assert_eq!(allowed.ratelimit_t_secs_within(secs(200)), 119);
        // A window's fraction of a second rounds up; a whole one does not.
        let half = Some(Duration::from_millis(59_500));
        assert_eq!(allowed.ratelimit_t_secs_within(half), 60);
        assert_eq!(allowed.ratelimit_t_secs_within(secs(59)), 59);
        assert_eq!(allowed.ratelimit_t_secs_within(Some(Duration::MAX)), 119);
        let denied = Decision::deny(10, 0, 65 * S, 119 * S);
        assert_eq!(denied.ratelimit_t_secs(), 65);
        assert_eq!(denied.ratelimit_t_secs_within(secs(60)), 65, "never capped");
        assert_eq!(
            denied.ratelimit_item("x", secs(60)).unwrap(),
            "\"x\";r=0;t=65"
        );
        assert_eq!(
            allowed.ratelimit_item("x", secs(60)).unwrap(),
            "\"x\";r=3;t=60"
        );
    }

    /// Finding 5 of issue 15: a name with CR LF reached the header as is.
    #[test]
    fn header_refuses_control_and_non_ascii_characters() {
        let d = Decision::allow(10, 3, 2_500_000_000);
        assert_eq!(
            d.ratelimit_item("a\r\nSet-Cookie: x=1", None),
            Err(InvalidPolicyName {
                position: 1,
                character: '\r'
            })
        );
        for bad in ["\u{0}", "\t", "\u{1f}", "\u{7f}", "é", "x\n"] {
            let err = d.ratelimit_item(bad, None).unwrap_err();
            assert_eq!(Some(err.character), bad.chars().last());
        }
    }
}
