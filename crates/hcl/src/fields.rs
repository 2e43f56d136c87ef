//! A cursor over one HCL block's body that knows the block's path, hands out attributes
//! and sub-blocks by name, and at the end names whatever was left unread: unknown
//! fields are errors, listed with the fields that are allowed. Shared by the jobspec
//! and the agent config.
//!
//! A value that could not be evaluated ([`Value::Failed`]) has had its problem reported:
//! the readers give nothing for it and say nothing more, and it still counts as written
//! (it is not "required", nor unknown when it is allowed).

use std::collections::HashSet;
use std::time::Duration;

use super::location::Location;
use super::tree::{BlockNode, BodyNode, Located, Value};
use crate::Problem;
use berth_model::units::{self, UnitError};

/// Reads one block's body.
pub struct Fields<'a> {
    body: &'a BodyNode,
    pub path: String,
    at: Location,
    read: HashSet<&'a str>,
    allowed: &'static [&'static str],
}

impl<'a> Fields<'a> {
    pub fn new(
        body: &'a BodyNode,
        path: String,
        at: Location,
        allowed: &'static [&'static str],
    ) -> Self {
        Fields {
            body,
            path,
            at,
            read: HashSet::new(),
            allowed,
        }
    }

    pub fn problem(&self, problems: &mut Vec<Problem>, field: &str, at: Location, message: String) {
        let path = if field.is_empty() {
            self.path.clone()
        } else {
            format!("{}.{field}", self.path)
        };
        problems.push(Problem {
            path,
            at: Some(at),
            message,
        });
    }

    /// A problem with attribute `name`, placed at the attribute (or at the block, when
    /// the attribute is absent).
    pub fn problem_with(
        &mut self,
        problems: &mut Vec<Problem>,
        name: &'static str,
        message: String,
    ) {
        let at = self.attr(name).map_or(self.at, |a| a.at);
        self.problem(problems, name, at, message);
    }

    /// Attribute `name` as written, a [`Value::Failed`] included.
    pub fn attr(&mut self, name: &'static str) -> Option<&'a Located<Value>> {
        self.read.insert(name);
        self.body
            .attrs
            .iter()
            .find(|a| a.name == name)
            .map(|a| &a.value)
    }

    /// Attribute `name` when it has a value: absent and failed alike give `None`.
    fn value(&mut self, name: &'static str) -> Option<&'a Located<Value>> {
        self.attr(name).filter(|v| !v.value.is_failed())
    }

    /// Whether attribute `name` is written and could not be evaluated (its problem is
    /// reported): a check that it is missing or empty would only repeat that problem.
    pub fn failed(&self, name: &str) -> bool {
        self.body
            .attrs
            .iter()
            .any(|a| a.name == name && a.value.value.is_failed())
    }

    pub fn string(&mut self, name: &'static str, problems: &mut Vec<Problem>) -> Option<String> {
        let value = self.value(name)?;
        match &value.value {
            Value::String(s) => Some(s.clone()),
            other => {
                self.problem(
                    problems,
                    name,
                    value.at,
                    format!("expected a string, found {}", other.kind()),
                );
                None
            }
        }
    }

    pub fn required_string(
        &mut self,
        name: &'static str,
        problems: &mut Vec<Problem>,
    ) -> Option<String> {
        let value = self.string(name, problems);
        if value.is_none() && !self.body.attrs.iter().any(|a| a.name == name) {
            self.problem(problems, name, self.at, "is required".into());
        }
        value
    }

    pub fn bool(&mut self, name: &'static str, problems: &mut Vec<Problem>) -> Option<bool> {
        let value = self.value(name)?;
        match &value.value {
            Value::Bool(b) => Some(*b),
            other => {
                self.problem(
                    problems,
                    name,
                    value.at,
                    format!("expected true or false, found {}", other.kind()),
                );
                None
            }
        }
    }

    pub fn number(
        &mut self,
        name: &'static str,
        max: u64,
        problems: &mut Vec<Problem>,
    ) -> Option<u64> {
        let value = self.value(name)?;
        match &value.value {
            Value::Number(n) if n.as_u64().is_some_and(|n| n <= max) => n.as_u64(),
            Value::Number(n) => {
                self.problem(
                    problems,
                    name,
                    value.at,
                    format!("{n} is out of range (0 to {max})"),
                );
                None
            }
            other => {
                self.problem(
                    problems,
                    name,
                    value.at,
                    format!("expected a number, found {}", other.kind()),
                );
                None
            }
        }
    }

    /// A duration written as a string (`"30s"`, `"1h30m"`); see [`units::parse_duration`].
    pub fn duration(
        &mut self,
        name: &'static str,
        problems: &mut Vec<Problem>,
    ) -> Option<Duration> {
        self.unit(
            name,
            "duration",
            "a duration such as \"30s\", \"5m\" or \"1h30m\"",
            units::parse_duration,
            problems,
        )
    }

    /// A size in bytes written as a string (`"32MiB"`, `"1GB"`); see [`units::parse_size`].
    pub fn size(&mut self, name: &'static str, problems: &mut Vec<Problem>) -> Option<u64> {
        self.unit(
            name,
            "size",
            "a size such as \"32MiB\" or \"1GB\"",
            units::parse_size,
            problems,
        )
    }

    fn unit<T>(
        &mut self,
        name: &'static str,
        what: &str,
        example: &str,
        parse: fn(&str) -> Result<T, UnitError>,
        problems: &mut Vec<Problem>,
    ) -> Option<T> {
        let value = self.value(name)?;
        let at = value.at;
        let message = match &value.value {
            Value::String(text) => match parse(text) {
                Ok(parsed) => return Some(parsed),
                Err(e) => format!("{text:?} is not a {what}: {e}"),
            },
            other => format!("expected {example}, found {}", other.kind()),
        };
        self.problem(problems, name, at, message);
        None
    }

    pub fn string_list(&mut self, name: &'static str, problems: &mut Vec<Problem>) -> Vec<String> {
        let Some(value) = self.value(name) else {
            return Vec::new();
        };
        match &value.value {
            Value::Array(items) => items
                .iter()
                .filter_map(|item| match &item.value {
                    Value::String(s) => Some(s.clone()),
                    Value::Failed => None,
                    other => {
                        self.problem(
                            problems,
                            name,
                            item.at,
                            format!("expected strings, found {}", other.kind()),
                        );
                        None
                    }
                })
                .collect(),
            other => {
                self.problem(
                    problems,
                    name,
                    value.at,
                    format!("expected a list of strings, found {}", other.kind()),
                );
                Vec::new()
            }
        }
    }

    /// A string map, written as an attribute (`env = { A = "1" }`) or a block (`env { A = "1" }`).
    pub fn string_map(
        &mut self,
        name: &'static str,
        problems: &mut Vec<Problem>,
    ) -> Vec<(String, String)> {
        let mut pairs = Vec::new();
        let mut push = |key: &str,
                        value: &Located<Value>,
                        problems: &mut Vec<Problem>,
                        this: &Self| match &value.value {
            Value::String(s) => pairs.push((key.to_string(), s.clone())),
            Value::Number(n) => pairs.push((key.to_string(), n.to_string())),
            Value::Bool(b) => pairs.push((key.to_string(), b.to_string())),
            Value::Failed => {}
            other => this.problem(
                problems,
                &format!("{name}.{key}"),
                value.at,
                format!("expected a string, found {}", other.kind()),
            ),
        };
        if let Some(value) = self.value(name) {
            match &value.value {
                Value::Object(fields) => {
                    for (key, v) in fields {
                        push(key, v, problems, self);
                    }
                }
                other => self.problem(
                    problems,
                    name,
                    value.at,
                    format!("expected a map, found {}", other.kind()),
                ),
            }
        }
        for block in self.blocks(name) {
            for attr in &block.body.attrs {
                push(&attr.name, &attr.value, problems, self);
            }
        }
        pairs
    }

    /// Maps a string already read from `name` onto one of `choices`. Anything else is
    /// reported at the attribute with the message `unknown` words for the value.
    pub fn choose<T: Copy>(
        &mut self,
        value: Option<String>,
        name: &'static str,
        choices: &[(&str, T)],
        problems: &mut Vec<Problem>,
        unknown: impl Fn(&str) -> String,
    ) -> Option<T> {
        let value = value?;
        if let Some((_, choice)) = choices.iter().find(|(text, _)| *text == value) {
            return Some(*choice);
        }
        let at = self.attr(name).map(|v| v.at).unwrap_or(self.at);
        self.problem(problems, name, at, unknown(&value));
        None
    }

    pub fn blocks(&mut self, kind: &'static str) -> Vec<&'a BlockNode> {
        self.read.insert(kind);
        self.body.blocks.iter().filter(|b| b.kind == kind).collect()
    }

    /// At most one unlabeled block of this kind.
    pub fn single_block(
        &mut self,
        kind: &'static str,
        problems: &mut Vec<Problem>,
    ) -> Option<&'a BlockNode> {
        let blocks = self.blocks(kind);
        if let Some(extra) = blocks.get(1) {
            self.problem(
                problems,
                kind,
                extra.at,
                format!(
                    "only one {kind} block is allowed (the first is at line {})",
                    blocks[0].at.line
                ),
            );
        }
        for block in &blocks {
            if !block.labels.is_empty() {
                self.problem(
                    problems,
                    kind,
                    block.at,
                    format!("a {kind} block takes no label"),
                );
            }
        }
        blocks.first().copied()
    }

    /// Labeled blocks (`group "web"`), refusing duplicate labels, which HCL decoders
    /// would otherwise merge silently.
    pub fn labeled_blocks(
        &mut self,
        kind: &'static str,
        problems: &mut Vec<Problem>,
    ) -> Vec<(String, &'a BlockNode)> {
        let mut seen: Vec<(String, Location)> = Vec::new();
        let mut out = Vec::new();
        for block in self.blocks(kind) {
            let [label] = block.labels.as_slice() else {
                self.problem(problems, kind, block.at, format!("a {kind} block takes exactly one label, its name: {kind} \"name\" {{ ... }}"));
                continue;
            };
            if let Some((_, first)) = seen.iter().find(|(l, _)| l == label) {
                self.problem(
                    problems,
                    &format!("{kind}.{label}"),
                    block.at,
                    format!(
                        "duplicate {kind} {label:?} (the first is at line {})",
                        first.line
                    ),
                );
                continue;
            }
            seen.push((label.clone(), block.at));
            out.push((label.clone(), block));
        }
        out
    }

    /// Reports attributes and blocks nobody asked for.
    pub fn finish(self, problems: &mut Vec<Problem>) {
        let allowed = || self.allowed.join(", ");
        for attr in &self.body.attrs {
            if !self.read.contains(attr.name.as_str()) {
                self.problem(
                    problems,
                    &attr.name,
                    attr.at,
                    format!(
                        "unknown field {:?} (allowed here: {})",
                        attr.name,
                        allowed()
                    ),
                );
            }
        }
        for block in &self.body.blocks {
            if !self.read.contains(block.kind.as_str()) {
                self.problem(
                    problems,
                    &block.kind,
                    block.at,
                    format!(
                        "unknown block {:?} (allowed here: {})",
                        block.kind,
                        allowed()
                    ),
                );
            }
        }
    }
}

/// The `config` block (or any free-form block) as a JSON object.
pub fn block_json(body: &BodyNode) -> serde_json::Value {
    let mut object = serde_json::Map::new();
    for attr in &body.attrs {
        object.insert(attr.name.clone(), attr.value.value.to_json());
    }
    for block in &body.blocks {
        let mut value = block_json(&block.body);
        for label in block.labels.iter().rev() {
            value = serde_json::json!({ label.clone(): value });
        }
        match object.get_mut(&block.kind) {
            Some(serde_json::Value::Array(items)) => items.push(value),
            Some(existing) => *existing = serde_json::Value::Array(vec![existing.take(), value]),
            None => {
                object.insert(block.kind.clone(), value);
            }
        }
    }
    serde_json::Value::Object(object)
}
