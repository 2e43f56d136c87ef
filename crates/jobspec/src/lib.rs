//! Jobspecs: Nomad's job model (`job` / `group` / `task`, `volume`, `volume_mount`,
//! `csi_plugin`, `service`), with what the agent computes from it at run time
//! (constraints, cron, interpolation, templates, artifacts), the field table both
//! readers name fields by, and the threads that evaluate untrusted jobspecs.
//!
//! Reading HCL into a [`Job`] is the `berth-jobspec-hcl` crate's, which the binary
//! installs at start ([`reader`]): the client, the cluster and the API parse through
//! [`parse_with`] and friends here and depend on the model only, so an edit to the
//! reader rebuilds the reader and the binary, not them.

pub mod artifact;
pub mod constraint;
pub mod cron;
pub mod fields;
pub mod interpolate;
pub mod names;
pub mod pool;
pub mod reader;
mod spec;
pub mod template;

use std::path::Path;

use berth_hcl::Problem;
use berth_hcl::eval::VariableInputs;

pub use spec::*;

/// Parses a jobspec without variable values (its variables take their defaults).
pub fn parse(file: &str, source: &str) -> Result<Job, JobspecError> {
    parse_with(file, source, &VariableInputs::default())
}

/// Parses and evaluates a jobspec with values for its variables, on the evaluating
/// threads ([`pool`]), this thread waiting. `file` is used in messages only. From async
/// code, use [`parse_with_async`].
pub fn parse_with(file: &str, source: &str, inputs: &VariableInputs) -> Result<Job, JobspecError> {
    let reader = reader::installed();
    let (owned_file, source, inputs) = (file.to_string(), source.to_string(), inputs.clone());
    pool::run(move || reader.evaluate(&owned_file, &source, &inputs))
        .unwrap_or_else(|stopped| Err(stopped_error(file, stopped)))
}

/// [`parse_with`] for async code: the task waits for the evaluating threads without
/// holding one of the runtime's.
pub async fn parse_with_async(
    file: &str,
    source: &str,
    inputs: &VariableInputs,
) -> Result<Job, JobspecError> {
    let reader = reader::installed();
    let (owned_file, source, inputs) = (file.to_string(), source.to_string(), inputs.clone());
    pool::run_async(move || reader.evaluate(&owned_file, &source, &inputs))
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
