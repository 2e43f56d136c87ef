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
use std::sync::Arc;

use base64::Engine as _;
use chrono::Utc;

use super::{Agent, JobAction, LookupError, SubmitError, Submitted, Submitter, now_ms};
use berth_cluster::evals::{Evaluation, trigger};
use berth_cluster::state::ChildCreated;
use berth_jobspec::{Job, MAX_DISPATCH_PAYLOAD, PayloadRule};
use berth_state::ChildOf;

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
        Ok(launched)
    }

    /// The running (not stopped) job `id`, to launch from, as the cluster has it.
    async fn launcher(&self, id: &str) -> Result<Parent, SubmitError> {
        let cluster = self.cluster.clone();
        let wanted = id.to_string();
        let found = tokio::task::spawn_blocking(move || cluster.job(&wanted))
            .await
            .map_err(|e| berth_cluster::ClusterError::Local(e.to_string()))??;
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
        Ok(Parent {
            job: Arc::new(record.spec_async().await.map_err(SubmitError::Invalid)?),
            source_name: record.source_name,
            source: record.source,
            variables: record.variables,
            may_run_plugins: record.may_run_plugins,
            owner: record.owner,
            typed: record.typed,
            version,
        })
    }

    /// Records a child of `parent` (`<parent>/<kind>-<unix time>[-suffix]`) with its
    /// evaluation, for the scheduler to place; answers once the evaluation completed.
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
        let triggered_by = if kind == "periodic" {
            trigger::PERIODIC
        } else {
            trigger::DISPATCH
        };
        let eval_id = loop {
            let record = cluster_child(parent, &id, child.clone());
            let eval = Evaluation::pending(&id, triggered_by);
            let eval_id = eval.id.clone();
            let writer = self.cluster.clone();
            let version = parent.version;
            let created =
                tokio::task::spawn_blocking(move || writer.create_child(&record, version, &eval))
                    .await
                    .map_err(|e| berth_cluster::ClusterError::Local(e.to_string()))??;
            match created {
                ChildCreated::Created => break eval_id,
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
        };
        tracing::info!(job = %name, child = %id, "launched a child job");
        self.publish_job("JobRegistered", &id);
        let (alloc_ids, replaced) = self.evaluated(&self.cluster, &eval_id).await;
        Ok(Submitted {
            job_id: id,
            alloc_ids,
            replaced,
            warnings: Vec::new(),
            eval_id,
        })
    }
}

/// A job to launch children from, with what a child keeps of it.
struct Parent {
    job: Arc<Job>,
    source_name: String,
    source: String,
    variables: berth_hcl::eval::VariableInputs,
    /// In a cluster: whether the parent's submitter could run CSI plugin tasks (its
    /// children may as much, and no more).
    may_run_plugins: bool,
    /// The parent's owner, whose its children are too.
    owner: Option<String>,
    /// The parent's typed job: its children's, under their own parts.
    typed: Option<berth_cluster::state::TypedJob>,
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
fn cluster_child(parent: &Parent, id: &str, child: ChildOf) -> berth_cluster::state::ClusterJob {
    berth_cluster::state::ClusterJob {
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
        typed: parent.typed.clone(),
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
