//! A tower layer that checks per-IP, per-user and per-route limits in one
//! all-or-nothing step, and answers with `429`, `Retry-After` and the IETF
//! `RateLimit` fields. Behind the `tower` feature.
//!
//! ```
//! use axum::{routing::get, Router};
//! use ratewall::http::{ClientIp, RateLimitLayer, Rule};
//! use ratewall::{Policy, Rate, Window};
//!
//! let limits = RateLimitLayer::builder()
//!     .client_ip(ClientIp::behind_proxies(["10.0.0.0/8".parse()?]))
//!     .rule(Rule::per_ip("ip", Policy::token_bucket(Rate::per_minute(600).burst(100))))
//!     .rule(Rule::per_header("key", "x-api-key", Policy::sliding_window_counter(Window::per_hour(5000))))
//!     .rule(Rule::per_ip("login", Policy::sliding_window_log(Window::per_minute(5)))
//!         .on_path_prefix("/login")
//!         .hide_headers())
//!     .build()?;
//! let app: Router = Router::new().route("/", get(|| async { "hello" })).layer(limits);
//! # let _ = app;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # How a request is checked
//!
//! 1. A skip predicate or an allow-listed client address passes the request
//!    through untouched.
//! 2. Every rule that is not off and matches the request gets its key and
//!    cost. A rule without a key skips, or rejects the request (as the rule
//!    says) before anything is charged.
//! 3. The enforced rules are checked together with
//!    [`check_each`](crate::check_each)'s protocol: one clock read, all or nothing.
//!    If one denies, the others give back what they took and the request
//!    gets a 429.
//! 4. Shadow rules are checked after an admitted request (never rejecting).
//! 5. The response gets the headers, and count-only-failures rules give
//!    their units back when the inner service answers 2xx or 3xx.
//!
//! With local limits nothing is allocated per request beyond the header
//! values `http` itself copies (one per header written) and, only if
//! [`RateLimitBuilder::decisions_extension`] is on, the request extension.
//!
//! # Redis rules (features `tower` and `redis`)
//!
//! `Rule::redis` checks a rule against a
//! `ratewall::redis::RedisLimiter` instead of a local table. A
//! request that matches a Redis rule takes an asynchronous path inside
//! [`ResponseFuture`] (polled by the server's runtime; the layer creates
//! none): the Redis rules first, all or nothing among themselves
//! (`ratewall::redis::check_all`: one script on one server), then
//! the local rules through the same synchronous check, and a local denial
//! gives the Redis units back. A layer with only local rules never takes
//! that path. `docs/http.md` describes the brief window between a Redis
//! take and a local denial's refund, and each failure policy.
//!
//! The service needs `S: Clone + Send + 'static` and a `Send + 'static`
//! request body (axum routers, tonic services and `service_fn` closures
//! qualify): a request that waits for Redis calls the inner service from
//! the future. The bounds are the same with and without the `redis`
//! feature, so turning it on never breaks a build.

#[cfg(feature = "serde")]
mod config;
mod headers;
mod key;
#[cfg(feature = "redis")]
mod remote;
mod response;
mod rule;

#[cfg(feature = "serde")]
pub use config::{LayerConfig, RuleConfig};
pub use headers::{Headers, Items};
pub use key::{Cidr, CidrParseError, ClientIp, ProxyHeader, MAX_HOPS};
pub use response::{Rejection, ResponseBody, RuleDecision};
pub use rule::{Key, Missing, Mode, Rule};

use crate::clock::Clock;
use crate::decision::{Decision, Tracking};
use crate::error::{ConfigError, InsufficientCapacity};
use crate::keyed::{KeyedPolicyLimiter, KeyedRef};
use crate::limiter::DefaultClock;
use crate::multi::{check_set, LimitCalls, LimitSet};
#[cfg(feature = "redis")]
use crate::redis::{check_all, DecisionSource, RedisError, RedisLimiter};
use crate::sync::{AtomicU64, Ordering};
use crate::text::ParseError;
use bytes::Bytes;
use crossbeam_utils::CachePadded;
use headers::{closer_to_exhaustion, Buf};
use http::header::{HeaderName, HeaderValue, RETRY_AFTER};
use http::{HeaderMap, Method, Request, Response, StatusCode, Uri};
use key::{Fingerprint, Resolved};
use pin_project_lite::pin_project;
use rule::{RequestParts, Visibility};
use smallvec::SmallVec;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Once};
use std::task::{ready, Context, Poll};
use tower_layer::Layer;
use tower_service::Service;

/// How many matching rules fit on the stack; more spill to the heap.
const INLINE_RULES: usize = 4;

/// How many requests are looked at for `X-Forwarded-For` when no proxy is
/// trusted (the misconfiguration warning).
const XFF_CHECKS: u64 = 4096;

const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
const X_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
const X_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
const X_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");
const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

/// A layer configuration that cannot be built, and what to change.
///
/// ```
/// use ratewall::http::{HttpConfigError, RateLimitLayer, Rule};
/// use ratewall::{Policy, Rate};
///
/// let err = RateLimitLayer::builder()
///     .rule(Rule::per_ip("per ip", Policy::token_bucket(Rate::per_second(1))))
///     .build()
///     .unwrap_err();
/// assert!(matches!(err, HttpConfigError::InvalidRuleName { .. }));
/// println!("{err}");
/// ```
#[non_exhaustive]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HttpConfigError {
    /// A rule name that is not a structured-field token.
    InvalidRuleName {
        /// The name given.
        name: String,
    },
    /// Two rules with one name.
    DuplicateRuleName {
        /// The name given twice.
        name: String,
    },
    /// A header key whose header name is not valid.
    InvalidHeaderName {
        /// The rule.
        rule: String,
    },
    /// A rule's policy or table settings are invalid.
    Policy {
        /// The rule.
        rule: String,
        /// What is wrong with it.
        error: ConfigError,
    },
    /// A rule's constant cost exceeds what its policy can ever admit.
    CostTooHigh {
        /// The rule.
        rule: String,
        /// The cost.
        cost: u64,
        /// The policy's limit.
        limit: u64,
    },
    /// More than 65,535 rules.
    TooManyRules,
    /// A value in a configuration (`LayerConfig`, `RuleConfig`; features
    /// `tower` and `serde`) that cannot be used.
    InvalidValue {
        /// The rule's name, or `None` for a field of the layer.
        rule: Option<String>,
        /// The field, as written in the file (`methods`, `trusted_proxies`).
        field: &'static str,
        /// The value, as written.
        value: String,
        /// What the field takes.
        expected: &'static str,
    },
    /// A rule's `policy` text that does not parse
    /// (`docs/configuration.md` gives the grammar).
    PolicyText {
        /// The rule.
        rule: String,
        /// The token that is wrong and what was expected.
        error: ParseError,
    },
    /// A rule with `store = "redis"` in a configuration built without a
    /// Redis backend ([`LayerConfig::to_builder`] instead of
    /// `LayerConfig::to_builder_with_redis`).
    RedisBackendMissing {
        /// The rule.
        rule: String,
    },
    /// A rule with `store = "redis"` while ratewall was compiled without
    /// its `redis` feature.
    RedisFeatureMissing {
        /// The rule.
        rule: String,
    },
    /// A Redis rule's limiter could not be made (feature `redis`).
    #[cfg(feature = "redis")]
    Redis {
        /// The rule.
        rule: String,
        /// What is wrong with it.
        error: crate::redis::RedisError,
    },
}

impl fmt::Display for HttpConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HttpConfigError::InvalidRuleName { name } => write!(
                f,
                "rule name {name:?} is not usable in RateLimit headers: use 1 to 64 characters, \
                 a letter first, then letters, digits or !#$%&'*+-.^_`|~:/"
            ),
            HttpConfigError::DuplicateRuleName { name } => {
                write!(f, "two rules are named {name:?}: give each rule its own name")
            }
            HttpConfigError::InvalidHeaderName { rule } => write!(
                f,
                "rule {rule:?} is keyed by a header whose name is not a valid HTTP header name"
            ),
            HttpConfigError::Policy { rule, error } => write!(f, "rule {rule:?}: {error}"),
            HttpConfigError::CostTooHigh { rule, cost, limit } => write!(
                f,
                "rule {rule:?} charges {cost} units per request but its policy admits at most {limit}: \
                 lower the cost or raise the limit"
            ),
            HttpConfigError::TooManyRules => {
                f.write_str("a layer takes at most 65,535 rules: combine keys instead")
            }
            HttpConfigError::InvalidValue {
                rule,
                field,
                value,
                expected,
            } => {
                if let Some(rule) = rule {
                    write!(f, "rule {rule:?}, ")?;
                }
                write!(
                    f,
                    "field `{field}`: {value:?} is not usable; expected {expected}"
                )
            }
            HttpConfigError::PolicyText { rule, error } => {
                write!(f, "rule {rule:?}, field `policy`: {error}")
            }
            HttpConfigError::RedisBackendMissing { rule } => write!(
                f,
                "rule {rule:?} keeps its state in Redis (`store = \"redis\"`), but the layer was \
                 built without a Redis backend: build it with \
                 `LayerConfig::to_builder_with_redis(&backend)`, or set `store = \"local\"`"
            ),
            HttpConfigError::RedisFeatureMissing { rule } => write!(
                f,
                "rule {rule:?} keeps its state in Redis (`store = \"redis\"`), but ratewall was \
                 compiled without its `redis` feature: enable it \
                 (`features = [\"tower\", \"serde\", \"redis\"]`), or set `store = \"local\"`"
            ),
            #[cfg(feature = "redis")]
            HttpConfigError::Redis { rule, error } => write!(f, "rule {rule:?}: {error}"),
        }
    }
}

impl std::error::Error for HttpConfigError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            HttpConfigError::Policy { error, .. } => Some(error),
            HttpConfigError::PolicyText { error, .. } => Some(error),
            #[cfg(feature = "redis")]
            HttpConfigError::Redis { error, .. } => Some(error),
            _ => None,
        }
    }
}

/// What a request is checked against: a skip predicate over the request head.
type SkipFn = fn(&Method, &Uri, &HeaderMap) -> bool;
type Responder = Arc<dyn Fn(&Rejection<'_>) -> Response<Bytes> + Send + Sync>;

/// Builds a [`RateLimitLayer`].
///
/// ```
/// use ratewall::http::{Headers, Items, RateLimitLayer, Rule};
/// use ratewall::{ManualClock, Policy, Rate};
///
/// let layer = RateLimitLayer::builder()
///     .clock(ManualClock::new())
///     .headers(Headers::Draft(Items::ClosestToExhaustion))
///     .skip(|_, uri, _| uri.path() == "/health")
///     .allow(["127.0.0.1".parse()?])
///     .rule(Rule::per_ip("ip", Policy::token_bucket(Rate::per_second(10))))
///     .build()?;
/// # let _ = layer;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[must_use = "a builder does nothing until `build`"]
pub struct RateLimitBuilder<C: Clock = DefaultClock> {
    rules: Vec<Rule>,
    client_ip: ClientIp,
    headers: Headers,
    skip: Option<SkipFn>,
    allow: Vec<Cidr>,
    responder: Option<Responder>,
    decisions_extension: bool,
    clock: C,
}

impl<C: Clock> fmt::Debug for RateLimitBuilder<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitBuilder")
            .field("rules", &self.rules)
            .field("client_ip", &self.client_ip)
            .field("headers", &self.headers)
            .field("skip", &self.skip.is_some())
            .field("allow", &self.allow)
            .field("responder", &self.responder.is_some())
            .field("decisions_extension", &self.decisions_extension)
            .field("clock", &self.clock)
            .finish()
    }
}

impl<C: Clock + Clone> RateLimitBuilder<C> {
    /// Adds a rule. Rules are checked together; their order is the order of
    /// the items in the `RateLimit` headers.
    ///
    /// ```
    /// # use ratewall::http::{RateLimitLayer, Rule};
    /// # use ratewall::{Policy, Rate};
    /// let layer = RateLimitLayer::builder()
    ///     .rule(Rule::global("all", Policy::token_bucket(Rate::per_second(1000))))
    ///     .build()?;
    /// # let _ = layer;
    /// # Ok::<(), ratewall::http::HttpConfigError>(())
    /// ```
    pub fn rule(mut self, rule: Rule) -> Self {
        self.rules.push(rule);
        self
    }

    /// How the client's address is found (default: the TCP peer only).
    ///
    /// ```
    /// # use ratewall::http::{ClientIp, RateLimitLayer};
    /// let b = RateLimitLayer::builder().client_ip(ClientIp::behind_hops(1));
    /// # let _ = b;
    /// ```
    pub fn client_ip(mut self, client_ip: ClientIp) -> Self {
        self.client_ip = client_ip;
        self
    }

    /// Which rate-limit headers to send (default: the draft's, every rule).
    ///
    /// ```
    /// # use ratewall::http::{Headers, RateLimitLayer};
    /// let b = RateLimitLayer::builder().headers(Headers::Legacy);
    /// # let _ = b;
    /// ```
    pub fn headers(mut self, headers: Headers) -> Self {
        self.headers = headers;
        self
    }

    /// Requests for which `skip` returns true pass through unlimited (health
    /// checks, metrics).
    ///
    /// ```
    /// # use ratewall::http::RateLimitLayer;
    /// let b = RateLimitLayer::builder().skip(|_, uri, _| uri.path().starts_with("/health"));
    /// # let _ = b;
    /// ```
    pub fn skip(mut self, skip: SkipFn) -> Self {
        self.skip = Some(skip);
        self
    }

    /// Clients inside these networks pass through unlimited (internal
    /// callers). The client is the address [`ClientIp`] finds.
    ///
    /// ```
    /// # use ratewall::http::RateLimitLayer;
    /// let b = RateLimitLayer::builder().allow(["10.0.0.0/8".parse()?]);
    /// # let _ = b;
    /// # Ok::<(), ratewall::http::CidrParseError>(())
    /// ```
    pub fn allow(mut self, networks: impl IntoIterator<Item = Cidr>) -> Self {
        self.allow.extend(networks);
        self
    }

    /// Builds the 429 response (body, status, headers of your own). The
    /// layer then adds `Retry-After` and the rate-limit headers that the
    /// response does not already have.
    ///
    /// ```
    /// # use ratewall::http::RateLimitLayer;
    /// let b = RateLimitLayer::builder().responder(|r| {
    ///     http::Response::builder()
    ///         .status(429)
    ///         .body(bytes::Bytes::from(format!("retry in {} s", r.retry_after_secs())))
    ///         .unwrap()
    /// });
    /// # let _ = b;
    /// ```
    pub fn responder(
        mut self,
        responder: impl Fn(&Rejection<'_>) -> Response<Bytes> + Send + Sync + 'static,
    ) -> Self {
        self.responder = Some(Arc::new(responder));
        self
    }

    /// Puts the per-rule decisions into the request's extensions as
    /// [`RateLimitInfo`] for handlers (off by default: `http`'s
    /// `Extensions` allocates on insert).
    ///
    /// ```
    /// # use ratewall::http::RateLimitLayer;
    /// let b = RateLimitLayer::builder().decisions_extension(true);
    /// # let _ = b;
    /// ```
    pub fn decisions_extension(mut self, on: bool) -> Self {
        self.decisions_extension = on;
        self
    }

    /// The clock the rules' limiters read (tests use
    /// [`ManualClock`](crate::ManualClock)).
    ///
    /// ```
    /// # use ratewall::http::RateLimitLayer;
    /// # use ratewall::ManualClock;
    /// let b = RateLimitLayer::builder().clock(ManualClock::new());
    /// # let _ = b;
    /// ```
    pub fn clock<C2: Clock + Clone>(self, clock: C2) -> RateLimitBuilder<C2> {
        RateLimitBuilder {
            rules: self.rules,
            client_ip: self.client_ip,
            headers: self.headers,
            skip: self.skip,
            allow: self.allow,
            responder: self.responder,
            decisions_extension: self.decisions_extension,
            clock,
        }
    }

    /// Validates every rule and builds its limiter.
    ///
    /// ```
    /// # use ratewall::http::{HttpConfigError, RateLimitLayer, Rule};
    /// # use ratewall::{Policy, Rate};
    /// let err = RateLimitLayer::builder()
    ///     .rule(Rule::per_ip("ip", Policy::token_bucket(Rate::per_second(1).burst(2))).cost(3))
    ///     .build()
    ///     .unwrap_err();
    /// assert!(matches!(err, HttpConfigError::CostTooHigh { cost: 3, limit: 2, .. }));
    /// ```
    pub fn build(self) -> Result<RateLimitLayer<C>, HttpConfigError> {
        if self.rules.len() > usize::from(u16::MAX) {
            return Err(HttpConfigError::TooManyRules);
        }
        let mut rules = Vec::with_capacity(self.rules.len());
        for (i, rule) in self.rules.into_iter().enumerate() {
            let name = rule.name.clone();
            if !rule::valid_name(&name) {
                return Err(HttpConfigError::InvalidRuleName { name });
            }
            if rules
                .iter()
                .take(i)
                .any(|r: &Compiled<C>| r.rule.name == name)
            {
                return Err(HttpConfigError::DuplicateRuleName { name });
            }
            if rule.key.has_invalid_header() {
                return Err(HttpConfigError::InvalidHeaderName { rule: name });
            }
            let policy_error = |error| HttpConfigError::Policy {
                rule: name.clone(),
                error,
            };
            rule.policy.validate().map_err(policy_error)?;
            if let rule::Cost::Units(cost) = rule.cost {
                if cost > rule.policy.limit() {
                    return Err(HttpConfigError::CostTooHigh {
                        rule: name,
                        cost,
                        limit: rule.policy.limit(),
                    });
                }
            }
            let limit = match remote_of(&rule) {
                #[cfg(feature = "redis")]
                Some(l) => RuleLimit::Redis(l),
                _ => {
                    let mut b =
                        KeyedPolicyLimiter::<u128>::builder(rule.policy).clock(self.clock.clone());
                    if let Some(m) = rule.max_keys {
                        b = b.max_keys(m);
                    }
                    if let Some(w) = rule.when_full {
                        b = b.when_full(w);
                    }
                    RuleLimit::Local(b.build().map_err(policy_error)?)
                }
            };
            let mut item = Buf::new();
            item.policy_item(&rule.name, &rule.policy);
            rules.push(Compiled {
                limit,
                policy_item: item.value(),
                ratelimit_prefix: format!("\"{}\";r=", rule.name).into_bytes().into(),
                counters: CachePadded::new(Counters::default()),
                always: rule.mode != Mode::Off && rule.matcher.matches_all(),
                rule,
            });
        }
        let needs_ip = !self.allow.is_empty()
            || rules
                .iter()
                .any(|r| r.rule.mode != Mode::Off && r.rule.key.needs_client_ip());
        let names = rules
            .iter()
            .map(|r| Box::from(r.rule.name.as_str()))
            .collect();
        let any_refund = rules.iter().any(|r| r.rule.refund_on_success);
        // Every rule's cost is a constant of at most one unit (a unit cost
        // always fits: the all-or-nothing check skips its capacity check).
        let unit_costs = rules
            .iter()
            .all(|r| matches!(r.rule.cost, rule::Cost::Units(0 | 1)));
        let plain = rules
            .iter()
            .all(|r| r.rule.mode != Mode::Shadow && r.local().is_some());
        // The `RateLimit-Policy` value when every shown rule matches (the
        // common case: rules without matchers), rendered once.
        let shown: Vec<usize> = (0..rules.len())
            .filter(|&i| {
                rules[i].rule.visibility == Visibility::Shown && rules[i].rule.mode != Mode::Off
            })
            .collect();
        let all_policy = if shown.len() > 1 && rules.len() <= 64 {
            let mut b = Buf::new();
            for &i in &shown {
                b.item(
                    rules[i]
                        .policy_item
                        .as_ref()
                        .map_or(&[][..], |v| v.as_bytes()),
                );
            }
            b.value()
                .map(|v| (shown.iter().fold(0u64, |m, &i| m | 1 << i), v))
        } else {
            None
        };
        if let Some((a, b)) = charged_twice(&rules) {
            warn_now(&format!(
                "rules {a:?} and {b:?} charge the same requests under the same key with the same \
                 policy: each request is counted twice; remove one"
            ));
        }
        Ok(RateLimitLayer {
            shared: Arc::new(Shared {
                rules,
                names,
                client_ip: self.client_ip,
                needs_ip,
                headers: self.headers,
                skip: self.skip,
                allow: self.allow,
                responder: self.responder,
                decisions_extension: self.decisions_extension,
                any_refund,
                plain,
                unit_costs,
                keep_decisions: self.headers != Headers::None
                    || self.decisions_extension
                    || any_refund
                    || !plain,
                all_policy,
                fp: Fingerprint::new(),
                warn_xff: Once::new(),
                xff_checks: AtomicU64::new(0),
                warn_no_peer: Once::new(),
            }),
        })
    }
}

/// The Redis limiter of a remote rule.
#[cfg(feature = "redis")]
fn remote_of(rule: &Rule) -> Option<Arc<RedisLimiter>> {
    rule.remote.clone()
}

#[cfg(not(feature = "redis"))]
fn remote_of(_: &Rule) -> Option<std::convert::Infallible> {
    None
}

/// Two enforced rules that count the same requests under the same key with
/// the same policy: one limit charged twice for each request.
fn charged_twice<C: Clock>(rules: &[Compiled<C>]) -> Option<(String, String)> {
    let sig = |r: &Rule| {
        (r.mode == Mode::Enforce).then(|| {
            format!(
                "{:?}|{:?}|{:?}|{:?}|{}",
                r.key,
                r.policy,
                r.matcher,
                match r.cost {
                    rule::Cost::Units(n) => Some(n),
                    rule::Cost::Fn(_) => None,
                },
                remote_id(r)
            )
        })
    };
    for (i, a) in rules.iter().enumerate() {
        let Some(sa) = sig(&a.rule) else { continue };
        for b in &rules[i + 1..] {
            if sig(&b.rule).as_ref() == Some(&sa) {
                return Some((a.rule.name.clone(), b.rule.name.clone()));
            }
        }
    }
    None
}

/// Which limit a rule charges: its own local table, or a Redis limiter
/// (rules sharing one limiter share its keys).
fn remote_id(r: &Rule) -> String {
    #[cfg(feature = "redis")]
    if let Some(l) = &r.remote {
        return format!("{:p}", Arc::as_ptr(l));
    }
    let _ = r;
    String::new()
}

fn warn_now(message: &str) {
    #[cfg(feature = "tracing")]
    tracing::warn!(target: "ratewall::http", "{message}");
    #[cfg(not(feature = "tracing"))]
    eprintln!("ratewall::http warning: {message}");
}

/// The rate-limiting layer. Cheap to clone: every clone shares the limits.
///
/// ```
/// use ratewall::http::{RateLimitLayer, Rule};
/// use ratewall::{Policy, Rate};
///
/// let layer = RateLimitLayer::builder()
///     .rule(Rule::per_ip("ip", Policy::token_bucket(Rate::per_minute(100))))
///     .build()?;
/// assert_eq!(layer.stats()[0].name(), "ip");
/// # Ok::<(), ratewall::http::HttpConfigError>(())
/// ```
pub struct RateLimitLayer<C: Clock = DefaultClock> {
    shared: Arc<Shared<C>>,
}

impl<C: Clock> Clone for RateLimitLayer<C> {
    fn clone(&self) -> Self {
        RateLimitLayer {
            shared: self.shared.clone(),
        }
    }
}

impl<C: Clock> fmt::Debug for RateLimitLayer<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayer")
            .field("rules", &self.shared.rules.len())
            .field("client_ip", &self.shared.client_ip)
            .field("headers", &self.shared.headers)
            .finish()
    }
}

impl RateLimitLayer<DefaultClock> {
    /// A builder with no rules, the TCP peer as the client, the draft
    /// headers and the default clock.
    ///
    /// ```
    /// # use ratewall::http::RateLimitLayer;
    /// let layer = RateLimitLayer::builder().build()?; // no rules: passes everything
    /// # let _ = layer;
    /// # Ok::<(), ratewall::http::HttpConfigError>(())
    /// ```
    pub fn builder() -> RateLimitBuilder<DefaultClock> {
        RateLimitBuilder {
            rules: Vec::new(),
            client_ip: ClientIp::peer(),
            headers: Headers::default(),
            skip: None,
            allow: Vec::new(),
            responder: None,
            decisions_extension: false,
            clock: DefaultClock::default(),
        }
    }
}

impl<C: Clock> RateLimitLayer<C> {
    /// Each rule's counters, in rule order.
    ///
    /// ```
    /// # use ratewall::http::{RateLimitLayer, Rule};
    /// # use ratewall::{Policy, Rate};
    /// let layer = RateLimitLayer::builder()
    ///     .rule(Rule::global("all", Policy::token_bucket(Rate::per_second(1))))
    ///     .build()?;
    /// assert_eq!(layer.stats()[0].allowed(), 0);
    /// # Ok::<(), ratewall::http::HttpConfigError>(())
    /// ```
    pub fn stats(&self) -> Vec<RuleStats> {
        self.shared
            .rules
            .iter()
            .map(|r| {
                // Relaxed: independent counters; a snapshot may be mid-request.
                let c = &r.counters;
                RuleStats {
                    name: r.rule.name.clone(),
                    allowed: c.allowed.load(Ordering::Relaxed),
                    denied: c.denied.load(Ordering::Relaxed),
                    shadow_denied: c.shadow_denied.load(Ordering::Relaxed),
                    missing_key: c.missing_key.load(Ordering::Relaxed),
                    errors: c.errors.load(Ordering::Relaxed),
                    fallbacks: c.fallbacks.load(Ordering::Relaxed),
                    untracked: c.untracked.load(Ordering::Relaxed),
                    refunded: c.refunded.load(Ordering::Relaxed),
                }
            })
            .collect()
    }
}

impl<S, C: Clock> Layer<S> for RateLimitLayer<C> {
    type Service = RateLimitService<S, C>;

    fn layer(&self, inner: S) -> RateLimitService<S, C> {
        RateLimitService {
            inner,
            shared: self.shared.clone(),
        }
    }
}

/// One rule's counters (a snapshot from [`RateLimitLayer::stats`]).
///
/// ```
/// # use ratewall::http::{RateLimitLayer, Rule};
/// # use ratewall::{Policy, Rate};
/// let layer = RateLimitLayer::builder()
///     .rule(Rule::global("all", Policy::token_bucket(Rate::per_second(1))))
///     .build()?;
/// let s = &layer.stats()[0];
/// assert_eq!((s.denied(), s.shadow_denied(), s.missing_key(), s.errors(), s.untracked(), s.refunded()), (0, 0, 0, 0, 0, 0));
/// # Ok::<(), ratewall::http::HttpConfigError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuleStats {
    name: String,
    allowed: u64,
    denied: u64,
    shadow_denied: u64,
    missing_key: u64,
    errors: u64,
    fallbacks: u64,
    untracked: u64,
    refunded: u64,
}

impl RuleStats {
    /// The rule's name.
    ///
    /// ```
    /// # fn f(s: &ratewall::http::RuleStats) { let _ = s.name(); }
    /// ```
    pub fn name(&self) -> &str {
        &self.name
    }
    /// Requests the rule admitted (enforced or shadow).
    ///
    /// ```
    /// # fn f(s: &ratewall::http::RuleStats) { let _ = s.allowed(); }
    /// ```
    pub fn allowed(&self) -> u64 {
        self.allowed
    }
    /// Requests the rule denied (and the layer rejected).
    ///
    /// ```
    /// # fn f(s: &ratewall::http::RuleStats) { let _ = s.denied(); }
    /// ```
    pub fn denied(&self) -> u64 {
        self.denied
    }
    /// Requests a shadow rule would have denied.
    ///
    /// ```
    /// # fn f(s: &ratewall::http::RuleStats) { let _ = s.shadow_denied(); }
    /// ```
    pub fn shadow_denied(&self) -> u64 {
        self.shadow_denied
    }
    /// Requests without a key for the rule.
    ///
    /// ```
    /// # fn f(s: &ratewall::http::RuleStats) { let _ = s.missing_key(); }
    /// ```
    pub fn missing_key(&self) -> u64 {
        self.missing_key
    }
    /// Requests that cost more than the rule can ever admit, and (Redis
    /// rules) requests Redis could not decide that were failed open or
    /// closed by the limiter's failure policy.
    ///
    /// ```
    /// # fn f(s: &ratewall::http::RuleStats) { let _ = s.errors(); }
    /// ```
    pub fn errors(&self) -> u64 {
        self.errors
    }
    /// Requests of a Redis rule that its local fallback limiter decided
    /// because Redis could not (always 0 for a local rule).
    ///
    /// ```
    /// # fn f(s: &ratewall::http::RuleStats) { assert!(s.fallbacks() <= s.allowed() + s.denied() + s.shadow_denied()); }
    /// ```
    pub fn fallbacks(&self) -> u64 {
        self.fallbacks
    }
    /// Requests admitted untracked because the rule's key table was full.
    ///
    /// ```
    /// # fn f(s: &ratewall::http::RuleStats) { let _ = s.untracked(); }
    /// ```
    pub fn untracked(&self) -> u64 {
        self.untracked
    }
    /// Requests whose units were given back (count-only-failures rules).
    ///
    /// ```
    /// # fn f(s: &ratewall::http::RuleStats) { let _ = s.refunded(); }
    /// ```
    pub fn refunded(&self) -> u64 {
        self.refunded
    }
}

#[derive(Default)]
struct Counters {
    allowed: AtomicU64,
    denied: AtomicU64,
    shadow_denied: AtomicU64,
    missing_key: AtomicU64,
    errors: AtomicU64,
    fallbacks: AtomicU64,
    untracked: AtomicU64,
    refunded: AtomicU64,
}

#[inline]
fn bump(c: &AtomicU64) {
    // Relaxed: a statistics counter publishes no other memory.
    c.fetch_add(1, Ordering::Relaxed);
}

/// Where a rule's state lives: a local table, checked synchronously, or
/// (feature `redis`) Redis, checked on the asynchronous path (see the
/// module docs).
// One per rule, built once: boxing the local table would cost a pointer
// chase on every local check.
#[allow(clippy::large_enum_variant)]
enum RuleLimit<C: Clock> {
    Local(KeyedPolicyLimiter<u128, C>),
    #[cfg(feature = "redis")]
    Redis(Arc<RedisLimiter>),
}

struct Compiled<C: Clock> {
    rule: Rule,
    limit: RuleLimit<C>,
    policy_item: Option<HeaderValue>,
    /// `"name";r=`: the start of the rule's `RateLimit` item.
    ratelimit_prefix: Box<[u8]>,
    counters: CachePadded<Counters>,
    /// Applies to every request: on (not `Mode::Off`), with no matcher.
    always: bool,
}

impl<C: Clock> Compiled<C> {
    #[inline]
    fn local(&self) -> Option<&KeyedPolicyLimiter<u128, C>> {
        match &self.limit {
            RuleLimit::Local(l) => Some(l),
            #[cfg(feature = "redis")]
            RuleLimit::Redis(_) => None,
        }
    }
}

struct Shared<C: Clock> {
    rules: Vec<Compiled<C>>,
    names: Arc<[Box<str>]>,
    client_ip: ClientIp,
    needs_ip: bool,
    headers: Headers,
    skip: Option<SkipFn>,
    allow: Vec<Cidr>,
    responder: Option<Responder>,
    decisions_extension: bool,
    any_refund: bool,
    /// No rule is in shadow mode and every rule is local: every entry of a
    /// request takes part in the all-or-nothing check (known at build, so
    /// no request scans its entries to find out).
    plain: bool,
    /// Every rule costs a constant of at most one unit.
    unit_costs: bool,
    /// An admitted request's decisions are read after the check (headers,
    /// the decisions extension, refunds or shadow rules).
    keep_decisions: bool,
    /// The mask of the shown rules and their joint `RateLimit-Policy` value.
    all_policy: Option<(u64, HeaderValue)>,
    fp: Fingerprint,
    warn_xff: Once,
    xff_checks: AtomicU64,
    warn_no_peer: Once,
}

/// One matching rule of one request.
#[derive(Clone, Copy)]
struct Entry {
    rule: u16,
    key: u128,
    cost: u64,
    shadow: bool,
    /// The table did not track the key (its decision's `Tracking`), for
    /// the `untracked` counter: kept even when the decision is not.
    untracked: bool,
    decision: Option<Decision>,
}

type Entries = SmallVec<[Entry; INLINE_RULES]>;

/// A rule's key for one request.
enum RuleKey {
    Local(u128),
    #[cfg(feature = "redis")]
    Remote(Vec<u8>),
}

#[cfg(not(feature = "redis"))]
impl RuleKey {
    #[inline]
    fn into_local(self) -> u128 {
        match self {
            RuleKey::Local(k) => k,
        }
    }
}

/// The asynchronous check of a request that matched Redis rules: the
/// verdict and the decisions extension.
#[cfg(feature = "redis")]
type RemoteCheck = Pin<Box<dyn Future<Output = (Verdict, Option<RateLimitInfo>)> + Send>>;

/// What the check decided. `Pass` is the large variant and the common
/// one; boxing it would allocate on every request.
#[allow(clippy::large_enum_variant)]
enum Verdict {
    Pass(Option<After>),
    Reject(Response<Bytes>),
    /// Redis rules matched: decided when this future completes.
    #[cfg(feature = "redis")]
    Remote(RemoteCheck),
}

/// What an admitted request's response gets: headers, and refunds.
struct After {
    policy: Option<HeaderValue>,
    ratelimit: Option<HeaderValue>,
    /// `X-RateLimit-Limit`, `-Remaining`, `-Reset`.
    legacy: Option<[u64; 3]>,
    /// Boxed: only count-only-failures rules need it (one allocation per
    /// request they match).
    refund: Option<Box<Refund>>,
}

struct Refund {
    shared: Arc<dyn Refunds>,
    list: RefundList,
    /// The Redis rules' units (given back in a task).
    #[cfg(feature = "redis")]
    remote: remote::RemoteRefunds,
}

/// (rule, key, cost) of each unit taken by a count-only-failures rule.
type RefundList = SmallVec<[(u16, u128, u64); 2]>;

trait Refunds: Send + Sync {
    fn refund(&self, rule: u16, key: u128, cost: u64);
    #[cfg(feature = "redis")]
    fn refund_remote(self: Arc<Self>, list: remote::RemoteRefunds);
}

impl<C: Clock + 'static> Refunds for Shared<C> {
    fn refund(&self, rule: u16, key: u128, cost: u64) {
        if let Some(r) = self.rules.get(usize::from(rule)) {
            if let Some(l) = r.local() {
                l.refund_key(&key, cost);
                bump(&r.counters.refunded);
            }
        }
    }

    #[cfg(feature = "redis")]
    fn refund_remote(self: Arc<Self>, list: remote::RemoteRefunds) {
        self.refund_remote_now(list);
    }
}

/// The local enforced entries of one request as the limits of one
/// all-or-nothing check ([`check_set`]): each entry's rule table with the
/// entry's key and cost, statically dispatched, and each decision written
/// into its entry. `map` lists the entries that take part when not all do.
struct LocalSet<'a, C: Clock> {
    rules: &'a [Compiled<C>],
    entries: &'a mut [Entry],
    map: Option<&'a [u16]>,
    /// Every cost is at most one unit.
    unit_costs: bool,
    /// Whether the decisions of an admitted request are kept in the
    /// entries (headers, the extension, refunds and Redis rules read them).
    keep: bool,
}

impl<C: Clock> LocalSet<'_, C> {
    #[inline]
    fn entry(&self, i: usize) -> &Entry {
        match self.map {
            None => &self.entries[i],
            Some(m) => &self.entries[usize::from(m[i])],
        }
    }

    /// Entry `i`'s table with its key. Every entry in the set is local
    /// (`check_enforced` picks them).
    #[inline]
    fn limit(&self, i: usize) -> Option<KeyedRef<'_, KeyedPolicyLimiter<u128, C>, u128>> {
        let e = self.entry(i);
        Some(self.rules[usize::from(e.rule)].local()?.with_key(&e.key))
    }
}

impl<C: Clock> LimitSet<C> for LocalSet<'_, C> {
    #[inline]
    fn len(&self) -> usize {
        self.map.map_or(self.entries.len(), <[u16]>::len)
    }
    #[inline]
    fn cost(&self, i: usize) -> u64 {
        self.entry(i).cost
    }
    #[inline]
    fn read_clock(&self) -> u64 {
        self.limit(0).map_or(0, |l| l.read_clock())
    }
    #[inline]
    fn take_at(&self, i: usize, now: u64, n: u64) -> Result<Decision, InsufficientCapacity> {
        match self.limit(i) {
            Some(l) => l.take_at(now, n),
            None => Ok(Decision::allow(u64::MAX, u64::MAX, 0)),
        }
    }
    fn peek_at(&self, i: usize, now: u64, n: u64) -> Result<Decision, InsufficientCapacity> {
        match self.limit(i) {
            Some(l) => l.peek_at(now, n),
            None => Ok(Decision::allow(u64::MAX, u64::MAX, 0)),
        }
    }
    fn give_back_at(&self, i: usize, now: u64, n: u64) {
        if let Some(l) = self.limit(i) {
            l.give_back_at(now, n);
        }
    }
    fn capacity(&self, i: usize) -> u64 {
        self.limit(i).map_or(u64::MAX, |l| l.capacity())
    }
    #[inline]
    fn max_cost(&self) -> u64 {
        if self.unit_costs {
            1
        } else {
            u64::MAX
        }
    }
    #[inline]
    fn decide_taken(&mut self, i: usize, d: Decision) {
        let at = match self.map {
            None => i,
            Some(m) => usize::from(m[i]),
        };
        let e = &mut self.entries[at];
        e.untracked = d.tracking() == Tracking::Untracked;
        if self.keep {
            e.decision = Some(d);
        }
    }
    #[inline]
    fn decide(&mut self, i: usize, d: Option<Decision>) {
        let at = match self.map {
            None => i,
            Some(m) => usize::from(m[i]),
        };
        self.entries[at].decision = d;
    }
}

impl<C: Clock + 'static> Shared<C> {
    fn warn(&self, once: &Once, message: &'static str) {
        once.call_once(|| warn_now(message));
    }

    fn check(
        self: &Arc<Self>,
        req: &RequestHead<'_>,
        insert: &mut Option<RateLimitInfo>,
    ) -> Verdict {
        if let Some(skip) = self.skip {
            if skip(req.method, req.uri, req.headers) {
                return Verdict::Pass(None);
            }
        }
        let client = if self.needs_ip {
            let c = self.client_ip.resolve(req.headers, req.extensions);
            if c == Resolved::NoPeer {
                self.warn(
                    &self.warn_no_peer,
                    "a request reached the rate-limit layer without a peer address: with axum, enable \
                     ratewall's `axum` feature and serve with `into_make_service_with_connect_info::<SocketAddr>()`; \
                     with tonic, enable the `tonic` feature; otherwise insert a `SocketAddr` extension",
                );
            }
            c
        } else {
            Resolved::NoPeer
        };
        // Looked for in the first requests only: a header lookup per request
        // is a good part of the layer's cost, and one sighting is enough.
        if !self.client_ip.trusts_proxies()
            && self.needs_ip
            // Relaxed: a sampling counter; it publishes nothing.
            && self.xff_checks.load(Ordering::Relaxed) < XFF_CHECKS
            && !self.warn_xff.is_completed()
        {
            // Relaxed: as above; an overshoot by concurrent requests is harmless.
            self.xff_checks.fetch_add(1, Ordering::Relaxed);
            if req.headers.contains_key(X_FORWARDED_FOR) {
                self.warn(
                    &self.warn_xff,
                    "X-Forwarded-For seen while no proxy is trusted: the TCP peer is the client. \
                     Behind a proxy, configure `ClientIp::behind_proxies` or `ClientIp::behind_hops`",
                );
            }
        }
        if let Resolved::Ip(ip) = client {
            if self.allow.iter().any(|n| n.contains(ip)) {
                return Verdict::Pass(None);
            }
        }
        let parts = RequestParts {
            method: req.method,
            uri: req.uri,
            headers: req.headers,
            extensions: req.extensions,
            client,
        };
        let mut entries = Entries::new();
        #[cfg(feature = "redis")]
        let mut remote_keys: Vec<(usize, Vec<u8>)> = Vec::new();
        for (i, r) in self.rules.iter().enumerate() {
            let rule = &r.rule;
            if !r.always && (rule.mode == Mode::Off || !rule.matcher.matches(&parts)) {
                continue;
            }
            let key = match self.key_of(r, &parts) {
                Ok(k) => k,
                Err(why) => {
                    bump(&r.counters.missing_key);
                    match rule.missing {
                        Missing::Reject(status) if rule.mode == Mode::Enforce => {
                            return Verdict::Reject(response::missing_key(
                                status,
                                &rule.name,
                                why.describe(),
                            ));
                        }
                        _ => continue,
                    }
                }
            };
            #[cfg(feature = "redis")]
            let key = match key {
                RuleKey::Local(k) => k,
                RuleKey::Remote(bytes) => {
                    remote_keys.push((entries.len(), bytes));
                    0
                }
            };
            #[cfg(not(feature = "redis"))]
            let key = key.into_local();
            entries.push(Entry {
                // Fits: `build` caps the rule count at u16::MAX.
                rule: i as u16,
                key,
                cost: rule.cost_of(&parts),
                shadow: rule.mode == Mode::Shadow,
                untracked: false,
                decision: None,
            });
        }
        if entries.is_empty() {
            return Verdict::Pass(None);
        }
        #[cfg(feature = "redis")]
        if !remote_keys.is_empty() {
            let shared = self.clone();
            let grpc = response::is_grpc(req.headers);
            return Verdict::Remote(Box::pin(async move {
                shared.check_remote(entries, remote_keys, grpc).await
            }));
        }
        match self.check_enforced(&mut entries, self.keep_decisions) {
            Ok(true) => {}
            Ok(false) => {
                return Verdict::Reject(self.reject(response::is_grpc(req.headers), &entries))
            }
            Err((rule, e)) => {
                bump(&self.rules[usize::from(rule)].counters.errors);
                return Verdict::Reject(response::cost_too_high(
                    &self.rules[usize::from(rule)].rule.name,
                    e.requested,
                    e.capacity,
                ));
            }
        }
        if !self.plain && entries.iter().any(|e| e.shadow) {
            self.check_shadow(&mut entries);
        }
        if self.decisions_extension {
            *insert = Some(RateLimitInfo {
                names: self.names.clone(),
                entries: entries
                    .iter()
                    .filter_map(|e| Some((e.rule, e.decision?)))
                    .collect(),
                #[cfg(feature = "redis")]
                sources: Vec::new(),
            });
        }
        Verdict::Pass(if self.headers == Headers::None && !self.any_refund {
            None
        } else {
            self.after(&entries)
        })
    }

    /// A rule's key for a request: a fingerprint for a local table, bytes
    /// for Redis.
    #[inline]
    fn key_of(&self, r: &Compiled<C>, parts: &RequestParts<'_>) -> Result<RuleKey, rule::Absent> {
        #[cfg(feature = "redis")]
        if r.local().is_none() {
            let mut out = Vec::new();
            r.rule.key.extract_bytes(parts, &mut out)?;
            return Ok(RuleKey::Remote(out));
        }
        r.rule.key.extract(parts, &self.fp).map(RuleKey::Local)
    }

    /// The all-or-nothing check of the local enforced entries. `Err` names the
    /// rule whose cost can never pass.
    ///
    /// `keep`: whether an admitted request's decisions are kept in its
    /// entries (a denied request's always are, for the 429).
    fn check_enforced(
        &self,
        entries: &mut [Entry],
        keep: bool,
    ) -> Result<bool, (u16, InsufficientCapacity)> {
        let counted = |e: &Entry| !e.shadow && self.rules[usize::from(e.rule)].local().is_some();
        // Usually every matching rule is a local enforced one: the set is
        // the entries themselves. Otherwise it maps to the entries that are.
        let map: Option<SmallVec<[u16; INLINE_RULES]>> =
            if self.plain || entries.iter().all(counted) {
                None
            } else {
                Some(
                    (0..entries.len())
                        .filter(|&i| counted(&entries[i]))
                        // Fits: at most one entry per rule, and at most u16::MAX rules.
                        .map(|i| i as u16)
                        .collect(),
                )
            };
        let mut set = LocalSet {
            rules: &self.rules,
            entries,
            map: map.as_deref(),
            unit_costs: self.unit_costs,
            keep,
        };
        let allowed = match check_set(&mut set) {
            Ok(allowed) => allowed,
            Err(e) => {
                let culprit = entries
                    .iter()
                    .filter(|e| counted(e))
                    .find(|e2| e2.cost > self.rules[usize::from(e2.rule)].rule.policy.limit())
                    .map_or(entries[0].rule, |e2| e2.rule);
                return Err((culprit, e));
            }
        };
        for e in entries.iter().filter(|e| self.plain || counted(e)) {
            let c = &self.rules[usize::from(e.rule)].counters;
            if allowed {
                // Every entry took its cost and allowed.
                bump(&c.allowed);
                if e.untracked {
                    bump(&c.untracked);
                }
            } else if e.decision.is_some_and(|d| !d.is_allowed()) {
                bump(&c.denied);
            }
        }
        Ok(allowed)
    }

    /// Shadow rules, each on its own, after the enforced ones admitted the
    /// request: charged like an enforced rule, never rejecting.
    #[inline(never)]
    fn check_shadow(&self, entries: &mut [Entry]) {
        for e in entries.iter_mut().filter(|e| e.shadow) {
            let r = &self.rules[usize::from(e.rule)];
            let Some(local) = r.local() else { continue };
            match local.check_key_n(&e.key, e.cost) {
                Ok(d) => {
                    bump(if d.is_allowed() {
                        &r.counters.allowed
                    } else {
                        &r.counters.shadow_denied
                    });
                    e.decision = Some(d);
                }
                Err(_) => bump(&r.counters.shadow_denied),
            }
        }
    }

    /// Headers and refunds for an admitted request.
    // Not inlined (nor `reject`, `check_shadow`): the check that every
    // request runs stays small, and its cost does not depend on the code
    // of the header generations it does not use.
    #[inline(never)]
    fn after(self: &Arc<Self>, entries: &[Entry]) -> Option<After> {
        let mut after = After {
            policy: None,
            ratelimit: None,
            legacy: None,
            refund: None,
        };
        let shown = || {
            entries.iter().filter_map(|e| {
                let r = &self.rules[usize::from(e.rule)];
                match (r.rule.visibility, e.decision) {
                    (Visibility::Shown, Some(d)) => Some((r, d)),
                    _ => None,
                }
            })
        };
        let closest = || {
            shown().reduce(|a, b| {
                if closer_to_exhaustion(&b.1, &a.1) {
                    b
                } else {
                    a
                }
            })
        };
        match self.headers {
            Headers::None => {}
            Headers::Legacy => {
                if let Some((_, d)) = closest() {
                    after.legacy = Some([d.limit(), d.remaining(), d.ratelimit_t_secs()]);
                }
            }
            Headers::Draft(Items::ClosestToExhaustion) => {
                if let Some((r, d)) = closest() {
                    let mut limit = Buf::new();
                    limit.ratelimit_item(&r.rule.name, &d);
                    after.policy = r.policy_item.clone();
                    after.ratelimit = limit.value();
                }
            }
            Headers::Draft(_) => {
                let mut limit = Buf::new();
                let mut count = 0;
                let mut last = None;
                let mut mask = 0u64;
                for e in entries {
                    let r = &self.rules[usize::from(e.rule)];
                    let Some(d) = e.decision else { continue };
                    if r.rule.visibility != Visibility::Shown {
                        continue;
                    }
                    limit.ratelimit_item_prefixed(&r.ratelimit_prefix, &d);
                    count += 1;
                    last = Some(r);
                    if e.rule < 64 {
                        mask |= 1 << e.rule;
                    }
                }
                after.policy = match (count, &self.all_policy) {
                    (0, _) => None,
                    // One rule: its policy item was rendered once, at build.
                    (1, _) => last.and_then(|r| r.policy_item.clone()),
                    // Every shown rule: rendered once, at build.
                    (_, Some((all, v))) if *all == mask => Some(v.clone()),
                    _ => {
                        let mut policy = Buf::new();
                        for (r, _) in shown() {
                            policy.item(r.policy_item.as_ref().map_or(&[][..], |v| v.as_bytes()));
                        }
                        policy.value()
                    }
                };
                if count > 0 {
                    after.ratelimit = limit.value();
                }
            }
        }
        if self.any_refund {
            let list: RefundList = entries
                .iter()
                .filter(|e| {
                    !e.shadow
                        && e.cost > 0
                        && self.rules[usize::from(e.rule)].rule.refund_on_success
                        && self.rules[usize::from(e.rule)].local().is_some()
                        && e.decision.is_some_and(|d| {
                            matches!(d.tracking(), Tracking::Tracked | Tracking::EvictedOther)
                        })
                })
                .map(|e| (e.rule, e.key, e.cost))
                .collect();
            if !list.is_empty() {
                after.refund = Some(Box::new(Refund {
                    shared: self.clone(),
                    list,
                    #[cfg(feature = "redis")]
                    remote: Vec::new(),
                }));
            }
        }
        if after.policy.is_none()
            && after.ratelimit.is_none()
            && after.legacy.is_none()
            && after.refund.is_none()
        {
            None
        } else {
            Some(after)
        }
    }

    /// The 429 for a request the enforced rules denied.
    #[cold]
    #[inline(never)]
    fn reject(&self, grpc: bool, entries: &[Entry]) -> Response<Bytes> {
        let rules: SmallVec<[RuleDecision<'_>; INLINE_RULES]> = entries
            .iter()
            .filter(|e| !e.shadow)
            .filter_map(|e| {
                let d = e.decision?;
                Some(RuleDecision {
                    name: &self.rules[usize::from(e.rule)].rule.name,
                    decision: d,
                    denied: !d.is_allowed(),
                })
            })
            .collect();
        let retry_after = rules
            .iter()
            .filter(|r| r.denied)
            .map(|r| r.decision.ratelimit_t_secs())
            .max()
            .unwrap_or(1);
        let rejection = Rejection {
            rules: &rules,
            retry_after_secs: retry_after,
        };
        #[cfg(feature = "tracing")]
        tracing::debug!(
            target: "ratewall::http",
            denied = ?rejection.denied().map(|r| r.name()).collect::<Vec<_>>(),
            retry_after,
            "request over its rate limit"
        );
        let mut res = if grpc {
            response::grpc_exhausted("rate limit exceeded")
        } else if let Some(responder) = &self.responder {
            responder(&rejection)
        } else {
            response::quota_exceeded(&rejection)
        };
        let h = res.headers_mut();
        if !h.contains_key(RETRY_AFTER) {
            h.insert(RETRY_AFTER, HeaderValue::from(retry_after));
        }
        // Only the rules that denied, and only those whose numbers are shown:
        // every `t` sent is at most `Retry-After`.
        let denied_shown = || {
            entries.iter().filter_map(|e| {
                let r = &self.rules[usize::from(e.rule)];
                match e.decision {
                    Some(d)
                        if !e.shadow
                            && !d.is_allowed()
                            && r.rule.visibility == Visibility::Shown =>
                    {
                        Some((r, d))
                    }
                    _ => None,
                }
            })
        };
        match self.headers {
            Headers::None => {}
            Headers::Legacy => {
                if let Some((_, d)) = denied_shown().next() {
                    if !h.contains_key(X_LIMIT) {
                        legacy(h, [d.limit(), d.remaining(), retry_after]);
                    }
                }
            }
            Headers::Draft(items) => {
                let (mut policy, mut limit) = (Buf::new(), Buf::new());
                let iter = denied_shown().take(match items {
                    Items::ClosestToExhaustion => 1,
                    _ => usize::MAX,
                });
                for (r, d) in iter {
                    policy.policy_item(&r.rule.name, &r.rule.policy);
                    limit.ratelimit_item(&r.rule.name, &d);
                }
                if !policy.is_empty() && !h.contains_key(RATELIMIT) {
                    if let (Some(p), Some(l)) = (policy.value(), limit.value()) {
                        h.insert(RATELIMIT_POLICY, p);
                        h.insert(RATELIMIT, l);
                    }
                }
            }
        }
        res
    }
}

fn legacy(h: &mut HeaderMap, [limit, remaining, reset]: [u64; 3]) {
    h.insert(X_LIMIT, HeaderValue::from(limit));
    h.insert(X_REMAINING, HeaderValue::from(remaining));
    h.insert(X_RESET, HeaderValue::from(reset));
}

/// The request head the check reads.
struct RequestHead<'a> {
    method: &'a Method,
    uri: &'a Uri,
    headers: &'a HeaderMap,
    extensions: &'a http::Extensions,
}

/// The per-rule decisions of an admitted request, for handlers (turn on
/// with [`RateLimitBuilder::decisions_extension`]).
///
/// ```
/// use axum::Extension;
/// use ratewall::http::RateLimitInfo;
///
/// async fn handler(Extension(info): Extension<RateLimitInfo>) -> String {
///     match info.get("ip") {
///         Some(d) => format!("{} left", d.remaining()),
///         None => "unlimited".into(),
///     }
/// }
/// # let _ = handler;
/// ```
#[derive(Clone)]
pub struct RateLimitInfo {
    names: Arc<[Box<str>]>,
    entries: SmallVec<[(u16, Decision); INLINE_RULES]>,
    /// Where the Redis rules' decisions came from.
    #[cfg(feature = "redis")]
    sources: Vec<(u16, DecisionSource)>,
}

impl RateLimitInfo {
    /// The decision of the rule named `name`, if it matched the request.
    ///
    /// ```
    /// # fn f(info: &ratewall::http::RateLimitInfo) { let _ = info.get("ip"); }
    /// ```
    pub fn get(&self, name: &str) -> Option<Decision> {
        self.iter().find(|(n, _)| *n == name).map(|(_, d)| d)
    }

    /// Where the decision of the Redis rule named `name` came from (Redis,
    /// the deny cache, the local fallback, or fail-open); `None` for a
    /// local rule or a rule that did not match (features `tower` and
    /// `redis`).
    ///
    /// ```
    /// use ratewall::http::RateLimitInfo;
    /// use ratewall::redis::DecisionSource;
    ///
    /// fn degraded(info: &RateLimitInfo) -> bool {
    ///     matches!(info.source("ip"), Some(DecisionSource::Fallback | DecisionSource::FailOpen))
    /// }
    /// # let _ = degraded;
    /// ```
    #[cfg(feature = "redis")]
    pub fn source(&self, name: &str) -> Option<DecisionSource> {
        self.sources
            .iter()
            .find(|(i, _)| &*self.names[usize::from(*i)] == name)
            .map(|&(_, s)| s)
    }

    /// Every matching rule's name and decision, in rule order.
    ///
    /// ```
    /// # fn f(info: &ratewall::http::RateLimitInfo) { for (name, d) in info.iter() { let _ = (name, d.remaining()); } }
    /// ```
    pub fn iter(&self) -> impl Iterator<Item = (&str, Decision)> + '_ {
        self.entries
            .iter()
            .map(|(i, d)| (&*self.names[usize::from(*i)], *d))
    }
}

impl fmt::Debug for RateLimitInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

/// The service made by [`RateLimitLayer`].
///
/// ```
/// use ratewall::http::{RateLimitLayer, RateLimitService, Rule};
/// use ratewall::{Policy, Rate};
/// use tower::ServiceBuilder;
///
/// let svc = ServiceBuilder::new()
///     .layer(RateLimitLayer::builder().rule(Rule::global("all", Policy::token_bucket(Rate::per_second(5)))).build()?)
///     .service_fn(|_req: http::Request<String>| async { Ok::<_, std::convert::Infallible>(http::Response::new(String::new())) });
/// # let _ = svc;
/// # Ok::<(), ratewall::http::HttpConfigError>(())
/// ```
pub struct RateLimitService<S, C: Clock = DefaultClock> {
    inner: S,
    shared: Arc<Shared<C>>,
}

impl<S: Clone, C: Clock> Clone for RateLimitService<S, C> {
    fn clone(&self) -> Self {
        RateLimitService {
            inner: self.inner.clone(),
            shared: self.shared.clone(),
        }
    }
}

impl<S: fmt::Debug, C: Clock> fmt::Debug for RateLimitService<S, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitService")
            .field("inner", &self.inner)
            .field("rules", &self.shared.rules.len())
            .finish()
    }
}

/// The inner service must be `Clone + Send + 'static` (axum routers, tonic
/// services and `service_fn` closures are): a request that matches a Redis
/// rule is passed on after an await, so the readied service moves into the
/// response future and a clone stays. The bounds hold with every feature
/// set, so turning on `redis` never breaks a build that compiled without it.
impl<S, C, ReqB, ResB> Service<Request<ReqB>> for RateLimitService<S, C>
where
    S: Service<Request<ReqB>, Response = Response<ResB>> + Clone + Send + 'static,
    C: Clock + 'static,
    ReqB: Send + 'static,
{
    type Response = Response<ResponseBody<ResB>>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<ReqB>) -> ResponseFuture<S::Future> {
        // The decisions extension, when on, is written here by the check
        // (not returned with the verdict: a large value moved on every request).
        let mut insert = None;
        let verdict = self.shared.check(
            &RequestHead {
                method: req.method(),
                uri: req.uri(),
                headers: req.headers(),
                extensions: req.extensions(),
            },
            &mut insert,
        );
        match verdict {
            // Apart from the other case: with nothing to do after the
            // response, no `After` is moved (it is large) on its way into the
            // future.
            Verdict::Pass(None) if insert.is_none() => ResponseFuture {
                state: State::Inner {
                    fut: self.inner.call(req),
                    after: None,
                },
            },
            Verdict::Pass(after) => {
                if let Some(info) = insert {
                    req.extensions_mut().insert(info);
                }
                ResponseFuture {
                    state: State::Inner {
                        fut: self.inner.call(req),
                        after,
                    },
                }
            }
            Verdict::Reject(res) => ResponseFuture {
                state: State::Ready { res: Some(res) },
            },
            #[cfg(feature = "redis")]
            Verdict::Remote(check) => {
                let clone = self.inner.clone();
                let mut inner = std::mem::replace(&mut self.inner, clone);
                ResponseFuture {
                    state: State::Remote {
                        check,
                        call: Some(Box::new(move |info| {
                            if let Some(info) = info {
                                req.extensions_mut().insert(info);
                            }
                            inner.call(req)
                        })),
                    },
                }
            }
        }
    }
}

/// Passes the request on once the Redis rules admitted it.
#[cfg(feature = "redis")]
type PendingCall<F> = Box<dyn FnOnce(Option<RateLimitInfo>) -> F + Send>;

pin_project! {
    /// The response future of [`RateLimitService`].
    pub struct ResponseFuture<F> {
        #[pin]
        state: State<F>,
    }
}

pin_project! {
    #[project = StateProj]
    #[allow(dead_code)] // `Remote` is built only with the `redis` feature.
    enum State<F> {
        Inner { #[pin] fut: F, after: Option<After> },
        Ready { res: Option<Response<Bytes>> },
        Remote { check: RemoteSlot, call: Option<CallSlot<F>> },
    }
}

impl<F> fmt::Debug for ResponseFuture<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self.state {
            State::Inner { .. } => "ResponseFuture::Inner",
            State::Ready { .. } => "ResponseFuture::Ready",
            State::Remote { .. } => "ResponseFuture::Remote",
        })
    }
}

impl<F, B, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<Response<B>, E>>,
{
    type Output = Result<Response<ResponseBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut state = self.project().state;
        loop {
            let next = match state.as_mut().project() {
                StateProj::Remote { check, call } => remote_done(check, call, cx),
                other => return poll_done(other, cx),
            };
            state.set(ready!(next));
        }
    }
}

/// The remote check finished: pass the request on, or answer.
#[cfg(feature = "redis")]
fn remote_done<F>(
    check: &mut RemoteSlot,
    call: &mut Option<CallSlot<F>>,
    cx: &mut Context<'_>,
) -> Poll<State<F>> {
    let (verdict, info) = ready!(check.as_mut().poll(cx));
    Poll::Ready(match (verdict, call.take()) {
        (Verdict::Pass(after), Some(call)) => State::Inner {
            fut: call(info),
            after,
        },
        (Verdict::Reject(res), _) => State::Ready { res: Some(res) },
        // Polled after completion, or a nested remote verdict (never
        // returned by the remote check): an empty 500.
        _ => State::Ready { res: None },
    })
}

#[cfg(not(feature = "redis"))]
fn remote_done<F>(
    check: &mut RemoteSlot,
    _: &mut Option<CallSlot<F>>,
    _: &mut Context<'_>,
) -> Poll<State<F>> {
    match *check {}
}

#[cfg(feature = "redis")]
type RemoteSlot = RemoteCheck;
#[cfg(feature = "redis")]
type CallSlot<F> = PendingCall<F>;
#[cfg(not(feature = "redis"))]
type RemoteSlot = std::convert::Infallible;
#[cfg(not(feature = "redis"))]
type CallSlot<F> = std::marker::PhantomData<F>;

/// Writes an admitted request's headers into its response, and gives
/// back the units of count-only-failures rules when the response succeeded.
fn apply_after<B>(res: &mut Response<B>, after: &mut Option<After>) {
    let Some(after) = after.take() else { return };
    let h = res.headers_mut();
    if let Some(v) = after.policy {
        h.insert(RATELIMIT_POLICY, v);
    }
    if let Some(v) = after.ratelimit {
        h.insert(RATELIMIT, v);
    }
    if let Some(l) = after.legacy {
        legacy(h, l);
    }
    if let Some(refund) = after.refund {
        let s = res.status();
        if s.is_success() || s.is_redirection() {
            for (rule, key, cost) in refund.list {
                refund.shared.refund(rule, key, cost);
            }
            #[cfg(feature = "redis")]
            if !refund.remote.is_empty() {
                refund.shared.refund_remote(refund.remote);
            }
        }
    }
}

fn poll_done<F, B, E>(
    state: StateProj<'_, F>,
    cx: &mut Context<'_>,
) -> Poll<Result<Response<ResponseBody<B>>, E>>
where
    F: Future<Output = Result<Response<B>, E>>,
{
    {
        match state {
            StateProj::Inner { fut, after } => {
                let mut res = ready!(fut.poll(cx))?;
                // Tested before it is taken: `take` would read the whole
                // (large) value even when there is none.
                if after.is_some() {
                    apply_after(&mut res, after);
                }
                Poll::Ready(Ok(res.map(ResponseBody::new)))
            }
            StateProj::Ready { res } => {
                // Polled again after completion: an empty 500, not a panic.
                let res = res.take().unwrap_or_else(|| {
                    let mut r = Response::new(Bytes::new());
                    *r.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
                    r
                });
                Poll::Ready(Ok(res.map(ResponseBody::full)))
            }
            // Never: `poll` handles this state.
            StateProj::Remote { .. } => {
                let mut r = Response::new(ResponseBody::full(Bytes::new()));
                *r.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
                Poll::Ready(Ok(r))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ManualClock, Policy, Rate};

    fn compiled(rules: Vec<Rule>) -> Vec<Compiled<ManualClock>> {
        let mut b = RateLimitLayer::builder().clock(ManualClock::new());
        for r in rules {
            b = b.rule(r);
        }
        let layer = b.build().unwrap();
        Arc::try_unwrap(layer.shared).ok().expect("one owner").rules
    }

    #[test]
    fn one_limit_charged_twice_is_detected() {
        let p = Policy::token_bucket(Rate::per_second(10));
        let twice = compiled(vec![Rule::per_ip("a", p), Rule::per_ip("b", p)]);
        assert_eq!(charged_twice(&twice), Some(("a".into(), "b".into())));
        let distinct = [
            vec![Rule::per_ip("a", p), Rule::per_ip("b", p).ipv6_prefix(56)],
            vec![
                Rule::per_ip("a", p),
                Rule::per_ip("b", Policy::token_bucket(Rate::per_second(11))),
            ],
            vec![
                Rule::per_ip("a", p),
                Rule::per_ip("b", p).on_path_prefix("/x"),
            ],
            vec![
                Rule::per_ip("a", p),
                Rule::per_ip("b", p).mode(Mode::Shadow),
            ],
            vec![Rule::per_ip("a", p), Rule::global("b", p)],
        ];
        for rules in distinct {
            assert_eq!(charged_twice(&compiled(rules)), None);
        }
    }
}
