//! HCL2 expression evaluation as Nomad's jobspec parser does it: `var.x` / `local.x`
//! references and the function library of [`super::functions`], in a [`Scope`] that
//! [`super::variables`] fills from the `variable` and `locals` blocks and that
//! [`super::string_template`] uses for strings with `${…}` and `%{…}`.
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
use hcl_edit::visit::Visit;
use serde::{Deserialize, Serialize};

use super::location::{LineIndex, SyntaxProblem, problem};

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
    /// `others`: ", or use one of the declared variables (a, b)", or nothing.
    #[error("var.{name} is not declared: add a variable \"{name}\" block{others}")]
    UndeclaredVariable { name: String, others: String },
    /// `others`: " (defined: a, b)", or nothing.
    #[error("local.{name} is not defined in a locals block{others}")]
    UndefinedLocal { name: String, others: String },
    #[error(
        "the expression cannot be evaluated: its arithmetic divides by zero, overflows or \
         gives a number that is not finite"
    )]
    Panicked,
    /// A reference to a variable or local whose own problem is already reported.
    #[error("refers to a variable or local that has no value (see its own problem)")]
    Unresolved,
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
    #[error(
        "the value nests lists and objects more than {MAX_VALUE_DEPTH} levels deep; berth \
         allows {MAX_VALUE_DEPTH}"
    )]
    ValueTooDeep,
    #[error(
        "a list or object of the value holds more than {} elements; berth allows {}",
        super::functions::MAX_ITEMS,
        super::functions::MAX_ITEMS
    )]
    TooManyItems,
    #[error("cannot put {kind} in a string")]
    NotText { kind: &'static str },
    #[error(
        "a template directive (%{{ if }} / %{{ for }}) mixed with run-time variables is not \
         supported"
    )]
    DirectiveAtRunTime,
    #[error(transparent)]
    TooDeep(#[from] super::nesting::TooDeep),
    #[error(transparent)]
    Budget(#[from] super::budget::BudgetSpent),
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
    pub(super) ctx: Context<'static>,
    /// What a reference to each variable and local copies (`value_size`), by
    /// `(is a local, name)`: every variable and local that has a value.
    pub(super) sizes: BTreeMap<(bool, String), usize>,
    pub(super) references: usize,
    /// The iterators of the `dynamic` blocks being expanded, innermost last.
    pub(super) iterators: Vec<String>,
    /// Blocks made by `dynamic` blocks so far.
    dynamic_blocks: usize,
    /// Variables and locals that are declared and have no value: their problem is
    /// reported where they are declared, and what refers to them fails without another
    /// ([`EvalError::Unresolved`]).
    pub(super) unresolved: BTreeSet<(bool, String)>,
    /// Whether every variable and local of the jobspec is known, so that a reference to
    /// any other is refused with its name (a default's or a var file's scope has none).
    pub(super) complete: bool,
}

/// What names a reference or interpolation uses, outside `for` variables.
#[derive(Default)]
pub(super) struct Roots {
    names: BTreeSet<String>,
    /// `local.<name>` references.
    pub(super) locals: BTreeSet<String>,
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

/// What evaluating one expression node in a loop is taken to build, at least (a value
/// and its slot): a loop body of numbers and names builds no string, yet a literal
/// tuple of 100,000 of them run 1,024 times held the agent for seconds and 700 MB.
const LOOPED_NODE_BYTES: usize = 16;

impl Visit for Roots {
    fn visit_expr(&mut self, node: &Expression) {
        self.literal(LOOPED_NODE_BYTES);
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

pub(super) fn roots_of(expr: &Expression) -> Roots {
    let mut roots = Roots::default();
    roots.visit_expr(expr);
    roots
}

/// Whether every variable `roots` names is known at parse time: `var`, `local`, and the
/// iterators of the `dynamic` blocks around.
pub(super) fn evaluable(roots: &Roots, iterators: &[String]) -> bool {
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
            unresolved: BTreeSet::new(),
            complete: false,
        }
    }

    /// Whether evaluation reached one of its bounds (the evaluation budget, the
    /// references, the dynamic blocks): the jobspec is refused for it, and what was
    /// evaluated is not worth reading further.
    pub fn bound_reached(&self) -> bool {
        self.references > MAX_REFERENCES
            || self.dynamic_blocks > MAX_DYNAMIC_BLOCKS
            || super::budget::refused().is_some()
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
        self.check_references(&roots)?;
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
        super::budget::charge(copies).map_err(EvalError::Budget)?;
        let expr = hcl::Expression::from(expr.clone());
        let value = guarded(|| expr.evaluate(&self.ctx).map_err(|e| explain(&e)))?;
        // Each expression nests at most `MAX_NESTING`, but locals built on locals nest
        // their values further; what the agent later walks (shaping the job as JSON, on
        // an async worker's small stack) must stay shallow.
        if nests_deeper_than(&value, MAX_VALUE_DEPTH) {
            return Err(EvalError::ValueTooDeep);
        }
        Ok(value)
    }

    /// Refuses a reference to a variable or local that has no value, naming it when it
    /// is not declared at all.
    fn check_references(&self, roots: &Roots) -> Result<(), EvalError> {
        if !self.complete {
            return Ok(());
        }
        for (local, name, _) in &roots.referenced {
            let key = (*local, name.clone());
            if self.sizes.contains_key(&key) {
                continue;
            }
            if self.unresolved.contains(&key) {
                return Err(EvalError::Unresolved);
            }
            let known: Vec<&str> = self
                .sizes
                .keys()
                .chain(&self.unresolved)
                .filter(|(l, _)| l == local)
                .map(|(_, n)| n.as_str())
                .collect();
            let known = known.join(", ");
            return Err(if *local {
                EvalError::UndefinedLocal {
                    name: name.clone(),
                    others: if known.is_empty() {
                        String::new()
                    } else {
                        format!(" (defined: {known})")
                    },
                }
            } else {
                EvalError::UndeclaredVariable {
                    name: name.clone(),
                    others: if known.is_empty() {
                        String::new()
                    } else {
                        format!(", or use one of the declared variables ({known})")
                    },
                }
            });
        }
        Ok(())
    }

    /// Remembers what a reference to each of `values` copies.
    pub(super) fn record_sizes(&mut self, local: bool, values: &hcl::Map<String, hcl::Value>) {
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
}

thread_local! {
    /// Whether this thread is inside [`guarded`].
    static GUARDED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs an hcl-rs evaluation, a panic in it becoming [`EvalError::Panicked`]: its
/// arithmetic panics on what a job author may write (`1 % 0`, an integer overflow, a
/// result that is not finite). The panic is not printed: it is the jobspec's problem.
fn guarded(
    evaluate: impl FnOnce() -> Result<hcl::Value, EvalError>,
) -> Result<hcl::Value, EvalError> {
    static QUIET: std::sync::Once = std::sync::Once::new();
    QUIET.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !GUARDED.with(|g| g.get()) {
                previous(info);
            }
        }));
    });
    let outer = GUARDED.with(|g| g.replace(true));
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(evaluate));
    GUARDED.with(|g| g.set(outer));
    result.unwrap_or(Err(EvalError::Panicked))
}

/// An hcl-rs evaluation error in a user's words.
fn explain(error: &hcl::eval::Error) -> EvalError {
    match error.kind() {
        hcl::eval::ErrorKind::UndefinedFunc(name) => EvalError::UnknownFunction {
            name: name.to_string(),
        },
        kind => {
            // hcl-rs shows the whole expression, and values in it: a jobspec of 2 MB
            // would get a message of 2 MB. A few lines are enough to find it.
            let mut text = shortened(&kind.to_string(), 400);
            if let Some(expr) = error.expr() {
                text.push_str(&format!(
                    " in expression `{}`",
                    shortened(&expr.to_string(), 200)
                ));
            }
            EvalError::Hcl(text)
        }
    }
}

/// `text`, cut to at most `most` bytes (at a character boundary) with an ellipsis.
fn shortened(text: &str, most: usize) -> String {
    if text.len() <= most {
        return text.to_string();
    }
    let mut end = most;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

/// Refuses a value larger than [`MAX_VALUE_BYTES`] as JSON.
pub(super) fn bounded(value: &hcl::Value) -> Result<(), EvalError> {
    if nests_deeper_than(value, MAX_VALUE_DEPTH) {
        return Err(EvalError::ValueTooDeep);
    }
    // A `for` over a variable or local is costed as running at most `MAX_ITEMS` times
    // (`Roots::iterations`), as over a function's result: so none holds more.
    if holds_too_many_items(value) {
        return Err(EvalError::TooManyItems);
    }
    let size = serde_json::to_vec(&super::functions::to_json(value))
        .map(|v| v.len())
        .unwrap_or(usize::MAX);
    if size > MAX_VALUE_BYTES {
        return Err(EvalError::TooLarge { size });
    }
    Ok(())
}

/// How deep an evaluated value may nest lists and objects: far beyond any driver's
/// config, and shallow enough for every walk of it (JSON shapes, serde_json's reading of
/// stored records, which stops at 128).
pub const MAX_VALUE_DEPTH: usize = 64;

/// Whether `value` nests lists and objects more than `limit` levels deep; it looks no
/// deeper than `limit + 1` levels.
fn nests_deeper_than(value: &hcl::Value, limit: usize) -> bool {
    let children: Box<dyn Iterator<Item = &hcl::Value>> = match value {
        hcl::Value::Array(items) => Box::new(items.iter()),
        hcl::Value::Object(items) => Box::new(items.values()),
        _ => return false,
    };
    match limit.checked_sub(1) {
        None => true,
        Some(below) => children
            .into_iter()
            .any(|child| nests_deeper_than(child, below)),
    }
}

/// Whether a list or object anywhere in `value` holds more than `MAX_ITEMS` elements
/// (`value` nests at most `MAX_VALUE_DEPTH` levels: checked first).
fn holds_too_many_items(value: &hcl::Value) -> bool {
    match value {
        hcl::Value::Array(items) => {
            items.len() > super::functions::MAX_ITEMS || items.iter().any(holds_too_many_items)
        }
        hcl::Value::Object(items) => {
            items.len() > super::functions::MAX_ITEMS || items.values().any(holds_too_many_items)
        }
        _ => false,
    }
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
    let lines = LineIndex::new(source);
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
