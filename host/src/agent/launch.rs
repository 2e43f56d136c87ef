//! Jobs that launch other jobs, as in Nomad: a `periodic` job launches a child
//! (`<job>/periodic-<unix time>`) on its cron schedule, and `berth job periodic force`
//! launches one now; a `parameterized` job launches a child
//! (`<job>/dispatch-<unix time>-<random>`) per `berth job dispatch`, with the dispatch's
//! meta and payload.
//!
//! A child is a job of its own, recorded with its parent's source at launch and what it
//! was launched with ([`ChildOf`]), so a restarted agent rebuilds it exactly and a
//! parent submitted again does not change the children already running.

use std::collections::BTreeMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use base64::Engine as _;
use chrono::Utc;

use super::{Agent, JobAction, LookupError, SubmitError, Submitted, Submitter, now_ms};
use crate::jobspec::{Job, MAX_DISPATCH_PAYLOAD, PayloadRule};
use crate::state::{ChildOf, JobRecord};

impl Agent {
    /// Launches a child of the parameterized job `parent` with `meta` and `payload`,
    /// checked against the job's `parameterized` block as Nomad checks them.
    /// Only the job's owner and the operator may dispatch it.
    pub async fn dispatch(
        &self,
        submitter: &Submitter,
        parent: &str,
        meta: BTreeMap<String, String>,
        payload: Option<Vec<u8>>,
    ) -> Result<Submitted, SubmitError> {
        let launcher = self.launcher(parent).await?;
        submitter.may_change(parent, launcher.owner.as_deref(), JobAction::Dispatch)?;
        let Some(rules) = &launcher.job.parameterized else {
            return Err(SubmitError::Refused(format!(
                "job {parent:?} is not parameterized: only a job with a parameterized block \
                 is dispatched"
            )));
        };
        let payload = payload.filter(|p| !p.is_empty());
        match (rules.payload, &payload) {
            (PayloadRule::Required, None) => {
                return Err(SubmitError::Refused(format!(
                    "job {parent:?} requires a payload (parameterized {{ payload = \"required\" }})"
                )));
            }
            (PayloadRule::Forbidden, Some(_)) => {
                return Err(SubmitError::Refused(format!(
                    "job {parent:?} takes no payload (parameterized {{ payload = \"forbidden\" }})"
                )));
            }
            (_, Some(p)) if p.len() > MAX_DISPATCH_PAYLOAD => {
                return Err(SubmitError::Refused(format!(
                    "the payload is {} bytes; a dispatch payload is at most {MAX_DISPATCH_PAYLOAD} \
                     bytes, as in Nomad",
                    p.len()
                )));
            }
            _ => {}
        }
        let meta_bytes: usize = meta.iter().map(|(k, v)| k.len() + v.len()).sum();
        if meta_bytes > MAX_DISPATCH_META {
            return Err(SubmitError::Refused(format!(
                "the dispatch's meta is {meta_bytes} bytes; it is at most {MAX_DISPATCH_META} \
                 bytes (keys and values)"
            )));
        }
        let missing: Vec<&str> = rules
            .meta_required
            .iter()
            .filter(|key| !meta.contains_key(*key))
            .map(String::as_str)
            .collect();
        if !missing.is_empty() {
            return Err(SubmitError::Refused(format!(
                "job {parent:?} requires meta {} (give it with -meta KEY=VALUE)",
                missing.join(", ")
            )));
        }
        let unknown: Vec<&str> = meta
            .keys()
            .filter(|key| !rules.meta_required.contains(key) && !rules.meta_optional.contains(key))
            .map(String::as_str)
            .collect();
        if !unknown.is_empty() {
            return Err(SubmitError::Refused(format!(
                "job {parent:?} does not take meta {} (its parameterized block allows: {})",
                unknown.join(", "),
                allowed_meta(&rules.meta_required, &rules.meta_optional)
            )));
        }
        let child = ChildOf {
            parent: parent.to_string(),
            meta: meta.into_iter().collect(),
            payload: payload.map(|p| base64::engine::general_purpose::STANDARD.encode(p)),
        };
        let suffix = format!("{:08x}", random_u32());
        self.launch_child(
            &launcher,
            "dispatch",
            Some(&suffix),
            child,
            Utc::now().timestamp(),
        )
        .await
    }

    /// Launches a child of the periodic job `parent` now, whatever its schedule says (and
    /// whether or not another child runs), as `nomad job periodic force` does.
    /// Only the job's owner and the operator may force a launch.
    pub async fn force_periodic(
        &self,
        submitter: &Submitter,
        parent: &str,
    ) -> Result<Submitted, SubmitError> {
        let launcher = self.launcher(parent).await?;
        submitter.may_change(parent, launcher.owner.as_deref(), JobAction::Launch)?;
        if launcher.job.periodic.is_none() {
            return Err(SubmitError::Refused(format!(
                "job {parent:?} is not periodic: only a job with a periodic block is forced"
            )));
        }
        let launched = self
            .launch_child(
                &launcher,
                "periodic",
                None,
                periodic_child(parent),
                Utc::now().timestamp(),
            )
            .await?;
        if self.cluster.is_none() {
            self.record_last_launch(parent, now_ms()).await;
        }
        Ok(launched)
    }

    /// Launches the child of the periodic job `parent` its schedule made due at
    /// `launched` (unix seconds, which name it), as the operator: the agent's own launch.
    async fn launch_scheduled(
        &self,
        parent: &str,
        launched: i64,
    ) -> Result<Submitted, SubmitError> {
        let launcher = self.launcher(parent).await?;
        // Submitted again since the launcher looked, without a schedule now.
        if !launcher.job.periodic.as_ref().is_some_and(|p| p.enabled) {
            return Err(SubmitError::Refused(format!(
                "job {parent:?} no longer launches on a schedule"
            )));
        }
        self.launch_child(
            &launcher,
            "periodic",
            None,
            periodic_child(parent),
            launched,
        )
        .await
    }

    /// Keeps `at_ms` as the periodic job `parent`'s last launch, in its own record: what
    /// its next launch follows, whatever the collector forgets of its children. Under
    /// the job's lock, which a submit holds from writing its record to keeping it: the
    /// record written here is never an older version's.
    async fn record_last_launch(&self, parent: &str, at_ms: u64) {
        let _this_job = self.job_locks.lock(parent).await;
        let mut jobs = self.jobs.lock().unwrap();
        let Some(entry) = jobs.get_mut(parent) else {
            return;
        };
        if entry
            .record
            .last_launch_ms
            .is_some_and(|last| last >= at_ms)
        {
            return;
        }
        entry.record.last_launch_ms = Some(at_ms);
        if let Err(error) = self.node.store.put_job(&entry.record) {
            tracing::error!(job = %parent, %error, "recording a periodic job's last launch");
        }
    }

    /// The running (not stopped) job `id`, to launch from: this agent's, or in a
    /// cluster the cluster's.
    async fn launcher(&self, id: &str) -> Result<Parent, SubmitError> {
        if let Some(cluster) = self.cluster.clone() {
            let wanted = id.to_string();
            let found = tokio::task::spawn_blocking(move || cluster.job(&wanted))
                .await
                .map_err(|e| crate::cluster::ClusterError::Local(e.to_string()))??;
            let Some((record, version)) = found else {
                return Err(LookupError::NotFound {
                    kind: "job",
                    id: id.to_string(),
                }
                .into());
            };
            if record.stopped {
                return Err(stopped(id));
            }
            return Ok(Parent {
                job: Arc::new(record.spec_async().await.map_err(SubmitError::Invalid)?),
                source_name: record.source_name,
                source: record.source,
                variables: record.variables,
                may_run_plugins: record.may_run_plugins,
                owner: record.owner,
                version,
            });
        }
        let jobs = self.jobs.lock().unwrap();
        let entry = jobs.get(id).ok_or_else(|| LookupError::NotFound {
            kind: "job",
            id: id.to_string(),
        })?;
        if entry.record.stopped {
            return Err(stopped(id));
        }
        Ok(Parent {
            job: entry.job.clone(),
            source_name: entry.record.source_name.clone(),
            source: entry.record.source.clone(),
            variables: entry.record.variables.clone(),
            may_run_plugins: false,
            owner: entry.record.owner.clone(),
            version: 0,
        })
    }

    /// Records and starts a child of `parent` (`<parent>/<kind>-<unix time>[-suffix]`);
    /// in a cluster, records it there for the scheduler to place.
    async fn launch_child(
        &self,
        parent: &Parent,
        kind: &str,
        suffix: Option<&str>,
        child: ChildOf,
        launched: i64,
    ) -> Result<Submitted, SubmitError> {
        let name = &parent.job.name;
        // The parent's lock first (the order every path takes): a purge, stop or resubmit
        // of the parent waits for this launch, or this launch sees it and refuses.
        let _parent = self.job_locks.lock(name).await;
        let _one_at_a_time = self.submitting.lock().await;
        let base = match suffix {
            Some(suffix) => format!("{name}/{kind}-{launched}-{suffix}"),
            None => format!("{name}/{kind}-{launched}"),
        };
        // Two launches in one second (a force next to a scheduled launch) get `-2`, ...
        let mut id = base.clone();
        let mut n = 1;
        if let Some(cluster) = self.cluster.clone() {
            use crate::cluster::evals::{Evaluation, trigger};
            use crate::cluster::state::ChildCreated;
            let triggered_by = if kind == "periodic" {
                trigger::PERIODIC
            } else {
                trigger::DISPATCH
            };
            let mut eval_id;
            loop {
                let record = cluster_child(parent, &id, child.clone());
                let eval = Evaluation::pending(&id, triggered_by);
                eval_id = eval.id.clone();
                let writer = cluster.clone();
                let version = parent.version;
                let created = tokio::task::spawn_blocking(move || {
                    writer.create_child(&record, version, &eval)
                })
                .await
                .map_err(|e| crate::cluster::ClusterError::Local(e.to_string()))??;
                match created {
                    ChildCreated::Created => break,
                    ChildCreated::ParentChanged => {
                        return Err(SubmitError::Refused(format!(
                            "job {name:?} changed while launching from it (stopped, purged or \
                             submitted again): try again"
                        )));
                    }
                    ChildCreated::Exists if n < MAX_SAME_SECOND => {
                        n += 1;
                        id = format!("{base}-{n}");
                    }
                    ChildCreated::Exists => {
                        return Err(SubmitError::Refused(format!(
                            "{MAX_SAME_SECOND} children of job {name:?} were launched in one \
                             second: try again"
                        )));
                    }
                }
            }
            tracing::info!(job = %name, child = %id, "launched a child job in the cluster");
            let (alloc_ids, replaced) = self.evaluated(&cluster, &eval_id).await;
            return Ok(Submitted {
                job_id: id,
                alloc_ids,
                replaced,
                warnings: Vec::new(),
                eval_id,
            });
        }
        let unchanged = (self.jobs.lock().unwrap().get(name))
            .is_some_and(|entry| !entry.record.stopped && Arc::ptr_eq(&entry.job, &parent.job));
        if !unchanged {
            return Err(SubmitError::Refused(format!(
                "job {name:?} changed while launching from it (stopped, purged or submitted \
                 again): try again"
            )));
        }
        while self.jobs.lock().unwrap().contains_key(&id) {
            n += 1;
            id = format!("{base}-{n}");
        }
        let job = Arc::new(child.child_job(Job::clone(&parent.job), &id));
        let record = JobRecord {
            id: id.clone(),
            source_name: parent.source_name.clone(),
            source: parent.source.clone(),
            variables: parent.variables.clone(),
            submitted_ms: now_ms(),
            stopped: false,
            child_of: Some(child),
            by_operator: false,
            owner: parent.owner.clone(),
            last_launch_ms: None,
        };
        let alloc_ids = self.record_and_place(record, job)?;
        tracing::info!(job = %name, child = %id, "launched a child job");
        Ok(Submitted {
            eval_id: String::new(),
            job_id: id,
            alloc_ids,
            replaced: Vec::new(),
            warnings: Vec::new(),
        })
    }

    /// Whether a periodic child of `parent` still runs.
    fn periodic_child_running(&self, parent: &str) -> bool {
        let prefix = format!("{parent}/periodic-");
        self.allocs
            .lock()
            .unwrap()
            .values()
            .any(|a| a.runner.job.name.starts_with(&prefix) && !*a.finished.borrow())
    }

    /// The periodic jobs that launch, running and enabled: (id, schedule, last launch or
    /// submission in ms).
    fn periodic_jobs(&self) -> Vec<(String, crate::jobspec::Periodic, u64)> {
        let jobs = self.jobs.lock().unwrap();
        jobs.values()
            .filter(|e| !e.record.stopped && e.record.child_of.is_none())
            .filter_map(|e| {
                let periodic = e.job.periodic.as_ref().filter(|p| p.enabled)?;
                let prefix = format!("{}/periodic-", e.record.id);
                let last_ms = jobs
                    .range(prefix.clone()..)
                    .take_while(|(id, _)| id.starts_with(&prefix))
                    .map(|(_, child)| child.record.submitted_ms)
                    .chain([e.record.submitted_ms])
                    .chain(e.record.last_launch_ms)
                    .max()
                    .unwrap_or(0);
                Some((e.record.id.clone(), periodic.clone(), last_ms))
            })
            .collect()
    }
}

/// A job to launch children from, with what a child keeps of it.
struct Parent {
    job: Arc<Job>,
    source_name: String,
    source: String,
    variables: crate::jobspec::eval::VariableInputs,
    /// In a cluster: whether the parent's submitter could run CSI plugin tasks (its
    /// children may as much, and no more).
    may_run_plugins: bool,
    /// The parent's owner, whose its children are too.
    owner: Option<String>,
    /// In a cluster: the parent's version (its key's revision) when read; a child is
    /// recorded only while it holds.
    version: i64,
}

/// The most bytes a dispatch's meta (keys and values) holds: it is kept with the child,
/// in the cluster's store too.
const MAX_DISPATCH_META: usize = 16 * 1024;

/// Children of one job launched in one second, at most (a cluster's ids then run out).
const MAX_SAME_SECOND: u32 = 100;

fn stopped(id: &str) -> SubmitError {
    SubmitError::Refused(format!(
        "job {id:?} is stopped: run it again to launch from it"
    ))
}

/// A child's record in the cluster: its parent's source at launch.
fn cluster_child(parent: &Parent, id: &str, child: ChildOf) -> crate::cluster::state::ClusterJob {
    crate::cluster::state::ClusterJob {
        id: id.to_string(),
        source_name: parent.source_name.clone(),
        source: parent.source.clone(),
        variables: parent.variables.clone(),
        submitted_ms: now_ms(),
        stopped: false,
        may_run_plugins: parent.may_run_plugins,
        child_of: Some(child),
        by_operator: false,
        owner: parent.owner.clone(),
    }
}

fn periodic_child(parent: &str) -> ChildOf {
    ChildOf {
        parent: parent.to_string(),
        meta: Vec::new(),
        payload: None,
    }
}

fn allowed_meta(required: &[String], optional: &[String]) -> String {
    let all: Vec<&str> = required
        .iter()
        .chain(optional)
        .map(String::as_str)
        .collect();
    if all.is_empty() {
        "none".into()
    } else {
        all.join(", ")
    }
}

fn random_u32() -> u32 {
    let mut bytes = [0u8; 4];
    let _ = rustix::rand::getrandom(&mut bytes, rustix::rand::GetRandomFlags::empty());
    u32::from_le_bytes(bytes)
}

/// Launches the periodic jobs' children on their schedules for as long as the agent
/// lives (an agent on its own; in a cluster the scheduler does), by the cluster's rule
/// (`cluster::scheduler::periodic::due`): each job's next launch follows its last one
/// (or its submission), so a restarted agent makes the launch it missed within the
/// window, once, as a new cluster scheduler (and Nomad's new leader) does.
pub(super) fn spawn_periodic_launcher(agent: &Arc<Agent>) {
    if agent.cluster.is_some() {
        // The cluster's scheduler launches them (`cluster/scheduler/periodic.rs`).
        return;
    }
    let agent: Weak<Agent> = Arc::downgrade(agent);
    tokio::spawn(async move {
        loop {
            let Some(live) = agent.upgrade() else {
                return;
            };
            let now = now_ms();
            let mut wake: Option<u64> = None;
            for (id, periodic, last_ms) in live.periodic_jobs() {
                let (launch, next) =
                    crate::cluster::scheduler::periodic::due(&periodic, last_ms, now);
                if let Some(next) = next {
                    wake = Some(wake.map_or(next, |w| w.min(next)));
                }
                let Some(at_ms) = launch else {
                    continue;
                };
                if periodic.prohibit_overlap && live.periodic_child_running(&id) {
                    tracing::debug!(job = %id,
                        "skipping a periodic launch: the last one still runs (prohibit_overlap)");
                    continue;
                }
                let launched_at = i64::try_from(at_ms / 1000).unwrap_or(i64::MAX);
                if let Err(error) = live.launch_scheduled(&id, launched_at).await {
                    tracing::error!(job = %id, %error, "launching a periodic job");
                }
                // Made or failed, this time is done: not made again when its child is
                // collected, nor tried again every second while it fails.
                live.record_last_launch(&id, at_ms).await;
            }
            drop(live);
            // At most a second, so a newly submitted periodic job is picked up.
            let wait = wake
                .map(|at| Duration::from_millis(at.saturating_sub(now_ms())))
                .unwrap_or(Duration::ZERO)
                .min(Duration::from_secs(1));
            tokio::time::sleep(wait.max(Duration::from_millis(20))).await;
        }
    });
}
