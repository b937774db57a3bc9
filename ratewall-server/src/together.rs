//! All or nothing across a request's descriptors (an option, off by
//! default): each enforced descriptor's hits are taken from its limit, or
//! none are. envoyproxy/ratelimit counts each descriptor on its own, so a
//! request refused by one limit still spends the others; with this option a
//! refused request spends nothing, and a client hammering a limit it is
//! over does not drain its other limits.

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::DescriptorStatus;
use ratewall::redis::RedisLimiter;
use ratewall::{check_each, Decision, KeyedPolicyLimiter, Limit};

use crate::config::LimitKind;
use crate::service::RequestError;
use crate::store::{finish, looked, Counter, LimitState, Taken};

/// One enforced descriptor's share of an all-or-nothing check.
#[derive(Debug)]
pub(crate) struct Joint<'a> {
    /// The descriptor's position in the request.
    pub(crate) index: usize,
    pub(crate) state: &'a LimitState,
    pub(crate) counter: &'a Counter,
    pub(crate) key: &'a [u8],
    pub(crate) stats_key: &'a str,
    pub(crate) hits: u64,
}

/// What each joint descriptor answers, in the joint descriptors' order:
/// (position in the request, status, decision).
pub(crate) type Answers = Vec<(usize, DescriptorStatus, Option<Decision>)>;

/// Checks `joint` all or nothing; `refused` (a limit of 0 among the
/// request's enforced descriptors) refuses it before anything is taken.
/// A descriptor that another refused reports what it has left, uncounted.
pub(crate) async fn check(joint: &[Joint<'_>], refused: bool) -> Result<Answers, RequestError> {
    if joint.is_empty() {
        return Ok(Vec::new());
    }
    if refused {
        return peek_all(joint).await;
    }
    let memory: Vec<&KeyedPolicyLimiter<Vec<u8>>> = joint
        .iter()
        .filter_map(|j| match j.counter {
            Counter::Memory(l) => Some(l),
            Counter::Redis(_) => None,
        })
        .collect();
    // One store per server: all in memory, or all on Redis.
    let decided = if memory.len() == joint.len() {
        on_memory(joint, &memory)
    } else {
        on_redis(joint).await?
    };
    match decided {
        Ok((allowed, decisions)) => Ok(joint
            .iter()
            .zip(decisions)
            .map(|(j, d)| {
                let status = if allowed || !d.is_allowed() {
                    finish(j.state, Taken::Checked(Ok(d)), j.hits, j.stats_key)
                } else {
                    // Allowed by its limit, then given back: nothing is
                    // counted, and it has what it had before.
                    let mut s = looked(j.state, &d);
                    let before = d.remaining().saturating_add(j.hits).min(d.limit());
                    s.limit_remaining = u32::try_from(before).unwrap_or(u32::MAX);
                    s
                };
                (j.index, status, Some(d))
            })
            .collect()),
        // A cost one limit can never admit: that descriptor is over for
        // good, the others are untouched.
        Err(culprit) => {
            let mut out = peek_all(joint).await?;
            let j = &joint[culprit];
            let never = ratewall::InsufficientCapacity {
                requested: j.hits,
                capacity: capacity(j),
            };
            out[culprit] = (
                j.index,
                finish(j.state, Taken::Checked(Err(never)), j.hits, j.stats_key),
                None,
            );
            Ok(out)
        }
    }
}

fn capacity(j: &Joint) -> u64 {
    match j.state.def.kind {
        LimitKind::Limited { policy, .. } => policy.limit(),
        _ => 0,
    }
}

/// The first joint descriptor whose cost its limit can never admit.
fn culprit(joint: &[Joint<'_>]) -> usize {
    joint.iter().position(|j| j.hits > capacity(j)).unwrap_or(0)
}

fn on_memory(
    joint: &[Joint<'_>],
    memory: &[&KeyedPolicyLimiter<Vec<u8>>],
) -> Result<(bool, Vec<Decision>), usize> {
    let refs: Vec<_> = memory
        .iter()
        .zip(joint)
        .map(|(l, j)| l.with_key(j.key))
        .collect();
    let limits: Vec<(&dyn Limit<_>, u64)> = refs
        .iter()
        .zip(joint)
        .map(|(r, j)| (r as &dyn Limit<_>, j.hits))
        .collect();
    let mut decisions = vec![None; limits.len()];
    match check_each(&limits, &mut decisions) {
        Ok(allowed) => Ok((
            allowed,
            decisions
                .into_iter()
                .zip(memory.iter().zip(joint))
                // A limit the check did not reach: what it has left.
                .map(|(d, (l, j))| d.unwrap_or_else(|| l.peek_key(j.key)))
                .collect(),
        )),
        Err(_) => Err(culprit(joint)),
    }
}

async fn on_redis(
    joint: &[Joint<'_>],
) -> Result<Result<(bool, Vec<Decision>), usize>, RequestError> {
    let limits: Vec<(&RedisLimiter, &[u8], u64)> = joint
        .iter()
        .filter_map(|j| match j.counter {
            Counter::Redis(l) => Some((l, j.key, j.hits)),
            Counter::Memory(_) => None,
        })
        .collect();
    match ratewall::redis::check_all(&limits).await {
        Ok((allowed, decisions)) => Ok(Ok((
            allowed,
            decisions.iter().map(|d| d.decision()).collect(),
        ))),
        Err(ratewall::redis::RedisError::InsufficientCapacity(_)) => Ok(Err(culprit(joint))),
        Err(e) => Err(RequestError::StoreUnavailable {
            cause: e.to_string(),
        }),
    }
}

/// Every joint descriptor's standing, nothing taken or counted.
async fn peek_all(joint: &[Joint<'_>]) -> Result<Answers, RequestError> {
    let mut out = Vec::with_capacity(joint.len());
    for j in joint {
        let d = match j.counter {
            Counter::Memory(l) => l.peek_key(j.key),
            Counter::Redis(l) => l
                .peek_key(j.key)
                .await
                .map_err(|e| RequestError::StoreUnavailable {
                    cause: e.to_string(),
                })?
                .decision(),
        };
        out.push((j.index, looked(j.state, &d), Some(d)));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use crate::config::Config;
    use crate::{Service, ServiceOptions};
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
    use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;

    const YAML: &str = "domain: d\ndescriptors:\n  - key: one\n    rate_limit: { unit: hour, requests_per_unit: 1 }\n  - key: five\n    rate_limit: { unit: hour, requests_per_unit: 5 }\n  - key: none\n    rate_limit: { unit: hour, requests_per_unit: 0 }\n  - key: trial\n    shadow_mode: true\n    rate_limit: { unit: hour, requests_per_unit: 1 }\n";

    fn service(together: bool) -> Service {
        let config = Config::from_sources(&[("d.yaml".into(), YAML.into())]).unwrap();
        Service::new(config, ServiceOptions::default().all_or_nothing(together)).unwrap()
    }

    fn request(keys: &[(&str, u64)]) -> RateLimitRequest {
        RateLimitRequest {
            domain: "d".into(),
            descriptors: keys
                .iter()
                .map(|(k, hits)| RateLimitDescriptor {
                    entries: vec![Entry {
                        key: (*k).into(),
                        value: "v".into(),
                    }],
                    hits_addend: Some(envoy_types::pb::google::protobuf::UInt64Value {
                        value: *hits,
                    }),
                    ..RateLimitDescriptor::default()
                })
                .collect(),
            hits_addend: 0,
        }
    }

    /// (overall over?, each descriptor's code and remaining).
    async fn ask(s: &Service, keys: &[(&str, u64)]) -> (bool, Vec<(bool, u32)>) {
        let r = s.should_rate_limit(&request(keys)).await.unwrap();
        (
            r.overall_code == Code::OverLimit as i32,
            r.statuses
                .iter()
                .map(|s| (s.code == Code::OverLimit as i32, s.limit_remaining))
                .collect(),
        )
    }

    #[tokio::test]
    async fn a_refused_request_takes_nothing_from_the_other_limits() {
        for together in [false, true] {
            let s = service(together);
            assert_eq!(
                ask(&s, &[("one", 1), ("five", 1)]).await,
                (false, vec![(false, 0), (false, 4)])
            );
            let (over, got) = ask(&s, &[("one", 1), ("five", 1)]).await;
            assert!(over);
            assert!(got[0].0);
            // Counted on its own (the default), `five` spent one more;
            // all or nothing, it kept it (and says what it has left).
            let left = if together { 4 } else { 3 };
            assert_eq!(got[1], (false, left), "together {together}");
            assert_eq!(
                ask(&s, &[("five", 1)]).await.1[0],
                (false, left - 1),
                "together {together}"
            );
        }
    }

    #[tokio::test]
    async fn a_limit_of_zero_or_a_cost_never_admitted_refuses_before_anything_is_taken() {
        let s = service(true);
        let (over, got) = ask(&s, &[("none", 1), ("five", 2)]).await;
        assert!(over && got[0].0 && !got[1].0);
        let (over, got) = ask(&s, &[("five", 2), ("one", 2)]).await;
        assert!(over && !got[0].0 && got[1].0, "{got:?}");
        // Nothing was taken from `five` by either request.
        assert_eq!(ask(&s, &[("five", 1)]).await.1[0], (false, 4));
    }

    #[tokio::test]
    async fn shadow_limits_count_on_their_own_and_never_refuse() {
        let s = service(true);
        assert!(!ask(&s, &[("trial", 1), ("five", 1)]).await.0);
        // `trial` is over (shadow: OK), `five` still takes its hit.
        assert_eq!(
            ask(&s, &[("trial", 1), ("five", 1)]).await,
            (false, vec![(false, 0), (false, 3)])
        );
    }

    /// Quota mode (envoyproxy/ratelimit's): a quota-mode descriptor over its
    /// limit makes the answer over only when every quota-mode descriptor
    /// of the request is over; its own status says over either way.
    #[tokio::test]
    async fn quota_mode_descriptors_refuse_only_together() {
        let yaml = "domain: d\ndescriptors:\n  - key: q1\n    quota_mode: true\n    rate_limit: { unit: hour, requests_per_unit: 1 }\n  - key: q2\n    quota_mode: true\n    rate_limit: { unit: hour, requests_per_unit: 1 }\n";
        let config = Config::from_sources(&[("d.yaml".into(), yaml.into())]).unwrap();
        let s = Service::new(config, ServiceOptions::default()).unwrap();
        assert!(!ask(&s, &[("q1", 1)]).await.0);
        // The only quota descriptor, over: over.
        assert_eq!(ask(&s, &[("q1", 1)]).await, (true, vec![(true, 0)]));
        // One of two over: OK, though q1 says over.
        assert_eq!(
            ask(&s, &[("q1", 1), ("q2", 1)]).await,
            (false, vec![(true, 0), (false, 0)])
        );
        // Both over: over.
        assert!(ask(&s, &[("q1", 1), ("q2", 1)]).await.0);
    }
}
