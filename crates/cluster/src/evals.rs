//! Evaluations, as Nomad has them: each change to a job (register, stop, purge,
//! dispatch, periodic launch) writes a `pending` evaluation in the same transaction as
//! the job (`P/evals/<id>`), and the scheduler's next round that read it marks it
//! `complete` with what it decided for the job: the allocs it has and where, the allocs
//! it stopped, and what could not be placed and why (Nomad's `FailedTGAllocs`).
//!
//! The records are here ([`Evaluation`], with what could not be placed: [`Blocked`]);
//! the scheduler completes them (`scheduler::evals`).
//!
//! A register answers with the evaluation's id (Nomad's `EvalID`), and Nomad's clients
//! follow it (`/v1/evaluation/:id`, `/v1/evaluation/:id/allocations`).

use serde::{Deserialize, Serialize};

use super::etcd::Write;
use super::{Cluster, ClusterError};

/// An alloc the scheduler could not place, and why (as `job plan` says it).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Blocked {
    pub job_id: String,
    pub group: String,
    pub name: String,
    pub nodes_evaluated: usize,
    /// More allocs of the group that failed the same way (Nomad's `CoalescedFailures`).
    #[serde(default)]
    pub coalesced: u32,
    /// How many nodes each reason ruled out (`missing driver "docker"`: 2).
    pub reasons: std::collections::BTreeMap<String, usize>,
    /// "3 node(s) evaluated: missing driver \"docker\" (2), memory exhausted (1)".
    pub why: String,
}

/// What caused an evaluation (Nomad's `TriggeredBy`).
pub mod trigger {
    pub const REGISTER: &str = "job-register";
    pub const DEREGISTER: &str = "job-deregister";
    pub const PERIODIC: &str = "periodic-job";
    pub const DISPATCH: &str = "job-dispatch";
    pub const ALLOC_STOP: &str = "alloc-stop";
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EvalStatus {
    Pending,
    Complete,
}

impl EvalStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            EvalStatus::Pending => "pending",
            EvalStatus::Complete => "complete",
        }
    }
}

/// One alloc an evaluation left the job with, and its node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EvalAlloc {
    pub alloc_id: String,
    pub node_id: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Evaluation {
    pub id: String,
    pub job_id: String,
    pub triggered_by: String,
    pub status: EvalStatus,
    #[serde(default)]
    pub status_description: String,
    pub created_ms: u64,
    #[serde(default)]
    pub modified_ms: u64,
    /// The job's allocs once it was evaluated (those of its current version).
    #[serde(default)]
    pub allocs: Vec<EvalAlloc>,
    /// Allocs this evaluation stopped.
    #[serde(default)]
    pub stopped: Vec<String>,
    /// What could not be placed, per group.
    #[serde(default)]
    pub failed: Vec<Blocked>,
    /// The store's revision it was written at (its `CreateIndex`); set when read.
    #[serde(skip)]
    pub create_revision: i64,
    #[serde(skip)]
    pub mod_revision: i64,
}

impl Evaluation {
    /// A new evaluation of `job_id`, waiting for the scheduler.
    pub fn pending(job_id: &str, triggered_by: &str) -> Evaluation {
        Evaluation {
            id: super::random_id(),
            job_id: job_id.to_string(),
            triggered_by: triggered_by.to_string(),
            status: EvalStatus::Pending,
            status_description: String::new(),
            created_ms: super::now_ms(),
            modified_ms: super::now_ms(),
            allocs: Vec::new(),
            stopped: Vec::new(),
            failed: Vec::new(),
            create_revision: 0,
            mod_revision: 0,
        }
    }

    /// Reads a record; `None` for one that is not an evaluation or that its key does not
    /// name.
    pub fn from_entry(entry: &super::etcd::Entry) -> Option<Evaluation> {
        let mut eval: Evaluation = serde_json::from_slice(&entry.value).ok()?;
        if !super::is_uuid(&eval.id) || !entry.key.ends_with(&format!("/evals/{}", eval.id)) {
            return None;
        }
        eval.create_revision = entry.create_revision;
        eval.mod_revision = entry.mod_revision;
        Some(eval)
    }
}

impl Cluster {
    /// The write that records `eval`, to go in the transaction that changes its job.
    pub fn eval_write(&self, eval: &Evaluation) -> Result<Write, ClusterError> {
        Ok(Write::Put {
            key: self.key(&["evals", &eval.id]),
            value: serde_json::to_vec(eval).map_err(|e| ClusterError::Local(e.to_string()))?,
            lease: 0,
        })
    }

    /// Every evaluation kept, oldest first, and the revision they were read at.
    pub fn evaluations(&self) -> Result<(Vec<Evaluation>, i64), ClusterError> {
        let prefix = format!("{}/", self.key(&["evals"]));
        let store = self.store().clone();
        let (entries, revision) = self
            .store()
            .block(async move { Ok::<_, ClusterError>(store.list(&prefix).await?) })?;
        let mut evals: Vec<Evaluation> =
            entries.iter().filter_map(Evaluation::from_entry).collect();
        evals.sort_by_key(|e| (e.create_revision, e.id.clone()));
        Ok((evals, revision))
    }

    /// One evaluation.
    pub fn evaluation(&self, id: &str) -> Result<Option<Evaluation>, ClusterError> {
        if !super::is_uuid(id) {
            return Ok(None);
        }
        let key = self.key(&["evals", id]);
        let store = self.store().clone();
        let entry = self
            .store()
            .block(async move { Ok::<_, ClusterError>(store.get(&key).await?) })?;
        Ok(entry.as_ref().and_then(Evaluation::from_entry))
    }

    /// Waits until evaluation `id` is no longer pending, for `wait` at most: the
    /// evaluation as it is then.
    pub fn wait_evaluation(
        &self,
        id: &str,
        wait: std::time::Duration,
    ) -> Result<Option<Evaluation>, ClusterError> {
        let key = self.key(&["evals", id]);
        let store = self.store().clone();
        let wait = wait.min(std::time::Duration::from_secs(8));
        self.store().block(async move {
            let deadline = tokio::time::Instant::now() + wait;
            let mut changes = store.watch(&key, 0);
            loop {
                let eval = store.get(&key).await?;
                let eval = eval.as_ref().and_then(Evaluation::from_entry);
                match &eval {
                    Some(found) if found.status == EvalStatus::Pending => {}
                    _ => return Ok::<_, ClusterError>(eval),
                }
                match tokio::time::timeout_at(deadline, changes.recv()).await {
                    Ok(Some(_)) => {}
                    Ok(None) | Err(_) => return Ok(eval),
                }
            }
        })
    }
}
