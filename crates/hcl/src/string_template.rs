//! Strings with `${…}` interpolations and `%{if}` / `%{for}` directives: evaluated whole
//! when everything they name is known at parse time, else each `var` / `local`
//! interpolation evaluated and the rest kept as written for the task runner (a directive
//! cannot be split that way, so one mixed with run-time names is refused).

use hcl_edit::Span as _;
use hcl_edit::expr::Expression;

use super::eval::{EvalError, Scope, evaluable, roots_of};

/// A template's text, its `var`/`local` interpolations evaluated and the others kept
/// as written (`source` is the jobspec text the spans point into).
pub fn render(
    scope: &Scope,
    template: &hcl_edit::template::Template,
    whole: &Expression,
    source: &str,
) -> Result<String, EvalError> {
    let roots = roots_of(whole);
    if evaluable(&roots, &scope.iterators) {
        return match scope.evaluate(whole)? {
            hcl::Value::String(s) => Ok(s),
            other => Ok(other.to_string()),
        };
    }
    let mut out = String::new();
    for element in template.iter() {
        match element {
            hcl_edit::template::Element::Literal(literal) => out.push_str(literal.value()),
            hcl_edit::template::Element::Interpolation(interpolation) => {
                if scope.is_static(&interpolation.expr) {
                    match scope.evaluate(&interpolation.expr)? {
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
