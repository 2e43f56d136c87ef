//! The lexer of Go's template syntax: text between actions, and inside each action
//! (between the delimiters, with `{{-`/`-}}` trims and comments) its tokens: words,
//! fields, variables, strings with Go's escapes, numbers in Go's forms, punctuation.

use crate::parse::{Delimiters, ParseError};

/// Why an action's text is not a token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub(crate) struct LexProblem(String);

impl From<&str> for LexProblem {
    fn from(message: &str) -> Self {
        LexProblem(message.to_string())
    }
}

impl From<String> for LexProblem {
    fn from(message: String) -> Self {
        LexProblem(message)
    }
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Tok {
    Text(String),
    Open,
    Close,
    Ident(String),
    Field(Vec<String>),
    Variable(String, Vec<String>),
    Dot,
    Str(String),
    Int(i64),
    Float(f64),
    Pipe,
    LeftParen,
    RightParen,
    Comma,
    Declare,
    Assign,
}

#[derive(Debug, Clone)]
pub(crate) struct Token {
    pub tok: Tok,
    pub line: usize,
    /// White space came before it (a field right after `)` chains on it; with space
    /// between, it is an argument of its own).
    pub spaced: bool,
}

pub(crate) fn lex(text: &str, delimiters: &Delimiters) -> Result<Vec<Token>, ParseError> {
    let (left, right) = (delimiters.left.as_str(), delimiters.right.as_str());
    let mut tokens: Vec<Token> = Vec::new();
    let mut rest = text;
    let mut line = 1;
    let mut trim_next_text = false;
    let fail = |line, message: String| ParseError { line, message };
    loop {
        let Some(start) = rest.find(left) else {
            push_text(&mut tokens, rest, line, trim_next_text);
            return Ok(tokens);
        };
        let mut before = &rest[..start];
        let mut inner = &rest[start + left.len()..];
        // `{{- ` trims the white space before it: the `-` must be followed by space.
        let trim_before =
            inner.starts_with('-') && inner[1..].starts_with(|c: char| c.is_ascii_whitespace());
        if trim_before {
            before = before.trim_end_matches(|c: char| c.is_ascii_whitespace());
            inner = &inner[1..];
        }
        push_text(&mut tokens, before, line, trim_next_text);
        line += rest[..start].matches('\n').count();
        let open_line = line;
        trim_next_text = false;
        // A comment stands alone between the delimiters.
        let trimmed = inner.trim_start_matches(|c: char| c.is_ascii_whitespace());
        if trimmed.starts_with("/*") {
            let end = trimmed
                .find("*/")
                .ok_or_else(|| fail(open_line, "a comment /* is never closed with */".into()))?;
            let after = trimmed[end + 2..].trim_start_matches(|c: char| c.is_ascii_whitespace());
            let (trim_after, after) = match after.strip_prefix('-') {
                Some(a) if a.starts_with(right) => (true, a),
                _ => (false, after),
            };
            let close = after
                .strip_prefix(right)
                .ok_or_else(|| fail(open_line, format!("a comment must end at its {right}")))?;
            line += inner[..inner.len() - close.len()].matches('\n').count();
            trim_next_text = trim_after;
            rest = close;
            continue;
        }
        tokens.push(Token {
            tok: Tok::Open,
            line,
            spaced: false,
        });
        let mut cursor = inner;
        loop {
            let before_space = cursor.len();
            cursor = cursor.trim_start_matches(|c: char| {
                if c == '\n' {
                    line += 1;
                }
                c.is_ascii_whitespace()
            });
            let spaced = cursor.len() != before_space;
            if spaced && cursor.starts_with('-') && cursor[1..].starts_with(right) {
                trim_next_text = true;
                cursor = &cursor[1 + right.len()..];
                tokens.push(Token {
                    tok: Tok::Close,
                    line,
                    spaced,
                });
                break;
            }
            if let Some(after) = cursor.strip_prefix(right) {
                cursor = after;
                tokens.push(Token {
                    tok: Tok::Close,
                    line,
                    spaced,
                });
                break;
            }
            let Some(c) = cursor.chars().next() else {
                return Err(fail(
                    open_line,
                    format!("an action {left} is never closed with {right}"),
                ));
            };
            let (tok, used) = lex_one(cursor, c).map_err(|problem| fail(line, problem.0))?;
            line += cursor[..used].matches('\n').count();
            cursor = &cursor[used..];
            tokens.push(Token { tok, line, spaced });
        }
        rest = cursor;
    }
}

fn push_text(tokens: &mut Vec<Token>, text: &str, line: usize, trim_start: bool) {
    let text = if trim_start {
        text.trim_start_matches(|c: char| c.is_ascii_whitespace())
    } else {
        text
    };
    if !text.is_empty() {
        tokens.push(Token {
            tok: Tok::Text(text.to_string()),
            line,
            spaced: false,
        });
    }
}

fn is_word(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// A path of fields `.A.B` at the start of `text` (which starts with `.`).
fn field_path(text: &str) -> (Vec<String>, usize) {
    let mut path = Vec::new();
    let mut used = 0;
    let mut rest = text;
    while let Some(after) = rest.strip_prefix('.') {
        let len = after.find(|c: char| !is_word(c)).unwrap_or(after.len());
        if len == 0 || !after.starts_with(|c: char| c.is_alphabetic() || c == '_') {
            break;
        }
        path.push(after[..len].to_string());
        used += 1 + len;
        rest = &after[len..];
    }
    (path, used)
}

fn lex_one(text: &str, c: char) -> Result<(Tok, usize), LexProblem> {
    match c {
        '|' => Ok((Tok::Pipe, 1)),
        '(' => Ok((Tok::LeftParen, 1)),
        ')' => Ok((Tok::RightParen, 1)),
        ',' => Ok((Tok::Comma, 1)),
        '=' => Ok((Tok::Assign, 1)),
        ':' if text.starts_with(":=") => Ok((Tok::Declare, 2)),
        '"' => lex_quoted(text),
        '`' => {
            let end = text[1..]
                .find('`')
                .ok_or("a raw string ` is never closed")?;
            Ok((Tok::Str(text[1..1 + end].to_string()), end + 2))
        }
        '\'' => {
            let (value, used) = lex_quoted(text)?;
            let Tok::Str(s) = value else {
                unreachable!("lex_quoted makes strings")
            };
            let mut chars = s.chars();
            match (chars.next(), chars.next()) {
                (Some(c), None) => Ok((Tok::Int(i64::from(u32::from(c))), used)),
                _ => Err(format!("{:?} is not one character", &text[..used]).into()),
            }
        }
        '$' => {
            let len = text[1..]
                .find(|c: char| !is_word(c))
                .unwrap_or(text.len() - 1);
            let name = text[..1 + len].to_string();
            let (path, more) = field_path(&text[1 + len..]);
            Ok((Tok::Variable(name, path), 1 + len + more))
        }
        '.' if text[1..].starts_with(|c: char| c.is_ascii_digit()) => lex_number(text),
        '.' => {
            let (path, used) = field_path(text);
            if path.is_empty() {
                Ok((Tok::Dot, 1))
            } else {
                Ok((Tok::Field(path), used))
            }
        }
        '0'..='9' => lex_number(text),
        '-' | '+' if text[1..].starts_with(|c: char| c.is_ascii_digit() || c == '.') => {
            lex_number(text)
        }
        c if c.is_alphabetic() || c == '_' => {
            let len = text.find(|c: char| !is_word(c)).unwrap_or(text.len());
            Ok((Tok::Ident(text[..len].to_string()), len))
        }
        other => Err(format!("unexpected {other:?} in an action").into()),
    }
}

fn lex_quoted(text: &str) -> Result<(Tok, usize), LexProblem> {
    let quote = text.chars().next().unwrap_or('"');
    let mut out = String::new();
    let mut chars = text.char_indices().skip(1);
    while let Some((at, c)) = chars.next() {
        match c {
            c if c == quote => return Ok((Tok::Str(out), at + 1)),
            '\n' => break,
            '\\' => {
                let (_, escape) = chars.next().ok_or("an escape at the end of a string")?;
                let mut hex = |digits: usize| -> Result<char, LexProblem> {
                    let mut code = 0u32;
                    for _ in 0..digits {
                        let (_, d) = chars.next().ok_or("a short escape in a string")?;
                        code = code * 16 + d.to_digit(16).ok_or("a bad escape in a string")?;
                    }
                    char::from_u32(code).ok_or_else(|| "an escape that is no character".into())
                };
                out.push(match escape {
                    'n' => '\n',
                    't' => '\t',
                    'r' => '\r',
                    'a' => '\u{7}',
                    'b' => '\u{8}',
                    'f' => '\u{c}',
                    'v' => '\u{b}',
                    '0'..='7' => {
                        let mut code = escape.to_digit(8).unwrap_or(0);
                        for _ in 0..2 {
                            let (_, d) = chars.next().ok_or("a short escape in a string")?;
                            code = code * 8 + d.to_digit(8).ok_or("a bad octal escape")?;
                        }
                        char::from_u32(code).ok_or("an escape that is no character")?
                    }
                    'x' => hex(2)?,
                    'u' => hex(4)?,
                    'U' => hex(8)?,
                    '\\' | '"' | '\'' => escape,
                    other => return Err(format!("unknown escape \\{other} in a string").into()),
                });
            }
            c => out.push(c),
        }
    }
    Err(format!("a string {quote} is never closed").into())
}

fn lex_number(text: &str) -> Result<(Tok, usize), LexProblem> {
    let mut len = 0;
    let bytes = text.as_bytes();
    while len < bytes.len() {
        let b = bytes[len];
        let exponent_sign = (b == b'+' || b == b'-')
            && len > 0
            && matches!(bytes[len - 1], b'e' | b'E' | b'p' | b'P')
            && !text[..len].starts_with("0x")
            && !text[..len].starts_with("0X");
        if b.is_ascii_alphanumeric()
            || b == b'.'
            || b == b'_'
            || exponent_sign
            || (len == 0 && (b == b'+' || b == b'-'))
        {
            len += 1;
        } else {
            break;
        }
    }
    let written = &text[..len];
    let clean: String = written.chars().filter(|c| *c != '_').collect();
    let (negative, digits) = match clean.strip_prefix('-') {
        Some(d) => (true, d),
        None => (false, clean.strip_prefix('+').unwrap_or(&clean)),
    };
    let radix = |prefix: &str| digits.strip_prefix(prefix);
    let integer = if let Some(d) = radix("0x").or_else(|| radix("0X")) {
        i64::from_str_radix(d, 16).ok()
    } else if let Some(d) = radix("0o").or_else(|| radix("0O")) {
        i64::from_str_radix(d, 8).ok()
    } else if let Some(d) = radix("0b").or_else(|| radix("0B")) {
        i64::from_str_radix(d, 2).ok()
    } else if digits.len() > 1
        && digits.starts_with('0')
        && digits.bytes().all(|b| b.is_ascii_digit())
    {
        i64::from_str_radix(&digits[1..], 8).ok()
    } else {
        digits.parse::<i64>().ok()
    };
    if let Some(i) = integer {
        return Ok((Tok::Int(if negative { -i } else { i }), len));
    }
    match digits.parse::<f64>() {
        Ok(f) if f.is_finite() && !digits.starts_with(|c: char| c.is_alphabetic()) => {
            Ok((Tok::Float(if negative { -f } else { f }), len))
        }
        _ => Err(format!("bad number syntax: {written:?}").into()),
    }
}
