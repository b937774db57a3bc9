//! Where limits count (bounded tables in memory, or Redis), what a
//! counter answered, and the descriptor status made of it, with the
//! limit's stats.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    rate_limit::Unit as PbUnit, Code, DescriptorStatus, RateLimit as PbLimit,
};
use envoy_types::pb::google::protobuf::Duration as PbDuration;
use ratewall::redis::{FailurePolicy, RedisBackend, RedisError, RedisLimiter};
use ratewall::{Decision, InsufficientCapacity, KeyedPolicyLimiter, WhenFull};

use crate::config::{LimitDef, LimitKind, Unit};
use crate::service::ServiceOptions;

/// The share of a limit above which an admitted hit counts as near the
/// limit (envoyproxy/ratelimit's `NEAR_LIMIT_RATIO` default).
const NEAR_LIMIT_RATIO: f64 = 0.8;

/// Where limits count.
#[derive(Clone, Debug)]
pub(crate) enum Store {
    /// Bounded tables in this process.
    Memory,
    /// Shared through Redis.
    Redis {
        backend: RedisBackend,
        on_failure: FailurePolicy,
        deny_cache: usize,
    },
}

/// Per-limit counts, as envoyproxy/ratelimit keeps them (in hits, the
/// cost units).
#[derive(Debug, Default)]
pub(crate) struct LimitStats {
    pub(crate) total_hits: AtomicU64,
    pub(crate) over_limit: AtomicU64,
    pub(crate) near_limit: AtomicU64,
    pub(crate) within_limit: AtomicU64,
    pub(crate) shadow_mode: AtomicU64,
}

/// The most per-value series one `detailed_metric` limit reports; the
/// values past it are counted in the limit's own series only (and in
/// `Series::dropped`), so a client sending new values cannot grow the
/// metrics without bound.
pub(crate) const MAX_SERIES: usize = 1_000;

/// A limit's stats by the stats keys that are not its own (the values of a
/// `detailed_metric` limit, `value_to_metric`'s runtime values, each
/// descriptor of a descriptor's own limit).
#[derive(Debug, Default)]
pub(crate) struct Series {
    pub(crate) by_key: Mutex<HashMap<String, Arc<LimitStats>>>,
    /// Hits of values that found no room (past `MAX_SERIES`).
    pub(crate) dropped: AtomicU64,
}

impl Series {
    /// The stats of `key`, made on first use while there is room.
    fn of(&self, key: &str) -> Option<Arc<LimitStats>> {
        let mut map = self.by_key.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = map.get(key) {
            return Some(Arc::clone(s));
        }
        if map.len() >= MAX_SERIES {
            return None;
        }
        let s = Arc::new(LimitStats::default());
        map.insert(key.to_owned(), Arc::clone(&s));
        Some(s)
    }
}

/// Where one descriptor's counts go: its limit's stats and, for a
/// `detailed_metric` limit, its value's series.
struct Tally<'a> {
    limit: &'a LimitStats,
    value: Option<Arc<LimitStats>>,
}

impl Tally<'_> {
    fn add(&self, field: fn(&LimitStats) -> &AtomicU64, n: u64) {
        add(field(self.limit), n);
        if let Some(v) = &self.value {
            add(field(v), n);
        }
    }
}

pub(crate) fn add(c: &AtomicU64, n: u64) {
    // Relaxed: a statistic, read alone; it orders nothing.
    c.fetch_add(n, Ordering::Relaxed);
}

/// Where one limit counts.
#[derive(Debug)]
pub(crate) enum Counter {
    Memory(KeyedPolicyLimiter<Vec<u8>>),
    Redis(RedisLimiter),
}

/// A limit that cannot be built, and which.
#[derive(Debug)]
#[non_exhaustive]
pub enum LimitError {
    /// The policy is outside ratewall's bounds.
    Policy {
        /// Where the limit is written (`file:line`).
        source: String,
        /// The limit (its stats key, `domain.key_value`).
        limit: String,
        /// Why.
        error: ratewall::ConfigError,
    },
    /// Redis cannot run the limit (a policy its arithmetic cannot hold
    /// exactly, or a bad setting).
    Redis {
        /// Where the limit is written (`file:line`).
        source: String,
        /// The limit.
        limit: String,
        /// Why.
        error: RedisError,
    },
}

impl std::fmt::Display for LimitError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LimitError::Policy {
                source,
                limit,
                error,
            } => {
                write!(f, "{source}: limit `{limit}`: {error}")
            }
            LimitError::Redis {
                source,
                limit,
                error,
            } => {
                write!(f, "{source}: limit `{limit}` on Redis: {error}")
            }
        }
    }
}

impl std::error::Error for LimitError {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn defs(yaml: &str) -> Vec<Arc<LimitDef>> {
        Config::from_sources(&[("t.yaml".into(), yaml.into())])
            .unwrap()
            .limits()
    }

    #[test]
    fn redis_names_are_readable_valid_and_follow_the_definition() {
        let long = "k".repeat(100);
        let yaml = |rpu: u32| {
            format!("domain: d\ndescriptors:\n  - key: \"a:b {{c}}\"\n    rate_limit: {{ unit: minute, requests_per_unit: {rpu} }}\n  - key: {long}\n    rate_limit: {{ unit: minute, requests_per_unit: 1 }}\n")
        };
        let (a, b) = (defs(&yaml(5)), defs(&yaml(6)));
        for d in a.iter().chain(&b) {
            let n = redis_name(d);
            assert!(n.len() <= 64, "{n}");
            assert!(!n.contains([' ', ':', '{', '}']), "{n}");
        }
        assert_eq!(redis_name(&a[0]), redis_name(&defs(&yaml(5))[0]), "stable");
        assert!(
            redis_name(&a[0]).starts_with("d.a_b__c_~"),
            "{}",
            redis_name(&a[0])
        );
        assert_ne!(redis_name(&a[0]), redis_name(&b[0]), "a changed limit");
        assert_eq!(redis_name(&a[1]), redis_name(&b[1]), "an unchanged one");
    }
}

/// A limit's name in Redis, in its keys, store events and metrics: its
/// stats key, readable (bytes Redis names refuse become `_`, at most 47 of
/// them), then `~` and a hash of its definition (FNV-1a of its id), so the
/// same on every replica and across restarts, and different whenever the
/// limit's counting changes (a changed limit starts on fresh keys).
fn redis_name(def: &LimitDef) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in def.id.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    let readable: String = def
        .full_key
        .bytes()
        .take(47)
        .map(|b| match b {
            b' ' | b':' | b'{' | b'}' => '_',
            b if b.is_ascii_graphic() => char::from(b),
            _ => '_',
        })
        .collect();
    format!("{readable}~{h:016x}")
}

/// One limit's counters and stats; kept across a reload while the limit
/// is unchanged.
#[derive(Debug)]
pub(crate) struct LimitState {
    pub(crate) def: Arc<LimitDef>,
    /// `None` for an unlimited limit.
    pub(crate) limiter: Option<Arc<Counter>>,
    pub(crate) stats: Arc<LimitStats>,
    /// Stats by the descriptor's stats key where it is not the limit's
    /// own (`detailed_metric`, `value_to_metric`, a descriptor's own limit).
    pub(crate) series: Arc<Series>,
}

impl LimitState {
    pub(crate) fn build(
        def: Arc<LimitDef>,
        options: &ServiceOptions,
    ) -> Result<LimitState, LimitError> {
        let limiter = match &def.kind {
            // Nothing to count: always OK, or (`requests_per_unit: 0`) always over.
            LimitKind::Unlimited | LimitKind::Blocked { .. } => None,
            LimitKind::Limited { policy, .. } => Some(Arc::new(match &options.store {
                Store::Memory => Counter::Memory(
                    KeyedPolicyLimiter::builder(*policy)
                        .max_keys(options.max_keys)
                        .when_full(WhenFull::EvictLeastRecent)
                        .build()
                        .map_err(|error| LimitError::Policy {
                            source: def.source.clone(),
                            limit: def.full_key.clone(),
                            error,
                        })?,
                ),
                Store::Redis {
                    backend,
                    on_failure,
                    deny_cache,
                } => {
                    let mut b = RedisLimiter::builder(*policy, backend)
                        .name(redis_name(&def))
                        .on_failure(*on_failure);
                    if *deny_cache > 0 {
                        b = b.deny_cache(*deny_cache);
                    }
                    Counter::Redis(b.build().map_err(|error| LimitError::Redis {
                        source: def.source.clone(),
                        limit: def.full_key.clone(),
                        error,
                    })?)
                }
            })),
        };
        Ok(LimitState {
            def,
            limiter,
            stats: Arc::default(),
            series: Arc::default(),
        })
    }

    /// The same counters under a new configuration's definition.
    pub(crate) fn carried(&self, def: Arc<LimitDef>) -> LimitState {
        LimitState {
            def,
            limiter: self.limiter.clone(),
            stats: Arc::clone(&self.stats),
            series: Arc::clone(&self.series),
        }
    }
}

/// What one descriptor asks of its counter.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Op {
    pub(crate) hits: u64,
    /// Give `hits` back (the descriptor's `is_negative_hits`).
    pub(crate) refund: bool,
}

/// What a counter answered, whichever store it is in.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Taken {
    /// `hits` were asked for: the decision, or a cost the limit never admits.
    Checked(Result<Decision, InsufficientCapacity>),
    /// Nothing was taken (0 hits, or a refund): what is left.
    Looked(Decision),
    /// A limit of 0 (`requests_per_unit: 0`): every hit is over.
    Blocked,
}

impl Taken {
    /// The decision, when the counter gave one.
    pub(crate) fn decision(self) -> Option<Decision> {
        match self {
            Taken::Checked(Ok(d)) | Taken::Looked(d) => Some(d),
            _ => None,
        }
    }
}

impl Op {
    pub(crate) fn on_memory(self, l: &KeyedPolicyLimiter<Vec<u8>>, key: &[u8]) -> Taken {
        if self.refund {
            l.refund_key(key, self.hits);
            Taken::Looked(l.peek_key(key))
        } else if self.hits == 0 {
            Taken::Looked(l.peek_key(key))
        } else {
            Taken::Checked(l.check_key_n(key, self.hits))
        }
    }

    pub(crate) async fn on_redis(self, l: &RedisLimiter, key: &[u8]) -> Result<Taken, RedisError> {
        if self.refund {
            l.refund_key(key, self.hits).await?;
            return Ok(Taken::Looked(l.peek_key(key).await?.decision()));
        }
        if self.hits == 0 {
            return Ok(Taken::Looked(l.peek_key(key).await?.decision()));
        }
        match l.check_key_n(key, self.hits).await {
            Ok(d) => Ok(Taken::Checked(Ok(d.decision()))),
            Err(RedisError::InsufficientCapacity(e)) => Ok(Taken::Checked(Err(e))),
            Err(e) => Err(e),
        }
    }
}

/// The answer's `current_limit` for a limit.
fn current_limit(state: &LimitState) -> Option<PbLimit> {
    let (requests_per_unit, unit) = match &state.def.kind {
        LimitKind::Limited {
            requests_per_unit,
            unit,
            ..
        } => (*requests_per_unit, *unit),
        LimitKind::Blocked { unit } => (0, *unit),
        _ => (0, Unit::Unknown),
    };
    Some(PbLimit {
        name: state.def.name.clone().unwrap_or_default(),
        requests_per_unit,
        unit: pb_unit(unit) as i32,
    })
}

/// The status of a descriptor that took nothing (and counts nothing):
/// what its limit has left.
pub(crate) fn looked(state: &LimitState, d: &Decision) -> DescriptorStatus {
    status(Code::Ok, current_limit(state), d, true)
}

/// Counts a descriptor's answer in its limit's stats and says what to
/// answer.
///
/// `stats_key`: the descriptor's stats key (its values, for a
/// `detailed_metric` limit).
pub(crate) fn finish(
    state: &LimitState,
    taken: Taken,
    hits: u64,
    stats_key: &str,
) -> DescriptorStatus {
    let current_limit = current_limit(state);
    let value = match taken {
        Taken::Checked(_) | Taken::Blocked if stats_key != state.def.full_key => {
            let v = state.series.of(stats_key);
            if v.is_none() {
                add(&state.series.dropped, hits);
            }
            v
        }
        _ => None,
    };
    let stats = &Tally {
        limit: &state.stats,
        value,
    };
    let over = |stats: &Tally<'_>| {
        stats.add(|s| &s.over_limit, hits);
        if state.def.shadow_mode {
            stats.add(|s| &s.shadow_mode, hits);
            Code::Ok
        } else {
            Code::OverLimit
        }
    };
    let checked = match taken {
        Taken::Looked(d) => return status(Code::Ok, current_limit, &d, true),
        Taken::Checked(c) => {
            stats.add(|s| &s.total_hits, hits);
            c
        }
        Taken::Blocked => {
            stats.add(|s| &s.total_hits, hits);
            // As envoyproxy/ratelimit answers a limit of 0: over, until
            // the end of the unit's current window (of wall-clock time).
            let code = over(stats);
            let unit = match &state.def.kind {
                LimitKind::Blocked { unit } => *unit,
                _ => Unit::Unknown,
            };
            return DescriptorStatus {
                code: code as i32,
                current_limit,
                duration_until_reset: unit.length().map(|len| pb_duration(until_window_end(len))),
                ..DescriptorStatus::default()
            };
        }
    };
    match checked {
        Ok(d) if d.is_allowed() => {
            stats.add(|s| &s.within_limit, hits);
            let limit = d.limit();
            let used_after = limit.saturating_sub(d.remaining());
            let used_before = used_after.saturating_sub(hits);
            let near = (limit as f64 * NEAR_LIMIT_RATIO).floor() as u64;
            if used_after > near {
                stats.add(|s| &s.near_limit, used_after - near.max(used_before));
            }
            status(Code::Ok, current_limit, &d, true)
        }
        Ok(d) => status(over(stats), current_limit, &d, false),
        // More hits than the limit ever admits at once: over, for good.
        Err(_) => DescriptorStatus {
            code: over(stats) as i32,
            current_limit,
            ..DescriptorStatus::default()
        },
    }
}

/// A counted descriptor's status. `duration_until_reset` is the time until
/// the limit is whole again when admitted, and until the same request could
/// pass when over.
fn status(
    code: Code,
    current_limit: Option<PbLimit>,
    d: &Decision,
    allowed: bool,
) -> DescriptorStatus {
    let reset = if allowed {
        d.reset_after()
    } else {
        d.retry_after()
    };
    DescriptorStatus {
        code: code as i32,
        current_limit,
        limit_remaining: u32::try_from(d.remaining()).unwrap_or(u32::MAX),
        duration_until_reset: Some(pb_duration(reset)),
        ..DescriptorStatus::default()
    }
}

/// The time left in the current `len`-long window of Unix time.
fn until_window_end(len: Duration) -> Duration {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let len_ns = len.as_nanos().max(1);
    Duration::from_nanos((len_ns - now.as_nanos() % len_ns) as u64)
}

fn pb_duration(d: Duration) -> PbDuration {
    PbDuration {
        seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        nanos: d.subsec_nanos() as i32,
    }
}

pub(crate) fn pb_unit(unit: Unit) -> PbUnit {
    match unit {
        Unit::Second => PbUnit::Second,
        Unit::Minute => PbUnit::Minute,
        Unit::Hour => PbUnit::Hour,
        Unit::Day => PbUnit::Day,
        Unit::Week => PbUnit::Week,
        Unit::Month => PbUnit::Month,
        Unit::Year => PbUnit::Year,
        _ => PbUnit::Unknown,
    }
}

/// A request's unit (an unknown number is `Unknown`).
pub(crate) fn unit_of(unit: i32) -> Unit {
    match PbUnit::try_from(unit) {
        Ok(PbUnit::Second) => Unit::Second,
        Ok(PbUnit::Minute) => Unit::Minute,
        Ok(PbUnit::Hour) => Unit::Hour,
        Ok(PbUnit::Day) => Unit::Day,
        Ok(PbUnit::Week) => Unit::Week,
        Ok(PbUnit::Month) => Unit::Month,
        Ok(PbUnit::Year) => Unit::Year,
        _ => Unit::Unknown,
    }
}
