//! All-or-nothing checks across several limits (per IP, per user, per
//! route, global): one clock read, no allocation, and a denial by any limit
//! gives back what the others took before the call returns.
//!
//! # Protocol
//!
//! 1. Read the clock once (the first limit's clock).
//! 2. Check the limits in order at that time, each with its own CAS. Remember
//!    which ones took something (a bit per limit, on the stack).
//! 3. On the first denial (or a cost some limit can never admit), refund
//!    the limits that took, at the same time, in reverse order; then peek
//!    the others so the decision reports the most restrictive limit.
//!
//! "As if it never came" holds for each limit up to the refund's precision:
//! a GCRA refund moves the arrival time back by exactly what was added, and
//! a window refund gives the units back to the window they were taken from.
//! Concurrent checks may see the capacity taken for the short time before
//! the refund (they may be denied in that time, never admitted beyond the
//! limit).

use crate::algo::Algorithm;
use crate::clock::Clock;
use crate::decision::{Decision, Tracking};
use crate::error::InsufficientCapacity;
use crate::limiter::Limiter;

/// One limit of a multi-limit check: a [`Limiter`], or a keyed limiter
/// with a key ([`KeyedRef`](crate::KeyedRef), from `with_key`). All limits of one check share
/// one clock type. Sealed; its methods are internal.
///
/// # Example
///
/// ```
/// use ratewall::{check_all, KeyedTokenBucket, Limit, Rate, TokenBucket};
///
/// let global = TokenBucket::new(Rate::per_second(10_000))?;
/// let per_user = KeyedTokenBucket::<u64>::builder(Rate::per_second(10)).build()?;
/// let limits: [&dyn Limit<_>; 2] = [&per_user.with_key(&42), &global];
/// assert!(check_all(&limits).is_allowed());
/// # Ok::<(), ratewall::ConfigError>(())
/// ```
///
/// `Limit` is a marker: what a check does with a limit (take, peek, give
/// back) is internal, so only [`check_all`], [`check_all_n`] and
/// [`check_each`] can run it, always with the rollback:
///
/// ```compile_fail
/// use ratewall::{Limit, Rate, TokenBucket};
/// let global = TokenBucket::new(Rate::per_second(10)).unwrap();
/// let limit: &dyn Limit<_> = &global;
/// let _ = limit.take_at(0, 1); // not callable from outside the crate
/// ```
pub trait Limit<C: Clock>: sealed::LimitCore<C> {}

impl<C: Clock, L: sealed::LimitCore<C> + ?Sized> Limit<C> for L {}

mod sealed {
    use crate::clock::Clock;
    use crate::decision::Decision;
    use crate::error::InsufficientCapacity;

    /// Proof that the caller is this crate: every method of [`LimitCore`]
    /// takes one, and only the crate can make one. Without it a user could
    /// call them through `&dyn Limit` (a trait object's supertrait methods
    /// need no import), and a `take` outside a check has no rollback.
    #[derive(Clone, Copy, Debug)]
    pub struct Token(());

    /// The one [`Token`].
    pub(crate) const TOKEN: Token = Token(());

    /// What a multi-limit check does with one limit. Public in a private
    /// module: nothing outside the crate can name or implement it, and its
    /// methods need a [`Token`]. The crate calls them through
    /// [`LimitCalls`](super::LimitCalls).
    pub trait LimitCore<C: Clock> {
        /// One reading of the limit's clock.
        fn core_read_clock(&self, _: Token) -> u64;
        /// Takes `n` at `now` if allowed.
        fn core_take(&self, _: Token, now: u64, n: u64) -> Result<Decision, InsufficientCapacity>;
        /// The decision `core_take` would return, without taking.
        fn core_peek(&self, _: Token, now: u64, n: u64) -> Result<Decision, InsufficientCapacity>;
        /// Gives back `n` that `core_take` at `now` took.
        fn core_give_back(&self, _: Token, now: u64, n: u64);
        /// The largest cost that can ever pass at once.
        fn core_capacity(&self, _: Token) -> u64;
        /// Starts loading the state a take will read (a prefetch that
        /// decides nothing), so that several limits' cache misses
        /// overlap. A no-op unless the limit has a table to load from.
        #[inline]
        fn core_touch(&self, _: Token) {}
    }
}
pub(crate) use sealed::{LimitCore, Token, TOKEN};

/// The crate's calls on a limit (any [`LimitCore`], `dyn Limit` included):
/// what the all-or-nothing engines and the limits built on others use.
pub(crate) trait LimitCalls<C: Clock>: LimitCore<C> {
    /// One reading of the limit's clock.
    #[inline]
    fn read_clock(&self) -> u64 {
        self.core_read_clock(TOKEN)
    }
    /// Takes `n` at `now` if allowed.
    #[inline]
    fn take_at(&self, now: u64, n: u64) -> Result<Decision, InsufficientCapacity> {
        self.core_take(TOKEN, now, n)
    }
    /// The decision `take_at` would return, without taking.
    #[inline]
    fn peek_at(&self, now: u64, n: u64) -> Result<Decision, InsufficientCapacity> {
        self.core_peek(TOKEN, now, n)
    }
    /// Gives back `n` that `take_at` at `now` took.
    #[inline]
    fn give_back_at(&self, now: u64, n: u64) {
        self.core_give_back(TOKEN, now, n);
    }
    /// The largest cost that can ever pass at once.
    #[inline]
    fn capacity(&self) -> u64 {
        self.core_capacity(TOKEN)
    }
    /// Starts loading what a take will read (see `LimitCore::core_touch`).
    #[inline]
    fn touch(&self) {
        self.core_touch(TOKEN)
    }
}

impl<C: Clock, L: LimitCore<C> + ?Sized> LimitCalls<C> for L {}

impl<A: Algorithm, C: Clock> LimitCore<C> for Limiter<A, C> {
    #[inline]
    fn core_read_clock(&self, _: Token) -> u64 {
        self.now()
    }
    #[inline]
    fn core_take(&self, _: Token, now: u64, n: u64) -> Result<Decision, InsufficientCapacity> {
        self.check_n_at(now, n)
    }
    fn core_peek(&self, _: Token, now: u64, n: u64) -> Result<Decision, InsufficientCapacity> {
        self.peek_n_at(now, n)
    }
    fn core_give_back(&self, _: Token, now: u64, n: u64) {
        self.refund_at(now, n);
    }
    fn core_capacity(&self, _: Token) -> u64 {
        Limiter::capacity(self)
    }
}

/// Checks one request of cost 1 against every limit, all or nothing: it is
/// taken from all of them, or from none. The decision is the most
/// restrictive one (denied if any denies; the lowest `remaining`; the
/// longest `retry_after`). One clock read (the first limit's clock) serves
/// the whole call. An empty list allows.
///
/// Limits past the 64th are refunded on a denial whenever they allowed
/// (the first 64 only if they tracked what they took).
///
/// # Example
///
/// ```
/// use ratewall::{check_all, KeyedTokenBucket, Limit, ManualClock, Rate, TokenBucket};
///
/// let clock = ManualClock::new();
/// let global = TokenBucket::with_clock(Rate::per_second(100), clock.clone())?;
/// let per_ip = KeyedTokenBucket::<u32, _>::builder(Rate::per_second(2).burst(2))
///     .clock(clock.clone())
///     .build()?;
/// for _ in 0..2 {
///     assert!(check_all(&[&per_ip.with_key(&1), &global]).is_allowed());
/// }
/// let denied = check_all(&[&per_ip.with_key(&1), &global]);
/// assert!(!denied.is_allowed());
/// assert_eq!(global.peek().remaining(), 97); // 2 taken; the denied one was given back
/// # Ok::<(), ratewall::ConfigError>(())
/// ```
pub fn check_all<C: Clock>(limits: &[&dyn Limit<C>]) -> Decision {
    match check_all_n(limits, 1) {
        Ok(d) => d,
        // Every limit's capacity is at least 1.
        Err(_) => Decision::deny(0, 0, u64::MAX, u64::MAX),
    }
}

/// [`check_all`] for a request of cost `n`. A cost that some limit can never
/// admit is an error, and nothing is taken.
///
/// ```
/// use ratewall::{check_all_n, Limit, Rate, TokenBucket};
///
/// let small = TokenBucket::new(Rate::per_hour(10).burst(5))?;
/// let large = TokenBucket::new(Rate::per_hour(100).burst(50))?;
/// let both: [&dyn Limit<_>; 2] = [&large, &small];
/// assert!(check_all_n(&both, 5).unwrap().is_allowed());
/// assert!(check_all_n(&both, 6).is_err());
/// assert_eq!(large.peek().remaining(), 44); // the error took nothing
/// # Ok::<(), ratewall::ConfigError>(())
/// ```
pub fn check_all_n<C: Clock>(
    limits: &[&dyn Limit<C>],
    n: u64,
) -> Result<Decision, InsufficientCapacity> {
    let mut set = AllLimits {
        limits,
        n,
        decision: Decision::allow(u64::MAX, u64::MAX, 0),
    };
    check_set(&mut set)?;
    Ok(set.decision)
}

/// [`check_all_n`]'s list as a [`LimitSet`]: one cost for every limit, and
/// one decision, the most restrictive of those [`check_set`] reports.
///
/// One plain `Decision`, not an `Option` per outcome: the engine reports in
/// a known order (limit 0 first when it allows; the denying limit first on
/// a denial), so the first report replaces and the others fold, with no
/// test and copy of an `Option` on each fold (see docs/benchmarks.md, "One
/// shape").
struct AllLimits<'a, C: Clock> {
    limits: &'a [&'a dyn Limit<C>],
    n: u64,
    /// Unlimited for an empty list; else the limits that allowed, so far;
    /// on a denial, the denying limit's decision folded with each other's
    /// after the rollback (a peek that fails is left out).
    decision: Decision,
}

impl<C: Clock> LimitSet<C> for AllLimits<'_, C> {
    #[inline]
    fn len(&self) -> usize {
        self.limits.len()
    }
    #[inline]
    fn cost(&self, _: usize) -> u64 {
        self.n
    }
    #[inline]
    fn read_clock(&self) -> u64 {
        self.limits[0].read_clock()
    }
    #[inline]
    fn take_at(&self, i: usize, now: u64, n: u64) -> Result<Decision, InsufficientCapacity> {
        self.limits[i].take_at(now, n)
    }
    fn peek_at(&self, i: usize, now: u64, n: u64) -> Result<Decision, InsufficientCapacity> {
        self.limits[i].peek_at(now, n)
    }
    fn give_back_at(&self, i: usize, now: u64, n: u64) {
        self.limits[i].give_back_at(now, n);
    }
    fn capacity(&self, i: usize) -> u64 {
        self.limits[i].capacity()
    }
    #[inline]
    fn touch(&self, i: usize) {
        self.limits[i].touch();
    }
    /// After [`decide_denied`](LimitSet::decide_denied): the most
    /// restrictive, the one seen first on a tie.
    #[inline]
    fn decide(&mut self, _: usize, d: Option<Decision>) {
        if let Some(d) = d {
            self.decision = self.decision.most_restrictive(d);
        }
    }
    /// Limit 0 reports first and replaces the unlimited start.
    #[inline]
    fn decide_taken(&mut self, i: usize, d: Decision) {
        self.decision = if i == 0 {
            d
        } else {
            self.decision.most_restrictive(d)
        };
    }
    /// Drops what the limits before it allowed: the report is the denial
    /// and the others as seen after the rollback.
    #[inline]
    fn decide_denied(&mut self, _: usize, d: Decision) {
        self.decision = d;
    }
    #[inline]
    fn max_cost(&self) -> u64 {
        self.n
    }
}

/// Every valid limit admits at least one unit at once (a burst, window
/// limit or quota of 0 is a `ConfigError`), so a cost up to this needs no
/// capacity read before the check: for a keyed limit that read hashes the
/// key and loads its parameters, a good part of a multi-limit check's cost.
/// (Were a capacity ever below it, `take_at` would report the error and
/// the check would roll back as for any other error.)
const MIN_CAPACITY: u64 = 1;

/// All-or-nothing like [`check_all_n`], with a cost per limit and a
/// decision per limit: what an HTTP layer needs to charge a route 5 units
/// and a user 1, and to send one `RateLimit` item per limit.
///
/// Every `(limit, cost)` is checked at one clock reading (the first
/// limit's). A cost of 0 takes nothing from its limit and reports the
/// decision a unit request would get. If every limit allows, each one's
/// decision is written to `decisions[i]` and the result is `Ok(true)`. If
/// one denies, what the others took is given back first; then `decisions[i]`
/// holds the denial, or for the others what they decide after the
/// rollback, and the result is `Ok(false)`. A cost that its limit can never
/// admit is an error, nothing is taken, and `decisions` is left as it was.
/// Only the first `decisions.len()` decisions are written.
///
/// No allocation: the rollback mask lives on the stack (limits past the 64th
/// are refunded whenever they allowed, as in [`check_all`]).
///
/// # Example
///
/// ```
/// use ratewall::{check_each, KeyedPolicyLimiter, ManualClock, Policy, Rate, Window};
///
/// let clock = ManualClock::new();
/// let per_user = KeyedPolicyLimiter::<u32, _>::builder(Policy::token_bucket(Rate::per_minute(100)))
///     .clock(clock.clone())
///     .build()?;
/// let reports = KeyedPolicyLimiter::<&str, _>::builder(Policy::fixed_window(Window::per_minute(10)))
///     .clock(clock)
///     .build()?;
/// let mut decisions = [None; 2];
/// assert!(check_each(&[(&per_user.with_key(&7), 1), (&reports.with_key("/report"), 5)], &mut decisions)?);
/// let remaining = decisions.map(|d| d.unwrap().remaining());
/// assert_eq!(remaining, [99, 5]);
/// // 6 more units for the report do not fit: nothing is taken from the user.
/// assert!(!check_each(&[(&per_user.with_key(&7), 1), (&reports.with_key("/report"), 6)], &mut decisions)?);
/// assert!(!decisions[1].unwrap().is_allowed());
/// assert_eq!(per_user.peek_key(&7).remaining(), 98);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn check_each<C: Clock>(
    limits: &[(&dyn Limit<C>, u64)],
    decisions: &mut [Option<Decision>],
) -> Result<bool, InsufficientCapacity> {
    check_set(&mut DynLimits { limits, decisions })
}

/// The limits of one all-or-nothing check, by index: what [`check_set`]
/// runs the protocol over. [`check_all_n`] and [`check_each`] are sets
/// over a `&dyn Limit` list; a caller with its own list (the HTTP layer's
/// matching rules) implements it to skip building that list and a
/// decisions array per check, and to dispatch statically.
pub(crate) trait LimitSet<C: Clock> {
    /// How many limits.
    fn len(&self) -> usize;
    /// What limit `i` is charged.
    fn cost(&self, i: usize) -> u64;
    /// The clock reading the whole check uses (the first limit's clock).
    fn read_clock(&self) -> u64;
    fn take_at(&self, i: usize, now: u64, n: u64) -> Result<Decision, InsufficientCapacity>;
    fn peek_at(&self, i: usize, now: u64, n: u64) -> Result<Decision, InsufficientCapacity>;
    fn give_back_at(&self, i: usize, now: u64, n: u64);
    fn capacity(&self, i: usize) -> u64;
    /// Starts loading what limit `i`'s take will read (a prefetch that
    /// decides nothing); a no-op by default.
    #[inline]
    fn touch(&self, i: usize) {
        let _ = i;
    }
    /// Whether [`check_set`] should `touch` every limit first: a set known
    /// to hold only tables that stay in the caches says no, and saves the
    /// loop.
    #[inline]
    fn prefetches(&self) -> bool {
        true
    }
    /// Limit `i`'s decision, as [`check_each`] writes `decisions[i]`.
    fn decide(&mut self, i: usize, d: Option<Decision>);
    /// Limit `i` took its cost and allowed: its decision, which a set
    /// that does not need it may keep only in part.
    #[inline]
    fn decide_taken(&mut self, i: usize, d: Decision) {
        self.decide(i, Some(d));
    }
    /// Limit `i` denied (after the rollback): its decision, reported
    /// before every other limit's peek.
    #[inline]
    fn decide_denied(&mut self, i: usize, d: Decision) {
        self.decide(i, Some(d));
    }
    /// An upper bound of every limit's cost, when the set knows one
    /// without looking: at most `MIN_CAPACITY` skips the capacity
    /// pre-check (a unit cost always fits).
    #[inline]
    fn max_cost(&self) -> u64 {
        u64::MAX
    }
}

/// [`check_each`]'s list as a [`LimitSet`].
struct DynLimits<'a, 'b, C: Clock> {
    limits: &'a [(&'a dyn Limit<C>, u64)],
    decisions: &'b mut [Option<Decision>],
}

impl<C: Clock> LimitSet<C> for DynLimits<'_, '_, C> {
    #[inline]
    fn len(&self) -> usize {
        self.limits.len()
    }
    #[inline]
    fn cost(&self, i: usize) -> u64 {
        self.limits[i].1
    }
    #[inline]
    fn read_clock(&self) -> u64 {
        self.limits[0].0.read_clock()
    }
    #[inline]
    fn take_at(&self, i: usize, now: u64, n: u64) -> Result<Decision, InsufficientCapacity> {
        self.limits[i].0.take_at(now, n)
    }
    fn peek_at(&self, i: usize, now: u64, n: u64) -> Result<Decision, InsufficientCapacity> {
        self.limits[i].0.peek_at(now, n)
    }
    fn give_back_at(&self, i: usize, now: u64, n: u64) {
        self.limits[i].0.give_back_at(now, n);
    }
    fn capacity(&self, i: usize) -> u64 {
        self.limits[i].0.capacity()
    }
    #[inline]
    fn touch(&self, i: usize) {
        self.limits[i].0.touch();
    }
    #[inline]
    fn decide(&mut self, i: usize, d: Option<Decision>) {
        if let Some(slot) = self.decisions.get_mut(i) {
            *slot = d;
        }
    }
}

/// The all-or-nothing protocol (see the module docs), over any
/// [`LimitSet`]: the one engine under [`check_all`], [`check_all_n`],
/// [`check_each`] and the HTTP layer. `Ok(true)` if every limit allowed;
/// `Ok(false)` after a denial and its rollback, with the denial reported
/// first through [`LimitSet::decide_denied`], then each other limit's peek.
#[inline]
pub(crate) fn check_set<C: Clock, S: LimitSet<C>>(
    set: &mut S,
) -> Result<bool, InsufficientCapacity> {
    let len = set.len();
    if len == 0 {
        return Ok(true);
    }
    // A cost some limit can never admit is an error, whatever the others
    // say, and nothing is taken: check every capacity first (a parameter
    // read each, no state touched; a unit cost always fits). A quota change
    // racing this call can still make `take_at` fail below; that path rolls
    // back too.
    for i in 0..if set.max_cost() <= MIN_CAPACITY {
        0
    } else {
        len
    } {
        let n = set.cost(i);
        if n <= MIN_CAPACITY {
            continue;
        }
        InsufficientCapacity::check(n, set.capacity(i))?;
    }
    // Several limits: start every limit's state load first, so that their
    // cache misses (keys in tables larger than the caches) overlap each
    // other and the clock read instead of following one another. One
    // limit's check already overlaps its own load with the clock read.
    if len > 1 && set.prefetches() {
        for i in 0..len {
            set.touch(i);
        }
    }
    let now = set.read_clock();
    let mut took: u64 = 0;
    for i in 0..len {
        let n = set.cost(i);
        let d = match set.take_at(i, now, n) {
            Ok(d) => d,
            Err(e) => {
                roll_back_set(set, i, took, now);
                return Err(e);
            }
        };
        if !d.is_allowed() {
            roll_back_set(set, i, took, now);
            // Report the denial first, then every other limit as seen
            // after the rollback (the most restrictive of them wins).
            set.decide_denied(i, d);
            for j in 0..len {
                if j != i {
                    match set.peek_at(j, now, set.cost(j)) {
                        Ok(p) => set.decide(j, Some(p)),
                        Err(_) => set.decide(j, None),
                    }
                }
            }
            return Ok(false);
        }
        set.decide_taken(i, d);
        if i < 64 && n > 0 && matches!(d.tracking(), Tracking::Tracked | Tracking::EvictedOther) {
            took |= 1 << i;
        }
    }
    Ok(true)
}

/// Gives back what the first `end` limits took, latest first, each its own
/// cost: the first 64 if their bit in `took` is set, the rest whenever they
/// were charged (their units are not in the mask; a no-op for an untracked
/// key, exact for everything else).
///
/// Inlined, not `#[cold]`: the call took the set's address, which keeps
/// the set in memory rather than in registers on every path of
/// [`check_set`]; inlined, the denied path is cheaper (docs/benchmarks.md).
#[inline]
fn roll_back_set<C: Clock, S: LimitSet<C>>(set: &S, end: usize, took: u64, now: u64) {
    for i in (0..end).rev() {
        let n = set.cost(i);
        let taken = if i < 64 { took & (1 << i) != 0 } else { n > 0 };
        if taken {
            set.give_back_at(i, now, n);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use std::cell::RefCell;

    /// A limit with a set answer that records every unit count it is given
    /// back: the rollback seen from inside, which the public limits cannot
    /// show (giving back to an untracked key or 0 units changes nothing).
    struct Scripted {
        answer: Decision,
        given_back: RefCell<Vec<u64>>,
    }

    impl Scripted {
        fn new(answer: Decision) -> Self {
            Self {
                answer,
                given_back: RefCell::new(Vec::new()),
            }
        }
        fn allows(tracking: Tracking) -> Self {
            Self::new(Decision::allow(10, 5, 0).with_tracking(tracking))
        }
        fn denies() -> Self {
            Self::new(Decision::deny(10, 0, 1, 1))
        }
        fn given_back(&self) -> Vec<u64> {
            self.given_back.borrow().clone()
        }
    }

    impl LimitCore<ManualClock> for Scripted {
        fn core_read_clock(&self, _: Token) -> u64 {
            0
        }
        fn core_take(&self, _: Token, _: u64, _: u64) -> Result<Decision, InsufficientCapacity> {
            Ok(self.answer)
        }
        fn core_peek(&self, _: Token, _: u64, _: u64) -> Result<Decision, InsufficientCapacity> {
            Ok(self.answer)
        }
        fn core_give_back(&self, _: Token, _: u64, n: u64) {
            self.given_back.borrow_mut().push(n);
        }
        fn core_capacity(&self, _: Token) -> u64 {
            u64::MAX
        }
    }

    /// Each limit of the first 64 is given back what it took only if it
    /// tracked it: not an untracked allow, not a cost of 0.
    #[test]
    fn the_rollback_gives_back_only_what_was_tracked() {
        let tracked = Scripted::allows(Tracking::Tracked);
        let evicted = Scripted::allows(Tracking::EvictedOther);
        let untracked = Scripted::allows(Tracking::Untracked);
        let denies = Scripted::denies();
        let limits: [&dyn Limit<ManualClock>; 4] = [&tracked, &untracked, &evicted, &denies];
        assert!(!check_all_n(&limits, 3).unwrap().is_allowed());
        assert_eq!(tracked.given_back(), [3]);
        assert_eq!(evicted.given_back(), [3]);
        assert_eq!(untracked.given_back(), Vec::<u64>::new());

        let free = Scripted::allows(Tracking::Tracked);
        let paid = Scripted::allows(Tracking::Tracked);
        let mut decisions = [None; 3];
        let each = [(&free as &dyn Limit<_>, 0), (&paid, 2), (&denies, 1)];
        assert!(!check_each(&each, &mut decisions).unwrap());
        assert_eq!(free.given_back(), Vec::<u64>::new());
        assert_eq!(paid.given_back(), [2]);
        assert!(check_all_n(&[&free as &dyn Limit<_>, &denies], 0).is_ok());
        assert_eq!(free.given_back(), Vec::<u64>::new());
    }

    /// Past the 64th limit there is no mask bit: a limit is given back its
    /// cost whenever it was charged one, and nothing for a cost of 0.
    #[test]
    fn past_64_limits_every_charged_limit_is_given_back_its_own_cost() {
        let allows: Vec<Scripted> = (0..70)
            .map(|_| Scripted::allows(Tracking::Tracked))
            .collect();
        let denies = Scripted::denies();
        let mut limits: Vec<&dyn Limit<ManualClock>> = allows.iter().map(|l| l as _).collect();
        limits.push(&denies);
        assert!(!check_all_n(&limits, 2).unwrap().is_allowed());
        assert!(allows.iter().all(|l| l.given_back() == [2]));

        let allows: Vec<Scripted> = (0..70)
            .map(|_| Scripted::allows(Tracking::Tracked))
            .collect();
        let mut each: Vec<(&dyn Limit<ManualClock>, u64)> = allows
            .iter()
            .enumerate()
            .map(|(i, l)| (l as _, (i % 2) as u64))
            .collect();
        each.push((&denies, 1));
        let mut decisions = vec![None; each.len()];
        assert!(!check_each(&each, &mut decisions).unwrap());
        for (i, l) in allows.iter().enumerate() {
            let expected: &[u64] = if i % 2 == 1 { &[1] } else { &[] };
            assert_eq!(l.given_back(), expected, "limit {i}");
        }
    }
}
