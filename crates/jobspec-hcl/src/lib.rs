//! The jobspec reader: HCL in Nomad's shape, evaluated (variables, locals, functions)
//! within one budget and decoded into [`berth_jobspec::Job`], with errors that point at
//! the file, the line and the path (`job.web.group.g.task.t.driver`).
//!
//! Parsing reports every problem it finds, not only the first: what cannot be evaluated
//! (an undeclared variable, an unknown function, a type error) is reported with its
//! place, and the rest of the jobspec is still evaluated and decoded, so that one run
//! finds every independent mistake.
//!
//! The binary installs it ([`install`]); the crates that parse call
//! `berth_jobspec::parse_with` and friends, which run it on the evaluating threads.
//! [`parse`] and its siblings here install it first, for programs and tests that read
//! jobspecs themselves. The files of this crate import one another in one direction
//! only: `reschedule`, then `decode`; this file uses them, and none of them uses it.

mod decode;
pub(crate) mod reschedule;

use std::path::Path;

use berth_hcl::eval::VariableInputs;
use berth_hcl::{Problem, SyntaxProblem, budget};
use berth_jobspec::reader::Reader;
use berth_jobspec::{Job, JobspecError};
// The tests name the model's types as the crate's own, as they did before the split.
#[cfg(test)]
use berth_jobspec::*;

/// The HCL reader of jobspecs.
struct HclReader;

impl Reader for HclReader {
    fn evaluate(
        &self,
        file: &str,
        source: &str,
        inputs: &VariableInputs,
    ) -> Result<Job, JobspecError> {
        evaluate(file, source, inputs)
    }
}

/// Makes this the reader every parse of `berth_jobspec` uses, in this process.
pub fn install() {
    berth_jobspec::reader::install(&HclReader);
}

/// [`berth_jobspec::parse`], with this reader installed.
pub fn parse(file: &str, source: &str) -> Result<Job, JobspecError> {
    install();
    berth_jobspec::parse(file, source)
}

/// [`berth_jobspec::parse_with`], with this reader installed.
pub fn parse_with(file: &str, source: &str, inputs: &VariableInputs) -> Result<Job, JobspecError> {
    install();
    berth_jobspec::parse_with(file, source, inputs)
}

/// [`berth_jobspec::parse_with_async`], with this reader installed.
pub async fn parse_with_async(
    file: &str,
    source: &str,
    inputs: &VariableInputs,
) -> Result<Job, JobspecError> {
    install();
    berth_jobspec::parse_with_async(file, source, inputs).await
}

/// [`berth_jobspec::parse_file`], with this reader installed.
pub fn parse_file(path: &Path) -> Result<Job, JobspecError> {
    install();
    berth_jobspec::parse_file(path)
}

/// What decoding a jobspec found: problems (it is refused) and warnings (it runs, and
/// the user is told what has no effect). Derefs to the problems, so the field readers
/// take it where they take a problem list.
#[derive(Debug, Default)]
pub(crate) struct Findings {
    pub problems: Vec<Problem>,
    pub warnings: Vec<Problem>,
}

impl std::ops::Deref for Findings {
    type Target = Vec<Problem>;
    fn deref(&self) -> &Vec<Problem> {
        &self.problems
    }
}

impl std::ops::DerefMut for Findings {
    fn deref_mut(&mut self) -> &mut Vec<Problem> {
        &mut self.problems
    }
}

/// Parses and evaluates a jobspec on this thread, within one budget.
fn evaluate(file: &str, source: &str, inputs: &VariableInputs) -> Result<Job, JobspecError> {
    let fail = |problems| JobspecError {
        file: file.to_string(),
        problems,
    };
    let placed = |problems: Vec<SyntaxProblem>| -> Vec<Problem> {
        problems
            .into_iter()
            .map(|p| Problem {
                path: if p.path.is_empty() {
                    "jobspec".into()
                } else {
                    p.path
                },
                at: Some(p.at),
                message: p.message,
            })
            .collect()
    };
    // Everything the evaluation builds, compares and spends in CPU time draws from one
    // budget ([`budget`]), which `parse_evaluated` sets.
    let evaluated = berth_hcl::tree::parse_evaluated(source, inputs);
    let evaluated = evaluated.map_err(|problems| fail(placed(problems)))?;
    let mut problems = placed(evaluated.problems);
    // A bound is a defence against a hostile jobspec: it is refused for that alone.
    if evaluated.bound_reached {
        // Once the CPU time is spent every later expression fails with its message:
        // once is enough.
        let cpu = budget::BudgetSpent::CpuTime.to_string();
        let mut told = false;
        problems.retain(|p| !p.message.contains(&cpu) || !std::mem::replace(&mut told, true));
        return Err(fail(problems));
    }
    // What could not be evaluated is `Value::Failed` in the tree, which the decoder
    // passes over: its problems are the others, independent of those above.
    let mut findings = Findings::default();
    let job = decode::job(&evaluated.tree, &mut findings);
    if problems.is_empty()
        && findings.problems.is_empty()
        && let Some(mut job) = job
    {
        job.warnings = findings.warnings;
        return Ok(job);
    }
    problems.append(&mut findings.problems);
    // In the order they are written (a stable sort: problems without a place first).
    problems.sort_by_key(|p| p.at.map(|at| (at.line, at.column)));
    Err(fail(problems))
}

#[cfg(test)]
mod service_tests;
#[cfg(test)]
mod template_tests;
#[cfg(test)]
mod tests;

#[cfg(test)]
mod eval_tests;

#[cfg(test)]
mod all_problems_tests;

#[cfg(test)]
mod deep_tests;

#[cfg(test)]
mod fields_tests;
