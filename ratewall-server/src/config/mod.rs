//! The service's configuration: envoyproxy/ratelimit's YAML, read
//! unchanged, plus ratewall's `policy` extension.
//!
//! (Interface only: the loader and the matcher are being written.)

use std::fmt;
use std::path::Path;
use std::sync::Arc;

use ratewall::Policy;

/// A time unit of envoyproxy/ratelimit's `rate_limit.unit`, as the
/// protocol's `RateLimitResponse.RateLimit.Unit` names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Unit {
    /// `second`
    Second,
    /// `minute`
    Minute,
    /// `hour`
    Hour,
    /// `day`
    Day,
    /// `week`
    Week,
    /// `month`
    Month,
    /// `year`
    Year,
    /// A `policy` whose period is none of the units (`"7/90s"`).
    Unknown,
}

/// What a limit does to a matching descriptor.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum LimitKind {
    /// `unlimited: true`: always OK, never counted.
    Unlimited,
    /// Counted by `policy`; `requests_per_unit` and `unit` are what the
    /// answer's `current_limit` reports.
    Limited {
        /// The algorithm and its quota (a fixed window for `unit` +
        /// `requests_per_unit`, as envoyproxy/ratelimit counts).
        policy: Policy,
        /// The answer's `current_limit.requests_per_unit`.
        requests_per_unit: u32,
        /// The answer's `current_limit.unit`.
        unit: Unit,
    },
}

/// One configured limit: a descriptor node's `rate_limit`.
#[derive(Debug)]
#[non_exhaustive]
pub struct LimitDef {
    /// The same for a limit that did not change across a reload (domain,
    /// descriptor path and every setting): its counters are kept.
    pub id: String,
    /// envoyproxy/ratelimit's key for the limit's stats: `domain.key_value.key`.
    pub full_key: String,
    /// Unlimited or counted.
    pub kind: LimitKind,
    /// `rate_limit.name`.
    pub name: Option<String>,
    /// `rate_limit.replaces[].name`.
    pub replaces: Vec<String>,
    /// `shadow_mode`: counted, reported, never enforced.
    pub shadow_mode: bool,
    /// `detailed_metric`: stats per descriptor value.
    pub detailed_metric: bool,
}

/// A descriptor's limit and which of its counters it takes.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Found {
    /// The limit.
    pub limit: Arc<LimitDef>,
    /// The counter within the limit: the descriptor's entries as matched
    /// (a wildcard with `share_threshold` names the pattern, not the value).
    pub counter_key: Vec<u8>,
    /// The stats key of this descriptor (values included when the limit
    /// has `detailed_metric`, `value_to_metric` applied).
    pub stats_key: String,
}

/// A configuration that cannot be loaded: which file, line and field, and
/// what to change.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ConfigError {
    /// The file, as given.
    pub file: String,
    /// 1-based; 0 when the error is about the file as a whole.
    pub line: usize,
    /// The field (`rate_limit.unit`), or empty.
    pub field: String,
    /// What is wrong and what to change.
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}: ", self.file, self.line)?;
        if !self.field.is_empty() {
            write!(f, "`{}`: ", self.field)?;
        }
        f.write_str(&self.message)
    }
}

impl std::error::Error for ConfigError {}

/// The loaded configuration: every domain's descriptor tree.
#[derive(Debug, Default)]
pub struct Config {
    _private: (),
}

impl Config {
    /// Reads every YAML file (`*.yaml`, `*.yml`) in `dir`.
    pub fn load_dir(dir: &Path) -> Result<Config, ConfigError> {
        let _ = dir;
        unimplemented!("being written")
    }

    /// Loads `(file name, text)` pairs.
    pub fn from_sources(files: &[(String, String)]) -> Result<Config, ConfigError> {
        let _ = files;
        unimplemented!("being written")
    }

    /// Every limit, unlimited ones included.
    pub fn limits(&self) -> Vec<Arc<LimitDef>> {
        Vec::new()
    }

    /// The limit for one descriptor of `domain` (envoyproxy/ratelimit's
    /// `GetLimit`), `limit_override` being the descriptor's own `limit`.
    pub fn find(
        &self,
        domain: &str,
        entries: &[(&str, &str)],
        limit_override: Option<(u32, Unit)>,
    ) -> Option<Found> {
        let _ = (domain, entries, limit_override);
        None
    }
}

/// Drops the limits that another matched limit of the same request
/// `replaces` (by name).
pub fn apply_replaces(found: &mut [Option<Found>]) {
    let _ = found;
}
