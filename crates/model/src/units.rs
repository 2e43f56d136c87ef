//! Sizes and durations as people write them in jobspecs, agent configs and volume
//! specs: one parser for all three, so `"32MiB"` and `"1m30s"` mean the same everywhere.
//!
//! **Sizes** follow Nomad (Go's `humanize.ParseBytes`): decimal units are powers of ten
//! (`KB` = 10^3, `MB` = 10^6, `GB` = 10^9, `TB` = 10^12; also `K`, `M`, `G`, `T`), binary
//! units are powers of two (`KiB` = 2^10, `MiB` = 2^20, `GiB` = 2^30, `TiB` = 2^40), the
//! unit is case-insensitive, a plain number is bytes, and a fraction is allowed
//! (`"1.5GiB"`). Nomad's `resources { memory = 256 }` is a number, not a size: it counts
//! MiB (Nomad calls them MB), and berth reads it the same way.
//!
//! **Durations** follow Go's `time.ParseDuration`: a sequence of numbers with units
//! `ns`, `us` (or `µs`), `ms`, `s`, `m`, `h`, e.g. `"250ms"`, `"1h30m"`, `"1.5s"`.
//! A bare number is refused: `"5"` could mean seconds or nanoseconds.
//!
//! Both are checked, never wrapping and never panicking: a size past 2^63 bytes or a
//! duration past [`MAX_DURATION`] is an error, so no later `Instant + duration` can
//! overflow.
//!
//! ```
//! use berth_model::units::{parse_duration, parse_size};
//! use std::time::Duration;
//!
//! assert_eq!(parse_size("32MiB"), Ok(32 << 20));
//! assert_eq!(parse_size("32MB"), Ok(32_000_000));
//! assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
//! assert!(parse_duration("9999999999999999h").is_err());
//! ```

use std::time::Duration;

/// The longest duration berth accepts anywhere: 100 years. Far beyond any sensible
/// timeout or interval, and far below what `Instant` arithmetic can hold.
pub const MAX_DURATION: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// The largest size berth accepts: 2^63 - 1 bytes (8 EiB), so a size fits an `i64`
/// (CSI capacities are `int64`).
pub const MAX_SIZE: u64 = i64::MAX as u64;

/// Why a size or a duration could not be read. The messages complete a sentence that
/// starts with the value, e.g. `"12XB": unknown unit "XB" (…)`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UnitError {
    #[error("is empty")]
    Empty,
    #[error("must not be negative")]
    Negative,
    #[error("{0:?} is not a number")]
    NotANumber(String),
    #[error("unknown unit {unit:?} (use {expected})")]
    UnknownUnit {
        unit: String,
        expected: &'static str,
    },
    #[error("needs a unit (e.g. \"30s\", \"5m\", \"250ms\")")]
    MissingDurationUnit,
    #[error("is too large (at most {max})")]
    TooLarge { max: &'static str },
}

const SIZE_UNITS: &str = "B, KB, MB, GB, TB (powers of 10) or KiB, MiB, GiB, TiB (powers of 2)";
const DURATION_UNITS: &str = "ns, us, ms, s, m or h";

/// A size in bytes: `"10MiB"`, `"1.5GB"`, `"512"`.
pub fn parse_size(text: &str) -> Result<u64, UnitError> {
    let text = text.trim();
    if text.is_empty() {
        return Err(UnitError::Empty);
    }
    if text.starts_with('-') {
        return Err(UnitError::Negative);
    }
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let scale: u128 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" => 1_000,
        "m" | "mb" => 1_000_000,
        "g" | "gb" => 1_000_000_000,
        "t" | "tb" => 1_000_000_000_000,
        "ki" | "kib" => 1 << 10,
        "mi" | "mib" => 1 << 20,
        "gi" | "gib" => 1 << 30,
        "ti" | "tib" => 1 << 40,
        _ => {
            return Err(UnitError::UnknownUnit {
                unit: unit.trim().to_string(),
                expected: SIZE_UNITS,
            });
        }
    };
    let bytes = scaled(number, scale).map_err(|e| e.into_unit_error(text, "8EiB"))?;
    u64::try_from(bytes)
        .ok()
        .filter(|&b| b <= MAX_SIZE)
        .ok_or(UnitError::TooLarge { max: "8EiB" })
}

/// A duration: `"250ms"`, `"5s"`, `"1h30m"`, `"1.5h"`.
pub fn parse_duration(text: &str) -> Result<Duration, UnitError> {
    let mut rest = text.trim();
    if rest.is_empty() {
        return Err(UnitError::Empty);
    }
    if rest.starts_with('-') {
        return Err(UnitError::Negative);
    }
    let too_large = UnitError::TooLarge { max: "876000h" };
    let mut total_nanos: u128 = 0;
    while !rest.is_empty() {
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (number, after) = rest.split_at(number_len);
        let unit_len = after
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(after.len());
        let (unit, after) = after.split_at(unit_len);
        if number.is_empty() {
            return Err(UnitError::NotANumber(rest.to_string()));
        }
        let scale: u128 = match unit {
            "ns" => 1,
            "us" | "µs" | "μs" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60 * 1_000_000_000,
            "h" => 3600 * 1_000_000_000,
            "" => return Err(UnitError::MissingDurationUnit),
            other => {
                return Err(UnitError::UnknownUnit {
                    unit: other.to_string(),
                    expected: DURATION_UNITS,
                });
            }
        };
        let nanos = scaled(number, scale).map_err(|e| e.into_unit_error(number, "876000h"))?;
        total_nanos = total_nanos
            .checked_add(nanos)
            .ok_or_else(|| too_large.clone())?;
        rest = after;
    }
    if total_nanos > MAX_DURATION.as_nanos() {
        return Err(too_large);
    }
    // Within MAX_DURATION, so the seconds fit a u64.
    let secs = (total_nanos / 1_000_000_000) as u64;
    let nanos = (total_nanos % 1_000_000_000) as u32;
    Ok(Duration::new(secs, nanos))
}

enum Malformed {
    NotANumber,
    Overflow,
}

impl Malformed {
    fn into_unit_error(self, text: &str, max: &'static str) -> UnitError {
        match self {
            Malformed::NotANumber => UnitError::NotANumber(text.to_string()),
            Malformed::Overflow => UnitError::TooLarge { max },
        }
    }
}

/// `number` (digits, at most one '.') times `scale`, truncated.
fn scaled(number: &str, scale: u128) -> Result<u128, Malformed> {
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    let digits_only = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    if (whole.is_empty() && fraction.is_empty()) || !digits_only(whole) || !digits_only(fraction) {
        return Err(Malformed::NotANumber);
    }
    // More than 38 digits overflows u128: an error, not a panic.
    let whole: u128 = match whole {
        "" => 0,
        digits => digits.parse().map_err(|_| Malformed::Overflow)?,
    };
    let value = whole.checked_mul(scale).ok_or(Malformed::Overflow)?;
    // fraction × scale / 10^digits, truncated. Digits past the 18th are below any unit's
    // smallest step (and would overflow 10^digits).
    let fraction = &fraction[..fraction.len().min(18)];
    let part = match fraction {
        "" => 0,
        digits => {
            let numerator: u128 = digits.parse().map_err(|_| Malformed::NotANumber)?;
            numerator * scale / 10u128.pow(digits.len() as u32)
        }
    };
    value.checked_add(part).ok_or(Malformed::Overflow)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_decimal_and_binary() {
        assert_eq!(parse_size("512"), Ok(512));
        assert_eq!(parse_size("512B"), Ok(512));
        assert_eq!(parse_size("10KB"), Ok(10_000));
        assert_eq!(parse_size("10KiB"), Ok(10 << 10));
        assert_eq!(parse_size("32MB"), Ok(32_000_000));
        assert_eq!(parse_size("32MiB"), Ok(32 << 20));
        assert_eq!(parse_size("32mib"), Ok(32 << 20));
        assert_eq!(parse_size("32 MiB"), Ok(32 << 20));
        assert_eq!(parse_size("1GB"), Ok(1_000_000_000));
        assert_eq!(parse_size("1GiB"), Ok(1 << 30));
        assert_eq!(parse_size("1.5GiB"), Ok(3 << 29));
        assert_eq!(parse_size("0.5KiB"), Ok(512));
        assert_eq!(parse_size("1.001KB"), Ok(1001));
        assert_eq!(parse_size(".5MB"), Ok(500_000));
        assert_eq!(parse_size("2TiB"), Ok(2 << 40));
        assert_eq!(
            parse_size("8EiB"),
            Err(UnitError::UnknownUnit {
                unit: "EiB".into(),
                expected: SIZE_UNITS
            })
        );
    }

    #[test]
    fn sizes_refused_with_a_reason() {
        assert_eq!(parse_size(""), Err(UnitError::Empty));
        assert_eq!(parse_size("  "), Err(UnitError::Empty));
        assert_eq!(parse_size("-5MiB"), Err(UnitError::Negative));
        assert_eq!(parse_size("MiB"), Err(UnitError::NotANumber("MiB".into())));
        assert!(matches!(
            parse_size("lots"),
            Err(UnitError::UnknownUnit { .. })
        ));
        assert_eq!(
            parse_size("1..5MiB"),
            Err(UnitError::NotANumber("1..5MiB".into()))
        );
        assert_eq!(
            parse_size("99999999999999GiB"),
            Err(UnitError::TooLarge { max: "8EiB" })
        );
        assert_eq!(
            parse_size("999999999999999999999999999999999999999999999999"),
            Err(UnitError::TooLarge { max: "8EiB" })
        );
        assert_eq!(
            parse_size("8388608TiB"),
            Err(UnitError::TooLarge { max: "8EiB" })
        );
        assert_eq!(parse_size("8388607TiB"), Ok(8_388_607 << 40));
    }

    #[test]
    fn durations_as_go_writes_them() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("5s"), Ok(Duration::from_secs(5)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("1.5h"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("0.000000001s"), Ok(Duration::from_nanos(1)));
        assert_eq!(
            parse_duration("1.1234567890123456789s"),
            Ok(Duration::new(1, 123_456_789))
        );
        assert_eq!(parse_duration("10us"), Ok(Duration::from_micros(10)));
        assert_eq!(parse_duration("10µs"), Ok(Duration::from_micros(10)));
        assert_eq!(parse_duration("7ns"), Ok(Duration::from_nanos(7)));
        assert_eq!(parse_duration("876000h"), Ok(MAX_DURATION));
    }

    #[test]
    fn durations_refused_with_a_reason() {
        assert_eq!(parse_duration(""), Err(UnitError::Empty));
        assert_eq!(parse_duration("-5s"), Err(UnitError::Negative));
        assert_eq!(parse_duration("5"), Err(UnitError::MissingDurationUnit));
        assert!(matches!(
            parse_duration("5x"),
            Err(UnitError::UnknownUnit { .. })
        ));
        assert!(matches!(parse_duration("s"), Err(UnitError::NotANumber(_))));
        assert_eq!(
            parse_duration("9999999999999999h"),
            Err(UnitError::TooLarge { max: "876000h" })
        );
        assert_eq!(
            parse_duration("876001h"),
            Err(UnitError::TooLarge { max: "876000h" })
        );
        assert_eq!(
            parse_duration("99999999999999999999999999999999999999999h"),
            Err(UnitError::TooLarge { max: "876000h" })
        );
        assert_eq!(
            parse_duration("1.2.3s"),
            Err(UnitError::NotANumber("1.2.3".into()))
        );
    }

    #[test]
    fn messages_read_as_sentences() {
        assert_eq!(
            parse_duration("5x").unwrap_err().to_string(),
            "unknown unit \"x\" (use ns, us, ms, s, m or h)"
        );
        assert_eq!(
            parse_size("99999999999999GiB").unwrap_err().to_string(),
            "is too large (at most 8EiB)"
        );
    }

    mod properties {
        use proptest::prelude::*;

        use super::*;

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(4096))]

            /// Any text, and numbers of any length with a real unit: a value within
            /// bounds, or an error; never a panic.
            #[test]
            fn any_text(
                text in "\\PC{0,40}",
                whole in "[0-9]{1,45}",
                fraction in "(\\.[0-9]{0,24})?",
                unit in prop::sample::select(vec![
                    "", "B", "KB", "kib", "MB", "MiB", "GiB", "TiB", "ns", "us", "ms", "s", "m",
                    "h", "x",
                ]),
            ) {
                let number = format!("{whole}{fraction}{unit}");
                for input in [&text, &number] {
                    if let Ok(size) = parse_size(input) {
                        prop_assert!(size <= MAX_SIZE);
                    }
                    if let Ok(duration) = parse_duration(input) {
                        prop_assert!(duration <= MAX_DURATION);
                    }
                }
            }

            /// What berth prints for a duration it parsed, it parses back.
            #[test]
            fn whole_seconds_round_trip(seconds in 0u64..=MAX_DURATION.as_secs()) {
                prop_assert_eq!(
                    parse_duration(&format!("{seconds}s")),
                    Ok(Duration::from_secs(seconds))
                );
            }
        }
    }
}
