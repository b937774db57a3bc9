//! The shared CAS helper over one packed `u64`, and the seqlock that holds a
//! limiter's parameters so they can change at run time.
//!
//! # Protocol
//!
//! Every transition of a state word goes through [`AtomicWord::update`]:
//!
//! 1. load the word;
//! 2. run a pure step on the value seen, which returns the outcome and, if
//!    the state must change, the next value;
//! 3. no next value (a denial, a peek, a no-op refund): load the word again;
//!    if it still holds the value the step saw, return, nothing is written
//!    (otherwise a quota change moved it under the step: go back to 2);
//! 4. otherwise compare-exchange from the value seen to the next one; on
//!    failure, go back to step 2 with the value the failed exchange observed.
//!
//! The step is re-run from scratch on every attempt, so a lost race can never
//! combine one thread's decision with another thread's state.

use crate::sync::{fence, spin_hint, yield_now, AtomicU64, Ordering};
use std::fmt;

/// One packed state word.
#[derive(Debug)]
pub struct AtomicWord(AtomicU64);

impl AtomicWord {
    pub(crate) fn new(v: u64) -> Self {
        AtomicWord(AtomicU64::new(v))
    }

    /// Acquire: pairs with the Release of a quota change's rescaling CAS, so
    /// that a thread which reads a rescaled word also sees the parameter
    /// seqlock's odd version and waits for the new parameters (see `ParamCell`).
    #[inline]
    pub(crate) fn load(&self) -> u64 {
        self.0.load(Ordering::Acquire)
    }

    /// Release: publishes nothing but the word itself; used by `reset`, which
    /// has no step to run.
    pub(crate) fn store(&self, v: u64) {
        self.0.store(v, Ordering::Release);
    }

    /// Subtracts `delta` in one read-modify-write: a concurrency permit's
    /// release (`algo::concurrency`), which cannot fail and needs no step.
    /// Release: pairs with the Acquire of the next admission's CAS, so the
    /// next holder of these units sees what this holder did with them (the
    /// usual semaphore contract); the count itself would need only Relaxed.
    /// Returns the word before the subtraction.
    #[inline]
    pub(crate) fn fetch_sub(&self, delta: u64) -> u64 {
        self.0.fetch_sub(delta, Ordering::Release)
    }

    /// Runs `step` on the current value until its result is written, or until
    /// it asks for no write. Returns the step's outcome for the value that won.
    #[inline]
    pub(crate) fn update<R>(&self, step: impl FnMut(u64) -> (R, Option<u64>)) -> R {
        self.apply(step).0
    }

    /// [`update`](Self::update), also returning the value the winning step
    /// ran on, so that the caller can derive the rest of its answer from it
    /// after the exchange (the hot paths build their decision there).
    #[inline]
    pub(crate) fn apply<R>(&self, mut step: impl FnMut(u64) -> (R, Option<u64>)) -> (R, u64) {
        let mut seen = self.load();
        loop {
            let (outcome, next) = step(seen);
            let next = match next {
                Some(next) if next != seen => next,
                // No write (a denial, a peek, or a step that changed nothing):
                // nothing to publish. The step read the parameters after
                // loading `seen`; if a quota change rescaled the word in
                // between, the outcome mixed new parameters with the old
                // word, so confirm the word is still `seen` (a plain load of
                // a line we hold: the deny path stays read-only).
                _ => {
                    let again = self.load();
                    if again == seen {
                        return (outcome, seen);
                    }
                    seen = again;
                    continue;
                }
            };
            // Success AcqRel: Release so a parameter writer's odd version,
            // stored before its rescaling CAS, is visible to whoever reads this
            // word next (Acquire above); Acquire so our own next step sees it.
            // Failure Acquire: same reason as `load`.
            match self
                .0
                .compare_exchange_weak(seen, next, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return (outcome, seen),
                // Lost the race (or a spurious failure): recompute from the
                // value we saw, never from the value we wanted to write.
                Err(actual) => seen = actual,
            }
        }
    }
}

/// Parameters that fit in three words, so they can live in a [`ParamCell`].
pub trait Params: Copy {
    fn encode(&self) -> [u64; 3];
    fn decode(words: [u64; 3]) -> Self;
}

/// A seqlock over three words of parameters: reads write nothing (the hot
/// path stays read-only on this cache line), writes are rare and serialized
/// by the owner's mutex.
///
/// A quota change runs: `begin` (version odd) → rescale the state words with
/// `AtomicWord::update` → `publish` (new words, version even). A checker reads
/// the parameters *after* loading a state word (inside the step), so:
/// - if it loaded a word the change already rescaled, the Acquire load
///   synchronizes with the rescaling CAS (Release), which comes after the
///   odd version, so it waits and then reads the new parameters;
/// - if it loaded a word from before the change and read the new parameters,
///   its CAS fails (the rescale changed the word) and it starts again;
/// - if the rescale left the word's value unchanged, both readings agree.
#[derive(Debug)]
pub struct ParamCell {
    version: AtomicU64,
    words: [AtomicU64; 3],
}

impl ParamCell {
    pub(crate) fn new<P: Params>(p: P) -> Self {
        let [a, b, c] = p.encode();
        ParamCell {
            version: AtomicU64::new(0),
            words: [AtomicU64::new(a), AtomicU64::new(b), AtomicU64::new(c)],
        }
    }

    /// A consistent snapshot; spins (then yields) while a change is under way.
    #[inline]
    pub(crate) fn read<P: Params>(&self) -> P {
        match self.try_read() {
            Some(p) => p,
            None => self.read_contended(),
        }
    }

    /// A consistent snapshot, or `None` while a change is under way (or if
    /// one raced this read). For callers that hold a lock the change also
    /// takes, and so must not wait for it while holding that lock.
    #[inline]
    pub(crate) fn try_read<P: Params>(&self) -> Option<P> {
        // Acquire: pairs with `publish`'s Release store of the even
        // version, so the words written before it are visible below.
        let v1 = self.version.load(Ordering::Acquire);
        // Relaxed: ordered by the Acquire above and the fence below.
        let words = [
            self.words[0].load(Ordering::Relaxed),
            self.words[1].load(Ordering::Relaxed),
            self.words[2].load(Ordering::Relaxed),
        ];
        // Acquire fence: the word loads above happen before the version
        // re-check, so a concurrent writer's odd version (or its later even
        // one) is seen if any word was torn.
        fence(Ordering::Acquire);
        // Relaxed: ordered by the fence above.
        let v2 = self.version.load(Ordering::Relaxed);
        (v1 == v2 && v1 & 1 == 0).then(|| P::decode(words))
    }

    #[cold]
    #[inline(never)]
    fn read_contended<P: Params>(&self) -> P {
        let mut spins = 0u32;
        loop {
            spins = wait_for_writer(spins);
            if let Some(p) = self.try_read() {
                return p;
            }
        }
    }

    /// [`read`](Self::read) with only the wait out of line (the same tries
    /// and waits), so that the snapshot stays in registers: `read`'s slow
    /// path joins its fast one through memory (a store and a reload of the
    /// words on every read). For the keyed check; the one-limiter's check
    /// compiles worse with this shape (docs/benchmarks.md, "cuts on the
    /// 8-byte slot").
    #[inline]
    pub(crate) fn read_in_registers<P: Params>(&self) -> P {
        let mut spins = 0u32;
        loop {
            if let Some(p) = self.try_read() {
                return p;
            }
            spins = wait_for_writer(spins);
        }
    }

    /// Starts a change: readers wait until `publish`. The caller must hold
    /// the owner's writer mutex.
    pub(crate) fn begin(&self) {
        // Relaxed: only the owner's mutex holder writes the version.
        let v = self.version.load(Ordering::Relaxed);
        debug_assert!(v & 1 == 0, "nested ParamCell::begin");
        // Relaxed store, then a Release fence: the odd version is ordered
        // before the rescaling CASes and the word stores that follow.
        self.version.store(v.wrapping_add(1), Ordering::Relaxed);
        fence(Ordering::Release);
    }

    /// Ends a change with new parameters.
    pub(crate) fn publish<P: Params>(&self, p: P) {
        for (slot, w) in self.words.iter().zip(p.encode()) {
            // Relaxed: ordered by `begin`'s fence and the Release below.
            slot.store(w, Ordering::Relaxed);
        }
        // Relaxed: only the mutex holder writes the version.
        let v = self.version.load(Ordering::Relaxed);
        // Release: pairs with `read`'s Acquire; the words above are visible
        // to any reader that sees this even version.
        self.version.store(v.wrapping_add(1), Ordering::Release);
    }
}

/// Bits of a keyed table's 8-byte slot word that hold the key's state: the
/// low 40. The 24 above them hold the key's tag (docs/design.md, "Keyed
/// table").
pub(crate) const STATE_BITS: u32 = 40;

/// The largest packed state.
pub(crate) const STATE_MASK: u64 = (1 << STATE_BITS) - 1;

/// A `ParamCell` reader's wait after a torn or contended try (`spins`:
/// the waits so far); returns the new count. Out of line: it runs only
/// while a change is under way.
#[cold]
#[inline(never)]
fn wait_for_writer(spins: u32) -> u32 {
    if spins < 64 {
        spin_hint();
    } else {
        // The writer was likely preempted; on 2 cores spinning only delays it.
        yield_now();
    }
    spins + 1
}

/// How a keyed table keeps one key's state in the [`STATE_BITS`] low bits of
/// its slot word: the algorithm's full state word (what its step reads and
/// writes) packed relative to `now`, and back.
///
/// A packing is fixed per table (from the quota it was built with, see
/// `algo::KeyedWord`). Its contract, for every state `s` the algorithm can
/// hold at `now` and every `later` with `later - now` under
/// [`sweep_period`](Self::sweep_period) twice:
///
/// - `pack(s, now) <= STATE_MASK`;
/// - `unpack(pack(s, now), later)` means the same as `s` at `later` (equal,
///   or both idle), except that a packing may round a state towards "less
///   admitted" (GCRA rounds its time up: it never admits more);
/// - an idle state may be packed as any other idle state.
///
/// A packing with time in it reads a state modulo its range, so the table
/// rewrites every idle key's word within
/// [`sweep_period`](Self::sweep_period) (its wrap sweep), before an old
/// time can read as a current one. A packing without time (`u64::MAX`) is
/// never swept for it.
pub trait Packing: Copy + fmt::Debug + Send + Sync + 'static {
    /// The state `state` at `now`, packed (at most [`STATE_MASK`]).
    fn pack(&self, state: u64, now: u64) -> u64;
    /// The full state a packed one stands for at `now`.
    fn unpack(&self, packed: u64, now: u64) -> u64;
    /// Nanoseconds within which the table must rewrite every idle key's
    /// word, or `u64::MAX` if the packed state holds no time.
    fn sweep_period(&self) -> u64;
    /// `now` as the table's checks read it: in the packing's time unit
    /// (rounded down: a check behaves as at an instant no later than its
    /// own, never admitting more). `now` itself for a packing that keeps
    /// time to the nanosecond, or none.
    #[inline]
    fn time(&self, now: u64) -> u64 {
        now
    }
}

/// The packing of a state with no time in it that fits 40 bits as it is (a
/// count: the keyed concurrency algorithm's): the identity. Never swept.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Plain;

impl Packing for Plain {
    #[inline]
    fn pack(&self, state: u64, _: u64) -> u64 {
        debug_assert!(state <= STATE_MASK);
        state
    }
    #[inline]
    fn unpack(&self, packed: u64, _: u64) -> u64 {
        packed
    }
    fn sweep_period(&self) -> u64 {
        u64::MAX
    }
}

#[cfg(all(test, not(ratewall_loom)))]
mod tests {
    use super::*;

    #[derive(Clone, Copy, Debug, PartialEq)]
    struct P(u64, u64, u64);
    impl Params for P {
        fn encode(&self) -> [u64; 3] {
            [self.0, self.1, self.2]
        }
        fn decode(w: [u64; 3]) -> Self {
            P(w[0], w[1], w[2])
        }
    }

    #[test]
    fn update_writes_only_when_the_step_asks() {
        let w = AtomicWord::new(5);
        let r = w.update(|s| (s * 10, None));
        assert_eq!(r, 50);
        assert_eq!(w.load(), 5, "a step without a next value writes nothing");
        let r = w.update(|s| (s, Some(s + 1)));
        assert_eq!(r, 5);
        assert_eq!(w.load(), 6);
    }

    #[test]
    fn update_recomputes_from_the_observed_value_after_a_lost_race() {
        let w = AtomicWord::new(1);
        let mut calls = Vec::new();
        let r = w.update(|s| {
            calls.push(s);
            if calls.len() == 1 {
                // Another thread wins the race between our load and our CAS.
                w.store(7);
            }
            (s, Some(s + 100))
        });
        assert_eq!(calls[0], 1);
        assert_eq!(*calls.last().unwrap(), 7, "retry runs on the value seen");
        assert_eq!(r, 7);
        assert_eq!(w.load(), 107);
    }

    #[test]
    fn param_cell_round_trips_and_publishes() {
        let c = ParamCell::new(P(1, 2, 3));
        assert_eq!(c.read::<P>(), P(1, 2, 3));
        c.begin();
        c.publish(P(4, 5, 6));
        assert_eq!(c.read::<P>(), P(4, 5, 6));
    }
}
