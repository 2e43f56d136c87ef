//! Allocs: `AllocationListStub`, `Allocation`, task states and events, and the alloc
//! files and log frames the client endpoints serve.

use serde::{Deserialize, Serialize};

use crate::Map;
use crate::jobs::Job;

/// `GET /v1/allocations`, `GET /v1/job/:id/allocations`: Nomad's `AllocationListStub`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct AllocationListStub {
    #[serde(rename = "ID")]
    pub id: String,
    #[serde(rename = "EvalID")]
    pub eval_id: String,
    pub name: String,
    pub namespace: String,
    #[serde(rename = "NodeID")]
    pub node_id: String,
    pub node_name: String,
    #[serde(rename = "JobID")]
    pub job_id: String,
    pub job_type: String,
    pub job_version: u64,
    pub task_group: String,
    pub desired_status: String,
    pub desired_description: String,
    pub client_status: String,
    pub client_description: String,
    #[serde(deserialize_with = "crate::null_as_empty")]
    pub task_states: Map<TaskState>,
    /// `null` unless the alloc replaces a failed one.
    pub reschedule_tracker: Option<RescheduleTracker>,
    pub previous_allocation: String,
    pub next_allocation: String,
    pub create_index: u64,
    pub modify_index: u64,
    pub alloc_modify_index: u64,
    /// Nanoseconds since the epoch.
    pub create_time: u64,
    /// Nanoseconds since the epoch.
    pub modify_time: u64,
}

impl AllocationListStub {
    /// Neither finished nor asked to stop.
    pub fn is_live(&self) -> bool {
        self.desired_status == "run" && matches!(self.client_status.as_str(), "pending" | "running")
    }
}

/// `GET /v1/allocation/:id`: Nomad's `Allocation`, the stub's fields and the job.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct Allocation {
    #[serde(flatten)]
    pub stub: AllocationListStub,
    pub job: Option<Job>,
}

/// A task's state: Nomad's `TaskState`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct TaskState {
    pub state: String,
    pub failed: bool,
    pub restarts: u64,
    /// RFC 3339 (Go's `time.Time`).
    pub last_restart: Option<String>,
    pub started_at: Option<String>,
    pub finished_at: Option<String>,
    #[serde(deserialize_with = "crate::null_as_empty")]
    pub events: Vec<TaskEvent>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct TaskEvent {
    #[serde(rename = "Type")]
    pub kind: String,
    /// Nanoseconds since the epoch.
    pub time: u64,
    pub message: String,
    pub display_message: String,
    #[serde(deserialize_with = "crate::null_as_empty")]
    pub details: Map<String>,
    pub fails_task: bool,
    pub exit_code: i64,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct RescheduleTracker {
    #[serde(deserialize_with = "crate::null_as_empty")]
    pub events: Vec<RescheduleEvent>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct RescheduleEvent {
    /// Nanoseconds since the epoch.
    pub reschedule_time: u64,
    #[serde(rename = "PrevAllocID")]
    pub prev_alloc_id: String,
    #[serde(rename = "PrevNodeID")]
    pub prev_node_id: String,
    /// Nanoseconds.
    pub delay: u64,
}

/// `POST /v1/client/allocation/:id/restart`'s body: one task by name, or all of them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct AllocRestartRequest {
    pub task_name: String,
    pub all_tasks: bool,
}

/// `POST /v1/client/allocation/:id/signal`'s body: `Signal` by name (`SIGHUP`), to one
/// task or to all.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct AllocSignalRequest {
    pub signal: String,
    pub task: String,
}

/// `POST /v1/allocation/:id/stop`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct AllocStopResponse {
    #[serde(rename = "EvalID")]
    pub eval_id: String,
    pub index: u64,
}

/// `GET /v1/client/fs/ls/:alloc_id`, `/stat/`: Nomad's `AllocFileInfo`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct AllocFileInfo {
    pub name: String,
    pub is_dir: bool,
    pub size: i64,
    /// Go's `os.FileMode` as text (`-rw-r--r--`).
    pub file_mode: String,
    /// RFC 3339.
    pub mod_time: String,
    pub content_type: String,
}

/// A piece of a file or log: Nomad's `StreamFrame` (and the answer of a log read
/// without `follow`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct StreamFrame {
    /// The offset in `file` after `data`.
    pub offset: u64,
    /// Base64.
    pub data: String,
    pub file: String,
}
