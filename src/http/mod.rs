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
//!
//! # Where each part lives
//!
//! | file | what it holds |
//! |---|---|
//! | `builder.rs` | [`RateLimitLayer::builder`], [`RateLimitBuilder`], [`HttpConfigError`] |
//! | `config.rs` | [`LayerConfig`], [`RuleConfig`]: the layer as a file (feature `serde`) |
//! | `concurrent_config.rs` | a [`RuleConfig`]'s concurrency fields (`concurrent`, `adaptive`, `keep_for`, `priority_header`) |
//! | `rule.rs` | [`Rule`], [`Mode`], [`Missing`], [`UnknownClient`]: what a rule says |
//! | `key.rs` | [`Key`]: a request's key for a rule, as a fingerprint or as bytes |
//! | `client_ip.rs` | [`ClientIp`], [`Cidr`], [`ProxyHeader`]: who the client is |
//! | `compiled.rs` | the rules as built, and a request's matching rules |
//! | `engine.rs` | the check: local rules, all or nothing; the Redis rules' branch |
//! | `remote_check.rs` | the check of a request that matches Redis rules (feature `redis`), a Redis failure's answer |
//! | `concurrent.rs` | concurrency rules: the limits they are built into, the permits a response body holds |
//! | `concurrent_redis.rs` | Redis concurrency rules (feature `redis`): `Rule::redis_concurrent`, their permits on the Redis path |
//! | `concurrent_check.rs` | the check of a layer with concurrency rules: rate and concurrency rules all or nothing |
//! | `headers.rs` | [`Headers`], [`Items`]: the `RateLimit` and legacy headers |
//! | `response.rs` | the 429 and other answers, [`Rejection`], [`ResponseBody`] |
//! | `info.rs` | [`RateLimitInfo`]: the decisions extension |
//! | `stats.rs` | [`RuleStats`], [`Offender`]: each rule's counters and top offenders (and, feature `metrics`, their facade handles) |
//! | `tier.rs` | premium tiers: a rule's other policies and how a request picks one |
//! | `lockout.rs` | lockouts after a breach: the blocked keys of a local rule |
//! | `refused.rs` | [`Rule::count_refused`]: a rule charged for requests other rules refuse |
//! | `spray.rs` | a rule's tables against key spraying: the default `WhenFull`, the build's warning, the lockout table's size |
//! | `service.rs` | [`RateLimitLayer`], [`RateLimitService`], [`ResponseFuture`] |

mod builder;
mod client_ip;
mod compiled;
mod concurrent;
mod concurrent_check;
#[cfg(feature = "serde")]
mod concurrent_config;
#[cfg(feature = "redis")]
mod concurrent_redis;
#[cfg(feature = "serde")]
mod config;
mod engine;
mod headers;
mod info;
mod key;
mod lockout;
mod origin;
mod path;
mod refused;
#[cfg(feature = "redis")]
mod remote_check;
mod response;
mod rule;
mod service;
mod spray;
mod stats;
mod tier;

pub use builder::{HttpConfigError, RateLimitBuilder};
pub use client_ip::{Cidr, CidrParseError, ClientIp, ProxyHeader, MAX_HOPS};
pub use concurrent::PermitRelease;
#[cfg(feature = "serde")]
pub use config::{LayerConfig, RuleConfig};
pub use headers::{Headers, Items};
pub use info::RateLimitInfo;
pub use key::Key;
pub use response::{Rejection, ResponseBody, RuleDecision};
pub use rule::{Missing, Mode, Rule, UnknownClient};
pub use service::{RateLimitLayer, RateLimitService, ResponseFuture};
pub use stats::{Offender, RuleStats};
