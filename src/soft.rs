//! Soft limits: a [`Tolerance`] on a [`Policy`](crate::Policy) lets a key go
//! a little above its nominal limit, and marks what passes there.
//!
//! # Semantics (mirrored exactly by any backend)
//!
//! A soft policy with nominal limit `L` (a bucket's burst, a window's limit)
//! and a tolerance of `u` units runs the **same algorithm with capacity
//! `L + u`** and nothing else changed: a bucket keeps its rate (emission
//! interval `T`) and gets burst `L + u`; a window keeps its length and gets
//! limit `L + u`. Its decisions are then read back in nominal terms:
//!
//! - `limit` is `L`;
//! - `remaining` is `max(0, remaining' - u)`, with `remaining'` the widened
//!   algorithm's remaining (what is left below the nominal limit);
//! - an allowed request is **above the limit** iff `remaining' < u`: exactly
//!   when the same algorithm with capacity `L`, in the same state, would have
//!   denied it (every algorithm allows iff `used + n <= capacity`, and
//!   reports `remaining' = capacity - used - n` with an integer `used`);
//! - `retry_after`, `reset_after` and the tracking are the widened
//!   algorithm's.
//!
//! A percentage tolerance is `floor(L * p / 100)` units, fixed when the
//! policy is built.

use crate::decision::Decision;
use crate::error::ConfigError;
use std::fmt;

/// How far above its nominal limit a soft [`Policy`](crate::Policy) admits:
/// a number of cost units, or a percentage of the limit (rounded down).
///
/// Admitted requests above the nominal limit are marked
/// ([`Decision::is_above_limit`]); `limit` and `remaining` stay nominal.
///
/// # Example
///
/// ```
/// use ratewall::{Policy, Tolerance, Window};
///
/// let p = Policy::fixed_window(Window::per_minute(100)).soft(Tolerance::Percent(10));
/// assert_eq!((p.limit(), p.soft_limit()), (100, 110));
/// assert_eq!(Tolerance::Percent(10).units(5), 0); // 0.5 rounds down
/// assert_eq!(Tolerance::Units(3).units(5), 3);
/// assert_eq!("100/min fixed-window soft 10%".parse::<Policy>()?, p);
/// # Ok::<(), ratewall::ParseError>(())
/// ```
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Tolerance {
    /// This many cost units above the nominal limit.
    Units(u64),
    /// This percentage of the nominal limit, rounded down to whole units.
    Percent(u32),
}

impl Tolerance {
    /// The tolerance in cost units on a nominal `limit` (saturating).
    ///
    /// ```
    /// # use ratewall::Tolerance;
    /// assert_eq!(Tolerance::Percent(25).units(10), 2);
    /// assert_eq!(Tolerance::Percent(200).units(10), 20);
    /// ```
    pub const fn units(self, limit: u64) -> u64 {
        match self {
            Tolerance::Units(u) => u,
            Tolerance::Percent(p) => {
                let u = limit as u128 * p as u128 / 100;
                if u > u64::MAX as u128 {
                    u64::MAX
                } else {
                    u as u64
                }
            }
        }
    }
}

impl fmt::Display for Tolerance {
    /// `10%` or `5` (units): the text form after `soft`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Tolerance::Units(u) => write!(f, "{u}"),
            Tolerance::Percent(p) => write!(f, "{p}%"),
        }
    }
}

/// A soft policy's nominal limit and tolerance, fixed at build time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Soft {
    pub(crate) limit: u64,
    pub(crate) units: u64,
}

impl Soft {
    /// Reads a decision of the widened algorithm in nominal terms.
    #[inline]
    pub(crate) fn view(self, d: Decision) -> Decision {
        if self.units == 0 {
            return d;
        }
        let raw = d.remaining();
        let remaining = raw.saturating_sub(self.units);
        let nominal = if d.is_allowed() {
            Decision::allow(self.limit, remaining, d.reset_after_ns)
        } else {
            Decision::deny(self.limit, remaining, d.retry_after_ns, d.reset_after_ns)
        };
        nominal
            .with_tracking(d.tracking())
            .with_above_limit(raw < self.units)
    }
}

/// Maps a widened quota's validation error to one that names the tolerance.
pub(crate) fn widened_error(limit: u64, units: u64, e: ConfigError) -> ConfigError {
    match e {
        ConfigError::LimitTooLarge { max, .. } | ConfigError::BurstTooLarge { max, .. } => {
            ConfigError::ToleranceTooLarge {
                limit,
                tolerance: units,
                max: max.saturating_sub(limit),
            }
        }
        other => other,
    }
}

#[cfg(all(test, not(ratewall_loom)))]
mod tests {
    use super::*;
    use crate::Tracking;

    #[test]
    fn view_reports_nominal_limit_and_marks_the_tolerated_part() {
        let soft = Soft {
            limit: 10,
            units: 2,
        };
        // Widened capacity 12: remaining' 3 is 1 below nominal.
        let d = soft.view(Decision::allow(12, 3, 7));
        assert!(d.is_allowed() && !d.is_above_limit());
        assert_eq!((d.limit(), d.remaining(), d.reset_after_ns), (10, 1, 7));
        // remaining' 2 = u: the nominal limit was exactly reached, not passed.
        let d = soft.view(Decision::allow(12, 2, 7));
        assert!(!d.is_above_limit());
        assert_eq!(d.remaining(), 0);
        // remaining' 1 < u: above the nominal limit.
        let d = soft.view(Decision::allow(12, 1, 7));
        assert!(d.is_above_limit());
        assert_eq!(d.remaining(), 0);
        let d = soft.view(Decision::deny(12, 1, 5, 9).with_tracking(Tracking::EvictedOther));
        assert!(!d.is_allowed() && !d.is_above_limit());
        assert_eq!(
            (d.limit(), d.remaining(), d.retry_after_ns, d.tracking()),
            (10, 0, 5, Tracking::EvictedOther)
        );
        let none = Soft {
            limit: 12,
            units: 0,
        };
        assert_eq!(
            none.view(Decision::allow(12, 1, 7)),
            Decision::allow(12, 1, 7)
        );
    }

    #[test]
    fn percentages_round_down_and_saturate() {
        assert_eq!(Tolerance::Percent(10).units(100), 10);
        assert_eq!(Tolerance::Percent(10).units(19), 1);
        assert_eq!(Tolerance::Percent(0).units(19), 0);
        assert_eq!(Tolerance::Percent(u32::MAX).units(u64::MAX), u64::MAX);
    }

    #[test]
    fn widened_errors_name_the_tolerance() {
        let e = widened_error(
            100,
            20_000,
            ConfigError::LimitTooLarge {
                limit: 20_100,
                max: 16_383,
            },
        );
        assert_eq!(
            e,
            ConfigError::ToleranceTooLarge {
                limit: 100,
                tolerance: 20_000,
                max: 16_283
            }
        );
        assert!(e.to_string().contains("at most 16283"), "{e}");
        assert_eq!(
            widened_error(1, 1, ConfigError::ZeroRate),
            ConfigError::ZeroRate
        );
    }
}
