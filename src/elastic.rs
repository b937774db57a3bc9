//! Elastic limits: a per-key guarantee, a per-key ceiling, and a shared
//! pool of spare capacity.
//!
//! # Protocol (mirrored exactly by any backend)
//!
//! Three limits, all checked at one time `t` for a request of cost `n` by
//! key `k`:
//!
//! - `G[k]`, the **guarantee** (a keyed limit);
//! - `H[k]`, the **headroom**: the ceiling minus the guarantee (a keyed
//!   limit with the same algorithm and period; see [`ElasticLimiter`]);
//! - `P`, the shared **pool** (one limit for all keys).
//!
//! 1. Take `n` from `G[k]`. If it allows, the request passes: a normal
//!    decision of the guarantee.
//! 2. Otherwise take `n` from `H[k]`; if that denies, the request is denied.
//! 3. Otherwise take `n` from `P`; if that denies, give `n` back to `H[k]`
//!    (at `t`) and deny. If it allows, the request passes **above the
//!    limit** ([`Decision::is_above_limit`]).
//!
//! A denial writes nothing to `G[k]` (each step writes only on allow) and
//! leaves `H[k]` and `P` as before (the rollback), so it takes nothing
//! from either. A request is never split between the guarantee and the pool.
//!
//! # Guarantees
//!
//! - **Isolation.** `G[k]` sees every request of `k` and nothing else, and
//!   is written only by admissions through it: what key `k` gets through its
//!   guarantee is exactly what a standalone guarantee limiter would admit
//!   from `k`'s requests, whatever other keys do to the pool.
//! - **Total.** Every admission is taken from its key's guarantee or from
//!   the pool, so in any interval the total admitted is at most the sum of
//!   the guarantees' bounds over the keys in use plus the pool's bound. Per
//!   key, guarantee plus headroom is at most the ceiling's bound.
//! - **No over-draw.** The pool is one atomic limit: concurrent takes never
//!   exceed its bound; a denial's rollback gives back only what it took
//!   (loom model `loom-tests/tests/elastic.rs`).

use crate::clock::Clock;
use crate::decision::Decision;
use crate::error::{ConfigError, InsufficientCapacity};
use crate::keyed::builder::{table_setters, TableOptions};
use crate::keyed::family::{keyed_methods, Checked, KeyedCore, KeyedRefund};
use crate::keyed::KeyedPolicyLimiter;
use crate::keyed::KeyedRef;
use crate::limiter::DefaultClock;
use crate::policy::{Policy, PolicyAlgorithm};
use crate::quota::{Rate, Window};
use std::cell::Cell;
use std::fmt;
use std::hash::Hash;

/// A keyed limiter that guarantees each key a quota, lets it go up to a
/// ceiling while a shared pool has spare capacity, and takes from the pool
/// all or nothing.
///
/// - The **guarantee** and the **ceiling** are per-key [`Policy`]s with the
///   same algorithm and period (or window length); the ceiling is above the
///   guarantee in count (and burst). The part between them, the
///   *headroom*, is a per-key limit of `ceiling - guarantee` (for a bucket:
///   `count_c - count_g` per period, burst `burst_c - burst_g`), so a key's
///   total stays within the ceiling's bound.
/// - The **pool** is one [`Policy`] shared by all keys. Its quota can
///   follow a capacity signal (CPU, queue depth) at run time:
///   [`set_pool`](Self::set_pool).
///
/// None of the three may be soft. See the module docs (`docs/algorithms.md`,
/// "Elastic limits") for the protocol and its guarantees.
///
/// # Example
///
/// ```
/// use ratewall::{ElasticLimiter, ManualClock, Policy};
///
/// let clock = ManualClock::new();
/// let l = ElasticLimiter::<&str, _>::builder(
///     "100/min fixed-window".parse()?, // every user gets 100 a minute
///     "300/min fixed-window".parse()?, // and up to 300 while there is spare
///     "150/min fixed-window".parse()?, // spare capacity shared by everyone
/// )
/// .clock(clock)
/// .build()?;
/// let alice = (0..400).filter(|_| l.check_key("alice").is_allowed()).count();
/// assert_eq!(alice, 250); // 100 guaranteed + 150 from the pool
/// let bob = (0..400).filter(|_| l.check_key("bob").is_allowed()).count();
/// assert_eq!(bob, 100); // the pool is drained; bob's guarantee is intact
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Checks
///
/// `check_key` runs the protocol for a unit request (above: guaranteed,
/// then from the pool, then the ceiling); `check_key_n` for a cost `n`, an
/// error if neither the guarantee nor the headroom and pool together could
/// ever admit it; `check_key_n_at` at a time the caller read, one reading
/// for all three limits. `peek_key` and `peek_key_n` report what a check
/// would decide, taking nothing.
///
/// ```
/// # use ratewall::{ElasticLimiter, ManualClock};
/// let l = ElasticLimiter::<u8, _>::builder("1/h".parse()?, "2/h".parse()?, "1/h".parse()?)
///     .clock(ManualClock::new()).build()?;
/// let first = l.check_key(&1);
/// assert!(first.is_allowed() && !first.is_above_limit()); // guaranteed
/// let second = l.check_key(&1);
/// assert!(second.is_allowed() && second.is_above_limit()); // from the pool
/// assert_eq!((second.limit(), second.remaining()), (1, 0)); // nominal: the guarantee
/// assert!(!l.check_key(&1).is_allowed()); // ceiling reached
/// assert!(l.check_key(&2).is_allowed()); // key 2's guarantee
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
/// ```
/// # use ratewall::{ElasticLimiter, ManualClock};
/// let l = ElasticLimiter::<u8, _>::builder("5/h".parse()?, "10/h".parse()?, "100/h".parse()?)
///     .clock(ManualClock::new()).build()?;
/// assert!(l.check_key_n(&1, 5)?.is_allowed());
/// assert!(l.check_key_n(&1, 5)?.is_above_limit());
/// assert!(l.check_key_n(&1, 6).is_err()); // more than 5 at once never fits
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
/// ```
/// # use ratewall::{ElasticLimiter, ManualClock};
/// let l = ElasticLimiter::<u8, _>::builder("1/s".parse()?, "2/s".parse()?, "1/s".parse()?)
///     .clock(ManualClock::new()).build()?;
/// assert!(l.check_key_n_at(&1, 0, 1)?.is_allowed());
/// assert!(l.check_key_n_at(&1, 0, 1)?.is_above_limit());
/// assert!(!l.check_key_n_at(&1, 0, 1)?.is_allowed());
/// assert!(!l.check_key_n_at(&1, 1_000_000_000, 1)?.is_above_limit()); // refilled
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
/// ```
/// # use ratewall::{ElasticLimiter, ManualClock};
/// let l = ElasticLimiter::<u8, _>::builder("1/s".parse()?, "2/s".parse()?, "5/s".parse()?)
///     .clock(ManualClock::new()).build()?;
/// assert_eq!(l.now(), 0);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # In a multi-limit check
///
/// `with_key` makes one key a limit of [`check_all`](crate::check_all) or
/// [`check_each`](crate::check_each) (per IP + elastic per user, all or
/// nothing). The [`KeyedRef`](crate::KeyedRef) remembers which path its
/// last check took, so a rollback gives back exactly that: the guarantee,
/// or the headroom and the pool. Make one per call.
///
/// ```
/// use ratewall::{check_all, ElasticLimiter, KeyedPolicyLimiter, ManualClock};
///
/// let clock = ManualClock::new();
/// let per_ip = KeyedPolicyLimiter::<u32, _>::builder("2/h".parse()?).clock(clock.clone()).build()?;
/// let per_user = ElasticLimiter::<u32, _>::builder("1/h".parse()?, "5/h".parse()?, "1/h".parse()?)
///     .clock(clock)
///     .build()?;
/// assert!(check_all(&[&per_user.with_key(&7), &per_ip.with_key(&1)]).is_allowed());
/// let d = check_all(&[&per_user.with_key(&7), &per_ip.with_key(&1)]);
/// assert!(d.is_allowed() && d.is_above_limit()); // user 7 went to the pool
/// // User 8 twice (guarantee, then pool) and per-IP denies: both come back.
/// per_user.set_pool("2/h".parse()?)?;
/// let user_8 = (per_user.with_key(&8), per_user.with_key(&8));
/// assert!(!check_all(&[&user_8.0, &user_8.1, &per_ip.with_key(&1)]).is_allowed());
/// assert!(per_user.peek_pool().is_allowed()); // the pool's second unit is back
/// let d = per_user.check_key(&8);
/// assert!(d.is_allowed() && !d.is_above_limit()); // so is user 8's guarantee
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct ElasticLimiter<K, C: Clock = DefaultClock> {
    guarantee: KeyedPolicyLimiter<K, C>,
    headroom: KeyedPolicyLimiter<K, C>,
    pool: KeyedPolicyLimiter<(), C>,
    ceiling: Policy,
}

// The keyed method family (`family.rs`), from this type's core below.
keyed_methods!([K, C: Clock] ElasticLimiter<K, C>, K);

/// Configures an [`ElasticLimiter`]: the table knobs (`max_keys`, shards,
/// policy when full, seed) apply to the per-key limits, and the clock to all
/// three.
///
/// # Example
///
/// ```
/// use ratewall::{ElasticLimiter, ManualClock, Policy, Rate};
///
/// let l = ElasticLimiter::<u64, _>::builder(
///     Policy::token_bucket(Rate::per_second(10)),
///     Policy::token_bucket(Rate::per_second(50)),
///     Policy::token_bucket(Rate::per_second(200)),
/// )
/// .max_keys(10_000)
/// .clock(ManualClock::new())
/// .build()?;
/// assert!(l.check_key(&1).is_allowed());
/// # Ok::<(), ratewall::ConfigError>(())
/// ```
#[must_use = "a builder does nothing until `build`"]
pub struct ElasticBuilder<K, C: Clock = DefaultClock> {
    guarantee: Policy,
    ceiling: Policy,
    pool: Policy,
    table: TableOptions,
    clock: C,
    _key: std::marker::PhantomData<fn(&K)>,
}

/// The per-key headroom: `ceiling - guarantee`, same algorithm and period.
pub(crate) fn headroom(guarantee: &Policy, ceiling: &Policy) -> Result<Policy, ConfigError> {
    let bad = |reason| Err(ConfigError::Incompatible { reason });
    if guarantee.tolerance().is_some() || ceiling.tolerance().is_some() {
        return bad("an elastic limit's guarantee, ceiling and pool cannot be soft; drop `soft`");
    }
    if guarantee.algorithm() != ceiling.algorithm() {
        return bad("the ceiling must use the guarantee's algorithm");
    }
    match (
        guarantee.rate(),
        ceiling.rate(),
        guarantee.window(),
        ceiling.window(),
    ) {
        (Some(g), Some(c), ..) => {
            if g.period() != c.period() {
                return bad("write the ceiling with the guarantee's period (for example 300/min with 100/min)");
            }
            if c.count() <= g.count() || c.burst_size() <= g.burst_size() {
                return bad("the ceiling's count and burst must both be above the guarantee's");
            }
            let h =
                Rate::new(c.count() - g.count(), g.period()).burst(c.burst_size() - g.burst_size());
            Ok(match guarantee.algorithm() {
                PolicyAlgorithm::LeakyBucket => Policy::leaky_bucket(h),
                _ => Policy::token_bucket(h),
            })
        }
        (_, _, Some(g), Some(c)) => {
            if g.length() != c.length() {
                return bad("write the ceiling with the guarantee's window length (for example 300/min with 100/min)");
            }
            if c.limit() <= g.limit() {
                return bad("the ceiling's limit must be above the guarantee's");
            }
            let h = Window::new(c.limit() - g.limit(), g.length());
            Ok(match guarantee.algorithm() {
                PolicyAlgorithm::FixedWindow => Policy::fixed_window(h),
                PolicyAlgorithm::SlidingWindowCounter => Policy::sliding_window_counter(h),
                _ => Policy::sliding_window_log(h),
            })
        }
        _ => unreachable!("a policy has a rate or a window, as its algorithm says"),
    }
}

/// Validates an elastic limit's three policies (as [`ElasticBuilder::build`]
/// does, for every backend) and returns the per-key headroom.
pub(crate) fn validate(
    guarantee: &Policy,
    ceiling: &Policy,
    pool: &Policy,
) -> Result<Policy, ConfigError> {
    guarantee.validate()?;
    ceiling.validate()?;
    pool.validate()?;
    if pool.tolerance().is_some() {
        return Err(ConfigError::Incompatible {
            reason: "an elastic limit's guarantee, ceiling and pool cannot be soft; drop `soft`",
        });
    }
    headroom(guarantee, ceiling)
}

impl<K> ElasticLimiter<K, DefaultClock> {
    /// A builder for a guarantee, a ceiling and a pool.
    ///
    /// ```
    /// # use ratewall::{ElasticLimiter, Policy};
    /// let err = ElasticLimiter::<u8>::builder(
    ///     "100/min".parse()?, "50/min".parse()?, "1000/min".parse()?,
    /// ).build().unwrap_err();
    /// assert!(err.to_string().contains("above the guarantee"));
    /// # Ok::<(), ratewall::ParseError>(())
    /// ```
    pub fn builder(guarantee: Policy, ceiling: Policy, pool: Policy) -> ElasticBuilder<K> {
        ElasticBuilder {
            guarantee,
            ceiling,
            pool,
            table: TableOptions::new(),
            clock: DefaultClock::default(),
            _key: std::marker::PhantomData,
        }
    }
}

table_setters!([K, C: Clock] ElasticBuilder<K, C>);

impl<K, C: Clock> ElasticBuilder<K, C> {
    /// The clock of all three limits.
    ///
    /// ```
    /// # use ratewall::{ElasticLimiter, ManualClock, Policy};
    /// let l = ElasticLimiter::<u8, _>::builder("1/s".parse()?, "2/s".parse()?, "5/s".parse()?)
    ///     .clock(ManualClock::new()).build()?;
    /// assert_eq!(l.now(), 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn clock<C2: Clock>(self, clock: C2) -> ElasticBuilder<K, C2> {
        ElasticBuilder {
            guarantee: self.guarantee,
            ceiling: self.ceiling,
            pool: self.pool,
            table: self.table,
            clock,
            _key: std::marker::PhantomData,
        }
    }

    /// Validates the three policies and builds the limits.
    ///
    /// ```
    /// # use ratewall::{ElasticLimiter, Policy};
    /// let err = ElasticLimiter::<u8>::builder(
    ///     "10/s".parse()?, "20/min".parse()?, "5/s".parse()?,
    /// ).build().unwrap_err();
    /// assert!(err.to_string().contains("period"));
    /// # Ok::<(), ratewall::ParseError>(())
    /// ```
    pub fn build(self) -> Result<ElasticLimiter<K, C>, ConfigError>
    where
        C: Clone,
    {
        let headroom = validate(&self.guarantee, &self.ceiling, &self.pool)?;
        let keyed = |policy: Policy| {
            KeyedPolicyLimiter::<K>::builder(policy)
                .table(self.table)
                .clock(self.clock.clone())
                .build()
        };
        let guarantee = keyed(self.guarantee)?;
        let headroom = keyed(headroom)?;
        let pool = KeyedPolicyLimiter::<()>::builder(self.pool)
            .max_keys(1)
            .shards(1)
            .seed(0)
            .clock(self.clock.clone())
            .build()?;
        Ok(ElasticLimiter {
            guarantee,
            headroom,
            pool,
            ceiling: self.ceiling,
        })
    }
}

impl<K, C: Clock> ElasticLimiter<K, C> {
    /// Changes the pool's quota at run time (same algorithm), keeping what
    /// is in use: how the pool follows a capacity signal.
    ///
    /// ```
    /// # use ratewall::{ElasticLimiter, ManualClock, Policy};
    /// let l = ElasticLimiter::<u8, _>::builder("1/h".parse()?, "9/h".parse()?, "1/h".parse()?)
    ///     .clock(ManualClock::new()).build()?;
    /// let _ = (l.check_key(&1), l.check_key(&1)); // guarantee, then the pool's only unit
    /// assert!(!l.check_key(&1).is_allowed());
    /// l.set_pool("4/h".parse()?)?; // the system has spare capacity again
    /// assert!(l.check_key(&1).is_above_limit());
    /// assert_eq!(l.pool(), "4/h".parse()?);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn set_pool(&self, pool: Policy) -> Result<(), ConfigError> {
        self.pool.set_quota(pool)
    }

    /// The pool's policy in force.
    ///
    /// ```
    /// # use ratewall::{ElasticLimiter, Policy};
    /// let l = ElasticLimiter::<u8>::builder("1/s".parse()?, "2/s".parse()?, "5/s".parse()?).build()?;
    /// assert_eq!(l.pool().to_string(), "5/s");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn pool(&self) -> Policy {
        self.pool.policy()
    }

    /// The per-key guarantee.
    ///
    /// ```
    /// # use ratewall::{ElasticLimiter, Policy};
    /// let l = ElasticLimiter::<u8>::builder("1/s".parse()?, "2/s".parse()?, "5/s".parse()?).build()?;
    /// assert_eq!(l.guarantee().to_string(), "1/s");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn guarantee(&self) -> Policy {
        self.guarantee.policy()
    }

    /// The per-key ceiling.
    ///
    /// ```
    /// # use ratewall::{ElasticLimiter, Policy};
    /// let l = ElasticLimiter::<u8>::builder("1/s".parse()?, "2/s".parse()?, "5/s".parse()?).build()?;
    /// assert_eq!(l.ceiling().to_string(), "2/s");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn ceiling(&self) -> Policy {
        self.ceiling
    }

    /// The decision a unit request from the pool would get now, without
    /// taking it (what is left of the spare capacity).
    ///
    /// ```
    /// # use ratewall::{ElasticLimiter, ManualClock};
    /// let l = ElasticLimiter::<u8, _>::builder("1/h".parse()?, "9/h".parse()?, "3/h".parse()?)
    ///     .clock(ManualClock::new()).build()?;
    /// let _ = (l.check_key(&1), l.check_key(&1));
    /// assert_eq!(l.peek_pool().remaining(), 1); // 2 of 3 left, 1 after a peeked unit
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn peek_pool(&self) -> Decision {
        self.pool.peek_key(&())
    }
}

/// What an elastic check took, for its rollback ([`KeyedRef`](crate::KeyedRef)'s memo).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Took {
    /// Nothing (a denial, or no check yet).
    #[default]
    Nothing,
    /// The key's guarantee.
    Guarantee,
    /// The key's headroom and the pool.
    Pool,
}

impl<K, C: Clock> ElasticLimiter<K, C> {
    /// The protocol's check (see the module docs) of cost `n` at `now`.
    fn check_at<Q: Hash + ?Sized>(&self, key: &Q, now: u64, n: u64) -> Checked {
        let g = KeyedRef::new(&self.guarantee, key);
        let h = KeyedRef::new(&self.headroom, key);
        let p = KeyedRef::new(&self.pool, &());
        let g_cap = g.capacity();
        let extra_cap = h.capacity().min(p.capacity());
        InsufficientCapacity::check(n, g_cap.max(extra_cap))?;
        // 1. The guarantee (writes only if it allows).
        let gd = if n <= g_cap {
            let d = g.take_at(now, n)?;
            if d.is_allowed() {
                return Ok(d);
            }
            d
        } else {
            g.peek_at(now, 1)?
        };
        let g_retry = if n <= g_cap {
            gd.retry_after_ns
        } else {
            u64::MAX
        };
        let denied = |extra_retry: u64, reset: u64| {
            Decision::deny(
                gd.limit(),
                gd.remaining(),
                g_retry.min(extra_retry),
                gd.reset_after_ns.max(reset),
            )
            .with_tracking(gd.tracking())
        };
        if n > extra_cap {
            return Ok(denied(u64::MAX, 0));
        }
        // 2. The key's headroom.
        let hd = h.take_at(now, n)?;
        if !hd.is_allowed() {
            // A pool that shrank below `n` meanwhile never admits it.
            let pool_retry = p.peek_at(now, n).map_or(u64::MAX, |pd| pd.retry_after_ns);
            return Ok(denied(hd.retry_after_ns.max(pool_retry), hd.reset_after_ns));
        }
        // 3. The pool; on a denial, give back what the headroom took.
        match p.take_at(now, n) {
            Ok(pd) if pd.is_allowed() => {}
            Ok(pd) => {
                h.give_back_at(now, n);
                return Ok(denied(pd.retry_after_ns, gd.reset_after_ns));
            }
            // The pool shrank below `n` since the capacity check (a racing
            // `set_pool`): nothing may stay taken.
            Err(e) => {
                h.give_back_at(now, n);
                return if n <= g_cap {
                    Ok(denied(u64::MAX, gd.reset_after_ns))
                } else {
                    Err(e)
                };
            }
        }
        Ok(Decision::allow(
            gd.limit(),
            gd.remaining(),
            gd.reset_after_ns.max(hd.reset_after_ns),
        )
        .with_tracking(hd.tracking())
        .with_above_limit(true))
    }

    /// The decision [`check_at`](Self::check_at) would return, taking nothing.
    fn peek_at<Q: Hash + ?Sized>(&self, key: &Q, now: u64, n: u64) -> Checked {
        let g = KeyedRef::new(&self.guarantee, key);
        if n <= g.capacity() {
            let d = g.peek_at(now, n)?;
            if d.is_allowed() {
                return Ok(d);
            }
        }
        let h = KeyedRef::new(&self.headroom, key).peek_at(now, n);
        let p = KeyedRef::new(&self.pool, &()).peek_at(now, n);
        let gd = g.peek_at(now, n.min(g.capacity()))?;
        Ok(match (h, p) {
            (Ok(h), Ok(p)) if h.is_allowed() && p.is_allowed() => {
                Decision::allow(gd.limit(), gd.remaining(), gd.reset_after_ns)
                    .with_above_limit(true)
            }
            (h, p) => {
                let wait = |d: Result<Decision, InsufficientCapacity>| {
                    d.map_or(u64::MAX, |d| d.retry_after_ns)
                };
                let g_retry = if n <= g.capacity() {
                    gd.retry_after_ns
                } else {
                    u64::MAX
                };
                Decision::deny(
                    gd.limit(),
                    gd.remaining(),
                    g_retry.min(wait(h).max(wait(p))),
                    gd.reset_after_ns,
                )
            }
        })
    }
}

impl<K, C: Clock> KeyedCore for ElasticLimiter<K, C> {
    type Key = K;
    type Clock = C;
    type Memo = Cell<Took>;

    fn key_now(&self) -> u64 {
        self.guarantee.now()
    }

    fn key_clock(&self) -> &C {
        self.guarantee.clock()
    }

    fn key_run<Q: Hash + ?Sized>(&self, key: &Q, now: Option<u64>, n: u64, take: bool) -> Checked {
        let now = now.unwrap_or_else(|| self.guarantee.now());
        if take {
            self.check_at(key, now, n)
        } else {
            self.peek_at(key, now, n)
        }
    }

    fn key_capacity<Q: Hash + ?Sized>(&self, key: &Q) -> u64 {
        let extra = self
            .headroom
            .key_capacity(key)
            .min(self.pool.key_capacity(&()));
        self.guarantee.key_capacity(key).max(extra)
    }

    fn key_take<Q: Hash + ?Sized>(&self, key: &Q, now: u64, n: u64, took: &Cell<Took>) -> Checked {
        let d = self.check_at(key, now, n)?;
        took.set(match (d.is_allowed(), d.is_above_limit()) {
            (true, false) => Took::Guarantee,
            (true, true) => Took::Pool,
            _ => Took::Nothing,
        });
        Ok(d)
    }

    fn key_give_back<Q: Hash + ?Sized>(&self, key: &Q, now: u64, n: u64, took: &Cell<Took>) {
        match took.replace(Took::Nothing) {
            Took::Guarantee => self.guarantee.key_refund(key, now, n),
            Took::Pool => {
                self.headroom.key_refund(key, now, n);
                self.pool.key_refund(&(), now, n);
            }
            Took::Nothing => {}
        }
    }
}

impl<K, C: Clock> fmt::Debug for ElasticLimiter<K, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ElasticLimiter")
            .field("guarantee", &self.guarantee.policy())
            .field("ceiling", &self.ceiling)
            .field("pool", &self.pool.policy())
            .finish()
    }
}

impl<K, C: Clock> fmt::Debug for ElasticBuilder<K, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ElasticBuilder")
            .field("guarantee", &self.guarantee)
            .field("ceiling", &self.ceiling)
            .field("pool", &self.pool)
            .field("table", &self.table)
            .field("clock", &self.clock)
            .finish()
    }
}

#[cfg(all(test, not(ratewall_loom)))]
mod tests {
    use super::*;

    fn p(s: &str) -> Policy {
        s.parse().unwrap()
    }

    #[test]
    fn headroom_is_the_ceiling_minus_the_guarantee() {
        assert_eq!(
            headroom(&p("100/min"), &p("300/min")),
            Ok(p("200/min burst 200"))
        );
        assert_eq!(
            headroom(&p("10/s leaky queue 5"), &p("30/s leaky queue 8")),
            Ok(p("20/s leaky queue 3"))
        );
        assert_eq!(
            headroom(&p("1/h sliding-log"), &p("4/h sliding-log")),
            Ok(p("3/h sliding-log"))
        );
        assert_eq!(
            headroom(&p("1/h sliding-window"), &p("4/h sliding-window")),
            Ok(p("3/h sliding-window"))
        );
        for (g, c, word) in [
            ("1/s", "2/min", "period"),
            ("1/s fixed-window", "2/min fixed-window", "window length"),
            ("1/s", "2/s fixed-window", "algorithm"),
            ("2/s", "2/s", "above"),
            ("2/s burst 5", "3/s burst 5", "burst"),
            ("2/s fixed-window", "2/s fixed-window", "above"),
            ("1/s soft 1", "2/s", "soft"),
        ] {
            let e = headroom(&p(g), &p(c)).unwrap_err();
            assert!(e.to_string().contains(word), "{g} / {c}: {e}");
        }
    }
}
