//! Everything the CLI prints, and how events, times and untrusted text look on a
//! terminal.
//!
//! Names, ids, messages, meta and events come from the agent's API, and through it from
//! job authors, token holders, drivers, hooks, plugins and tasks. None of them may
//! repaint the operator's terminal, write its clipboard (OSC 52), forge a line or
//! reorder one, so the other files of `cli` print only through this one (the floors test
//! holds them to it):
//!
//! - [`print_line!`] and [`eprint_line!`] are `println!` and `eprintln!` whose every
//!   argument is shown through [`Shown`]: control characters (newlines included) and
//!   bidirectional controls escaped as `\u{..}`. The format string is ours, so its
//!   layout (line breaks, padding) stays.
//! - [`print_text`] shows text over several lines (a task's output): newlines and tabs
//!   kept, every other control character escaped.
//! - [`print_json`] writes JSON with the same characters as `\uXXXX` escapes.
//! - [`print_error`], [`print_problems`] and [`print_refusal`] show errors with our own
//!   structure kept and the parts from outside escaped.
//! - [`write_task_output`] is `berth alloc logs` into a pipe or a file: the task's bytes
//!   as they are, which is what the user asked for (as `cat` does); on a terminal they are
//!   escaped.

use std::borrow::Cow;
use std::fmt::{self, Write as _};
use std::io::Write as _;

use berth_api::ApiError;
use berth_jobspec::JobspecError;
use berth_model::events::AllocEvent;

/// `println!` with every argument shown through [`Shown`] (escaped, padding kept). The
/// format string names no variables (`{name}` would bypass the escaping): pass them as
/// arguments.
macro_rules! print_line {
    () => {
        println!()
    };
    ($format:literal $(, $arg:expr)* $(,)?) => {
        println!($format $(, $crate::cli::output::Shown(&$arg))*)
    };
}

/// `eprintln!` with every argument shown through [`Shown`], as [`print_line!`].
macro_rules! eprint_line {
    () => {
        eprintln!()
    };
    ($format:literal $(, $arg:expr)* $(,)?) => {
        eprintln!($format $(, $crate::cli::output::Shown(&$arg))*)
    };
}

pub(super) use {eprint_line, print_line};

/// A value as the CLI shows it: formatted as it would be (`{}` or `{:?}`, with its
/// precision), then every control character and bidirectional control escaped, then
/// padded to the width asked for (text's default alignment, left).
pub struct Shown<'a, T: ?Sized>(pub &'a T);

impl<T: fmt::Display + ?Sized> fmt::Display for Shown<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let plain = match f.precision() {
            Some(precision) => format!("{:.*}", precision, self.0),
            None => self.0.to_string(),
        };
        pad(f, &one_line(&plain))
    }
}

impl<T: fmt::Debug + ?Sized> fmt::Debug for Shown<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let plain = match f.precision() {
            Some(precision) => format!("{:.*?}", precision, self.0),
            None => format!("{:?}", self.0),
        };
        pad(f, &one_line(&plain))
    }
}

/// `text` padded to the formatter's width with its fill, left-aligned unless told.
fn pad(f: &mut fmt::Formatter<'_>, text: &str) -> fmt::Result {
    let missing = f.width().unwrap_or(0).saturating_sub(text.chars().count());
    let (before, after) = match f.align() {
        Some(fmt::Alignment::Right) => (missing, 0),
        Some(fmt::Alignment::Center) => (missing / 2, missing - missing / 2),
        Some(fmt::Alignment::Left) | None => (0, missing),
    };
    let fill = f.fill();
    for _ in 0..before {
        f.write_char(fill)?;
    }
    f.write_str(text)?;
    for _ in 0..after {
        f.write_char(fill)?;
    }
    Ok(())
}

pub(super) fn print_event(event: &AllocEvent) {
    print_line!(
        "    {}  {}  {}  {:<15} {}",
        clock(event.event.time_ms),
        event.alloc_name,
        event.task,
        event.event.kind,
        event.event.message
    );
}

/// `text` for a single line: every control character (ESC, CR, LF, ...) and the Unicode
/// bidirectional controls escaped as `\u{..}`.
pub(super) fn one_line(text: &str) -> Cow<'_, str> {
    berth_model::text::one_line(text)
}

/// `text` over several lines (a task's output): newlines and tabs kept, every other
/// control character escaped.
pub(super) fn text(text: &str) -> Cow<'_, str> {
    berth_model::text::escape(text, |c| {
        (c.is_control() && c != '\n' && c != '\t') || berth_model::text::is_bidi_control(c)
    })
}

/// Prints `text` over several lines (a task's output) as [`text`] shows it, ending with
/// a line break.
pub(super) fn print_text(text: &str) {
    print!("{}", self::text(text));
    if !text.is_empty() && !text.ends_with('\n') {
        println!();
    }
}

/// Prints `value` as pretty JSON. JSON escapes C0 controls in strings itself; DEL, the C1
/// controls and the bidirectional controls it leaves as they are, so they are written as
/// `\uXXXX` here (still JSON, with the same strings).
pub(super) fn print_json(value: &impl serde::Serialize) -> serde_json::Result<()> {
    println!("{}", json(value)?);
    Ok(())
}

fn json(value: &impl serde::Serialize) -> serde_json::Result<String> {
    let pretty = serde_json::to_string_pretty(value)?;
    let mut out = String::with_capacity(pretty.len());
    for c in pretty.chars() {
        // Outside strings JSON has only its own layout; in them serde_json escaped C0.
        if c != '\n' && (c.is_control() || berth_model::text::is_bidi_control(c)) {
            let _ = write!(out, "\\u{:04x}", u32::from(c));
        } else {
            out.push(c);
        }
    }
    Ok(out)
}

/// `berth alloc logs`: a task's own bytes. Into a pipe or a file they go as they are (the
/// user asked for them, as of `cat`); on a terminal they are escaped as [`text`] does.
pub(super) fn write_task_output(bytes: &[u8]) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    if std::io::IsTerminal::is_terminal(&out) {
        write!(out, "{}", text(&String::from_utf8_lossy(bytes)))?;
    } else {
        out.write_all(bytes)?;
    }
    out.flush()
}

/// `berth alloc exec`: a command's output. A terminal session's goes as it is (its
/// escapes drive the user's terminal, as over ssh); without one, as [`write_task_output`]
/// writes a task's, and stderr's to stderr.
pub(super) fn write_session_output(
    bytes: &[u8],
    to_stderr: bool,
    terminal: bool,
) -> std::io::Result<()> {
    if to_stderr {
        let mut err = std::io::stderr().lock();
        if !terminal && std::io::IsTerminal::is_terminal(&err) {
            write!(err, "{}", text(&String::from_utf8_lossy(bytes)))?;
        } else {
            err.write_all(bytes)?;
        }
        return err.flush();
    }
    if !terminal {
        return write_task_output(bytes);
    }
    let mut out = std::io::stdout().lock();
    out.write_all(bytes)?;
    out.flush()
}

/// An error at the CLI's edge: `Error: ` and its chain joined by `: ` (as anyhow's
/// `{:#}`), each part escaped to one line, except the line breaks of a problem list
/// (a jobspec's or the agent config's), whose problems are escaped one by one.
pub(super) fn print_error(error: &anyhow::Error) {
    eprintln!("Error: {}", error_text(error));
}

fn error_text(error: &anyhow::Error) -> String {
    let parts: Vec<String> = error
        .chain()
        .map(|cause| match cause.downcast_ref::<JobspecError>() {
            Some(problems) => problems_text(problems),
            None => one_line(&cause.to_string()).into_owned(),
        })
        .collect();
    parts.join(": ")
}

/// A jobspec's (or the agent config's) problems, one per line, each escaped.
fn problems_text(error: &JobspecError) -> String {
    let count = error.problems.len();
    let file = one_line(&error.file);
    let mut text = format!(
        "{file} has {count} problem{}:",
        if count == 1 { "" } else { "s" }
    );
    for problem in &error.problems {
        text.push_str(&format!("\n  {file}:{}", one_line(&problem.to_string())));
    }
    text
}

/// `{prefix}` and a jobspec's problems, one per line, on stderr.
pub(super) fn print_problems(prefix: &str, error: &JobspecError) {
    eprintln!("{prefix}{}", problems_text(error));
}

/// `{prefix}` and the agent's refusal on stderr: its message, then its problems one per
/// line, each escaped.
pub(super) fn print_refusal(prefix: &str, error: &ApiError) {
    eprintln!("{prefix}{}", one_line(&error.error));
    for problem in &error.problems {
        eprintln!("  {}", one_line(problem));
    }
}

/// The log (tracing) on stderr, colored on a terminal. The agent escapes what it logs
/// of others' text (`model::text::one_line`); tracing-subscriber escapes terminal
/// escapes in messages besides.
pub(super) fn start_log(filter: tracing_subscriber::EnvFilter) {
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
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
    fn shown_values_are_escaped_and_keep_their_layout() {
        let hostile = "vol\u{1b}]52;c;ZXZpbA==\u{7}\r\nforged\u{202e}";
        let escaped = "vol\\u{1b}]52;c;ZXZpbA==\\u{7}\\u{d}\\u{a}forged\\u{202e}";
        assert_eq!(format!("{}", Shown(&hostile)), escaped);
        assert_eq!(format!("{:?}", Shown(&"a\u{9b}b")), "\"a\\u{9b}b\"");
        // Padding counts what is shown, and keeps its alignment and fill.
        assert_eq!(format!("[{:<6}]", Shown(&"a\nb")), "[a\\u{a}b]");
        assert_eq!(format!("[{:<6}]", Shown(&"ab")), "[ab    ]");
        assert_eq!(format!("[{:>6}]", Shown(&12)), "[    12]");
        assert_eq!(format!("[{:*^6}]", Shown(&"ab")), "[**ab**]");
        // Precision stays the value's: digits for a number, a cut for text.
        assert_eq!(format!("{:.2}", Shown(&1.23456)), "1.23");
        assert_eq!(format!("{:.3}", Shown(&"abcdef")), "abc");
    }

    #[test]
    fn json_escapes_what_serde_json_leaves() {
        let value = serde_json::json!({"Name": "a\u{1b}b\u{7f}c\u{9b}d\u{2066}e\u{200e}f"});
        let shown = json(&value).unwrap();
        assert!(
            !shown
                .chars()
                .any(|c| c != '\n' && (c.is_control() || berth_model::text::is_bidi_control(c))),
            "{shown}"
        );
        // Still JSON, with the same string.
        let back: serde_json::Value = serde_json::from_str(&shown).unwrap();
        assert_eq!(back, value);
    }

    #[test]
    fn errors_keep_our_line_breaks_and_escape_the_rest() {
        let problems = JobspecError {
            file: "agent.hcl".into(),
            problems: vec![
                berth_hcl::Problem {
                    path: "config".into(),
                    at: None,
                    message: "first\nforged: line\u{1b}[2J".into(),
                },
                berth_hcl::Problem {
                    path: "config".into(),
                    at: None,
                    message: "second".into(),
                },
            ],
        };
        assert_eq!(
            error_text(&anyhow::Error::from(problems)),
            "agent.hcl has 2 problems:\n  agent.hcl:config: first\\u{a}forged: line\\u{1b}[2J\n  \
             agent.hcl:config: second"
        );
        let api = anyhow::Error::msg("ok\nforged line").context("submitting\r");
        assert_eq!(error_text(&api), "submitting\\u{d}: ok\\u{a}forged line");
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
