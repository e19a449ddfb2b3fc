//! The caller's deadline, from the `grpc-timeout` header Envoy sends (its filter timeout).

use std::time::Duration;

use http::{HeaderMap, HeaderName};

/// By name, not by `&str`: a lookup by string parses and validates the name on every call.
static GRPC_TIMEOUT: HeaderName = HeaderName::from_static("grpc-timeout");

/// The caller's timeout from a request's `grpc-timeout` header; `None` when absent or not a
/// valid timeout.
pub fn grpc_timeout(headers: &HeaderMap) -> Option<Duration> {
    headers
        .get(&GRPC_TIMEOUT)
        .and_then(|v| v.to_str().ok())
        .and_then(parse_grpc_timeout)
}

/// Parses a gRPC timeout value: at most 8 digits and a unit (H M S m u n).
pub fn parse_grpc_timeout(value: &str) -> Option<Duration> {
    let (digits, unit) = value.split_at(value.len().checked_sub(1)?);
    if digits.is_empty() || digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let amount: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(amount.checked_mul(3600)?),
        "M" => Duration::from_secs(amount.checked_mul(60)?),
        "S" => Duration::from_secs(amount),
        "m" => Duration::from_millis(amount),
        "u" => Duration::from_micros(amount),
        "n" => Duration::from_nanos(amount),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_envoy_style_timeouts() {
        assert_eq!(parse_grpc_timeout("20m"), Some(Duration::from_millis(20)));
        assert_eq!(parse_grpc_timeout("1S"), Some(Duration::from_secs(1)));
        assert_eq!(parse_grpc_timeout("2H"), Some(Duration::from_secs(7200)));
        assert_eq!(parse_grpc_timeout("5000u"), Some(Duration::from_millis(5)));
        assert_eq!(
            parse_grpc_timeout("99999999n"),
            Some(Duration::from_nanos(99_999_999))
        );
    }

    #[test]
    fn reads_the_timeout_header() {
        let mut headers = HeaderMap::new();
        assert_eq!(grpc_timeout(&headers), None);
        headers.insert("grpc-timeout", http::HeaderValue::from_static("250m"));
        assert_eq!(grpc_timeout(&headers), Some(Duration::from_millis(250)));
        headers.insert("grpc-timeout", http::HeaderValue::from_static("soon"));
        assert_eq!(grpc_timeout(&headers), None);
    }

    #[test]
    fn rejects_malformed_timeouts() {
        for bad in ["", "m", "20", "20x", "123456789m", "-1m", "1.5S", "２m"] {
            assert_eq!(parse_grpc_timeout(bad), None, "{bad:?}");
        }
    }
}
