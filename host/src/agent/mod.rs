//! The agent: owns the state store, the jobs and their alloc runners, and restores them
//! after a restart. The HTTP API ([`crate::api`]) and `berth run` both drive it.
//!
//! ```text
//!   submit(HCL) ─► parse + validate ─► job record ─► alloc records ─► alloc runners
//!   start()     ─► open state.db ─► jobs (re-parsed from their source) ─► allocs:
//!                    live ones restored and run again, finished ones kept for status
//! ```
//!
//! Stopping the agent leaves tasks running, as Nomad's client does: the next agent
//! recovers them through their drivers.

pub mod data_dir;
mod launch;
pub mod logs;
mod volumes;

pub use volumes::{Detached, VolumeError};

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use tokio::sync::{broadcast, watch};

use crate::alloc_runner::{AllocRunner, AllocStatus, NodeContext};
use crate::config::AgentConfig;
use crate::driver_set::DriverSet;
use crate::hook_set::HookSet;
use crate::jobspec::{self, Job, JobType, JobspecError};
use crate::model::events::AllocEvent;
use crate::model::status::{ClientStatus, DesiredStatus};
use crate::state::{JobRecord, OpenOutcome, StateError, StateStore};

/// Where the agent keeps its state.
pub enum StateLocation {
    /// `<data_dir>/state.db`: survives restarts.
    DataDir,
    /// Nothing survives the process (`berth run`).
    Memory,
}

pub struct AgentOptions {
    pub data_dir: PathBuf,
    pub config: AgentConfig,
    pub drivers: DriverSet,
    pub hooks: HookSet,
    pub state: StateLocation,
}

/// Something the operator should know about the start, e.g. a state file moved aside.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Notice {
    pub level: NoticeLevel,
    pub message: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum NoticeLevel {
    Info,
    Warning,
    Error,
}

#[derive(Debug, thiserror::Error)]
pub enum SubmitError {
    #[error("{0}")]
    Invalid(JobspecError),
    /// A dispatch or forced launch the job does not allow (what it lacks, in words).
    #[error("{0}")]
    Refused(String),
    #[error(transparent)]
    Lookup(#[from] LookupError),
    #[error("recording the job: {0}")]
    State(#[from] StateError),
}

#[derive(Debug, thiserror::Error)]
pub enum LookupError {
    #[error("no {kind} matches {id:?}")]
    NotFound { kind: &'static str, id: String },
    #[error("{id:?} matches several allocs ({}): give more of the id", matches.join(", "))]
    Ambiguous { id: String, matches: Vec<String> },
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Submitted {
    pub job_id: String,
    pub alloc_ids: Vec<String>,
    /// Allocs of an earlier version of the job that were stopped first.
    pub replaced: Vec<String>,
    /// What the jobspec asks for that has no effect here (`file:line:col: path: why`).
    #[serde(default)]
    pub warnings: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AllocSummary {
    pub id: String,
    pub name: String,
    pub desired_status: DesiredStatus,
    pub client_status: ClientStatus,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum JobState {
    Pending,
    Running,
    Dead,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct JobStatus {
    pub id: String,
    #[serde(rename = "type")]
    pub job_type: JobType,
    pub source_name: String,
    pub submitted_ms: u64,
    pub stopped: bool,
    pub status: JobState,
    pub allocs: Vec<AllocSummary>,
    /// `periodic` or `parameterized`: the job launches children instead of placing
    /// allocs itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub launches: Option<String>,
    /// The job a child was launched from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
}

struct JobEntry {
    record: JobRecord,
    job: Arc<Job>,
}

/// What one garbage collection forgot: finished allocs, and the jobs that had nothing
/// left once they went.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Garbage {
    pub allocs: Vec<String>,
    #[serde(default)]
    pub jobs: Vec<String>,
}

struct CollectedAlloc {
    alloc: String,
    job: Option<String>,
}

/// `GET /v1/jobs` parameters, as Nomad names them.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct JobsQuery {
    pub prefix: Option<String>,
    pub per_page: Option<usize>,
    pub next_token: Option<String>,
}

fn job_status(record: JobRecord, job: &Job, allocs: Vec<AllocSummary>) -> JobStatus {
    let launches = if job.periodic.is_some() {
        Some("periodic".to_string())
    } else if job.parameterized.is_some() {
        Some("parameterized".to_string())
    } else {
        None
    };
    // A job that launches children runs for as long as it is not stopped, as in Nomad.
    let launching = launches.is_some() && !record.stopped;
    let status = if launching
        || allocs
            .iter()
            .any(|a| a.client_status == ClientStatus::Running)
    {
        JobState::Running
    } else if allocs
        .iter()
        .any(|a| a.client_status == ClientStatus::Pending)
    {
        JobState::Pending
    } else {
        JobState::Dead
    };
    JobStatus {
        id: record.id,
        job_type: job.job_type,
        parent: job.parent.clone(),
        launches,
        source_name: record.source_name,
        submitted_ms: record.submitted_ms,
        stopped: record.stopped,
        status,
        allocs,
    }
}

#[derive(Clone)]
struct AllocEntry {
    runner: Arc<AllocRunner>,
    /// Becomes true when the runner has finished (or was never run: already terminal).
    finished: watch::Receiver<bool>,
}

pub struct Agent {
    node: NodeContext,
    jobs: Mutex<BTreeMap<String, JobEntry>>,
    allocs: Mutex<BTreeMap<String, AllocEntry>>,
    events: broadcast::Sender<AllocEvent>,
    notices: Vec<Notice>,
    /// Serialises submits and stops, so two versions of a job never run at once.
    submitting: tokio::sync::Mutex<()>,
}

impl Agent {
    /// Opens the state and restores what it records. Problems with single records are
    /// notices, not errors: the agent runs with everything it could read.
    pub async fn start(options: AgentOptions) -> Result<Arc<Agent>, StateError> {
        let mut notices = Vec::new();
        // With state in memory too (`berth run`): the data dir still holds task dirs,
        // whose files a root task may have made setuid.
        let mut options = options;
        options.data_dir = data_dir::prepare(&options.data_dir).map_err(|e| StateError::Open {
            path: options.data_dir.clone(),
            message: format!("the data dir: {e}"),
        })?;
        let store = match options.state {
            StateLocation::Memory => StateStore::in_memory(),
            StateLocation::DataDir => {
                let path = options.data_dir.join("state.db");
                let (store, outcome) = StateStore::open(&path)?;
                match outcome {
                    OpenOutcome::Opened => {}
                    OpenOutcome::Created => notices.push(Notice {
                        level: NoticeLevel::Info,
                        message: format!("no state file at {}: starting fresh", path.display()),
                    }),
                    OpenOutcome::MovedAside { reason, moved_to } => notices.push(Notice {
                        level: NoticeLevel::Error,
                        message: format!(
                            "the state file {} could not be read: {reason}. It was kept at {} \
                             and the agent started with empty state; tasks it recorded are \
                             not supervised",
                            path.display(),
                            moved_to.display()
                        ),
                    }),
                }
                store
            }
        };
        let (events, _) = broadcast::channel(4096);
        tokio::spawn(log_events(events.subscribe()));
        let store = Arc::new(store);
        let csi = crate::csi::CsiNode::start(
            &options.data_dir,
            store.clone(),
            options.config.csi.clone(),
        );
        match crate::process::raise_open_files_limit() {
            Ok((before, after)) if after > before => {
                tracing::info!(before, after, "raised the agent's open-files limit");
            }
            Ok(_) => {}
            Err(error) => notices.push(Notice {
                level: NoticeLevel::Warning,
                message: format!(
                    "could not raise the agent's open-files limit ({error}): with many tasks \
                     the agent may run out of descriptors"
                ),
            }),
        }
        let cgroups = crate::cgroup::Cgroups::detect(options.config.cgroups.clone());
        let missing = cgroups.missing();
        if !missing.is_empty() {
            notices.push(Notice {
                level: NoticeLevel::Warning,
                message: format!(
                    "this node has no cgroup controller for {} ({}): {}",
                    missing.join(", "),
                    cgroups.describe(),
                    if cgroups.settings().allow_missing_controllers {
                        "tasks run without those limits (allow_missing_controllers = true)"
                    } else {
                        "tasks that need them fail to start; an operator may allow it with \
                         cgroups { allow_missing_controllers = true }"
                    }
                ),
            });
        }
        if cgroups.settings().favor_dynmods {
            match cgroups.favor_dynamic_modifications(&options.data_dir.join("cgroup-favordynmods"))
            {
                Ok(step) => tracing::info!(step = ?step.map(|s| s.to_string()), "favordynmods"),
                Err(error) => notices.push(Notice {
                    level: NoticeLevel::Warning,
                    message: error.to_string(),
                }),
            }
        }
        match cgroups.limit_all_tasks() {
            Ok(Some(pids)) => tracing::info!(pids, "node-wide ceiling on tasks' processes"),
            Ok(None) => {}
            Err(error) => notices.push(Notice {
                level: NoticeLevel::Warning,
                message: format!(
                    "could not set the node-wide ceiling on tasks' processes ({error}): tasks \
                     together may exhaust the host's pids"
                ),
            }),
        }
        tracing::info!(cgroups = %cgroups.describe(), "task cgroups");
        let services = crate::consul::ServiceClient::new(options.config.consul.as_ref())
            .unwrap_or_else(|error| {
                notices.push(Notice {
                    level: NoticeLevel::Warning,
                    message: format!("consul: {error}; services are registered without a token"),
                });
                crate::consul::ServiceClient::disabled()
            });
        let mut agent = Agent {
            node: NodeContext {
                sys: Arc::new(crate::sys::LinuxSys::new(cgroups)),
                data_dir: options.data_dir,
                drivers: options.drivers,
                hooks: options.hooks,
                config: Arc::new(options.config),
                store,
                events: events.clone(),
                csi,
                services: Arc::new(services),
            },
            jobs: Mutex::default(),
            allocs: Mutex::default(),
            events,
            notices,
            submitting: tokio::sync::Mutex::new(()),
        };
        let mut restore_notices = agent.restore()?;
        agent.notices.append(&mut restore_notices);
        let agent = Arc::new(agent);
        agent.run_restored();
        // After restore: the first sync must not take restored tasks' services for
        // orphans (their runners register them again as they recover).
        tokio::spawn(agent.node.services.clone().run());
        spawn_garbage_collector(&agent);
        launch::spawn_periodic_launcher(&agent);
        Ok(agent)
    }

    /// The services of running tasks and groups, and how their sync with Consul goes.
    pub fn services(&self) -> crate::consul::ServicesStatus {
        self.node.services.status()
    }

    /// Collects the finished allocs beyond the newest `gc { max_allocs }`, and more while
    /// the data dir's disk is fuller than `gc`'s thresholds: their records first, then
    /// their directories. An alloc with anything still mounted below its
    /// directory is kept (removing the directory would reach into the mount) and the
    /// agent's log says so. The ids collected, oldest first.
    pub fn collect_garbage(&self) -> Garbage {
        let mut garbage = Garbage::default();
        for id in self.collect_allocs() {
            garbage.allocs.push(id.alloc);
            garbage.jobs.extend(id.job);
        }
        garbage.jobs.sort();
        garbage
    }

    /// The finished allocs beyond `max_allocs`, and more while the data dir's disk is
    /// fuller than the thresholds, oldest first; and each job whose last alloc that was.
    fn collect_allocs(&self) -> Vec<CollectedAlloc> {
        let keep = self.node.config.gc.max_allocs;
        let mut finished: Vec<(u64, AllocEntry)> = self
            .allocs
            .lock()
            .unwrap()
            .values()
            .filter(|a| *a.finished.borrow())
            .map(|a| (finished_at(&a.runner.status()), a.clone()))
            .collect();
        if finished.len() <= keep && self.disk_pressure().is_none() {
            return Vec::new();
        }
        finished.sort_by_key(|(at, _)| *at);
        let Ok(mounts) = crate::mount::mountinfo::read_self() else {
            tracing::warn!("garbage collection skipped: the mount table is unreadable");
            return Vec::new();
        };
        let mut left = finished.len();
        let mut collected = Vec::new();
        for (_, entry) in finished {
            if left <= keep {
                match self.disk_pressure() {
                    None => break,
                    Some(why) => tracing::info!(alloc = %entry.runner.id, %why,
                        "collecting a finished alloc within max_allocs: the disk is full"),
                }
            }
            left -= 1;
            if self.collect(&entry, &mounts) {
                collected.push(CollectedAlloc {
                    alloc: entry.runner.id.clone(),
                    job: self.collect_job_of(&entry),
                });
            }
        }
        collected
    }

    /// Groups whose `ephemeral_disk` is larger than the data dir's whole filesystem.
    fn disk_problems(&self, job: &jobspec::Job) -> Vec<jobspec::Problem> {
        let Ok(stats) = rustix::fs::statvfs(&self.node.data_dir) else {
            return Vec::new();
        };
        let node_mb = stats.f_blocks.saturating_mul(stats.f_frsize) / crate::model::limits::MIB;
        job.groups
            .iter()
            .filter(|g| g.ephemeral_disk_mb > node_mb)
            .map(|g| jobspec::Problem {
                path: format!("job.{}.group.{}.ephemeral_disk", job.name, g.name),
                at: None,
                message: format!(
                    "group {:?} asks for {} MB of ephemeral_disk; this node's data dir has {} MB \
                     in all",
                    g.name, g.ephemeral_disk_mb, node_mb
                ),
            })
            .collect()
    }

    /// Why the data dir's filesystem is fuller than `gc`'s thresholds, if it is.
    fn disk_pressure(&self) -> Option<String> {
        let gc = &self.node.config.gc;
        let stats = rustix::fs::statvfs(&self.node.data_dir).ok()?;
        let percent =
            |free: u64, total: u64| (total > 0).then(|| 100 * total.saturating_sub(free) / total);
        if let Some(used) = percent(stats.f_bfree, stats.f_blocks)
            && used > u64::from(gc.disk_usage_threshold)
        {
            return Some(format!(
                "{used}% of its disk in use (disk_usage_threshold = {})",
                gc.disk_usage_threshold
            ));
        }
        if let Some(used) = percent(stats.f_ffree, stats.f_files)
            && used > u64::from(gc.inode_usage_threshold)
        {
            return Some(format!(
                "{used}% of its inodes in use (inode_usage_threshold = {})",
                gc.inode_usage_threshold
            ));
        }
        None
    }

    /// Forgets the job of a collected alloc when nothing of it is left: no other alloc,
    /// and the job is still the version that alloc ran (a job submitted again since is a
    /// new version, kept). Returns the job's id when it was collected.
    fn collect_job_of(&self, collected: &AllocEntry) -> Option<String> {
        let name = &collected.runner.job.name;
        let mut jobs = self.jobs.lock().unwrap();
        let same_version = jobs
            .get(name)
            .is_some_and(|entry| Arc::ptr_eq(&entry.job, &collected.runner.job));
        let others = self
            .allocs
            .lock()
            .unwrap()
            .values()
            .any(|a| &a.runner.job.name == name);
        if !same_version || others {
            return None;
        }
        if let Err(error) = self.node.store.remove_job(name) {
            tracing::error!(job = %name, %error, "collecting a finished job's record");
            return None;
        }
        jobs.remove(name);
        Some(name.clone())
    }

    /// Forgets one finished alloc: its records, then its directory. Refused (false) while
    /// anything is mounted below the directory.
    fn collect(&self, entry: &AllocEntry, mounts: &[crate::mount::mountinfo::MountEntry]) -> bool {
        let id = &entry.runner.id;
        if entry.runner.holds_csi_volumes() {
            // Its record says what to give back, and the give-back is still trying.
            return false;
        }
        let root = entry.runner.alloc_dir.root();
        let root = root.canonicalize().unwrap_or_else(|_| root.to_path_buf());
        if let Some(mount) = mounts.iter().find(|m| m.mount_point.starts_with(&root)) {
            tracing::warn!(alloc = %id, mount = %mount.mount_point.display(),
                "not collecting a finished alloc: something is still mounted in it");
            return false;
        }
        if let Err(error) = self.node.store.remove_alloc(id) {
            tracing::error!(alloc = %id, %error, "collecting a finished alloc's records");
            return false;
        }
        self.allocs.lock().unwrap().remove(id);
        match crate::blocking::run(|| std::fs::remove_dir_all(&root)) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(error) => tracing::warn!(alloc = %id, %error,
                "removing a collected alloc's directory"),
        }
        true
    }

    pub fn notices(&self) -> &[Notice] {
        &self.notices
    }

    pub fn drivers(&self) -> &DriverSet {
        &self.node.drivers
    }

    pub fn hooks(&self) -> &HookSet {
        &self.node.hooks
    }

    pub fn data_dir(&self) -> &std::path::Path {
        &self.node.data_dir
    }

    pub fn csi(&self) -> &Arc<crate::csi::CsiNode> {
        &self.node.csi
    }

    pub fn state_file(&self) -> Option<&std::path::Path> {
        self.node.store.path()
    }

    /// Every task event from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<AllocEvent> {
        self.events.subscribe()
    }

    /// Reads the recorded jobs and allocs. Live allocs are started by `run_restored`.
    fn restore(&self) -> Result<Vec<Notice>, StateError> {
        let store = &self.node.store;
        let mut notices = Vec::new();
        let unreadable_notice = |u: crate::state::Unreadable| Notice {
            level: NoticeLevel::Error,
            message: u.to_string(),
        };
        let (records, unreadable) = store.jobs()?;
        notices.extend(unreadable.into_iter().map(unreadable_notice));
        let mut jobs = self.jobs.lock().unwrap();
        for record in records {
            match jobspec::parse_with(&record.source_name, &record.source, &record.variables) {
                Ok(job) => {
                    let job = match &record.child_of {
                        Some(child) => launch::child_job(job, &record.id, child),
                        None => job,
                    };
                    jobs.insert(
                        record.id.clone(),
                        JobEntry {
                            record,
                            job: Arc::new(job),
                        },
                    );
                }
                Err(error) => notices.push(Notice {
                    level: NoticeLevel::Error,
                    message: format!(
                        "job {:?} is recorded but no longer parses, so its allocs are left \
                         alone: {error}",
                        record.id
                    ),
                }),
            }
        }
        let (records, unreadable) = store.allocs()?;
        notices.extend(unreadable.into_iter().map(unreadable_notice));
        let mut allocs = self.allocs.lock().unwrap();
        for record in records {
            let Some(entry) = jobs.get(&record.job_id) else {
                notices.push(Notice {
                    level: NoticeLevel::Warning,
                    message: format!(
                        "alloc {} belongs to job {:?}, which is not recorded; left alone",
                        record.id, record.job_id
                    ),
                });
                continue;
            };
            let id = record.id.clone();
            let terminal = matches!(
                record.client_status,
                ClientStatus::Complete | ClientStatus::Failed
            );
            match AllocRunner::restore(entry.job.clone(), record, self.node.clone()) {
                Ok(runner) => {
                    let (done, finished) = watch::channel(terminal);
                    // A terminal alloc is kept for `alloc status` only.
                    drop(done);
                    allocs.insert(id, AllocEntry { runner, finished });
                }
                Err(error) => notices.push(Notice {
                    level: NoticeLevel::Error,
                    message: error.to_string(),
                }),
            }
        }
        let live = allocs.values().filter(|a| !*a.finished.borrow()).count();
        if live > 0 {
            notices.push(Notice {
                level: NoticeLevel::Info,
                message: format!("restoring {live} alloc(s) from {}", store_name(store)),
            });
        }
        Ok(notices)
    }

    fn run_restored(&self) {
        let mut allocs = self.allocs.lock().unwrap();
        // Their services are theirs until they say otherwise: the first sync must not
        // take them for orphans before the restored runners have set them again.
        self.node.services.expect_allocs(
            allocs
                .values()
                .filter(|entry| !*entry.finished.borrow())
                .map(|entry| entry.runner.id.clone()),
        );
        for entry in allocs.values_mut() {
            if !*entry.finished.borrow() {
                entry.finished = spawn_runner(entry.runner.clone());
            } else {
                // Finished before the restart with volumes its plugin could not take back.
                entry.runner.give_back_csi();
            }
        }
    }

    /// Parses, validates and runs a job. A job with the name of a running one replaces
    /// it: the old allocs are stopped (and waited for) before the new ones start.
    pub async fn submit(&self, source_name: &str, source: &str) -> Result<Submitted, SubmitError> {
        self.submit_with(source_name, source, &Default::default())
            .await
    }

    /// [`Agent::submit`] with values for the jobspec's variables, as the operator.
    pub async fn submit_with(
        &self,
        source_name: &str,
        source: &str,
        variables: &jobspec::eval::VariableInputs,
    ) -> Result<Submitted, SubmitError> {
        self.submit_as(Submitter::Operator, source_name, source, variables)
            .await
    }

    /// [`Agent::submit_with`] for `submitter`: a job that runs a CSI plugin needs the
    /// operator, or a token of scope `plugin`.
    pub async fn submit_as(
        &self,
        submitter: Submitter,
        source_name: &str,
        source: &str,
        variables: &jobspec::eval::VariableInputs,
    ) -> Result<Submitted, SubmitError> {
        let job =
            jobspec::parse_with(source_name, source, variables).map_err(SubmitError::Invalid)?;
        let refused = plugin_tasks_refused(&job, submitter);
        if !refused.is_empty() {
            return Err(SubmitError::Invalid(JobspecError {
                file: source_name.to_string(),
                problems: refused,
            }));
        }
        let problems = crate::validate::validate(
            &job,
            &self.node.drivers,
            &self.node.hooks,
            &self.node.config,
            Some(self.node.csi.catalog.as_ref()),
        )
        .await;
        let mut problems = problems;
        problems.extend(self.disk_problems(&job));
        if !problems.is_empty() {
            return Err(SubmitError::Invalid(JobspecError {
                file: source_name.to_string(),
                problems,
            }));
        }
        let _one_at_a_time = self.submitting.lock().await;
        let places = job.periodic.is_none() && job.parameterized.is_none();
        if let Some(why) = places.then(|| self.static_port_clash(&job)).flatten() {
            return Err(SubmitError::Refused(why));
        }
        let replaced = self.stop_allocs_of(&job.name).await;
        self.forget_allocs_of(&job.name);
        let record = JobRecord {
            id: job.name.clone(),
            source_name: source_name.to_string(),
            source: source.to_string(),
            variables: variables.clone(),
            submitted_ms: now_ms(),
            stopped: false,
            child_of: None,
        };
        let job = Arc::new(job);
        // A periodic or parameterized job places nothing itself: its children do.
        let alloc_ids = if job.periodic.is_some() || job.parameterized.is_some() {
            self.record_job(record, job.clone())?;
            Vec::new()
        } else {
            self.record_and_place(record, job.clone())?
        };
        Ok(Submitted {
            job_id: job.name.clone(),
            alloc_ids,
            replaced,
            warnings: job
                .warnings
                .iter()
                .map(|w| format!("{source_name}:{w}"))
                .collect(),
        })
    }

    /// The ports the running allocs hold (static and dynamic), and which alloc holds
    /// each; without the allocs of job `except`, which are about to be replaced.
    fn port_holders(&self, except: Option<&str>) -> BTreeMap<u16, String> {
        let mut holders = BTreeMap::new();
        for entry in self.allocs.lock().unwrap().values() {
            if *entry.finished.borrow() || Some(entry.runner.job.name.as_str()) == except {
                continue;
            }
            for number in entry.runner.group.ports.iter().filter_map(|p| p.number) {
                holders.insert(number, entry.runner.name.clone());
            }
        }
        holders
    }

    /// Why `job` cannot be placed here for its static ports: one a running alloc holds,
    /// or one its own allocs would share (`count` > 1). A static port is one alloc's on a
    /// node, as Nomad's scheduler has it. Checked before an older version is stopped.
    fn static_port_clash(&self, job: &Job) -> Option<String> {
        let mut holders = self.port_holders(Some(&job.name));
        for group in &job.groups {
            for alloc_index in 0..group.count {
                let name = format!("{}.{}[{alloc_index}]", job.name, group.name);
                for port in &group.ports {
                    let Some(number) = port.number else { continue };
                    if let Some(holder) = holders.insert(number, name.clone()) {
                        return Some(format!(
                            "{name} cannot have static port {number} (port {:?}): {holder} \
                             holds it on this node",
                            port.label
                        ));
                    }
                }
            }
        }
        None
    }

    /// Records the job (durably) and keeps it in the job table.
    fn record_job(&self, record: JobRecord, job: Arc<Job>) -> Result<(), SubmitError> {
        self.node.store.put_job(&record)?;
        self.jobs
            .lock()
            .unwrap()
            .insert(record.id.clone(), JobEntry { record, job });
        Ok(())
    }

    /// Records the job and all its allocs in one transaction, then starts the allocs;
    /// their ids. An agent killed in between comes back with the job and every alloc,
    /// or with neither.
    fn record_and_place(
        &self,
        record: JobRecord,
        job: Arc<Job>,
    ) -> Result<Vec<String>, SubmitError> {
        // Dynamic ports avoid what running allocs hold and this job's static ports.
        let mut in_use: std::collections::BTreeSet<u16> = self
            .port_holders(None)
            .into_keys()
            .chain(
                job.groups
                    .iter()
                    .flat_map(|g| g.ports.iter().filter_map(|p| p.number)),
            )
            .collect();
        let mut allocs = Vec::new();
        for (group_index, group) in job.groups.iter().enumerate() {
            for alloc_index in 0..group.count {
                let ports = crate::alloc_runner::ports::allocate(&group.ports, &mut in_use)
                    .map_err(|e| SubmitError::Refused(format!("group {:?}: {e}", group.name)))?;
                allocs.push(AllocRunner::new_record(
                    &job,
                    group_index,
                    alloc_index,
                    ports,
                ));
            }
        }
        self.node.store.put_job_and_allocs(&record, &allocs)?;
        self.jobs.lock().unwrap().insert(
            record.id.clone(),
            JobEntry {
                record,
                job: job.clone(),
            },
        );
        let runners: Vec<Arc<AllocRunner>> = allocs
            .into_iter()
            .map(|alloc| AllocRunner::recorded(job.clone(), alloc, self.node.clone()))
            .collect();
        let alloc_ids = runners.iter().map(|r| r.id.clone()).collect();
        let mut allocs = self.allocs.lock().unwrap();
        for runner in runners {
            let finished = spawn_runner(runner.clone());
            allocs.insert(runner.id.clone(), AllocEntry { runner, finished });
        }
        Ok(alloc_ids)
    }

    /// Stops a job's allocs; the job stays listed as stopped. Returns the allocs asked
    /// to stop.
    pub async fn stop_job(&self, id: &str) -> Result<Vec<String>, LookupError> {
        let _one_at_a_time = self.submitting.lock().await;
        {
            let mut jobs = self.jobs.lock().unwrap();
            let entry = jobs.get_mut(id).ok_or_else(|| LookupError::NotFound {
                kind: "job",
                id: id.to_string(),
            })?;
            entry.record.stopped = true;
            if let Err(error) = self.node.store.put_job(&entry.record) {
                tracing::error!(job = id, %error, "recording the job as stopped");
            }
        }
        let stopping: Vec<String> = self
            .allocs_of(id)
            .into_iter()
            .filter(|a| !a.runner.is_terminal())
            .map(|a| {
                a.runner.stop();
                a.runner.id.clone()
            })
            .collect();
        Ok(stopping)
    }

    /// Waits until every alloc of the job has finished.
    pub async fn wait_job(&self, id: &str) {
        let waits: Vec<watch::Receiver<bool>> =
            self.allocs_of(id).into_iter().map(|a| a.finished).collect();
        for mut finished in waits {
            let _ = finished.wait_for(|done| *done).await;
        }
    }

    pub fn jobs(&self) -> Vec<JobStatus> {
        self.jobs_page(&JobsQuery::default()).0
    }

    /// One page of jobs in id order, from `next_token` (inclusive) on, and the id that
    /// starts the next page when there is one (Nomad's `per_page` / `next_token`).
    /// One pass over the allocs, whatever the number of jobs.
    pub fn jobs_page(&self, query: &JobsQuery) -> (Vec<JobStatus>, Option<String>) {
        let per_page = query.per_page.filter(|n| *n > 0).unwrap_or(usize::MAX);
        let mut page: Vec<(JobRecord, Arc<Job>)> = Vec::new();
        let mut next = None;
        {
            let jobs = self.jobs.lock().unwrap();
            let start = query.next_token.clone().unwrap_or_default();
            let prefix = query.prefix.as_deref().unwrap_or("");
            for (id, entry) in jobs.range(start..) {
                if !id.starts_with(prefix) {
                    if id.as_str() > prefix {
                        break;
                    }
                    continue;
                }
                if page.len() == per_page {
                    next = Some(id.clone());
                    break;
                }
                page.push((entry.record.clone(), entry.job.clone()));
            }
        }
        let mut allocs: BTreeMap<String, Vec<AllocSummary>> = page
            .iter()
            .map(|(record, _)| (record.id.clone(), Vec::new()))
            .collect();
        let entries: Vec<AllocEntry> = self.allocs.lock().unwrap().values().cloned().collect();
        for entry in entries {
            if let Some(list) = allocs.get_mut(&entry.runner.job.name) {
                list.push(summary(&entry.runner.status()));
            }
        }
        let statuses = page
            .into_iter()
            .map(|(record, job)| {
                let allocs = allocs.remove(&record.id).unwrap_or_default();
                job_status(record, &job, allocs)
            })
            .collect();
        (statuses, next)
    }

    pub fn job(&self, id: &str) -> Result<JobStatus, LookupError> {
        let (record, job) = {
            let jobs = self.jobs.lock().unwrap();
            let entry = jobs.get(id).ok_or_else(|| LookupError::NotFound {
                kind: "job",
                id: id.to_string(),
            })?;
            (entry.record.clone(), entry.job.clone())
        };
        let allocs: Vec<AllocSummary> = self
            .allocs_of(id)
            .iter()
            .map(|a| summary(&a.runner.status()))
            .collect();
        Ok(job_status(record, &job, allocs))
    }

    pub fn allocs(&self) -> Vec<AllocSummary> {
        self.allocs
            .lock()
            .unwrap()
            .values()
            .map(|a| summary(&a.runner.status()))
            .collect()
    }

    /// An alloc by id or by a unique prefix of it (as Nomad's short ids).
    pub fn alloc(&self, id: &str) -> Result<AllocStatus, LookupError> {
        let allocs = self.allocs.lock().unwrap();
        if let Some(entry) = allocs.get(id) {
            return Ok(entry.runner.status());
        }
        let matches: Vec<&AllocEntry> = allocs
            .iter()
            .filter(|(key, _)| !id.is_empty() && key.starts_with(id))
            .map(|(_, entry)| entry)
            .collect();
        match matches.as_slice() {
            [] => Err(LookupError::NotFound {
                kind: "alloc",
                id: id.to_string(),
            }),
            [one] => Ok(one.runner.status()),
            many => Err(LookupError::Ambiguous {
                id: id.to_string(),
                matches: many.iter().map(|a| a.runner.id.clone()).collect(),
            }),
        }
    }

    /// The alloc runner itself, for callers in the same process (`berth run`, tests).
    pub fn alloc_runner(&self, id: &str) -> Option<Arc<AllocRunner>> {
        self.allocs
            .lock()
            .unwrap()
            .get(id)
            .map(|a| a.runner.clone())
    }

    /// Copies of a job's entries, usable without holding the map's lock.
    fn allocs_of(&self, job_id: &str) -> Vec<AllocEntry> {
        self.allocs
            .lock()
            .unwrap()
            .values()
            .filter(|a| a.runner.job.name == job_id)
            .cloned()
            .collect()
    }

    /// Stops the live allocs of a job and waits for them to finish.
    async fn stop_allocs_of(&self, job_id: &str) -> Vec<String> {
        let live: Vec<AllocEntry> = self
            .allocs_of(job_id)
            .into_iter()
            .filter(|a| !*a.finished.borrow())
            .collect();
        for alloc in &live {
            alloc.runner.stop();
        }
        let mut stopped = Vec::new();
        for mut alloc in live {
            let _ = alloc.finished.wait_for(|done| *done).await;
            stopped.push(alloc.runner.id.clone());
        }
        stopped
    }

    /// Collects the finished allocs of a job being replaced: records and directories
    /// (what is still mounted stays, as for any collection).
    fn forget_allocs_of(&self, job_id: &str) {
        let finished: Vec<AllocEntry> = self
            .allocs_of(job_id)
            .into_iter()
            .filter(|a| *a.finished.borrow())
            .collect();
        if finished.is_empty() {
            return;
        }
        let Ok(mounts) = crate::mount::mountinfo::read_self() else {
            tracing::warn!(
                job = job_id,
                "the mount table is unreadable: replaced allocs kept"
            );
            return;
        };
        for entry in &finished {
            self.collect(entry, &mounts);
        }
    }
}

/// Collects finished allocs every `gc { interval }`, for as long as the agent lives.
fn spawn_garbage_collector(agent: &Arc<Agent>) {
    let interval = agent.node.config.gc.interval;
    let agent = Arc::downgrade(agent);
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(interval).await;
            let Some(agent) = agent.upgrade() else {
                return;
            };
            let collected = agent.collect_garbage();
            if !collected.allocs.is_empty() {
                tracing::info!(
                    allocs = collected.allocs.len(),
                    jobs = collected.jobs.len(),
                    "collected finished allocs and jobs"
                );
            }
        }
    });
}

/// When an alloc finished: its last task event (0 without any).
fn finished_at(status: &AllocStatus) -> u64 {
    status
        .tasks
        .values()
        .filter_map(|task| task.events.last())
        .map(|event| event.time_ms)
        .max()
        .unwrap_or(0)
}

fn spawn_runner(runner: Arc<AllocRunner>) -> watch::Receiver<bool> {
    let (done, finished) = watch::channel(false);
    tokio::spawn(async move {
        runner.run().await;
        let _ = done.send(true);
    });
    finished
}

/// Every task event also goes to the agent's log.
/// Who submits a job, as the API's access check found it: what they may run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Submitter {
    /// The operator: the Unix socket's owner (or its group), `berth run`.
    Operator,
    /// A TCP request: with a token of scope `plugin`, it may run CSI plugin jobs.
    Token { may_run_plugins: bool },
}

/// The `csi_plugin` tasks of `job` that `submitter` may not run: a plugin task sees the
/// volumes it serves and, granted by the operator, mounts on the node, so it needs more
/// than a submit token (Nomad's `csi-register-plugin` capability).
fn plugin_tasks_refused(job: &jobspec::Job, submitter: Submitter) -> Vec<jobspec::Problem> {
    if matches!(
        submitter,
        Submitter::Operator
            | Submitter::Token {
                may_run_plugins: true
            }
    ) {
        return Vec::new();
    }
    job.groups
        .iter()
        .flat_map(|g| g.tasks.iter().map(move |t| (g, t)))
        .filter(|(_, t)| t.csi_plugin.is_some())
        .map(|(group, task)| jobspec::Problem {
            path: format!(
                "job.{}.group.{}.task.{}.csi_plugin",
                job.name, group.name, task.name
            ),
            at: Some(task.at),
            message: format!(
                "task {:?} runs a CSI plugin, which needs the operator's authorization: \
                 submit it through the agent's Unix socket, or with a token of scope \
                 \"plugin\"",
                task.name
            ),
        })
        .collect()
}

async fn log_events(mut events: broadcast::Receiver<AllocEvent>) {
    loop {
        match events.recv().await {
            // Drivers, hooks and tasks write event messages: one line each in the log.
            Ok(event) => tracing::info!(alloc = %event.alloc_id, task = %event.task,
                kind = %event.event.kind, "{}", crate::model::text::one_line(&event.event.message)),
            Err(broadcast::error::RecvError::Lagged(missed)) => {
                tracing::warn!("the event log fell behind and skipped {missed} event(s)")
            }
            Err(broadcast::error::RecvError::Closed) => return,
        }
    }
}

fn summary(status: &AllocStatus) -> AllocSummary {
    AllocSummary {
        id: status.id.clone(),
        name: status.name.clone(),
        desired_status: status.desired_status,
        client_status: status.client_status,
    }
}

fn store_name(store: &StateStore) -> String {
    store
        .path()
        .map(|p| p.display().to_string())
        .unwrap_or_else(|| "memory".into())
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}
