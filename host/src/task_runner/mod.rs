//! Runs one task through its lifecycle: prestart hooks, driver start, poststart, wait,
//! exited, and the restart policy; stop on request. Every step emits a task event.

pub mod hooks;
mod task_dir_hook;
mod volumes_hook;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, watch};

use crate::events::{AllocEvent, EventKind, TaskEvent, TaskState, TaskStateKind};
use crate::jobspec::{JobType, RestartMode};
use crate::runtime::driver::{ExitResult, TaskHandle, TaskRequest};
use hooks::{TaskHook, TaskHookContext, TaskPrepare};

/// Where a task runner reports.
#[derive(Clone)]
pub struct EventSink {
    pub alloc_id: String,
    pub alloc_name: String,
    pub sender: mpsc::UnboundedSender<AllocEvent>,
}

pub struct TaskRunner {
    ctx: TaskHookContext,
    hooks: Vec<Box<dyn TaskHook>>,
    state: Arc<Mutex<TaskState>>,
    events: EventSink,
    stop: watch::Receiver<bool>,
}

/// How a task run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Succeeded,
    Failed,
    Stopped,
}

impl TaskRunner {
    pub fn new(ctx: TaskHookContext, events: EventSink, stop: watch::Receiver<bool>) -> Self {
        TaskRunner {
            ctx,
            hooks: hooks::task_hooks(),
            state: Arc::default(),
            events,
            stop,
        }
    }

    pub fn state(&self) -> Arc<Mutex<TaskState>> {
        self.state.clone()
    }

    fn emit(&self, kind: EventKind, message: impl Into<String>) {
        let event = TaskEvent::new(kind, message);
        self.state.lock().unwrap().events.push(event.clone());
        let _ = self.events.sender.send(AllocEvent {
            alloc_id: self.events.alloc_id.clone(),
            alloc_name: self.events.alloc_name.clone(),
            task: self.ctx.task.name.clone(),
            event,
        });
    }

    fn set_state(&self, state: TaskStateKind, failed: bool) {
        let mut current = self.state.lock().unwrap();
        current.state = state;
        current.failed = failed;
    }

    pub async fn run(mut self) -> Outcome {
        self.emit(EventKind::Received, "Task received by client");
        let policy = self.ctx.group.restart.clone();
        let mut restarts_in_interval: Vec<Instant> = Vec::new();
        loop {
            let exit = match self.run_once().await {
                RunOnce::Exited(exit) => exit,
                RunOnce::Stopped => return self.finish(Outcome::Stopped),
                RunOnce::SetupFailed => return self.finish(Outcome::Failed),
                RunOnce::DriverFailed => None,
            };
            if let Some(exit) = exit {
                let batch_done = self.ctx.job.job_type == JobType::Batch && exit.successful();
                if batch_done {
                    return self.finish(Outcome::Succeeded);
                }
            }
            // The restart policy: `attempts` restarts within `interval`.
            let now = Instant::now();
            restarts_in_interval.retain(|t| now.duration_since(*t) < policy.interval);
            if restarts_in_interval.len() as u32 >= policy.attempts {
                if policy.mode == RestartMode::Fail {
                    self.emit(
                        EventKind::NotRestarting,
                        "Exceeded allowed attempts, applying a fail mode",
                    );
                    return self.finish(Outcome::Failed);
                }
                let wait = policy
                    .interval
                    .saturating_sub(now.duration_since(restarts_in_interval[0]));
                self.emit(
                    EventKind::Restarting,
                    format!("Exceeded allowed attempts, waiting {wait:?} (delay mode)"),
                );
                if self.sleep_or_stop(wait).await {
                    return self.finish(Outcome::Stopped);
                }
                restarts_in_interval.clear();
            }
            restarts_in_interval.push(Instant::now());
            self.state.lock().unwrap().restarts += 1;
            self.emit(
                EventKind::Restarting,
                format!("Task restarting in {:?}", policy.delay),
            );
            if self.sleep_or_stop(policy.delay).await {
                return self.finish(Outcome::Stopped);
            }
        }
    }

    fn finish(&self, outcome: Outcome) -> Outcome {
        self.set_state(TaskStateKind::Dead, outcome == Outcome::Failed);
        outcome
    }

    /// Sleeps, returning true if a stop came first.
    async fn sleep_or_stop(&mut self, duration: Duration) -> bool {
        if *self.stop.borrow() {
            return true;
        }
        tokio::select! {
            _ = tokio::time::sleep(duration) => false,
            _ = self.stop.wait_for(|stop| *stop) => true,
        }
    }

    async fn run_once(&mut self) -> RunOnce {
        self.emit(EventKind::TaskSetup, "Building Task Directory");
        let mut prepare = TaskPrepare::default();
        for hook in &self.hooks {
            if let Err(error) = hook.prestart(&self.ctx, &mut prepare).await {
                self.emit(EventKind::SetupFailure, error.to_string());
                return RunOnce::SetupFailed;
            }
        }
        let task = &self.ctx.task;
        let request = TaskRequest {
            id: format!("{}/{}", self.ctx.alloc_id, task.name),
            name: task.name.clone(),
            alloc_id: self.ctx.alloc_id.clone(),
            job_name: self.ctx.job.name.clone(),
            group_name: self.ctx.group.name.clone(),
            config: task.config.to_string(),
            env: prepare.env,
            task_dir: prepare.task_dir,
            mounts: prepare.mounts,
            stdout: self.ctx.alloc_dir.stdout(&task.name),
            stderr: self.ctx.alloc_dir.stderr(&task.name),
        };
        let handle = match self.ctx.driver.start_task(&request).await {
            Ok(handle) => handle,
            Err(error) => {
                self.emit(EventKind::DriverFailure, error.to_string());
                return RunOnce::DriverFailed;
            }
        };
        self.set_state(TaskStateKind::Running, false);
        self.emit(EventKind::Started, "Task started by client");
        for hook in &self.hooks {
            hook.poststart(&self.ctx).await;
        }
        let driver = self.ctx.driver.clone();
        let waited = {
            let wait = driver.wait_task(&handle);
            tokio::pin!(wait);
            tokio::select! {
                exit = &mut wait => Some(exit),
                _ = self.stop.wait_for(|stop| *stop) => None,
            }
        };
        let outcome = match waited {
            Some(Ok(exit)) => {
                self.terminated(&exit);
                RunOnce::Exited(Some(exit))
            }
            Some(Err(error)) => {
                self.emit(
                    EventKind::DriverFailure,
                    format!("waiting for the task: {error}"),
                );
                RunOnce::Exited(None)
            }
            None => {
                self.kill(&handle).await;
                RunOnce::Stopped
            }
        };
        for hook in &self.hooks {
            hook.exited(&self.ctx).await;
        }
        if let Err(error) = driver.destroy_task(&handle, true).await {
            tracing::warn!(task = %task.name, %error, "destroying the task's driver state");
        }
        outcome
    }

    fn terminated(&self, exit: &ExitResult) {
        self.state.lock().unwrap().exit_code = Some(exit.exit_code);
        let mut message = format!("Exit Code: {}", exit.exit_code);
        if exit.signal != 0 {
            message.push_str(&format!(", Signal: {}", exit.signal));
        }
        if exit.oom_killed {
            message.push_str(", OOM Killed");
        }
        self.emit(EventKind::Terminated, message);
    }

    async fn kill(&self, handle: &TaskHandle) {
        for hook in &self.hooks {
            hook.stop(&self.ctx).await;
        }
        let task = &self.ctx.task;
        self.emit(
            EventKind::Killing,
            format!(
                "Sent interrupt. Waiting {:?} before force killing",
                task.kill_timeout
            ),
        );
        let driver = &self.ctx.driver;
        if let Err(error) = driver
            .stop_task(handle, task.kill_timeout, &task.kill_signal)
            .await
        {
            self.emit(
                EventKind::DriverFailure,
                format!("stopping the task: {error}"),
            );
        }
        match tokio::time::timeout(
            task.kill_timeout + Duration::from_secs(5),
            driver.wait_task(handle),
        )
        .await
        {
            Ok(Ok(exit)) => self.terminated(&exit),
            Ok(Err(error)) => {
                tracing::warn!(task = %task.name, %error, "waiting for a killed task")
            }
            Err(_) => tracing::warn!(task = %task.name, "a killed task did not exit in time"),
        }
        self.emit(EventKind::Killed, "Task successfully killed");
    }
}

enum RunOnce {
    /// The task ran and exited (`None`: the driver could not say how).
    Exited(Option<ExitResult>),
    Stopped,
    SetupFailed,
    DriverFailed,
}
