//! Cron expressions as Nomad reads them (its `cronexpr` library): five fields (minute,
//! hour, day of month, month, day of week), six (those and a year), or seven (a second
//! first, then those and a year); or a name such as `@daily`. A six-field expression is
//! not seconds-first as in many cron libraries: `0 3 * * * *` is 03:00 every day, not
//! second 0 of minute 3 of every hour. The `croner` crate reads the fields it shares
//! with Nomad's; the year, which it does not have, is checked here.

use chrono::{DateTime, Datelike, TimeZone, Utc};

/// The years a cron field allows (Nomad's range, 1970 to 2099).
const FIRST_YEAR: i32 = 1970;
const LAST_YEAR: i32 = 2099;

/// A parsed cron expression.
#[derive(Debug, Clone)]
pub struct CronSpec {
    cron: croner::Cron,
    /// The allowed years, when the expression names a year field other than `*`.
    years: Option<Vec<bool>>,
}

/// Why a cron expression is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CronError {
    #[error(
        "it has {0} fields; a cron expression has 5 (minute hour day-of-month month \
         day-of-week), 6 (and a year) or 7 (a second first, and a year)"
    )]
    Fields(usize),
    #[error("{0}")]
    Invalid(String),
    #[error("year field {0:?}: years are {FIRST_YEAR}-{LAST_YEAR}, `*`, lists, ranges and steps")]
    Year(String),
}

impl std::str::FromStr for CronSpec {
    type Err = CronError;

    fn from_str(text: &str) -> Result<CronSpec, CronError> {
        let fields: Vec<&str> = text.split_whitespace().collect();
        let (shared, year) = match fields.len() {
            _ if text.trim_start().starts_with('@') => (text.trim().to_string(), None),
            5 => (fields.join(" "), None),
            6 => (fields[..5].join(" "), Some(fields[5])),
            // croner reads six fields as seconds first.
            7 => (fields[..6].join(" "), Some(fields[6])),
            n => return Err(CronError::Fields(n)),
        };
        let cron = shared
            .parse::<croner::Cron>()
            .map_err(|e| CronError::Invalid(e.to_string()))?;
        let years = match year {
            None | Some("*") => None,
            Some(field) => Some(parse_years(field).ok_or_else(|| CronError::Year(field.into()))?),
        };
        Ok(CronSpec { cron, years })
    }
}

impl CronSpec {
    /// The first time after `after` the expression matches.
    pub fn next_after(&self, after: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let mut from = after;
        // Each turn either returns or jumps to a later allowed year: bounded by the range.
        for _ in FIRST_YEAR..=LAST_YEAR + 1 {
            let next = self.cron.find_next_occurrence(&from, false).ok()?;
            let Some(years) = &self.years else {
                return Some(next);
            };
            if allowed(years, next.year()) {
                return Some(next);
            }
            let year = (next.year() + 1..=LAST_YEAR).find(|y| allowed(years, *y))?;
            // Just before the start of that year: the next match may be at its first second.
            from =
                Utc.with_ymd_and_hms(year, 1, 1, 0, 0, 0).single()? - chrono::Duration::seconds(1);
        }
        None
    }
}

fn allowed(years: &[bool], year: i32) -> bool {
    usize::try_from(year - FIRST_YEAR)
        .ok()
        .and_then(|i| years.get(i))
        .copied()
        .unwrap_or(false)
}

/// A year field: a comma list of `*`, `Y`, `A-B`, each with an optional `/step`.
fn parse_years(field: &str) -> Option<Vec<bool>> {
    let mut years = vec![false; usize::try_from(LAST_YEAR - FIRST_YEAR + 1).ok()?];
    for item in field.split(',') {
        let (range, step) = match item.split_once('/') {
            Some((range, step)) => (range, step.parse::<i32>().ok().filter(|s| *s > 0)?),
            None => (item, 1),
        };
        let (first, last) = match range {
            "*" => (FIRST_YEAR, LAST_YEAR),
            _ => match range.split_once('-') {
                Some((a, b)) => (a.parse().ok()?, b.parse().ok()?),
                None => {
                    let year: i32 = range.parse().ok()?;
                    // `Y/step` runs from Y to the end, as in cronexpr.
                    (year, if item.contains('/') { LAST_YEAR } else { year })
                }
            },
        };
        if !(FIRST_YEAR..=LAST_YEAR).contains(&first)
            || !(FIRST_YEAR..=LAST_YEAR).contains(&last)
            || first > last
        {
            return None;
        }
        for year in (first..=last).step_by(usize::try_from(step).ok()?) {
            years[usize::try_from(year - FIRST_YEAR).ok()?] = true;
        }
    }
    Some(years)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn next(text: &str, after: DateTime<Utc>) -> Option<DateTime<Utc>> {
        text.parse::<CronSpec>().unwrap().next_after(after)
    }

    fn at(y: i32, mo: u32, d: u32, h: u32, mi: u32, s: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(y, mo, d, h, mi, s).unwrap()
    }

    #[test]
    fn six_fields_end_with_a_year_and_seven_start_with_a_second_as_in_nomad() {
        let now = at(2026, 11, 24, 2, 29, 10);
        // Five: minute first, second 0.
        assert_eq!(next("30 2 * * *", now), Some(at(2026, 11, 24, 2, 30, 0)));
        // Six: the same and a year: 03:00 every day, not minute 3 of every hour.
        assert_eq!(next("0 3 * * * *", now), Some(at(2026, 11, 24, 3, 0, 0)));
        assert_eq!(next("0 3 * * * 2028", now), Some(at(2028, 1, 1, 3, 0, 0)));
        assert_eq!(
            next("0 3 * * * 2026-2027/2", now),
            Some(at(2026, 11, 24, 3, 0, 0))
        );
        assert_eq!(next("0 3 * * * 2020", now), None);
        // Seven: seconds first.
        assert_eq!(
            next("15 * * * * * *", now),
            Some(at(2026, 11, 24, 2, 29, 15))
        );
        assert_eq!(
            next("* * * * * * *", now),
            Some(at(2026, 11, 24, 2, 29, 11))
        );
        // Names.
        assert_eq!(next("@daily", now), Some(at(2026, 11, 25, 0, 0, 0)));
    }

    #[test]
    fn bad_expressions_say_why() {
        let error = |text: &str| text.parse::<CronSpec>().unwrap_err().to_string();
        assert!(
            error("* * *").contains("it has 3 fields"),
            "{}",
            error("* * *")
        );
        assert!(error("0 3 * * * 1900").contains("year field \"1900\""));
        assert!(error("0 3 * * * 2030-2020").contains("year field"));
        assert!(error("0 3 * * * 20x0").contains("year field"));
        assert!(error("0 3 * * * */0").contains("year field"));
        assert!(next("0 3 * * * 2099/2147483647", at(2026, 1, 1, 0, 0, 0)).is_some());
        assert!(!error("99 * * * *").is_empty());
    }
}
