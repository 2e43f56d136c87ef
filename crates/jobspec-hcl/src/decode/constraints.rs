//! The `constraint` blocks of a job, a group or a task.

use berth_hcl::fields::Fields;
use berth_jobspec::fields as schema;

use crate::Findings;
use berth_jobspec::*;

/// The operators of Nomad's constraints.
pub const CONSTRAINT_OPERATORS: &[&str] = &[
    "=",
    "==",
    "is",
    "!=",
    "not",
    ">",
    ">=",
    "<",
    "<=",
    "regexp",
    "version",
    "semver",
    "set_contains",
    "set_contains_all",
    "set_contains_any",
    "distinct_hosts",
    "distinct_property",
    "is_set",
    "is_not_set",
];

pub(super) fn constraints(fields: &mut Fields, problems: &mut Findings) -> Vec<Constraint> {
    let path = format!("{}.constraint", fields.path);
    fields
        .blocks("constraint")
        .into_iter()
        .map(|block| {
            let mut c = Fields::new(
                &block.body,
                path.clone(),
                block.at,
                &[
                    schema::constraint::ATTRIBUTE.hcl,
                    schema::constraint::OPERATOR.hcl,
                    schema::constraint::VALUE.hcl,
                    "distinct_hosts",
                    "distinct_property",
                ],
            );
            let attribute = c
                .string(schema::constraint::ATTRIBUTE.hcl, problems)
                .unwrap_or_default();
            let mut operator = c
                .string(schema::constraint::OPERATOR.hcl, problems)
                .unwrap_or_else(|| "=".into());
            let mut value = c
                .string(schema::constraint::VALUE.hcl, problems)
                .unwrap_or_default();
            if c.bool("distinct_hosts", problems).unwrap_or(false) {
                operator = "distinct_hosts".into();
            }
            if let Some(property) = c.string("distinct_property", problems) {
                operator = "distinct_property".into();
                value = property;
            }
            if !CONSTRAINT_OPERATORS.contains(&operator.as_str()) {
                c.problem_with(
                    problems,
                    schema::constraint::OPERATOR.hcl,
                    format!(
                        "unknown constraint operator {operator:?} (Nomad's are: {})",
                        CONSTRAINT_OPERATORS.join(", ")
                    ),
                );
            }
            let needs_attribute =
                !matches!(operator.as_str(), "distinct_hosts" | "distinct_property");
            if needs_attribute
                && attribute.is_empty()
                && !c.failed(schema::constraint::ATTRIBUTE.hcl)
            {
                c.problem_with(
                    problems,
                    schema::constraint::ATTRIBUTE.hcl,
                    "a constraint needs an attribute, as attribute = \"${attr.kernel.name}\""
                        .into(),
                );
            }
            if operator == "regexp"
                && let Err(error) = regex::Regex::new(&value)
            {
                c.problem_with(
                    problems,
                    schema::constraint::VALUE.hcl,
                    format!("{value:?} is not a regular expression: {error}"),
                );
            }
            c.finish(problems);
            Constraint {
                attribute,
                operator,
                value,
                at: block.at,
                path: path.clone(),
            }
        })
        .collect()
}
