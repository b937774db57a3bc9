//! The decisions extension: each matching rule's decision, put into the
//! request for handlers when
//! [`RateLimitBuilder::decisions_extension`](super::RateLimitBuilder::decisions_extension)
//! is on.

use super::compiled::{Entry, INLINE_RULES};
use crate::decision::Decision;
#[cfg(feature = "redis")]
use crate::redis::DecisionSource;
use smallvec::SmallVec;
use std::fmt;
use std::sync::Arc;

/// The per-rule decisions of an admitted request, for handlers (turn on
/// with [`RateLimitBuilder::decisions_extension`](super::RateLimitBuilder::decisions_extension)).
///
/// ```
/// use axum::Extension;
/// use ratewall::http::RateLimitInfo;
///
/// async fn handler(Extension(info): Extension<RateLimitInfo>) -> String {
///     match info.get("ip") {
///         Some(d) => format!("{} left", d.remaining()),
///         None => "unlimited".into(),
///     }
/// }
/// # let _ = handler;
/// ```
#[derive(Clone)]
pub struct RateLimitInfo {
    names: Arc<[Box<str>]>,
    entries: SmallVec<[(u16, Decision); INLINE_RULES]>,
    /// Where the Redis rules' decisions came from.
    #[cfg(feature = "redis")]
    pub(super) sources: Vec<(u16, DecisionSource)>,
}

impl RateLimitInfo {
    /// The decisions of a request's entries (rules with none left out),
    /// with no Redis sources yet.
    pub(super) fn of(names: &Arc<[Box<str>]>, entries: &[Entry]) -> RateLimitInfo {
        RateLimitInfo {
            names: names.clone(),
            entries: entries
                .iter()
                .filter_map(|e| Some((e.rule, e.decision?)))
                .collect(),
            #[cfg(feature = "redis")]
            sources: Vec::new(),
        }
    }

    /// The decision of the rule named `name`, if it matched the request.
    ///
    /// ```
    /// # fn f(info: &ratewall::http::RateLimitInfo) { let _ = info.get("ip"); }
    /// ```
    pub fn get(&self, name: &str) -> Option<Decision> {
        self.iter().find(|(n, _)| *n == name).map(|(_, d)| d)
    }

    /// Where the decision of the Redis rule named `name` came from (Redis,
    /// the deny cache, the local fallback, or fail-open); `None` for a
    /// local rule or a rule that did not match (features `tower` and
    /// `redis`).
    ///
    /// ```
    /// use ratewall::http::RateLimitInfo;
    /// use ratewall::redis::DecisionSource;
    ///
    /// fn degraded(info: &RateLimitInfo) -> bool {
    ///     matches!(info.source("ip"), Some(DecisionSource::Fallback | DecisionSource::FailOpen))
    /// }
    /// # let _ = degraded;
    /// ```
    #[cfg(feature = "redis")]
    pub fn source(&self, name: &str) -> Option<DecisionSource> {
        self.sources
            .iter()
            .find(|(i, _)| &*self.names[usize::from(*i)] == name)
            .map(|&(_, s)| s)
    }

    /// Every matching rule's name and decision, in rule order.
    ///
    /// ```
    /// # fn f(info: &ratewall::http::RateLimitInfo) { for (name, d) in info.iter() { let _ = (name, d.remaining()); } }
    /// ```
    pub fn iter(&self) -> impl Iterator<Item = (&str, Decision)> + '_ {
        self.entries
            .iter()
            .map(|(i, d)| (&*self.names[usize::from(*i)], *d))
    }
}

impl fmt::Debug for RateLimitInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}
