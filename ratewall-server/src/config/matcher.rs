//! The descriptor tree and its walk: envoyproxy/ratelimit's `GetLimit`.
//!
//! Each level is a hash map keyed by the node's *final key*: `key_value`,
//! or `key` alone when the node has no value (so a request entry `(k, v)`
//! looks up `k_v`, then the wildcards in the order written, then `k`).
//! Wildcard nodes also sit in an ordered list with their pattern split on
//! `*` at load time, so a match allocates nothing.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;

use super::{Found, LimitDef, LimitKind, Unit};

/// One level's node (a domain's root is a node without limit).
#[derive(Debug, Default)]
pub(crate) struct Node {
    /// The children, by final key.
    pub(crate) children: HashMap<Box<str>, Node>,
    /// The children whose final key holds a `*`, in the order written.
    pub(crate) wildcards: Vec<Wildcard>,
    /// This node's `rate_limit`.
    pub(crate) limit: Option<Arc<LimitDef>>,
    /// `value_to_metric`.
    pub(crate) value_to_metric: bool,
    /// `share_threshold` (only on a wildcard node: the loader checks it).
    pub(crate) share_threshold: bool,
}

/// A wildcard child: its final key and that key split on `*`.
#[derive(Debug)]
pub(crate) struct Wildcard {
    pub(crate) key: Box<str>,
    pub(crate) parts: Vec<Box<str>>,
}

impl Wildcard {
    pub(crate) fn new(key: &str) -> Wildcard {
        Wildcard {
            key: key.into(),
            parts: key.split('*').map(Into::into).collect(),
        }
    }

    /// Each `*` matches zero or more bytes; the literal parts must appear
    /// in order, the first at the start and the last at the end.
    pub(crate) fn matches(&self, text: &str) -> bool {
        let parts = &self.parts;
        let (Some(first), Some(last)) = (parts.first(), parts.last()) else {
            return false;
        };
        if parts.len() == 1 {
            return **first == *text;
        }
        let fixed: usize = parts.iter().map(|p| p.len()).sum();
        if text.len() < fixed || !text.starts_with(&**first) || !text.ends_with(&**last) {
            return false;
        }
        // Prefix and suffix cannot overlap (the length check above), so
        // both cuts fall on character boundaries.
        let Some(mut rest) = text.get(first.len()..text.len() - last.len()) else {
            return false;
        };
        for part in &parts[1..parts.len() - 1] {
            match rest.find(&**part) {
                Some(at) => rest = &rest[at + part.len()..],
                None => return false,
            }
        }
        true
    }
}

/// How one request entry matched its level.
#[derive(Clone, Copy, Debug)]
enum Matched<'c> {
    /// By `key_value`.
    Exact,
    /// By a wildcard child: the pattern's value part (`files/*` of
    /// `files_files/*`), and whether the node shares one counter.
    Wildcard { pattern: &'c str, share: bool },
    /// By the bare `key`.
    Default,
}

/// One walked level: how it matched, and the node's `value_to_metric`.
#[derive(Clone, Copy, Debug)]
struct Step<'c> {
    matched: Matched<'c>,
    value_to_metric: bool,
}

/// `GetLimit` without an override.
pub(crate) fn find<'c>(
    root: &'c Node,
    domain: &str,
    entries: &[(&str, &str)],
) -> Option<Found<'c>> {
    // How each entry matched: on the stack for the usual few entries.
    const INLINE: usize = 8;
    let unmatched = Step {
        matched: Matched::Default,
        value_to_metric: false,
    };
    let mut inline = [unmatched; INLINE];
    let mut spilled = Vec::new();
    let steps: &mut [Step<'_>] = if entries.len() <= INLINE {
        &mut inline[..entries.len()]
    } else {
        spilled.resize(entries.len(), unmatched);
        &mut spilled
    };
    let mut node = root;
    let mut final_key = String::with_capacity(64);
    for (i, &(key, value)) in entries.iter().enumerate() {
        final_key.clear();
        final_key.push_str(key);
        final_key.push('_');
        final_key.push_str(value);
        let (next, matched) = if let Some(n) = node.children.get(final_key.as_str()) {
            (n, Matched::Exact)
        } else if let Some((n, w)) = node
            .wildcards
            .iter()
            .find(|w| w.matches(&final_key))
            .and_then(|w| node.children.get(&w.key).map(|n| (n, w)))
        {
            let pattern = trim_key_prefix(&w.key, key);
            (
                n,
                Matched::Wildcard {
                    pattern,
                    share: n.share_threshold,
                },
            )
        } else {
            (node.children.get(key)?, Matched::Default)
        };
        steps[i] = Step {
            matched,
            value_to_metric: next.value_to_metric,
        };
        node = next;
    }
    let limit = node.limit.as_ref()?;
    let steps = &*steps;
    let share = |i: usize| match steps[i].matched {
        Matched::Wildcard {
            pattern,
            share: true,
        } => Some(pattern),
        _ => None,
    };

    let mut counter_key = Vec::new();
    for (i, &(key, value)) in entries.iter().enumerate() {
        push_counter_part(&mut counter_key, key, share(i).unwrap_or(value));
    }

    let mut stats_key = String::with_capacity(domain.len() + 16 * entries.len());
    stats_key.push_str(domain);
    let any_share = (0..entries.len()).any(|i| share(i).is_some());
    for (i, &(key, value)) in entries.iter().enumerate() {
        stats_key.push('.');
        stats_key.push_str(key);
        let shown = if limit.detailed_metric {
            // Go: with a shared wildcard anywhere, empty values are left
            // out; without, every entry is `key_value`, even empty.
            match share(i) {
                Some(p) => Some(p),
                None if any_share && value.is_empty() => None,
                None => Some(value),
            }
        } else {
            let s = steps[i];
            let v = match s.matched {
                Matched::Wildcard {
                    pattern,
                    share: true,
                } => pattern,
                Matched::Wildcard { .. } if s.value_to_metric => value,
                Matched::Wildcard { pattern, .. } => pattern,
                Matched::Exact => value,
                Matched::Default if s.value_to_metric => value,
                Matched::Default => "",
            };
            (!v.is_empty()).then_some(v)
        };
        if let Some(v) = shown {
            stats_key.push('_');
            stats_key.push_str(v);
        }
    }
    Some(Found {
        limit: Cow::Borrowed(limit),
        counter_key,
        stats_key,
    })
}

/// `GetLimit` with the descriptor's own `limit`.
pub(crate) fn find_override(
    domain: &str,
    entries: &[(&str, &str)],
    requests_per_unit: u32,
    unit: Unit,
) -> Option<Found<'static>> {
    let kind = LimitKind::from_unit(requests_per_unit, unit)?;
    let mut stats_key = String::with_capacity(domain.len() + 16 * entries.len());
    stats_key.push_str(domain);
    stats_key.push('.');
    let mut counter_key = Vec::new();
    for (i, &(key, value)) in entries.iter().enumerate() {
        if i > 0 {
            stats_key.push('.');
        }
        stats_key.push_str(key);
        if !value.is_empty() {
            stats_key.push('_');
            stats_key.push_str(value);
        }
        push_counter_part(&mut counter_key, key, value);
    }
    let mut id = String::from("override");
    push_id_part(&mut id, domain);
    id.push('=');
    id.push_str(&kind.id_text());
    let limit = LimitDef {
        source: "request".into(),
        id,
        full_key: stats_key.clone(),
        kind,
        name: None,
        replaces: Vec::new(),
        shadow_mode: false,
        quota_mode: false,
        // Its stats go by each descriptor's stats key, as the Go service
        // names an own limit's stats (one limit serves every descriptor
        // with the same rate).
        detailed_metric: true,
        metadata: None,
    };
    Some(Found {
        limit: Cow::Owned(Arc::new(limit)),
        counter_key,
        stats_key,
    })
}

/// `pattern` without `key_` in front (Go's `TrimPrefix`).
fn trim_key_prefix<'p>(pattern: &'p str, key: &str) -> &'p str {
    pattern
        .strip_prefix(key)
        .and_then(|rest| rest.strip_prefix('_'))
        .unwrap_or(pattern)
}

/// Appends one entry to a counter key: the key's and the value's lengths
/// (4 bytes, little-endian) each before its bytes, so `a|b`+`c` never
/// reads as `a`+`b|c`.
fn push_counter_part(out: &mut Vec<u8>, key: &str, value: &str) {
    for s in [key, value] {
        let len = u32::try_from(s.len()).unwrap_or(u32::MAX);
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(s.as_bytes());
    }
}

/// Appends `/len:text` to an id: length-prefixed, so ids are unambiguous.
pub(crate) fn push_id_part(id: &mut String, text: &str) {
    use std::fmt::Write;
    let _ = write!(id, "/{}:{}", text.len(), text);
}
