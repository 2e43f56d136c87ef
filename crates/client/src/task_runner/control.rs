//! What a user asks of a running task through its alloc runner (Nomad's alloc restart and
//! signal): a request travels to the task runner, which alone holds the task's driver
//! handle, and the answer comes back once the runner has acted.
//!
//! A user restart is not a failure: the runner kills the run and starts the task again
//! at once, and the restart policy's `attempts` do not count it (as in Nomad, where the
//! restart tracker treats a signaled restart apart from a failed exit).

use tokio::sync::{mpsc, oneshot};

/// Why a request to a task could not be carried out.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ControlError {
    #[error("task {task:?} is not running")]
    NotRunning { task: String },
    #[error("signaling task {task:?}: {message}")]
    Signal { task: String, message: String },
}

/// One request to a task runner, with where to send its outcome.
pub(super) enum TaskRequest {
    /// Restart the task now, outside the restart policy; `reason` is the event's.
    Restart {
        reason: String,
        done: oneshot::Sender<Result<(), ControlError>>,
    },
    /// Send the running task a signal through its driver's `signal-task`.
    Signal {
        signal: String,
        done: oneshot::Sender<Result<(), ControlError>>,
    },
}

/// The alloc runner's end: sends requests to one task runner.
#[derive(Clone)]
pub struct TaskControl {
    task: String,
    requests: mpsc::UnboundedSender<TaskRequest>,
}

impl TaskControl {
    pub(super) fn new(task: &str) -> (TaskControl, mpsc::UnboundedReceiver<TaskRequest>) {
        let (requests, receiver) = mpsc::unbounded_channel();
        let control = TaskControl {
            task: task.to_string(),
            requests,
        };
        (control, receiver)
    }

    /// Restarts the running task; answers once its run has been killed.
    pub async fn restart(&self) -> Result<(), ControlError> {
        self.restart_for("User requested task to restart").await
    }

    /// Restarts the running task, outside its restart policy, for `reason` (the
    /// Restart Signaled event's text): a user's, or a re-rendered template's.
    pub async fn restart_for(&self, reason: &str) -> Result<(), ControlError> {
        let reason = reason.to_string();
        self.ask(|done| TaskRequest::Restart { reason, done }).await
    }

    /// Sends `signal` (a name such as `SIGHUP`) to the running task.
    pub async fn signal(&self, signal: &str) -> Result<(), ControlError> {
        let signal = signal.to_string();
        self.ask(|done| TaskRequest::Signal { signal, done }).await
    }

    async fn ask(
        &self,
        request: impl FnOnce(oneshot::Sender<Result<(), ControlError>>) -> TaskRequest,
    ) -> Result<(), ControlError> {
        let not_running = || ControlError::NotRunning {
            task: self.task.clone(),
        };
        let (done, answer) = oneshot::channel();
        self.requests
            .send(request(done))
            .map_err(|_| not_running())?;
        // A runner that ends before it got to the request drops it: the task is not
        // running any more.
        answer.await.map_err(|_| not_running())?
    }
}
