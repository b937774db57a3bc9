//! The answer's `response_headers_to_add`, which Envoy adds to the
//! response its client gets: none (the default, as envoyproxy/ratelimit),
//! envoyproxy/ratelimit's three `RateLimit-Limit`/`-Remaining`/`-Reset`
//! fields of the most constrained descriptor, or the IETF `RateLimit` and
//! `RateLimit-Policy` fields (draft-ietf-httpapi-ratelimit-headers) with
//! one item per counted descriptor.

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus};
use ratewall::{Decision, Policy};

/// Which rate-limit fields the answer asks Envoy to add to the response.
///
/// ```
/// use ratewall_server::{ResponseHeaders, ServiceOptions};
///
/// let options = ServiceOptions::default().response_headers(ResponseHeaders::Ietf);
/// # let _ = options;
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum ResponseHeaders {
    /// None.
    #[default]
    Off,
    /// envoyproxy/ratelimit's (`LIMIT_RESPONSE_HEADERS_ENABLED`):
    /// `RateLimit-Limit`, `RateLimit-Remaining` and `RateLimit-Reset` (in
    /// seconds) of one descriptor: the one over its limit if any, else the
    /// one with the fewest remaining.
    Draft03,
    /// `RateLimit-Policy: "name";q=<limit>;w=<seconds>` and `RateLimit:
    /// "name";r=<remaining>;t=<seconds>`, one item per counted descriptor,
    /// as ratewall's HTTP layer writes them. A limit's name is its `name`,
    /// or else its stats key (`domain.key_value`).
    Ietf,
}

/// A counted descriptor, for its header items.
#[derive(Debug)]
pub(crate) struct Shown<'a> {
    pub(crate) name: &'a str,
    pub(crate) policy: Policy,
    pub(crate) decision: Decision,
}

/// A name as an RFC 9651 string's content: `"` and `\` and anything
/// outside printable ASCII become `_` (a name comes from the
/// configuration, and can never inject a field).
fn safe_name(name: &str) -> String {
    name.chars()
        .map(|c| match c {
            '"' | '\\' => '_',
            ' '..='~' => c,
            _ => '_',
        })
        .collect()
}

/// A duration's whole seconds, rounded up, at least 1.
fn ceil_secs(d: std::time::Duration) -> u64 {
    (d.as_secs() + u64::from(d.subsec_nanos() > 0)).max(1)
}

fn header(key: &str, value: String) -> HeaderValue {
    HeaderValue {
        key: key.to_owned(),
        value,
        ..HeaderValue::default()
    }
}

/// The fields `mode` asks for.
pub(crate) fn response_headers(
    mode: ResponseHeaders,
    shown: &[Shown<'_>],
    statuses: &[DescriptorStatus],
) -> Vec<HeaderValue> {
    match mode {
        ResponseHeaders::Off => Vec::new(),
        ResponseHeaders::Ietf => {
            if shown.is_empty() {
                return Vec::new();
            }
            let mut policy = String::new();
            let mut state = String::new();
            for s in shown {
                let name = safe_name(s.name);
                if !policy.is_empty() {
                    policy.push_str(", ");
                    state.push_str(", ");
                }
                policy.push_str(&format!(
                    "\"{name}\";q={};w={}",
                    s.policy.limit(),
                    ceil_secs(s.policy.span())
                ));
                // The name is safe: the item cannot be refused.
                state.push_str(
                    &s.decision
                        .ratelimit_header(&name, &s.policy)
                        .unwrap_or_default(),
                );
            }
            vec![
                header("RateLimit-Policy", policy),
                header("RateLimit", state),
            ]
        }
        ResponseHeaders::Draft03 => {
            // As envoyproxy/ratelimit picks: the last descriptor over its
            // limit, else the first with the fewest remaining.
            let mut pick: Option<&DescriptorStatus> = None;
            for s in statuses.iter().filter(|s| s.current_limit.is_some()) {
                let better = match pick {
                    None => true,
                    Some(p) if p.code == Code::OverLimit as i32 => s.code == Code::OverLimit as i32,
                    Some(p) => {
                        s.code == Code::OverLimit as i32 || s.limit_remaining < p.limit_remaining
                    }
                };
                if better {
                    pick = Some(s);
                }
            }
            let Some(s) = pick else { return Vec::new() };
            let limit = s.current_limit.as_ref().map_or(0, |l| l.requests_per_unit);
            let reset = s.duration_until_reset.map_or(0, |d| {
                u64::try_from(d.seconds).unwrap_or(0) + u64::from(d.nanos > 0)
            });
            vec![
                header("RateLimit-Limit", limit.to_string()),
                header("RateLimit-Remaining", s.limit_remaining.to_string()),
                header("RateLimit-Reset", reset.to_string()),
            ]
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::RateLimit;
    use envoy_types::pb::google::protobuf::Duration as PbDuration;
    use ratewall::{ManualClock, Rate, TokenBucket, Window};

    fn status(code: Code, limit: u32, remaining: u32, reset_ms: u64) -> DescriptorStatus {
        DescriptorStatus {
            code: code as i32,
            current_limit: Some(RateLimit {
                requests_per_unit: limit,
                ..RateLimit::default()
            }),
            limit_remaining: remaining,
            duration_until_reset: Some(PbDuration {
                seconds: (reset_ms / 1000) as i64,
                nanos: ((reset_ms % 1000) * 1_000_000) as i32,
            }),
            ..DescriptorStatus::default()
        }
    }

    fn values(h: &[HeaderValue]) -> Vec<(String, String)> {
        h.iter().map(|h| (h.key.clone(), h.value.clone())).collect()
    }

    #[test]
    fn draft03_shows_the_over_limit_descriptor_else_the_fewest_remaining() {
        let unlimited = DescriptorStatus::default();
        let a = status(Code::Ok, 10, 7, 1500);
        let b = status(Code::Ok, 5, 2, 30_000);
        let over = status(Code::OverLimit, 3, 0, 500);
        let got = response_headers(
            ResponseHeaders::Draft03,
            &[],
            &[unlimited.clone(), a.clone(), b.clone()],
        );
        assert_eq!(
            values(&got),
            [
                ("RateLimit-Limit".into(), "5".into()),
                ("RateLimit-Remaining".into(), "2".into()),
                ("RateLimit-Reset".into(), "30".into())
            ]
        );
        let got = response_headers(ResponseHeaders::Draft03, &[], &[over, a.clone(), b]);
        assert_eq!(values(&got)[0].1, "3");
        assert_eq!(values(&got)[2].1, "1", "500 ms rounds up");
        assert!(response_headers(ResponseHeaders::Draft03, &[], &[unlimited]).is_empty());
        assert!(response_headers(ResponseHeaders::Off, &[], &[a]).is_empty());
    }

    #[test]
    fn ietf_items_name_each_counted_limit_and_names_cannot_inject() {
        let rate = Rate::per_minute(60);
        let bucket = TokenBucket::with_clock(rate, ManualClock::new()).unwrap();
        let policy = Policy::token_bucket(rate);
        let window = Policy::fixed_window(Window::per_minute(10));
        let shown = [
            Shown {
                name: "edge.user",
                policy,
                decision: bucket.check(),
            },
            Shown {
                name: "bad\"name\r\nX: 1",
                policy: window,
                decision: bucket.check(),
            },
        ];
        let got = values(&response_headers(ResponseHeaders::Ietf, &shown, &[]));
        assert_eq!(got[0].0, "RateLimit-Policy");
        assert_eq!(
            got[0].1,
            "\"edge.user\";q=60;w=60, \"bad_name__X: 1\";q=10;w=60"
        );
        assert_eq!(got[1].0, "RateLimit");
        assert!(
            got[1]
                .1
                .starts_with("\"edge.user\";r=59;t=1, \"bad_name__X: 1\";r=58;"),
            "{}",
            got[1].1
        );
        assert!(!got.iter().any(|(_, v)| v.contains(['\r', '\n'])));
        assert!(response_headers(ResponseHeaders::Ietf, &[], &[]).is_empty());
    }
}
