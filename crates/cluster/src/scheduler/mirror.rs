//! The scheduler leader's copy of the cluster, kept from its watch: the whole cluster is
//! read once when an agent becomes the leader (and again after a cut watch), then each
//! change is applied as it comes. A round then plans only what a change can have
//! altered, not every job:
//!
//! - the jobs whose record, placements, reports or pending evaluations changed, and the
//!   jobs placed on a node that went down, started draining or changed its settings;
//! - when room may have grown (a placement removed, an alloc ended, a node or a CSI
//!   volume or plugin changed): the jobs that could not be placed, and the per-node
//!   (system) jobs;
//! - always: periodic parents with their children, jobs on draining nodes, jobs whose
//!   time has come ([`super::Plan::wake_jobs`]: a reschedule delay, a periodic launch),
//!   and reports and children past their hour.
//!
//! What the other jobs hold on each node (CPU, memory, disk, static ports) is kept as a
//! running total, so the jobs planned see the room they left. `Mirror::plan_round`
//! (`rounds.rs`) makes the snapshot of the jobs planned and the room held by the rest,
//! and runs the same `plan_with` as a full plan: a round of the jobs that changed
//! decides what a full plan decides (the tests in `mirror_tests.rs` compare the two
//! after each change). What a round writes is applied here at once, so the next reads
//! it though its watch events have not come. Every [`FULL_ROUND_MS`] a round plans
//! everything: a safety net.

use std::collections::{BTreeMap, BTreeSet};

use super::super::etcd::{Change, Entry};
use super::super::records::{Stored, decode};
use super::super::state::{
    AllocReport, Blocked, ClusterJob, CsiView, EvalStatus, Evaluation, NodeSettings, Placement,
};
use super::super::{NodeRecord, NodeView};
use berth_jobspec::{Job, JobspecError};

/// How often a round plans every job, not only those that changed.
pub const FULL_ROUND_MS: u64 = 5 * 60 * 1000;

/// One job as the mirror holds it: its record, version, and what it evaluated to (once
/// per version; `None` until evaluated, or while the agent was too busy to).
pub(super) struct MirroredJob {
    pub(super) record: ClusterJob,
    pub(super) version: i64,
    pub(super) parsed: Option<Result<Job, JobspecError>>,
    /// The agent was too busy to evaluate it in the last round (the round defers).
    pub(super) busy: Option<JobspecError>,
}

/// What the allocs of one node hold while they run, summed.
#[derive(Debug, Clone, Default, PartialEq)]
pub(super) struct Held {
    pub(super) cpu_mhz: u64,
    pub(super) memory_mb: u64,
    pub(super) disk_mb: u64,
    /// Static ports, with how many allocs hold each (two only in a damaged cluster).
    pub(super) ports: BTreeMap<u16, u32>,
}

impl Held {
    pub(super) fn add(&mut self, placement: &Placement) {
        self.cpu_mhz = self.cpu_mhz.saturating_add(placement.cpu_mhz);
        self.memory_mb = self.memory_mb.saturating_add(placement.memory_mb);
        self.disk_mb = self.disk_mb.saturating_add(placement.disk_mb);
        for port in &placement.static_ports {
            *self.ports.entry(*port).or_default() += 1;
        }
    }

    pub(super) fn remove(&mut self, placement: &Placement) {
        self.cpu_mhz = self.cpu_mhz.saturating_sub(placement.cpu_mhz);
        self.memory_mb = self.memory_mb.saturating_sub(placement.memory_mb);
        self.disk_mb = self.disk_mb.saturating_sub(placement.disk_mb);
        for port in &placement.static_ports {
            if let Some(count) = self.ports.get_mut(port) {
                *count = count.saturating_sub(1);
                if *count == 0 {
                    self.ports.remove(port);
                }
            }
        }
    }
}

/// The cluster as the leader last read it, with what changed since its last round.
pub struct Mirror {
    /// `<prefix>/`.
    pub(super) prefix: String,
    /// The latest revision of a change applied.
    pub(super) revision: i64,
    /// The latest revision the watch said it had handed whole ([`Change::Revision`]):
    /// below [`Mirror::revision`], a transaction is applied in part.
    delivered: i64,
    pub(super) jobs: BTreeMap<String, MirroredJob>,
    pub(super) nodes: BTreeMap<String, NodeRecord>,
    pub(super) node_settings: BTreeMap<String, NodeSettings>,
    pub(super) placements: BTreeMap<String, Placement>,
    pub(super) reports: BTreeMap<String, AllocReport>,
    /// Alloc ids by job: those placed, and those reported (a report may outlive its
    /// placement).
    pub(super) placed_of_job: BTreeMap<String, BTreeSet<String>>,
    pub(super) reported_of_job: BTreeMap<String, BTreeSet<String>>,
    /// Allocs reported and no longer placed (their reports are kept a while).
    pub(super) unplaced: BTreeSet<String>,
    /// Allocs reported lost (their claims are released after a grace).
    pub(super) lost: BTreeSet<String>,
    /// Alloc ids placed on each node.
    pub(super) placed_on_node: BTreeMap<String, BTreeSet<String>>,
    /// What the placements on each node hold (those not terminal).
    pub(super) held: BTreeMap<String, Held>,
    /// CSI volumes (plugin, claimed allocs) and node plugins (plugin, node, healthy),
    /// by the rest of their key.
    pub(super) volumes: BTreeMap<String, (String, Vec<String>)>,
    pub(super) node_plugins: BTreeMap<String, (String, String, bool)>,
    pub(super) last_launches: BTreeMap<String, u64>,
    pub(super) evals: BTreeMap<String, Evaluation>,
    pub(super) blocked: BTreeMap<String, Vec<Blocked>>,
    /// Jobs by kind, from their evaluation: per node (system, sysbatch), and periodic
    /// parents.
    pub(super) per_node: BTreeSet<String>,
    pub(super) periodic: BTreeSet<String>,
    /// What the next round plans.
    pub(super) dirty: BTreeSet<String>,
    /// How many changes called for a round (one to a job already to be planned, too).
    pub(super) marks: u64,
    pub(super) room_changed: bool,
    pub(super) everything: bool,
    /// When a job is due to be planned again though nothing changes (a reschedule
    /// delay, a periodic launch).
    pub(super) timers: BTreeMap<String, u64>,
    /// Nodes as a snapshot shows them (operator settings applied, by name), made again
    /// when a node or its settings change.
    pub(super) nodes_view: Option<Vec<NodeView>>,
    pub(super) csi_view: Option<CsiView>,
    pub(super) last_full_ms: u64,
}

impl Mirror {
    /// The cluster as `entries` (every key under `prefix`, read at `revision`) hold it;
    /// its first round plans everything.
    pub fn load(prefix: &str, entries: &[Entry], revision: i64) -> Mirror {
        let mut mirror = Mirror {
            prefix: format!("{prefix}/"),
            revision,
            delivered: revision,
            jobs: BTreeMap::new(),
            nodes: BTreeMap::new(),
            node_settings: BTreeMap::new(),
            placements: BTreeMap::new(),
            reports: BTreeMap::new(),
            placed_of_job: BTreeMap::new(),
            reported_of_job: BTreeMap::new(),
            placed_on_node: BTreeMap::new(),
            unplaced: BTreeSet::new(),
            lost: BTreeSet::new(),
            held: BTreeMap::new(),
            volumes: BTreeMap::new(),
            node_plugins: BTreeMap::new(),
            last_launches: BTreeMap::new(),
            evals: BTreeMap::new(),
            blocked: BTreeMap::new(),
            per_node: BTreeSet::new(),
            periodic: BTreeSet::new(),
            dirty: BTreeSet::new(),
            marks: 0,
            room_changed: false,
            everything: true,
            timers: BTreeMap::new(),
            nodes_view: None,
            csi_view: None,
            last_full_ms: 0,
        };
        for entry in entries {
            mirror.put(entry);
        }
        mirror.everything = true;
        mirror
    }

    /// The store's revision the mirror holds.
    pub fn revision(&self) -> i64 {
        self.revision
    }

    /// Whether every change of the revisions applied has come: a round planned
    /// before then could see a job's evaluation without the job written with it.
    pub fn whole(&self) -> bool {
        self.delivered >= self.revision
    }

    /// Applies one change of the watch. Whether it calls for a round (a change the plan
    /// reads); a [`Change::Reset`] calls for reading the cluster again instead
    /// ([`Mirror::load`]), and is answered `true`.
    pub fn apply(&mut self, change: &Change) -> bool {
        let before = self.marks;
        match change {
            Change::Put(entry) => {
                self.revision = self.revision.max(entry.mod_revision);
                self.put(entry);
            }
            Change::Delete { key, mod_revision } => {
                self.revision = self.revision.max(*mod_revision);
                self.delete(key);
            }
            Change::Reset => {
                self.everything = true;
                self.marks += 1;
                return true;
            }
            Change::Revision(revision) => {
                self.delivered = self.delivered.max(*revision);
            }
        }
        before != self.marks
    }

    fn put(&mut self, entry: &Entry) {
        // A record that no longer reads is as good as gone (its decoding logged why).
        let Some(stored) = decode(&self.prefix, entry) else {
            self.delete(&entry.key);
            return;
        };
        match stored {
            Stored::Job(record, version) => {
                let id = record.id.clone();
                if self
                    .jobs
                    .get(&id)
                    .is_some_and(|j| j.version == version && j.record == record)
                {
                    return;
                }
                // Its kind (per node, periodic) is kept until it is evaluated again: a
                // periodic parent submitted again is planned with its children.
                self.jobs.insert(
                    id.clone(),
                    MirroredJob {
                        record,
                        version,
                        parsed: None,
                        busy: None,
                    },
                );
                self.mark(id);
            }
            Stored::Node(record) => {
                if self.nodes.get(&record.id) == Some(&record) {
                    return;
                }
                let id = record.id.clone();
                self.nodes.insert(id.clone(), record);
                self.node_changed(&id);
            }
            Stored::Placement(placement) => self.record_placement(placement),
            Stored::Report(report) => self.record_report(report),
            Stored::NodeSettings(id, settings) => {
                if self.node_settings.get(&id) == Some(&settings) {
                    return;
                }
                self.node_settings.insert(id.clone(), settings);
                self.node_changed(&id);
            }
            Stored::Volume {
                id,
                plugin_id,
                claimed,
            } => {
                let old = self.volumes.insert(id, (plugin_id, claimed.clone()));
                self.claims_changed(old.map(|(_, c)| c).unwrap_or_default(), claimed);
            }
            Stored::NodePlugin {
                plugin_id,
                node,
                healthy,
            } => {
                let rest = self.rest(&entry.key).to_string();
                self.node_plugins.insert(rest, (plugin_id, node, healthy));
                self.csi_view = None;
                self.room();
            }
            Stored::Launch(parent, at_ms) => {
                self.last_launches.insert(parent.clone(), at_ms);
                self.mark(parent);
            }
            Stored::Eval(eval) => {
                if eval.status == EvalStatus::Pending {
                    self.mark(eval.job_id.clone());
                }
                self.evals.insert(eval.id.clone(), eval);
            }
            Stored::Blocked(job, entries) => {
                self.blocked.insert(job, entries);
            }
        }
    }

    /// A placement written (by the leader's round, or read from the watch).
    pub(super) fn record_placement(&mut self, placement: Placement) {
        let alloc = placement.alloc_id.clone();
        // The watch's echo of what the round wrote and already applied (or a write of
        // the same record again) changes nothing: no round for it.
        if self.placements.get(&alloc) == Some(&placement) {
            return;
        }
        // The same alloc written again: what it held goes, and its job (if another)
        // is planned with the room it left.
        if let Some(old) = self.placements.get(&alloc) {
            let same_room = old.node_id == placement.node_id
                && (old.cpu_mhz, old.memory_mb, old.disk_mb, &old.static_ports)
                    == (
                        placement.cpu_mhz,
                        placement.memory_mb,
                        placement.disk_mb,
                        &placement.static_ports,
                    );
            if old.job_id != placement.job_id || !same_room {
                self.mark(old.job_id.clone());
                self.room();
            }
            self.unplace(&alloc);
        }
        self.mark(placement.job_id.clone());
        self.placed_of_job
            .entry(placement.job_id.clone())
            .or_default()
            .insert(alloc.clone());
        self.placed_on_node
            .entry(placement.node_id.clone())
            .or_default()
            .insert(alloc.clone());
        if !self.terminal(&alloc) {
            self.held
                .entry(placement.node_id.clone())
                .or_default()
                .add(&placement);
        }
        self.unplaced.remove(&alloc);
        self.placements.insert(alloc, placement);
    }

    /// The placement of `alloc` on `node` removed (one the mirror holds on another node
    /// is not this one).
    pub(super) fn remove_placement(&mut self, node: &str, alloc: &str) {
        let Some(placement) = self.placements.get(alloc).filter(|p| p.node_id == node) else {
            return;
        };
        self.mark(placement.job_id.clone());
        self.room();
        self.unplace(alloc);
    }

    /// A report written (by a node, or the leader's round for a lost alloc).
    pub(super) fn record_report(&mut self, report: AllocReport) {
        let alloc = report.alloc_id.clone();
        // The echo of a report the round wrote (a lost alloc's) changes nothing.
        if self.reports.get(&alloc) == Some(&report) {
            return;
        }
        let was_terminal = self.terminal(&alloc);
        let terminal = report.client_status.is_terminal();
        self.mark(report.job_id.clone());
        if let Some(old) = self.reports.get(&alloc)
            && old.job_id != report.job_id
        {
            let old_job = old.job_id.clone();
            self.mark(old_job.clone());
            self.unreport(&old_job, &alloc);
        }
        self.reported_of_job
            .entry(report.job_id.clone())
            .or_default()
            .insert(alloc.clone());
        if !self.placements.contains_key(&alloc) {
            self.unplaced.insert(alloc.clone());
        }
        if report.client_status == berth_model::status::ClientStatus::Lost {
            self.lost.insert(alloc.clone());
        } else {
            self.lost.remove(&alloc);
        }
        self.reports.insert(alloc.clone(), report);
        self.terminal_changed(&alloc, was_terminal, terminal);
    }

    /// The report of `alloc` removed.
    pub(super) fn remove_report(&mut self, alloc: &str) {
        let Some(report) = self.reports.get(alloc) else {
            return;
        };
        let job = report.job_id.clone();
        let was_terminal = report.client_status.is_terminal();
        self.mark(job.clone());
        self.unreport(&job, alloc);
        self.reports.remove(alloc);
        self.unplaced.remove(alloc);
        self.lost.remove(alloc);
        self.terminal_changed(alloc, was_terminal, false);
    }

    /// The job `id` removed.
    pub(super) fn remove_job(&mut self, id: &str) {
        if self.jobs.remove(id).is_some() {
            self.forget_kind(id);
            self.timers.remove(id);
            self.mark(id.to_string());
        }
    }

    fn delete(&mut self, key: &str) {
        let rest = self.rest(key).to_string();
        let (kind, id) = rest.split_once('/').unwrap_or((rest.as_str(), ""));
        match kind {
            "jobs" => self.remove_job(id),
            "nodes" => {
                let known = self.nodes.remove(id).is_some();
                if known {
                    self.nodes_view = None;
                    self.node_changed(id);
                }
            }
            "allocs" => {
                let (node, alloc) = id.split_once('/').unwrap_or_default();
                self.remove_placement(node, alloc);
            }
            "status" => self.remove_report(id),
            "node-settings" => {
                let known = self.node_settings.remove(id).is_some();
                if known {
                    self.node_changed(id);
                }
            }
            "volumes" => {
                let claimed = self.volumes.remove(id).map(|(_, claimed)| claimed);
                if let Some(claimed) = claimed {
                    self.claims_changed(claimed, Vec::new());
                }
            }
            "plugins" => {
                let known = self.node_plugins.remove(&rest).is_some();
                if known {
                    self.csi_view = None;
                    self.room();
                }
            }
            "launches" => {
                let known = self.last_launches.remove(id).is_some();
                if known {
                    self.mark(id.to_string());
                }
            }
            "evals" => {
                self.evals.remove(id);
            }
            "blocked" => {
                self.blocked.remove(id);
            }
            _ => {}
        }
    }

    /// `job` is planned in the next round.
    fn mark(&mut self, job: String) {
        self.dirty.insert(job);
        self.marks += 1;
    }

    /// Room may have grown: the jobs waiting for it are planned in the next round.
    fn room(&mut self) {
        self.room_changed = true;
        self.marks += 1;
    }

    fn rest<'k>(&self, key: &'k str) -> &'k str {
        key.strip_prefix(&self.prefix).unwrap_or_default()
    }

    pub(super) fn terminal(&self, alloc: &str) -> bool {
        self.reports
            .get(alloc)
            .is_some_and(|r| r.client_status.is_terminal())
    }

    /// An alloc's report turned terminal or back: what its placement holds follows.
    fn terminal_changed(&mut self, alloc: &str, was: bool, now: bool) {
        if was == now {
            return;
        }
        if let Some(placement) = self.placements.get(alloc) {
            let held = self.held.entry(placement.node_id.clone()).or_default();
            if now {
                held.remove(placement);
            } else {
                held.add(placement);
            }
        }
        if now {
            self.room();
        }
    }

    /// Removes the placement of `alloc` (if any) from the indexes and the room held.
    fn unplace(&mut self, alloc: &str) {
        let Some(placement) = self.placements.remove(alloc) else {
            return;
        };
        if !self.terminal(alloc)
            && let Some(held) = self.held.get_mut(&placement.node_id)
        {
            held.remove(&placement);
        }
        remove_from(&mut self.placed_of_job, &placement.job_id, alloc);
        remove_from(&mut self.placed_on_node, &placement.node_id, alloc);
        if self.reports.contains_key(alloc) {
            self.unplaced.insert(alloc.to_string());
        }
    }

    fn unreport(&mut self, job: &str, alloc: &str) {
        remove_from(&mut self.reported_of_job, job, alloc);
    }

    /// A node came, went or changed (its record or its operator settings): the jobs
    /// placed on it are planned, and the room it has may have grown.
    fn node_changed(&mut self, id: &str) {
        self.nodes_view = None;
        self.room();
        let jobs: Vec<String> = self
            .placed_on_node
            .get(id)
            .into_iter()
            .flatten()
            .filter_map(|alloc| self.placements.get(alloc))
            .map(|p| p.job_id.clone())
            .collect();
        for job in jobs {
            self.mark(job);
        }
    }

    /// A volume's claims changed: the jobs of the allocs named before or after are
    /// planned (a report is kept while a claim names its alloc).
    fn claims_changed(&mut self, before: Vec<String>, after: Vec<String>) {
        self.csi_view = None;
        self.room();
        let before: BTreeSet<String> = before.into_iter().collect();
        let after: BTreeSet<String> = after.into_iter().collect();
        for alloc in before.symmetric_difference(&after) {
            if let Some(job) = self
                .reports
                .get(alloc)
                .map(|r| &r.job_id)
                .or_else(|| self.placements.get(alloc).map(|p| &p.job_id))
            {
                self.mark(job.clone());
            }
        }
    }

    fn forget_kind(&mut self, job: &str) {
        self.per_node.remove(job);
        self.periodic.remove(job);
    }

    /// Whether a change (of the watch, or a round's own writes applied) calls for a
    /// round: a round that placed a replacement is followed by one that stops what it
    /// replaces, without waiting for the echo of its writes (which changes nothing).
    pub fn marked(&self) -> bool {
        self.everything || self.room_changed || !self.dirty.is_empty()
    }

    /// Whether anything calls for a round at `now_ms`.
    pub fn wants_round(&self, now_ms: u64) -> bool {
        self.marked()
            || self.timers.values().any(|at| *at <= now_ms)
            || now_ms >= self.last_full_ms.saturating_add(FULL_ROUND_MS)
    }

    /// When a round is due though nothing changes: the earliest job timer, or the next
    /// full round.
    pub fn next_wake_ms(&self) -> u64 {
        self.timers
            .values()
            .copied()
            .chain([self.last_full_ms.saturating_add(FULL_ROUND_MS)])
            .min()
            .unwrap_or(u64::MAX)
    }

    /// When each job is due to be planned again.
    #[cfg(test)]
    pub(super) fn timers(&self) -> &BTreeMap<String, u64> {
        &self.timers
    }

    /// Every report of an alloc lost (their claims are released after a grace).
    pub fn lost_reports(&self) -> Vec<AllocReport> {
        self.lost
            .iter()
            .filter_map(|alloc| self.reports.get(alloc))
            .cloned()
            .collect()
    }
}

fn remove_from(index: &mut BTreeMap<String, BTreeSet<String>>, key: &str, alloc: &str) {
    if let Some(allocs) = index.get_mut(key) {
        allocs.remove(alloc);
        if allocs.is_empty() {
            index.remove(key);
        }
    }
}
