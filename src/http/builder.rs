//! Building a layer: [`RateLimitLayer::builder`], the
//! [`RateLimitBuilder`] it returns, and the [`HttpConfigError`]s its
//! `build` reports. `build` validates every rule, makes its limit (a local
//! table or its Redis limiter) and renders what can be rendered once.

use super::client_ip::{Cidr, ClientIp};
use super::compiled::{Compiled, RuleLimit};
use super::concurrent::{ConcError, ConcLimit};
use super::engine::{warn_now, Shared, SkipFn};
use super::headers::{Buf, Headers};
use super::key::Fingerprint;
use super::lockout::Lockout;
use super::origin::{self, Origin};
use super::response::{Rejection, Responder};
use super::rule::{self, Mode, Rule, Visibility};
use super::service::RateLimitLayer;
use super::spray;
use super::stats::Counters;
use super::tier::TierError;
use crate::clock::Clock;
use crate::error::ConfigError;
use crate::keyed::KeyedPolicyLimiter;
use crate::limiter::DefaultClock;
#[cfg(feature = "redis")]
use crate::redis::RedisLimiter;
use crate::sync::AtomicU64;
use crate::text::ParseError;
use bytes::Bytes;
use crossbeam_utils::CachePadded;
use http::{HeaderMap, Method, Response, Uri};
use std::fmt;
use std::sync::{Arc, Once};
use std::time::Duration;

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
    /// A rule name that is not a structured-field token (for a Redis rule,
    /// the limiter's name).
    InvalidRuleName {
        /// The name given.
        name: String,
    },
    /// Two rules with one name (for Redis rules, two limiters of one name).
    DuplicateRuleName {
        /// The name given twice.
        name: String,
    },
    /// A header the rule names (its key's, its tier header, its priority
    /// header) whose name is not a valid header name.
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
    /// Redis backend ([`LayerConfig::to_builder`](super::LayerConfig::to_builder) instead of
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
    /// A rule's tier list or key list names a tier the rule does not
    /// declare ([`Rule::tier`]).
    UnknownTier {
        /// The rule.
        rule: String,
        /// The tier named.
        tier: String,
    },
    /// A tier's policy in a configuration is not a policy (feature `serde`).
    TierPolicyText {
        /// The rule.
        rule: String,
        /// The tier.
        tier: String,
        /// The token that is wrong and what was expected.
        error: ParseError,
    },
    /// A tier's name is not usable, or is given twice.
    InvalidTierName {
        /// The rule.
        rule: String,
        /// The tier's name.
        tier: String,
    },
    /// A rule on a Redis limiter ([`Rule::redis`],
    /// [`Rule::redis_concurrent`]) whose limiter kept its default name: the
    /// rule takes the limiter's name, and a default such as `tb.10000.20`
    /// names only its algorithm (features `tower` and `redis`).
    ///
    /// [`Rule::redis`]: super::Rule::redis
    /// [`Rule::redis_concurrent`]: super::Rule::redis_concurrent
    RedisLimiterUnnamed {
        /// The limiter's default name.
        default: String,
    },
}

impl fmt::Display for HttpConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HttpConfigError::InvalidRuleName { name } => write!(
                f,
                "rule name {name:?} is not usable in RateLimit headers: use 1 to 64 characters, \
                 a letter first, then letters, digits or !#$%&'*+-.^_`|~:/ (a Redis rule made in \
                 Rust is named after its limiter: rename the limiter with \
                 `RedisLimiterBuilder::name`; in a file, the rule's `name` is its limiter's)"
            ),
            HttpConfigError::DuplicateRuleName { name } => write!(
                f,
                "two rules are named {name:?}: give each rule its own name (a Redis rule made \
                 in Rust is named after its limiter: give each limiter its own \
                 `RedisLimiterBuilder::name`; limiters of one name and prefix share one limit, so \
                 one rule on it suffices)"
            ),
            HttpConfigError::InvalidHeaderName { rule } => write!(
                f,
                "rule {rule:?} names a header (in its key, as its tier header or as its priority \
                 header) whose name is not a valid HTTP header name: use letters, digits and `-`, \
                 such as `x-api-key`"
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
            HttpConfigError::UnknownTier { rule, tier } => write!(
                f,
                "rule {rule:?} names tier {tier:?}, which it does not declare: add it to the \
                 rule's tiers (`tiers = {{ {tier} = \"POLICY\" }}`, Rust: `.tier({tier:?}, policy)`) \
                 or fix the name"
            ),
            HttpConfigError::TierPolicyText { rule, tier, error } => {
                write!(f, "rule {rule:?}, field `tiers`, tier {tier:?}: {error}")
            }
            HttpConfigError::InvalidTierName { rule, tier } => write!(
                f,
                "rule {rule:?}: tier {tier:?} is not a usable tier name: a letter, then up to 31 \
                 letters, digits, `-` or `_`, each tier once"
            ),
            HttpConfigError::RedisLimiterUnnamed { default } => write!(
                f,
                "a rule on a Redis limiter takes the limiter's name, and this limiter has only its \
                 default name {default:?}: name it (RedisLimiterBuilder::name or \
                 RedisConcurrencyLimiter's builder .name(\"...\")), and that one name is the rule's \
                 in RateLimit headers, stats, metrics, logs, store events and Redis keys"
            ),
        }
    }
}

impl std::error::Error for HttpConfigError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            HttpConfigError::Policy { error, .. } => Some(error),
            HttpConfigError::PolicyText { error, .. } => Some(error),
            HttpConfigError::TierPolicyText { error, .. } => Some(error),
            #[cfg(feature = "redis")]
            HttpConfigError::Redis { error, .. } => Some(error),
            _ => None,
        }
    }
}

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
    /// Where the client-address settings were written (`LayerConfig` or
    /// Rust): the words of the warnings about them.
    origin: Origin,
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
        // Set in Rust now: its warnings name the API.
        self.origin = Origin::Rust;
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
    /// checks, metrics). A closure may capture, so the paths can come from
    /// configuration.
    ///
    /// ```
    /// # use ratewall::http::RateLimitLayer;
    /// let b = RateLimitLayer::builder().skip(|_, uri, _| uri.path().starts_with("/health"));
    /// // Paths read from configuration:
    /// let open: Vec<String> = vec!["/metrics".into(), "/ready".into()];
    /// let c = RateLimitLayer::builder().skip(move |_, uri, _| open.iter().any(|p| uri.path() == p));
    /// # let _ = (b, c);
    /// ```
    pub fn skip(
        mut self,
        skip: impl Fn(&Method, &Uri, &HeaderMap) -> bool + Send + Sync + 'static,
    ) -> Self {
        let skip: SkipFn = Arc::new(skip);
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
    /// [`RateLimitInfo`](super::RateLimitInfo) for handlers (off by default: `http`'s
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
            origin: self.origin,
        }
    }

    /// The layer's settings were read from a configuration file: its
    /// messages name the file's fields (`config.rs`).
    #[cfg(feature = "serde")]
    pub(super) fn read_from_file(mut self) -> Self {
        self.origin = Origin::File;
        self
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
            #[cfg(feature = "redis")]
            if let Some(default) = rule.unnamed_redis_limiter() {
                return Err(HttpConfigError::RedisLimiterUnnamed { default });
            }
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
            let conc = match &rule.concurrency {
                None => None,
                Some(c) => {
                    if let (false, Some(said)) = (c.on_rate_rule, not_for_concurrency(&rule)) {
                        let reason = rule.origin.pick(said);
                        return Err(policy_error(ConfigError::Incompatible { reason }));
                    }
                    let built =
                        ConcLimit::build(&self.clock, &name, &rule.key, rule.table, c, rule.origin);
                    Some(built.map_err(|e| match e {
                        ConcError::Config(error) => policy_error(error),
                        ConcError::BadHeader => {
                            HttpConfigError::InvalidHeaderName { rule: name.clone() }
                        }
                    })?)
                }
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
            for (_, tier) in &rule.tiers.list {
                tier.validate().map_err(policy_error)?;
                if let rule::Cost::Units(cost) = rule.cost {
                    if cost > tier.limit() {
                        return Err(HttpConfigError::CostTooHigh {
                            rule: name,
                            cost,
                            limit: tier.limit(),
                        });
                    }
                }
            }
            let limit = if let Some(l) = redis_concurrent(conc.as_ref()) {
                l
            } else if conc.is_some() {
                // Unused (`Compiled::conc`): the smallest table.
                let mut one = rule.clone();
                one.table = one.table.max_keys(1).shards(1);
                limit_of(&self.clock, &one, rule.policy, None)?
            } else {
                limit_of(&self.clock, &rule, rule.policy, None)?
            };
            if rule.count_refused && remote_of(&rule).is_some() {
                return Err(HttpConfigError::InvalidValue {
                    rule: Some(name),
                    field: "count_refused",
                    value: "true".into(),
                    expected: "a local rate rule (a Redis rule's units are all or nothing across the store)",
                });
            }
            if let Some(w) = spray::spray_warning(&rule, remote_of(&rule).is_none()) {
                warn_now(&w);
            }
            let lockout = match rule.block_for {
                None => None,
                Some(block) => lockout_of(&self.clock, &rule, block)?,
            };
            // Fits: at most u16::MAX rules (checked above).
            let base = i as u16;
            // A concurrency rule's table is its limiter's (none for one
            // limit shared by all); the rate table beside it is unused.
            let table = match &conc {
                Some(c) => c.max_keys(),
                None => table_of(&limit),
            };
            let mut compiled = compile(rule, limit, base, lockout, "", table);
            if let Some(c) = conc {
                let mut item = Buf::new();
                item.concurrency_policy_item(&compiled.rule.name, c.quota());
                compiled.policy_item = item.value();
                compiled.conc = Some(Box::new(c));
            }
            rules.push(compiled);
        }
        // Each tier's limit, after every rule.
        for i in 0..rules.len() {
            if rules[i].rule.tiers.is_empty() {
                continue;
            }
            let rule = rules[i].rule.clone();
            let first = u16::try_from(rules.len()).map_err(|_| HttpConfigError::TooManyRules)?;
            let pick = rule
                .tiers
                .compile(rule.key.header_name(), first)
                .map_err(|e| tier_error(&rule.name, rule.origin, e))?;
            for (tier, policy) in &rule.tiers.list {
                let mut t = rule.clone();
                t.policy = *policy;
                t.mode = Mode::Off;
                t.tiers = Default::default();
                let limit = limit_of(&self.clock, &rule, *policy, Some(tier))?;
                if rules.len() >= usize::from(u16::MAX) {
                    return Err(HttpConfigError::TooManyRules);
                }
                // Fits: `i` is a rule's index.
                let table = table_of(&limit);
                rules.push(compile(t, limit, i as u16, None, tier, table));
            }
            rules[i].tiers = Some(Box::new(pick));
        }
        let concurrent = rules.iter().any(|r| r.conc.is_some());
        let extras = concurrent
            || rules
                .iter()
                .any(|r| r.tiers.is_some() || r.lockout.is_some());
        let needs_ip = !self.allow.is_empty()
            || rules
                .iter()
                .any(|r| r.rule.mode != Mode::Off && r.rule.key.needs_client_ip());
        let names = rules
            .iter()
            .map(|r| Box::from(r.rule.name.as_str()))
            .collect();
        let any_refund = rules.iter().any(|r| r.rule.refund_on_success);
        let any_count_refused = rules.iter().any(|r| r.rule.count_refused);
        // Every rule's cost is a constant of at most one unit (a unit cost
        // always fits: the all-or-nothing check skips its capacity check).
        let unit_costs = rules
            .iter()
            .all(|r| matches!(r.rule.cost, rule::Cost::Units(0 | 1)));
        let prefetch = rules
            .iter()
            .any(|r| r.local().is_some_and(|l| l.prefetches()));
        let plain = !concurrent
            && rules
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
        if needs_ip && self.client_ip.hops_from_any_peer() {
            warn_now(self.origin.pick(origin::HOPS_FROM_ANY_PEER));
        }
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
                any_count_refused,
                origin: self.origin,
                plain,
                unit_costs,
                prefetch,
                keep_decisions: self.headers != Headers::None
                    || self.decisions_extension
                    || any_refund
                    || !plain,
                all_policy,
                extras,
                concurrent,
                fp: Fingerprint::new(),
                warn_xff: Once::new(),
                xff_checks: AtomicU64::new(0),
                warn_no_peer: Once::new(),
                #[cfg(feature = "redis")]
                warn_foreign_key: Once::new(),
            }),
        })
    }
}

/// The limit of `rule` under `policy`: a local table, or its Redis
/// limiter (for a tier, the limiter's sibling under `policy`, named
/// `name.tier`).
fn limit_of<C: Clock + Clone>(
    clock: &C,
    rule: &Rule,
    policy: crate::policy::Policy,
    tier: Option<&str>,
) -> Result<RuleLimit<C>, HttpConfigError> {
    match (remote_of(rule), tier) {
        #[cfg(feature = "redis")]
        (Some(l), None) => Ok(RuleLimit::Redis(l)),
        #[cfg(feature = "redis")]
        (Some(l), Some(tier)) => l
            .for_tier(tier, policy)
            .map(|t| RuleLimit::Redis(Arc::new(t)))
            .map_err(|error| HttpConfigError::Redis {
                rule: rule.name.clone(),
                error,
            }),
        _ => {
            let b = KeyedPolicyLimiter::<u128>::builder(policy)
                .clock(clock.clone())
                .table(rule.table);
            Ok(RuleLimit::Local(b.build().map_err(|error| {
                HttpConfigError::Policy {
                    rule: rule.name.clone(),
                    error,
                }
            })?))
        }
    }
}

/// The lockout table of a local rule with `block_for` (none for a Redis
/// rule: its blocks are in Redis).
fn lockout_of<C: Clock + Clone>(
    clock: &C,
    rule: &Rule,
    block: Duration,
) -> Result<Option<Lockout<C>>, HttpConfigError> {
    let bad = || HttpConfigError::InvalidValue {
        rule: Some(rule.name.clone()),
        field: "block_for",
        value: format!("{block:?}"),
        expected: "a block from 1 ns to 146 years, such as `15min`",
    };
    if block.is_zero() {
        return Err(bad());
    }
    // A Redis rule's blocks live in Redis (`redis::check_all_locked`).
    if remote_of(rule).is_some() {
        return if block.as_nanos() > (1u128 << 62) {
            Err(bad())
        } else {
            Ok(None)
        };
    }
    if let Some(n) = rule.lockout_max_keys {
        if n == 0 || n > crate::keyed::MAX_KEYS {
            return Err(HttpConfigError::InvalidValue {
                rule: Some(rule.name.clone()),
                field: "lockout_max_keys",
                value: n.to_string(),
                expected: "from 1 to 2^32 blocks",
            });
        }
    }
    Lockout::new(block, spray::lockout_table(rule), clock.clone())
        .map(Some)
        .map_err(|_| bad())
}

/// What is wrong with rule `rule`'s tiers, as the error that names it.
fn tier_error(rule: &str, origin: Origin, e: TierError) -> HttpConfigError {
    let rule = rule.to_owned();
    match e {
        TierError::BadHeader => HttpConfigError::InvalidHeaderName { rule },
        TierError::InvalidName(tier) => HttpConfigError::InvalidTierName { rule, tier },
        TierError::Unknown(tier) => HttpConfigError::UnknownTier { rule, tier },
        TierError::KeysNeedHeader(value) => HttpConfigError::InvalidValue {
            rule: Some(rule),
            field: "tier_keys",
            value,
            expected:
                "a rule keyed by one header (`header:x-api-key`): its values are the keys listed",
        },
        TierError::NoPick(value) => HttpConfigError::InvalidValue {
            rule: Some(rule),
            field: "tiers",
            value,
            expected: origin.pick(origin::Said {
                rust: "tiers and a way to pick one: `tier_keys`, `tier_by` or `tier_by_header`",
                file: "tiers and a way to pick one: `tier_keys` or `tier_header`",
            }),
        },
    }
}

/// A rule as built: its limit, headers rendered once, its counters.
/// `max_keys`: the capacity of the rule's table, if it has one (a rate
/// rule's `limit`, a per-key concurrency rule's limiter; see [`table_of`]).
fn compile<C: Clock>(
    rule: Rule,
    limit: RuleLimit<C>,
    base: u16,
    lockout: Option<Lockout<C>>,
    tier: &str,
    max_keys: Option<usize>,
) -> Compiled<C> {
    let mut item = Buf::new();
    item.policy_item(&rule.name, &rule.policy);
    Compiled {
        limit,
        policy_item: item.value(),
        ratelimit_prefix: format!("\"{}\";r=", rule.name).into_bytes().into(),
        counters: CachePadded::new(Counters::new(&rule.name, tier, rule.key.shown(), max_keys)),
        always: rule.mode != Mode::Off && rule.matcher.matches_all(),
        base,
        tiers: None,
        lockout,
        conc: None,
        rule,
    }
}

/// The capacity of a rate rule's table (none for a Redis rule).
fn table_of<C: Clock>(limit: &RuleLimit<C>) -> Option<usize> {
    match limit {
        RuleLimit::Local(l) => Some(l.max_keys()),
        #[cfg(feature = "redis")]
        RuleLimit::Redis(_) | RuleLimit::RedisConcurrent => None,
    }
}

/// What a concurrency rule cannot have, and what to do instead.
fn not_for_concurrency(rule: &Rule) -> Option<origin::Said> {
    if rule.mode == Mode::Shadow {
        return Some(origin::NO_SHADOW);
    }
    if rule.refund_on_success
        || rule.count_refused
        || !rule.tiers.is_empty()
        || rule.block_for.is_some()
    {
        return Some(origin::RATE_ONLY);
    }
    if remote_of(rule).is_some() {
        return Some(origin::Said {
            rust: "a Redis rule cannot be a concurrency rule",
            file: "a Redis rule cannot be a concurrency rule",
        });
    }
    None
}

/// The limit of a Redis concurrency rule (its limiter is in `conc`).
#[cfg(feature = "redis")]
fn redis_concurrent<C: Clock>(conc: Option<&ConcLimit<C>>) -> Option<RuleLimit<C>> {
    conc?.redis().map(|_| RuleLimit::RedisConcurrent)
}

#[cfg(not(feature = "redis"))]
fn redis_concurrent<C: Clock>(_: Option<&ConcLimit<C>>) -> Option<RuleLimit<C>> {
    None
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
    #[cfg(feature = "redis")]
    if let Some(l) = r.concurrency.as_ref().and_then(|c| c.redis.as_ref()) {
        return format!("{:p}", Arc::as_ptr(l));
    }
    let _ = r;
    String::new()
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
            origin: Origin::Rust,
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

    /// A layer read from a file warns about its client address in the
    /// file's words, until Rust sets the client address.
    #[cfg(feature = "serde")]
    #[test]
    fn the_client_address_warnings_follow_who_set_it() {
        let config: super::super::LayerConfig = toml::from_str("trusted_hops = 1").unwrap();
        let b = config.to_builder().unwrap();
        assert_eq!(b.origin, Origin::File);
        assert_eq!(b.client_ip(ClientIp::behind_hops(1)).origin, Origin::Rust);
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
