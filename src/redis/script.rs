//! The server-side scripts and the parameters they take.
//!
//! Each algorithm has one script: `lua/prelude.lua` (helpers, the clock),
//! the algorithm's file (its step and refund, with the state layout in its
//! header), and `lua/check.lua` (KEYS, ARGV and the reply). Redis works in
//! whole microseconds: the policy's interval or window is rounded **up** to
//! whole microseconds (never more permissive), and a policy whose rounding
//! would change it by more than 0.1%, or whose span does not fit exact Lua
//! arithmetic, is rejected with [`RedisError::Unsupported`].

use super::RedisError;
use crate::algo::sealed::Core;
use crate::algo::{FixedCounter, SlidingCounter, SlidingLog};
use crate::clock::duration_nanos;
use crate::policy::{Policy, PolicyAlgorithm};
use std::sync::LazyLock;

/// The largest span (interval x burst, or window x limit) the scripts take,
/// in microseconds: 2^52 us (about 142 years). With the time since 1970
/// (about 2^50.6 us) every sum stays below 2^53, where Lua's doubles are
/// exact integers.
pub(crate) const MAX_SPAN_US: u64 = 1 << 52;

/// The prelude every script starts with (`lua/prelude.lua`: helpers and
/// the server's clock). The crate's unit tests append `lua/test_clock.lua`,
/// which takes the time from the call's last argument instead (see
/// `testing.rs`); a production script never holds it.
#[cfg(not(test))]
macro_rules! prelude {
    () => {
        include_str!("lua/prelude.lua")
    };
}

#[cfg(test)]
macro_rules! prelude {
    () => {
        concat!(
            include_str!("lua/prelude.lua"),
            include_str!("lua/test_clock.lua")
        )
    };
}

macro_rules! script_source {
    ($algo:literal, $step:literal, $refund:literal) => {
        concat!(
            prelude!(),
            include_str!(concat!("lua/", $algo, ".lua")),
            "local step, refund = ",
            $step,
            ", ",
            $refund,
            "\n",
            include_str!("lua/check.lua"),
        )
    };
}

/// The token and leaky bucket script.
pub(crate) const GCRA_SOURCE: &str = script_source!("gcra", "gcra_step", "gcra_refund");
/// The fixed window script.
pub(crate) const FIXED_SOURCE: &str = script_source!("fixed_window", "fixed_step", "fixed_refund");
/// The sliding window counter script.
pub(crate) const SLIDING_SOURCE: &str =
    script_source!("sliding_window", "sliding_step", "sliding_refund");
/// The sliding window log script.
pub(crate) const LOG_SOURCE: &str = script_source!("sliding_log", "log_step", "log_refund");

/// A script that runs any algorithm's step: the prelude, every
/// algorithm's file, then `lua/<$tail>.lua`.
macro_rules! with_every_step {
    ($tail:literal) => {
        concat!(
            prelude!(),
            include_str!("lua/gcra.lua"),
            include_str!("lua/fixed_window.lua"),
            include_str!("lua/sliding_window.lua"),
            include_str!("lua/sliding_log.lua"),
            include_str!(concat!("lua/", $tail, ".lua")),
        )
    };
}

/// All or nothing across several keys on one server or slot.
pub(crate) const MULTI_SOURCE: &str = with_every_step!("multi");

pub(crate) static MULTI: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(MULTI_SOURCE));

/// All or nothing with lockouts (the HTTP layer's `block_for`, `lockout.rs`).
pub(crate) const LOCKOUT_SOURCE: &str = with_every_step!("lockout");

#[cfg_attr(not(feature = "tower"), allow(dead_code))]
pub(crate) static LOCKOUT: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(LOCKOUT_SOURCE));

/// Single-key calls of any algorithm, batched (`batch.rs`).
pub(crate) const BATCH_SOURCE: &str = with_every_step!("batch");

pub(crate) static BATCH: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(BATCH_SOURCE));

/// Elastic limits: guarantee, headroom and pool in one script.
pub(crate) const ELASTIC_SOURCE: &str = with_every_step!("elastic");

pub(crate) static ELASTIC: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(ELASTIC_SOURCE));

/// Leases (`RedisLeaseLimiter`): the prelude, the fixed window's step
/// and `lua/lease.lua`.
pub(crate) const LEASE_SOURCE: &str = concat!(
    prelude!(),
    include_str!("lua/fixed_window.lua"),
    include_str!("lua/lease.lua")
);

pub(crate) static LEASE: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(LEASE_SOURCE));

/// Concurrency permits (`RedisConcurrencyLimiter`): the prelude and
/// `lua/concurrency.lua`.
pub(crate) const CONCURRENCY_SOURCE: &str =
    concat!(prelude!(), include_str!("lua/concurrency.lua"));

pub(crate) static CONCURRENCY: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(CONCURRENCY_SOURCE));

static GCRA: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(GCRA_SOURCE));
static FIXED: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(FIXED_SOURCE));
static SLIDING: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(SLIDING_SOURCE));
static LOG: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(LOG_SOURCE));

/// What a script call does (`ARGV[1]`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Take `n` on allow.
    Check,
    /// The decision for `n`, taking nothing.
    Peek,
    /// Give back `n`.
    Refund,
}

impl Mode {
    pub(crate) fn arg(self) -> &'static str {
        match self {
            Mode::Check => "c",
            Mode::Peek => "p",
            Mode::Refund => "r",
        }
    }
}

/// A policy compiled for Redis: its script and its three parameters in
/// microseconds (see each script's header).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Program {
    pub(crate) algorithm: PolicyAlgorithm,
    pub(crate) params: [u64; 3],
    pub(crate) limit: u64,
}

impl Program {
    pub(crate) fn compile(policy: &Policy) -> Result<Program, RedisError> {
        policy.validate().map_err(RedisError::Config)?;
        let algorithm = policy.algorithm();
        let limit = policy.limit();
        let params = match (policy.rate(), policy.window()) {
            (Some(rate), _) => {
                let g = crate::algo::Gcra::from_rate(rate).map_err(RedisError::Config)?;
                let t = to_micros(g.emission, "interval")?;
                let tau = t.checked_mul(g.burst).filter(|&s| s <= MAX_SPAN_US).ok_or(
                    RedisError::Unsupported {
                        reason: "burst x interval exceeds 2^52 us (about 142 years); lower the burst or raise the rate",
                    },
                )?;
                [t, tau, g.burst]
            }
            (None, Some(window)) => {
                let w = to_micros(duration_nanos(window.length()), "window")?;
                let l = window.limit();
                // The same limits as the local algorithm (the packed words'
                // field widths), so a policy behaves the same on both.
                match algorithm {
                    PolicyAlgorithm::FixedWindow => {
                        FixedCounter::from_config(&window).map_err(RedisError::Config)?;
                    }
                    PolicyAlgorithm::SlidingWindowCounter => {
                        SlidingCounter::from_config(&window).map_err(RedisError::Config)?;
                    }
                    _ => {
                        SlidingLog::from_config(&window).map_err(RedisError::Config)?;
                    }
                }
                // The sliding counter multiplies a count by the window.
                if w.checked_mul(l).map_or(true, |s| s > MAX_SPAN_US) {
                    return Err(RedisError::Unsupported {
                        reason:
                            "window x limit exceeds 2^52 us; use a shorter window or a lower limit",
                    });
                }
                [w, l, 0]
            }
            // Every policy has a rate or a window.
            (None, None) => unreachable!("a policy has a rate or a window"),
        };
        Ok(Program {
            algorithm,
            params,
            limit,
        })
    }

    pub(crate) fn script(&self) -> &'static redis::Script {
        match self.algorithm {
            PolicyAlgorithm::TokenBucket | PolicyAlgorithm::LeakyBucket => &GCRA,
            PolicyAlgorithm::FixedWindow => &FIXED,
            PolicyAlgorithm::SlidingWindowCounter => &SLIDING,
            PolicyAlgorithm::SlidingWindowLog => &LOG,
        }
    }

    /// The algorithm's code in the multi-limit script.
    pub(crate) fn code(&self) -> &'static str {
        match self.algorithm {
            PolicyAlgorithm::TokenBucket | PolicyAlgorithm::LeakyBucket => "g",
            PolicyAlgorithm::FixedWindow => "f",
            PolicyAlgorithm::SlidingWindowCounter => "s",
            PolicyAlgorithm::SlidingWindowLog => "l",
        }
    }

    /// A short, readable name of the policy for key names, the same on
    /// every instance: the algorithm and its parameters in microseconds,
    /// such as `tb.10000.20` (10 ms interval, burst 20).
    pub(crate) fn default_name(&self) -> String {
        let code = match self.algorithm {
            PolicyAlgorithm::TokenBucket => "tb",
            PolicyAlgorithm::LeakyBucket => "lb",
            PolicyAlgorithm::FixedWindow => "fw",
            PolicyAlgorithm::SlidingWindowCounter => "sw",
            PolicyAlgorithm::SlidingWindowLog => "sl",
        };
        match self.algorithm {
            PolicyAlgorithm::TokenBucket | PolicyAlgorithm::LeakyBucket => {
                format!("{code}.{}.{}", self.params[0], self.params[2])
            }
            _ => format!("{code}.{}.{}", self.params[0], self.params[1]),
        }
    }
}

/// Nanoseconds to whole microseconds, rounded up; an error if that changes
/// the value by more than 0.1%.
fn to_micros(ns: u64, what: &'static str) -> Result<u64, RedisError> {
    let us = ns.div_ceil(1000);
    let excess = us * 1000 - ns;
    if excess.saturating_mul(1000) > ns {
        return Err(RedisError::Unsupported {
            reason: if what == "window" {
                "the window is not a whole number of microseconds, and rounding it up would change it by more than 0.1%; use a window of at least 1 ms"
            } else {
                "the interval between requests is under 1 ms and not a whole number of microseconds: Redis keeps time in microseconds; use at most 1,000,000 per second"
            },
        });
    }
    Ok(us)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Rate, Window};
    use std::time::Duration;

    #[test]
    fn parameters_are_microseconds_rounded_up() {
        let p = Program::compile(&Policy::token_bucket(Rate::per_second(3).burst(2))).unwrap();
        assert_eq!(p.params, [333_334, 666_668, 2]);
        assert_eq!(p.default_name(), "tb.333334.2");
        let p = Program::compile(&Policy::sliding_window_log(Window::per_minute(5))).unwrap();
        assert_eq!(p.params, [60_000_000, 5, 0]);
        assert_eq!(p.default_name(), "sl.60000000.5");
    }

    #[test]
    fn policies_that_do_not_fit_microseconds_are_rejected() {
        for policy in [
            Policy::token_bucket(Rate::per_second(2_000_000)),
            Policy::sliding_window_log(Window::new(1, Duration::from_nanos(1_500))),
        ] {
            assert!(
                matches!(
                    Program::compile(&policy),
                    Err(RedisError::Unsupported { .. })
                ),
                "{policy:?}"
            );
        }
        // 1e6/s is exactly 1 us per request.
        assert!(Program::compile(&Policy::token_bucket(Rate::per_second(1_000_000))).is_ok());
        assert_eq!(
            Program::compile(&Policy::fixed_window(Window::per_second(0))).unwrap_err(),
            RedisError::Config(crate::error::ConfigError::ZeroLimit)
        );
    }

    #[test]
    fn every_script_is_one_chunk_with_its_step() {
        for (src, step) in [
            (GCRA_SOURCE, "gcra_step"),
            (FIXED_SOURCE, "fixed_step"),
            (SLIDING_SOURCE, "sliding_step"),
            (LOG_SOURCE, "log_step"),
        ] {
            assert!(src.contains(&format!("local step, refund = {step}")));
            assert!(src.ends_with("return decision\n"));
        }
    }
}
