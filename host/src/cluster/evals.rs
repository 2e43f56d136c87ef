//! Evaluations, as Nomad has them: each change to a job (register, stop, purge,
//! dispatch, periodic launch) writes a `pending` evaluation in the same transaction as
//! the job (`P/evals/<id>`), and the scheduler's next round that read it marks it
//! `complete` with what it decided for the job: the allocs it has and where, the allocs
//! it stopped, and what could not be placed and why (Nomad's `FailedTGAllocs`).
//!
//! A register answers with the evaluation's id (Nomad's `EvalID`), and Nomad's clients
//! follow it (`/v1/evaluation/:id`, `/v1/evaluation/:id/allocations`).

use serde::{Deserialize, Serialize};

use super::etcd::{Change, Write};
use super::state::Blocked;
use super::{Cluster, ClusterError};

/// What caused an evaluation (Nomad's `TriggeredBy`).
pub mod trigger {
    pub const REGISTER: &str = "job-register";
    pub const DEREGISTER: &str = "job-deregister";
    pub const PERIODIC: &str = "periodic-job";
    pub const DISPATCH: &str = "job-dispatch";
}

/// Complete evaluations are kept this long (Nomad's `eval_gc_threshold` is an hour).
pub const EVALS_KEPT_MS: u64 = 60 * 60 * 1000;

/// At most this many evaluations are kept per job: the oldest complete ones go first.
pub const EVALS_KEPT_PER_JOB: usize = 16;

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
                    Ok(Some(Change::Put(_) | Change::Delete { .. } | Change::Reset)) => {}
                    Ok(None) | Err(_) => return Ok(eval),
                }
            }
        })
    }
}

/// What the scheduler's round does to the evaluations it read: each pending one
/// completed with what `plan` leaves its job with, and those past keeping removed.
#[derive(Debug, Default, PartialEq)]
pub struct EvalOutcome {
    pub complete: Vec<Evaluation>,
    pub forget: Vec<String>,
}

/// Completes the pending evaluations of `snapshot` by `plan` (at `now_ms`), and picks
/// the complete ones past keeping ([`EVALS_KEPT_MS`], [`EVALS_KEPT_PER_JOB`]).
pub fn outcome(
    snapshot: &super::state::Snapshot,
    plan: &super::scheduler::Plan,
    now_ms: u64,
) -> EvalOutcome {
    use std::collections::{BTreeMap, BTreeSet};
    let stopped: BTreeSet<&str> = plan.stop.iter().map(|(_, alloc)| alloc.as_str()).collect();
    let mut result = EvalOutcome::default();
    for eval in snapshot
        .evals
        .iter()
        .filter(|e| e.status == EvalStatus::Pending)
    {
        let of_job = |p: &&super::state::Placement| p.job_id == eval.job_id;
        let mut done = eval.clone();
        done.status = EvalStatus::Complete;
        done.modified_ms = now_ms;
        done.allocs = snapshot
            .placements
            .iter()
            .filter(of_job)
            .filter(|p| !stopped.contains(p.alloc_id.as_str()))
            .chain(plan.place.iter().filter(of_job))
            .map(|p| EvalAlloc {
                alloc_id: p.alloc_id.clone(),
                node_id: p.node_id.clone(),
            })
            .collect();
        done.stopped = snapshot
            .placements
            .iter()
            .filter(of_job)
            .filter(|p| stopped.contains(p.alloc_id.as_str()))
            .map(|p| p.alloc_id.clone())
            .collect();
        done.failed = plan
            .blocked
            .iter()
            .filter(|b| b.job_id == eval.job_id)
            .cloned()
            .collect();
        done.status_description = done
            .failed
            .first()
            .map(|b| b.why.clone())
            .unwrap_or_default();
        result.complete.push(done);
    }
    let mut per_job: BTreeMap<&str, Vec<&Evaluation>> = BTreeMap::new();
    for eval in &snapshot.evals {
        per_job.entry(eval.job_id.as_str()).or_default().push(eval);
    }
    for evals in per_job.values() {
        let complete: Vec<&&Evaluation> = evals
            .iter()
            .filter(|e| e.status == EvalStatus::Complete)
            .collect();
        let beyond = complete.len().saturating_sub(EVALS_KEPT_PER_JOB);
        for (at, eval) in complete.iter().enumerate() {
            let old = now_ms.saturating_sub(eval.modified_ms) > EVALS_KEPT_MS;
            if at < beyond || old {
                result.forget.push(eval.id.clone());
            }
        }
    }
    result
}

/// Writes `outcome` while `leader_key` is still at `leader_revision` (this agent still
/// schedules).
pub async fn apply(
    cluster: &Cluster,
    outcome: &EvalOutcome,
    leader_key: &str,
    leader_revision: i64,
) -> Result<(), ClusterError> {
    use super::etcd::Condition;
    let mut writes = Vec::new();
    for eval in &outcome.complete {
        writes.push(cluster.eval_write(eval)?);
    }
    for id in &outcome.forget {
        writes.push(Write::Delete(cluster.key(&["evals", id])));
    }
    for chunk in writes.chunks(100) {
        let held = vec![Condition::ModRevision(
            leader_key.to_string(),
            leader_revision,
        )];
        if !cluster.store().transaction(held, chunk.to_vec()).await? {
            break;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::scheduler::tests::tests_support::{job, node};
    use crate::cluster::state::Snapshot;

    fn snapshot(evals: Vec<Evaluation>) -> Snapshot {
        Snapshot {
            revision: 100,
            jobs: vec![job("web", 2, ""), job("huge", 1, "")],
            nodes: vec![node("a", 1000, 1000)],
            evals,
            ..Snapshot::default()
        }
    }

    #[test]
    fn a_pending_evaluation_completes_with_its_jobs_allocs_and_what_could_not_be_placed() {
        let mut huge = job("huge", 1, "");
        huge.0.source = huge.0.source.replace("memory = 100", "memory = 5000");
        let mut snap = snapshot(vec![
            Evaluation::pending("web", trigger::REGISTER),
            Evaluation::pending("huge", trigger::REGISTER),
        ]);
        snap.jobs[1] = huge;
        let plan = crate::cluster::scheduler::plan(&snap, 1_000);
        let outcome = outcome(&snap, &plan, 1_000);
        assert_eq!(outcome.complete.len(), 2);
        let web = &outcome.complete[0];
        assert_eq!(web.status, EvalStatus::Complete);
        assert_eq!(web.allocs.len(), 2, "{web:?}");
        assert!(web.allocs.iter().all(|a| a.node_id == "id-a"));
        assert!(web.failed.is_empty());
        let huge = &outcome.complete[1];
        assert!(huge.allocs.is_empty());
        assert_eq!(huge.failed.len(), 1);
        assert!(
            huge.status_description.contains("memory exhausted"),
            "{huge:?}"
        );
        assert!(outcome.forget.is_empty());
    }

    #[test]
    fn complete_evaluations_are_kept_an_hour_and_sixteen_per_job_at_most() {
        let now = EVALS_KEPT_MS * 10;
        let complete = |job: &str, modified_ms: u64| Evaluation {
            status: EvalStatus::Complete,
            modified_ms,
            ..Evaluation::pending(job, trigger::REGISTER)
        };
        let mut evals: Vec<Evaluation> = (0..20).map(|i| complete("web", now - i)).collect();
        // Oldest first, as a snapshot has them.
        evals.reverse();
        let stale = complete("huge", now - EVALS_KEPT_MS - 1);
        let fresh = complete("huge", now - 10);
        let pending = Evaluation {
            modified_ms: 0,
            ..Evaluation::pending("huge", trigger::REGISTER)
        };
        evals.extend([stale.clone(), fresh, pending.clone()]);
        let outcome = outcome(&snapshot(evals.clone()), &Default::default(), now);
        let mut expected: Vec<String> = evals[..4].iter().map(|e| e.id.clone()).collect();
        expected.push(stale.id);
        let mut forgotten = outcome.forget.clone();
        forgotten.sort();
        expected.sort();
        assert_eq!(forgotten, expected);
        // A pending one is never forgotten: it is completed.
        assert_eq!(outcome.complete.len(), 1);
        assert_eq!(outcome.complete[0].id, pending.id);
    }
}
