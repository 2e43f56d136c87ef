//! The scheduler's word on the evaluations a round read: each pending one completed
//! with what the round's plan leaves its job with, and complete ones past keeping
//! removed (`cluster::evals` has the reads; `state` the records).

use super::super::etcd::{Condition, Write};
use super::super::state::{EvalAlloc, EvalStatus, Evaluation, Placement, Snapshot};
use super::super::{Cluster, ClusterError};

/// Complete evaluations are kept this long (Nomad's `eval_gc_threshold` is an hour).
pub const EVALS_KEPT_MS: u64 = 60 * 60 * 1000;

/// At most this many complete evaluations are kept in all: the oldest go first.
pub const EVALS_KEPT_IN_ALL: usize = 2048;

/// At most this many evaluations are kept per job: the oldest complete ones go first.
pub const EVALS_KEPT_PER_JOB: usize = 16;

/// What the scheduler's round does to the evaluations it read: each pending one
/// completed with what `plan` leaves its job with, and those past keeping removed.
#[derive(Debug, Default, PartialEq)]
pub struct EvalOutcome {
    pub complete: Vec<Evaluation>,
    pub forget: Vec<String>,
}

/// Completes the pending evaluations of `snapshot` by `plan` (at `now_ms`), and picks
/// the complete ones past keeping ([`EVALS_KEPT_MS`], [`EVALS_KEPT_PER_JOB`]).
pub fn outcome(snapshot: &Snapshot, plan: &super::Plan, now_ms: u64) -> EvalOutcome {
    let every: Vec<&Evaluation> = snapshot.evals.iter().collect();
    EvalOutcome {
        complete: completed(snapshot, plan, now_ms),
        forget: forgotten(&every, now_ms),
    }
}

/// The pending evaluations of `snapshot`, completed by `plan` at `now_ms`.
pub fn completed(snapshot: &Snapshot, plan: &super::Plan, now_ms: u64) -> Vec<Evaluation> {
    use std::collections::BTreeSet;
    let stopped: BTreeSet<&str> = plan.stop.iter().map(|(_, alloc)| alloc.as_str()).collect();
    let mut complete = Vec::new();
    for eval in snapshot
        .evals
        .iter()
        .filter(|e| e.status == EvalStatus::Pending)
    {
        let of_job = |p: &&Placement| p.job_id == eval.job_id;
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
        complete.push(done);
    }
    complete
}

/// Of `every` evaluation kept (oldest first), the complete ones past keeping at
/// `now_ms`: older than [`EVALS_KEPT_MS`], beyond [`EVALS_KEPT_PER_JOB`] of one job, or
/// beyond [`EVALS_KEPT_IN_ALL`].
pub fn forgotten(every: &[&Evaluation], now_ms: u64) -> Vec<String> {
    use std::collections::{BTreeMap, BTreeSet};
    let mut forget = Vec::new();
    let mut per_job: BTreeMap<&str, Vec<&Evaluation>> = BTreeMap::new();
    for eval in every {
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
                forget.push(eval.id.clone());
            }
        }
    }
    // And at most so many in all, oldest first (attack review: jobs submitted and purged
    // under ever new names kept theirs for an hour each).
    let forgotten: BTreeSet<&str> = forget.iter().map(String::as_str).collect();
    let kept: Vec<&&Evaluation> = every
        .iter()
        .filter(|e| e.status == EvalStatus::Complete && !forgotten.contains(e.id.as_str()))
        .collect();
    let beyond = kept.len().saturating_sub(EVALS_KEPT_IN_ALL);
    let oldest: Vec<String> = kept.iter().take(beyond).map(|e| e.id.clone()).collect();
    forget.extend(oldest);
    forget
}

/// Writes `outcome` while `leader_key` is still at `leader_revision` (this agent still
/// schedules).
pub async fn apply(
    cluster: &Cluster,
    outcome: &EvalOutcome,
    leader_key: &str,
    leader_revision: i64,
) -> Result<(), ClusterError> {
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
    use crate::scheduler::tests::tests_support::{job, node};
    use crate::state::Snapshot;
    use crate::state::trigger;

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
        let plan = crate::scheduler::plan(&snap, 1_000);
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
            huge.status_description
                .contains("Resources exhausted: memory (1000 MiB free)"),
            "{huge:?}"
        );
        assert!(outcome.forget.is_empty());
    }

    #[test]
    fn complete_evaluations_are_kept_an_hour_sixteen_per_job_and_so_many_in_all() {
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
        // Jobs under ever new names: the oldest beyond the total go.
        let many: Vec<Evaluation> = (0..EVALS_KEPT_IN_ALL + 5)
            .map(|i| complete(&format!("j{i}"), now - 10))
            .collect();
        let many_outcome = super::outcome(&snapshot(many.clone()), &Default::default(), now);
        let expected: Vec<String> = many[..5].iter().map(|e| e.id.clone()).collect();
        assert_eq!(many_outcome.forget, expected);
    }
}
