//! Rules: a name, a key, a policy, where it applies, what a request costs,
//! and what to do when the key is missing.

use super::concurrent::{Concurrency, PermitRelease};
use super::key::{Key, RequestParts};
use super::path;
use super::tier::{TierBy, Tiers};
use crate::concurrency::{Adaptive, Priority};
use crate::keyed::{TableOptions, WhenFull};
use crate::policy::Policy;
use crate::quota::Window;
use http::header::HeaderName;
use http::{Extensions, HeaderMap, Method, StatusCode, Uri};
use std::fmt;
use std::hash::Hash;
use std::sync::Arc;
use std::time::Duration;

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
/// no user, no peer address; an unknown client address too, unless
/// [`UnknownClient::NearestHop`] says otherwise, and never with a 5xx).
/// Never a silent shared bucket.
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

/// What a rule does with a request whose client address is unknown: the
/// proxy chain holds an unknown, obfuscated or malformed entry where the
/// walk lands, is longer than [`MAX_HOPS`](super::MAX_HOPS), or a trusted
/// CDN sent no single client header. Such requests are counted in
/// [`RuleStats::unknown_client`](super::RuleStats::unknown_client) either
/// way, and never get a bucket of their own per forged value.
///
/// ```
/// use ratewall::http::{Rule, UnknownClient};
/// use ratewall::{Policy, Rate};
///
/// // Behind a proxy that writes `for=_hidden` for some clients: limit those
/// // together under the proxy's address instead of answering 400.
/// let ip = Rule::per_ip("ip", Policy::token_bucket(Rate::per_second(50)))
///     .when_client_unknown(UnknownClient::NearestHop);
/// # let _ = ip;
/// ```
#[non_exhaustive]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum UnknownClient {
    /// As a missing key (the default): the rule's
    /// [`when_missing`](Rule::when_missing) decides, except that a `5xx`
    /// status (the `500` client-IP rules answer for a missing peer address,
    /// a server set-up error) becomes `400 Bad Request`: the request, not
    /// the server, is at fault. The problem+json body names the problem.
    #[default]
    AsMissing,
    /// Key the request by the nearest trusted hop's own address: the proxy
    /// that wrote the entry (or the peer). Every such request behind that
    /// proxy shares one bucket, so one client can spend the others' quota.
    NearestHop,
}

/// A cost function ([`Rule::cost_fn`]).
type CostFn = Arc<dyn Fn(&Method, &Uri, &HeaderMap) -> u64 + Send + Sync>;

/// What a request costs under a rule.
#[derive(Clone)]
pub(super) enum Cost {
    Units(u64),
    Fn(CostFn),
}

/// Which requests a rule applies to: all by default; a method list, a
/// path prefix and an axum route narrow it (all given must match).
#[derive(Clone, Debug, Default)]
pub(super) struct Matcher {
    methods: Vec<Method>,
    /// Normal (`path::normalize`): the request's path is normalized too.
    path_prefix: Option<String>,
    /// The prefix matches ASCII letters in either case.
    ignore_case: bool,
    route: Option<String>,
}

impl Matcher {
    /// Whether the rule applies to every request (no method, path or
    /// route): then no call is needed.
    #[inline]
    pub(super) fn matches(&self, req: &RequestParts<'_>) -> bool {
        if self.matches_all() {
            return true;
        }
        self.matches_request(req)
    }

    /// Whether the rule applies to every request (no method, path or route).
    pub(super) fn matches_all(&self) -> bool {
        self.methods.is_empty() && self.path_prefix.is_none() && self.route.is_none()
    }

    fn matches_request(&self, req: &RequestParts<'_>) -> bool {
        if !self.methods.is_empty() && !self.methods.iter().any(|m| m == req.method) {
            return false;
        }
        if let Some(prefix) = &self.path_prefix {
            if !path::under(prefix, req.uri.path(), self.ignore_case) {
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
pub(super) enum Visibility {
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
    pub(super) name: String,
    pub(super) key: Key,
    pub(super) policy: Policy,
    pub(super) matcher: Matcher,
    pub(super) cost: Cost,
    pub(super) mode: Mode,
    pub(super) missing: Missing,
    pub(super) unknown_client: UnknownClient,
    pub(super) visibility: Visibility,
    pub(super) table: TableOptions,
    pub(super) refund_on_success: bool,
    /// Charged when another rule refuses the request (`refused.rs`).
    pub(super) count_refused: bool,
    /// Made in Rust or read from a file: the words of its errors.
    pub(super) origin: super::origin::Origin,
    /// Premium tiers: other policies, and how a request picks one.
    pub(super) tiers: Tiers,
    /// The lockout after a denial.
    pub(super) block_for: Option<Duration>,
    /// The lockout table's size ([`Rule::lockout_max_keys`]).
    pub(super) lockout_max_keys: Option<usize>,
    /// The Redis limit this rule is checked against instead of a local table.
    #[cfg(feature = "redis")]
    pub(super) remote: Option<std::sync::Arc<crate::redis::RedisLimiter>>,
    /// A concurrency rule's settings ([`Rule::concurrent`]); `None` for a
    /// rate rule.
    pub(super) concurrency: Option<Box<Concurrency>>,
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
            .field("unknown_client", &self.unknown_client)
            .field("visibility", &self.visibility)
            .field("table", &self.table)
            .field("refund_on_success", &self.refund_on_success)
            .field("count_refused", &self.count_refused)
            .field("tiers", &self.tiers)
            .field("block_for", &self.block_for)
            .field("lockout_max_keys", &self.lockout_max_keys)
            .field("concurrency", &self.concurrency);
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
            unknown_client: UnknownClient::AsMissing,
            visibility: Visibility::Shown,
            // The keyed tables' defaults, but evicting when full: a client
            // spraying new keys evicts its own (`spray.rs`, docs/http.md).
            table: TableOptions::new().when_full(WhenFull::EvictLeastRecent),
            refund_on_success: false,
            count_refused: false,
            origin: super::origin::Origin::Rust,
            tiers: Tiers::default(),
            block_for: None,
            lockout_max_keys: None,
            #[cfg(feature = "redis")]
            remote: None,
            concurrency: None,
        }
    }

    /// A concurrency rule: at most `max` of the requests it matches in
    /// flight at once under `key`, from the check until the response body
    /// ends or is dropped (or the inner service fails). It is checked in
    /// the same all-or-nothing step as the rate rules: a request that any
    /// rule denies holds no permit and takes no rate unit. With
    /// [`Key::global`] it is one limit (narrowed to a route or a path by
    /// [`on_route`](Self::on_route) or [`on_path_prefix`](Self::on_path_prefix)),
    /// which sheds with `503`; keyed by the client (an IP, a header, an
    /// extension) it is a limit per client, which answers `429`
    /// (`docs/http.md`, "Concurrency rules"). A request costs 1 permit
    /// unless [`cost`](Self::cost) says otherwise.
    ///
    /// Its [`policy`](Self::policy) is a placeholder whose `limit()` is
    /// `max` (a concurrency limit has no window). A maximum of 0 or above
    /// [`MAX_PERMITS`](crate::concurrency::MAX_PERMITS) is
    /// [`HttpConfigError::Policy`](super::HttpConfigError::Policy) when
    /// the layer is built.
    ///
    /// ```
    /// use ratewall::http::{Key, RateLimitLayer, Rule};
    /// use ratewall::{Policy, Rate};
    ///
    /// let layer = RateLimitLayer::builder()
    ///     .rule(Rule::per_ip("ip", Policy::token_bucket(Rate::per_second(50))))
    ///     // The report generator takes a database connection each: 8 at once.
    ///     .rule(Rule::concurrent("reports", Key::global(), 8).on_path_prefix("/reports"))
    ///     .build()?;
    /// # let _ = layer;
    /// # Ok::<(), ratewall::http::HttpConfigError>(())
    /// ```
    pub fn concurrent(name: impl Into<String>, key: Key, max: u64) -> Rule {
        let mut rule = Rule::new(name, key, Policy::fixed_window(Window::per_second(max)));
        rule.concurrency = Some(Box::new(Concurrency::new(max)));
        rule
    }

    /// Makes a concurrency rule's maximum adaptive ([`Adaptive`]): it
    /// starts at the rule's `max` and follows the latency and outcome of
    /// the requests it admits (from the check to the end of the response
    /// body; a `5xx`, a failed body or no response at all (an inner
    /// service error, a panic, a request cancelled before its response,
    /// often by a timeout) count as dropped, a `4xx` says nothing). Only on
    /// a [`Key::global`] concurrency rule; elsewhere
    /// [`HttpConfigError::Policy`](super::HttpConfigError::Policy) when the
    /// layer is built.
    ///
    /// ```
    /// use ratewall::http::{Key, Rule};
    /// use ratewall::Adaptive;
    ///
    /// let backend = Rule::concurrent("backend", Key::global(), 20).adaptive(Adaptive::vegas(4, 200));
    /// # let _ = backend;
    /// ```
    pub fn adaptive(mut self, adaptive: Adaptive) -> Rule {
        self.concurrency_mut().adaptive = Some(adaptive);
        self
    }

    /// Keeps `percent` of a concurrency rule's maximum for requests of
    /// `class` and above ([`ConcurrencyBuilder::keep_for`](crate::ConcurrencyBuilder::keep_for));
    /// a request's class comes from [`priority_by_header`](Self::priority_by_header).
    /// A request shed because only kept permits were left gets `503`.
    /// Only on a [`Key::global`] concurrency rule.
    ///
    /// ```
    /// use ratewall::http::{Key, Rule};
    /// use ratewall::Priority;
    ///
    /// let all = Rule::concurrent("all", Key::global(), 100)
    ///     .keep_for(Priority::Critical, 20)
    ///     .priority_by_header("x-priority");
    /// # let _ = all;
    /// ```
    pub fn keep_for(mut self, class: Priority, percent: u8) -> Rule {
        let c = self.concurrency_mut();
        c.kept.retain(|(p, _)| *p != class);
        c.kept.push((class, percent));
        self
    }

    /// A concurrency rule reads a request's [`Priority`] from header
    /// `header`: `critical`, `normal` or `sheddable` (any case); a missing
    /// or other value is `normal`. **A client can send this header too**:
    /// set it in a trusted layer (your authenticating proxy, or a layer
    /// outside this one that computes it) and strip it from clients at the
    /// edge. Otherwise any client that sends `critical` takes the share
    /// kept for critical requests. An invalid header name is
    /// [`HttpConfigError::InvalidHeaderName`](super::HttpConfigError::InvalidHeaderName)
    /// when the layer is built.
    ///
    /// ```
    /// use ratewall::http::{Key, Rule};
    /// use ratewall::Priority;
    ///
    /// let all = Rule::concurrent("all", Key::global(), 100)
    ///     .keep_for(Priority::Normal, 30)
    ///     .priority_by_header("x-priority");
    /// # let _ = all;
    /// ```
    pub fn priority_by_header(mut self, header: &str) -> Rule {
        self.concurrency_mut().priority_header = Some(header.to_owned());
        self
    }

    /// When a concurrency rule gives a request's permit back: at the end
    /// of the response body (the default), or at the response head, so a
    /// client that reads slowly or not at all holds no permit while its
    /// body streams ([`PermitRelease`] says what each bounds). Local
    /// concurrency rules only.
    ///
    /// ```
    /// use ratewall::http::{Key, PermitRelease, Rule};
    ///
    /// let handlers = Rule::concurrent("handlers", Key::global(), 64)
    ///     .release_permit(PermitRelease::ResponseHead);
    /// # let _ = handlers;
    /// ```
    pub fn release_permit(mut self, when: PermitRelease) -> Rule {
        self.concurrency_mut().release = when;
        self
    }

    /// The concurrency settings, made for a rate rule so that the layer's
    /// `build` can say that they apply only to concurrency rules.
    fn concurrency_mut(&mut self) -> &mut Concurrency {
        self.concurrency.get_or_insert_with(|| {
            let mut c = Concurrency::new(0);
            c.on_rate_rule = true;
            Box::new(c)
        })
    }

    /// A rule whose limit lives in Redis (features `tower` and `redis`):
    /// every instance behind a load balancer counts against `limiter`.
    /// The rule is named after the limiter ([`RedisLimiter::name`], the
    /// name in its Redis keys), so one name says both which rule answered
    /// (stats, `RateLimit-Policy`, logs) and which limiters share state.
    /// The rule's policy is the limiter's; its key is `key`'s value as
    /// bytes (the masked client address as text, `h:` and a header value,
    /// and so on), which the limiter bounds by hashing long or binary keys.
    /// The limiter's [`FailurePolicy`](crate::redis::FailurePolicy) says
    /// what happens when Redis cannot answer. `max_keys` and `when_full`
    /// do not apply (Redis keys expire by their TTL).
    ///
    /// The limiter must be given its name ([`RedisLimiterBuilder::name`]):
    /// its default (such as `tb.10000.20`) says only its algorithm, and
    /// would reach clients' headers, so the layer's `build` fails with
    /// [`HttpConfigError::RedisLimiterUnnamed`]. The name must also be a
    /// rule name (a letter first; see [`Rule::new`]), or the layer's
    /// `build` fails with [`HttpConfigError::InvalidRuleName`]; two rules
    /// on limiters of one name (which share their Redis state when their
    /// prefixes match) fail with [`HttpConfigError::DuplicateRuleName`].
    ///
    /// [`RedisLimiter::name`]: crate::redis::RedisLimiter::name
    /// [`RedisLimiterBuilder::name`]: crate::redis::RedisLimiterBuilder::name
    /// [`HttpConfigError::InvalidRuleName`]: super::HttpConfigError::InvalidRuleName
    /// [`HttpConfigError::DuplicateRuleName`]: super::HttpConfigError::DuplicateRuleName
    /// [`HttpConfigError::RedisLimiterUnnamed`]: super::HttpConfigError::RedisLimiterUnnamed
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
    /// let rule = Rule::redis(Key::ip(), per_ip);
    /// assert_eq!(rule.name(), "ip");
    /// let layer = RateLimitLayer::builder().rule(rule).build()?;
    /// # let _ = layer;
    /// # Ok::<(), Box<dyn std::error::Error>>(()) }).unwrap();
    /// ```
    #[cfg(feature = "redis")]
    pub fn redis(key: Key, limiter: impl Into<std::sync::Arc<crate::redis::RedisLimiter>>) -> Rule {
        let limiter = limiter.into();
        let mut rule = Rule::new(limiter.name(), key, limiter.policy());
        rule.remote = Some(limiter);
        rule
    }

    /// Per client IP ([`Key::ip`]). A request whose client is
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
        Rule::new(name, Key::ip(), policy)
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
        self.key = self.key.with_prefix(None, Some(prefix));
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
        self.key = self.key.with_prefix(Some(prefix), None);
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

    /// Applies only to paths under `prefix`, by whole segments (`/login`
    /// matches `/login` and `/login/otp`, not `/loginx`; a prefix ending
    /// in `/` matches what follows it). Both are compared normalized as
    /// RFC 3986 says, so every spelling a normalizing router or proxy
    /// sends to the same route is matched: `//login`, `/./login`,
    /// `/x/../login` and `/%6Cogin` are `/login`. Escapes of other
    /// characters stay escapes (`/login%2Fotp` is one segment). Letters
    /// are compared as written, as axum's router does; see
    /// [`ignore_path_case`](Self::ignore_path_case). A prefix without a
    /// leading `/` is read as if it had one.
    ///
    /// ```
    /// # use ratewall::http::Rule;
    /// # use ratewall::{Policy, Window};
    /// let r = Rule::per_ip("login", Policy::sliding_window_log(Window::per_minute(5))).on_path_prefix("/login");
    /// # let _ = r;
    /// ```
    pub fn on_path_prefix(mut self, prefix: impl Into<String>) -> Rule {
        self.matcher.path_prefix = Some(path::normalize(&prefix.into()));
        self
    }

    /// The path prefix matches ASCII letters in either case (`/LOGIN` is
    /// under `/login`): for a server whose router, or a layer inside this
    /// one, ignores case. Without it a case-insensitive router reaches
    /// the route around the rule.
    ///
    /// ```
    /// # use ratewall::http::Rule;
    /// # use ratewall::{Policy, Window};
    /// let r = Rule::per_ip("login", Policy::sliding_window_log(Window::per_minute(5)))
    ///     .on_path_prefix("/login")
    ///     .ignore_path_case();
    /// # let _ = r;
    /// ```
    pub fn ignore_path_case(mut self) -> Rule {
        self.matcher.ignore_case = true;
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
    pub fn cost_fn(
        mut self,
        f: impl Fn(&Method, &Uri, &HeaderMap) -> u64 + Send + Sync + 'static,
    ) -> Rule {
        self.cost = Cost::Fn(Arc::new(f));
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

    /// What to do with a request whose client address is unknown (see
    /// [`UnknownClient`]; the default is [`UnknownClient::AsMissing`]).
    ///
    /// ```
    /// # use ratewall::http::{Rule, UnknownClient};
    /// # use ratewall::{Policy, Rate};
    /// let r = Rule::per_ip("ip", Policy::token_bucket(Rate::per_second(1)))
    ///     .when_client_unknown(UnknownClient::NearestHop);
    /// # let _ = r;
    /// ```
    pub fn when_client_unknown(mut self, unknown: UnknownClient) -> Rule {
        self.unknown_client = unknown;
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
        self.table = self.table.max_keys(max_keys);
        self
    }

    /// What to do with a new key when the table is full of active keys
    /// (default: [`WhenFull::EvictLeastRecent`], so that a client spraying
    /// new keys evicts the keys closest to idle, its own first, and never
    /// locks out the next new client; `RejectNew` on a key a client picks
    /// warns when the layer is built if a spray fills the table cheaply:
    /// `docs/http.md`, "Key spraying and full tables").
    ///
    /// ```
    /// # use ratewall::http::Rule;
    /// # use ratewall::{Policy, Rate, WhenFull};
    /// // Fail closed: while the table is full, a new client waits (1 s at most here).
    /// let r = Rule::per_ip("ip", Policy::token_bucket(Rate::per_second(1))).when_full(WhenFull::RejectNew);
    /// # let _ = r;
    /// ```
    pub fn when_full(mut self, when_full: WhenFull) -> Rule {
        self.table = self.table.when_full(when_full);
        self
    }

    /// This rule's whole table ([`TableOptions`]: `max_keys`, shards,
    /// [`WhenFull`], seed), the value every keyed builder takes, replacing
    /// what [`max_keys`](Self::max_keys) and [`when_full`](Self::when_full)
    /// set. `TableOptions::new()` is [`WhenFull::RejectNew`], not the
    /// rule's default. For local rules only; a Redis rule's table is in Redis.
    ///
    /// ```
    /// # use ratewall::http::Rule;
    /// # use ratewall::{Policy, Rate, TableOptions, WhenFull};
    /// let table = TableOptions::new().max_keys(1 << 20).when_full(WhenFull::EvictLeastRecent);
    /// let r = Rule::per_ip("ip", Policy::token_bucket(Rate::per_second(1))).table(table);
    /// # let _ = r;
    /// ```
    pub fn table(mut self, options: TableOptions) -> Rule {
        self.table = options;
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

    /// A premium tier: requests that pick tier `name` are limited by
    /// `policy` instead of the rule's own (may be given several times, one
    /// per tier). Each tier keeps its own state per key, and the headers
    /// advertise the tier's quota under the rule's name; the rule's stats
    /// count every tier. A request picks its tier by
    /// [`tier_keys`](Self::tier_keys), then [`tier_by`](Self::tier_by) or
    /// [`tier_by_header`](Self::tier_by_header); one that names no tier
    /// gets the rule's own policy. A key that changes tier starts the new
    /// tier's limit afresh (its old tier's state ages out).
    ///
    /// A tier name is a letter, then up to 31 letters, digits, `-` or `_`
    /// ([`HttpConfigError::InvalidTierName`] otherwise); a tier's policy
    /// is validated as a rule's ([`HttpConfigError::Policy`]). On a
    /// [`Rule::redis`] rule each tier is a limiter of its own, named
    /// `name.tier` in Redis key names, with the rule's failure policy.
    ///
    /// [`HttpConfigError::InvalidTierName`]: super::HttpConfigError::InvalidTierName
    /// [`HttpConfigError::Policy`]: super::HttpConfigError::Policy
    ///
    /// ```
    /// use ratewall::http::Rule;
    /// use ratewall::{Policy, Rate};
    ///
    /// // Premium API keys get 10x.
    /// let api = Rule::per_header("api", "x-api-key", Policy::token_bucket(Rate::per_minute(100)))
    ///     .tier("premium", Policy::token_bucket(Rate::per_minute(1000)))
    ///     .tier_keys("premium", ["key-of-acme", "key-of-globex"]);
    /// # let _ = api;
    /// ```
    pub fn tier(mut self, name: impl Into<String>, policy: Policy) -> Rule {
        let name = name.into();
        self.tiers.list.retain(|(n, _)| *n != name);
        self.tiers.list.push((name, policy));
        self
    }

    /// These values of the rule's key header get tier `tier` (for a rule
    /// keyed by one header, such as [`Rule::per_header`]; may be given
    /// once per tier). A tier that [`tier`](Self::tier) does not declare is
    /// [`HttpConfigError::UnknownTier`](super::HttpConfigError::UnknownTier)
    /// when the layer is built.
    ///
    /// ```
    /// # use ratewall::http::Rule;
    /// # use ratewall::{Policy, Rate};
    /// let api = Rule::per_header("api", "x-api-key", Policy::token_bucket(Rate::per_minute(100)))
    ///     .tier("premium", Policy::token_bucket(Rate::per_minute(1000)))
    ///     .tier_keys("premium", ["key-of-acme"]);
    /// # let _ = api;
    /// ```
    pub fn tier_keys(
        mut self,
        tier: impl Into<String>,
        keys: impl IntoIterator<Item = impl Into<String>>,
    ) -> Rule {
        let tier = tier.into();
        let keys: Vec<String> = keys.into_iter().map(Into::into).collect();
        match self.tiers.keys.iter_mut().find(|(t, _)| *t == tier) {
            Some((_, list)) => list.extend(keys),
            None => self.tiers.keys.push((tier, keys)),
        }
        self
    }

    /// Picks a request's tier with `f`, from its headers and extensions
    /// (a plan an authenticating middleware stored, say): the tier's name,
    /// or `None` for the rule's own policy. Replaces
    /// [`tier_by_header`](Self::tier_by_header).
    ///
    /// ```
    /// use ratewall::http::Rule;
    /// use ratewall::{Policy, Rate};
    ///
    /// #[derive(Clone)]
    /// struct Plan(&'static str);
    /// let api = Rule::per_header("api", "x-api-key", Policy::token_bucket(Rate::per_minute(100)))
    ///     .tier("premium", Policy::token_bucket(Rate::per_minute(1000)))
    ///     .tier_by(|_headers, ext| ext.get::<Plan>().map(|p| p.0));
    /// # let _ = api;
    /// ```
    pub fn tier_by(
        mut self,
        f: impl for<'a> Fn(&'a HeaderMap, &'a Extensions) -> Option<&'a str> + Send + Sync + 'static,
    ) -> Rule {
        self.tiers.by = Some(TierBy::Fn(Arc::new(f)));
        self
    }

    /// The value of header `header` names a request's tier (a header your
    /// authenticating proxy sets and strips from clients: a client that
    /// can send it picks its own tier). Replaces [`tier_by`](Self::tier_by).
    /// An invalid header name is
    /// [`HttpConfigError::InvalidHeaderName`](super::HttpConfigError::InvalidHeaderName)
    /// when the layer is built.
    ///
    /// ```
    /// # use ratewall::http::Rule;
    /// # use ratewall::{Policy, Rate};
    /// let api = Rule::per_header("api", "x-api-key", Policy::token_bucket(Rate::per_minute(100)))
    ///     .tier("premium", Policy::token_bucket(Rate::per_minute(1000)))
    ///     .tier_by_header("x-plan");
    /// # let _ = api;
    /// ```
    pub fn tier_by_header(mut self, header: &str) -> Rule {
        self.tiers.by = HeaderName::from_bytes(header.as_bytes())
            .ok()
            .map(TierBy::Header);
        if self.tiers.by.is_none() {
            self.tiers.bad_header = true;
        }
        self
    }

    /// A lockout after a breach (rate-limiter-flexible's
    /// `blockDuration`): once this rule denies a key, the key is denied
    /// for `block_for`, whatever its limit says, and takes nothing from
    /// any rule meanwhile. The 429 tells the truth: `Retry-After` and the
    /// `RateLimit` item's `t` are the time to the block's end, `r` is 0.
    /// A shadow rule never locks out. See `docs/http.md`, "Lockouts".
    /// A zero or too long `block_for` (over 146 years) is
    /// [`HttpConfigError::InvalidValue`](super::HttpConfigError::InvalidValue)
    /// when the layer is built.
    ///
    /// ```
    /// use ratewall::http::Rule;
    /// use ratewall::{Policy, Window};
    /// use std::time::Duration;
    ///
    /// // Five failed logins a minute, then fifteen minutes out.
    /// let login = Rule::per_ip("login", Policy::sliding_window_log(Window::per_minute(5)))
    ///     .on_path_prefix("/login")
    ///     .count_failures_only()
    ///     .block_for(Duration::from_secs(15 * 60));
    /// # let _ = login;
    /// ```
    pub fn block_for(mut self, block_for: Duration) -> Rule {
        self.block_for = Some(block_for);
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

    /// The rule's policy (for a concurrency rule, a placeholder whose
    /// `limit()` is its maximum: see [`Rule::concurrent`]).
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
    pub(super) fn cost_of(&self, req: &RequestParts<'_>) -> u64 {
        match &self.cost {
            Cost::Units(n) => *n,
            Cost::Fn(f) => f(req.method, req.uri, req.headers),
        }
    }
}

/// Whether `name` may name a rule: a structured-field token that is also a
/// string needing no escapes, 1 to 64 bytes: a letter, then letters,
/// digits and `!#$%&'*+-.^_`|~:/`.
pub(super) fn valid_name(name: &str) -> bool {
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
#[path = "rule_tests.rs"]
mod tests;
