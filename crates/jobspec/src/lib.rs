//! Jobspecs: HCL in Nomad's shape (`job` / `group` / `task`, `volume`, `volume_mount`,
//! `csi_plugin`, `service`), parsed into typed structures with errors that point at the
//! file, the line and the path (`job.web.group.g.task.t.driver`).
//!
//! Parsing reports every problem it finds, not only the first: what cannot be evaluated
//! (an undeclared variable, an unknown function, a type error) is reported with its
//! place, and the rest of the jobspec is still evaluated and decoded, so that one run
//! finds every independent mistake.
//!
//! The HCL itself (the located tree, the evaluation of variables, locals and functions
//! within a budget, the field reader) is the `berth-hcl` crate's; this crate is Nomad's
//! jobspec schema on it. The files of this crate import one another in one direction
//! only: `reschedule`, then `decode` (with `spec`, the typed job); this file uses them,
//! and none of them uses it.

pub mod artifact;
pub mod constraint;
pub mod cron;
mod decode;
pub mod fields;
pub mod interpolate;
pub mod names;
pub mod pool;
pub(crate) mod reschedule;
mod spec;
pub mod template;

use std::path::Path;

use berth_hcl::eval::VariableInputs;
use berth_hcl::{Problem, SyntaxProblem, budget};

pub use spec::*;

/// Parses a jobspec without variable values (its variables take their defaults).
pub fn parse(file: &str, source: &str) -> Result<Job, JobspecError> {
    parse_with(file, source, &VariableInputs::default())
}

/// Parses and evaluates a jobspec with values for its variables, on the evaluating
/// threads ([`pool`]), this thread waiting. `file` is used in messages only. From async
/// code, use [`parse_with_async`].
pub fn parse_with(file: &str, source: &str, inputs: &VariableInputs) -> Result<Job, JobspecError> {
    let (owned_file, source, inputs) = (file.to_string(), source.to_string(), inputs.clone());
    pool::run(move || evaluate(&owned_file, &source, &inputs))
        .unwrap_or_else(|stopped| Err(stopped_error(file, stopped)))
}

/// [`parse_with`] for async code: the task waits for the evaluating threads without
/// holding one of the runtime's.
pub async fn parse_with_async(
    file: &str,
    source: &str,
    inputs: &VariableInputs,
) -> Result<Job, JobspecError> {
    let (owned_file, source, inputs) = (file.to_string(), source.to_string(), inputs.clone());
    pool::run_async(move || evaluate(&owned_file, &source, &inputs))
        .await
        .unwrap_or_else(|stopped| Err(stopped_error(file, stopped)))
}

/// Whether `error` says only that the agent could not evaluate the jobspec now (its
/// evaluating threads were busy or could not start): a try later may well pass, so it
/// says nothing of the jobspec itself.
pub fn is_transient(error: &JobspecError) -> bool {
    let transient = [
        pool::PoolError::Busy.to_string(),
        pool::PoolError::NoThreads(String::new()).to_string(),
    ];
    matches!(error.problems.as_slice(), [only]
        if only.path == "jobspec"
            && transient.iter().any(|t| only.message.starts_with(t.trim_end())))
}

/// The refusal of a jobspec whose evaluation did not run to its end.
fn stopped_error(file: &str, stopped: pool::PoolError) -> JobspecError {
    JobspecError {
        file: file.to_string(),
        problems: vec![Problem {
            path: "jobspec".into(),
            at: None,
            message: stopped.to_string(),
        }],
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

/// Reads and parses a jobspec file.
pub fn parse_file(path: &Path) -> Result<Job, JobspecError> {
    let file = path.display().to_string();
    let source = std::fs::read_to_string(path).map_err(|e| JobspecError {
        file: file.clone(),
        problems: vec![Problem {
            path: "jobspec".into(),
            at: None,
            message: format!("cannot read the file: {e}"),
        }],
    })?;
    parse(&file, &source)
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
