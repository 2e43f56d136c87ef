//! From the located HCL tree to typed jobspec structures, collecting every problem. A
//! value that could not be evaluated ([`Value::Failed`]) was reported already: it draws
//! no second problem here (neither its type, nor "required", nor "needs").
//!
//! One file per block; the files import one another in one direction only: `job` on
//! `group`, `group` on `connect`, `task`, `service`, `network` and `restart`, `connect` on
//! `task`, `task` on `service`; `constraints` and `ignored` under them all. This file
//! holds what they share.

mod artifact;
mod connect;
mod constraints;
mod group;
mod identity;
mod ignored;
mod job;
mod network;
mod restart;
mod service;
mod task;

use berth_hcl::Location;
use berth_hcl::Problem;
use berth_hcl::fields::Fields;

use crate::Findings;
use berth_jobspec::names::{NameKind, check_name, normalise_task_path};

pub(crate) use job::job;

/// A problem at the block for a job, group, task or volume label that is not a safe name.
pub(super) fn check_label(
    kind: NameKind,
    name: &str,
    path: &str,
    at: Location,
    problems: &mut Findings,
) {
    if let Err(error) = check_name(kind, name) {
        problems.push(Problem {
            path: path.to_string(),
            at: Some(at),
            message: error.to_string(),
        });
    }
}

/// `value` of field `name` as a normalised path inside the task, or a problem at it.
pub(super) fn task_path(
    fields: &mut Fields,
    name: &'static str,
    value: &str,
    block_at: Location,
    problems: &mut Findings,
) -> Option<String> {
    match normalise_task_path(value) {
        Ok(path) => Some(path),
        Err(error) => {
            let at = fields.attr(name).map(|a| a.at).unwrap_or(block_at);
            fields.problem(problems, name, at, format!("{name} {error}"));
            None
        }
    }
}
