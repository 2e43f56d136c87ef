//! Task events and states, as a person reads them in `berth run` and `berth alloc
//! status`. The kinds and wording follow Nomad's.

use std::fmt;
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use crate::mount::HandedMount;

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
    /// A CSI plugin task's health changed (its supervisor probes it).
    #[serde(rename = "Plugin became healthy")]
    PluginHealthy,
    #[serde(rename = "Plugin became unhealthy")]
    PluginUnhealthy,
    /// A hook or the user asked for the task to be restarted (e.g. a plugin that never
    /// got healthy; `berth alloc restart`).
    #[serde(rename = "Restart Signaled")]
    RestartSignaled,
    /// The user sent the task a signal (`berth alloc signal`).
    Signaling,
    /// Its services are gone; the kill signal waits for `shutdown_delay`.
    #[serde(rename = "Waiting for shutdown delay")]
    WaitingShutdownDelay,
    /// The alloc's directory holds more than its `ephemeral_disk` size (Nomad's name).
    #[serde(rename = "Disk Resources Exceeded")]
    DiskExceeded,
    /// Nomad's names for the artifact hook's start and failure.
    #[serde(rename = "Downloading Artifacts")]
    DownloadingArtifacts,
    #[serde(rename = "Failed Artifact Download")]
    ArtifactDownloadFailed,
    /// What the task's driver did on its way (Nomad's docker driver's "Downloading
    /// image"): an image's pull, layer by layer.
    Driver,
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

impl TaskState {
    /// Events kept per task. The whole state is written on every event, so a task in a
    /// restart loop must not make each write bigger than the last.
    pub const MAX_EVENTS: usize = 50;

    /// Appends an event, dropping the oldest beyond [`Self::MAX_EVENTS`].
    pub fn push_event(&mut self, event: TaskEvent) {
        if self.events.len() >= Self::MAX_EVENTS {
            let excess = self.events.len() + 1 - Self::MAX_EVENTS;
            self.events.drain(..excess);
        }
        self.events.push(event);
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_task_keeps_its_latest_events_only() {
        let mut state = TaskState::default();
        for n in 0..TaskState::MAX_EVENTS + 7 {
            state.push_event(TaskEvent::new(EventKind::Restarting, n.to_string()));
        }
        assert_eq!(state.events.len(), TaskState::MAX_EVENTS);
        assert_eq!(state.events[0].message, "7");
        assert_eq!(
            state.events.last().unwrap().message,
            (TaskState::MAX_EVENTS + 6).to_string()
        );
    }
}
