//! Premium tiers: a rule's named alternative policies ("premium API keys
//! get 10x") and how a request picks one.
//!
//! A rule with tiers is compiled into its own limit (the default tier) and
//! one limit per tier, each with its own state per key, its own
//! `RateLimit-Policy` item and `RateLimit` prefix under the rule's name
//! (`compiled.rs`). The engine keys the request as for any rule, then
//! points the entry at the tier's limit (`TierPick::pick`); rules without
//! tiers never reach this file.

use super::key::single_header;
use crate::policy::Policy;
use http::header::HeaderName;
use http::{Extensions, HeaderMap};
use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

/// A tier function ([`Rule::tier_by`](super::Rule::tier_by)): the tier's
/// name for a request, or `None` for the rule's own policy.
pub(super) type TierFn =
    Arc<dyn for<'a> Fn(&'a HeaderMap, &'a Extensions) -> Option<&'a str> + Send + Sync>;

/// How a request names its tier.
#[derive(Clone)]
pub(super) enum TierBy {
    /// A function of the request head.
    Fn(TierFn),
    /// The value of a header (set by an authenticating proxy or middleware).
    Header(HeaderName),
}

/// What is wrong with a rule's tiers (`builder.rs` turns it into an
/// `HttpConfigError` naming the rule).
#[derive(Debug, PartialEq, Eq)]
pub(super) enum TierError {
    /// `tier_by_header` got an invalid header name.
    BadHeader,
    /// A tier's name is not usable, or is given twice.
    InvalidName(String),
    /// A key list names a tier the rule does not declare.
    Unknown(String),
    /// `tier_keys` on a rule not keyed by one header (the tiers listed).
    KeysNeedHeader(String),
    /// Tiers without a way to pick one, or a way without tiers (the tiers).
    NoPick(String),
}

/// What a rule says about tiers: the tiers, the key lists and the tier
/// function, as given (checked when the layer is built).
#[derive(Clone, Default)]
pub(super) struct Tiers {
    pub(super) list: Vec<(String, Policy)>,
    /// Values of the rule's header key that get a tier, per tier.
    pub(super) keys: Vec<(String, Vec<String>)>,
    pub(super) by: Option<TierBy>,
    /// `tier_by_header` was given an invalid header name.
    pub(super) bad_header: bool,
}

impl fmt::Debug for Tiers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("Tiers");
        d.field("list", &self.list);
        d.field(
            "keys",
            &self
                .keys
                .iter()
                .map(|(t, k)| (t, k.len()))
                .collect::<Vec<_>>(),
        );
        d.field(
            "by",
            &match &self.by {
                None => "none".to_owned(),
                Some(TierBy::Fn(_)) => "fn".to_owned(),
                Some(TierBy::Header(h)) => format!("header {h}"),
            },
        );
        d.finish()
    }
}

impl Tiers {
    pub(super) fn is_empty(&self) -> bool {
        self.list.is_empty() && self.keys.is_empty() && self.by.is_none() && !self.bad_header
    }

    /// Checks the tiers of rule `rule` (keyed by header `key_header`, if
    /// by one header) and makes the picker; `first` is the index of the
    /// first tier's limit among the layer's rules.
    pub(super) fn compile(
        &self,
        key_header: Option<&HeaderName>,
        first: u16,
    ) -> Result<TierPick, TierError> {
        if self.bad_header {
            return Err(TierError::BadHeader);
        }
        for (i, (name, _)) in self.list.iter().enumerate() {
            if !valid_tier_name(name) || self.list[..i].iter().any(|(n, _)| n == name) {
                return Err(TierError::InvalidName(name.clone()));
            }
        }
        let index = |tier: &str| {
            self.list
                .iter()
                .position(|(n, _)| n == tier)
                // Fits: a layer has at most u16::MAX limits (checked by `build`).
                .map(|i| first + i as u16)
                .ok_or_else(|| TierError::Unknown(tier.to_owned()))
        };
        let listed = |list: &mut dyn Iterator<Item = &str>| list.collect::<Vec<_>>().join(", ");
        let mut keys = None;
        if !self.keys.is_empty() {
            let Some(header) = key_header else {
                return Err(TierError::KeysNeedHeader(listed(
                    &mut self.keys.iter().map(|(t, _)| t.as_str()),
                )));
            };
            let mut map = HashMap::new();
            for (tier, values) in &self.keys {
                let at = index(tier)?;
                for v in values {
                    map.insert(v.clone().into_bytes().into_boxed_slice(), at);
                }
            }
            keys = Some((header.clone(), map));
        }
        if self.list.is_empty() || (keys.is_none() && self.by.is_none()) {
            return Err(TierError::NoPick(listed(
                &mut self.list.iter().map(|(t, _)| t.as_str()),
            )));
        }
        Ok(TierPick {
            first,
            names: self
                .list
                .iter()
                .map(|(n, _)| Box::from(n.as_str()))
                .collect(),
            keys,
            by: self.by.clone(),
        })
    }
}

/// A tier name: a letter, then up to 31 letters, digits, `-` or `_` (it
/// is part of a Redis rule's key names).
fn valid_tier_name(name: &str) -> bool {
    let b = name.as_bytes();
    !b.is_empty()
        && b.len() <= 32
        && b[0].is_ascii_alphabetic()
        && b.iter()
            .all(|&c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_')
}

/// The limit index of each listed key value.
type KeyTiers = HashMap<Box<[u8]>, u16>;

/// A rule's tiers as built: which limit a request is checked against.
pub(super) struct TierPick {
    /// The index of the first tier's limit among the layer's rules.
    first: u16,
    names: Box<[Box<str>]>,
    /// The rule's key header and the limit index of each listed value.
    keys: Option<(HeaderName, KeyTiers)>,
    by: Option<TierBy>,
}

impl TierPick {
    /// The index of the limit a request is checked against: a listed key's
    /// tier, else the tier the function or header names, else `own` (the
    /// rule's own policy; so is a name that is not one of the tiers).
    pub(super) fn pick(&self, own: u16, headers: &HeaderMap, extensions: &Extensions) -> u16 {
        if let Some((header, map)) = &self.keys {
            // A line of many names no tier: see `single_header`.
            if let Some(&at) = single_header(headers, header)
                .ok()
                .and_then(|v| map.get(v.as_bytes()))
            {
                return at;
            }
        }
        let name = match &self.by {
            None => None,
            Some(TierBy::Fn(f)) => f(headers, extensions),
            Some(TierBy::Header(h)) => single_header(headers, h).ok().and_then(|v| v.to_str().ok()),
        };
        name.and_then(|n| self.names.iter().position(|t| &**t == n))
            // Fits: at most u16::MAX limits.
            .map_or(own, |i| self.first + i as u16)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Rate;

    fn tiers() -> Tiers {
        let p = Policy::token_bucket(Rate::per_second(10));
        Tiers {
            list: vec![("premium".into(), p), ("gold".into(), p)],
            keys: vec![("gold".into(), vec!["k-gold".into()])],
            by: Some(TierBy::Header(HeaderName::from_static("x-plan"))),
            bad_header: false,
        }
    }

    #[test]
    fn listed_keys_come_first_then_the_header_then_the_own_policy() {
        let key = HeaderName::from_static("x-api-key");
        let pick = tiers().compile(Some(&key), 7).ok().unwrap();
        let ext = Extensions::new();
        let mut h = HeaderMap::new();
        assert_eq!(pick.pick(3, &h, &ext), 3);
        h.insert("x-plan", "premium".parse().unwrap());
        assert_eq!(pick.pick(3, &h, &ext), 7);
        h.insert("x-api-key", "k-gold".parse().unwrap());
        assert_eq!(pick.pick(3, &h, &ext), 8);
        h.insert("x-api-key", "k-other".parse().unwrap());
        // The second tier by name: the first tier's index plus one.
        h.insert("x-plan", "gold".parse().unwrap());
        assert_eq!(pick.pick(3, &h, &ext), 8);
        h.insert("x-plan", "platinum".parse().unwrap());
        assert_eq!(
            pick.pick(3, &h, &ext),
            3,
            "a name that is no tier: the own policy"
        );
        // A header sent twice names nothing, even when both lines agree.
        let mut h = HeaderMap::new();
        h.append("x-api-key", "k-gold".parse().unwrap());
        h.append("x-api-key", "k-gold".parse().unwrap());
        assert_eq!(pick.pick(3, &h, &ext), 3, "a key listed twice");
        h.insert("x-api-key", "k-other".parse().unwrap());
        h.append("x-plan", "premium".parse().unwrap());
        h.append("x-plan", "premium".parse().unwrap());
        assert_eq!(pick.pick(3, &h, &ext), 3, "a tier named twice");
    }

    #[test]
    fn bad_tiers_are_errors_naming_the_tier() {
        let key = HeaderName::from_static("x-api-key");
        let err = |t: Tiers, key: Option<&HeaderName>| t.compile(key, 1).err().unwrap();
        let mut t = tiers();
        t.keys.push(("silver".into(), vec!["k".into()]));
        assert_eq!(err(t, Some(&key)), TierError::Unknown("silver".into()));
        for bad in ["", "1st", "pre mium", "a:b", &"x".repeat(33), "premium"] {
            let mut t = tiers();
            t.list
                .push((bad.to_owned(), Policy::token_bucket(Rate::per_second(1))));
            assert_eq!(err(t, Some(&key)), TierError::InvalidName(bad.to_owned()));
        }
        assert_eq!(err(tiers(), None), TierError::KeysNeedHeader("gold".into()));
        let mut t = tiers();
        t.keys.clear();
        t.by = None;
        assert_eq!(
            err(t, Some(&key)),
            TierError::NoPick("premium, gold".into())
        );
        let mut t = tiers();
        t.bad_header = true;
        assert_eq!(err(t, Some(&key)), TierError::BadHeader);
    }
}
