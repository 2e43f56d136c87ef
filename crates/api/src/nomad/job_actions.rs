//! A job's plan (`POST /v1/job/:id/plan`) and a parameterized job's dispatch
//! (`POST /v1/job/:id/dispatch`), in Nomad's shapes.
//!
//! The plan is a dry run on this node: the job passes every check a register makes (the
//! jobspec against this node's drivers, hooks, attributes and volumes, who may run a
//! `csi_plugin`, its disk, its static ports), and nothing is recorded. Berth fills of
//! Nomad's `JobPlanResponse`:
//! - `Annotations.DesiredTGUpdates`: per group, `Place` (new allocs),
//!   `DestructiveUpdate` (running allocs replaced: berth replaces a job's allocs when it
//!   is submitted again, never in place) and `Stop` (running allocs left over);
//!   `Ignore`, `Migrate`, `InPlaceUpdate`, `Canary` and `Preemptions` are always 0.
//! - `FailedTGAllocs`: per group that cannot be placed, an `AllocationMetric` of one node
//!   evaluated and filtered, with each problem (as `file:line:col: path: message`) in
//!   `ConstraintFiltered`; a job-wide problem counts against every group.
//! - `Diff` (when asked): the job's and each group's `Type` (`Added`, `Edited`, `None`,
//!   `Deleted`); `Fields` and `Objects` are always empty.
//! - `NextPeriodicLaunch` of a periodic job, `Warnings`, `JobModifyIndex`.
//!
//! `CreatedEvals` and `Annotations.PreemptedAllocs` are always empty: berth has no
//! evaluations and never preempts.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::Deserialize;
use serde_json::Value;

use berth_nomad_api::evals::AllocationMetric;
use berth_nomad_api::{QueryMeta, jobs};

use super::{NomadError, bad_request, shapes, submission, with_index};
use berth_client::agent::{Agent, Submitter};
use berth_hcl::Problem;
use berth_jobspec::Job;

/// Nomad's zero `time.Time`, for a job with no next periodic launch.
const GO_ZERO_TIME: &str = "0001-01-01T00:00:00Z";

/// `POST /v1/job/:id/dispatch`: a child of the parameterized job `id`.
pub async fn dispatch(
    State(agent): State<Arc<Agent>>,
    submitter: Option<Extension<Submitter>>,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Response, NomadError> {
    use base64::Engine as _;
    let request: jobs::JobDispatchRequest = if body.iter().all(u8::is_ascii_whitespace) {
        jobs::JobDispatchRequest::default()
    } else {
        serde_json::from_slice(&body)
            .map_err(|e| bad_request(format!("Failed to decode request: {e}")))?
    };
    let payload = match request.payload.as_deref().filter(|p| !p.is_empty()) {
        None => None,
        Some(text) => Some(
            base64::engine::general_purpose::STANDARD
                .decode(text)
                .map_err(|e| bad_request(format!("the Payload is not base64: {e}")))?,
        ),
    };
    let submitter = submission::submitter_of(submitter);
    let launched = agent
        .dispatch(&submitter, &id, request.meta, payload)
        .await
        .map_err(submission::submit_error)?;
    let index = agent.change_index().current();
    Ok(with_index(
        Json(jobs::JobDispatchResponse {
            dispatched_job_id: launched.job_id,
            eval_id: launched.eval_id,
            eval_create_index: index,
            job_create_index: index,
            meta: QueryMeta::at(index),
        })
        .into_response(),
        index,
    ))
}

#[derive(Debug, Deserialize)]
struct PlanRequest {
    #[serde(rename = "Diff", default)]
    diff: bool,
}

/// `POST /v1/job/:id/plan`: what registering the job would do here (see the module doc).
pub async fn plan(
    State(agent): State<Arc<Agent>>,
    submitter: Option<Extension<Submitter>>,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Response, NomadError> {
    // A turn first: parsing the request's jobspec is part of the cost a plan bounds.
    let turn = agent.plan_turn().await.map_err(submission::submit_error)?;
    let body: Value = serde_json::from_slice(&body)
        .map_err(|e| bad_request(format!("Failed to decode request: {e}")))?;
    let request: PlanRequest = serde_json::from_value(body.clone())
        .map_err(|e| bad_request(format!("Failed to decode request: {e}")))?;
    let chosen = submission::to_submit(&body).await?;
    if chosen.id != id {
        return Err(bad_request("Job ID does not match"));
    }
    let planned = agent
        .plan_job(
            &turn,
            submission::submitter_of(submitter),
            &chosen.source_name,
            &chosen.source,
            &chosen.variables,
        )
        .await
        .map_err(submission::submit_error)?;
    let job = &planned.job;
    let current = agent.job_spec(&job.name).ok();
    let mut updates = BTreeMap::new();
    let mut failed = BTreeMap::new();
    if planned.problems.is_empty() {
        // The scheduler's own decision, as the register's evaluation would make it.
        for (group, planned) in &planned.groups {
            updates.insert(group.clone(), desired_updates(planned));
        }
        if let Some(groups) = super::evaluations::failed_tg_allocs(&planned.failed) {
            failed.extend(groups);
        }
    } else {
        // Refused as submitted: each group that would be says why; the others show
        // what they would place.
        for group in &job.groups {
            let group_problems: Vec<&Problem> = planned
                .problems
                .iter()
                .filter(|p| problem_group(job, p).is_none_or(|g| g == group.name))
                .collect();
            if group_problems.is_empty() {
                let places = job.periodic.is_none() && job.parameterized.is_none();
                let planned = berth_client::agent::GroupUpdates {
                    place: if places { u64::from(group.count) } else { 0 },
                    ..Default::default()
                };
                updates.insert(group.name.clone(), desired_updates(&planned));
                continue;
            }
            failed.insert(
                group.name.clone(),
                allocation_metric(
                    &agent,
                    &chosen.source_name,
                    &group_problems,
                    u64::from(group.count),
                ),
            );
            updates.insert(group.name.clone(), desired_updates(&Default::default()));
        }
    }
    let diff = request
        .diff
        .then(|| job_diff(job, current.as_ref().map(|(s, j)| (s, j.as_ref()))));
    let next_launch = job
        .periodic
        .as_ref()
        .filter(|p| p.enabled)
        .and_then(|p| p.next_after(chrono::Utc::now()))
        .map_or(GO_ZERO_TIME.to_string(), |t| {
            t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
        });
    let index = agent.change_index().current();
    let modify_index = planned.current_version;
    let mut warnings = chosen.warnings;
    warnings.extend(
        job.warnings
            .iter()
            .map(|w| format!("{}:{w}", chosen.source_name)),
    );
    Ok(with_index(
        Json(jobs::JobPlanResponse {
            job_modify_index: modify_index,
            created_evals: Vec::new(),
            diff,
            annotations: jobs::PlanAnnotations {
                desired_tg_updates: updates,
                preempted_allocs: Vec::new(),
            },
            failed_tg_allocs: (!failed.is_empty()).then_some(failed),
            next_periodic_launch: next_launch,
            warnings: warnings.join("\n"),
            index,
        })
        .into_response(),
        index,
    ))
}

/// Nomad's `DesiredUpdates` of a group.
fn desired_updates(updates: &berth_client::agent::GroupUpdates) -> jobs::DesiredUpdates {
    jobs::DesiredUpdates {
        ignore: updates.ignore,
        place: updates.place,
        stop: updates.stop,
        destructive_update: updates.destructive_update,
        ..Default::default()
    }
}

/// The group a problem's path names (`job.J.group.G.…`), or `None` for the whole job.
fn problem_group<'p>(job: &Job, problem: &'p Problem) -> Option<&'p str> {
    let rest = problem
        .path
        .strip_prefix(&format!("job.{}.group.", job.name))?;
    // A group's name may hold dots: the longest name the path starts with is its group.
    job.groups
        .iter()
        .map(|g| g.name.as_str())
        .filter(|name| rest == *name || rest.starts_with(&format!("{name}.")))
        .max_by_key(|name| name.len())
        .map(|name| &rest[..name.len()])
}

/// Nomad's `AllocationMetric` for a group this node cannot take.
fn allocation_metric(
    agent: &Agent,
    file: &str,
    problems: &[&Problem],
    wanted: u64,
) -> AllocationMetric {
    AllocationMetric {
        nodes_evaluated: 1,
        nodes_filtered: 1,
        nodes_in_pool: 1,
        nodes_available: [(shapes::ThisNode::of(agent).datacenter, 1)].into(),
        constraint_filtered: problems
            .iter()
            .map(|p| (format!("{file}:{p}"), 1))
            .collect(),
        coalesced_failures: wanted.saturating_sub(1),
        ..Default::default()
    }
}

/// The job's diff against the running version: whether the job and each group are
/// added, edited, unchanged or deleted (no field-level diff).
fn job_diff(job: &Job, current: Option<(&berth_client::agent::JobStatus, &Job)>) -> jobs::JobDiff {
    let new_shape = shapes::job(job, None);
    let groups_of = |job: jobs::Job| -> BTreeMap<String, jobs::TaskGroup> {
        job.task_groups
            .into_iter()
            .map(|g| (g.name.clone(), g))
            .collect()
    };
    let (job_type, old_groups) = match current {
        None => ("Added", BTreeMap::new()),
        Some((status, old)) => {
            let old_shape = shapes::job(old, None);
            let same = old_shape == new_shape && !status.stopped;
            (if same { "None" } else { "Edited" }, groups_of(old_shape))
        }
    };
    let new_groups = groups_of(new_shape);
    let mut task_groups = Vec::new();
    for (name, group) in &new_groups {
        let kind = match old_groups.get(name) {
            None => "Added",
            Some(old) if old == group && job_type == "None" => "None",
            Some(_) => "Edited",
        };
        task_groups.push(group_diff(kind, name));
    }
    for name in old_groups.keys().filter(|n| !new_groups.contains_key(*n)) {
        task_groups.push(group_diff("Deleted", name));
    }
    jobs::JobDiff {
        kind: job_type.into(),
        id: job.name.clone(),
        task_groups,
        ..Default::default()
    }
}

fn group_diff(kind: &str, name: &str) -> jobs::TaskGroupDiff {
    jobs::TaskGroupDiff {
        kind: kind.into(),
        name: name.into(),
        ..Default::default()
    }
}
