//! The cluster's scheduler: one agent at a time (elected through etcd's election
//! service, under that agent's lease) reads the cluster at one revision and decides
//! where each alloc runs, as Nomad's `service` and `batch` schedulers do on one
//! region:
//!
//! - **feasibility**: a node is ready (its lease lives), eligible and not draining, has
//!   every driver the group's tasks use, meets the job's, group's and tasks'
//!   constraints, has the group's host volumes, runs a healthy node part of each CSI
//!   volume's plugin, has room for the group's CPU and memory beside what is placed
//!   there, and has the group's static ports free;
//! - **ranking**: Nomad's bin-packing score (how full the node would be), averaged with
//!   its job anti-affinity penalty (allocs of one group on one node), so a group's
//!   `count` spreads across equal nodes while a busy cluster still packs;
//! - **lost nodes**: an alloc whose node is down is marked `lost` and replaced at once
//!   (Nomad replaces lost allocs without the reschedule delay); a completed batch alloc
//!   is never placed again;
//! - **drain**: allocs on a draining node are replaced elsewhere, then stopped there;
//! - **system and sysbatch jobs**: one alloc per group on every eligible node, in
//!   [`system`].
//! - **reschedule**: a failed alloc is replaced after its group's `reschedule` delay,
//!   preferring another node ([`reschedule`]).
//!
//! [`plan`] is a pure function of a [`Snapshot`]; the leader writes its result in one
//! transaction that holds only while it is still the leader.

pub mod evals;
mod fit;
mod leader;
pub mod mirror;
pub mod periodic;
pub mod reschedule;
pub mod rounds;

pub use leader::run;

use std::collections::BTreeMap;

use super::state::{AllocReport, Blocked, ClusterJob, Placement, Snapshot};
use super::{Cluster, NodeView};
use berth_jobspec::Job;
use berth_model::status::ClientStatus;
pub use fit::{Needs, needs};
use fit::{Tally, Usage, binpack, no_node_ready, no_room, unfit};

/// What the scheduler decided.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Plan {
    pub place: Vec<Placement>,
    /// Placements to remove (their node stops the alloc): `(node id, alloc id)`.
    pub stop: Vec<(String, String)>,
    /// Allocs whose node is down, to be reported `lost`.
    pub lost: Vec<AllocReport>,
    /// Allocs that fit nowhere: `(job, group, alloc name, why)` as `job plan` says it.
    pub blocked: Vec<Blocked>,
    /// Reports of allocs that are no longer placed and whose job is gone, or that ended
    /// more than [`REPORTS_KEPT_MS`] ago: removed, so the cluster's records do not grow
    /// with every alloc it ever ran.
    pub forget: Vec<String>,
    /// The earliest time a failed alloc is due to be placed again: the scheduler plans
    /// again then, though nothing in the cluster changed.
    pub wake_at_ms: Option<u64>,
    /// The jobs [`Plan::wake_at_ms`] is for, each with its own time: a failed alloc's
    /// reschedule, a periodic job's next launch.
    pub wake_jobs: BTreeMap<String, u64>,
    /// Children of periodic jobs due now, to be launched (recorded as jobs).
    pub launch: Vec<periodic::Launch>,
    /// The round decided nothing: a job could not be evaluated now (the agent's
    /// evaluating threads were busy), and planning without it would stop its allocs. It
    /// is planned again at `wake_at_ms`; no evaluation is completed by it.
    pub deferred: bool,
    /// Child jobs that ended more than [`REPORTS_KEPT_MS`] ago: removed.
    pub forget_jobs: Vec<String>,
}

/// How soon a round deferred for a busy agent is tried again.
pub const DEFERRED_RETRY_MS: u64 = 500;

/// How long the report of an alloc that is no longer placed is kept (Nomad collects
/// terminal allocs after an hour by default).
pub const REPORTS_KEPT_MS: u64 = 60 * 60 * 1000;

impl Plan {
    pub fn is_empty(&self) -> bool {
        self.place.is_empty()
            && self.stop.is_empty()
            && self.lost.is_empty()
            && self.forget.is_empty()
            && self.forget_jobs.is_empty()
    }
}

/// The jobs as [`plan`] reads them: id to record, version and jobspec (if it parses).
type Jobs<'a> = BTreeMap<&'a str, (&'a ClusterJob, i64, Option<Job>)>;

/// The scheduler's decision for everything in `snapshot`.
pub fn plan(snapshot: &Snapshot, now_ms: u64) -> Plan {
    plan_with(snapshot, now_ms, ClusterJob::spec, &BTreeMap::new())
}

/// [`plan`] with `evaluate` reading each job's record (the leader's mirror holds them
/// evaluated; the tests' seam for an agent too busy to evaluate one), and `held`: the
/// room taken on each node by the allocs of jobs `snapshot` leaves out (a round of the
/// jobs that changed, [`mirror`]).
fn plan_with(
    snapshot: &Snapshot,
    now_ms: u64,
    evaluate: impl Fn(&ClusterJob) -> Result<Job, berth_jobspec::JobspecError>,
    held: &BTreeMap<String, Usage>,
) -> Plan {
    let mut plan = Plan::default();
    let live: BTreeMap<&str, &NodeView> = snapshot
        .nodes
        .iter()
        .map(|n| (n.record.id.as_str(), n))
        .collect();
    let reports: BTreeMap<&str, &AllocReport> = snapshot
        .reports
        .iter()
        .map(|r| (r.alloc_id.as_str(), r))
        .collect();
    // What every live node has taken, counting only placements the plan keeps.
    let mut usage: BTreeMap<String, Usage> = held.clone();
    let mut busy = false;
    let jobs: Jobs<'_> = snapshot
        .jobs
        .iter()
        .map(|(job, version)| {
            let parsed = evaluate(job)
                .inspect_err(|e| busy |= berth_jobspec::is_transient(e))
                .ok();
            (job.id.as_str(), (job, *version, parsed))
        })
        .collect();
    if busy {
        return Plan {
            deferred: true,
            wake_at_ms: Some(now_ms + DEFERRED_RETRY_MS),
            ..Plan::default()
        };
    }
    // Placements by (job, group, index): the current one is kept, the rest go.
    let mut kept: BTreeMap<(String, String, u32), &Placement> = BTreeMap::new();
    // Failed placements due to be replaced now, with the delay they waited.
    let mut due: BTreeMap<(String, String, u32), (&Placement, u64)> = BTreeMap::new();
    for placement in &snapshot.placements {
        if system::per_node_job(&jobs, &placement.job_id) {
            continue;
        }
        let wanted = jobs
            .get(placement.job_id.as_str())
            .and_then(|(job, version, parsed)| {
                let parsed = parsed.as_ref()?;
                let group = parsed.groups.iter().find(|g| g.name == placement.group)?;
                let current = !job.stopped
                    && *version == placement.job_version
                    && placement.alloc_index < group.count
                    && job_places(parsed);
                current.then_some(group)
            });
        let node = live.get(placement.node_id.as_str());
        let report = reports.get(placement.alloc_id.as_str());
        // A job whose record cannot be read keeps its allocs as they are, its status
        // saying why: a record this agent cannot read is no reason to stop what runs.
        // (On a down node they are lost as any other.)
        let unreadable = jobs
            .get(placement.job_id.as_str())
            .is_some_and(|(_, _, parsed)| parsed.is_none());
        if unreadable && node.is_some() {
            usage.entry(placement.node_id.clone()).or_default().hold(
                placement,
                report.is_some_and(|r| r.client_status.is_terminal()),
            );
            continue;
        }
        if node.is_none() {
            // Its node is down: lost (and replaced below if still wanted).
            let already_lost = report.is_some_and(|r| r.client_status == ClientStatus::Lost);
            let finished = report.is_some_and(|r| r.client_status.is_terminal());
            if !already_lost && !finished {
                plan.lost.push(AllocReport {
                    alloc_id: placement.alloc_id.clone(),
                    job_id: placement.job_id.clone(),
                    name: placement.name.clone(),
                    node_id: placement.node_id.clone(),
                    node_name: report.map(|r| r.node_name.clone()).unwrap_or_default(),
                    client_status: ClientStatus::Lost,
                    description: "its node is down (no heartbeat within heartbeat_ttl)".into(),
                    updated_ms: now_ms,
                    tasks: Default::default(),
                });
            }
            // A completed batch alloc stays done, wherever its node went: its placement
            // stays as the record of it (removed, the next round would run it again).
            if wanted.is_some() && report.is_some_and(|r| r.client_status == ClientStatus::Complete)
            {
                kept.insert(
                    (
                        placement.job_id.clone(),
                        placement.group.clone(),
                        placement.alloc_index,
                    ),
                    placement,
                );
            } else {
                plan.stop
                    .push((placement.node_id.clone(), placement.alloc_id.clone()));
            }
            continue;
        }
        if placement.stop_requested {
            // Nomad's `alloc stop`: removed now (its node stops the alloc) and placed
            // again below while the group wants it (its key is not kept). Its room is
            // held this round: the replacement does not take its static ports while it
            // stops.
            usage.entry(placement.node_id.clone()).or_default().hold(
                placement,
                report.is_some_and(|r| r.client_status.is_terminal()),
            );
            plan.stop
                .push((placement.node_id.clone(), placement.alloc_id.clone()));
            continue;
        }
        let node = node.copied();
        let draining = node.is_some_and(|n| n.record.drain);
        let key = (
            placement.job_id.clone(),
            placement.group.clone(),
            placement.alloc_index,
        );
        if draining && !report.is_some_and(|r| r.client_status.is_terminal()) {
            // Replaced elsewhere (below, or in an earlier round), and stopped here once
            // its replacement runs, or once the drain's deadline has passed: a drain
            // with nowhere to go leaves the alloc running until then.
            let replaced = snapshot.placements.iter().any(|other| {
                other.replaces.as_deref() == Some(placement.alloc_id.as_str())
                    && reports
                        .get(other.alloc_id.as_str())
                        .is_some_and(|r| r.client_status == ClientStatus::Running)
            });
            let deadline = snapshot
                .node_settings
                .iter()
                .find(|(id, _)| *id == placement.node_id)
                .map_or(0, |(_, s)| s.drain_deadline_ms);
            let past_deadline = deadline > 0 && now_ms >= deadline;
            if wanted.is_none() || replaced || past_deadline {
                plan.stop
                    .push((placement.node_id.clone(), placement.alloc_id.clone()));
            }
            continue;
        }
        if wanted.is_none() || kept.contains_key(&key) {
            plan.stop
                .push((placement.node_id.clone(), placement.alloc_id.clone()));
            continue;
        }
        if let Some(group) = wanted {
            let verdict = reschedule::verdict(&group.reschedule, placement, report.copied());
            if let Some(reschedule::Verdict::At { at_ms, delay_ms }) = verdict {
                if at_ms <= now_ms {
                    // Replaced below; stopped once its replacement is placed.
                    due.insert(key, (placement, delay_ms));
                    continue;
                }
                plan.wake_at_ms = Some(plan.wake_at_ms.map_or(at_ms, |w| w.min(at_ms)));
                let job = plan
                    .wake_jobs
                    .entry(placement.job_id.clone())
                    .or_insert(at_ms);
                *job = (*job).min(at_ms);
            }
        }
        usage.entry(placement.node_id.clone()).or_default().hold(
            placement,
            report.is_some_and(|r| r.client_status.is_terminal()),
        );
        kept.insert(key, placement);
    }
    // System and sysbatch jobs, one alloc per node, before other jobs take the room.
    system::plan_per_node(snapshot, &jobs, &mut usage, &mut plan, now_ms);
    // Reports nobody needs any more.
    let placed: std::collections::BTreeSet<&str> = snapshot
        .placements
        .iter()
        .map(|p| p.alloc_id.as_str())
        .collect();
    for report in &snapshot.reports {
        let job_gone = !jobs.contains_key(report.job_id.as_str());
        let old = report.updated_ms.saturating_add(REPORTS_KEPT_MS) < now_ms;
        // A lost alloc's claim is released from its report: kept while a claim names it.
        let claimed = snapshot.csi.claimed_allocs.contains(&report.alloc_id);
        if !placed.contains(report.alloc_id.as_str()) && (job_gone || old) && !claimed {
            plan.forget.push(report.alloc_id.clone());
        }
    }
    // Children of periodic and parameterized jobs that ended long ago go, as Nomad's
    // job garbage collection takes them: their allocs, placements and reports after.
    plan.forget_jobs = periodic::dead_children(snapshot, now_ms);
    // The placement each missing alloc replaces (on a down or draining node), if any.
    let previous: BTreeMap<(String, String, u32), &str> = snapshot
        .placements
        .iter()
        .map(|p| {
            (
                (p.job_id.clone(), p.group.clone(), p.alloc_index),
                p.alloc_id.as_str(),
            )
        })
        .collect();
    // Place what is missing: first the jobs whose evaluations are pending, in the order
    // they were made (as Nomad processes evaluations), then those waiting for room. So a
    // job submitted again gets the room its old allocs leave before a job that waited
    // for it, as in Nomad, where the waiting job's blocked evaluation comes after.
    let pending: BTreeMap<&str, i64> = snapshot
        .evals
        .iter()
        .filter(|e| e.status == super::state::EvalStatus::Pending)
        .fold(BTreeMap::new(), |mut first, eval| {
            let at = first
                .entry(eval.job_id.as_str())
                .or_insert(eval.create_revision);
            *at = (*at).min(eval.create_revision);
            first
        });
    let mut order: Vec<_> = jobs.iter().collect();
    order.sort_by_key(|(id, _)| (pending.get(*id).copied().unwrap_or(i64::MAX), **id));
    for (job_id, (job, version, parsed)) in order {
        let Some(parsed) = parsed else { continue };
        if job.stopped || !job_places(parsed) || parsed.job_type.per_node() {
            continue;
        }
        for (group_index, group) in parsed.groups.iter().enumerate() {
            let needs = needs(group);
            let group_key = (job.id.clone(), group.name.clone());
            let distinct_hosts = parsed
                .constraints
                .iter()
                .chain(group.constraints.iter())
                .any(|c| c.operator == "distinct_hosts");
            // Nodes outside the job's datacenters are not evaluated (as in Nomad); what
            // rules one of the others out for good is found once per node.
            let candidates: Vec<&NodeView> = snapshot
                .nodes
                .iter()
                .filter(|n| berth_jobspec::constraint::in_datacenters(parsed, &n.record.datacenter))
                .collect();
            let unfit: Vec<Option<String>> = candidates
                .iter()
                .map(|node| unfit(node, &needs, &snapshot.csi, parsed, group))
                .collect();
            let empty = Usage::default();
            for alloc_index in 0..group.count {
                let key = (job_id.to_string(), group.name.clone(), alloc_index);
                if kept.contains_key(&key) {
                    continue;
                }
                // Once one alloc of the group fits nowhere the rest cannot either (each
                // sees the room the ones before took): counted, not tried, as Nomad
                // coalesces them (attack review: 1,000 groups of 10,000 allocs that fit
                // nowhere held the scheduler 14 s a round).
                if let Some(last) = plan
                    .blocked
                    .last_mut()
                    .filter(|b| b.job_id == job.id && b.group == group.name)
                {
                    last.coalesced += 1;
                    continue;
                }
                let name = format!("{}.{}[{alloc_index}]", job.id, group.name);
                let failed = due.get(&key);
                let replaces = match failed {
                    Some((previous, _)) => Some(previous.alloc_id.clone()),
                    None => previous.get(&key).map(|id| id.to_string()),
                };
                let avoided = failed.map(|(p, _)| reschedule::penalized_nodes(p));
                let mut tally = Tally::default();
                let mut best: Option<(f64, &NodeView)> = None;
                for (node, unfit) in candidates.iter().copied().zip(&unfit) {
                    if let Some(why) = unfit {
                        tally.filtered(why);
                        continue;
                    }
                    let taken = usage.get(&node.record.id).unwrap_or(&empty);
                    let collisions = taken.per_group.get(&group_key).copied().unwrap_or(0);
                    if let Some(room) = no_room(node, taken, &needs, collisions, distinct_hosts) {
                        tally.no_room(room);
                        continue;
                    }
                    // Nomad averages the scores that apply: fit, anti-affinity, and the
                    // penalty on the nodes a rescheduled alloc failed on.
                    let mut scores = vec![binpack(node, taken, &needs)];
                    if collisions > 0 {
                        scores.push(-f64::from(collisions + 1) / f64::from(group.count.max(1)));
                    }
                    if avoided
                        .as_ref()
                        .is_some_and(|a| a.contains(node.record.id.as_str()))
                    {
                        scores.push(reschedule::PENALTY);
                    }
                    let score = scores.iter().sum::<f64>() / scores.len() as f64;
                    if best.is_none_or(|(s, _)| score > s) {
                        best = Some((score, node));
                    }
                }
                let Some((_, node)) = best else {
                    // One entry per group, as Nomad coalesces its failures: a count of
                    // 10,000 that fits nowhere is one record, not 10,000.
                    let why = tally.said();
                    plan.blocked.push(Blocked {
                        job_id: job.id.clone(),
                        group: group.name.clone(),
                        name,
                        nodes_evaluated: candidates.len(),
                        coalesced: 0,
                        reasons: tally.reasons,
                        why: if candidates.is_empty() {
                            no_node_ready(parsed)
                        } else {
                            format!("{} node(s) evaluated: {why}", candidates.len())
                        },
                    });
                    continue;
                };
                let placement = Placement {
                    alloc_id: super::random_id(),
                    job_id: job.id.clone(),
                    job_version: *version,
                    group: group.name.clone(),
                    group_index,
                    alloc_index,
                    name,
                    node_id: node.record.id.clone(),
                    cpu_mhz: needs.cpu_mhz,
                    memory_mb: needs.memory_mb,
                    disk_mb: needs.disk_mb,
                    static_ports: needs.static_ports.clone(),
                    replaces,
                    placed_ms: now_ms,
                    reschedule_events: failed
                        .map(|(previous, delay_ms)| {
                            reschedule::events_for_replacement(
                                &group.reschedule,
                                previous,
                                *delay_ms,
                                now_ms,
                            )
                        })
                        .unwrap_or_default(),
                    stop_requested: false,
                };
                if let Some((previous, _)) = failed {
                    plan.stop
                        .push((previous.node_id.clone(), previous.alloc_id.clone()));
                }
                let entry = usage.entry(node.record.id.clone()).or_default();
                entry.cpu_mhz += needs.cpu_mhz;
                entry.memory_mb += needs.memory_mb;
                entry.disk_mb += needs.disk_mb;
                entry.ports.extend(needs.static_ports.iter().copied());
                *entry.per_group.entry(group_key.clone()).or_default() += 1;
                plan.place.push(placement);
            }
        }
    }
    let (launch, next_launches) = periodic::launches(snapshot, &jobs, now_ms);
    plan.launch = launch;
    for (parent, at_ms) in next_launches {
        plan.wake_at_ms = Some(plan.wake_at_ms.map_or(at_ms, |w| w.min(at_ms)));
        let job = plan.wake_jobs.entry(parent).or_insert(at_ms);
        *job = (*job).min(at_ms);
    }
    plan
}

/// Whether a job places allocs itself (periodic and parameterized jobs do not: their
/// children do).
fn job_places(job: &Job) -> bool {
    job.periodic.is_none() && job.parameterized.is_none()
}

/// Writes `plan` in one transaction that holds only while `leader_key` (this agent's
/// leadership) is still at `leader_revision`. `Ok(false)`: no longer the leader.
pub async fn apply(
    cluster: &Cluster,
    plan: &Plan,
    recorded_blocked: &BTreeMap<String, Vec<Blocked>>,
    leader_key: &str,
    leader_revision: i64,
) -> Result<bool, super::ClusterError> {
    use super::etcd::{Condition, Write};
    let mut writes = Vec::new();
    for (node, alloc) in &plan.stop {
        writes.push(Write::Delete(cluster.key(&["allocs", node, alloc])));
    }
    for alloc in &plan.forget {
        writes.push(Write::Delete(cluster.key(&["status", alloc])));
    }
    for job in &plan.forget_jobs {
        writes.push(Write::Delete(cluster.key(&["jobs", job])));
    }
    for report in &plan.lost {
        writes.push(Write::Put {
            key: cluster.key(&["status", &report.alloc_id]),
            value: serde_json::to_vec(report)
                .map_err(|e| super::ClusterError::Local(e.to_string()))?,
            lease: 0,
        });
    }
    for placement in &plan.place {
        writes.push(Write::Put {
            key: cluster.key(&["allocs", &placement.node_id, &placement.alloc_id]),
            value: serde_json::to_vec(placement)
                .map_err(|e| super::ClusterError::Local(e.to_string()))?,
            lease: 0,
        });
    }
    // etcd caps the operations of one transaction (128 by default): write in chunks,
    // each guarded by the leadership.
    for chunk in writes.chunks(100) {
        let held = cluster
            .store()
            .transaction(
                vec![Condition::ModRevision(
                    leader_key.to_string(),
                    leader_revision,
                )],
                chunk.to_vec(),
            )
            .await?;
        if !held {
            return Ok(false);
        }
    }
    // What could not be placed, per job, as evaluations show it: written when it
    // changed, one job at a time, so one job's record (too big, refused) never stops the
    // placements of the others.
    let mut blocked: BTreeMap<String, Vec<Blocked>> = BTreeMap::new();
    for entry in &plan.blocked {
        blocked
            .entry(entry.job_id.clone())
            .or_default()
            .push(entry.clone());
    }
    let mut notes = Vec::new();
    for (job, entries) in &blocked {
        if recorded_blocked.get(job) != Some(entries) {
            let value = serde_json::to_vec(entries)
                .map_err(|e| super::ClusterError::Local(e.to_string()))?;
            let key = cluster.key(&["blocked", job]);
            notes.push((
                job.clone(),
                Write::Put {
                    key,
                    value,
                    lease: 0,
                },
            ));
        }
    }
    for job in recorded_blocked.keys() {
        if !blocked.contains_key(job) {
            notes.push((job.clone(), Write::Delete(cluster.key(&["blocked", job]))));
        }
    }
    for (job, write) in notes {
        let written = cluster
            .store()
            .transaction(
                vec![Condition::ModRevision(
                    leader_key.to_string(),
                    leader_revision,
                )],
                vec![write],
            )
            .await;
        if let Err(error) = written {
            tracing::warn!(job = %job, %error, "recording what could not be placed");
        }
    }
    Ok(true)
}

#[cfg(test)]
mod csi_tests;
#[cfg(test)]
mod mirror_tests;
mod system;
#[cfg(test)]
mod system_tests;
#[cfg(test)]
pub(crate) mod tests;

#[cfg(test)]
mod reschedule_tests;
