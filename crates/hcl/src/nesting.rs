//! The bound on how deeply an HCL file nests, checked on the parsed tree before anything
//! is evaluated or converted.
//!
//! hcl-edit's parser bounds its own recursion (64 nested brackets, 128 chained binary
//! operators), but a chain of traversal operators (`x[*][*]…`, `x.a.b…`, `x[0][0]…`) is
//! parsed as one flat list, and hcl-rs's evaluator recurses once per operator: 2,200
//! `[*]` (a 9 KB jobspec) overflow an 8 MiB stack, which aborts the process (no
//! `catch_unwind` catches a stack overflow). Every level the evaluator and the tree
//! readers recurse through is counted here: each expression, each traversal operator,
//! each template interpolation and directive, each block.

use hcl_edit::Span as _;
use hcl_edit::expr::Expression;
use hcl_edit::structure::{Block, Body};
use hcl_edit::template::{Directive, Interpolation};
use hcl_edit::visit::{self, Visit};

use super::location::{LineIndex, SyntaxProblem, problem};

/// The deepest an HCL file may nest, in levels as [`Depth`] counts them. Jobspecs
/// written by people stay far below (Nomad's examples reach about 12).
pub const MAX_NESTING: usize = 128;

/// The refusal of a file that nests deeper than [`MAX_NESTING`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "nested more than {MAX_NESTING} levels deep (each block, bracket, call, operator and \
     template interpolation is a level, and so is each [*], [i] or .name after a value); \
     berth allows {MAX_NESTING}"
)]
pub struct TooDeep;

/// Refuses a body that nests deeper than [`MAX_NESTING`], at the place of the first
/// expression or block that does.
pub(crate) fn check_body(body: &Body, lines: &LineIndex) -> Result<(), SyntaxProblem> {
    let mut depth = Depth::default();
    depth.visit_body(body);
    match depth.too_deep {
        None => Ok(()),
        Some(span) => Err(problem(lines.at(span), TooDeep)),
    }
}

/// Refuses an expression that nests deeper than [`MAX_NESTING`] (a `-var` value, which
/// has no file to point into).
pub(crate) fn check_expr(expr: &Expression) -> Result<(), TooDeep> {
    let mut depth = Depth::default();
    depth.visit_expr(expr);
    match depth.too_deep {
        None => Ok(()),
        Some(_) => Err(TooDeep),
    }
}

/// Walks the tree counting levels. The walk itself recurses once per expression and
/// block: hcl-edit's parser bounds that (64 nested brackets, 128 chained operators), and
/// the walk stops going down at the first level past the bound.
#[derive(Default)]
struct Depth {
    levels: usize,
    /// The span of the first node past the bound.
    too_deep: Option<Option<std::ops::Range<usize>>>,
}

impl Depth {
    /// Visits what is below a node of `levels` levels at `span`, unless that passes the
    /// bound (then remembered) or the bound was passed already.
    fn within(
        &mut self,
        levels: usize,
        span: Option<std::ops::Range<usize>>,
        visit: impl FnOnce(&mut Self),
    ) {
        if self.too_deep.is_some() {
            return;
        }
        self.levels += levels;
        if self.levels > MAX_NESTING {
            self.too_deep = Some(span);
        } else {
            visit(self);
        }
        self.levels -= levels;
    }
}

impl Visit for Depth {
    fn visit_block(&mut self, node: &Block) {
        self.within(1, node.span(), |d| visit::visit_block(d, node));
    }

    fn visit_expr(&mut self, node: &Expression) {
        let levels = match node {
            // hcl-rs evaluates each operator in a frame of its own (a splat recurses
            // into the rest of the chain).
            Expression::Traversal(traversal) => 1 + traversal.operators.len(),
            _ => 1,
        };
        self.within(levels, node.span(), |d| visit::visit_expr(d, node));
    }

    fn visit_interpolation(&mut self, node: &Interpolation) {
        self.within(1, node.expr.span(), |d| visit::visit_interpolation(d, node));
    }

    fn visit_directive(&mut self, node: &Directive) {
        self.within(1, node.span(), |d| visit::visit_directive(d, node));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(source: &str) -> Result<(), SyntaxProblem> {
        let body = hcl_edit::parser::parse_body(source).expect("parses");
        check_body(&body, &LineIndex::new(source))
    }

    #[test]
    fn a_splat_chain_past_the_bound_is_refused_at_its_line() {
        let splats = "[*]".repeat(MAX_NESTING);
        let refused = check(&format!("a = 1\nmeta {{\n  x = [[1]]{splats}\n}}\n")).unwrap_err();
        assert_eq!(refused.at.line, 3);
        assert!(refused.message.contains("berth allows 128"), "{refused:?}");
        // A chain that fits, inside a block: 1 (block) + 1 (the traversal) + its
        // operators + 3 (`[[1]]`).
        let fits = "[*]".repeat(MAX_NESTING - 5);
        check(&format!("meta {{\n  x = [[1]]{fits}\n}}\n")).unwrap();
        let past = "[*]".repeat(MAX_NESTING - 4);
        assert!(check(&format!("meta {{\n  x = [[1]]{past}\n}}\n")).is_err());
    }

    #[test]
    fn attribute_chains_and_interpolations_count() {
        let attrs = ".a".repeat(MAX_NESTING);
        assert!(check(&format!("x = var{attrs}\n")).is_err());
        let interpolated = format!("x = \"${{var{attrs}}}\"\n");
        assert_eq!(check(&interpolated).unwrap_err().at.line, 1);
        check("job \"a\" {\n  group \"g\" {\n    task \"t\" {\n      config {\n        x = \"${var.a.b}\"\n      }\n    }\n  }\n}\n")
            .unwrap();
    }

    #[test]
    fn a_var_value_is_checked_too() {
        let deep: Expression = format!("[[1]]{}", "[*]".repeat(200)).parse().unwrap();
        assert_eq!(check_expr(&deep), Err(TooDeep));
        let shallow: Expression = "[1, [2, {a = 3}]]".parse().unwrap();
        assert_eq!(check_expr(&shallow), Ok(()));
    }
}
