//! The local deny cache: after Redis denies a unit request for a key with
//! `retry_after` r, checks of that key before r are denied here, with no
//! round trip.
//!
//! Storage is ratewall's keyed table (`src/keyed/table.rs`): bounded
//! (`max_keys`), one 8-byte slot per key (a 24-bit tag of the Redis key
//! name's hash and the deadline in nanoseconds on this process's monotonic
//! clock, modulo 2^40: deadlines at most 2^38 ns ahead, the table's wrap
//! sweep reclaims passed ones; two names with one tag in one chain share
//! an entry, about 2^-24 per entry compared: a denial cached for one may
//! deny the other until it passes), lock-free lookups, and expired deadlines reclaimed as
//! new keys arrive; when full of live deadlines the entry that expires
//! soonest is evicted (losing one only costs a round trip).
//!
//! # Where it is exact
//!
//! Only denials of a **unit** request with nothing remaining are recorded,
//! so a cached denial is one Redis itself would give: a unit request
//! denied at t stays denied until t + r for GCRA, both window counters and
//! the log, because until then the key's state only gains units (other
//! instances' allows), and any cost of at least one unit is denied when one
//! unit is. It stops being exact when capacity comes back early from
//! elsewhere: a refund or a reset by another instance (this instance clears
//! its entry on its own refunds and resets), or a quota change. Then this
//! instance denies a key that Redis would admit, until r: never more
//! permissive, at most r too strict. A cached decision reports
//! `retry_after` = the time left to the deadline (exact for a unit request,
//! a lower bound for a larger cost) and `reset_after` the same lower bound.

use crate::algo::TimePacking;
use crate::clock::{Clock, StdClock};
use crate::keyed::table::{Full, Inserted, StateView, Table};
use std::fmt;

pub(crate) struct DenyCache {
    table: Table<TimePacking>,
    hasher: ahash::RandomState,
    clock: StdClock,
}

/// A deadline state: idle once it has passed.
struct Deadlines(u64);

impl StateView for Deadlines {
    fn is_idle(&self, until: u64) -> bool {
        until <= self.0
    }
    fn time_to_idle(&self, until: u64) -> u64 {
        until.saturating_sub(self.0)
    }
    fn held(&self, _: u64) -> u64 {
        0
    }
    fn now(&self) -> u64 {
        self.0
    }
}

impl DenyCache {
    pub(crate) fn new(max_keys: usize) -> DenyCache {
        let clock = StdClock::new();
        DenyCache {
            // 1 ns units: deadlines up to 2^38 ns (4.6 minutes) ahead.
            table: Table::new(
                max_keys,
                if max_keys >= 1024 { 16 } else { 1 },
                TimePacking::for_tolerance(0),
                clock.now() + 1,
            ),
            hasher: ahash::RandomState::new(),
            clock,
        }
    }

    /// The time every entry point uses, once the table's wrap sweep is
    /// done up to it (`keyed/wrap.rs`).
    fn now(&self) -> u64 {
        // 0 is a fresh slot's state: keep live deadlines above it.
        let now = self.clock.now() + 1;
        if self.table.sweep_due(now) {
            self.table.sweep_wrap(now, &Deadlines(now));
        }
        now
    }

    /// The time left until `rkey`'s cached denial ends, if one is live.
    pub(crate) fn denied_for(&self, rkey: &[u8]) -> Option<u64> {
        let now = self.now();
        let until = self
            .table
            .update(self.hasher.hash_one(rkey), now, &mut |s| (s, None))?;
        (until > now).then(|| until - now)
    }

    /// Records a denial of `rkey` for `retry_ns` from now.
    pub(crate) fn record(&self, rkey: &[u8], retry_ns: u64) {
        // At most as far ahead as a slot holds: a shorter cached denial
        // only asks Redis sooner.
        let range = self.table.packing().max_tolerance();
        let now = self.now();
        let until = now.saturating_add(retry_ns.min(range));
        let h = self.hasher.hash_one(rkey);
        let mut step = |s: u64| ((), (until > s).then_some(until));
        if self.table.update(h, now, &mut step).is_none() {
            match self
                .table
                .insert(h, &mut step, &Deadlines(now), Full::Evict)
            {
                Inserted::Existing(()) | Inserted::New { .. } | Inserted::NotStored(()) => {}
                Inserted::Full { .. } => {} // no room: the next check asks Redis
            }
        }
    }

    /// Forgets `rkey`'s denial (a refund or reset here brought capacity back).
    pub(crate) fn clear(&self, rkey: &[u8]) {
        let h = self.hasher.hash_one(rkey);
        let _ = self
            .table
            .update(h, self.now(), &mut |s| ((), (s != 1).then_some(1)));
    }
}

impl fmt::Debug for DenyCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DenyCache")
            .field("max_keys", &self.table.capacity())
            .field("len", &self.table.len())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_recorded_denial_holds_until_its_deadline_and_clears() {
        let c = DenyCache::new(16);
        assert_eq!(c.denied_for(b"k"), None);
        c.record(b"k", 60_000_000_000);
        let left = c.denied_for(b"k").unwrap();
        assert!(left > 59_000_000_000 && left <= 60_000_000_000, "{left}");
        assert_eq!(c.denied_for(b"other"), None);
        // A shorter deadline never shortens a longer one.
        c.record(b"k", 1);
        assert!(c.denied_for(b"k").unwrap() > 59_000_000_000);
        c.clear(b"k");
        assert_eq!(c.denied_for(b"k"), None);
        c.record(b"soon", 1);
        std::thread::sleep(std::time::Duration::from_millis(1));
        assert_eq!(c.denied_for(b"soon"), None, "expired");
    }

    #[test]
    fn it_stays_bounded() {
        let c = DenyCache::new(8);
        for i in 0..1000u32 {
            c.record(&i.to_le_bytes(), 60_000_000_000);
        }
        assert!(c.table.len() <= c.table.capacity());
        assert!(c.table.capacity() <= 16);
    }
}
