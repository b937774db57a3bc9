//! The path of a key the table does not hold: a fresh key's decision, the
//! insert (under the shard's mutex) when the check must store it, and what
//! [`WhenFull`] decides when there is no room. The table's side of it (the
//! key's chain, reclaim, eviction) is `Table::insert` and `Table::room`.

use super::builder::WhenFull;
use super::limiter::KeyedLimiter;
use super::table::{Full, Inserted, Room, StateView};
use super::KeyedAlgorithm;
use crate::algo::WordStep;
use crate::clock::Clock;
use crate::decision::{Decision, Tracking};
use crate::error::InsufficientCapacity;

/// The insert path's view of states: idleness and time to idle at `now`.
pub(super) struct View<A> {
    params: A,
    now: u64,
}

impl<A: KeyedAlgorithm> StateView for View<A> {
    fn is_idle(&self, state: u64) -> bool {
        // Idleness is "equals a fresh state": the same under any quota for
        // the GCRA buckets; the window counters compare window ids.
        self.params.is_idle(state, self.now)
    }
    fn time_to_idle(&self, state: u64) -> u64 {
        self.params.time_to_idle(state, self.now)
    }
    fn held(&self, state: u64) -> u64 {
        self.params.held(state, self.now)
    }
    fn now(&self) -> u64 {
        self.now
    }
}

impl<K, A: KeyedAlgorithm, C: Clock> KeyedLimiter<K, A, C> {
    /// One step of the algorithm on `state`, for the insert path.
    #[inline]
    fn step_at(
        &self,
        h: u64,
        state: u64,
        now: u64,
        n: u64,
        take: bool,
    ) -> (Result<Decision, InsufficientCapacity>, Option<u64>) {
        let a = self.params_for(h);
        let capacity = WordStep::capacity(&a);
        if let Err(e) = InsufficientCapacity::check(n, capacity) {
            return (Err(e), None);
        }
        // A cost of 0 asks for a unit request's decision, without taking it.
        let (d, next) = a.step(state, now, n.max(1));
        (Ok(d), if take { next } else { None })
    }

    /// `run` for a key the table does not hold: a fresh key's decision,
    /// stored only if it must be.
    #[cold]
    #[inline(never)]
    pub(super) fn run_untracked(
        &self,
        h: u64,
        now: u64,
        n: u64,
        take: bool,
    ) -> Result<Decision, InsufficientCapacity> {
        let mut step = |state: u64| self.step_at(h, state, now, n, take);
        let (fresh, next) = step(0);
        if take {
            if next.is_none() {
                return fresh;
            }
            return self.insert(h, now, &mut step);
        }
        // A peek: the decision the check would get, full-table policy
        // included. A check that would store nothing is the fresh decision.
        let fresh = fresh?;
        if n == 0 || self.step_at(h, 0, now, n, true).1.is_none() {
            return Ok(fresh);
        }
        Ok(match self.table.room(h, &self.view(now), self.full()) {
            Room::Tracked => fresh,
            Room::Evict => fresh.with_tracking(Tracking::EvictedOther),
            Room::Full { soonest } => self.when_no_room(fresh, soonest),
        })
    }

    pub(super) fn view(&self, now: u64) -> View<A> {
        View {
            params: self.params.read::<A>(),
            now,
        }
    }

    fn full(&self) -> Full {
        match self.policy {
            WhenFull::RejectNew => Full::Reject,
            WhenFull::AdmitUntracked => Full::Untracked,
            WhenFull::EvictLeastRecent => Full::Evict,
        }
    }

    /// The decision for a new key that found no room: admitted untracked,
    /// or rejected until the first key in its way goes idle.
    fn when_no_room(&self, fresh: Decision, soonest: u64) -> Decision {
        match self.policy {
            WhenFull::AdmitUntracked => fresh.with_tracking(Tracking::Untracked),
            // RejectNew, or EvictLeastRecent with nothing to evict.
            _ => {
                Decision::deny(fresh.limit(), 0, soonest, soonest).with_tracking(Tracking::Rejected)
            }
        }
    }

    #[cold]
    #[inline(never)]
    fn insert(
        &self,
        h: u64,
        now: u64,
        step: &mut impl FnMut(u64) -> (Result<Decision, InsufficientCapacity>, Option<u64>),
    ) -> Result<Decision, InsufficientCapacity> {
        match self.table.insert(h, step, &self.view(now), self.full()) {
            Inserted::Existing(r) | Inserted::NotStored(r) => r,
            Inserted::New { outcome, evicted } => outcome.map(|d| {
                if evicted {
                    d.with_tracking(Tracking::EvictedOther)
                } else {
                    d
                }
            }),
            Inserted::Full { soonest } => {
                let fresh = step(0).0?;
                Ok(self.when_no_room(fresh, soonest))
            }
        }
    }
}
