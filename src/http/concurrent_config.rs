//! A [`RuleConfig`]'s concurrency fields (features `tower` and `serde`):
//! `concurrent = N` instead of `policy` makes a concurrency rule
//! ([`Rule::concurrent`]); `adaptive`, `keep_for`, `priority_header` and
//! `release_permit` apply to it only. Each bad value is an [`HttpConfigError`] naming the
//! rule and the field.

use super::builder::HttpConfigError;
use super::concurrent::PermitRelease;
use super::config::{Backend, RuleConfig};
use super::key::Key;
use super::rule::Rule;
use crate::concurrency::{Adaptive, Priority};
use crate::policy::Policy;
use http::header::HeaderName;

const ADAPTIVE: &str = "`vegas FLOOR..CEILING` or `aimd FLOOR..CEILING LATENCY`, optionally \
                        followed by `backoff RATIO` (`aimd 4..200 50ms backoff 0.8`)";

impl RuleConfig {
    /// The rate rule's policy, or `None` for a concurrency rule; a rule
    /// with both or neither is an error.
    pub(super) fn rate_policy(&self) -> Result<Option<Policy>, HttpConfigError> {
        match (self.concurrent, self.policy.is_empty()) {
            (Some(_), true) => return Ok(None),
            (Some(max), false) => {
                return Err(self.bad(
                    "concurrent",
                    &max.to_string(),
                    "either `policy` (a rate rule) or `concurrent` (a concurrency rule), not both: make two rules",
                ))
            }
            (None, true) => {
                return Err(self.bad(
                    "policy",
                    "",
                    "a policy such as `100/min`, or `concurrent = N` for a concurrency rule",
                ))
            }
            (None, false) => {}
        }
        let only = [
            ("adaptive", self.adaptive.clone()),
            ("priority_header", self.priority_header.clone()),
            ("release_permit", self.release_permit.clone()),
            (
                "keep_for",
                (!self.keep_for.is_empty()).then(|| format!("{:?}", self.keep_for)),
            ),
        ];
        if let Some((field, Some(value))) = only.iter().find(|(_, v)| v.is_some()) {
            return Err(self.bad(
                field,
                value,
                "`concurrent = N` too: only a concurrency rule takes it",
            ));
        }
        self.policy
            .parse()
            .map(Some)
            .map_err(|error| HttpConfigError::PolicyText {
                rule: self.name.clone(),
                error,
            })
    }

    /// The concurrency rule of `key` with its concurrency fields; the
    /// fields every rule shares are applied after.
    pub(super) fn concurrency_rule(
        &self,
        key: Key,
        in_redis: bool,
        redis: Option<&Backend>,
    ) -> Result<Rule, HttpConfigError> {
        let max = self.concurrent.unwrap_or(0);
        let mut rule = if in_redis {
            self.redis_concurrency_rule(key, max, redis)?
        } else {
            Rule::concurrent(self.name.clone(), key, max)
        };
        if let Some(text) = &self.adaptive {
            let a = parse_adaptive(text).ok_or_else(|| self.bad("adaptive", text, ADAPTIVE))?;
            rule = rule.adaptive(a);
        }
        for (class, &pct) in &self.keep_for {
            let p = parse_class(class).ok_or_else(|| {
                self.bad(
                    "keep_for",
                    class,
                    "classes `critical` and `normal` with a percent each, `{ critical = 20 }`",
                )
            })?;
            rule = rule.keep_for(p, pct);
        }
        if let Some(h) = &self.priority_header {
            HeaderName::from_bytes(h.as_bytes()).map_err(|_| {
                self.bad("priority_header", h, "a header name such as `x-priority`")
            })?;
            rule = rule.priority_by_header(h);
        }
        if let Some(text) = &self.release_permit {
            let when = match text.as_str() {
                "body-end" => PermitRelease::BodyEnd,
                "response-head" => PermitRelease::ResponseHead,
                _ => {
                    return Err(self.bad(
                        "release_permit",
                        text,
                        "`body-end` (the default) or `response-head`",
                    ))
                }
            };
            rule = rule.release_permit(when);
        }
        Ok(rule)
    }
}

impl RuleConfig {
    /// A concurrency rule with `store = "redis"`: a
    /// [`Rule::redis_concurrent`] on the layer's Redis backend, its limiter
    /// named after the rule (`on_failure` and `redis_prefix` as for a Redis
    /// rate rule; `fallback POLICY` is not offered for permits).
    #[cfg(feature = "redis")]
    fn redis_concurrency_rule(
        &self,
        key: Key,
        max: u64,
        redis: Option<&Backend>,
    ) -> Result<Rule, HttpConfigError> {
        use crate::redis::{FailurePolicy, RedisConcurrencyLimiter};
        let (backend, failure) = self.redis_settings(redis)?;
        if let FailurePolicy::Fallback(_) = failure {
            let text = self.on_failure.as_deref().unwrap_or_default();
            return Err(self.bad(
                "on_failure",
                text,
                "`open`, `closed` or `fallback-share N` for a concurrency rule (a rate policy cannot hold permits)",
            ));
        }
        if let Some(n) = self.deny_cache {
            return Err(self.bad(
                "deny_cache",
                &n.to_string(),
                "nothing on a concurrency rule (leave the field out)",
            ));
        }
        let mut b = RedisConcurrencyLimiter::builder(max, backend)
            .name(self.name.clone())
            .on_failure(failure);
        if let Some(prefix) = &self.redis_prefix {
            b = b.prefix(prefix.clone());
        }
        let limiter = b.build().map_err(|error| HttpConfigError::Redis {
            rule: self.name.clone(),
            error,
        })?;
        Ok(Rule::redis_concurrent(key, limiter))
    }

    #[cfg(not(feature = "redis"))]
    fn redis_concurrency_rule(
        &self,
        _key: Key,
        _max: u64,
        _redis: Option<&Backend>,
    ) -> Result<Rule, HttpConfigError> {
        Err(HttpConfigError::RedisFeatureMissing {
            rule: self.name.clone(),
        })
    }
}

/// A request class by name (`sheddable` too: keeping a share for it is a
/// build error that says why).
fn parse_class(text: &str) -> Option<Priority> {
    [
        ("critical", Priority::Critical),
        ("normal", Priority::Normal),
        ("sheddable", Priority::Sheddable),
    ]
    .into_iter()
    .find(|(w, _)| text.trim().eq_ignore_ascii_case(w))
    .map(|(_, p)| p)
}

/// `vegas FLOOR..CEILING` or `aimd FLOOR..CEILING LATENCY [backoff R]`.
fn parse_adaptive(text: &str) -> Option<Adaptive> {
    let words: Vec<&str> = text.split_whitespace().collect();
    let (floor, ceiling) = words.get(1)?.split_once("..")?;
    let (floor, ceiling) = (floor.parse().ok()?, ceiling.parse().ok()?);
    let algorithm = words.first()?.to_ascii_lowercase();
    let (a, rest) = match algorithm.as_str() {
        "vegas" => (Adaptive::vegas(floor, ceiling), &words[2..]),
        "aimd" => {
            let latency = crate::text::duration(words.get(2)?).ok()?;
            (Adaptive::aimd(floor, ceiling, latency), &words[3..])
        }
        _ => return None,
    };
    match rest {
        [] => Some(a),
        [b, ratio] if algorithm == "aimd" && b.eq_ignore_ascii_case("backoff") => {
            Some(a.backoff(ratio.parse().ok()?))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn adaptive_texts_parse_strictly() {
        assert_eq!(
            parse_adaptive("vegas 4..200"),
            Some(Adaptive::vegas(4, 200))
        );
        assert_eq!(
            parse_adaptive("AIMD 2..50 40ms backoff 0.5"),
            Some(Adaptive::aimd(2, 50, Duration::from_millis(40)).backoff(0.5))
        );
        assert_eq!(
            parse_adaptive("aimd 2..50 1s"),
            Some(Adaptive::aimd(2, 50, Duration::from_secs(1)))
        );
        for bad in [
            "",
            "vegas",
            "vegas 4",
            "vegas 4..",
            "vegas 4..x",
            "vegas 4..200 backoff 0.5",
            "aimd 2..50",
            "aimd 2..50 fast",
            "aimd 2..50 40ms backoff",
            "aimd 2..50 40ms backoff half",
            "gradient 2..50",
        ] {
            assert_eq!(parse_adaptive(bad), None, "{bad}");
        }
        assert_eq!(parse_class(" Critical "), Some(Priority::Critical));
        assert_eq!(parse_class("urgent"), None);
    }
}
