//! The check of a request in a layer with concurrency rules: its rate and
//! concurrency entries in one all-or-nothing set, and what an admitted
//! request's response takes with it (`concurrent.rs` holds the limits and
//! the permits).
//!
//! A request of a layer with concurrency rules takes this path
//! (`Shared::check_concurrent`, reached from the check's rarely taken
//! "extras" branch, so a rate-only layer runs none of it). Its rate entries
//! and its concurrency entries form one [`check_set`] set, rate entries
//! first: the permits are taken only once every rate rule allowed, and a
//! denial by a later concurrency rule gives back the permits taken before
//! it and the rate units (one clock reading, the engine's rollback). The
//! permits move into the response body (`ResponseBody`), which releases
//! them once, at the body's end, on a body error, or when it is dropped;
//! a request whose inner service fails or is cancelled before a response
//! releases them with its future.
//! What an adaptive rule learns is in `concurrent.rs`'s docs.
use super::compiled::{Entries, Entry, INLINE_RULES};
use super::concurrent::{Classes, ConcLimit, Held, Permit, Taken};
use super::engine::{After, LocalSet, RequestHead, Shared, Verdict};
use super::info::RateLimitInfo;
use super::response;
use super::stats::{self, bump};
use crate::clock::Clock;
use crate::concurrency::Priority;
use crate::decision::{Decision, Tracking};
use crate::error::InsufficientCapacity;
use crate::multi::{check_set, LimitSet};
use http::HeaderMap;
use smallvec::SmallVec;
use std::cell::RefCell;
use std::sync::Arc;

/// A request's rate entries (through [`LocalSet`]) followed by its
/// concurrency entries, as one all-or-nothing set. The permits taken so
/// far wait in `taken`, one slot per concurrency entry.
struct MixedSet<'a, C: Clock> {
    rate: LocalSet<'a, C>,
    /// The number of rate entries (the first limits of the set).
    rates: usize,
    /// The entry index of each concurrency entry.
    conc: &'a [u16],
    /// Each entry's request class.
    classes: &'a [Priority],
    taken: RefCell<SmallVec<[Option<Permit<C>>; 2]>>,
}

impl<C: Clock> MixedSet<'_, C> {
    fn entry(&self, j: usize) -> &Entry {
        &self.rate.entries[usize::from(self.conc[j])]
    }

    fn limit(&self, j: usize) -> Option<&ConcLimit<C>> {
        self.rate.rules[usize::from(self.entry(j).rule)]
            .conc
            .as_deref()
    }
}

impl<C: Clock> LimitSet<C> for MixedSet<'_, C> {
    fn len(&self) -> usize {
        self.rates + self.conc.len()
    }
    fn cost(&self, i: usize) -> u64 {
        match i.checked_sub(self.rates) {
            None => self.rate.cost(i),
            Some(j) => self.entry(j).cost,
        }
    }
    fn read_clock(&self) -> u64 {
        // Permits need no clock reading.
        if self.rates == 0 {
            0
        } else {
            self.rate.read_clock()
        }
    }
    fn take_at(&self, i: usize, now: u64, n: u64) -> Result<Decision, InsufficientCapacity> {
        let Some(j) = i.checked_sub(self.rates) else {
            return self.rate.take_at(i, now, n);
        };
        let Some(l) = self.limit(j) else {
            return Ok(Decision::allow(u64::MAX, u64::MAX, 0));
        };
        let at = usize::from(self.conc[j]);
        let (d, permit) = l.try_acquire_n(self.entry(j).key, n, self.classes[at])?;
        self.taken.borrow_mut()[j] = permit;
        Ok(d)
    }
    fn peek_at(&self, i: usize, now: u64, n: u64) -> Result<Decision, InsufficientCapacity> {
        match i.checked_sub(self.rates) {
            None => self.rate.peek_at(i, now, n),
            Some(j) => match self.limit(j) {
                Some(l) => l.peek(self.entry(j).key, n),
                None => Ok(Decision::allow(u64::MAX, u64::MAX, 0)),
            },
        }
    }
    fn give_back_at(&self, i: usize, now: u64, n: u64) {
        match i.checked_sub(self.rates) {
            None => self.rate.give_back_at(i, now, n),
            // Given back unused: no sample for an adaptive maximum.
            Some(j) => {
                if let Some(p) = self.taken.borrow_mut()[j].take() {
                    p.give_back();
                }
            }
        }
    }
    fn capacity(&self, i: usize) -> u64 {
        match i.checked_sub(self.rates) {
            None => self.rate.capacity(i),
            Some(j) => self.limit(j).map_or(u64::MAX, ConcLimit::max),
        }
    }
    fn decide(&mut self, i: usize, d: Option<Decision>) {
        match i.checked_sub(self.rates) {
            None => self.rate.decide(i, d),
            Some(j) => {
                let at = usize::from(self.conc[j]);
                self.rate.entries[at].decision = d;
            }
        }
    }
    fn decide_taken(&mut self, i: usize, d: Decision) {
        match i.checked_sub(self.rates) {
            None => self.rate.decide_taken(i, d),
            Some(j) => {
                let e = &mut self.rate.entries[usize::from(self.conc[j])];
                // A key admitted untracked (a full keyed table), counted.
                e.untracked = d.tracking() == Tracking::Untracked;
                e.decision = Some(d);
            }
        }
    }
}

impl<C: Clock + 'static> Shared<C> {
    /// Each entry's request class.
    pub(super) fn classes(&self, entries: &[Entry], headers: &HeaderMap) -> Classes {
        entries
            .iter()
            .map(|e| {
                self.rules[usize::from(e.rule)]
                    .conc
                    .as_ref()
                    .map_or(Priority::Normal, |c| c.class_of(headers))
            })
            .collect()
    }

    /// The check of a request in a layer with concurrency rules and no
    /// Redis rule matched (the module docs): the local rules all or
    /// nothing, then shadow rules, the extension, the headers and the
    /// permits.
    #[inline(never)]
    pub(super) fn check_concurrent(
        self: &Arc<Self>,
        mut entries: Entries,
        req: &RequestHead<'_>,
        insert: &mut Option<RateLimitInfo>,
    ) -> Verdict {
        let classes = self.classes(&entries, req.headers);
        let (checked, taken) = self.check_mixed(&mut entries, &classes);
        if !matches!(checked, Ok(true)) {
            let grpc = response::is_grpc(req.headers);
            return Verdict::Reject(self.refused(checked, &mut entries, grpc));
        }
        if entries.iter().any(|e| e.shadow) {
            self.check_shadow(&mut entries);
        }
        if self.decisions_extension {
            *insert = Some(RateLimitInfo::of(&self.names, &entries));
        }
        let mut after = self.after::<true>(&entries);
        self.hold(&mut after, taken.held());
        Verdict::Pass(after)
    }

    /// The local enforced entries, rate and concurrency, all or nothing
    /// ([`check_enforced`](Shared::check_enforced)'s contract, counted the
    /// same way; a shed request counted as shed), and the permits of an
    /// admitted request (none for another).
    pub(super) fn check_mixed(
        &self,
        entries: &mut [Entry],
        classes: &[Priority],
    ) -> (Result<bool, (u16, InsufficientCapacity)>, Taken<C>) {
        let kind = |e: &Entry| {
            let r = &self.rules[usize::from(e.rule)];
            match (e.shadow, r.conc.is_some(), r.local().is_some()) {
                (true, ..) | (false, false, false) => None,
                (false, conc, true) => Some(conc),
                // A Redis concurrency rule: on the Redis path, not here.
                (false, true, false) => None,
            }
        };
        let pick = |conc: bool| -> SmallVec<[u16; INLINE_RULES]> {
            (0..entries.len())
                .filter(|&i| kind(&entries[i]) == Some(conc))
                // Fits: at most one entry per rule, and at most u16::MAX rules.
                .map(|i| i as u16)
                .collect()
        };
        let (rate_map, conc_map) = (pick(false), pick(true));
        let mut set = MixedSet {
            rate: LocalSet {
                rules: &self.rules,
                entries,
                map: Some(&rate_map),
                unit_costs: false,
                keep: true,
            },
            rates: rate_map.len(),
            conc: &conc_map,
            classes,
            taken: RefCell::new(conc_map.iter().map(|_| None).collect()),
        };
        let checked = check_set(&mut set);
        let taken = set.taken.into_inner();
        if matches!(checked, Ok(false)) && self.any_count_refused {
            self.charge_refused(entries);
        }
        let allowed = match checked {
            Ok(allowed) => allowed,
            Err(e) => return (Err((self.culprit(entries, e.capacity), e)), Taken::none()),
        };
        // A rate rule that denied is the client's own limit: the request is
        // refused by it (429), and a concurrency rule's denial beside it (a
        // peek: the check stopped at the rate rule) sheds nothing.
        let rate_denied = !allowed
            && rate_map.iter().any(|&i| {
                entries[usize::from(i)]
                    .decision
                    .is_some_and(|d| !d.is_allowed())
            });
        for i in rate_map.iter().chain(&conc_map).map(|&i| usize::from(i)) {
            let e = &entries[i];
            let r = &self.rules[usize::from(e.rule)];
            if allowed {
                bump(&r.counters.allowed);
                if e.untracked {
                    bump(&r.counters.untracked);
                }
                #[cfg(feature = "metrics")]
                stats::observe(
                    &r.counters,
                    e.decision,
                    if r.conc.is_some() { None } else { r.local() },
                );
            } else if e.decision.is_some_and(|d| !d.is_allowed()) {
                if let Some(c) = r.conc.as_ref().filter(|c| c.sheds) {
                    if !rate_denied {
                        bump(&c.shed);
                    }
                } else {
                    stats::denied(&r.counters, e.key, false, e.decision);
                }
            }
        }
        let mut permits = Taken::none();
        if allowed {
            for (j, p) in taken.into_iter().enumerate() {
                let Some(p) = p else { continue };
                let rule = &self.rules[usize::from(entries[usize::from(conc_map[j])].rule)];
                match rule.conc.as_ref().is_some_and(|c| c.at_head) {
                    true => permits.head.push(p),
                    false => permits.body.push(p),
                }
            }
        }
        (Ok(allowed), permits)
    }

    /// Whether a concurrency rule shared by every client denied the
    /// request (it is shed with `503`, not refused with `429`). Out of
    /// line: the rate-only check inlines `reject`, which calls it.
    #[cold]
    #[inline(never)]
    pub(super) fn shed(&self, entries: &[Entry]) -> bool {
        let denied = |e: &&Entry| !e.shadow && e.decision.is_some_and(|d| !d.is_allowed());
        let sheds = |e: &Entry| {
            self.rules[usize::from(e.rule)]
                .conc
                .as_ref()
                .map(|c| c.sheds)
        };
        // Shed only when no rate rule refused the request: a client over its
        // own limit is told so (429), not to come back soon (503).
        entries
            .iter()
            .filter(denied)
            .any(|e| sheds(e) == Some(true))
            && !entries.iter().filter(denied).any(|e| sheds(e).is_none())
    }

    /// Puts an admitted request's permits where its response will take
    /// them.
    pub(super) fn hold(self: &Arc<Self>, after: &mut Option<After>, held: Option<Held>) {
        if let Some(held) = held {
            self.later_of(after).held = Some(held);
        }
    }

    /// The rule of the entry whose cost can never pass: its cost is above
    /// `capacity` (a concurrency rule's maximum now, or a policy's limit).
    fn culprit(&self, entries: &[Entry], capacity: u64) -> u16 {
        entries
            .iter()
            .filter(|e| !e.shadow)
            .find(|e| {
                let r = &self.rules[usize::from(e.rule)];
                let cap = r.conc.as_ref().map_or(r.rule.policy.limit(), |c| c.max());
                e.cost > cap || (r.conc.is_some() && e.cost > capacity)
            })
            .map_or(entries[0].rule, |e| e.rule)
    }
}
