//! Jobs: `Job` and its parts, `JobListStub`, `JobSummary`, and the answers of the
//! job endpoints that write or plan.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{Map, QueryMeta};

/// `GET /v1/job/:id`, `POST /v1/jobs/parse`: Nomad's `Job`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct Job {
    pub region: String,
    pub namespace: String,
    #[serde(rename = "ID")]
    pub id: String,
    #[serde(rename = "ParentID")]
    pub parent_id: String,
    pub name: String,
    #[serde(rename = "Type")]
    pub job_type: String,
    pub priority: u32,
    pub all_at_once: bool,
    #[serde(deserialize_with = "crate::null_as_empty")]
    pub datacenters: Vec<String>,
    pub node_pool: String,
    #[serde(deserialize_with = "crate::null_as_empty")]
    pub constraints: Vec<Constraint>,
    #[serde(deserialize_with = "crate::null_as_empty")]
    pub task_groups: Vec<TaskGroup>,
    #[serde(deserialize_with = "crate::null_as_empty")]
    pub meta: Map<String>,
    pub periodic: Option<PeriodicConfig>,
    pub parameterized_job: Option<ParameterizedJobConfig>,
    pub stop: bool,
    pub status: String,
    pub status_description: String,
    pub stable: bool,
    pub version: u64,
    /// Nanoseconds since the epoch.
    pub submit_time: u64,
    pub create_index: u64,
    pub modify_index: u64,
    pub job_modify_index: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct Constraint {
    #[serde(rename = "LTarget")]
    pub l_target: String,
    #[serde(rename = "RTarget")]
    pub r_target: String,
    pub operand: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct PeriodicConfig {
    pub enabled: bool,
    pub spec: String,
    #[serde(deserialize_with = "crate::null_as_empty")]
    pub specs: Vec<String>,
    pub spec_type: String,
    pub prohibit_overlap: bool,
    pub time_zone: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct ParameterizedJobConfig {
    pub payload: String,
    #[serde(deserialize_with = "crate::null_as_empty")]
    pub meta_required: Vec<String>,
    #[serde(deserialize_with = "crate::null_as_empty")]
    pub meta_optional: Vec<String>,
}

/// A job's group: Nomad's `TaskGroup`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct TaskGroup {
    pub name: String,
    pub count: u32,
    #[serde(deserialize_with = "crate::null_as_empty")]
    pub constraints: Vec<Constraint>,
    pub restart_policy: RestartPolicy,
    #[serde(deserialize_with = "crate::null_as_empty")]
    pub tasks: Vec<Task>,
    pub ephemeral_disk: EphemeralDisk,
    #[serde(deserialize_with = "crate::null_as_empty")]
    pub meta: Map<String>,
    #[serde(deserialize_with = "crate::null_as_empty")]
    pub volumes: Map<VolumeRequest>,
    /// Nanoseconds.
    pub shutdown_delay: u64,
    /// Its `network` block (Nomad takes one).
    #[serde(deserialize_with = "crate::null_as_empty")]
    pub networks: Vec<NetworkResource>,
}

/// A group's network: Nomad's `NetworkResource`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct NetworkResource {
    /// "host" (or empty) or "bridge".
    pub mode: String,
    pub hostname: String,
    #[serde(rename = "DNS")]
    pub dns: Option<DnsConfig>,
    /// Static ports (`Value` is the host port).
    #[serde(deserialize_with = "crate::null_as_empty")]
    pub reserved_ports: Vec<Port>,
    /// Dynamic ports (`Value` is the one given, 0 before).
    #[serde(deserialize_with = "crate::null_as_empty")]
    pub dynamic_ports: Vec<Port>,
}

/// A port of a group's network: Nomad's `Port`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct Port {
    pub label: String,
    pub value: u16,
    /// The port inside the group's namespace (bridge mode): 0 unset, -1 the host
    /// port's own number.
    pub to: i32,
    pub host_network: String,
}

/// A network's `dns` block: Nomad's `DNSConfig`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct DnsConfig {
    #[serde(deserialize_with = "crate::null_as_empty")]
    pub servers: Vec<String>,
    #[serde(deserialize_with = "crate::null_as_empty")]
    pub searches: Vec<String>,
    #[serde(deserialize_with = "crate::null_as_empty")]
    pub options: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct RestartPolicy {
    pub attempts: u32,
    /// Nanoseconds.
    pub interval: u64,
    /// Nanoseconds.
    pub delay: u64,
    pub mode: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct EphemeralDisk {
    #[serde(rename = "SizeMB")]
    pub size_mb: u64,
    pub sticky: bool,
    pub migrate: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct VolumeRequest {
    pub name: String,
    #[serde(rename = "Type")]
    pub volume_type: String,
    pub source: String,
    pub read_only: bool,
    pub access_mode: String,
    pub attachment_mode: String,
    pub per_alloc: bool,
}

/// A group's task: Nomad's `Task`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct Task {
    pub name: String,
    pub driver: String,
    pub user: String,
    /// The driver's own keys, as the jobspec gave them.
    #[serde(deserialize_with = "crate::null_as_empty")]
    pub config: Map<Value>,
    #[serde(deserialize_with = "crate::null_as_empty")]
    pub env: Map<String>,
    #[serde(deserialize_with = "crate::null_as_empty")]
    pub meta: Map<String>,
    pub resources: Resources,
    #[serde(deserialize_with = "crate::null_as_empty")]
    pub constraints: Vec<Constraint>,
    /// Nanoseconds.
    pub kill_timeout: u64,
    pub kill_signal: String,
    /// Nanoseconds.
    pub shutdown_delay: u64,
    pub lifecycle: Option<TaskLifecycle>,
    #[serde(deserialize_with = "crate::null_as_empty")]
    pub volume_mounts: Vec<VolumeMount>,
    #[serde(deserialize_with = "crate::null_as_empty")]
    pub templates: Vec<Template>,
    #[serde(deserialize_with = "crate::null_as_empty")]
    pub artifacts: Vec<TaskArtifact>,
    /// Nanoseconds; 0: no limit.
    pub max_run_duration: u64,
    pub dispatch_payload: Option<DispatchPayloadConfig>,
    pub leader: bool,
    pub log_config: LogConfig,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct Resources {
    #[serde(rename = "CPU")]
    pub cpu: u64,
    #[serde(rename = "MemoryMB")]
    pub memory_mb: u64,
    #[serde(rename = "MemoryMaxMB")]
    pub memory_max_mb: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct TaskLifecycle {
    pub hook: String,
    pub sidecar: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct VolumeMount {
    pub volume: String,
    pub destination: String,
    pub read_only: bool,
    pub propagation_mode: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct Template {
    pub embedded_tmpl: String,
    pub dest_path: String,
    pub envvars: bool,
    /// Octal, as Nomad writes it (`"644"`).
    pub perms: String,
    pub change_mode: String,
    pub change_signal: String,
    pub change_script: Option<ChangeScript>,
    /// Nanoseconds.
    pub splay: u64,
    pub wait: Option<WaitConfig>,
    /// -1: the task's user.
    pub uid: Option<i64>,
    pub gid: Option<i64>,
    pub left_delim: String,
    pub right_delim: String,
    pub err_missing_key: bool,
    pub once: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct ChangeScript {
    pub command: String,
    pub args: Vec<String>,
    /// Nanoseconds.
    pub timeout: u64,
    pub fail_on_error: bool,
}

/// A template's `wait`, in nanoseconds.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct WaitConfig {
    pub min: u64,
    pub max: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct TaskArtifact {
    pub getter_source: String,
    #[serde(deserialize_with = "crate::null_as_empty")]
    pub getter_options: Map<String>,
    #[serde(deserialize_with = "crate::null_as_empty")]
    pub getter_headers: Map<String>,
    pub getter_mode: String,
    pub relative_dest: String,
    pub chown: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct DispatchPayloadConfig {
    pub file: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct LogConfig {
    pub disabled: bool,
    pub max_files: u32,
    #[serde(rename = "MaxFileSizeMB")]
    pub max_file_size_mb: u64,
}

/// `GET /v1/jobs`: Nomad's `JobListStub`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct JobListStub {
    #[serde(rename = "ID")]
    pub id: String,
    #[serde(rename = "ParentID")]
    pub parent_id: String,
    pub name: String,
    pub namespace: String,
    #[serde(deserialize_with = "crate::null_as_empty")]
    pub datacenters: Vec<String>,
    #[serde(rename = "Type")]
    pub job_type: String,
    pub priority: u32,
    pub periodic: bool,
    pub parameterized_job: bool,
    pub stop: bool,
    pub status: String,
    pub status_description: String,
    pub job_summary: Option<JobSummary>,
    pub create_index: u64,
    pub modify_index: u64,
    pub job_modify_index: u64,
    /// Nanoseconds since the epoch.
    pub submit_time: u64,
}

/// `GET /v1/job/:id/summary`: Nomad's `JobSummary`, allocs per group and status.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct JobSummary {
    #[serde(rename = "JobID")]
    pub job_id: String,
    pub namespace: String,
    #[serde(deserialize_with = "crate::null_as_empty")]
    pub summary: Map<TaskGroupSummary>,
    pub children: JobChildrenSummary,
    pub create_index: u64,
    pub modify_index: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct TaskGroupSummary {
    pub queued: u64,
    pub complete: u64,
    pub failed: u64,
    pub running: u64,
    pub starting: u64,
    pub lost: u64,
    pub unknown: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct JobChildrenSummary {
    pub pending: u64,
    pub running: u64,
    pub dead: u64,
}

/// `GET /v1/job/:id/versions`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct JobVersionsResponse {
    #[serde(deserialize_with = "crate::null_as_empty")]
    pub versions: Vec<Job>,
    pub diffs: Option<Vec<JobDiff>>,
}

/// `PUT /v1/jobs`, `PUT /v1/job/:id`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct JobRegisterResponse {
    #[serde(rename = "EvalID")]
    pub eval_id: String,
    pub eval_create_index: u64,
    pub job_modify_index: u64,
    pub warnings: String,
    #[serde(flatten)]
    pub meta: QueryMeta,
}

/// `DELETE /v1/job/:id`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct JobDeregisterResponse {
    #[serde(rename = "EvalID")]
    pub eval_id: String,
    pub eval_create_index: u64,
    pub job_modify_index: u64,
    #[serde(flatten)]
    pub meta: QueryMeta,
}

/// `POST /v1/job/:id/dispatch`'s body.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct JobDispatchRequest {
    /// Base64, as Go marshals a `[]byte`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub payload: Option<String>,
    #[serde(deserialize_with = "crate::null_as_empty")]
    pub meta: Map<String>,
}

/// `POST /v1/job/:id/dispatch`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct JobDispatchResponse {
    #[serde(rename = "DispatchedJobID")]
    pub dispatched_job_id: String,
    #[serde(rename = "EvalID")]
    pub eval_id: String,
    pub eval_create_index: u64,
    pub job_create_index: u64,
    #[serde(flatten)]
    pub meta: QueryMeta,
}

/// `POST /v1/validate/job`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct JobValidateResponse {
    pub driver_config_validated: bool,
    #[serde(deserialize_with = "crate::null_as_empty")]
    pub validation_errors: Vec<String>,
    pub error: String,
    pub warnings: String,
}

/// `POST /v1/job/:id/plan`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct JobPlanResponse {
    pub job_modify_index: u64,
    #[serde(deserialize_with = "crate::null_as_empty")]
    pub created_evals: Vec<Value>,
    pub diff: Option<JobDiff>,
    pub annotations: PlanAnnotations,
    /// `null` when every group can be placed.
    #[serde(rename = "FailedTGAllocs")]
    pub failed_tg_allocs: Option<Map<crate::evals::AllocationMetric>>,
    /// RFC 3339; Go's zero time when the job launches nothing.
    pub next_periodic_launch: String,
    pub warnings: String,
    pub index: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct PlanAnnotations {
    #[serde(rename = "DesiredTGUpdates")]
    #[serde(deserialize_with = "crate::null_as_empty")]
    pub desired_tg_updates: Map<DesiredUpdates>,
    #[serde(deserialize_with = "crate::null_as_empty")]
    pub preempted_allocs: Vec<Value>,
}

/// What a plan would do to a group's allocs.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct DesiredUpdates {
    pub ignore: u64,
    pub place: u64,
    pub migrate: u64,
    pub stop: u64,
    pub in_place_update: u64,
    pub destructive_update: u64,
    pub canary: u64,
    pub preemptions: u64,
}

/// A job's diff against its running version. berth says whether the job and each
/// group are `Added`, `Edited`, `None` or `Deleted`; it lists no field-level diff.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct JobDiff {
    #[serde(rename = "Type")]
    pub kind: String,
    #[serde(rename = "ID")]
    pub id: String,
    #[serde(deserialize_with = "crate::null_as_empty")]
    pub fields: Vec<Value>,
    #[serde(deserialize_with = "crate::null_as_empty")]
    pub objects: Vec<Value>,
    #[serde(deserialize_with = "crate::null_as_empty")]
    pub task_groups: Vec<TaskGroupDiff>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct TaskGroupDiff {
    #[serde(rename = "Type")]
    pub kind: String,
    pub name: String,
    #[serde(deserialize_with = "crate::null_as_empty")]
    pub fields: Vec<Value>,
    #[serde(deserialize_with = "crate::null_as_empty")]
    pub objects: Vec<Value>,
    #[serde(deserialize_with = "crate::null_as_empty")]
    pub tasks: Vec<Value>,
    #[serde(deserialize_with = "crate::null_as_empty")]
    pub updates: Map<u64>,
}
