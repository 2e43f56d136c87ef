//! What a user asks of a running task through its alloc runner (Nomad's alloc restart,
//! signal and exec): a request travels to the task runner, which alone holds the task's
//! driver handle, and the answer comes back once the runner has acted.
//!
//! A command run inside the task (a script, or an `alloc exec` session) gets the
//! environment and user the task's run started with, its cgroup, and the driver's
//! confinement; it runs on a tokio task of its own, so the runner goes on waiting on
//! (and stopping) the task meanwhile.
//!
//! A user restart is not a failure: the runner kills the run and starts the task again
//! at once, and the restart policy's `attempts` do not count it (as in Nomad, where the
//! restart tracker treats a signaled restart apart from a failed exit).

use std::sync::Arc;

use berth_model::driver::TaskHandle;
use berth_runtime::driver::{Driver, ExecError};
use berth_sys::process::enter::EnterSpec;
use berth_sys::process::session::{Session, WindowSize};
use tokio::sync::{mpsc, oneshot};

use super::{TaskRunner, run_context};

/// The most output of a command run inside a task that is kept (Consul keeps 4 KiB of a
/// check's output).
const EXEC_OUTPUT_LIMIT: usize = 4096;

/// How long an interactive session's command has to start inside the task (the task's
/// processes can stop it on its way in).
const SESSION_START_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

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

/// An interactive command to start inside a running task (`alloc exec`).
#[derive(Debug, Clone)]
pub struct SessionCommand {
    pub argv: Vec<String>,
    /// A terminal of this size (`-t`), or pipes.
    pub terminal: Option<WindowSize>,
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
    /// Start an interactive command inside the running task.
    Session {
        command: SessionCommand,
        done: oneshot::Sender<Result<Session, ControlError>>,
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

    /// Starts an interactive command inside the running task, as [`TaskControl::exec`]
    /// does; answers once it executes, with its streams.
    pub async fn start_session(&self, command: SessionCommand) -> Result<Session, ControlError> {
        self.ask(|done| TaskRequest::Session { command, done })
            .await
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

impl TaskRunner {
    /// Runs a command inside the running task, on a task of its own; the answer goes
    /// to `done`.
    pub(super) fn exec(
        &self,
        handle: &TaskHandle,
        command: TaskCommand,
        done: oneshot::Sender<Result<Ran, ControlError>>,
    ) {
        let spec = self.enter_spec(command.argv, EXEC_OUTPUT_LIMIT, command.timeout);
        self.inside(handle, spec, done, |driver, handle, spec| async move {
            driver.run_in_task(&handle, &spec).await
        });
    }

    /// Starts an interactive command inside the running task, on a task of its own;
    /// the session goes to `done` once its command executes (a caller gone meanwhile
    /// drops it, which ends its command).
    pub(super) fn start_session(
        &self,
        handle: &TaskHandle,
        command: SessionCommand,
        done: oneshot::Sender<Result<Session, ControlError>>,
    ) {
        let spec = self.enter_spec(command.argv, 0, SESSION_START_TIMEOUT);
        self.inside(handle, spec, done, move |driver, handle, spec| async move {
            driver
                .start_session_in_task(&handle, &spec, command.terminal)
                .await
        });
    }

    /// Calls `enter` with the driver on a tokio task of its own, so the runner goes on
    /// waiting on the task meanwhile; its answer, or the refusal of `spec`, goes to
    /// `done`.
    fn inside<T, F>(
        &self,
        handle: &TaskHandle,
        spec: Result<EnterSpec, ControlError>,
        done: oneshot::Sender<Result<T, ControlError>>,
        enter: impl FnOnce(Arc<Driver>, TaskHandle, EnterSpec) -> F,
    ) where
        T: Send + 'static,
        F: std::future::Future<Output = Result<T, ExecError>> + Send + 'static,
    {
        let spec = match spec {
            Ok(spec) => spec,
            Err(refusal) => {
                let _ = done.send(Err(refusal));
                return;
            }
        };
        let failed = self.exec_failed();
        let entered = enter(self.ctx.driver.clone(), handle.clone(), spec);
        tokio::spawn(async move {
            let _ = done.send(entered.await.map_err(|error| failed(error.to_string())));
        });
    }

    fn exec_failed(&self) -> impl Fn(String) -> ControlError + Send + 'static {
        let task = self.ctx.task.name.clone();
        move |message: String| ControlError::Exec {
            task: task.clone(),
            message,
        }
    }

    /// What a command inside the running task gets: the environment and user its run
    /// started with, its cgroup, its task directory (for an unconfined task).
    fn enter_spec(
        &self,
        argv: Vec<String>,
        output_limit: usize,
        timeout: std::time::Duration,
    ) -> Result<EnterSpec, ControlError> {
        let run = match &self.run {
            Some(run) => run.clone(),
            // Started before an agent restart that lost the record: as the config says.
            None => match self.ctx.task_user() {
                Ok(user) => run_context::RunContext {
                    env: Vec::new(),
                    user,
                },
                Err(refusal) => return Err(self.exec_failed()(refusal.to_string())),
            },
        };
        Ok(EnterSpec {
            argv,
            env: run.env,
            user: run.user,
            cgroup_procs: self
                .cgroup
                .as_ref()
                .map(|cgroup| cgroup.procs_files().to_vec())
                .unwrap_or_default(),
            host_cwd: self.ctx.alloc_dir.task_dir(&self.ctx.task.name),
            output_limit,
            timeout,
            // The driver decides (only raw_exec's unconfined tasks may be entered).
            unconfined_allowed: false,
        })
    }
}
