//! Go duration strings (`time.ParseDuration`), the format KubeProxyConfiguration uses for
//! `syncPeriod`, `minSyncPeriod` and the `conntrack.*Timeout` fields: a sequence of decimal
//! numbers, each with an optional fraction and a unit suffix, such as `300ms`, `1.5h` or
//! `2h45m`. Valid units are `ns`, `us` (or `µs`/`μs`), `ms`, `s`, `m`, `h`. A bare `0` is
//! zero. Negative durations are rejected: no xlb setting can use one.

use std::time::Duration;

/// A string that is not a Go duration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid duration {text:?}: {why} (use Go syntax such as \"30s\", \"1m30s\", \"500ms\")")]
pub struct DurationParseError {
    /// The text that was given.
    pub text: String,
    /// What is wrong with it.
    pub why: &'static str,
}

/// Parses a Go duration string into a [`Duration`].
///
/// # Errors
/// [`DurationParseError`] if `s` is empty, negative, has a number without a unit (other than a
/// lone `0`), an unknown unit, or overflows.
pub fn parse_go_duration(s: &str) -> Result<Duration, DurationParseError> {
    let err = |why| DurationParseError { text: s.to_owned(), why };
    let mut rest = s.trim();
    if let Some(r) = rest.strip_prefix('+') {
        rest = r;
    } else if rest.starts_with('-') {
        return Err(err("negative durations are not allowed"));
    }
    if rest.is_empty() {
        return Err(err("empty"));
    }
    if rest == "0" {
        return Ok(Duration::ZERO);
    }
    let mut total_ns: u128 = 0;
    while !rest.is_empty() {
        let num_len = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(rest.len());
        let (num, tail) = rest.split_at(num_len);
        if num.is_empty() || num == "." {
            return Err(err("expected a number"));
        }
        let unit_len = tail.find(|c: char| c.is_ascii_digit() || c == '.').unwrap_or(tail.len());
        let (unit, tail) = tail.split_at(unit_len);
        let unit_ns: u128 = match unit {
            "ns" => 1,
            "us" | "µs" | "μs" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60 * 1_000_000_000,
            "h" => 3_600 * 1_000_000_000,
            "" => return Err(err("missing unit")),
            _ => return Err(err("unknown unit")),
        };
        let (int_part, frac_part) = match num.split_once('.') {
            Some((i, f)) => (i, f),
            None => (num, ""),
        };
        if frac_part.contains('.') {
            return Err(err("expected a number"));
        }
        let int: u128 = if int_part.is_empty() { 0 } else { int_part.parse().map_err(|_| err("number too large"))? };
        let mut value = int.checked_mul(unit_ns).ok_or_else(|| err("too large"))?;
        // Fraction: digits beyond nanosecond precision are dropped, as Go does.
        let mut scale = unit_ns;
        for d in frac_part.chars() {
            scale /= 10;
            if scale == 0 {
                break;
            }
            let digit = u128::from(d.to_digit(10).ok_or_else(|| err("expected a number"))?);
            value += digit * scale;
        }
        total_ns = total_ns.checked_add(value).ok_or_else(|| err("too large"))?;
        rest = tail;
    }
    let secs = u64::try_from(total_ns / 1_000_000_000).map_err(|_| err("too large"))?;
    let nanos = u32::try_from(total_ns % 1_000_000_000).map_err(|_| err("too large"))?;
    Ok(Duration::new(secs, nanos))
}

/// Formats a duration the way Go prints one (`1h0m0s`, `1m30s`, `500ms`, `0s`), so values
/// echo back in the syntax they were written in.
pub fn format_go_duration(d: Duration) -> String {
    if d.is_zero() {
        return "0s".to_owned();
    }
    if d < Duration::from_secs(1) {
        let ns = d.as_nanos();
        return if ns.is_multiple_of(1_000_000) {
            format!("{}ms", ns / 1_000_000)
        } else if ns.is_multiple_of(1_000) {
            format!("{}us", ns / 1_000)
        } else {
            format!("{ns}ns")
        };
    }
    let total = d.as_secs();
    let (h, m, s) = (total / 3600, (total / 60) % 60, total % 60);
    let frac = d.subsec_nanos();
    let secs = if frac == 0 {
        format!("{s}")
    } else {
        let f = format!("{frac:09}");
        format!("{s}.{}", f.trim_end_matches('0'))
    };
    if h > 0 {
        format!("{h}h{m}m{secs}s")
    } else if m > 0 {
        format!("{m}m{secs}s")
    } else {
        format!("{secs}s")
    }
}

/// `deserialize_with` helper: a Go duration string.
///
/// # Errors
/// A serde error carrying the [`DurationParseError`] message.
pub fn deserialize<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let s: String = serde::Deserialize::deserialize(d)?;
    parse_go_duration(&s).map_err(serde::de::Error::custom)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_go_syntax() {
        assert_eq!(parse_go_duration("1s").unwrap(), Duration::from_secs(1));
        assert_eq!(parse_go_duration("30s").unwrap(), Duration::from_secs(30));
        assert_eq!(parse_go_duration("1m30s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_go_duration("2h45m").unwrap(), Duration::from_secs(9900));
        assert_eq!(parse_go_duration("1.5h").unwrap(), Duration::from_secs(5400));
        assert_eq!(parse_go_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_go_duration("0").unwrap(), Duration::ZERO);
        assert_eq!(parse_go_duration("10us").unwrap(), Duration::from_micros(10));
        assert_eq!(parse_go_duration(".5s").unwrap(), Duration::from_millis(500));
    }

    #[test]
    fn rejects_bad_syntax() {
        for bad in ["", "1", "5x", "-1s", "s", "1..5s", "1.5.5s"] {
            assert!(parse_go_duration(bad).is_err(), "{bad:?} should be rejected");
        }
    }

    #[test]
    fn formats_like_go() {
        assert_eq!(format_go_duration(Duration::from_secs(3600)), "1h0m0s");
        assert_eq!(format_go_duration(Duration::from_secs(90)), "1m30s");
        assert_eq!(format_go_duration(Duration::from_millis(500)), "500ms");
        assert_eq!(format_go_duration(Duration::from_millis(1500)), "1.5s");
        assert_eq!(format_go_duration(Duration::ZERO), "0s");
    }
}
