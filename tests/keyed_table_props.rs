//! Property tests of the keyed tables' full-table behaviour (issue 15): for
//! every keyed kind (token bucket, leaky bucket, fixed window, sliding window
//! counter, sliding window log) under every `WhenFull` policy, random scripts
//! on a `ManualClock` against a simple model of which keys are active and
//! when each goes idle.
//!
//! Scope: one shard of at most 8 keys. There the table's probe window and
//! its reclaim sweep cover the whole shard (a one-shard table of up to 22
//! keys has at most 32 slots in its main region and at most 64 in all), so
//! the table's promises are exact, and these are checked after every
//! operation:
//!
//! - a new key is `Tracked` whenever fewer than `max_keys` other keys are
//!   active;
//! - `len()` stays between the number of active keys and `max_keys`;
//! - a rejected decision's `retry_after` is the exact time until the first
//!   active key goes idle, a check then is admitted and tracked, and a check
//!   1 ns before is still rejected;
//! - `EvictLeastRecent` evicts a key with the least time to idle;
//! - `peek_key_n` returns the very decision the next `check_key_n` returns,
//!   for new keys and for held ones.
//!
//! Larger tables spread keys over shards and probe windows, where a full
//! chain (window and stash) can act before the whole table is full, and a
//! shard's sweep reclaims only its own idle keys (see `docs/design.md`,
//! "Keyed table"). There `any_table` checks what holds in every table:
//! `peek_key_n` returns the very decision the next `check_key_n` returns,
//! the tracking is one the policy allows, and `len()` never passes
//! `max_keys`.

use proptest::prelude::*;
use ratewall::algorithm::KeyedAlgorithm;
use ratewall::{
    Clock, Decision, KeyedLimiter, KeyedSlidingWindowLog, ManualClock, Rate, Tracking, WhenFull,
    Window,
};
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

const MS: u64 = 1_000_000;
/// Window length of the window kinds and the log.
const W: u64 = 1000 * MS;
/// Emission interval of the buckets: 2 per second, burst 3.
const T: u64 = 500 * MS;
const LIMIT: u64 = 3;

/// The public operations the script drives, for both table types.
trait Table {
    fn check(&self, k: u32, n: u64) -> Decision;
    fn peek(&self, k: u32, n: u64) -> Decision;
    fn refund(&self, k: u32, n: u64);
    fn reset(&self, k: u32);
    fn len(&self) -> usize;
}

impl<A: KeyedAlgorithm> Table for KeyedLimiter<u32, A, ManualClock> {
    fn check(&self, k: u32, n: u64) -> Decision {
        self.check_key_n(&k, n).unwrap()
    }
    fn peek(&self, k: u32, n: u64) -> Decision {
        self.peek_key_n(&k, n).unwrap()
    }
    fn refund(&self, k: u32, n: u64) {
        self.refund_key(&k, n);
    }
    fn reset(&self, k: u32) {
        self.reset_key(&k);
    }
    fn len(&self) -> usize {
        KeyedLimiter::len(self)
    }
}

impl Table for KeyedSlidingWindowLog<u32, ManualClock> {
    fn check(&self, k: u32, n: u64) -> Decision {
        self.check_key_n(&k, n).unwrap()
    }
    fn peek(&self, k: u32, n: u64) -> Decision {
        self.peek_key_n(&k, n).unwrap()
    }
    fn refund(&self, k: u32, n: u64) {
        self.refund_key(&k, n);
    }
    fn reset(&self, k: u32) {
        self.reset_key(&k);
    }
    fn len(&self) -> usize {
        KeyedSlidingWindowLog::len(self)
    }
}

/// A key's usage, as far as idleness goes: what an admission and a refund
/// do, and how long until the key carries no information.
trait KeyModel: Default + Clone + std::fmt::Debug {
    fn take(&mut self, t: u64, n: u64);
    fn refund(&mut self, t: u64, n: u64);
    fn time_to_idle(&self, t: u64) -> u64;
}

/// GCRA (both buckets): the theoretical arrival time; idle once it passed.
#[derive(Clone, Debug, Default)]
struct Tat(u64);

impl KeyModel for Tat {
    fn take(&mut self, t: u64, n: u64) {
        self.0 = self.0.max(t) + n * T;
    }
    fn refund(&mut self, t: u64, n: u64) {
        if self.0 > t {
            self.0 = self.0.saturating_sub(n * T);
        }
    }
    fn time_to_idle(&self, t: u64) -> u64 {
        self.0.saturating_sub(t)
    }
}

/// Fixed window: admissions per window; idle when the current window has none.
#[derive(Clone, Debug, Default)]
struct FixedCounts {
    counts: BTreeMap<u64, u64>,
    last: u64,
}

impl KeyModel for FixedCounts {
    fn take(&mut self, t: u64, n: u64) {
        *self.counts.entry(t / W).or_default() += n;
        self.last = t / W;
    }
    fn refund(&mut self, t: u64, n: u64) {
        // Only into the window the units were taken in, while it is current.
        if t / W == self.last {
            if let Some(c) = self.counts.get_mut(&self.last) {
                *c = c.saturating_sub(n);
            }
        }
    }
    fn time_to_idle(&self, t: u64) -> u64 {
        let id = t / W;
        if self.counts.get(&id).copied().unwrap_or(0) > 0 {
            (id + 1) * W - t
        } else {
            0
        }
    }
}

/// Sliding window counter: admissions per window; idle when neither the
/// current window nor the previous one has any.
#[derive(Clone, Debug, Default)]
struct SlidingCounts(FixedCounts);

impl KeyModel for SlidingCounts {
    fn take(&mut self, t: u64, n: u64) {
        self.0.take(t, n);
    }
    fn refund(&mut self, t: u64, n: u64) {
        // Into the last admission's window, while it is current or previous.
        let id = t / W;
        if id == self.0.last || id == self.0.last + 1 {
            if let Some(c) = self.0.counts.get_mut(&self.0.last) {
                *c = c.saturating_sub(n);
            }
        }
    }
    fn time_to_idle(&self, t: u64) -> u64 {
        let id = t / W;
        let count = |w: u64| self.0.counts.get(&w).copied().unwrap_or(0);
        if count(id) > 0 {
            (id + 2) * W - t
        } else if id > 0 && count(id - 1) > 0 {
            (id + 1) * W - t
        } else {
            0
        }
    }
}

/// Sliding log: admission times; idle once the newest left the window.
#[derive(Clone, Debug, Default)]
struct Times(Vec<u64>);

impl KeyModel for Times {
    fn take(&mut self, t: u64, n: u64) {
        self.0.extend(std::iter::repeat(t).take(n as usize));
    }
    fn refund(&mut self, t: u64, n: u64) {
        for _ in 0..n {
            match self.0.last() {
                Some(&a) if a + W > t => {
                    self.0.pop();
                }
                _ => break,
            }
        }
    }
    fn time_to_idle(&self, t: u64) -> u64 {
        self.0.last().map_or(0, |&a| (a + W).saturating_sub(t))
    }
}

#[derive(Clone, Debug)]
enum Op {
    /// Check key, cost; `follow`: on a rejection, wait `retry_after` and
    /// check again (and 1 ns before that).
    Check(u32, u64, bool),
    Refund(u32, u64),
    Reset(u32),
    Advance(u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (0u32..12, 1u64..=2, any::<bool>()).prop_map(|(k, n, f)| Op::Check(k, n, f)),
        1 => (0u32..12, 1u64..=2).prop_map(|(k, n)| Op::Refund(k, n)),
        1 => (0u32..12).prop_map(Op::Reset),
        3 => (1u64..700).prop_map(|ms| Op::Advance(ms * MS)),
        1 => (1u64..3).prop_map(Op::Advance),
    ]
}

fn policy() -> impl Strategy<Value = WhenFull> {
    prop_oneof![
        Just(WhenFull::RejectNew),
        Just(WhenFull::AdmitUntracked),
        Just(WhenFull::EvictLeastRecent),
    ]
}

/// Runs `ops` on `table`, checking every promise in the module doc.
fn run<M: KeyModel>(
    table: &dyn Table,
    clock: &ManualClock,
    policy: WhenFull,
    max_keys: usize,
    ops: &[Op],
) -> Result<(), TestCaseError> {
    // The keys the table holds (as far as the model knows: idle ones may
    // have been reclaimed, which changes nothing for them).
    let mut held: HashMap<u32, M> = HashMap::new();
    for op in ops {
        let t = clock.now();
        let active = |held: &HashMap<u32, M>, except: u32| -> Vec<(u32, u64)> {
            let mut v: Vec<(u32, u64)> = held
                .iter()
                .filter(|(k, _)| **k != except)
                .map(|(k, m)| (*k, m.time_to_idle(t)))
                .filter(|(_, ttl)| *ttl > 0)
                .collect();
            v.sort_unstable();
            v
        };
        match *op {
            Op::Check(k, n, follow) => {
                let peek = table.peek(k, n);
                let d = table.check(k, n);
                prop_assert_eq!(peek, d, "peek vs check of key {} at {}", k, t);
                prop_assert_eq!(peek.tracking(), d.tracking());
                let others = active(&held, k);
                let k_active = held.get(&k).is_some_and(|m| m.time_to_idle(t) > 0);
                let soonest = others.iter().map(|&(_, ttl)| ttl).min();
                if k_active || others.len() < max_keys {
                    prop_assert_eq!(
                        d.tracking(),
                        Tracking::Tracked,
                        "key {} at {}: {:?}",
                        k,
                        t,
                        others
                    );
                } else {
                    // Full of active keys: the policy acts.
                    let want = match policy {
                        WhenFull::RejectNew => Tracking::Rejected,
                        WhenFull::AdmitUntracked => Tracking::Untracked,
                        _ => Tracking::EvictedOther,
                    };
                    prop_assert_eq!(d.tracking(), want, "key {} at {}: {:?}", k, t, others);
                }
                match d.tracking() {
                    Tracking::Tracked => {
                        if d.is_allowed() {
                            held.entry(k).or_default().take(t, n);
                        }
                    }
                    Tracking::EvictedOther => {
                        prop_assert_eq!(policy, WhenFull::EvictLeastRecent);
                        prop_assert!(d.is_allowed());
                        // The victim has the least time to idle; if several
                        // tie, the evicted one is the one now untracked
                        // (its peek is a new key's: not `Tracked`).
                        let least = soonest.unwrap();
                        let tied: Vec<u32> = others
                            .iter()
                            .filter(|&&(_, ttl)| ttl == least)
                            .map(|&(c, _)| c)
                            .collect();
                        let gone: Vec<u32> = others
                            .iter()
                            .map(|&(c, _)| c)
                            .filter(|&c| table.peek(c, 1).tracking() != Tracking::Tracked)
                            .collect();
                        prop_assert_eq!(gone.len(), 1, "evicted: {:?}, tied: {:?}", gone, tied);
                        prop_assert!(
                            tied.contains(&gone[0]),
                            "evicted {:?}, least: {:?}",
                            gone,
                            tied
                        );
                        held.remove(&gone[0]);
                        let mut m = M::default();
                        m.take(t, n);
                        held.insert(k, m);
                    }
                    Tracking::Untracked => {
                        prop_assert_eq!(policy, WhenFull::AdmitUntracked);
                        prop_assert!(d.is_allowed());
                    }
                    Tracking::Rejected => {
                        prop_assert_eq!(policy, WhenFull::RejectNew);
                        prop_assert!(!d.is_allowed());
                        let wait = d.retry_after().as_nanos() as u64;
                        prop_assert_eq!(Some(wait), soonest, "rejected at {}: {:?}", t, others);
                        if follow {
                            if wait > 1 {
                                clock.advance(Duration::from_nanos(wait - 1));
                                let before = table.check(k, n);
                                prop_assert_eq!(before.tracking(), Tracking::Rejected);
                                prop_assert_eq!(before.retry_after(), Duration::from_nanos(1));
                                clock.advance(Duration::from_nanos(1));
                            } else {
                                clock.advance(Duration::from_nanos(wait));
                            }
                            let then = table.check(k, n);
                            prop_assert!(then.is_allowed());
                            prop_assert_eq!(then.tracking(), Tracking::Tracked);
                            held.entry(k).or_default().take(clock.now(), n);
                        }
                    }
                    other => prop_assert!(false, "unknown tracking {:?}", other),
                }
            }
            Op::Refund(k, n) => {
                table.refund(k, n);
                if let Some(m) = held.get_mut(&k) {
                    m.refund(t, n);
                }
            }
            Op::Reset(k) => {
                table.reset(k);
                held.remove(&k);
            }
            Op::Advance(by) => clock.advance(Duration::from_nanos(by)),
        }
        let t = clock.now();
        let active_now = held.values().filter(|m| m.time_to_idle(t) > 0).count();
        let len = table.len();
        prop_assert!(
            active_now <= len && len <= max_keys,
            "len {} with {} active, max {}",
            len,
            active_now,
            max_keys
        );
    }
    Ok(())
}

/// Runs `ops` on any table (many shards, windows that do not cover them):
/// what holds there (see the module doc).
fn run_any(
    table: &dyn Table,
    clock: &ManualClock,
    policy: WhenFull,
    (max_keys, shards): (usize, usize),
    ops: &[Op],
) -> Result<(), TestCaseError> {
    for op in ops {
        match *op {
            Op::Check(k, n, _) => {
                let peek = table.peek(k, n);
                let d = table.check(k, n);
                prop_assert_eq!(peek, d, "peek vs check of key {} at {}", k, clock.now());
                prop_assert_eq!(peek.tracking(), d.tracking());
                let allowed = match d.tracking() {
                    Tracking::Tracked => true,
                    Tracking::Rejected => {
                        !d.is_allowed()
                            && (policy == WhenFull::RejectNew
                                // At `max_keys`, a shard with no key in its
                                // window and sweep ranges has nothing to
                                // evict (the keys are in other shards): told
                                // of no key, it may retry at once.
                                || (policy == WhenFull::EvictLeastRecent
                                    && shards > 1
                                    && d.retry_after() == Duration::from_nanos(1)))
                    }
                    Tracking::Untracked => policy == WhenFull::AdmitUntracked && d.is_allowed(),
                    Tracking::EvictedOther => {
                        policy == WhenFull::EvictLeastRecent && d.is_allowed()
                    }
                    _ => false,
                };
                prop_assert!(allowed, "{:?} under {:?}", d, policy);
            }
            Op::Refund(k, n) => table.refund(k, n),
            Op::Reset(k) => table.reset(k),
            Op::Advance(by) => clock.advance(Duration::from_nanos(by)),
        }
        prop_assert!(
            table.len() <= max_keys,
            "len {} > {}",
            table.len(),
            max_keys
        );
    }
    Ok(())
}

/// `op()` over keys `0..keys`.
fn op_over(keys: u32) -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (0..keys, 1u64..=2).prop_map(|(k, n)| Op::Check(k, n, false)),
        1 => (0..keys, 1u64..=2).prop_map(|(k, n)| Op::Refund(k, n)),
        1 => (0..keys).prop_map(Op::Reset),
        2 => (1u64..700).prop_map(|ms| Op::Advance(ms * MS)),
    ]
}

fn keyed<A: KeyedAlgorithm>(
    config: A::Config,
    policy: WhenFull,
    max_keys: usize,
    seed: u64,
    clock: &ManualClock,
) -> KeyedLimiter<u32, A, ManualClock> {
    KeyedLimiter::<u32, A>::builder(config)
        .max_keys(max_keys)
        .shards(1)
        .when_full(policy)
        .seed(seed)
        .clock(clock.clone())
        .build()
        .unwrap()
}

fn keyed_in<A: KeyedAlgorithm>(
    config: A::Config,
    policy: WhenFull,
    max_keys: usize,
    shards: usize,
    clock: &ManualClock,
) -> KeyedLimiter<u32, A, ManualClock> {
    KeyedLimiter::<u32, A>::builder(config)
        .max_keys(max_keys)
        .shards(shards)
        .when_full(policy)
        .clock(clock.clone())
        .build()
        .unwrap()
}

fn rate() -> Rate {
    Rate::new(2, Duration::from_secs(1)).burst(LIMIT)
}

fn window() -> Window {
    Window::new(LIMIT, Duration::from_nanos(W))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn token_bucket_table(ops in prop::collection::vec(op(), 1..80), policy in policy(), max_keys in 1usize..=8, seed in any::<u64>()) {
        let clock = ManualClock::new();
        let t = keyed::<ratewall::algorithm::Gcra>(rate(), policy, max_keys, seed, &clock);
        run::<Tat>(&t, &clock, policy, max_keys, &ops)?;
    }

    #[test]
    fn leaky_bucket_table(ops in prop::collection::vec(op(), 1..80), policy in policy(), max_keys in 1usize..=8, seed in any::<u64>()) {
        let clock = ManualClock::new();
        let t = keyed::<ratewall::algorithm::LeakyGcra>(rate(), policy, max_keys, seed, &clock);
        run::<Tat>(&t, &clock, policy, max_keys, &ops)?;
    }

    #[test]
    fn fixed_window_table(ops in prop::collection::vec(op(), 1..80), policy in policy(), max_keys in 1usize..=8, seed in any::<u64>()) {
        let clock = ManualClock::new();
        let t = keyed::<ratewall::algorithm::FixedCounter>(window(), policy, max_keys, seed, &clock);
        run::<FixedCounts>(&t, &clock, policy, max_keys, &ops)?;
    }

    #[test]
    fn sliding_counter_table(ops in prop::collection::vec(op(), 1..80), policy in policy(), max_keys in 1usize..=8, seed in any::<u64>()) {
        let clock = ManualClock::new();
        let t = keyed::<ratewall::algorithm::SlidingCounter>(window(), policy, max_keys, seed, &clock);
        run::<SlidingCounts>(&t, &clock, policy, max_keys, &ops)?;
    }

    #[test]
    fn sliding_log_table(ops in prop::collection::vec(op(), 1..80), policy in policy(), max_keys in 1usize..=8, seed in any::<u64>()) {
        let clock = ManualClock::new();
        let t = KeyedSlidingWindowLog::<u32>::builder(window())
            .max_keys(max_keys)
            .shards(1)
            .when_full(policy)
            .seed(seed)
            .clock(clock.clone())
            .build()
            .unwrap();
        run::<Times>(&t, &clock, policy, max_keys, &ops)?;
    }

    #[test]
    fn any_table(
        ops in prop::collection::vec(op_over(160), 1..200),
        policy in policy(),
        max_keys in 1usize..=96,
        shards in prop_oneof![Just(1usize), Just(2), Just(4)],
        kind in 0u8..5,
    ) {
        let clock = ManualClock::new();
        match kind {
            0 => run_any(&keyed_in::<ratewall::algorithm::Gcra>(rate(), policy, max_keys, shards, &clock), &clock, policy, (max_keys, shards), &ops)?,
            1 => run_any(&keyed_in::<ratewall::algorithm::LeakyGcra>(rate(), policy, max_keys, shards, &clock), &clock, policy, (max_keys, shards), &ops)?,
            2 => run_any(&keyed_in::<ratewall::algorithm::FixedCounter>(window(), policy, max_keys, shards, &clock), &clock, policy, (max_keys, shards), &ops)?,
            3 => run_any(&keyed_in::<ratewall::algorithm::SlidingCounter>(window(), policy, max_keys, shards, &clock), &clock, policy, (max_keys, shards), &ops)?,
            _ => {
                let t = KeyedSlidingWindowLog::<u32>::builder(window())
                    .max_keys(max_keys)
                    .shards(shards)
                    .when_full(policy)
                    .clock(clock.clone())
                    .build()
                    .unwrap();
                run_any(&t, &clock, policy, (max_keys, shards), &ops)?;
            }
        }
    }
}
