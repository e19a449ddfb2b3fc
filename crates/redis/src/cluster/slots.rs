//! The slot map: which master serves each of the 16384 slots, as `CLUSTER SLOTS` reports it.

use redis::Value;

pub const SLOTS: usize = 16384;

/// A master's address as the map names it, `host:port`.
pub type Addr = String;

/// Slot ranges and their masters, parsed from one `CLUSTER SLOTS` reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ranges(pub Vec<(u16, u16, Addr)>);

/// Parses a `CLUSTER SLOTS` reply: `[[start, end, [host, port, id, ...], replica...], ...]`.
/// An empty or `?` host means "the node you asked" (`asked_host`). `None` if the reply is not
/// shaped like that.
pub fn parse_cluster_slots(value: &Value, asked_host: &str) -> Option<Ranges> {
    let Value::Array(entries) = value else {
        return None;
    };
    let mut ranges = Vec::with_capacity(entries.len());
    for entry in entries {
        let Value::Array(fields) = entry else {
            return None;
        };
        let (start, end) = (int(fields.first()?)?, int(fields.get(1)?)?);
        let Value::Array(master) = fields.get(2)? else {
            return None;
        };
        let host = match master.first()? {
            Value::BulkString(bytes) => String::from_utf8(bytes.clone()).ok()?,
            Value::SimpleString(s) => s.clone(),
            _ => return None,
        };
        let host = if host.is_empty() || host == "?" {
            asked_host.to_owned()
        } else {
            host
        };
        let port = int(master.get(1)?)?;
        let (start, end, port) = (
            u16::try_from(start).ok()?,
            u16::try_from(end).ok()?,
            u16::try_from(port).ok()?,
        );
        if start > end || usize::from(end) >= SLOTS {
            return None;
        }
        ranges.push((start, end, format!("{host}:{port}")));
    }
    Some(Ranges(ranges))
}

fn int(value: &Value) -> Option<i64> {
    match value {
        Value::Int(i) => Some(*i),
        _ => None,
    }
}

/// Splits `host:port` (the form of `MOVED`/`ASK` targets and of the map's addresses).
pub fn split_addr(addr: &str) -> Option<(&str, u16)> {
    let (host, port) = addr.rsplit_once(':')?;
    Some((host, port.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn parses_ranges_with_replicas_and_unknown_hosts() {
        let reply = Value::Array(vec![
            Value::Array(vec![
                Value::Int(0),
                Value::Int(5460),
                Value::Array(vec![bulk("127.0.0.1"), Value::Int(7000), bulk("id0")]),
                Value::Array(vec![bulk("127.0.0.1"), Value::Int(7003), bulk("id3")]),
            ]),
            Value::Array(vec![
                Value::Int(5461),
                Value::Int(16383),
                Value::Array(vec![bulk(""), Value::Int(7001), bulk("id1")]),
            ]),
        ]);
        assert_eq!(
            parse_cluster_slots(&reply, "10.0.0.9"),
            Some(Ranges(vec![
                (0, 5460, "127.0.0.1:7000".into()),
                (5461, 16383, "10.0.0.9:7001".into()),
            ]))
        );
    }

    #[test]
    fn refuses_malformed_replies() {
        assert_eq!(parse_cluster_slots(&Value::Nil, "h"), None);
        let out_of_range = Value::Array(vec![Value::Array(vec![
            Value::Int(0),
            Value::Int(16384),
            Value::Array(vec![bulk("h"), Value::Int(1)]),
        ])]);
        assert_eq!(parse_cluster_slots(&out_of_range, "h"), None);
        assert_eq!(split_addr("127.0.0.1:7000"), Some(("127.0.0.1", 7000)));
        assert_eq!(split_addr("::1:7000"), Some(("::1", 7000)));
        assert_eq!(split_addr("nohost"), None);
    }
}
