//! Who waits for a permit: the queue, and its protocol with the word's
//! waiters mark (bit 63, `algo::concurrency`).
//!
//! # Protocol (docs/concurrency.md, "Waiting for a permit")
//!
//! - The queue is a list under one lock, in the order waiters are served:
//!   by class (highest first), then by arrival. Only code holding the lock
//!   sets or clears the mark, and the mark is set whenever the list is not
//!   empty.
//! - **Join** (a waiting acquire that found no room): under the lock, add
//!   the entry, set the mark (a compare-exchange, none if set), then
//!   **drain**. A release whose `fetch_sub` came before the mark is seen by
//!   the drain's compare-exchange (the word's modifications are totally
//!   ordered); one after it returns the mark and drains itself.
//! - **Drain** (under the lock): admit entries in order, each with the
//!   admission step's compare-exchange, on the entry's behalf (the units are
//!   taken then, and the waiter is woken to collect them); an entry whose
//!   cost exceeds its class's share of the current maximum ends with
//!   `InsufficientCapacity`. Fair: stop at the first entry that does not fit;
//!   not fair: go on to the others. An empty list clears the mark.
//! - **Wake**: a release whose `fetch_sub` returned the mark, and a re-size
//!   of a marked word, drain. Nobody polls: a waiter sleeps until woken.
//! - **Leave** (a waiting future dropped, a deadline): under the lock, an
//!   entry still queued is removed (and the list drained: it may have held
//!   others back); an entry already granted hands its units back through
//!   the ordinary release, after the lock is dropped, which drains in turn.
//!   Nothing is taken and nothing lost.

use super::priority::{Priority, Shares};
use crate::algo::concurrency::{self as algo, InFlight};
use crate::decision::Decision;
use crate::error::InsufficientCapacity;
use crate::sync::{lock, Mutex};
use crate::word::AtomicWord;
use std::fmt;
use std::task::Waker;

/// What the queue works on: the limiter's word, its shares, and the mean
/// hold time for the decisions (`ConcurrencyLimiter::counts`).
pub(super) struct Counts<'a> {
    pub(super) word: &'a AtomicWord,
    pub(super) shares: &'a Shares,
    pub(super) hold_ns: u64,
}

/// What a waiter was finally told: a grant (its units already taken), or a
/// cost that can never pass.
pub(super) type Verdict = Result<Decision, InsufficientCapacity>;

/// The waiters of one limiter.
pub(crate) struct Waiters {
    queue: Mutex<Queue>,
    fair: bool,
}

#[derive(Default)]
struct Queue {
    /// Waiting, in the order they are served.
    entries: Vec<Entry>,
    /// Served but not yet collected by their waiter (few: each is taken by
    /// the waiter's next poll, or returned when it leaves).
    done: Vec<(u64, Verdict)>,
    next_id: u64,
}

struct Entry {
    id: u64,
    units: u64,
    class: Priority,
    waker: Waker,
}

/// The answer to a join.
pub(super) enum Joined {
    /// Served at once (the drain that follows the join admitted it).
    Done(Verdict),
    /// Queued under this id.
    Queued(u64),
}

// Every non-generic function here is `#[inline]`, so a build that never
// uses a concurrency limiter compiles none of it (a new codegen unit moves
// inlining on the hot paths elsewhere: docs/client.md, issue 20's note).
impl Waiters {
    #[inline]
    pub(super) fn new(fair: bool) -> Self {
        Waiters {
            queue: Mutex::new(Queue::default()),
            fair,
        }
    }

    /// Whether waiting is fair (arrival order, no passing).
    #[inline]
    pub(super) fn is_fair(&self) -> bool {
        self.fair
    }
}

impl fmt::Debug for Waiters {
    #[inline]
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Waiters")
            .field("fair", &self.fair)
            .finish_non_exhaustive()
    }
}

impl Queue {
    /// Takes the verdict of waiter `id`, if it has one.
    #[inline]
    fn take_done(&mut self, id: u64) -> Option<Verdict> {
        let i = self.done.iter().position(|(d, _)| *d == id)?;
        Some(self.done.swap_remove(i).1)
    }
}

impl Waiters {
    /// Queues a waiter for `n` units of class `class`, woken by `waker`.
    #[inline]
    pub(super) fn join(&self, c: Counts<'_>, n: u64, class: Priority, waker: &Waker) -> Joined {
        let mut q = lock(&self.queue);
        // A cost that can never pass at this maximum does not queue (a fair
        // queue might not reach it for a while).
        let max = InFlight::unpack(c.word.load()).max;
        let cap = algo::cap(max, c.shares.cap_pct(class));
        if let Err(e) = InsufficientCapacity::check(n, cap) {
            return Joined::Done(Err(e));
        }
        let id = q.next_id;
        q.next_id += 1;
        // Highest class first; within a class, arrival order.
        let at = q
            .entries
            .iter()
            .position(|e| e.class < class)
            .unwrap_or(q.entries.len());
        q.entries.insert(
            at,
            Entry {
                id,
                units: n,
                class,
                waker: waker.clone(),
            },
        );
        // The mark before the drain: a release after it drains the queue
        // itself; one before it freed units the drain's CAS now sees.
        c.word.update(algo::mark_waiters);
        let woken = self.drain(&mut q, &c);
        let joined = match q.take_done(id) {
            Some(verdict) => Joined::Done(verdict),
            None => Joined::Queued(id),
        };
        drop(q);
        wake(woken);
        joined
    }

    /// Waiter `id`'s verdict if it has one; else it stays queued, to be
    /// woken by `waker`.
    #[inline]
    pub(super) fn poll(&self, id: u64, waker: &Waker) -> Option<Verdict> {
        let mut q = lock(&self.queue);
        if let Some(verdict) = q.take_done(id) {
            return Some(verdict);
        }
        if let Some(e) = q.entries.iter_mut().find(|e| e.id == id) {
            if !e.waker.will_wake(waker) {
                e.waker = waker.clone();
            }
        }
        None
    }

    /// Waiter `id` gives up: out of the queue. `true` if it was served
    /// meanwhile: the caller gives its units back with the ordinary release
    /// (after this returns, the lock dropped), which drains if others wait.
    #[must_use = "units served to a waiter that leaves must be released"]
    #[inline]
    pub(super) fn leave(&self, c: Counts<'_>, id: u64) -> bool {
        let mut q = lock(&self.queue);
        match q.take_done(id) {
            Some(verdict) => verdict.is_ok(),
            None => {
                q.entries.retain(|e| e.id != id);
                // It may have held others back (fair), or been the last.
                let woken = self.drain(&mut q, &c);
                drop(q);
                wake(woken);
                false
            }
        }
    }

    /// A release or a re-size found the mark: serve whoever fits now
    /// (called from the limiter's out-of-line `wake_waiters`).
    #[inline]
    pub(super) fn wake(&self, c: Counts<'_>) {
        let mut q = lock(&self.queue);
        let woken = self.drain(&mut q, &c);
        drop(q);
        wake(woken);
    }

    /// Admits queued waiters in order while they fit (fair: stops at the
    /// first that does not), and clears the mark when nobody is left.
    /// Called with the lock held; returns the wakers of those served, to be
    /// woken after the lock is dropped (a waker may run code that locks).
    #[must_use = "the waiters served must be woken"]
    #[inline]
    fn drain(&self, q: &mut Queue, c: &Counts<'_>) -> Woken {
        let mut woken = Woken::default();
        let mut i = 0;
        while i < q.entries.len() {
            let e = &q.entries[i];
            let share = c.shares.cap_pct(e.class);
            // The admission step's CAS (Acquire/AcqRel, as `try_admit`): the
            // waiter sees what the holders before it did.
            let (verdict, _) = c
                .word
                .apply(|word| algo::acquire(word, e.units, share, c.hold_ns));
            match verdict {
                Ok(d) if !d.is_allowed() => {
                    if self.fair {
                        break;
                    }
                    i += 1;
                }
                served => {
                    let e = q.entries.remove(i);
                    q.done.push((e.id, served));
                    woken.add(e.waker);
                }
            }
        }
        if q.entries.is_empty() {
            c.word.update(algo::clear_waiters);
        }
        woken
    }
}

/// The wakers of the waiters one drain served: most drains serve one (a
/// release of one unit), which needs no allocation.
#[derive(Default)]
struct Woken {
    first: Option<Waker>,
    rest: Vec<Waker>,
}

impl Woken {
    #[inline]
    fn add(&mut self, w: Waker) {
        if self.first.is_none() {
            self.first = Some(w);
        } else {
            self.rest.push(w);
        }
    }
}

/// Wakes the waiters a drain served.
#[inline]
fn wake(woken: Woken) {
    if let Some(w) = woken.first {
        w.wake();
    }
    for w in woken.rest {
        w.wake();
    }
}
