//! The jobspec reader, as the crates that parse see it: a [`Reader`] the binary installs
//! once at start (`berth_jobspec_hcl::install`), which [`crate::parse_with`] and friends
//! call on the evaluating threads. The client, the cluster and the API parse stored and
//! submitted jobs without depending on the reader's crate.

use std::sync::OnceLock;

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

/// Installs the reader every later parse uses. The first one installed stays (there is
/// one reader, `berth-jobspec-hcl`'s).
pub fn install(reader: &'static dyn Reader) {
    let _ = READER.set(reader);
}

/// The installed reader.
///
/// # Panics
///
/// When none is installed: a program built that way can read no jobspec, which is a
/// fault of the program, not of a jobspec. It is said at once, on the caller's thread:
/// on the evaluating threads the panic would become a jobspec problem, which a caller
/// would blame on the jobspec (and the cluster would remember the job as unreadable).
pub(crate) fn installed() -> &'static dyn Reader {
    match READER.get() {
        Some(reader) => *reader,
        None => panic!(
            "no jobspec reader is installed: call berth_jobspec_hcl::install() at the \
             program's start"
        ),
    }
}
