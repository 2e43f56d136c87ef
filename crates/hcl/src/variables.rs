//! A jobspec's `variable` blocks (with `default`, `type` and `validation`), their values
//! from `-var`, `-var-file` and `NOMAD_VAR_*` ([`VariableInputs`]), and its `locals`,
//! evaluated in dependency order into the [`Scope`] the rest of the jobspec is evaluated
//! in. A variable or local that gets no value is reported once, where it is declared;
//! what refers to it then fails without a second message ([`EvalError::Unresolved`]).

use std::collections::{BTreeMap, BTreeSet};

use hcl_edit::Span as _;
use hcl_edit::expr::Expression;
use hcl_edit::structure::{Block, Body, Structure};

use super::eval::{EvalError, Scope, VariableInputs, bounded, roots_of};
use super::location::{Location, SyntaxProblem, problem};

/// Takes the `variable`, `variables` and `locals` blocks out of `body` and evaluates
/// them with `inputs` into the scope for the rest. Every problem is reported, each at its
/// place.
pub fn scope_of(
    body: &mut Body,
    inputs: &VariableInputs,
    lines: &dyn Fn(Option<std::ops::Range<usize>>) -> Location,
    problems: &mut Vec<SyntaxProblem>,
) -> Scope {
    let mut scope = Scope::empty();
    let mut declared: Vec<Declared> = Vec::new();
    let mut locals: Vec<(String, Expression, Location)> = Vec::new();
    let mut kept = Vec::new();
    for structure in std::mem::take(body).into_iter() {
        match structure {
            Structure::Block(block) if block.ident.as_str() == "variable" => {
                if let Some(d) = declare(&block, lines, problems) {
                    if declared.iter().any(|o| o.name == d.name) {
                        problems.push(problem(
                            d.at,
                            format!("variable {:?} is declared twice", d.name),
                        ));
                    } else {
                        declared.push(d);
                    }
                }
            }
            Structure::Block(block) if block.ident.as_str() == "variables" => {
                for attr in block.body.attributes() {
                    declared.push(Declared {
                        name: attr.key.as_str().to_string(),
                        default: Some(attr.value.clone()),
                        kind: TypeConstraint::Any,
                        validations: Vec::new(),
                        at: lines(attr.span()),
                    });
                }
            }
            Structure::Block(block) if block.ident.as_str() == "locals" => {
                for attr in block.body.attributes() {
                    let name = attr.key.as_str().to_string();
                    if locals.iter().any(|(n, _, _)| *n == name) {
                        problems.push(problem(
                            lines(attr.span()),
                            format!("local {name:?} is defined twice"),
                        ));
                        continue;
                    }
                    locals.push((name, attr.value.clone(), lines(attr.span())));
                }
            }
            other => kept.push(other),
        }
    }
    *body = kept.into_iter().collect();
    let values = scope.variable_values(&declared, inputs, problems);
    scope.record_sizes(false, &values);
    scope.ctx.declare_var("var", hcl::Value::Object(values));
    // From here on, a reference names a declared variable or it is refused by name.
    scope.complete = true;
    scope.evaluate_locals(locals, problems);
    scope
}

impl Scope {
    /// Every declared variable's value: the last input that gives one, else its default.
    fn variable_values(
        &mut self,
        declared: &[Declared],
        inputs: &VariableInputs,
        problems: &mut Vec<SyntaxProblem>,
    ) -> hcl::Map<String, hcl::Value> {
        let mut given: BTreeMap<&str, (hcl::Value, String)> = BTreeMap::new();
        for (name, text) in &inputs.env {
            if let Some(d) = declared.iter().find(|d| d.name == *name) {
                given.insert(
                    &d.name,
                    (
                        hcl::Value::String(text.clone()),
                        format!("NOMAD_VAR_{name}"),
                    ),
                );
            }
        }
        for (file, text) in &inputs.files {
            match parse_var_file(text) {
                Ok(values) => {
                    for (name, value) in values {
                        match declared.iter().find(|d| d.name == name) {
                            Some(d) => {
                                given.insert(&d.name, (value, format!("the var file {file}")));
                            }
                            None => problems.push(problem(
                                Location::default(),
                                format!(
                                    "the var file {file} sets {name:?}, which the jobspec does not \
                                     declare (add a variable \"{name}\" block)"
                                ),
                            )),
                        }
                    }
                }
                Err(message) => problems.push(problem(
                    Location::default(),
                    format!("the var file {file}: {message}"),
                )),
            }
        }
        for (name, text) in &inputs.args {
            match declared.iter().find(|d| d.name == *name) {
                Some(d) => {
                    given.insert(
                        &d.name,
                        (hcl::Value::String(text.clone()), format!("-var {name}")),
                    );
                }
                None => problems.push(problem(
                    Location::default(),
                    format!(
                        "-var {name}=…: the jobspec declares no variable {name:?} (add a \
                         variable \"{name}\" block)"
                    ),
                )),
            }
        }
        let functions_only = Scope::empty();
        let mut values = hcl::Map::new();
        for d in declared {
            let (raw, origin) = match given.remove(d.name.as_str()) {
                Some((value, origin)) => (value, origin),
                None => match &d.default {
                    Some(expr) => match functions_only.evaluate(expr) {
                        Ok(value) => (value, "its default".to_string()),
                        Err(message) => {
                            problems.push(problem(
                                d.at,
                                format!("variable {:?}: default: {message}", d.name),
                            ));
                            self.unresolved.insert((false, d.name.clone()));
                            continue;
                        }
                    },
                    None => {
                        problems.push(problem(
                            d.at,
                            format!(
                                "variable {:?} has no value: give it one with -var {0}=…, a \
                                 -var-file, NOMAD_VAR_{0} in the environment, or a default",
                                d.name
                            ),
                        ));
                        self.unresolved.insert((false, d.name.clone()));
                        continue;
                    }
                },
            };
            let value = match d.kind.convert(
                raw,
                origin.starts_with("-var ") || origin.starts_with("NOMAD_VAR_"),
            ) {
                Ok(value) => value,
                Err(message) => {
                    problems.push(problem(
                        d.at,
                        format!("variable {:?} (from {origin}): {message}", d.name),
                    ));
                    self.unresolved.insert((false, d.name.clone()));
                    continue;
                }
            };
            if let Err(message) = bounded(&value) {
                problems.push(problem(d.at, format!("variable {:?}: {message}", d.name)));
                self.unresolved.insert((false, d.name.clone()));
                continue;
            }
            // A condition sees this variable only, under the same bounds as the rest.
            let mut check = Scope::empty();
            check.references = self.references;
            check.sizes.insert(
                (false, d.name.clone()),
                super::functions::value_size(&value),
            );
            check.ctx.declare_var(
                "var",
                hcl::Value::Object(hcl::Map::from_iter([(d.name.clone(), value.clone())])),
            );
            for (condition, message, at) in &d.validations {
                let evaluated = check
                    .count(condition)
                    .and_then(|()| check.evaluate(condition));
                match evaluated {
                    Ok(hcl::Value::Bool(true)) => {}
                    Ok(hcl::Value::Bool(false)) => {
                        problems.push(problem(*at, format!("variable {:?}: {message}", d.name)))
                    }
                    Ok(other) => problems.push(problem(
                        *at,
                        format!(
                            "variable {:?}: the validation condition gave {other}, not a bool",
                            d.name
                        ),
                    )),
                    Err(error) => problems.push(problem(
                        *at,
                        format!("variable {:?}: validation: {error}", d.name),
                    )),
                }
            }
            self.references = check.references;
            values.insert(d.name.clone(), value);
        }
        values
    }

    /// Evaluates the locals in dependency order; a cycle or an unknown local is reported.
    fn evaluate_locals(
        &mut self,
        locals: Vec<(String, Expression, Location)>,
        problems: &mut Vec<SyntaxProblem>,
    ) {
        let names: BTreeSet<String> = locals.iter().map(|(n, _, _)| n.clone()).collect();
        let mut pending: Vec<(String, Expression, Location, BTreeSet<String>)> = Vec::new();
        for (name, expr, at) in locals {
            // Counted before anything is evaluated: a local is where a template of many
            // references to a large value would be built.
            if let Err(error) = self.count(&expr) {
                problems.push(problem(at, format!("local {name:?}: {error}")));
                // A bound: nothing more is evaluated here, and no local has a value.
                self.unresolved.extend(names.into_iter().map(|n| (true, n)));
                return;
            }
            let roots = roots_of(&expr);
            if let Some(unknown) = roots.locals.iter().find(|l| !names.contains(*l)) {
                problems.push(problem(
                    at,
                    format!("local {name:?} refers to local.{unknown}, which is not defined"),
                ));
                self.unresolved.insert((true, name));
                continue;
            }
            pending.push((name, expr, at, roots.locals));
        }
        let mut done = hcl::Map::new();
        let mut failed: BTreeSet<String> = BTreeSet::new();
        while !pending.is_empty() {
            let ready = pending.iter().position(|(_, _, _, deps)| {
                deps.iter()
                    .all(|d| done.contains_key(d) || failed.contains(d))
            });
            let Some(index) = ready else {
                let cycle = describe_cycle(&pending);
                problems.push(problem(
                    pending[0].2,
                    format!("locals refer to each other in a cycle: {cycle}"),
                ));
                // Those outside the cycle keep their values.
                self.unresolved
                    .extend(pending.drain(..).map(|(name, _, _, _)| (true, name)));
                break;
            };
            let (name, expr, at, deps) = pending.remove(index);
            if deps.iter().any(|d| failed.contains(d)) {
                self.unresolved.insert((true, name.clone()));
                failed.insert(name);
                continue;
            }
            self.ctx
                .declare_var("local", hcl::Value::Object(done.clone()));
            match self.evaluate(&expr).and_then(|v| bounded(&v).map(|()| v)) {
                Ok(value) => {
                    self.sizes
                        .insert((true, name.clone()), super::functions::value_size(&value));
                    done.insert(name, value);
                }
                Err(message) => {
                    if message != EvalError::Unresolved {
                        problems.push(problem(at, format!("local {name:?}: {message}")));
                    }
                    self.unresolved.insert((true, name.clone()));
                    failed.insert(name);
                }
            }
        }
        self.ctx.declare_var("local", hcl::Value::Object(done));
    }
}

fn describe_cycle(pending: &[(String, Expression, Location, BTreeSet<String>)]) -> String {
    let mut path = vec![pending[0].0.clone()];
    let mut current = &pending[0];
    while let Some(next) = current
        .3
        .iter()
        .find_map(|d| pending.iter().find(|(n, _, _, _)| n == d))
    {
        if let Some(start) = path.iter().position(|n| *n == next.0) {
            let mut cycle: Vec<String> =
                path[start..].iter().map(|n| format!("local.{n}")).collect();
            cycle.push(format!("local.{}", next.0));
            return cycle.join(" → ");
        }
        path.push(next.0.clone());
        current = next;
    }
    path.join(" → ")
}

/// One `variable "name" { ... }` block.
struct Declared {
    name: String,
    default: Option<Expression>,
    kind: TypeConstraint,
    /// `(condition, error_message, where)`.
    validations: Vec<(Expression, String, Location)>,
    at: Location,
}

fn declare(
    block: &Block,
    lines: &dyn Fn(Option<std::ops::Range<usize>>) -> Location,
    problems: &mut Vec<SyntaxProblem>,
) -> Option<Declared> {
    let at = lines(block.span());
    let [label] = block.labels.as_slice() else {
        problems.push(problem(
            at,
            "a variable block takes one label: variable \"name\" { … }",
        ));
        return None;
    };
    let name = label.as_str().to_string();
    let mut declared = Declared {
        name: name.clone(),
        default: None,
        kind: TypeConstraint::Any,
        validations: Vec::new(),
        at,
    };
    for structure in block.body.iter() {
        match structure {
            Structure::Attribute(attr) => match attr.key.as_str() {
                "default" => declared.default = Some(attr.value.clone()),
                "type" => match TypeConstraint::parse(&attr.value) {
                    Ok(kind) => declared.kind = kind,
                    Err(message) => problems.push(problem(lines(attr.span()), format!("variable {name:?}: {message}"))),
                },
                "description" | "sensitive" | "nullable" => {}
                other => problems.push(problem(
                    lines(attr.span()),
                    format!("variable {name:?}: unknown attribute {other:?} (a variable has default, type, description, sensitive, validation)"),
                )),
            },
            Structure::Block(inner) if inner.ident.as_str() == "validation" => {
                let condition = inner.body.get_attribute("condition").map(|a| a.value.clone());
                let message = inner
                    .body
                    .get_attribute("error_message")
                    .and_then(|a| match &a.value {
                        Expression::String(s) => Some(s.value().to_string()),
                        _ => None,
                    });
                match (condition, message) {
                    (Some(condition), Some(message)) => {
                        declared.validations.push((condition, message, lines(inner.span())))
                    }
                    _ => problems.push(problem(
                        lines(inner.span()),
                        format!("variable {name:?}: a validation block needs condition and a literal error_message"),
                    )),
                }
            }
            Structure::Block(inner) => problems.push(problem(
                lines(inner.span()),
                format!("variable {name:?}: unknown block {:?}", inner.ident.as_str()),
            )),
        }
    }
    Some(declared)
}

/// A variable's `type`.
#[derive(Debug, Clone, PartialEq)]
enum TypeConstraint {
    Any,
    String,
    Number,
    Bool,
    List(Box<TypeConstraint>),
    Map(Box<TypeConstraint>),
    /// `object({...})` and `tuple([...])`: checked as an object or a list only.
    Object,
    Tuple,
}

impl TypeConstraint {
    fn parse(expr: &Expression) -> Result<TypeConstraint, EvalError> {
        match expr {
            Expression::Variable(ident) => match ident.as_str() {
                "any" => Ok(TypeConstraint::Any),
                "string" => Ok(TypeConstraint::String),
                "number" => Ok(TypeConstraint::Number),
                "bool" => Ok(TypeConstraint::Bool),
                other => Err(EvalError::UnknownType(other.to_string())),
            },
            Expression::FuncCall(call) => {
                let inner = || -> Result<TypeConstraint, EvalError> {
                    match call.args.iter().next() {
                        Some(arg) => TypeConstraint::parse(arg),
                        None => Ok(TypeConstraint::Any),
                    }
                };
                match call.name.name.as_str() {
                    "list" | "set" => Ok(TypeConstraint::List(Box::new(inner()?))),
                    "map" => Ok(TypeConstraint::Map(Box::new(inner()?))),
                    "object" => Ok(TypeConstraint::Object),
                    "tuple" => Ok(TypeConstraint::Tuple),
                    other => Err(EvalError::UnknownType(format!("{other}(…)"))),
                }
            }
            _ => Err(EvalError::NotAType),
        }
    }

    /// Converts `value` to this type, as HCL does (`"5"` is a number, `5` a string). A
    /// string from the command line or the environment is parsed as HCL for the complex
    /// types (`-var 'dcs=["a","b"]'`).
    fn convert(&self, value: hcl::Value, from_text: bool) -> Result<hcl::Value, EvalError> {
        use hcl::Value as V;
        let kind = |v: &V| match v {
            V::Null => "null",
            V::Bool(_) => "a bool",
            V::Number(_) => "a number",
            V::String(_) => "a string",
            V::Array(_) => "a list",
            V::Object(_) => "an object",
        };
        let complex = matches!(
            self,
            TypeConstraint::List(_)
                | TypeConstraint::Map(_)
                | TypeConstraint::Object
                | TypeConstraint::Tuple
        );
        let value = match value {
            V::String(text) if from_text && complex => {
                let expr: Expression = text
                    .parse()
                    .map_err(|_| EvalError::NotAValue(text.clone()))?;
                super::nesting::check_expr(&expr).map_err(EvalError::TooDeep)?;
                Scope::empty().evaluate(&expr)?
            }
            other => other,
        };
        match (self, value) {
            (TypeConstraint::Any, v) => Ok(v),
            (TypeConstraint::String, V::String(s)) => Ok(V::String(s)),
            (TypeConstraint::String, V::Number(n)) => Ok(V::String(n.to_string())),
            (TypeConstraint::String, V::Bool(b)) => Ok(V::String(b.to_string())),
            (TypeConstraint::Number, V::Number(n)) => Ok(V::Number(n)),
            (TypeConstraint::Number, V::String(s)) => s
                .trim()
                .parse::<f64>()
                .ok()
                .and_then(hcl::Number::from_f64)
                .map(|n| match n.as_f64() {
                    Some(f) if f.fract() == 0.0 && f.abs() < 9.0e15 => V::from(f as i64),
                    _ => V::Number(n),
                })
                .ok_or(EvalError::NotANumber(s)),
            (TypeConstraint::Bool, V::Bool(b)) => Ok(V::Bool(b)),
            (TypeConstraint::Bool, V::String(s)) if s == "true" || s == "false" => {
                Ok(V::Bool(s == "true"))
            }
            (TypeConstraint::List(inner), V::Array(items)) => items
                .into_iter()
                .map(|v| inner.convert(v, false))
                .collect::<Result<Vec<_>, _>>()
                .map(V::Array),
            (TypeConstraint::Map(inner), V::Object(map)) => map
                .into_iter()
                .map(|(k, v)| Ok((k, inner.convert(v, false)?)))
                .collect::<Result<hcl::Map<_, _>, EvalError>>()
                .map(V::Object),
            (TypeConstraint::Object, V::Object(map)) => Ok(V::Object(map)),
            (TypeConstraint::Tuple, V::Array(items)) => Ok(V::Array(items)),
            (want, got) => Err(EvalError::WrongType {
                want: want.describe(),
                got: kind(&got),
            }),
        }
    }

    fn describe(&self) -> String {
        match self {
            TypeConstraint::Any => "any value".into(),
            TypeConstraint::String => "a string".into(),
            TypeConstraint::Number => "a number".into(),
            TypeConstraint::Bool => "a bool".into(),
            TypeConstraint::List(inner) => format!("a list of {}", inner.describe()),
            TypeConstraint::Map(inner) => format!("a map of {}", inner.describe()),
            TypeConstraint::Object => "an object".into(),
            TypeConstraint::Tuple => "a list".into(),
        }
    }
}

/// A `-var-file`: `name = value` attributes with literal values (functions allowed).
fn parse_var_file(source: &str) -> Result<Vec<(String, hcl::Value)>, EvalError> {
    let body = hcl_edit::parser::parse_body(source).map_err(|e| {
        let at = e.location();
        EvalError::VarFileSyntax {
            line: at.line(),
            column: at.column(),
            message: e.message().to_string(),
        }
    })?;
    super::nesting::check_body(&body, &super::location::LineIndex::new(source)).map_err(
        |too_deep| EvalError::VarFileSyntax {
            line: too_deep.at.line,
            column: too_deep.at.column,
            message: too_deep.message,
        },
    )?;
    let scope = Scope::empty();
    let mut values = Vec::new();
    for structure in body.iter() {
        match structure {
            Structure::Attribute(attr) => {
                let value = scope
                    .evaluate(&attr.value)
                    .map_err(|e| EvalError::VarFileValue {
                        name: attr.key.as_str().to_string(),
                        source: Box::new(e),
                    })?;
                values.push((attr.key.as_str().to_string(), value));
            }
            Structure::Block(block) => {
                return Err(EvalError::VarFileBlock(block.ident.as_str().to_string()));
            }
        }
    }
    Ok(values)
}
