//! The errors of the Redis backend.

use crate::error::{ConfigError, InsufficientCapacity};
use std::fmt;
use std::time::Duration;

/// What went wrong with a Redis limit, and what to change.
///
/// Configuration errors come from the builders; [`RedisError::Unavailable`]
/// is what [`FailurePolicy::Closed`](super::FailurePolicy::Closed) returns
/// when Redis cannot answer (and what refunds and resets return under any
/// policy); [`RedisError::Server`] is an error reply from Redis itself.
///
/// # Example
///
/// ```
/// use ratewall::redis::RedisError;
/// use std::time::Duration;
///
/// let e = RedisError::Unavailable { retry_in: Duration::from_millis(800), cause: "no reply within 50 ms".into() };
/// assert!(e.to_string().contains("800 ms"));
/// ```
#[non_exhaustive]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RedisError {
    /// The policy is invalid (the same error a local limiter gives).
    Config(ConfigError),
    /// The policy is valid locally but Redis' microsecond arithmetic cannot
    /// run it exactly.
    Unsupported {
        /// Why, and what to change.
        reason: &'static str,
    },
    /// A prefix or policy name that is empty, longer than 64 bytes, or holds
    /// a space, `:`, `{` or `}`.
    InvalidName {
        /// The name given.
        name: String,
    },
    /// The Redis URL could not be parsed.
    InvalidUrl {
        /// The client's message.
        message: String,
    },
    /// An empty key.
    EmptyKey,
    /// A cost the limit can never admit at once.
    InsufficientCapacity(InsufficientCapacity),
    /// Redis did not answer: connection refused or lost, no reply within
    /// the timeout, a reply that is not Redis', or the circuit breaker is
    /// open after repeated failures.
    Unavailable {
        /// How long until ratewall calls Redis again (zero: the next call).
        retry_in: Duration,
        /// What failed.
        cause: String,
    },
    /// Redis answered with an error (for example, the key holds data that
    /// is not this policy's state).
    Server {
        /// Redis' message.
        message: String,
    },
    /// Called outside a tokio runtime. The backend and its calls need one,
    /// with time enabled (`#[tokio::main]`, or `Builder::enable_all`).
    NoRuntime,
}

impl fmt::Display for RedisError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RedisError::Config(e) => write!(f, "invalid policy: {e}"),
            RedisError::Unsupported { reason } => write!(f, "policy not supported on Redis: {reason}"),
            RedisError::InvalidName { name } => write!(
                f,
                "invalid Redis key prefix or policy name {name:?}: use 1 to 64 printable ASCII bytes without space, ':', '{{' or '}}'"
            ),
            RedisError::InvalidUrl { message } => write!(
                f,
                "invalid Redis URL ({message}); use for example redis://127.0.0.1:6379"
            ),
            RedisError::EmptyKey => f.write_str(
                "empty rate-limit key; key by something that identifies the caller (an IP, a user id)",
            ),
            RedisError::InsufficientCapacity(e) => e.fmt(f),
            RedisError::Unavailable { retry_in, cause } => write!(
                f,
                "Redis unavailable ({cause}); ratewall tries it again in {} ms. Choose FailurePolicy::Open or a local fallback to keep serving meanwhile",
                retry_in.as_millis()
            ),
            RedisError::Server { message } => write!(
                f,
                "Redis answered with an error: {message}; check that no other program writes under the limiter's key prefix"
            ),
            RedisError::NoRuntime => f.write_str(
                "ratewall's Redis backend was used outside a tokio runtime: build it and call it from inside one, with time enabled (#[tokio::main], or tokio::runtime::Builder::enable_all)",
            ),
        }
    }
}

impl std::error::Error for RedisError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            RedisError::Config(e) => Some(e),
            RedisError::InsufficientCapacity(e) => Some(e),
            _ => None,
        }
    }
}

impl From<ConfigError> for RedisError {
    fn from(e: ConfigError) -> Self {
        RedisError::Config(e)
    }
}

impl From<InsufficientCapacity> for RedisError {
    fn from(e: InsufficientCapacity) -> Self {
        RedisError::InsufficientCapacity(e)
    }
}
