//! `job plan`: what registering a job would do, decided by the scheduler's own
//! [`plan`](berth_cluster::scheduler::plan) on the cluster as it is now, with the job
//! put in it (Nomad's plan is its scheduler's dry run too). So a plan says what a
//! register then does, on a lone agent and on a cluster member alike: the nodes it
//! would take, the allocs it would replace or stop, and what would fit nowhere, with
//! the evaluation's reasons.

use std::collections::{BTreeMap, BTreeSet};

use super::{Agent, JobAction, SubmitError, Submitter};
use berth_cluster::evals::{Evaluation, trigger};
use berth_cluster::state::Blocked;
use berth_jobspec::Job;

/// Plans an agent runs at once: each parses a jobspec, reads the whole cluster and plans
/// it, so a flood of them (any token that may submit may plan) waits its turn instead of
/// holding a copy of the cluster each.
pub(super) const PLANS_AT_ONCE: usize = 2;

/// How long a plan waits for its turn before it is refused as busy.
const PLAN_TURN_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// What registering a job would do.
#[derive(Debug)]
pub struct JobPlan {
    pub job: Job,
    /// Why a register would refuse the job (who may run what, the jobspec for any
    /// node); with any, nothing was planned.
    pub problems: Vec<berth_hcl::Problem>,
    /// Per group, what the scheduler would do to its allocs.
    pub groups: BTreeMap<String, GroupUpdates>,
    /// What would fit nowhere, with why (the evaluation's `FailedTGAllocs`).
    pub failed: Vec<Blocked>,
    /// The registered version's revision (0: a new job).
    pub current_version: u64,
}

/// Nomad's `DesiredUpdates` of one group.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GroupUpdates {
    /// Allocs it would place, beside those it replaces.
    pub place: u64,
    /// Allocs it would stop without replacing them.
    pub stop: u64,
    /// Allocs it would replace with the new version's.
    pub destructive_update: u64,
    /// Allocs it would leave as they are.
    pub ignore: u64,
}

/// A turn to plan, held from before the request's jobspec is parsed until the plan is
/// made: at most [`PLANS_AT_ONCE`] per agent (attack review: 60 plans of a big jobspec
/// parsed at once, past the limit on planning, held submits for seconds).
pub struct PlanTurn<'a>(
    #[allow(dead_code, reason = "held, never read: the turn ends when it drops")]
    tokio::sync::SemaphorePermit<'a>,
);

impl Agent {
    /// Waits for a turn to plan, [`PLAN_TURN_WAIT`] at most: then refused as busy.
    pub async fn plan_turn(&self) -> Result<PlanTurn<'_>, SubmitError> {
        match tokio::time::timeout(PLAN_TURN_WAIT, self.plans.acquire()).await {
            Ok(Ok(permit)) => Ok(PlanTurn(permit)),
            _ => Err(SubmitError::Refused(
                "the agent is busy planning other jobs: try again".into(),
            )),
        }
    }

    /// What submitting `source` would do, without submitting it, in a turn: what a
    /// submit by `submitter` checks (plugins, the jobspec for any node, the record's
    /// size, the job's owner), then the scheduler's decision.
    pub async fn plan_job(
        &self,
        _turn: &PlanTurn<'_>,
        submitter: Submitter,
        source_name: &str,
        source: &str,
        variables: &berth_hcl::eval::VariableInputs,
    ) -> Result<JobPlan, SubmitError> {
        let mut job = berth_jobspec::parse_with_async(source_name, source, variables)
            .await
            .map_err(SubmitError::Invalid)?;
        job.submitted_by_operator = submitter == Submitter::Operator;
        // The checks a submit makes before the scheduler sees the job.
        let problems = self.submit_problems(&job, &submitter).await;
        let mut plan = JobPlan {
            job,
            problems,
            groups: BTreeMap::new(),
            failed: Vec::new(),
            current_version: 0,
        };
        if !plan.problems.is_empty() {
            return Ok(plan);
        }
        let record = super::cluster::job_record(
            &plan.job,
            submitter.clone(),
            source_name,
            source,
            variables,
        );
        super::cluster::fits_in_the_store(&record)?;
        let cluster = self.cluster.clone();
        let decided = tokio::task::spawn_blocking(move || {
            let mut snapshot = cluster.snapshot()?;
            let current = snapshot.jobs.iter().position(|(j, _)| j.id == record.id);
            let current_version = current.map_or(0, |at| snapshot.jobs[at].1);
            // Another token's job is not its to replace, nor to plan replacing.
            if let Some(at) = current {
                let owner = snapshot.jobs[at].0.owner.as_deref();
                submitter.may_change(&record.id, owner, JobAction::Replace)?;
            }
            // A register writes a new version, after every revision the cluster has
            // (berth replaces the allocs of a job submitted again, changed or not), with
            // its pending evaluation.
            let version = snapshot.revision + 1;
            let mut eval = Evaluation::pending(&record.id, trigger::REGISTER);
            eval.create_revision = version;
            eval.mod_revision = version;
            snapshot.evals.push(eval);
            match current {
                Some(at) => snapshot.jobs[at] = (record, version),
                None => snapshot.jobs.push((record, version)),
            }
            let decided = berth_cluster::scheduler::plan(&snapshot, berth_cluster::now_ms());
            Ok::<_, SubmitError>((snapshot, decided, current_version))
        })
        .await
        .map_err(|e| berth_cluster::ClusterError::Local(e.to_string()))??;
        let (snapshot, decided, current_version) = decided;
        if decided.deferred {
            return Err(SubmitError::Refused(
                "the agent is too busy to plan the job now: try again".into(),
            ));
        }
        plan.current_version = u64::try_from(current_version).unwrap_or(0);
        let name = plan.job.name.as_str();
        let stopped: BTreeSet<&str> = decided.stop.iter().map(|(_, a)| a.as_str()).collect();
        let reports: BTreeMap<&str, _> = snapshot
            .reports
            .iter()
            .map(|r| (r.alloc_id.as_str(), r.client_status))
            .collect();
        for placement in snapshot.placements.iter().filter(|p| p.job_id == name) {
            let updates = plan.groups.entry(placement.group.clone()).or_default();
            if stopped.contains(placement.alloc_id.as_str()) {
                updates.stop += 1;
            } else if !reports
                .get(placement.alloc_id.as_str())
                .is_some_and(|s| s.is_terminal())
            {
                updates.ignore += 1;
            }
        }
        for placement in decided.place.iter().filter(|p| p.job_id == name) {
            plan.groups
                .entry(placement.group.clone())
                .or_default()
                .place += 1;
        }
        for group in &plan.job.groups {
            plan.groups.entry(group.name.clone()).or_default();
        }
        // A new alloc in place of a stopped one is an update of it.
        for updates in plan.groups.values_mut() {
            let replaced = updates.place.min(updates.stop);
            updates.destructive_update = replaced;
            updates.place -= replaced;
            updates.stop -= replaced;
        }
        plan.failed = decided
            .blocked
            .into_iter()
            .filter(|b| b.job_id == name)
            .collect();
        Ok(plan)
    }
}
