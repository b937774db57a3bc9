//! The service's configuration: envoyproxy/ratelimit's YAML, read
//! unchanged, plus ratewall's `policy` extension.
//!
//! A configuration is a set of files; each names a `domain` and a tree of
//! descriptors. [`Config::find`] walks one domain's tree with a request's
//! descriptor, as envoyproxy/ratelimit's `GetLimit` does: at each level the
//! exact `key_value` first, then the value wildcards (`*`, in the order
//! written), then the bare `key`. A limit applies only when every entry of
//! the descriptor matched a level and the last level has a `rate_limit`.
//!
//! ```
//! use ratewall_server::config::{Config, LimitKind, Unit};
//!
//! let yaml = r#"
//! domain: edge
//! descriptors:
//!   - key: remote_address
//!     rate_limit: { unit: second, requests_per_unit: 10 }
//!   - key: remote_address
//!     value: 50.0.0.5
//!     rate_limit: { unit: second, requests_per_unit: 0 }
//! "#;
//! let config = Config::from_sources(&[("edge.yaml".into(), yaml.into())])?;
//! let found = config.find("edge", &[("remote_address", "50.0.0.1")], None).unwrap();
//! assert!(matches!(found.limit.kind, LimitKind::Limited { requests_per_unit: 10, unit: Unit::Second, .. }));
//! assert_eq!(found.stats_key, "edge.remote_address");
//! let blocked = config.find("edge", &[("remote_address", "50.0.0.5")], None).unwrap();
//! assert_eq!(blocked.limit.kind, LimitKind::Blocked { unit: Unit::Second });
//! # Ok::<(), ratewall_server::config::ConfigError>(())
//! ```
//!
//! Where this loader differs from envoyproxy/ratelimit, it is stricter, and
//! the error says what to change:
//! - a field that envoyproxy/ratelimit knows but ignores where it stands
//!   (`shadow_mode` inside `rate_limit`) is an error here;
//! - `rate_limit` without `requests_per_unit` is an error (the Go service
//!   reads it as 0, which blocks every request; write `0` to mean that);
//! - a second, non-empty YAML document in a file is an error (the Go
//!   service ignores it).
//!
//! And one place where it is more lenient: a text field written as a
//! decimal number (`value: 1.5`) is read as its text; the Go service
//! refuses floating-point scalars outside `metadata`.
//!
//! Scalars are read as Go's yaml.v2 reads them into envoyproxy/ratelimit's
//! fields: a text field takes the scalar as written (`value: 007` is
//! `"007"`), a flag takes YAML 1.1's booleans (`yes`, `on`, `true`, …), a
//! count YAML 1.1's integers (`0x10`, `010` octal, `1_000`).

mod matcher;
mod yaml;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_errors;
#[cfg(test)]
mod tests_more;

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use ratewall::{Policy, Rate, Window};

use matcher::Node;

/// A time unit of envoyproxy/ratelimit's `rate_limit.unit`, as the
/// protocol's `RateLimitResponse.RateLimit.Unit` names them.
///
/// ```
/// use ratewall_server::config::Unit;
/// use std::time::Duration;
///
/// assert_eq!(Unit::from_name("Minute"), Some(Unit::Minute));
/// assert_eq!(Unit::Month.length(), Some(Duration::from_secs(30 * 86_400)));
/// assert_eq!(Unit::Unknown.length(), None);
/// ```
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
    /// `month` (30 days, as envoyproxy/ratelimit counts it)
    Month,
    /// `year` (365 days, as envoyproxy/ratelimit counts it)
    Year,
    /// A `policy` whose period is none of the units (`"7/90s"`).
    Unknown,
}

impl Unit {
    /// The unit that `rate_limit.unit` names, in any letter case (as the Go
    /// service upper-cases it); `None` for anything else, `unknown` included.
    pub fn from_name(name: &str) -> Option<Unit> {
        const NAMES: [(&str, Unit); 7] = [
            ("second", Unit::Second),
            ("minute", Unit::Minute),
            ("hour", Unit::Hour),
            ("day", Unit::Day),
            ("week", Unit::Week),
            ("month", Unit::Month),
            ("year", Unit::Year),
        ];
        NAMES
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|&(_, u)| u)
    }

    /// The unit's name as `rate_limit.unit` writes it (`"unknown"` for
    /// [`Unit::Unknown`]).
    ///
    /// ```
    /// # use ratewall_server::config::Unit;
    /// assert_eq!(Unit::Hour.name(), "hour");
    /// ```
    pub fn name(self) -> &'static str {
        match self {
            Unit::Second => "second",
            Unit::Minute => "minute",
            Unit::Hour => "hour",
            Unit::Day => "day",
            Unit::Week => "week",
            Unit::Month => "month",
            Unit::Year => "year",
            Unit::Unknown => "unknown",
        }
    }

    /// The window a unit counts (envoyproxy/ratelimit's divider: a month is
    /// 30 days, a year 365); `None` for [`Unit::Unknown`].
    pub fn length(self) -> Option<Duration> {
        let secs = match self {
            Unit::Second => 1,
            Unit::Minute => 60,
            Unit::Hour => 3_600,
            Unit::Day => 86_400,
            Unit::Week => 7 * 86_400,
            Unit::Month => 30 * 86_400,
            Unit::Year => 365 * 86_400,
            Unit::Unknown => return None,
        };
        Some(Duration::from_secs(secs))
    }

    /// The unit a policy's period is exactly (1 s, min, h, day or week),
    /// else [`Unit::Unknown`].
    fn of_period(period: Duration) -> Unit {
        [
            Unit::Second,
            Unit::Minute,
            Unit::Hour,
            Unit::Day,
            Unit::Week,
        ]
        .into_iter()
        .find(|u| u.length() == Some(period))
        .unwrap_or(Unit::Unknown)
    }
}

/// What a limit does to a matching descriptor.
///
/// ```
/// use ratewall::{Policy, Rate, Window};
/// use ratewall_server::config::{LimitKind, Unit};
///
/// let kind = LimitKind::from_unit(100, Unit::Minute).unwrap();
/// assert_eq!(
///     kind,
///     LimitKind::Limited { policy: Policy::fixed_window(Window::per_minute(100)), requests_per_unit: 100, unit: Unit::Minute }
/// );
/// assert_eq!(LimitKind::from_unit(0, Unit::Day), Some(LimitKind::Blocked { unit: Unit::Day }));
/// assert_eq!(LimitKind::from_unit(1, Unit::Unknown), None);
/// ```
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
    /// `requests_per_unit: 0` (envoyproxy/ratelimit's block list, README
    /// example 3): every request is over the limit, nothing is counted. The
    /// answer's `current_limit` is `{ requests_per_unit: 0, unit }`.
    Blocked {
        /// The answer's `current_limit.unit`.
        unit: Unit,
    },
}

impl LimitKind {
    /// The kind of envoyproxy/ratelimit's `requests_per_unit` per `unit`: a
    /// fixed window, or [`LimitKind::Blocked`] for 0; `None` for
    /// [`Unit::Unknown`].
    ///
    /// A count above 16,777,215 (the most a keyed fixed window counts)
    /// becomes a token bucket of the same rate with a burst of the whole
    /// count.
    pub fn from_unit(requests_per_unit: u32, unit: Unit) -> Option<LimitKind> {
        let length = unit.length()?;
        Some(if requests_per_unit == 0 {
            LimitKind::Blocked { unit }
        } else {
            LimitKind::Limited {
                policy: if u64::from(requests_per_unit) <= MAX_FIXED_WINDOW {
                    Policy::fixed_window(Window::new(u64::from(requests_per_unit), length))
                } else {
                    // Past a keyed fixed window's count: the same rate
                    // and burst as a token bucket.
                    let n = u64::from(requests_per_unit);
                    Policy::token_bucket(Rate::new(n, length).burst(n))
                },
                requests_per_unit,
                unit,
            }
        })
    }

    /// The kind of a ratewall policy: its quota count per its period
    /// ([`Unit::Unknown`] when the period is not exactly one unit).
    fn from_policy(policy: Policy) -> LimitKind {
        let (count, period) = match (policy.rate(), policy.window()) {
            (Some(r), _) => (r.count(), r.period()),
            (None, Some(w)) => (w.limit(), w.length()),
            (None, None) => (policy.limit(), policy.span()),
        };
        LimitKind::Limited {
            policy,
            requests_per_unit: u32::try_from(count).unwrap_or(u32::MAX),
            unit: Unit::of_period(period),
        }
    }

    /// The kind as text, for [`LimitDef::id`].
    fn id_text(&self) -> String {
        match self {
            LimitKind::Unlimited => "unlimited".to_owned(),
            LimitKind::Limited { policy, .. } => policy.to_string(),
            LimitKind::Blocked { unit } => format!("blocked/{}", unit.name()),
        }
    }
}

/// The most a keyed fixed window counts (its slot's count field).
const MAX_FIXED_WINDOW: u64 = (1 << 24) - 1;

/// One configured limit: a descriptor node's `rate_limit`.
///
/// ```
/// use ratewall_server::config::Config;
///
/// let yaml = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { name: per_k, unit: hour, requests_per_unit: 5 }\n";
/// let config = Config::from_sources(&[("d.yaml".into(), yaml.into())])?;
/// let limit = &config.limits()[0];
/// assert_eq!(limit.full_key, "d.k");
/// assert_eq!(limit.name.as_deref(), Some("per_k"));
/// # Ok::<(), ratewall_server::config::ConfigError>(())
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub struct LimitDef {
    /// Where it is written: `file:line` (`request` for a descriptor's own
    /// limit), for messages about it.
    pub source: String,
    /// The same for a limit that did not change across a reload (domain,
    /// descriptor path, `share_threshold` along the path, and the kind with
    /// its policy): its counters are kept. Names, stats flags and
    /// `shadow_mode` do not change counting, so they do not change the id.
    pub id: String,
    /// envoyproxy/ratelimit's key for the limit's stats: `domain.key_value.key`.
    pub full_key: String,
    /// Unlimited, counted or blocked.
    pub kind: LimitKind,
    /// `rate_limit.name`.
    pub name: Option<String>,
    /// `rate_limit.replaces[].name`.
    pub replaces: Vec<String>,
    /// `shadow_mode`: counted, reported, never enforced.
    pub shadow_mode: bool,
    /// `quota_mode`: over the limit only counts when every quota-mode
    /// descriptor of the request is over (envoyproxy/ratelimit's rule).
    pub quota_mode: bool,
    /// `detailed_metric`: stats per descriptor value.
    pub detailed_metric: bool,
    /// The descriptor's `metadata`, as JSON (`None` when absent or empty).
    pub metadata: Option<serde_json::Value>,
}

/// A descriptor's limit and which of its counters it takes.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Found<'c> {
    /// The limit: the configuration's own (borrowed, so a lookup touches
    /// no reference count), or the descriptor's own `limit` (made for it).
    pub limit: Cow<'c, Arc<LimitDef>>,
    /// The counter within the limit: the descriptor's entries as matched
    /// (a wildcard with `share_threshold` names the pattern, not the value),
    /// each key and value length-prefixed, so no two descriptors share a
    /// counter by accident.
    pub counter_key: Vec<u8>,
    /// The stats key of this descriptor (values included when the limit
    /// has `detailed_metric`, `value_to_metric` applied).
    pub stats_key: String,
}

/// A configuration that cannot be loaded: which file, line and field, and
/// what to change.
///
/// ```
/// use ratewall_server::config::Config;
///
/// let err = Config::from_sources(&[("a.yaml".into(), "domain: a\ndescriptors:\n  - value: v\n".into())]).unwrap_err();
/// assert_eq!((err.file.as_str(), err.line, err.field.as_str()), ("a.yaml", 3, "key"));
/// assert!(err.to_string().starts_with("a.yaml:3: `key`: "));
/// ```
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

impl ConfigError {
    pub(crate) fn new(file: &str, line: usize, field: &str, message: impl Into<String>) -> Self {
        ConfigError {
            file: file.to_owned(),
            line,
            field: field.to_owned(),
            message: message.into(),
        }
    }
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

/// How files are loaded.
///
/// ```
/// use ratewall_server::config::{Config, LoadOptions};
///
/// let a = ("a.yaml".to_string(), "domain: d\ndescriptors:\n  - key: a\n".to_string());
/// let b = ("b.yaml".to_string(), "domain: d\ndescriptors:\n  - key: b\n".to_string());
/// assert!(Config::from_sources(&[a.clone(), b.clone()]).is_err());
/// assert!(Config::from_sources_with(&[a, b], &LoadOptions::default().merge_domains(true)).is_ok());
/// ```
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct LoadOptions {
    /// Files that name the same domain add their top-level descriptors to
    /// it (envoyproxy/ratelimit's `MERGE_DOMAIN_CONFIG`); off: a second
    /// file with the domain is an error.
    pub merge_domains: bool,
    /// [`Config::load_dir_with`] skips files and directories whose name
    /// starts with `.` (envoyproxy/ratelimit's `RUNTIME_IGNOREDOTFILES`,
    /// off by default as there).
    pub ignore_dot_files: bool,
}

impl LoadOptions {
    /// Sets [`LoadOptions::merge_domains`].
    pub fn merge_domains(mut self, merge: bool) -> Self {
        self.merge_domains = merge;
        self
    }

    /// Sets [`LoadOptions::ignore_dot_files`].
    pub fn ignore_dot_files(mut self, ignore: bool) -> Self {
        self.ignore_dot_files = ignore;
        self
    }
}

/// The loaded configuration: every domain's descriptor tree.
#[derive(Debug, Default)]
pub struct Config {
    domains: HashMap<String, Node>,
    limits: Vec<Arc<LimitDef>>,
}

impl Config {
    /// Reads every regular file under `dir`, subdirectories included, as
    /// envoyproxy/ratelimit's runtime loader does: whatever the extension,
    /// dot files included (see [`LoadOptions::ignore_dot_files`]), in path
    /// order. Symbolic links to files are read; links to directories are
    /// not followed. Each file is named in errors by its path.
    ///
    /// ```no_run
    /// # use ratewall_server::config::Config;
    /// let config = Config::load_dir(std::path::Path::new("/srv/runtime_data/current/config"))?;
    /// # Ok::<(), ratewall_server::config::ConfigError>(())
    /// ```
    pub fn load_dir(dir: &Path) -> Result<Config, ConfigError> {
        Config::load_dir_with(dir, &LoadOptions::default())
    }

    /// [`Config::load_dir`] with options.
    pub fn load_dir_with(dir: &Path, options: &LoadOptions) -> Result<Config, ConfigError> {
        Config::from_sources_with(&Config::read_dir(dir, options)?, options)
    }

    /// The `(path, text)` of every file [`Config::load_dir_with`] reads,
    /// in path order: what a reload compares to decide whether anything
    /// changed, and then loads with [`Config::from_sources_with`].
    ///
    /// ```no_run
    /// # use ratewall_server::config::{Config, LoadOptions};
    /// let options = LoadOptions::default();
    /// let files = Config::read_dir(std::path::Path::new("config"), &options)?;
    /// let config = Config::from_sources_with(&files, &options)?;
    /// # Ok::<(), ratewall_server::config::ConfigError>(())
    /// ```
    pub fn read_dir(
        dir: &Path,
        options: &LoadOptions,
    ) -> Result<Vec<(String, String)>, ConfigError> {
        let mut paths = Vec::new();
        collect_files(dir, options, &mut paths)?;
        paths.sort();
        let mut files = Vec::with_capacity(paths.len());
        for path in paths {
            let name = path.display().to_string();
            let text = std::fs::read_to_string(&path).map_err(|e| {
                ConfigError::new(
                    &name,
                    0,
                    "",
                    format!("cannot read the file as UTF-8 text: {e}"),
                )
            })?;
            files.push((name, text));
        }
        Ok(files)
    }

    /// Loads `(file name, text)` pairs, in order.
    ///
    /// ```
    /// # use ratewall_server::config::Config;
    /// let config = Config::from_sources(&[("m.yaml".into(), "domain: m\ndescriptors:\n  - key: k\n    rate_limit: { unlimited: true }\n".into())])?;
    /// assert_eq!(config.limits().len(), 1);
    /// # Ok::<(), ratewall_server::config::ConfigError>(())
    /// ```
    pub fn from_sources(files: &[(String, String)]) -> Result<Config, ConfigError> {
        Config::from_sources_with(files, &LoadOptions::default())
    }

    /// [`Config::from_sources`] with options.
    pub fn from_sources_with(
        files: &[(String, String)],
        options: &LoadOptions,
    ) -> Result<Config, ConfigError> {
        let mut config = Config::default();
        for (name, text) in files {
            yaml::load_file(&mut config, name, text, options)?;
        }
        Ok(config)
    }

    /// Every limit, unlimited ones included, in the order loaded.
    ///
    /// ```
    /// # use ratewall_server::config::Config;
    /// let yaml = "domain: d\ndescriptors:\n  - key: a\n    rate_limit: { policy: 5/s }\n    descriptors:\n      - key: b\n        rate_limit: { unlimited: true }\n";
    /// let config = Config::from_sources(&[("d.yaml".into(), yaml.into())])?;
    /// let keys: Vec<_> = config.limits().iter().map(|l| l.full_key.clone()).collect();
    /// assert_eq!(keys, ["d.a", "d.a.b"]);
    /// # Ok::<(), ratewall_server::config::ConfigError>(())
    /// ```
    pub fn limits(&self) -> Vec<Arc<LimitDef>> {
        self.limits.clone()
    }

    /// No domain is configured (envoyproxy/ratelimit then answers every
    /// request with an error).
    pub fn is_empty(&self) -> bool {
        self.domains.is_empty()
    }

    /// Whether `domain` is configured.
    pub fn has_domain(&self, domain: &str) -> bool {
        self.domains.contains_key(domain)
    }

    /// The limit for one descriptor of `domain` (envoyproxy/ratelimit's
    /// `GetLimit`), `limit_override` being the descriptor's own `limit`.
    ///
    /// An override applies to any descriptor of a configured domain,
    /// matched or not: a fixed window of its rate whose stats key is the
    /// descriptor's `domain.key_value…` and whose id names the domain and
    /// the rate, so the same override shares its counters. An override
    /// with [`Unit::Unknown`] finds nothing (envoyproxy/ratelimit fails the
    /// request on it).
    ///
    /// ```
    /// # use ratewall_server::config::{Config, LimitKind, Unit};
    /// let config = Config::from_sources(&[("d.yaml".into(), "domain: d\ndescriptors:\n  - key: k\n".into())])?;
    /// assert!(config.find("d", &[("k", "v")], None).is_none());
    /// let found = config.find("d", &[("k", "v")], Some((42, Unit::Hour))).unwrap();
    /// assert!(matches!(found.limit.kind, LimitKind::Limited { requests_per_unit: 42, unit: Unit::Hour, .. }));
    /// assert_eq!(found.stats_key, "d.k_v");
    /// # Ok::<(), ratewall_server::config::ConfigError>(())
    /// ```
    pub fn find(
        &self,
        domain: &str,
        entries: &[(&str, &str)],
        limit_override: Option<(u32, Unit)>,
    ) -> Option<Found<'_>> {
        let root = self.domains.get(domain)?;
        match limit_override {
            Some((requests_per_unit, unit)) => {
                matcher::find_override(domain, entries, requests_per_unit, unit)
            }
            None => matcher::find(root, domain, entries),
        }
    }
}

/// Drops the limits that another matched limit of the same request
/// `replaces` (by name), as envoyproxy/ratelimit does: the names replaced
/// are gathered from every found limit first (unlimited ones included),
/// then each counted or blocked limit whose `name` is among them is
/// dropped; an unlimited limit is never dropped.
///
/// ```
/// use ratewall_server::config::{apply_replaces, Config};
///
/// let yaml = r#"
/// domain: d
/// descriptors:
///   - key: a
///     rate_limit: { name: base, unit: second, requests_per_unit: 5 }
///   - key: b
///     rate_limit: { replaces: [{ name: base }], unit: second, requests_per_unit: 10 }
/// "#;
/// let config = Config::from_sources(&[("d.yaml".into(), yaml.into())])?;
/// let mut found = [config.find("d", &[("a", "1")], None), config.find("d", &[("b", "1")], None)];
/// apply_replaces(&mut found);
/// assert!(found[0].is_none() && found[1].is_some());
/// # Ok::<(), ratewall_server::config::ConfigError>(())
/// ```
pub fn apply_replaces(found: &mut [Option<Found<'_>>]) {
    let replaced: Vec<&str> = found
        .iter()
        .flatten()
        .flat_map(|f| f.limit.replaces.iter().map(String::as_str))
        .collect();
    if replaced.is_empty() {
        return;
    }
    let drop: Vec<bool> = found
        .iter()
        .map(|f| match f {
            Some(f) if f.limit.kind != LimitKind::Unlimited => f
                .limit
                .name
                .as_deref()
                .is_some_and(|n| replaced.contains(&n)),
            _ => false,
        })
        .collect();
    for (slot, drop) in found.iter_mut().zip(drop) {
        if drop {
            *slot = None;
        }
    }
}

/// Every regular file under `dir` (see [`Config::load_dir`]).
fn collect_files(
    dir: &Path,
    options: &LoadOptions,
    out: &mut Vec<PathBuf>,
) -> Result<(), ConfigError> {
    let name = dir.display().to_string();
    let entries = std::fs::read_dir(dir)
        .map_err(|e| ConfigError::new(&name, 0, "", format!("cannot list the directory: {e}")))?;
    for entry in entries {
        let entry = entry.map_err(|e| {
            ConfigError::new(&name, 0, "", format!("cannot list the directory: {e}"))
        })?;
        if options.ignore_dot_files && entry.file_name().to_string_lossy().starts_with('.') {
            continue;
        }
        let path = entry.path();
        let kind = entry.file_type().map_err(|e| {
            ConfigError::new(
                &path.display().to_string(),
                0,
                "",
                format!("cannot stat: {e}"),
            )
        })?;
        if kind.is_dir() {
            collect_files(&path, options, out)?;
        } else if kind.is_file() || (kind.is_symlink() && path.is_file()) {
            out.push(path);
        }
    }
    Ok(())
}
