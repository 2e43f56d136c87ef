//! Text from untrusted guests, cut to size before the host keeps or shows it.

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
    fn clips_on_characters_and_says_so() {
        assert_eq!(clip("short", 10), "short");
        assert_eq!(clip("ééééé", 5), "ééééé");
        assert_eq!(clip("ééééé", 2), "éé… (6 more bytes cut)");
        assert_eq!(clip(&"x".repeat(10_000), 4), "xxxx… (9996 more bytes cut)");
    }
}
