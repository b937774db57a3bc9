//! One `ShouldRateLimit` call, whatever carried it (gRPC or `/json`):
//! each descriptor's limit found in the configuration, counted in its
//! limit's table, and the answer built as envoyproxy/ratelimit builds it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    rate_limit::Unit as PbUnit, Code, DescriptorStatus, RateLimit as PbLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::Duration as PbDuration;
use ratewall::{Decision, KeyedPolicyLimiter, WhenFull};

use crate::config::{apply_replaces, Config, Found, LimitDef, LimitKind, Unit};

/// The share of a limit above which an admitted hit counts as near the
/// limit (envoyproxy/ratelimit's `NEAR_LIMIT_RATIO` default).
const NEAR_LIMIT_RATIO: f64 = 0.8;

/// How the service counts and answers; [`Service::new`] takes it.
///
/// ```
/// use ratewall_server::ServiceOptions;
///
/// let options = ServiceOptions::default().max_keys_per_limit(10_000).global_shadow_mode(true);
/// assert_eq!(options.keys_per_limit(), 10_000);
/// ```
#[derive(Clone, Debug)]
pub struct ServiceOptions {
    max_keys: usize,
    max_override_limits: usize,
    global_shadow_mode: bool,
    floor: bool,
}

impl Default for ServiceOptions {
    fn default() -> Self {
        ServiceOptions {
            max_keys: 100_000,
            max_override_limits: 1024,
            global_shadow_mode: false,
            floor: false,
        }
    }
}

impl ServiceOptions {
    /// The most counters (distinct descriptor values) one limit tracks in
    /// memory; past it the least recently used is forgotten (its count
    /// starts over). 100,000 by default, 12 bytes each.
    #[must_use]
    pub fn max_keys_per_limit(mut self, max_keys: usize) -> Self {
        self.max_keys = max_keys;
        self
    }

    /// The configured most counters per limit.
    ///
    /// ```
    /// assert_eq!(ratewall_server::ServiceOptions::default().keys_per_limit(), 100_000);
    /// ```
    pub fn keys_per_limit(&self) -> usize {
        self.max_keys
    }

    /// The most distinct limits that descriptors may carry themselves (a
    /// descriptor's own `limit`, one per rate and unit); past it such a
    /// descriptor is answered `UNKNOWN`-free as unmatched (no limit) and
    /// counted in the stats. 1,024 by default.
    #[must_use]
    pub fn max_override_limits(mut self, n: usize) -> Self {
        self.max_override_limits = n;
        self
    }

    /// Answers every descriptor `OK` without looking at the configuration
    /// or counting: the cost of the transport alone, the floor a benchmark
    /// compares the service against. Never for serving traffic.
    ///
    /// ```
    /// # use ratewall_server::ServiceOptions;
    /// let floor = ServiceOptions::default().answer_ok_without_limiting(true);
    /// # let _ = floor;
    /// ```
    #[must_use]
    pub fn answer_ok_without_limiting(mut self, on: bool) -> Self {
        self.floor = on;
        self
    }

    /// Every answer is `OK` whatever the limits say (they still count and
    /// report): envoyproxy/ratelimit's `SHADOW_MODE`.
    #[must_use]
    pub fn global_shadow_mode(mut self, on: bool) -> Self {
        self.global_shadow_mode = on;
        self
    }
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

fn add(c: &AtomicU64, n: u64) {
    // Relaxed: a statistic, read alone; it orders nothing.
    c.fetch_add(n, Ordering::Relaxed);
}

/// One limit's counters and stats; kept across a reload while the limit
/// is unchanged.
#[derive(Debug)]
pub(crate) struct LimitState {
    pub(crate) def: Arc<LimitDef>,
    /// `None` for an unlimited limit.
    limiter: Option<Arc<KeyedPolicyLimiter<Vec<u8>>>>,
    pub(crate) stats: Arc<LimitStats>,
}

impl LimitState {
    fn build(
        def: Arc<LimitDef>,
        options: &ServiceOptions,
    ) -> Result<LimitState, ratewall::ConfigError> {
        let limiter = match &def.kind {
            LimitKind::Unlimited => None,
            LimitKind::Limited { policy, .. } => Some(Arc::new(
                KeyedPolicyLimiter::builder(*policy)
                    .max_keys(options.max_keys)
                    .when_full(WhenFull::EvictLeastRecent)
                    .build()?,
            )),
        };
        Ok(LimitState {
            def,
            limiter,
            stats: Arc::default(),
        })
    }

    /// The same counters under a new configuration's definition.
    fn carried(&self, def: Arc<LimitDef>) -> LimitState {
        LimitState {
            def,
            limiter: self.limiter.clone(),
            stats: Arc::clone(&self.stats),
        }
    }
}

/// A configuration and its limits' state, swapped whole on reload.
#[derive(Debug)]
pub(crate) struct Generation {
    pub(crate) config: Config,
    /// By the address of the limit's definition (what `find` returns).
    by_def: HashMap<usize, Arc<LimitState>>,
    /// By `LimitDef::id`, to carry state into the next generation.
    pub(crate) by_id: HashMap<String, Arc<LimitState>>,
}

fn def_addr(def: &Arc<LimitDef>) -> usize {
    Arc::as_ptr(def) as usize
}

impl Generation {
    fn new(
        config: Config,
        previous: Option<&Generation>,
        options: &ServiceOptions,
    ) -> Result<Generation, ratewall::ConfigError> {
        let mut by_def = HashMap::new();
        let mut by_id = HashMap::new();
        for def in config.limits() {
            let kept = previous.and_then(|p| p.by_id.get(&def.id));
            let state = Arc::new(match kept {
                Some(old) => old.carried(Arc::clone(&def)),
                None => LimitState::build(Arc::clone(&def), options)?,
            });
            by_def.insert(def_addr(&def), Arc::clone(&state));
            by_id.insert(def.id.clone(), state);
        }
        Ok(Generation {
            config,
            by_def,
            by_id,
        })
    }
}

/// What a request was refused for before any descriptor was counted.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RequestError {
    /// The request names no domain.
    EmptyDomain,
    /// The request carries no descriptor.
    NoDescriptors,
    /// A descriptor has no entries.
    EmptyDescriptor {
        /// Its position in the request.
        index: usize,
    },
}

impl std::fmt::Display for RequestError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RequestError::EmptyDomain => f.write_str("rate limit domain must not be empty"),
            RequestError::NoDescriptors => {
                f.write_str("rate limit descriptor list must not be empty")
            }
            RequestError::EmptyDescriptor { index } => {
                write!(f, "descriptor {index} has no entries")
            }
        }
    }
}

impl std::error::Error for RequestError {}

/// The rate limit service: the current configuration, its limits'
/// counters, and the answer to a `ShouldRateLimit` request.
///
/// ```
/// use ratewall_server::config::Config;
/// use ratewall_server::{Service, ServiceOptions};
///
/// let yaml = "domain: api\ndescriptors:\n  - key: user\n    rate_limit: { unit: minute, requests_per_unit: 2 }\n";
/// let config = Config::from_sources(&[("api.yaml".into(), yaml.into())])?;
/// let service = Service::new(config, ServiceOptions::default())?;
/// let call = || service.check("api", &[&[("user", "ada")]], 1).unwrap();
/// assert!(call());
/// assert!(call());
/// assert!(!call()); // the third call in the minute is over the limit
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct Service {
    current: ArcSwap<Generation>,
    options: ServiceOptions,
    /// Limits that descriptors carried themselves, by id, across reloads.
    overrides: Mutex<HashMap<String, Arc<LimitState>>>,
    /// Descriptors whose own limit found no room (`max_override_limits`).
    pub(crate) overrides_refused: AtomicU64,
}

impl Service {
    /// A service answering by `config`.
    pub fn new(config: Config, options: ServiceOptions) -> Result<Service, ratewall::ConfigError> {
        let generation = Generation::new(config, None, &options)?;
        Ok(Service {
            current: ArcSwap::from_pointee(generation),
            options,
            overrides: Mutex::default(),
            overrides_refused: AtomicU64::new(0),
        })
    }

    /// Replaces the configuration in one step: a call sees the old one or
    /// the new one, never a mix. Limits whose definition did not change
    /// keep their counters; on an error nothing changes.
    ///
    /// ```
    /// use ratewall_server::config::Config;
    /// use ratewall_server::{Service, ServiceOptions};
    ///
    /// let load = |n: u32| {
    ///     let yaml = format!("domain: api\ndescriptors:\n  - key: user\n    rate_limit: {{ unit: minute, requests_per_unit: {n} }}\n");
    ///     Config::from_sources(&[("api.yaml".into(), yaml)]).unwrap()
    /// };
    /// let service = Service::new(load(1), ServiceOptions::default())?;
    /// assert!(service.check("api", &[&[("user", "ada")]], 1)?);
    /// service.replace_config(load(1))?; // unchanged: the count is kept
    /// assert!(!service.check("api", &[&[("user", "ada")]], 1)?);
    /// service.replace_config(load(5))?; // a new limit counts afresh
    /// assert!(service.check("api", &[&[("user", "ada")]], 1)?);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn replace_config(&self, config: Config) -> Result<(), ratewall::ConfigError> {
        let old = self.current.load();
        let next = Generation::new(config, Some(&old), &self.options)?;
        self.current.store(Arc::new(next));
        Ok(())
    }

    /// The current generation (for stats).
    pub(crate) fn generation(&self) -> Arc<Generation> {
        self.current.load_full()
    }

    /// The limits descriptors carried themselves.
    pub(crate) fn override_states(&self) -> Vec<Arc<LimitState>> {
        self.overrides
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .cloned()
            .collect()
    }

    /// Answers one request, counting `hits` per descriptor: whether every
    /// descriptor is within its limit (a shorthand of
    /// [`should_rate_limit`](Self::should_rate_limit) for tests and
    /// examples).
    ///
    /// ```
    /// # use ratewall_server::config::Config;
    /// # use ratewall_server::{Service, ServiceOptions};
    /// let yaml = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { unit: second, requests_per_unit: 1 }\n";
    /// let s = Service::new(Config::from_sources(&[("d.yaml".into(), yaml.into())])?, ServiceOptions::default())?;
    /// assert!(s.check("d", &[&[("k", "v")]], 1)?);
    /// assert!(s.check("d", &[&[("other", "v")]], 1)?); // no limit matches
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn check(
        &self,
        domain: &str,
        descriptors: &[&[(&str, &str)]],
        hits: u32,
    ) -> Result<bool, RequestError> {
        let request = RateLimitRequest {
            domain: domain.to_owned(),
            descriptors: descriptors
                .iter()
                .map(|entries| RateLimitDescriptor {
                    entries: entries
                        .iter()
                        .map(|(k, v)| {
                            envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry {
                                key: (*k).to_owned(),
                                value: (*v).to_owned(),
                            }
                        })
                        .collect(),
                    ..RateLimitDescriptor::default()
                })
                .collect(),
            hits_addend: hits,
        };
        let response = self.should_rate_limit(&request)?;
        Ok(response.overall_code == Code::Ok as i32)
    }

    /// Answers a `ShouldRateLimit` request as envoyproxy/ratelimit does:
    /// each descriptor is matched and counted on its own (a descriptor
    /// over its limit does not stop the others from counting), the
    /// overall code is `OVER_LIMIT` when any enforced descriptor is over.
    pub fn should_rate_limit(
        &self,
        request: &RateLimitRequest,
    ) -> Result<RateLimitResponse, RequestError> {
        if request.domain.is_empty() {
            return Err(RequestError::EmptyDomain);
        }
        if request.descriptors.is_empty() {
            return Err(RequestError::NoDescriptors);
        }
        if self.options.floor {
            return Ok(RateLimitResponse {
                overall_code: Code::Ok as i32,
                statuses: vec![
                    DescriptorStatus {
                        code: Code::Ok as i32,
                        ..DescriptorStatus::default()
                    };
                    request.descriptors.len()
                ],
                ..RateLimitResponse::default()
            });
        }
        let generation = self.current.load();
        let mut found = Vec::with_capacity(request.descriptors.len());
        let mut entries: Vec<(&str, &str)> = Vec::new();
        for (index, d) in request.descriptors.iter().enumerate() {
            if d.entries.is_empty() {
                return Err(RequestError::EmptyDescriptor { index });
            }
            entries.clear();
            entries.extend(d.entries.iter().map(|e| (e.key.as_str(), e.value.as_str())));
            let own = d
                .limit
                .as_ref()
                .map(|l| (l.requests_per_unit, unit_of(l.unit)));
            found.push(generation.config.find(&request.domain, &entries, own));
        }
        apply_replaces(&mut found);
        let mut over = false;
        let mut statuses = Vec::with_capacity(found.len());
        for (d, f) in request.descriptors.iter().zip(&found) {
            let hits = match &d.hits_addend {
                // A descriptor's own count, 0 included (a check that takes nothing).
                Some(h) => h.value,
                // The request's, 0 meaning 1.
                None => u64::from(request.hits_addend.max(1)),
            };
            let status = match f {
                None => DescriptorStatus {
                    code: Code::Ok as i32,
                    ..DescriptorStatus::default()
                },
                Some(f) => match self.state_of(&generation, f) {
                    Some(state) => self.count(&state, f, hits, d.is_negative_hits),
                    None => {
                        add(&self.overrides_refused, 1);
                        DescriptorStatus {
                            code: Code::Ok as i32,
                            ..DescriptorStatus::default()
                        }
                    }
                },
            };
            over |= status.code == Code::OverLimit as i32;
            statuses.push(status);
        }
        let overall = if over && !self.options.global_shadow_mode {
            Code::OverLimit
        } else {
            Code::Ok
        };
        Ok(RateLimitResponse {
            overall_code: overall as i32,
            statuses,
            ..RateLimitResponse::default()
        })
    }

    /// The state of a found limit: configured, or carried by the
    /// descriptor (made on first use, up to `max_override_limits`).
    fn state_of(&self, generation: &Generation, f: &Found) -> Option<Arc<LimitState>> {
        if let Some(s) = generation.by_def.get(&def_addr(&f.limit)) {
            return Some(Arc::clone(s));
        }
        let mut overrides = self.overrides.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = overrides.get(&f.limit.id) {
            return Some(Arc::clone(s));
        }
        if overrides.len() >= self.options.max_override_limits {
            return None;
        }
        let state = Arc::new(LimitState::build(Arc::clone(&f.limit), &self.options).ok()?);
        overrides.insert(f.limit.id.clone(), Arc::clone(&state));
        Some(state)
    }

    /// Counts `hits` for one descriptor and says what to answer.
    fn count(&self, state: &LimitState, f: &Found, hits: u64, refund: bool) -> DescriptorStatus {
        let (limiter, requests_per_unit, unit) = match (&state.limiter, &state.def.kind) {
            (
                Some(l),
                LimitKind::Limited {
                    requests_per_unit,
                    unit,
                    ..
                },
            ) => (l, *requests_per_unit, *unit),
            _ => {
                return DescriptorStatus {
                    code: Code::Ok as i32,
                    limit_remaining: u32::MAX,
                    ..DescriptorStatus::default()
                }
            }
        };
        let current_limit = Some(PbLimit {
            name: state.def.name.clone().unwrap_or_default(),
            requests_per_unit,
            unit: pb_unit(unit) as i32,
        });
        let key = &f.counter_key[..];
        if refund {
            // Hits given back (the descriptor's `is_negative_hits`).
            limiter.refund_key(key, hits);
            let d = limiter.peek_key(key);
            return status(Code::Ok, current_limit, &d, true);
        }
        let stats = &state.stats;
        add(&stats.total_hits, hits);
        if hits == 0 {
            // A check that takes nothing: what is left now.
            let d = limiter.peek_key(key);
            return status(Code::Ok, current_limit, &d, true);
        }
        match limiter.check_key_n(key, hits) {
            Ok(d) if d.is_allowed() => {
                add(&stats.within_limit, hits);
                let limit = d.limit();
                let used_after = limit.saturating_sub(d.remaining());
                let used_before = used_after.saturating_sub(hits);
                let near = (limit as f64 * NEAR_LIMIT_RATIO).floor() as u64;
                if used_after > near {
                    add(&stats.near_limit, used_after - near.max(used_before));
                }
                status(Code::Ok, current_limit, &d, true)
            }
            Ok(d) => {
                add(&stats.over_limit, hits);
                if state.def.shadow_mode {
                    add(&stats.shadow_mode, hits);
                    status(Code::Ok, current_limit, &d, false)
                } else {
                    status(Code::OverLimit, current_limit, &d, false)
                }
            }
            // More hits than the limit ever admits at once: over, for good.
            Err(_) => {
                add(&stats.over_limit, hits);
                let code = if state.def.shadow_mode {
                    add(&stats.shadow_mode, hits);
                    Code::Ok
                } else {
                    Code::OverLimit
                };
                DescriptorStatus {
                    code: code as i32,
                    current_limit,
                    ..DescriptorStatus::default()
                }
            }
        }
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
