//! `system` and `sysbatch` jobs, as Nomad's system schedulers place them: one alloc of
//! each group on every ready, eligible node where the group is feasible, named
//! `job.group[0]` on each.
//!
//! - a node outside the job's datacenters is not evaluated; one that is ineligible or
//!   draining gets no new alloc; an ineligible node keeps the one it has (in Nomad only
//!   a drain stops allocs);
//! - a draining node stops its system allocs last: once nothing else of other job
//!   types still runs there, or its drain deadline has passed;
//! - a node that is down loses its alloc (`lost`), with no replacement elsewhere: the
//!   alloc belongs to that node, which gets a fresh one when it is back;
//! - a node where the group cannot run (driver, host volume, constraint) is filtered:
//!   not a failure. A feasible node without room (CPU, memory, static port) is a failed
//!   placement, recorded as what could not be placed with every reason counted;
//! - a sysbatch alloc that completed stays done on its node: it is not run again there
//!   (a new version of the job runs once more everywhere, as a batch job's does);
//! - an alloc that failed is kept as it is (its restart policy ran on its node; system
//!   jobs have no reschedule).

use std::collections::{BTreeMap, BTreeSet};

use super::super::state::{AllocReport, Blocked, Placement, Snapshot};
use super::fit::{Tally, Usage, needs, no_room, unfit};
use super::{Jobs, Plan, job_places};
use berth_model::status::ClientStatus;

/// Whether `job_id` names a job whose allocs are placed per node (system, sysbatch).
/// A job that is gone or does not parse is not: the main planner stops its allocs.
pub(super) fn per_node_job(jobs: &Jobs<'_>, job_id: &str) -> bool {
    jobs.get(job_id)
        .and_then(|(_, _, parsed)| parsed.as_ref())
        .is_some_and(|parsed| parsed.job_type.per_node())
}

/// Keeps, stops and makes the placements of per-node jobs, adding what they take on
/// each node to `usage` (so the allocs of other jobs placed after see it).
pub(super) fn plan_per_node(
    snapshot: &Snapshot,
    jobs: &Jobs<'_>,
    usage: &mut BTreeMap<String, Usage>,
    plan: &mut Plan,
    now_ms: u64,
) {
    let kept = keep_or_stop(snapshot, jobs, usage, plan, now_ms);
    place(snapshot, jobs, &kept, usage, plan, now_ms);
}

/// `(job, group, node)`: a per-node alloc that stays.
type Kept = BTreeSet<(String, String, String)>;

fn keep_or_stop(
    snapshot: &Snapshot,
    jobs: &Jobs<'_>,
    usage: &mut BTreeMap<String, Usage>,
    plan: &mut Plan,
    now_ms: u64,
) -> Kept {
    let reports: BTreeMap<&str, &AllocReport> = snapshot
        .reports
        .iter()
        .map(|r| (r.alloc_id.as_str(), r))
        .collect();
    let mut kept = Kept::new();
    for placement in &snapshot.placements {
        let Some((job, version, Some(parsed))) = jobs.get(placement.job_id.as_str()) else {
            continue;
        };
        if !parsed.job_type.per_node() {
            continue;
        }
        let wanted = !job.stopped
            && *version == placement.job_version
            && job_places(parsed)
            && parsed
                .groups
                .get(placement.group_index)
                .is_some_and(|g| g.name == placement.group && g.count > 0);
        let report = reports.get(placement.alloc_id.as_str());
        let terminal = report.is_some_and(|r| r.client_status.is_terminal());
        let completed = report.is_some_and(|r| r.client_status == ClientStatus::Complete);
        let key = (
            placement.job_id.clone(),
            placement.group.clone(),
            placement.node_id.clone(),
        );
        let stop = |plan: &mut Plan| {
            plan.stop
                .push((placement.node_id.clone(), placement.alloc_id.clone()));
        };
        let Some(node) = snapshot
            .nodes
            .iter()
            .find(|n| n.record.id == placement.node_id)
        else {
            // Its node is down. A completed run stays on record (the node ran it); any
            // other alloc is lost and goes, with no replacement on another node.
            if wanted && completed && !kept.contains(&key) {
                kept.insert(key);
                continue;
            }
            if !terminal {
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
            stop(plan);
            continue;
        };
        if !wanted || kept.contains(&key) {
            stop(plan);
            continue;
        }
        if node.record.drain && !terminal {
            // Stopped last: once the node's other allocs are gone (stopped in an earlier
            // round, not this one), or at the deadline.
            let others_remain = snapshot.placements.iter().any(|other| {
                other.node_id == placement.node_id
                    && !per_node_job(jobs, &other.job_id)
                    && !reports
                        .get(other.alloc_id.as_str())
                        .is_some_and(|r| r.client_status.is_terminal())
            });
            let deadline = snapshot
                .node_settings
                .iter()
                .find(|(id, _)| *id == placement.node_id)
                .map_or(0, |(_, s)| s.drain_deadline_ms);
            if !others_remain || (deadline > 0 && now_ms >= deadline) {
                stop(plan);
                continue;
            }
        }
        usage
            .entry(placement.node_id.clone())
            .or_default()
            .hold(placement, terminal);
        kept.insert(key);
    }
    kept
}

fn place(
    snapshot: &Snapshot,
    jobs: &Jobs<'_>,
    kept: &Kept,
    usage: &mut BTreeMap<String, Usage>,
    plan: &mut Plan,
    now_ms: u64,
) {
    let empty = Usage::default();
    for (job, version, parsed) in jobs.values() {
        let Some(parsed) = parsed else { continue };
        if !parsed.job_type.per_node() || job.stopped || !job_places(parsed) {
            continue;
        }
        for (group_index, group) in parsed.groups.iter().enumerate() {
            if group.count == 0 {
                continue;
            }
            let needs = needs(group);
            let name = format!("{}.{}[0]", job.id, group.name);
            // Nodes ruled out (filtered) or without room (exhausted), per reason.
            let mut tally = Tally::default();
            let (mut evaluated, mut failed) = (0usize, 0u32);
            for node in &snapshot.nodes {
                let record = &node.record;
                let key = (job.id.clone(), group.name.clone(), record.id.clone());
                if kept.contains(&key)
                    || record.eligibility != "eligible"
                    || record.drain
                    || !berth_jobspec::constraint::in_datacenters(parsed, &record.datacenter)
                {
                    continue;
                }
                evaluated += 1;
                if let Some(why) = unfit(node, &needs, &snapshot.csi, parsed, group) {
                    tally.filtered(&why);
                    continue;
                }
                let taken = usage.get(&record.id).unwrap_or(&empty);
                if let Some(room) = no_room(node, taken, &needs, 0, false) {
                    tally.no_room(room);
                    failed += 1;
                    continue;
                }
                plan.place.push(Placement {
                    alloc_id: super::super::random_id(),
                    job_id: job.id.clone(),
                    job_version: *version,
                    group: group.name.clone(),
                    group_index,
                    alloc_index: 0,
                    name: name.clone(),
                    node_id: record.id.clone(),
                    cpu_mhz: needs.cpu_mhz,
                    memory_mb: needs.memory_mb,
                    disk_mb: needs.disk_mb,
                    static_ports: needs.static_ports.clone(),
                    replaces: None,
                    placed_ms: now_ms,
                    reschedule_events: Vec::new(),
                    stop_requested: false,
                });
                let entry = usage.entry(record.id.clone()).or_default();
                entry.cpu_mhz += needs.cpu_mhz;
                entry.memory_mb += needs.memory_mb;
                entry.disk_mb += needs.disk_mb;
                entry.ports.extend(needs.static_ports.iter().copied());
                *entry
                    .per_group
                    .entry((job.id.clone(), group.name.clone()))
                    .or_default() += 1;
            }
            if failed == 0 {
                // Filtered nodes alone are not a failure: the job runs where it can.
                continue;
            }
            let why = tally.said();
            plan.blocked.push(Blocked {
                job_id: job.id.clone(),
                group: group.name.clone(),
                name,
                nodes_evaluated: evaluated,
                coalesced: failed - 1,
                reasons: tally.reasons,
                why: format!("{failed} of {evaluated} node(s) evaluated had no room for it: {why}"),
            });
        }
    }
}
