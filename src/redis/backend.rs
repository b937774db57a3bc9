//! The connection to Redis: one multiplexed connection that pipelines
//! concurrent callers and reconnects by itself, a per-call timeout, and the
//! circuit breaker.

use super::batch::{Batcher, Call, Reply};
use super::breaker::{Breaker, Permit};
use super::RedisError;
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, ErrorKind, Pipeline, RedisFuture, ServerErrorKind, Value};
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

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
    /// `None` when batching is off (`max_batch(1)`).
    batcher: Option<Batcher>,
}

/// The connection, its per-call timeout and its breaker: what a call needs,
/// shared with the batch runners (which must not keep the backend alive).
pub(crate) struct Link {
    conn: Conn,
    timeout: Duration,
    breaker: Breaker,
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
#[derive(Debug, Clone)]
pub struct RedisBackendBuilder {
    url: String,
    cluster: Option<Vec<String>>,
    timeout: Duration,
    connect_timeout: Duration,
    failures: u32,
    cool_down: Duration,
    max_batch: usize,
    in_flight: usize,
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
            cluster: None,
            timeout: DEFAULT_TIMEOUT,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            failures: DEFAULT_BREAKER_FAILURES,
            cool_down: DEFAULT_COOL_DOWN,
            max_batch: DEFAULT_MAX_BATCH,
            in_flight: DEFAULT_IN_FLIGHT,
        }
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
        self.inner.link.timeout
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
        self.inner.link.breaker.is_closed()
    }

    /// Whether `other` is this backend (the same connection).
    pub(crate) fn same(&self, other: &RedisBackend) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// Whether this is a Redis Cluster.
    pub(crate) fn is_cluster(&self) -> bool {
        matches!(self.inner.link.conn, Conn::Cluster(_))
    }

    /// Runs one single-key call (a check, peek or refund): batched with
    /// the other calls in flight when batching is on, alone otherwise.
    /// Bounded by the per-call timeout from the moment it is made (time
    /// spent queued counts).
    pub(crate) async fn call(&self, call: Call) -> Result<Reply, RedisError> {
        match &self.inner.batcher {
            Some(b) => b.call(call).await,
            None => call.send(&self.inner.link).await,
        }
    }

    /// Runs one script call under the timeout and the breaker. Failures to
    /// reach Redis are [`RedisError::Unavailable`]; error replies are
    /// [`RedisError::Server`]. A call that timed out is never retried: it
    /// may have run.
    pub(crate) async fn invoke(
        &self,
        invocation: &redis::ScriptInvocation<'_>,
    ) -> Result<Value, RedisError> {
        self.inner.link.invoke(invocation).await
    }

    /// One plain command under the timeout and the breaker.
    pub(crate) async fn query(&self, cmd: &redis::Cmd) -> Result<Value, RedisError> {
        self.inner
            .link
            .guarded(|mut conn| async move { cmd.query_async::<Value>(&mut conn).await })
            .await
    }
}

impl Link {
    pub(crate) fn timeout(&self) -> Duration {
        self.timeout
    }

    pub(crate) fn is_cluster(&self) -> bool {
        matches!(self.conn, Conn::Cluster(_))
    }

    /// See [`RedisBackend::invoke`].
    pub(crate) async fn invoke(
        &self,
        invocation: &redis::ScriptInvocation<'_>,
    ) -> Result<Value, RedisError> {
        // `invoke_async` sends EVALSHA, and on NOSCRIPT (the script did not
        // run) loads the script and sends EVALSHA again.
        self.guarded(|mut conn| async move { invocation.invoke_async::<Value>(&mut conn).await })
            .await
    }

    /// One `EVALSHA` of `script`, built by the caller as `cmd` (see
    /// [`evalsha`]), under the timeout and the breaker. On `NOSCRIPT` (the
    /// script did not run) it loads the script and sends `cmd` again, as
    /// `ScriptInvocation::invoke_async` does; building the command directly
    /// writes every argument into one buffer instead of one vector each.
    pub(crate) async fn evalsha(
        &self,
        script: &redis::Script,
        cmd: &Cmd,
    ) -> Result<Value, RedisError> {
        self.guarded(|mut conn| async move {
            match cmd.query_async::<Value>(&mut conn).await {
                Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                    script.load_async(&mut conn).await?;
                    cmd.query_async::<Value>(&mut conn).await
                }
                other => other,
            }
        })
        .await
    }

    async fn guarded<F, Fut>(&self, call: F) -> Result<Value, RedisError>
    where
        F: FnOnce(AnyConn) -> Fut,
        Fut: std::future::Future<Output = redis::RedisResult<Value>>,
    {
        // The timeout below needs a tokio runtime with time enabled;
        // without a runtime it would panic, so say so instead.
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(RedisError::NoRuntime);
        }
        if let Permit::Rejected { retry_in } = self.breaker.acquire(Instant::now()) {
            return Err(RedisError::Unavailable {
                retry_in,
                cause: "circuit open after repeated failures".into(),
            });
        }
        let attempt = async {
            let conn = self.conn.get().await?;
            call(conn).await
        };
        match tokio::time::timeout(self.timeout, attempt).await {
            Ok(Ok(value)) => {
                self.breaker.success();
                Ok(value)
            }
            Ok(Err(e)) if !is_outage(&e) => {
                // Redis answered: it is up, and the error is this call's.
                self.breaker.success();
                Err(RedisError::Server {
                    message: e.to_string(),
                })
            }
            Ok(Err(e)) => Err(self.failed(e.to_string())),
            Err(_) => Err(self.failed(format!("no reply within {} ms", self.timeout.as_millis()))),
        }
    }

    fn failed(&self, cause: String) -> RedisError {
        let now = Instant::now();
        self.breaker.failure(now);
        RedisError::Unavailable {
            retry_in: self.breaker.retry_in(now),
            cause,
        }
    }

    /// The error of a call that waited its whole timeout for a batch: not
    /// a failure of its own for the breaker (its batch counts once).
    pub(crate) fn timed_out(&self) -> RedisError {
        RedisError::Unavailable {
            retry_in: self.breaker.retry_in(Instant::now()),
            cause: format!("no reply within {} ms", self.timeout.as_millis()),
        }
    }
}

/// An `EVALSHA` of `script` with `keys` keys, its arguments (`keys`
/// keys, then the script's arguments) to be added by the caller, in a
/// command with room for `args` arguments and `bytes` bytes of them.
pub(crate) fn evalsha(script: &redis::Script, keys: usize, args: usize, bytes: usize) -> Cmd {
    let mut cmd = Cmd::with_capacity(3 + args, 64 + bytes);
    cmd.arg("EVALSHA").arg(script.get_hash()).arg(keys);
    cmd
}

/// The URL without its credentials (`redis://user:password@host` shows
/// as `redis://***@host`).
fn redacted(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => format!("{}***{}", &url[..s + 3], &url[at..]),
        _ => url.to_string(),
    }
}

/// Whether an error means Redis cannot serve (as opposed to an error reply
/// about this call).
fn is_outage(e: &redis::RedisError) -> bool {
    if e.is_io_error()
        || e.is_timeout()
        || e.is_connection_refusal()
        || e.is_connection_dropped()
        || e.is_unrecoverable_error()
    {
        return true;
    }
    if e.code() == Some("BUSY") {
        return true; // a script ran past its time limit
    }
    matches!(
        e.kind(),
        ErrorKind::Parse
            | ErrorKind::UnexpectedReturnType
            | ErrorKind::ClusterConnectionNotFound
            | ErrorKind::Server(
                ServerErrorKind::BusyLoading
                    | ServerErrorKind::TryAgain
                    | ServerErrorKind::ClusterDown
                    | ServerErrorKind::MasterDown
                    | ServerErrorKind::ReadOnly
            )
    )
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

    /// Batching (on by default): single-key calls (`check`, `peek`,
    /// `refund`) made while earlier ones are on the wire are sent together,
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
        if let Some(nodes) = &self.cluster {
            // Redirects (MOVED, ASK) count as retries; two cover a slot
            // move. A retry after a lost connection may run a script twice:
            // that over-counts (denies early), never admits extra.
            let client = ClusterClient::builder(nodes.iter().map(String::as_str))
                .connection_timeout(self.connect_timeout)
                .response_timeout(self.timeout)
                .retries(2)
                .build()
                .map_err(invalid)?;
            return Ok(self.finish(Conn::Cluster(Box::new(LazyCluster {
                client,
                conn: tokio::sync::OnceCell::new(),
            }))));
        }
        let client =
            redis::Client::open(self.url.as_str()).map_err(|e| RedisError::InvalidUrl {
                message: e.to_string(),
            })?;
        // The client's own timeouts bound each attempt; reconnection is
        // quick and short, because the per-call timeout and the breaker
        // decide what callers see meanwhile.
        let config = ConnectionManagerConfig::new()
            .set_response_timeout(Some(self.timeout))
            .set_connection_timeout(Some(self.connect_timeout))
            .set_number_of_retries(1)
            .set_min_delay(Duration::from_millis(5))
            .set_max_delay(Duration::from_millis(50));
        let conn = ConnectionManager::new_lazy_with_config(client, config).map_err(invalid)?;
        Ok(self.finish(Conn::Single(conn)))
    }

    fn finish(self, conn: Conn) -> RedisBackend {
        let link = Arc::new(Link {
            conn,
            timeout: self.timeout,
            breaker: Breaker::new(self.failures, self.cool_down, self.timeout),
        });
        let batcher = (self.max_batch > 1)
            .then(|| Batcher::new(link.clone(), self.max_batch, self.in_flight));
        RedisBackend {
            inner: Arc::new(Inner {
                link,
                url: self.url,
                batcher,
            }),
        }
    }
}

/// The server or cluster behind a backend.
enum Conn {
    Single(ConnectionManager),
    /// Connected on first use (under the per-call timeout), so a cluster
    /// that is down at start-up is a failure of the first calls.
    Cluster(Box<LazyCluster>),
}

struct LazyCluster {
    client: ClusterClient,
    conn: tokio::sync::OnceCell<ClusterConnection>,
}

impl Conn {
    async fn get(&self) -> redis::RedisResult<AnyConn> {
        match self {
            Conn::Single(c) => Ok(AnyConn::Single(c.clone())),
            Conn::Cluster(lazy) => {
                let c = lazy
                    .conn
                    .get_or_try_init(|| lazy.client.get_async_connection())
                    .await?;
                Ok(AnyConn::Cluster(c.clone()))
            }
        }
    }
}

/// One call's handle on either kind of connection.
#[derive(Clone)]
pub(crate) enum AnyConn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl ConnectionLike for AnyConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            AnyConn::Single(c) => c.req_packed_command(cmd),
            AnyConn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            AnyConn::Single(c) => c.req_packed_commands(pipeline, offset, count),
            AnyConn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            AnyConn::Single(c) => c.get_db(),
            AnyConn::Cluster(c) => c.get_db(),
        }
    }
}

impl fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisBackend")
            .field("url", &redacted(&self.inner.url))
            .field("timeout", &self.inner.link.timeout)
            .field("breaker", &self.inner.link.breaker)
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
