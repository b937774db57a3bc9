//! The errors of the Redis backend.

use crate::error::{ConfigError, InsufficientCapacity};
use crate::wording::Millis;
use std::fmt;
use std::time::Duration;

/// What went wrong with a Redis limit, and what to change.
///
/// Configuration errors come from the builders; [`RedisError::Unavailable`]
/// is what [`FailurePolicy::Closed`](super::FailurePolicy::Closed) returns
/// when Redis cannot give a decision (and what refunds and resets return
/// under any policy); [`RedisError::Server`] is an error about the call's
/// own key (it holds data that is not this policy's state).
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
    /// A TLS setting the client cannot use: a private CA or client
    /// certificate that is not PEM, a key that is not the certificate's,
    /// or certificates given for a URL that is not `rediss://`.
    InvalidTls {
        /// What is wrong, and which setting to change.
        message: String,
    },
    /// The URL or builder asks for something behind a cargo feature that is
    /// off (`rediss://` needs `redis-tls`).
    FeatureDisabled {
        /// The cargo feature to turn on.
        feature: &'static str,
        /// What needed it.
        needed_for: &'static str,
    },
    /// An empty key.
    EmptyKey,
    /// A cost the limit can never admit at once.
    InsufficientCapacity(InsufficientCapacity),
    /// Redis could not give a decision: connection refused or lost, no
    /// reply within the timeout, the circuit breaker open after repeated
    /// failures, an error reply that says the store cannot serve (`OOM`,
    /// `MISCONF`, `READONLY`, `LOADING`, `BUSY`, ...), or a reply that is
    /// not a decision. The cause says which, and what to do.
    Unavailable {
        /// How long until ratewall calls Redis again (zero: the next call).
        retry_in: Duration,
        /// What failed.
        cause: String,
    },
    /// The call's key holds data that is not this policy's state (Redis'
    /// `WRONGTYPE`, or a script's "key holds state of another policy"):
    /// another program, or another policy with the same prefix and name,
    /// wrote it. Only that key's calls fail; Redis counts as up, and the
    /// failure policy does not answer.
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
            RedisError::InvalidTls { message } => write!(f, "invalid TLS setting for Redis: {message}"),
            RedisError::FeatureDisabled { feature, needed_for } => write!(
                f,
                "{needed_for} needs ratewall's cargo feature `{feature}`: turn it on (features = [\"{feature}\"] in Cargo.toml)"
            ),
            RedisError::EmptyKey => f.write_str(
                "empty rate-limit key; key by something that identifies the caller (an IP, a user id)",
            ),
            RedisError::InsufficientCapacity(e) => e.fmt(f),
            RedisError::Unavailable { retry_in, cause } => {
                write!(f, "Redis unavailable ({cause}); ratewall tries it again ")?;
                if retry_in.is_zero() {
                    f.write_str("on the next call")?;
                } else {
                    write!(f, "in {}", Millis(*retry_in))?;
                }
                f.write_str(
                    ". To keep serving meanwhile, give the limiter a failure policy that admits \
                     or limits locally (in Rust `FailurePolicy::Open` or a fallback; in a \
                     configuration file `on_failure = \"open\"` or `\"fallback-share N\"`)",
                )
            }
            RedisError::Server { message } => write!(
                f,
                "Redis answered with an error about this key: {message}; the key holds data that is not this policy's state: check that no other program, and no other policy with the same prefix and name, writes under the limiter's keys"
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The wait is rounded up as `Retry-After` is (never "0 ms" while a
    /// wait is due), and the advice names the failure policy in both the
    /// forms a user may have written it in.
    #[test]
    fn an_outage_says_when_it_is_tried_again_rounded_up() {
        let down = |retry_in| RedisError::Unavailable {
            retry_in,
            cause: "connection refused".into(),
        };
        let soon = down(Duration::from_micros(300)).to_string();
        assert!(soon.contains("tries it again in 1 ms."), "{soon}");
        let later = down(Duration::from_millis(1500)).to_string();
        assert!(later.contains("tries it again in 1500 ms."), "{later}");
        let next = down(Duration::ZERO).to_string();
        assert!(next.contains("tries it again on the next call."), "{next}");
        assert!(
            next.contains("FailurePolicy::Open") && next.contains("on_failure = \"open\""),
            "{next}"
        );
    }
}
