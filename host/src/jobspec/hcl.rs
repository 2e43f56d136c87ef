//! HCL into a small tree that remembers where everything was written.
//!
//! hcl-edit parses with spans; this module keeps only what jobspecs use (attributes with
//! literal values, blocks with labels) and the line and column of each, so every later
//! error can point at the file. Expressions other than literals are refused here, with
//! their location, rather than half-evaluated.

use hcl_edit::Span as _;
use hcl_edit::expr::{Expression, ObjectKey};
use hcl_edit::structure::{Body, Structure};

/// A 1-based line and column in the jobspec file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Location {
    pub line: usize,
    pub column: usize,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Null,
    Bool(bool),
    Number(serde_json::Number),
    String(String),
    Array(Vec<Located<Value>>),
    Object(Vec<(String, Located<Value>)>),
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
        }
    }

    pub fn to_json(&self) -> serde_json::Value {
        match self {
            Value::Null => serde_json::Value::Null,
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
}

/// A problem found while reading the HCL itself.
#[derive(Debug, Clone, PartialEq)]
pub struct SyntaxProblem {
    pub at: Location,
    pub message: String,
}

/// Parses `source` with literal values only (agent config, volume specs), reporting every
/// unsupported expression (not only the first).
pub fn parse(source: &str) -> Result<BodyNode, Vec<SyntaxProblem>> {
    parse_in(source, None)
}

/// Parses a jobspec: HCL2 with variables, locals and functions ([`super::eval`]).
pub fn parse_evaluated(
    source: &str,
    inputs: &super::eval::VariableInputs,
) -> Result<BodyNode, Vec<SyntaxProblem>> {
    parse_in(source, Some(inputs))
}

fn parse_in(
    source: &str,
    inputs: Option<&super::eval::VariableInputs>,
) -> Result<BodyNode, Vec<SyntaxProblem>> {
    let mut body = hcl_edit::parser::parse_body(source).map_err(|error| {
        let location = error.location();
        vec![SyntaxProblem {
            at: Location {
                line: location.line(),
                column: location.column(),
            },
            message: error.message().to_string(),
        }]
    })?;
    let lines = LineIndex::new(source);
    let mut problems = Vec::new();
    let mut scope = inputs.map(|inputs| {
        super::eval::Scope::build(&mut body, inputs, &|span| lines.at(span), &mut problems)
    });
    let mut reader = Reader {
        lines: &lines,
        source,
        scope: scope.as_mut(),
        problems: &mut problems,
    };
    let tree = reader.body(&body);
    if problems.is_empty() {
        Ok(tree)
    } else {
        Err(problems)
    }
}

/// Converts hcl-edit's tree, evaluating with `scope` when there is one.
struct Reader<'a> {
    lines: &'a LineIndex,
    source: &'a str,
    scope: Option<&'a mut super::eval::Scope>,
    problems: &'a mut Vec<SyntaxProblem>,
}

impl Reader<'_> {
    fn body(&mut self, body: &Body) -> BodyNode {
        convert_body(body, self)
    }
}

fn convert_body(body: &Body, reader: &mut Reader) -> BodyNode {
    let lines = reader.lines;
    let mut node = BodyNode::default();
    for structure in body.iter() {
        match structure {
            Structure::Attribute(attr) => {
                let at = lines.at(attr.span());
                let value = convert_expr(&attr.value, reader);
                node.attrs.push(Attr {
                    name: attr.key.as_str().to_string(),
                    value,
                    at,
                });
            }
            Structure::Block(block)
                if block.ident.as_str() == "dynamic" && reader.scope.is_some() =>
            {
                node.blocks.extend(expand_dynamic(block, reader));
            }
            Structure::Block(block) => {
                let labels = block
                    .labels
                    .iter()
                    .map(|l| l.as_str().to_string())
                    .collect();
                node.blocks.push(BlockNode {
                    kind: block.ident.as_str().to_string(),
                    labels,
                    body: convert_body(&block.body, reader),
                    at: lines.at(block.span()),
                });
            }
        }
    }
    node
}

/// A `dynamic "KIND" { for_each, iterator, labels, content { ... } }` block, as HCL2 has
/// it: one `KIND` block per element of `for_each`, its `content` evaluated with the
/// iterator (`KIND` unless named) holding the element's `key` and `value`.
fn expand_dynamic(block: &hcl_edit::structure::Block, reader: &mut Reader) -> Vec<BlockNode> {
    let lines = reader.lines;
    let at = lines.at(block.span());
    let fail = |reader: &mut Reader, message: String| {
        reader.problems.push(SyntaxProblem { at, message });
        Vec::new()
    };
    let [kind] = block.labels.as_slice() else {
        return fail(
            reader,
            "a dynamic block takes one label: the kind of block it makes (dynamic \"task\")".into(),
        );
    };
    let kind = kind.as_str().to_string();
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
                    _ => return fail(reader, "iterator must be a bare name".into()),
                },
                "labels" => match &attr.value {
                    Expression::Array(items) => labels = items.iter().collect(),
                    _ => return fail(reader, "labels must be a list".into()),
                },
                other => {
                    return fail(
                        reader,
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
            "a dynamic block needs for_each and a content block".into(),
        );
    };
    let Some(scope) = reader.scope.as_deref_mut() else {
        return Vec::new();
    };
    if scope.is_iterating(&iterator) {
        return fail(
            reader,
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
                format!("for_each must be a list, a set or a map, not {other}"),
            );
        }
        Err(error) => return fail(reader, format!("for_each: {error}")),
    };
    if let Some(scope) = reader.scope.as_deref_mut()
        && let Err(error) = scope.count_dynamic_blocks(items.len())
    {
        return fail(reader, error.to_string());
    }
    let mut made = Vec::new();
    for (key, value) in items {
        if let Some(scope) = reader.scope.as_deref_mut() {
            scope.enter_iterator(&iterator, key, value);
        }
        let mut block_labels = Vec::new();
        for label in &labels {
            match convert_expr(label, reader).value {
                Value::String(text) => block_labels.push(text),
                Value::Number(n) => block_labels.push(n.to_string()),
                _ => {
                    reader.problems.push(SyntaxProblem {
                        at: lines.at(label.span()),
                        message: "a dynamic block's labels must be strings".into(),
                    });
                }
            }
        }
        let body = convert_body(&content.body, reader);
        if let Some(scope) = reader.scope.as_deref_mut() {
            scope.leave_iterator();
        }
        made.push(BlockNode {
            kind: kind.clone(),
            labels: block_labels,
            body,
            at,
        });
    }
    made
}

fn convert_expr(expr: &Expression, reader: &mut Reader) -> Located<Value> {
    let lines = reader.lines;
    let at = lines.at(expr.span());
    if let Some(scope) = reader.scope.as_deref_mut() {
        let evaluated = match expr {
            Expression::StringTemplate(template) => Some(
                scope
                    .count(expr)
                    .and_then(|()| scope.template(template, expr, reader.source))
                    .map(Value::String),
            ),
            Expression::HeredocTemplate(heredoc) => Some(
                scope
                    .count(expr)
                    .and_then(|()| scope.template(&heredoc.template, expr, reader.source))
                    .map(Value::String),
            ),
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
            Some(Err(message)) => {
                reader.problems.push(SyntaxProblem {
                    at,
                    message: message.to_string(),
                });
                return Located {
                    value: Value::Null,
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
                        reader.problems.push(SyntaxProblem {
                            at: lines.at(other.span()),
                            message: "object keys must be names or plain strings".into(),
                        });
                        continue;
                    }
                };
                fields.push((name, convert_expr(value.expr(), reader)));
            }
            Value::Object(fields)
        }
        Expression::Parenthesis(inner) => return convert_expr(inner.inner(), reader),
        _ => {
            reader.problems.push(SyntaxProblem {
                at,
                message: "only literal values are supported here (strings, numbers, bools, lists, objects)".into(),
            });
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

/// Byte offsets to 1-based line and column.
pub(crate) struct LineIndex {
    starts: Vec<usize>,
}

impl LineIndex {
    pub(crate) fn new(source: &str) -> Self {
        let mut starts = vec![0];
        starts.extend(source.match_indices('\n').map(|(i, _)| i + 1));
        LineIndex { starts }
    }

    pub(crate) fn at(&self, span: Option<std::ops::Range<usize>>) -> Location {
        let Some(span) = span else {
            return Location::default();
        };
        let line = self.starts.partition_point(|&start| start <= span.start);
        Location {
            line,
            column: span.start - self.starts[line - 1] + 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
