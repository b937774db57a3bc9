//! `POST /json`: the same request and answer as gRPC, in the protocol's
//! JSON mapping (what envoyproxy/ratelimit's `/json` reads and writes):
//! fields in lowerCamelCase (the proto names are accepted too), enums by
//! name, durations as `"1.500s"`, fields at their default left out.

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    rate_limit::Unit as PbUnit, Code,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::UInt64Value;
use serde::Deserialize;
use serde_json::{json, Map, Value};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonRequest {
    #[serde(default)]
    domain: String,
    #[serde(default)]
    descriptors: Vec<JsonDescriptor>,
    #[serde(default, alias = "hits_addend", rename = "hitsAddend")]
    hits_addend: Option<JsonUint>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonDescriptor {
    #[serde(default)]
    entries: Vec<JsonEntry>,
    #[serde(default)]
    limit: Option<JsonOverride>,
    #[serde(default, alias = "hits_addend", rename = "hitsAddend")]
    hits_addend: Option<JsonUint>,
    #[serde(default, alias = "is_negative_hits", rename = "isNegativeHits")]
    is_negative_hits: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonEntry {
    #[serde(default)]
    key: String,
    #[serde(default)]
    value: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonOverride {
    #[serde(default, alias = "requests_per_unit", rename = "requestsPerUnit")]
    requests_per_unit: Option<JsonUint>,
    #[serde(default)]
    unit: Option<JsonEnum>,
}

/// An integer as a JSON number or a decimal string (how the JSON mapping
/// writes 64-bit integers); a number in any integral form (`2.0`, `2e0`)
/// reads as the JSON mapping reads it.
#[derive(Deserialize)]
#[serde(untagged)]
enum JsonUint {
    Number(u64),
    Float(f64),
    Text(String),
}

impl JsonUint {
    fn get(&self) -> Result<u64, String> {
        match self {
            JsonUint::Number(n) => Ok(*n),
            // Integral, and exactly representable below 2^53.
            JsonUint::Float(f) if f.fract() == 0.0 && *f >= 0.0 && *f < 9_007_199_254_740_992.0 => {
                Ok(*f as u64)
            }
            JsonUint::Float(f) => Err(format!("`{f}` is not a non-negative integer")),
            JsonUint::Text(t) => t.parse().map_err(|_| format!("`{t}` is not an integer")),
        }
    }
}

/// An enum by name or by number.
#[derive(Deserialize)]
#[serde(untagged)]
enum JsonEnum {
    Number(i32),
    Name(String),
}

/// A `RateLimitRequest` from the JSON mapping; the error says what is wrong.
pub(crate) fn parse_request(body: &[u8]) -> Result<RateLimitRequest, String> {
    let r: JsonRequest = serde_json::from_slice(body).map_err(|e| e.to_string())?;
    let hits_addend = match &r.hits_addend {
        Some(h) => u32::try_from(h.get()?).map_err(|_| "hitsAddend is over 2^32 - 1".to_owned())?,
        None => 0,
    };
    let mut descriptors = Vec::with_capacity(r.descriptors.len());
    for d in r.descriptors {
        let limit = match d.limit {
            None => None,
            Some(l) => Some(RateLimitOverride {
                requests_per_unit: match &l.requests_per_unit {
                    Some(n) => u32::try_from(n.get()?)
                        .map_err(|_| "requestsPerUnit is over 2^32 - 1".to_owned())?,
                    None => 0,
                },
                unit: match l.unit {
                    None => 0,
                    Some(JsonEnum::Number(n)) => n,
                    Some(JsonEnum::Name(name)) => PbUnit::from_str_name(&name)
                        .ok_or_else(|| format!("unknown unit `{name}`"))?
                        as i32,
                },
            }),
        };
        descriptors.push(RateLimitDescriptor {
            entries: d
                .entries
                .into_iter()
                .map(|e| Entry {
                    key: e.key,
                    value: e.value,
                })
                .collect(),
            limit,
            hits_addend: match &d.hits_addend {
                Some(h) => Some(UInt64Value { value: h.get()? }),
                None => None,
            },
            is_negative_hits: d.is_negative_hits,
        });
    }
    Ok(RateLimitRequest {
        domain: r.domain,
        descriptors,
        hits_addend,
    })
}

fn code_name(code: i32) -> &'static str {
    Code::try_from(code).map_or("UNKNOWN", |c| c.as_str_name())
}

/// A protobuf `Duration` in the JSON mapping: `"30s"`, `"1.500s"`.
fn duration_text(seconds: i64, nanos: i32) -> String {
    if nanos == 0 {
        format!("{seconds}s")
    } else if nanos % 1_000_000 == 0 {
        format!("{seconds}.{:03}s", nanos / 1_000_000)
    } else if nanos % 1_000 == 0 {
        format!("{seconds}.{:06}s", nanos / 1_000)
    } else {
        format!("{seconds}.{nanos:09}s")
    }
}

/// A `RateLimitResponse` in the JSON mapping.
pub(crate) fn response_json(r: &RateLimitResponse) -> Value {
    let mut out = Map::new();
    out.insert("overallCode".into(), json!(code_name(r.overall_code)));
    let statuses: Vec<Value> = r
        .statuses
        .iter()
        .map(|s| {
            let mut m = Map::new();
            m.insert("code".into(), json!(code_name(s.code)));
            if let Some(l) = &s.current_limit {
                let mut lm = Map::new();
                if !l.name.is_empty() {
                    lm.insert("name".into(), json!(l.name));
                }
                if l.requests_per_unit != 0 {
                    lm.insert("requestsPerUnit".into(), json!(l.requests_per_unit));
                }
                let unit = PbUnit::try_from(l.unit).unwrap_or(PbUnit::Unknown);
                if unit != PbUnit::Unknown {
                    lm.insert("unit".into(), json!(unit.as_str_name()));
                }
                m.insert("currentLimit".into(), Value::Object(lm));
            }
            if s.limit_remaining != 0 {
                m.insert("limitRemaining".into(), json!(s.limit_remaining));
            }
            if let Some(d) = &s.duration_until_reset {
                m.insert(
                    "durationUntilReset".into(),
                    json!(duration_text(d.seconds, d.nanos)),
                );
            }
            Value::Object(m)
        })
        .collect();
    if !statuses.is_empty() {
        out.insert("statuses".into(), Value::Array(statuses));
    }
    if !r.response_headers_to_add.is_empty() {
        let headers: Vec<Value> = r
            .response_headers_to_add
            .iter()
            .map(|h| json!({ "key": h.key, "value": h.value }))
            .collect();
        out.insert("responseHeadersToAdd".into(), Value::Array(headers));
    }
    Value::Object(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_read_in_both_spellings_and_unknown_fields_are_refused() {
        let r = parse_request(
            br#"{"domain":"d","hits_addend":3,"descriptors":[{"entries":[{"key":"k","value":"v"}],"limit":{"requestsPerUnit":"7","unit":"MINUTE"},"hitsAddend":"0"}]}"#,
        )
        .unwrap();
        assert_eq!(r.domain, "d");
        assert_eq!(r.hits_addend, 3);
        let d = &r.descriptors[0];
        assert_eq!(
            (d.entries[0].key.as_str(), d.entries[0].value.as_str()),
            ("k", "v")
        );
        assert_eq!(d.limit.unwrap().requests_per_unit, 7);
        assert_eq!(d.limit.unwrap().unit, PbUnit::Minute as i32);
        assert_eq!(d.hits_addend, Some(UInt64Value { value: 0 }));
        assert!(parse_request(br#"{"domain":"d","extra":1}"#).is_err());
        assert!(
            parse_request(br#"{"domain":"d","descriptors":[{"limit":{"unit":"FORTNIGHT"}}]}"#)
                .unwrap_err()
                .contains("FORTNIGHT")
        );
        assert!(parse_request(b"not json").is_err());
        assert!(parse_request(br#"{"hitsAddend": 4294967296}"#).is_err());
    }

    #[test]
    fn durations_are_written_as_the_json_mapping_writes_them() {
        assert_eq!(duration_text(30, 0), "30s");
        assert_eq!(duration_text(1, 500_000_000), "1.500s");
        assert_eq!(duration_text(0, 1_000), "0.000001s");
        assert_eq!(duration_text(0, 7), "0.000000007s");
    }
}
