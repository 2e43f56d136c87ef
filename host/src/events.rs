//! Task events and states, as a person reads them in `berth run` and `berth alloc
//! status`. The kinds and wording follow Nomad's.

use std::fmt;
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use crate::runtime::sandbox::HandedMount;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum EventKind {
    Received,
    #[serde(rename = "Task Setup")]
    TaskSetup,
    Started,
    Terminated,
    Killing,
    Killed,
    Restarting,
    #[serde(rename = "Not Restarting")]
    NotRestarting,
    #[serde(rename = "Setup Failure")]
    SetupFailure,
    #[serde(rename = "Driver Failure")]
    DriverFailure,
    /// Something a lifecycle hook said, or its failure when ignored.
    #[serde(rename = "Task Hook")]
    TaskHook,
}

impl fmt::Display for EventKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = serde_json::to_value(self).ok();
        f.write_str(name.as_ref().and_then(|v| v.as_str()).unwrap_or("?"))
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskEvent {
    /// Milliseconds since the Unix epoch.
    pub time_ms: u64,
    pub kind: EventKind,
    pub message: String,
}

impl TaskEvent {
    pub fn new(kind: EventKind, message: impl Into<String>) -> Self {
        let time_ms = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        TaskEvent {
            time_ms,
            kind,
            message: message.into(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TaskStateKind {
    Pending,
    Running,
    Dead,
}

/// A task's state as shown to people.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskState {
    pub state: TaskStateKind,
    pub failed: bool,
    pub restarts: u32,
    pub exit_code: Option<i32>,
    /// What the task was given to mount on its last start.
    #[serde(default)]
    pub mounts: Vec<HandedMount>,
    pub events: Vec<TaskEvent>,
}

impl Default for TaskState {
    fn default() -> Self {
        TaskState {
            state: TaskStateKind::Pending,
            failed: false,
            restarts: 0,
            exit_code: None,
            mounts: Vec::new(),
            events: Vec::new(),
        }
    }
}

/// An event of one task of one alloc, as streamed to watchers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AllocEvent {
    pub alloc_id: String,
    /// `job.group[index]`.
    pub alloc_name: String,
    pub task: String,
    pub event: TaskEvent,
}
