//! Nomad's evaluation reads: `GET /v1/evaluations` (`prefix`, `job`, `status`),
//! `/v1/evaluation/:id`, `/v1/evaluation/:id/allocations` and `/v1/job/:id/evaluations`,
//! from the evaluations the cluster records (`cluster/evals.rs`): what a register, stop,
//! dispatch or periodic launch returns as `EvalID`, and what Nomad's clients follow.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use berth_nomad_api::evals::AllocationMetric;
use serde::Deserialize;

use super::cluster::{alloc_stubs, answer};
use super::shapes::count;
use super::{Blocking, NomadError};
use berth_client::agent::Agent;
use berth_cluster::evals::Evaluation;
use berth_cluster::state::{Blocked, Snapshot};

#[derive(Debug, Default, Deserialize)]
pub struct EvalsQuery {
    #[serde(default)]
    prefix: Option<String>,
    #[serde(default)]
    job: Option<String>,
    #[serde(default)]
    status: Option<String>,
    #[serde(flatten)]
    blocking: Blocking,
}

/// Nomad's `FailedTGAllocs`: per group, how many nodes each reason ruled out (filtered)
/// or had no room (exhausted).
pub fn failed_tg_allocs(blocked: &[Blocked]) -> Option<BTreeMap<String, AllocationMetric>> {
    let mut failed = BTreeMap::new();
    for entry in blocked {
        let (mut filtered, mut exhausted) = (BTreeMap::new(), BTreeMap::<String, u64>::new());
        let (mut nodes_filtered, mut nodes_exhausted) = (0, 0);
        for (reason, nodes) in &entry.reasons {
            if let Some(dimension) = dimension(reason) {
                *exhausted.entry(dimension).or_default() += count(*nodes);
                nodes_exhausted += count(*nodes);
            } else {
                filtered.insert(reason.clone(), count(*nodes));
                nodes_filtered += count(*nodes);
            }
        }
        failed.insert(
            entry.group.clone(),
            AllocationMetric {
                nodes_evaluated: count(entry.nodes_evaluated),
                nodes_filtered,
                nodes_exhausted,
                constraint_filtered: filtered,
                dimension_exhausted: exhausted,
                coalesced_failures: entry.coalesced.into(),
                ..Default::default()
            },
        );
    }
    (!failed.is_empty()).then_some(failed)
}

/// A store revision as Nomad's index (revisions start at 1).
fn revision(revision: i64) -> u64 {
    u64::try_from(revision).unwrap_or(0)
}

/// The resource a reason says was exhausted, as Nomad's `DimensionExhausted` names it
/// (`memory`, `network: reserved port collision http=8080`).
fn dimension(reason: &str) -> Option<String> {
    if let Some(resource) = reason.strip_suffix(" exhausted") {
        return Some(resource.to_string());
    }
    let port = reason.strip_prefix("port ")?.strip_suffix(" in use")?;
    Some(format!("network: reserved port collision {port}"))
}

/// An evaluation as Nomad's `Evaluation`. A job's scheduler type is read from its
/// record (`service` when the job is gone or unreadable).
fn evaluation(snapshot: &Snapshot, eval: &Evaluation) -> berth_nomad_api::evals::Evaluation {
    let job = snapshot.jobs.iter().find(|(j, _)| j.id == eval.job_id);
    let job_type = job
        .and_then(|(j, _)| j.spec().ok())
        .map_or("service", |spec| spec.job_type.as_str());
    let mut queued: BTreeMap<String, u64> = BTreeMap::new();
    for blocked in &eval.failed {
        *queued.entry(blocked.group.clone()).or_default() += 1 + u64::from(blocked.coalesced);
    }
    berth_nomad_api::evals::Evaluation {
        id: eval.id.clone(),
        namespace: super::shapes::NAMESPACE.into(),
        priority: 50,
        job_type: job_type.into(),
        triggered_by: eval.triggered_by.clone(),
        job_id: eval.job_id.clone(),
        job_modify_index: revision(eval.create_revision),
        status: eval.status.as_str().into(),
        status_description: eval.status_description.clone(),
        failed_tg_allocs: failed_tg_allocs(&eval.failed),
        queued_allocations: queued,
        snapshot_index: revision(eval.mod_revision),
        create_index: revision(eval.create_revision),
        modify_index: revision(eval.mod_revision),
        create_time: super::shapes::ms_as_ns(eval.created_ms),
        modify_time: super::shapes::ms_as_ns(eval.modified_ms),
        ..Default::default()
    }
}

fn not_found() -> NomadError {
    NomadError(StatusCode::NOT_FOUND, "eval not found".into())
}

/// The evaluation `id` names (its id, or a unique prefix of 4 or more).
fn find<'a>(snapshot: &'a Snapshot, id: &str) -> Result<&'a Evaluation, NomadError> {
    let found: Vec<&Evaluation> = snapshot
        .evals
        .iter()
        .filter(|e| e.id == id || (id.len() >= 4 && e.id.starts_with(id)))
        .collect();
    match found.as_slice() {
        [one] => Ok(one),
        [] => Err(not_found()),
        _ => Err(NomadError(
            StatusCode::BAD_REQUEST,
            format!("eval ID prefix {id:?} matches several evaluations"),
        )),
    }
}

pub async fn list(State(agent): State<Arc<Agent>>, Query(query): Query<EvalsQuery>) -> Response {
    let cluster = agent.cluster().clone();
    answer(&agent, &cluster, &query.blocking, |snapshot| {
        let prefix = query.prefix.as_deref().unwrap_or("");
        let evals = snapshot
            .evals
            .iter()
            .rev()
            .filter(|e| e.id.starts_with(prefix))
            .filter(|e| query.job.as_ref().is_none_or(|job| e.job_id == *job))
            .filter(|e| (query.status.as_ref()).is_none_or(|status| e.status.as_str() == status))
            .map(|e| evaluation(snapshot, e))
            .collect::<Vec<_>>();
        Ok(evals)
    })
    .await
}

pub async fn read(
    State(agent): State<Arc<Agent>>,
    Path(id): Path<String>,
    Query(blocking): Query<Blocking>,
) -> Response {
    let cluster = agent.cluster().clone();
    answer(&agent, &cluster, &blocking, |snapshot| {
        Ok(evaluation(snapshot, find(snapshot, &id)?))
    })
    .await
}

/// The allocs the evaluation left its job with, as Nomad's `AllocListStub`s.
pub async fn allocations(
    State(agent): State<Arc<Agent>>,
    Path(id): Path<String>,
    Query(blocking): Query<Blocking>,
) -> Response {
    let cluster = agent.cluster().clone();
    answer(&agent, &cluster, &blocking, |snapshot| {
        let eval = find(snapshot, &id)?;
        let ids: std::collections::BTreeSet<&str> =
            eval.allocs.iter().map(|a| a.alloc_id.as_str()).collect();
        let mut stubs = alloc_stubs(&agent, snapshot, |job, _| job == eval.job_id);
        stubs.retain(|s| ids.contains(s.id.as_str()));
        for stub in &mut stubs {
            stub.eval_id = eval.id.clone();
        }
        Ok(stubs)
    })
    .await
}

/// `GET /v1/job/:id/evaluations`: the job's evaluations, newest first. A job whose
/// record cannot be evaluated shows that in its newest one; a dead job whose allocs
/// will not be placed again says why there.
pub async fn of_job(
    State(agent): State<Arc<Agent>>,
    Path(id): Path<String>,
    Query(blocking): Query<Blocking>,
) -> Response {
    let cluster = agent.cluster().clone();
    answer(&agent, &cluster, &blocking, |snapshot| {
        let Some((job, _)) = snapshot.jobs.iter().find(|(j, _)| j.id == id) else {
            return Err(NomadError(StatusCode::NOT_FOUND, "job not found".into()));
        };
        let mut evals: Vec<_> = snapshot
            .evals
            .iter()
            .rev()
            .filter(|e| e.job_id == id)
            .map(|e| evaluation(snapshot, e))
            .collect();
        if let Some(newest) = evals.first_mut() {
            let said = newest.status_description.clone();
            let why = match job.spec() {
                Err(error) => Some(format!(
                    "its recorded source cannot be evaluated, so no agent runs it: {error}"
                )),
                Ok(_) if !said.is_empty() => None,
                Ok(parsed) => Some(berth_cluster::scheduler::reschedule::exhausted(
                    snapshot, &parsed, &id,
                ))
                .filter(|why| !why.is_empty()),
            };
            if let Some(why) = why {
                newest.status_description = why;
            }
        }
        Ok(evals)
    })
    .await
}
