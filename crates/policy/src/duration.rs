//! Human durations in configuration files: `250ms`, `10s`, `5m`, `1h`, `1d`. Shared by the
//! server configuration and policy files (`window:`).

use std::time::Duration;

pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(|| format!("`{text}` has no unit (use ms, s, m, h or d)"))?;
    let (digits, unit) = text.split_at(split);
    let amount: u64 = digits
        .parse()
        .map_err(|_| format!("`{text}` does not start with a whole number"))?;
    let ms_per_unit: u64 = match unit {
        "ms" => 1,
        "s" => 1000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => {
            return Err(format!(
                "`{text}` has unknown unit `{unit}` (use ms, s, m, h or d)"
            ))
        }
    };
    amount
        .checked_mul(ms_per_unit)
        .map(Duration::from_millis)
        .ok_or_else(|| format!("`{text}` is too large"))
}

pub mod serde_duration {
    use serde::{Deserialize, Deserializer};
    use std::time::Duration;

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let text = String::deserialize(d)?;
        super::parse_duration(&text).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration("2d"), Ok(Duration::from_secs(172_800)));
    }

    #[test]
    fn rejects_garbage_with_a_reason() {
        assert!(parse_duration("10").unwrap_err().contains("no unit"));
        assert!(parse_duration("ms").unwrap_err().contains("whole number"));
        assert!(parse_duration("1.5s").unwrap_err().contains("unknown unit"));
        assert!(parse_duration("99999999999999999999d").is_err());
    }
}
