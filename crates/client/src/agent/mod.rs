//! The agent: a member of a cluster (etcd's, or its own one-node cluster on the
//! embedded store), owning this node's state store and alloc runners, and restoring them
//! after a restart. The HTTP API (the `berth-api` crate) and `berth run` both drive it.
//!
//! ```text
//!   submit(HCL) ─► parse + validate ─► job + evaluation in the cluster store
//!                  scheduler ─► placements ─► follow_placements ─► alloc records ─► runners
//!   start()     ─► open state.db ─► join the cluster ─► allocs: live ones restored and
//!                    run again, finished ones kept for status
//! ```
//!
//! Stopping the agent leaves tasks running, as Nomad's client does: the next agent
//! recovers them through their drivers.

pub mod api_places;
pub mod capacity;
pub mod cluster;
mod csi_calls;
pub mod data_dir;
mod dynamic_users;
mod errors;
pub mod event_hub;
mod gc;
pub mod index;
mod job_locks;
pub use gc::Garbage;
mod launch;
pub mod logs;
mod lone_import;
mod owner;
mod plan;
mod restore;
mod stop;
mod submit;
mod volumes;

pub use errors::{LookupError, StartError, StopError, SubmitError};
pub use owner::{JobAction, NotOwner, Submitter};
pub use plan::{GroupUpdates, JobPlan};
pub use stop::JobStopped;
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
use berth_cluster::ClusterError;
use berth_jobspec::Job;
use berth_model::events::AllocEvent;
use berth_state::{JobRecord, OpenOutcome, StateError, StateStore};

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

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Submitted {
    pub job_id: String,
    pub alloc_ids: Vec<String>,
    /// Allocs of an earlier version of the job that were stopped first.
    pub replaced: Vec<String>,
    /// What the jobspec asks for that has no effect here (`file:line:col: path: why`).
    #[serde(default)]
    pub warnings: Vec<String>,
    /// The evaluation the change made (Nomad's `EvalID`): `alloc_ids` are its allocs
    /// when it completed within the submit's wait, else it is the way to follow them.
    #[serde(default)]
    pub eval_id: String,
}

pub use berth_cluster::job_view::{AllocSummary, JobState, JobStatus};

struct JobEntry {
    record: JobRecord,
    job: Arc<Job>,
}

/// `GET /v1/jobs` parameters, as Nomad names them.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct JobsQuery {
    pub prefix: Option<String>,
    pub per_page: Option<usize>,
    pub next_token: Option<String>,
}

#[derive(Clone)]
struct AllocEntry {
    runner: Arc<AllocRunner>,
    /// Becomes true when the runner has finished (or was never run: already terminal).
    finished: watch::Receiver<bool>,
}

pub struct Agent {
    node: NodeContext,
    /// The cluster this agent is a member of: etcd's, or its own one-node cluster on
    /// the embedded store.
    cluster: Arc<berth_cluster::Cluster>,
    jobs: Mutex<BTreeMap<String, JobEntry>>,
    allocs: Mutex<BTreeMap<String, AllocEntry>>,
    events: broadcast::Sender<AllocEvent>,
    notices: Vec<Notice>,
    /// Serialises submits and stops, so two versions of a job never run at once.
    submitting: tokio::sync::Mutex<()>,
    /// Plans run at once (`plan::PLANS_AT_ONCE`): each reads the whole cluster.
    plans: tokio::sync::Semaphore,
    /// One lock per job: a submit or stop of a job, its purge and the collector
    /// forgetting it take turns. Taken before `submitting`.
    job_locks: job_locks::JobLocks,
    /// This process's hold on the data dir ([`data_dir::lock`]).
    _data_dir_lock: std::fs::File,
    /// Raised on every change a client could watch (Nomad's `X-Nomad-Index`).
    index: Arc<index::ChangeIndex>,
    /// What changed, for Nomad's event stream.
    event_hub: Arc<event_hub::EventHub>,
    /// Becomes true when the agent stops serving: long answers (streams) end then.
    shutting_down: watch::Sender<bool>,
    /// What its API holds at once, on all its listeners.
    api_places: api_places::ApiPlaces,
    /// Counts the rounds of following this node's placements (`follow_placements`): a
    /// submit waits for one that began after its evaluation completed.
    placement_rounds: watch::Sender<u64>,
}

impl Agent {
    /// Opens the state and restores what it records. Problems with single records are
    /// notices, not errors: the agent runs with everything it could read.
    pub async fn start(options: AgentOptions) -> Result<Arc<Agent>, StartError> {
        let mut notices = Vec::new();
        // Before anything runs: a range a host user or group holds would make tasks that.
        let range = options.config.users.dynamic_range.clone();
        berth_sys::process::dynamic_users::check_host(&range, "dynamic_range")?;
        if options.config.image.private_user_namespaces
            && let Some(ids) = options.config.users.subordinate_ids()
        {
            // Tasks on images become these in their user namespaces.
            berth_sys::process::dynamic_users::check_host(&ids, "subordinate_base")?;
        }
        let disk = berth_sys::disk::DiskLimits::detect(
            &options.data_dir,
            options.config.ephemeral_disk_inodes_per_mb,
        );
        let facts = crate::node::facts(&crate::node::Identity {
            name: options.config.name.clone(),
            datacenter: options.config.datacenter.clone(),
            ephemeral_disk_limit: Some(disk.mechanism().name().to_string()),
        });
        // With state in memory too (`berth run`): the data dir still holds task dirs,
        // whose files a root task may have made setuid.
        let mut options = options;
        options.data_dir = data_dir::prepare(&options.data_dir).map_err(|e| StateError::Open {
            path: options.data_dir.clone(),
            message: format!("the data dir: {e}"),
        })?;
        // Checked against the data dir's own filesystem, now that it exists.
        capacity::check_reserved(
            options.config.reserved,
            capacity::node_totals(&options.data_dir),
        )?;
        let data_dir_lock = data_dir::lock(&options.data_dir).map_err(|e| StateError::Open {
            path: options.data_dir.clone(),
            message: e.to_string(),
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
        // Followed once the agent exists (below); what happens before waits in the channel.
        let task_events = events.subscribe();
        let store = Arc::new(store);
        let dynamic_users = Arc::new(dynamic_users::pool(range, &store, &options.data_dir));
        let cluster = {
            let (data_dir, config, drivers, state, facts) = (
                options.data_dir.clone(),
                options.config.clone(),
                options.drivers.clone(),
                store.clone(),
                facts.clone(),
            );
            tokio::task::spawn_blocking(move || {
                cluster::join(&data_dir, &config, &drivers, &state, &facts)
            })
            .await
            .map_err(|e| StartError::Cluster(ClusterError::Local(e.to_string())))??
        };
        // One identity: the node's id is the one it has in its cluster.
        let facts: crate::node::Facts = {
            let mut facts = (*facts).clone();
            facts.insert("node.unique.id".into(), cluster.node_id().to_string());
            Arc::new(facts)
        };
        if !cluster.is_lone() && !cluster.settings().presents_credentials() {
            notices.push(Notice {
                level: NoticeLevel::Warning,
                message: format!(
                    "berth shows etcd (at {}) no credentials (no username, no client \
                     certificate): whoever can reach it, a task on this host included, \
                     can place any job on any node, as the operator. Turn on etcd's auth \
                     or client certificates (see README \"A cluster\"), or keep etcd where \
                     tasks and other users cannot reach it (see SECURITY.md)",
                    cluster.store().endpoints()
                ),
            });
        }
        let change_index = Arc::new(berth_sys::blocking::run(|| {
            cluster::follow_revision(&cluster)
        }));
        let csi = berth_csi::CsiNode::start_with(
            &options.data_dir,
            store.clone(),
            options.config.csi.clone(),
            options.drivers.metrics().clone(),
            cluster.node_name().to_string(),
            Arc::new(berth_cluster::catalog::EtcdCatalog::new(cluster.clone())),
        );
        csi_calls::connect(&cluster, &csi);
        match berth_sys::process::raise_open_files_limit() {
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
        let cgroups = berth_sys::cgroup::Cgroups::detect(options.config.cgroups.clone());
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
        match disk.mechanism() {
            berth_sys::disk::Mechanism::Unavailable { why } => notices.push(Notice {
                level: NoticeLevel::Warning,
                message: format!(
                    "allocs will not start: {}",
                    berth_sys::disk::DiskError::Unavailable { why: why.clone() }
                ),
            }),
            mechanism => tracing::info!(mechanism = mechanism.name(), "ephemeral disk limits"),
        }
        let services = crate::consul::ServiceClient::new(options.config.consul.as_ref())
            .unwrap_or_else(|error| {
                notices.push(Notice {
                    level: NoticeLevel::Warning,
                    message: format!("consul: {error}; services are registered without a token"),
                });
                crate::consul::ServiceClient::disabled()
            });
        services.attach_catalog(
            cluster.clone(),
            options
                .config
                .datacenter
                .clone()
                .unwrap_or_else(|| "dc1".into()),
        );
        let identities = Arc::new(crate::identity::Keyring::new(
            cluster.clone(),
            options.config.keyring_rotation,
        ));
        let mut agent = Agent {
            cluster,
            node: NodeContext {
                sys: Arc::new(berth_sys::LinuxSys::with_disk(cgroups, disk)),
                data_dir: options.data_dir,
                drivers: options.drivers,
                hooks: options.hooks,
                config: Arc::new(options.config),
                store,
                events: events.clone(),
                csi,
                services: Arc::new(services),
                identities,
                dynamic_users,
                facts,
            },
            jobs: Mutex::default(),
            allocs: Mutex::default(),
            index: change_index,
            event_hub: Arc::default(),
            shutting_down: watch::Sender::new(false),
            events,
            notices,
            submitting: tokio::sync::Mutex::new(()),
            plans: tokio::sync::Semaphore::new(plan::PLANS_AT_ONCE),
            _data_dir_lock: data_dir_lock,
            job_locks: job_locks::JobLocks::default(),
            api_places: api_places::ApiPlaces::default(),
            placement_rounds: watch::Sender::new(0),
        };
        agent.publish(
            event_hub::Topic::Node,
            "NodeRegistration",
            agent
                .node
                .facts
                .get("node.unique.id")
                .cloned()
                .unwrap_or_default(),
            Vec::new(),
            event_hub::Payload::Node,
        );
        let mut restore_notices = agent.restore()?;
        agent.notices.append(&mut restore_notices);
        // Every restored alloc claimed its user ids: those handed out and never recorded
        // are free again.
        agent.node.dynamic_users.restored();
        let agent = Arc::new(agent);
        tokio::spawn(follow_events(task_events, Arc::downgrade(&agent)));
        agent.run_restored();
        // After restore: the first sync must not take restored tasks' services for
        // orphans (their runners register them again as they recover).
        tokio::spawn(agent.node.services.clone().run());
        tokio::spawn(agent.node.services.clone().run_catalog());
        gc::spawn_garbage_collector(&agent);
        let cluster = agent.cluster.clone();
        cluster::spawn_revision_follower(&cluster, agent.index.clone());
        agent.follow_placements();
        let lost_claims = csi_calls::lost_claims(&cluster, agent.csi());
        tokio::spawn(berth_cluster::scheduler::run(cluster, lost_claims));
        Ok(agent)
    }

    /// The cluster this agent is a member of: etcd's, or its own one-node cluster.
    pub fn cluster(&self) -> &Arc<berth_cluster::Cluster> {
        &self.cluster
    }

    /// The services of running tasks and groups, and how their sync with Consul goes.
    pub fn services(&self) -> crate::consul::ServicesStatus {
        self.node.services.status()
    }

    /// The keys that verify workload identities, as `(kid, Ed25519 public key)`.
    pub async fn identity_keys(
        &self,
    ) -> Result<Vec<(String, String)>, crate::identity::IdentityError> {
        let keyring = self.node.identities.clone();
        tokio::task::spawn_blocking(move || keyring.public_keys())
            .await
            .unwrap_or(Err(crate::identity::IdentityError::Interrupted))
    }

    /// The latest results of the checks this node runs for the allocs it runs.
    pub fn check_results(&self, alloc: &str) -> Vec<crate::checks::CheckResult> {
        self.node.services.checks().of_alloc(alloc)
    }

    /// What the agent's API holds at once.
    pub fn api_places(&self) -> &api_places::ApiPlaces {
        &self.api_places
    }

    /// This node's attributes (`node`).
    pub fn facts(&self) -> &crate::node::Facts {
        &self.node.facts
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

    pub fn csi(&self) -> &Arc<berth_csi::CsiNode> {
        &self.node.csi
    }

    pub fn state_file(&self) -> Option<&std::path::Path> {
        self.node.store.path()
    }

    /// Every task event from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<AllocEvent> {
        self.events.subscribe()
    }

    /// The agent's config.
    pub fn config(&self) -> &AgentConfig {
        &self.node.config
    }

    /// The operator's host volumes: name, path, read-only.
    pub fn host_volumes(&self) -> Vec<(String, String, bool)> {
        self.node
            .config
            .host_volumes
            .iter()
            .map(|v| (v.name.clone(), v.path.display().to_string(), v.read_only))
            .collect()
    }

    /// The change index (Nomad's `X-Nomad-Index`), for blocking queries.
    pub fn change_index(&self) -> &index::ChangeIndex {
        &self.index
    }

    /// Events for Nomad's event stream: those kept from `from_index` on, then new ones.
    pub fn subscribe_changes(&self, from_index: Option<u64>) -> event_hub::Subscription {
        self.event_hub.subscribe(from_index)
    }

    /// The agent stops serving: streams end.
    pub fn shut_down(&self) {
        self.shutting_down.send_replace(true);
    }

    /// Becomes true when the agent stops serving.
    pub fn shutting_down(&self) -> watch::Receiver<bool> {
        self.shutting_down.subscribe()
    }

    fn publish(
        &self,
        topic: event_hub::Topic,
        kind: &'static str,
        key: String,
        filter_keys: Vec<String>,
        payload: event_hub::Payload,
    ) {
        self.event_hub.publish(event_hub::ClusterEvent {
            index: self.index.current(),
            topic,
            kind,
            key,
            filter_keys,
            payload,
        });
    }

    /// A job's event, with the job as it is now (nothing when it is gone).
    pub(crate) fn publish_job(&self, kind: &'static str, id: &str) {
        if let Ok((status, job)) = self.job_spec(id) {
            self.publish_job_snapshot(kind, status, job);
        }
    }

    fn publish_job_snapshot(&self, kind: &'static str, status: JobStatus, job: Arc<Job>) {
        self.publish(
            event_hub::Topic::Job,
            kind,
            status.id.clone(),
            Vec::new(),
            event_hub::Payload::Job { status, job },
        );
    }

    /// An alloc's event, with the alloc as it is now.
    pub fn publish_alloc(&self, kind: &'static str, id: &str) {
        if let Some(runner) = self.alloc_runner(id) {
            publish_alloc_status(&self.event_hub, self.index.current(), kind, runner.status());
        }
    }

    /// A job's jobspec and status, as the cluster has it.
    pub fn job_spec(&self, id: &str) -> Result<(JobStatus, Arc<Job>), LookupError> {
        let snapshot = berth_sys::blocking::run(|| self.cluster.job_snapshot(id))
            .map_err(LookupError::Cluster)?;
        match berth_cluster::job_view::job_status(&snapshot, id) {
            None => Err(LookupError::NotFound {
                kind: "job",
                id: id.to_string(),
            }),
            Some(Err(unreadable)) => Err(LookupError::Unreadable {
                id: id.to_string(),
                problems: unreadable.error.to_string(),
            }),
            Some(Ok((status, job))) => Ok((status, Arc::new(job))),
        }
    }

    /// The job of one of this node's allocs: as the cluster has it, or, once the job is
    /// gone from the cluster (purged while its alloc stops), as the alloc runs it.
    pub fn job_of_alloc(&self, alloc: &AllocStatus) -> Result<(JobStatus, Arc<Job>), LookupError> {
        match self.job_spec(&alloc.job_id) {
            Err(LookupError::NotFound { .. }) => {
                let runner = self
                    .alloc_runner(&alloc.id)
                    .ok_or_else(|| LookupError::NotFound {
                        kind: "job",
                        id: alloc.job_id.clone(),
                    })?;
                let job = runner.job.clone();
                let status = JobStatus {
                    id: alloc.job_id.clone(),
                    job_type: job.job_type,
                    source_name: String::new(),
                    submitted_ms: 0,
                    version: 0,
                    stopped: true,
                    status: JobState::Dead,
                    allocs: vec![summary(alloc)],
                    launches: job.launches().map(str::to_string),
                    parent: job.parent.clone(),
                };
                Ok((status, job))
            }
            other => other,
        }
    }

    /// Waits until every alloc of the job on this node has finished.
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
    /// starts the next page when there is one (Nomad's `per_page` / `next_token`). A
    /// job whose record cannot be read is left out (Nomad's API lists it, dead, with
    /// its problems).
    pub fn jobs_page(&self, query: &JobsQuery) -> (Vec<JobStatus>, Option<String>) {
        let per_page = query.per_page.filter(|n| *n > 0).unwrap_or(usize::MAX);
        let Ok(snapshot) = berth_sys::blocking::run(|| self.cluster.snapshot()) else {
            return (Vec::new(), None);
        };
        let start = query.next_token.clone().unwrap_or_default();
        let prefix = query.prefix.as_deref().unwrap_or("");
        let mut ids: Vec<&str> = snapshot
            .jobs
            .iter()
            .map(|(job, _)| job.id.as_str())
            .filter(|id| *id >= start.as_str() && id.starts_with(prefix))
            .collect();
        ids.sort_unstable();
        let next = ids.get(per_page).map(|id| id.to_string());
        let page = ids
            .into_iter()
            .take(per_page)
            .filter_map(
                |id| match berth_cluster::job_view::job_status(&snapshot, id) {
                    Some(Ok((status, _))) => Some(status),
                    _ => None,
                },
            )
            .collect();
        (page, next)
    }

    pub fn job(&self, id: &str) -> Result<JobStatus, LookupError> {
        Ok(self.job_spec(id)?.0)
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

    /// Collects the finished allocs of a job being replaced: records and directories
    /// (what is still mounted stays, as for any collection).
    pub(super) fn forget_allocs_of(&self, job_id: &str) {
        self.forget_finished_allocs_of(job_id, &Default::default());
    }

    /// [`Agent::forget_allocs_of`], keeping the allocs in `kept` (those still placed).
    pub(super) fn forget_finished_allocs_of(
        &self,
        job_id: &str,
        kept: &std::collections::BTreeSet<&str>,
    ) {
        let finished: Vec<AllocEntry> = self
            .allocs_of(job_id)
            .into_iter()
            .filter(|a| *a.finished.borrow() && !kept.contains(a.runner.id.as_str()))
            .collect();
        if finished.is_empty() {
            return;
        }
        let Ok(mounts) = berth_sys::mount::mountinfo::read_self() else {
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

/// Runs an alloc; once it has finished (its last status set after its tasks' last
/// events), the change is an index and an event of its own.
fn spawn_runner(agent: &Agent, runner: Arc<AllocRunner>) -> watch::Receiver<bool> {
    let (done, finished) = watch::channel(false);
    let (index, hub) = (agent.index.clone(), agent.event_hub.clone());
    let users = agent.node.dynamic_users.clone();
    tokio::spawn(async move {
        runner.clone().run().await;
        index.bump();
        publish_alloc_status(&hub, index.current(), "AllocationUpdated", runner.status());
        let _ = done.send(true);
        users.alloc_finished();
    });
    finished
}

fn publish_alloc_status(
    hub: &event_hub::EventHub,
    index: u64,
    kind: &'static str,
    status: AllocStatus,
) {
    hub.publish(event_hub::ClusterEvent {
        index,
        topic: event_hub::Topic::Allocation,
        kind,
        key: status.id.clone(),
        filter_keys: vec![status.job_id.clone()],
        payload: event_hub::Payload::Allocation(Box::new(status)),
    });
}

/// Every task event raises the change index and is an update of its alloc.
async fn follow_events(mut events: broadcast::Receiver<AllocEvent>, agent: std::sync::Weak<Agent>) {
    loop {
        let event = events.recv().await;
        let Some(agent) = agent.upgrade() else {
            return;
        };
        match event {
            Ok(event) => {
                agent.index.bump();
                agent.publish_alloc("AllocationUpdated", &event.alloc_id);
            }
            Err(broadcast::error::RecvError::Lagged(_)) => agent.index.bump(),
            Err(broadcast::error::RecvError::Closed) => return,
        }
    }
}

/// Every task event also goes to the agent's log.
async fn log_events(mut events: broadcast::Receiver<AllocEvent>) {
    loop {
        match events.recv().await {
            // Drivers, hooks and tasks write event messages: one line each in the log.
            Ok(event) => tracing::info!(alloc = %event.alloc_id, task = %event.task,
                kind = %event.event.kind, "{}", berth_model::text::one_line(&event.event.message)),
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
