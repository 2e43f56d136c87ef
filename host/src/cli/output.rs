//! How events, times and untrusted text look on a terminal.
//!
//! Event messages, errors and logs hold text that drivers, hooks, plugins and tasks
//! wrote. None of them may repaint the operator's terminal or forge a line, so every such
//! text is printed through [`one_line`] (control characters, newlines included, escaped)
//! or [`text`] (newlines and tabs kept, every other control character escaped).

use std::borrow::Cow;

use crate::model::events::AllocEvent;

pub(super) fn print_event(event: &AllocEvent) {
    println!(
        "    {}  {}  {}  {:<15} {}",
        clock(event.event.time_ms),
        one_line(&event.alloc_name),
        one_line(&event.task),
        event.event.kind.to_string(),
        one_line(&event.event.message)
    );
}

/// `text` for a single line: every control character (ESC, CR, LF, ...) and the
/// Unicode bidirectional overrides escaped as `\u{..}`.
pub(super) fn one_line(text: &str) -> Cow<'_, str> {
    crate::model::text::one_line(text)
}

/// `text` over several lines (a task's output): newlines and tabs kept, every other
/// control character escaped.
pub(super) fn text(text: &str) -> Cow<'_, str> {
    crate::model::text::escape(text, |c| {
        (c.is_control() && c != '\n' && c != '\t') || crate::model::text::is_bidi_override(c)
    })
}

/// `HH:MM:SS.mmm` UTC.
pub(super) fn clock(time_ms: u64) -> String {
    let seconds = time_ms / 1000;
    format!(
        "{:02}:{:02}:{:02}.{:03}",
        seconds / 3600 % 24,
        seconds / 60 % 60,
        seconds % 60,
        time_ms % 1000
    )
}

/// A time in seconds since the epoch as a UTC date and time; "-" for 0 (not recorded).
pub(super) fn date_time(seconds: u64) -> String {
    if seconds == 0 {
        return "-".into();
    }
    let (year, month, day) = civil_from_days(seconds / 86_400);
    let (h, m, s) = (seconds % 86_400 / 3600, seconds % 3600 / 60, seconds % 60);
    format!("{year:04}-{month:02}-{day:02}T{h:02}:{m:02}:{s:02}Z")
}

/// The proleptic Gregorian date of a day count since 1970-01-01 (Howard Hinnant's
/// civil-from-days algorithm).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

/// A job id in a query string (ids are letters, digits, `.`, `_`, `-`; anything else is
/// escaped all the same).
pub(super) fn query_escape(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'.' | b'_' | b'-' => (b as char).to_string(),
            other => format!("%{other:02X}"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_shown_as_utc_dates() {
        assert_eq!(date_time(0), "-");
        assert_eq!(date_time(1), "1970-01-01T00:00:01Z");
        // A leap day of a century year, and today.
        assert_eq!(date_time(951_782_400 + 3_723), "2000-02-29T01:02:03Z");
        assert_eq!(date_time(1_795_478_400 + 86_399), "2026-11-24T23:59:59Z");
    }

    #[test]
    fn escapes_what_could_repaint_a_terminal() {
        assert_eq!(one_line("plain words"), "plain words");
        assert!(matches!(one_line("plain"), Cow::Borrowed(_)));
        assert_eq!(one_line("\x1b[2Jgone"), "\\u{1b}[2Jgone");
        assert_eq!(one_line("a\nforged line"), "a\\u{a}forged line");
        assert_eq!(one_line("back\rover"), "back\\u{d}over");
        assert_eq!(one_line("rtl\u{202e}txt"), "rtl\\u{202e}txt");
        assert_eq!(text("line 1\n\tline 2\n"), "line 1\n\tline 2\n");
        assert_eq!(text("red \x1b[31mtext\x07"), "red \\u{1b}[31mtext\\u{7}");
    }
}
