//! The layer's rules as configuration (features `tower` and `serde`): a
//! [`LayerConfig`] read from a TOML, YAML or JSON file turns into a
//! [`RateLimitBuilder`].
//!
//! Values are kept as written (strings and numbers) and checked when the
//! builder is made, so a bad value gives a typed [`HttpConfigError`] that
//! names the rule and the field. The file format itself reports structural
//! mistakes (a missing `name`, an unknown field, a string where a number
//! belongs).

use super::{
    Cidr, ClientIp, Headers, HttpConfigError, Items, Key, Missing, Mode, ProxyHeader,
    RateLimitBuilder, RateLimitLayer, Rule, MAX_HOPS,
};
use crate::keyed::WhenFull;
use crate::policy::Policy;
use http::header::HeaderName;
use http::{Method, StatusCode};
use serde::{Deserialize, Serialize};

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
/// | `path_prefix` | only paths under this prefix, whole segments: `"/login"` |
/// | `route` | only this axum route (`MatchedPath`), `"/items/{id}"` |
/// | `cost` | units per request (default 1) |
/// | `mode` | `"enforce"` (default), `"shadow"` or `"off"` |
/// | `when_missing` | `"skip"`, or `"reject 401"` (any status from 400 to 599) |
/// | `hide_headers` | `true`: left out of the headers of allowed responses |
/// | `count_failures_only` | `true`: given back when the response is 2xx or 3xx |
/// | `max_keys` | the most keys tracked at once |
/// | `when_full` | `"reject-new"` (default), `"admit-untracked"` or `"evict-least-recent"` |
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
    /// The policy in text form (`docs/configuration.md`).
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
    /// Leave the rule out of the headers of allowed responses.
    #[serde(default, skip_serializing_if = "is_false")]
    pub hide_headers: bool,
    /// Give the units back when the response is 2xx or 3xx.
    #[serde(default, skip_serializing_if = "is_false")]
    pub count_failures_only: bool,
    /// The most keys tracked at once ([`Rule::max_keys`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_keys: Option<usize>,
    /// `"reject-new"`, `"admit-untracked"` or `"evict-least-recent"`
    /// ([`WhenFull`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub when_full: Option<String>,
}

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
        let bad = |field: &'static str, value: &str, expected: &'static str| {
            HttpConfigError::InvalidValue {
                rule: Some(self.name.clone()),
                field,
                value: value.to_owned(),
                expected,
            }
        };
        let policy: Policy = self
            .policy
            .parse()
            .map_err(|error| HttpConfigError::PolicyText {
                rule: self.name.clone(),
                error,
            })?;
        let key = parse_key(&self.key).ok_or_else(|| bad("key", &self.key, KEY))?;
        let has_ip = key.needs_client_ip();
        let mut rule = Rule::new(self.name.clone(), key, policy);
        for (field, prefix, max) in [
            ("ipv4_prefix", self.ipv4_prefix, 32),
            ("ipv6_prefix", self.ipv6_prefix, 128),
        ] {
            let Some(p) = prefix else { continue };
            if !has_ip {
                return Err(bad(
                    field,
                    &p.to_string(),
                    "no prefix: the rule's key has no `ip` part",
                ));
            }
            let p = u8::try_from(p).ok().filter(|&p| p <= max).ok_or_else(|| {
                bad(
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
                bad(
                    "methods",
                    m,
                    "an HTTP method in capitals, such as `GET` or `POST` (methods are case-sensitive)",
                )
            })?;
            rule = rule.on_method(method);
        }
        if let Some(prefix) = &self.path_prefix {
            if !prefix.starts_with('/') {
                return Err(bad(
                    "path_prefix",
                    prefix,
                    "a path starting with `/`, such as `/login`",
                ));
            }
            rule = rule.on_path_prefix(prefix.clone());
        }
        if let Some(route) = &self.route {
            if !route.starts_with('/') {
                return Err(bad(
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
            rule = rule.mode(match mode.to_ascii_lowercase().as_str() {
                "enforce" => Mode::Enforce,
                "shadow" => Mode::Shadow,
                "off" => Mode::Off,
                _ => return Err(bad("mode", mode, "`enforce`, `shadow` or `off`")),
            });
        }
        if let Some(missing) = &self.when_missing {
            let m = parse_missing(missing).ok_or_else(|| {
                bad(
                    "when_missing",
                    missing,
                    "`skip`, or `reject` and a status from 400 to 599 (`reject 401`)",
                )
            })?;
            rule = rule.when_missing(m);
        }
        if self.hide_headers {
            rule = rule.hide_headers();
        }
        if self.count_failures_only {
            rule = rule.count_failures_only();
        }
        if let Some(n) = self.max_keys {
            rule = rule.max_keys(n);
        }
        if let Some(full) = &self.when_full {
            rule = rule.when_full(match full.to_ascii_lowercase().as_str() {
                "reject-new" => WhenFull::RejectNew,
                "admit-untracked" => WhenFull::AdmitUntracked,
                "evict-least-recent" => WhenFull::EvictLeastRecent,
                _ => {
                    return Err(bad(
                        "when_full",
                        full,
                        "`reject-new`, `admit-untracked` or `evict-least-recent`",
                    ))
                }
            });
        }
        Ok(rule)
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
        let bad = |field: &'static str, value: &str, expected: &'static str| {
            HttpConfigError::InvalidValue {
                rule: None,
                field,
                value: value.to_owned(),
                expected,
            }
        };
        let networks = |field: &'static str, list: &[String]| {
            list.iter()
                .map(|s| s.parse::<Cidr>().map_err(|_| bad(field, s, NETWORK)))
                .collect::<Result<Vec<Cidr>, _>>()
        };
        let mut b = RateLimitLayer::builder();
        if let Some(h) = &self.headers {
            b = b.headers(match h.to_ascii_lowercase().as_str() {
                "draft" => Headers::Draft(Items::All),
                "draft-closest" => Headers::Draft(Items::ClosestToExhaustion),
                "legacy" => Headers::Legacy,
                "none" => Headers::None,
                _ => {
                    return Err(bad(
                        "headers",
                        h,
                        "`draft`, `draft-closest`, `legacy` or `none`",
                    ))
                }
            });
        }
        let proxies = networks("trusted_proxies", &self.trusted_proxies)?;
        let proxy_header = match &self.proxy_header {
            None => None,
            Some(p) => Some(match p.to_ascii_lowercase().as_str() {
                "x-forwarded-for" => ProxyHeader::XForwardedFor,
                "forwarded" => ProxyHeader::Forwarded,
                _ => return Err(bad("proxy_header", p, "`x-forwarded-for` or `forwarded`")),
            }),
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
                ClientIp::behind_hops(hops)
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
        b = b.client_ip(match proxy_header {
            Some(p) if self.client_ip_header.is_none() => client_ip.header(p),
            _ => client_ip,
        });
        b = b.allow(networks("allow", &self.allow)?);
        for rule in &self.rules {
            b = b.rule(rule.to_rule()?);
        }
        Ok(b)
    }
}

/// `ip`, `header:NAME`, `route`, `global`, or several joined by `+`.
fn parse_key(text: &str) -> Option<Key> {
    let mut parts = Vec::new();
    for part in text.split('+') {
        let part = part.trim();
        let key = if part.eq_ignore_ascii_case("ip") {
            Key::client_ip()
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
mod tests {
    use super::*;

    #[test]
    fn keys_parse_alone_and_joined() {
        for ok in [
            "ip",
            "IP",
            "route",
            "global",
            "header:x-api-key",
            " ip + header : X-Key ",
        ] {
            assert!(parse_key(ok).is_some(), "{ok}");
        }
        assert!(parse_key("ip + route").unwrap().needs_client_ip());
        assert!(!parse_key("header:x-api-key").unwrap().needs_client_ip());
        for bad in [
            "",
            "ip +",
            "user",
            "header:",
            "header:bad name",
            "cookie:x",
            "ip route",
        ] {
            assert!(parse_key(bad).is_none(), "{bad}");
        }
    }

    #[test]
    fn missing_and_methods_parse_strictly() {
        assert_eq!(parse_missing("skip"), Some(Missing::Skip));
        assert_eq!(
            parse_missing("reject 401"),
            Some(Missing::Reject(StatusCode::UNAUTHORIZED))
        );
        for bad in [
            "",
            "reject",
            "reject 200",
            "reject 600",
            "reject 401 now",
            "drop",
        ] {
            assert_eq!(parse_missing(bad), None, "{bad}");
        }
        assert_eq!(parse_method("POST"), Some(Method::POST));
        assert_eq!(
            parse_method("PURGE").map(|m| m.to_string()),
            Some("PURGE".into())
        );
        for bad in ["post", "", "GE T"] {
            assert_eq!(parse_method(bad), None, "{bad}");
        }
    }
}
