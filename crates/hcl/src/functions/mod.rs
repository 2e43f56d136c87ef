//! The HCL function library a jobspec may call, as Nomad exposes it (a subset of
//! go-cty's standard library, without the filesystem: `file` is the CLI's, see
//! [`super::eval`]).
//!
//! A job author is not trusted and the agent evaluates what they send, so every function
//! bounds what it builds: strings up to [`MAX_STRING`] bytes, lists up to [`MAX_ITEMS`]
//! elements. A call past a bound fails with an error saying so. What they build and
//! what they compare is charged to the evaluation's budget ([`super::budget`]) before
//! they build or compare it: `distinct` hashes (linear, not pairwise), and `contains`,
//! `distinct`, `toset` and `sort` take their comparisons from the budget first.

use base64::Engine as _;
use hcl::Value;
use hcl::eval::{Context, FuncArgs, FuncDef, ParamType};

use super::budget::{BudgetSpent, charge, charge_comparisons};

/// The longest string a function returns.
pub const MAX_STRING: usize = 64 * 1024;
/// The most elements a function returns in a list or object.
pub const MAX_ITEMS: usize = 1024;
/// The text hcl-rs shows for a spent budget.
fn spent(error: BudgetSpent) -> String {
    error.to_string()
}

/// About how many bytes `value` takes: its strings, plus a word per element.
pub fn value_size(value: &Value) -> usize {
    match value {
        Value::String(s) => s.len(),
        Value::Array(items) => items
            .iter()
            .map(|v| value_size(v).saturating_add(16))
            .fold(0, usize::saturating_add),
        Value::Object(map) => map
            .iter()
            .map(|(k, v)| k.len().saturating_add(value_size(v)).saturating_add(16))
            .fold(0, usize::saturating_add),
        _ => 16,
    }
}

/// What hcl-rs's function signature (`hcl::eval::Func`) returns: the error is the text
/// hcl-rs shows the user.
type Result = std::result::Result<hcl::Value, String>;

/// Declares every function in `ctx`.
pub fn declare_all(ctx: &mut Context) {
    use ParamType::{Any, Number, String as Str};
    let list = || ParamType::array_of(Any);
    let strings = || ParamType::array_of(Str);
    let object = || ParamType::object_of(Any);
    let fixed = |params: Vec<ParamType>, f: hcl::eval::Func| FuncDef::new(f, params);
    let variadic = |params: Vec<ParamType>, rest: ParamType, f: hcl::eval::Func| {
        FuncDef::builder()
            .params(params)
            .variadic_param(rest)
            .build(f)
    };
    let defs: Vec<(&str, FuncDef)> = vec![
        (
            "upper",
            fixed(vec![Str], |a| {
                text(a[0].as_str().unwrap_or("").to_uppercase())
            }),
        ),
        (
            "lower",
            fixed(vec![Str], |a| {
                text(a[0].as_str().unwrap_or("").to_lowercase())
            }),
        ),
        ("title", fixed(vec![Str], title)),
        (
            "trimspace",
            fixed(vec![Str], |a| {
                text(a[0].as_str().unwrap_or("").trim().into())
            }),
        ),
        (
            "chomp",
            fixed(vec![Str], |a| {
                text(
                    a[0].as_str()
                        .unwrap_or("")
                        .trim_end_matches(['\n', '\r'])
                        .into(),
                )
            }),
        ),
        (
            "trimprefix",
            fixed(vec![Str, Str], |a| {
                let (s, p) = (string(&a[0]), string(&a[1]));
                text(s.strip_prefix(p).unwrap_or(s).into())
            }),
        ),
        (
            "trimsuffix",
            fixed(vec![Str, Str], |a| {
                let (s, p) = (string(&a[0]), string(&a[1]));
                text(s.strip_suffix(p).unwrap_or(s).into())
            }),
        ),
        (
            "startswith",
            fixed(vec![Str, Str], |a| {
                Ok(Value::Bool(string(&a[0]).starts_with(string(&a[1]))))
            }),
        ),
        (
            "endswith",
            fixed(vec![Str, Str], |a| {
                Ok(Value::Bool(string(&a[0]).ends_with(string(&a[1]))))
            }),
        ),
        ("replace", fixed(vec![Str, Str, Str], replace)),
        ("substr", fixed(vec![Str, Number, Number], substr)),
        (
            "strlen",
            fixed(vec![Str], |a| {
                Ok(Value::from(string(&a[0]).chars().count() as u64))
            }),
        ),
        ("format", variadic(vec![Str], Any, format)),
        ("join", variadic(vec![Str], strings(), join)),
        ("split", fixed(vec![Str, Str], split)),
        ("concat", variadic(vec![], list(), concat)),
        (
            "merge",
            variadic(vec![], ParamType::nullable(object()), merge),
        ),
        ("lookup", variadic(vec![object(), Str], Any, lookup)),
        (
            "keys",
            fixed(vec![object()], |a| {
                items(
                    a[0].as_object()
                        .map(|o| o.keys().cloned().map(Value::from).collect()),
                )
            }),
        ),
        (
            "values",
            fixed(vec![object()], |a| {
                items(a[0].as_object().map(|o| o.values().cloned().collect()))
            }),
        ),
        ("length", fixed(vec![Any], length)),
        ("contains", fixed(vec![list(), Any], contains)),
        ("element", fixed(vec![list(), Number], element)),
        ("flatten", fixed(vec![list()], flatten)),
        ("distinct", fixed(vec![list()], distinct)),
        (
            "compact",
            fixed(vec![list()], |a| {
                items(Some(
                    array(&a[0])
                        .iter()
                        .filter(|v| !v.is_null() && v.as_str() != Some(""))
                        .cloned()
                        .collect(),
                ))
            }),
        ),
        (
            "reverse",
            fixed(vec![list()], |a| {
                items(Some(array(&a[0]).iter().rev().cloned().collect()))
            }),
        ),
        ("sort", fixed(vec![strings()], sort)),
        ("slice", fixed(vec![list(), Number, Number], slice)),
        ("range", variadic(vec![Number], Number, range)),
        (
            "coalesce",
            variadic(vec![], Any, |a| {
                a.iter()
                    .find(|v| !v.is_null() && v.as_str() != Some(""))
                    .ok_or_else(|| "no non-null, non-empty argument".to_string())
                    .and_then(cloned)
            }),
        ),
        (
            "min",
            variadic(vec![Number], Number, |a| fold_numbers(&a, f64::min)),
        ),
        (
            "max",
            variadic(vec![Number], Number, |a| fold_numbers(&a, f64::max)),
        ),
        (
            "abs",
            fixed(vec![Number], |a| number(number_of(&a[0]).abs())),
        ),
        (
            "ceil",
            fixed(vec![Number], |a| number(number_of(&a[0]).ceil())),
        ),
        (
            "floor",
            fixed(vec![Number], |a| number(number_of(&a[0]).floor())),
        ),
        (
            "tostring",
            fixed(vec![Any], |a| match &a[0] {
                Value::String(_) => cloned(&a[0]),
                Value::Number(n) => text(n.to_string()),
                Value::Bool(b) => text(b.to_string()),
                other => Err(format!("cannot convert {} to a string", kind(other))),
            }),
        ),
        (
            "tonumber",
            fixed(vec![Any], |a| match &a[0] {
                Value::Number(_) => Ok(a[0].clone()),
                Value::String(s) => s
                    .trim()
                    .parse::<f64>()
                    .map_err(|_| format!("{s:?} is not a number"))
                    .and_then(number),
                other => Err(format!("cannot convert {} to a number", kind(other))),
            }),
        ),
        (
            "tobool",
            fixed(vec![Any], |a| match &a[0] {
                Value::Bool(_) => Ok(a[0].clone()),
                Value::String(s) if s == "true" || s == "false" => Ok(Value::Bool(s == "true")),
                other => Err(format!("cannot convert {} to a bool", describe(other))),
            }),
        ),
        ("tolist", fixed(vec![list()], |a| cloned(&a[0]))),
        ("toset", fixed(vec![list()], distinct)),
        ("tomap", fixed(vec![object()], |a| cloned(&a[0]))),
        (
            "jsonencode",
            fixed(vec![Any], |a| {
                serde_json::to_string(&to_json(&a[0]))
                    .map_err(|e| e.to_string())
                    .and_then(text)
            }),
        ),
        (
            "jsondecode",
            fixed(vec![Str], |a| {
                let json: serde_json::Value =
                    serde_json::from_str(string(&a[0])).map_err(|e| format!("not JSON: {e}"))?;
                let value = from_json(json);
                charge(value_size(&value)).map_err(spent)?;
                Ok(value)
            }),
        ),
        (
            "base64encode",
            fixed(vec![Str], |a| {
                text(base64::engine::general_purpose::STANDARD.encode(string(&a[0])))
            }),
        ),
        (
            "base64decode",
            fixed(vec![Str], |a| {
                let bytes = base64::engine::general_purpose::STANDARD
                    .decode(string(&a[0]))
                    .map_err(|e| format!("not base64: {e}"))?;
                String::from_utf8(bytes)
                    .map_err(|_| "the decoded bytes are not UTF-8".to_string())
                    .and_then(text)
            }),
        ),
    ];
    for (name, def) in defs {
        ctx.declare_func(name, def);
    }
}

/// The names of the functions, for "unknown function" errors (`file` is the CLI's).
pub const NAMES: &[&str] = &[
    "abs",
    "base64decode",
    "base64encode",
    "ceil",
    "chomp",
    "coalesce",
    "compact",
    "concat",
    "contains",
    "distinct",
    "element",
    "endswith",
    "file",
    "flatten",
    "floor",
    "format",
    "join",
    "jsondecode",
    "jsonencode",
    "keys",
    "length",
    "lookup",
    "lower",
    "max",
    "merge",
    "min",
    "range",
    "replace",
    "reverse",
    "slice",
    "sort",
    "split",
    "startswith",
    "strlen",
    "substr",
    "title",
    "tobool",
    "tolist",
    "tomap",
    "tonumber",
    "toset",
    "tostring",
    "trimprefix",
    "trimspace",
    "trimsuffix",
    "upper",
    "values",
];

fn string(value: &Value) -> &str {
    value.as_str().unwrap_or("")
}

fn array(value: &Value) -> &[Value] {
    value.as_array().map(Vec::as_slice).unwrap_or(&[])
}

fn number_of(value: &Value) -> f64 {
    value.as_f64().unwrap_or(0.0)
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a bool",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

fn describe(value: &Value) -> String {
    match value {
        Value::String(s) => format!("{s:?}"),
        other => kind(other).to_string(),
    }
}

/// A string result, refused past [`MAX_STRING`].
fn text(s: String) -> Result {
    if s.len() > MAX_STRING {
        return Err(too_long(s.len()));
    }
    charge(s.len()).map_err(spent)?;
    Ok(Value::String(s))
}

/// The refusal of a string result of `len` bytes. Functions whose result can be many
/// times their arguments' size compute `len` first and never build such a string.
fn too_long(len: usize) -> String {
    format!("the result would be {len} bytes long; berth allows {MAX_STRING}")
}

/// The refusal of a list argument of more than [`MAX_ITEMS`] elements, for a function
/// whose work grows with its square.
fn too_many_to_compare(len: usize) -> String {
    format!("the list has {len} elements; berth compares at most {MAX_ITEMS}")
}

/// `replace(string, substring, replacement)`: the result's length is computed from the
/// number of matches before it is built (60,000 matches of a 60,000-byte replacement
/// would otherwise be 3.6 GB, built and then refused).
fn replace(args: FuncArgs) -> Result {
    let (s, from, to) = (string(&args[0]), string(&args[1]), string(&args[2]));
    let matches = if from.is_empty() {
        // Go and Rust both insert at every character boundary, both ends included.
        s.chars().count() + 1
    } else {
        s.matches(from).count()
    };
    let len = (s.len() - matches * from.len()).saturating_add(matches.saturating_mul(to.len()));
    if len > MAX_STRING {
        return Err(too_long(len));
    }
    text(s.replace(from, to))
}

/// A copy of an argument as the result, charged as one.
fn cloned(value: &Value) -> Result {
    charge(value_size(value)).map_err(spent)?;
    Ok(value.clone())
}

/// A list result, refused past [`MAX_ITEMS`].
fn items(list: Option<Vec<Value>>) -> Result {
    let list = list.unwrap_or_default();
    if list.len() > MAX_ITEMS {
        return Err(too_many_items(list.len()));
    }
    let list = Value::Array(list);
    charge(value_size(&list)).map_err(spent)?;
    Ok(list)
}

fn too_many_items(len: usize) -> String {
    format!("the result would have {len} elements; berth allows {MAX_ITEMS}")
}

fn number(n: f64) -> Result {
    if n.fract() == 0.0 && n.abs() < 9.0e15 {
        return Ok(Value::from(n as i64));
    }
    hcl::Number::from_f64(n)
        .map(Value::Number)
        .ok_or_else(|| format!("{n} is not a finite number"))
}

fn fold_numbers(args: &FuncArgs, pick: fn(f64, f64) -> f64) -> Result {
    let first = number_of(&args[0]);
    number(args.iter().skip(1).map(number_of).fold(first, pick))
}

fn title(args: FuncArgs) -> Result {
    let mut out = String::new();
    let mut start = true;
    for c in string(&args[0]).chars() {
        if start && c.is_alphabetic() {
            out.extend(c.to_uppercase());
        } else {
            out.push(c);
        }
        start = !c.is_alphanumeric();
    }
    text(out)
}

fn substr(args: FuncArgs) -> Result {
    let chars: Vec<char> = string(&args[0]).chars().collect();
    let offset = number_of(&args[1]) as i64;
    let length = number_of(&args[2]) as i64;
    let len = chars.len() as i64;
    let start = if offset < 0 {
        (len + offset).max(0)
    } else {
        offset.min(len)
    };
    let end = if length < 0 {
        len
    } else {
        (start + length).min(len)
    };
    text(
        chars[start as usize..end.max(start) as usize]
            .iter()
            .collect(),
    )
}

/// Go's fmt verbs as go-cty's `format` has them: `%s`, `%d`, `%v`, `%q`, `%f`, `%t`,
/// `%%`, with an optional width (`%5d`, `%-5s`) and precision (`%.2f`).
fn format(args: FuncArgs) -> Result {
    let spec = string(&args[0]);
    let mut rest = args.iter().skip(1);
    let mut out = String::new();
    let mut chars = spec.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let mut flags = String::new();
        while let Some(&next) = chars.peek() {
            if next == '-' || next == '0' || next == '.' || next.is_ascii_digit() {
                flags.push(next);
                chars.next();
            } else {
                break;
            }
        }
        let verb = chars
            .next()
            .ok_or("the format ends in the middle of a verb")?;
        if verb == '%' {
            out.push('%');
            continue;
        }
        let value = rest
            .next()
            .ok_or_else(|| format!("too few arguments for the format {spec:?}"))?;
        let (width_text, precision) = match flags.split_once('.') {
            Some((w, p)) => (w.to_string(), p.parse::<usize>().ok()),
            None => (flags.clone(), None),
        };
        let left = width_text.starts_with('-');
        let zero = width_text.trim_start_matches('-').starts_with('0');
        let width: usize = width_text
            .trim_start_matches(['-', '0'])
            .parse()
            .unwrap_or(0)
            .min(MAX_STRING);
        let piece = match verb {
            's' | 'v' => match value {
                Value::String(s) => s.clone(),
                Value::Number(n) => n.to_string(),
                Value::Bool(b) => b.to_string(),
                other => serde_json::to_string(&to_json(other)).map_err(|e| e.to_string())?,
            },
            'q' => format!("{:?}", string(value)),
            'd' => match value.as_f64() {
                Some(n) if n.fract() == 0.0 => format!("{}", n as i64),
                _ => return Err(format!("%d needs a whole number, got {}", describe(value))),
            },
            'f' => {
                let n = value
                    .as_f64()
                    .ok_or_else(|| format!("%f needs a number, got {}", describe(value)))?;
                format!("{n:.*}", precision.unwrap_or(6))
            }
            't' => match value {
                Value::Bool(b) => b.to_string(),
                other => return Err(format!("%t needs a bool, got {}", describe(other))),
            },
            other => return Err(format!("format verb %{other} is not supported")),
        };
        let pad = width.saturating_sub(piece.chars().count());
        if left {
            out.push_str(&piece);
            out.extend(std::iter::repeat_n(' ', pad));
        } else {
            out.extend(std::iter::repeat_n(if zero { '0' } else { ' ' }, pad));
            out.push_str(&piece);
        }
        if out.len() > MAX_STRING {
            return text(out);
        }
    }
    text(out)
}

/// The list without repeats, first occurrences kept (also `toset`: berth's sets are lists).
/// Each element is hashed, and compared only with the earlier ones of its hash: the work
/// is about twice the list's size (charged first), not its square.
fn distinct(args: FuncArgs) -> Result {
    use std::hash::BuildHasher as _;
    let list = array(&args[0]);
    if list.len() > MAX_ITEMS {
        return Err(too_many_to_compare(list.len()));
    }
    charge_comparisons(value_size(&args[0]).saturating_mul(2)).map_err(spent)?;
    // Random keys: a job author cannot choose elements whose hashes collide.
    let keys = std::collections::hash_map::RandomState::new();
    let mut seen: std::collections::HashMap<u64, Vec<usize>> = std::collections::HashMap::new();
    let mut kept: Vec<&Value> = Vec::new();
    for item in list {
        let mut hasher = keys.build_hasher();
        fingerprint(item, &keys, &mut hasher);
        let same_hash = seen.entry(std::hash::Hasher::finish(&hasher)).or_default();
        if !same_hash.iter().any(|&index| kept[index] == item) {
            same_hash.push(kept.len());
            kept.push(item);
        }
    }
    // The result is charged before it is copied.
    let size = kept
        .iter()
        .map(|v| value_size(v).saturating_add(16))
        .fold(0, usize::saturating_add);
    charge(size).map_err(spent)?;
    Ok(Value::Array(kept.into_iter().cloned().collect()))
}

/// Hashes `value` so that equal values (as hcl-rs compares them) hash the same: numbers
/// by their value, objects whatever the order of their keys.
fn fingerprint(
    value: &Value,
    keys: &std::collections::hash_map::RandomState,
    into: &mut impl std::hash::Hasher,
) {
    use std::hash::{BuildHasher as _, Hash as _};
    match value {
        Value::Null => 0u8.hash(into),
        Value::Bool(b) => (1u8, b).hash(into),
        Value::Number(n) => {
            // 0.0 and -0.0 are equal.
            let n = n.as_f64().unwrap_or(0.0);
            (2u8, if n == 0.0 { 0 } else { n.to_bits() }).hash(into);
        }
        Value::String(s) => (3u8, s).hash(into),
        Value::Array(items) => {
            (4u8, items.len()).hash(into);
            for item in items {
                fingerprint(item, keys, into);
            }
        }
        Value::Object(map) => {
            // Keys in any order: each entry hashed alone, the hashes summed.
            let entries = map.iter().fold(0u64, |sum, (key, item)| {
                let mut entry = keys.build_hasher();
                key.hash(&mut entry);
                fingerprint(item, keys, &mut entry);
                sum.wrapping_add(std::hash::Hasher::finish(&entry))
            });
            (5u8, map.len(), entries).hash(into);
        }
    }
}

/// `contains(list, value)`: compares `value` with each element, the list's size charged
/// first (a `for` over a list that calls it once per element would otherwise compare
/// the list with itself unbounded).
fn contains(args: FuncArgs) -> Result {
    charge_comparisons(value_size(&args[0])).map_err(spent)?;
    Ok(Value::Bool(array(&args[0]).contains(&args[1])))
}

/// `sort(list of strings)`: refused past [`MAX_ITEMS`] before sorting (the result would
/// be), its comparisons charged first.
fn sort(args: FuncArgs) -> Result {
    let list = array(&args[0]);
    if list.len() > MAX_ITEMS {
        return Err(too_many_to_compare(list.len()));
    }
    let rounds = usize::BITS - list.len().leading_zeros();
    charge_comparisons(value_size(&args[0]).saturating_mul(rounds as usize)).map_err(spent)?;
    let mut out: Vec<&str> = list.iter().map(string).collect();
    out.sort_unstable();
    items(Some(out.into_iter().map(Value::from).collect()))
}

fn join(args: FuncArgs) -> Result {
    let separator = string(&args[0]);
    let parts: Vec<&str> = args
        .iter()
        .skip(1)
        .flat_map(|list| array(list).iter().map(string))
        .collect();
    let total: usize = parts
        .iter()
        .map(|p| p.len().saturating_add(separator.len()))
        .fold(0, usize::saturating_add)
        .saturating_sub(separator.len());
    if total > MAX_STRING {
        return Err(too_long(total));
    }
    text(parts.join(separator))
}

fn split(args: FuncArgs) -> Result {
    let (separator, s) = (string(&args[0]), string(&args[1]));
    if separator.is_empty() {
        return Err("split needs a non-empty separator".into());
    }
    items(Some(
        s.split(separator)
            .take(MAX_ITEMS + 1)
            .map(Value::from)
            .collect(),
    ))
}

fn concat(args: FuncArgs) -> Result {
    let total: usize = args.iter().map(|l| array(l).len()).sum();
    if total > MAX_ITEMS {
        return Err(too_many_items(total));
    }
    items(Some(
        args.iter().flat_map(|l| array(l).iter().cloned()).collect(),
    ))
}

fn merge(args: FuncArgs) -> Result {
    let mut out = hcl::Map::new();
    for object in args.iter().filter_map(Value::as_object) {
        for (key, value) in object {
            out.insert(key.clone(), value.clone());
        }
        if out.len() > MAX_ITEMS {
            return Err(too_many_items(out.len()));
        }
    }
    let out = Value::Object(out);
    charge(value_size(&out)).map_err(spent)?;
    Ok(out)
}

fn lookup(args: FuncArgs) -> Result {
    let key = string(&args[1]);
    match args[0].as_object().and_then(|o| o.get(key)) {
        Some(value) => cloned(value),
        None => args
            .get(2)
            .ok_or_else(|| format!("the object has no key {key:?} and no default was given"))
            .and_then(cloned),
    }
}

fn length(args: FuncArgs) -> Result {
    let n = match &args[0] {
        Value::String(s) => s.chars().count(),
        Value::Array(a) => a.len(),
        Value::Object(o) => o.len(),
        other => return Err(format!("length of {} is not defined", kind(other))),
    };
    Ok(Value::from(n as u64))
}

fn element(args: FuncArgs) -> Result {
    let list = array(&args[0]);
    if list.is_empty() {
        return Err("element of an empty list".into());
    }
    let index = number_of(&args[1]);
    if index < 0.0 {
        return Err("element needs an index of 0 or more".into());
    }
    cloned(&list[index as usize % list.len()])
}

fn flatten(args: FuncArgs) -> Result {
    /// Appends the leaves of `list`; false once they pass the bounds.
    fn walk(list: &[Value], out: &mut Vec<Value>, depth: usize) -> bool {
        depth <= 32
            && list.iter().all(|item| {
                match item {
                    Value::Array(inner) => return walk(inner, out, depth + 1),
                    other => out.push(other.clone()),
                }
                out.len() <= MAX_ITEMS
            })
    }
    let mut out = Vec::new();
    if !walk(array(&args[0]), &mut out, 0) {
        return Err(format!(
            "the result would be nested more than 32 deep or have more than {MAX_ITEMS} \
             elements"
        ));
    }
    items(Some(out))
}

fn slice(args: FuncArgs) -> Result {
    let list = array(&args[0]);
    let (start, end) = (number_of(&args[1]), number_of(&args[2]));
    if start < 0.0 || end < start || end as usize > list.len() {
        return Err(format!(
            "slice({start}, {end}) is out of range for a list of {}",
            list.len()
        ));
    }
    items(Some(list[start as usize..end as usize].to_vec()))
}

/// `range(limit)`, `range(start, limit)`, `range(start, limit, step)`.
fn range(args: FuncArgs) -> Result {
    let numbers: Vec<f64> = args.iter().map(number_of).collect();
    let (start, limit, step) = match numbers.as_slice() {
        [limit] => (0.0, *limit, 1.0),
        [start, limit] => (*start, *limit, if limit >= start { 1.0 } else { -1.0 }),
        [start, limit, step] => (*start, *limit, *step),
        _ => return Err("range takes one to three numbers".into()),
    };
    if step == 0.0 || (step > 0.0) != (limit >= start) && limit != start {
        return Err(format!("range({start}, {limit}, {step}) never ends"));
    }
    let count = ((limit - start) / step).ceil().max(0.0);
    if count > MAX_ITEMS as f64 {
        return Err(format!(
            "range would have {count} elements; berth allows {MAX_ITEMS}"
        ));
    }
    (0..count as usize)
        .map(|i| number(start + step * i as f64))
        .collect::<std::result::Result<Vec<_>, _>>()
        .and_then(|list| items(Some(list)))
}

pub fn to_json(value: &Value) -> serde_json::Value {
    match value {
        Value::Null => serde_json::Value::Null,
        Value::Bool(b) => serde_json::Value::Bool(*b),
        Value::Number(n) => number_json(n),
        Value::String(s) => serde_json::Value::String(s.clone()),
        Value::Array(a) => a.iter().map(to_json).collect(),
        Value::Object(o) => o.iter().map(|(k, v)| (k.clone(), to_json(v))).collect(),
    }
}

pub fn number_json(n: &hcl::Number) -> serde_json::Value {
    if let Some(i) = n.as_i64() {
        serde_json::Value::from(i)
    } else if let Some(u) = n.as_u64() {
        serde_json::Value::from(u)
    } else {
        n.as_f64()
            .and_then(serde_json::Number::from_f64)
            .map(serde_json::Value::Number)
            .unwrap_or(serde_json::Value::Null)
    }
}

fn from_json(json: serde_json::Value) -> Value {
    match json {
        serde_json::Value::Null => Value::Null,
        serde_json::Value::Bool(b) => Value::Bool(b),
        serde_json::Value::Number(n) => n
            .as_f64()
            .and_then(hcl::Number::from_f64)
            .map(Value::Number)
            .unwrap_or(Value::Null),
        serde_json::Value::String(s) => Value::String(s),
        serde_json::Value::Array(a) => Value::Array(a.into_iter().map(from_json).collect()),
        serde_json::Value::Object(o) => {
            Value::Object(o.into_iter().map(|(k, v)| (k, from_json(v))).collect())
        }
    }
}

#[cfg(test)]
mod tests;
