//! How long the pacing layer waits before it retries a request the
//! upstream refused (a 429 or a 503): exponential backoff with a cap and
//! jitter on top, so an upstream that is failing (or says `Retry-After: 0`,
//! or nothing) is not sent every retry at once.
//!
//! Retry `n` (from 1) waits a random time in `[d_n, 2·d_n]`, where
//! `d_n = min(RETRY_BACKOFF_BASE · 2^(n−1), RETRY_BACKOFF_CAP)`: 1-2 s,
//! 2-4 s, 4-8 s, 8-16 s, then 10-20 s for every later retry. The floor
//! `d_n` is the schedule; the jitter only ever lengthens it (by up to as
//! much again), so requests refused together do not come back together,
//! and each gap is at least the one before it up to the fourth retry
//! (`2·d_n = d_(n+1)` below the cap; from the fifth, gaps stay in 10-20
//! s). The backoff runs before the retry's turn, so a pause the upstream
//! asked for (`Retry-After`) and the backoff overlap: the retry waits the
//! longer.

use crate::wait::random_up_to;
use std::time::Duration;

/// The first retry's backoff floor (1 s); each further retry doubles it,
/// up to [`RETRY_BACKOFF_CAP`]. Retry `n` waits `[d_n, 2·d_n]` with
/// `d_n = min(RETRY_BACKOFF_BASE · 2^(n−1), RETRY_BACKOFF_CAP)`.
///
/// ```
/// use ratewall::client::{RETRY_BACKOFF_BASE, RETRY_BACKOFF_CAP};
/// use std::time::Duration;
///
/// assert_eq!(RETRY_BACKOFF_BASE, Duration::from_secs(1));
/// // The fourth retry's floor: 8 s, still under the cap.
/// assert!(RETRY_BACKOFF_BASE * 8 < RETRY_BACKOFF_CAP);
/// ```
pub const RETRY_BACKOFF_BASE: Duration = Duration::from_secs(1);

/// The most a retry's backoff floor grows to (10 s); with its jitter, a
/// retry waits at most twice this (20 s) for the backoff.
///
/// ```
/// use ratewall::client::{MAX_RETRIES, RETRY_BACKOFF_CAP};
/// use std::time::Duration;
///
/// // A request's retries never back off longer than this in all.
/// let longest = RETRY_BACKOFF_CAP * 2 * MAX_RETRIES;
/// assert_eq!(longest, Duration::from_secs(200));
/// ```
pub const RETRY_BACKOFF_CAP: Duration = Duration::from_secs(10);

/// One request's backoff: its random generator (seeded on first use).
#[derive(Debug, Default)]
pub(crate) struct Backoff {
    rng: u64,
}

/// Retry `n`'s floor: `min(RETRY_BACKOFF_BASE · 2^(n−1), RETRY_BACKOFF_CAP)`
/// (retry 0, which is not one, counts as the first).
pub(crate) fn floor(retry: u32) -> Duration {
    // 2^4 · 1 s is past the 10 s cap already; the shift stays small.
    let doublings = retry.saturating_sub(1).min(16);
    RETRY_BACKOFF_BASE
        .saturating_mul(1 << doublings)
        .min(RETRY_BACKOFF_CAP)
}

impl Backoff {
    /// How long to wait before retry `n` (from 1): in `[d_n, 2·d_n]`.
    pub(crate) fn wait(&mut self, retry: u32) -> Duration {
        let d = floor(retry);
        let d_ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        d + Duration::from_nanos(random_up_to(&mut self.rng, d_ns))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_floor_doubles_from_the_base_up_to_the_cap() {
        let secs = Duration::from_secs;
        let floors: Vec<Duration> = (1..=8).map(floor).collect();
        assert_eq!(
            floors,
            [1, 2, 4, 8, 10, 10, 10, 10].map(secs),
            "the schedule docs/client.md gives"
        );
        assert_eq!(floor(0), RETRY_BACKOFF_BASE);
        assert_eq!(floor(u32::MAX), RETRY_BACKOFF_CAP);
    }

    #[test]
    fn jitter_only_lengthens_by_at_most_the_floor_and_spreads() {
        let mut a = Backoff::default();
        let mut b = Backoff::default();
        for n in 1..=10 {
            let (wa, wb) = (a.wait(n), b.wait(n));
            for w in [wa, wb] {
                assert!(w >= floor(n) && w <= 2 * floor(n), "retry {n}: {w:?}");
            }
        }
        // Two requests refused together come back at different times.
        let spread: Vec<bool> = (1..=10).map(|n| a.wait(n) != b.wait(n)).collect();
        assert!(spread.iter().filter(|&&d| d).count() >= 9, "{spread:?}");
    }

    #[test]
    fn each_wait_is_at_least_the_one_before_up_to_the_fourth() {
        let mut b = Backoff::default();
        for _ in 0..100 {
            let waits: Vec<Duration> = (1..=4).map(|n| b.wait(n)).collect();
            assert!(waits.windows(2).all(|w| w[0] <= w[1]), "{waits:?}");
        }
    }
}
