//! The loader: one file's YAML, walked by hand over saphyr's marked tree
//! so that every error names its file, line and field.
//!
//! Scalars are loaded as written (no early resolution) and read as Go's
//! yaml.v2 reads them into envoyproxy/ratelimit's structs: a text field
//! takes any scalar's text (`value: 007` is `"007"`), a flag takes YAML
//! 1.1's booleans (`yes`, `on`, …), a count takes YAML 1.1's integers.

use std::collections::HashMap;
use std::sync::Arc;

use ratewall::Policy;
use saphyr::{MarkedYaml, ScalarStyle, YamlData, YamlLoader};
use saphyr_parser::Parser;

use super::matcher::{push_id_part, Node, Wildcard};
use super::{Config, ConfigError, LimitDef, LimitKind, LoadOptions, Unit};

/// Descriptors nest at most this deep (a bound on the loader's recursion).
const MAX_DEPTH: usize = 64;

/// Loads one file into `config`.
pub(super) fn load_file(
    config: &mut Config,
    file: &str,
    text: &str,
    options: &LoadOptions,
) -> Result<(), ConfigError> {
    let docs = parse(file, text)?;
    let mut docs = docs.iter();
    let root = docs.next();
    if let Some(extra) = docs.find(|d| !is_null(d)) {
        return Err(ConfigError::new(
            file,
            line(extra),
            "",
            "a second YAML document (after `---`) is not read: put each domain in its own file",
        ));
    }
    let ctx = Ctx { file };

    let mut domain: Option<(String, usize)> = None;
    let mut descriptors: Option<&MarkedYaml<'_>> = None;
    if let Some(root) = root.filter(|r| !is_null(r)) {
        if !matches!(untag(root).data, YamlData::Mapping(_)) {
            return Err(ctx.err(
                root,
                "",
                "a configuration file is a mapping with `domain` and `descriptors`",
            ));
        }
        for (name, k, v) in ctx.mapping(root, "")? {
            match name {
                "domain" => domain = Some((ctx.text(v, "domain")?, line(k))),
                "descriptors" => descriptors = Some(v),
                other => return Err(ctx.unknown(k, other, "", &["domain", "descriptors"])),
            }
        }
    }
    let (domain, domain_line) = match domain {
        Some((d, l)) if !d.is_empty() => (d, l),
        other => {
            return Err(ConfigError::new(
                file,
                other.map_or(0, |(_, l)| l),
                "domain",
                "config file cannot have empty domain: name the file's `domain`",
            ))
        }
    };

    let merging = config.domains.contains_key(&domain);
    if merging && !options.merge_domains {
        return Err(ConfigError::new(
            file,
            domain_line,
            "domain",
            format!(
                "duplicate domain '{domain}' in config file: another file already defines it; \
                 use one file per domain, or load with `merge_domains`"
            ),
        ));
    }
    let mut root_node = config.domains.remove(&domain).unwrap_or_default();
    let mut limits = Vec::new();
    let mut id = String::new();
    push_id_part(&mut id, &domain);
    let result = match descriptors {
        Some(d) => ctx.descriptors(
            &mut root_node,
            d,
            &format!("{domain}."),
            &id,
            0,
            &mut limits,
        ),
        None => Ok(()),
    };
    // A failed merge leaves the domain as it was loaded so far; the whole
    // load fails anyway.
    config.domains.insert(domain, root_node);
    result?;
    config.limits.extend(limits);
    Ok(())
}

/// The documents of a file, scalars unresolved.
fn parse<'t>(file: &str, text: &'t str) -> Result<Vec<MarkedYaml<'t>>, ConfigError> {
    let mut loader: YamlLoader<'t, MarkedYaml<'t>> = YamlLoader::default();
    loader.early_parse(false);
    let mut parser = Parser::new_from_str(text);
    parser.load(&mut loader, true).map_err(|e| {
        ConfigError::new(
            file,
            e.marker().line(),
            "",
            format!("error loading config file: not valid YAML: {}", e.info()),
        )
    })?;
    Ok(loader.into_documents())
}

/// The 1-based line a node starts on.
fn line(node: &MarkedYaml<'_>) -> usize {
    node.span.start.line()
}

/// A collection's tag does not change what it holds.
fn untag<'a, 't>(node: &'a MarkedYaml<'t>) -> &'a MarkedYaml<'t> {
    match &node.data {
        YamlData::Tagged(_, inner) => untag(inner),
        _ => node,
    }
}

/// A scalar as written: its text and whether it was plain (unquoted).
fn scalar<'a>(node: &'a MarkedYaml<'_>) -> Option<(&'a str, bool)> {
    match &untag(node).data {
        YamlData::Representation(text, style, _) => Some((text, *style == ScalarStyle::Plain)),
        _ => None,
    }
}

/// YAML's null (an empty value, `~`, `null`) or an empty document.
fn is_null(node: &MarkedYaml<'_>) -> bool {
    match &untag(node).data {
        YamlData::BadValue => true,
        YamlData::Representation(text, ScalarStyle::Plain, _) => is_null_text(text),
        _ => false,
    }
}

fn is_null_text(text: &str) -> bool {
    matches!(text, "" | "~" | "null" | "Null" | "NULL")
}

/// YAML 1.1's booleans, as Go's yaml.v2 reads them.
fn bool_text(text: &str) -> Option<bool> {
    match text {
        "y" | "Y" | "yes" | "Yes" | "YES" | "on" | "On" | "ON" | "true" | "True" | "TRUE" => {
            Some(true)
        }
        "n" | "N" | "no" | "No" | "NO" | "off" | "Off" | "OFF" | "false" | "False" | "FALSE" => {
            Some(false)
        }
        _ => None,
    }
}

/// YAML 1.1's integers (`12`, `+12`, `-12`, `0x1f`, `0b101`, `017` octal,
/// `1_000`), as Go's yaml.v2 reads them.
fn int_text(text: &str) -> Option<i128> {
    let clean: String = text.chars().filter(|&c| c != '_').collect();
    let (negative, digits) = match clean.as_bytes().first()? {
        b'-' => (true, &clean[1..]),
        b'+' => (false, &clean[1..]),
        _ => (false, clean.as_str()),
    };
    let (radix, body) = if let Some(h) = digits.strip_prefix("0x") {
        (16, h)
    } else if let Some(b) = digits.strip_prefix("0b") {
        (2, b)
    } else if digits.len() > 1 && digits.starts_with('0') {
        (8, &digits[1..])
    } else {
        (10, digits)
    };
    if body.is_empty() || !body.chars().all(|c| c.is_digit(radix)) {
        return None;
    }
    let n = i128::from_str_radix(body, radix).ok()?;
    Some(if negative { -n } else { n })
}

/// A plain scalar that YAML 1.1 reads as a number.
fn is_float_text(text: &str) -> bool {
    let t = text.trim_start_matches(['+', '-']);
    let numeric = t.starts_with(|c: char| c.is_ascii_digit() || c == '.')
        && t.chars().any(|c| c.is_ascii_digit());
    (numeric && t.replace('_', "").parse::<f64>().is_ok())
        || matches!(t, ".inf" | ".Inf" | ".INF" | ".nan" | ".NaN" | ".NAN")
}

/// One field of a mapping: its name, its key node and its value.
type Field<'a, 't> = (&'a str, &'a MarkedYaml<'t>, &'a MarkedYaml<'t>);

/// The file being loaded, for errors.
struct Ctx<'f> {
    file: &'f str,
}

/// A `rate_limit` block as read.
#[derive(Default)]
struct RawLimit {
    unit: Option<(String, usize)>,
    requests_per_unit: Option<u32>,
    unlimited: bool,
    name: Option<String>,
    replaces: Vec<(String, usize)>,
    policy: Option<(String, usize)>,
}

/// One descriptor as read.
#[derive(Default)]
struct RawDescriptor<'a, 't> {
    key: String,
    value: String,
    rate_limit: Option<(RawLimit, usize)>,
    descriptors: Option<&'a MarkedYaml<'t>>,
    shadow_mode: bool,
    quota_mode: bool,
    detailed_metric: bool,
    value_to_metric: bool,
    share_threshold: Option<usize>,
    metadata: Option<serde_json::Value>,
}

const DESCRIPTOR_FIELDS: [&str; 10] = [
    "key",
    "value",
    "rate_limit",
    "descriptors",
    "shadow_mode",
    "quota_mode",
    "detailed_metric",
    "value_to_metric",
    "share_threshold",
    "metadata",
];

const RATE_LIMIT_FIELDS: [&str; 6] = [
    "unit",
    "requests_per_unit",
    "unlimited",
    "name",
    "replaces",
    "policy",
];

impl Ctx<'_> {
    fn err(&self, node: &MarkedYaml<'_>, field: &str, message: impl Into<String>) -> ConfigError {
        ConfigError::new(self.file, line(node), field, message)
    }

    /// A mapping key: a text (a plain number, flag or null is not one).
    fn key_name<'a>(&self, key: &'a MarkedYaml<'_>) -> Result<&'a str, ConfigError> {
        match scalar(key) {
            Some((text, plain))
                if !(plain
                    && (is_null_text(text)
                        || bool_text(text).is_some()
                        || int_text(text).is_some()
                        || is_float_text(text))) =>
            {
                Ok(text)
            }
            Some((text, _)) => Err(self.err(
                key,
                "",
                format!("config error, key is not of type string: {text}; field names are words such as `key`"),
            )),
            None => Err(self.err(
                key,
                "",
                "config error, key is not of type string: a field name is a word such as `key`",
            )),
        }
    }

    /// An unknown field: says where it belongs if it belongs elsewhere.
    fn unknown(
        &self,
        key: &MarkedYaml<'_>,
        name: &str,
        prefix: &str,
        allowed: &[&str],
    ) -> ConfigError {
        let field = format!("{prefix}{name}");
        let elsewhere = if DESCRIPTOR_FIELDS.contains(&name) {
            Some("a descriptor")
        } else if RATE_LIMIT_FIELDS.contains(&name) {
            Some("`rate_limit`")
        } else if name == "domain" {
            Some("the top of the file")
        } else {
            None
        };
        let hint = match elsewhere {
            Some(place) => format!(
                "`{name}` belongs to {place}, not here (envoyproxy/ratelimit would ignore it here)"
            ),
            None => format!("expected one of: {}", allowed.join(", ")),
        };
        self.err(
            key,
            &field,
            format!("config error, unknown key '{name}': {hint}"),
        )
    }

    /// A text field: any scalar's text; null is empty.
    fn text(&self, node: &MarkedYaml<'_>, field: &str) -> Result<String, ConfigError> {
        match scalar(node) {
            Some((text, true)) if is_null_text(text) => Ok(String::new()),
            Some((text, _)) => Ok(text.to_owned()),
            None if is_null(node) => Ok(String::new()),
            None => Err(self.err(node, field, "expected a text, found a list or a mapping")),
        }
    }

    /// A flag: YAML 1.1's booleans; null is false.
    fn flag(&self, node: &MarkedYaml<'_>, field: &str) -> Result<bool, ConfigError> {
        if is_null(node) {
            return Ok(false);
        }
        match scalar(node) {
            Some((text, true)) => bool_text(text).ok_or(()),
            _ => Err(()),
        }
        .map_err(|()| self.err(node, field, "expected `true` or `false`"))
    }

    /// `requests_per_unit`: an integer from 0 to 4294967295.
    fn count(&self, node: &MarkedYaml<'_>, field: &str) -> Result<u32, ConfigError> {
        let n = match scalar(node) {
            Some((text, true)) => int_text(text),
            _ => None,
        };
        n.and_then(|n| u32::try_from(n).ok()).ok_or_else(|| {
            self.err(
                node,
                field,
                "expected a whole number of requests from 0 to 4294967295 (0 blocks every request)",
            )
        })
    }

    /// The fields of a mapping, each key checked to be a text.
    fn mapping<'a, 't>(
        &self,
        node: &'a MarkedYaml<'t>,
        field: &str,
    ) -> Result<Vec<Field<'a, 't>>, ConfigError> {
        let YamlData::Mapping(map) = &untag(node).data else {
            return Err(self.err(node, field, "expected a mapping of fields"));
        };
        let mut fields = Vec::with_capacity(map.len());
        let mut merged = Vec::new();
        for (k, v) in map {
            if scalar(k) == Some(("<<", true)) {
                // YAML's merge key, as yaml.v2 reads it: `<<: *base` or
                // `<<: [*a, *b]` adds the fields not written here.
                match &untag(v).data {
                    YamlData::Sequence(items) => {
                        for item in items {
                            merged.extend(self.mapping(item, field)?);
                        }
                    }
                    _ => merged.extend(self.mapping(v, field)?),
                }
            } else {
                fields.push((self.key_name(k)?, k, v));
            }
        }
        for m in merged {
            if !fields.iter().any(|f| f.0 == m.0) {
                fields.push(m);
            }
        }
        Ok(fields)
    }

    /// A descriptor list into `parent`.
    fn descriptors(
        &self,
        parent: &mut Node,
        list: &MarkedYaml<'_>,
        parent_key: &str,
        parent_id: &str,
        depth: usize,
        limits: &mut Vec<Arc<LimitDef>>,
    ) -> Result<(), ConfigError> {
        if is_null(list) {
            return Ok(());
        }
        let YamlData::Sequence(items) = &untag(list).data else {
            return Err(self.err(
                list,
                "descriptors",
                "expected a list of descriptors (`- key: …`)",
            ));
        };
        if depth >= MAX_DEPTH {
            return Err(self.err(
                list,
                "descriptors",
                format!("descriptors nest deeper than {MAX_DEPTH} levels"),
            ));
        }
        for item in items {
            self.descriptor(parent, item, parent_key, parent_id, depth, limits)?;
        }
        Ok(())
    }

    /// Reads one descriptor's fields.
    fn read_descriptor<'a, 't>(
        &self,
        item: &'a MarkedYaml<'t>,
    ) -> Result<RawDescriptor<'a, 't>, ConfigError> {
        if !matches!(untag(item).data, YamlData::Mapping(_)) {
            let shown = scalar(item).map_or("a list", |(t, _)| t);
            return Err(self.err(
                item,
                "descriptors",
                format!(
                    "config error, yaml file contains list of type other than map: {shown}; \
                     each descriptor is a mapping such as `- key: …`"
                ),
            ));
        }
        let mut d = RawDescriptor::default();
        for (name, k, v) in self.mapping(item, "descriptors")? {
            match name {
                "key" => d.key = self.text(v, "key")?,
                "value" => d.value = self.text(v, "value")?,
                "rate_limit" if is_null(v) => {}
                "rate_limit" => d.rate_limit = Some((self.read_limit(v)?, line(k))),
                "descriptors" => d.descriptors = Some(v),
                "shadow_mode" => d.shadow_mode = self.flag(v, name)?,
                "quota_mode" => d.quota_mode = self.flag(v, name)?,
                "detailed_metric" => d.detailed_metric = self.flag(v, name)?,
                "value_to_metric" => d.value_to_metric = self.flag(v, name)?,
                "share_threshold" => {
                    d.share_threshold = self.flag(v, name)?.then(|| line(k));
                }
                "metadata" => d.metadata = self.metadata(v)?,
                other => return Err(self.unknown(k, other, "", &DESCRIPTOR_FIELDS)),
            }
        }
        Ok(d)
    }

    /// One descriptor (and its subtree) into `parent`.
    fn descriptor(
        &self,
        parent: &mut Node,
        item: &MarkedYaml<'_>,
        parent_key: &str,
        parent_id: &str,
        depth: usize,
        limits: &mut Vec<Arc<LimitDef>>,
    ) -> Result<(), ConfigError> {
        let d = self.read_descriptor(item)?;
        if d.key.is_empty() {
            return Err(self.err(item, "key", "descriptor has empty key: give it a `key`"));
        }
        let mut final_key = d.key.clone();
        if !d.value.is_empty() {
            final_key.push('_');
            final_key.push_str(&d.value);
        }
        let full_key = format!("{parent_key}{final_key}");
        if parent.children.contains_key(final_key.as_str()) {
            return Err(self.err(
                item,
                "key",
                format!(
                    "duplicate descriptor composite key '{full_key}': another descriptor at this \
                     level has the same `key` and `value`; merge them"
                ),
            ));
        }
        let wildcard = final_key.contains('*');
        if let Some(at) = d.share_threshold.filter(|_| !wildcard) {
            return Err(ConfigError::new(
                self.file,
                at,
                "share_threshold",
                format!(
                    "share_threshold can only be used with wildcard values (containing '*'), \
                     but found key '{final_key}': remove it or give `value` a `*`"
                ),
            ));
        }
        let mut id = parent_id.to_owned();
        push_id_part(&mut id, &d.key);
        push_id_part(&mut id, &d.value);
        if d.share_threshold.is_some() {
            id.push('*');
        }
        let limit = match d.rate_limit {
            Some((raw, at)) => {
                let kind = self.limit_kind(&raw, at)?;
                let name = raw.name.filter(|n| !n.is_empty());
                for (r, at) in &raw.replaces {
                    if r.is_empty() {
                        return Err(ConfigError::new(
                            self.file,
                            *at,
                            "rate_limit.replaces.name",
                            "should not have an empty replaces entry: name the limit replaced",
                        ));
                    }
                    if name.as_deref() == Some(r.as_str()) {
                        return Err(ConfigError::new(
                            self.file,
                            *at,
                            "rate_limit.replaces.name",
                            format!(
                                "replaces should not contain name of same descriptor ('{r}'): \
                                 a limit cannot replace itself"
                            ),
                        ));
                    }
                }
                let limit = Arc::new(LimitDef {
                    source: format!("{}:{at}", self.file),
                    id: format!("{id}={}", kind.id_text()),
                    full_key: full_key.clone(),
                    kind,
                    name,
                    replaces: raw.replaces.into_iter().map(|(r, _)| r).collect(),
                    shadow_mode: d.shadow_mode,
                    quota_mode: d.quota_mode,
                    detailed_metric: d.detailed_metric,
                    metadata: d.metadata,
                });
                limits.push(Arc::clone(&limit));
                Some(limit)
            }
            None => None,
        };
        let mut node = Node {
            children: HashMap::new(),
            wildcards: Vec::new(),
            limit,
            value_to_metric: d.value_to_metric,
            share_threshold: d.share_threshold.is_some(),
        };
        if let Some(children) = d.descriptors {
            self.descriptors(
                &mut node,
                children,
                &format!("{full_key}."),
                &id,
                depth + 1,
                limits,
            )?;
        }
        if wildcard {
            parent.wildcards.push(Wildcard::new(&final_key));
        }
        parent.children.insert(final_key.into_boxed_str(), node);
        Ok(())
    }

    /// Reads a `rate_limit` block.
    fn read_limit(&self, node: &MarkedYaml<'_>) -> Result<RawLimit, ConfigError> {
        let mut raw = RawLimit::default();
        for (name, k, v) in self.mapping(node, "rate_limit")? {
            let field = format!("rate_limit.{name}");
            match name {
                "unit" => {
                    let unit = self.text(v, &field)?;
                    raw.unit = (!unit.is_empty()).then(|| (unit, line(k)));
                }
                "requests_per_unit" if is_null(v) => {}
                "requests_per_unit" => raw.requests_per_unit = Some(self.count(v, &field)?),
                "unlimited" => raw.unlimited = self.flag(v, &field)?,
                "name" => raw.name = Some(self.text(v, &field)?),
                "policy" => raw.policy = Some((self.text(v, &field)?, line(k))),
                "replaces" => raw.replaces = self.replaces(v)?,
                other => return Err(self.unknown(k, other, "rate_limit.", &RATE_LIMIT_FIELDS)),
            }
        }
        Ok(raw)
    }

    /// `replaces: [{ name: … }]`.
    fn replaces(&self, node: &MarkedYaml<'_>) -> Result<Vec<(String, usize)>, ConfigError> {
        if is_null(node) {
            return Ok(Vec::new());
        }
        let YamlData::Sequence(items) = &untag(node).data else {
            return Err(self.err(node, "rate_limit.replaces", "expected a list (`- name: …`)"));
        };
        let mut out = Vec::with_capacity(items.len());
        for item in items {
            if !matches!(untag(item).data, YamlData::Mapping(_)) {
                let shown = scalar(item).map_or("a list", |(t, _)| t);
                return Err(self.err(
                    item,
                    "rate_limit.replaces",
                    format!(
                        "config error, yaml file contains list of type other than map: {shown}; \
                         write `- name: …`"
                    ),
                ));
            }
            let mut name = String::new();
            for (field, k, v) in self.mapping(item, "rate_limit.replaces")? {
                match field {
                    "name" => name = self.text(v, "rate_limit.replaces.name")?,
                    other => return Err(self.unknown(k, other, "rate_limit.replaces.", &["name"])),
                }
            }
            out.push((name, line(item)));
        }
        Ok(out)
    }

    /// What a `rate_limit` does; `at` is the line of `rate_limit`.
    fn limit_kind(&self, raw: &RawLimit, at: usize) -> Result<LimitKind, ConfigError> {
        let err = |line: usize, field: &str, message: String| {
            ConfigError::new(self.file, line, field, message)
        };
        if let Some((text, line)) = &raw.policy {
            if raw.unit.is_some() || raw.requests_per_unit.is_some() {
                return Err(err(
                    *line,
                    "rate_limit.policy",
                    "`policy` excludes `unit` and `requests_per_unit`: keep `policy`, or remove \
                     it and keep `unit` and `requests_per_unit`"
                        .into(),
                ));
            }
            if raw.unlimited {
                return Err(err(
                    *line,
                    "rate_limit.policy",
                    "`policy` excludes `unlimited: true`: remove one of them".into(),
                ));
            }
            let policy: Policy = text.parse().map_err(|e| {
                err(
                    *line,
                    "rate_limit.policy",
                    format!(
                        "{e}; a policy reads like `100/min`, `10/s burst 20`, \
                         `100/min sliding-window`, `100/min sliding-log`, `100/min fixed-window` \
                         or `10/s leaky queue 20`"
                    ),
                )
            })?;
            // Refused here, with its file and line, rather than when the
            // server builds the limit's table.
            fits_a_table(policy).map_err(|e| err(*line, "rate_limit.policy", format!("{e}")))?;
            return Ok(LimitKind::from_policy(policy));
        }
        if raw.unlimited {
            if let Some((unit, line)) = &raw.unit {
                return Err(err(
                    *line,
                    "rate_limit.unit",
                    format!(
                        "should not specify rate limit unit when unlimited (found '{unit}'): \
                         remove `unit`"
                    ),
                ));
            }
            return Ok(LimitKind::Unlimited);
        }
        let unit = match &raw.unit {
            Some((name, line)) => Unit::from_name(name).ok_or_else(|| {
                err(
                    *line,
                    "rate_limit.unit",
                    format!(
                        "invalid rate limit unit '{name}': use second, minute, hour, day, week, \
                         month or year"
                    ),
                )
            })?,
            None => {
                return Err(err(
                    at,
                    "rate_limit.unit",
                    "invalid rate limit unit '': `rate_limit` needs a `unit` (second, minute, \
                     hour, day, week, month or year) with `requests_per_unit`, or a `policy`, \
                     or `unlimited: true`"
                        .into(),
                ))
            }
        };
        let Some(requests_per_unit) = raw.requests_per_unit else {
            return Err(err(
                at,
                "rate_limit.requests_per_unit",
                "`rate_limit` needs `requests_per_unit` with its `unit` (write 0 to block every \
                 request)"
                    .into(),
            ));
        };
        let kind = LimitKind::from_unit(requests_per_unit, unit)
            .ok_or_else(|| err(at, "rate_limit.unit", "the unit has no length".into()))?;
        if let LimitKind::Limited { policy, .. } = &kind {
            fits_a_table(*policy)
                .map_err(|e| err(at, "rate_limit.requests_per_unit", format!("{e}")))?;
        }
        Ok(kind)
    }

    /// `metadata`, as JSON (`None` when absent or empty).
    fn metadata(&self, node: &MarkedYaml<'_>) -> Result<Option<serde_json::Value>, ConfigError> {
        if is_null(node) {
            return Ok(None);
        }
        if !matches!(untag(node).data, YamlData::Mapping(_)) {
            return Err(self.err(node, "metadata", "expected a mapping"));
        }
        let value = self.json(node, 0)?;
        Ok(value
            .as_object()
            .is_some_and(|o| !o.is_empty())
            .then_some(value))
    }

    fn json(&self, node: &MarkedYaml<'_>, depth: usize) -> Result<serde_json::Value, ConfigError> {
        use serde_json::Value;
        if depth > MAX_DEPTH {
            return Err(self.err(node, "metadata", "nests too deep"));
        }
        Ok(match &untag(node).data {
            YamlData::Mapping(map) => {
                let mut out = serde_json::Map::new();
                for (k, v) in map {
                    let key = match scalar(k) {
                        Some((t, _)) => t.to_owned(),
                        None => return Err(self.err(k, "metadata", "a key must be a scalar")),
                    };
                    out.insert(key, self.json(v, depth + 1)?);
                }
                Value::Object(out)
            }
            YamlData::Sequence(items) => Value::Array(
                items
                    .iter()
                    .map(|i| self.json(i, depth + 1))
                    .collect::<Result<_, _>>()?,
            ),
            YamlData::Representation(text, ScalarStyle::Plain, _) => {
                if is_null_text(text) {
                    Value::Null
                } else if let Some(b) = bool_text(text) {
                    Value::Bool(b)
                } else if let Some(n) = int_text(text) {
                    match i64::try_from(n) {
                        Ok(n) => Value::from(n),
                        Err(_) => Value::String(text.to_string()),
                    }
                } else if is_float_text(text) {
                    let f: f64 = text.replace('_', "").parse().unwrap_or(f64::NAN);
                    serde_json::Number::from_f64(f)
                        .map(Value::Number)
                        .ok_or_else(|| {
                            self.err(node, "metadata", "a number JSON cannot carry (inf or nan)")
                        })?
                } else {
                    Value::String(text.to_string())
                }
            }
            YamlData::Representation(text, _, _) => Value::String(text.to_string()),
            _ => Value::Null,
        })
    }
}

/// Whether a keyed table can hold `policy`'s state (a table of one key is
/// enough to know: the bounds are the policy's, not the table's size).
fn fits_a_table(policy: Policy) -> Result<(), ratewall::ConfigError> {
    ratewall::KeyedPolicyLimiter::<Vec<u8>>::builder(policy)
        .max_keys(1)
        .build()
        .map(|_| ())
}
