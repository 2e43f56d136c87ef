//! Nomad's JSON shapes (its API documentation's field names, PascalCase, and types), made
//! from berth's own types. What berth has no value for is sent as Nomad's empty value
//! (`""`, `0`, `{}`, `[]` or `null`), never invented.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::{Value, json};

use berth_client::agent::{JobState, JobStatus};
use berth_client::alloc_runner::AllocStatus;
use berth_jobspec::{Constraint, Group, Job, JobType, Task};
use berth_model::events::{TaskState, TaskStateKind};
use berth_model::status::{ClientStatus, DesiredStatus};

/// The namespace and region every object is in: one node is its own cluster.
pub const NAMESPACE: &str = "default";
pub const REGION: &str = "global";

const NS_PER_MS: u64 = 1_000_000;

fn ns(duration: std::time::Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

fn pairs(pairs: &[(String, String)]) -> BTreeMap<&str, &str> {
    pairs
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect()
}

pub(super) fn job_type(job_type: JobType) -> &'static str {
    job_type.as_str()
}

fn job_state(state: JobState) -> &'static str {
    match state {
        JobState::Pending => "pending",
        JobState::Running => "running",
        JobState::Dead => "dead",
    }
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

fn desired_status(status: DesiredStatus) -> &'static str {
    match status {
        DesiredStatus::Run => "run",
        DesiredStatus::Stop => "stop",
    }
}

fn constraints(constraints: &[Constraint]) -> Vec<Value> {
    constraints
        .iter()
        .map(|c| {
            json!({
                "LTarget": c.attribute,
                "RTarget": c.value,
                "Operand": c.operator,
            })
        })
        .collect()
}

/// A job's indexes: its record's revision in the cluster store, the scale of the index
/// reads are served at.
fn indexes(status: &JobStatus) -> (u64, u64) {
    (status.version, status.version)
}

/// `GET /v1/jobs`: a job's stub.
pub fn job_stub(status: &JobStatus, job: &Job) -> Value {
    let (create, modify) = indexes(status);
    json!({
        "ID": status.id,
        "ParentID": status.parent.clone().unwrap_or_default(),
        "Name": status.id,
        "Namespace": NAMESPACE,
        "Datacenters": job.datacenters,
        "Type": job_type(status.job_type),
        "Priority": 50,
        "Periodic": job.periodic.is_some(),
        "ParameterizedJob": job.parameterized.is_some(),
        "Stop": status.stopped,
        "Status": job_state(status.status),
        "StatusDescription": "",
        "JobSummary": job_summary(status, job, &[]),
        "CreateIndex": create,
        "ModifyIndex": modify,
        "JobModifyIndex": modify,
        "SubmitTime": status.submitted_ms.saturating_mul(NS_PER_MS),
    })
}

/// `GET /v1/job/:id/summary`: allocs per group and client status. `allocs` gives the
/// group of each alloc; without them (a stub) the counts come from the status alone.
pub fn job_summary(status: &JobStatus, job: &Job, allocs: &[AllocStatus]) -> Value {
    let mut summary: BTreeMap<&str, BTreeMap<&str, u64>> = BTreeMap::new();
    for group in &job.groups {
        let counts = summary.entry(group.name.as_str()).or_default();
        for key in [
            "Queued", "Complete", "Failed", "Running", "Starting", "Lost", "Unknown",
        ] {
            counts.insert(key, 0);
        }
    }
    for alloc in &status.allocs {
        let group = allocs
            .iter()
            .find(|a| a.id == alloc.id)
            .map(group_of)
            .or_else(|| (job.groups.len() == 1).then(|| job.groups[0].name.clone()));
        let Some(group) = group else { continue };
        let Some(counts) = summary.get_mut(group.as_str()) else {
            continue;
        };
        let key = match alloc.client_status {
            ClientStatus::Pending => "Starting",
            ClientStatus::Running => "Running",
            ClientStatus::Complete => "Complete",
            ClientStatus::Failed => "Failed",
            ClientStatus::Lost => "Lost",
        };
        *counts.entry(key).or_default() += 1;
    }
    let (create, modify) = indexes(status);
    json!({
        "JobID": status.id,
        "Namespace": NAMESPACE,
        "Summary": summary,
        "Children": {"Pending": 0, "Running": 0, "Dead": 0},
        "CreateIndex": create,
        "ModifyIndex": modify,
    })
}

/// `GET /v1/job/:id`, `POST /v1/jobs/parse`: the job in Nomad's job JSON. `status` is
/// `None` for a parsed job that is not registered.
pub fn job(job: &Job, status: Option<&JobStatus>) -> Value {
    let (create, modify) = status.map_or((0, 0), indexes);
    json!({
        "Region": REGION,
        "Namespace": NAMESPACE,
        "ID": job.name,
        "ParentID": job.parent.clone().unwrap_or_default(),
        "Name": job.name,
        "Type": job_type(job.job_type),
        "Priority": 50,
        "AllAtOnce": false,
        "Datacenters": job.datacenters,
        "NodePool": "default",
        "Constraints": constraints(&job.constraints),
        "TaskGroups": job.groups.iter().map(group).collect::<Vec<_>>(),
        "Meta": pairs(&job.meta),
        "Periodic": job.periodic.as_ref().map(|p| json!({
            "Enabled": p.enabled,
            "Spec": p.crons.first().cloned().unwrap_or_default(),
            "Specs": p.crons,
            "SpecType": "cron",
            "ProhibitOverlap": p.prohibit_overlap,
            "TimeZone": "UTC",
        })),
        "ParameterizedJob": job.parameterized.as_ref().map(|p| json!({
            "Payload": p.payload,
            "MetaRequired": p.meta_required,
            "MetaOptional": p.meta_optional,
        })),
        "Stop": status.is_some_and(|s| s.stopped),
        "Status": status.map_or("pending", |s| job_state(s.status)),
        "StatusDescription": "",
        "Stable": false,
        "Version": 0,
        "SubmitTime": status.map_or(0, |s| s.submitted_ms.saturating_mul(NS_PER_MS)),
        "CreateIndex": create,
        "ModifyIndex": modify,
        "JobModifyIndex": modify,
    })
}

fn group(group: &Group) -> Value {
    let volumes: BTreeMap<&str, Value> = group
        .volumes
        .iter()
        .map(|v| {
            (
                v.name.as_str(),
                json!({
                    "Name": v.name,
                    "Type": match v.volume_type {
                        berth_jobspec::VolumeType::Host => "host",
                        berth_jobspec::VolumeType::Csi => "csi",
                    },
                    "Source": v.source,
                    "ReadOnly": v.read_only,
                    "AccessMode": v.access_mode.clone().unwrap_or_default(),
                    "AttachmentMode": v.attachment_mode.clone().unwrap_or_default(),
                    "PerAlloc": v.per_alloc,
                }),
            )
        })
        .collect();
    json!({
        "Name": group.name,
        "Count": group.count,
        "Constraints": constraints(&group.constraints),
        "RestartPolicy": {
            "Attempts": group.restart.attempts,
            "Interval": ns(group.restart.interval),
            "Delay": ns(group.restart.delay),
            "Mode": match group.restart.mode {
                berth_jobspec::RestartMode::Fail => "fail",
                berth_jobspec::RestartMode::Delay => "delay",
            },
        },
        "Tasks": group.tasks.iter().map(task).collect::<Vec<_>>(),
        "EphemeralDisk": {"SizeMB": group.ephemeral_disk_mb, "Sticky": false, "Migrate": false},
        "Meta": pairs(&group.meta),
        "Volumes": volumes,
        "ShutdownDelay": ns(group.shutdown_delay),
    })
}

fn task(task: &Task) -> Value {
    json!({
        "Name": task.name,
        "Driver": task.driver,
        "User": task.user.clone().unwrap_or_default(),
        "Config": task.config,
        "Env": pairs(&task.env),
        "Meta": pairs(&task.meta),
        "Resources": {
            "CPU": task.resources.cpu,
            "MemoryMB": task.resources.memory_mb,
            "MemoryMaxMB": task.resources.memory_max_mb.unwrap_or(0),
        },
        "Constraints": constraints(&task.constraints),
        "KillTimeout": ns(task.kill_timeout),
        "KillSignal": task.kill_signal,
        "ShutdownDelay": ns(task.shutdown_delay),
        "Lifecycle": task.lifecycle.map(|l| json!({
            "Hook": match l.hook {
                berth_jobspec::LifecycleHook::Prestart => "prestart",
                berth_jobspec::LifecycleHook::Poststart => "poststart",
                berth_jobspec::LifecycleHook::Poststop => "poststop",
            },
            "Sidecar": l.sidecar,
        })),
        "VolumeMounts": task.volume_mounts.iter().map(|m| json!({
            "Volume": m.volume,
            "Destination": m.destination,
            "ReadOnly": m.read_only,
            "PropagationMode": match m.propagation {
                berth_model::mount::Propagation::Private => "private",
                berth_model::mount::Propagation::HostToTask => "host-to-task",
                berth_model::mount::Propagation::Bidirectional => "bidirectional",
            },
        })).collect::<Vec<_>>(),
        "Templates": task.templates.iter().map(|t| json!({
            "EmbeddedTmpl": t.data,
            "DestPath": t.destination,
            "Envvars": t.env,
            "Perms": format!("{:o}", t.perms),
        })).collect::<Vec<_>>(),
        "DispatchPayload": task.dispatch_payload.as_ref().map(|file| json!({"File": file})),
        // berth accepts `leader` with a warning and makes no task the leader.
        "Leader": false,
        "LogConfig": {
            // A task's logs are always collected.
            "Disabled": false,
            "MaxFiles": task.logs.max_files,
            "MaxFileSizeMB": task.logs.max_file_size / berth_model::limits::MIB,
        },
    })
}

/// The group of an alloc, from its name (`<job>.<group>[<index>]`).
pub fn group_of(alloc: &AllocStatus) -> String {
    let rest = alloc
        .name
        .strip_prefix(&alloc.job_id)
        .and_then(|r| r.strip_prefix('.'))
        .unwrap_or(&alloc.name);
    rest.rsplit_once('[')
        .map_or(rest, |(group, _)| group)
        .to_string()
}

/// A task's state in Nomad's shape.
pub(super) fn task_state(state: &TaskState) -> Value {
    let started = state
        .events
        .iter()
        .find(|e| e.kind == berth_model::events::EventKind::Started)
        .map(|e| e.time_ms);
    let finished = (state.state == TaskStateKind::Dead)
        .then(|| state.events.last().map(|e| e.time_ms))
        .flatten();
    let last_restart = state
        .events
        .iter()
        .rev()
        .find(|e| e.kind == berth_model::events::EventKind::Restarting)
        .map(|e| e.time_ms);
    json!({
        "State": match state.state {
            TaskStateKind::Pending => "pending",
            TaskStateKind::Running => "running",
            TaskStateKind::Dead => "dead",
        },
        "Failed": state.failed,
        "Restarts": state.restarts,
        "LastRestart": last_restart.map(rfc3339),
        "StartedAt": started.map(rfc3339),
        "FinishedAt": finished.map(rfc3339),
        "Events": state.events.iter().map(|e| json!({
            "Type": e.kind.to_string(),
            "Time": e.time_ms.saturating_mul(NS_PER_MS),
            "Message": "",
            "DisplayMessage": e.message,
            "Details": {},
            "FailsTask": state.failed && matches!(e.kind,
                berth_model::events::EventKind::SetupFailure
                    | berth_model::events::EventKind::NotRestarting),
            "ExitCode": if e.kind == berth_model::events::EventKind::Terminated {
                state.exit_code.unwrap_or(0)
            } else {
                0
            },
        })).collect::<Vec<_>>(),
    })
}

/// Milliseconds since the epoch as RFC 3339 (what Go's `time.Time` marshals to).
fn rfc3339(ms: u64) -> String {
    let time = chrono::DateTime::<chrono::Utc>::from_timestamp_millis(
        i64::try_from(ms).unwrap_or(i64::MAX),
    )
    .unwrap_or_default();
    time.to_rfc3339_opts(chrono::SecondsFormat::Nanos, true)
}

/// The node this agent is, as `GET /v1/nodes` and allocs name it.
#[derive(Debug, Clone, Serialize)]
pub struct ThisNode {
    pub id: String,
    pub name: String,
    pub datacenter: String,
}

impl ThisNode {
    /// The node `agent` is.
    pub fn of(agent: &berth_client::agent::Agent) -> ThisNode {
        let facts = agent.facts();
        let fact = |key: &str| facts.get(key).cloned().unwrap_or_default();
        ThisNode {
            id: agent.cluster().node_id().to_string(),
            name: agent.cluster().node_name().to_string(),
            datacenter: fact("node.datacenter"),
        }
    }
}

/// `GET /v1/allocations`, `GET /v1/job/:id/allocations`: an alloc's stub.
pub fn alloc_stub(alloc: &AllocStatus, job_type_of: JobType, node: &ThisNode) -> Value {
    let times: Vec<u64> = alloc
        .tasks
        .values()
        .flat_map(|t| t.events.iter().map(|e| e.time_ms))
        .collect();
    let created = times.iter().min().copied().unwrap_or(0);
    let modified = times.iter().max().copied().unwrap_or(0);
    json!({
        "ID": alloc.id,
        "EvalID": "",
        "Name": alloc.name,
        "Namespace": NAMESPACE,
        "NodeID": node.id,
        "NodeName": node.name,
        "JobID": alloc.job_id,
        "JobType": job_type(job_type_of),
        "JobVersion": 0,
        "TaskGroup": group_of(alloc),
        "DesiredStatus": desired_status(alloc.desired_status),
        "DesiredDescription": "",
        "ClientStatus": client_status(alloc.client_status),
        "ClientDescription": "",
        "TaskStates": alloc.tasks.iter().map(|(name, state)| (name.clone(), task_state(state))).collect::<BTreeMap<_, _>>(),
        "CreateIndex": created,
        "ModifyIndex": modified,
        "AllocModifyIndex": modified,
        "CreateTime": created.saturating_mul(NS_PER_MS),
        "ModifyTime": modified.saturating_mul(NS_PER_MS),
    })
}

/// `GET /v1/allocation/:id`: the stub's fields and the job.
pub fn allocation(
    alloc: &AllocStatus,
    job_spec: &Job,
    status: &JobStatus,
    node: &ThisNode,
) -> Value {
    let mut value = alloc_stub(alloc, job_spec.job_type, node);
    if let Value::Object(fields) = &mut value {
        fields.insert("Job".into(), job(job_spec, Some(status)));
    }
    value
}
