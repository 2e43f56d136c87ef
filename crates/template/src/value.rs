//! The values a template works on: Go's `interface{}` as consul-template's functions
//! hand them around, shared (`Arc`) so that a `range` over a thousand services copies
//! no service.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;

/// A value in a template.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// Go's nil: a missing map entry, or what a function returns for nothing.
    Nil,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(Arc<str>),
    List(Arc<Vec<Value>>),
    /// A map with string keys (`parseJSON`'s objects, `byTag`'s groups): a missing key
    /// is nil, or an error with `error_on_missing_key`.
    Map(Arc<BTreeMap<String, Value>>),
    /// A record with named fields (a service): a field it lacks is always an error.
    Object(Arc<Object>),
    /// `loop`'s integers, `start` up to `end` (excluded), made as they are ranged over.
    Ints {
        start: i64,
        end: i64,
    },
}

/// A record such as a service, with Go's type name for errors.
#[derive(Debug, Clone, PartialEq)]
pub struct Object {
    pub type_name: &'static str,
    pub fields: BTreeMap<&'static str, Value>,
}

impl Value {
    pub fn str(text: impl Into<Arc<str>>) -> Value {
        Value::Str(text.into())
    }

    pub fn list(items: Vec<Value>) -> Value {
        Value::List(Arc::new(items))
    }

    pub fn object(type_name: &'static str, fields: BTreeMap<&'static str, Value>) -> Value {
        Value::Object(Arc::new(Object { type_name, fields }))
    }

    /// Go's name of the value's type, for errors.
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::Nil => "nil",
            Value::Bool(_) => "bool",
            Value::Int(_) => "int",
            Value::Float(_) => "float64",
            Value::Str(_) => "string",
            Value::List(_) | Value::Ints { .. } => "list",
            Value::Map(_) => "map",
            Value::Object(object) => object.type_name,
        }
    }

    /// Go's `truth`: false, 0, nil and empty things are false.
    pub fn truth(&self) -> bool {
        match self {
            Value::Nil => false,
            Value::Bool(b) => *b,
            Value::Int(i) => *i != 0,
            Value::Float(f) => *f != 0.0,
            Value::Str(s) => !s.is_empty(),
            Value::List(l) => !l.is_empty(),
            Value::Map(m) => !m.is_empty(),
            Value::Object(_) => true,
            Value::Ints { start, end } => end > start,
        }
    }

    /// Whether it has no elements (nil, or a `len` of 0).
    pub fn is_empty(&self) -> bool {
        self.len().unwrap_or(0) == 0
    }

    /// The number of elements (`len`), if it has any.
    pub fn len(&self) -> Option<usize> {
        match self {
            Value::Str(s) => Some(s.len()),
            Value::List(l) => Some(l.len()),
            Value::Map(m) => Some(m.len()),
            Value::Ints { start, end } => {
                Some(usize::try_from(end.saturating_sub(*start)).unwrap_or(0))
            }
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_int(&self) -> Option<i64> {
        match self {
            Value::Int(i) => Some(*i),
            Value::Float(f) if f.fract() == 0.0 && f.abs() < 9.0e15 => Some(*f as i64),
            _ => None,
        }
    }

    /// Bytes a function spent making this value, for the render's memory budget: a
    /// string's text, a list's and a map's slots (their elements were counted when
    /// they were made).
    pub fn made_size(&self) -> usize {
        match self {
            Value::Str(s) => s.len(),
            Value::List(l) => l.len().saturating_mul(32),
            Value::Map(m) => m.keys().map(|k| k.len() + 64).sum(),
            Value::Object(o) => o.fields.len().saturating_mul(48),
            _ => 0,
        }
    }

    /// The `index`-th element of a list (or `loop`'s integers).
    pub fn element(&self, index: usize) -> Option<Value> {
        match self {
            Value::List(l) => l.get(index).cloned(),
            Value::Ints { start, end } => {
                let at = start.checked_add(i64::try_from(index).ok()?)?;
                (at < *end).then_some(Value::Int(at))
            }
            _ => None,
        }
    }

    /// Writes the value as Go's `fmt.Print` does (`%v`): lists as `[a b]`, maps as
    /// `map[k:v]`, nil as `<nil>`. It stops once `out` holds [`GO_TEXT_CAP`] bytes: a
    /// text that long is refused by whoever asked for it (no render writes as much),
    /// and `loop`'s billion integers are not all written first.
    pub fn write_go(&self, out: &mut String) {
        if out.len() > GO_TEXT_CAP {
            return;
        }
        match self {
            Value::Nil => out.push_str("<nil>"),
            Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            Value::Int(i) => {
                let _ = write!(out, "{i}");
            }
            Value::Float(f) => out.push_str(&go_float(*f)),
            Value::Str(s) => out.push_str(s),
            Value::List(_) | Value::Ints { .. } => {
                out.push('[');
                let mut first = true;
                for item in self.iter_elements() {
                    if out.len() > GO_TEXT_CAP {
                        return;
                    }
                    if !first {
                        out.push(' ');
                    }
                    first = false;
                    item.write_go(out);
                }
                out.push(']');
            }
            Value::Map(m) => {
                out.push_str("map[");
                for (i, (k, v)) in m.iter().enumerate() {
                    if i > 0 {
                        out.push(' ');
                    }
                    out.push_str(k);
                    out.push(':');
                    v.write_go(out);
                }
                out.push(']');
            }
            Value::Object(o) => {
                out.push('{');
                for (i, v) in o.fields.values().enumerate() {
                    if i > 0 {
                        out.push(' ');
                    }
                    v.write_go(out);
                }
                out.push('}');
            }
        }
    }

    /// As `fmt.Sprint` would give it.
    pub fn to_go_string(&self) -> String {
        match self {
            Value::Str(s) => s.to_string(),
            _ => {
                let mut out = String::new();
                self.write_go(&mut out);
                out
            }
        }
    }

    /// The elements of a list or of `loop`'s integers; nothing for anything else.
    pub fn iter_elements(&self) -> Box<dyn Iterator<Item = Value> + '_> {
        match self {
            Value::List(l) => Box::new(l.iter().cloned()),
            Value::Ints { start, end } => Box::new((*start..*end).map(Value::Int)),
            _ => Box::new(std::iter::empty()),
        }
    }

    /// From JSON, as Go's `encoding/json` decodes into `interface{}` (numbers that are
    /// whole stay integers here, which prints the same).
    pub fn from_json(json: serde_json::Value) -> Value {
        match json {
            serde_json::Value::Null => Value::Nil,
            serde_json::Value::Bool(b) => Value::Bool(b),
            serde_json::Value::Number(n) => match n.as_i64() {
                Some(i) => Value::Int(i),
                None => Value::Float(n.as_f64().unwrap_or(f64::NAN)),
            },
            serde_json::Value::String(s) => Value::str(s),
            serde_json::Value::Array(items) => {
                Value::list(items.into_iter().map(Value::from_json).collect())
            }
            serde_json::Value::Object(map) => Value::Map(Arc::new(
                map.into_iter()
                    .map(|(k, v)| (k, Value::from_json(v)))
                    .collect(),
            )),
        }
    }

    /// To JSON, as `toJSON` writes it (an object's fields by their Go names).
    pub fn to_json(&self) -> serde_json::Value {
        match self {
            Value::Nil => serde_json::Value::Null,
            Value::Bool(b) => serde_json::Value::Bool(*b),
            Value::Int(i) => serde_json::Value::from(*i),
            Value::Float(f) => serde_json::Number::from_f64(*f)
                .map(serde_json::Value::Number)
                .unwrap_or(serde_json::Value::Null),
            Value::Str(s) => serde_json::Value::String(s.to_string()),
            Value::List(_) | Value::Ints { .. } => {
                serde_json::Value::Array(self.iter_elements().map(|v| v.to_json()).collect())
            }
            Value::Map(m) => {
                serde_json::Value::Object(m.iter().map(|(k, v)| (k.clone(), v.to_json())).collect())
            }
            Value::Object(o) => serde_json::Value::Object(
                o.fields
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_json()))
                    .collect(),
            ),
        }
    }
}

/// The most [`Value::write_go`] writes (past every output limit berth sets).
pub const GO_TEXT_CAP: usize = 16 << 20;

/// Go's `%v` of a float64: the shortest form that reads back, with an exponent below
/// 1e-4 and from 1e21 (`1e+21`, `1e-05`).
pub fn go_float(f: f64) -> String {
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "+Inf" } else { "-Inf" }.into();
    }
    let magnitude = f.abs();
    if f == 0.0 || (1e-4..1e21).contains(&magnitude) {
        return format!("{f}");
    }
    let text = format!("{f:e}");
    let (mantissa, exponent) = text.split_once('e').unwrap_or((&text, "0"));
    let (sign, digits) = match exponent.strip_prefix('-') {
        Some(d) => ('-', d),
        None => ('+', exponent),
    };
    format!("{mantissa}e{sign}{digits:0>2}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_print_as_go_prints_them() {
        assert_eq!(go_float(1.5), "1.5");
        assert_eq!(go_float(3.0), "3");
        assert_eq!(go_float(1e21), "1e+21");
        assert_eq!(go_float(0.00001), "1e-05");
        assert_eq!(go_float(-2.5e-7), "-2.5e-07");
    }

    #[test]
    fn lists_and_maps_print_as_go_prints_them() {
        let map = Value::from_json(serde_json::json!({"b": [1, "x"], "a": null}));
        assert_eq!(map.to_go_string(), "map[a:<nil> b:[1 x]]");
        assert_eq!(Value::Ints { start: 1, end: 4 }.to_go_string(), "[1 2 3]");
    }
}
