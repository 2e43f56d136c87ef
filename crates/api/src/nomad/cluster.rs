//! Nomad's job, node and alloc reads from the cluster store (every node's view, from
//! any agent; a lone agent's is its one-node cluster), with the store's revision as
//! `X-Nomad-Index`; an alloc of this node carries its task states. Also the operator's
//! node actions: eligibility and drain.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Extension;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::shapes::{self, ThisNode};
use super::{Blocking, ListQuery, NomadError, bad_request, with_index};
use berth_client::agent::{Agent, Submitter};
use berth_client::cluster::state::{NodeSettings, Snapshot};
use berth_client::cluster::{Cluster, NodeRecord};
use berth_model::status::ClientStatus;

fn snapshot(cluster: &Cluster) -> Result<Snapshot, NomadError> {
    berth_sys::blocking::run(|| cluster.snapshot())
        .map_err(|e| NomadError(StatusCode::SERVICE_UNAVAILABLE, e.to_string()))
}

/// A node as Nomad's `NodeListStub` (and, with `full`, `Node`) shows it.
pub fn node_json(record: &NodeRecord, status: &str, full: bool) -> Value {
    let drivers: BTreeMap<&str, Value> = record
        .drivers
        .iter()
        .map(|(name, healthy)| {
            (
                name.as_str(),
                json!({
                    "Attributes": {},
                    "Detected": true,
                    "Healthy": healthy,
                    "HealthDescription": if *healthy { "Healthy" } else { "Unhealthy" },
                }),
            )
        })
        .collect();
    let address = record
        .http_addr
        .as_deref()
        .and_then(|a| a.rsplit_once(':').map(|(host, _)| host.to_string()))
        .unwrap_or_else(|| "127.0.0.1".into());
    let mut value = json!({
        "ID": record.id,
        "Name": record.name,
        "Datacenter": record.datacenter,
        "NodeClass": record.node_class,
        "NodePool": record.node_pool,
        "Version": env!("CARGO_PKG_VERSION"),
        "Drain": record.drain,
        "SchedulingEligibility": record.eligibility,
        "Status": status,
        "StatusDescription": "",
        "Drivers": drivers,
        "Address": address,
        "CreateIndex": 1,
        "ModifyIndex": 1,
    });
    if full && let Value::Object(fields) = &mut value {
        let attributes: BTreeMap<&str, &str> = record
            .attributes
            .iter()
            .filter_map(|(k, v)| Some((k.strip_prefix("attr.")?, v.as_str())))
            .collect();
        let host_volumes: BTreeMap<&str, Value> = record
            .host_volumes
            .iter()
            .map(|name| {
                let place = record.host_volume_paths.get(name);
                let volume = json!({
                    "Name": name,
                    "Path": place.map(|p| p.path.as_str()).unwrap_or_default(),
                    "ReadOnly": place.is_some_and(|p| p.read_only),
                });
                (name.as_str(), volume)
            })
            .collect();
        fields.insert("Attributes".into(), json!(attributes));
        fields.insert("Meta".into(), json!({}));
        fields.insert("HostVolumes".into(), json!(host_volumes));
        let resources = |r: berth_model::limits::NodeResources| {
            json!({
                "Cpu": {"CpuShares": r.cpu_mhz},
                "Memory": {"MemoryMB": r.memory_mb},
                "Disk": {"DiskMB": r.disk_mb},
            })
        };
        fields.insert("NodeResources".into(), resources(record.totals()));
        fields.insert("ReservedResources".into(), resources(record.reserved));
        fields.insert("CSINodePlugins".into(), json!({}));
        fields.insert("CSIControllerPlugins".into(), json!({}));
        fields.insert("TLSEnabled".into(), json!(false));
        fields.insert(
            "HTTPAddr".into(),
            json!(record.http_addr.clone().unwrap_or_default()),
        );
    }
    value
}

/// The node `id` names (its id, or a prefix of 4 or more), or a 404.
fn find_node<'a>(snapshot: &'a Snapshot, id: &str) -> Result<&'a NodeRecord, NomadError> {
    snapshot
        .nodes
        .iter()
        .map(|n| &n.record)
        .find(|n| n.id == id || (id.len() >= 4 && n.id.starts_with(id)))
        .ok_or_else(|| NomadError(StatusCode::NOT_FOUND, "node not found".into()))
}

/// Answers a blocking query on the cluster: waits on the agent's index (which follows
/// etcd's revision in a cluster), then reads a snapshot.
pub(super) async fn answer(
    agent: &Arc<Agent>,
    cluster: &Arc<Cluster>,
    blocking: &Blocking,
    make: impl FnOnce(&Snapshot) -> Result<Value, NomadError>,
) -> Response {
    blocking
        .answer(agent, || {
            let snapshot = snapshot(cluster)?;
            make(&snapshot)
        })
        .await
}

pub async fn list_nodes(
    State(agent): State<Arc<Agent>>,
    Query(query): Query<ListQuery>,
) -> Response {
    let cluster = agent.cluster().clone();
    let prefix = query.prefix.clone().unwrap_or_default();
    answer(&agent, &cluster, &query.blocking, |snapshot| {
        Ok(Value::Array(
            snapshot
                .nodes
                .iter()
                .filter(|n| n.record.id.starts_with(&prefix))
                .map(|n| node_json(&n.record, n.status, false))
                .collect(),
        ))
    })
    .await
}

pub async fn read_node(
    State(agent): State<Arc<Agent>>,
    Path(id): Path<String>,
    Query(blocking): Query<Blocking>,
) -> Response {
    let cluster = agent.cluster().clone();
    answer(&agent, &cluster, &blocking, |snapshot| {
        let node = find_node(snapshot, &id)?;
        Ok(node_json(node, "ready", true))
    })
    .await
}

/// A cluster alloc as Nomad's `AllocListStub`, from the cluster's records: its
/// placement, and its node's report (status and task states). An alloc that runs on
/// this node starts from its local stub (its status and task states, fresher than its
/// last report), the cluster's other fields over it.
pub(super) fn alloc_stubs(
    agent: &Agent,
    snapshot: &Snapshot,
    keep: impl Fn(&str, &str) -> bool,
) -> Vec<Value> {
    let this_node = ThisNode::of(agent);
    let names: BTreeMap<&str, &str> = snapshot
        .nodes
        .iter()
        .map(|n| (n.record.id.as_str(), n.record.name.as_str()))
        .collect();
    let reports: BTreeMap<&str, &berth_client::cluster::state::AllocReport> = snapshot
        .reports
        .iter()
        .map(|r| (r.alloc_id.as_str(), r))
        .collect();
    let next = super::reschedule::next_allocations(snapshot);
    // Each job's type, for its allocs (a job that is gone or cannot be read: none).
    let job_types: BTreeMap<&str, &str> = snapshot
        .jobs
        .iter()
        .filter_map(|(job, _)| Some((job.id.as_str(), shapes::job_type(job.spec().ok()?.job_type))))
        .collect();
    let task_states = |report: Option<&berth_client::cluster::state::AllocReport>| {
        report
            .map(|r| {
                r.tasks
                    .iter()
                    .map(|(name, state)| (name.clone(), shapes::task_state(state)))
                    .collect::<BTreeMap<_, _>>()
            })
            .unwrap_or_default()
    };
    let mut stubs = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    for placement in &snapshot.placements {
        if !keep(&placement.job_id, &placement.node_id) {
            continue;
        }
        seen.insert(placement.alloc_id.as_str());
        let report = reports.get(placement.alloc_id.as_str()).copied();
        let status = report.map_or(ClientStatus::Pending, |r| r.client_status);
        // In a list, an alloc's tasks show as its report has them (the last 10 events,
        // clipped), here as on any other agent; `/v1/allocation/:id` shows them all.
        let local = agent.alloc_runner(&placement.alloc_id).map(|runner| {
            let mut status = runner.status();
            status.tasks = berth_client::cluster::state::AllocReport::tasks_of(&status.tasks);
            super::shapes::alloc_stub(&status, runner.job.job_type, &this_node)
        });
        let status = local
            .as_ref()
            .and_then(|stub| stub["ClientStatus"].as_str().map(str::to_string))
            .unwrap_or_else(|| client_status(status).to_string());
        let cluster_view = json!({
            "ID": placement.alloc_id,
            "EvalID": "",
            "Name": placement.name,
            "Namespace": "default",
            "NodeID": placement.node_id,
            "NodeName": names.get(placement.node_id.as_str()).copied().unwrap_or_default(),
            "JobID": placement.job_id,
            "JobType": job_types.get(placement.job_id.as_str()).copied().unwrap_or_default(),
            "JobVersion": 0,
            "TaskGroup": placement.group,
            "DesiredStatus": "run",
            "DesiredDescription": "",
            "ClientStatus": status,
            "ClientDescription": report.map(|r| r.description.clone()).unwrap_or_default(),
            "TaskStates": task_states(report),
            "RescheduleTracker": super::reschedule::tracker(placement),
            "PreviousAllocation": placement.replaces.clone().unwrap_or_default(),
            "NextAllocation": next.get(placement.alloc_id.as_str()).copied().unwrap_or_default(),
            "CreateTime": placement.placed_ms.saturating_mul(1_000_000),
            "ModifyTime": report.map_or(placement.placed_ms, |r| r.updated_ms).saturating_mul(1_000_000),
            "CreateIndex": 1,
            "ModifyIndex": 1,
        });
        stubs.push(match local {
            Some(mut stub) => {
                if let (Some(stub), Some(cluster)) =
                    (stub.as_object_mut(), cluster_view.as_object())
                {
                    for (key, value) in cluster {
                        // This node's own task states are fresher than its last
                        // report of them.
                        let kept = matches!(
                            key.as_str(),
                            "CreateTime"
                                | "ModifyTime"
                                | "CreateIndex"
                                | "ModifyIndex"
                                | "TaskStates"
                        );
                        if !kept || !stub.contains_key(key) {
                            stub.insert(key.clone(), value.clone());
                        }
                    }
                }
                stub
            }
            None => cluster_view,
        });
    }
    // Allocs no longer placed (stopped, lost, replaced) as their nodes last reported.
    for report in &snapshot.reports {
        if seen.contains(report.alloc_id.as_str()) || !keep(&report.job_id, &report.node_id) {
            continue;
        }
        stubs.push(json!({
            "ID": report.alloc_id,
            "EvalID": "",
            "Name": report.name,
            "Namespace": "default",
            "NodeID": report.node_id,
            "NodeName": report.node_name,
            "JobID": report.job_id,
            "JobType": job_types.get(report.job_id.as_str()).copied().unwrap_or_default(),
            "JobVersion": 0,
            "TaskGroup": report.name.rsplit_once('[').and_then(|(g, _)| g.rsplit_once('.')).map(|(_, g)| g).unwrap_or_default(),
            "DesiredStatus": "stop",
            "DesiredDescription": "",
            "ClientStatus": client_status(report.client_status),
            "ClientDescription": report.description,
            "TaskStates": task_states(Some(report)),
            "RescheduleTracker": null,
            "PreviousAllocation": "",
            "NextAllocation": next.get(report.alloc_id.as_str()).copied().unwrap_or_default(),
            "CreateTime": report.updated_ms.saturating_mul(1_000_000),
            "ModifyTime": report.updated_ms.saturating_mul(1_000_000),
            "CreateIndex": 1,
            "ModifyIndex": 1,
        }));
    }
    stubs
}

fn client_status(status: ClientStatus) -> &'static str {
    match status {
        ClientStatus::Pending => "pending",
        ClientStatus::Running => "running",
        ClientStatus::Complete => "complete",
        ClientStatus::Failed => "failed",
        ClientStatus::Lost => "lost",
    }
}

pub async fn node_allocations(
    State(agent): State<Arc<Agent>>,
    Path(id): Path<String>,
    Query(blocking): Query<Blocking>,
) -> Response {
    let cluster = agent.cluster().clone();
    answer(&agent, &cluster, &blocking, |snapshot| {
        let node = find_node(snapshot, &id)?.id.clone();
        Ok(Value::Array(alloc_stubs(&agent, snapshot, |_, n| {
            n == node
        })))
    })
    .await
}

pub async fn list_allocations(
    State(agent): State<Arc<Agent>>,
    Query(query): Query<ListQuery>,
) -> Response {
    let cluster = agent.cluster().clone();
    let prefix = query.prefix.clone().unwrap_or_default();
    answer(&agent, &cluster, &query.blocking, |snapshot| {
        let mut stubs = alloc_stubs(&agent, snapshot, |_, _| true);
        stubs.retain(|s| s["ID"].as_str().is_some_and(|id| id.starts_with(&prefix)));
        Ok(Value::Array(stubs))
    })
    .await
}

pub async fn job_allocations(
    State(agent): State<Arc<Agent>>,
    Path(id): Path<String>,
    Query(blocking): Query<Blocking>,
) -> Response {
    let cluster = agent.cluster().clone();
    answer(&agent, &cluster, &blocking, |snapshot| {
        if !snapshot.jobs.iter().any(|(job, _)| job.id == id) {
            return Err(NomadError(StatusCode::NOT_FOUND, "job not found".into()));
        }
        Ok(Value::Array(alloc_stubs(&agent, snapshot, |job, _| {
            job == id
        })))
    })
    .await
}

/// `GET /v1/status/leader`: the address of the agent that schedules the cluster.
pub async fn status_leader(State(agent): State<Arc<Agent>>) -> Response {
    let cluster = agent.cluster().clone();
    let election = cluster.key(&["leader"]);
    let store = cluster.store().clone();
    let leader = berth_sys::blocking::run(|| {
        cluster
            .store()
            .block(async move { store.leader(&election).await })
    });
    match leader {
        Ok(Some(node_id)) => {
            let address = berth_sys::blocking::run(|| cluster.snapshot())
                .ok()
                .and_then(|s| {
                    s.nodes
                        .into_iter()
                        .find(|n| n.record.id == node_id)
                        .map(|n| n.record.http_addr.unwrap_or(n.record.name))
                })
                .unwrap_or(node_id);
            axum::Json(json!(address)).into_response()
        }
        // Nomad answers an empty string while there is no leader.
        Ok(None) => axum::Json(json!("")).into_response(),
        Err(error) => {
            NomadError(StatusCode::SERVICE_UNAVAILABLE, error.to_string()).into_response()
        }
    }
}

#[derive(Debug, serde::Deserialize)]
struct EligibilityRequest {
    #[serde(rename = "Eligibility")]
    eligibility: String,
}

/// `POST /v1/node/:id/eligibility`: `{"Eligibility": "eligible" | "ineligible"}`.
pub async fn node_eligibility(
    State(agent): State<Arc<Agent>>,
    Path(id): Path<String>,
    submitter: Option<Extension<Submitter>>,
    body: Bytes,
) -> Result<Response, NomadError> {
    operator_only(submitter)?;
    let request: EligibilityRequest = serde_json::from_slice(&body)
        .map_err(|e| bad_request(format!("invalid eligibility request: {e}")))?;
    let ineligible = match request.eligibility.as_str() {
        "eligible" => false,
        "ineligible" => true,
        other => {
            return Err(bad_request(format!(
                "invalid scheduling eligibility {other:?} (use \"eligible\" or \"ineligible\")"
            )));
        }
    };
    update_node(&agent, &id, |settings| settings.ineligible = ineligible)
}

#[derive(Debug, Default, serde::Deserialize)]
struct DrainRequest {
    #[serde(rename = "DrainSpec", default)]
    drain_spec: Option<DrainSpec>,
    #[serde(rename = "MarkEligible", default)]
    mark_eligible: bool,
}

#[derive(Debug, Default, serde::Deserialize)]
struct DrainSpec {
    /// Nanoseconds (Go's `time.Duration`); 0: no deadline, -1: force at once.
    #[serde(rename = "Deadline", default)]
    deadline: i64,
}

/// `POST /v1/node/:id/drain`: `{"DrainSpec": {"Deadline": ns}}` starts a drain,
/// `{"DrainSpec": null, "MarkEligible": true}` ends it.
pub async fn node_drain(
    State(agent): State<Arc<Agent>>,
    Path(id): Path<String>,
    submitter: Option<Extension<Submitter>>,
    body: Bytes,
) -> Result<Response, NomadError> {
    operator_only(submitter)?;
    let request: DrainRequest = serde_json::from_slice(&body)
        .map_err(|e| bad_request(format!("invalid drain request: {e}")))?;
    let now = berth_client::cluster::now_ms();
    update_node(&agent, &id, |settings| match &request.drain_spec {
        Some(spec) => {
            settings.drain = true;
            // Nomad's: a positive deadline in ns; -1 forces at once; 0 waits for good.
            settings.drain_deadline_ms = match spec.deadline {
                d if d > 0 => now.saturating_add(u64::try_from(d / 1_000_000).unwrap_or(0)),
                d if d < 0 => now.max(1),
                _ => 0,
            };
        }
        None => {
            settings.drain = false;
            settings.drain_deadline_ms = 0;
            if request.mark_eligible {
                settings.ineligible = false;
            }
        }
    })
}

/// Changing a node is the operator's (Nomad's `node:write`): a job author's token
/// could otherwise drain every node of the cluster.
fn operator_only(submitter: Option<Extension<Submitter>>) -> Result<(), NomadError> {
    match submitter.map_or(Submitter::Operator, |Extension(s)| s) {
        Submitter::Operator => Ok(()),
        Submitter::Dev | Submitter::Token { .. } => Err(NomadError(
            StatusCode::FORBIDDEN,
            "Permission denied: changing a node's drain or eligibility needs the operator \
             (the agent's Unix socket)"
                .into(),
        )),
    }
}

fn update_node(
    agent: &Arc<Agent>,
    id: &str,
    change: impl FnOnce(&mut NodeSettings),
) -> Result<Response, NomadError> {
    let cluster = agent.cluster();
    let snapshot = snapshot(cluster)?;
    let node = find_node(&snapshot, id)?.id.clone();
    let mut settings = snapshot
        .node_settings
        .iter()
        .find(|(n, _)| *n == node)
        .map(|(_, s)| s.clone())
        .unwrap_or_default();
    change(&mut settings);
    berth_sys::blocking::run(|| cluster.set_node_settings(&node, &settings))
        .map_err(|e| NomadError(StatusCode::SERVICE_UNAVAILABLE, e.to_string()))?;
    let index = berth_sys::blocking::run(|| cluster.revision()).unwrap_or(0);
    let index = u64::try_from(index).unwrap_or(0);
    Ok(with_index(
        axum::Json(
            json!({"EvalIDs": [], "EvalCreateIndex": 0, "NodeModifyIndex": index, "Index": index}),
        )
        .into_response(),
        index,
    ))
}

/// This agent as the record a cluster member registers (by its cluster id when it is
/// one): a node has one shape whichever plane answers ([`node_json`]).
pub(super) fn this_node_record(agent: &Agent) -> NodeRecord {
    berth_client::agent::cluster::node_record(
        agent.cluster().node_id().to_string(),
        agent.data_dir(),
        agent.config(),
        agent.drivers(),
        agent.facts(),
    )
}

/// A cluster job as Nomad's job JSON (`stub`: as `GET /v1/jobs` lists it), or the
/// report of a job whose stored source cannot be evaluated.
fn cluster_job_json(snapshot: &Snapshot, id: &str, stub: bool) -> Option<Value> {
    Some(
        match berth_client::cluster::job_view::job_status(snapshot, id)? {
            Ok((status, job)) if stub => super::shapes::job_stub(&status, &job),
            Ok((status, job)) => super::shapes::job(&job, Some(&status)),
            Err(unreadable) => unreadable_job(&unreadable, stub),
        },
    )
}

use berth_client::cluster::job_view::UnreadableJob;

fn unreadable_job(unreadable: &UnreadableJob, stub: bool) -> Value {
    let record = unreadable.record;
    let submitted_ns = record.submitted_ms.saturating_mul(1_000_000);
    let mut json = json!({
        "ID": record.id,
        "Name": record.id,
        "Namespace": "default",
        "Type": "service",
        "Stop": record.stopped,
        "Status": "dead",
        "StatusDescription": format!(
            "its recorded source cannot be evaluated, so no agent runs it: {}",
            unreadable.error
        ),
        "SubmitTime": submitted_ns,
        "CreateIndex": record.submitted_ms,
        "ModifyIndex": record.submitted_ms,
        "JobModifyIndex": record.submitted_ms,
    });
    if !stub {
        json["Region"] = json!("global");
        json["TaskGroups"] = json!([]);
    }
    json
}

pub async fn list_jobs(
    State(agent): State<Arc<Agent>>,
    Query(query): Query<ListQuery>,
) -> Response {
    let cluster = agent.cluster().clone();
    let prefix = query.prefix.clone().unwrap_or_default();
    answer(&agent, &cluster, &query.blocking, |snapshot| {
        Ok(Value::Array(
            snapshot
                .jobs
                .iter()
                .filter(|(job, _)| job.id.starts_with(&prefix))
                .filter_map(|(job, _)| cluster_job_json(snapshot, &job.id, true))
                .collect(),
        ))
    })
    .await
}

pub async fn read_job(
    State(agent): State<Arc<Agent>>,
    Path(id): Path<String>,
    Query(blocking): Query<Blocking>,
) -> Response {
    let cluster = agent.cluster().clone();
    answer(&agent, &cluster, &blocking, |snapshot| {
        cluster_job_json(snapshot, &id, false)
            .ok_or_else(|| NomadError(StatusCode::NOT_FOUND, "job not found".into()))
    })
    .await
}
