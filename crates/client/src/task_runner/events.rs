//! A task's events: into its state (shown by `alloc status`), the state store, and the
//! broadcast to watchers. Below the hooks and the runner, which both emit.

use std::sync::{Arc, Mutex};

use tokio::sync::{Notify, broadcast};

use berth_model::events::{AllocEvent, EventKind, TaskEvent, TaskState};
use berth_state::{Commit, StateStore};

/// Where a task runner reports: watchers get events, the store gets every change, and
/// `changed` wakes whoever waits on task states (the alloc runner's lifecycle).
#[derive(Clone)]
pub struct EventSink {
    pub alloc_id: String,
    pub alloc_name: String,
    pub sender: broadcast::Sender<AllocEvent>,
    pub store: Arc<StateStore>,
    pub changed: Arc<Notify>,
}

/// Emits one task's events: into its state (shown by `alloc status`), the store, and
/// the broadcast. Cloned into hooks that report from the background.
#[derive(Clone)]
pub struct TaskEvents {
    pub(super) state: Arc<Mutex<TaskState>>,
    pub(super) sink: EventSink,
    pub(super) task: String,
}

impl TaskEvents {
    pub fn emit(&self, kind: EventKind, message: impl Into<String>) {
        let event = TaskEvent::new(kind, message);
        self.state.lock().unwrap().push_event(event.clone());
        self.persist(Commit::Lazy);
        let _ = self.sink.sender.send(AllocEvent {
            alloc_id: self.sink.alloc_id.clone(),
            alloc_name: self.sink.alloc_name.clone(),
            task: self.task.clone(),
            event,
        });
    }

    /// Writes the task's state: durably for transitions, lazily for events in between.
    pub(super) fn persist(&self, commit: Commit) {
        let snapshot = self.state.lock().unwrap().clone();
        let sink = &self.sink;
        if let Err(error) = sink
            .store
            .put_task_state(&sink.alloc_id, &self.task, &snapshot, commit)
        {
            tracing::error!(alloc = %sink.alloc_id, task = %self.task, %error,
                "recording the task state");
        }
        sink.changed.notify_waiters();
    }
}
