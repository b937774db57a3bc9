//! Lockouts after a breach ([`Rule::block_for`](super::Rule::block_for)):
//! once a local rule denies a key, that key is denied for the block's
//! length, whatever its bucket says.
//!
//! A block is one unit of a keyed token bucket of burst 1 that refills
//! one unit per block length: a key is blocked while its unit is taken
//! (its TAT is in the future), and the unit's `retry_after` is the time
//! to the block's end. So the blocks live in the crate's keyed table:
//! lock-free, and a key whose block has ended is idle, so its slot can be
//! reclaimed. A key that is not blocked costs one peek (a hash and a
//! probe, no write); a blocked key's request is answered from the peek
//! and takes no unit of any rule.
//!
//! The table is the lockout's own (`spray::lockout_table`), not the rule's:
//! [`Rule::lockout_max_keys`](super::Rule::lockout_max_keys) blocks (by
//! default the rule's `max_keys`, at least 65,536), and
//! [`WhenFull::EvictLeastRecent`](crate::keyed::WhenFull::EvictLeastRecent):
//! when it is full of live blocks, a new breach is still blocked, and the
//! block that ends soonest among the new one's neighbours (the least time
//! to idle) ends early. A block that could not be recorded at all (a
//! table given `RejectNew` or `AdmitUntracked`, as the unit tests do)
//! leaves the key limited by its rule alone, as before the breach.

use crate::clock::Clock;
use crate::decision::{Decision, Tracking};
use crate::error::ConfigError;
use crate::keyed::{KeyedPolicyLimiter, TableOptions};
use crate::policy::Policy;
use crate::quota::Rate;
use std::time::Duration;

/// The live blocks of one rule.
pub(super) struct Lockout<C: Clock> {
    blocks: KeyedPolicyLimiter<u128, C>,
}

impl<C: Clock + Clone> Lockout<C> {
    /// Blocks of `block_for` each, in a table with `table`'s options.
    pub(super) fn new(
        block_for: Duration,
        table: TableOptions,
        clock: C,
    ) -> Result<Lockout<C>, ConfigError> {
        let blocks =
            KeyedPolicyLimiter::<u128>::builder(Policy::token_bucket(Rate::every(block_for)))
                .clock(clock)
                .table(table)
                .build()?;
        Ok(Lockout { blocks })
    }
}

impl<C: Clock> Lockout<C> {
    /// The denial of a request whose key is blocked (for a rule whose
    /// limit is `limit`): nothing left, until the block ends. `None` if
    /// the key is not blocked.
    #[inline]
    pub(super) fn blocked(&self, key: &u128, limit: u64) -> Option<Decision> {
        let d = self.blocks.peek_key(key);
        // A key the table does not hold (`Rejected`: a full table's answer
        // for a new key) is not blocked.
        (!d.is_allowed() && d.tracking() == Tracking::Tracked).then(|| {
            let left = d.retry_after().as_nanos() as u64;
            Decision::deny(limit, 0, left, left)
        })
    }

    /// Starts a block for `key` after its rule denied `denial`: the denial
    /// to report, until the block's end, or the rule's own wait if longer
    /// (see [`no_sooner_than`]). If the table could not record the
    /// block (full, see the module docs), or the rule denied the key only
    /// because its own table was full (`Tracking::Rejected`), the rule's
    /// own denial stands.
    pub(super) fn start(&self, key: &u128, denial: Decision) -> Decision {
        if denial.tracking() == Tracking::Rejected {
            // The rule's table was full (`WhenFull::RejectNew`): not this
            // key's breach, so no block (a spray that fills the table must
            // not lock each new client out for `block_for`).
            return denial;
        }
        let d = self.blocks.check_key(key);
        let recorded = matches!(d.tracking(), Tracking::Tracked | Tracking::EvictedOther);
        if d.is_allowed() && recorded {
            // The unit taken: blocked until it is back (`reset_after`).
            let left = d.reset_after().as_nanos() as u64;
            no_sooner_than(Decision::deny(denial.limit(), 0, left, left), denial)
        } else if !d.is_allowed() && recorded {
            // Another request of this key started the block first.
            self.blocked(key, denial.limit())
                .map_or(denial, |b| no_sooner_than(b, denial))
        } else {
            denial
        }
    }
}

/// A block's denial `block`, told no sooner than the rule's own `own`
/// decision for the same request: a client that waits the `Retry-After`
/// it is told must find the block over **and** its rule admitting, or it
/// would meet the rule's denial and start a new block (a `3/min` rule
/// with a 30 s block answered 30, and the request was denied until about
/// 60 s).
pub(super) fn no_sooner_than(block: Decision, own: Decision) -> Decision {
    if !own.is_allowed() && own.retry_after() > block.retry_after() {
        let wait = own.retry_after().as_nanos() as u64;
        Decision::deny(block.limit(), 0, wait, wait)
    } else {
        block
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ManualClock;

    #[test]
    fn a_block_lasts_its_length_and_then_ends() {
        let clock = ManualClock::new();
        let l = Lockout::new(Duration::from_secs(10), TableOptions::new(), clock.clone()).unwrap();
        assert!(l.blocked(&7, 5).is_none());
        let d = l.start(&7, Decision::deny(5, 0, 1_000, 1_000));
        assert!(!d.is_allowed());
        assert_eq!((d.limit(), d.remaining()), (5, 0));
        assert_eq!(d.retry_after(), Duration::from_secs(10));
        clock.advance(Duration::from_secs(4));
        let b = l.blocked(&7, 5).expect("still blocked");
        assert_eq!(b.retry_after(), Duration::from_secs(6));
        assert!(l.blocked(&8, 5).is_none(), "another key is free");
        // A second start during the block keeps the first block's end.
        assert_eq!(
            l.start(&7, Decision::deny(5, 0, 1, 1)).retry_after(),
            Duration::from_secs(6)
        );
        clock.advance(Duration::from_secs(6));
        assert!(l.blocked(&7, 5).is_none(), "the block ended");
        assert_eq!(
            l.start(&7, Decision::deny(5, 0, 1, 1)).retry_after(),
            Duration::from_secs(10)
        );
    }

    #[test]
    fn a_full_table_ends_the_block_nearest_its_end_and_records_the_new_one() {
        let clock = ManualClock::new();
        let own = Decision::deny(5, 0, 1_000_000_000, 1_000_000_000);
        // A one-shard table of 4 blocks: every insert sees all of them.
        let table = TableOptions::new()
            .max_keys(4)
            .shards(1)
            .when_full(crate::keyed::WhenFull::EvictLeastRecent);
        let l = Lockout::new(Duration::from_secs(100), table, clock.clone()).unwrap();
        for k in 1..=4u128 {
            assert_eq!(l.start(&k, own).retry_after(), Duration::from_secs(100));
            clock.advance(Duration::from_secs(10));
        }
        // Full: key 1's block ends first (in 60 s); a fifth breach takes its place.
        assert_eq!(l.start(&5, own).retry_after(), Duration::from_secs(100));
        assert!(l.blocked(&1, 5).is_none(), "the block nearest its end went");
        for k in 2..=5u128 {
            let left = l.blocked(&k, 5).expect("still blocked").retry_after();
            assert_eq!(
                left,
                Duration::from_secs(100 - 10 * (5 - k as u64)),
                "key {k}"
            );
        }
    }

    #[test]
    fn a_full_table_that_rejects_new_keys_records_no_block() {
        let clock = ManualClock::new();
        let table = TableOptions::new().max_keys(1);
        let l = Lockout::new(Duration::from_secs(10), table, clock).unwrap();
        let own = Decision::deny(5, 0, 1_000_000_000, 1_000_000_000);
        assert_eq!(l.start(&1, own).retry_after(), Duration::from_secs(10));
        // The table holds at least `max_keys`, a few more by its layout.
        let unrecorded: Vec<u128> = (2..1_000u128)
            .filter(|k| l.start(k, own).retry_after() == own.retry_after())
            .collect();
        assert!(
            !unrecorded.is_empty(),
            "a full table records no more blocks"
        );
        for k in unrecorded {
            assert!(
                l.blocked(&k, 5).is_none(),
                "key {k}: no block recorded, none reported"
            );
        }
        assert!(l.blocked(&1, 5).is_some(), "the first block holds");
    }
}
