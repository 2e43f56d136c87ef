//! One round of the leader's [`Mirror`]: the jobs it plans (see `mirror`'s doc), their
//! snapshot with the room the other jobs hold, the plan of it, and what the next rounds
//! keep of it (when each job is due again, what could not be placed).

use std::collections::{BTreeMap, BTreeSet};

use super::super::NodeView;
use super::super::records::Stored;
use super::super::state::{AllocReport, ClusterJob, CsiView, EvalStatus, Evaluation, Snapshot};
use super::fit::Usage;
use super::mirror::{FULL_ROUND_MS, Mirror};

/// What one round plans: the snapshot of the jobs it plans, and the room the other
/// jobs' allocs hold on each node.
pub struct Round {
    pub snapshot: Snapshot,
    held: BTreeMap<String, Usage>,
    /// The jobs planned (`None`: every job).
    jobs: Option<BTreeSet<String>>,
}

impl Round {
    /// Whether this round planned every job.
    pub fn is_full(&self) -> bool {
        self.jobs.is_none()
    }

    /// Whether this round planned `job`.
    pub fn planned(&self, job: &str) -> bool {
        self.jobs.as_ref().is_none_or(|jobs| jobs.contains(job))
    }

    /// How many jobs this round planned.
    pub fn jobs_planned(&self) -> usize {
        self.snapshot.jobs.len()
    }
}

impl Mirror {
    /// Takes what changed into a round at `now_ms` and plans it: the round (its
    /// snapshot, the jobs it planned) and its plan. Jobs not yet evaluated are
    /// evaluated here (the job sources stored without a typed job may wait for the
    /// agent's evaluating threads: call it off the async workers).
    ///
    /// A plan that stops or loses allocs frees room: the jobs waiting for room, and the
    /// per-node jobs, are planned in the same round (planned again with them), as a
    /// full plan would place them.
    pub fn plan_round(&mut self, now_ms: u64) -> (Round, super::Plan) {
        let full = self.everything || now_ms >= self.last_full_ms.saturating_add(FULL_ROUND_MS);
        let jobs = (!full).then(|| self.jobs_to_plan(now_ms));
        if full {
            self.last_full_ms = now_ms;
        }
        self.dirty.clear();
        self.room_changed = false;
        self.everything = false;
        let round = self.round(jobs);
        let plan = self.plan(&round, now_ms);
        let Some(mut jobs) = round.jobs.clone() else {
            return (round, plan);
        };
        if plan.stop.is_empty() && plan.lost.is_empty() {
            return (round, plan);
        }
        let before = jobs.len();
        jobs.extend(self.blocked.keys().cloned());
        jobs.extend(self.per_node.iter().cloned());
        if jobs.len() == before {
            return (round, plan);
        }
        let round = self.round(Some(jobs));
        let plan = self.plan(&round, now_ms);
        (round, plan)
    }

    /// The snapshot of `jobs` (`None`: every job) and the room the others hold.
    fn round(&mut self, jobs: Option<BTreeSet<String>>) -> Round {
        let planned = |id: &str| jobs.as_ref().is_none_or(|jobs| jobs.contains(id));
        // Evaluated once per version: the kinds the next rounds' choices need.
        let ids: Vec<String> = match &jobs {
            Some(jobs) => jobs.iter().cloned().collect(),
            None => self.jobs.keys().cloned().collect(),
        };
        for id in &ids {
            self.evaluate(id);
        }
        let mut snapshot = Snapshot {
            revision: self.revision,
            nodes: self.nodes_view().clone(),
            node_settings: self
                .node_settings
                .iter()
                .map(|(id, s)| (id.clone(), s.clone()))
                .collect(),
            csi: self.csi_view().clone(),
            last_launches: self.last_launches.clone(),
            ..Snapshot::default()
        };
        for id in &ids {
            if let Some(job) = self.jobs.get(id) {
                snapshot.jobs.push((job.record.clone(), job.version));
            }
        }
        let of_jobs = |index: &BTreeMap<String, BTreeSet<String>>| -> Vec<String> {
            match &jobs {
                Some(jobs) => jobs
                    .iter()
                    .flat_map(|job| index.get(job).into_iter().flatten().cloned())
                    .collect(),
                None => index.values().flatten().cloned().collect(),
            }
        };
        snapshot.placements = of_jobs(&self.placed_of_job)
            .iter()
            .filter_map(|alloc| self.placements.get(alloc).cloned())
            .collect();
        // The reports of those jobs, and of their placements (one naming another job
        // is read by its alloc, as a full plan reads it).
        let reported: BTreeSet<String> = of_jobs(&self.reported_of_job)
            .into_iter()
            .chain(snapshot.placements.iter().map(|p| p.alloc_id.clone()))
            .collect();
        snapshot.reports = reported
            .iter()
            .filter_map(|alloc| self.reports.get(alloc).cloned())
            .collect();
        // In the store's order (by key), as a snapshot read from it has them: where two
        // placements stand for one alloc, the plan's choices follow that order.
        snapshot
            .placements
            .sort_by(|a, b| (&a.node_id, &a.alloc_id).cmp(&(&b.node_id, &b.alloc_id)));
        snapshot.reports.sort_by(|a, b| a.alloc_id.cmp(&b.alloc_id));
        snapshot.blocked = self
            .blocked
            .iter()
            .filter(|(job, _)| planned(job))
            .map(|(job, entries)| (job.clone(), entries.clone()))
            .collect();
        // The pending evaluations of the jobs planned (those past keeping are picked
        // from all, [`Mirror::eval_outcome`]).
        snapshot.evals = self
            .evals
            .values()
            .filter(|e| e.status == EvalStatus::Pending && planned(&e.job_id))
            .cloned()
            .collect();
        snapshot
            .evals
            .sort_by_key(|e| (e.create_revision, e.id.clone()));
        // The room the jobs not planned hold.
        let mut held = self.held.clone();
        for placement in &snapshot.placements {
            if !self.terminal(&placement.alloc_id)
                && let Some(on_node) = held.get_mut(&placement.node_id)
            {
                on_node.remove(placement);
            }
        }
        let held = held
            .into_iter()
            .filter(|(node, _)| self.nodes.contains_key(node))
            .map(|(node, h)| {
                let usage = Usage {
                    cpu_mhz: h.cpu_mhz,
                    memory_mb: h.memory_mb,
                    disk_mb: h.disk_mb,
                    ports: h.ports.into_keys().collect(),
                    per_group: BTreeMap::new(),
                };
                (node, usage)
            })
            .collect();
        Round {
            snapshot,
            held,
            jobs,
        }
    }

    /// The jobs a round that is not full plans (see the module's doc).
    fn jobs_to_plan(&self, now_ms: u64) -> BTreeSet<String> {
        let mut jobs = self.dirty.clone();
        jobs.extend(
            self.timers
                .iter()
                .filter(|(_, at)| **at <= now_ms)
                .map(|(job, _)| job.clone()),
        );
        // Not evaluated yet (the agent was busy): their kind is not known.
        jobs.extend(
            self.jobs
                .iter()
                .filter(|(_, j)| !matches!(j.parsed, Some(Ok(_)) | Some(Err(_))))
                .map(|(id, _)| id.clone()),
        );
        if self.room_changed {
            jobs.extend(self.blocked.keys().cloned());
            jobs.extend(self.per_node.iter().cloned());
        }
        // Reports kept past their time, of allocs no longer placed.
        let kept_until =
            |report: &AllocReport| report.updated_ms.saturating_add(super::REPORTS_KEPT_MS);
        jobs.extend(
            self.unplaced
                .iter()
                .filter_map(|alloc| self.reports.get(alloc))
                .filter(|r| kept_until(r) < now_ms)
                .map(|r| r.job_id.clone()),
        );
        // Children of periodic and parameterized jobs whose allocs ended long ago.
        for (id, job) in self
            .jobs
            .iter()
            .filter(|(_, j)| j.record.child_of.is_some())
        {
            let mut ended_ms = Some(job.record.submitted_ms);
            for alloc in self.placed_of_job.get(id).into_iter().flatten() {
                let ended = self
                    .reports
                    .get(alloc)
                    .filter(|r| r.client_status.is_terminal())
                    .map(|r| r.updated_ms);
                ended_ms = ended_ms.zip(ended).map(|(a, b)| a.max(b));
            }
            if ended_ms.is_some_and(|at| at.saturating_add(super::REPORTS_KEPT_MS) < now_ms) {
                jobs.insert(id.clone());
            }
        }
        // A node's drain moves its allocs one round after another (the operator's
        // setting, or a record that says so).
        let draining = self
            .nodes
            .iter()
            .filter(|(id, record)| {
                record.drain || self.node_settings.get(*id).is_some_and(|s| s.drain)
            })
            .map(|(id, _)| id);
        for node in draining {
            jobs.extend(
                self.placed_on_node
                    .get(node)
                    .into_iter()
                    .flatten()
                    .filter_map(|alloc| self.placements.get(alloc))
                    .map(|p| p.job_id.clone()),
            );
        }
        // Periodic parents with their children: a launch reads them all.
        for parent in &self.periodic {
            jobs.insert(parent.clone());
            let children = format!("{parent}/");
            jobs.extend(
                self.jobs
                    .range(children.clone()..)
                    .take_while(|(id, _)| id.starts_with(&children))
                    .map(|(id, _)| id.clone()),
            );
        }
        jobs
    }

    fn evaluate(&mut self, id: &str) {
        let Some(job) = self.jobs.get_mut(id) else {
            return;
        };
        if job.parsed.is_some() {
            return;
        }
        let parsed = job.record.spec();
        // A busy agent's refusal says nothing of the job: the round defers, and it is
        // evaluated again in the next.
        if let Err(error) = &parsed
            && berth_jobspec::is_transient(error)
        {
            job.busy = Some(error.clone());
            return;
        }
        job.busy = None;
        let per_node = parsed.as_ref().is_ok_and(|p| p.job_type.per_node());
        let periodic = parsed
            .as_ref()
            .is_ok_and(|p| p.periodic.is_some() && job.record.child_of.is_none());
        job.parsed = Some(parsed);
        for (kind, is) in [
            (&mut self.per_node, per_node),
            (&mut self.periodic, periodic),
        ] {
            if is {
                kind.insert(id.to_string());
            } else {
                kind.remove(id);
            }
        }
    }

    /// The plan of `round`: the same decision a full plan makes for its jobs.
    fn plan(&self, round: &Round, now_ms: u64) -> super::Plan {
        // A job the agent was too busy to evaluate defers the round (as a full plan
        // does), rather than being evaluated again with another outcome.
        let evaluate = |job: &ClusterJob| match self.jobs.get(&job.id) {
            Some(known) => match (&known.parsed, &known.busy) {
                (Some(parsed), _) => parsed.clone(),
                (None, Some(busy)) => Err(busy.clone()),
                (None, None) => job.spec(),
            },
            None => job.spec(),
        };
        super::plan_with(&round.snapshot, now_ms, evaluate, &round.held)
    }

    /// What `round`'s `plan` does to the evaluations: the pending ones of its jobs
    /// completed, and those past keeping, of every job, removed.
    pub fn eval_outcome(
        &self,
        round: &Round,
        plan: &super::Plan,
        now_ms: u64,
    ) -> super::evals::EvalOutcome {
        let mut every: Vec<&Evaluation> = self.evals.values().collect();
        every.sort_by_key(|e| (e.create_revision, e.id.as_str()));
        super::evals::EvalOutcome {
            complete: super::evals::completed(&round.snapshot, plan, now_ms),
            forget: super::evals::forgotten(&every, now_ms),
        }
    }

    /// The evaluations the leader wrote after a round (`outcome`), as the store now
    /// holds them.
    pub fn wrote_evals(&mut self, outcome: &super::evals::EvalOutcome) {
        for eval in &outcome.complete {
            let mut eval = eval.clone();
            if let Some(known) = self.evals.get(&eval.id) {
                eval.create_revision = known.create_revision;
                eval.mod_revision = known.mod_revision;
            }
            self.evals.insert(eval.id.clone(), eval);
        }
        for id in &outcome.forget {
            self.evals.remove(id);
        }
    }

    /// After `round`'s `plan` was written (`written`), or not: what the next rounds need
    /// of it. A round not written, or deferred, is planned again.
    pub fn finished(&mut self, round: Round, plan: &super::Plan, written: bool) {
        if !written || plan.deferred {
            match round.jobs {
                Some(jobs) => self.dirty.extend(jobs),
                None => self.everything = true,
            }
            return;
        }
        match &round.jobs {
            Some(jobs) => self.timers.retain(|job, _| !jobs.contains(job)),
            None => self.timers.clear(),
        }
        self.timers.extend(plan.wake_jobs.clone());
        // What the round wrote, as the store now holds it: the next round reads its own
        // writes though their watch events have not all come (they change nothing when
        // they come).
        for (node, alloc) in &plan.stop {
            self.remove_placement(node, alloc);
        }
        for alloc in &plan.forget {
            self.remove_report(alloc);
        }
        for job in &plan.forget_jobs {
            self.remove_job(job);
        }
        for report in &plan.lost {
            self.record_report(report.clone());
        }
        for placement in &plan.place {
            self.record_placement(placement.clone());
        }
        // What could not be placed, as the round wrote it (the watch brings it too).
        let planned = |id: &str| round.jobs.as_ref().is_none_or(|jobs| jobs.contains(id));
        self.blocked.retain(|job, _| !planned(job));
        for entry in &plan.blocked {
            self.blocked
                .entry(entry.job_id.clone())
                .or_default()
                .push(entry.clone());
        }
    }

    fn nodes_view(&mut self) -> &Vec<NodeView> {
        let nodes = &self.nodes;
        let settings = &self.node_settings;
        self.nodes_view.get_or_insert_with(|| {
            let mut view = Snapshot {
                nodes: nodes
                    .values()
                    .map(|record| NodeView {
                        record: record.clone(),
                        status: "ready",
                    })
                    .collect(),
                node_settings: settings
                    .iter()
                    .map(|(id, s)| (id.clone(), s.clone()))
                    .collect(),
                ..Snapshot::default()
            };
            view.finish();
            view.nodes
        })
    }

    fn csi_view(&mut self) -> &CsiView {
        let volumes = &self.volumes;
        let plugins = &self.node_plugins;
        self.csi_view.get_or_insert_with(|| {
            let mut view = Snapshot::default();
            for (id, (plugin_id, claimed)) in volumes {
                view.add(Stored::Volume {
                    id: id.clone(),
                    plugin_id: plugin_id.clone(),
                    claimed: claimed.clone(),
                });
            }
            for (plugin_id, node, healthy) in plugins.values() {
                view.add(Stored::NodePlugin {
                    plugin_id: plugin_id.clone(),
                    node: node.clone(),
                    healthy: *healthy,
                });
            }
            view.csi
        })
    }
}
