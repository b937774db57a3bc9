//! One partition's local pace: a token bucket at the pace in force
//! ([`Partitions::pace`](super::Partitions::pace): the user's rate,
//! tightened by what the upstream announced), rebuilt in place when that
//! pace changes.
//!
//! The bucket is made on first use (a partition that was only learned
//! about costs no bucket) and lives as long as its partition: evicting the
//! partition from the bounded table forgets its pace too. A change of pace
//! rescales the bucket's usage ([`set_quota`](crate::Limiter::set_quota)), so a tighter
//! announcement does not hand out a fresh burst.

use crate::clock::Clock;
use crate::decision::Decision;
use crate::limiter::TokenBucket;
use crate::quota::Rate;
use crate::sync::{lock, Mutex};
use std::fmt;
use std::time::Duration;

/// The bucket and the pace it was built for.
struct Bucket<C: Clock> {
    pace: Rate,
    limiter: TokenBucket<C>,
}

/// One partition's local pace (see the module docs).
pub(crate) struct Pacer<C: Clock> {
    bucket: Mutex<Option<Bucket<C>>>,
}

impl<C: Clock> Default for Pacer<C> {
    fn default() -> Self {
        Pacer {
            bucket: Mutex::new(None),
        }
    }
}

impl<C: Clock> fmt::Debug for Pacer<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let pace = lock(&self.bucket).as_ref().map(|b| b.pace);
        f.debug_struct("Pacer").field("pace", &pace).finish()
    }
}

/// A denial that asks the caller to come back in `wait` (nothing taken).
pub(crate) fn come_back_in(wait: Duration) -> Decision {
    let ns = u64::try_from(wait.as_nanos()).unwrap_or(u64::MAX);
    Decision::deny(1, 0, ns, ns)
}

impl<C: Clock + Clone> Pacer<C> {
    /// Takes one request at `pace` (`None`: no pace known, every request
    /// passes). A pace the bucket cannot be built for (an announced window
    /// beyond the limiters' range) leaves the bucket as it was, or none.
    pub(crate) fn admit(&self, pace: Option<Rate>, clock: &C) -> Decision {
        let Some(pace) = pace else {
            return Decision::allow(1, 1, 0);
        };
        let mut slot = lock(&self.bucket);
        match slot.as_mut() {
            Some(b) if b.pace == pace => {}
            Some(b) => {
                if b.limiter.set_quota(pace).is_ok() {
                    b.pace = pace;
                }
            }
            None => {
                if let Ok(limiter) = TokenBucket::with_clock(pace, clock.clone()) {
                    *slot = Some(Bucket { pace, limiter });
                }
            }
        }
        match slot.as_ref() {
            Some(b) => b.limiter.check(),
            None => Decision::allow(1, 1, 0),
        }
    }
}
