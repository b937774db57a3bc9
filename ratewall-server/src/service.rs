//! One `ShouldRateLimit` call, whatever carried it (gRPC or `/json`):
//! each descriptor's limit found in the configuration, counted in its
//! limit's table, and the answer built as envoyproxy/ratelimit builds it.

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use ratewall::redis::{FailurePolicy, RedisBackend};
use ratewall::Decision;

use crate::config::{apply_replaces, Config, Found, LimitDef, LimitKind};
use crate::headers::{response_headers, ResponseHeaders, Shown};
use crate::store::{add, finish, unit_of, Counter, LimitError, LimitState, Op, Store, Taken};
use crate::together::{self, Joint};

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
    pub(crate) max_keys: usize,
    max_override_limits: usize,
    global_shadow_mode: bool,
    floor: bool,
    all_or_nothing: bool,
    pub(crate) store: Store,
    response_headers: ResponseHeaders,
}

impl Default for ServiceOptions {
    fn default() -> Self {
        ServiceOptions {
            max_keys: 100_000,
            max_override_limits: 1024,
            global_shadow_mode: false,
            floor: false,
            all_or_nothing: false,
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

    /// All or nothing across a request's descriptors: each enforced
    /// descriptor's hits are taken from its limit only if every one of
    /// them is within its limit; a refused request takes nothing from any.
    /// Off by default: envoyproxy/ratelimit counts each descriptor on its
    /// own, so a request refused by one limit still spends the others.
    /// Shadow-mode limits, refunds and checks of 0 hits stay on their own.
    ///
    /// ```
    /// # use ratewall_server::ServiceOptions;
    /// let options = ServiceOptions::default().all_or_nothing(true);
    /// # let _ = options;
    /// ```
    #[must_use]
    pub fn all_or_nothing(mut self, on: bool) -> Self {
        self.all_or_nothing = on;
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
        let request = request(domain, descriptors, hits);
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
        // Each found limit's state, borrowed from the generation this call
        // holds (no reference count touched), or a descriptor's own limit.
        let states: Vec<Option<StateRef<'_>>> = found
            .iter()
            .map(|f| {
                let state = self.state_of(&generation, f.as_ref()?);
                if state.is_none() {
                    add(&self.overrides_refused, 1);
                }
                state
            })
            .collect();
        // Several descriptors: start every in-memory key's slot load first,
        // so that their cache misses overlap (a no-op on tables small
        // enough to stay in the caches).
        if states.len() > 1 {
            for (f, state) in found.iter().zip(&states) {
                if let (Some(f), Some(state)) = (f, state) {
                    if let Some(Counter::Memory(l)) = state.limiter.as_deref() {
                        l.prefetch_key(f.counter_key.as_slice());
                    }
                }
            }
        }
        let ok = DescriptorStatus {
            code: Code::Ok as i32,
            ..DescriptorStatus::default()
        };
        let mut statuses = vec![ok; found.len()];
        // The counted descriptors' decisions, for the IETF fields.
        let ietf = self.options.response_headers == ResponseHeaders::Ietf;
        let mut shown: Vec<(&LimitState, Decision)> = Vec::new();
        // Descriptors counted on their own, on Redis (sent together).
        let mut remote = Vec::new();
        // All or nothing: the enforced descriptors, and whether a limit
        // of 0 among them refuses the request.
        let together = self.options.all_or_nothing;
        let (mut joint, mut refused) = (Vec::new(), false);
        // Which descriptors have a quota-mode limit.
        let mut quota = vec![false; statuses.len()];
        let described = request.descriptors.iter().zip(&found).zip(&states);
        for (i, ((d, f), state)) in described.enumerate() {
            // `d`: the descriptor as sent; `f`: its limit, if any.
            let (Some(f), Some(state)) = (f, state) else {
                continue;
            };
            let state: &LimitState = state;
            quota[i] = state.def.quota_mode;
            let hits = request_hits(request, i);
            let enforced = together && !state.def.shadow_mode && hits > 0 && !d.is_negative_hits;
            let Some(counter) = state.limiter.as_deref() else {
                statuses[i] = if let LimitKind::Blocked { .. } = state.def.kind {
                    refused |= enforced;
                    finish(state, Taken::Blocked, hits, &f.stats_key)
                } else {
                    DescriptorStatus {
                        code: Code::Ok as i32,
                        limit_remaining: u32::MAX,
                        ..DescriptorStatus::default()
                    }
                };
                continue;
            };
            if enforced {
                joint.push(Joint {
                    index: i,
                    state,
                    counter,
                    key: &f.counter_key,
                    stats_key: &f.stats_key,
                    hits,
                });
                continue;
            }
            let op = Op {
                hits,
                refund: d.is_negative_hits,
            };
            match counter {
                Counter::Memory(l) => {
                    let taken = op.on_memory(l, &f.counter_key);
                    statuses[i] = finish(state, taken, hits, &f.stats_key);
                    if ietf {
                        shown.extend(taken.decision().map(|d| (state, d)));
                    }
                }
                Counter::Redis(l) => remote.push((i, state, l, f, op)),
            }
        }
        // In the joint descriptors' order.
        let answers = together::check(&joint, refused).await?;
        for (j, (i, status, decision)) in joint.iter().zip(answers) {
            statuses[i] = status;
            if ietf {
                shown.extend(decision.map(|d| (j.state, d)));
            }
        }
        if !remote.is_empty() {
            let calls = remote
                .iter()
                .map(|(_, _, l, f, op)| op.on_redis(l, &f.counter_key));
            let answers = futures_util::future::join_all(calls).await;
            for ((i, state, _, f, op), answer) in remote.iter().zip(answers) {
                let taken = answer.map_err(|e| RequestError::StoreUnavailable {
                    cause: e.to_string(),
                })?;
                statuses[*i] = finish(state, taken, op.hits, &f.stats_key);
                if ietf {
                    shown.extend(taken.decision().map(|d| (*state, d)));
                }
            }
        }
        // As envoyproxy/ratelimit: over when any descriptor is over, except
        // that quota-mode descriptors make it over only when all of them are.
        let is_over = |s: &DescriptorStatus| s.code == Code::OverLimit as i32;
        let rate_over = statuses.iter().zip(&quota).any(|(s, q)| !q && is_over(s));
        let quota_total = quota.iter().filter(|q| **q).count();
        let quota_over = statuses
            .iter()
            .zip(&quota)
            .filter(|(s, q)| **q && is_over(s))
            .count();
        let over = rate_over || (quota_total > 0 && quota_over == quota_total);
        let overall = if over && !self.options.global_shadow_mode {
            Code::OverLimit
        } else {
            Code::Ok
        };
        let items: Vec<Shown<'_>> = shown
            .iter()
            .filter_map(|&(state, decision)| match &state.def.kind {
                LimitKind::Limited { policy, .. } => Some(Shown {
                    name: state.def.name.as_deref().unwrap_or(&state.def.full_key),
                    policy: *policy,
                    decision,
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
    fn state_of<'g>(&self, generation: &'g Generation, f: &Found) -> Option<StateRef<'g>> {
        if let Some(s) = generation.by_def.get(&def_addr(&f.limit)) {
            return Some(StateRef::Configured(s));
        }
        let mut overrides = self.overrides.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = overrides.get(&f.limit.id) {
            return Some(StateRef::Own(Arc::clone(s)));
        }
        if overrides.len() >= self.options.max_override_limits {
            return None;
        }
        let state = Arc::new(LimitState::build(Arc::clone(&f.limit), &self.options).ok()?);
        overrides.insert(f.limit.id.clone(), Arc::clone(&state));
        Some(StateRef::Own(state))
    }
}

/// A found limit's state: a configured limit's, borrowed from the
/// generation the call holds, or a descriptor's own limit's, shared with
/// the service's map of them.
enum StateRef<'g> {
    Configured(&'g LimitState),
    Own(Arc<LimitState>),
}

impl std::ops::Deref for StateRef<'_> {
    type Target = LimitState;
    fn deref(&self) -> &LimitState {
        match self {
            StateRef::Configured(s) => s,
            StateRef::Own(s) => s,
        }
    }
}

/// A `ShouldRateLimit` request of `domain`, each descriptor given as its
/// `(key, value)` entries, costing `hits` (0 means 1): what a client builds
/// from Envoy's published protos, in one call.
///
/// ```
/// let r = ratewall_server::request("edge", &[&[("remote_address", "10.0.0.1")]], 1);
/// assert_eq!(r.descriptors[0].entries[0].value, "10.0.0.1");
/// ```
pub fn request(domain: &str, descriptors: &[&[(&str, &str)]], hits: u32) -> RateLimitRequest {
    RateLimitRequest {
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
