//! This agent as a member of a cluster (`cluster { store = "etcd" }`): joining at start
//! with a record of what the node is and has; jobs submitted here go to the cluster,
//! whose scheduler places them; this node runs what is placed on it (a placement is
//! durable intent: recorded locally before its runner starts) and reports what became
//! of it.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{
    Agent, AllocEntry, JobAction, JobEntry, NotOwner, SubmitError, Submitted, Submitter,
    spawn_runner,
};
use crate::alloc_runner::AllocRunner;
use crate::config::AgentConfig;
use crate::driver_set::DriverSet;
use berth_cluster::embedded::Embedded;
use berth_cluster::evals::{EvalStatus, Evaluation, trigger};
use berth_cluster::pace::Pace;
use berth_cluster::state::{AllocReport, ClusterJob, Placement, TypedJob};
use berth_cluster::store::Store;
use berth_cluster::{Cluster, ClusterError, NodeRecord};
use berth_jobspec::Job;
use berth_state::JobRecord;

/// Joins the configured cluster: etcd's, shared with other agents, or (without a
/// `cluster` block) this agent's own one-node cluster on the embedded store, kept in
/// `<data_dir>/cluster.db` (in memory for `berth run`). Blocking (it waits for etcd up to
/// the dial timeout): run it off the async workers.
pub(super) fn join(
    data_dir: &std::path::Path,
    config: &AgentConfig,
    drivers: &DriverSet,
    store: &Arc<berth_state::StateStore>,
    facts: &crate::node::Facts,
) -> Result<Arc<Cluster>, ClusterError> {
    let record = node_record(
        berth_cluster::node_id(data_dir)?,
        data_dir,
        config,
        drivers,
        facts,
    );
    let cluster = if config.cluster.uses_etcd() {
        if !data_dir.join("cluster-id").exists() {
            refuse_if_running_alone(store)?;
        }
        Cluster::join(&config.cluster, data_dir, record)?
    } else {
        let file = data_dir.join("cluster.db");
        // A data dir an older berth ran alone has a state file and no cluster store yet.
        let first = store.path().is_some() && !file.exists();
        let embedded = match store.path() {
            None => Embedded::in_memory(),
            Some(_) => Embedded::open(&file)?,
        };
        let cluster = Cluster::join_store(
            Store::embedded(embedded)?,
            &config.cluster,
            data_dir,
            record,
        )?;
        let imported = if first {
            super::lone_import::import(&cluster, store, config)?
        } else {
            Default::default()
        };
        if imported != Default::default() {
            tracing::info!(
                jobs = imported.jobs,
                allocs = imported.allocs,
                volumes = imported.volumes,
                "imported what this agent ran alone into its one-node cluster"
            );
        }
        cluster
    };
    tracing::info!(
        cluster = %cluster.cluster_id(),
        node = %cluster.node_id(),
        store = %cluster.store().endpoints(),
        "joined the cluster"
    );
    Ok(cluster)
}

/// A node joining a cluster for the first time must not run allocs of its own: the
/// cluster places every alloc, so the node would stop them on its first round. Refused
/// instead, saying which jobs and what to do.
fn refuse_if_running_alone(store: &berth_state::StateStore) -> Result<(), ClusterError> {
    let (allocs, _) = store
        .allocs()
        .map_err(|e| ClusterError::Local(e.to_string()))?;
    let live: Vec<&berth_state::AllocRecord> = allocs
        .iter()
        .filter(|a| !a.client_status.is_terminal())
        .collect();
    if live.is_empty() {
        return Ok(());
    }
    let distinct: BTreeSet<&str> = live.iter().map(|a| a.job_id.as_str()).collect();
    let jobs: Vec<String> = distinct.iter().take(5).map(|j| format!("{j:?}")).collect();
    Err(ClusterError::Local(format!(
        "this node runs {} alloc(s) of jobs submitted to it on its own ({}{}); in a cluster \
         the scheduler places every alloc, so joining would stop them. Stop those jobs \
         first (`berth job stop JOB`), or start the agent without its `cluster` block",
        live.len(),
        jobs.join(", "),
        if distinct.len() > jobs.len() {
            ", …"
        } else {
            ""
        }
    )))
}

/// The change index of an agent in `cluster`: etcd's revision from now on.
pub(super) fn follow_revision(cluster: &Arc<Cluster>) -> super::index::ChangeIndex {
    let start = cluster.revision().unwrap_or(1);
    super::index::ChangeIndex::following_store(u64::try_from(start).unwrap_or(1))
}

/// Moves `index` with every change under the cluster's prefix (a cut watch reads the
/// revision again).
pub(super) fn spawn_revision_follower(
    cluster: &Arc<Cluster>,
    index: Arc<super::index::ChangeIndex>,
) {
    let cluster = cluster.clone();
    let start = i64::try_from(index.current()).unwrap_or(0) + 1;
    tokio::spawn(async move {
        let mut changes = cluster
            .store()
            .watch(&format!("{}/", cluster.settings().prefix), start);
        while let Some(change) = changes.recv().await {
            let revision = match change {
                berth_cluster::etcd::Change::Put(entry) => entry.mod_revision,
                berth_cluster::etcd::Change::Delete { mod_revision, .. }
                | berth_cluster::etcd::Change::Revision(mod_revision) => mod_revision,
                berth_cluster::etcd::Change::Reset => {
                    let cluster = cluster.clone();
                    match tokio::task::spawn_blocking(move || cluster.revision()).await {
                        Ok(Ok(revision)) => revision,
                        _ => continue,
                    }
                }
            };
            index.advance_to(u64::try_from(revision).unwrap_or(0));
        }
    });
}

/// What this node is and has, as the cluster's scheduler and `node status` see it.
pub fn node_record(
    id: String,
    data_dir: &std::path::Path,
    config: &AgentConfig,
    drivers: &DriverSet,
    facts: &crate::node::Facts,
) -> NodeRecord {
    let fact = |key: &str| facts.get(key).cloned().unwrap_or_default();
    let totals = super::capacity::node_totals(data_dir);
    let mut attributes = (**facts).clone();
    let name = config
        .name
        .clone()
        .unwrap_or_else(|| fact("node.unique.name"));
    let datacenter = config.datacenter.clone().unwrap_or_else(|| "dc1".into());
    attributes.insert("node.unique.name".into(), name.clone());
    attributes.insert("node.unique.id".into(), id.clone());
    attributes.insert("node.datacenter".into(), datacenter.clone());
    NodeRecord {
        id,
        name,
        datacenter,
        node_pool: "default".into(),
        node_class: String::new(),
        http_addr: config.http.address.map(|a| a.to_string()),
        attributes,
        // A driver the operator turned off (raw_exec or mock unless enabled), or one that
        // spawns unconfined where the operator has not allowed it, is detected but
        // unusable: the scheduler places nothing on it here.
        drivers: drivers
            .iter()
            .map(|driver| {
                let usable = config.driver_enabled(driver.name())
                    && crate::validate::may_run_tasks_here(driver, config);
                (driver.name().to_string(), usable)
            })
            .collect(),
        host_volumes: config.host_volumes.iter().map(|v| v.name.clone()).collect(),
        host_volume_paths: config
            .host_volumes
            .iter()
            .map(|v| {
                let place = berth_cluster::HostVolumePath {
                    path: v.path.display().to_string(),
                    read_only: v.read_only,
                };
                (v.name.clone(), place)
            })
            .collect(),
        eligibility: "eligible".into(),
        drain: false,
        cpu_mhz: totals.cpu_mhz,
        memory_mb: totals.memory_mb,
        disk_mb: totals.disk_mb,
        reserved: config.reserved,
        reserved_ports: port_ranges(&config.reserved_ports),
        registered_ms: super::now_ms(),
    }
}

/// The most of a jobspec's source a cluster keeps for one job (store refuses a value
/// over 1.5 MiB, and every agent reads every job on each scheduling round).
const MAX_CLUSTER_SOURCE: usize = 256 * 1024;

/// The most one job's record (its source and its typed job) may take: etcd takes at most
/// 1.5 MiB in one request.
const MAX_CLUSTER_RECORD: usize = 1024 * 1024;

/// How long a submit waits for its evaluation before answering with the evaluation to
/// follow.
const EVALUATION_WAIT: Duration = Duration::from_secs(8);

/// How long it then waits for this node to take up what the evaluation placed here (a
/// placement's start may first collect finished allocs for room: their disks unmounted).
const TAKE_UP_WAIT: Duration = Duration::from_secs(30);

/// Rounds of read-then-write of a job's record before giving up on a job that keeps
/// changing.
const WRITE_TRIES: usize = 16;

/// The least time from one pass of this node over its placements to the next
/// ([`Pace`]: a placement that comes alone starts at once; a stream of task events makes
/// a pass every `PASS_GAP`, not one each).
const PASS_GAP: Duration = Duration::from_millis(2);

/// Refuses a record too big for one write of the store: evaluated, a small source can
/// make a big job (dynamic blocks), and the record holds it typed.
pub(super) fn fits_in_the_store(record: &ClusterJob) -> Result<(), SubmitError> {
    let record_bytes = serde_json::to_vec(record).map_or(usize::MAX, |json| json.len());
    if record_bytes > MAX_CLUSTER_RECORD {
        return Err(SubmitError::Refused(format!(
            "the job is {} KiB once evaluated; a cluster keeps at most {} KiB of one job",
            record_bytes / 1024,
            MAX_CLUSTER_RECORD / 1024
        )));
    }
    Ok(())
}

/// Once its burst is spent, how often an alloc's task states alone are told to the
/// cluster, at most.
const TASKS_REPORT_EVERY: Duration = Duration::from_secs(5);

/// Changes of an alloc's task states alone told as they come, per task, before the pace
/// of [`TASKS_REPORT_EVERY`] applies: a task's start is a few in a row (received, its
/// directory built, its hooks, started), each told in a pass of its own when they come
/// more than a pass apart, and the alloc's report ends with its tasks started.
const TASKS_REPORT_BURST_PER_TASK: f64 = 6.0;

/// What was last told of an alloc, when, and how many task-only reports it may still
/// make at once.
struct Reported {
    mark: ReportMark,
    at: Instant,
    tokens: f64,
}

/// What a report depends on, cheap to compare: its status, and per task its state,
/// restarts and how many events it has had (the last one's time).
#[derive(PartialEq)]
struct ReportMark {
    client_status: berth_model::status::ClientStatus,
    tasks: Vec<(berth_model::events::TaskStateKind, bool, u32, usize, u64)>,
}

impl ReportMark {
    fn of(alloc: &crate::alloc_runner::AllocStatus) -> ReportMark {
        ReportMark {
            client_status: alloc.client_status,
            tasks: alloc
                .tasks
                .values()
                .map(|t| {
                    let last = t.events.last().map_or(0, |e| e.time_ms);
                    (t.state, t.failed, t.restarts, t.events.len(), last)
                })
                .collect(),
        }
    }
}

/// The cluster's record of `job` as `submitter` submits it now.
pub(super) fn job_record(
    job: &Job,
    submitter: Submitter,
    source_name: &str,
    source: &str,
    variables: &berth_hcl::eval::VariableInputs,
) -> ClusterJob {
    ClusterJob {
        id: job.name.clone(),
        source_name: source_name.to_string(),
        source: source.to_string(),
        variables: variables.clone(),
        submitted_ms: super::now_ms(),
        stopped: false,
        may_run_plugins: submitter.may_run_plugins(),
        child_of: None,
        by_operator: job.submitted_by_operator,
        owner: submitter.owner(),
        typed: TypedJob::of(job),
    }
}

impl Agent {
    /// Submits a checked job to the cluster: the scheduler places it (on any node).
    pub(super) async fn submit_to_cluster(
        &self,
        cluster: &Arc<Cluster>,
        submitter: Submitter,
        job: Job,
        source_name: &str,
        source: &str,
        variables: &berth_hcl::eval::VariableInputs,
    ) -> Result<Submitted, SubmitError> {
        if source.len() > MAX_CLUSTER_SOURCE {
            return Err(SubmitError::Refused(format!(
                "the jobspec is {} KiB; a cluster keeps at most {} KiB of one job's source",
                source.len() / 1024,
                MAX_CLUSTER_SOURCE / 1024
            )));
        }
        let mut record = job_record(&job, submitter.clone(), source_name, source, variables);
        fits_in_the_store(&record)?;
        let eval = Evaluation::pending(&record.id, trigger::REGISTER);
        let eval_id = eval.id.clone();
        let writer = cluster.clone();
        tokio::task::spawn_blocking(move || -> Result<(), SubmitError> {
            let cluster = writer;
            // Written only over the version whose owner was checked (or where there was
            // none): a job another token submitted meanwhile is not replaced unchecked.
            for _ in 0..WRITE_TRIES {
                let version = match cluster.job_entry(&record.id)? {
                    None => 0,
                    Some((found, version)) => {
                        // The first submitter stays the owner; a record no agent can
                        // read is the operator's to replace.
                        let owner = found.and_then(|job| job.owner);
                        submitter.may_change(&record.id, owner.as_deref(), JobAction::Replace)?;
                        record.owner = owner;
                        version
                    }
                };
                if cluster.put_job_if(&record, version, &eval)? {
                    return Ok(());
                }
            }
            Err(SubmitError::Refused(format!(
                "job {:?} kept changing while it was being submitted: try again",
                record.id
            )))
        })
        .await
        .map_err(|e| ClusterError::Local(e.to_string()))??;
        // Registered: told before anything of its allocs, which the scheduler places now.
        self.publish_job("JobRegistered", &job.name);
        let (alloc_ids, replaced) = self.evaluated(cluster, &eval_id).await;
        Ok(Submitted {
            eval_id,
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

    /// Stops a cluster job (its allocs stop wherever they run) or purges it, when
    /// `submitter` may: the inner error says whose the job is when it may not.
    ///
    /// Each writes only the version it read (an etcd transaction compares the job's
    /// revision), and reads again when another agent wrote in between: a stop never
    /// puts back an older source over a resubmit, and a purge removes only a stopped
    /// version, never one submitted again after the stop (that submit stands).
    pub async fn stop_cluster_job(
        &self,
        submitter: &Submitter,
        id: &str,
        purge: bool,
    ) -> Result<Result<String, NotOwner>, ClusterError> {
        let cluster = self.cluster.clone();
        let id = id.to_string();
        let submitter = submitter.clone();
        let action = if purge {
            JobAction::Purge
        } else {
            JobAction::Stop
        };
        tokio::task::spawn_blocking(move || {
            for _ in 0..WRITE_TRIES {
                let entry = cluster.job_entry(&id)?;
                if let Some((found, _)) = &entry {
                    // A record no agent can read is the operator's.
                    let owner = found.as_ref().and_then(|job| job.owner.as_deref());
                    if let Err(refused) = submitter.may_change(&id, owner, action) {
                        return Ok(Err(refused));
                    }
                }
                let eval = Evaluation::pending(&id, trigger::DEREGISTER);
                let written = match (entry, purge) {
                    (None, true) => return Ok(Ok(String::new())),
                    (None, false) | (Some((None, _)), false) => {
                        return Err(ClusterError::Local(format!("job {id:?} not found")));
                    }
                    // A record no agent can read: purging is how it goes.
                    (Some((None, version)), true) => cluster.delete_job_if(&id, version, &eval)?,
                    (Some((Some(job), _)), true) if !job.stopped => {
                        return Err(ClusterError::Local(format!(
                            "job {id:?} was submitted again since it was stopped: not purged"
                        )));
                    }
                    (Some((Some(_), version)), true) => {
                        cluster.delete_job_if(&id, version, &eval)?
                    }
                    (Some((Some(mut job), version)), false) => {
                        job.stopped = true;
                        cluster.put_job_if(&job, version, &eval)?
                    }
                };
                if written {
                    return Ok(Ok(eval.id));
                }
            }
            Err(ClusterError::Local(format!(
                "job {id:?} kept changing while it was being stopped: try again"
            )))
        })
        .await
        .map_err(|e| ClusterError::Local(e.to_string()))?
    }

    /// The node that runs alloc `alloc_id`, when it is another's and `submitter` may
    /// `action` its job's allocs (the job's owner, or the operator). `Ok(Ok(None))`:
    /// the cluster has no report of it on another node.
    pub async fn alloc_elsewhere(
        &self,
        submitter: &Submitter,
        alloc_id: &str,
        action: JobAction,
    ) -> Result<Result<Option<String>, NotOwner>, ClusterError> {
        let cluster = self.cluster.clone();
        let alloc_id = alloc_id.to_string();
        let submitter = submitter.clone();
        tokio::task::spawn_blocking(move || {
            Ok(
                owned_report(&cluster, &submitter, &alloc_id, action)?.map(|report| {
                    report
                        .filter(|report| report.node_name != cluster.node_name())
                        .map(|report| report.node_name)
                }),
            )
        })
        .await
        .map_err(|e| ClusterError::Local(e.to_string()))?
    }

    /// Nomad's `alloc stop`, from any agent: the alloc's placement (on the node its
    /// report names) is marked, with an evaluation of its job, for the scheduler to stop
    /// it and place the group's alloc again, when `submitter` may change the job's allocs.
    /// `Ok(Ok(None))`: the cluster has no report of the alloc (not yet reported, or not
    /// the cluster's): nothing marked, the caller stops it here if it runs here.
    pub async fn request_alloc_stop(
        &self,
        submitter: &Submitter,
        alloc_id: &str,
    ) -> Result<Result<Option<String>, NotOwner>, ClusterError> {
        use berth_cluster::state::AllocStopRequest;
        let cluster = self.cluster.clone();
        let alloc_id = alloc_id.to_string();
        let submitter = submitter.clone();
        tokio::task::spawn_blocking(move || {
            let report = match owned_report(&cluster, &submitter, &alloc_id, JobAction::StopAlloc)?
            {
                Ok(Some(report)) => report,
                Ok(None) => return Ok(Ok(None)),
                Err(refused) => return Ok(Err(refused)),
            };
            for _ in 0..WRITE_TRIES {
                match cluster.request_alloc_stop(&report.node_id, &alloc_id)? {
                    AllocStopRequest::Requested(eval) => return Ok(Ok(Some(eval))),
                    AllocStopRequest::NotPlaced => return Ok(Ok(None)),
                    AllocStopRequest::Changed => continue,
                }
            }
            Err(ClusterError::Local(format!(
                "the placement of alloc {alloc_id} kept changing while its stop was asked: try again"
            )))
        })
        .await
        .map_err(|e| ClusterError::Local(e.to_string()))?
    }

    /// Waits for evaluation `eval_id` (a few seconds at most), then for this node to
    /// take up what it placed here: the allocs it left the job with, and those it
    /// stopped. Empty when it did not complete in time (it is then the way to follow).
    pub(super) async fn evaluated(
        &self,
        cluster: &Arc<Cluster>,
        eval_id: &str,
    ) -> (Vec<String>, Vec<String>) {
        let waiting = cluster.clone();
        let id = eval_id.to_string();
        let eval =
            tokio::task::spawn_blocking(move || waiting.wait_evaluation(&id, EVALUATION_WAIT))
                .await;
        let Ok(Ok(Some(eval))) = eval else {
            return (Vec::new(), Vec::new());
        };
        if eval.status == EvalStatus::Pending {
            return (Vec::new(), Vec::new());
        }
        let here = eval.allocs.iter().any(|a| a.node_id == cluster.node_id());
        if here || !eval.stopped.is_empty() {
            // A round that began after the evaluation completed has seen its placements.
            let mut rounds = self.placement_rounds.subscribe();
            let seen = *rounds.borrow_and_update();
            let _ = tokio::time::timeout(TAKE_UP_WAIT, rounds.wait_for(|round| *round >= seen + 2))
                .await;
        }
        let allocs = eval.allocs.into_iter().map(|a| a.alloc_id).collect();
        (allocs, eval.stopped)
    }

    /// Runs this node's placements for as long as the agent runs: a new placement is
    /// started, a removed one stopped; every alloc's status is reported to the cluster.
    pub(super) fn follow_placements(self: &Arc<Self>) {
        let cluster = self.cluster.clone();
        let agent = Arc::downgrade(self);
        let mut local_events = self.subscribe();
        tokio::spawn(async move {
            let prefix = format!("{}/", cluster.key(&["allocs", cluster.node_id()]));
            let mut changes = cluster.store().watch(&prefix, 0);
            let mut reported: BTreeMap<String, Reported> = BTreeMap::new();
            // Placements this node refused (its checks failed): reported once, not retried.
            let mut refused: BTreeSet<String> = BTreeSet::new();
            let mut pace = Pace::new(PASS_GAP);
            loop {
                pace.began();
                let Some(agent) = agent.upgrade() else { return };
                let placements = {
                    let cluster = cluster.clone();
                    tokio::task::spawn_blocking(move || cluster.own_placements()).await
                };
                match placements {
                    Ok(Ok((placements, _))) => {
                        agent
                            .run_placements(&cluster, placements, &mut refused)
                            .await
                    }
                    Ok(Err(error)) => {
                        tracing::warn!(%error, "reading this node's placements");
                    }
                    Err(_) => return,
                }
                agent.report_allocs(&cluster, &mut reported).await;
                agent.placement_rounds.send_modify(|round| *round += 1);
                drop(agent);
                tokio::select! {
                    change = changes.recv() => if change.is_none() { return },
                    _ = local_events.recv() => {}
                    () = tokio::time::sleep(Duration::from_secs(2)) => {}
                }
                // What else arrives until the pace allows is taken in the same pass.
                let rest = pace.rest();
                if !rest.is_zero() {
                    tokio::time::sleep(rest).await;
                }
                while changes.try_recv().is_ok() {}
                while local_events.try_recv().is_ok() {}
            }
        });
    }

    /// Starts the placements not running here and stops the allocs no longer placed.
    async fn run_placements(
        &self,
        cluster: &Arc<Cluster>,
        placements: Vec<Placement>,
        refused: &mut BTreeSet<String>,
    ) {
        let placed: BTreeSet<String> = placements.iter().map(|p| p.alloc_id.clone()).collect();
        let local: Vec<AllocEntry> = self.allocs.lock().unwrap().values().cloned().collect();
        for entry in &local {
            if !placed.contains(&entry.runner.id) && !entry.runner.is_terminal() {
                tracing::info!(alloc = %entry.runner.id, "the cluster no longer places this alloc here; stopping it");
                entry.runner.stop();
                self.index.bump();
            }
        }
        let known: BTreeSet<String> = local.iter().map(|e| e.runner.id.clone()).collect();
        let new: Vec<Placement> = placements
            .into_iter()
            .filter(|p| !known.contains(&p.alloc_id) && !refused.contains(&p.alloc_id))
            .collect();
        if new.is_empty() {
            return;
        }
        // A placement this node ran to its end and then collected is not run again (a
        // finished batch alloc stays placed): its report says it ended, as Nomad's client
        // skips an alloc the server has as terminal.
        let mut new = new;
        let mut ended = Vec::new();
        for placement in &new {
            let reader = cluster.clone();
            let id = placement.alloc_id.clone();
            if let Ok(Ok(Some(report))) =
                tokio::task::spawn_blocking(move || reader.report_of(&id)).await
                && report.client_status.is_terminal()
            {
                ended.push(placement.alloc_id.clone());
            }
        }
        new.retain(|p| !ended.contains(&p.alloc_id));
        refused.extend(ended);
        if new.is_empty() {
            return;
        }
        // Each new placement's job, read alone (not the whole cluster, which every
        // node would otherwise read on every placement).
        let mut jobs: BTreeMap<String, Option<(ClusterJob, i64)>> = BTreeMap::new();
        for placement in &new {
            if jobs.contains_key(&placement.job_id) {
                continue;
            }
            let reader = cluster.clone();
            let id = placement.job_id.clone();
            match tokio::task::spawn_blocking(move || reader.job(&id)).await {
                Ok(Ok(job)) => {
                    jobs.insert(placement.job_id.clone(), job);
                }
                _ => return,
            }
        }
        let mut replaced_here: BTreeSet<String> = BTreeSet::new();
        for placement in new {
            let Some(Some((job, version))) = jobs.get(&placement.job_id) else {
                continue;
            };
            if *version != placement.job_version || job.stopped {
                // About to be replaced by the scheduler.
                continue;
            }
            replaced_here.insert(placement.job_id.clone());
            if let Err(error) = self.run_placement(job, &placement).await {
                if let SubmitError::Invalid(problems) = &error
                    && berth_jobspec::is_transient(problems)
                {
                    // Busy now: the next round tries it again.
                    tracing::warn!(alloc = %placement.alloc_id, %error, "starting a placed alloc later");
                    continue;
                }
                refused.insert(placement.alloc_id.clone());
                tracing::error!(alloc = %placement.alloc_id, %error, "starting a placed alloc");
                let report = AllocReport {
                    alloc_id: placement.alloc_id.clone(),
                    job_id: placement.job_id.clone(),
                    name: placement.name.clone(),
                    node_id: cluster.node_id().to_string(),
                    node_name: cluster.node_name().to_string(),
                    client_status: berth_model::status::ClientStatus::Failed,
                    description: error.to_string(),
                    updated_ms: super::now_ms(),
                    tasks: Default::default(),
                };
                let cluster = cluster.clone();
                let _ = tokio::task::spawn_blocking(move || cluster.report(&report)).await;
            }
        }
        // A new version placed here: its old versions' finished allocs on this node go
        // (records and directories), as the job they belonged to was replaced.
        let placed: BTreeSet<&str> = placed.iter().map(String::as_str).collect();
        for job in &replaced_here {
            self.forget_finished_allocs_of(job, &placed);
        }
    }

    /// Checks one placed alloc's job against this node (its config, drivers, hooks and
    /// the submitter's rights, as a submit here would), then records and starts it.
    async fn run_placement(
        &self,
        cluster_job: &ClusterJob,
        placement: &Placement,
    ) -> Result<(), SubmitError> {
        let job = cluster_job
            .spec_async()
            .await
            .map_err(SubmitError::Invalid)?;
        let mut problems = super::submit::plugin_tasks_refused(&job, cluster_job.may_run_plugins);
        problems.extend(
            crate::validate::validate(
                &job,
                &self.node.drivers,
                &self.node.hooks,
                &self.node.config,
                Some(self.node.csi.catalog.as_ref()),
                &self.node.facts,
            )
            .await,
        );
        if !problems.is_empty() {
            return Err(SubmitError::Invalid(berth_jobspec::JobspecError {
                file: cluster_job.source_name.clone(),
                problems,
            }));
        }
        let group = job
            .groups
            .get(placement.group_index)
            .filter(|g| g.name == placement.group);
        let Some(group) = group else {
            return Err(SubmitError::Refused(format!(
                "job {:?} has no group {:?} at {}",
                job.name, placement.group, placement.group_index
            )));
        };
        let mut in_use = self.ports_in_use();
        let reserved = &self.node.config.reserved_ports;
        // A static port another job's alloc here holds (its dynamic ones included), or
        // the operator keeps for the node: refused, never shared (attack review: a
        // forward to this alloc took the other's traffic from the host's addresses).
        // An older version of this job, being replaced, gives its ports up.
        let others = self.ports_held_by_others(Some(&job.name));
        // Forwards stand until their release succeeds, a finished alloc's too.
        let forwarded = crate::alloc_runner::forwarded_ports();
        let this_jobs: BTreeSet<String> = (self.allocs.lock().unwrap().values())
            .filter(|entry| entry.runner.job.name == job.name)
            .map(|entry| entry.runner.id.clone())
            .collect();
        for port in group.ports.iter().filter_map(|p| p.number) {
            // A reserved one never gets here: the scheduler keeps it off this node.
            let whose = if others.contains(&port) {
                "held by another alloc on this node".to_string()
            } else if let Some(holder) = forwarded
                .get(&port)
                .filter(|holder| !this_jobs.contains(&holder.alloc))
            {
                format!("forwarded to {holder}, whose network is not released yet")
            } else {
                continue;
            };
            return Err(SubmitError::Refused(format!(
                "group {:?}: static port {port} is {whose}",
                group.name
            )));
        }
        in_use.extend(forwarded.keys().copied());
        in_use.extend(reserved.iter().copied());
        in_use.extend(group.ports.iter().filter_map(|p| p.number));
        let ports = crate::alloc_runner::ports::allocate(&group.ports, &mut in_use)
            .map_err(|e| SubmitError::Refused(format!("group {:?}: {e}", group.name)))?;
        let mut alloc =
            AllocRunner::new_record(&job, placement.group_index, placement.alloc_index, ports);
        alloc.id = placement.alloc_id.clone();
        let record = JobRecord {
            id: job.name.clone(),
            source_name: cluster_job.source_name.clone(),
            source: cluster_job.source.clone(),
            variables: cluster_job.variables.clone(),
            submitted_ms: cluster_job.submitted_ms,
            stopped: false,
            child_of: cluster_job.child_of.clone(),
            by_operator: job.submitted_by_operator,
            owner: cluster_job.owner.clone(),
            last_launch_ms: None,
        };
        self.node
            .store
            .put_job_and_allocs(&record, std::slice::from_ref(&alloc))?;
        let job = Arc::new(job);
        self.jobs.lock().unwrap().insert(
            record.id.clone(),
            JobEntry {
                record,
                job: job.clone(),
            },
        );
        let runner = AllocRunner::recorded(job, alloc, self.node.clone());
        self.make_room(std::slice::from_ref(&runner));
        let finished = spawn_runner(self, runner.clone());
        self.allocs
            .lock()
            .unwrap()
            .insert(runner.id.clone(), AllocEntry { runner, finished });
        self.index.bump();
        Ok(())
    }

    /// Tells the cluster what became of this node's allocs, their tasks' states with
    /// them (only what changed). A change of status is told at once; changes of task
    /// states alone as they come for a few ([`TASKS_REPORT_BURST_PER_TASK`]), then one every
    /// [`TASKS_REPORT_EVERY`] per alloc, so a restart loop does not write to the store
    /// on every event (attack review: 2,200 tasks failing each second swamped the
    /// agent) while an alloc's start is told step by step.
    async fn report_allocs(
        &self,
        cluster: &Arc<Cluster>,
        reported: &mut BTreeMap<String, Reported>,
    ) {
        let statuses: Vec<crate::alloc_runner::AllocStatus> = self
            .allocs
            .lock()
            .unwrap()
            .values()
            .map(|a| a.runner.status())
            .collect();
        let now = Instant::now();
        // Allocs this node no longer runs are not remembered (their last report stands).
        let live: BTreeSet<&str> = statuses.iter().map(|a| a.id.as_str()).collect();
        reported.retain(|id, _| live.contains(id.as_str()));
        for alloc in statuses {
            let mark = ReportMark::of(&alloc);
            let burst = TASKS_REPORT_BURST_PER_TASK * alloc.tasks.len().max(1) as f64;
            let tokens = match reported.get(&alloc.id) {
                None => burst,
                Some(before) if before.mark == mark => continue,
                Some(before) => {
                    let earned = now.duration_since(before.at).as_secs_f64()
                        / TASKS_REPORT_EVERY.as_secs_f64();
                    let tokens = (before.tokens + earned).min(burst);
                    let status_changed = before.mark.client_status != mark.client_status;
                    if tokens < 1.0 && !status_changed {
                        continue;
                    }
                    tokens
                }
            };
            let report = AllocReport {
                tasks: AllocReport::tasks_of(&alloc.tasks),
                job_id: alloc.job_id,
                alloc_id: alloc.id,
                name: alloc.name,
                node_id: cluster.node_id().to_string(),
                node_name: cluster.node_name().to_string(),
                client_status: alloc.client_status,
                description: String::new(),
                updated_ms: super::now_ms(),
            };
            let writer = cluster.clone();
            let alloc_id = report.alloc_id.clone();
            if let Ok(Ok(())) = tokio::task::spawn_blocking(move || writer.report(&report)).await {
                let tokens = (tokens - 1.0).max(0.0);
                reported.insert(
                    alloc_id,
                    Reported {
                        mark,
                        at: now,
                        tokens,
                    },
                );
            }
        }
    }
}

/// The cluster's report of alloc `alloc_id`, when `submitter` may `action` its job's
/// allocs (the job's owner, or the operator); `Ok(None)`: the cluster has no report of
/// it. Blocking: reads the store.
fn owned_report(
    cluster: &Cluster,
    submitter: &Submitter,
    alloc_id: &str,
    action: JobAction,
) -> Result<Result<Option<AllocReport>, NotOwner>, ClusterError> {
    let Some(report) = cluster.report_of(alloc_id)? else {
        return Ok(Ok(None));
    };
    let owner = cluster.job(&report.job_id)?.and_then(|(job, _)| job.owner);
    Ok(submitter
        .may_change(&report.job_id, owner.as_deref(), action)
        .map(|()| Some(report)))
}

/// `ports` as inclusive ranges, in order.
fn port_ranges(ports: &BTreeSet<u16>) -> Vec<(u16, u16)> {
    let mut ranges: Vec<(u16, u16)> = Vec::new();
    for &port in ports {
        match ranges.last_mut() {
            Some((_, last)) if u32::from(*last) + 1 == u32::from(port) => *last = port,
            _ => ranges.push((port, port)),
        }
    }
    ranges
}
