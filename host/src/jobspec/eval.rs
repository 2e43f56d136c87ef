//! HCL2 evaluation as Nomad's jobspec parser does it: `variable` blocks (with `default`,
//! `type` and `validation`), values from `-var`, `-var-file` and `NOMAD_VAR_*`, `locals`,
//! `var.x` / `local.x` references and the function library of [`super::functions`].
//!
//! What is known only when a task starts (`${NOMAD_ALLOC_DIR}`, `${attr.kernel.name}`,
//! `${meta.x}`, `${env["X"]}`, …) is left in its string, verbatim, for the task runner
//! to interpolate: an interpolation is evaluated here only when every variable it names
//! is `var` or `local`.
//!
//! The agent evaluates what job authors send it, and they are not trusted, so the work is
//! bounded: a `var` or `local` value holds at most [`MAX_VALUE_BYTES`], a jobspec makes
//! at most [`MAX_REFERENCES`] references to them, `for` expressions do not nest, and the
//! functions bound their own results. The worst a jobspec can make the agent build is
//! then a few tens of MiB, for an instant, before it is refused. `file()` reads the disk of
//! the machine that evaluates it, so only the CLI has it ([`inline_files`]): it replaces
//! each call by the file's text before the jobspec leaves for the agent.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use hcl::eval::{Context, Evaluate};
use hcl_edit::Span as _;
use hcl_edit::expr::{Expression, TraversalOperator};
use hcl_edit::structure::{Block, Body, Structure};
use hcl_edit::visit::Visit;
use serde::{Deserialize, Serialize};

use super::hcl::{Location, SyntaxProblem};

/// The largest value a variable or local may hold, as JSON.
pub const MAX_VALUE_BYTES: usize = 64 * 1024;
/// The most `var.*` / `local.*` references one jobspec may make.
pub const MAX_REFERENCES: usize = 1024;
/// The most blocks the `dynamic` blocks of one jobspec may make, nested ones counted
/// as many times as they are made.
pub const MAX_DYNAMIC_BLOCKS: usize = 4096;
/// The largest file `file()` inlines.
pub const MAX_FILE_BYTES: usize = 1024 * 1024;

/// Values for a jobspec's variables, as `berth job run` collects them. Later sources win:
/// `NOMAD_VAR_<name>` in the environment, then each `-var-file` in order, then each
/// `-var name=value` in order (Nomad's precedence).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VariableInputs {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<(String, String)>,
    /// `(file name, HCL source)` of each `-var-file`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<(String, String)>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<(String, String)>,
}

impl VariableInputs {
    pub fn is_empty(&self) -> bool {
        self.env.is_empty() && self.files.is_empty() && self.args.is_empty()
    }

    /// `NOMAD_VAR_<name>=value` pairs of an environment.
    pub fn from_env(vars: impl IntoIterator<Item = (String, String)>) -> Vec<(String, String)> {
        vars.into_iter()
            .filter_map(|(k, v)| Some((k.strip_prefix("NOMAD_VAR_")?.to_string(), v)))
            .filter(|(k, _)| !k.is_empty())
            .collect()
    }
}

/// Why an expression, a variable value or a file could not be evaluated.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum EvalError {
    #[error(
        "{name} is known only when the task starts; use it inside a string, as \
         \"${{{name}…}}\""
    )]
    RunTimeName { name: String },
    #[error("a for expression inside another is not supported")]
    NestedFor,
    #[error(
        "file() reads the disk of the machine that evaluates it: `berth job run` and \
         `berth job validate` replace each file(\"…\") by the file's text before the agent \
         sees the jobspec; the agent reads no files for a job author"
    )]
    FileOnAgent,
    #[error("unknown function {name}() (berth has: {})", super::functions::NAMES.join(", "))]
    UnknownFunction { name: String },
    #[error("{0}")]
    Hcl(String),
    #[error(
        "the jobspec makes more than {MAX_REFERENCES} references to variables and locals; \
         berth allows {MAX_REFERENCES}"
    )]
    TooManyReferences,
    #[error(
        "the dynamic blocks would make more than {MAX_DYNAMIC_BLOCKS} blocks; a node runs \
         fewer tasks than that"
    )]
    TooManyDynamicBlocks,
    #[error("the value is {size} bytes as JSON; berth allows {MAX_VALUE_BYTES}")]
    TooLarge { size: usize },
    #[error("cannot put {kind} in a string")]
    NotText { kind: &'static str },
    #[error(
        "a template directive (%{{ if }} / %{{ for }}) mixed with run-time variables is not \
         supported"
    )]
    DirectiveAtRunTime,
    #[error("unknown type {0:?}")]
    UnknownType(String),
    #[error(
        "a type is a name (string, number, bool, any) or list(…), set(…), map(…), \
         object(…), tuple(…)"
    )]
    NotAType,
    #[error("expected {want}, got {got}")]
    WrongType { want: String, got: &'static str },
    #[error("{0:?} is not a number")]
    NotANumber(String),
    #[error("{0:?} is not an HCL value of the declared type")]
    NotAValue(String),
    #[error("{line}:{column}: {message}")]
    VarFileSyntax {
        line: usize,
        column: usize,
        message: String,
    },
    #[error("a var file holds name = value lines only, not blocks ({0:?})")]
    VarFileBlock(String),
    #[error("{name}: {source}")]
    VarFileValue {
        name: String,
        source: Box<EvalError>,
    },
    #[error("file() takes one literal path, as file(\"config/app.conf\"): {written}")]
    FilePath { written: String },
    #[error("file({path:?}): {reason}")]
    FileRead { path: String, reason: String },
    #[error("file({path:?}) is {size} bytes; berth inlines at most {MAX_FILE_BYTES}")]
    FileTooLarge { path: String, size: u64 },
    #[error("file({path:?}) is not UTF-8 text")]
    FileNotText { path: String },
}

/// The scope a jobspec body is evaluated in.
pub struct Scope {
    ctx: Context<'static>,
    /// What a reference to each variable and local copies (`value_size`), by name.
    sizes: BTreeMap<(bool, String), usize>,
    references: usize,
    /// The iterators of the `dynamic` blocks being expanded, innermost last.
    iterators: Vec<String>,
    /// Blocks made by `dynamic` blocks so far.
    dynamic_blocks: usize,
}

/// Where a problem was, before it gets the jobspec path of the block around it.
fn problem(at: Location, message: impl ToString) -> SyntaxProblem {
    SyntaxProblem {
        at,
        message: message.to_string(),
    }
}

/// What names a reference or interpolation uses, outside `for` variables.
#[derive(Default)]
struct Roots {
    names: BTreeSet<String>,
    /// `local.<name>` references.
    locals: BTreeSet<String>,
    references: usize,
    /// Each reference: whether it is a local, its name, and how many times it may be
    /// evaluated (inside a `for` expression or `%{for}` directive, once per element).
    referenced: Vec<(bool, String, usize)>,
    bound: Vec<String>,
    for_depth: usize,
    nested_for: bool,
    calls_file: bool,
    /// How many times what is being visited may be evaluated: 1 outside loops, the
    /// loop's element count (at most [`super::functions::MAX_ITEMS`]) inside one.
    times: usize,
    /// The bytes the literals inside loops produce, counted as many times as their loop
    /// may run: a literal body repeated by a `%{for}` costs little to write and a lot to
    /// build.
    looped_literals: usize,
}

impl Roots {
    /// How many times a loop over `collection` may run: a literal list's length, else
    /// the most elements a function or a value may have.
    fn iterations(collection: &Expression) -> usize {
        match collection {
            Expression::Array(items) => items.len(),
            Expression::Object(items) => items.len(),
            _ => super::functions::MAX_ITEMS,
        }
    }

    /// Visits a loop's body with `vars` bound, as many times as costly as `iterations`.
    fn in_loop(&mut self, vars: Vec<String>, iterations: usize, visit: impl FnOnce(&mut Roots)) {
        if self.for_depth > 0 {
            self.nested_for = true;
        }
        self.for_depth += 1;
        let (bound_before, times_before) = (self.bound.len(), self.times);
        self.bound.extend(vars);
        self.times = self.times.max(1).saturating_mul(iterations.max(1));
        visit(self);
        self.bound.truncate(bound_before);
        self.times = times_before;
        self.for_depth -= 1;
    }

    fn literal(&mut self, len: usize) {
        if self.times > 1 {
            self.looped_literals = self
                .looped_literals
                .saturating_add(len.saturating_mul(self.times));
        }
    }
}

impl Visit for Roots {
    fn visit_expr(&mut self, node: &Expression) {
        match node {
            Expression::Variable(ident) => {
                let name = ident.as_str();
                if !self.bound.iter().any(|b| b == name) {
                    self.names.insert(name.to_string());
                }
            }
            Expression::Traversal(traversal) => {
                if let Expression::Variable(ident) = &traversal.expr {
                    let name = ident.as_str();
                    if (name == "var" || name == "local") && !self.bound.iter().any(|b| b == name) {
                        self.references += 1;
                        if let Some(TraversalOperator::GetAttr(attr)) =
                            traversal.operators.first().map(|o| o.value())
                        {
                            self.referenced.push((
                                name == "local",
                                attr.as_str().to_string(),
                                self.times.max(1),
                            ));
                        }
                        if let (Some(TraversalOperator::GetAttr(attr)), "local") =
                            (traversal.operators.first().map(|o| o.value()), name)
                        {
                            self.locals.insert(attr.as_str().to_string());
                        }
                    }
                }
                hcl_edit::visit::visit_traversal(self, traversal);
            }
            Expression::ForExpr(for_expr) => {
                self.visit_expr(&for_expr.intro.collection_expr);
                let mut vars = vec![for_expr.intro.value_var.as_str().to_string()];
                vars.extend(
                    for_expr
                        .intro
                        .key_var
                        .as_ref()
                        .map(|k| k.as_str().to_string()),
                );
                let iterations = Roots::iterations(&for_expr.intro.collection_expr);
                self.in_loop(vars, iterations, |roots| {
                    if let Some(key) = &for_expr.key_expr {
                        roots.visit_expr(key);
                    }
                    roots.visit_expr(&for_expr.value_expr);
                    if let Some(cond) = &for_expr.cond {
                        roots.visit_expr(&cond.expr);
                    }
                });
            }
            Expression::FuncCall(call) => {
                if call.name.name.as_str() == "file" && call.name.namespace.is_empty() {
                    self.calls_file = true;
                }
                hcl_edit::visit::visit_func_call(self, call);
            }
            other => hcl_edit::visit::visit_expr(self, other),
        }
    }

    /// A template's `%{for}`: a loop like a `for` expression (hcl-edit's default visit
    /// skips its collection).
    fn visit_for_template_expr(&mut self, node: &hcl_edit::template::ForTemplateExpr) {
        self.visit_expr(&node.collection_expr);
        let mut vars = vec![node.value_var.as_str().to_string()];
        vars.extend(node.key_var.as_ref().map(|k| k.as_str().to_string()));
        let iterations = Roots::iterations(&node.collection_expr);
        self.in_loop(vars, iterations, |roots| {
            roots.visit_template(&node.template)
        });
    }

    fn visit_literal(&mut self, node: &hcl_edit::Spanned<String>) {
        self.literal(node.len());
    }

    fn visit_string(&mut self, node: &hcl_edit::Decorated<String>) {
        self.literal(node.len());
    }
}

fn roots_of(expr: &Expression) -> Roots {
    let mut roots = Roots::default();
    roots.visit_expr(expr);
    roots
}

/// Whether every variable `roots` names is known at parse time: `var`, `local`, and the
/// iterators of the `dynamic` blocks around.
fn evaluable(roots: &Roots, iterators: &[String]) -> bool {
    roots
        .names
        .iter()
        .all(|n| n == "var" || n == "local" || iterators.contains(n))
}

impl Scope {
    /// A scope without variables or locals (the functions only).
    pub fn empty() -> Scope {
        let mut ctx = Context::new();
        super::functions::declare_all(&mut ctx);
        Scope {
            ctx,
            sizes: BTreeMap::new(),
            references: 0,
            iterators: Vec::new(),
            dynamic_blocks: 0,
        }
    }

    /// Takes the `variable`, `variables` and `locals` blocks out of `body` and evaluates
    /// them with `inputs`. Every problem is reported, each at its place.
    pub fn build(
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
        scope.evaluate_locals(locals, problems);
        scope
    }

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
                    continue;
                }
            };
            if let Err(message) = bounded(&value) {
                problems.push(problem(d.at, format!("variable {:?}: {message}", d.name)));
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
                return;
            }
            let roots = roots_of(&expr);
            if let Some(unknown) = roots.locals.iter().find(|l| !names.contains(*l)) {
                problems.push(problem(
                    at,
                    format!("local {name:?} refers to local.{unknown}, which is not defined"),
                ));
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
                return;
            };
            let (name, expr, at, deps) = pending.remove(index);
            if deps.iter().any(|d| failed.contains(d)) {
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
                    problems.push(problem(at, format!("local {name:?}: {message}")));
                    failed.insert(name);
                }
            }
        }
        self.ctx.declare_var("local", hcl::Value::Object(done));
    }

    /// Evaluates an expression that names only `var`, `local` and functions.
    pub fn evaluate(&self, expr: &Expression) -> Result<hcl::Value, EvalError> {
        let roots = roots_of(expr);
        if roots.nested_for {
            return Err(EvalError::NestedFor);
        }
        if roots.calls_file {
            return Err(EvalError::FileOnAgent);
        }
        if let Some(name) = roots
            .names
            .iter()
            .find(|n| *n != "var" && *n != "local" && !self.iterators.contains(n))
        {
            return Err(EvalError::RunTimeName { name: name.clone() });
        }
        // What its references will copy, and what its loops will build from literals,
        // taken from the budget before they are made.
        let copies = roots
            .referenced
            .iter()
            .map(|(local, name, times)| {
                let size = self
                    .sizes
                    .get(&(*local, name.clone()))
                    .copied()
                    .unwrap_or(0);
                size.saturating_mul(*times)
            })
            .fold(roots.looped_literals, usize::saturating_add);
        super::functions::charge(copies).map_err(|spent| EvalError::Hcl(spent.to_string()))?;
        hcl::Expression::from(expr.clone())
            .evaluate(&self.ctx)
            .map_err(|e| explain(&e))
    }

    /// Remembers what a reference to each of `values` copies.
    fn record_sizes(&mut self, local: bool, values: &hcl::Map<String, hcl::Value>) {
        for (name, value) in values {
            self.sizes
                .insert((local, name.clone()), super::functions::value_size(value));
        }
    }

    /// Counts references; past [`MAX_REFERENCES`], refuses.
    pub fn count(&mut self, expr: &Expression) -> Result<(), EvalError> {
        self.references += roots_of(expr).references;
        if self.references > MAX_REFERENCES {
            return Err(EvalError::TooManyReferences);
        }
        Ok(())
    }

    /// Whether `expr` can be evaluated now (it names no run-time variable).
    pub fn is_static(&self, expr: &Expression) -> bool {
        evaluable(&roots_of(expr), &self.iterators)
    }

    /// Declares a `dynamic` block's iterator (`{ key, value }`) for its `content`.
    pub fn enter_iterator(&mut self, name: &str, key: hcl::Value, value: hcl::Value) {
        let mut item = hcl::Map::new();
        item.insert("key".to_string(), key);
        item.insert("value".to_string(), value);
        self.ctx
            .declare_var(name.to_string(), hcl::Value::Object(item));
        self.iterators.push(name.to_string());
    }

    /// Counts blocks a `dynamic` block is about to make; past [`MAX_DYNAMIC_BLOCKS`] for
    /// the jobspec, refuses.
    pub fn count_dynamic_blocks(&mut self, made: usize) -> Result<(), EvalError> {
        self.dynamic_blocks += made;
        if self.dynamic_blocks > MAX_DYNAMIC_BLOCKS {
            return Err(EvalError::TooManyDynamicBlocks);
        }
        Ok(())
    }

    /// Whether a `dynamic` block around uses `name` as its iterator.
    pub fn is_iterating(&self, name: &str) -> bool {
        self.iterators.iter().any(|i| i == name)
    }

    /// Ends the innermost iterator's `content`.
    pub fn leave_iterator(&mut self) {
        self.iterators.pop();
    }

    /// A template's text, its `var`/`local` interpolations evaluated and the others kept
    /// as written (`source` is the jobspec text the spans point into).
    pub fn template(
        &self,
        template: &hcl_edit::template::Template,
        whole: &Expression,
        source: &str,
    ) -> Result<String, EvalError> {
        let roots = roots_of(whole);
        if evaluable(&roots, &self.iterators) {
            return match self.evaluate(whole)? {
                hcl::Value::String(s) => Ok(s),
                other => Ok(other.to_string()),
            };
        }
        let mut out = String::new();
        for element in template.iter() {
            match element {
                hcl_edit::template::Element::Literal(literal) => out.push_str(literal.value()),
                hcl_edit::template::Element::Interpolation(interpolation) => {
                    if self.is_static(&interpolation.expr) {
                        match self.evaluate(&interpolation.expr)? {
                            hcl::Value::String(s) => out.push_str(&s),
                            hcl::Value::Number(n) => out.push_str(&n.to_string()),
                            hcl::Value::Bool(b) => out.push_str(&b.to_string()),
                            other => {
                                return Err(EvalError::NotText {
                                    kind: if other.is_array() {
                                        "a list"
                                    } else {
                                        "an object or null"
                                    },
                                });
                            }
                        }
                    } else {
                        let text = interpolation
                            .expr
                            .span()
                            .and_then(|span| source.get(span))
                            .ok_or(EvalError::DirectiveAtRunTime)?;
                        out.push_str("${");
                        out.push_str(text.trim());
                        out.push('}');
                    }
                }
                hcl_edit::template::Element::Directive(_) => {
                    return Err(EvalError::DirectiveAtRunTime);
                }
            }
        }
        Ok(out)
    }
}

/// An hcl-rs evaluation error in a user's words.
fn explain(error: &hcl::eval::Error) -> EvalError {
    match error.kind() {
        hcl::eval::ErrorKind::UndefinedFunc(name) => EvalError::UnknownFunction {
            name: name.to_string(),
        },
        _ => EvalError::Hcl(error.to_string()),
    }
}

/// Refuses a value larger than [`MAX_VALUE_BYTES`] as JSON.
fn bounded(value: &hcl::Value) -> Result<(), EvalError> {
    let size = serde_json::to_vec(&super::functions::to_json(value))
        .map(|v| v.len())
        .unwrap_or(usize::MAX);
    if size > MAX_VALUE_BYTES {
        return Err(EvalError::TooLarge { size });
    }
    Ok(())
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

/// Replaces each `file("path")` call in `source` by the text of the file (relative to
/// `base`), quoted as an HCL string on one line, so that line numbers stay true. The path
/// must be a literal string. Run by the CLI, on the user's machine, with the user's rights.
pub fn inline_files(source: &str, base: &Path) -> Result<String, Vec<SyntaxProblem>> {
    let Ok(body) = hcl_edit::parser::parse_body(source) else {
        // The parse that follows reports the syntax error with its position.
        return Ok(source.to_string());
    };
    struct Calls<'a> {
        found: Vec<(std::ops::Range<usize>, Result<String, EvalError>)>,
        source: &'a str,
    }
    impl Visit for Calls<'_> {
        fn visit_func_call(&mut self, call: &hcl_edit::expr::FuncCall) {
            if call.name.name.as_str() != "file" || !call.name.namespace.is_empty() {
                return hcl_edit::visit::visit_func_call(self, call);
            }
            let Some(span) = call.span() else { return };
            let args: Vec<&Expression> = call.args.iter().collect();
            let path = match args.as_slice() {
                [Expression::String(s)] => Ok(s.value().to_string()),
                _ => Err(EvalError::FilePath {
                    written: self.source.get(span.clone()).unwrap_or("").to_string(),
                }),
            };
            self.found.push((span, path));
        }
    }
    let mut calls = Calls {
        found: Vec::new(),
        source,
    };
    calls.visit_body(&body);
    let lines = super::hcl::LineIndex::new(source);
    let mut problems = Vec::new();
    let mut out = source.to_string();
    for (span, path) in calls.found.into_iter().rev() {
        let at = lines.at(Some(span.clone()));
        let text = path.and_then(|path| {
            let full = base.join(&path);
            let read_error = |e: std::io::Error| EvalError::FileRead {
                path: path.clone(),
                reason: e.to_string(),
            };
            let meta = std::fs::metadata(&full).map_err(read_error)?;
            if meta.len() > MAX_FILE_BYTES as u64 {
                return Err(EvalError::FileTooLarge {
                    path: path.clone(),
                    size: meta.len(),
                });
            }
            let bytes = std::fs::read(&full).map_err(read_error)?;
            String::from_utf8(bytes).map_err(|_| EvalError::FileNotText { path: path.clone() })
        });
        match text {
            Ok(text) => out.replace_range(span, &quote(&text)),
            Err(message) => problems.push(problem(at, message)),
        }
    }
    if problems.is_empty() {
        Ok(out)
    } else {
        Err(problems)
    }
}

/// `text` as a one-line HCL string literal whose value is `text` exactly.
fn quote(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '$' | '%' if chars.peek() == Some(&'{') => {
                out.push(c);
                out.push(c);
            }
            c if c.is_control() => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}
