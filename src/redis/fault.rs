//! Whose fault a failed call is: the store's (the failure policy answers,
//! the breaker counts it) or the call's own (a typed error, Redis is fine).
//!
//! | What happened                                   | Class  | The caller gets                   |
//! |-------------------------------------------------|--------|-----------------------------------|
//! | refused, lost, no reply in time, breaker open   | store  | the [`FailurePolicy`]'s answer    |
//! | `OOM`, `MISCONF`, `READONLY`, `LOADING`, `BUSY`, `MASTERDOWN`, `TRYAGAIN`, `CLUSTERDOWN`, `NOPERM`, any other error reply | store | the [`FailurePolicy`]'s answer |
//! | a reply of the wrong shape or out of range      | store  | the [`FailurePolicy`]'s answer    |
//! | `WRONGTYPE` (the key holds another data type)   | caller | [`RedisError::Server`]            |
//! | `ratewall: key holds state of another policy`   | caller | [`RedisError::Server`]            |
//!
//! A store failure counts as a failure for the breaker and is reported
//! like an outage (a [`StoreEvent`](super::StoreEvent), the metrics): the
//! store cannot do its job for anyone, and the operator chose what to
//! answer meanwhile. The caller's class is only what one key's contents
//! cause (another program, or another policy under the same name, wrote
//! it): that key's calls fail, Redis counts as up, and the breaker does
//! not open, so one foreign key can neither trip fail-open for everyone
//! nor lock everyone out. Anything not known to be the key's is the
//! store's: an unknown error never passes for a decision.
//!
//! [`FailurePolicy`]: super::FailurePolicy
//! [`RedisError::Server`]: super::RedisError::Server

use redis::{ErrorKind, Value};

/// Why a call gave no decision.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Fault {
    /// The store cannot do its job (out of memory, read-only, loading, a
    /// reply that is not a decision, ...): what failed, and what to do.
    Store(String),
    /// The call's key holds data that is not this policy's state: Redis'
    /// message.
    Caller(String),
}

/// The message of the scripts' error for a key that holds another
/// policy's state (`error(...)` in `lua/*.lua`).
const FOREIGN_STATE: &str = "ratewall: key holds state of another policy";

/// The class of a message a script put in a batch's reply for one call
/// (an error it caught: `WRONGTYPE ...`, `OOM ...`, or its own).
pub(crate) fn of_message(message: &str) -> Fault {
    let code = message.split(' ').next().unwrap_or("");
    if code == "WRONGTYPE" || message.contains(FOREIGN_STATE) {
        Fault::Caller(message.to_string())
    } else {
        Fault::Store(advice(code, message))
    }
}

/// The class of an error from the client: a failure to reach Redis, an
/// error reply (by its code), or a reply the client could not read.
pub(crate) fn of_error(e: &redis::RedisError) -> Fault {
    if matches!(e.kind(), ErrorKind::Server(_) | ErrorKind::Extension) {
        let text = e.to_string();
        let code = e.code().unwrap_or("");
        if code == "WRONGTYPE" || text.contains(FOREIGN_STATE) {
            return Fault::Caller(text);
        }
        return Fault::Store(advice(code, &text));
    }
    let text = e.to_string();
    // rustls' words for a server certificate it does not accept.
    if text.contains("invalid peer certificate") {
        return Fault::Store(format!(
            "the server's TLS certificate is not trusted: give the CA that signed it with tls_root_certificate ({})",
            shortened(&text)
        ));
    }
    Fault::Store(text)
}

/// An error reply that means the store cannot serve, with what to do.
fn advice(code: &str, message: &str) -> String {
    let hint = match code {
        "OOM" => "Redis is out of memory: raise maxmemory (an eviction policy such as volatile-lru keeps Redis answering, but the keys it evicts start afresh)",
        "MISCONF" => "Redis refuses writes because it cannot save to disk: fix its persistence, or set stop-writes-on-bgsave-error no",
        "READONLY" => "the server is a replica: point the backend at the primary",
        "LOADING" => "Redis is loading its data set",
        "BUSY" => "a script ran past Redis' time limit",
        "MASTERDOWN" | "CLUSTERDOWN" | "TRYAGAIN" => "the Cluster or its primary is down",
        "NOPERM" | "NOAUTH" | "WRONGPASS" => {
            "the Redis user may not run this: grant it EVALSHA, SCRIPT LOAD and the commands of the scripts"
        }
        _ => "Redis did not give a decision",
    };
    format!("{hint} ({})", shortened(message))
}

/// The most of a message or reply shown in an error: a hostile or broken
/// server must not make ratewall log megabytes.
const SHOWN: usize = 200;

/// `text`, cut to [`SHOWN`] bytes (at a character boundary).
fn shortened(text: &str) -> &str {
    if text.len() <= SHOWN {
        return text;
    }
    let mut end = SHOWN;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// A reply that is not the decision asked for: a store failure naming
/// `what` was expected (the reply shown shortened).
#[cold]
pub(crate) fn bad_reply(what: &str, reply: &Value) -> Fault {
    let shown = format!("{reply:?}");
    Fault::Store(format!(
        "Redis did not give a decision: unexpected {what} reply {}",
        shortened(&shown)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_foreign_key_is_the_callers_and_anything_else_the_stores() {
        assert!(matches!(
            of_message("WRONGTYPE Operation against a key holding the wrong kind of value"),
            Fault::Caller(_)
        ));
        assert!(matches!(
            of_message("user_script:54: ratewall: key holds state of another policy"),
            Fault::Caller(_)
        ));
        for (message, says) in [
            (
                "OOM command not allowed when used memory > 'maxmemory'.",
                "out of memory",
            ),
            (
                "MISCONF Redis is configured to save RDB snapshots",
                "persistence",
            ),
            (
                "READONLY You can't write against a read only replica.",
                "primary",
            ),
            ("LOADING Redis is loading the dataset in memory", "loading"),
            (
                "ERR user_script:1: attempt to compare nil",
                "did not give a decision",
            ),
            ("", "did not give a decision"),
        ] {
            match of_message(message) {
                Fault::Store(cause) => {
                    assert!(cause.contains(says), "{cause}");
                    assert!(cause.contains(message), "{cause}");
                }
                other => panic!("{message:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn a_huge_reply_is_shown_shortened() {
        let junk = Value::BulkString("é".repeat(100_000).into_bytes());
        let Fault::Store(cause) = bad_reply("script", &junk) else {
            panic!("a bad reply is the store's");
        };
        assert!(cause.len() < 2 * SHOWN + 100, "{}", cause.len());
        let Fault::Store(cause) = of_message(&"x".repeat(100_000)) else {
            panic!("an unknown message is the store's");
        };
        assert!(cause.len() < 2 * SHOWN + 100, "{}", cause.len());
    }
}
