//! Request classes and the shares of the maximum kept for them.

use crate::error::ConfigError;

/// The class of a request, for load shedding: capacity kept for a class
/// (see [`ConcurrencyBuilder::keep_for`](crate::ConcurrencyBuilder::keep_for))
/// can be used by that class and the classes above it, never by those below.
///
/// Under overload the lower classes are shed first: with 20% kept for
/// `Critical`, `Normal` and `Sheddable` requests together never hold more
/// than 80% of the maximum, so critical requests always find their 20%.
///
/// # Example
///
/// ```
/// use ratewall::{ConcurrencyLimiter, ManualClock, Priority};
///
/// let l = ConcurrencyLimiter::builder(10)
///     .keep_for(Priority::Critical, 20)
///     .clock(ManualClock::new())
///     .build()?;
/// let normal: Vec<_> = (0..10).filter_map(|_| l.try_acquire().into_permit()).collect();
/// assert_eq!(normal.len(), 8); // the last 2 are kept for critical requests
/// let critical = l.try_acquire_with(Priority::Critical);
/// assert!(critical.is_allowed());
/// # Ok::<(), ratewall::ConfigError>(())
/// ```
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Priority {
    /// May be shed first: batch jobs, prefetches, retries.
    Sheddable,
    /// Ordinary traffic; what [`try_acquire`](crate::ConcurrencyLimiter::try_acquire) uses.
    Normal,
    /// Must keep working under overload: health checks, payments, control traffic.
    Critical,
}

impl Priority {
    const ALL: [Priority; 3] = [Priority::Sheddable, Priority::Normal, Priority::Critical];

    #[inline]
    const fn index(self) -> usize {
        match self {
            Priority::Sheddable => 0,
            Priority::Normal => 1,
            Priority::Critical => 2,
        }
    }
}

/// How much of the maximum each class may fill, in percent: 100 less what
/// is kept for the classes above it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Shares {
    cap_pct: [u8; 3],
}

impl Shares {
    /// From the percent kept for each class (indexed like `Priority`).
    pub(crate) fn new(kept_pct: [u8; 3]) -> Result<Self, ConfigError> {
        if kept_pct[Priority::Sheddable.index()] != 0 {
            return Err(ConfigError::Incompatible {
                reason: "nothing ranks below Priority::Sheddable, so a share kept for it keeps nothing; keep a share for Normal or Critical",
            });
        }
        let total: u32 = kept_pct.iter().map(|&p| u32::from(p)).sum();
        if total >= 100 {
            return Err(ConfigError::Incompatible {
                reason: "the shares kept for Critical and Normal add up to 100% or more, so Sheddable requests could never pass; keep their sum under 100",
            });
        }
        let mut cap_pct = [100u8; 3];
        for class in Priority::ALL {
            let above: u8 = Priority::ALL
                .iter()
                .filter(|&&p| p > class)
                .map(|p| kept_pct[p.index()])
                .sum();
            cap_pct[class.index()] = 100 - above;
        }
        Ok(Shares { cap_pct })
    }

    /// The percent of the maximum requests of `class` may fill.
    #[inline]
    pub(crate) const fn cap_pct(&self, class: Priority) -> u64 {
        self.cap_pct[class.index()] as u64
    }

    #[inline]
    pub(crate) const fn kept_index(class: Priority) -> usize {
        class.index()
    }
}

#[cfg(all(test, not(ratewall_loom)))]
mod tests {
    use super::*;

    #[test]
    fn each_class_fills_what_the_classes_above_leave() {
        let s = Shares::new([0, 30, 20]).unwrap();
        assert_eq!(s.cap_pct(Priority::Critical), 100);
        assert_eq!(s.cap_pct(Priority::Normal), 80);
        assert_eq!(s.cap_pct(Priority::Sheddable), 50);
        let none = Shares::new([0, 0, 0]).unwrap();
        assert!(Priority::ALL.iter().all(|&p| none.cap_pct(p) == 100));
    }

    #[test]
    fn shares_that_leave_nothing_are_refused() {
        assert!(matches!(
            Shares::new([0, 50, 50]),
            Err(ConfigError::Incompatible { .. })
        ));
        assert!(matches!(
            Shares::new([10, 0, 0]),
            Err(ConfigError::Incompatible { .. })
        ));
        assert!(Shares::new([0, 49, 50]).is_ok());
    }
}
