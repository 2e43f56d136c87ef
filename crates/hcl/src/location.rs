//! Where something is written in an HCL file, and a problem found there before it is
//! given its place in a jobspec. The lowest layer of the folder: the tree reader
//! ([`super::tree`]) and the evaluator ([`super::eval`]) both use it, and it uses neither.

/// A 1-based line and column in an HCL file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct Location {
    pub line: usize,
    pub column: usize,
}

/// A problem found while reading or evaluating the HCL itself.
#[derive(Debug, Clone, PartialEq)]
pub struct SyntaxProblem {
    pub at: Location,
    /// Where in the jobspec, as the decoder names it (`job.web.group.g.task.t.config.command`);
    /// empty when the problem belongs to no block (syntax, `variable` and `locals` blocks).
    pub path: String,
    pub message: String,
}

/// A problem at `at`, before it gets the jobspec path of the block around it.
pub(crate) fn problem(at: Location, message: impl ToString) -> SyntaxProblem {
    SyntaxProblem {
        at,
        path: String::new(),
        message: message.to_string(),
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
