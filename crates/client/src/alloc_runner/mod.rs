//! Runs one allocation: its alloc hooks, then its task runners in lifecycle order, then
//! postrun.
//!
//! ```text
//!   prerun hooks (alloc_dir, network, etc_files, csi_hook, group_services)
//!        │ ok                                    │ failure: unwind the hooks that ran,
//!        ▼                                       ▼ in reverse; the tasks never start
//!   tasks by lifecycle (lifecycle.rs)        alloc failed
//!        │
//!        ▼
//!   postrun hooks, in reverse
//! ```
//!
//! The alloc's record, its hook resources and its tasks' states are written to the
//! [`StateStore`] as they change; [`AllocRunner::restore`] rebuilds a runner from them.

mod csi_hook;
mod disk;
mod etc_files;
mod lifecycle;
mod network;
pub use network::{Holder, forwarded_ports};
pub mod ports;
mod task_network;
pub mod users;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use tokio::sync::{Notify, broadcast, watch};

use tracing::Instrument;

use crate::config::AgentConfig;
use crate::driver_set::DriverSet;
use crate::hook_set::HookSet;
use crate::task_runner::hooks::{BoxFuture, HookError, TaskHookContext};
use crate::task_runner::{ControlError, EventSink, Outcome, TaskControl, TaskRunner};
use berth_jobspec::{Group, Job, Task};
use berth_model::driver::TaskHandle;
use berth_model::events::{AllocEvent, EventKind, TaskEvent, TaskState, TaskStateKind};
use berth_model::hook_resources::HookResources;
use berth_model::status::{ClientStatus, DesiredStatus};
use berth_state::{AllocRecord, Commit, StateError, StateStore};
use berth_sys::alloc_dir::AllocDir;

/// The hook state key under which an alloc's hook resources are recorded.
const HOOK_RESOURCES_KEY: &str = "hook_resources";

/// What `berth alloc status` shows.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AllocStatus {
    pub id: String,
    pub name: String,
    pub job_id: String,
    pub desired_status: DesiredStatus,
    pub client_status: ClientStatus,
    pub alloc_dir: PathBuf,
    pub tasks: BTreeMap<String, TaskState>,
    /// What the alloc's directory held when last measured (`None`: not yet).
    #[serde(default)]
    pub disk_used_bytes: Option<u64>,
    /// Its `ephemeral_disk` size.
    #[serde(default)]
    pub disk_limit_bytes: u64,
    /// Who holds the alloc to its size: the kernel's mechanism (`image`,
    /// `project-quota`), or `measured` (an alloc an older build made); `None`: not yet.
    #[serde(default)]
    pub disk_limited_by: Option<String>,
    /// Inodes used, and the most it may use (`None`: not limited by the kernel).
    #[serde(default)]
    pub disk_inodes: Option<(u64, u64)>,
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
    vec![
        Box::new(AllocDirHook),
        Box::new(network::NetworkHook),
        Box::new(etc_files::EtcFilesHook),
        Box::new(csi_hook::CsiHook),
        Box::new(GroupServicesHook),
    ]
}

/// The group's `service` blocks: registered before its tasks start (as Nomad's group
/// service hook), and with every service of the alloc deregistered after they end.
struct GroupServicesHook;

impl AllocHook for GroupServicesHook {
    fn name(&self) -> &'static str {
        "group_services"
    }

    fn prerun<'a>(&'a self, alloc: &'a AllocRunner) -> BoxFuture<'a, Result<(), HookError>> {
        Box::pin(async move {
            if alloc.group.services.is_empty() {
                return Ok(());
            }
            let names = |name: &str| -> Option<String> {
                match name {
                    "NOMAD_ALLOC_ID" => Some(alloc.id.clone()),
                    "NOMAD_JOB_NAME" | "NOMAD_JOB_ID" => Some(alloc.job.name.clone()),
                    "NOMAD_GROUP_NAME" => Some(alloc.group.name.clone()),
                    _ => name
                        .strip_prefix("meta.")
                        .and_then(|key| {
                            alloc
                                .group
                                .meta
                                .iter()
                                .chain(&alloc.job.meta)
                                .find(|(k, _)| k == key)
                                .map(|(_, v)| v.clone())
                        })
                        .or_else(|| alloc.node.facts.get(name).cloned()),
                }
            };
            let address = crate::consul::service_address(alloc.node.config.consul.as_ref());
            let alloc_address = alloc.resources.network().and_then(|n| n.address);
            let source = crate::consul::build::ServiceSource {
                alloc_id: &alloc.id,
                task: None,
                group: &alloc.group.name,
                ports: &alloc.group.ports,
                network_mode: alloc.group.network_mode,
                address: &address,
                alloc_address: alloc_address.as_deref(),
                lookup: &names,
            };
            let registrations = crate::consul::build::registrations(&alloc.group.services, &source)
                .map_err(|e| HookError {
                    hook: "group_services".into(),
                    message: e.to_string(),
                })?;
            alloc.node.services.set(
                crate::consul::Owner {
                    alloc: alloc.id.clone(),
                    task: None,
                    job: alloc.job.name.clone(),
                },
                registrations,
            );
            Ok(())
        })
    }

    fn postrun<'a>(&'a self, alloc: &'a AllocRunner) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            alloc.node.services.remove_alloc(&alloc.id);
            if let Some(api) = alloc.node.services.api() {
                crate::task_runner::revoke_tokens(api, &alloc.alloc_dir.si_token_accessors()).await;
            }
        })
    }
}

/// Creates the alloc directory, limited to the alloc's `ephemeral_disk` (see [`disk`]).
struct AllocDirHook;

impl AllocHook for AllocDirHook {
    fn name(&self) -> &'static str {
        "alloc_dir"
    }

    fn prerun<'a>(&'a self, alloc: &'a AllocRunner) -> BoxFuture<'a, Result<(), HookError>> {
        Box::pin(async move {
            alloc.limit_disk().map_err(|error| HookError {
                hook: "alloc_dir".into(),
                message: error.to_string(),
            })?;
            alloc.alloc_dir.build().map_err(|e| HookError {
                hook: "alloc_dir".into(),
                message: format!("creating {}: {e}", alloc.alloc_dir.root().display()),
            })?;
            alloc.share_alloc_dir()
        })
    }
}

/// What every alloc runner of an agent shares.
#[derive(Clone)]
pub struct NodeContext {
    pub data_dir: PathBuf,
    pub drivers: DriverSet,
    pub hooks: HookSet,
    pub config: Arc<AgentConfig>,
    pub store: Arc<StateStore>,
    /// Every task event, as it happens (sending never blocks; nobody listening is fine).
    pub events: broadcast::Sender<AllocEvent>,
    pub csi: Arc<berth_csi::CsiNode>,
    /// The privileged operations (cgroups, ownership, users).
    pub sys: Arc<dyn berth_sys::Sys>,
    /// The services of running tasks and groups, kept registered in Consul.
    pub services: Arc<crate::consul::ServiceClient>,
    /// The cluster's keyring, which signs workload identities.
    pub identities: Arc<crate::identity::Keyring>,
    /// `user { dynamic_range }`'s ids, which allocs take and give back ([`users`]).
    pub dynamic_users: Arc<berth_sys::process::dynamic_users::DynamicUsers>,
    /// This node's attributes (`node`), for interpolation and constraints.
    pub facts: crate::node::Facts,
}

/// Why a recorded alloc could not be restored after an agent restart.
#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    #[error("alloc {alloc} refers to group #{index} of job {job:?}, which has {groups} group(s)")]
    NoSuchGroup {
        alloc: String,
        index: usize,
        job: String,
        groups: usize,
    },
    #[error(transparent)]
    State(#[from] StateError),
}

pub struct AllocRunner {
    pub id: String,
    pub name: String,
    pub job: Arc<Job>,
    pub group: Arc<Group>,
    pub alloc_dir: AllocDir,
    node: NodeContext,
    /// Exists from construction on, before any hook runs, also when restored.
    pub resources: Arc<HookResources>,
    record: Mutex<AllocRecord>,
    /// Every task of the group, from construction on (pending until its runner starts).
    task_states: BTreeMap<String, Arc<Mutex<TaskState>>>,
    /// The running task runners' ends for a user's requests, by task.
    task_controls: Mutex<BTreeMap<String, TaskControl>>,
    /// Handles recorded before an agent restart, taken by the task runners.
    restored_handles: Mutex<BTreeMap<String, TaskHandle>>,
    restored: bool,
    /// Wakes the lifecycle when any task state changes.
    changed: Arc<Notify>,
    stop: watch::Sender<bool>,
    /// Bytes in the alloc's directory when last measured ([`disk`]); `u64::MAX`: not yet.
    disk_used: std::sync::atomic::AtomicU64,
    /// How the alloc's disk is limited, and its inodes (see [`AllocStatus`]).
    disk_limit: Mutex<disk::DiskReport>,
    /// The ids the alloc took from `user { dynamic_range }` ([`users`]).
    users: Mutex<Option<users::AllocUsers>>,
}

impl AllocRunner {
    /// A new alloc of `job`'s group `group_index`. The record is written before this
    /// returns, so the alloc is known to a restarted agent from the start.
    pub fn new(
        job: Arc<Job>,
        group_index: usize,
        alloc_index: u32,
        node: NodeContext,
    ) -> Result<Arc<AllocRunner>, StateError> {
        let ports = ports::allocate(&job.groups[group_index].ports, &mut Default::default())
            .unwrap_or_default();
        let record = Self::new_record(&job, group_index, alloc_index, ports);
        node.store.put_alloc(&record)?;
        Ok(Self::recorded(job, record, node))
    }

    /// The record of a new alloc of `job`'s group `group_index` with its dynamic ports'
    /// numbers, to be written (with its job's and its siblings', in one transaction)
    /// before [`AllocRunner::recorded`].
    pub fn new_record(
        job: &Job,
        group_index: usize,
        alloc_index: u32,
        ports: BTreeMap<String, u16>,
    ) -> AllocRecord {
        let group = &job.groups[group_index];
        AllocRecord {
            ports,
            id: new_alloc_id(),
            job_id: job.name.clone(),
            group_index,
            alloc_index,
            name: format!("{}.{}[{alloc_index}]", job.name, group.name),
            desired_status: DesiredStatus::Run,
            client_status: ClientStatus::Pending,
        }
    }

    /// The runner of a new alloc whose record the caller has written.
    pub fn recorded(job: Arc<Job>, record: AllocRecord, node: NodeContext) -> Arc<AllocRunner> {
        let group = &job.groups[record.group_index];
        let states = group
            .tasks
            .iter()
            .map(|task| (task.name.clone(), TaskState::default()))
            .collect();
        Self::build(
            job,
            record,
            node,
            HookResources::default(),
            states,
            BTreeMap::new(),
            false,
        )
    }

    /// The runner of an alloc recorded before an agent restart. Fails only when the
    /// record does not match the job (the job changed shape under it).
    pub fn restore(
        job: Arc<Job>,
        record: AllocRecord,
        node: NodeContext,
    ) -> Result<Arc<AllocRunner>, RestoreError> {
        let Some(group) = job.groups.get(record.group_index) else {
            return Err(RestoreError::NoSuchGroup {
                alloc: record.id.clone(),
                index: record.group_index,
                job: job.name.clone(),
                groups: job.groups.len(),
            });
        };
        let (mut recorded, unreadable) = node.store.task_states(&record.id)?;
        for problem in unreadable {
            tracing::error!("{problem}");
        }
        let mut states = BTreeMap::new();
        let mut handles = BTreeMap::new();
        for task in &group.tasks {
            let state = recorded
                .iter()
                .position(|(name, _)| *name == task.name)
                .map(|i| recorded.swap_remove(i).1)
                .unwrap_or_default();
            match node.store.task_handle(&record.id, &task.name) {
                Ok(Some(stored)) => {
                    handles.insert(task.name.clone(), stored.handle);
                }
                Ok(None) => {}
                Err(error) => tracing::error!(alloc = %record.id, task = %task.name, %error,
                    "the task's driver handle is unreadable; the task will be started anew"),
            }
            states.insert(task.name.clone(), state);
        }
        let resources = match node.store.hook_state(&record.id, HOOK_RESOURCES_KEY) {
            Ok(Some(bytes)) => HookResources::from_bytes(&bytes).unwrap_or_else(|error| {
                tracing::error!(alloc = %record.id, %error, "recorded hook resources are unreadable");
                HookResources::default()
            }),
            Ok(None) => HookResources::default(),
            Err(error) => {
                tracing::error!(alloc = %record.id, %error, "reading hook resources");
                HookResources::default()
            }
        };
        let runner = Self::build(job, record, node, resources, states, handles, true);
        runner.restore_users();
        Ok(runner)
    }

    fn build(
        job: Arc<Job>,
        record: AllocRecord,
        node: NodeContext,
        resources: HookResources,
        states: BTreeMap<String, TaskState>,
        handles: BTreeMap<String, TaskHandle>,
        restored: bool,
    ) -> Arc<AllocRunner> {
        let mut group = job.groups[record.group_index].clone();
        group.ports = ports::resolve(&group.ports, &record.ports);
        let group = Arc::new(group);
        let (stop, _) = watch::channel(record.desired_status == DesiredStatus::Stop);
        Arc::new(AllocRunner {
            id: record.id.clone(),
            name: record.name.clone(),
            alloc_dir: if restored {
                AllocDir::existing(&node.data_dir, &record.id)
            } else {
                AllocDir::new(&node.data_dir, &record.id)
            },
            job,
            group,
            node,
            resources: Arc::new(resources),
            record: Mutex::new(record),
            task_states: states
                .into_iter()
                .map(|(name, state)| (name, Arc::new(Mutex::new(state))))
                .collect(),
            task_controls: Mutex::default(),
            restored_handles: Mutex::new(handles),
            restored,
            changed: Arc::default(),
            stop,
            disk_used: std::sync::atomic::AtomicU64::new(u64::MAX),
            disk_limit: Mutex::default(),
            users: Mutex::default(),
        })
    }

    /// Asks every task to stop. Recorded first, so a restarted agent finishes the stop.
    /// The group's services leave first, and with a group `shutdown_delay` the tasks are
    /// told after it.
    pub fn stop(&self) {
        {
            let mut record = self.record.lock().unwrap();
            record.desired_status = DesiredStatus::Stop;
            self.write_record(&record);
        }
        self.node.services.remove(&crate::consul::Owner {
            alloc: self.id.clone(),
            task: None,
            job: self.job.name.clone(),
        });
        let delay = self.group.shutdown_delay;
        // send_replace, not send: before the tasks subscribe there is no receiver, and
        // send would drop the stop (the alloc ran on, desired status stop).
        let runtime = tokio::runtime::Handle::try_current();
        match runtime {
            Ok(runtime) if !delay.is_zero() => {
                let stop = self.stop.clone();
                runtime.spawn(async move {
                    tokio::time::sleep(delay).await;
                    stop.send_replace(true);
                });
            }
            _ => {
                self.stop.send_replace(true);
            }
        }
    }

    /// Whether the alloc was asked to stop (before or, restored, after a restart).
    pub fn stop_requested(&self) -> bool {
        self.record.lock().unwrap().desired_status == DesiredStatus::Stop
    }

    pub fn client_status(&self) -> ClientStatus {
        self.record.lock().unwrap().client_status
    }

    pub fn is_terminal(&self) -> bool {
        matches!(
            self.client_status(),
            ClientStatus::Complete | ClientStatus::Failed
        )
    }

    pub fn status(&self) -> AllocStatus {
        let record = self.record.lock().unwrap().clone();
        let disk = self.disk_limit.lock().unwrap().clone();
        AllocStatus {
            id: record.id,
            name: record.name,
            job_id: record.job_id,
            desired_status: record.desired_status,
            client_status: record.client_status,
            alloc_dir: self.alloc_dir.root().to_path_buf(),
            tasks: self
                .task_states
                .iter()
                .map(|(name, state)| (name.clone(), state.lock().unwrap().clone()))
                .collect(),
            disk_used_bytes: Some(self.disk_used.load(std::sync::atomic::Ordering::Relaxed))
                .filter(|used| *used != u64::MAX),
            disk_limit_bytes: self.disk_limit(),
            disk_limited_by: disk.limited_by,
            disk_inodes: disk.inodes,
        }
    }

    /// Terminal statuses are durable; `running` is informative (a restarted agent runs
    /// every alloc that is not terminal) and goes to disk with the next durable commit.
    fn set_status(&self, status: ClientStatus) {
        let mut record = self.record.lock().unwrap();
        record.client_status = status;
        if status == ClientStatus::Running {
            if let Err(error) = self.node.store.put_alloc_lazily(&record) {
                tracing::error!(alloc = %record.id, %error, "recording the alloc");
            }
        } else {
            self.write_record(&record);
        }
    }

    fn write_record(&self, record: &AllocRecord) {
        if let Err(error) = self.node.store.put_alloc(record) {
            tracing::error!(alloc = %record.id, %error, "recording the alloc");
        }
    }

    fn save_resources(&self, commit: Commit) {
        save_resources(&self.node.store, &self.id, &self.resources, commit);
    }

    /// Forgets the alloc's mounts of CSI volume `volume_id`, which an operator detached
    /// by force: the give-back stops trying for it.
    pub fn forget_csi_volume(&self, volume_id: &str) {
        let names: Vec<String> = self
            .group
            .volumes
            .iter()
            .filter(|v| v.volume_type == berth_jobspec::VolumeType::Csi && v.source == volume_id)
            .map(|v| v.name.clone())
            .collect();
        let mut mounts = self.resources.csi_mounts();
        mounts.retain(|name, _| !names.contains(name));
        self.resources.set_csi_mounts(mounts);
        self.save_resources(Commit::Durable);
    }

    /// Whether this alloc still holds CSI volumes (mounted for it, or claimed).
    pub fn holds_csi_volumes(&self) -> bool {
        !self.resources.csi_mounts().is_empty()
    }

    /// Gives back, in the background, the CSI volumes this finished alloc still holds
    /// because their plugin could not be reached when it stopped: unpublish, unstage,
    /// controller unpublish and release, retried with backoff (1 s per failure so far,
    /// at most 30 s) until the plugin is back. A restarted agent starts this again for
    /// such allocs, from what the state file says they hold.
    pub fn give_back_csi(self: &Arc<Self>) {
        if !self.holds_csi_volumes() {
            return;
        }
        let alloc = self.clone();
        let span = tracing::info_span!("alloc", alloc_id = %self.id, job = %self.job.name);
        tokio::spawn(
            async move {
                let mut failures: u64 = 0;
                while alloc.holds_csi_volumes() {
                    if csi_hook::CsiHook::give_back(&alloc).await {
                        tracing::info!("gave back the alloc's CSI volumes");
                        return;
                    }
                    failures += 1;
                    let wait = std::time::Duration::from_secs(failures.min(30));
                    tracing::warn!(retry_in = ?wait, "CSI volumes still held: retrying");
                    tokio::time::sleep(wait).await;
                }
            }
            .instrument(span),
        );
    }

    /// Runs the alloc to the end and returns its final status. Everything it does, its
    /// task runners included, is logged within an `alloc` span (`alloc_id`, `job`).
    pub async fn run(self: Arc<Self>) -> ClientStatus {
        let span = tracing::info_span!("alloc", alloc_id = %self.id, job = %self.job.name);
        self.run_in_span().instrument(span).await
    }

    async fn run_in_span(self: Arc<Self>) -> ClientStatus {
        match self.take_users().await {
            users::Taking::Taken => {}
            users::Taking::Stopped => {
                self.set_status(ClientStatus::Complete);
                return ClientStatus::Complete;
            }
            users::Taking::Failed(why) => {
                self.fail_all_tasks(&why);
                self.set_status(ClientStatus::Failed);
                return ClientStatus::Failed;
            }
        }
        let hooks = alloc_hooks();
        for (index, hook) in hooks.iter().enumerate() {
            if let Err(error) = hook.prerun(&self).await {
                for done in hooks[..index].iter().rev() {
                    done.postrun(&self).await;
                }
                self.give_back_csi();
                self.fail_all_tasks(&format!("alloc hook {error}"));
                self.set_status(ClientStatus::Failed);
                return ClientStatus::Failed;
            }
        }
        // Lazy: the first task's durable state transition puts it on disk before any task
        // starts (and on restore it came from disk).
        self.save_resources(Commit::Lazy);
        if self.client_status() == ClientStatus::Pending {
            self.set_status(ClientStatus::Running);
        }
        let tasks = self.run_tasks();
        tokio::pin!(tasks);
        let (failed, over_disk) = tokio::select! {
            failed = &mut tasks => (failed, false),
            verdict = self.watch_disk() => {
                self.disk_exceeded(verdict);
                tasks.await;
                (true, true)
            }
        };
        self.remove_collectors();
        for hook in hooks.iter().rev() {
            hook.postrun(&self).await;
        }
        self.give_back_csi();
        if over_disk {
            self.remove_written_files();
        } else {
            self.measure_disk();
        }
        let status = if failed {
            ClientStatus::Failed
        } else {
            ClientStatus::Complete
        };
        self.set_status(status);
        status
    }

    /// Kills the alloc's log collectors, once all its tasks are over (each task's end
    /// already waited for its collector to write its last words), and removes their
    /// cgroup. A collector can outlive its task's run when the task handed its output
    /// to another process: this is where it ends. Also for an alloc restored finished
    /// (the agent may have died in between). A cgroup that is gone is fine.
    pub fn remove_collectors(&self) {
        let name = berth_sys::cgroup::Cgroups::collectors_name(&self.job.name, &self.id);
        let cgroup = self.node.sys.existing_collectors_cgroup(&name);
        if let Err(error) = berth_sys::blocking::run(|| cgroup.kill_and_remove()) {
            tracing::error!(%error, "removing the alloc's log collectors");
        }
    }

    /// Spawns the runner of one task onto `set`. Returns false (after failing the task)
    /// when its driver is not loaded.
    fn spawn_task(
        &self,
        task: &Task,
        stop: watch::Receiver<bool>,
        set: &mut tokio::task::JoinSet<Outcome>,
    ) -> bool {
        let Some(driver) = self.node.drivers.get(&task.driver).cloned() else {
            self.fail_task(
                &task.name,
                EventKind::DriverFailure,
                &format!("unknown driver {:?}", task.driver),
            );
            return false;
        };
        let ctx = TaskHookContext {
            alloc_id: self.id.clone(),
            job: self.job.clone(),
            group: self.group.clone(),
            task: task.clone(),
            dynamic_user: self.dynamic_user(&task.name),
            alloc_dir: self.alloc_dir.clone(),
            driver,
            config: self.node.config.clone(),
            resources: self.resources.clone(),
            plugin_hooks: self.node.hooks.for_task(task),
            reports: Arc::default(),
            csi: self.node.csi.clone(),
            sys: self.node.sys.clone(),
            services: self.node.services.clone(),
            identities: self.node.identities.clone(),
            facts: self.node.facts.clone(),
            events: None,
            restart: None,
            control: None,
            own_network: self.own_network_maker(&task.name),
            release_own_network: self.own_network_releaser(&task.name),
        };
        let sink = EventSink {
            alloc_id: self.id.clone(),
            alloc_name: self.name.clone(),
            sender: self.node.events.clone(),
            store: self.node.store.clone(),
            changed: self.changed.clone(),
        };
        let state = self.task_states[&task.name].clone();
        let (runner, control) = if self.restored {
            let handle = self.restored_handles.lock().unwrap().remove(&task.name);
            TaskRunner::restored(ctx, sink, stop, state, handle)
        } else {
            TaskRunner::new(ctx, sink, stop, state)
        };
        (self.task_controls.lock().unwrap()).insert(task.name.clone(), control);
        // The task's future runs as its own tokio task: it takes the alloc span along.
        set.spawn(runner.run().in_current_span());
        true
    }

    /// The tasks a user's restart or signal is for: `task`, which must be running, or
    /// (`None`) every running task, of which there must be one.
    fn running_tasks(&self, task: Option<&str>) -> Result<Vec<TaskControl>, ActionError> {
        let controls = self.task_controls.lock().unwrap();
        let running = |name: &str| {
            self.task_states
                .get(name)
                .is_some_and(|state| state.lock().unwrap().state == TaskStateKind::Running)
        };
        match task {
            Some(name) => {
                if !self.task_states.contains_key(name) {
                    return Err(ActionError::NoSuchTask {
                        alloc: self.id.clone(),
                        task: name.to_string(),
                    });
                }
                match controls.get(name) {
                    Some(control) if running(name) => Ok(vec![control.clone()]),
                    _ => Err(ControlError::NotRunning {
                        task: name.to_string(),
                    }
                    .into()),
                }
            }
            None => {
                let chosen: Vec<TaskControl> = controls
                    .iter()
                    .filter(|(name, _)| running(name))
                    .map(|(_, control)| control.clone())
                    .collect();
                if chosen.is_empty() {
                    return Err(ActionError::NothingRunning {
                        alloc: self.id.clone(),
                    });
                }
                Ok(chosen)
            }
        }
    }

    /// Restarts `task` (or every running task) at the user's request: each run is killed
    /// and started again at once, outside the restart policy (its `attempts` do not count
    /// it), with a "Restart Signaled" event. Answers once every run was killed.
    pub async fn restart_tasks(&self, task: Option<&str>) -> Result<(), ActionError> {
        let mut restarts = tokio::task::JoinSet::new();
        for control in self.running_tasks(task)? {
            restarts.spawn(async move { control.restart().await });
        }
        Self::all_done(restarts).await
    }

    /// Sends `signal` to `task` (or every running task) through its driver.
    pub async fn signal_tasks(&self, task: Option<&str>, signal: &str) -> Result<(), ActionError> {
        let mut signals = tokio::task::JoinSet::new();
        for control in self.running_tasks(task)? {
            let signal = signal.to_string();
            signals.spawn(async move { control.signal(&signal).await });
        }
        Self::all_done(signals).await
    }

    /// Starts an interactive command inside running task `task` (Nomad's `alloc
    /// exec`), in its confinement; answers once the command executes, with its streams.
    pub async fn start_session(
        &self,
        task: &str,
        command: crate::task_runner::SessionCommand,
    ) -> Result<berth_sys::process::session::Session, ActionError> {
        let running = self.running_tasks(Some(task))?;
        let Some(control) = running.into_iter().next() else {
            let task = task.to_string();
            return Err(ControlError::NotRunning { task }.into());
        };
        Ok(control.start_session(command).await?)
    }

    /// What each running task's cgroup counts as used now (Nomad's alloc stats).
    /// Blocking: small cgroupfs reads.
    pub fn task_usage(&self) -> BTreeMap<String, berth_model::usage::CgroupUsage> {
        (self.task_states.iter())
            .filter(|(_, state)| state.lock().unwrap().state == TaskStateKind::Running)
            .map(|(task, _)| {
                let cgroup = crate::task_runner::cgroup_name(&self.job.name, &self.id, task);
                (task.clone(), self.node.sys.cgroup_usage(&cgroup))
            })
            .collect()
    }

    /// Waits for every task's answer; the first refusal is the answer.
    async fn all_done(
        mut answers: tokio::task::JoinSet<Result<(), ControlError>>,
    ) -> Result<(), ActionError> {
        let mut outcome = Ok(());
        while let Some(answer) = answers.join_next().await {
            if let Ok(Err(error)) = answer
                && outcome.is_ok()
            {
                outcome = Err(error.into());
            }
        }
        outcome
    }

    fn fail_all_tasks(&self, message: &str) {
        for task in &self.group.tasks {
            self.fail_task(&task.name, EventKind::SetupFailure, message);
        }
    }

    fn fail_task(&self, task: &str, kind: EventKind, message: &str) {
        self.record_task_event(task, TaskEvent::new(kind, message), true);
    }

    /// Adds `event` to a task's state, as it is.
    fn task_event(&self, task: &str, event: TaskEvent) {
        self.record_task_event(task, event, false);
    }

    fn record_task_event(&self, task: &str, event: TaskEvent, dead: bool) {
        let snapshot = {
            let mut state = self.task_states[task].lock().unwrap();
            if dead {
                state.state = TaskStateKind::Dead;
                state.failed = true;
            }
            state.push_event(event.clone());
            state.clone()
        };
        if let Err(error) =
            self.node
                .store
                .put_task_state(&self.id, task, &snapshot, Commit::Durable)
        {
            tracing::error!(alloc = %self.id, task, %error, "recording the task state");
        }
        self.changed.notify_waiters();
        let _ = self.node.events.send(AllocEvent {
            alloc_id: self.id.clone(),
            alloc_name: self.name.clone(),
            task: task.to_string(),
            event,
        });
    }
}

/// Why a user's restart or signal was not carried out.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ActionError {
    #[error("alloc {alloc} has no task {task:?}")]
    NoSuchTask { alloc: String, task: String },
    #[error("no task of alloc {alloc} is running")]
    NothingRunning { alloc: String },
    #[error(transparent)]
    Task(#[from] ControlError),
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

/// Records an alloc's hook resources; a failure is logged (what was done stays done, and
/// is found again by what it left on the node).
fn save_resources(store: &StateStore, alloc_id: &str, resources: &HookResources, commit: Commit) {
    let written = resources
        .persist(|bytes| store.put_hook_state(alloc_id, HOOK_RESOURCES_KEY, bytes, commit));
    if let Err(error) = written {
        tracing::error!(alloc = %alloc_id, %error, "recording hook resources");
    }
}

#[cfg(test)]
mod tests;
