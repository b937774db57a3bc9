//! The requests a pacing layer has in flight to one partition, and the
//! cuts that what-is-left made to its local pace, with the proofs that
//! give back what a cut took twice.
//!
//! # Why cuts are given back
//!
//! A response saying `r` are left lowers the local pace to `r - 1 -
//! newer` whole units (`pacer.rs`), `newer` being the requests sent after
//! the one answered and not answered yet: the upstream's `r` may not
//! count them. But an upstream serves concurrent requests out of order,
//! and it may have counted some of them already: then the cut counted
//! them twice, and the client waits for units the upstream still has. In
//! a 20-worker run against a `50/s burst 100` upstream, one such cut took
//! 11 units at once (220 ms of pace) in about half the runs.
//!
//! Their own responses prove it. Absent a refill, each request the
//! upstream counts leaves one fewer: a request `j` counted *after* the
//! answered request `k` says `r_j < r_k + R`, `R` being the (fractional)
//! units the upstream's announced pace refilled from `k`'s send to `j`'s
//! response (an interval that holds the span between the two counts).
//! Other clients of the same quota only lower `r_j`. So `r_j >= r_k + R`
//! proves `j` was counted before `k`, and `k`'s cut took one unit too
//! many: its bound rises by one. (If the upstream instead refilled
//! faster than it announced, or reset a window, it gained at least that
//! unit since `k`: the raised bound still holds.)
//!
//! # What may be given back
//!
//! The pace must stay at or below every cut's bound. Each cut's *slack*
//! is how far its bound is above the pace's whole units; the bound and
//! the bucket refill at the same rate and lose the same sends, so the
//! slack only changes when a cut takes units (every slack grows by what
//! it took), when a proof raises one cut's bound (its slack grows by
//! one) or when units are given back (every slack shrinks by them). What
//! is given back is at most the smallest slack, and at most what cuts
//! took and nothing gave back yet (*owed*): the pace never rises above
//! where it was before the cuts. While nothing is owed no cut can bind a
//! give-back (each slack is at least what was owed since it was made),
//! so the cuts are forgotten; a cut whose counted requests are all
//! answered or gone can gain no proof, and only its slack is kept.

use crate::quota::Rate;
use std::collections::{BTreeMap, BTreeSet};

/// At most this many cuts wait for proofs; an older one keeps only its
/// slack (it can gain no proof then: what it took stays taken).
const MAX_CUTS: usize = 64;

/// One cut that may yet be proven to have taken too much.
#[derive(Debug)]
struct Cut {
    /// What the answered request's response said was left.
    left: u64,
    /// When the answered request was sent (ns on the table's clock).
    sent_at: u64,
    /// How far this cut's bound is above the pace's whole units.
    slack: u64,
    /// The requests this cut counted as not seen upstream, still unanswered.
    counted: BTreeSet<u64>,
}

/// One partition's requests in flight, and its cuts (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct Flights {
    next: u64,
    /// Ticket (in the order sent) to when it was sent (ns).
    open: BTreeMap<u64, u64>,
    /// Units cuts took that no proof gave back yet.
    owed: u64,
    /// The smallest slack of the cuts that can gain no proof (`None`: no
    /// such cut since nothing was owed).
    settled: Option<u64>,
    cuts: Vec<Cut>,
}

/// Whether `j`, answered at `now` with `left_j`, was counted upstream
/// before a cut's request (sent at `cut.sent_at`, answered with
/// `cut.left`): `left_j >= cut.left + R`, `R` the units `upstream`
/// refills from that send to `now` (see the module docs).
fn counted_before(cut: &Cut, left_j: u64, now: u64, upstream: Rate) -> bool {
    let Some(gained) = left_j.checked_sub(cut.left) else {
        return false;
    };
    let elapsed = u128::from(now.saturating_sub(cut.sent_at));
    // gained >= elapsed * count / period, without division; no overflow:
    // each factor is below 2^64.
    u128::from(gained) * upstream.period().as_nanos() >= elapsed * u128::from(upstream.count())
}

/// Keeps a cut that can gain no more proofs as its slack alone: the
/// smallest such slack.
fn settle(settled: &mut Option<u64>, slack: u64) {
    *settled = Some(settled.map_or(slack, |s| s.min(slack)));
}

impl Flights {
    /// Changes every slack, the waiting cuts' and the settled one, alike
    /// (units taken raise them all; units given back lower them all).
    fn each_slack(&mut self, change: impl Fn(u64) -> u64) {
        for cut in &mut self.cuts {
            cut.slack = change(cut.slack);
        }
        if let Some(s) = self.settled.as_mut() {
            *s = change(*s);
        }
    }

    /// Marks one request sent at `now`: its ticket.
    pub(crate) fn open(&mut self, now: u64) -> u64 {
        let ticket = self.next;
        self.next += 1;
        self.open.insert(ticket, now);
        ticket
    }

    /// When `ticket` was sent, if it is still in flight.
    pub(crate) fn sent_at(&self, ticket: u64) -> Option<u64> {
        self.open.get(&ticket).copied()
    }

    /// How many requests sent after `ticket` are still in flight.
    pub(crate) fn newer(&self, ticket: u64) -> u64 {
        let newer = self.open.range(ticket + 1..).count();
        u64::try_from(newer).unwrap_or(u64::MAX)
    }

    /// `ticket` is answered, or its call failed or was dropped: no longer
    /// in flight, and no cut waits for its proof.
    pub(crate) fn close(&mut self, ticket: u64) {
        self.open.remove(&ticket);
        self.forget(ticket);
    }

    /// Removes `ticket` from every cut's counted requests; a cut left with
    /// none keeps only its slack.
    fn forget(&mut self, ticket: u64) {
        for cut in &mut self.cuts {
            cut.counted.remove(&ticket);
        }
        self.settle_done();
    }

    fn settle_done(&mut self) {
        let settled = &mut self.settled;
        self.cuts.retain(|cut| {
            if cut.counted.is_empty() {
                settle(settled, cut.slack);
            }
            !cut.counted.is_empty()
        });
    }

    /// `ticket`'s response says `left` are left, read at `now`: the cuts it
    /// proves took it twice rise by one unit each. Returns the units to
    /// give back to the pace now (see the module docs). `upstream` is the
    /// upstream's announced pace; without one, nothing is proven.
    pub(crate) fn prove(
        &mut self,
        ticket: u64,
        left: u64,
        now: u64,
        upstream: Option<Rate>,
    ) -> u64 {
        for cut in &mut self.cuts {
            // Removed whether or not it proves anything: it is answered.
            if cut.counted.remove(&ticket)
                && upstream.is_some_and(|up| counted_before(cut, left, now, up))
            {
                cut.slack = cut.slack.saturating_add(1);
            }
        }
        self.settle_done();
        // While anything is owed there is a cut or a settled slack (`cut`
        // records one), so no room means nothing to give.
        let room = self.cuts.iter().map(|c| c.slack).chain(self.settled).min();
        let give = room.map_or(0, |room| room.min(self.owed));
        if give > 0 {
            self.owed -= give;
            // No slack is below `room`, so none goes below zero.
            self.each_slack(|s| s - give);
        }
        give
    }

    /// A response said `left` were left after the request `ticket`: the
    /// pace was lowered to `bound` whole units, from `held`, taking
    /// `taken`. Records the cut while anything is owed.
    pub(crate) fn cut(
        &mut self,
        ticket: Option<u64>,
        left: u64,
        bound: u64,
        held: u64,
        taken: u64,
    ) {
        if taken > 0 {
            self.owed = self.owed.saturating_add(taken);
            self.each_slack(|s| s.saturating_add(taken));
        }
        if self.owed == 0 {
            self.cuts.clear();
            self.settled = None;
            return;
        }
        let slack = bound.saturating_sub(held - taken);
        let sent_at = ticket.and_then(|t| self.sent_at(t));
        let counted: BTreeSet<u64> = match (ticket, sent_at) {
            (Some(t), Some(_)) => self.open.range(t + 1..).map(|(&t, _)| t).collect(),
            _ => BTreeSet::new(),
        };
        match sent_at {
            Some(sent_at) if !counted.is_empty() => self.cuts.push(Cut {
                left,
                sent_at,
                slack,
                counted,
            }),
            _ => settle(&mut self.settled, slack),
        }
        if self.cuts.len() > MAX_CUTS {
            let oldest = self.cuts.remove(0);
            settle(&mut self.settled, oldest.slack);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// The upstream: 50/s (one unit per 20 ms).
    fn upstream() -> Option<Rate> {
        Some(Rate::every(Duration::from_millis(20)))
    }

    const MS: u64 = 1_000_000;

    #[test]
    fn a_request_counted_before_the_cut_gives_its_unit_back() {
        // Sent 10 s into the clock: the refill counts from k's send.
        let at = 10_000 * MS;
        let mut f = Flights::default();
        let k = f.open(at);
        let j: Vec<u64> = (0..3).map(|_| f.open(at)).collect();
        assert_eq!(f.sent_at(k), Some(at));
        // k's response: 83 left, 3 newer in flight; the pace held 90 and
        // was cut to 83 - 1 - 3 = 79.
        assert_eq!(f.newer(k), 3);
        f.cut(Some(k), 83, 79, 90, 11);
        f.close(k);
        assert_eq!(f.sent_at(k), None, "answered");
        // j[0] says 85: counted before k (85 >= 83 + 1 ms of refill).
        assert_eq!(f.prove(j[0], 85, at + MS, upstream()), 1);
        f.close(j[0]);
        // j[1] says 82: counted after k; nothing.
        assert_eq!(f.prove(j[1], 82, at + MS, upstream()), 0);
        f.close(j[1]);
        // j[2] says 84, but 40 ms later: two units refilled since k's send
        // could explain it; nothing.
        assert_eq!(f.prove(j[2], 84, at + 40 * MS, upstream()), 0);
        f.close(j[2]);
        assert!(f.cuts.is_empty(), "every counted request answered");
    }

    #[test]
    fn nothing_is_proven_without_the_upstreams_pace_or_past_what_was_taken() {
        let mut f = Flights::default();
        let k = f.open(0);
        let j: Vec<u64> = (0..3).map(|_| f.open(0)).collect();
        f.cut(Some(k), 50, 46, 47, 1);
        assert_eq!(f.prove(j[0], 60, MS, None), 0, "no announced pace");
        // Two proofs, but the cut took one unit: one given back.
        assert_eq!(f.prove(j[1], 60, MS, upstream()), 1);
        assert_eq!(f.prove(j[2], 60, MS, upstream()), 0);
        assert_eq!(f.owed, 0);
    }

    #[test]
    fn a_later_cut_with_no_slack_holds_the_give_back() {
        let mut f = Flights::default();
        let k = f.open(0);
        let j = f.open(0);
        let m = f.open(0);
        let later = f.open(0);
        // k: cut from 20 to 10 (took 10), counting j, m and later.
        f.cut(Some(k), 14, 10, 20, 10);
        // m answered next, with a bound exactly at the pace: slack 0.
        f.cut(Some(m), 12, 10, 10, 0);
        // j proves k took it twice, but m's bound (0 slack) holds: nothing.
        assert_eq!(f.prove(j, 20, MS, upstream()), 0);
        // `later` proves m's cut counted it twice: m's slack is 1, k's is
        // 1 (j) + 1 (later): one unit back.
        assert_eq!(f.prove(later, 20, MS, upstream()), 1);
        assert_eq!(f.owed, 9);
    }

    #[test]
    fn a_settled_cut_limits_every_give_back_after_it() {
        let mut f = Flights::default();
        let k = f.open(0);
        let j: Vec<u64> = (0..3).map(|_| f.open(0)).collect();
        // k: cut from 12 to 10 (took 2), counting the three j.
        f.cut(Some(k), 14, 10, 12, 2);
        // A response about no request of ours: its bound is 1 above the pace.
        f.cut(None, 20, 11, 10, 0);
        assert_eq!(f.settled, Some(1));
        // Two proofs for k, but the settled bound leaves room for one unit.
        assert_eq!(f.prove(j[0], 20, MS, upstream()), 1);
        assert_eq!(f.settled, Some(0));
        assert_eq!(f.prove(j[1], 20, MS, upstream()), 0);
        assert_eq!(f.owed, 1);
        // An answer with nothing newer in flight can gain no proof: only
        // its slack is kept.
        let last = f.open(MS);
        f.cut(Some(last), 30, 12, 12, 0);
        assert_eq!(f.cuts.len(), 1, "only k's cut waits for proofs");
        assert_eq!(f.settled, Some(0));
    }

    #[test]
    fn nothing_owed_forgets_the_cuts_and_gone_requests_settle_them() {
        let mut f = Flights::default();
        let k = f.open(0);
        let j = f.open(0);
        f.cut(Some(k), 10, 8, 5, 0);
        assert!(f.cuts.is_empty() && f.settled.is_none(), "nothing owed");
        f.cut(Some(k), 10, 8, 9, 1);
        assert_eq!(f.cuts.len(), 1);
        f.close(j);
        assert!(f.cuts.is_empty());
        assert_eq!(f.settled, Some(0), "the cut's slack stays");
        // No request to prove anything: the unit stays taken.
        assert_eq!(f.prove(k, 100, MS, upstream()), 0);
        assert_eq!(f.owed, 1);
    }

    proptest::proptest! {
        /// Against a real upstream bucket (50/s-like: one unit per
        /// `interval`, burst `burst`), requests sent, counted and answered
        /// at any times: every proof is true. When `j`'s answer proves it
        /// was counted before `k`, the upstream did count it first.
        #[test]
        fn a_proof_is_never_wrong(
            burst in 1u64..30,
            interval_ms in 1u64..50,
            per_second in proptest::option::of(20u64..1000),
            reqs in proptest::collection::vec((0u64..100, 0u64..200, 0u64..100), 2..40),
        ) {
            use crate::clock::ManualClock;
            use crate::limiter::TokenBucket;
            // One unit per `interval` (an announced pace's form), or
            // `per_second` units per second (a count above one).
            let rate = match per_second {
                None => Rate::every(Duration::from_millis(interval_ms)),
                Some(n) => Rate::per_second(n),
            }
            .burst(burst);
            let upstream = TokenBucket::with_clock(rate, ManualClock::new()).unwrap();
            // (sent, counted, read) in ns, in the order sent.
            let mut sent = 0;
            let times: Vec<(u64, u64, u64)> = reqs
                .iter()
                .map(|&(gap, delay, read)| {
                    sent += gap * MS / 10;
                    let counted = sent + delay * MS / 10;
                    (sent, counted, counted + read * MS / 10)
                })
                .collect();
            let mut order: Vec<usize> = (0..times.len()).collect();
            order.sort_by_key(|&i| (times[i].1, i));
            // What each request's answer said was left, if it was admitted,
            // and its place in the upstream's counting order.
            let mut left = vec![None; times.len()];
            let mut place = vec![0; times.len()];
            for (n, &i) in order.iter().enumerate() {
                let d = upstream.check_at(times[i].1);
                place[i] = n;
                left[i] = d.is_allowed().then(|| d.remaining());
            }
            for k in 0..times.len() {
                for j in k + 1..times.len() {
                    let (Some(left_k), Some(left_j)) = (left[k], left[j]) else { continue };
                    let cut = Cut { left: left_k, sent_at: times[k].0, slack: 0, counted: BTreeSet::new() };
                    if counted_before(&cut, left_j, times[j].2, rate) {
                        proptest::prop_assert!(
                            place[j] < place[k],
                            "{j} (left {left_j}) proven before {k} (left {left_k})"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn at_most_max_cuts_wait_for_proofs() {
        let mut f = Flights::default();
        let tickets: Vec<u64> = (0..=MAX_CUTS as u64 + 1).map(|_| f.open(0)).collect();
        for &t in &tickets[..=MAX_CUTS] {
            f.cut(Some(t), 100, 10, 11, 1);
        }
        assert_eq!(f.cuts.len(), MAX_CUTS);
        assert_eq!(f.settled, Some(MAX_CUTS as u64), "the oldest cut's slack");
    }
}
