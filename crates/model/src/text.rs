//! Text from untrusted guests, cut to size before the host keeps or shows it, and
//! escaped before it is written where a line break or a terminal escape would forge
//! something (the agent's log, the CLI).

use std::borrow::Cow;

/// `text` for a single line: every control character (C0 with ESC, CR and LF, DEL, C1)
/// and the Unicode bidirectional controls escaped as `\u{..}`, so it can neither start a
/// new line, nor repaint a terminal, nor reorder what is shown around it.
pub fn one_line(text: &str) -> Cow<'_, str> {
    escape(text, |c| c.is_control() || is_bidi_control(c))
}

/// `text` with every character `unsafe_char` picks escaped as `\u{..}`.
pub fn escape(text: &str, unsafe_char: impl Fn(char) -> bool) -> Cow<'_, str> {
    if !text.chars().any(&unsafe_char) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if unsafe_char(c) {
            out.extend(c.escape_unicode());
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// Characters that reorder the text around them on screen (the "Trojan Source" ones):
/// the embeddings and overrides (U+202A–U+202E), the isolates (U+2066–U+2069), and the
/// marks (U+200E, U+200F, U+061C), which are invisible and move neutral characters.
pub fn is_bidi_control(c: char) -> bool {
    matches!(
        c,
        '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{200e}' | '\u{200f}' | '\u{061c}'
    )
}

/// At most `max` characters of `text`; when cut, a note says how much was left out, so
/// a reader knows the message is not whole.
pub fn clip(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        None => text.to_string(),
        Some((cut, _)) => format!("{}… ({} more bytes cut)", &text[..cut], text.len() - cut),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_escapes_what_would_forge_a_line() {
        assert_eq!(one_line("plain"), "plain");
        assert_eq!(
            one_line("ok\nERROR forged\r\u{1b}[2J\u{202e}"),
            "ok\\u{a}ERROR forged\\u{d}\\u{1b}[2J\\u{202e}"
        );
        // DEL, a C1 CSI, and the bidi isolates and marks.
        assert_eq!(
            one_line("a\u{7f}b\u{9b}c\u{2067}d\u{200f}e\u{61c}"),
            "a\\u{7f}b\\u{9b}c\\u{2067}d\\u{200f}e\\u{61c}"
        );
    }

    #[test]
    fn clips_on_characters_and_says_so() {
        assert_eq!(clip("short", 10), "short");
        assert_eq!(clip("ééééé", 5), "ééééé");
        assert_eq!(clip("ééééé", 2), "éé… (6 more bytes cut)");
        assert_eq!(clip(&"x".repeat(10_000), 4), "xxxx… (9996 more bytes cut)");
    }
}
