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
use serde::Serialize;

use super::shapes::{self, ThisNode};
use super::{Blocking, ListQuery, NomadError, bad_request, with_index};
use berth_client::agent::{Agent, Submitter};
use berth_cluster::state::{NodeSettings, Snapshot};
use berth_cluster::{Cluster, NodeRecord};
use berth_model::status::ClientStatus;
use berth_nomad_api::allocs::AllocationListStub;
use berth_nomad_api::{jobs, nodes};

fn snapshot(cluster: &Cluster) -> Result<Snapshot, NomadError> {
    berth_sys::blocking::run(|| cluster.snapshot())
        .map_err(|e| NomadError(StatusCode::SERVICE_UNAVAILABLE, e.to_string()))
}

/// A node as Nomad's `NodeListStub`.
pub fn node_stub(record: &NodeRecord, status: &str) -> nodes::NodeListStub {
    let drivers = record
        .drivers
        .iter()
        .map(|(name, healthy)| {
            let driver = nodes::DriverInfo {
                attributes: BTreeMap::new(),
                detected: true,
                healthy: *healthy,
                health_description: if *healthy { "Healthy" } else { "Unhealthy" }.into(),
            };
            (name.clone(), driver)
        })
        .collect();
    let address = record
        .http_addr
        .as_deref()
        .and_then(|a| a.rsplit_once(':').map(|(host, _)| host.to_string()))
        .unwrap_or_else(|| "127.0.0.1".into());
    nodes::NodeListStub {
        id: record.id.clone(),
        name: record.name.clone(),
        datacenter: record.datacenter.clone(),
        node_class: record.node_class.clone(),
        node_pool: record.node_pool.clone(),
        version: env!("CARGO_PKG_VERSION").into(),
        drain: record.drain,
        scheduling_eligibility: record.eligibility.clone(),
        status: status.into(),
        status_description: String::new(),
        drivers,
        address,
        create_index: 1,
        modify_index: 1,
    }
}

/// A node as Nomad's `Node`: the stub's fields and its fingerprint.
pub fn node(record: &NodeRecord, status: &str) -> nodes::Node {
    let attributes = record
        .attributes
        .iter()
        .filter_map(|(k, v)| Some((k.strip_prefix("attr.")?.to_string(), v.clone())))
        .collect();
    let host_volumes = record
        .host_volumes
        .iter()
        .map(|name| {
            let place = record.host_volume_paths.get(name);
            let volume = nodes::HostVolumeInfo {
                name: name.clone(),
                path: place.map(|p| p.path.clone()).unwrap_or_default(),
                read_only: place.is_some_and(|p| p.read_only),
            };
            (name.clone(), volume)
        })
        .collect();
    let resources = |r: berth_model::limits::NodeResources| nodes::NodeResources {
        cpu: nodes::NodeCpuResources {
            cpu_shares: r.cpu_mhz,
        },
        memory: nodes::NodeMemoryResources {
            memory_mb: r.memory_mb,
        },
        disk: nodes::NodeDiskResources { disk_mb: r.disk_mb },
    };
    nodes::Node {
        stub: node_stub(record, status),
        attributes,
        meta: BTreeMap::new(),
        host_volumes,
        node_resources: resources(record.totals()),
        reserved_resources: resources(record.reserved),
        csi_node_plugins: BTreeMap::new(),
        csi_controller_plugins: BTreeMap::new(),
        tls_enabled: false,
        http_addr: record.http_addr.clone().unwrap_or_default(),
    }
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
pub(super) async fn answer<T: Serialize>(
    agent: &Arc<Agent>,
    cluster: &Arc<Cluster>,
    blocking: &Blocking,
    make: impl FnOnce(&Snapshot) -> Result<T, NomadError>,
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
        Ok(snapshot
            .nodes
            .iter()
            .filter(|n| n.record.id.starts_with(&prefix))
            .map(|n| node_stub(&n.record, n.status))
            .collect::<Vec<_>>())
    })
    .await
}

/// `GET /v1/allocation/:id` of an alloc this agent does not run: from the cluster's
/// records (its placement and its node's last report, the last events of each task)
/// with its job, as Nomad answers it from any agent.
pub(super) async fn read_allocation(agent: &Arc<Agent>, id: &str, blocking: &Blocking) -> Response {
    let cluster = agent.cluster().clone();
    answer(agent, &cluster, blocking, |snapshot| {
        let mut found: Vec<AllocationListStub> = alloc_stubs(agent, snapshot, |_, _| true)
            .into_iter()
            .filter(|s| s.id == id || (id.len() >= 4 && s.id.starts_with(id)))
            .collect();
        if let Some(exact) = found.iter().position(|s| s.id == id) {
            found = vec![found.swap_remove(exact)];
        }
        let stub = match found.len() {
            0 => return Err(NomadError(StatusCode::NOT_FOUND, "alloc not found".into())),
            1 => found.remove(0),
            _ => {
                let ids: Vec<&str> = found.iter().map(|s| s.id.as_str()).collect();
                return Err(bad_request(format!(
                    "alloc id {id:?} is ambiguous: it starts {}",
                    ids.join(", ")
                )));
            }
        };
        let job = cluster_job(snapshot, &stub.job_id);
        Ok(berth_nomad_api::allocs::Allocation { stub, job })
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
        Ok(self::node(node, "ready"))
    })
    .await
}

/// A cluster alloc as Nomad's `AllocListStub`, from the cluster's records: its
/// placement, and its node's report (status and task states). An alloc that runs on
/// this node takes its status and task states from its runner, fresher than its last
/// report.
pub(super) fn alloc_stubs(
    agent: &Agent,
    snapshot: &Snapshot,
    keep: impl Fn(&str, &str) -> bool,
) -> Vec<AllocationListStub> {
    let this_node = ThisNode::of(agent);
    let names: BTreeMap<&str, &str> = snapshot
        .nodes
        .iter()
        .map(|n| (n.record.id.as_str(), n.record.name.as_str()))
        .collect();
    let reports: BTreeMap<&str, &berth_cluster::state::AllocReport> = snapshot
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
    let task_states = |report: Option<&berth_cluster::state::AllocReport>| {
        report
            .map(|r| {
                r.tasks
                    .iter()
                    .map(|(name, state)| (name.clone(), shapes::task_state(state)))
                    .collect::<BTreeMap<_, _>>()
            })
            .unwrap_or_default()
    };
    let next_of = |id: &str| next.get(id).copied().unwrap_or_default().to_string();
    let mut stubs = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    for placement in &snapshot.placements {
        if !keep(&placement.job_id, &placement.node_id) {
            continue;
        }
        seen.insert(placement.alloc_id.as_str());
        let report = reports.get(placement.alloc_id.as_str()).copied();
        let mut stub = AllocationListStub {
            id: placement.alloc_id.clone(),
            name: placement.name.clone(),
            namespace: shapes::NAMESPACE.into(),
            node_id: placement.node_id.clone(),
            node_name: names
                .get(placement.node_id.as_str())
                .copied()
                .unwrap_or_default()
                .into(),
            job_id: placement.job_id.clone(),
            job_type: job_types
                .get(placement.job_id.as_str())
                .copied()
                .unwrap_or_default()
                .into(),
            task_group: placement.group.clone(),
            desired_status: "run".into(),
            client_status: shapes::client_status(
                report.map_or(ClientStatus::Pending, |r| r.client_status),
            )
            .into(),
            client_description: report.map(|r| r.description.clone()).unwrap_or_default(),
            task_states: task_states(report),
            reschedule_tracker: super::reschedule::tracker(placement),
            previous_allocation: placement.replaces.clone().unwrap_or_default(),
            next_allocation: next_of(&placement.alloc_id),
            create_time: shapes::ms_as_ns(placement.placed_ms),
            modify_time: shapes::ms_as_ns(report.map_or(placement.placed_ms, |r| r.updated_ms)),
            create_index: 1,
            modify_index: 1,
            ..Default::default()
        };
        // In a list, an alloc's tasks show as its report has them (the last 10 events,
        // clipped), here as on any other agent; `/v1/allocation/:id` shows them all.
        if let Some(runner) = agent.alloc_runner(&placement.alloc_id) {
            let mut status = runner.status();
            status.tasks = berth_cluster::state::AllocReport::tasks_of(&status.tasks);
            let local = shapes::alloc_stub(&status, runner.job.job_type, &this_node);
            stub.client_status = local.client_status;
            stub.task_states = local.task_states;
            stub.create_time = local.create_time;
            stub.modify_time = local.modify_time;
            stub.create_index = local.create_index;
            stub.modify_index = local.modify_index;
            stub.alloc_modify_index = local.alloc_modify_index;
        }
        stubs.push(stub);
    }
    // Allocs no longer placed (stopped, lost, replaced) as their nodes last reported.
    for report in &snapshot.reports {
        if seen.contains(report.alloc_id.as_str()) || !keep(&report.job_id, &report.node_id) {
            continue;
        }
        stubs.push(AllocationListStub {
            id: report.alloc_id.clone(),
            name: report.name.clone(),
            namespace: shapes::NAMESPACE.into(),
            node_id: report.node_id.clone(),
            node_name: report.node_name.clone(),
            job_id: report.job_id.clone(),
            job_type: job_types
                .get(report.job_id.as_str())
                .copied()
                .unwrap_or_default()
                .into(),
            task_group: report
                .name
                .rsplit_once('[')
                .and_then(|(g, _)| g.rsplit_once('.'))
                .map(|(_, g)| g)
                .unwrap_or_default()
                .into(),
            desired_status: "stop".into(),
            client_status: shapes::client_status(report.client_status).into(),
            client_description: report.description.clone(),
            task_states: task_states(Some(report)),
            next_allocation: next_of(&report.alloc_id),
            create_time: shapes::ms_as_ns(report.updated_ms),
            modify_time: shapes::ms_as_ns(report.updated_ms),
            create_index: 1,
            modify_index: 1,
            ..Default::default()
        });
    }
    stubs
}

pub async fn node_allocations(
    State(agent): State<Arc<Agent>>,
    Path(id): Path<String>,
    Query(blocking): Query<Blocking>,
) -> Response {
    let cluster = agent.cluster().clone();
    answer(&agent, &cluster, &blocking, |snapshot| {
        let node = find_node(snapshot, &id)?.id.clone();
        Ok(alloc_stubs(&agent, snapshot, |_, n| n == node))
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
        stubs.retain(|s| s.id.starts_with(&prefix));
        Ok(stubs)
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
        Ok(alloc_stubs(&agent, snapshot, |job, _| job == id))
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
            axum::Json(address).into_response()
        }
        // Nomad answers an empty string while there is no leader.
        Ok(None) => axum::Json("").into_response(),
        Err(error) => {
            NomadError(StatusCode::SERVICE_UNAVAILABLE, error.to_string()).into_response()
        }
    }
}

/// `POST /v1/node/:id/eligibility`: `{"Eligibility": "eligible" | "ineligible"}`.
pub async fn node_eligibility(
    State(agent): State<Arc<Agent>>,
    Path(id): Path<String>,
    submitter: Option<Extension<Submitter>>,
    body: Bytes,
) -> Result<Response, NomadError> {
    operator_only(submitter)?;
    let request: nodes::NodeEligibilityRequest = serde_json::from_slice(&body)
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

/// `POST /v1/node/:id/drain`: `{"DrainSpec": {"Deadline": ns}}` starts a drain,
/// `{"DrainSpec": null, "MarkEligible": true}` ends it.
pub async fn node_drain(
    State(agent): State<Arc<Agent>>,
    Path(id): Path<String>,
    submitter: Option<Extension<Submitter>>,
    body: Bytes,
) -> Result<Response, NomadError> {
    operator_only(submitter)?;
    let request: nodes::NodeDrainRequest = serde_json::from_slice(&body)
        .map_err(|e| bad_request(format!("invalid drain request: {e}")))?;
    let now = berth_cluster::now_ms();
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
        axum::Json(nodes::NodeUpdateResponse {
            eval_ids: Vec::new(),
            eval_create_index: 0,
            node_modify_index: index,
            index,
        })
        .into_response(),
        index,
    ))
}

/// This agent as the record a cluster member registers (by its cluster id when it is
/// one): a node has one shape whichever plane answers ([`node`]).
pub(super) fn this_node_record(agent: &Agent) -> NodeRecord {
    berth_client::agent::cluster::node_record(
        agent.cluster().node_id().to_string(),
        agent.data_dir(),
        agent.config(),
        agent.drivers(),
        agent.facts(),
    )
}

/// A cluster job as `GET /v1/jobs` lists it, or the report of a job whose stored
/// source cannot be evaluated.
fn cluster_job_stub(snapshot: &Snapshot, id: &str) -> Option<jobs::JobListStub> {
    Some(match berth_cluster::job_view::job_status(snapshot, id)? {
        Ok((status, job)) => shapes::job_stub(&status, &job),
        Err(unreadable) => {
            let job = unreadable_job(&unreadable);
            jobs::JobListStub {
                id: job.id,
                name: job.name,
                namespace: job.namespace,
                job_type: job.job_type,
                stop: job.stop,
                status: job.status,
                status_description: job.status_description,
                submit_time: job.submit_time,
                create_index: job.create_index,
                modify_index: job.modify_index,
                job_modify_index: job.job_modify_index,
                ..Default::default()
            }
        }
    })
}

/// A cluster job as Nomad's `Job`, or the report of a job whose stored source cannot be
/// evaluated.
fn cluster_job(snapshot: &Snapshot, id: &str) -> Option<jobs::Job> {
    Some(match berth_cluster::job_view::job_status(snapshot, id)? {
        Ok((status, job)) => shapes::job(&job, Some(&status)),
        Err(unreadable) => unreadable_job(&unreadable),
    })
}

use berth_cluster::job_view::UnreadableJob;

fn unreadable_job(unreadable: &UnreadableJob) -> jobs::Job {
    let record = unreadable.record;
    jobs::Job {
        region: shapes::REGION.into(),
        id: record.id.clone(),
        name: record.id.clone(),
        namespace: shapes::NAMESPACE.into(),
        job_type: "service".into(),
        stop: record.stopped,
        status: "dead".into(),
        status_description: format!(
            "its recorded source cannot be evaluated, so no agent runs it: {}",
            unreadable.error
        ),
        submit_time: shapes::ms_as_ns(record.submitted_ms),
        create_index: record.submitted_ms,
        modify_index: record.submitted_ms,
        job_modify_index: record.submitted_ms,
        ..Default::default()
    }
}

pub async fn list_jobs(
    State(agent): State<Arc<Agent>>,
    Query(query): Query<ListQuery>,
) -> Response {
    let cluster = agent.cluster().clone();
    let prefix = query.prefix.clone().unwrap_or_default();
    answer(&agent, &cluster, &query.blocking, |snapshot| {
        Ok(snapshot
            .jobs
            .iter()
            .filter(|(job, _)| job.id.starts_with(&prefix))
            .filter_map(|(job, _)| cluster_job_stub(snapshot, &job.id))
            .collect::<Vec<_>>())
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
        cluster_job(snapshot, &id)
            .ok_or_else(|| NomadError(StatusCode::NOT_FOUND, "job not found".into()))
    })
    .await
}
