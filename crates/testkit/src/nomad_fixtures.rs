//! Nomad's documented JSON shapes (`tests/fixtures/nomad/`, one file per endpoint, each
//! naming the page of Nomad's API docs it was written from) and the comparison that
//! holds berth to them: the contract test holds berth's live answers, and
//! `berth-nomad-api`'s tests its types.
//!
//! Rules of the comparison ([`differences`]): a `null` in a fixture is Nomad's
//! "nothing here in this sample" and matches anything, a missing field too; numbers
//! match numbers (integer or not); the first element of a fixture's array is checked
//! against every element of the other's; objects keyed by names (a job's groups in a
//! summary, an alloc's tasks) check the fixture's first entry against each entry
//! ([`NAMED_MAPS`]), and free-form maps (meta, env, attributes) only that they are
//! objects ([`FREE_MAPS`]).

use std::path::PathBuf;

use serde_json::Value;

/// Fields of Nomad's documented answers that berth neither sends nor reads (its Nomad
/// types do not name them, so no handler can fill them), with why: the contract test of
/// the live answers and the types' own test both leave out exactly these.
pub const NOT_IN_BERTH: &[(&str, &[&str], &str)] = &[
    (
        "allocation_read",
        &["TaskStates.*.Events[].Signal"],
        "berth keeps the signal that ended a task in its Terminated event's message",
    ),
    (
        "node_read",
        &["Drivers.*.UpdateTime", "NodeResources", "StatusUpdatedAt"],
        "the node's record keeps no fingerprint times, and its resources as berth's own \
         NodeResources fields (the sample's are another version's)",
    ),
    (
        "csi_volume_read",
        &["Version", "ResourceExhausted", "Topologies[].foo"],
        "the page's sample is older than Nomad's api.CSIVolume: berth names \
         ProviderVersion as the code does, ResourceExhausted is a time in the code (a \
         number in the sample, null from a one-node agent), and a topology is \
         `{\"Segments\": {...}}` in the code (bare segments in the sample)",
    ),
];

/// Objects whose keys are names: each of berth's entries has the fixture's first shape.
pub const NAMED_MAPS: &[&str] = &[
    "Summary",
    "TaskStates",
    "Tasks",
    "Drivers",
    "DesiredTGUpdates",
];

/// Objects whose keys and values are the user's or the node's: only their type counts.
pub const FREE_MAPS: &[&str] = &[
    "Attributes",
    "Meta",
    "Env",
    "Config",
    "Labels",
    "Parameters",
    "Context",
    "ReadAllocs",
    "WriteAllocs",
];

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/nomad")
}

/// Every fixture's name (its file's stem).
pub fn fixture_names() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir())
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir().display()))
        .filter_map(|entry| entry.ok()?.path().file_stem()?.to_str().map(String::from))
        .collect();
    names.sort();
    names
}

/// Fixture `name`, which must name the page of Nomad's API docs it was written from.
pub fn fixture(name: &str) -> Value {
    let path = dir().join(format!("{name}.json"));
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    let fixture: Value = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()));
    assert!(
        fixture["Doc"]
            .as_str()
            .is_some_and(|doc| doc.contains("api-docs/")),
        "{} names no page of Nomad's API docs in its Doc field",
        path.display()
    );
    fixture
}

pub fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// Every difference between the fixture's shape and berth's answer, as `path: why`.
pub fn differences(
    path: &str,
    expected: &Value,
    actual: &Value,
    absent: &[&str],
    out: &mut Vec<String>,
) {
    if expected.is_null() {
        return;
    }
    if kind(expected) != kind(actual) {
        out.push(format!(
            "{path}: Nomad has {}, berth {} ({actual})",
            kind(expected),
            kind(actual)
        ));
        return;
    }
    let last = path.rsplit('.').next().unwrap_or(path);
    match (expected, actual) {
        (Value::Object(_), Value::Object(_)) if FREE_MAPS.contains(&last) => {}
        (Value::Object(expected), Value::Object(actual)) if NAMED_MAPS.contains(&last) => {
            if let Some((_, shape)) = expected.iter().next() {
                for (name, value) in actual {
                    differences(&format!("{path}.{name}"), shape, value, absent, out);
                }
            }
        }
        (Value::Object(expected), Value::Object(actual)) => {
            for (key, shape) in expected {
                let at = if path.is_empty() {
                    key.clone()
                } else {
                    format!("{path}.{key}")
                };
                if absent.contains(&at.as_str()) {
                    continue;
                }
                match actual.get(key) {
                    Some(value) => differences(&at, shape, value, absent, out),
                    // Go decodes a missing field and a null alike.
                    None if shape.is_null() => {}
                    None => out.push(format!("{at}: missing")),
                }
            }
        }
        (Value::Array(expected), Value::Array(actual)) => {
            if let Some(shape) = expected.first() {
                for value in actual {
                    differences(&format!("{path}[]"), shape, value, absent, out);
                }
            }
        }
        _ => {}
    }
}

/// `path` (of a difference) with the names it holds (jobs, groups, tasks, drivers) as
/// `*`: an element of a named map is `Tasks.<name>`, so the lists of what berth leaves
/// out name `Tasks.*`.
pub fn generic(path: &str, names: &[String]) -> String {
    let mut path = path.to_string();
    for name in names {
        path = path
            .replace(&format!(".{name}."), ".*.")
            .replace(&format!(".{name}"), ".*");
    }
    path
}

/// The keys of every named map ([`NAMED_MAPS`]) in `value`, at any depth: the names
/// [`generic`] stands for.
pub fn named_keys(value: &Value) -> Vec<String> {
    let mut names = Vec::new();
    let mut stack = vec![value];
    while let Some(value) = stack.pop() {
        match value {
            Value::Object(fields) => {
                for (key, inner) in fields {
                    if NAMED_MAPS.contains(&key.as_str())
                        && let Value::Object(named) = inner
                    {
                        names.extend(named.keys().cloned());
                    }
                    stack.push(inner);
                }
            }
            Value::Array(items) => stack.extend(items),
            _ => {}
        }
    }
    names
}
