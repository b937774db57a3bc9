//! [`RedisBackend`], the public handle on a Redis server or Cluster, and
//! its builder: the connection and the guarded call ([`Link`], in
//! `connection.rs`) with the batching front (`batch.rs`).

use super::batch::Batcher;
use super::connection::{Conn, Link};
use super::door;
use super::events::Watch;
use super::fault::Fault;
use super::key_names::KeyNames;
use super::wire::Call;
use super::RedisError;
use crate::decision::Decision;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::Value;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// The default per-call timeout: a loopback or same-rack script call takes
/// well under a millisecond, so 50 ms means Redis is in trouble.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(50);
/// The default time to wait for a new connection.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_millis(250);
/// The default number of failures in a row that opens the circuit.
pub const DEFAULT_BREAKER_FAILURES: u32 = 5;
/// The default time the circuit stays open before one call probes Redis.
pub const DEFAULT_COOL_DOWN: Duration = Duration::from_secs(1);

/// A Redis server shared by any number of [`RedisLimiter`](super::RedisLimiter)s:
/// one connection that pipelines concurrent callers and reconnects by
/// itself, a per-call timeout, and a circuit breaker. Cheap to clone.
///
/// Build it inside a tokio runtime (with time enabled). It connects
/// lazily: a server that is down at start-up is a failure of the first
/// calls, handled by each limiter's [`FailurePolicy`](super::FailurePolicy).
///
/// # Example
///
/// ```no_run
/// use ratewall::redis::RedisBackend;
/// use std::time::Duration;
///
/// # async fn f() -> Result<(), ratewall::redis::RedisError> {
/// let redis = RedisBackend::builder("redis://127.0.0.1:6379")
///     .timeout(Duration::from_millis(20))
///     .breaker(5, Duration::from_secs(2))
///     .build()?;
/// assert_eq!(redis.timeout(), Duration::from_millis(20));
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RedisBackend {
    inner: Arc<Inner>,
}

struct Inner {
    link: Arc<Link>,
    url: String,
    /// How the HTTP layer names client key material here.
    key_names: KeyNames,
    /// `None` when batching is off (`max_batch(1)`).
    batcher: Option<Batcher>,
}

/// Configures a [`RedisBackend`]: timeouts and the circuit breaker.
///
/// # Example
///
/// ```no_run
/// use ratewall::redis::RedisBackend;
/// use std::time::Duration;
///
/// # async fn f() -> Result<(), ratewall::redis::RedisError> {
/// let redis = RedisBackend::builder("redis://10.0.0.5:6379/0")
///     .timeout(Duration::from_millis(30))
///     .connect_timeout(Duration::from_millis(100))
///     .build()?;
/// # Ok(()) }
/// ```
#[must_use = "a builder does nothing until `build`"]
#[derive(Clone)]
pub struct RedisBackendBuilder {
    url: String,
    name: String,
    cluster: Option<Vec<String>>,
    timeout: Duration,
    connect_timeout: Duration,
    failures: u32,
    cool_down: Duration,
    max_batch: usize,
    in_flight: usize,
    key_names: KeyNames,
    #[cfg(feature = "redis-tls")]
    tls: super::tls::TlsFiles,
    /// The sentinels, the master's name and its credentials.
    #[cfg(feature = "redis-sentinel")]
    sentinel: Option<super::sentinel::Target>,
}

impl fmt::Debug for RedisBackendBuilder {
    /// Without credentials: a URL's password (and user) shows as `***`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisBackendBuilder")
            .field("url", &redacted(&self.url))
            .field(
                "cluster",
                &self
                    .cluster
                    .as_ref()
                    .map(|nodes| nodes.iter().map(|n| redacted(n)).collect::<Vec<_>>()),
            )
            .field("name", &self.name)
            .field("timeout", &self.timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("breaker", &(self.failures, self.cool_down))
            .field("max_batch", &self.max_batch)
            .field("in_flight", &self.in_flight)
            .finish_non_exhaustive()
    }
}

/// The default largest number of calls sent as one script call.
pub const DEFAULT_MAX_BATCH: usize = 128;
/// The default number of batches on the wire at once.
pub const DEFAULT_IN_FLIGHT: usize = 2;

impl RedisBackend {
    /// A builder for the server at `url` (`redis://host:port/db`).
    ///
    /// ```
    /// # use ratewall::redis::RedisBackend;
    /// let b = RedisBackend::builder("redis://127.0.0.1:6379");
    /// println!("{b:?}");
    /// ```
    pub fn builder(url: impl Into<String>) -> RedisBackendBuilder {
        RedisBackendBuilder {
            url: url.into(),
            name: "redis".into(),
            cluster: None,
            timeout: DEFAULT_TIMEOUT,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            failures: DEFAULT_BREAKER_FAILURES,
            cool_down: DEFAULT_COOL_DOWN,
            max_batch: DEFAULT_MAX_BATCH,
            in_flight: DEFAULT_IN_FLIGHT,
            key_names: KeyNames::Hashed,
            #[cfg(feature = "redis-tls")]
            tls: super::tls::TlsFiles::default(),
            #[cfg(feature = "redis-sentinel")]
            sentinel: None,
        }
    }

    /// A builder for the master of the group `master_name` that Redis
    /// Sentinel monitors, found through any of `sentinels` (the sentinels'
    /// own URLs, `redis://[user:password@]host:26379`, with the sentinels'
    /// credentials). Every call goes to the master the sentinels name:
    /// never to a replica, since every check writes. The master is looked
    /// up on first use, and again after a call fails in a way a failover
    /// explains (connection refused, lost or timed out, or `READONLY` from
    /// a master that is a replica now); meanwhile the per-call timeout,
    /// the breaker and each limiter's failure policy answer as for one
    /// server. Feature `redis-sentinel`.
    ///
    /// ```no_run
    /// # use ratewall::redis::RedisBackend;
    /// # async fn f() -> Result<(), ratewall::redis::RedisError> {
    /// let redis = RedisBackend::sentinel_builder(
    ///     ["redis://10.0.0.1:26379", "redis://10.0.0.2:26379", "redis://10.0.0.3:26379"],
    ///     "limits",
    /// )
    /// .build()?;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "redis-sentinel")]
    pub fn sentinel_builder<I, S>(
        sentinels: I,
        master_name: impl Into<String>,
    ) -> RedisBackendBuilder
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let sentinels: Vec<String> = sentinels.into_iter().map(Into::into).collect();
        let master_name = master_name.into();
        let shown = format!(
            "{} (Sentinel master {master_name})",
            sentinels.first().map_or("", String::as_str)
        );
        let mut b = RedisBackend::builder(shown);
        b.sentinel = Some(super::sentinel::Target {
            sentinels,
            master_name,
            username: None,
            password: None,
        });
        b
    }

    /// A builder for a Redis Cluster reached through any of `nodes`
    /// (`redis://host:port` each). The client follows `MOVED` and `ASK`
    /// redirects (the script did not run there, so following is safe) and
    /// learns the slot map; each key's script runs on its slot's master.
    /// The cluster client has no response timeout of its own: the per-call
    /// timeout here always bounds a call.
    ///
    /// ```no_run
    /// # use ratewall::redis::RedisBackend;
    /// # async fn f() -> Result<(), ratewall::redis::RedisError> {
    /// let redis = RedisBackend::cluster_builder(["redis://10.0.0.1:7000", "redis://10.0.0.2:7000"]).build()?;
    /// # Ok(()) }
    /// ```
    pub fn cluster_builder<I, S>(nodes: I) -> RedisBackendBuilder
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let nodes: Vec<String> = nodes.into_iter().map(Into::into).collect();
        let mut b = RedisBackend::builder(nodes.first().cloned().unwrap_or_default());
        b.cluster = Some(nodes);
        b
    }

    /// The per-call timeout.
    ///
    /// ```no_run
    /// # use ratewall::redis::RedisBackend;
    /// # async fn f() -> Result<(), ratewall::redis::RedisError> {
    /// let redis = RedisBackend::builder("redis://127.0.0.1:6379").build()?;
    /// assert_eq!(redis.timeout(), ratewall::redis::DEFAULT_TIMEOUT);
    /// # Ok(()) }
    /// ```
    pub fn timeout(&self) -> Duration {
        self.inner.link.timeout()
    }

    /// Whether calls go to Redis now (the circuit is closed).
    ///
    /// ```no_run
    /// # use ratewall::redis::RedisBackend;
    /// # async fn f() -> Result<(), ratewall::redis::RedisError> {
    /// let redis = RedisBackend::builder("redis://127.0.0.1:6379").build()?;
    /// assert!(redis.is_available());
    /// # Ok(()) }
    /// ```
    pub fn is_available(&self) -> bool {
        self.inner.link.is_available()
    }

    /// Whether `other` is this backend (the same connection).
    pub(crate) fn same(&self, other: &RedisBackend) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// The name of the HTTP layer's client key material here (see
    /// [`key_secret`](RedisBackendBuilder::key_secret)).
    #[cfg_attr(not(feature = "tower"), allow(dead_code))]
    pub(crate) fn key_name(&self, material: Vec<u8>) -> Vec<u8> {
        self.inner.key_names.name(material)
    }

    /// Whether this is a Redis Cluster.
    pub(crate) fn is_cluster(&self) -> bool {
        self.inner.link.is_cluster()
    }

    /// Runs one single-key call (a check, peek or refund) for the limiter
    /// `watch` watches: batched with the other calls in flight when
    /// batching is on, alone otherwise. Bounded by the per-call timeout
    /// from the moment it is made (time spent queued counts). Its decision
    /// (a refund's is [`REFUNDED`](super::wire::REFUNDED)), accounted at the
    /// door (`door.rs`).
    pub(crate) async fn call(&self, watch: &Watch, call: Call) -> Result<Decision, RedisError> {
        let got = match &self.inner.batcher {
            Some(b) => b.call(call).await,
            None => self.inner.link.send(&call).await,
        };
        door::account(&[watch], &got);
        got
    }

    /// Runs one script call for the limiters `watches` watch, under the
    /// timeout and the breaker, its reply read by `read` (a `parse_*` of
    /// `wire.rs`), and accounts what came back at the door (`door.rs`).
    /// What the store failed (unreachable, an error reply such as `OOM`, a
    /// reply `read` cannot read: see `fault.rs`) is
    /// [`RedisError::Unavailable`]; what the call's key caused is
    /// [`RedisError::Server`]. A call that timed out is never retried: it
    /// may have run.
    pub(crate) async fn invoke<T>(
        &self,
        watches: &[&Watch],
        invocation: &redis::ScriptInvocation<'_>,
        read: impl FnOnce(Value) -> Result<T, Fault>,
    ) -> Result<T, RedisError> {
        let got = self.inner.link.invoke(invocation, read).await;
        door::account(watches, &got);
        got
    }

    /// One plain command for the limiter `watch` watches, under the
    /// timeout and the breaker, accounted at the door.
    pub(crate) async fn query(&self, watch: &Watch, cmd: &redis::Cmd) -> Result<Value, RedisError> {
        let got = self.inner.link.query(cmd).await;
        door::account(&[watch], &got);
        got
    }
}

/// Whether `url` asks for TLS (`rediss://`, or Valkey's `valkeys://`).
fn is_tls(url: &str) -> bool {
    let scheme = url.split("://").next().unwrap_or_default();
    url.contains("://")
        && (scheme.eq_ignore_ascii_case("rediss") || scheme.eq_ignore_ascii_case("valkeys"))
}

/// The URL without its credentials (`redis://user:password@host` shows
/// as `redis://***@host`).
fn redacted(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => format!("{}***{}", &url[..s + 3], &url[at..]),
        _ => url.to_string(),
    }
}

impl RedisBackendBuilder {
    /// The per-call timeout (default [`DEFAULT_TIMEOUT`], 50 ms). A call
    /// that times out is a failure: it is not retried (it may have run),
    /// and the limiter's failure policy answers.
    ///
    /// ```
    /// # use ratewall::redis::RedisBackend; use std::time::Duration;
    /// let b = RedisBackend::builder("redis://127.0.0.1").timeout(Duration::from_millis(10));
    /// ```
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The time to wait for a (re)connection (default 250 ms).
    ///
    /// ```
    /// # use ratewall::redis::RedisBackend; use std::time::Duration;
    /// let b = RedisBackend::builder("redis://127.0.0.1").connect_timeout(Duration::from_millis(100));
    /// ```
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// The circuit breaker: after `failures` failed calls in a row, stop
    /// calling Redis for `cool_down`, then let one call probe it (defaults:
    /// 5 failures, 1 s).
    ///
    /// ```
    /// # use ratewall::redis::RedisBackend; use std::time::Duration;
    /// let b = RedisBackend::builder("redis://127.0.0.1").breaker(3, Duration::from_millis(500));
    /// ```
    pub fn breaker(mut self, failures: u32, cool_down: Duration) -> Self {
        self.failures = failures;
        self.cool_down = cool_down;
        self
    }

    /// Batching (on by default): single-key calls (`check_key`, `peek_key`,
    /// `refund_key`) made while earlier ones are on the wire are sent together,
    /// up to `max_batch` of them in one script call, which runs them one
    /// after the other in arrival order at one server time. Each call gets
    /// the decision it would have got alone at that time; a denied call
    /// takes nothing and does not stop the others. A call alone (no other
    /// call waiting) is sent at once, as its own script call, so a quiet
    /// backend adds no latency. On a Cluster, calls are grouped by hash
    /// slot. `1` turns batching off (default [`DEFAULT_MAX_BATCH`], 128).
    ///
    /// ```
    /// # use ratewall::redis::RedisBackend;
    /// let unbatched = RedisBackend::builder("redis://127.0.0.1").max_batch(1);
    /// ```
    pub fn max_batch(mut self, max_batch: usize) -> Self {
        self.max_batch = max_batch.max(1);
        self
    }

    /// The backend's name in its metrics' `backend` label (feature
    /// `metrics`; default `redis`): calls, errors, latency, batch sizes
    /// and the breaker's state are per backend, since every limiter on it
    /// shares one connection, its batches and one breaker.
    ///
    /// ```
    /// # use ratewall::redis::RedisBackend;
    /// let b = RedisBackend::builder("redis://127.0.0.1").name("sessions");
    /// ```
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// How many batches may be on the wire at once (default
    /// [`DEFAULT_IN_FLIGHT`], 2; at least 1). More lets more calls overlap
    /// with fewer per batch; while all are in flight, new calls queue (the
    /// per-call timeout still bounds them) and go out together next.
    ///
    /// ```
    /// # use ratewall::redis::RedisBackend;
    /// let b = RedisBackend::builder("redis://127.0.0.1").batches_in_flight(4);
    /// ```
    pub fn batches_in_flight(mut self, batches: usize) -> Self {
        self.in_flight = batches.max(1);
        self
    }

    /// Names the HTTP layer's client keys (header values such as API keys,
    /// extensions, routes, composites) in Redis by a keyed hash under
    /// `secret`: `~` and 32 hex digits of HMAC-SHA-1, so nobody without
    /// the secret can tell a key's name from its value, nor aim a value at
    /// a Redis Cluster slot. Give every instance that shares the store the
    /// same secret (from your secret store, at least 16 random bytes);
    /// instances with different secrets count the same client under
    /// different keys. Changing it starts every such key afresh. Client
    /// addresses and the global key keep their readable names. Without a
    /// secret the names are an unkeyed hash (the value is not in them, but
    /// anyone can compute them).
    ///
    /// ```
    /// # use ratewall::redis::RedisBackend;
    /// let b = RedisBackend::builder("redis://127.0.0.1").key_secret(b"a secret shared by every instance");
    /// ```
    pub fn key_secret(mut self, secret: impl AsRef<[u8]>) -> Self {
        self.key_names = KeyNames::Keyed(Arc::from(secret.as_ref()));
        self
    }

    /// Names the HTTP layer's client keys in Redis by their value, as
    /// earlier versions did (`h:<header value>`): readable in
    /// `redis-cli`, for debugging, or to keep the counts of keys written
    /// by an earlier version across the upgrade. API keys and tokens then
    /// sit in clear in Redis, and a client can aim a value at a Cluster
    /// slot.
    ///
    /// ```
    /// # use ratewall::redis::RedisBackend;
    /// let b = RedisBackend::builder("redis://127.0.0.1").readable_key_names();
    /// ```
    pub fn readable_key_names(mut self) -> Self {
        self.key_names = KeyNames::Readable;
        self
    }

    /// The credentials of the master (and any replica promoted in its
    /// place) that a [`sentinel_builder`](RedisBackend::sentinel_builder)
    /// backend connects to: `username` for an ACL user (`None`: the
    /// default user, as with `requirepass`) and its `password`. The
    /// sentinels' own credentials go in their URLs. Without this, the
    /// master is reached without credentials. The password never shows in
    /// `Debug`. Feature `redis-sentinel`; ignored by other backends.
    ///
    /// ```no_run
    /// # use ratewall::redis::RedisBackend;
    /// # async fn f() -> Result<(), ratewall::redis::RedisError> {
    /// let redis = RedisBackend::sentinel_builder(["redis://10.0.0.1:26379"], "limits")
    ///     .sentinel_master_auth(Some("limiter"), "s3cret")
    ///     .build()?;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "redis-sentinel")]
    pub fn sentinel_master_auth(
        mut self,
        username: Option<&str>,
        password: impl Into<String>,
    ) -> Self {
        if let Some(target) = &mut self.sentinel {
            target.username = username.map(str::to_string);
            target.password = Some(password.into());
        }
        self
    }

    /// Trusts the CA whose certificate `pem` holds (PEM text, one or more
    /// `-----BEGIN CERTIFICATE-----` blocks) for `rediss://` URLs, instead
    /// of the platform's trust store: for a managed service's or your own
    /// private CA. Checked by [`build`](Self::build), which answers
    /// [`RedisError::InvalidTls`] for PEM it cannot use. Feature
    /// `redis-tls`.
    ///
    /// ```no_run
    /// # use ratewall::redis::RedisBackend;
    /// # async fn f() -> Result<(), Box<dyn std::error::Error>> {
    /// let ca = std::fs::read("/etc/redis/ca.pem")?;
    /// let redis = RedisBackend::builder("rediss://limits:secret@redis.internal:6380")
    ///     .tls_root_certificate(ca)
    ///     .build()?;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "redis-tls")]
    pub fn tls_root_certificate(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls.root = Some(pem.into());
        self
    }

    /// Mutual TLS: presents the client certificate chain `cert_pem` with
    /// its private key `key_pem` (PEM: PKCS#8, SEC1 or PKCS#1) to servers
    /// that ask for one (`tls-auth-clients yes`). Checked by
    /// [`build`](Self::build), which answers [`RedisError::InvalidTls`] for
    /// PEM it cannot use or a key that is not the certificate's. The key is
    /// never shown by `Debug`. Feature `redis-tls`.
    ///
    /// ```no_run
    /// # use ratewall::redis::RedisBackend;
    /// # async fn f() -> Result<(), Box<dyn std::error::Error>> {
    /// let redis = RedisBackend::builder("rediss://redis.internal:6380")
    ///     .tls_root_certificate(std::fs::read("ca.pem")?)
    ///     .tls_client_certificate(std::fs::read("client.pem")?, std::fs::read("client.key")?)
    ///     .build()?;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "redis-tls")]
    pub fn tls_client_certificate(
        mut self,
        cert_pem: impl Into<Vec<u8>>,
        key_pem: impl Into<Vec<u8>>,
    ) -> Self {
        self.tls.client = Some((cert_pem.into(), key_pem.into()));
        self
    }

    /// The backend. Must run inside a tokio runtime; the connection is made
    /// on first use.
    ///
    /// ```no_run
    /// # use ratewall::redis::RedisBackend;
    /// # async fn f() -> Result<(), ratewall::redis::RedisError> {
    /// let redis = RedisBackend::builder("redis://127.0.0.1:6379").build()?;
    /// # Ok(()) }
    /// ```
    pub fn build(self) -> Result<RedisBackend, RedisError> {
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(RedisError::NoRuntime);
        }
        let invalid = |e: redis::RedisError| RedisError::InvalidUrl {
            message: e.to_string(),
        };
        // The client's own timeouts bound each attempt; reconnection is
        // quick and short, because the per-call timeout and the breaker
        // decide what callers see meanwhile.
        let config = ConnectionManagerConfig::new()
            .set_response_timeout(Some(self.timeout))
            .set_connection_timeout(Some(self.connect_timeout))
            .set_number_of_retries(1)
            .set_min_delay(Duration::from_millis(5))
            .set_max_delay(Duration::from_millis(50));
        #[cfg(feature = "redis-sentinel")]
        if let Some(target) = &self.sentinel {
            if target.sentinels.is_empty() || target.master_name.is_empty() {
                return Err(RedisError::InvalidUrl {
                    message: "Sentinel needs at least one sentinel URL and the master's name"
                        .into(),
                });
            }
            if target.sentinels.iter().any(|u| is_tls(u)) {
                return Err(RedisError::InvalidTls {
                    message:
                        "TLS to Sentinel is not supported: use redis:// URLs for the sentinels"
                            .into(),
                });
            }
            // One lookup: ask a sentinel, check the master's role, connect.
            let lookup_timeout = self.connect_timeout * 2;
            let master = super::sentinel::SentinelMaster::new(target, config, lookup_timeout)
                .map_err(invalid)?;
            return Ok(self.finish(Conn::Sentinel(Box::new(master))));
        }
        let urls: &[String] = self
            .cluster
            .as_deref()
            .unwrap_or(std::slice::from_ref(&self.url));
        let tls = urls.iter().any(|u| is_tls(u));
        #[cfg(not(feature = "redis-tls"))]
        if tls {
            return Err(RedisError::FeatureDisabled {
                feature: "redis-tls",
                needed_for: "a rediss:// URL (TLS)",
            });
        }
        #[cfg(feature = "redis-tls")]
        let certificates = {
            if tls {
                super::tls::install_provider();
            }
            if !self.tls.is_set() {
                None
            } else if urls.iter().all(|u| is_tls(u)) {
                Some(self.tls.certificates()?)
            } else {
                return Err(RedisError::InvalidTls {
                    message: "TLS certificates were given for a URL that is not rediss://: use rediss:// URLs".into(),
                });
            }
        };
        if let Some(nodes) = &self.cluster {
            // Redirects (MOVED, ASK) count as retries; two cover a slot
            // move. A retry after a lost connection may run a script twice:
            // that over-counts (denies early), never admits extra.
            let builder = ClusterClient::builder(nodes.iter().map(String::as_str))
                .connection_timeout(self.connect_timeout)
                .response_timeout(self.timeout)
                .retries(2);
            #[cfg(feature = "redis-tls")]
            let builder = match certificates {
                Some(c) => builder.certs(c),
                None => builder,
            };
            let client = builder.build().map_err(invalid)?;
            return Ok(self.finish(Conn::cluster(client)));
        }
        #[cfg(feature = "redis-tls")]
        let client = match certificates {
            Some(c) => redis::Client::build_with_tls(self.url.as_str(), c),
            None => redis::Client::open(self.url.as_str()),
        };
        #[cfg(not(feature = "redis-tls"))]
        let client = redis::Client::open(self.url.as_str());
        let client = client.map_err(invalid)?;
        let conn = ConnectionManager::new_lazy_with_config(client, config).map_err(invalid)?;
        Ok(self.finish(Conn::Single(conn)))
    }

    fn finish(self, conn: Conn) -> RedisBackend {
        let link = Arc::new(Link::new(
            conn,
            &self.name,
            self.timeout,
            self.failures,
            self.cool_down,
        ));
        let batcher = (self.max_batch > 1)
            .then(|| Batcher::new(link.clone(), self.max_batch, self.in_flight));
        RedisBackend {
            inner: Arc::new(Inner {
                link,
                url: self.url,
                key_names: self.key_names,
                batcher,
            }),
        }
    }
}

impl fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisBackend")
            .field("url", &redacted(&self.inner.url))
            .field("timeout", &self.inner.link.timeout())
            .field("breaker", self.inner.link.breaker())
            .field("batching", &self.inner.batcher)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn debug_output_hides_credentials() {
        assert_eq!(
            super::redacted("redis://u:secret@h:1/0"),
            "redis://***@h:1/0"
        );
        assert_eq!(super::redacted("redis://h:1"), "redis://h:1");
    }
}
