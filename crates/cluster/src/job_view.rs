//! A job as every reader sees it, from the cluster's records: its status, its allocs
//! (placed, with what their nodes reported; no longer placed, as last reported) and
//! whether it waits: to place a failed alloc again, or for room for allocs that could
//! not be placed (pending, as Nomad's job with a blocked evaluation). berth's own API,
//! Nomad's API and the CLI read jobs through this, on a lone agent and on a cluster
//! member alike.

use serde::{Deserialize, Serialize};

use super::state::{ClusterJob, Snapshot};
use berth_jobspec::{Job, JobType, JobspecError};
use berth_model::status::{ClientStatus, DesiredStatus};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AllocSummary {
    pub id: String,
    pub name: String,
    pub desired_status: DesiredStatus,
    pub client_status: ClientStatus,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum JobState {
    Pending,
    Running,
    Dead,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct JobStatus {
    pub id: String,
    #[serde(rename = "type")]
    pub job_type: JobType,
    pub source_name: String,
    pub submitted_ms: u64,
    /// The revision of the job's record in the cluster store: its `JobModifyIndex`, in
    /// the scale of the index reads are served at.
    #[serde(default)]
    pub version: u64,
    pub stopped: bool,
    pub status: JobState,
    pub allocs: Vec<AllocSummary>,
    /// `periodic` or `parameterized`: the job launches children instead of placing
    /// allocs itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub launches: Option<String>,
    /// The job a child was launched from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
}

/// A job recorded in the cluster whose source cannot be evaluated: every agent skips it
/// (the scheduler places nothing for it), and reads show it dead, with its problems.
pub struct UnreadableJob<'a> {
    pub record: &'a ClusterJob,
    pub error: JobspecError,
}

/// Job `id`'s allocs: placed ones with their nodes' reports, then those no longer
/// placed as their nodes last reported them.
pub fn alloc_summaries(snapshot: &Snapshot, id: &str) -> Vec<AllocSummary> {
    let mut allocs = Vec::new();
    let mut placed = std::collections::BTreeSet::new();
    for placement in snapshot.placements.iter().filter(|p| p.job_id == id) {
        placed.insert(placement.alloc_id.as_str());
        let report = snapshot
            .reports
            .iter()
            .find(|r| r.alloc_id == placement.alloc_id);
        allocs.push(AllocSummary {
            id: placement.alloc_id.clone(),
            name: placement.name.clone(),
            desired_status: DesiredStatus::Run,
            client_status: report.map_or(ClientStatus::Pending, |r| r.client_status),
        });
    }
    for report in snapshot.reports.iter().filter(|r| r.job_id == id) {
        if placed.contains(report.alloc_id.as_str()) {
            continue;
        }
        allocs.push(AllocSummary {
            id: report.alloc_id.clone(),
            name: report.name.clone(),
            desired_status: DesiredStatus::Stop,
            client_status: report.client_status,
        });
    }
    allocs
}

/// Job `id` as the cluster has it, with its jobspec; `None` when there is no such job.
pub fn job_status<'a>(
    snapshot: &'a Snapshot,
    id: &str,
) -> Option<Result<(JobStatus, Job), UnreadableJob<'a>>> {
    let (record, version) = snapshot.jobs.iter().find(|(j, _)| j.id == id)?;
    let job = match record.spec() {
        Ok(job) => job,
        Err(error) => return Some(Err(UnreadableJob { record, error })),
    };
    let allocs = alloc_summaries(snapshot, id);
    let launches = job.launches().map(str::to_string);
    // A job that launches children runs for as long as it is not stopped, as in Nomad.
    let status = if (launches.is_some() && !record.stopped)
        || allocs
            .iter()
            .any(|a| a.client_status == ClientStatus::Running)
    {
        JobState::Running
    } else if allocs
        .iter()
        .any(|a| a.client_status == ClientStatus::Pending && a.desired_status == DesiredStatus::Run)
        || super::scheduler::reschedule::awaiting(snapshot, &job, id)
        || (!record.stopped && snapshot.blocked.get(id).is_some_and(|b| !b.is_empty()))
    {
        JobState::Pending
    } else {
        JobState::Dead
    };
    Some(Ok((
        JobStatus {
            id: record.id.clone(),
            job_type: job.job_type,
            source_name: record.source_name.clone(),
            submitted_ms: record.submitted_ms,
            version: u64::try_from(*version).unwrap_or(0),
            stopped: record.stopped,
            status,
            allocs,
            parent: job.parent.clone(),
            launches,
        },
        job,
    )))
}
