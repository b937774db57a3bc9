//! The keyed table's wrap sweep: the schedule that rewrites every idle
//! key's word before its packed time can wrap around and read as current.
//!
//! A slot word keeps a key's state in 40 bits, with time modulo the
//! packing's range (`word::Packing`): an idle key left alone long enough
//! would come back as active. So every shard's idle keys are *normalized*
//! at least once per `sweep_period` (a quarter of what the packing
//! tolerates, see `docs/design.md`, "Keyed table"): their words rewritten
//! as the idle state packed at the sweep's `now`. They stay tracked, as
//! idle keys always did until an insert reclaims them: `len()` and every
//! decision are those of an untouched idle key.
//!
//! The table drives it itself, with no thread of its own: each check loads
//! `due` (one read-mostly word beside the table's shard pointer) and
//! compares it with its `now`; the first check at or past it takes the
//! mutex and sweeps as many shards as the time since the last run asks for
//! (all of them after a long pause) *before* it reads its own slot. A table
//! nobody inserts into is swept all the same, and a check after a long pause
//! never trusts a word the sweep has not seen.

use crate::sync::{lock, AtomicU64, Mutex, Ordering};

/// When the next shard is due, and where the sweep stands.
#[derive(Debug)]
pub(crate) struct Wrap {
    /// The earliest time the next run is due (`u64::MAX`: never, for a
    /// packing without time). Written only under `cursor`'s mutex.
    due: AtomicU64,
    /// Nanoseconds between two runs: the sweep period over the shard count,
    /// so that every shard is swept once per period.
    step: u64,
    /// The sweep period.
    period: u64,
    /// The next shard to sweep and the time of the last run (or of the
    /// table's build). Boxed: cold, and the limiter that holds the table
    /// stays small.
    cursor: Box<Mutex<(usize, u64)>>,
}

impl Wrap {
    /// The schedule for `shards` shards, each swept once per `period` ns
    /// (`u64::MAX`: never), of a table built at `now` (empty: as good as
    /// swept then).
    pub(crate) fn new(period: u64, shards: usize, now: u64) -> Wrap {
        let step = if period == u64::MAX {
            u64::MAX
        } else {
            (period / shards as u64).max(1)
        };
        Wrap {
            due: AtomicU64::new(now.saturating_add(step)),
            step,
            period,
            cursor: Box::new(Mutex::new((0, now))),
        }
    }

    /// The time a shard last swept at `swept` reads its slots at, when swept
    /// again at `now`: `now`, or after a pause longer than the period the
    /// end of the period, when every word the shard holds (swept then, or
    /// written since by checks that found no run due) still reads as what
    /// it stored. Idleness is then judged at `now` from the states read.
    pub(crate) fn read_at(&self, swept: u64, now: u64) -> u64 {
        now.min(swept.saturating_add(self.period))
    }

    /// Bytes this schedule owns beside itself (its boxed cursor).
    pub(crate) fn heap_bytes(&self) -> usize {
        std::mem::size_of::<Mutex<(usize, u64)>>()
    }

    /// Whether a run is due at `now`: the check's one load and compare.
    #[inline]
    pub(crate) fn is_due(&self, now: u64) -> bool {
        // Acquire: pairs with `run`'s Release store, so a check that sees
        // the new `due` also sees every tombstone the run wrote before it.
        now >= self.due.load(Ordering::Acquire)
    }

    /// Sweeps the shards due at `now` with `sweep` (shard index), unless
    /// another thread has done it meanwhile. Returns the shards swept.
    pub(crate) fn run(&self, now: u64, shards: usize, mut sweep: impl FnMut(usize)) -> usize {
        let mut cursor = lock(&self.cursor);
        // Relaxed: `due` is written only under this mutex, which we hold.
        if now < self.due.load(Ordering::Relaxed) {
            return 0; // another check ran it while we waited
        }
        // As many shards as the time since the last run covers (at least
        // one; all of them after a pause of a period or more), so that each
        // shard waits at most a period (plus one step) between two sweeps
        // for as long as checks come.
        let k = now
            .saturating_sub(cursor.1)
            .div_ceil(self.step)
            .clamp(1, shards as u64) as usize;
        for _ in 0..k {
            sweep(cursor.0);
            cursor.0 = (cursor.0 + 1) % shards;
        }
        cursor.1 = now;
        // Release: see `is_due`.
        self.due
            .store(now.saturating_add(self.step), Ordering::Release);
        k
    }
}
