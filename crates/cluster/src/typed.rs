//! Jobs stored typed: a job record keeps the job as its source evaluated when it was
//! submitted, in a versioned shape, next to the source. Readers take the job without
//! evaluating the source again, so a change to the jobspec reader does not change what
//! a stored job means.
//!
//! - a record written before jobs were stored typed, or of an older schema, is read by
//!   evaluating its source (its migration, in memory: rewriting the record would make it
//!   a new version of the job and replace its allocs);
//! - one of a newer schema is refused, and named in the job's status;
//! - one whose typed job does not read (damaged) is refused the same way, and the
//!   others run.

use serde::{Deserialize, Serialize};

use berth_hcl::Problem;
use berth_jobspec::{Job, JobspecError};

/// The version of the typed job's shape: raised with any change to `jobspec::Job` that
/// changes its stored form. A record of an older schema is read by evaluating its
/// source again (its migration); one of a newer schema is refused, and named.
/// 2: a group's `network_mode` and its ports' `to` (bridge mode).
/// 3: a group's `dns` and `hostname`, a service's and a check's `address_mode`.
/// 4: a template's change mode, splay, wait, delimiters, owner ids,
/// `error_on_missing_key` and `once`.
/// 5: a task's `artifacts`, `identities` and `max_run_duration`; a check's
/// `check_restart`, `task` and the `script` kind.
/// 6: a port's `to` kept in host mode too (a docker task's own network forwards to it).
pub const JOB_SCHEMA: u32 = 6;

/// A job stored typed, with the schema it was written in. The job is kept as JSON in
/// the record, so a record whose typed job this agent cannot read is still read as a
/// record (its job reported, the others placed).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TypedJob {
    pub schema: u32,
    pub job: serde_json::Value,
}

impl TypedJob {
    /// The job, read without its source: `None` for one of an older schema (its source
    /// is evaluated instead); an error for one of a newer schema, or one that does not
    /// read, naming job `id` of file `source_name`.
    pub fn read(&self, id: &str, source_name: &str) -> Option<Result<Job, JobspecError>> {
        let refused = |message: String| JobspecError {
            file: source_name.to_string(),
            problems: vec![Problem {
                path: format!("job.{id}"),
                at: None,
                message,
            }],
        };
        match self.schema.cmp(&JOB_SCHEMA) {
            std::cmp::Ordering::Less => None,
            std::cmp::Ordering::Greater => Some(Err(refused(format!(
                "the job was stored by a newer berth (job schema {}; this agent reads up to \
                 {JOB_SCHEMA}): upgrade this agent, or submit the job again",
                self.schema
            )))),
            std::cmp::Ordering::Equal => Some(
                Job::deserialize(&self.job)
                    .map_err(|e| refused(format!("the stored job cannot be read: {e}"))),
            ),
        }
    }

    /// `job` (as evaluated from its source, before a record's own parts) in this
    /// agent's schema.
    pub fn of(job: &Job) -> Option<TypedJob> {
        Some(TypedJob {
            schema: JOB_SCHEMA,
            job: serde_json::to_value(job).ok()?,
        })
    }
}
