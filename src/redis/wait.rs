//! Waiting on Redis limits (features `wait` and `redis`): a Redis check's
//! result is one try; a denial sleeps on its `retry_after`, a cost that can
//! never pass ends the wait at once, and any other Redis error is returned
//! as [`WaitError::Limiter`](crate::wait::WaitError::Limiter), never retried.

use super::{RedisDecision, RedisError};
use crate::wait::{Attempt, AttemptCore, Outcome, Token};

/// One Redis check (`RedisLimiter`, `RedisLeaseLimiter`,
/// `RedisElasticLimiter`'s `check_key`/`check_key_n`).
impl AttemptCore for Result<RedisDecision, RedisError> {}
impl Attempt for Result<RedisDecision, RedisError> {
    type Output = RedisDecision;
    type Error = RedisError;
    fn outcome(self, _: Token) -> Outcome<RedisDecision, RedisError> {
        match self {
            Ok(d) if d.is_allowed() => Outcome::Admitted(d),
            Ok(d) => Outcome::Denied(d.decision()),
            Err(RedisError::InsufficientCapacity(e)) => Outcome::Never(e),
            Err(e) => Outcome::Failed(e),
        }
    }
}

/// Redis' all-or-nothing [`check_all`](crate::redis::check_all): admitted
/// gives every limit's decision; a denial waits for the most restrictive one.
impl AttemptCore for Result<(bool, Vec<RedisDecision>), RedisError> {}
impl Attempt for Result<(bool, Vec<RedisDecision>), RedisError> {
    type Output = Vec<RedisDecision>;
    type Error = RedisError;
    fn outcome(self, _: Token) -> Outcome<Vec<RedisDecision>, RedisError> {
        match self {
            Ok((true, all)) => Outcome::Admitted(all),
            Ok((false, all)) => match all
                .iter()
                .filter(|d| !d.is_allowed())
                .max_by_key(|d| d.retry_after())
            {
                Some(d) => Outcome::Denied(d.decision()),
                // Denied with no denying limit: nothing says how long to
                // wait; the shortest wait a denial can report.
                None => Outcome::Denied(crate::decision::Decision::deny(0, 0, 1, 0)),
            },
            Err(RedisError::InsufficientCapacity(e)) => Outcome::Never(e),
            Err(e) => Outcome::Failed(e),
        }
    }
}
