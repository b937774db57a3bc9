//! The connection to Redis and the guarded call: one multiplexed
//! connection (or a Cluster's) that pipelines concurrent callers and
//! reconnects by itself, the per-call timeout and the circuit breaker.
//! Every call to Redis goes through [`Link::guarded`].

use super::breaker::{Breaker, Permit};
use super::fault::{self, Fault};
use super::wire::Call;
use super::RedisError;
use crate::decision::Decision;
use crate::wording::Millis;
use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, ErrorKind, Pipeline, RedisFuture, ServerErrorKind, Value};
use std::fmt;
use std::time::{Duration, Instant};

/// The connection, its per-call timeout and its breaker: what a call needs,
/// shared with the batch runners (which must not keep the backend alive).
pub(crate) struct Link {
    conn: Conn,
    timeout: Duration,
    breaker: Breaker,
    #[cfg(feature = "metrics")]
    metrics: crate::metrics::StoreMetrics,
}

impl Link {
    /// The link of the backend named `name` (its metrics' label).
    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    pub(crate) fn new(
        conn: Conn,
        name: &str,
        timeout: Duration,
        failures: u32,
        cool_down: Duration,
    ) -> Link {
        #[cfg(feature = "metrics")]
        let metrics = crate::metrics::StoreMetrics::new(name);
        Link {
            conn,
            timeout,
            #[cfg(feature = "metrics")]
            breaker: Breaker::new(failures, cool_down, timeout).with_gauge(metrics.breaker.clone()),
            #[cfg(not(feature = "metrics"))]
            breaker: Breaker::new(failures, cool_down, timeout),
            #[cfg(feature = "metrics")]
            metrics,
        }
    }

    /// The backend's metric handles (feature `metrics`).
    #[cfg(feature = "metrics")]
    pub(crate) fn metrics(&self) -> &crate::metrics::StoreMetrics {
        &self.metrics
    }

    pub(crate) fn breaker(&self) -> &Breaker {
        &self.breaker
    }

    /// Whether calls go to Redis now (the circuit is closed).
    pub(crate) fn is_available(&self) -> bool {
        self.breaker.is_closed()
    }

    /// Sends a single-key call alone, as its algorithm's own script: its
    /// decision (a refund's is [`REFUNDED`](super::wire::REFUNDED)).
    pub(crate) async fn send(&self, call: &Call) -> Result<Decision, RedisError> {
        self.evalsha(call.script, &call.command(), |v| call.read(&v))
            .await
    }

    /// One plain command under the timeout and the breaker.
    pub(crate) async fn query(&self, cmd: &redis::Cmd) -> Result<Value, RedisError> {
        self.guarded(
            |mut conn| async move { cmd.query_async::<Value>(&mut conn).await },
            Ok,
        )
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

    /// Runs one script call under the timeout and the breaker, its reply
    /// read by `read`. What the store failed (see `fault.rs`) is
    /// [`RedisError::Unavailable`]; what the call's key caused is
    /// [`RedisError::Server`]. A call that timed out is never retried: it
    /// may have run.
    pub(crate) async fn invoke<T>(
        &self,
        invocation: &redis::ScriptInvocation<'_>,
        read: impl FnOnce(Value) -> Result<T, Fault>,
    ) -> Result<T, RedisError> {
        // `invoke_async` sends EVALSHA, and on NOSCRIPT (the script did not
        // run) loads the script and sends EVALSHA again.
        self.guarded(
            |mut conn| async move { invocation.invoke_async::<Value>(&mut conn).await },
            read,
        )
        .await
    }

    /// One `EVALSHA` of `script`, built by the caller as `cmd` (see
    /// [`evalsha`](super::wire::evalsha)), under the timeout and the breaker. On `NOSCRIPT` (the
    /// script did not run) it loads the script and sends `cmd` again, as
    /// `ScriptInvocation::invoke_async` does; building the command directly
    /// writes every argument into one buffer instead of one vector each.
    pub(crate) async fn evalsha<T>(
        &self,
        script: &redis::Script,
        cmd: &Cmd,
        read: impl FnOnce(Value) -> Result<T, Fault>,
    ) -> Result<T, RedisError> {
        self.guarded(
            |mut conn| async move {
                match cmd.query_async::<Value>(&mut conn).await {
                    Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                        script.load_async(&mut conn).await?;
                        cmd.query_async::<Value>(&mut conn).await
                    }
                    other => other,
                }
            },
            read,
        )
        .await
    }

    /// The one door of every call: the breaker's permit, the timeout, and
    /// the accounting of what came back. `read` turns the reply into what
    /// the caller asked for; a reply it cannot read is the store's failure
    /// like an error reply that is (see `fault.rs`).
    async fn guarded<T, F, Fut>(
        &self,
        call: F,
        read: impl FnOnce(Value) -> Result<T, Fault>,
    ) -> Result<T, RedisError>
    where
        F: Fn(AnyConn) -> Fut,
        Fut: std::future::Future<Output = redis::RedisResult<Value>>,
    {
        // The timeout below needs a tokio runtime with time enabled;
        // without a runtime it would panic, so say so instead.
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(RedisError::NoRuntime);
        }
        let start = Instant::now();
        if let Permit::Rejected { retry_in } = self.breaker.acquire(start) {
            #[cfg(feature = "metrics")]
            self.metrics.call(crate::metrics::CallEnd::BreakerOpen, 0.0);
            return Err(RedisError::Unavailable {
                retry_in,
                cause: "circuit open after repeated failures".into(),
            });
        }
        let attempt = async {
            match call(self.conn.get().await?).await {
                // A refused connection: the call ran nothing. The
                // `ConnectionManager` keeps its last connection attempt and
                // hands out that attempt's result, however old, until a
                // call fails on it; only then does it start a new one. After
                // a restart the first call (the breaker's probe) would get
                // the refusal of an attempt made while the server was down
                // and open the circuit for a second cool-down. So a refused
                // call tries once more, on the attempt its failure started.
                Err(e) if e.is_connection_refusal() => call(self.conn.get().await?).await,
                // A pooled connection found dead before the call was sent
                // on it (its server restarted since the last call; the
                // client answers `broken pipe` without writing): the call
                // ran nothing, so it is tried once more on the connection
                // its failure started, within the same timeout. (A call
                // that may have reached Redis, a reset or an end of stream
                // after the write, is not retried: a refund run twice would
                // give back twice.)
                Err(e) if was_not_sent(&e) => call(self.conn.get().await?).await,
                other => other,
            }
        };
        let outcome = match tokio::time::timeout(self.timeout, attempt).await {
            Ok(Ok(value)) => read(value),
            Ok(Err(e)) => Err(fault::of_error(&e)),
            Err(_) => Err(Fault::Store(format!(
                "no reply within {}",
                Millis(self.timeout)
            ))),
        };
        #[cfg(feature = "metrics")]
        self.metrics.call(
            match &outcome {
                Ok(_) => crate::metrics::CallEnd::Replied { error: false },
                Err(Fault::Caller(_)) => crate::metrics::CallEnd::Replied { error: true },
                Err(Fault::Store(_)) => crate::metrics::CallEnd::Outage,
            },
            start.elapsed().as_secs_f64(),
        );
        match outcome {
            Ok(value) => {
                self.breaker.success();
                Ok(value)
            }
            Err(Fault::Caller(message)) => {
                // Redis did its job: the error is this call's key's.
                self.breaker.success();
                Err(RedisError::Server { message })
            }
            Err(Fault::Store(cause)) => Err(self.failed(cause)),
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
            cause: format!("no reply within {}", Millis(self.timeout)),
        }
    }
}

/// Whether a call failed before anything was written: the connection was
/// already closed (an I/O error whose kind, or whose text where the client
/// gives no kind, is a broken pipe or not connected).
fn was_not_sent(e: &redis::RedisError) -> bool {
    if e.kind() != redis::ErrorKind::Io {
        return false;
    }
    // The client keeps the I/O error behind an `Arc<dyn Error>`.
    type Shared = std::sync::Arc<dyn std::error::Error + Send + Sync>;
    let io_kind = std::error::Error::source(e)
        .and_then(|s| {
            s.downcast_ref::<std::io::Error>().or_else(|| {
                s.downcast_ref::<Shared>()
                    .and_then(|a| a.downcast_ref::<std::io::Error>())
            })
        })
        .map(std::io::Error::kind);
    match io_kind {
        Some(k) => matches!(
            k,
            std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::NotConnected
        ),
        None => {
            let text = e.to_string().to_ascii_lowercase();
            text.contains("broken pipe") || text.contains("not connected")
        }
    }
}

impl fmt::Debug for Link {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Link")
            .field("timeout", &self.timeout)
            .field("breaker", &self.breaker)
            .finish()
    }
}

/// The server or cluster behind a backend.
pub(crate) enum Conn {
    Single(ConnectionManager),
    /// Connected on first use (under the per-call timeout), so a cluster
    /// that is down at start-up is a failure of the first calls.
    Cluster(Box<LazyCluster>),
    /// The master the sentinels name (feature `redis-sentinel`), looked
    /// up again after a failure a failover explains.
    #[cfg(feature = "redis-sentinel")]
    Sentinel(Box<super::sentinel::SentinelMaster>),
}

pub(crate) struct LazyCluster {
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
            #[cfg(feature = "redis-sentinel")]
            Conn::Sentinel(master) => Ok(AnyConn::Sentinel(master.get().await?)),
        }
    }
}

/// One call's handle on either kind of connection.
#[derive(Clone)]
pub(crate) enum AnyConn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
    #[cfg(feature = "redis-sentinel")]
    Sentinel(super::sentinel::MasterConn),
}

impl ConnectionLike for AnyConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            AnyConn::Single(c) => c.req_packed_command(cmd),
            AnyConn::Cluster(c) => c.req_packed_command(cmd),
            #[cfg(feature = "redis-sentinel")]
            AnyConn::Sentinel(m) => Box::pin(async move {
                let reply = m.conn.req_packed_command(cmd).await;
                if let Err(e) = &reply {
                    m.failed(e);
                }
                reply
            }),
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
            #[cfg(feature = "redis-sentinel")]
            AnyConn::Sentinel(m) => Box::pin(async move {
                let replies = m.conn.req_packed_commands(pipeline, offset, count).await;
                if let Err(e) = &replies {
                    m.failed(e);
                }
                replies
            }),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            AnyConn::Single(c) => c.get_db(),
            AnyConn::Cluster(c) => c.get_db(),
            #[cfg(feature = "redis-sentinel")]
            AnyConn::Sentinel(m) => m.conn.get_db(),
        }
    }
}

impl Conn {
    /// A Cluster reached through `client`, connected on first use.
    pub(crate) fn cluster(client: ClusterClient) -> Conn {
        Conn::Cluster(Box::new(LazyCluster {
            client,
            conn: tokio::sync::OnceCell::new(),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::was_not_sent;
    use std::io::{Error, ErrorKind};

    /// Only a call that never left the client is retried: a broken pipe or
    /// a socket not connected. A reset or an end of stream may come after
    /// Redis ran the call; a refusal is retried on its own arm; a reply is
    /// no I/O error at all.
    #[test]
    fn only_calls_that_were_never_written_are_retried() {
        let io = |kind| redis::RedisError::from(Error::new(kind, "io"));
        assert!(was_not_sent(&io(ErrorKind::BrokenPipe)));
        assert!(was_not_sent(&io(ErrorKind::NotConnected)));
        for kind in [
            ErrorKind::ConnectionReset,
            ErrorKind::UnexpectedEof,
            ErrorKind::ConnectionAborted,
            ErrorKind::TimedOut,
        ] {
            assert!(!was_not_sent(&io(kind)), "{kind:?}");
        }
        let reply = redis::RedisError::from((redis::ErrorKind::Io, "connection reset by peer"));
        assert!(!was_not_sent(&reply));
        let pipe = redis::RedisError::from((redis::ErrorKind::Io, "broken pipe"));
        assert!(was_not_sent(&pipe));
        let busy = redis::RedisError::from((redis::ErrorKind::Client, "broken pipe"));
        assert!(!was_not_sent(&busy), "not an I/O error");
    }
}
