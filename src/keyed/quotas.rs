//! Quotas: the limiter's quota and its run-time change, and per-key
//! quotas (premium tiers, kept in `overrides.rs`). A check finds its key's
//! parameters here (`params_for`); while no override exists that is one
//! relaxed load of a counter and the limiter's seqlock.

use super::limiter::KeyedLimiter;
use super::KeyedAlgorithm;
use crate::algo::WordStep;
use crate::clock::Clock;
use crate::error::ConfigError;
use crate::sync::lock;
use std::borrow::Borrow;
use std::hash::Hash;

impl<K, A: KeyedAlgorithm, C: Clock> KeyedLimiter<K, A, C> {
    /// The largest cost `key` can ever be admitted at once (its own quota's
    /// if it has one): what a multi-limit check validates before taking.
    pub(crate) fn capacity_for<Q: Hash + ?Sized>(&self, key: &Q) -> u64 {
        WordStep::capacity(&self.params_for(self.hash(key)))
    }

    /// Quota changes need a table without hot keys: a lease's units are
    /// counted in the emission interval of its take.
    fn no_hot_keys(&self) -> Result<(), ConfigError> {
        match self.hot {
            Some(_) => Err(ConfigError::Incompatible {
                reason: "quota changes are not supported on a keyed table with hot keys; build it without `hot_keys`",
            }),
            None => Ok(()),
        }
    }

    /// The parameters for the key with hash `h`. Called inside the step,
    /// after the slot load (see `ParamCell`).
    #[inline]
    pub(super) fn params_for(&self, h: u64) -> A {
        if self.overrides.any() {
            if let Some(a) = self.overrides.get(h) {
                return a;
            }
        }
        self.params.read_in_registers()
    }

    /// Changes the quota of every key at run time, keeping each key's usage
    /// (rescaled as [`Limiter::set_quota`](crate::Limiter::set_quota) does).
    /// Keys with their own quota ([`set_key_quota`](Self::set_key_quota))
    /// keep it.
    ///
    /// Cost: one pass over the table (about a millisecond per 100,000 slots);
    /// new keys' inserts wait for it, and checks wait while the parameters
    /// change. A check that races with the pass is decided under the old
    /// quota or the new one, never a mix.
    ///
    /// ```
    /// # use ratewall::{KeyedTokenBucket, ManualClock, Rate};
    /// let l = KeyedTokenBucket::<u64, _>::builder(Rate::per_second(10).burst(10))
    ///     .clock(ManualClock::new())
    ///     .build()
    ///     .unwrap();
    /// let _ = l.check_key_n(&1, 4).unwrap();
    /// l.set_quota(Rate::per_second(100).burst(20)).unwrap();
    /// assert_eq!(l.peek_key(&1).remaining(), 15);
    /// assert_eq!(l.quota(), Rate::per_second(100).burst(20));
    /// ```
    pub fn set_quota(&self, config: A::Config) -> Result<(), ConfigError> {
        self.no_hot_keys()?;
        let new = A::from_config(&config)?;
        new.fits(self.table.packing())?;
        let new = new.in_units(self.table.packing());
        let mut current = lock(&self.config);
        let old: A = self.params.read();
        let now = self.clamp(self.now());
        // Keys with their own quota keep it (and their state as it is).
        let own: Vec<u64> = self
            .overrides
            .snapshot()
            .map_or_else(Vec::new, |map| map.into_keys().collect());
        self.table.for_each_state(
            now,
            &own,
            || self.params.begin(),
            |s| new.rescale(&old, s, now),
        );
        self.params.publish(new);
        *current = config;
        Ok(())
    }

    /// Gives `key` its own quota (a premium tier), keeping its usage. It
    /// survives global [`set_quota`](Self::set_quota) calls until
    /// [`clear_key_quota`](Self::clear_key_quota). While any override
    /// exists, every check also consults a small mutex-guarded map: keep
    /// overrides few, or use a second limiter for a large tier.
    ///
    /// ```
    /// # use ratewall::{KeyedTokenBucket, Rate};
    /// let l = KeyedTokenBucket::<&str>::builder(Rate::per_hour(1)).build().unwrap();
    /// l.set_key_quota(&"premium", Rate::per_hour(100)).unwrap();
    /// assert_eq!((0..5).filter(|_| l.check_key(&"premium").is_allowed()).count(), 5);
    /// assert_eq!((0..5).filter(|_| l.check_key(&"free").is_allowed()).count(), 1);
    /// ```
    pub fn set_key_quota<Q>(&self, key: &Q, config: A::Config) -> Result<(), ConfigError>
    where
        K: Borrow<Q>,
        Q: Hash + ?Sized,
    {
        self.no_hot_keys()?;
        let new = A::from_config(&config)?;
        new.fits(self.table.packing())?;
        let new = new.in_units(self.table.packing());
        let _serial = lock(&self.config);
        let h = self.hash(key);
        let old = self.params_for(h);
        let now = self.clamp(self.now());
        // Before the rescale exchange below (see `Overrides::insert`).
        self.overrides.insert(h, new);
        let _ = self
            .table
            .update(h, now, &mut |s| ((), Some(new.rescale(&old, s, now))));
        Ok(())
    }

    /// Removes `key`'s own quota: it follows the limiter's quota again.
    ///
    /// ```
    /// # use ratewall::{KeyedTokenBucket, Rate};
    /// let l = KeyedTokenBucket::<u64>::builder(Rate::per_hour(1)).build().unwrap();
    /// l.set_key_quota(&1, Rate::per_hour(10)).unwrap();
    /// l.clear_key_quota(&1);
    /// let _ = l.check_key(&1);
    /// assert!(!l.check_key(&1).is_allowed());
    /// ```
    pub fn clear_key_quota<Q>(&self, key: &Q)
    where
        K: Borrow<Q>,
        Q: Hash + ?Sized,
    {
        let _serial = lock(&self.config);
        let h = self.hash(key);
        let global: A = self.params.read();
        let now = self.clamp(self.now());
        if let Some(own) = self.overrides.remove(h) {
            let _ = self
                .table
                .update(h, now, &mut |s| ((), Some(global.rescale(&own, s, now))));
        }
    }

    /// The quota in force for keys without their own.
    ///
    /// ```
    /// # use ratewall::{KeyedTokenBucket, Rate};
    /// let l = KeyedTokenBucket::<u64>::builder(Rate::per_second(3)).build().unwrap();
    /// assert_eq!(l.quota(), Rate::per_second(3));
    /// ```
    pub fn quota(&self) -> A::Config {
        *lock(&self.config)
    }
}
