//! Why an agent could not start, and why a submit, a stop or a lookup was refused.

use super::{NotOwner, capacity};
use berth_cluster::ClusterError;
use berth_jobspec::JobspecError;
use berth_state::StateError;

/// Why a job was not submitted.
#[derive(Debug, thiserror::Error)]
pub enum SubmitError {
    #[error("{0}")]
    Invalid(JobspecError),
    /// A dispatch or forced launch the job does not allow (what it lacks, in words).
    #[error("{0}")]
    Refused(String),
    #[error(transparent)]
    Lookup(#[from] LookupError),
    #[error("recording the job: {0}")]
    State(#[from] StateError),
    #[error(transparent)]
    Cluster(#[from] ClusterError),
    /// The job is another token's (or the operator's).
    #[error(transparent)]
    NotOwner(#[from] NotOwner),
}

/// Why a job was not stopped.
#[derive(Debug, thiserror::Error)]
pub enum StopError {
    #[error(transparent)]
    Lookup(#[from] LookupError),
    #[error(transparent)]
    NotOwner(#[from] NotOwner),
}

#[derive(Debug, thiserror::Error)]
pub enum LookupError {
    #[error("no {kind} matches {id:?}")]
    NotFound { kind: &'static str, id: String },
    #[error("{id:?} matches several allocs ({}): give more of the id", matches.join(", "))]
    Ambiguous { id: String, matches: Vec<String> },
    /// The job is recorded, but its source cannot be evaluated by this agent.
    #[error("job {id:?} is recorded but cannot be read: {problems} (submit it again, or purge it)")]
    Unreadable { id: String, problems: String },
    /// The cluster store could not be asked (the job may well exist).
    #[error(transparent)]
    Cluster(ClusterError),
}

/// Why an agent could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    State(#[from] StateError),
    #[error(transparent)]
    Cluster(#[from] ClusterError),
    #[error(transparent)]
    Users(#[from] berth_sys::process::dynamic_users::RangeError),
    #[error(transparent)]
    Reserved(#[from] capacity::ReservedTooLarge),
}
