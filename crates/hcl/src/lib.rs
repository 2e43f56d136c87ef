//! HCL as berth reads it: every HCL file (jobspecs, the agent config, volume specs) is
//! parsed into a tree that remembers where everything was written ([`tree`]), read
//! through [`fields::Fields`] (unknown fields named, with the allowed ones), and refused
//! with every [`Problem`] at once, each with its file, line and path ([`FileError`]).
//! A jobspec is also evaluated as Nomad's parser does it: variables, locals, the
//! function library and `${…}` templates, within a budget ([`budget`]), since job
//! authors are not trusted.
//!
//! The files of this crate import one another in one direction only: `location` at the
//! bottom, then `nesting` (the bound on how deep a file nests, checked before anything
//! walks the tree) and `budget` (what one evaluation may spend), then `functions` and
//! `eval`, then `variables` and `string_template`, then `tree`, then `fields`; this file
//! uses them, and none of them uses it but for [`Problem`].

pub mod budget;
pub mod eval;
pub mod fields;
pub mod functions;
pub mod location;
pub mod nesting;
pub mod string_template;
pub mod tree;
pub mod variables;

use std::fmt;

use serde::{Deserialize, Serialize};

pub use location::{Location, SyntaxProblem};

/// One thing wrong with an HCL file, with where it is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Problem {
    /// `job.web.group.g.task.t.driver`, `config.client.host_volume.data`.
    pub path: String,
    pub at: Option<Location>,
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.at {
            Some(at) if at.line > 0 => write!(
                f,
                "{}:{}: {}: {}",
                at.line, at.column, self.path, self.message
            ),
            _ => write!(f, "{}: {}", self.path, self.message),
        }
    }
}

/// Every problem found in one HCL file (a jobspec, the agent config, a volume spec).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct FileError {
    pub file: String,
    pub problems: Vec<Problem>,
}

impl fmt::Display for FileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let count = self.problems.len();
        write!(
            f,
            "{} has {count} problem{}:",
            self.file,
            if count == 1 { "" } else { "s" }
        )?;
        for problem in &self.problems {
            write!(f, "\n  {}:{problem}", self.file)?;
        }
        Ok(())
    }
}

/// Parses HCL into a tree without evaluating it (literals only); syntax errors become
/// problems at `root` (the path shown for them: `jobspec`, `config`, `volume`).
pub fn parse_tree(file: &str, source: &str, root: &str) -> Result<tree::BodyNode, FileError> {
    tree::parse(source).map_err(|problems| FileError {
        file: file.to_string(),
        problems: problems
            .into_iter()
            .map(|p| Problem {
                path: root.into(),
                at: Some(p.at),
                message: p.message,
            })
            .collect(),
    })
}
