//! The jobspec reader, as the crates that parse see it: a [`Reader`] the binary installs
//! once at start (`berth_jobspec_hcl::install`), which [`crate::parse_with`] and friends
//! call on the evaluating threads. The client, the cluster and the API parse stored and
//! submitted jobs without depending on the reader's crate.

use std::sync::OnceLock;

use berth_hcl::Problem;
use berth_hcl::eval::VariableInputs;

use crate::{Job, JobspecError};

/// Reads a jobspec's source into a [`Job`], within its own budget, on the calling
/// thread (one of [`crate::pool`]'s).
pub trait Reader: Send + Sync {
    fn evaluate(
        &self,
        file: &str,
        source: &str,
        inputs: &VariableInputs,
    ) -> Result<Job, JobspecError>;
}

static READER: OnceLock<&'static dyn Reader> = OnceLock::new();

/// Installs the reader every later parse uses. The first one installed stays.
pub fn install(reader: &'static dyn Reader) {
    let _ = READER.set(reader);
}

/// Evaluates with the installed reader; a program that installed none is told so, as a
/// problem of the jobspec, rather than failing any other way.
pub(crate) fn evaluate(
    file: &str,
    source: &str,
    inputs: &VariableInputs,
) -> Result<Job, JobspecError> {
    match READER.get() {
        Some(reader) => reader.evaluate(file, source, inputs),
        None => Err(JobspecError {
            file: file.to_string(),
            problems: vec![Problem {
                path: "jobspec".into(),
                at: None,
                message: "this program reads no jobspecs: it installed no reader \
                          (berth_jobspec_hcl::install)"
                    .into(),
            }],
        }),
    }
}
