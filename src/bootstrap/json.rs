//! The proto3 JSON mapping of `RateLimitRequest` / `RateLimitResponse`, for the reference's
//! `/json` endpoint. envoy-types' messages have no serde support, so the few fields of the
//! RLS messages are mapped here by hand, following the mapping's rules: lowerCamelCase names
//! (the original snake_case names accepted too), enums as names (numbers accepted), 64-bit
//! integers as strings (numbers accepted), wrappers as their plain value, `Duration` as
//! `"1.5s"`, and default values left out of the output.

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{rate_limit::Unit, Code};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::UInt64Value;
use serde_json::{Map, Value};

/// Why a body is not a `RateLimitRequest`. Names the field, never echoes a value.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{field}: {problem}")]
pub struct JsonError {
    pub field: String,
    pub problem: String,
}

fn bad(field: &str, problem: impl Into<String>) -> JsonError {
    JsonError {
        field: field.to_owned(),
        problem: problem.into(),
    }
}

/// Looks a field up by its JSON name or its proto name; unknown fields are errors, as in
/// protojson's default.
struct Fields<'a> {
    map: &'a Map<String, Value>,
    path: String,
}

impl<'a> Fields<'a> {
    fn new(value: &'a Value, path: &str, known: &[(&str, &str)]) -> Result<Self, JsonError> {
        let Value::Object(map) = value else {
            return Err(bad(path, "expected an object"));
        };
        for key in map.keys() {
            if !known
                .iter()
                .any(|(json, proto)| key == json || key == proto)
            {
                return Err(bad(&join(path, key), "unknown field"));
            }
        }
        Ok(Self {
            map,
            path: path.to_owned(),
        })
    }

    /// The field, with `null` meaning absent.
    fn get(&self, json: &str, proto: &str) -> Option<(&'a Value, String)> {
        self.map
            .get(json)
            .or_else(|| self.map.get(proto))
            .filter(|v| !v.is_null())
            .map(|v| (v, join(&self.path, json)))
    }
}

fn join(path: &str, name: &str) -> String {
    if path.is_empty() {
        name.to_owned()
    } else {
        format!("{path}.{name}")
    }
}

fn string(value: &Value, field: &str) -> Result<String, JsonError> {
    value
        .as_str()
        .map(str::to_owned)
        .ok_or_else(|| bad(field, "expected a string"))
}

/// An unsigned integer written as a JSON number or a decimal string.
fn unsigned(value: &Value, field: &str, max: u64) -> Result<u64, JsonError> {
    let n = match value {
        Value::Number(n) => n.as_u64(),
        Value::String(s) => s.parse::<u64>().ok(),
        _ => None,
    };
    n.filter(|n| *n <= max)
        .ok_or_else(|| bad(field, format!("expected an integer from 0 to {max}")))
}

fn list<'a>(value: &'a Value, field: &str) -> Result<&'a Vec<Value>, JsonError> {
    value
        .as_array()
        .ok_or_else(|| bad(field, "expected an array"))
}

fn unit(value: &Value, field: &str) -> Result<i32, JsonError> {
    // `envoy.type.v3.RateLimitUnit` names; numbers pass through and are checked later.
    match value {
        Value::String(s) => match s.as_str() {
            "UNKNOWN" => Ok(0),
            "SECOND" => Ok(1),
            "MINUTE" => Ok(2),
            "HOUR" => Ok(3),
            "DAY" => Ok(4),
            "MONTH" => Ok(5),
            "YEAR" => Ok(6),
            _ => Err(bad(field, "unknown unit name")),
        },
        other => unsigned(other, field, i32::MAX as u64).map(|n| n as i32),
    }
}

pub fn parse_request(body: &[u8]) -> Result<RateLimitRequest, JsonError> {
    let value: Value = serde_json::from_slice(body).map_err(|e| {
        // serde_json's message names line and column, not the content.
        bad("(body)", format!("not JSON: {e}"))
    })?;
    let top = Fields::new(
        &value,
        "",
        &[
            ("domain", "domain"),
            ("descriptors", "descriptors"),
            ("hitsAddend", "hits_addend"),
        ],
    )?;
    let mut request = RateLimitRequest::default();
    if let Some((v, f)) = top.get("domain", "domain") {
        request.domain = string(v, &f)?;
    }
    if let Some((v, f)) = top.get("hitsAddend", "hits_addend") {
        request.hits_addend = unsigned(v, &f, u64::from(u32::MAX))? as u32;
    }
    if let Some((v, f)) = top.get("descriptors", "descriptors") {
        for (i, d) in list(v, &f)?.iter().enumerate() {
            request
                .descriptors
                .push(descriptor(d, &format!("{f}[{i}]"))?);
        }
    }
    Ok(request)
}

fn descriptor(value: &Value, path: &str) -> Result<RateLimitDescriptor, JsonError> {
    let fields = Fields::new(
        value,
        path,
        &[
            ("entries", "entries"),
            ("limit", "limit"),
            ("hitsAddend", "hits_addend"),
            ("isNegativeHits", "is_negative_hits"),
        ],
    )?;
    let mut d = RateLimitDescriptor::default();
    if let Some((v, f)) = fields.get("entries", "entries") {
        for (i, e) in list(v, &f)?.iter().enumerate() {
            let at = format!("{f}[{i}]");
            let entry = Fields::new(e, &at, &[("key", "key"), ("value", "value")])?;
            let mut out = Entry::default();
            if let Some((v, f)) = entry.get("key", "key") {
                out.key = string(v, &f)?;
            }
            if let Some((v, f)) = entry.get("value", "value") {
                out.value = string(v, &f)?;
            }
            d.entries.push(out);
        }
    }
    if let Some((v, f)) = fields.get("limit", "limit") {
        let limit = Fields::new(
            v,
            &f,
            &[("requestsPerUnit", "requests_per_unit"), ("unit", "unit")],
        )?;
        let mut out = RateLimitOverride::default();
        if let Some((v, f)) = limit.get("requestsPerUnit", "requests_per_unit") {
            out.requests_per_unit = unsigned(v, &f, u64::from(u32::MAX))? as u32;
        }
        if let Some((v, f)) = limit.get("unit", "unit") {
            out.unit = unit(v, &f)?;
        }
        d.limit = Some(out);
    }
    if let Some((v, f)) = fields.get("hitsAddend", "hits_addend") {
        d.hits_addend = Some(UInt64Value {
            value: unsigned(v, &f, u64::MAX)?,
        });
    }
    if let Some((v, f)) = fields.get("isNegativeHits", "is_negative_hits") {
        d.is_negative_hits = v
            .as_bool()
            .ok_or_else(|| bad(&f, "expected true or false"))?;
    }
    Ok(d)
}

fn code_name(code: i32) -> Value {
    match Code::try_from(code) {
        Ok(c) => Value::String(c.as_str_name().to_owned()),
        Err(_) => Value::from(code),
    }
}

fn unit_name(unit: i32) -> Value {
    match Unit::try_from(unit) {
        Ok(u) => Value::String(u.as_str_name().to_owned()),
        Err(_) => Value::from(unit),
    }
}

/// `Duration` in its JSON form: seconds with up to nine fractional digits and an `s`.
fn duration(seconds: i64, nanos: i32) -> String {
    if nanos == 0 {
        format!("{seconds}s")
    } else {
        let frac = format!("{:09}", nanos.unsigned_abs());
        format!("{seconds}.{}s", frac.trim_end_matches('0'))
    }
}

pub fn response_json(response: &RateLimitResponse) -> Value {
    let mut top = Map::new();
    if response.overall_code != 0 {
        top.insert("overallCode".into(), code_name(response.overall_code));
    }
    let statuses: Vec<Value> = response
        .statuses
        .iter()
        .map(|s| {
            let mut m = Map::new();
            if s.code != 0 {
                m.insert("code".into(), code_name(s.code));
            }
            if let Some(l) = &s.current_limit {
                let mut limit = Map::new();
                if !l.name.is_empty() {
                    limit.insert("name".into(), Value::String(l.name.clone()));
                }
                if l.requests_per_unit != 0 {
                    limit.insert("requestsPerUnit".into(), Value::from(l.requests_per_unit));
                }
                if l.unit != 0 {
                    limit.insert("unit".into(), unit_name(l.unit));
                }
                m.insert("currentLimit".into(), Value::Object(limit));
            }
            if s.limit_remaining != 0 {
                m.insert("limitRemaining".into(), Value::from(s.limit_remaining));
            }
            if let Some(d) = &s.duration_until_reset {
                m.insert(
                    "durationUntilReset".into(),
                    Value::String(duration(d.seconds, d.nanos)),
                );
            }
            Value::Object(m)
        })
        .collect();
    if !statuses.is_empty() {
        top.insert("statuses".into(), Value::Array(statuses));
    }
    let headers: Vec<Value> = response
        .response_headers_to_add
        .iter()
        .map(|h| {
            let mut m = Map::new();
            m.insert("key".into(), Value::String(h.key.clone()));
            m.insert("value".into(), Value::String(h.value.clone()));
            Value::Object(m)
        })
        .collect();
    if !headers.is_empty() {
        top.insert("responseHeadersToAdd".into(), Value::Array(headers));
    }
    Value::Object(top)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_parse_in_both_name_styles_with_proto3_scalars() {
        let r = parse_request(
            br#"{"domain":"edge","hitsAddend":2,"descriptors":[
                {"entries":[{"key":"path","value":"/a"}],"hits_addend":"5",
                 "limit":{"requestsPerUnit":7,"unit":"MINUTE"}},
                {"entries":[]}]}"#,
        )
        .unwrap();
        assert_eq!(r.domain, "edge");
        assert_eq!(r.hits_addend, 2);
        assert_eq!(r.descriptors.len(), 2);
        let d = &r.descriptors[0];
        assert_eq!(
            (d.entries[0].key.as_str(), d.entries[0].value.as_str()),
            ("path", "/a")
        );
        assert_eq!(d.hits_addend.as_ref().map(|h| h.value), Some(5));
        let limit = d.limit.as_ref().unwrap();
        assert_eq!((limit.requests_per_unit, limit.unit), (7, 2));
    }

    #[test]
    fn bad_bodies_name_the_field() {
        for (body, field) in [
            (&br#"{"domian":"x"}"#[..], "domian"),
            (br#"{"domain":1}"#, "domain"),
            (
                br#"{"descriptors":[{"entries":[{"key":"k","vlaue":"v"}]}]}"#,
                "descriptors[0].entries[0].vlaue",
            ),
            (br#"{"hitsAddend":-1}"#, "hitsAddend"),
            (
                br#"{"descriptors":[{"limit":{"unit":"FORTNIGHT"}}]}"#,
                "descriptors[0].limit.unit",
            ),
            (b"not json", "(body)"),
            (b"[]", ""),
        ] {
            let e = parse_request(body).unwrap_err();
            assert_eq!(e.field, field, "{e}");
        }
    }

    #[test]
    fn responses_use_names_and_leave_defaults_out() {
        use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
            DescriptorStatus, RateLimit,
        };
        use envoy_types::pb::google::protobuf::Duration;
        let r = RateLimitResponse {
            overall_code: Code::OverLimit as i32,
            statuses: vec![
                DescriptorStatus {
                    code: Code::OverLimit as i32,
                    current_limit: Some(RateLimit {
                        name: String::new(),
                        requests_per_unit: 3,
                        unit: Unit::Minute as i32,
                    }),
                    limit_remaining: 0,
                    duration_until_reset: Some(Duration {
                        seconds: 12,
                        nanos: 500_000_000,
                    }),
                    quota: None,
                },
                DescriptorStatus {
                    code: Code::Ok as i32,
                    ..Default::default()
                },
            ],
            ..Default::default()
        };
        let json = response_json(&r).to_string();
        assert_eq!(
            json,
            r#"{"overallCode":"OVER_LIMIT","statuses":[{"code":"OVER_LIMIT","currentLimit":{"requestsPerUnit":3,"unit":"MINUTE"},"durationUntilReset":"12.5s"},{"code":"OK"}]}"#
        );
    }
}
