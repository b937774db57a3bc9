//! Redis Sentinel (feature `redis-sentinel`): the connection to the master
//! the sentinels name. It is looked up on first use and again after a call
//! on it fails in a way a failover explains (the connection refused, lost
//! or silent, or `READONLY` from a master demoted to a replica). Calls
//! never go to a replica: every check writes.
//!
//! The lookup runs in a task of its own, so a caller whose per-call timeout
//! ends first drops only its wait: the lookup completes for the calls after
//! it, and lookups never run two at once.

use crate::sync::{lock, Mutex};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};
use redis::{ErrorKind, RedisConnectionInfo, RedisResult, ServerErrorKind};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// What the builder was given: the sentinels, the group's name, and the
/// master's own credentials.
#[derive(Clone)]
pub(crate) struct Target {
    pub(crate) sentinels: Vec<String>,
    pub(crate) master_name: String,
    pub(crate) username: Option<String>,
    pub(crate) password: Option<String>,
}

impl fmt::Debug for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The sentinels' URLs may hold their password: shown by the
        // backend's redacted URL, not here.
        f.debug_struct("Sentinel")
            .field("sentinels", &self.sentinels.len())
            .field("master_name", &self.master_name)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .finish()
    }
}

/// The master of one Sentinel-monitored group, found through its sentinels.
pub(crate) struct SentinelMaster {
    shared: Arc<Shared>,
}

struct Shared {
    /// Held for the whole of a lookup: lookups run one at a time.
    sentinels: tokio::sync::Mutex<SentinelClient>,
    config: ConnectionManagerConfig,
    /// Bounds one lookup (ask the sentinels, check the master's role,
    /// connect to it), whoever waits for it.
    lookup_timeout: Duration,
    current: Mutex<Current>,
}

struct Current {
    /// Counts the masters found; a failure forgets the master only if it
    /// is still the one the failed call used.
    generation: u64,
    master: Option<ConnectionManager>,
    /// Counts the lookups that ended, and the last one's error: callers
    /// that waited for a lookup share its answer instead of queueing one
    /// each (an outage with many callers in flight would otherwise make
    /// that many lookups, one after the other).
    lookups: u64,
    last_error: Option<redis::RedisError>,
}

/// The master a call was given, and how to forget it when the call fails.
#[derive(Clone)]
pub(crate) struct MasterConn {
    pub(crate) conn: ConnectionManager,
    shared: Arc<Shared>,
    generation: u64,
}

impl SentinelMaster {
    /// The group `target` names behind its sentinels. Connects to nothing
    /// yet.
    pub(crate) fn new(
        target: &Target,
        config: ConnectionManagerConfig,
        lookup_timeout: Duration,
    ) -> RedisResult<SentinelMaster> {
        let mut master = RedisConnectionInfo::default();
        if let Some(username) = &target.username {
            master = master.set_username(username);
        }
        if let Some(password) = &target.password {
            master = master.set_password(password);
        }
        let client = SentinelClient::build(
            target.sentinels.iter().map(String::as_str).collect(),
            // A `String`: what `build` takes without the crate's TLS.
            target.master_name.clone(),
            Some(SentinelNodeConnectionInfo::default().set_redis_connection_info(master)),
            SentinelServerType::Master,
        )?;
        Ok(SentinelMaster {
            shared: Arc::new(Shared {
                sentinels: tokio::sync::Mutex::new(client),
                config,
                lookup_timeout,
                current: Mutex::new(Current {
                    generation: 0,
                    master: None,
                    lookups: 0,
                    last_error: None,
                }),
            }),
        })
    }

    /// The current master's connection, looked up first if there is none.
    pub(crate) async fn get(&self) -> RedisResult<MasterConn> {
        let seen = match self.shared.current() {
            Ok(found) => return Ok(found),
            Err(lookups) => lookups,
        };
        match tokio::spawn(Shared::look_up(self.shared.clone(), seen)).await {
            Ok(found) => found,
            Err(e) => Err(redis::RedisError::from((
                ErrorKind::Client,
                "the Sentinel lookup stopped",
                e.to_string(),
            ))),
        }
    }
}

impl Shared {
    /// The current master, or how many lookups have ended.
    fn current(self: &Arc<Self>) -> Result<MasterConn, u64> {
        let current = lock(&self.current);
        match &current.master {
            Some(conn) => Ok(MasterConn {
                conn: conn.clone(),
                shared: self.clone(),
                generation: current.generation,
            }),
            None => Err(current.lookups),
        }
    }

    /// Looks the master up, unless a lookup that ended after the caller
    /// found none (`seen` lookups had ended then) answers it already.
    async fn look_up(self: Arc<Self>, seen: u64) -> RedisResult<MasterConn> {
        let mut sentinels = self.sentinels.lock().await;
        match self.current() {
            Ok(found) => return Ok(found),
            Err(lookups) if lookups != seen => {
                if let Some(e) = &lock(&self.current).last_error {
                    return Err(e.clone());
                }
            }
            Err(_) => {}
        }
        let config = self.config.clone();
        let found = tokio::time::timeout(self.lookup_timeout, async {
            // Asks the sentinels for the master's address and checks that
            // the server there calls itself a master.
            let client = sentinels.async_get_client().await?;
            ConnectionManager::new_with_config(client, config).await
        })
        .await;
        let found = found.unwrap_or_else(|_| {
            Err(redis::RedisError::from((
                ErrorKind::Io,
                "no master from Sentinel",
                format!(
                    "lookup took over {}",
                    crate::wording::Millis(self.lookup_timeout)
                ),
            )))
        });
        let mut current = lock(&self.current);
        current.lookups += 1;
        let conn = match found {
            Ok(conn) => conn,
            Err(e) => {
                current.last_error = Some(e.clone());
                return Err(e);
            }
        };
        current.last_error = None;
        current.generation += 1;
        current.master = Some(conn.clone());
        Ok(MasterConn {
            conn,
            shared: self.clone(),
            generation: current.generation,
        })
    }
}

impl MasterConn {
    /// After a failed call: forgets the master if a failover explains the
    /// failure, so the next call asks the sentinels again.
    pub(crate) fn failed(&self, e: &redis::RedisError) {
        if !failover_explains(e) {
            return;
        }
        let mut current = lock(&self.shared.current);
        if current.generation == self.generation {
            current.master = None;
        }
    }
}

/// Whether a failover explains `e`: the master is gone or silent (a
/// connection refused, lost or timed out), or it is a replica now
/// (`READONLY`). An error about the call itself keeps the master.
fn failover_explains(e: &redis::RedisError) -> bool {
    e.is_io_error()
        || e.is_connection_refusal()
        || e.is_connection_dropped()
        || e.is_timeout()
        || e.kind() == ErrorKind::Server(ServerErrorKind::ReadOnly)
}

#[cfg(test)]
mod tests {
    use super::failover_explains;

    #[test]
    fn only_failures_a_failover_explains_forget_the_master() {
        let io = redis::RedisError::from(std::io::Error::new(
            std::io::ErrorKind::ConnectionReset,
            "reset",
        ));
        assert!(failover_explains(&io));
        let refused = redis::RedisError::from(std::io::Error::new(
            std::io::ErrorKind::ConnectionRefused,
            "refused",
        ));
        assert!(failover_explains(&refused));
        let demoted = redis::RedisError::from((
            redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly),
            "READONLY",
        ));
        assert!(failover_explains(&demoted));
        let no_perm = redis::RedisError::from((
            redis::ErrorKind::Server(redis::ServerErrorKind::NoPerm),
            "NOPERM",
        ));
        assert!(!failover_explains(&no_perm));
    }
}
