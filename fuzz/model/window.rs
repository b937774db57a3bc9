//! The naive references for the window algorithms, written from their
//! documented rules (DESIGN.md section 1, the `Window` and algorithm docs) in
//! `u128`, with no code shared with ratewall. `retry_after` and `reset_after`
//! are not computed by formula: they are found by searching for the earliest
//! instant at which the model admits the same request (or holds nothing).

use super::{Dec, HORIZON};
use ratewall::ConfigError;
use std::collections::VecDeque;
use std::time::Duration;

/// Which window algorithm.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Fixed,
    Sliding,
    Log,
}

impl Kind {
    /// Documented limits of each algorithm (`Window`'s docs): the largest
    /// limit and the shortest window, in ns.
    pub fn bounds(self) -> (u64, u64) {
        match self {
            Kind::Fixed => ((1 << 24) - 1, 1 << 23),
            Kind::Sliding => ((1 << 14) - 1, 1 << 27),
            Kind::Log => (1 << 20, 1),
        }
    }

    /// The latest instant the algorithm sees: the counters stop at
    /// `2^63 - 1` ns, the log at the limiter's horizon `2^63` ns.
    pub fn last_ns(self) -> u128 {
        match self {
            Kind::Fixed | Kind::Sliding => HORIZON - 1,
            Kind::Log => HORIZON,
        }
    }
}

/// A validated window quota.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WQuota {
    pub limit: u64,
    pub length: u128,
}

/// Every documented rule the window breaks for `kind` (ratewall returns one).
pub fn violations(kind: Kind, limit: u64, length: Duration) -> Result<WQuota, Vec<ConfigError>> {
    let (max_limit, min_ns) = kind.bounds();
    let ns = length.as_nanos().min(u128::from(u64::MAX));
    let mut errs = Vec::new();
    if limit == 0 {
        errs.push(ConfigError::ZeroLimit);
    }
    if ns == 0 {
        errs.push(ConfigError::ZeroPeriod);
    }
    if ns > super::gcra::MAX_TOLERANCE {
        errs.push(ConfigError::PeriodTooLong {
            max: Duration::from_nanos(1 << 62),
        });
    }
    if ns < u128::from(min_ns) {
        errs.push(ConfigError::WindowTooShort {
            min: Duration::from_nanos(min_ns),
        });
    }
    if limit > max_limit {
        errs.push(ConfigError::LimitTooLarge {
            limit,
            max: max_limit,
        });
    }
    if errs.is_empty() {
        Ok(WQuota { limit, length: ns })
    } else {
        Err(errs)
    }
}

/// A window limiter's state, per algorithm.
#[derive(Clone, Debug)]
pub enum State {
    /// The window id (`t / W`) and the cost admitted in it.
    Fixed { id: u128, count: u64 },
    /// The window id, the previous window's count and the current one's.
    Sliding { id: u128, prev: u64, cur: u64 },
    /// One timestamp per admitted unit, oldest first.
    Log { times: VecDeque<u128> },
}

#[derive(Clone, Debug)]
pub struct WindowModel {
    pub kind: Kind,
    pub quota: WQuota,
    pub state: State,
}

impl WindowModel {
    pub fn new(kind: Kind, quota: WQuota) -> Self {
        WindowModel {
            kind,
            quota,
            state: Self::fresh(kind),
        }
    }

    fn fresh(kind: Kind) -> State {
        match kind {
            Kind::Fixed => State::Fixed { id: 0, count: 0 },
            Kind::Sliding => State::Sliding {
                id: 0,
                prev: 0,
                cur: 0,
            },
            Kind::Log => State::Log {
                times: VecDeque::new(),
            },
        }
    }

    pub fn reset(&mut self) {
        self.state = Self::fresh(self.kind);
    }

    /// The sliding counter seen at `t`: (window id, previous count, current count).
    fn view(id: u128, prev: u64, cur: u64, w: u128, t: u128) -> (u128, u64, u64) {
        let now_id = t / w;
        if now_id <= id {
            (id, prev, cur)
        } else if now_id == id + 1 {
            (now_id, cur, 0)
        } else {
            (now_id, 0, 0)
        }
    }

    /// The usage the algorithm counts at `t` (the estimate for the sliding
    /// counter: the previous count weighted by the part of the previous
    /// window still inside `(t - W, t]`, rounded up).
    pub fn used_at(&self, t: u128) -> u64 {
        let w = self.quota.length;
        match &self.state {
            State::Fixed { id, count } => {
                if t / w > *id {
                    0
                } else {
                    *count
                }
            }
            State::Sliding { id, prev, cur } => {
                let (vid, pv, c) = Self::view(*id, *prev, *cur, w, t);
                let into = t.saturating_sub(vid * w);
                let weighted = (u128::from(pv) * (w - into.min(w))).div_ceil(w);
                weighted as u64 + c
            }
            // Sorted (time never moves back): the entries still inside (t - W, t].
            State::Log { times } => (times.len() - times.partition_point(|&ts| ts + w <= t)) as u64,
        }
    }

    fn admit(&mut self, t: u128, n: u64) {
        let w = self.quota.length;
        match &mut self.state {
            State::Fixed { id, count } => {
                if t / w > *id {
                    *id = t / w;
                    *count = 0;
                }
                *count += n;
            }
            State::Sliding { id, prev, cur } => {
                let (vid, pv, c) = Self::view(*id, *prev, *cur, w, t);
                (*id, *prev, *cur) = (vid, pv, c + n);
            }
            State::Log { times } => {
                // "On allow the expired entries are dropped and n copies of t appended."
                let expired = times.partition_point(|&ts| ts + w <= t);
                times.drain(..expired);
                times.extend(std::iter::repeat(t).take(n as usize));
            }
        }
    }

    /// The earliest instant in `(t, t + 3W]` where `ok` holds (`ok` is
    /// monotone: usage only falls as time passes).
    fn earliest(&self, t: u128, ok: impl Fn(&Self, u128) -> bool) -> u128 {
        let (mut lo, mut hi) = (t, t + 3 * self.quota.length);
        assert!(ok(self, hi), "model never frees up: {self:?} at {t}");
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if ok(self, mid) {
                hi = mid;
            } else {
                lo = mid;
            }
        }
        hi
    }

    /// `check_n`: `None` for a cost above the limit.
    pub fn check(&mut self, t: u128, n: u64, consume: bool) -> Option<Dec> {
        let l = self.quota.limit;
        if n > l {
            return None;
        }
        let unit = n.max(1);
        let used = self.used_at(t);
        let idle_at = |m: &Self, x: u128| m.used_at(x) == 0;
        if used + unit <= l {
            let mut after = self.clone();
            after.admit(t, unit);
            let reset = after.earliest(t, idle_at) - t;
            if consume && n > 0 {
                *self = after;
            }
            Some(Dec {
                allowed: true,
                limit: l,
                remaining: l - used - unit,
                retry_ns: 0,
                reset_ns: reset,
            })
        } else {
            let fits = |m: &Self, x: u128| m.used_at(x) + unit <= l;
            Some(Dec {
                allowed: false,
                limit: l,
                remaining: l.saturating_sub(used),
                retry_ns: (self.earliest(t, fits) - t).max(1),
                reset_ns: self.earliest(t, idle_at) - t,
            })
        }
    }

    /// Gives back `n` units to the window they were taken from, while it
    /// still counts them (the sliding counter: current or just previous).
    pub fn refund(&mut self, t: u128, n: u64) {
        let w = self.quota.length;
        match &mut self.state {
            State::Fixed { id, count } => {
                if t / w == *id {
                    *count = count.saturating_sub(n);
                }
            }
            State::Sliding { id, cur, .. } => {
                if t / w == *id || t / w == *id + 1 {
                    *cur = cur.saturating_sub(n);
                }
            }
            State::Log { times } => {
                for _ in 0..n {
                    match times.back() {
                        Some(&ts) if ts + w > t => {
                            times.pop_back();
                        }
                        _ => break,
                    }
                }
            }
        }
    }

    /// A quota change keeps the usage in force: the counters carry what
    /// counts at `t` into the new window containing `t` (at most the new
    /// limit); the log keeps its newest `L'` timestamps.
    pub fn set_quota(&mut self, t: u128, new: WQuota) {
        let old = self.quota;
        let same = old.length == new.length;
        let carried = self.used_at(t).min(new.limit);
        self.state = match &self.state {
            State::Fixed { id, count } if same => State::Fixed {
                id: *id,
                count: (*count).min(new.limit),
            },
            State::Fixed { .. } => State::Fixed {
                id: t / new.length,
                count: carried,
            },
            State::Sliding { id, prev, cur } if same => State::Sliding {
                id: *id,
                prev: (*prev).min(new.limit),
                cur: (*cur).min(new.limit),
            },
            State::Sliding { .. } => State::Sliding {
                id: t / new.length,
                prev: 0,
                cur: carried,
            },
            State::Log { times } => {
                let keep = times.len().min(new.limit as usize);
                State::Log {
                    times: times.iter().skip(times.len() - keep).copied().collect(),
                }
            }
        };
        self.quota = new;
    }

    pub fn is_idle(&self, t: u128) -> bool {
        self.used_at(t) == 0
    }
}
