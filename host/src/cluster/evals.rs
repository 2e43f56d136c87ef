//! Evaluations, as Nomad has them: each change to a job (register, stop, purge,
//! dispatch, periodic launch) writes a `pending` evaluation in the same transaction as
//! the job (`P/evals/<id>`), and the scheduler's next round that read it marks it
//! `complete` with what it decided for the job: the allocs it has and where, the allocs
//! it stopped, and what could not be placed and why (Nomad's `FailedTGAllocs`).
//!
//! The records are `state`'s ([`Evaluation`]); the scheduler completes them
//! (`scheduler::evals`).
//!
//! A register answers with the evaluation's id (Nomad's `EvalID`), and Nomad's clients
//! follow it (`/v1/evaluation/:id`, `/v1/evaluation/:id/allocations`).

use super::etcd::{Change, Write};
pub use super::state::{EvalAlloc, EvalStatus, Evaluation, trigger};
use super::{Cluster, ClusterError};

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
