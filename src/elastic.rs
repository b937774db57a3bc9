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
use crate::limiter::DefaultClock;
use crate::multi::{LimitCalls, LimitCore, Token};
use crate::policy::{KeyedPolicyLimiter, Policy};
use crate::quota::{Rate, Window};
use std::borrow::Borrow;
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
pub struct ElasticLimiter<K, C: Clock = DefaultClock> {
    guarantee: KeyedPolicyLimiter<K, C>,
    headroom: KeyedPolicyLimiter<K, C>,
    pool: KeyedPolicyLimiter<(), C>,
    ceiling: Policy,
}

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
    max_keys: Option<usize>,
    shards: Option<usize>,
    when_full: Option<crate::WhenFull>,
    seed: Option<u64>,
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
                crate::PolicyAlgorithm::LeakyBucket => Policy::leaky_bucket(h),
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
                crate::PolicyAlgorithm::FixedWindow => Policy::fixed_window(h),
                crate::PolicyAlgorithm::SlidingWindowCounter => Policy::sliding_window_counter(h),
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
            max_keys: None,
            shards: None,
            when_full: None,
            seed: None,
            clock: DefaultClock::default(),
            _key: std::marker::PhantomData,
        }
    }
}

impl<K, C: Clock> ElasticBuilder<K, C> {
    /// The most keys tracked at once by each per-key limit.
    ///
    /// ```
    /// # use ratewall::{ElasticLimiter, Policy};
    /// let b = ElasticLimiter::<u8>::builder("1/s".parse()?, "2/s".parse()?, "5/s".parse()?);
    /// assert!(b.max_keys(16).build().is_ok());
    /// # Ok::<(), ratewall::ParseError>(())
    /// ```
    pub fn max_keys(mut self, max_keys: usize) -> Self {
        self.max_keys = Some(max_keys);
        self
    }

    /// The shard count of each per-key table (a power of two).
    ///
    /// ```
    /// # use ratewall::{ElasticLimiter, Policy};
    /// let b = ElasticLimiter::<u8>::builder("1/s".parse()?, "2/s".parse()?, "5/s".parse()?);
    /// assert!(b.shards(3).build().is_err());
    /// # Ok::<(), ratewall::ParseError>(())
    /// ```
    pub fn shards(mut self, shards: usize) -> Self {
        self.shards = Some(shards);
        self
    }

    /// What the per-key tables do with a new key when full of active keys.
    ///
    /// ```
    /// # use ratewall::{ElasticLimiter, Policy, WhenFull};
    /// let b = ElasticLimiter::<u8>::builder("1/s".parse()?, "2/s".parse()?, "5/s".parse()?);
    /// assert!(b.when_full(WhenFull::EvictLeastRecent).build().is_ok());
    /// # Ok::<(), ratewall::ParseError>(())
    /// ```
    pub fn when_full(mut self, policy: crate::WhenFull) -> Self {
        self.when_full = Some(policy);
        self
    }

    /// A fixed hash seed for the per-key tables (reproducible tests).
    ///
    /// ```
    /// # use ratewall::{ElasticLimiter, Policy};
    /// let b = ElasticLimiter::<u8>::builder("1/s".parse()?, "2/s".parse()?, "5/s".parse()?);
    /// assert!(b.seed(7).build().is_ok());
    /// # Ok::<(), ratewall::ParseError>(())
    /// ```
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

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
            max_keys: self.max_keys,
            shards: self.shards,
            when_full: self.when_full,
            seed: self.seed,
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
            let mut b = KeyedPolicyLimiter::<K>::builder(policy);
            if let Some(m) = self.max_keys {
                b = b.max_keys(m);
            }
            if let Some(s) = self.shards {
                b = b.shards(s);
            }
            if let Some(w) = self.when_full {
                b = b.when_full(w);
            }
            if let Some(s) = self.seed {
                b = b.seed(s);
            }
            b.clock(self.clock.clone()).build()
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
    /// Checks one request of cost 1 for `key` (see the protocol above).
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
    pub fn check_key<Q>(&self, key: &Q) -> Decision
    where
        K: Borrow<Q>,
        Q: Hash + ?Sized,
    {
        match self.check_key_n(key, 1) {
            Ok(d) => d,
            // Every part admits at least one unit (validated at build).
            Err(_) => unreachable!("a cost of 1 always fits"),
        }
    }

    /// Checks a request of cost `n` for `key`. A cost that neither the
    /// guarantee nor the headroom and pool together could ever admit is an
    /// error, and nothing is taken.
    ///
    /// ```
    /// # use ratewall::{ElasticLimiter, ManualClock};
    /// let l = ElasticLimiter::<u8, _>::builder("5/h".parse()?, "10/h".parse()?, "100/h".parse()?)
    ///     .clock(ManualClock::new()).build()?;
    /// assert!(l.check_key_n(&1, 5)?.is_allowed());
    /// assert!(l.check_key_n(&1, 5)?.is_above_limit());
    /// assert!(l.check_key_n(&1, 6).is_err()); // more than 5 at once never fits
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn check_key_n<Q>(&self, key: &Q, n: u64) -> Result<Decision, InsufficientCapacity>
    where
        K: Borrow<Q>,
        Q: Hash + ?Sized,
    {
        self.check_key_n_at(key, self.guarantee.now(), n)
    }

    /// [`check_key_n`](Self::check_key_n) at the time `now` (nanoseconds
    /// on this limiter's clock): one reading serves all three limits.
    ///
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
    pub fn check_key_n_at<Q>(
        &self,
        key: &Q,
        now: u64,
        n: u64,
    ) -> Result<Decision, InsufficientCapacity>
    where
        K: Borrow<Q>,
        Q: Hash + ?Sized,
    {
        let g = self.guarantee.with_key(key);
        let h = self.headroom.with_key(key);
        let p = self.pool.with_key(&());
        let g_cap = g.capacity();
        let extra_cap = h.capacity().min(p.capacity());
        if n > g_cap.max(extra_cap) {
            return Err(InsufficientCapacity {
                requested: n,
                capacity: g_cap.max(extra_cap),
            });
        }
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

    /// The current time on this limiter's clock, in nanoseconds.
    ///
    /// ```
    /// # use ratewall::{ElasticLimiter, ManualClock};
    /// let l = ElasticLimiter::<u8, _>::builder("1/s".parse()?, "2/s".parse()?, "5/s".parse()?)
    ///     .clock(ManualClock::new()).build()?;
    /// assert_eq!(l.now(), 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn now(&self) -> u64 {
        self.guarantee.now()
    }
}

impl<K, C: Clock> ElasticLimiter<K, C> {
    /// This limiter with one key, as one limit of a multi-limit
    /// [`check_all`](crate::check_all) or [`check_each`](crate::check_each)
    /// (per IP + elastic per user, all or nothing). The reference remembers
    /// which path its last check took, so a rollback gives back exactly
    /// that: the guarantee, or the headroom and the pool. Make one per call.
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
    pub fn with_key<'a, Q>(&'a self, key: &'a Q) -> ElasticRef<'a, K, Q, C>
    where
        K: Borrow<Q>,
        Q: Hash + ?Sized,
    {
        ElasticRef {
            limiter: self,
            key,
            took: Cell::new(Took::Nothing),
        }
    }
}

/// What an [`ElasticRef`]'s last check took.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Took {
    Nothing,
    Guarantee,
    Pool,
}

/// One key of an [`ElasticLimiter`], as one limit of a multi-limit check.
/// Made by [`ElasticLimiter::with_key`]; not shared between threads.
///
/// # Example
///
/// ```
/// use ratewall::{check_each, ElasticLimiter};
/// let l = ElasticLimiter::<u32>::builder("1/h".parse()?, "2/h".parse()?, "1/h".parse()?).build()?;
/// let user = l.with_key(&7);
/// println!("{user:?}");
/// let mut d = [None];
/// assert!(check_each(&[(&user, 1)], &mut d)?);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct ElasticRef<'a, K, Q: ?Sized, C: Clock> {
    limiter: &'a ElasticLimiter<K, C>,
    key: &'a Q,
    took: Cell<Took>,
}

impl<K, Q: ?Sized + fmt::Debug, C: Clock> fmt::Debug for ElasticRef<'_, K, Q, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ElasticRef")
            .field("limiter", self.limiter)
            .field("key", &self.key)
            .field("took", &self.took.get())
            .finish()
    }
}

impl<K, Q, C> LimitCore<C> for ElasticRef<'_, K, Q, C>
where
    K: Borrow<Q>,
    Q: Hash + ?Sized,
    C: Clock,
{
    fn core_read_clock(&self, _: Token) -> u64 {
        self.limiter.now()
    }
    fn core_take(&self, _: Token, now: u64, n: u64) -> Result<Decision, InsufficientCapacity> {
        let d = self.limiter.check_key_n_at(self.key, now, n)?;
        self.took.set(match (d.is_allowed(), d.is_above_limit()) {
            (true, false) => Took::Guarantee,
            (true, true) => Took::Pool,
            _ => Took::Nothing,
        });
        Ok(d)
    }
    fn core_peek(&self, _: Token, now: u64, n: u64) -> Result<Decision, InsufficientCapacity> {
        let l = self.limiter;
        let g = l.guarantee.with_key(self.key);
        if n <= g.capacity() {
            let d = g.peek_at(now, n)?;
            if d.is_allowed() {
                return Ok(d);
            }
        }
        let h = l.headroom.with_key(self.key).peek_at(now, n);
        let p = l.pool.with_key(&()).peek_at(now, n);
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
    fn core_give_back(&self, _: Token, now: u64, n: u64) {
        let l = self.limiter;
        match self.took.replace(Took::Nothing) {
            Took::Guarantee => l.guarantee.refund_key_at(self.key, now, n),
            Took::Pool => {
                l.headroom.refund_key_at(self.key, now, n);
                l.pool.refund_key_at(&(), now, n);
            }
            Took::Nothing => {}
        }
    }
    fn core_capacity(&self, _: Token) -> u64 {
        let l = self.limiter;
        let extra = l
            .headroom
            .with_key(self.key)
            .capacity()
            .min(l.pool.with_key(&()).capacity());
        l.guarantee.with_key(self.key).capacity().max(extra)
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
            .field("max_keys", &self.max_keys)
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
