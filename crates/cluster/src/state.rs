//! What the cluster records about jobs and allocs, and how it reads them: the jobs as
//! submitted (`P/jobs/<id>`), the placements the scheduler made (`P/allocs/<node>/<alloc>`,
//! which the node's agent runs), and what each node reports of its allocs
//! (`P/status/<alloc>`).

use serde::{Deserialize, Serialize};

pub use super::evals::{Blocked, EvalAlloc, EvalStatus, Evaluation, trigger};
use super::parsed::{Parsed, Unreadable};
pub use super::typed::{JOB_SCHEMA, TypedJob};
use super::{Cluster, ClusterError, NodeView};
use berth_hcl::eval::VariableInputs;
use std::collections::BTreeMap;

use berth_model::events::TaskState;
use berth_model::status::ClientStatus;

/// A job as submitted to any agent: its source, so every agent reads it the same way.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClusterJob {
    pub id: String,
    pub source_name: String,
    pub source: String,
    #[serde(default)]
    pub variables: VariableInputs,
    pub submitted_ms: u64,
    /// Stopped: its allocs are stopped, the job is kept (Nomad's `job stop`).
    #[serde(default)]
    pub stopped: bool,
    /// The submitter could run CSI plugin tasks (the operator, or a `plugin` token):
    /// the node that runs the job checks its `csi_plugin` tasks against this.
    #[serde(default)]
    pub may_run_plugins: bool,
    /// Set for a child launched from a periodic or parameterized job (its source is its
    /// parent's at launch; its id `<parent>/<kind>-<time>[-<suffix>]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub child_of: Option<berth_state::ChildOf>,
    /// Submitted by the operator (`Job::submitted_by_operator`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub by_operator: bool,
    /// The API token that first submitted it (`JobRecord::owner`); `None`: the
    /// operator's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// The job as its source evaluated when it was submitted, so every reader takes it
    /// as it was meant then, without evaluating the source again. `None` in a record
    /// written before jobs were stored typed: read by evaluating its source.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub typed: Option<TypedJob>,
}

/// What [`Cluster::request_alloc_stop`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AllocStopRequest {
    /// Marked, with the evaluation of its job (its id) that stops and replaces it.
    Requested(String),
    /// No placement of the alloc on that node: it ended and was collected, or it was
    /// never the cluster's.
    NotPlaced,
    /// The placement changed since it was read (the scheduler wrote it): nothing written.
    Changed,
}

/// What [`Cluster::create_child`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChildCreated {
    Created,
    /// A job of the child's id exists: nothing written.
    Exists,
    /// The parent changed since it was read (stopped, purged, submitted again).
    ParentChanged,
}

impl ClusterJob {
    /// The job as every agent reads it: the typed job the record holds (read without
    /// its source, [`TypedJob`]), or for a record written before jobs were stored typed,
    /// its source evaluated with its variables; then a child's meta and payload over
    /// its parent's job.
    ///
    /// A record that cannot be read (a typed job of a newer schema or damaged, or a
    /// source written to the store by something other than a submit, or by an agent with
    /// other bounds) is refused with its problems, logged once per record version by
    /// each agent, and not read again by that agent ([`Unreadable`]): the scheduler
    /// places nothing for it and leaves its allocs as they are, API reads report it.
    /// One that reads is kept read ([`Parsed`]): the scheduler's rounds and API reads
    /// take each version of a job once, not on every read.
    pub fn spec(&self) -> Result<berth_jobspec::Job, berth_jobspec::JobspecError> {
        let key = self.source_key();
        if let Some(known) = Unreadable::known(key) {
            return Err(known);
        }
        if let Some(job) = Parsed::known(key) {
            return Ok(self.over(job));
        }
        if let Some(stored) = self.stored() {
            return self.finish(key, stored);
        }
        #[cfg(test)]
        berth_jobspec_hcl::install(); // the reader the `berth` binary installs at start
        let parsed = berth_jobspec::parse_with(&self.source_name, &self.source, &self.variables);
        self.finish(key, parsed)
    }

    /// The typed job the record holds, read without its source ([`TypedJob::read`]).
    fn stored(&self) -> Option<Result<berth_jobspec::Job, berth_jobspec::JobspecError>> {
        self.typed.as_ref()?.read(&self.id, &self.source_name)
    }

    /// [`ClusterJob::spec`] for async code: the task waits for the evaluating threads
    /// without holding one of the runtime's.
    pub async fn spec_async(&self) -> Result<berth_jobspec::Job, berth_jobspec::JobspecError> {
        let key = self.source_key();
        if let Some(known) = Unreadable::known(key) {
            return Err(known);
        }
        if let Some(job) = Parsed::known(key) {
            return Ok(self.over(job));
        }
        if let Some(stored) = self.stored() {
            return self.finish(key, stored);
        }
        #[cfg(test)]
        berth_jobspec_hcl::install(); // the reader the `berth` binary installs at start
        let parsed =
            berth_jobspec::parse_with_async(&self.source_name, &self.source, &self.variables).await;
        self.finish(key, parsed)
    }

    fn finish(
        &self,
        key: u64,
        parsed: Result<berth_jobspec::Job, berth_jobspec::JobspecError>,
    ) -> Result<berth_jobspec::Job, berth_jobspec::JobspecError> {
        // A busy agent says nothing of the source: not remembered, evaluated again later
        // (attack review: a read token's flood of reads made every job "unreadable" for
        // good, and the scheduler stopped them all).
        let job = parsed.inspect_err(|error| {
            if !berth_jobspec::is_transient(error) {
                Unreadable::remember(key, &self.id, error);
            }
        })?;
        Parsed::remember(key, &job);
        Ok(self.over(job))
    }

    /// The record's own over its evaluated source: who submitted it, and a child's
    /// launch.
    fn over(&self, mut job: berth_jobspec::Job) -> berth_jobspec::Job {
        job.submitted_by_operator = self.by_operator;
        match &self.child_of {
            Some(child) => {
                job.into_child(&self.id, &child.parent, &child.meta, child.payload_bytes())
            }
            None => job,
        }
    }

    /// What the evaluation depends on, hashed with this process's keys.
    fn source_key(&self) -> u64 {
        use std::hash::{BuildHasher as _, Hash as _, Hasher as _};
        static KEYS: std::sync::OnceLock<std::collections::hash_map::RandomState> =
            std::sync::OnceLock::new();
        let mut hasher = KEYS.get_or_init(Default::default).build_hasher();
        (&self.source_name, &self.source, &self.variables.env).hash(&mut hasher);
        (&self.variables.files, &self.variables.args).hash(&mut hasher);
        // A record of another schema reads otherwise (refused, or evaluated again).
        self.typed.as_ref().map(|t| t.schema).hash(&mut hasher);
        hasher.finish()
    }
}

/// Checks a cluster job id: a job's name, or a child's `<parent>/<kind>-<...>` whose
/// parent is a job's name and whose rest is a name too (one `/`, no path tricks).
pub fn check_job_id(id: &str) -> Result<(), berth_jobspec::names::NameError> {
    use berth_jobspec::names::{NameKind, check_name};
    match id.split_once('/') {
        Some((parent, child)) => {
            check_name(NameKind::Job, parent)?;
            check_name(NameKind::Job, child)
        }
        None => check_name(NameKind::Job, id),
    }
}

/// One alloc placed on one node by the scheduler.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Placement {
    pub alloc_id: String,
    pub job_id: String,
    /// The job key's revision this alloc was placed for: a newer one replaces it.
    pub job_version: i64,
    pub group: String,
    pub group_index: usize,
    pub alloc_index: u32,
    /// `job.group[index]`.
    pub name: String,
    pub node_id: String,
    pub cpu_mhz: u64,
    pub memory_mb: u64,
    /// Its `ephemeral_disk` (MB); 0 in placements of an older berth.
    #[serde(default)]
    pub disk_mb: u64,
    /// Static ports the alloc holds on its node.
    #[serde(default)]
    pub static_ports: Vec<u16>,
    /// The alloc this one replaces (on a lost or draining node, or failed), if any.
    #[serde(default)]
    pub replaces: Option<String>,
    pub placed_ms: u64,
    /// The reschedule attempts behind this alloc, oldest first, the last one for the
    /// failed alloc it replaces (Nomad's `RescheduleTracker`); kept short (see
    /// `scheduler/reschedule.rs`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reschedule_events: Vec<RescheduleEvent>,
    /// Asked to stop and be replaced (Nomad's `alloc stop`): the scheduler removes it
    /// (its node stops the alloc) and places the group's alloc again.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stop_requested: bool,
}

/// One reschedule attempt: a failed alloc placed again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RescheduleEvent {
    /// When the replacement was placed.
    pub reschedule_ms: u64,
    pub prev_alloc_id: String,
    pub prev_node_id: String,
    /// How long after the failure it was placed, as the policy asked.
    pub delay_ms: u64,
}

/// What a node says of one of its allocs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AllocReport {
    pub alloc_id: String,
    pub job_id: String,
    pub name: String,
    pub node_id: String,
    pub node_name: String,
    pub client_status: ClientStatus,
    /// Why it is in that state, when it is not plain (`lost`: its node went down).
    #[serde(default)]
    pub description: String,
    pub updated_ms: u64,
    /// Its tasks' states as its node last reported them ([`AllocReport::tasks_of`]),
    /// so every agent shows them (Nomad's clients send theirs to the servers).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tasks: BTreeMap<String, TaskState>,
}

impl AllocReport {
    /// Events kept per task in a report: Nomad keeps 10.
    pub const EVENTS_KEPT: usize = 10;
    /// Characters kept of an event's message in a report.
    pub const MESSAGE_KEPT: usize = 512;

    /// The most a report's task states take, as JSON: a group of thousands of tasks
    /// keeps fewer events each, so a report always fits in the store's request.
    pub const TASKS_BYTES_KEPT: usize = 64 * 1024;

    /// What a report says of an alloc's tasks: their states with the last
    /// [`EVENTS_KEPT`](Self::EVENTS_KEPT) events (fewer when the alloc has so many tasks
    /// that they would take more than [`TASKS_BYTES_KEPT`](Self::TASKS_BYTES_KEPT)), each
    /// message clipped, and without the host paths they mounted (which are the node's
    /// own business).
    pub fn tasks_of(tasks: &BTreeMap<String, TaskState>) -> BTreeMap<String, TaskState> {
        let mut kept = BTreeMap::new();
        for events in [Self::EVENTS_KEPT, 3, 1, 0] {
            kept = Self::tasks_keeping(tasks, events);
            let bytes = serde_json::to_vec(&kept).map_or(usize::MAX, |json| json.len());
            if bytes <= Self::TASKS_BYTES_KEPT {
                return kept;
            }
        }
        // Even without events: the states alone, for as many tasks as fit (each entry
        // is its name quoted, a colon, its state and a comma; the map's braces).
        let mut bytes: usize = 2;
        kept.retain(|name, state| {
            let entry = serde_json::to_vec(state).map_or(usize::MAX, |j| j.len());
            bytes = bytes.saturating_add(name.len() + 4).saturating_add(entry);
            bytes <= Self::TASKS_BYTES_KEPT
        });
        kept
    }

    fn tasks_keeping(
        tasks: &BTreeMap<String, TaskState>,
        events: usize,
    ) -> BTreeMap<String, TaskState> {
        tasks
            .iter()
            .map(|(name, state)| {
                let mut state = state.clone();
                state.mounts.clear();
                let beyond = state.events.len().saturating_sub(events);
                state.events.drain(..beyond);
                for event in &mut state.events {
                    if let Some((end, _)) = event.message.char_indices().nth(Self::MESSAGE_KEPT) {
                        event.message.truncate(end);
                        event.message.push('…');
                    }
                }
                (name.clone(), state)
            })
            .collect()
    }
}

/// Everything the scheduler reads, at one revision.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    pub revision: i64,
    /// Jobs with the revision of their key (their version).
    pub jobs: Vec<(ClusterJob, i64)>,
    pub nodes: Vec<NodeView>,
    pub placements: Vec<Placement>,
    pub reports: Vec<AllocReport>,
    /// Operator settings per node id: eligibility and drain, kept apart from the node's
    /// own record (which its agent rewrites).
    pub node_settings: Vec<(String, NodeSettings)>,
    /// What the scheduler could not place, by job.
    pub blocked: std::collections::BTreeMap<String, Vec<Blocked>>,
    /// Which nodes can use which CSI volumes.
    pub csi: CsiView,
    /// Evaluations, oldest first.
    pub evals: Vec<Evaluation>,
    /// Each periodic job's last launch (ms since the epoch), kept apart from its
    /// children, which are collected.
    pub last_launches: std::collections::BTreeMap<String, u64>,
}

/// The CSI facts placement needs: each volume's plugin, and where that plugin's node
/// part runs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CsiView {
    /// Volume id → plugin id.
    pub volume_plugins: std::collections::BTreeMap<String, String>,
    /// Plugin id → node name → whether its node part there is healthy.
    pub node_plugins: std::collections::BTreeMap<String, std::collections::BTreeMap<String, bool>>,
    /// The allocs a claim names: their reports are kept while it does (a lost alloc's
    /// claim is released from its report).
    pub claimed_allocs: std::collections::BTreeSet<String>,
}

/// What an operator set on a node (`node eligibility`, `node drain`); survives the
/// node's restarts.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeSettings {
    #[serde(default)]
    pub ineligible: bool,
    /// Draining: allocs are moved off; `drain_deadline_ms` is when they are stopped
    /// anyway (0: no deadline).
    #[serde(default)]
    pub drain: bool,
    #[serde(default)]
    pub drain_deadline_ms: u64,
}

impl Cluster {
    /// Submits (or replaces) a job with its evaluation; the key's new revision is its
    /// version.
    pub fn put_job(&self, job: &ClusterJob) -> Result<i64, ClusterError> {
        use super::etcd::Write;
        let key = self.key(&["jobs", &job.id]);
        let value = serde_json::to_vec(job).map_err(|e| ClusterError::Local(e.to_string()))?;
        let eval = self.eval_write(&Evaluation::pending(&job.id, trigger::REGISTER))?;
        let store = self.store().clone();
        self.store().block(async move {
            let job = Write::Put {
                key: key.clone(),
                value,
                lease: 0,
            };
            store.transaction(Vec::new(), vec![job, eval]).await?;
            Ok::<_, ClusterError>(store.get(&key).await?.map_or(0, |e| e.mod_revision))
        })
    }

    /// Records a launched child, which must be new, while its parent is still at
    /// `parent_version` (not stopped, purged or submitted again since it was read):
    /// agents launching one periodic child at once launch it once, and a parent stopped
    /// meanwhile launches nothing.
    pub fn create_child(
        &self,
        child: &ClusterJob,
        parent_version: i64,
        eval: &Evaluation,
    ) -> Result<ChildCreated, ClusterError> {
        use super::etcd::{Condition, Write};
        let parent = child
            .child_of
            .as_ref()
            .map(|c| c.parent.clone())
            .ok_or_else(|| {
                ClusterError::Local(format!("job {:?} is not a launched child", child.id))
            })?;
        let key = self.key(&["jobs", &child.id]);
        let parent_key = self.key(&["jobs", &parent]);
        let value = serde_json::to_vec(child).map_err(|e| ClusterError::Local(e.to_string()))?;
        let eval = self.eval_write(eval)?;
        let last_launch = child.id.contains("/periodic-").then(|| Write::Put {
            key: self.key(&["launches", &parent]),
            value: child.submitted_ms.to_string().into_bytes(),
            lease: 0,
        });
        let store = self.store().clone();
        self.store().block(async move {
            let conditions = vec![
                Condition::ModRevision(key.clone(), 0),
                Condition::ModRevision(parent_key, parent_version),
            ];
            let write = Write::Put {
                key: key.clone(),
                value,
                lease: 0,
            };
            // A periodic launch is kept apart from the child, which may be collected
            // long before the next launch is due (`scheduler::periodic`).
            let mut writes = vec![write, eval];
            writes.extend(last_launch);
            if store.transaction(conditions, writes).await? {
                return Ok(ChildCreated::Created);
            }
            Ok::<_, ClusterError>(if store.get(&key).await?.is_some() {
                ChildCreated::Exists
            } else {
                ChildCreated::ParentChanged
            })
        })
    }

    /// One job with its version (its key's revision), read alone (not through a
    /// snapshot of everything); a record its key does not name is refused.
    pub fn job(&self, id: &str) -> Result<Option<(ClusterJob, i64)>, ClusterError> {
        Ok(self
            .job_entry(id)?
            .and_then(|(job, version)| Some((job?, version))))
    }

    /// Job `id`'s record with its version, when its key exists: `None` for a record
    /// that cannot be read (or that its key does not name), with the version all the
    /// same, so that it can still be purged.
    pub fn job_entry(&self, id: &str) -> Result<Option<(Option<ClusterJob>, i64)>, ClusterError> {
        let key = self.key(&["jobs", id]);
        let store = self.store().clone();
        let entry = self
            .store()
            .block(async move { Ok::<_, ClusterError>(store.get(&key).await?) })?;
        Ok(entry.map(|entry| {
            let job = serde_json::from_slice::<ClusterJob>(&entry.value)
                .ok()
                .filter(|job| job.id == id);
            (job, entry.mod_revision)
        }))
    }

    /// Writes a job's record only if its key is still at `version` (nothing wrote it
    /// since it was read): false, and nothing written, when it was.
    /// `eval` is written with it.
    pub fn put_job_if(
        &self,
        job: &ClusterJob,
        version: i64,
        eval: &Evaluation,
    ) -> Result<bool, ClusterError> {
        let key = self.key(&["jobs", &job.id]);
        let value = serde_json::to_vec(job).map_err(|e| ClusterError::Local(e.to_string()))?;
        self.put_if_with_eval(key, value, version, eval)
    }

    /// Writes `value` at `key` only if the key is still at `version`, with `eval`, in one
    /// transaction: false, and nothing written, when something wrote the key since.
    fn put_if_with_eval(
        &self,
        key: String,
        value: Vec<u8>,
        version: i64,
        eval: &Evaluation,
    ) -> Result<bool, ClusterError> {
        use super::etcd::{Condition, Write};
        let eval = self.eval_write(eval)?;
        let store = self.store().clone();
        self.store().block(async move {
            let condition = Condition::ModRevision(key.clone(), version);
            let write = Write::Put {
                key,
                value,
                lease: 0,
            };
            Ok::<_, ClusterError>(
                store
                    .transaction(vec![condition], vec![write, eval])
                    .await?,
            )
        })
    }

    /// Removes a job (purge) only if its key is still at `version`: a purge never
    /// removes a version submitted after it looked. False, and nothing removed, when the
    /// job changed. The scheduler then stops the job's allocs.
    /// `eval` is written with it.
    pub fn delete_job_if(
        &self,
        id: &str,
        version: i64,
        eval: &Evaluation,
    ) -> Result<bool, ClusterError> {
        use super::etcd::{Condition, Write};
        let key = self.key(&["jobs", id]);
        let eval = self.eval_write(eval)?;
        let launches = Write::Delete(self.key(&["launches", id]));
        let store = self.store().clone();
        self.store().block(async move {
            let condition = Condition::ModRevision(key.clone(), version);
            Ok::<_, ClusterError>(
                store
                    .transaction(vec![condition], vec![Write::Delete(key), eval, launches])
                    .await?,
            )
        })
    }

    /// Nomad's `alloc stop`: marks the placement of `alloc_id` on `node_id` to be
    /// stopped and replaced, with an evaluation of its job, in one transaction, if the
    /// placement is still as read.
    pub fn request_alloc_stop(
        &self,
        node_id: &str,
        alloc_id: &str,
    ) -> Result<AllocStopRequest, ClusterError> {
        let key = self.key(&["allocs", node_id, alloc_id]);
        let store = self.store().clone();
        let read = key.clone();
        let entry = self
            .store()
            .block(async move { Ok::<_, ClusterError>(store.get(&read).await?) })?;
        let Some(entry) = entry else {
            return Ok(AllocStopRequest::NotPlaced);
        };
        let mut placement: Placement = serde_json::from_slice(&entry.value)
            .map_err(|e| ClusterError::Local(format!("the placement of alloc {alloc_id}: {e}")))?;
        if placement.alloc_id != alloc_id {
            return Ok(AllocStopRequest::NotPlaced);
        }
        placement.stop_requested = true;
        let eval = Evaluation::pending(&placement.job_id, trigger::ALLOC_STOP);
        let value =
            serde_json::to_vec(&placement).map_err(|e| ClusterError::Local(e.to_string()))?;
        let written = self.put_if_with_eval(key, value, entry.mod_revision, &eval)?;
        Ok(if written {
            AllocStopRequest::Requested(eval.id)
        } else {
            AllocStopRequest::Changed
        })
    }

    /// Records a placement as it is (a lone agent's import of the allocs it ran alone).
    pub fn put_placement(&self, placement: &Placement) -> Result<(), ClusterError> {
        let key = self.key(&["allocs", &placement.node_id, &placement.alloc_id]);
        let value =
            serde_json::to_vec(placement).map_err(|e| ClusterError::Local(e.to_string()))?;
        let store = self.store().clone();
        self.store()
            .block(async move { Ok::<_, ClusterError>(store.put(&key, value, 0).await?) })
    }

    /// What the alloc's node last said of it, if anything.
    pub fn report_of(&self, alloc_id: &str) -> Result<Option<AllocReport>, ClusterError> {
        let key = self.key(&["status", alloc_id]);
        let store = self.store().clone();
        let entry = self
            .store()
            .block(async move { Ok::<_, ClusterError>(store.get(&key).await?) })?;
        Ok(entry.and_then(|e| serde_json::from_slice::<AllocReport>(&e.value).ok()))
    }

    /// Records what this node says of one of its allocs.
    pub fn report(&self, report: &AllocReport) -> Result<(), ClusterError> {
        let key = self.key(&["status", &report.alloc_id]);
        let value = serde_json::to_vec(report).map_err(|e| ClusterError::Local(e.to_string()))?;
        let store = self.store().clone();
        self.store()
            .block(async move { Ok::<_, ClusterError>(store.put(&key, value, 0).await?) })
    }

    /// Sets an operator setting of a node (eligibility, drain).
    pub fn set_node_settings(
        &self,
        node_id: &str,
        settings: &NodeSettings,
    ) -> Result<(), ClusterError> {
        let key = self.key(&["node-settings", node_id]);
        let value = serde_json::to_vec(settings).map_err(|e| ClusterError::Local(e.to_string()))?;
        let store = self.store().clone();
        self.store()
            .block(async move { Ok::<_, ClusterError>(store.put(&key, value, 0).await?) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A busy agent's refusal is not remembered as the record's: the next read evaluates
    /// it again (attack review: remembered, it made jobs unreadable for good).
    #[test]
    fn a_busy_agents_refusal_is_not_remembered_as_the_records() {
        let job = ClusterJob {
            id: "busy-once".into(),
            source_name: "busy-once.hcl".into(),
            source: "job \"busy-once\" {\n  group \"g\" {\n    task \"t\" {\n      driver = \"mock\"\n    }\n  }\n}\n".into(),
            variables: Default::default(),
            submitted_ms: 0,
            stopped: false,
            may_run_plugins: false,
            child_of: None,
            by_operator: false,
            owner: None,
            typed: None,
        };
        let busy = berth_jobspec::JobspecError {
            file: job.source_name.clone(),
            problems: vec![berth_hcl::Problem {
                path: "jobspec".into(),
                at: None,
                message: berth_jobspec::pool::PoolError::Busy.to_string(),
            }],
        };
        assert!(berth_jobspec::is_transient(&busy));
        assert!(job.finish(job.source_key(), Err(busy)).is_err());
        assert!(Unreadable::known(job.source_key()).is_none());
        let read = job
            .spec()
            .expect("evaluated once the agent is no longer busy");
        assert_eq!(read.name, "busy-once");
        // Evaluated once, kept: the next read takes it from memory.
        assert!(Parsed::known(job.source_key()).is_some());
    }

    /// What a node writes of its tasks into the cluster is bounded whatever the task
    /// did: the last 10 events, each message clipped, and no host paths.
    #[test]
    fn a_report_keeps_the_last_events_clipped_and_no_host_paths() {
        use berth_model::events::{EventKind, TaskEvent, TaskStateKind};
        let state = TaskState {
            state: TaskStateKind::Running,
            failed: false,
            restarts: 40,
            exit_code: None,
            mounts: vec![berth_model::mount::HandedMount {
                host_path: "/var/lib/berth/secret-host-path".into(),
                task_path: "/data".into(),
                read_only: false,
                propagation: berth_model::mount::Propagation::Private,
                allow_setuid: false,
                source_below: None,
            }],
            events: (0..50)
                .map(|i| TaskEvent::new(EventKind::Restarting, format!("{i} {}", "x".repeat(5000))))
                .collect(),
        };
        let kept = AllocReport::tasks_of(&[("t".to_string(), state.clone())].into());
        let kept = &kept["t"];
        assert!(kept.mounts.is_empty());
        assert_eq!(kept.events.len(), AllocReport::EVENTS_KEPT);
        assert!(kept.events[0].message.starts_with("40 "), "the last ten");
        assert!(
            kept.events
                .iter()
                .all(|e| e.message.chars().count() == AllocReport::MESSAGE_KEPT + 1)
        );
        assert_eq!(kept.restarts, 40);
        // Thousands of tasks (dynamic blocks make them from a small jobspec): fewer
        // events each, and the whole stays within its bound.
        let many: BTreeMap<String, TaskState> = (0..3000)
            .map(|i| (format!("task-{i:04}"), state.clone()))
            .collect();
        let kept = AllocReport::tasks_of(&many);
        let bytes = serde_json::to_vec(&kept).unwrap().len();
        assert!(bytes <= AllocReport::TASKS_BYTES_KEPT, "{bytes}");
        assert!(!kept.is_empty());
    }
}
