//! The functions a template computes from its arguments alone (Go's built-ins,
//! consul-template's helpers and the `sprig_` ones berth has), each bounded by the
//! render's byte limit where it could make a large string.

use std::collections::BTreeMap;
use std::sync::Arc;

use base64::Engine as _;

use crate::CallError;
use crate::budget::Budget;
use crate::format::{go_layout, printf};
use crate::operands::{
    arithmetic, arity, equal, go_quote, holds, json_text, less, nesting, regex, regex_input,
    string_list, walk_charged, want_int, want_str,
};
use crate::value::Value;

/// Calls a [`Support::Builtin`] or [`Support::Yes`] function (not `and`, `or`,
/// `executeTemplate` and the data ones, which the renderer answers).
pub(crate) fn call(name: &str, args: &[Value], budget: &mut Budget) -> Result<Value, CallError> {
    // Each argument's elements (a string's bytes, by 64) once, before any work: what
    // a function that walks its arguments once costs. Those that do more are charged
    // again below.
    let shallow: usize = args
        .iter()
        .map(|a| match a {
            Value::Str(s) => 1 + s.len() / 64,
            other => 1usize.saturating_add(other.len().unwrap_or(0)),
        })
        .fold(0, usize::saturating_add);
    budget.charge_elements(shallow)?;
    let max_output = budget.max_output();
    let s = |at: usize| want_str(args, at, "the argument");
    let text = |v: String| Ok(Value::str(v));
    match name {
        "not" => {
            arity(args, 1)?;
            Ok(Value::Bool(!args[0].truth()))
        }
        "len" => {
            arity(args, 1)?;
            args[0]
                .len()
                .map(|n| Value::Int(n as i64))
                .ok_or_else(|| CallError(format!("len of {}", args[0].type_name())))
        }
        "index" => {
            let (first, keys) = args.split_first().ok_or("index takes something to index")?;
            let mut value = first.clone();
            for key in keys {
                value = match &value {
                    Value::Map(map) => map.get(&key.to_go_string()).cloned().unwrap_or(Value::Nil),
                    Value::List(_) | Value::Ints { .. } => {
                        let i = key.as_int().ok_or("a list index must be a whole number")?;
                        usize::try_from(i)
                            .ok()
                            .and_then(|i| value.element(i))
                            .ok_or_else(|| CallError(format!("index out of range: {i}")))?
                    }
                    Value::Str(text) => {
                        let i = key
                            .as_int()
                            .ok_or("a string index must be a whole number")?;
                        let byte = usize::try_from(i).ok().and_then(|i| text.as_bytes().get(i));
                        Value::Int(i64::from(
                            *byte.ok_or_else(|| CallError(format!("index out of range: {i}")))?,
                        ))
                    }
                    Value::Nil => return Err("index of untyped nil".into()),
                    other => {
                        return Err(
                            format!("can't index item of type {}", other.type_name()).into()
                        );
                    }
                };
            }
            Ok(value)
        }
        "slice" => {
            let (first, bounds) = args.split_first().ok_or("slice takes something to slice")?;
            let len = first.len().ok_or_else(|| {
                CallError(format!("can't slice item of type {}", first.type_name()))
            })?;
            let bound = |at: usize, default: usize| -> Result<usize, CallError> {
                match bounds.get(at) {
                    None => Ok(default),
                    Some(v) => v
                        .as_int()
                        .and_then(|i| usize::try_from(i).ok())
                        .ok_or_else(|| "a slice bound must be a whole number".into()),
                }
            };
            if bounds.len() > 2 {
                return Err("berth slices with at most two bounds".into());
            }
            let (from, to) = (bound(0, 0)?, bound(1, len)?);
            if from > to || to > len {
                return Err(
                    format!("slice bounds out of range [{from}:{to}] of length {len}").into(),
                );
            }
            match first {
                Value::Str(t) => t
                    .get(from..to)
                    .map(Value::str)
                    .ok_or_else(|| "slice bounds fall inside a character".into()),
                Value::Ints { start, .. } => Ok(Value::Ints {
                    start: start.saturating_add(from as i64),
                    end: start.saturating_add(to as i64),
                }),
                Value::List(items) => Ok(Value::list(items[from..to].to_vec())),
                other => Err(format!("can't slice item of type {}", other.type_name()).into()),
            }
        }
        "print" => {
            // Go's Sprint: a space between operands when neither is a string.
            let mut out = String::new();
            for (i, arg) in args.iter().enumerate() {
                if i > 0 && !matches!(arg, Value::Str(_)) && !matches!(args[i - 1], Value::Str(_)) {
                    out.push(' ');
                }
                arg.write_go(&mut out);
                budget.string_of(out.len())?;
            }
            text(out)
        }
        "println" => {
            let mut out = String::new();
            for (i, arg) in args.iter().enumerate() {
                if i > 0 {
                    out.push(' ');
                }
                arg.write_go(&mut out);
                budget.string_of(out.len())?;
            }
            out.push('\n');
            text(out)
        }
        "printf" => {
            let (format, rest) = args.split_first().ok_or("printf takes a format")?;
            let format = format.as_str().ok_or("printf's format must be a string")?;
            text(printf(format, rest, max_output)?)
        }
        "eq" => {
            let (first, rest) = args.split_first().ok_or("eq takes two arguments or more")?;
            if rest.is_empty() {
                return Err("eq takes two arguments or more".into());
            }
            for other in rest {
                if equal(first, other)? {
                    return Ok(Value::Bool(true));
                }
            }
            Ok(Value::Bool(false))
        }
        "ne" => {
            arity(args, 2)?;
            Ok(Value::Bool(!equal(&args[0], &args[1])?))
        }
        "lt" | "le" | "gt" | "ge" => {
            arity(args, 2)?;
            let (a, b) = (&args[0], &args[1]);
            Ok(Value::Bool(match name {
                "lt" => less(a, b)?,
                "le" => less(a, b)? || equal(a, b)?,
                "gt" => !less(a, b)? && !equal(a, b)?,
                _ => !less(a, b)?,
            }))
        }
        "html" => {
            let mut joined = String::new();
            for arg in args {
                arg.write_go(&mut joined);
                budget.string_of(joined.len())?;
            }
            text(
                joined
                    .replace('&', "&amp;")
                    .replace('<', "&lt;")
                    .replace('>', "&gt;")
                    .replace('"', "&#34;")
                    .replace('\'', "&#39;"),
            )
        }
        "js" => {
            let mut joined = String::new();
            for arg in args {
                arg.write_go(&mut joined);
                budget.string_of(joined.len())?;
            }
            let mut out = String::new();
            for c in joined.chars() {
                match c {
                    '\\' => out.push_str("\\\\"),
                    '\'' => out.push_str("\\'"),
                    '"' => out.push_str("\\\""),
                    '<' => out.push_str("\\u003C"),
                    '>' => out.push_str("\\u003E"),
                    '&' => out.push_str("\\u0026"),
                    '=' => out.push_str("\\u003D"),
                    '\n' => out.push_str("\\n"),
                    '\r' => out.push_str("\\r"),
                    '\t' => out.push_str("\\t"),
                    c => out.push(c),
                }
            }
            text(out)
        }
        "urlquery" => {
            let mut joined = String::new();
            for arg in args {
                arg.write_go(&mut joined);
                budget.string_of(joined.len())?;
            }
            let mut out = String::new();
            for b in joined.bytes() {
                match b {
                    b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                        out.push(b as char)
                    }
                    b' ' => out.push('+'),
                    b => out.push_str(&format!("%{b:02X}")),
                }
            }
            text(out)
        }
        "base64Encode" | "sprig_b64enc" => {
            arity(args, 1)?;
            text(base64::engine::general_purpose::STANDARD.encode(s(0)?))
        }
        "base64URLEncode" => {
            arity(args, 1)?;
            text(base64::engine::general_purpose::URL_SAFE.encode(s(0)?))
        }
        "base64Decode" | "base64URLDecode" | "sprig_b64dec" => {
            arity(args, 1)?;
            let engine = if name == "base64URLDecode" {
                &base64::engine::general_purpose::URL_SAFE
            } else {
                &base64::engine::general_purpose::STANDARD
            };
            let bytes = engine
                .decode(s(0)?)
                .map_err(|e| CallError(format!("not base64: {e}")))?;
            text(
                String::from_utf8(bytes)
                    .map_err(|_| "the decoded bytes are not UTF-8 text".to_string())?,
            )
        }
        "byKey" | "explode" | "explodeMap" => crate::key_trees::call(name, args, budget),
        "byTag" => {
            arity(args, 1)?;
            walk_charged(&args[0], budget)?;
            let mut groups: BTreeMap<String, Vec<Value>> = BTreeMap::new();
            for service in args[0].iter_elements() {
                let Value::Object(object) = &service else {
                    return Err("byTag takes a list of services".into());
                };
                for tag in object
                    .fields
                    .get("Tags")
                    .map(|t| t.iter_elements().collect::<Vec<_>>())
                    .unwrap_or_default()
                {
                    groups
                        .entry(tag.to_go_string())
                        .or_default()
                        .push(service.clone());
                }
            }
            Ok(Value::Map(Arc::new(
                groups
                    .into_iter()
                    .map(|(k, v)| (k, Value::list(v)))
                    .collect(),
            )))
        }
        "contains" => {
            arity(args, 2)?;
            Ok(Value::Bool(holds(&args[1], &args[0])?))
        }
        "sprig_contains" => {
            arity(args, 2)?;
            Ok(Value::Bool(s(1)?.contains(s(0)?)))
        }
        "containsAll" | "containsAny" | "containsNone" | "containsNotAll" => {
            arity(args, 2)?;
            let needles = args[0].len().unwrap_or(0);
            budget.charge_elements(needles.saturating_mul(args[1].len().unwrap_or(0)))?;
            let mut found = 0usize;
            let mut total = 0usize;
            for needle in args[0].iter_elements() {
                total += 1;
                if holds(&args[1], &needle)? {
                    found += 1;
                }
            }
            Ok(Value::Bool(match name {
                "containsAll" => found == total,
                "containsAny" => found > 0,
                "containsNone" => found == 0,
                _ => found < total,
            }))
        }
        "in" => {
            arity(args, 2)?;
            Ok(Value::Bool(holds(&args[0], &args[1])?))
        }
        "indent" => {
            arity(args, 2)?;
            let spaces = usize::try_from(want_int(args, 0, "the width")?)
                .map_err(|_| "the width cannot be negative")?;
            let body = s(1)?;
            if spaces
                .saturating_mul(body.lines().count() + 1)
                .saturating_add(body.len())
                > max_output
            {
                return Err(format!("the result would pass {} bytes", max_output).into());
            }
            let pad = " ".repeat(spaces);
            let mut out = String::new();
            for (i, line) in body.split('\n').enumerate() {
                if i > 0 {
                    out.push('\n');
                }
                out.push_str(&pad);
                out.push_str(line);
            }
            text(out)
        }
        "join" | "sprig_join" => {
            arity(args, 2)?;
            let separator = s(0)?;
            if !matches!(args[1], Value::List(_) | Value::Ints { .. } | Value::Nil) {
                return Err(format!(
                    "the second argument must be a list, not {}",
                    args[1].type_name()
                )
                .into());
            }
            let mut out = String::new();
            for (i, item) in args[1].iter_elements().enumerate() {
                if i > 0 {
                    out.push_str(separator);
                }
                item.write_go(&mut out);
                budget.string_of(out.len())?;
            }
            text(out)
        }
        "loop" => {
            let (start, end) = match args {
                [_] => (0, want_int(args, 0, "the end")?),
                [_, _] => (
                    want_int(args, 0, "the start")?,
                    want_int(args, 1, "the end")?,
                ),
                _ => return Err("loop takes an end, or a start and an end".into()),
            };
            Ok(Value::Ints {
                start,
                end: end.max(start),
            })
        }
        "mergeMap" | "mergeMapWithOverride" => {
            arity(args, 2)?;
            let (Value::Map(a), Value::Map(b)) = (&args[0], &args[1]) else {
                return Err("takes two maps".into());
            };
            // mergeMap keeps the second map's values; WithOverride lets the first win.
            let (base, over) = if name == "mergeMap" { (a, b) } else { (b, a) };
            let mut merged = (**base).clone();
            for (k, v) in over.iter() {
                merged.insert(k.clone(), v.clone());
            }
            Ok(Value::Map(Arc::new(merged)))
        }
        "parseBool" => {
            arity(args, 1)?;
            match s(0)? {
                "1" | "t" | "T" | "true" | "TRUE" | "True" => Ok(Value::Bool(true)),
                "0" | "f" | "F" | "false" | "FALSE" | "False" | "" => Ok(Value::Bool(false)),
                other => Err(format!("{other:?} is not a boolean").into()),
            }
        }
        "parseFloat" => {
            arity(args, 1)?;
            let t = s(0)?;
            if t.is_empty() {
                return Ok(Value::Float(0.0));
            }
            t.parse()
                .map(Value::Float)
                .map_err(|_| CallError(format!("{t:?} is not a number")))
        }
        "parseInt" | "sprig_atoi" => {
            arity(args, 1)?;
            let t = s(0)?;
            if t.is_empty() {
                return Ok(Value::Int(0));
            }
            t.parse()
                .map(Value::Int)
                .map_err(|_| CallError(format!("{t:?} is not a whole number")))
        }
        "parseUint" => {
            arity(args, 1)?;
            let t = s(0)?;
            if t.is_empty() {
                return Ok(Value::Int(0));
            }
            t.parse::<u32>()
                .map(|u| Value::Int(i64::from(u)))
                .or_else(|_| {
                    t.parse::<i64>()
                        .ok()
                        .filter(|i| *i >= 0)
                        .map(Value::Int)
                        .ok_or(())
                })
                .map_err(|_| CallError(format!("{t:?} is not a whole number of zero or more")))
        }
        "parseJSON" => {
            arity(args, 1)?;
            let t = s(0)?;
            if t.is_empty() {
                return Ok(Value::Map(Arc::default()));
            }
            // What a document becomes, at most (`[[],[],…]`: a value per 3 bytes).
            budget.take(t.len().saturating_mul(24))?;
            serde_json::from_str(t)
                .map(Value::from_json)
                .map_err(|e| CallError(format!("not JSON: {e}")))
        }
        "regexMatch" => {
            arity(args, 2)?;
            let body = regex_input(s(1)?)?;
            budget.charge_elements(body.len())?;
            Ok(Value::Bool(regex(s(0)?)?.is_match(body)))
        }
        "regexReplaceAll" => {
            arity(args, 3)?;
            let (pattern, replacement, body) = (regex(s(0)?)?, s(1)?, regex_input(s(2)?)?);
            budget.charge_elements(body.len())?;
            let matches = pattern.find_iter(body).count();
            budget
                .string_of(body.len().saturating_add(
                    matches.saturating_mul(replacement.len().saturating_add(16)),
                ))?;
            text(pattern.replace_all(body, replacement).into_owned())
        }
        "replaceAll" => {
            arity(args, 3)?;
            let (from, to, body) = (s(0)?, s(1)?, s(2)?);
            let count = if from.is_empty() {
                body.chars().count() + 1
            } else {
                body.matches(from).count()
            };
            if body.len().saturating_add(count.saturating_mul(to.len())) > max_output {
                return Err(format!("the result would pass {} bytes", max_output).into());
            }
            text(body.replace(from, to))
        }
        "sha256Hex" | "sprig_sha256sum" => {
            use sha2::Digest as _;
            arity(args, 1)?;
            let digest = sha2::Sha256::digest(s(0)?.as_bytes());
            text(digest.iter().map(|b| format!("{b:02x}")).collect())
        }
        "split" | "sprig_split" => {
            arity(args, 2)?;
            let (separator, body) = (s(0)?, s(1)?);
            if body.is_empty() {
                return Ok(Value::list(Vec::new()));
            }
            // An element each: charged in full, not by 64, and their room first.
            budget.charge_elements(body.len())?;
            let count = if separator.is_empty() {
                body.chars().count()
            } else {
                body.matches(separator).count() + 1
            };
            budget.will_make(count.saturating_mul(64))?;
            let parts: Vec<Value> = if separator.is_empty() {
                body.chars().map(|c| Value::str(c.to_string())).collect()
            } else {
                body.split(separator).map(Value::str).collect()
            };
            Ok(Value::list(parts))
        }
        "splitToMap" => {
            arity(args, 3)?;
            let (pair_separator, key_separator, body) = (s(0)?, s(1)?, s(2)?);
            if pair_separator.is_empty() || key_separator.is_empty() {
                return Err("the separators cannot be empty".into());
            }
            budget.charge_elements(body.len())?;
            budget.will_make(
                body.matches(pair_separator)
                    .count()
                    .saturating_add(1)
                    .saturating_mul(96),
            )?;
            let mut map = BTreeMap::new();
            for pair in body.split(pair_separator).filter(|p| !p.is_empty()) {
                let (k, v) = pair.split_once(key_separator).unwrap_or((pair, ""));
                map.insert(k.to_string(), Value::str(v));
            }
            Ok(Value::Map(Arc::new(map)))
        }
        "timestamp" => {
            let now = chrono::Utc::now();
            match args {
                [] => text(now.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)),
                [Value::Str(layout)] if &**layout == "unix" => text(now.timestamp().to_string()),
                [Value::Str(layout)] => text(now.format(&go_layout(layout)).to_string()),
                _ => Err("timestamp takes nothing, or a Go time layout".into()),
            }
        }
        "toJSON" => {
            arity(args, 1)?;
            // The JSON is at least its text; it is made twice (serde's value, then the
            // text).
            let bytes = walk_charged(&args[0], budget)?.text_bytes;
            budget.string_of(bytes)?;
            budget.take(bytes.saturating_mul(2))?;
            text(json_text(&args[0], false, true)?)
        }
        "toJSONPretty" => {
            arity(args, 1)?;
            // The JSON is at least its text; it is made twice (serde's value, then the
            // text).
            let bytes = walk_charged(&args[0], budget)?.text_bytes;
            budget.string_of(bytes)?;
            budget.take(bytes.saturating_mul(2))?;
            text(json_text(&args[0], true, true)?)
        }
        "toUnescapedJSON" => {
            arity(args, 1)?;
            // The JSON is at least its text; it is made twice (serde's value, then the
            // text).
            let bytes = walk_charged(&args[0], budget)?.text_bytes;
            budget.string_of(bytes)?;
            budget.take(bytes.saturating_mul(2))?;
            text(json_text(&args[0], false, false)?)
        }
        "toUnescapedJSONPretty" => {
            arity(args, 1)?;
            // The JSON is at least its text; it is made twice (serde's value, then the
            // text).
            let bytes = walk_charged(&args[0], budget)?.text_bytes;
            budget.string_of(bytes)?;
            budget.take(bytes.saturating_mul(2))?;
            text(json_text(&args[0], true, false)?)
        }
        "toLower" | "sprig_lower" => {
            arity(args, 1)?;
            text(s(0)?.to_lowercase())
        }
        "toUpper" | "sprig_upper" => {
            arity(args, 1)?;
            text(s(0)?.to_uppercase())
        }
        "toTitle" => {
            arity(args, 1)?;
            let mut out = String::new();
            let mut start = true;
            for c in s(0)?.chars() {
                if start {
                    out.extend(c.to_uppercase());
                } else {
                    out.push(c);
                }
                start = c.is_whitespace();
            }
            text(out)
        }
        "trimSpace" | "sprig_trim" => {
            arity(args, 1)?;
            text(s(0)?.trim().to_string())
        }
        "trim" | "sprig_trimAll" => {
            arity(args, 2)?;
            // consul-template's trim(s, cutset); sprig's trimAll(cutset, s).
            let (body, cutset) = if name == "trim" {
                (s(0)?, s(1)?)
            } else {
                (s(1)?, s(0)?)
            };
            // A set of the cutset's characters: a lookup each, not a scan of the cutset.
            let cut: std::collections::HashSet<char> = cutset.chars().collect();
            text(body.trim_matches(|c| cut.contains(&c)).to_string())
        }
        "trimPrefix" => {
            arity(args, 2)?;
            let (prefix, body) = (s(0)?, s(1)?);
            text(body.strip_prefix(prefix).unwrap_or(body).to_string())
        }
        "trimSuffix" => {
            arity(args, 2)?;
            let (suffix, body) = (s(0)?, s(1)?);
            text(body.strip_suffix(suffix).unwrap_or(body).to_string())
        }
        "add" | "subtract" | "multiply" | "divide" | "modulo" | "minimum" | "maximum" => {
            arity(args, 2)?;
            arithmetic(name, &args[0], &args[1])
        }
        "sprig_coalesce" => Ok(args
            .iter()
            .find(|a| a.truth())
            .cloned()
            .unwrap_or(Value::Nil)),
        "sprig_default" => {
            arity(args, 2)?;
            Ok(if args[1].truth() {
                args[1].clone()
            } else {
                args[0].clone()
            })
        }
        "sprig_dict" => {
            if !args.len().is_multiple_of(2) {
                return Err("dict takes pairs of a key and a value".into());
            }
            for pair in args.chunks(2) {
                nesting(&pair[1], budget)?;
            }
            let map = args
                .chunks(2)
                .map(|pair| (pair[0].to_go_string(), pair[1].clone()))
                .collect();
            Ok(Value::Map(Arc::new(map)))
        }
        "sprig_empty" => {
            arity(args, 1)?;
            Ok(Value::Bool(!args[0].truth()))
        }
        "sprig_first" | "sprig_last" => {
            arity(args, 1)?;
            let len = args[0].len().unwrap_or(0);
            let at = if name == "sprig_first" {
                0
            } else {
                len.saturating_sub(1)
            };
            Ok(args[0].element(at).unwrap_or(Value::Nil))
        }
        "sprig_has" => {
            arity(args, 2)?;
            Ok(Value::Bool(holds(&args[1], &args[0])?))
        }
        "sprig_hasPrefix" => {
            arity(args, 2)?;
            Ok(Value::Bool(s(1)?.starts_with(s(0)?)))
        }
        "sprig_hasSuffix" => {
            arity(args, 2)?;
            Ok(Value::Bool(s(1)?.ends_with(s(0)?)))
        }
        "sprig_list" => {
            for arg in args {
                nesting(arg, budget)?;
            }
            Ok(Value::list(args.to_vec()))
        }
        "sprig_quote" | "sprig_squote" => {
            let mut out = String::new();
            for (i, arg) in args.iter().enumerate() {
                if i > 0 {
                    out.push(' ');
                }
                let mut inner = String::new();
                arg.write_go(&mut inner);
                budget.string_of(out.len().saturating_add(inner.len()))?;
                if name == "sprig_quote" {
                    out.push_str(&go_quote(&inner));
                } else {
                    out.push('\'');
                    out.push_str(&inner);
                    out.push('\'');
                }
            }
            budget.string_of(out.len())?;
            text(out)
        }
        "sprig_repeat" => {
            arity(args, 2)?;
            let count = usize::try_from(want_int(args, 0, "the count")?)
                .map_err(|_| "the count cannot be negative")?;
            let body = s(1)?;
            if body.len().saturating_mul(count) > max_output {
                return Err(format!("the result would pass {} bytes", max_output).into());
            }
            text(body.repeat(count))
        }
        "sprig_replace" => {
            arity(args, 3)?;
            call("replaceAll", args, budget)
        }
        "sprig_sortAlpha" => {
            arity(args, 1)?;
            let n = args[0].len().unwrap_or(0);
            budget.charge_elements(
                n.saturating_mul(usize::BITS as usize - n.leading_zeros() as usize),
            )?;
            let mut items = string_list(&args[0], "the argument", budget)?;
            items.sort();
            Ok(Value::list(items.into_iter().map(Value::str).collect()))
        }
        "sprig_ternary" => {
            arity(args, 3)?;
            Ok(if args[2].truth() {
                args[0].clone()
            } else {
                args[1].clone()
            })
        }
        "sprig_toString" => {
            arity(args, 1)?;
            let mut out = String::new();
            args[0].write_go(&mut out);
            budget.string_of(out.len())?;
            text(out)
        }
        "sprig_uniq" => {
            arity(args, 1)?;
            let n = args[0].len().unwrap_or(0);
            budget.charge_elements(n.saturating_mul(n))?;
            let mut seen: Vec<Value> = Vec::new();
            for item in args[0].iter_elements() {
                if !seen.iter().any(|s| equal(s, &item).unwrap_or(false)) {
                    seen.push(item);
                }
            }
            Ok(Value::list(seen))
        }
        other => Err(format!("berth does not compute {other:?} here (an internal mix-up)").into()),
    }
}
