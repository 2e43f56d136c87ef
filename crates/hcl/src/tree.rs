//! HCL into a small tree that remembers where everything was written.
//!
//! hcl-edit parses with spans; this module keeps only what jobspecs use (attributes with
//! literal values, blocks with labels) and the line and column of each, so every later
//! error can point at the file. Without a scope (agent config, volume specs) expressions
//! other than literals are refused here, with their location, rather than
//! half-evaluated. A jobspec is evaluated as it is read ([`super::variables`],
//! [`super::eval`], [`super::string_template`]); an expression that cannot be evaluated
//! is reported and stands in the tree as [`Value::Failed`], so that reading goes on and
//! later problems are found too.

use hcl_edit::Span as _;
use hcl_edit::expr::{Expression, ObjectKey};
use hcl_edit::structure::{Body, Structure};

use super::eval::{EvalError, Scope, VariableInputs};
use super::location::LineIndex;
use super::location::{Location, SyntaxProblem};

#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Null,
    Bool(bool),
    Number(serde_json::Number),
    String(String),
    Array(Vec<Located<Value>>),
    Object(Vec<(String, Located<Value>)>),
    /// An expression that could not be evaluated. Its problem is reported where it is
    /// written; whoever reads the value says nothing more of it.
    Failed,
}

impl Value {
    /// The kind of value, for "expected a string, found a number".
    pub fn kind(&self) -> &'static str {
        match self {
            Value::Null => "null",
            Value::Bool(_) => "a bool",
            Value::Number(_) => "a number",
            Value::String(_) => "a string",
            Value::Array(_) => "a list",
            Value::Object(_) => "an object",
            Value::Failed => "a value that could not be evaluated",
        }
    }

    /// Whether the value could not be evaluated (its problem is reported already).
    pub fn is_failed(&self) -> bool {
        matches!(self, Value::Failed)
    }

    pub fn to_json(&self) -> serde_json::Value {
        match self {
            Value::Null | Value::Failed => serde_json::Value::Null,
            Value::Bool(b) => serde_json::Value::Bool(*b),
            Value::Number(n) => serde_json::Value::Number(n.clone()),
            Value::String(s) => serde_json::Value::String(s.clone()),
            Value::Array(items) => items.iter().map(|i| i.value.to_json()).collect(),
            Value::Object(fields) => fields
                .iter()
                .map(|(k, v)| (k.clone(), v.value.to_json()))
                .collect(),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Located<T> {
    pub value: T,
    pub at: Location,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Attr {
    pub name: String,
    pub value: Located<Value>,
    pub at: Location,
}

#[derive(Debug, Clone, PartialEq)]
pub struct BlockNode {
    pub kind: String,
    pub labels: Vec<String>,
    pub body: BodyNode,
    pub at: Location,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct BodyNode {
    pub attrs: Vec<Attr>,
    pub blocks: Vec<BlockNode>,
    /// The kinds of the `dynamic` blocks that could not be expanded (their problem is
    /// reported): the body may have been meant to hold blocks of these kinds.
    pub unmade: Vec<String>,
}

impl BodyNode {
    /// Whether the body holds a block of `kind`, or a `dynamic` block meant to make some.
    pub fn writes_block(&self, kind: &str) -> bool {
        self.blocks.iter().any(|b| b.kind == kind) || self.unmade.iter().any(|k| k == kind)
    }
}

/// A jobspec's tree, evaluated, with the problems evaluation found.
#[derive(Debug)]
pub struct Evaluated {
    pub tree: BodyNode,
    pub problems: Vec<SyntaxProblem>,
    /// Evaluation reached one of its bounds (budget, references, dynamic blocks): the
    /// jobspec is refused for it alone, and the tree is not read further.
    pub bound_reached: bool,
}

/// Parses `source` with literal values only (agent config, volume specs), reporting every
/// unsupported expression (not only the first).
pub fn parse(source: &str) -> Result<BodyNode, Vec<SyntaxProblem>> {
    let body = syntax(source)?;
    let lines = LineIndex::new(source);
    let mut problems = Vec::new();
    let mut reader = Reader {
        lines: &lines,
        source,
        scope: None,
        problems: &mut problems,
        path: Vec::new(),
    };
    let tree = convert_body(&body, &mut reader);
    if problems.is_empty() {
        Ok(tree)
    } else {
        Err(problems)
    }
}

/// Parses a jobspec: HCL2 with variables, locals and functions. Only a syntax error is
/// an `Err`: what cannot be evaluated is in [`Evaluated::problems`], every one of them.
///
/// The text comes from a job author, who is not trusted: it is evaluated within the
/// caller's [`super::budget::BudgetScope`], or within the default budget when the caller
/// set none, never unbounded.
pub fn parse_evaluated(
    source: &str,
    inputs: &VariableInputs,
) -> Result<Evaluated, Vec<SyntaxProblem>> {
    let _budget = (!super::budget::in_force()).then(super::budget::BudgetScope::start);
    let mut body = syntax(source)?;
    let lines = LineIndex::new(source);
    let mut problems = Vec::new();
    let mut scope =
        super::variables::scope_of(&mut body, inputs, &|span| lines.at(span), &mut problems);
    let mut reader = Reader {
        lines: &lines,
        source,
        scope: Some(&mut scope),
        problems: &mut problems,
        path: Vec::new(),
    };
    let tree = convert_body(&body, &mut reader);
    Ok(Evaluated {
        tree,
        bound_reached: scope.bound_reached(),
        problems,
    })
}

/// hcl-edit's tree, or the syntax error with its place. A tree nested deeper than
/// [`super::nesting::MAX_NESTING`] is refused here, before anything walks or evaluates it.
fn syntax(source: &str) -> Result<Body, Vec<SyntaxProblem>> {
    let body = hcl_edit::parser::parse_body(source).map_err(|error| {
        let location = error.location();
        vec![super::location::problem(
            Location {
                line: location.line(),
                column: location.column(),
            },
            error.message(),
        )]
    })?;
    super::nesting::check_body(&body, &LineIndex::new(source))
        .map_err(|too_deep| vec![too_deep])?;
    Ok(body)
}

/// Converts hcl-edit's tree, evaluating with `scope` when there is one.
struct Reader<'a> {
    lines: &'a LineIndex,
    source: &'a str,
    scope: Option<&'a mut Scope>,
    problems: &'a mut Vec<SyntaxProblem>,
    /// Where the reader is, as the decoder names it: `job`, `web`, `group`, `g`, …
    path: Vec<String>,
}

impl Reader<'_> {
    /// Reports a problem at `at`, under the current path and `field` (when not empty).
    fn problem(&mut self, at: Location, field: &str, message: impl ToString) {
        let mut path = self.path.join(".");
        if !field.is_empty() {
            if !path.is_empty() {
                path.push('.');
            }
            path.push_str(field);
        }
        self.problems.push(SyntaxProblem {
            at,
            path,
            message: message.to_string(),
        });
    }

    /// Reads `body` with `segments` added to the path.
    fn within<T>(&mut self, segments: &[String], read: impl FnOnce(&mut Self) -> T) -> T {
        let depth = self.path.len();
        self.path.extend(segments.iter().cloned());
        let out = read(self);
        self.path.truncate(depth);
        out
    }
}

fn convert_body(body: &Body, reader: &mut Reader) -> BodyNode {
    let lines = reader.lines;
    let mut node = BodyNode::default();
    for structure in body.iter() {
        match structure {
            Structure::Attribute(attr) => {
                let at = lines.at(attr.span());
                let name = attr.key.as_str().to_string();
                let value = reader.within(std::slice::from_ref(&name), |r| {
                    convert_expr(&attr.value, r)
                });
                node.attrs.push(Attr { name, value, at });
            }
            Structure::Block(block)
                if block.ident.as_str() == "dynamic" && reader.scope.is_some() =>
            {
                expand_dynamic(block, reader, &mut node);
            }
            Structure::Block(block) => {
                let labels: Vec<String> = block
                    .labels
                    .iter()
                    .map(|l| l.as_str().to_string())
                    .collect();
                let kind = block.ident.as_str().to_string();
                let mut segments = vec![kind.clone()];
                segments.extend(labels.iter().cloned());
                let body = reader.within(&segments, |r| convert_body(&block.body, r));
                node.blocks.push(BlockNode {
                    kind,
                    labels,
                    body,
                    at: lines.at(block.span()),
                });
            }
        }
    }
    node
}

/// A `dynamic "KIND" { for_each, iterator, labels, content { ... } }` block, as HCL2 has
/// it: one `KIND` block per element of `for_each`, its `content` evaluated with the
/// iterator (`KIND` unless named) holding the element's `key` and `value`. What it makes
/// goes into `node`; when it cannot be expanded, its problem is reported and `node`
/// remembers that it meant to make blocks of `KIND` ([`BodyNode::unmade`]).
fn expand_dynamic(block: &hcl_edit::structure::Block, reader: &mut Reader, node: &mut BodyNode) {
    let lines = reader.lines;
    let at = lines.at(block.span());
    let [kind] = block.labels.as_slice() else {
        return reader.problem(
            at,
            "dynamic",
            "a dynamic block takes one label: the kind of block it makes (dynamic \"task\")",
        );
    };
    let kind = kind.as_str().to_string();
    let field = format!("dynamic.{kind}");
    let fail = |reader: &mut Reader, node: &mut BodyNode, message: String| {
        reader.problem(at, &field, message);
        node.unmade.push(kind.clone());
    };
    let mut for_each = None;
    let mut iterator = kind.clone();
    let mut labels = Vec::new();
    let mut content = None;
    for structure in block.body.iter() {
        match structure {
            Structure::Attribute(attr) => match attr.key.as_str() {
                "for_each" => for_each = Some(&attr.value),
                "iterator" => match &attr.value {
                    Expression::Variable(name) => iterator = name.as_str().to_string(),
                    _ => return fail(reader, node, "iterator must be a bare name".into()),
                },
                "labels" => match &attr.value {
                    Expression::Array(items) => labels = items.iter().collect(),
                    _ => return fail(reader, node, "labels must be a list".into()),
                },
                other => {
                    return fail(
                        reader,
                        node,
                        format!(
                            "unknown attribute {other:?} in a dynamic block (use for_each, \
                             iterator, labels and a content block)"
                        ),
                    );
                }
            },
            Structure::Block(inner) if inner.ident.as_str() == "content" => content = Some(inner),
            Structure::Block(inner) => {
                return fail(
                    reader,
                    node,
                    format!(
                        "a dynamic block holds a content block, not {:?}",
                        inner.ident.as_str()
                    ),
                );
            }
        }
    }
    let (Some(for_each), Some(content)) = (for_each, content) else {
        return fail(
            reader,
            node,
            "a dynamic block needs for_each and a content block".into(),
        );
    };
    let Some(scope) = reader.scope.as_deref_mut() else {
        return;
    };
    if scope.is_iterating(&iterator) {
        return fail(
            reader,
            node,
            format!("nested dynamic blocks need different iterators; {iterator:?} is taken"),
        );
    }
    let items: Vec<(hcl::Value, hcl::Value)> = match scope
        .count(for_each)
        .and_then(|()| scope.evaluate(for_each))
    {
        Ok(hcl::Value::Array(items)) => items
            .into_iter()
            .enumerate()
            .map(|(i, v)| (hcl::Value::from(i as u64), v))
            .collect(),
        Ok(hcl::Value::Object(map)) => map
            .into_iter()
            .map(|(k, v)| (hcl::Value::String(k), v))
            .collect(),
        Ok(other) => {
            return fail(
                reader,
                node,
                format!("for_each must be a list, a set or a map, not {other}"),
            );
        }
        Err(EvalError::Unresolved) => return node.unmade.push(kind.clone()),
        Err(error) => return fail(reader, node, format!("for_each: {error}")),
    };
    if let Some(scope) = reader.scope.as_deref_mut()
        && let Err(error) = scope.count_dynamic_blocks(items.len())
    {
        return fail(reader, node, error.to_string());
    }
    for (key, value) in items {
        if let Some(scope) = reader.scope.as_deref_mut() {
            scope.enter_iterator(&iterator, key, value);
        }
        let mut block_labels = Vec::new();
        let mut labelled = true;
        for label in &labels {
            match reader
                .within(std::slice::from_ref(&field), |r| convert_expr(label, r))
                .value
            {
                Value::String(text) => block_labels.push(text),
                Value::Number(n) => block_labels.push(n.to_string()),
                Value::Failed => labelled = false,
                _ => {
                    labelled = false;
                    reader.problem(
                        lines.at(label.span()),
                        &field,
                        "a dynamic block's labels must be strings",
                    );
                }
            }
        }
        let mut segments = vec![kind.clone()];
        segments.extend(block_labels.iter().cloned());
        let body = reader.within(&segments, |r| convert_body(&content.body, r));
        if let Some(scope) = reader.scope.as_deref_mut() {
            scope.leave_iterator();
        }
        // A block without its labels would only draw problems of its own.
        if labelled {
            node.blocks.push(BlockNode {
                kind: kind.clone(),
                labels: block_labels,
                body,
                at,
            });
        } else if !node.unmade.contains(&kind) {
            node.unmade.push(kind.clone());
        }
    }
}

fn convert_expr(expr: &Expression, reader: &mut Reader) -> Located<Value> {
    let lines = reader.lines;
    let at = lines.at(expr.span());
    if let Some(scope) = reader.scope.as_deref_mut() {
        let source = reader.source;
        let template = |scope: &mut Scope, template| {
            scope
                .count(expr)
                .and_then(|()| super::string_template::render(scope, template, expr, source))
                .map(Value::String)
        };
        let evaluated = match expr {
            Expression::StringTemplate(t) => Some(template(scope, t)),
            Expression::HeredocTemplate(heredoc) => Some(template(scope, &heredoc.template)),
            Expression::Variable(_)
            | Expression::Traversal(_)
            | Expression::FuncCall(_)
            | Expression::BinaryOp(_)
            | Expression::UnaryOp(_)
            | Expression::Conditional(_)
            | Expression::ForExpr(_) => Some(
                scope
                    .count(expr)
                    .and_then(|()| scope.evaluate(expr))
                    .map(|value| from_evaluated(&value, at)),
            ),
            _ => None,
        };
        match evaluated {
            Some(Ok(value)) => return Located { value, at },
            // Reported where the variable or local it names is declared.
            Some(Err(EvalError::Unresolved)) => {
                return Located {
                    value: Value::Failed,
                    at,
                };
            }
            Some(Err(message)) => {
                reader.problem(at, "", message);
                return Located {
                    value: Value::Failed,
                    at,
                };
            }
            None => {}
        }
    }
    let value = match expr {
        Expression::Null(_) => Value::Null,
        Expression::Bool(b) => Value::Bool(*b.value()),
        Expression::Number(n) => {
            let number = n.value();
            let json = if let Some(i) = number.as_i64() {
                serde_json::Number::from(i)
            } else if let Some(u) = number.as_u64() {
                serde_json::Number::from(u)
            } else {
                number
                    .as_f64()
                    .and_then(serde_json::Number::from_f64)
                    .unwrap_or_else(|| 0.into())
            };
            Value::Number(json)
        }
        Expression::String(s) => Value::String(s.value().to_string()),
        // Templates keep their text: `${NOMAD_TASK_DIR}`-style references are resolved
        // at run time by the agent, not by the parser.
        Expression::StringTemplate(template) => {
            let text = template.to_string();
            Value::String(text.trim_matches('"').to_string())
        }
        Expression::HeredocTemplate(heredoc) => Value::String(heredoc.template.to_string()),
        Expression::Array(array) => Value::Array(
            array
                .iter()
                .map(|item| convert_expr(item, reader))
                .collect(),
        ),
        Expression::Object(object) => {
            let mut fields = Vec::new();
            for (key, value) in object.iter() {
                let name = match key {
                    ObjectKey::Ident(ident) => ident.as_str().to_string(),
                    ObjectKey::Expression(Expression::String(s)) => s.value().to_string(),
                    ObjectKey::Expression(other) => {
                        reader.problem(
                            lines.at(other.span()),
                            "",
                            "object keys must be names or plain strings",
                        );
                        continue;
                    }
                };
                let value = reader.within(std::slice::from_ref(&name), |r| {
                    convert_expr(value.expr(), r)
                });
                fields.push((name, value));
            }
            Value::Object(fields)
        }
        Expression::Parenthesis(inner) => return convert_expr(inner.inner(), reader),
        _ => {
            reader.problem(
                at,
                "",
                "only literal values are supported here (strings, numbers, bools, lists, objects)",
            );
            Value::Null
        }
    };
    Located { value, at }
}

/// An evaluated value, every part of it at the place of the expression.
fn from_evaluated(value: &hcl::Value, at: Location) -> Value {
    let located = |v: &hcl::Value| Located {
        value: from_evaluated(v, at),
        at,
    };
    match value {
        hcl::Value::Null => Value::Null,
        hcl::Value::Bool(b) => Value::Bool(*b),
        hcl::Value::Number(n) => match super::functions::number_json(n) {
            serde_json::Value::Number(n) => Value::Number(n),
            _ => Value::Null,
        },
        hcl::Value::String(s) => Value::String(s.clone()),
        hcl::Value::Array(items) => Value::Array(items.iter().map(located).collect()),
        hcl::Value::Object(fields) => Value::Object(
            fields
                .iter()
                .map(|(k, v)| (k.clone(), located(v)))
                .collect(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A caller of the crate that sets no budget of its own still gets one: a jobspec
    /// that would build 2 x 20 MB from a 20 KB literal in loops is refused for it, with
    /// nothing built (the budget is charged before).
    #[test]
    fn an_evaluation_without_a_callers_budget_is_bounded_all_the_same() {
        assert!(!crate::budget::in_force());
        let body = "X".repeat(20_000);
        let looped = format!(
            "meta = {{\n  x = \"%{{for a in range(1000)}}{body}%{{endfor}}\"\n  y = join(\",\", [for a in range(1000) : \"{body}\"])\n}}\n"
        );
        let evaluated = parse_evaluated(&looped, &VariableInputs::default()).unwrap();
        assert!(evaluated.bound_reached);
        let spent = crate::budget::BudgetSpent::Memory.to_string();
        let refused = evaluated
            .problems
            .iter()
            .filter(|p| p.message.contains(&spent))
            .count();
        assert_eq!(refused, 2, "{:?}", evaluated.problems);
        // The scope it made ended with it.
        assert!(!crate::budget::in_force());
    }

    #[test]
    fn keeps_locations_of_attributes_and_blocks() {
        let tree =
            parse("job \"web\" {\n  type = \"batch\"\n  group \"g\" { count = 2 }\n}\n").unwrap();
        let job = &tree.blocks[0];
        assert_eq!(
            (job.kind.as_str(), job.labels.as_slice()),
            ("job", ["web".to_string()].as_slice())
        );
        assert_eq!(job.at, Location { line: 1, column: 1 });
        assert_eq!(job.body.attrs[0].at, Location { line: 2, column: 3 });
        assert_eq!(
            job.body.blocks[0].body.attrs[0].value.value,
            Value::Number(2.into())
        );
    }

    #[test]
    fn refuses_expressions_with_their_location() {
        let problems = parse("a = 1\nb = var.x\n").unwrap_err();
        assert_eq!(problems.len(), 1);
        assert_eq!(problems[0].at.line, 2);
    }

    #[test]
    fn syntax_errors_carry_line_and_column() {
        let problems = parse("job \"x\" {\n  type = \n}\n").unwrap_err();
        assert_eq!(problems[0].at.line, 2);
    }

    #[test]
    fn templates_keep_their_text() {
        let tree = parse("a = \"${NOMAD_TASK_DIR}/x\"\n").unwrap();
        assert_eq!(
            tree.attrs[0].value.value,
            Value::String("${NOMAD_TASK_DIR}/x".into())
        );
    }
}
