//! One `ShouldRateLimit` call, whatever carried it (gRPC or `/json`):
//! each descriptor's limit found in the configuration, counted in its
//! limit's table, and the answer built as envoyproxy/ratelimit builds it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    rate_limit::Unit as PbUnit, Code, DescriptorStatus, RateLimit as PbLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::Duration as PbDuration;
use ratewall::redis::{FailurePolicy, RedisBackend, RedisError, RedisLimiter};
use ratewall::{Decision, InsufficientCapacity, KeyedPolicyLimiter, WhenFull};

use crate::config::{apply_replaces, Config, Found, LimitDef, LimitKind, Unit};
use crate::headers::{response_headers, ResponseHeaders, Shown};

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
    store: Store,
    response_headers: ResponseHeaders,
}

/// Where limits count.
#[derive(Clone, Debug)]
enum Store {
    /// Bounded tables in this process.
    Memory,
    /// Shared through Redis.
    Redis {
        backend: RedisBackend,
        on_failure: FailurePolicy,
        deny_cache: usize,
    },
}

impl Default for ServiceOptions {
    fn default() -> Self {
        ServiceOptions {
            max_keys: 100_000,
            max_override_limits: 1024,
            global_shadow_mode: false,
            floor: false,
            store: Store::Memory,
            response_headers: ResponseHeaders::Off,
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

    /// Counts every limit in Redis (or a Redis Cluster), shared by every
    /// replica on the same store, instead of in this process. When Redis
    /// cannot answer, `on_failure` decides: admit (`Open`), refuse the call
    /// with gRPC `UNAVAILABLE` so Envoy's `failure_mode_deny` applies
    /// (`Closed`), or limit locally at this replica's share
    /// (`FallbackShare`). A key denied a moment ago is denied again without
    /// a round trip until its retry time (a deny cache of `deny_cache`
    /// keys per limit, 0 for none).
    ///
    /// ```no_run
    /// use ratewall::redis::{FailurePolicy, RedisBackend};
    /// use ratewall_server::ServiceOptions;
    ///
    /// let backend = RedisBackend::builder("redis://127.0.0.1:6379").build()?;
    /// let options = ServiceOptions::default().redis(backend, FailurePolicy::Open, 10_000);
    /// # let _ = options;
    /// # Ok::<(), ratewall::redis::RedisError>(())
    /// ```
    #[must_use]
    pub fn redis(
        mut self,
        backend: RedisBackend,
        on_failure: FailurePolicy,
        deny_cache: usize,
    ) -> Self {
        self.store = Store::Redis {
            backend,
            on_failure,
            deny_cache,
        };
        self
    }

    /// The rate-limit fields the answer asks Envoy to add to its response
    /// (`response_headers_to_add`): none by default.
    ///
    /// ```
    /// use ratewall_server::{ResponseHeaders, ServiceOptions};
    /// let options = ServiceOptions::default().response_headers(ResponseHeaders::Draft03);
    /// # let _ = options;
    /// ```
    #[must_use]
    pub fn response_headers(mut self, mode: ResponseHeaders) -> Self {
        self.response_headers = mode;
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

/// Where one limit counts.
#[derive(Debug)]
enum Counter {
    Memory(KeyedPolicyLimiter<Vec<u8>>),
    Redis(RedisLimiter),
}

/// A limit that cannot be built, and which.
#[derive(Debug)]
#[non_exhaustive]
pub enum LimitError {
    /// The policy is outside ratewall's bounds.
    Policy {
        /// The limit (its stats key, `domain.key_value`).
        limit: String,
        /// Why.
        error: ratewall::ConfigError,
    },
    /// Redis cannot run the limit (a policy its arithmetic cannot hold
    /// exactly, or a bad setting).
    Redis {
        /// The limit.
        limit: String,
        /// Why.
        error: RedisError,
    },
}

impl std::fmt::Display for LimitError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LimitError::Policy { limit, error } => write!(f, "limit `{limit}`: {error}"),
            LimitError::Redis { limit, error } => write!(f, "limit `{limit}` on Redis: {error}"),
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
    limiter: Option<Arc<Counter>>,
    pub(crate) stats: Arc<LimitStats>,
}

impl LimitState {
    fn build(def: Arc<LimitDef>, options: &ServiceOptions) -> Result<LimitState, LimitError> {
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
    ) -> Result<Generation, LimitError> {
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
    /// Redis could not answer and the failure policy is `Closed`: no
    /// answer is given (gRPC `UNAVAILABLE`; Envoy's `failure_mode_deny`
    /// decides).
    StoreUnavailable {
        /// What failed, and when Redis is tried again.
        cause: String,
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
            RequestError::StoreUnavailable { cause } => f.write_str(cause),
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
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let yaml = "domain: api\ndescriptors:\n  - key: user\n    rate_limit: { unit: minute, requests_per_unit: 2 }\n";
/// let config = Config::from_sources(&[("api.yaml".into(), yaml.into())])?;
/// let service = Service::new(config, ServiceOptions::default())?;
/// let ada: &[(&str, &str)] = &[("user", "ada")];
/// assert!(service.check("api", &[ada], 1).await?);
/// assert!(service.check("api", &[ada], 1).await?);
/// assert!(!service.check("api", &[ada], 1).await?); // the third in the minute is over
/// # Ok(())
/// # }
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
    pub fn new(config: Config, options: ServiceOptions) -> Result<Service, LimitError> {
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
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let load = |n: u32| {
    ///     let yaml = format!("domain: api\ndescriptors:\n  - key: user\n    rate_limit: {{ unit: minute, requests_per_unit: {n} }}\n");
    ///     Config::from_sources(&[("api.yaml".into(), yaml)]).unwrap()
    /// };
    /// let service = Service::new(load(1), ServiceOptions::default())?;
    /// let ada: &[(&str, &str)] = &[("user", "ada")];
    /// assert!(service.check("api", &[ada], 1).await?);
    /// service.replace_config(load(1))?; // unchanged: the count is kept
    /// assert!(!service.check("api", &[ada], 1).await?);
    /// service.replace_config(load(5))?; // a new limit counts afresh
    /// assert!(service.check("api", &[ada], 1).await?);
    /// # Ok(())
    /// # }
    /// ```
    pub fn replace_config(&self, config: Config) -> Result<(), LimitError> {
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
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let yaml = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { unit: second, requests_per_unit: 1 }\n";
    /// let s = Service::new(Config::from_sources(&[("d.yaml".into(), yaml.into())])?, ServiceOptions::default())?;
    /// assert!(s.check("d", &[&[("k", "v")]], 1).await?);
    /// assert!(s.check("d", &[&[("other", "v")]], 1).await?); // no limit matches
    /// # Ok(())
    /// # }
    /// ```
    pub async fn check(
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
                        .map(|(k, v)| Entry {
                            key: (*k).to_owned(),
                            value: (*v).to_owned(),
                        })
                        .collect(),
                    ..RateLimitDescriptor::default()
                })
                .collect(),
            hits_addend: hits,
        };
        let response = self.should_rate_limit(&request).await?;
        Ok(response.overall_code == Code::Ok as i32)
    }

    /// Answers a `ShouldRateLimit` request as envoyproxy/ratelimit does:
    /// each descriptor is matched and counted on its own (a descriptor
    /// over its limit does not stop the others from counting), the
    /// overall code is `OVER_LIMIT` when any enforced descriptor is over.
    /// In memory the answer is ready at once; on Redis the descriptors'
    /// calls go out together (batched with other requests').
    pub async fn should_rate_limit(
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
        let generation = self.current.load_full();
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
        let ok = DescriptorStatus {
            code: Code::Ok as i32,
            ..DescriptorStatus::default()
        };
        let mut statuses = vec![ok; found.len()];
        let mut remote = Vec::new();
        // The counted descriptors' decisions, for the IETF fields.
        let ietf = self.options.response_headers == ResponseHeaders::Ietf;
        let mut shown: Vec<(Arc<LimitState>, Decision)> = Vec::new();
        for (i, (d, f)) in request.descriptors.iter().zip(&found).enumerate() {
            // `d`: the descriptor as sent; `f`: its limit, if any.
            let Some(f) = f else { continue };
            let Some(state) = self.state_of(&generation, f) else {
                add(&self.overrides_refused, 1);
                continue;
            };
            let hits = request_hits(request, i);
            let Some(counter) = state.limiter.clone() else {
                statuses[i] = if let LimitKind::Blocked { .. } = state.def.kind {
                    finish(&state, Taken::Blocked, hits)
                } else {
                    DescriptorStatus {
                        code: Code::Ok as i32,
                        limit_remaining: u32::MAX,
                        ..DescriptorStatus::default()
                    }
                };
                continue;
            };
            let op = Op {
                hits,
                refund: d.is_negative_hits,
            };
            match &*counter {
                Counter::Memory(l) => {
                    let taken = op.on_memory(l, &f.counter_key);
                    statuses[i] = finish(&state, taken, hits);
                    if ietf {
                        shown.extend(taken.decision().map(|d| (Arc::clone(&state), d)));
                    }
                }
                Counter::Redis(_) => remote.push((i, state, counter, f.counter_key.clone(), op)),
            }
        }
        if !remote.is_empty() {
            let calls = remote.iter().map(|(_, _, counter, key, op)| async move {
                match &**counter {
                    Counter::Redis(l) => op.on_redis(l, key).await,
                    Counter::Memory(l) => Ok(op.on_memory(l, key)),
                }
            });
            let answers = futures_util::future::join_all(calls).await;
            for ((i, state, ..), answer) in remote.iter().zip(answers) {
                let taken = answer.map_err(|e| RequestError::StoreUnavailable {
                    cause: e.to_string(),
                })?;
                statuses[*i] = finish(state, taken, request_hits(request, *i));
                if ietf {
                    shown.extend(taken.decision().map(|d| (Arc::clone(state), d)));
                }
            }
        }
        let over = statuses.iter().any(|s| s.code == Code::OverLimit as i32);
        let overall = if over && !self.options.global_shadow_mode {
            Code::OverLimit
        } else {
            Code::Ok
        };
        let items: Vec<Shown<'_>> = shown
            .iter()
            .filter_map(|(state, decision)| match &state.def.kind {
                LimitKind::Limited { policy, .. } => Some(Shown {
                    name: state.def.name.as_deref().unwrap_or(&state.def.full_key),
                    policy: *policy,
                    decision: *decision,
                }),
                _ => None,
            })
            .collect();
        let response_headers_to_add =
            response_headers(self.options.response_headers, &items, &statuses);
        Ok(RateLimitResponse {
            overall_code: overall as i32,
            statuses,
            response_headers_to_add,
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
}

/// The hits of descriptor `i`: its own count, 0 included (a check that
/// takes nothing), or else the request's, 0 meaning 1.
fn request_hits(request: &RateLimitRequest, i: usize) -> u64 {
    match &request.descriptors[i].hits_addend {
        Some(h) => h.value,
        None => u64::from(request.hits_addend.max(1)),
    }
}

/// What one descriptor asks of its counter.
#[derive(Clone, Copy, Debug)]
struct Op {
    hits: u64,
    /// Give `hits` back (the descriptor's `is_negative_hits`).
    refund: bool,
}

/// What a counter answered, whichever store it is in.
#[derive(Clone, Copy, Debug)]
enum Taken {
    /// `hits` were asked for: the decision, or a cost the limit never admits.
    Checked(Result<Decision, InsufficientCapacity>),
    /// Nothing was taken (0 hits, or a refund): what is left.
    Looked(Decision),
    /// A limit of 0 (`requests_per_unit: 0`): every hit is over.
    Blocked,
}

impl Taken {
    /// The decision, when the counter gave one.
    fn decision(self) -> Option<Decision> {
        match self {
            Taken::Checked(Ok(d)) | Taken::Looked(d) => Some(d),
            _ => None,
        }
    }
}

impl Op {
    fn on_memory(self, l: &KeyedPolicyLimiter<Vec<u8>>, key: &[u8]) -> Taken {
        if self.refund {
            l.refund_key(key, self.hits);
            Taken::Looked(l.peek_key(key))
        } else if self.hits == 0 {
            Taken::Looked(l.peek_key(key))
        } else {
            Taken::Checked(l.check_key_n(key, self.hits))
        }
    }

    async fn on_redis(self, l: &RedisLimiter, key: &[u8]) -> Result<Taken, RedisError> {
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

/// Counts a descriptor's answer in its limit's stats and says what to
/// answer.
fn finish(state: &LimitState, taken: Taken, hits: u64) -> DescriptorStatus {
    let (requests_per_unit, unit) = match &state.def.kind {
        LimitKind::Limited {
            requests_per_unit,
            unit,
            ..
        } => (*requests_per_unit, *unit),
        LimitKind::Blocked { unit } => (0, *unit),
        _ => (0, Unit::Unknown),
    };
    let current_limit = Some(PbLimit {
        name: state.def.name.clone().unwrap_or_default(),
        requests_per_unit,
        unit: pb_unit(unit) as i32,
    });
    let stats = &state.stats;
    let over = |stats: &LimitStats| {
        add(&stats.over_limit, hits);
        if state.def.shadow_mode {
            add(&stats.shadow_mode, hits);
            Code::Ok
        } else {
            Code::OverLimit
        }
    };
    add(&stats.total_hits, hits);
    let checked = match taken {
        Taken::Looked(d) => return status(Code::Ok, current_limit, &d, true),
        Taken::Checked(c) => c,
        Taken::Blocked => {
            // As envoyproxy/ratelimit answers a limit of 0: over, until
            // the end of the unit's current window (of wall-clock time).
            let code = over(stats);
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
