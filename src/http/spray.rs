//! A rule's tables against a client that sprays keys: the build's warning
//! when a rule's table rejects new keys and is cheap to fill (a rule's
//! table evicts by default, [`WhenFull::EvictLeastRecent`], set in
//! `Rule::new`), and the lockout table's own size and policy
//! ([`Rule::lockout_max_keys`]). `docs/http.md`, "Key spraying and full
//! tables", gives what a spray costs under each policy.

use super::origin::Origin;
use super::rule::{Mode, Rule};
use crate::keyed::{TableOptions, WhenFull};
use crate::policy::{Policy, PolicyAlgorithm};
use crate::wording::plural;
use std::time::Duration;

/// Requests a second: a table that rejects new keys and that a client can
/// keep full with fewer requests than this (`max_keys` per the time one
/// request keeps a key active) gets a warning when the layer is built.
pub(super) const SPRAY_WARN_RATE: u128 = 10_000;

/// The least size of a lockout table when [`Rule::lockout_max_keys`] is
/// not given: the keyed tables' default `max_keys`.
pub(super) const LOCKOUT_MIN_KEYS: usize = 1 << 16;

/// How long one request keeps a new key active under `policy` (its time
/// to idle): one emission interval for a bucket, until the window's end
/// for a fixed window (at most its length), two windows for the sliding
/// counter (a count weighs on the next window), one for the sliding log.
pub(super) fn one_request_keeps(policy: &Policy) -> Duration {
    let span = policy.span();
    match policy.algorithm() {
        PolicyAlgorithm::TokenBucket | PolicyAlgorithm::LeakyBucket => {
            // Never 0: `validate` refuses a zero burst.
            let per = span.as_nanos() / u128::from(policy.limit().max(1));
            Duration::from_nanos(u64::try_from(per).unwrap_or(u64::MAX))
        }
        PolicyAlgorithm::SlidingWindowCounter => span.saturating_mul(2),
        _ => span,
    }
}

/// The build's warning for a rule whose table rejects new keys when full
/// ([`WhenFull::RejectNew`], the keyed tables' own default, chosen by
/// [`Rule::when_full`] or a [`Rule::table`]), enforced, local, keyed by
/// something a client picks, and cheap to fill: `max_keys` requests every
/// time one request keeps a key active, below [`SPRAY_WARN_RATE`] a
/// second. `None` otherwise. The choice stands; the warning says its cost.
pub(super) fn spray_warning(rule: &Rule, local: bool) -> Option<String> {
    if !local
        || rule.mode != Mode::Enforce
        || rule.concurrency.is_some()
        || rule.table.when_full != WhenFull::RejectNew
        || !rule.key.client_sprays()
    {
        return None;
    }
    let keeps = std::iter::once(&rule.policy)
        .chain(rule.tiers.list.iter().map(|(_, p)| p))
        .map(one_request_keeps)
        .max()?;
    let keys = rule.table.max_keys as u128;
    // Requests a second that keep the table full: keys per `keeps`.
    if keys.saturating_mul(1_000_000_000) >= SPRAY_WARN_RATE.saturating_mul(keeps.as_nanos()) {
        return None;
    }
    let (reject, evict) = match rule.origin {
        Origin::Rust => ("`WhenFull::RejectNew`", "`WhenFull::EvictLeastRecent`"),
        Origin::File => (
            "`when_full = \"reject-new\"`",
            "`when_full = \"evict-least-recent\"`",
        ),
    };
    let requests = plural(u64::try_from(keys).unwrap_or(u64::MAX), "request");
    Some(format!(
        "rule {:?} (key {:?}) rejects new keys when its table is full ({reject}): \
         {requests} with new keys, each active for {keeps:?}, fill it, and every new client \
         then gets 429 until they go idle; use {evict} (the default: a \
         spray evicts its own keys first) or a larger `max_keys` (docs/http.md, \"Key spraying \
         and full tables\")",
        rule.name, rule.key
    ))
}

/// The lockout table of `rule`: [`Rule::lockout_max_keys`] blocks, by
/// default as many as the rule's table holds but at least
/// [`LOCKOUT_MIN_KEYS`]; when full of live blocks, a new block evicts the
/// one of its neighbours that ends soonest (a block's time to idle is the
/// time to its end), so a breach is always blocked. The rule's seed, if
/// fixed, is the lockout table's too.
pub(super) fn lockout_table(rule: &Rule) -> TableOptions {
    let blocks = rule
        .lockout_max_keys
        .unwrap_or(rule.table.max_keys.max(LOCKOUT_MIN_KEYS));
    let table = TableOptions::new()
        .max_keys(blocks)
        .when_full(WhenFull::EvictLeastRecent);
    match rule.table.seed {
        Some(seed) => table.seed(seed),
        None => table,
    }
}

impl Rule {
    /// The most live blocks of this rule's lockout ([`block_for`](Self::block_for))
    /// tracked at once: by default the rule's [`max_keys`](Self::max_keys),
    /// and at least 65,536. The lockout table is the rule's own, apart from
    /// the rule's limit table: when it is full of live blocks, a new breach
    /// is still blocked, and the block that ends soonest among its
    /// neighbours ends early (the breach whose block has the least time
    /// left). Filling it takes `lockout_max_keys` distinct keys breaching
    /// the rule within `block_for`, `limit + 1` requests each (see
    /// `docs/http.md`, "Lockouts"). 0 or more than
    /// [`MAX_KEYS`](crate::MAX_KEYS) is
    /// [`HttpConfigError::InvalidValue`](super::HttpConfigError::InvalidValue)
    /// when the layer is built.
    ///
    /// ```
    /// use ratewall::http::{RateLimitLayer, Rule};
    /// use ratewall::{Policy, Window};
    /// use std::time::Duration;
    ///
    /// let login = Rule::per_ip("login", Policy::sliding_window_log(Window::per_minute(5)))
    ///     .block_for(Duration::from_secs(15 * 60))
    ///     .lockout_max_keys(1 << 20);
    /// let layer = RateLimitLayer::builder().rule(login).build()?;
    /// # let _ = layer;
    /// # Ok::<(), ratewall::http::HttpConfigError>(())
    /// ```
    pub fn lockout_max_keys(mut self, blocks: usize) -> Rule {
        self.lockout_max_keys = Some(blocks);
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quota::{Rate, Window};

    fn daily_header(when_full: Option<WhenFull>) -> Rule {
        let day = Window::new(1000, Duration::from_secs(86_400));
        let rule = Rule::per_header("key", "x-api-key", Policy::fixed_window(day));
        match when_full {
            Some(w) => rule.when_full(w),
            None => rule,
        }
    }

    #[test]
    fn client_picked_keys_evict_by_default() {
        for rule in [
            daily_header(None),
            Rule::per_ip("ip", Policy::token_bucket(Rate::per_minute(100))),
            Rule::per_route("route", Policy::fixed_window(Window::per_minute(100))),
        ] {
            assert_eq!(rule.table.when_full, WhenFull::EvictLeastRecent, "{rule:?}");
            assert_eq!(spray_warning(&rule, true), None, "{rule:?}");
        }
    }

    #[test]
    fn reject_new_on_a_long_window_warns_and_names_the_cost() {
        let w = spray_warning(&daily_header(Some(WhenFull::RejectNew)), true).expect("warns");
        assert!(
            w.contains("RejectNew") && w.contains("65536 requests"),
            "{w}"
        );
        // A rule read from a file is told in the file's words.
        let mut from_file = daily_header(Some(WhenFull::RejectNew));
        from_file.origin = Origin::File;
        let f = spray_warning(&from_file, true).expect("warns");
        assert!(
            f.contains("`when_full = \"reject-new\"`")
                && f.contains("`when_full = \"evict-least-recent\"`")
                && !f.contains("WhenFull::"),
            "{f}"
        );
        // Not for Redis rules (no table), shadow rules (never deny), or an
        // extension key (the application picks its values).
        assert_eq!(
            spray_warning(&daily_header(Some(WhenFull::RejectNew)), false),
            None
        );
        let shadow = daily_header(Some(WhenFull::RejectNew)).mode(Mode::Shadow);
        assert_eq!(spray_warning(&shadow, true), None);
        #[derive(Hash)]
        struct User(u64);
        let user = Rule::per_extension::<User>("user", Policy::fixed_window(Window::per_hour(9)))
            .when_full(WhenFull::RejectNew);
        assert_eq!(spray_warning(&user, true), None);
    }

    #[test]
    fn the_warning_follows_the_cost_of_keeping_the_table_full() {
        // 65,536 keys a second under a 1/s-refill bucket: above the rate,
        // no warning; a bucket of 100/min keeps a key 600 ms: 109,227/s.
        let ip = |p| Rule::per_ip("ip", p).when_full(WhenFull::RejectNew);
        assert_eq!(
            spray_warning(&ip(Policy::token_bucket(Rate::per_minute(100))), true),
            None
        );
        // One request a minute keeps a key for a minute: 1,092/s.
        assert!(spray_warning(&ip(Policy::token_bucket(Rate::per_minute(1))), true).is_some());
        // A bigger table costs more to fill: 2^24 keys a minute, 279,620/s.
        let big = ip(Policy::token_bucket(Rate::per_minute(1))).max_keys(1 << 24);
        assert_eq!(spray_warning(&big, true), None);
        // A sliding counter keeps a key two windows.
        let one_sec = Policy::sliding_window_counter(Window::per_second(5));
        assert_eq!(one_request_keeps(&one_sec), Duration::from_secs(2));
    }

    #[test]
    fn the_lockout_table_is_its_own() {
        let small = daily_header(Some(WhenFull::RejectNew)).max_keys(8);
        let t = lockout_table(&small);
        assert_eq!(
            (t.max_keys, t.when_full),
            (LOCKOUT_MIN_KEYS, WhenFull::EvictLeastRecent)
        );
        let big = small.clone().max_keys(1 << 20);
        assert_eq!(lockout_table(&big).max_keys, 1 << 20);
        assert_eq!(lockout_table(&small.lockout_max_keys(3)).max_keys, 3);
    }

    #[test]
    fn a_lockout_table_of_no_blocks_is_a_typed_error() {
        use super::super::{HttpConfigError, RateLimitLayer};
        for bad in [0, crate::keyed::MAX_KEYS + 1] {
            let rule = daily_header(None)
                .block_for(Duration::from_secs(60))
                .lockout_max_keys(bad);
            let err = RateLimitLayer::builder().rule(rule).build().unwrap_err();
            assert!(
                matches!(
                    err,
                    HttpConfigError::InvalidValue {
                        field: "lockout_max_keys",
                        ..
                    }
                ),
                "{err:?}"
            );
        }
    }
}
