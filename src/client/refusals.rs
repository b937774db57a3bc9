//! The refusals a client acted on, by status: [`Refusals`], and the
//! counters behind it (one per status, shared by a partition and by the
//! pacing layer's totals).
//!
//! A refusal is a response whose status makes the client stop or try
//! again: 429 Too Many Requests and 503 Service Unavailable. Both have
//! their `Retry-After` read (the partition pauses for it), and both are
//! what a pacing layer retries; every one received is counted here,
//! retried or not.

use super::announce::Announcement;
use crate::sync::{AtomicU64, Ordering};
use http::StatusCode;
use std::fmt;

/// How many refusals came back, by status: 429s and 503s, retried ones
/// included.
///
/// ```
/// use http::{HeaderMap, StatusCode};
/// use ratewall::client::{Announcement, Partitions};
///
/// let partitions = Partitions::new(8).unwrap();
/// for status in [StatusCode::SERVICE_UNAVAILABLE, StatusCode::TOO_MANY_REQUESTS, StatusCode::SERVICE_UNAVAILABLE] {
///     partitions.learn(&"upstream", &Announcement::read(status, &HeaderMap::new()));
/// }
/// let refused = partitions.view(&"upstream").unwrap().refusals;
/// assert_eq!((refused.too_many_requests, refused.unavailable), (1, 2));
/// assert_eq!(refused.total(), 3);
/// assert_eq!(refused.to_string(), "3 refused (429: 1, 503: 2)");
/// ```
#[non_exhaustive]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Refusals {
    /// 429 Too Many Requests.
    pub too_many_requests: u64,
    /// 503 Service Unavailable.
    pub unavailable: u64,
}

impl Refusals {
    /// Every refusal, whatever its status.
    ///
    /// ```
    /// # use ratewall::client::Refusals;
    /// assert_eq!(Refusals::default().total(), 0);
    /// ```
    pub fn total(&self) -> u64 {
        self.too_many_requests.saturating_add(self.unavailable)
    }

    /// Each counted status and its count, in status order.
    ///
    /// ```
    /// # use ratewall::client::Refusals;
    /// use http::StatusCode;
    /// for (status, n) in Refusals::default().by_status() {
    ///     assert!(status == StatusCode::TOO_MANY_REQUESTS || status == StatusCode::SERVICE_UNAVAILABLE);
    ///     assert_eq!(n, 0);
    /// }
    /// ```
    pub fn by_status(&self) -> [(StatusCode, u64); 2] {
        [
            (StatusCode::TOO_MANY_REQUESTS, self.too_many_requests),
            (StatusCode::SERVICE_UNAVAILABLE, self.unavailable),
        ]
    }
}

impl fmt::Display for Refusals {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} refused (", self.total())?;
        for (i, (status, n)) in self.by_status().into_iter().enumerate() {
            let sep = if i == 0 { "" } else { ", " };
            write!(f, "{sep}{}: {n}", status.as_u16())?;
        }
        f.write_str(")")
    }
}

/// The counters behind a [`Refusals`].
#[derive(Debug)]
pub(crate) struct RefusalCounters {
    too_many_requests: AtomicU64,
    unavailable: AtomicU64,
}

impl Default for RefusalCounters {
    fn default() -> Self {
        RefusalCounters {
            too_many_requests: AtomicU64::new(0),
            unavailable: AtomicU64::new(0),
        }
    }
}

impl RefusalCounters {
    /// Counts the response `said` was read from, if it was a refusal.
    pub(crate) fn record(&self, said: &Announcement) {
        let counter = if said.too_many_requests {
            &self.too_many_requests
        } else if said.unavailable {
            &self.unavailable
        } else {
            return;
        };
        // Relaxed: a counter; it publishes no other memory.
        counter.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn load(&self) -> Refusals {
        Refusals {
            // Relaxed: counters, read for display.
            too_many_requests: self.too_many_requests.load(Ordering::Relaxed),
            unavailable: self.unavailable.load(Ordering::Relaxed),
        }
    }
}
