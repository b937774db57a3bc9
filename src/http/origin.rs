//! Where a rule and the layer's settings were written: in Rust
//! (`Rule::..`, `RateLimitLayer::builder()`) or in a configuration file
//! (`LayerConfig`, features `tower` and `serde`). A message about a setting
//! names it as its reader wrote it: `Key::global()` to the one,
//! `key = "global"` to the other. The typed errors stay the same; only
//! their words follow the origin.

/// Where a rule or the layer's settings came from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) enum Origin {
    /// Made in Rust.
    #[default]
    Rust,
    /// Read from a configuration file (`LayerConfig::to_builder`).
    #[cfg_attr(not(feature = "serde"), allow(dead_code))]
    File,
}

/// One message in the words of each origin.
#[derive(Clone, Copy, Debug)]
pub(super) struct Said {
    /// For settings made in Rust: the API's names.
    pub(super) rust: &'static str,
    /// For settings read from a file: its fields and values.
    pub(super) file: &'static str,
}

impl Origin {
    /// The words of `said` for this origin.
    pub(super) fn pick(self, said: Said) -> &'static str {
        match self {
            Origin::Rust => said.rust,
            Origin::File => said.file,
        }
    }
}

/// Adaptive maximums, kept shares and request classes on a per-key
/// concurrency rule.
pub(super) const SHARED_ONLY: Said = Said {
    rust: "an adaptive maximum, kept shares and request classes apply to one limit shared by all requests: give the rule `Key::global()` (narrowed with `on_route` or `on_path_prefix`), or drop them from the per-key rule",
    file: "`adaptive`, `keep_for` and `priority_header` apply to one limit shared by all requests: set `key = \"global\"` (narrowed with `route` or `path_prefix`), or drop them from the per-key rule",
};

/// Concurrency settings on a rate rule.
pub(super) const CONCURRENCY_ONLY: Said = Said {
    rust: "`adaptive`, `keep_for`, `priority_by_header` and `release_permit` apply to concurrency rules only: make the rule with `Rule::concurrent`",
    file: "`adaptive`, `keep_for`, `priority_header` and `release_permit` apply to concurrency rules only: give the rule `concurrent = N` instead of `policy`",
};

/// Settings of a local concurrency limit on a Redis concurrency rule.
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
pub(super) const LOCAL_ONLY: Said = Said {
    rust: "an adaptive maximum, kept shares, request classes and `release_permit` apply to local concurrency rules only: drop them from the Redis concurrency rule, or make it with `Rule::concurrent`",
    file: "`adaptive`, `keep_for`, `priority_header` and `release_permit` apply to local concurrency rules only: drop them from the rule, or set `store = \"local\"`",
};

/// Shadow mode on a concurrency rule.
pub(super) const NO_SHADOW: Said = Said {
    rust: "a concurrency rule cannot be in shadow mode (`Mode::Shadow`): a dry run would have to hold permits it never enforces; enforce it with a high maximum instead",
    file: "a concurrency rule cannot have `mode = \"shadow\"`: a dry run would have to hold permits it never enforces; enforce it with a high `concurrent` instead",
};

/// Rate-rule settings on a concurrency rule.
pub(super) const RATE_ONLY: Said = Said {
    rust: "`count_failures_only`, `count_refused`, tiers and `block_for` apply to rate rules only: put them on a rate rule beside the concurrency rule",
    file: "`count_failures_only`, `count_refused`, `tiers` and `block_for` apply to rate rules only: put them on a rule with a `policy` beside the concurrency rule",
};

/// The warning when `X-Forwarded-For` comes while no proxy is trusted.
pub(super) const XFF_UNTRUSTED: Said = Said {
    rust: "X-Forwarded-For seen while no proxy is trusted: the TCP peer is the client. \
           Behind a proxy, configure `ClientIp::behind_proxies` or `ClientIp::behind_hops`",
    file: "X-Forwarded-For seen while no proxy is trusted: the TCP peer is the client. \
           Behind a proxy, set `trusted_proxies = [\"10.0.0.0/8\"]` (the proxies' networks) \
           or `trusted_hops = N` with `trusted_peers`",
};

/// The warning when a hop count believes every peer.
pub(super) const HOPS_FROM_ANY_PEER: Said = Said {
    rust: "`ClientIp::behind_hops` without `from_peers` believes X-Forwarded-For from every \
           peer: a client that reaches the server directly can write any address (another \
           client's key, an allowed network). Name the proxies with \
           `ClientIp::behind_hops(n).from_peers(..)` unless only they can connect",
    file: "`trusted_hops` without `trusted_peers` believes X-Forwarded-For from every \
           peer: a client that reaches the server directly can write any address (another \
           client's key, an allowed network). Name the proxies with \
           `trusted_peers = [\"10.0.0.0/8\"]` unless only they can connect",
};

#[cfg(test)]
mod tests {
    use super::*;

    /// The file's words name no Rust API, and the Rust words no field
    /// assignment: each reader is told what they wrote.
    #[test]
    fn each_origin_gets_its_own_words() {
        for said in [
            SHARED_ONLY,
            CONCURRENCY_ONLY,
            LOCAL_ONLY,
            NO_SHADOW,
            RATE_ONLY,
            XFF_UNTRUSTED,
            HOPS_FROM_ANY_PEER,
        ] {
            let file = Origin::File.pick(said);
            assert!(!file.contains("::") && !file.contains("Rule::"), "{file}");
            let rust = Origin::Rust.pick(said);
            assert!(!rust.contains(" = \""), "{rust}");
        }
    }
}
