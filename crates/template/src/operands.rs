//! What the computed functions share: their arguments checked and read, Go's
//! comparisons, consul-template's `in`, arithmetic in its argument order, JSON out,
//! regular expressions within a size, and the walk that charges a value's size and
//! bounds its nesting.

use crate::CallError;
use crate::budget::Budget;
use crate::value::Value;

pub(crate) fn want_str<'a>(args: &'a [Value], at: usize, what: &str) -> Result<&'a str, CallError> {
    match args.get(at) {
        Some(Value::Str(s)) => Ok(s),
        Some(other) => Err(format!("{what} must be a string, not {}", other.type_name()).into()),
        None => Err(format!("{what} is missing").into()),
    }
}

pub(crate) fn want_int(args: &[Value], at: usize, what: &str) -> Result<i64, CallError> {
    match args.get(at) {
        Some(Value::Str(s)) => s
            .trim()
            .parse()
            .map_err(|_| CallError(format!("{what} {s:?} is not a whole number"))),
        Some(v) => v.as_int().ok_or_else(|| {
            CallError(format!(
                "{what} must be a whole number, not {}",
                v.type_name()
            ))
        }),
        None => Err(format!("{what} is missing").into()),
    }
}

pub(crate) fn arity(args: &[Value], count: usize) -> Result<(), CallError> {
    if args.len() == count {
        Ok(())
    } else {
        Err(format!(
            "takes {count} argument{}, given {}",
            if count == 1 { "" } else { "s" },
            args.len()
        )
        .into())
    }
}

/// The deepest a list or map a template makes may nest (`sprig_list`, `sprig_dict`):
/// each level is a frame where a value is printed, written as JSON or dropped.
pub(crate) const MAX_NESTING: usize = 32;

/// What a walk of a whole value found: how deep it nests, and the bytes of its text
/// (strings and keys, a shared one each time it is reached).
pub(crate) struct Walked {
    pub depth: usize,
    pub text_bytes: usize,
}

/// Charges a step for every element in `value`, all the way down: what a function that
/// walks all of it (`toJSON`) will do. Shared parts count each time they are reached,
/// as the walk reaches them.
pub(crate) fn walk_charged(value: &Value, budget: &mut Budget) -> Result<Walked, CallError> {
    fn walk(
        value: &Value,
        budget: &mut Budget,
        depth: usize,
        text: &mut usize,
    ) -> Result<usize, CallError> {
        if depth > MAX_NESTING + 128 {
            return Err(format!("values nested more than {} deep", MAX_NESTING + 128).into());
        }
        let mut deepest = 0;
        match value {
            Value::Str(s) => *text = text.saturating_add(s.len()),
            Value::List(items) => {
                budget.charge_elements(items.len())?;
                for item in items.iter() {
                    deepest = deepest.max(walk(item, budget, depth + 1, text)? + 1);
                }
                deepest = deepest.max(1);
            }
            Value::Map(map) => {
                budget.charge_elements(map.len())?;
                for (key, item) in map.iter() {
                    *text = text.saturating_add(key.len());
                    deepest = deepest.max(walk(item, budget, depth + 1, text)? + 1);
                }
                deepest = deepest.max(1);
            }
            Value::Object(object) => {
                budget.charge_elements(object.fields.len())?;
                for (key, item) in object.fields.iter() {
                    *text = text.saturating_add(key.len());
                    deepest = deepest.max(walk(item, budget, depth + 1, text)? + 1);
                }
                deepest = deepest.max(1);
            }
            Value::Ints { .. } => {
                let len = value.len().unwrap_or(0);
                budget.charge_elements(len)?;
                *text = text.saturating_add(len);
                deepest = 1;
            }
            _ => {}
        }
        Ok(deepest)
    }
    let mut text_bytes = 0;
    let depth = walk(value, budget, 0, &mut text_bytes)?;
    Ok(Walked { depth, text_bytes })
}

/// Refuses an element that would nest a made list or map deeper than [`MAX_NESTING`]
/// (its walk charged).
pub(crate) fn nesting(value: &Value, budget: &mut Budget) -> Result<(), CallError> {
    if walk_charged(value, budget)?.depth >= MAX_NESTING {
        return Err(format!("lists and maps nest at most {MAX_NESTING} deep").into());
    }
    Ok(())
}

pub(crate) fn string_list(
    value: &Value,
    what: &str,
    budget: &mut Budget,
) -> Result<Vec<String>, CallError> {
    match value {
        Value::List(_) | Value::Ints { .. } => {
            let mut list = Vec::new();
            for item in value.iter_elements() {
                let text = item.to_go_string();
                // Each is a copy: a list of one shared string counts it every time.
                budget.take(text.len().saturating_add(24))?;
                list.push(text);
            }
            Ok(list)
        }
        Value::Nil => Ok(Vec::new()),
        other => Err(format!("{what} must be a list, not {}", other.type_name()).into()),
    }
}

fn incompatible(x: &Value, y: &Value) -> CallError {
    format!(
        "incompatible types for comparison: {} and {}",
        x.type_name(),
        y.type_name()
    )
    .into()
}

/// Go's `eq` for two basic values: ints and floats compare as numbers; a list or map
/// is not comparable.
pub(crate) fn equal(a: &Value, b: &Value) -> Result<bool, CallError> {
    Ok(match (a, b) {
        (Value::Nil, Value::Nil) => true,
        (Value::Nil, _) | (_, Value::Nil) => false,
        (Value::Bool(x), Value::Bool(y)) => x == y,
        (Value::Int(x), Value::Int(y)) => x == y,
        (Value::Int(x), Value::Float(y)) | (Value::Float(y), Value::Int(x)) => (*x as f64) == *y,
        (Value::Float(x), Value::Float(y)) => x == y,
        (Value::Str(x), Value::Str(y)) => x == y,
        (x, y) if x.type_name() != y.type_name() => return Err(incompatible(x, y)),
        (x, _) => return Err(format!("non-comparable type {}", x.type_name()).into()),
    })
}

pub(crate) fn less(a: &Value, b: &Value) -> Result<bool, CallError> {
    Ok(match (a, b) {
        (Value::Int(x), Value::Int(y)) => x < y,
        (Value::Int(x), Value::Float(y)) => (*x as f64) < *y,
        (Value::Float(x), Value::Int(y)) => *x < (*y as f64),
        (Value::Float(x), Value::Float(y)) => x < y,
        (Value::Str(x), Value::Str(y)) => x < y,
        (x, y) if x.type_name() != y.type_name() => return Err(incompatible(x, y)),
        (x, _) => return Err(format!("invalid type for comparison: {}", x.type_name()).into()),
    })
}

/// Whether `haystack` holds `needle`: an element of a list, a key of a map, a part of
/// a string (consul-template's `in`).
pub(crate) fn holds(haystack: &Value, needle: &Value) -> Result<bool, CallError> {
    match haystack {
        Value::List(_) | Value::Ints { .. } => {
            for item in haystack.iter_elements() {
                if equal(&item, needle).unwrap_or(false) {
                    return Ok(true);
                }
            }
            Ok(false)
        }
        Value::Map(map) => Ok(map.contains_key(&needle.to_go_string())),
        Value::Str(s) => Ok(s.contains(&*needle.to_go_string())),
        Value::Nil => Ok(false),
        other => Err(format!("cannot look into a {}", other.type_name()).into()),
    }
}

pub(crate) fn arithmetic(name: &str, a: &Value, b: &Value) -> Result<Value, CallError> {
    // consul-template's order: `{{ 5 | subtract 2 }}` is 5 - 2, the piped value last.
    let (left, right) = (b, a);
    match (
        left.as_int().filter(|_| !matches!(left, Value::Float(_))),
        right.as_int().filter(|_| !matches!(right, Value::Float(_))),
    ) {
        (Some(x), Some(y)) => {
            let result = match name {
                "add" => x.checked_add(y),
                "subtract" => x.checked_sub(y),
                "multiply" => x.checked_mul(y),
                "divide" | "modulo" if y == 0 => return Err("division by zero".into()),
                "divide" => x.checked_div(y),
                "modulo" => x.checked_rem(y),
                "minimum" => Some(x.min(y)),
                _ => Some(x.max(y)),
            };
            result
                .map(Value::Int)
                .ok_or_else(|| "the result does not fit in 64 bits".into())
        }
        _ => {
            let number = |v: &Value| match v {
                Value::Int(i) => Ok(*i as f64),
                Value::Float(f) => Ok(*f),
                Value::Str(s) => s
                    .trim()
                    .parse::<f64>()
                    .map_err(|_| CallError(format!("{s:?} is not a number"))),
                other => Err(format!("{} is not a number", other.type_name()).into()),
            };
            let (x, y) = (number(left)?, number(right)?);
            Ok(Value::Float(match name {
                "add" => x + y,
                "subtract" => x - y,
                "multiply" => x * y,
                "divide" => x / y,
                "modulo" => x % y,
                "minimum" => x.min(y),
                _ => x.max(y),
            }))
        }
    }
}

pub(crate) fn json_text(
    value: &Value,
    pretty: bool,
    escape_html: bool,
) -> Result<String, CallError> {
    let json = value.to_json();
    let mut text = if pretty {
        serde_json::to_string_pretty(&json)
    } else {
        serde_json::to_string(&json)
    }
    .map_err(|e| e.to_string())?;
    if escape_html {
        // Go's encoding/json escapes these for HTML safety; consul-template's toJSON
        // keeps that, toUnescapedJSON does not.
        text = text
            .replace('<', "\\u003c")
            .replace('>', "\\u003e")
            .replace('&', "\\u0026");
    }
    Ok(text)
}

/// The longest text a regular expression runs over: its matching may cost the text's
/// length times the pattern's states (the regex crate's slowest engine), so both are
/// kept small.
pub(crate) const MAX_REGEX_INPUT: usize = 64 << 10;

pub(crate) fn regex_input(text: &str) -> Result<&str, CallError> {
    if text.len() > MAX_REGEX_INPUT {
        return Err(format!(
            "berth matches regular expressions over at most {MAX_REGEX_INPUT} bytes; this \
             text has {}",
            text.len()
        )
        .into());
    }
    Ok(text)
}

pub(crate) fn regex(pattern: &str) -> Result<regex::Regex, CallError> {
    regex::RegexBuilder::new(pattern)
        .size_limit(32 << 10)
        .build()
        .map_err(|e| CallError(format!("{pattern:?} is not a regular expression: {e}")))
}

pub(crate) fn go_quote(s: &str) -> String {
    // Go's %q: a double-quoted string with Go escapes (Rust's Debug is close enough for
    // printable text and the common escapes).
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if c.is_control() => out.push_str(&format!("\\x{:02x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}
