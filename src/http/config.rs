//! The layer's rules as configuration (features `tower` and `serde`): a
//! [`LayerConfig`] read from a TOML, YAML or JSON file turns into a
//! [`RateLimitBuilder`].
//!
//! Values are kept as written (strings and numbers) and checked when the
//! builder is made, so a bad value gives a typed [`HttpConfigError`] that
//! names the rule and the field. The file format itself reports structural
//! mistakes (a missing `name`, an unknown field, a string where a number
//! belongs).

use super::builder::{HttpConfigError, RateLimitBuilder};
use super::client_ip::{Cidr, ClientIp, ProxyHeader, MAX_HOPS};
use super::headers::{Headers, Items};
use super::key::Key;
use super::rule::{Missing, Mode, Rule, UnknownClient};
use super::service::RateLimitLayer;
use crate::keyed::WhenFull;
use crate::policy::Policy;
use http::header::HeaderName;
use http::{Method, StatusCode};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The whole layer as configuration: how the client address is found,
/// which headers are sent, an allow list, and the rules.
///
/// Every field is optional; the defaults are those of
/// [`RateLimitLayer::builder`] (the TCP peer as the client, the draft
/// headers, no rules). [`to_builder`](Self::to_builder) checks every value
/// and gives a builder to finish in Rust (a clock, a skip predicate, a
/// responder, rules keyed by request extensions).
///
/// | field | value |
/// |---|---|
/// | `headers` | `"draft"` (default), `"draft-closest"`, `"legacy"` or `"none"` |
/// | `trusted_proxies` | networks of proxies to walk past, `["10.0.0.0/8"]` |
/// | `trusted_hops` | or: how many proxies stand in front of the server |
/// | `trusted_peers` | with `trusted_hops`: the proxies' networks; a peer outside them is the client, whatever its headers say |
/// | `proxy_header` | `"x-forwarded-for"` (default) or `"forwarded"` |
/// | `client_ip_header` | a CDN's single header, believed from `trusted_proxies` only |
/// | `allow` | networks whose clients pass unlimited |
/// | `rules` | the rules ([`RuleConfig`]), `[[rules]]` in TOML |
///
/// # Example
///
/// ```
/// use ratewall::http::LayerConfig;
///
/// let config: LayerConfig = toml::from_str(r#"
///     trusted_proxies = ["10.0.0.0/8"]
///
///     [[rules]]
///     name = "ip"
///     key = "ip"
///     policy = "600/min burst 100"
///
///     [[rules]]
///     name = "login"
///     key = "ip"
///     policy = "5/min sliding-log"
///     methods = ["POST"]
///     path_prefix = "/login"
///     hide_headers = true
/// "#)?;
/// let layer = config.to_builder()?.build()?;
/// assert_eq!(layer.stats().len(), 2);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[non_exhaustive]
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LayerConfig {
    /// Which rate-limit headers to send: `"draft"`, `"draft-closest"`,
    /// `"legacy"` or `"none"` (see [`Headers`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub headers: Option<String>,
    /// Networks of trusted proxies ([`ClientIp::behind_proxies`]), or with
    /// `client_ip_header` the networks that header is believed from.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub trusted_proxies: Vec<String>,
    /// How many proxies stand in front of the server
    /// ([`ClientIp::behind_hops`]); not with `trusted_proxies`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trusted_hops: Option<u32>,
    /// With `trusted_hops`: the networks the TCP peer must be in for the
    /// chain to be read ([`ClientIp::from_peers`]). Without it a hop count
    /// believes every peer, and the layer warns when it is built.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub trusted_peers: Vec<String>,
    /// The list header the proxies write: `"x-forwarded-for"` (default) or
    /// `"forwarded"` (RFC 7239).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub proxy_header: Option<String>,
    /// A CDN's single client-address header such as `"cf-connecting-ip"`
    /// ([`ClientIp::single_header`]), believed only from peers in
    /// `trusted_proxies`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client_ip_header: Option<String>,
    /// Clients in these networks pass unlimited
    /// ([`RateLimitBuilder::allow`]).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub allow: Vec<String>,
    /// The rules, in header order.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub rules: Vec<RuleConfig>,
}

/// One rule as configuration: the text form of a [`Rule`].
///
/// `name`, `key` and `policy` are required; every other field is optional
/// and defaults as [`Rule::new`] does.
///
/// | field | value |
/// |---|---|
/// | `name` | the rule's name (a structured-field token: `"ip"`, `"login"`) |
/// | `policy` | a policy in text form: `"100/min"`, `"5/min burst 10"`, `"10/min sliding-log"`, `"100/min soft 10%"` |
/// | `key` | `"ip"`, `"header:x-api-key"`, `"route"`, `"global"`, or parts joined by `+` (`"ip + route"`) |
/// | `ipv4_prefix`, `ipv6_prefix` | for `ip` keys: group clients by this many leading bits (defaults 32 and 64) |
/// | `methods` | only these methods, `["POST"]` (case-sensitive) |
/// | `path_prefix` | only paths under this prefix, whole segments, both normalized (`//login`, `/%6Cogin` are `/login`): `"/login"` |
/// | `ignore_path_case` | `true`: the path prefix matches letters in either case |
/// | `route` | only this axum route (`MatchedPath`), `"/items/{id}"` |
/// | `cost` | units per request (default 1) |
/// | `mode` | `"enforce"` (default), `"shadow"` or `"off"` |
/// | `when_missing` | `"skip"`, or `"reject 401"` (any status from 400 to 599) |
/// | `unknown_client` | `"as-missing"` (default: `when_missing` decides, a 5xx becoming 400) or `"nearest-hop"` (key by the nearest trusted proxy's address) |
/// | `hide_headers` | `true`: left out of the headers of allowed responses |
/// | `count_failures_only` | `true`: given back when the response is 2xx or 3xx |
/// | `count_refused` | `true`: charged even when another rule refuses the request ([`Rule::count_refused`]) |
/// | `max_keys` | the most keys tracked at once |
/// | `when_full` | `"evict-least-recent"` (default), `"reject-new"` or `"admit-untracked"` |
/// | `store` | `"local"` (default) or `"redis"`: the state lives in Redis, shared by every instance (built by `LayerConfig::to_builder_with_redis`) |
/// | `redis_prefix` | Redis rules: the first part of the key names (default `"ratewall"`; keys are `prefix:name:key`) |
/// | `on_failure` | Redis rules: `"open"`, `"closed"`, `"fallback-share N"` (default `"fallback-share 1"`) or `"fallback POLICY"` |
/// | `deny_cache` | Redis rules: a local deny cache of up to this many keys |
/// | `tiers` | premium tiers: tier names and their policies, `{ premium = "1000/min" }` |
/// | `tier_keys` | for a rule keyed by one header: the key values of each tier, `{ premium = ["key-1"] }` |
/// | `tier_header` | or: a header whose value names the tier (set by your authenticating proxy) |
/// | `block_for` | a lockout after a breach: the key is denied this long after the rule denies it, `"15min"` |
/// | `lockout_max_keys` | the most live blocks tracked at once (default: `max_keys`, at least 65,536) |
/// | `concurrent` | instead of `policy`: a concurrency rule, at most this many requests in flight (`key = "global"`) |
/// | `adaptive` | concurrency rules: `"vegas FLOOR..CEILING"` or `"aimd FLOOR..CEILING LATENCY"` (`backoff 0.8` optional) |
/// | `keep_for` | concurrency rules: percent of the maximum kept for a class and those above, `{ critical = 20, normal = 10 }` |
/// | `priority_header` | concurrency rules: the header naming a request's class (`critical`, `normal`, `sheddable`); a client can send it too: set it in a trusted proxy that strips it from clients |
/// | `release_permit` | concurrency rules: `"body-end"` (default: a slow reader holds its permit until its body ends) or `"response-head"` |
///
/// `max_keys`, `when_full` and `lockout_max_keys` are for local rules only, the `redis_*`,
/// `on_failure` and `deny_cache` fields for Redis rules only; either on
/// the other kind is an error naming the field.
///
/// # Example
///
/// ```
/// use ratewall::http::{RuleConfig, RateLimitLayer};
///
/// let mut rule = RuleConfig::new("key", "header:x-api-key", "6000/min sliding-window soft 10%");
/// rule.when_missing = Some("reject 401".into());
/// let layer = RateLimitLayer::builder().rule(rule.to_rule()?).build()?;
/// # let _ = layer;
/// # Ok::<(), ratewall::http::HttpConfigError>(())
/// ```
#[non_exhaustive]
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleConfig {
    /// The rule's name ([`Rule::new`]).
    pub name: String,
    /// The policy in text form (`docs/configuration.md`); empty for a
    /// concurrency rule.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub policy: String,
    /// What the rule counts requests under: `ip`, `header:NAME`, `route`,
    /// `global`, or several joined by `+`.
    pub key: String,
    /// For `ip` keys: IPv4 clients grouped by this many bits (0 to 32).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv4_prefix: Option<u32>,
    /// For `ip` keys: IPv6 clients grouped by this many bits (0 to 128).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv6_prefix: Option<u32>,
    /// Only requests with one of these methods (all if empty).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub methods: Vec<String>,
    /// Only paths under this prefix ([`Rule::on_path_prefix`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path_prefix: Option<String>,
    /// The path prefix matches letters in either case
    /// ([`Rule::ignore_path_case`]).
    #[serde(default, skip_serializing_if = "is_false")]
    pub ignore_path_case: bool,
    /// Only this axum route ([`Rule::on_route`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub route: Option<String>,
    /// What a request costs (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<u64>,
    /// `"enforce"`, `"shadow"` or `"off"` ([`Mode`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
    /// `"skip"` or `"reject STATUS"` ([`Missing`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub when_missing: Option<String>,
    /// `"as-missing"` or `"nearest-hop"`: what to do with a request whose
    /// client address is unknown ([`UnknownClient`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unknown_client: Option<String>,
    /// Leave the rule out of the headers of allowed responses.
    #[serde(default, skip_serializing_if = "is_false")]
    pub hide_headers: bool,
    /// Give the units back when the response is 2xx or 3xx.
    #[serde(default, skip_serializing_if = "is_false")]
    pub count_failures_only: bool,
    /// Charged even when another rule refuses the request
    /// ([`Rule::count_refused`]).
    #[serde(default, skip_serializing_if = "is_false")]
    pub count_refused: bool,
    /// The most keys tracked at once ([`Rule::max_keys`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_keys: Option<usize>,
    /// `"reject-new"`, `"admit-untracked"` or `"evict-least-recent"`
    /// ([`WhenFull`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub when_full: Option<String>,
    /// Where the rule's state lives: `"local"` (default: a table in this
    /// process) or `"redis"` (shared by every instance through Redis; built
    /// by [`LayerConfig::to_builder_with_redis`], feature `redis`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store: Option<String>,
    /// For Redis rules: the first part of the rule's Redis key names
    /// (default `ratewall`; keys are `prefix:name:key`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redis_prefix: Option<String>,
    /// For Redis rules: what to answer when Redis cannot. `"open"`
    /// (admit), `"closed"` (503), `"fallback-share N"` (limit locally with
    /// this instance's share of the policy among `N` instances; the
    /// default is `"fallback-share 1"`) or `"fallback POLICY"` (limit
    /// locally with that policy, `"fallback 10/s"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_failure: Option<String>,
    /// For Redis rules: keep a local deny cache of up to this many keys
    /// (`RedisLimiterBuilder::deny_cache`; off by default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deny_cache: Option<usize>,
    /// Premium tiers: each tier's name and its policy in text form
    /// ([`Rule::tier`]).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tiers: BTreeMap<String, String>,
    /// For a rule keyed by one header: the key values that get each tier
    /// ([`Rule::tier_keys`]).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tier_keys: BTreeMap<String, Vec<String>>,
    /// A header whose value names the request's tier
    /// ([`Rule::tier_by_header`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tier_header: Option<String>,
    /// A lockout after a breach, such as `"15min"` ([`Rule::block_for`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block_for: Option<String>,
    /// The most live blocks of the lockout tracked at once
    /// ([`Rule::lockout_max_keys`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lockout_max_keys: Option<usize>,
    /// A concurrency rule's maximum in flight, instead of `policy`
    /// ([`Rule::concurrent`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrent: Option<u64>,
    /// A concurrency rule's adaptive maximum, `"vegas 4..200"` or
    /// `"aimd 4..200 50ms"` ([`Rule::adaptive`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adaptive: Option<String>,
    /// A concurrency rule's shares kept for a class and those above, `{ critical = 20 }`
    /// ([`Rule::keep_for`]).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub keep_for: BTreeMap<String, u8>,
    /// The header naming a request's class ([`Rule::priority_by_header`]):
    /// a client can send it too, so set it in a trusted proxy that strips
    /// it from clients.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority_header: Option<String>,
    /// When a concurrency rule's permit is given back: `"body-end"`
    /// (default) or `"response-head"` ([`Rule::release_permit`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub release_permit: Option<String>,
}

/// What a Redis rule is built with: the backend with the `redis` feature,
/// nothing without it.
#[cfg(feature = "redis")]
pub(super) type Backend = crate::redis::RedisBackend;
#[cfg(not(feature = "redis"))]
pub(super) type Backend = std::convert::Infallible;

fn is_false(b: &bool) -> bool {
    !*b
}

const KEY: &str = "`ip`, `header:NAME`, `route` or `global`, or several joined by `+` \
                   (`ip + route`); a request extension needs `Key::extension` in Rust";
const NETWORK: &str = "a network such as `10.0.0.0/8`, `192.0.2.7` or `2001:db8::/32`";

impl RuleConfig {
    /// A rule with a name, key and policy, every other field at its
    /// default.
    ///
    /// ```
    /// # use ratewall::http::RuleConfig;
    /// let rule = RuleConfig::new("ip", "ip", "100/min");
    /// assert!(rule.to_rule().is_ok());
    /// ```
    pub fn new(
        name: impl Into<String>,
        key: impl Into<String>,
        policy: impl Into<String>,
    ) -> RuleConfig {
        RuleConfig {
            name: name.into(),
            key: key.into(),
            policy: policy.into(),
            ..RuleConfig::default()
        }
    }

    /// Checks every field and makes the [`Rule`]. The name, a constant
    /// cost above the policy's limit and `max_keys` are checked when the
    /// layer is built, as for rules made in Rust.
    ///
    /// ```
    /// use ratewall::http::{HttpConfigError, RuleConfig};
    ///
    /// let mut rule = RuleConfig::new("login", "ip", "5/min sliding-log");
    /// rule.methods = vec!["post".into()];
    /// let err = rule.to_rule().unwrap_err();
    /// assert!(matches!(&err, HttpConfigError::InvalidValue { rule: Some(r), field: "methods", .. } if r == "login"));
    /// println!("{err}");
    /// ```
    pub fn to_rule(&self) -> Result<Rule, HttpConfigError> {
        self.make_rule(None)
    }

    /// As [`to_rule`](Self::to_rule), and a rule with `store = "redis"`
    /// becomes a [`Rule::redis`] on `redis` (features `tower`, `serde` and
    /// `redis`; a concurrency rule, a [`Rule::redis_concurrent`]): its
    /// limiter is named after the rule, so its Redis keys are
    /// `prefix:name:key`, shared by every instance with the same
    /// configuration.
    ///
    /// ```
    /// use ratewall::http::{RateLimitLayer, RuleConfig};
    /// use ratewall::redis::RedisBackend;
    ///
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let redis = RedisBackend::builder("redis://127.0.0.1:6379").build()?;
    /// let mut rule = RuleConfig::new("ip", "ip", "600/min burst 100");
    /// rule.store = Some("redis".into());
    /// rule.on_failure = Some("fallback-share 4".into());
    /// let layer = RateLimitLayer::builder().rule(rule.to_rule_with_redis(&redis)?).build()?;
    /// # let _ = layer;
    /// # Ok::<(), Box<dyn std::error::Error>>(()) }).unwrap();
    /// ```
    #[cfg(feature = "redis")]
    pub fn to_rule_with_redis(
        &self,
        redis: &crate::redis::RedisBackend,
    ) -> Result<Rule, HttpConfigError> {
        self.make_rule(Some(redis))
    }

    /// Whether the rule's state is in Redis (`store = "redis"`).
    ///
    /// ```
    /// # use ratewall::http::RuleConfig;
    /// let mut rule = RuleConfig::new("ip", "ip", "100/min");
    /// assert!(!rule.is_redis());
    /// rule.store = Some("redis".into());
    /// assert!(rule.is_redis());
    /// ```
    pub fn is_redis(&self) -> bool {
        self.store
            .as_deref()
            .is_some_and(|s| s.eq_ignore_ascii_case("redis"))
    }

    /// A field of this rule that cannot be used.
    pub(super) fn bad(
        &self,
        field: &'static str,
        value: &str,
        expected: &'static str,
    ) -> HttpConfigError {
        invalid(Some(&self.name), field, value, expected)
    }

    fn make_rule(&self, redis: Option<&Backend>) -> Result<Rule, HttpConfigError> {
        // `None` for a concurrency rule (`concurrent_config.rs`).
        let policy = self.rate_policy()?;
        let key = parse_key(&self.key).ok_or_else(|| self.bad("key", &self.key, KEY))?;
        let has_ip = key.needs_client_ip();
        let in_redis = match self.store.as_deref() {
            None => false,
            Some(s) => keyword(s, &[("local", false), ("redis", true)])
                .ok_or_else(|| self.bad("store", s, "`local` (default) or `redis`"))?,
        };
        let redis_only = [
            ("redis_prefix", self.redis_prefix.clone()),
            ("on_failure", self.on_failure.clone()),
            ("deny_cache", self.deny_cache.map(|n| n.to_string())),
        ];
        let local_only = [
            ("max_keys", self.max_keys.map(|n| n.to_string())),
            ("when_full", self.when_full.clone()),
            (
                "lockout_max_keys",
                self.lockout_max_keys.map(|n| n.to_string()),
            ),
        ];
        if in_redis {
            if let Some((field, Some(value))) = local_only.iter().find(|(_, v)| v.is_some()) {
                return Err(self.bad(
                    field,
                    value,
                    "nothing on a Redis rule: its keys expire in Redis by their TTL \
                     (leave the field out, or set `store = \"local\"`)",
                ));
            }
        } else if let Some((field, Some(value))) = redis_only.iter().find(|(_, v)| v.is_some()) {
            return Err(self.bad(
                field,
                value,
                "`store = \"redis\"` too: only a Redis rule takes it",
            ));
        }
        let mut rule = match policy {
            None => self.concurrency_rule(key, in_redis, redis)?,
            Some(policy) if in_redis => self.redis_rule(key, policy, redis)?,
            Some(policy) => Rule::new(self.name.clone(), key, policy),
        };
        rule.origin = super::origin::Origin::File;
        for (field, prefix, max) in [
            ("ipv4_prefix", self.ipv4_prefix, 32),
            ("ipv6_prefix", self.ipv6_prefix, 128),
        ] {
            let Some(p) = prefix else { continue };
            if !has_ip {
                return Err(self.bad(
                    field,
                    &p.to_string(),
                    "no prefix: the rule's key has no `ip` part",
                ));
            }
            let p = u8::try_from(p).ok().filter(|&p| p <= max).ok_or_else(|| {
                self.bad(
                    field,
                    &p.to_string(),
                    if max == 32 {
                        "a prefix length from 0 to 32"
                    } else {
                        "a prefix length from 0 to 128"
                    },
                )
            })?;
            rule = if max == 32 {
                rule.ipv4_prefix(p)
            } else {
                rule.ipv6_prefix(p)
            };
        }
        for m in &self.methods {
            let method = parse_method(m).ok_or_else(|| {
                self.bad(
                    "methods",
                    m,
                    "an HTTP method in capitals, such as `GET` or `POST` (methods are case-sensitive)",
                )
            })?;
            rule = rule.on_method(method);
        }
        if let Some(prefix) = &self.path_prefix {
            if !prefix.starts_with('/') {
                return Err(self.bad(
                    "path_prefix",
                    prefix,
                    "a path starting with `/`, such as `/login`",
                ));
            }
            rule = rule.on_path_prefix(prefix.clone());
        }
        if self.ignore_path_case {
            if self.path_prefix.is_none() {
                return Err(self.bad(
                    "ignore_path_case",
                    "true",
                    "a `path_prefix` too: it says how the prefix is compared",
                ));
            }
            rule = rule.ignore_path_case();
        }
        if let Some(route) = &self.route {
            if !route.starts_with('/') {
                return Err(self.bad(
                    "route",
                    route,
                    "a route starting with `/`, such as `/items/{id}`",
                ));
            }
            rule = rule.on_route(route.clone());
        }
        if let Some(cost) = self.cost {
            rule = rule.cost(cost);
        }
        if let Some(mode) = &self.mode {
            let modes = [
                ("enforce", Mode::Enforce),
                ("shadow", Mode::Shadow),
                ("off", Mode::Off),
            ];
            rule = rule.mode(
                keyword(mode, &modes)
                    .ok_or_else(|| self.bad("mode", mode, "`enforce`, `shadow` or `off`"))?,
            );
        }
        if let Some(missing) = &self.when_missing {
            let m = parse_missing(missing).ok_or_else(|| {
                self.bad(
                    "when_missing",
                    missing,
                    "`skip`, or `reject` and a status from 400 to 599 (`reject 401`)",
                )
            })?;
            rule = rule.when_missing(m);
        }
        if let Some(unknown) = &self.unknown_client {
            let choices = [
                ("as-missing", UnknownClient::AsMissing),
                ("nearest-hop", UnknownClient::NearestHop),
            ];
            rule = rule.when_client_unknown(keyword(unknown, &choices).ok_or_else(|| {
                self.bad("unknown_client", unknown, "`as-missing` or `nearest-hop`")
            })?);
        }
        for (tier, text) in &self.tiers {
            let policy: Policy = text
                .parse()
                .map_err(|error| HttpConfigError::TierPolicyText {
                    rule: self.name.clone(),
                    tier: tier.clone(),
                    error,
                })?;
            rule = rule.tier(tier.clone(), policy);
        }
        for (tier, keys) in &self.tier_keys {
            rule = rule.tier_keys(tier.clone(), keys.iter().cloned());
        }
        if let Some(header) = &self.tier_header {
            HeaderName::from_bytes(header.as_bytes())
                .map_err(|_| self.bad("tier_header", header, "a header name such as `x-plan`"))?;
            rule = rule.tier_by_header(header);
        }
        if let Some(text) = &self.block_for {
            let block = crate::text::duration(text)
                .ok()
                .filter(|d| !d.is_zero())
                .ok_or_else(|| {
                    self.bad(
                        "block_for",
                        text,
                        "a duration such as `15min`, `30s`, `1h` or `250ms`",
                    )
                })?;
            rule = rule.block_for(block);
        }
        if let Some(n) = self.lockout_max_keys {
            rule = rule.lockout_max_keys(n);
        }
        if self.hide_headers {
            rule = rule.hide_headers();
        }
        if self.count_failures_only {
            rule = rule.count_failures_only();
        }
        if self.count_refused {
            rule = rule.count_refused();
        }
        if let Some(n) = self.max_keys {
            rule = rule.max_keys(n);
        }
        if let Some(full) = &self.when_full {
            let policies = [
                ("reject-new", WhenFull::RejectNew),
                ("admit-untracked", WhenFull::AdmitUntracked),
                ("evict-least-recent", WhenFull::EvictLeastRecent),
            ];
            rule = rule.when_full(keyword(full, &policies).ok_or_else(|| {
                self.bad(
                    "when_full",
                    full,
                    "`reject-new`, `admit-untracked` or `evict-least-recent`",
                )
            })?);
        }
        Ok(rule)
    }

    #[cfg(not(feature = "redis"))]
    fn redis_rule(
        &self,
        _key: Key,
        _policy: Policy,
        _redis: Option<&Backend>,
    ) -> Result<Rule, HttpConfigError> {
        Err(HttpConfigError::RedisFeatureMissing {
            rule: self.name.clone(),
        })
    }

    /// A Redis rule's backend and failure policy, with its name and
    /// `redis_prefix` checked (rate and concurrency rules alike).
    #[cfg(feature = "redis")]
    pub(super) fn redis_settings<'a>(
        &self,
        redis: Option<&'a Backend>,
    ) -> Result<(&'a Backend, crate::redis::FailurePolicy), HttpConfigError> {
        use crate::redis::FailurePolicy;
        let failure = match &self.on_failure {
            None => FailurePolicy::default(),
            Some(text) => parse_failure(text).ok_or_else(|| {
                self.bad(
                    "on_failure",
                    text,
                    "`open`, `closed`, `fallback-share N` (this instance's share among N, 1 or more) \
                     or `fallback POLICY` (`fallback 10/s`)",
                )
            })?,
        };
        if let Some(prefix) = &self.redis_prefix {
            if !redis_name(prefix) {
                return Err(self.bad(
                    "redis_prefix",
                    prefix,
                    "1 to 64 printable ASCII characters without space, `:`, `{` or `}`",
                ));
            }
        }
        if self.name.contains(':') {
            return Err(self.bad(
                "name",
                &self.name,
                "a name without `:` for a Redis rule (it names the rule's Redis keys, `prefix:name:key`)",
            ));
        }
        let Some(backend) = redis else {
            return Err(HttpConfigError::RedisBackendMissing {
                rule: self.name.clone(),
            });
        };
        Ok((backend, failure))
    }

    #[cfg(feature = "redis")]
    fn redis_rule(
        &self,
        key: Key,
        policy: Policy,
        redis: Option<&Backend>,
    ) -> Result<Rule, HttpConfigError> {
        use crate::redis::RedisLimiter;
        let (backend, failure) = self.redis_settings(redis)?;
        let mut limiter = RedisLimiter::builder(policy, backend)
            .name(self.name.clone())
            .on_failure(failure);
        if let Some(prefix) = &self.redis_prefix {
            limiter = limiter.prefix(prefix.clone());
        }
        if let Some(n) = self.deny_cache {
            limiter = limiter.deny_cache(n);
        }
        let limiter = limiter.build().map_err(|error| HttpConfigError::Redis {
            rule: self.name.clone(),
            error,
        })?;
        Ok(Rule::redis(key, limiter))
    }
}

/// Whether a Redis key prefix is usable: what `RedisLimiterBuilder::build`
/// accepts (1 to 64 printable ASCII bytes without space, `:` or braces),
/// checked here so that the error names the field even without a backend.
#[cfg(feature = "redis")]
fn redis_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_graphic() && b != b'{' && b != b'}' && b != b':')
}

/// `open`, `closed`, `fallback-share N` or `fallback POLICY`.
#[cfg(feature = "redis")]
fn parse_failure(text: &str) -> Option<crate::redis::FailurePolicy> {
    use crate::redis::FailurePolicy;
    let text = text.trim();
    let (word, rest) = match text.split_once(char::is_whitespace) {
        Some((w, r)) => (w, r.trim()),
        None => (text, ""),
    };
    match (word.to_ascii_lowercase().as_str(), rest) {
        ("open", "") => Some(FailurePolicy::Open),
        ("closed", "") => Some(FailurePolicy::Closed),
        ("fallback-share", n) => {
            let instances: u32 = n.parse().ok().filter(|&n| n >= 1)?;
            Some(FailurePolicy::FallbackShare { instances })
        }
        ("fallback", p) if !p.is_empty() => p.parse().ok().map(FailurePolicy::Fallback),
        _ => None,
    }
}

impl LayerConfig {
    /// Checks every value and makes the layer's builder, with every rule
    /// added. Finish it in Rust: `.clock(..)`, `.skip(..)`, more rules,
    /// then `.build()`.
    ///
    /// ```
    /// use ratewall::http::{HttpConfigError, LayerConfig};
    ///
    /// let config: LayerConfig = toml::from_str("trusted_proxies = [\"10.0.0.0/33\"]").unwrap();
    /// let err = config.to_builder().unwrap_err();
    /// assert!(matches!(err, HttpConfigError::InvalidValue { rule: None, field: "trusted_proxies", .. }));
    /// assert_eq!(
    ///     err.to_string(),
    ///     "field `trusted_proxies`: \"10.0.0.0/33\" is not usable; expected a network such as \
    ///      `10.0.0.0/8`, `192.0.2.7` or `2001:db8::/32`"
    /// );
    /// ```
    pub fn to_builder(&self) -> Result<RateLimitBuilder, HttpConfigError> {
        self.make_builder(None)
    }

    /// As [`to_builder`](Self::to_builder), with the rules that say
    /// `store = "redis"` on `redis` (features `tower`, `serde` and `redis`;
    /// the backend needs a tokio runtime). Every instance built from the
    /// same configuration on the same Redis counts against one limit.
    ///
    /// ```
    /// use ratewall::http::LayerConfig;
    /// use ratewall::redis::RedisBackend;
    ///
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let config: LayerConfig = toml::from_str(r#"
    ///     [[rules]]
    ///     name = "ip"
    ///     key = "ip"
    ///     policy = "600/min burst 100"
    ///     store = "redis"
    ///     on_failure = "fallback-share 4"
    /// "#)?;
    /// let redis = RedisBackend::builder("redis://127.0.0.1:6379").build()?;
    /// let layer = config.to_builder_with_redis(&redis)?.build()?;
    /// # let _ = layer;
    /// # Ok::<(), Box<dyn std::error::Error>>(()) }).unwrap();
    /// ```
    #[cfg(feature = "redis")]
    pub fn to_builder_with_redis(
        &self,
        redis: &crate::redis::RedisBackend,
    ) -> Result<RateLimitBuilder, HttpConfigError> {
        self.make_builder(Some(redis))
    }

    /// Whether any rule keeps its state in Redis (`store = "redis"`), so
    /// that the layer needs [`to_builder_with_redis`](Self::to_builder_with_redis).
    ///
    /// ```
    /// # use ratewall::http::LayerConfig;
    /// let config: LayerConfig =
    ///     toml::from_str("[[rules]]\nname = \"ip\"\nkey = \"ip\"\npolicy = \"1/s\"\nstore = \"redis\"\n")?;
    /// assert!(config.uses_redis());
    /// # Ok::<(), toml::de::Error>(())
    /// ```
    pub fn uses_redis(&self) -> bool {
        self.rules.iter().any(RuleConfig::is_redis)
    }

    fn make_builder(&self, redis: Option<&Backend>) -> Result<RateLimitBuilder, HttpConfigError> {
        let bad = |field, value: &str, expected| invalid(None, field, value, expected);
        let networks = |field: &'static str, list: &[String]| {
            list.iter()
                .map(|s| s.parse::<Cidr>().map_err(|_| bad(field, s, NETWORK)))
                .collect::<Result<Vec<Cidr>, _>>()
        };
        let mut b = RateLimitLayer::builder();
        if let Some(h) = &self.headers {
            let kinds = [
                ("draft", Headers::Draft(Items::All)),
                ("draft-closest", Headers::Draft(Items::ClosestToExhaustion)),
                ("legacy", Headers::Legacy),
                ("none", Headers::None),
            ];
            b = b.headers(keyword(h, &kinds).ok_or_else(|| {
                bad("headers", h, "`draft`, `draft-closest`, `legacy` or `none`")
            })?);
        }
        let proxies = networks("trusted_proxies", &self.trusted_proxies)?;
        if !self.trusted_peers.is_empty() && self.trusted_hops.is_none() {
            return Err(bad(
                "trusted_peers",
                &self.trusted_peers.join(", "),
                "`trusted_hops` too: the peers are the proxies a hop count trusts \
                 (`trusted_proxies` and `client_ip_header` already check the peer)",
            ));
        }
        let proxy_header =
            match &self.proxy_header {
                None => None,
                Some(p) => {
                    let headers = [
                        ("x-forwarded-for", ProxyHeader::XForwardedFor),
                        ("forwarded", ProxyHeader::Forwarded),
                    ];
                    Some(keyword(p, &headers).ok_or_else(|| {
                        bad("proxy_header", p, "`x-forwarded-for` or `forwarded`")
                    })?)
                }
            };
        let client_ip = match (&self.client_ip_header, self.trusted_hops) {
            (Some(h), _) => {
                if HeaderName::from_bytes(h.as_bytes()).is_err() {
                    return Err(bad(
                        "client_ip_header",
                        h,
                        "a header name such as `cf-connecting-ip`",
                    ));
                }
                if proxies.is_empty() {
                    return Err(bad(
                        "client_ip_header",
                        h,
                        "`trusted_proxies` too: the networks the header is believed from",
                    ));
                }
                if let Some(n) = self.trusted_hops {
                    return Err(bad(
                        "trusted_hops",
                        &n.to_string(),
                        "no hop count with `client_ip_header` (it is believed from `trusted_proxies`)",
                    ));
                }
                if let Some(p) = &self.proxy_header {
                    return Err(bad(
                        "proxy_header",
                        p,
                        "no list header with `client_ip_header` (one header holds the client)",
                    ));
                }
                ClientIp::single_header(h, proxies)
            }
            (None, Some(n)) => {
                if !proxies.is_empty() {
                    return Err(bad(
                        "trusted_hops",
                        &n.to_string(),
                        "no hop count with `trusted_proxies`: trust proxies by network or by count, not both",
                    ));
                }
                let hops = usize::try_from(n)
                    .ok()
                    .filter(|&n| n <= MAX_HOPS)
                    .ok_or_else(|| bad("trusted_hops", &n.to_string(), "a count from 0 to 32"))?;
                match self.trusted_peers.is_empty() {
                    true => ClientIp::behind_hops(hops),
                    false => ClientIp::behind_hops(hops)
                        .from_peers(networks("trusted_peers", &self.trusted_peers)?),
                }
            }
            (None, None) if !proxies.is_empty() => ClientIp::behind_proxies(proxies),
            (None, None) => {
                if let Some(p) = &self.proxy_header {
                    return Err(bad(
                        "proxy_header",
                        p,
                        "`trusted_proxies` or `trusted_hops` too: without trusted proxies no header is read",
                    ));
                }
                ClientIp::peer()
            }
        };
        b = b
            .client_ip(match proxy_header {
                Some(p) if self.client_ip_header.is_none() => client_ip.header(p),
                _ => client_ip,
            })
            .read_from_file();
        b = b.allow(networks("allow", &self.allow)?);
        for rule in &self.rules {
            b = b.rule(rule.make_rule(redis)?);
        }
        Ok(b)
    }
}

/// A value of a configuration that cannot be used: `rule` names the rule,
/// `None` a field of the layer.
fn invalid(
    rule: Option<&str>,
    field: &'static str,
    value: &str,
    expected: &'static str,
) -> HttpConfigError {
    HttpConfigError::InvalidValue {
        rule: rule.map(str::to_owned),
        field,
        value: value.to_owned(),
        expected,
    }
}

/// The value `text` names among `words`, in any case (`Shadow`, `shadow`).
fn keyword<T: Copy>(text: &str, words: &[(&str, T)]) -> Option<T> {
    words
        .iter()
        .find(|(w, _)| text.eq_ignore_ascii_case(w))
        .map(|&(_, v)| v)
}

/// `ip`, `header:NAME`, `route`, `global`, or several joined by `+`.
fn parse_key(text: &str) -> Option<Key> {
    let mut parts = Vec::new();
    for part in text.split('+') {
        let part = part.trim();
        let key = if part.eq_ignore_ascii_case("ip") {
            Key::ip()
        } else if part.eq_ignore_ascii_case("route") {
            Key::route()
        } else if part.eq_ignore_ascii_case("global") {
            Key::global()
        } else {
            let (kind, name) = part.split_once(':')?;
            if !kind.trim().eq_ignore_ascii_case("header") {
                return None;
            }
            let name = name.trim();
            HeaderName::from_bytes(name.as_bytes()).ok()?;
            Key::header(name)
        };
        parts.push(key);
    }
    if parts.len() == 1 {
        parts.pop()
    } else {
        Some(Key::composite(parts))
    }
}

/// A method token with no lower-case letters (methods are case-sensitive:
/// `post` is not `POST`, and is almost always a typo).
fn parse_method(text: &str) -> Option<Method> {
    if text.bytes().any(|b| b.is_ascii_lowercase()) {
        return None;
    }
    Method::from_bytes(text.as_bytes()).ok()
}

/// `skip`, or `reject` and a status from 400 to 599.
fn parse_missing(text: &str) -> Option<Missing> {
    let mut words = text.split_whitespace();
    let m = match words.next()?.to_ascii_lowercase().as_str() {
        "skip" => Missing::Skip,
        "reject" => {
            let code: u16 = words.next()?.parse().ok()?;
            if !(400..=599).contains(&code) {
                return None;
            }
            Missing::Reject(StatusCode::from_u16(code).ok()?)
        }
        _ => return None,
    };
    words.next().is_none().then_some(m)
}

#[cfg(test)]
#[path = "config_tests.rs"]
mod tests;
