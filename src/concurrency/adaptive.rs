//! Adaptive maximums: a controller that moves a concurrency limit's maximum
//! between a floor and a ceiling from the latency and outcome of each
//! released permit. Its state is one atomic word, updated by the shared CAS
//! helper, so samples from many threads never lock.
//!
//! ```text
//! //  63                           32 31                            0
//! // +-------------------------------+-------------------------------+
//! // | limit (an f32's bits: exact   | shortest latency seen (Vegas; |
//! // |  to 1e-5 near 100)            |  units of 64 ns, 0 = none)    |
//! // +-------------------------------+-------------------------------+
//! ```
//!
//! Both algorithms adjust per sample by a per-window amount divided by the
//! limit, so that one window's worth of samples (about `limit` of them)
//! moves the limit by the amount the algorithm names: AIMD adds 1 per window
//! and multiplies by `backoff` per overloaded window; Vegas adds or takes
//! `log10(limit)` per window. Increases need the limit to be in use (at
//! least half of it in flight), so an idle service does not drift upwards.

use crate::algo::concurrency::MAX_PERMITS;
use crate::error::ConfigError;
use crate::word::AtomicWord;
use std::time::Duration;

/// The largest ceiling of an adaptive limit (the controller keeps its limit
/// as an `f32`, whose integers are exact up to 2^24).
pub const MAX_ADAPTIVE: u64 = (1 << 24) - 1;
const _: () = assert!(MAX_ADAPTIVE <= MAX_PERMITS);

const RTT_UNIT_NS: u64 = 64;
const LOW_MASK: u64 = u32::MAX as u64;

/// How a request that held a permit ended, for an adaptive limit.
///
/// # Example
///
/// ```
/// use ratewall::{Adaptive, ConcurrencyLimiter, ManualClock, Outcome};
/// use std::time::Duration;
///
/// let l = ConcurrencyLimiter::builder(10)
///     .adaptive(Adaptive::aimd(2, 100, Duration::from_millis(50)))
///     .clock(ManualClock::new())
///     .build()?;
/// for _ in 0..10 {
///     let permit = l.try_acquire().into_permit().unwrap();
///     permit.release(Outcome::Dropped); // the backend refused or timed out
/// }
/// assert_eq!(l.max(), 9); // x 0.9 per window of drops (10 of them at 10)
/// # Ok::<(), ratewall::ConfigError>(())
/// ```
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// The request was served; its latency counts. What dropping a permit
    /// records (unless the thread is panicking).
    Success,
    /// The request failed from overload (a timeout, a 503, a refused
    /// connection): the limit backs off. What a permit dropped during a
    /// panic records.
    Dropped,
    /// Says nothing about the backend (a client went away, a 4xx): no sample.
    Ignored,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Algorithm {
    Aimd { threshold_ns: u64, backoff: f64 },
    Vegas { alpha: f64, beta: f64 },
}

/// An adaptive maximum for a [`ConcurrencyLimiter`](crate::ConcurrencyLimiter):
/// the algorithm, and the floor and ceiling it moves between. The limiter's
/// initial maximum is where it starts.
///
/// # Example
///
/// ```
/// use ratewall::{Adaptive, ConcurrencyLimiter};
/// use std::time::Duration;
///
/// // Start at 20; Vegas keeps the backend's queue short, between 5 and 200.
/// let l = ConcurrencyLimiter::builder(20).adaptive(Adaptive::vegas(5, 200)).build()?;
/// assert_eq!(l.max(), 20);
/// // AIMD: back off when a request takes longer than 100 ms or fails.
/// let aimd = Adaptive::aimd(5, 200, Duration::from_millis(100)).backoff(0.8);
/// # let _ = aimd;
/// # Ok::<(), ratewall::ConfigError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Adaptive {
    algorithm: Algorithm,
    floor: u64,
    ceiling: u64,
}

impl Adaptive {
    /// Additive increase, multiplicative decrease: +1 per window of
    /// successes faster than `latency_threshold`; × `backoff` (0.9 unless
    /// set) per window of drops or slower successes. It needs to know what
    /// latency is too slow; Vegas finds it by itself.
    ///
    /// ```
    /// # use ratewall::Adaptive;
    /// # use std::time::Duration;
    /// let a = Adaptive::aimd(1, 50, Duration::from_millis(20));
    /// # let _ = a;
    /// ```
    pub fn aimd(floor: u64, ceiling: u64, latency_threshold: Duration) -> Self {
        let threshold_ns = u64::try_from(latency_threshold.as_nanos()).unwrap_or(u64::MAX);
        Adaptive {
            algorithm: Algorithm::Aimd {
                threshold_ns,
                backoff: 0.9,
            },
            floor,
            ceiling,
        }
    }

    /// TCP Vegas, as in Netflix's concurrency-limits: the queue at the
    /// backend is estimated as `limit × (1 − shortest latency / latency)`;
    /// with `s = max(1, log10(limit))`, below `2·s` the limit grows by `s`
    /// per window, above `4·s` it shrinks by as much, and a drop shrinks
    /// it. It settles a few permits above the backend's knee. (Netflix
    /// uses 3 and 6; 2 and 4 keep a shorter queue at the backend, which
    /// matters most for small knees.)
    ///
    /// `s` is at least 1, as in Netflix's `Log10RootFunction`: below a
    /// limit of 10, `log10` would make the thresholds and the step vanish,
    /// so a limit of 1 could never grow (`log10(1) = 0`) and any queue at
    /// all would shrink a small limit to the floor. So below 10 the
    /// thresholds are a queue of 2 and 4 permits and the step one permit
    /// per window: at 3× the shortest latency (a queue of two thirds of the
    /// limit) a limit settles at 6, the largest whose queue is not above 4.
    ///
    /// The shortest latency is never forgotten: a backend whose *unloaded*
    /// latency grows for good reads as a queue, and the limit falls to the
    /// floor. Rebuild the limiter (or use AIMD) where that happens.
    ///
    /// ```
    /// # use ratewall::Adaptive;
    /// let a = Adaptive::vegas(4, 400);
    /// # let _ = a;
    /// ```
    pub fn vegas(floor: u64, ceiling: u64) -> Self {
        Adaptive {
            algorithm: Algorithm::Vegas {
                alpha: 2.0,
                beta: 4.0,
            },
            floor,
            ceiling,
        }
    }

    /// AIMD's multiplicative decrease per overloaded window, in `(0, 1)`
    /// (default 0.9). No effect on Vegas.
    ///
    /// ```
    /// # use ratewall::Adaptive;
    /// # use std::time::Duration;
    /// let a = Adaptive::aimd(1, 50, Duration::from_millis(20)).backoff(0.5);
    /// # let _ = a;
    /// ```
    pub fn backoff(mut self, ratio: f64) -> Self {
        if let Algorithm::Aimd { backoff, .. } = &mut self.algorithm {
            *backoff = ratio;
        }
        self
    }

    /// The floor and ceiling, validated against the initial maximum.
    fn validate(&self, initial: u64) -> Result<(), ConfigError> {
        let bounds = ConfigError::AdaptiveBounds {
            floor: self.floor,
            initial,
            ceiling: self.ceiling,
        };
        if self.floor == 0 {
            return Err(bounds);
        }
        if self.ceiling > MAX_ADAPTIVE {
            return Err(ConfigError::LimitTooLarge {
                limit: self.ceiling,
                max: MAX_ADAPTIVE,
            });
        }
        if !(self.floor..=self.ceiling).contains(&initial) {
            return Err(bounds);
        }
        match self.algorithm {
            Algorithm::Aimd {
                threshold_ns: 0, ..
            } => Err(ConfigError::ZeroPeriod),
            Algorithm::Aimd { backoff, .. } if !(backoff > 0.0 && backoff < 1.0) => {
                Err(ConfigError::AimdBackoff {
                    backoff: backoff.to_string(),
                })
            }
            _ => Ok(()),
        }
    }
}

/// The running controller: the configuration and its state word.
#[derive(Debug)]
pub(crate) struct Controller {
    config: Adaptive,
    state: AtomicWord,
}

fn pack(limit: f64, rtt_units: u64) -> u64 {
    // The limit is clamped to [floor, ceiling] <= 2^24 - 1 before packing.
    u64::from((limit as f32).to_bits()) << 32 | rtt_units.min(LOW_MASK)
}

fn unpack(word: u64) -> (f64, u64) {
    (
        f64::from(f32::from_bits((word >> 32) as u32)),
        word & LOW_MASK,
    )
}

impl Controller {
    pub(crate) fn new(config: Adaptive, initial: u64) -> Result<Self, ConfigError> {
        config.validate(initial)?;
        Ok(Controller {
            config,
            state: AtomicWord::new(pack(initial as f64, 0)),
        })
    }

    pub(crate) fn floor(&self) -> u64 {
        self.config.floor
    }

    pub(crate) fn ceiling(&self) -> u64 {
        self.config.ceiling
    }

    /// Feeds one sample: the latency of a request, how it ended, and how
    /// many permits were out when it was released (itself included).
    /// Returns the new maximum, rounded to a whole permit.
    pub(crate) fn sample(&self, latency_ns: u64, outcome: Outcome, in_flight: u64) -> u64 {
        let (floor, ceiling) = (self.config.floor as f64, self.config.ceiling as f64);
        let limit = self.state.update(|word| {
            let (limit, min_units) = unpack(word);
            let rtt_units = latency_ns.div_ceil(RTT_UNIT_NS).max(1);
            let min_units = if min_units == 0 {
                rtt_units
            } else {
                min_units.min(rtt_units)
            };
            let busy = in_flight as f64 * 2.0 >= limit;
            let next = match (self.config.algorithm, outcome) {
                (_, Outcome::Ignored) => limit,
                // × backoff per window of `limit` drops.
                (Algorithm::Aimd { backoff, .. }, Outcome::Dropped) => limit - (1.0 - backoff),
                (
                    Algorithm::Aimd {
                        threshold_ns,
                        backoff,
                    },
                    Outcome::Success,
                ) => {
                    if latency_ns > threshold_ns {
                        // × backoff per window of `limit` samples.
                        limit - (1.0 - backoff)
                    } else if busy {
                        limit + 1.0 / limit
                    } else {
                        limit
                    }
                }
                (Algorithm::Vegas { .. }, Outcome::Dropped) => limit - vegas_step(limit) / limit,
                (Algorithm::Vegas { alpha, beta }, Outcome::Success) => {
                    let log = vegas_step(limit);
                    let queue = limit * (1.0 - min_units as f64 / rtt_units as f64);
                    if queue < alpha * log && busy {
                        limit + log / limit
                    } else if queue > beta * log {
                        limit - log / limit
                    } else {
                        limit
                    }
                }
            };
            let next = next.clamp(floor, ceiling);
            let word_next = pack(next, min_units);
            (next, Some(word_next))
        });
        // Nearest whole permit: float steps leave 90.9999 for 91.
        limit.round() as u64
    }
}

/// Vegas's `s`: `log10(limit)`, but at least 1 (see [`Adaptive::vegas`]):
/// the thresholds' unit and the step per window.
fn vegas_step(limit: f64) -> f64 {
    limit.log10().max(1.0)
}

#[cfg(all(test, not(ratewall_loom)))]
mod tests {
    use super::*;

    fn controller(a: Adaptive, initial: u64) -> Controller {
        Controller::new(a, initial).unwrap()
    }

    #[test]
    fn bad_bounds_are_refused() {
        let ms = Duration::from_millis(1);
        let zero = Controller::new(Adaptive::vegas(0, 5), 1).unwrap_err();
        assert_eq!(
            zero,
            ConfigError::AdaptiveBounds {
                floor: 0,
                initial: 1,
                ceiling: 5
            }
        );
        assert_eq!(
            zero.to_string(),
            "an adaptive maximum's floor is 0 (bounds 0..5, starting at 1): use a floor of at least 1"
        );
        let outside = Controller::new(Adaptive::vegas(5, 10), 11).unwrap_err();
        assert_eq!(
            outside,
            ConfigError::AdaptiveBounds {
                floor: 5,
                initial: 11,
                ceiling: 10
            }
        );
        // The message shows every value it checked.
        let text = outside.to_string();
        assert!(
            text.contains("maximum, 11,") && text.contains("bounds 5..10"),
            "{text}"
        );
        assert!(matches!(
            Controller::new(Adaptive::vegas(1, MAX_ADAPTIVE + 1), 1).unwrap_err(),
            ConfigError::LimitTooLarge { .. }
        ));
        assert_eq!(
            Controller::new(Adaptive::aimd(1, 5, Duration::ZERO), 1).unwrap_err(),
            ConfigError::ZeroPeriod
        );
        for (bad, text) in [(0.0, "0"), (1.0, "1"), (-0.5, "-0.5"), (f64::NAN, "NaN")] {
            let err = Controller::new(Adaptive::aimd(1, 5, ms).backoff(bad), 1).unwrap_err();
            assert_eq!(
                err,
                ConfigError::AimdBackoff {
                    backoff: text.into()
                }
            );
            assert!(
                err.to_string().contains(&format!("backoff is {text},")),
                "{err}"
            );
        }
        // Just inside the bounds builds.
        for good in [f64::MIN_POSITIVE, 0.5, 1.0 - f64::EPSILON] {
            assert!(Controller::new(Adaptive::aimd(1, 5, ms).backoff(good), 1).is_ok());
        }
    }

    /// AIMD: `limit` fast samples add 1; `limit` slow ones take 10%.
    #[test]
    fn aimd_adds_one_per_window_and_backs_off_by_ten_percent() {
        let c = controller(Adaptive::aimd(1, 1000, Duration::from_millis(10)), 100);
        for _ in 0..100 {
            c.sample(5_000_000, Outcome::Success, 100);
        }
        let (limit, _) = unpack(c.state.load());
        assert!((limit - 101.0).abs() < 0.05, "{limit}");
        for _ in 0..100 {
            c.sample(50_000_000, Outcome::Success, 100);
        }
        let (limit, _) = unpack(c.state.load());
        assert!((limit - 91.0).abs() < 0.05, "{limit}");
        // Idle (less than half in flight): no increase.
        assert_eq!(c.sample(1, Outcome::Success, 10), 91);
        assert_eq!(c.sample(1, Outcome::Ignored, 100), 91);
    }

    #[test]
    fn the_limit_stays_between_floor_and_ceiling() {
        let c = controller(Adaptive::aimd(5, 7, Duration::from_millis(10)), 6);
        for _ in 0..1000 {
            assert!(c.sample(1, Outcome::Success, 7) <= 7);
        }
        for _ in 0..1000 {
            assert!(c.sample(1, Outcome::Dropped, 7) >= 5);
        }
        assert_eq!(c.sample(1, Outcome::Dropped, 7), 5);
    }

    /// Vegas: latency twice the shortest means a queue of half the limit: shrink.
    #[test]
    fn vegas_shrinks_on_a_queue_and_grows_without_one() {
        let c = controller(Adaptive::vegas(1, 1000), 100);
        c.sample(10_000_000, Outcome::Success, 100);
        let grown = unpack(c.state.load()).0;
        assert!(grown > 100.0, "{grown}");
        for _ in 0..100 {
            c.sample(20_000_000, Outcome::Success, 100);
        }
        let shrunk = unpack(c.state.load()).0;
        assert!(shrunk < grown - 1.5, "{shrunk}");
        assert_eq!(unpack(c.state.load()).1, 10_000_000 / RTT_UNIT_NS);
    }

    /// Below a limit of 10 the documented `s = max(1, log10(limit))`: a
    /// limit of 1 grows without a queue (with `log10` alone it would stay
    /// at 1 for ever), and at 3× the shortest latency a limit settles at 6
    /// from above and at 3 from below (a queue of two thirds of the limit
    /// held between the thresholds 2 and 4).
    #[test]
    fn vegas_below_ten_steps_by_one_permit_with_thresholds_of_two_and_four() {
        let c = controller(Adaptive::vegas(1, 60), 1);
        c.sample(10_000_000, Outcome::Success, 1);
        for _ in 0..5 {
            c.sample(10_000_000, Outcome::Success, 1);
        }
        assert!(unpack(c.state.load()).0 >= 2.0, "a limit of 1 grows");
        let settle = |initial: u64| {
            let c = controller(Adaptive::vegas(1, 60), initial);
            c.sample(10_000_000, Outcome::Success, initial);
            let mut last = 0;
            for _ in 0..2_000 {
                last = c.sample(30_000_000, Outcome::Success, 60);
            }
            last
        };
        assert_eq!(
            settle(20),
            6,
            "from above: the largest limit whose queue is <= 4"
        );
        assert_eq!(
            settle(2),
            3,
            "from below: the smallest limit whose queue is >= 2"
        );
    }
}
