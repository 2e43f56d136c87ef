//! Running a parsed template: Go's `text/template` semantics over [`Value`]s, within a
//! budget of steps, time, nesting and output, so that a template written to loop
//! forever or to render gigabytes ends with an error that says which.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::CallError;
use crate::functions::{self, Support};
use crate::parse::{Command, Node, Operand, Parsed, Pipe};
use crate::value::Value;

/// What a template may use while it renders.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Bytes of output, and of any one string a function makes.
    pub max_output: usize,
    /// Actions, loop turns and function calls.
    pub max_steps: u64,
    pub max_time: Duration,
    /// Nested `template` calls.
    pub max_depth: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_output: 8 << 20,
            max_steps: 10_000_000,
            max_time: Duration::from_secs(5),
            max_depth: 100,
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
    #[error("line {line}: templates call each other more than {limit} deep")]
    TooDeep { line: usize, limit: usize },
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
    limits: &'a Limits,
    missing: MissingKey,
    pub(crate) out: String,
    steps: u64,
    started: Instant,
    vars: Vec<(String, Value)>,
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
            limits,
            missing,
            out: String::new(),
            steps: 0,
            started: Instant::now(),
            vars: vec![("$".into(), Value::Nil)],
            depth: 0,
        }
    }

    pub(crate) fn run(&mut self) -> Result<(), RenderError> {
        let main = &self.parsed.main;
        self.walk(&Value::Nil, main).map(|_| ())
    }

    fn step(&mut self) -> Result<(), RenderError> {
        self.steps += 1;
        if self.steps > self.limits.max_steps {
            return Err(RenderError::TooManySteps {
                limit: self.limits.max_steps,
            });
        }
        if self.steps.is_multiple_of(1024) && self.started.elapsed() > self.limits.max_time {
            return Err(RenderError::TooLong {
                limit: self.limits.max_time,
            });
        }
        Ok(())
    }

    fn emit(&mut self, text: &str) -> Result<(), RenderError> {
        if self.out.len() + text.len() > self.limits.max_output {
            return Err(RenderError::TooLarge {
                limit: self.limits.max_output,
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
                    let mark = self.vars.len();
                    let flow = self.range(dot, pipe, body, otherwise, *line)?;
                    self.vars.truncate(mark);
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
        if self.depth >= self.limits.max_depth {
            return Err(RenderError::TooDeep {
                line,
                limit: self.limits.max_depth,
            });
        }
        self.depth += 1;
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
                if let Some(slot) = self.vars.iter_mut().rev().find(|(n, _)| n == name) {
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
        let Operand::Function(name) = first else {
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
        self.call(name, args, line)
    }

    fn call(
        &mut self,
        name: &'static str,
        args: Vec<Value>,
        line: usize,
    ) -> Result<Value, RenderError> {
        let value = match functions::support(name).map(|(_, s)| s) {
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
            Some(Support::Data) => self
                .data
                .call(name, &args)
                .map_err(|m| at(line, format!("{name}: {m}")))?,
            _ => crate::compute::call(name, &args, self.limits)
                .map_err(|m| at(line, format!("{name}: {m}")))?,
        };
        if let Value::Str(s) = &value
            && s.len() > self.limits.max_output
        {
            return Err(RenderError::TooLarge {
                limit: self.limits.max_output,
            });
        }
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
            Operand::Field(path) => self.fields(dot.clone(), path, line)?,
            Operand::Variable(name, path) => {
                let value = self
                    .vars
                    .iter()
                    .rev()
                    .find(|(n, _)| n == name)
                    .map(|(_, v)| v.clone())
                    .ok_or_else(|| at(line, format!("undefined variable {name:?}")))?;
                self.fields(value, path, line)?
            }
            Operand::Function(name) => self.call(name, Vec::new(), line)?,
            Operand::Nested(pipe, path) => {
                let value = self.pipe(dot, pipe)?;
                self.fields(value, path, line)?
            }
        })
    }

    fn fields(&self, mut value: Value, path: &[String], line: usize) -> Result<Value, RenderError> {
        for field in path {
            value = match &value {
                Value::Map(map) => match map.get(field) {
                    Some(v) => v.clone(),
                    None if self.missing == MissingKey::Error => {
                        return Err(at(line, format!("map has no entry for key {field:?}")));
                    }
                    None => Value::Nil,
                },
                Value::Object(object) => {
                    object.fields.get(field.as_str()).cloned().ok_or_else(|| {
                        at(
                            line,
                            format!("can't evaluate field {field} in type {}", object.type_name),
                        )
                    })?
                }
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
}

fn describe(operand: &Operand) -> String {
    match operand {
        Operand::Field(path) => format!(".{}", path.join(".")),
        Operand::Variable(name, path) if path.is_empty() => name.clone(),
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
