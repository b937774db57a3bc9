//! The naive reference for the token and leaky buckets, written from the
//! documented rules (DESIGN.md section 1, `Rate`'s docs) in `u128`, with no
//! code shared with ratewall.

use super::Dec;
use ratewall::ConfigError;
use std::time::Duration;

/// `2^62` ns: the longest period and the largest `burst * T` (quota.rs docs).
pub const MAX_TOLERANCE: u128 = 1 << 62;

/// A validated bucket quota: `T` in ns and the burst.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Quota {
    pub count: u64,
    pub period: Duration,
    pub burst: u64,
    pub emission: u128,
}

impl Quota {
    pub fn tau(&self) -> u128 {
        self.emission * u128::from(self.burst)
    }
}

/// The documented precision of a keyed table (docs/design.md, "Keyed
/// table"): a keyed bucket runs in time units of `u = 2^s` ns, the least
/// power of two (at most 2^23) with `4 * tau <= 2^38 * u` for the quota it
/// was built with; 1 ns (exact) for burst windows up to 2^36 ns.
pub fn keyed_unit(q: &Quota) -> u128 {
    let units = (q.tau() * 4).min(u128::from(u64::MAX)) >> 38;
    let shift = 128 - units.leading_zeros();
    1 << shift.min(23)
}

/// The quota a keyed table of unit `u` runs: the interval rounded up to
/// whole units; `None` where the table refuses it (`ConfigError::KeyedSlot`:
/// a unit above 2^-10 of the interval, or a burst window in units above
/// 2^38 units).
pub fn keyed_quota(q: Quota, u: u128) -> Option<Quota> {
    if u > 1 && u << 10 > q.emission {
        return None;
    }
    let kq = Quota {
        emission: q.emission.div_ceil(u) * u,
        ..q
    };
    (kq.tau() <= (1 << 38) * u).then_some(kq)
}

/// A time as a keyed table of unit `u` reads it: rounded down to a unit.
pub fn keyed_time(t: u128, u: u128) -> u128 {
    t / u * u
}

/// Every documented rule the rate breaks. ratewall must return one of
/// these (it may check them in any order), or succeed when there are none.
pub fn violations(
    count: u64,
    period: Duration,
    burst: Option<u64>,
) -> Result<Quota, Vec<ConfigError>> {
    let burst = burst.unwrap_or(count); // "the burst defaults to count"
    let period_ns = period.as_nanos().min(u128::from(u64::MAX));
    let mut errs = Vec::new();
    if count == 0 {
        errs.push(ConfigError::ZeroRate);
    }
    if period_ns == 0 {
        errs.push(ConfigError::ZeroPeriod);
    }
    if period_ns > MAX_TOLERANCE {
        errs.push(ConfigError::PeriodTooLong {
            max: Duration::from_nanos(1 << 62),
        });
    }
    if burst == 0 {
        errs.push(ConfigError::ZeroBurst);
    }
    let count128 = u128::from(count);
    if count > 0 && period_ns > 0 {
        if period_ns < count128 {
            // More than one request per nanosecond.
            errs.push(ConfigError::RateTooHigh {
                count,
                period_ns: period_ns as u64,
            });
        } else {
            // T = period / count rounded up; rejected if that rounding changes
            // the rate by more than 0.1%.
            let emission = period_ns.div_ceil(count128);
            let rate_error = emission * count128 - period_ns;
            if rate_error * 1000 > period_ns {
                errs.push(ConfigError::RateImprecise {
                    count,
                    period_ns: period_ns as u64,
                });
            }
            if burst > 0 && u128::from(burst) * emission > MAX_TOLERANCE {
                errs.push(ConfigError::BurstTooLarge {
                    burst,
                    max: (MAX_TOLERANCE / emission) as u64,
                });
            }
            if errs.is_empty() {
                return Ok(Quota {
                    count,
                    period,
                    burst,
                    emission,
                });
            }
        }
    }
    Err(errs)
}

/// A bucket: the theoretical arrival time, in `u128`.
#[derive(Clone, Debug)]
pub struct Bucket {
    pub quota: Quota,
    pub tat: u128,
}

impl Bucket {
    pub fn new(quota: Quota) -> Self {
        Bucket { quota, tat: 0 }
    }

    /// The decision for `n >= 1` units at `t`, and the TAT to store if allowed.
    pub fn decide(&self, t: u128, n: u64) -> (Dec, Option<u128>) {
        let q = &self.quota;
        let tau = q.tau();
        let start = self.tat.max(t);
        let held = start - t; // time the bucket needs to drain, i.e. tokens in use * T
        let after = start + u128::from(n) * q.emission;
        let used = after - t;
        if used <= tau {
            // "remaining (after this request)": unit requests that would still fit.
            let d = Dec {
                allowed: true,
                limit: q.burst,
                remaining: ((tau - used) / q.emission) as u64,
                retry_ns: 0,
                reset_ns: used,
            };
            (d, Some(after))
        } else {
            // The earliest wait w with max(tat, t+w) + nT - (t+w) <= tau, never 0.
            let d = Dec {
                allowed: false,
                limit: q.burst,
                remaining: (tau.saturating_sub(held) / q.emission) as u64,
                retry_ns: (used - tau).max(1),
                reset_ns: held,
            };
            (d, None)
        }
    }

    /// `check_n`: `None` for a cost above the burst (an error, not a denial).
    pub fn check(&mut self, t: u128, n: u64, consume: bool) -> Option<Dec> {
        if n > self.quota.burst {
            return None;
        }
        // A cost of 0 gets a unit request's decision and takes nothing.
        let (d, next) = self.decide(t, n.max(1));
        if consume && n > 0 {
            if let Some(next) = next {
                self.tat = next;
            }
        }
        Some(d)
    }

    /// Gives back `n` units: never more than a full bucket.
    pub fn refund(&mut self, t: u128, n: u64) {
        if n == 0 || self.tat <= t {
            return;
        }
        self.tat = self.tat.saturating_sub(u128::from(n) * self.quota.emission);
    }

    /// A new quota keeps the tokens in use, at most a full new bucket.
    pub fn set_quota(&mut self, t: u128, new: Quota) {
        if self.tat > t {
            let in_use_new_ns = (self.tat - t) * new.emission / self.quota.emission;
            self.tat = t + in_use_new_ns.min(new.tau());
        }
        self.quota = new;
    }

    pub fn is_idle(&self, t: u128) -> bool {
        self.tat <= t
    }
}
