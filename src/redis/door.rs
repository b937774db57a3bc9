//! The one door to the store: what every Redis limiter's call to Redis
//! comes to, accounted in one place.
//!
//! Every call the crate makes to Redis (a plain, batched, multi-limit,
//! lockout, concurrency, lease or elastic script, a renewal, a release, a
//! refund, a reset) goes through [`RedisBackend::enter`](super::RedisBackend),
//! which sends it through the connection's guarded call (`connection.rs`:
//! the breaker, the timeout, one retry of a call that never left) and then
//! hands what came back to [`account`], for every limiter the call was
//! made for. Every decision a limiter returns goes through [`settle`] (or,
//! for one no failure policy stands behind, [`decided`]). No call site reports a
//! transition or counts a decision of its own, so no path can forget
//! either:
//!
//! - a call Redis answered (with a reply, or an error about the call's own
//!   key such as `WRONGTYPE`): the limiter recovers if it was failing;
//! - a call the store failed ([`RedisError::Unavailable`]): the limiter
//!   starts failing (one [`StoreEvent::Failing`](super::StoreEvent)), or,
//!   while failing, at most one summary line a minute;
//! - a decision: counted by source and outcome (feature `metrics`); a
//!   check the failure policy answered is counted for the recovery's
//!   report; a check `Closed` refused is counted as unavailable.

use super::events::Watch;
use super::{RedisDecision, RedisError};
use std::time::Duration;

/// Accounts what one call brought back, for each limiter it was made for.
#[inline]
pub(crate) fn account<T>(watches: &[&Watch], got: &Result<T, RedisError>) {
    match got {
        // Redis answered: a reply, or an error of the call's own key.
        Ok(_) | Err(RedisError::Server { .. }) => watches.iter().for_each(|w| w.answered()),
        Err(RedisError::Unavailable { cause, .. }) => {
            watches.iter().for_each(|w| w.failed(cause));
        }
        // Nothing was sent (no runtime, a bad key): nothing to say of Redis.
        Err(_) => {}
    }
}

/// A decision a limiter returns, with the decision to count.
pub(crate) trait Answer {
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    fn counted(&self) -> &RedisDecision;
}

impl Answer for RedisDecision {
    fn counted(&self) -> &RedisDecision {
        self
    }
}

/// One limiter's answer to one check from what its call brought back
/// (`got`, already accounted by [`account`]): Redis's decision as it is;
/// on a store failure, the failure policy's answer (`policy`, given when
/// Redis is tried again and why not); either way counted once.
#[inline]
pub(crate) fn settle<D: Answer>(
    watch: &Watch,
    got: Result<D, RedisError>,
    policy: impl FnOnce(Duration, String) -> Result<D, RedisError>,
) -> Result<D, RedisError> {
    let answer = match got {
        Err(RedisError::Unavailable { retry_in, cause }) => {
            watch.answered_locally();
            policy(retry_in, cause)
        }
        other => other,
    };
    count(watch, &answer);
    answer
}

/// A decision no failure policy stands behind, counted: Redis's own from
/// a call already accounted (one of several a multi-limit script made),
/// or one made without a call (a deny-cache hit, a lease's local
/// admission, a denial shared with a check in flight).
#[inline]
pub(crate) fn decided(watch: &Watch, d: RedisDecision) -> RedisDecision {
    #[cfg(feature = "metrics")]
    watch.decided(&d);
    #[cfg(not(feature = "metrics"))]
    let _ = watch;
    d
}

#[inline]
#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
fn count<D: Answer>(watch: &Watch, answer: &Result<D, RedisError>) {
    #[cfg(feature = "metrics")]
    match answer {
        Ok(d) => watch.decided(d.counted()),
        Err(RedisError::Unavailable { .. }) => watch.metrics().unavailable(),
        Err(_) => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::redis::events::Hook;
    use crate::redis::{DecisionSource, FailurePolicy, StoreEvent};
    use crate::Decision;
    use std::sync::{Arc, Mutex};

    fn watched() -> (Watch, Arc<Mutex<Vec<StoreEvent>>>) {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s = seen.clone();
        let hook = Hook(Arc::new(move |e: &StoreEvent| {
            s.lock().unwrap().push(e.clone())
        }));
        (Watch::new("door", FailurePolicy::Closed, Some(hook)), seen)
    }

    fn down() -> Result<RedisDecision, RedisError> {
        Err(RedisError::Unavailable {
            retry_in: Duration::from_millis(5),
            cause: "refused".into(),
        })
    }

    fn redis(allowed: bool) -> RedisDecision {
        let d = if allowed {
            Decision::allow(3, 2, 0)
        } else {
            Decision::deny(3, 0, 7, 7)
        };
        RedisDecision {
            decision: d,
            source: DecisionSource::Redis,
        }
    }

    /// The three kinds of outcome: a store failure starts failing, an
    /// error of the call's own key is Redis answering (a recovery), an
    /// error before any call says nothing.
    #[test]
    fn what_a_call_came_to_moves_the_watch() {
        let (w, seen) = watched();
        let (a, b) = (&w, &w);
        account(&[a, b], &down());
        assert!(w.is_failing());
        account::<()>(&[&w], &Err(RedisError::NoRuntime));
        assert!(w.is_failing(), "nothing was sent: no recovery");
        account::<()>(
            &[&w],
            &Err(RedisError::Server {
                message: "WRONGTYPE".into(),
            }),
        );
        assert!(!w.is_failing(), "Redis answered the call");
        account(&[&w], &down());
        account(&[&w], &Ok(redis(true)));
        let kinds: Vec<_> = seen
            .lock()
            .unwrap()
            .iter()
            .map(|e| matches!(e, StoreEvent::Failing { .. }))
            .collect();
        assert_eq!(kinds, [true, false, true, false]);
    }

    /// The failure policy answers only store failures; Redis's own
    /// decisions and other errors pass as they are; the recovery reports
    /// how many checks the policy answered.
    #[test]
    fn only_a_store_failure_reaches_the_failure_policy() {
        let (w, seen) = watched();
        let policy = |retry_in: Duration, cause: String| {
            assert_eq!(
                (retry_in, cause.as_str()),
                (Duration::from_millis(5), "refused")
            );
            Ok(RedisDecision {
                decision: Decision::allow(3, 1, 0),
                source: DecisionSource::Fallback,
            })
        };
        let unreached = |_: Duration, _: String| -> Result<RedisDecision, RedisError> {
            panic!("the failure policy answered a decision Redis made")
        };
        let d = settle(&w, Ok(redis(false)), unreached).unwrap();
        assert_eq!(d.source(), DecisionSource::Redis);
        assert!(!d.is_allowed());
        let e = settle(&w, Err(RedisError::NoRuntime), unreached);
        assert!(matches!(e, Err(RedisError::NoRuntime)));
        account(&[&w], &down());
        for _ in 0..3 {
            let got = down();
            let d = settle(&w, got, policy).unwrap();
            assert_eq!(d.source(), DecisionSource::Fallback);
        }
        account(&[&w], &Ok(()));
        let seen = seen.lock().unwrap();
        assert!(
            matches!(
                seen[..],
                [
                    StoreEvent::Failing { .. },
                    StoreEvent::Recovered {
                        answered_locally: 3,
                        ..
                    }
                ]
            ),
            "{seen:?}"
        );
    }

    /// The door is the only way: outside `door.rs` (and the watch itself,
    /// and the backend whose three calls are the door), no source file
    /// moves a watch, counts a decision, or calls the link.
    #[test]
    fn no_call_site_accounts_for_itself() {
        let forbidden = [
            "watch.answered",
            "watch().answered",
            "watch.failed",
            "watch().failed",
            "watch.decided",
            "watch().decided",
            "metrics().unavailable",
            "link.invoke(",
            "link.send(",
            "link.query(",
            "link.evalsha(",
        ];
        let allowed = ["door.rs", "events.rs", "backend.rs", "batch.rs"];
        let mut found = Vec::new();
        let mut dirs = vec![std::path::PathBuf::from(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/src"
        ))];
        let mut files = 0;
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    dirs.push(path);
                    continue;
                }
                let name = path.file_name().unwrap().to_string_lossy().into_owned();
                if !name.ends_with(".rs") || allowed.contains(&name.as_str()) {
                    continue;
                }
                files += 1;
                let text = std::fs::read_to_string(&path).unwrap();
                for (i, line) in text.lines().enumerate() {
                    let code = line.split("//").next().unwrap_or("");
                    for f in forbidden.iter().filter(|f| code.contains(*f)) {
                        found.push(format!("{}:{}: {f}", path.display(), i + 1));
                    }
                }
            }
        }
        assert!(files > 50, "the sources were not found ({files} files)");
        assert!(
            found.is_empty(),
            "accounting outside the door:\n{}",
            found.join("\n")
        );
    }
}
