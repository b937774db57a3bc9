//! Rules: a name, a key, a policy, where it applies, what a request costs,
//! and what to do when the key is missing.

use super::key::{ip_key, Fingerprint, Resolved};
use crate::keyed::WhenFull;
use crate::policy::Policy;
use http::header::HeaderName;
use http::{Extensions, HeaderMap, Method, StatusCode, Uri};
use std::fmt;
use std::hash::{Hash, Hasher};
use std::net::IpAddr;

/// What a rule counts requests under.
///
/// # Example
///
/// ```
/// use ratewall::http::Key;
///
/// #[derive(Clone, Hash)]
/// struct UserId(u64);
///
/// let per_user = Key::extension::<UserId>();
/// let per_key = Key::header("x-api-key");
/// let both = Key::composite([Key::client_ip(), Key::header("x-api-key")]);
/// # let _ = (per_user, per_key, both);
/// ```
#[derive(Clone)]
pub struct Key(KeyKind);

#[derive(Clone)]
enum KeyKind {
    ClientIp {
        v4_prefix: u8,
        v6_prefix: u8,
    },
    Header(Option<HeaderName>),
    Extension(
        &'static str,
        fn(&Extensions, &Fingerprint) -> Option<u128>,
        // The key as bytes, for Redis rules.
        #[cfg_attr(not(feature = "redis"), allow(dead_code))]
        fn(&Extensions, &mut dyn Hasher) -> bool,
    ),
    Route,
    Global,
    Composite(Vec<Key>),
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            KeyKind::ClientIp {
                v4_prefix,
                v6_prefix,
            } => write!(f, "ClientIp(/{v4_prefix}, /{v6_prefix})"),
            KeyKind::Header(Some(h)) => write!(f, "Header({h})"),
            KeyKind::Header(None) => f.write_str("Header(<invalid name>)"),
            KeyKind::Extension(t, _, _) => write!(f, "Extension({t})"),
            KeyKind::Route => f.write_str("Route"),
            KeyKind::Global => f.write_str("Global"),
            KeyKind::Composite(keys) => f.debug_tuple("Composite").field(keys).finish(),
        }
    }
}

fn extension_key<T: Hash + Send + Sync + 'static>(
    ext: &Extensions,
    fp: &Fingerprint,
) -> Option<u128> {
    ext.get::<T>().map(|v| fp.of(v))
}

fn extension_hash<T: Hash + Send + Sync + 'static>(ext: &Extensions, h: &mut dyn Hasher) -> bool {
    ext.get::<T>().map(|v| v.hash(&mut &mut *h)).is_some()
}

impl Key {
    /// The client's IP address (see [`ClientIp`](super::ClientIp)): IPv4 per
    /// address, IPv6 per /64.
    ///
    /// ```
    /// # use ratewall::http::Key;
    /// let k = Key::client_ip();
    /// # let _ = k;
    /// ```
    pub fn client_ip() -> Key {
        Key(KeyKind::ClientIp {
            v4_prefix: 32,
            v6_prefix: 64,
        })
    }

    /// The client's IP address, IPv4 by its first `v4_prefix` bits and
    /// IPv6 by its first `v6_prefix` bits (clamped to 32 and 128).
    ///
    /// ```
    /// # use ratewall::http::Key;
    /// let per_site = Key::client_ip_prefix(24, 48);
    /// # let _ = per_site;
    /// ```
    pub fn client_ip_prefix(v4_prefix: u8, v6_prefix: u8) -> Key {
        Key(KeyKind::ClientIp {
            v4_prefix: v4_prefix.min(32),
            v6_prefix: v6_prefix.min(128),
        })
    }

    /// The value of a request header (an API key), as a 128-bit
    /// fingerprint. Sent more than once, the values are joined in order.
    /// An invalid header name is reported when the layer is built.
    ///
    /// ```
    /// # use ratewall::http::Key;
    /// let k = Key::header("x-api-key");
    /// # let _ = k;
    /// ```
    pub fn header(name: &str) -> Key {
        Key(KeyKind::Header(
            HeaderName::from_bytes(name.as_bytes()).ok(),
        ))
    }

    /// A request extension of type `T` (the user id an auth layer set), as a
    /// 128-bit fingerprint of its `Hash`.
    ///
    /// ```
    /// # use ratewall::http::Key;
    /// #[derive(Clone, Hash)]
    /// struct UserId(u64);
    /// let k = Key::extension::<UserId>();
    /// # let _ = k;
    /// ```
    pub fn extension<T: Hash + Send + Sync + 'static>() -> Key {
        Key(KeyKind::Extension(
            std::any::type_name::<T>(),
            extension_key::<T>,
            extension_hash::<T>,
        ))
    }

    /// The route: axum's `MatchedPath` (with the `axum` feature) or else the
    /// request path. The path of an unmatched request is client-chosen:
    /// prefer `MatchedPath`, and a bounded `max_keys`.
    ///
    /// ```
    /// # use ratewall::http::Key;
    /// let k = Key::route();
    /// # let _ = k;
    /// ```
    pub fn route() -> Key {
        Key(KeyKind::Route)
    }

    /// One key for every request: a global limit.
    ///
    /// ```
    /// # use ratewall::http::Key;
    /// let k = Key::global();
    /// # let _ = k;
    /// ```
    pub fn global() -> Key {
        Key(KeyKind::Global)
    }

    /// All of `keys` together (per IP and route, per user and API key).
    /// Missing if any part is missing.
    ///
    /// ```
    /// # use ratewall::http::Key;
    /// let k = Key::composite([Key::client_ip(), Key::route()]);
    /// # let _ = k;
    /// ```
    pub fn composite(keys: impl IntoIterator<Item = Key>) -> Key {
        Key(KeyKind::Composite(keys.into_iter().collect()))
    }

    pub(crate) fn needs_client_ip(&self) -> bool {
        match &self.0 {
            KeyKind::ClientIp { .. } => true,
            KeyKind::Composite(keys) => keys.iter().any(Key::needs_client_ip),
            _ => false,
        }
    }

    pub(crate) fn has_invalid_header(&self) -> bool {
        match &self.0 {
            KeyKind::Header(None) => true,
            KeyKind::Composite(keys) => keys.iter().any(Key::has_invalid_header),
            _ => false,
        }
    }

    /// The key of a request, or why it has none. The client-address and
    /// global keys are inline (a few instructions); the others, which hash,
    /// and composites, which recurse, are a call.
    #[inline]
    pub(crate) fn extract(&self, req: &RequestParts<'_>, fp: &Fingerprint) -> Result<u128, Absent> {
        match &self.0 {
            KeyKind::ClientIp {
                v4_prefix,
                v6_prefix,
            } => match req.client {
                Resolved::Ip(ip) => Ok(ip_key(ip, *v4_prefix, *v6_prefix)),
                Resolved::NoPeer => Err(Absent::NoPeer),
                Resolved::Unknown => Err(Absent::UnknownClient),
            },
            KeyKind::Global => Ok(0),
            _ => self.extract_hashed(req, fp),
        }
    }

    #[inline(never)]
    fn extract_hashed(&self, req: &RequestParts<'_>, fp: &Fingerprint) -> Result<u128, Absent> {
        match &self.0 {
            // Inline in `extract`, which does not come back here for them.
            KeyKind::ClientIp { .. } | KeyKind::Global => self.extract(req, fp),
            KeyKind::Header(name) => {
                let name = name.as_ref().ok_or(Absent::Value)?;
                let mut values = req.headers.get_all(name).iter();
                let first = values.next().ok_or(Absent::Value)?;
                let mut acc = fp.of_bytes(first.as_bytes());
                // Sent more than once (rare): chain the lines in order.
                for more in values {
                    acc = fp.of(&(acc, more.as_bytes()));
                }
                Ok(acc)
            }
            KeyKind::Extension(_, f, _) => f(req.extensions, fp).ok_or(Absent::Value),
            KeyKind::Route => Ok(fp.of(req.route())),
            KeyKind::Composite(keys) => {
                let mut acc: u128 = 0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c834;
                for k in keys {
                    let part = k.extract(req, fp)?;
                    acc = fp.of(&(acc, part));
                }
                Ok(acc)
            }
        }
    }
}

#[cfg(feature = "redis")]
impl Key {
    /// The key of a request as bytes that every instance computes alike
    /// (for a Redis limit): the masked client address as text, `h:` and the
    /// header value, `x:` and a SHA-1 of the extension's `Hash`, `r:` and
    /// the route, `*` for the global key; a composite's parts each
    /// prefixed with their length. The Redis limiter bounds the result
    /// (it hashes long, binary or braced keys).
    pub(crate) fn extract_bytes(
        &self,
        req: &RequestParts<'_>,
        out: &mut Vec<u8>,
    ) -> Result<(), Absent> {
        use std::io::Write;
        match &self.0 {
            KeyKind::ClientIp {
                v4_prefix,
                v6_prefix,
            } => match req.client {
                Resolved::Ip(ip) => {
                    let bits = ip_key(ip, *v4_prefix, *v6_prefix);
                    let v6 = std::net::Ipv6Addr::from(bits);
                    // Writing to a Vec cannot fail.
                    let _ = match v6.to_ipv4_mapped() {
                        Some(v4) if *v4_prefix >= 32 => write!(out, "{v4}"),
                        Some(v4) => write!(out, "{v4}/{v4_prefix}"),
                        None if *v6_prefix >= 128 => write!(out, "{v6}"),
                        None => write!(out, "{v6}/{v6_prefix}"),
                    };
                    Ok(())
                }
                Resolved::NoPeer => Err(Absent::NoPeer),
                Resolved::Unknown => Err(Absent::UnknownClient),
            },
            KeyKind::Header(name) => {
                let name = name.as_ref().ok_or(Absent::Value)?;
                let mut values = req.headers.get_all(name).iter();
                let first = values.next().ok_or(Absent::Value)?;
                out.extend_from_slice(b"h:");
                out.extend_from_slice(first.as_bytes());
                // Sent more than once: NUL (never in a header value) between lines.
                for more in values {
                    out.push(0);
                    out.extend_from_slice(more.as_bytes());
                }
                Ok(())
            }
            KeyKind::Extension(_, _, hash) => {
                let mut h = Sha1Hasher(sha1_smol::Sha1::new());
                if !hash(req.extensions, &mut h) {
                    return Err(Absent::Value);
                }
                out.extend_from_slice(b"x:");
                for b in &h.0.digest().bytes()[..16] {
                    let _ = write!(out, "{b:02x}");
                }
                Ok(())
            }
            KeyKind::Route => {
                out.extend_from_slice(b"r:");
                out.extend_from_slice(req.route().as_bytes());
                Ok(())
            }
            KeyKind::Global => {
                out.push(b'*');
                Ok(())
            }
            KeyKind::Composite(keys) => {
                let mut part = Vec::new();
                for k in keys {
                    part.clear();
                    k.extract_bytes(req, &mut part)?;
                    let _ = write!(out, "{}:", part.len());
                    out.extend_from_slice(&part);
                }
                Ok(())
            }
        }
    }
}

/// A `Hasher` over SHA-1: the same bytes give the same digest in every
/// process (unlike a seeded hasher), so instances share Redis keys.
#[cfg(feature = "redis")]
struct Sha1Hasher(sha1_smol::Sha1);

#[cfg(feature = "redis")]
impl Hasher for Sha1Hasher {
    fn write(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }
    fn finish(&self) -> u64 {
        let d = self.0.digest().bytes();
        u64::from_le_bytes([d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7]])
    }
}

/// Why a request has no key for a rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Absent {
    /// The server did not pass the peer address to the layer.
    NoPeer,
    /// The proxy chain ends in an unknown or malformed entry.
    UnknownClient,
    /// The header or extension is not there.
    Value,
}

impl Absent {
    pub(crate) fn describe(self) -> &'static str {
        match self {
            Absent::NoPeer => {
                "the server passed no peer address: with axum, enable ratewall's `axum` feature and serve with \
                 `into_make_service_with_connect_info::<SocketAddr>()`; with tonic, enable the `tonic` feature; \
                 otherwise insert a `SocketAddr` extension"
            }
            Absent::UnknownClient => {
                "the client address is unknown: the proxy chain holds an unknown, obfuscated or malformed entry"
            }
            Absent::Value => "the request does not carry the value this rule is keyed by",
        }
    }
}

/// The parts of a request that keys, matchers and costs read.
#[derive(Debug)]
pub(crate) struct RequestParts<'a> {
    pub(crate) method: &'a Method,
    pub(crate) uri: &'a Uri,
    pub(crate) headers: &'a HeaderMap,
    pub(crate) extensions: &'a Extensions,
    pub(crate) client: Resolved,
}

impl RequestParts<'_> {
    fn route(&self) -> &str {
        #[cfg(feature = "axum")]
        if let Some(m) = self.extensions.get::<axum::extract::MatchedPath>() {
            return m.as_str();
        }
        self.uri.path()
    }

    #[allow(dead_code)]
    pub(crate) fn client_ip(&self) -> Option<IpAddr> {
        match self.client {
            Resolved::Ip(ip) => Some(ip),
            _ => None,
        }
    }
}

/// What a rule does with the requests it matches.
///
/// ```
/// use ratewall::http::{Mode, Rule};
/// use ratewall::{Policy, Rate};
///
/// let trial = Rule::per_ip("trial", Policy::token_bucket(Rate::per_second(5))).mode(Mode::Shadow);
/// # let _ = trial;
/// ```
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mode {
    /// Check, and reject what the limit denies (the default).
    Enforce,
    /// Dry run: check and count as if enforced, report in headers and
    /// counters, but never reject. Shadow rules are charged only when the
    /// enforced rules admit the request.
    Shadow,
    /// The rule is ignored.
    Off,
}

/// What a rule does when a request has no key for it (no API key header,
/// no user, an unknown client address). Never a silent shared bucket.
///
/// ```
/// use ratewall::http::{Missing, Rule};
/// use ratewall::{Policy, Rate};
/// use http::StatusCode;
///
/// let keys = Rule::per_header("api-key", "x-api-key", Policy::token_bucket(Rate::per_second(50)))
///     .when_missing(Missing::Reject(StatusCode::UNAUTHORIZED));
/// # let _ = keys;
/// ```
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Missing {
    /// The rule does not apply to the request.
    Skip,
    /// The request is rejected with this status and a problem+json body
    /// that names the rule and the reason; no limit is charged.
    Reject(StatusCode),
}

/// What a request costs under a rule.
#[derive(Clone, Copy)]
pub(crate) enum Cost {
    Units(u64),
    Fn(fn(&Method, &Uri, &HeaderMap) -> u64),
}

/// Which requests a rule applies to: all by default; a method list, a
/// path prefix and an axum route narrow it (all given must match).
#[derive(Clone, Debug, Default)]
pub(crate) struct Matcher {
    methods: Vec<Method>,
    path_prefix: Option<String>,
    route: Option<String>,
}

impl Matcher {
    /// Whether the rule applies to every request (no method, path or
    /// route): then no call is needed.
    #[inline]
    pub(crate) fn matches(&self, req: &RequestParts<'_>) -> bool {
        if self.matches_all() {
            return true;
        }
        self.matches_request(req)
    }

    /// Whether the rule applies to every request (no method, path or route).
    pub(crate) fn matches_all(&self) -> bool {
        self.methods.is_empty() && self.path_prefix.is_none() && self.route.is_none()
    }

    fn matches_request(&self, req: &RequestParts<'_>) -> bool {
        if !self.methods.is_empty() && !self.methods.iter().any(|m| m == req.method) {
            return false;
        }
        if let Some(prefix) = &self.path_prefix {
            let path = req.uri.path();
            let ok = path.starts_with(prefix.as_str())
                && (prefix.ends_with('/')
                    || path.len() == prefix.len()
                    || path.as_bytes().get(prefix.len()) == Some(&b'/'));
            if !ok {
                return false;
            }
        }
        if let Some(route) = &self.route {
            if req.route() != route {
                return false;
            }
        }
        true
    }
}

/// Whether a rule's numbers appear in response headers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Visibility {
    Shown,
    /// Hidden on allowed responses; a 429 still carries `Retry-After`.
    Hidden,
}

/// One limit of the layer: its name, key, policy and where it applies.
///
/// All rules that match a request are checked in one all-or-nothing step:
/// a request that one rule denies takes nothing from the others.
///
/// # Example
///
/// ```
/// use http::Method;
/// use ratewall::http::{Missing, Rule};
/// use ratewall::{Policy, Rate, Window};
///
/// let rules = [
///     Rule::per_ip("ip", Policy::token_bucket(Rate::per_minute(600).burst(100))),
///     Rule::per_header("key", "x-api-key", Policy::sliding_window_counter(Window::per_hour(5000))),
///     Rule::per_ip("login", Policy::sliding_window_log(Window::per_minute(5)))
///         .on_method(Method::POST)
///         .on_path_prefix("/login")
///         .hide_headers(),
/// ];
/// # let _ = rules;
/// ```
#[derive(Clone)]
pub struct Rule {
    pub(crate) name: String,
    pub(crate) key: Key,
    pub(crate) policy: Policy,
    pub(crate) matcher: Matcher,
    pub(crate) cost: Cost,
    pub(crate) mode: Mode,
    pub(crate) missing: Missing,
    pub(crate) visibility: Visibility,
    pub(crate) max_keys: Option<usize>,
    pub(crate) when_full: Option<WhenFull>,
    pub(crate) refund_on_success: bool,
    /// The Redis limit this rule is checked against instead of a local table.
    #[cfg(feature = "redis")]
    pub(crate) remote: Option<std::sync::Arc<crate::redis::RedisLimiter>>,
}

impl fmt::Debug for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("Rule");
        d.field("name", &self.name)
            .field("key", &self.key)
            .field("policy", &self.policy)
            .field("matcher", &self.matcher)
            .field(
                "cost",
                &match self.cost {
                    Cost::Units(n) => format!("{n}"),
                    Cost::Fn(_) => "fn".to_owned(),
                },
            )
            .field("mode", &self.mode)
            .field("missing", &self.missing)
            .field("visibility", &self.visibility)
            .field("max_keys", &self.max_keys)
            .field("when_full", &self.when_full)
            .field("refund_on_success", &self.refund_on_success);
        #[cfg(feature = "redis")]
        d.field("remote", &self.remote);
        d.finish()
    }
}

impl Rule {
    /// A rule named `name` (a structured-field token: a letter, then
    /// letters, digits and `-_.:*/`; checked when the layer is built),
    /// counting requests under `key` with `policy`. It applies to every
    /// request, costs 1, is enforced, and skips requests without a key.
    ///
    /// ```
    /// # use ratewall::http::{Key, Rule};
    /// # use ratewall::{Policy, Rate};
    /// let global = Rule::new("global", Key::global(), Policy::token_bucket(Rate::per_second(10_000)));
    /// # let _ = global;
    /// ```
    pub fn new(name: impl Into<String>, key: Key, policy: Policy) -> Rule {
        let missing = if key.needs_client_ip() {
            Missing::Reject(StatusCode::INTERNAL_SERVER_ERROR)
        } else {
            Missing::Skip
        };
        Rule {
            name: name.into(),
            key,
            policy,
            matcher: Matcher::default(),
            cost: Cost::Units(1),
            mode: Mode::Enforce,
            missing,
            visibility: Visibility::Shown,
            max_keys: None,
            when_full: None,
            refund_on_success: false,
            #[cfg(feature = "redis")]
            remote: None,
        }
    }

    /// A rule whose limit lives in Redis (features `tower` and `redis`):
    /// every instance behind a load balancer counts against `limiter`.
    /// The rule's policy is the limiter's; its key is `key`'s value as
    /// bytes (the masked client address as text, `h:` and a header value,
    /// and so on), which the limiter bounds by hashing long or binary keys.
    /// The limiter's [`FailurePolicy`](crate::redis::FailurePolicy) says
    /// what happens when Redis cannot answer. `max_keys` and `when_full`
    /// do not apply (Redis keys expire by their TTL).
    ///
    /// ```
    /// use ratewall::http::{Key, RateLimitLayer, Rule};
    /// use ratewall::redis::{FailurePolicy, RedisBackend, RedisLimiter};
    /// use ratewall::{Policy, Rate};
    ///
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let redis = RedisBackend::builder("redis://127.0.0.1:6379").build()?;
    /// let per_ip = RedisLimiter::builder(Policy::token_bucket(Rate::per_minute(600)), &redis)
    ///     .name("ip")
    ///     .on_failure(FailurePolicy::FallbackShare { instances: 4 })
    ///     .build()?;
    /// let layer = RateLimitLayer::builder()
    ///     .rule(Rule::redis("ip", Key::client_ip(), per_ip))
    ///     .build()?;
    /// # let _ = layer;
    /// # Ok::<(), Box<dyn std::error::Error>>(()) }).unwrap();
    /// ```
    #[cfg(feature = "redis")]
    pub fn redis(
        name: impl Into<String>,
        key: Key,
        limiter: impl Into<std::sync::Arc<crate::redis::RedisLimiter>>,
    ) -> Rule {
        let limiter = limiter.into();
        let mut rule = Rule::new(name, key, limiter.policy());
        rule.remote = Some(limiter);
        rule
    }

    /// Per client IP ([`Key::client_ip`]). A request whose client is
    /// unknown is rejected with 500 and a message saying why, unless
    /// [`when_missing`](Self::when_missing) says otherwise.
    ///
    /// ```
    /// # use ratewall::http::Rule;
    /// # use ratewall::{Policy, Rate};
    /// let r = Rule::per_ip("ip", Policy::token_bucket(Rate::per_minute(100)));
    /// # let _ = r;
    /// ```
    pub fn per_ip(name: impl Into<String>, policy: Policy) -> Rule {
        Rule::new(name, Key::client_ip(), policy)
    }

    /// Per value of header `header` ([`Key::header`]), e.g. an API key.
    ///
    /// ```
    /// # use ratewall::http::Rule;
    /// # use ratewall::{Policy, Rate};
    /// let r = Rule::per_header("key", "x-api-key", Policy::token_bucket(Rate::per_minute(1000)));
    /// # let _ = r;
    /// ```
    pub fn per_header(name: impl Into<String>, header: &str, policy: Policy) -> Rule {
        Rule::new(name, Key::header(header), policy)
    }

    /// Per request extension `T` ([`Key::extension`]), e.g. a user id.
    ///
    /// ```
    /// # use ratewall::http::Rule;
    /// # use ratewall::{Policy, Rate};
    /// #[derive(Clone, Hash)]
    /// struct UserId(u64);
    /// let r = Rule::per_extension::<UserId>("user", Policy::token_bucket(Rate::per_second(20)));
    /// # let _ = r;
    /// ```
    pub fn per_extension<T: Hash + Send + Sync + 'static>(
        name: impl Into<String>,
        policy: Policy,
    ) -> Rule {
        Rule::new(name, Key::extension::<T>(), policy)
    }

    /// Per route ([`Key::route`]).
    ///
    /// ```
    /// # use ratewall::http::Rule;
    /// # use ratewall::{Policy, Window};
    /// let r = Rule::per_route("route", Policy::fixed_window(Window::per_second(500)));
    /// # let _ = r;
    /// ```
    pub fn per_route(name: impl Into<String>, policy: Policy) -> Rule {
        Rule::new(name, Key::route(), policy)
    }

    /// One limit for every matching request ([`Key::global`]).
    ///
    /// ```
    /// # use ratewall::http::Rule;
    /// # use ratewall::{Policy, Rate};
    /// let r = Rule::global("all", Policy::token_bucket(Rate::per_second(10_000)));
    /// # let _ = r;
    /// ```
    pub fn global(name: impl Into<String>, policy: Policy) -> Rule {
        Rule::new(name, Key::global(), policy)
    }

    /// For client-IP keys: group IPv6 clients by their first `prefix`
    /// bits (default 64). Parallel /64, /56 and /48 rules are three rules
    /// with three prefixes.
    ///
    /// ```
    /// # use ratewall::http::Rule;
    /// # use ratewall::{Policy, Rate};
    /// let per_56 = Rule::per_ip("ip56", Policy::token_bucket(Rate::per_minute(1000))).ipv6_prefix(56);
    /// # let _ = per_56;
    /// ```
    pub fn ipv6_prefix(mut self, prefix: u8) -> Rule {
        self.key = set_prefix(self.key, None, Some(prefix));
        self
    }

    /// For client-IP keys: group IPv4 clients by their first `prefix` bits
    /// (default 32).
    ///
    /// ```
    /// # use ratewall::http::Rule;
    /// # use ratewall::{Policy, Rate};
    /// let per_24 = Rule::per_ip("net", Policy::token_bucket(Rate::per_minute(1000))).ipv4_prefix(24);
    /// # let _ = per_24;
    /// ```
    pub fn ipv4_prefix(mut self, prefix: u8) -> Rule {
        self.key = set_prefix(self.key, Some(prefix), None);
        self
    }

    /// Applies only to requests with this method (may be given several
    /// times: any of them).
    ///
    /// ```
    /// # use ratewall::http::Rule;
    /// # use ratewall::{Policy, Window};
    /// let r = Rule::per_ip("writes", Policy::fixed_window(Window::per_minute(60)))
    ///     .on_method(http::Method::POST)
    ///     .on_method(http::Method::PUT);
    /// # let _ = r;
    /// ```
    pub fn on_method(mut self, method: Method) -> Rule {
        self.matcher.methods.push(method);
        self
    }

    /// Applies only to paths under `prefix` (`/login` matches `/login` and
    /// `/login/otp`, not `/loginx`).
    ///
    /// ```
    /// # use ratewall::http::Rule;
    /// # use ratewall::{Policy, Window};
    /// let r = Rule::per_ip("login", Policy::sliding_window_log(Window::per_minute(5))).on_path_prefix("/login");
    /// # let _ = r;
    /// ```
    pub fn on_path_prefix(mut self, prefix: impl Into<String>) -> Rule {
        self.matcher.path_prefix = Some(prefix.into());
        self
    }

    /// Applies only to requests whose axum `MatchedPath` is `route` (or,
    /// without the `axum` feature or outside a router, whose path is).
    ///
    /// ```
    /// # use ratewall::http::Rule;
    /// # use ratewall::{Policy, Window};
    /// let r = Rule::per_ip("item", Policy::fixed_window(Window::per_minute(100))).on_route("/items/{id}");
    /// # let _ = r;
    /// ```
    pub fn on_route(mut self, route: impl Into<String>) -> Rule {
        self.matcher.route = Some(route.into());
        self
    }

    /// Every matching request costs `units` (default 1; 0 charges nothing
    /// but still reports).
    ///
    /// ```
    /// # use ratewall::http::Rule;
    /// # use ratewall::{Policy, Window};
    /// let r = Rule::per_ip("export", Policy::fixed_window(Window::per_hour(100))).cost(10);
    /// # let _ = r;
    /// ```
    pub fn cost(mut self, units: u64) -> Rule {
        self.cost = Cost::Units(units);
        self
    }

    /// A request costs what `f` says (e.g. by `Content-Length`). A cost the
    /// policy can never admit is answered with 413 (no wait would help) and
    /// a problem body that says so; nothing is charged.
    ///
    /// ```
    /// # use ratewall::http::Rule;
    /// # use ratewall::{Policy, Window};
    /// let r = Rule::per_ip("bulk", Policy::fixed_window(Window::per_minute(1000)))
    ///     .cost_fn(|_, uri, _| if uri.path().starts_with("/bulk") { 10 } else { 1 });
    /// # let _ = r;
    /// ```
    pub fn cost_fn(mut self, f: fn(&Method, &Uri, &HeaderMap) -> u64) -> Rule {
        self.cost = Cost::Fn(f);
        self
    }

    /// Enforce (default), shadow (dry run) or off.
    ///
    /// ```
    /// # use ratewall::http::{Mode, Rule};
    /// # use ratewall::{Policy, Rate};
    /// let r = Rule::per_ip("new", Policy::token_bucket(Rate::per_second(1))).mode(Mode::Shadow);
    /// # let _ = r;
    /// ```
    pub fn mode(mut self, mode: Mode) -> Rule {
        self.mode = mode;
        self
    }

    /// What to do with a request that has no key for this rule.
    ///
    /// ```
    /// # use ratewall::http::{Missing, Rule};
    /// # use ratewall::{Policy, Rate};
    /// let r = Rule::per_ip("ip", Policy::token_bucket(Rate::per_second(1))).when_missing(Missing::Skip);
    /// # let _ = r;
    /// ```
    pub fn when_missing(mut self, missing: Missing) -> Rule {
        self.missing = missing;
        self
    }

    /// Leaves this rule out of `RateLimit`/`X-RateLimit` headers on allowed
    /// responses (a login rule need not show its numbers). A 429 it causes
    /// still carries `Retry-After`.
    ///
    /// ```
    /// # use ratewall::http::Rule;
    /// # use ratewall::{Policy, Window};
    /// let r = Rule::per_ip("login", Policy::sliding_window_log(Window::per_minute(5))).hide_headers();
    /// # let _ = r;
    /// ```
    pub fn hide_headers(mut self) -> Rule {
        self.visibility = Visibility::Hidden;
        self
    }

    /// The most keys this rule tracks at once (default 65,536).
    ///
    /// ```
    /// # use ratewall::http::Rule;
    /// # use ratewall::{Policy, Rate};
    /// let r = Rule::per_ip("ip", Policy::token_bucket(Rate::per_second(1))).max_keys(1 << 20);
    /// # let _ = r;
    /// ```
    pub fn max_keys(mut self, max_keys: usize) -> Rule {
        self.max_keys = Some(max_keys);
        self
    }

    /// What to do with a new key when the table is full of active keys
    /// (default: reject it; see [`WhenFull`]).
    ///
    /// ```
    /// # use ratewall::http::Rule;
    /// # use ratewall::{Policy, Rate, WhenFull};
    /// let r = Rule::per_ip("ip", Policy::token_bucket(Rate::per_second(1))).when_full(WhenFull::EvictLeastRecent);
    /// # let _ = r;
    /// ```
    pub fn when_full(mut self, when_full: WhenFull) -> Rule {
        self.when_full = Some(when_full);
        self
    }

    /// Count only failures (for login rules): what a request took is given
    /// back when the inner service answers with a 2xx or 3xx status.
    ///
    /// ```
    /// # use ratewall::http::Rule;
    /// # use ratewall::{Policy, Window};
    /// let r = Rule::per_ip("login", Policy::sliding_window_log(Window::per_minute(5))).count_failures_only();
    /// # let _ = r;
    /// ```
    pub fn count_failures_only(mut self) -> Rule {
        self.refund_on_success = true;
        self
    }

    /// The rule's name.
    ///
    /// ```
    /// # use ratewall::http::Rule;
    /// # use ratewall::{Policy, Rate};
    /// assert_eq!(Rule::per_ip("ip", Policy::token_bucket(Rate::per_second(1))).name(), "ip");
    /// ```
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The rule's policy.
    ///
    /// ```
    /// # use ratewall::http::Rule;
    /// # use ratewall::{Policy, Rate};
    /// let p = Policy::token_bucket(Rate::per_second(1));
    /// assert_eq!(Rule::per_ip("ip", p).policy(), p);
    /// ```
    pub fn policy(&self) -> Policy {
        self.policy
    }

    #[inline]
    pub(crate) fn cost_of(&self, req: &RequestParts<'_>) -> u64 {
        match self.cost {
            Cost::Units(n) => n,
            Cost::Fn(f) => f(req.method, req.uri, req.headers),
        }
    }
}

fn set_prefix(key: Key, v4: Option<u8>, v6: Option<u8>) -> Key {
    match key.0 {
        KeyKind::ClientIp {
            v4_prefix,
            v6_prefix,
        } => Key::client_ip_prefix(v4.unwrap_or(v4_prefix), v6.unwrap_or(v6_prefix)),
        KeyKind::Composite(keys) => Key(KeyKind::Composite(
            keys.into_iter().map(|k| set_prefix(k, v4, v6)).collect(),
        )),
        other => Key(other),
    }
}

/// Whether `name` may name a rule: a structured-field token that is also a
/// string needing no escapes, 1 to 64 bytes: a letter, then letters,
/// digits and `!#$%&'*+-.^_`|~:/`.
pub(crate) fn valid_name(name: &str) -> bool {
    let b = name.as_bytes();
    !b.is_empty()
        && b.len() <= 64
        && b[0].is_ascii_alphabetic()
        && b[1..].iter().all(|&c| {
            c.is_ascii_alphanumeric()
                || matches!(
                    c,
                    b'!' | b'#'
                        | b'$'
                        | b'%'
                        | b'&'
                        | b'\''
                        | b'*'
                        | b'+'
                        | b'-'
                        | b'.'
                        | b'^'
                        | b'_'
                        | b'`'
                        | b'|'
                        | b'~'
                        | b':'
                        | b'/'
                )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_tokens_without_escapes() {
        for ok in ["default", "ip", "per-ip/v6:56", "a", "Login_1.x"] {
            assert!(valid_name(ok), "{ok}");
        }
        let long = "a".repeat(65);
        for bad in [
            "",
            "1ip",
            "-x",
            "a b",
            "a\"b",
            "a\\b",
            "a,b",
            "a;b",
            "é",
            long.as_str(),
            "*x",
        ] {
            assert!(!valid_name(bad), "{bad}");
        }
    }

    fn parts<'a>(
        method: &'a Method,
        uri: &'a Uri,
        headers: &'a HeaderMap,
        ext: &'a Extensions,
    ) -> RequestParts<'a> {
        RequestParts {
            method,
            uri,
            headers,
            extensions: ext,
            client: Resolved::Ip("192.0.2.1".parse().unwrap()),
        }
    }

    #[test]
    fn path_prefixes_match_whole_segments() {
        let m = Matcher {
            methods: vec![Method::POST],
            path_prefix: Some("/login".into()),
            route: None,
        };
        let (h, e) = (HeaderMap::new(), Extensions::new());
        let check = |method: Method, path: &str| {
            let uri: Uri = path.parse().unwrap();
            m.matches(&parts(&method, &uri, &h, &e))
        };
        assert!(check(Method::POST, "/login"));
        assert!(check(Method::POST, "/login/otp"));
        assert!(check(Method::POST, "/login?x=1"));
        assert!(!check(Method::POST, "/loginx"));
        assert!(!check(Method::GET, "/login"));
        assert!(!check(Method::POST, "/"));
    }

    #[test]
    fn keys_separate_values_and_report_absence() {
        let fp = Fingerprint::new();
        let (m, u) = (Method::GET, Uri::from_static("/a"));
        let e = Extensions::new();
        let mut h = HeaderMap::new();
        let k = Key::header("x-api-key");
        assert_eq!(k.extract(&parts(&m, &u, &h, &e), &fp), Err(Absent::Value));
        h.insert("x-api-key", "alpha".parse().unwrap());
        let a = k.extract(&parts(&m, &u, &h, &e), &fp).unwrap();
        h.insert("x-api-key", "beta".parse().unwrap());
        let b = k.extract(&parts(&m, &u, &h, &e), &fp).unwrap();
        assert_ne!(a, b);
        h.append("x-api-key", "gamma".parse().unwrap());
        let bg = k.extract(&parts(&m, &u, &h, &e), &fp).unwrap();
        assert_ne!(bg, b, "a second line changes the key");
        assert!(Key::header("bad header").has_invalid_header());
        let g = Key::global().extract(&parts(&m, &u, &h, &e), &fp).unwrap();
        assert_eq!(g, 0);
        let c = Key::composite([Key::client_ip(), Key::header("x-missing")]);
        assert_eq!(c.extract(&parts(&m, &u, &h, &e), &fp), Err(Absent::Value));
    }

    #[cfg(feature = "redis")]
    #[test]
    fn byte_keys_are_the_same_in_every_process_and_unambiguous() {
        #[derive(Clone, Hash)]
        struct User(u64);
        let (m, u) = (Method::GET, Uri::from_static("/items/7"));
        let mut e = Extensions::new();
        let mut h = HeaderMap::new();
        let bytes = |k: &Key, h: &HeaderMap, e: &Extensions, client: Resolved| {
            let mut p = parts(&m, &u, h, e);
            p.client = client;
            let mut out = Vec::new();
            k.extract_bytes(&p, &mut out)
                .map(|()| String::from_utf8_lossy(&out).into_owned())
        };
        let ip = |s: &str| Resolved::Ip(s.parse().unwrap());
        let v4 = ip("192.0.2.77");
        let cases = [
            (Key::client_ip(), v4, "192.0.2.77"),
            (Key::client_ip_prefix(24, 48), v4, "192.0.2.0/24"),
            (Key::client_ip(), ip("::ffff:192.0.2.77"), "192.0.2.77"),
            (
                Key::client_ip(),
                ip("2001:db8:1:2:3:4:5:6"),
                "2001:db8:1:2::/64",
            ),
            (
                Key::client_ip_prefix(32, 128),
                ip("2001:db8::9"),
                "2001:db8::9",
            ),
            (Key::route(), v4, "r:/items/7"),
            (Key::global(), v4, "*"),
        ];
        for (k, client, want) in cases {
            assert_eq!(bytes(&k, &h, &e, client).unwrap(), want, "{k:?}");
        }
        assert_eq!(
            bytes(&Key::client_ip(), &h, &e, Resolved::NoPeer),
            Err(Absent::NoPeer)
        );
        let k = Key::header("x-api-key");
        assert_eq!(bytes(&k, &h, &e, v4), Err(Absent::Value));
        h.insert("x-api-key", "alpha".parse().unwrap());
        assert_eq!(bytes(&k, &h, &e, v4).unwrap(), "h:alpha");
        h.append("x-api-key", "beta".parse().unwrap());
        assert_eq!(bytes(&k, &h, &e, v4).unwrap(), "h:alpha\0beta");
        // Composites: each part with its length, so parts cannot run together.
        let c = Key::composite([Key::client_ip(), Key::route()]);
        assert_eq!(bytes(&c, &h, &e, v4).unwrap(), "10:192.0.2.7710:r:/items/7");
        // Extensions: a SHA-1 of the `Hash`, the same whatever the seed.
        let x = Key::extension::<User>();
        assert_eq!(bytes(&x, &h, &e, v4), Err(Absent::Value));
        e.insert(User(42));
        let a = bytes(&x, &h, &e, v4).unwrap();
        assert_eq!(a.len(), 2 + 32);
        assert_eq!(a, bytes(&x, &h, &e, v4).unwrap());
        e.insert(User(43));
        assert_ne!(a, bytes(&x, &h, &e, v4).unwrap());
        let mut fixed = Sha1Hasher(sha1_smol::Sha1::new());
        42u64.hash(&mut fixed);
        let digest = fixed.0.digest().bytes();
        let hex: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(a, format!("x:{hex}"));
    }
}
