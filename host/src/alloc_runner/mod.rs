//! Runs one allocation: its alloc hooks, then its task runners, then postrun.
//!
//! ```text
//!   prerun hooks (alloc_dir, csi*) ──► task runners (concurrently) ──► postrun hooks
//!        │ failure: unwind the hooks that ran, in reverse
//!        ▼
//!   alloc failed, tasks never start
//! ```
//! (*) the CSI hook slot is filled by the CSI work.

pub mod alloc_dir;
pub mod hook_resources;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use serde::Serialize;
use tokio::sync::{mpsc, watch};

use crate::config::AgentConfig;
use crate::driver_set::DriverSet;
use crate::events::{AllocEvent, EventKind, TaskEvent, TaskState, TaskStateKind};
use crate::jobspec::{Group, Job};
use crate::task_runner::hooks::{BoxFuture, HookError, TaskHookContext};
use crate::task_runner::{EventSink, Outcome, TaskRunner};
use alloc_dir::AllocDir;
use hook_resources::HookResources;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ClientStatus {
    Pending,
    Running,
    Complete,
    Failed,
}

/// What `berth alloc status` shows.
#[derive(Debug, Clone, Serialize)]
pub struct AllocStatus {
    pub id: String,
    pub name: String,
    pub client_status: ClientStatus,
    pub alloc_dir: PathBuf,
    pub tasks: BTreeMap<String, TaskState>,
}

/// An alloc hook: one method per phase, no-op by default.
pub trait AllocHook: Send + Sync {
    fn name(&self) -> &'static str;

    fn prerun<'a>(&'a self, _alloc: &'a AllocRunner) -> BoxFuture<'a, Result<(), HookError>> {
        Box::pin(async { Ok(()) })
    }

    /// Undoes what prerun did; runs in reverse order after a later hook failed, and
    /// after the tasks finished.
    fn postrun<'a>(&'a self, _alloc: &'a AllocRunner) -> BoxFuture<'a, ()> {
        Box::pin(async {})
    }
}

/// The alloc hooks, in order.
fn alloc_hooks() -> Vec<Box<dyn AllocHook>> {
    vec![Box::new(AllocDirHook)]
}

/// Creates the alloc directory.
struct AllocDirHook;

impl AllocHook for AllocDirHook {
    fn name(&self) -> &'static str {
        "alloc_dir"
    }

    fn prerun<'a>(&'a self, alloc: &'a AllocRunner) -> BoxFuture<'a, Result<(), HookError>> {
        Box::pin(async move {
            alloc.alloc_dir.build().map_err(|e| HookError {
                hook: "alloc_dir",
                message: format!("creating {}: {e}", alloc.alloc_dir.root().display()),
            })
        })
    }
}

pub struct AllocRunner {
    pub id: String,
    pub name: String,
    pub job: Arc<Job>,
    pub group: Arc<Group>,
    pub alloc_dir: AllocDir,
    pub drivers: DriverSet,
    pub config: Arc<AgentConfig>,
    /// Exists from construction on, before any hook runs.
    pub resources: Arc<HookResources>,
    status: Mutex<ClientStatus>,
    task_states: Mutex<BTreeMap<String, Arc<Mutex<TaskState>>>>,
    events: mpsc::UnboundedSender<AllocEvent>,
    stop: watch::Sender<bool>,
}

impl AllocRunner {
    pub fn new(
        job: Arc<Job>,
        group_index: usize,
        alloc_index: u32,
        data_dir: &std::path::Path,
        drivers: DriverSet,
        config: Arc<AgentConfig>,
        events: mpsc::UnboundedSender<AllocEvent>,
    ) -> Arc<AllocRunner> {
        let group = Arc::new(job.groups[group_index].clone());
        let id = new_alloc_id();
        let name = format!("{}.{}[{alloc_index}]", job.name, group.name);
        let (stop, _) = watch::channel(false);
        Arc::new(AllocRunner {
            alloc_dir: AllocDir::new(data_dir, &id),
            id,
            name,
            job,
            group,
            drivers,
            config,
            resources: Arc::default(),
            status: Mutex::new(ClientStatus::Pending),
            task_states: Mutex::default(),
            events,
            stop,
        })
    }

    /// Asks every task to stop.
    pub fn stop(&self) {
        let _ = self.stop.send(true);
    }

    pub fn status(&self) -> AllocStatus {
        AllocStatus {
            id: self.id.clone(),
            name: self.name.clone(),
            client_status: *self.status.lock().unwrap(),
            alloc_dir: self.alloc_dir.root().to_path_buf(),
            tasks: self
                .task_states
                .lock()
                .unwrap()
                .iter()
                .map(|(name, state)| (name.clone(), state.lock().unwrap().clone()))
                .collect(),
        }
    }

    fn set_status(&self, status: ClientStatus) {
        *self.status.lock().unwrap() = status;
    }

    /// Runs the alloc to the end and returns its final status.
    pub async fn run(self: Arc<Self>) -> ClientStatus {
        let hooks = alloc_hooks();
        for (index, hook) in hooks.iter().enumerate() {
            if let Err(error) = hook.prerun(&self).await {
                for done in hooks[..index].iter().rev() {
                    done.postrun(&self).await;
                }
                self.fail_all_tasks(&format!("alloc hook {error}"));
                self.set_status(ClientStatus::Failed);
                return ClientStatus::Failed;
            }
        }
        self.set_status(ClientStatus::Running);
        let mut runners = tokio::task::JoinSet::new();
        for task in &self.group.tasks {
            let Some(driver) = self.drivers.get(&task.driver).cloned() else {
                self.fail_task(
                    &task.name,
                    EventKind::DriverFailure,
                    &format!("unknown driver {:?}", task.driver),
                );
                continue;
            };
            let ctx = TaskHookContext {
                alloc_id: self.id.clone(),
                job: self.job.clone(),
                group: self.group.clone(),
                task: task.clone(),
                alloc_dir: self.alloc_dir.clone(),
                driver,
                config: self.config.clone(),
                resources: self.resources.clone(),
            };
            let sink = EventSink {
                alloc_id: self.id.clone(),
                alloc_name: self.name.clone(),
                sender: self.events.clone(),
            };
            let runner = TaskRunner::new(ctx, sink, self.stop.subscribe());
            self.task_states
                .lock()
                .unwrap()
                .insert(task.name.clone(), runner.state());
            runners.spawn(runner.run());
        }
        let mut failed = self.status.lock().unwrap().eq(&ClientStatus::Failed);
        while let Some(outcome) = runners.join_next().await {
            failed |= !matches!(outcome, Ok(Outcome::Succeeded | Outcome::Stopped));
        }
        for hook in hooks.iter().rev() {
            hook.postrun(&self).await;
        }
        let status = if failed {
            ClientStatus::Failed
        } else {
            ClientStatus::Complete
        };
        self.set_status(status);
        status
    }

    fn fail_all_tasks(&self, message: &str) {
        for task in &self.group.tasks {
            self.fail_task(&task.name, EventKind::SetupFailure, message);
        }
    }

    fn fail_task(&self, task: &str, kind: EventKind, message: &str) {
        let event = TaskEvent::new(kind, message);
        let state = TaskState {
            state: TaskStateKind::Dead,
            failed: true,
            events: vec![event.clone()],
            ..TaskState::default()
        };
        self.task_states
            .lock()
            .unwrap()
            .insert(task.to_string(), Arc::new(Mutex::new(state)));
        *self.status.lock().unwrap() = ClientStatus::Failed;
        let _ = self.events.send(AllocEvent {
            alloc_id: self.id.clone(),
            alloc_name: self.name.clone(),
            task: task.to_string(),
            event,
        });
    }
}

/// A random id in the UUID text shape.
pub fn new_alloc_id() -> String {
    let mut bytes = [0u8; 16];
    if rustix::rand::getrandom(&mut bytes, rustix::rand::GetRandomFlags::empty()).is_err() {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        bytes = (nanos ^ u128::from(std::process::id())).to_le_bytes();
    }
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
}
