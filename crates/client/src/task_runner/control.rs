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
    #[error("task {task:?}: {message}")]
    Exec { task: String, message: String },
}

/// A command to run inside a running task, in its confinement.
#[derive(Debug, Clone)]
pub struct TaskCommand {
    pub argv: Vec<String>,
    pub timeout: std::time::Duration,
}

/// How a command inside a task ended.
pub type Ran = berth_sys::process::enter::Ran;

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
    /// Kill the running task and fail it for good, outside its restart policy (Nomad's
    /// lifecycle `Kill`): `reason` is the Killing event's text.
    Kill {
        reason: String,
        done: oneshot::Sender<Result<(), ControlError>>,
    },
    /// Run a command inside the running task.
    Exec {
        command: TaskCommand,
        done: oneshot::Sender<Result<Ran, ControlError>>,
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

    /// Kills the running task and fails it, without a restart (a template's change
    /// script that failed with `fail_on_error`); answers once it was killed.
    pub async fn kill_failed(&self, reason: &str) -> Result<(), ControlError> {
        let reason = reason.to_string();
        self.ask(|done| TaskRequest::Kill { reason, done }).await
    }

    /// Runs `command` inside the running task, with the task's environment, user and
    /// confinement; answers once it ended (or was killed at its timeout).
    pub async fn exec(&self, command: TaskCommand) -> Result<Ran, ControlError> {
        self.ask(|done| TaskRequest::Exec { command, done }).await
    }

    async fn ask<T>(
        &self,
        request: impl FnOnce(oneshot::Sender<Result<T, ControlError>>) -> TaskRequest,
    ) -> Result<T, ControlError> {
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
