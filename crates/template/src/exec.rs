//! Running a parsed template: Go's `text/template` semantics over [`Value`]s, within a
//! budget of steps, time, nesting and output, so that a template written to loop
//! forever or to render gigabytes ends with an error that says which.

use std::sync::Arc;
use std::time::Duration;

use crate::CallError;
use crate::budget::Budget;
use crate::functions::Support;
use crate::parse::{Command, Node, Operand, Parsed, Pipe};
use crate::value::Value;

/// What a template may use while it renders.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Bytes of output, and of any one string a function makes.
    pub max_output: usize,
    /// Actions, loop turns, function calls, and the elements functions walk or make.
    pub max_steps: u64,
    pub max_time: Duration,
    /// Bytes of values the functions make in one render (strings, list elements).
    pub max_memory: usize,
    /// Nesting while rendering: `if`/`range`/`with` bodies, parentheses and `template`
    /// calls together. Each level is a frame of the renderer's stack: run it on a
    /// thread with room for them (8 MiB is room for the default).
    pub max_depth: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_output: 8 << 20,
            max_steps: 10_000_000,
            max_time: Duration::from_secs(5),
            max_memory: 128 << 20,
            max_depth: 200,
        }
    }
}

/// How a render treats a missing map key: Go's `missingkey=default` (`<no value>`) or,
/// with `error_on_missing_key`, `missingkey=error`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MissingKey {
    #[default]
    NoValue,
    Error,
}

/// Why a render failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RenderError {
    #[error("line {line}: {message}")]
    At { line: usize, message: String },
    #[error("the template renders more than {limit} bytes")]
    TooLarge { limit: usize },
    #[error("the template runs more than {limit} steps (a loop without end?)")]
    TooManySteps { limit: u64 },
    #[error("the template renders for more than {limit:?}")]
    TooLong { limit: Duration },
    #[error(
        "line {line}: the template nests blocks, parentheses and template calls more than \
         {limit} deep"
    )]
    TooDeep { line: usize, limit: usize },
    #[error("the template makes more than {limit} bytes of values")]
    TooMuchMemory { limit: usize },
}

/// The functions whose answers come from outside the template: the task's environment,
/// its files, services, Consul's keys. The renderer asks for each call.
pub trait Data {
    /// Answers `function` (a [`Support::Data`] function of [`functions::FUNCTIONS`])
    /// called with `args`; the error is shown with the template's line.
    fn call(&mut self, function: &str, args: &[Value]) -> Result<Value, CallError>;
}

enum Flow {
    Normal,
    Break,
    Continue,
}

pub(crate) struct Exec<'a> {
    parsed: &'a Parsed,
    data: &'a mut dyn Data,
    budget: Budget,
    missing: MissingKey,
    pub(crate) out: String,
    vars: Vec<(Arc<str>, Value)>,
    depth: usize,
}

impl<'a> Exec<'a> {
    pub(crate) fn new(
        parsed: &'a Parsed,
        data: &'a mut dyn Data,
        limits: &'a Limits,
        missing: MissingKey,
    ) -> Exec<'a> {
        Exec {
            parsed,
            data,
            budget: Budget::new(limits),
            missing,
            out: String::new(),
            vars: vec![("$".into(), Value::Nil)],
            depth: 0,
        }
    }

    pub(crate) fn run(&mut self) -> Result<(), RenderError> {
        let main = &self.parsed.main;
        self.walk(&Value::Nil, main).map(|_| ())
    }

    fn step(&mut self) -> Result<(), RenderError> {
        self.budget.step()
    }

    /// One level deeper (a body, parentheses, a template call), within the limit.
    fn enter(&mut self, line: usize) -> Result<(), RenderError> {
        if self.depth >= self.budget.limits.max_depth {
            return Err(RenderError::TooDeep {
                line,
                limit: self.budget.limits.max_depth,
            });
        }
        self.depth += 1;
        Ok(())
    }

    fn emit(&mut self, text: &str) -> Result<(), RenderError> {
        if self.out.len() + text.len() > self.budget.limits.max_output {
            return Err(RenderError::TooLarge {
                limit: self.budget.limits.max_output,
            });
        }
        self.out.push_str(text);
        Ok(())
    }

    fn walk(&mut self, dot: &Value, nodes: &[Node]) -> Result<Flow, RenderError> {
        for node in nodes {
            self.step()?;
            match node {
                Node::Text(text) => self.emit(text)?,
                Node::Action { pipe } => {
                    let value = self.pipe(dot, pipe)?;
                    if pipe.declare.is_empty() {
                        self.print(&value)?;
                    }
                }
                Node::Branches {
                    with,
                    branches,
                    otherwise,
                } => {
                    let line = branches.first().map_or(0, |(pipe, _)| pipe.line);
                    self.enter(line)?;
                    let mark = self.vars.len();
                    let mut chosen = None;
                    for (pipe, body) in branches {
                        let value = self.pipe(dot, pipe)?;
                        if value.truth() {
                            chosen = Some((value, body));
                            break;
                        }
                    }
                    let flow = match chosen {
                        Some((value, body)) => {
                            let inner = if *with { value } else { dot.clone() };
                            self.walk(&inner, body)?
                        }
                        None => self.walk(dot, otherwise)?,
                    };
                    self.vars.truncate(mark);
                    self.depth -= 1;
                    if !matches!(flow, Flow::Normal) {
                        return Ok(flow);
                    }
                }
                Node::Range {
                    line,
                    pipe,
                    body,
                    otherwise,
                } => {
                    self.enter(*line)?;
                    let mark = self.vars.len();
                    let flow = self.range(dot, pipe, body, otherwise, *line)?;
                    self.vars.truncate(mark);
                    self.depth -= 1;
                    if let Some(flow) = flow {
                        return Ok(flow);
                    }
                }
                Node::Template { line, name, pipe } => {
                    let Some(body) = self.parsed.defined.get(name).cloned() else {
                        return Err(at(*line, format!("no such template {name:?}")));
                    };
                    let inner = match pipe {
                        Some(pipe) => self.pipe(dot, pipe)?,
                        None => Value::Nil,
                    };
                    self.call_template(&body, inner, *line)?;
                }
                Node::Break => return Ok(Flow::Break),
                Node::Continue => return Ok(Flow::Continue),
            }
        }
        Ok(Flow::Normal)
    }

    fn call_template(
        &mut self,
        body: &Arc<Vec<Node>>,
        dot: Value,
        line: usize,
    ) -> Result<(), RenderError> {
        self.enter(line)?;
        let saved = std::mem::replace(&mut self.vars, vec![("$".into(), dot.clone())]);
        let result = self.walk(&dot, body);
        self.vars = saved;
        self.depth -= 1;
        result.map(|_| ())
    }

    /// A `range`; `Some(flow)` only for a flow that must leave (none: break and continue
    /// end here).
    fn range(
        &mut self,
        dot: &Value,
        pipe: &Pipe,
        body: &[Node],
        otherwise: &[Node],
        line: usize,
    ) -> Result<Option<Flow>, RenderError> {
        let mut pipe_only = pipe.clone();
        pipe_only.declare.clear();
        let value = self.pipe(dot, &pipe_only)?;
        let names = &pipe.declare;
        let turn = |exec: &mut Exec, key: Value, element: Value| -> Result<bool, RenderError> {
            exec.step()?;
            let mark = exec.vars.len();
            match names.as_slice() {
                [one] => exec.vars.push((one.clone(), element.clone())),
                [k, e] => {
                    exec.vars.push((k.clone(), key));
                    exec.vars.push((e.clone(), element.clone()));
                }
                _ => {}
            }
            let flow = exec.walk(&element, body)?;
            exec.vars.truncate(mark);
            Ok(matches!(flow, Flow::Break))
        };
        let mut any = false;
        match &value {
            Value::List(items) => {
                for (i, item) in items.iter().enumerate() {
                    any = true;
                    if turn(self, Value::Int(i as i64), item.clone())? {
                        break;
                    }
                }
            }
            Value::Ints { start, end } => {
                for (i, n) in (*start..*end).enumerate() {
                    any = true;
                    if turn(self, Value::Int(i as i64), Value::Int(n))? {
                        break;
                    }
                }
            }
            Value::Map(map) => {
                for (k, v) in map.iter() {
                    any = true;
                    if turn(self, Value::str(k.as_str()), v.clone())? {
                        break;
                    }
                }
            }
            Value::Int(n) => {
                if names.len() == 2 {
                    return Err(at(line, "a range over an integer takes one variable"));
                }
                for i in 0..*n {
                    any = true;
                    if turn(self, Value::Int(i), Value::Int(i))? {
                        break;
                    }
                }
            }
            Value::Nil => {}
            other => {
                return Err(at(
                    line,
                    format!("range can't iterate over {}", other.to_go_string()),
                ));
            }
        }
        if !any {
            let flow = self.walk(dot, otherwise)?;
            if !matches!(flow, Flow::Normal) {
                return Ok(Some(flow));
            }
        }
        Ok(None)
    }

    fn print(&mut self, value: &Value) -> Result<(), RenderError> {
        match value {
            // A missing map entry prints as Go prints the zero reflect.Value.
            Value::Nil => self.emit("<no value>"),
            Value::Str(s) => {
                let s = s.clone();
                self.emit(&s)
            }
            Value::Int(i) => {
                let mut digits = itoa::Buffer::new();
                let text = digits.format(*i);
                self.emit(text)
            }
            other => {
                let text = other.to_go_string();
                self.emit(&text)
            }
        }
    }

    fn pipe(&mut self, dot: &Value, pipe: &Pipe) -> Result<Value, RenderError> {
        let line = pipe.line;
        let mut value: Option<Value> = None;
        for command in &pipe.commands {
            value = Some(self.command(dot, command, value, line)?);
        }
        let value = value.unwrap_or(Value::Nil);
        if let Some(name) = pipe.declare.first() {
            if pipe.assign {
                if let Some(slot) = self.vars.iter_mut().rev().find(|(n, _)| **n == **name) {
                    slot.1 = value.clone();
                }
            } else {
                self.vars.push((name.clone(), value.clone()));
            }
        }
        Ok(value)
    }

    fn command(
        &mut self,
        dot: &Value,
        command: &Command,
        piped: Option<Value>,
        line: usize,
    ) -> Result<Value, RenderError> {
        self.step()?;
        let (first, rest) = command
            .args
            .split_first()
            .ok_or_else(|| at(line, "an empty command"))?;
        let Operand::Function(name, support) = first else {
            if !rest.is_empty() || piped.is_some() {
                return Err(at(
                    line,
                    format!("can't give argument to non-function {}", describe(first)),
                ));
            }
            return self.operand(dot, first, line);
        };
        // `and` and `or` stop at the first argument that decides them.
        if matches!(*name, "and" | "or") {
            let mut last = Value::Nil;
            let count = rest.len() + usize::from(piped.is_some());
            if count == 0 {
                return Err(at(line, format!("{name} takes at least one argument")));
            }
            for arg in rest {
                last = self.operand(dot, arg, line)?;
                if last.truth() == (*name == "or") {
                    return Ok(last);
                }
            }
            if let Some(p) = piped {
                last = p;
            }
            return Ok(last);
        }
        let mut args = Vec::with_capacity(rest.len() + 1);
        for arg in rest {
            args.push(self.operand(dot, arg, line)?);
        }
        if let Some(p) = piped {
            args.push(p);
        }
        self.call(name, *support, args, line)
    }

    fn call(
        &mut self,
        name: &'static str,
        support: Support,
        args: Vec<Value>,
        line: usize,
    ) -> Result<Value, RenderError> {
        let value = match support {
            _ if name == "executeTemplate" => {
                let (template, inner) = match args.as_slice() {
                    [Value::Str(t)] => (t.clone(), Value::Nil),
                    [Value::Str(t), v] => (t.clone(), v.clone()),
                    _ => {
                        return Err(at(
                            line,
                            "executeTemplate takes a template's name and, optionally, its data",
                        ));
                    }
                };
                let Some(body) = self.parsed.defined.get(&*template).cloned() else {
                    return Err(at(
                        line,
                        format!("executeTemplate: no such template {template:?}"),
                    ));
                };
                let start = self.out.len();
                self.call_template(&body, inner, line)?;
                let rendered = self.out.split_off(start);
                Value::str(rendered)
            }
            _ if name == "envOrDefault" => match args.as_slice() {
                [n @ Value::Str(_), default] => {
                    let found = self
                        .data
                        .call("env", std::slice::from_ref(n))
                        .map_err(|m| at(line, format!("env: {m}")))?;
                    if found.truth() {
                        found
                    } else {
                        default.clone()
                    }
                }
                _ => return Err(at(line, "envOrDefault takes a name and a default")),
            },
            Support::Data => self
                .data
                .call(name, &args)
                .map_err(|m| at(line, format!("{name}: {m}")))?,
            _ => match crate::compute::call(name, &args, &mut self.budget) {
                Ok(value) => value,
                // The budget ran out inside it: the render's error says which.
                Err(_) if self.budget.exceeded.is_some() => {
                    return Err(self
                        .budget
                        .exceeded
                        .take()
                        .unwrap_or(RenderError::TooLarge {
                            limit: self.budget.limits.max_output,
                        }));
                }
                Err(message) => return Err(at(line, format!("{name}: {message}"))),
            },
        };
        if let Value::Str(s) = &value
            && s.len() > self.budget.limits.max_output
        {
            return Err(RenderError::TooLarge {
                limit: self.budget.limits.max_output,
            });
        }
        self.budget.made(value.made_size())?;
        Ok(value)
    }

    fn operand(
        &mut self,
        dot: &Value,
        operand: &Operand,
        line: usize,
    ) -> Result<Value, RenderError> {
        Ok(match operand {
            Operand::Nil => return Err(at(line, "nil is not a command")),
            Operand::Bool(b) => Value::Bool(*b),
            Operand::Int(i) => Value::Int(*i),
            Operand::Float(f) => Value::Float(*f),
            Operand::Str(s) => Value::Str(s.clone()),
            Operand::Dot => dot.clone(),
            Operand::Field(path) => field_of(dot, path, self.missing, line)?.clone(),
            Operand::Variable(name, path) => {
                let value = self
                    .vars
                    .iter()
                    .rev()
                    .find(|(n, _)| **n == **name)
                    .map(|(_, v)| v)
                    .ok_or_else(|| at(line, format!("undefined variable {name:?}")))?;
                field_of(value, path, self.missing, line)?.clone()
            }
            Operand::Function(name, support) => self.call(name, *support, Vec::new(), line)?,
            Operand::Nested(pipe, path) => {
                self.enter(pipe.line)?;
                let value = self.pipe(dot, pipe);
                self.depth -= 1;
                let value = value?;
                self.fields(value, path, line)?
            }
        })
    }

    fn fields(&self, value: Value, path: &[String], line: usize) -> Result<Value, RenderError> {
        if path.is_empty() {
            return Ok(value);
        }
        field_of(&value, path, self.missing, line).cloned()
    }
}

/// The value at `path` in `value`, by reference (a clone only of what is kept).
fn field_of<'v>(
    mut value: &'v Value,
    path: &[String],
    missing: MissingKey,
    line: usize,
) -> Result<&'v Value, RenderError> {
    static NIL: Value = Value::Nil;
    for field in path {
        value = match value {
            Value::Map(map) => match map.get(field) {
                Some(v) => v,
                None if missing == MissingKey::Error => {
                    return Err(at(line, format!("map has no entry for key {field:?}")));
                }
                None => &NIL,
            },
            Value::Object(object) => object.fields.get(field.as_str()).ok_or_else(|| {
                at(
                    line,
                    format!("can't evaluate field {field} in type {}", object.type_name),
                )
            })?,
            Value::Nil => {
                return Err(at(line, format!("nil data; no entry for key {field:?}")));
            }
            other => {
                return Err(at(
                    line,
                    format!("can't evaluate field {field} in type {}", other.type_name()),
                ));
            }
        };
    }
    Ok(value)
}

fn describe(operand: &Operand) -> String {
    match operand {
        Operand::Field(path) => format!(".{}", path.join(".")),
        Operand::Variable(name, path) if path.is_empty() => name.to_string(),
        Operand::Variable(name, path) => format!("{name}.{}", path.join(".")),
        Operand::Dot => ".".into(),
        Operand::Str(s) => format!("{s:?}"),
        other => format!("{other:?}"),
    }
}

fn at(line: usize, message: impl Into<String>) -> RenderError {
    RenderError::At {
        line,
        message: message.into(),
    }
}
