//! Runs one task through its lifecycle: prestart hooks, driver start, poststart, wait,
//! exited, and the restart policy; stop on request. Every step emits a task event.
//!
//! State is written through to the [`StateStore`] on every change, and the driver's
//! handle is stored *before* the task is reported started. A runner built with
//! [`TaskRunner::restored`] starts from that record: a dead task stays dead, a running
//! one is recovered through the driver and supervised again without re-running its
//! prestart hooks (so nothing is mounted twice).
//!
//! Each run of the task has a cgroup of its own ([`berth_sys::cgroup`]), made before the
//! driver starts it and emptied and removed after the driver destroyed it: whatever
//! the task forked dies with the run. Whether the kernel OOM-killed the task is read
//! from that cgroup, not taken from the driver.

mod checks_hook;
mod connect_hook;
pub use connect_hook::revoke_tokens;
mod control;
pub use control::{ControlError, SessionCommand, TaskControl};
mod csi_plugin_supervisor_hook;
mod driver_config_hook;
mod events;
pub use events::{EventSink, TaskEvents};
mod artifact_hook;
pub mod hooks;
mod identity_hook;
mod interpolate_hook;
mod run_context;
mod services_hook;
mod task_dir_hook;
mod template_consul;
mod template_data;
mod template_hook;
mod template_render;
mod template_watch;
mod volumes_hook;
pub mod wasm_hooks;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::watch;

use tracing::Instrument;

use crate::validate::{disabled_driver_refusal, driver_allows_unconfined, unconfined_refusal};
use berth_jobspec::RestartMode;
use berth_model::driver::{ExitResult, TaskHandle, TaskRequest};
use berth_model::events::{EventKind, TaskState, TaskStateKind};
use berth_model::limits::{MIB, TaskLimits, cpu_shares};
use berth_state::{Commit, StoredHandle};
use berth_sys::RunCgroup;
use hooks::{TaskHook, TaskHookContext, TaskPrepare};

/// The hooks, in the order they run. Later hooks see what earlier ones prepared: the
/// operator's WASM hooks run last, with the task's env and mounts in hand.
fn task_hooks() -> Vec<Box<dyn TaskHook>> {
    vec![
        Box::new(task_dir_hook::TaskDirHook),
        Box::new(connect_hook::ConnectHook),
        Box::new(volumes_hook::VolumesHook),
        Box::new(csi_plugin_supervisor_hook::CsiPluginSupervisorHook::default()),
        Box::new(interpolate_hook::InterpolateHook),
        Box::new(artifact_hook::ArtifactHook),
        Box::new(identity_hook::IdentityHook::default()),
        Box::new(template_hook::TemplateHook::default()),
        Box::new(wasm_hooks::WasmHooks),
        Box::new(driver_config_hook::DriverConfigHook),
        Box::new(services_hook::ServicesHook),
        Box::new(checks_hook::ChecksHook::default()),
    ]
}

pub struct TaskRunner {
    ctx: TaskHookContext,
    task_events: TaskEvents,
    restart_requests: tokio::sync::mpsc::UnboundedReceiver<String>,
    /// What the user asks of the task (restart, signal), from the alloc runner.
    user_requests: tokio::sync::mpsc::UnboundedReceiver<control::TaskRequest>,
    hooks: Vec<Box<dyn TaskHook>>,
    state: Arc<Mutex<TaskState>>,
    events: EventSink,
    stop: watch::Receiver<bool>,
    /// A handle from before an agent restart, to recover instead of starting anew.
    restored_handle: Option<TaskHandle>,
    restored: bool,
    /// The cgroup of the current run.
    cgroup: Option<Box<dyn RunCgroup>>,
    /// The environment and user the current run started with, for commands run inside
    /// it (recorded: an agent restarted while it runs reads them back).
    run: Option<run_context::RunContext>,
}

/// How a task run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Succeeded,
    Failed,
    Stopped,
}

impl TaskRunner {
    /// `state` is shared with the alloc runner, which shows it in `berth alloc status`.
    /// `control` sends it what the user asks (see [`TaskRunner::control`]).
    pub fn new(
        mut ctx: TaskHookContext,
        events: EventSink,
        stop: watch::Receiver<bool>,
        state: Arc<Mutex<TaskState>>,
    ) -> (Self, TaskControl) {
        let (control, user_requests) = TaskControl::new(&ctx.task.name);
        let task_events = TaskEvents {
            state: state.clone(),
            sink: events.clone(),
            task: ctx.task.name.clone(),
        };
        let (restart, restart_requests) = tokio::sync::mpsc::unbounded_channel();
        ctx.events = Some(task_events.clone());
        ctx.restart = Some(restart);
        ctx.control = Some(control.clone());
        let runner = TaskRunner {
            ctx,
            task_events,
            restart_requests,
            user_requests,
            hooks: task_hooks(),
            state,
            events,
            stop,
            restored_handle: None,
            restored: false,
            cgroup: None,
            run: None,
        };
        (runner, control)
    }

    /// A runner that continues from what the store recorded before an agent restart.
    pub fn restored(
        ctx: TaskHookContext,
        events: EventSink,
        stop: watch::Receiver<bool>,
        state: Arc<Mutex<TaskState>>,
        handle: Option<TaskHandle>,
    ) -> (Self, TaskControl) {
        let (mut runner, control) = TaskRunner::new(ctx, events, stop, state);
        runner.restored_handle = handle;
        runner.restored = true;
        (runner, control)
    }

    fn emit(&self, kind: EventKind, message: impl Into<String>) {
        self.task_events.emit(kind, message);
    }

    fn set_state(&self, state: TaskStateKind, failed: bool) {
        {
            let mut current = self.state.lock().unwrap();
            current.state = state;
            current.failed = failed;
        }
        self.persist(Commit::Durable);
    }

    /// Emits the events hooks queued.
    fn flush_reports(&self) {
        let reports = std::mem::take(&mut *self.ctx.reports.lock().unwrap());
        for (kind, message) in reports {
            self.emit(kind, message);
        }
    }

    fn persist(&self, commit: Commit) {
        self.task_events.persist(commit);
    }

    /// Runs the task to the end, within a `task` span (`task`, `driver`) nested in its
    /// alloc's span.
    pub async fn run(self) -> Outcome {
        let span = tracing::info_span!(
            "task",
            task = %self.ctx.task.name,
            driver = %self.ctx.task.driver
        );
        self.run_in_span().instrument(span).await
    }

    async fn run_in_span(mut self) -> Outcome {
        if self.restored {
            let recorded = self.state.lock().unwrap().clone();
            if recorded.state == TaskStateKind::Dead {
                // A crash may have come between the task's end and its cgroup's removal,
                // or its own network's release.
                self.cgroup = Some(self.existing_cgroup());
                self.release_cgroup();
                if let Some(release) = &self.ctx.release_own_network {
                    release();
                }
                return if recorded.failed {
                    Outcome::Failed
                } else {
                    Outcome::Succeeded
                };
            }
            self.recover().await;
        } else {
            self.emit(EventKind::Received, "Task received by client");
        }
        let policy =
            (self.ctx.task.restart.clone()).unwrap_or_else(|| self.ctx.group.restart.clone());
        let mut restarts_in_interval: Vec<Instant> = Vec::new();
        loop {
            // Asked of the run before (two checks failing at once): not of this one.
            while self.restart_requests.try_recv().is_ok() {}
            let exit = match self.run_once().await {
                RunOnce::Exited(exit) => exit,
                RunOnce::Stopped => return self.finish(Outcome::Stopped),
                RunOnce::SetupFailed | RunOnce::Killed => return self.finish(Outcome::Failed),
                RunOnce::DriverFailed | RunOnce::SetupToRetry => None,
                RunOnce::UserRestart => {
                    // Not a failure: the policy's attempts and delay do not apply.
                    self.state.lock().unwrap().restarts += 1;
                    self.emit(EventKind::Restarting, "Task restarting in 0s");
                    continue;
                }
            };
            if let Some(exit) = exit {
                // Batch and sysbatch tasks and non-sidecar lifecycle tasks run to
                // completion; service and system tasks are restarted whatever their exit.
                let runs_to_completion = self.ctx.job.job_type.runs_to_completion()
                    || self.ctx.task.lifecycle.is_some_and(|l| !l.sidecar);
                if runs_to_completion && exit.successful() {
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
        // Over for good: its own network (a docker task's) goes now, not at the alloc's end.
        if let Some(release) = &self.ctx.release_own_network {
            release();
        }
        outcome
    }

    /// Sleeps, returning true if a stop came first. The task is not running meanwhile:
    /// a user's request is answered so.
    async fn sleep_or_stop(&mut self, duration: Duration) -> bool {
        if *self.stop.borrow() {
            return true;
        }
        let sleep = tokio::time::sleep(duration);
        tokio::pin!(sleep);
        loop {
            let request = tokio::select! {
                _ = &mut sleep => return false,
                _ = self.stop.wait_for(|stop| *stop) => return true,
                Some(request) = self.user_requests.recv() => request,
            };
            self.refuse(request);
        }
    }

    /// Answers a user's request that came when the task was not running.
    fn refuse(&self, request: control::TaskRequest) {
        let not_running = || ControlError::NotRunning {
            task: self.ctx.task.name.clone(),
        };
        match request {
            control::TaskRequest::Restart { done, .. }
            | control::TaskRequest::Signal { done, .. }
            | control::TaskRequest::Kill { done, .. } => {
                let _ = done.send(Err(not_running()));
            }
            control::TaskRequest::Exec { done, .. } => {
                let _ = done.send(Err(not_running()));
            }
            control::TaskRequest::Session { done, .. } => {
                let _ = done.send(Err(not_running()));
            }
        }
    }

    /// Sends the running task a user's signal through its driver.
    async fn signal(&self, handle: &TaskHandle, signal: &str) -> Result<(), ControlError> {
        self.emit(
            EventKind::Signaling,
            format!("Task being sent signal {signal}"),
        );
        self.ctx
            .driver
            .signal_task(handle, signal)
            .await
            .map_err(|error| ControlError::Signal {
                task: self.ctx.task.name.clone(),
                message: error.to_string(),
            })
    }

    /// Picks up the task from before an agent restart. Without a usable handle the task
    /// is started anew by the normal path.
    async fn recover(&mut self) {
        let Some(mut handle) = self.restored_handle.take() else {
            return;
        };
        match self.ctx.driver.recover_task(&mut handle).await {
            Ok(()) => {
                tracing::info!(alloc = %self.events.alloc_id, task = %self.ctx.task.name,
                    "recovered the task after an agent restart");
                self.restored_handle = Some(handle);
                self.cgroup = Some(self.existing_cgroup());
                self.run = run_context::RunContext::recorded(
                    &self.events.store,
                    &self.ctx.alloc_id,
                    &self.ctx.task.name,
                );
                for hook in &self.hooks {
                    hook.recovered(&self.ctx).await;
                }
                self.flush_reports();
            }
            Err(error) => {
                self.emit(
                    EventKind::DriverFailure,
                    format!("could not recover the task after an agent restart: {error}"),
                );
                self.forget_handle();
                // Whatever is left of the lost run must not outlive it.
                self.cgroup = Some(self.existing_cgroup());
                self.release_cgroup();
            }
        }
    }

    fn forget_handle(&self) {
        let sink = &self.events;
        if let Err(error) = sink
            .store
            .remove_task_handle(&sink.alloc_id, &self.ctx.task.name)
        {
            tracing::error!(alloc = %sink.alloc_id, task = %self.ctx.task.name, %error,
                "forgetting the task's driver handle");
        }
    }

    async fn run_once(&mut self) -> RunOnce {
        let handle = match self.restored_handle.take() {
            Some(handle) => handle,
            None if *self.stop.borrow() => return RunOnce::Stopped,
            None => match self.start().await {
                Ok(handle) => handle,
                Err(failed) => return failed,
            },
        };
        self.supervise(handle).await
    }

    /// Prestart hooks, then the driver's start. The handle is stored before the task is
    /// reported started.
    async fn start(&mut self) -> Result<TaskHandle, RunOnce> {
        let task = &self.ctx.task;
        let refusal = disabled_driver_refusal(&task.name, &task.driver, &self.ctx.config)
            .or_else(|| unconfined_refusal(&task.name, &self.ctx.driver, &self.ctx.config));
        if let Some(refusal) = refusal {
            self.emit(EventKind::SetupFailure, refusal);
            return Err(RunOnce::SetupFailed);
        }
        self.emit(EventKind::TaskSetup, "Building Task Directory");
        let mut prepare = TaskPrepare::default();
        for hook in &self.hooks {
            let result = hook.prestart(&self.ctx, &mut prepare).await;
            self.flush_reports();
            if let Err(error) = result {
                if hook.failure_is_recoverable() {
                    return Err(RunOnce::SetupToRetry);
                }
                self.emit(EventKind::SetupFailure, error.to_string());
                return Err(RunOnce::SetupFailed);
            }
        }
        let task = &self.ctx.task;
        let user = match self.ctx.task_user() {
            Ok(user) => user,
            Err(refusal) => {
                self.emit(EventKind::SetupFailure, refusal.to_string());
                return Err(RunOnce::SetupFailed);
            }
        };
        if let Some(user) = user
            && let Err(error) =
                (self.ctx.sys).give_dirs(&self.ctx.alloc_dir.task_owned_dirs(&task.name), user)
        {
            self.emit(
                EventKind::SetupFailure,
                format!("giving the task's directories to uid {}: {error}", user.uid),
            );
            return Err(RunOnce::SetupFailed);
        }
        let limits = self.limits();
        let cgroup = match self.ctx.sys.create_cgroup(&self.cgroup_name(), &limits) {
            Ok(cgroup) => cgroup,
            Err(error) => {
                self.emit(EventKind::SetupFailure, format!("cgroup: {error}"));
                return Err(RunOnce::SetupFailed);
            }
        };
        let missing = self.ctx.sys.missing_controllers();
        if !missing.is_empty() {
            self.emit(
                EventKind::TaskSetup,
                format!(
                    "running without the {} cgroup controller(s): those limits are not \
                     enforced (the operator allowed it)",
                    missing.join(", ")
                ),
            );
        }
        let cgroup_procs = cgroup.procs_files().to_vec();
        self.cgroup = Some(cgroup);
        let collectors =
            berth_sys::cgroup::Cgroups::collectors_name(&self.ctx.job.name, &self.ctx.alloc_id);
        let collector_cgroup_procs = match self.ctx.sys.collectors_cgroup(&collectors) {
            Ok(cgroup) => cgroup.procs_files().to_vec(),
            Err(error) => {
                self.emit(
                    EventKind::SetupFailure,
                    format!("the log collectors' cgroup: {error}"),
                );
                self.release_cgroup();
                return Err(RunOnce::SetupFailed);
            }
        };
        let network_namespace = self
            .ctx
            .resources
            .network()
            .filter(|network| network.attached.is_some())
            .map(|network| network.path);
        if self.ctx.group.network_mode == berth_jobspec::NetworkMode::Bridge
            && network_namespace.is_none()
        {
            // Never the host's network instead: the network hook made none.
            self.emit(
                EventKind::SetupFailure,
                "the group is in bridge mode and has no network namespace".to_string(),
            );
            self.release_cgroup();
            return Err(RunOnce::SetupFailed);
        }
        let task = &self.ctx.task;
        let run = run_context::RunContext {
            env: prepare.env.clone(),
            user,
        };
        run.record(&self.events.store, &self.ctx.alloc_id, &task.name);
        self.run = Some(run);
        let request = TaskRequest {
            id: format!("{}/{}", self.ctx.alloc_id, task.name),
            name: task.name.clone(),
            alloc_id: self.ctx.alloc_id.clone(),
            job_name: self.ctx.job.name.clone(),
            group_name: self.ctx.group.name.clone(),
            config: prepare.config.as_ref().unwrap_or(&task.config).to_string(),
            env: prepare.env,
            task_dir: prepare.task_dir,
            mounts: prepare.mounts,
            stdout: self.ctx.alloc_dir.stdout(&task.name),
            stderr: self.ctx.alloc_dir.stderr(&task.name),
            logs: task.logs,
            privileged: task
                .csi_plugin
                .as_ref()
                .is_some_and(|p| self.ctx.config.csi_privileged(&p.id, &self.ctx.job)),
            user,
            allow_unconfined: self.allows_unconfined(),
            cgroup_procs,
            collector_cgroup_procs,
            // The group's namespace (bridge mode), once the network hook attached it.
            network_namespace,
            etc_files: self.ctx.alloc_dir.group_etc_files(),
            image_user_namespace: self.image_user_namespace(user),
            progress: Some({
                let events = self.task_events.clone();
                berth_model::driver::TaskProgress(std::sync::Arc::new(move |message| {
                    events.emit(EventKind::Driver, message)
                }))
            }),
            own_network: self.ctx.own_network.clone(),
        };
        let handle = match self.ctx.driver.start_task(&request).await {
            Ok(handle) => handle,
            Err(error) => {
                let mut message = error.to_string();
                if let Some(why) = self.job_pids_share_used_up() {
                    message = format!("{why}: {message}");
                }
                self.emit(EventKind::DriverFailure, message);
                self.release_cgroup();
                return Err(RunOnce::DriverFailed);
            }
        };
        let stored = StoredHandle {
            driver: self.ctx.driver.name().to_string(),
            handle: handle.clone(),
        };
        // Lazy, because the Running transition right below is a durable commit, which
        // puts the handle on disk with it, before Started is reported.
        let sink = &self.events;
        if let Err(error) =
            sink.store
                .put_task_handle(&sink.alloc_id, &task.name, &stored, Commit::Lazy)
        {
            tracing::error!(alloc = %sink.alloc_id, task = %task.name, %error,
                "recording the task's driver handle: the task cannot be recovered after an agent restart");
        }
        self.state.lock().unwrap().mounts = request.mounts;
        self.set_state(TaskStateKind::Running, false);
        self.emit(EventKind::Started, "Task started by client");
        for hook in &self.hooks {
            hook.poststart(&self.ctx).await;
        }
        self.flush_reports();
        Ok(handle)
    }

    /// Waits for the task (or a stop), then runs the exited hooks and drops the handle.
    async fn supervise(&mut self, handle: TaskHandle) -> RunOnce {
        let task = &self.ctx.task;
        let driver = self.ctx.driver.clone();
        enum Waited {
            Exit(Result<ExitResult, berth_runtime::driver::DriverError>),
            Stop,
            Restart,
            UserRestart(tokio::sync::oneshot::Sender<Result<(), ControlError>>),
            Kill(tokio::sync::oneshot::Sender<Result<(), ControlError>>),
            RanTooLong(Duration),
        }
        let deadline = self.run_deadline();
        let waited = {
            let wait = driver.wait_task(&handle);
            tokio::pin!(wait);
            let too_long = async {
                match deadline {
                    Some((at, _)) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::pin!(too_long);
            loop {
                let request = tokio::select! {
                    exit = &mut wait => break Waited::Exit(exit),
                    _ = &mut too_long => {
                        break Waited::RanTooLong(deadline.map(|(_, max)| max).unwrap_or_default());
                    }
                    _ = self.stop.wait_for(|stop| *stop) => break Waited::Stop,
                    Some(reason) = self.restart_requests.recv() => {
                        self.task_events.emit(EventKind::RestartSignaled, reason);
                        break Waited::Restart;
                    }
                    Some(request) = self.user_requests.recv() => request,
                };
                match request {
                    control::TaskRequest::Restart { reason, done } => {
                        self.emit(EventKind::RestartSignaled, reason);
                        break Waited::UserRestart(done);
                    }
                    // The task keeps running: back to waiting on it.
                    control::TaskRequest::Signal { signal, done } => {
                        let _ = done.send(self.signal(&handle, &signal).await);
                    }
                    control::TaskRequest::Exec { command, done } => {
                        self.exec(&handle, command, done);
                    }
                    control::TaskRequest::Session { command, done } => {
                        self.start_session(&handle, command, done);
                    }
                    control::TaskRequest::Kill { reason, done } => {
                        self.emit(EventKind::Killing, reason);
                        break Waited::Kill(done);
                    }
                }
            }
        };
        let outcome = match waited {
            Waited::Exit(Ok(exit)) => {
                let exit = self.with_oom_kills(exit);
                self.terminated(&exit);
                RunOnce::Exited(Some(exit))
            }
            Waited::Exit(Err(error)) => {
                self.emit(
                    EventKind::DriverFailure,
                    format!("waiting for the task: {error}"),
                );
                RunOnce::Exited(None)
            }
            Waited::Stop => {
                self.kill(&handle).await;
                RunOnce::Stopped
            }
            // The restart policy decides what happens next, as for a failed exit.
            Waited::Restart => {
                self.kill(&handle).await;
                RunOnce::Exited(None)
            }
            Waited::UserRestart(done) => {
                self.kill(&handle).await;
                let _ = done.send(Ok(()));
                RunOnce::UserRestart
            }
            Waited::Kill(done) => {
                self.kill(&handle).await;
                let _ = done.send(Ok(()));
                RunOnce::Killed
            }
            // Failed for good: another run would be stopped the same way.
            Waited::RanTooLong(max) => {
                self.emit(
                    EventKind::Killing,
                    format!("Task exceeded its max_run_duration of {max:?}; killing it"),
                );
                self.kill(&handle).await;
                RunOnce::Killed
            }
        };
        // Requests that came as the run ended found it over.
        while let Ok(request) = self.user_requests.try_recv() {
            self.refuse(request);
        }
        let exit = match &outcome {
            RunOnce::Exited(exit) => *exit,
            _ => None,
        };
        for hook in &self.hooks {
            hook.exited(&self.ctx, exit.as_ref()).await;
        }
        self.flush_reports();
        if let Err(error) = driver.destroy_task(&handle, true).await {
            tracing::warn!(task = %task.name, %error, "destroying the task's driver state");
        }
        self.release_cgroup();
        driver.release(&handle);
        self.forget_handle();
        outcome
    }

    /// When this run has lasted its `max_run_duration`, counted from its Started event (so
    /// from its start in an earlier agent, for a recovered task), and that duration.
    fn run_deadline(&self) -> Option<(tokio::time::Instant, Duration)> {
        let max = self.ctx.task.max_run_duration?;
        let started_ms = (self.state.lock().unwrap().events.iter().rev())
            .find(|event| event.kind == EventKind::Started)
            .map(|event| event.time_ms);
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        // Without its Started event (dropped from a long history), from now.
        let ran = Duration::from_millis(started_ms.map_or(0, |ms| now_ms.saturating_sub(ms)));
        Some((tokio::time::Instant::now() + max.saturating_sub(ran), max))
    }

    /// Whether the operator lets this task's driver, from the file it was loaded from,
    /// spawn unconfined.
    fn allows_unconfined(&self) -> bool {
        driver_allows_unconfined(&self.ctx.driver, &self.ctx.config)
    }

    /// The task's limits: `resources` and the operator's cgroup settings.
    fn limits(&self) -> TaskLimits {
        let task = &self.ctx.task;
        let resources = &task.resources;
        let memory = u64::from(resources.memory_mb) * MIB;
        TaskLimits {
            memory_bytes: resources
                .memory_max_mb
                .map_or(memory, |max| u64::from(max) * MIB),
            memory_soft_bytes: resources.memory_max_mb.map(|_| memory),
            cpu_shares: cpu_shares(resources.cpu.into()),
            pids_max: self.ctx.sys.cgroup_settings().pids_max,
            // Unconfined drivers are root on the host by the operator's choice. A CSI
            // plugin granted mounting binds directories: it gets no device either.
            restrict_devices: !self.allows_unconfined(),
        }
    }

    fn cgroup_name(&self) -> String {
        cgroup_name(&self.ctx.job.name, &self.ctx.alloc_id, &self.ctx.task.name)
    }

    /// Why the run's processes were refused, when it was its job's pids share.
    fn job_pids_share_used_up(&self) -> Option<String> {
        let max = self.cgroup.as_ref()?.job_pids_share_used_up()?;
        Some(format!(
            "the job's pids share is used up: all its tasks and log collectors together \
             may have {max} processes at once (job_pids_max = {max} in the agent config)"
        ))
    }

    /// The cgroup a run before an agent restart made.
    fn existing_cgroup(&self) -> Box<dyn RunCgroup> {
        self.ctx
            .sys
            .existing_cgroup(&self.cgroup_name(), &self.limits())
    }

    /// An image task's own user namespace, by the agent's `image { userns }`: its block
    /// of subordinate ids follows from its dynamic uid; the job's `user` is the image's.
    fn image_user_namespace(
        &self,
        user: Option<berth_model::driver::TaskUser>,
    ) -> Option<berth_model::driver::ImageUserNamespace> {
        let config = &self.ctx.config;
        let isolation = self.ctx.driver.capabilities().fs_isolation;
        if !crate::validate::has_own_user_namespace(isolation, config) {
            return None;
        }
        // Only over the task's own ids: a CSI plugin keeping root never gets here.
        let dynamic = self
            .ctx
            .dynamic_user
            .filter(|dynamic| user == Some(*dynamic))?;
        let subordinate = config.users.subordinate_block(dynamic.uid)?;
        Some(berth_model::driver::ImageUserNamespace {
            subordinate,
            user: self.ctx.task.user.clone(),
        })
    }

    /// Kills what is left in the run's cgroup and removes it.
    fn release_cgroup(&mut self) {
        let Some(cgroup) = self.cgroup.take() else {
            return;
        };
        if let Err(error) = berth_sys::blocking::run(|| cgroup.kill_and_remove()) {
            tracing::error!(alloc = %self.ctx.alloc_id, task = %self.ctx.task.name, %error,
                "releasing the task's cgroup");
            self.emit(
                EventKind::Killing,
                format!("the task's processes could not all be stopped: {error}"),
            );
        }
    }

    /// The exit as the host saw it: an OOM kill is read from the task's cgroup.
    fn with_oom_kills(&self, mut exit: ExitResult) -> ExitResult {
        if self.cgroup.as_ref().is_some_and(|c| c.oom_kills() > 0) {
            exit.oom_killed = true;
        }
        exit
    }

    fn terminated(&self, exit: &ExitResult) {
        if exit.exit_code < 0 && exit.signal == 0 {
            // Exit codes are 0..=255: a negative one is the driver saying it could not
            // read the status, which happens for a task adopted after an agent restart.
            self.emit(
                EventKind::Terminated,
                "Exit status unknown: the task was recovered after an agent restart, and \
                 only the process that started it could read its status",
            );
            return;
        }
        self.state.lock().unwrap().exit_code = Some(exit.exit_code);
        let mut message = format!("Exit Code: {}", exit.exit_code);
        if exit.signal != 0 {
            message.push_str(&format!(", Signal: {}", exit.signal));
        }
        if exit.oom_killed {
            message.push_str(", OOM Killed");
        }
        if exit.exit_code != 0
            && let Some(why) = self.job_pids_share_used_up()
        {
            message.push_str(&format!(", {why}"));
        }
        self.emit(EventKind::Terminated, message);
    }

    async fn kill(&self, handle: &TaskHandle) {
        for hook in &self.hooks {
            hook.stop(&self.ctx).await;
        }
        self.flush_reports();
        let task = &self.ctx.task;
        if !task.shutdown_delay.is_zero() {
            self.emit(
                EventKind::WaitingShutdownDelay,
                format!(
                    "Waiting for shutdown_delay of {:?} before killing the task.",
                    task.shutdown_delay
                ),
            );
            tokio::time::sleep(task.shutdown_delay).await;
        }
        let kill_timeout = self.ctx.config.kill_timeout_of(task.kill_timeout);
        self.emit(
            EventKind::Killing,
            format!("Sent interrupt. Waiting {kill_timeout:?} before force killing"),
        );
        let driver = &self.ctx.driver;
        if let Err(error) = driver
            .stop_task(handle, kill_timeout, &task.kill_signal)
            .await
        {
            self.emit(
                EventKind::DriverFailure,
                format!("stopping the task: {error}"),
            );
        }
        match tokio::time::timeout(
            kill_timeout.saturating_add(Duration::from_secs(5)),
            driver.wait_stopped_task(handle),
        )
        .await
        {
            Ok(Ok(exit)) => self.terminated(&self.with_oom_kills(exit)),
            Ok(Err(error)) => {
                tracing::warn!(task = %task.name, %error, "waiting for a killed task")
            }
            Err(_) => tracing::warn!(task = %task.name, "a killed task did not exit in time"),
        }
        self.emit(EventKind::Killed, "Task successfully killed");
    }
}

/// The name of a task's cgroup under the agent's parent cgroup.
pub fn cgroup_name(job: &str, alloc_id: &str, task: &str) -> String {
    berth_sys::cgroup::Cgroups::task_name(job, alloc_id, task)
}

enum RunOnce {
    /// The task ran and exited (`None`: the driver could not say how).
    Exited(Option<ExitResult>),
    Stopped,
    SetupFailed,
    /// A prestart hook failed in a way another try may mend (a download).
    SetupToRetry,
    DriverFailed,
    /// The user asked for a restart; the run was killed.
    UserRestart,
    /// Killed and failed for good, without a restart.
    Killed,
}
