//! consul-template's functions that reshape Consul key trees: `byKey` groups a tree's
//! pairs by their top-level folder, `explode` (a tree's or `ls`'s pairs) and
//! `explodeMap` (a map whose keys are paths) make a nested map of folders. Each is
//! charged the elements it walks and the values it makes, before it makes them.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::CallError;
use crate::budget::Budget;
use crate::operands::{MAX_NESTING, arity, walk_charged};
use crate::value::Value;

/// What one entry of a made map costs, besides its key and value.
const ENTRY_BYTES: usize = 48;

pub(crate) fn call(name: &str, args: &[Value], budget: &mut Budget) -> Result<Value, CallError> {
    arity(args, 1)?;
    let walked = walk_charged(&args[0], budget)?;
    // Every key is copied into the made maps at most once per folder it is in.
    let entries = args[0].len().unwrap_or(0);
    budget.take(
        walked
            .text_bytes
            .saturating_mul(2)
            .saturating_add(entries.saturating_mul(ENTRY_BYTES)),
    )?;
    match name {
        "byKey" => by_key(&args[0]),
        "explode" => {
            let mut pairs = Vec::new();
            for pair in args[0].iter_elements() {
                pairs.push(key_and_value(&pair, "explode")?);
            }
            explode(pairs)
        }
        "explodeMap" => match &args[0] {
            Value::Map(map) => explode(map.iter().map(|(k, v)| (k.clone(), v.clone())).collect()),
            other => Err(format!("explodeMap takes a map, not a {}", other.type_name()).into()),
        },
        other => Err(format!("{other} is not a key-tree function").into()),
    }
}

/// A pair's `.Key` (as text) and `.Value`.
fn key_and_value(pair: &Value, function: &str) -> Result<(String, Value), CallError> {
    let Value::Object(object) = pair else {
        return Err(format!(
            "{function} takes the pairs of tree or ls, not a list of {}",
            pair.type_name()
        )
        .into());
    };
    match (object.fields.get("Key"), object.fields.get("Value")) {
        (Some(key), Some(value)) => Ok((key.to_go_string(), value.clone())),
        _ => Err(format!("{function} takes the pairs of tree or ls (with .Key and .Value)").into()),
    }
}

/// The pairs grouped by their top-level folder, each keyed and named by the rest of its
/// key; pairs at the top level belong to no folder and are left out (as consul-template
/// leaves them).
fn by_key(pairs: &Value) -> Result<Value, CallError> {
    let mut groups: BTreeMap<String, BTreeMap<String, Value>> = BTreeMap::new();
    for pair in pairs.iter_elements() {
        let (key, _) = key_and_value(&pair, "byKey")?;
        let Some((folder, rest)) = key.split_once('/') else {
            continue;
        };
        let Value::Object(object) = &pair else {
            continue;
        };
        let mut fields = object.fields.clone();
        fields.insert("Key", Value::str(rest));
        groups
            .entry(folder.to_string())
            .or_default()
            .insert(rest.to_string(), Value::object(object.type_name, fields));
    }
    Ok(Value::Map(Arc::new(
        groups
            .into_iter()
            .map(|(folder, pairs)| (folder, Value::Map(Arc::new(pairs))))
            .collect(),
    )))
}

/// A nested map of folders from `(path, value)` pairs: `a/b/c = v` is `{a: {b: {c: v}}}`.
fn explode(pairs: Vec<(String, Value)>) -> Result<Value, CallError> {
    enum Node {
        Leaf(Value),
        Folder(BTreeMap<String, Node>),
    }
    fn into_value(node: Node) -> Value {
        match node {
            Node::Leaf(value) => value,
            Node::Folder(children) => Value::Map(Arc::new(
                children
                    .into_iter()
                    .map(|(k, v)| (k, into_value(v)))
                    .collect(),
            )),
        }
    }
    let clash = |path: &str| -> CallError {
        format!("key {path:?} is both a value and a folder of other keys").into()
    };
    let mut root: BTreeMap<String, Node> = BTreeMap::new();
    for (path, value) in pairs {
        let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
        // Made maps nest no deeper than any other made value.
        if parts.len() > MAX_NESTING {
            return Err(format!(
                "key {:?}… has {} parts: maps nest at most {MAX_NESTING} deep",
                parts.iter().take(3).copied().collect::<Vec<_>>().join("/"),
                parts.len()
            )
            .into());
        }
        let Some((last, folders)) = parts.split_last() else {
            continue;
        };
        let mut here = &mut root;
        for folder in folders {
            let node = here
                .entry(folder.to_string())
                .or_insert_with(|| Node::Folder(BTreeMap::new()));
            here = match node {
                Node::Folder(children) => children,
                Node::Leaf(_) => return Err(clash(&path)),
            };
        }
        if matches!(here.get(*last), Some(Node::Folder(_))) {
            return Err(clash(&path));
        }
        here.insert(last.to_string(), Node::Leaf(value));
    }
    Ok(into_value(Node::Folder(root)))
}
