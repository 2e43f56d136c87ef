//! Periodic jobs in a cluster: the scheduler (one per cluster) launches each periodic
//! job's children on its cron schedule, as Nomad's leader does. A child is a job of its
//! own in the store (`<job>/periodic-<launch time>`, its parent's source at launch),
//! placed like any other.
//!
//! The launch time is the schedule's, not the clock's, so the child's id is decided by
//! the schedule: a scheduler that launches it twice (a leader that lost its leadership
//! mid-round, and the next) writes one child, the store refusing the second
//! (`Cluster::create_child`, which also refuses a child of a parent changed since). The
//! last launch is read back from the store (`P/launches/<job>`, written with each
//! child, and the children themselves), so a new leader goes on where the last one
//! stopped, and a child collected early does not make its launch due again.
//!
//! A launch is made within [`LAUNCH_WINDOW_MS`] of its time or not at all: a new
//! scheduler, elected after the last one died, makes the launch it missed, as Nomad's
//! new leader does, but not every launch of a long outage. With `prohibit_overlap`, a
//! launch while a child of the job has not ended (or has not been placed yet) waits,
//! and is made late if that child ends within the window, else skipped.
//!
//! Children that ended more than an hour ago are removed ([`dead_children`]), as
//! Nomad's job garbage collection removes them: a job launched every second does not
//! fill the store.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};

use super::super::state::Snapshot;
use super::Jobs;

/// How late a launch may still be made: long enough for a new scheduler to be elected
/// and make the launch the last one missed, as Nomad's new leader does.
pub const LAUNCH_WINDOW_MS: u64 = 60_000;

/// A periodic job's child due now: its parent, and its launch time (ms since the epoch,
/// on a whole second: the child's id names it in seconds).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Launch {
    pub parent: String,
    pub at_ms: u64,
}

/// The children of periodic jobs due at `now_ms`, and when each parent's next one is.
pub(super) fn launches(
    snapshot: &Snapshot,
    jobs: &Jobs<'_>,
    now_ms: u64,
) -> (Vec<Launch>, BTreeMap<String, u64>) {
    let mut launches = Vec::new();
    let mut next_ms = BTreeMap::new();
    for (id, (record, _, parsed)) in jobs {
        let Some(periodic) = parsed.as_ref().and_then(|job| job.periodic.as_ref()) else {
            continue;
        };
        if record.stopped || !periodic.enabled || record.child_of.is_some() {
            continue;
        }
        let prefix = format!("{id}/periodic-");
        let children: Vec<&str> = snapshot
            .jobs
            .iter()
            .filter(|(child, _)| child.id.starts_with(&prefix))
            .map(|(child, _)| child.id.as_str())
            .collect();
        // The last launch (scheduled or forced), or the job's submission.
        let last_ms = snapshot
            .jobs
            .iter()
            .filter(|(child, _)| child.id.starts_with(&prefix))
            .map(|(child, _)| child.submitted_ms)
            .chain(snapshot.last_launches.get(*id).copied())
            .chain([record.submitted_ms])
            .max()
            .unwrap_or(0);
        let (launch, wake) = due(periodic, last_ms, now_ms);
        if let Some(wake) = wake {
            next_ms.insert(id.to_string(), wake);
        }
        let Some(at_ms) = launch else {
            continue;
        };
        if periodic.prohibit_overlap && children.iter().any(|child| running(snapshot, child)) {
            tracing::debug!(job = %id,
                "skipping a periodic launch: the last one still runs (prohibit_overlap)");
        } else {
            launches.push(Launch {
                parent: id.to_string(),
                at_ms,
            });
        }
    }
    (launches, next_ms)
}

/// A periodic job's launch due at `now_ms`, and when to look again. `last_ms` is its last
/// launch (scheduled or forced) or its submission. The launch due is the latest of the
/// schedule's times since then and within [`LAUNCH_WINDOW_MS`]: one launch makes up
/// for those missed before it (a restarted agent, a newly elected scheduler), and none
/// is made for a long outage. When one is due, the time to look again is the schedule's
/// next after now; when none is, its next after `last_ms`.
pub fn due(
    periodic: &berth_jobspec::Periodic,
    last_ms: u64,
    now_ms: u64,
) -> (Option<u64>, Option<u64>) {
    let from_ms = last_ms.max(now_ms.saturating_sub(LAUNCH_WINDOW_MS));
    let Some(first_ms) = next_after(periodic, from_ms) else {
        return (None, None);
    };
    if first_ms > now_ms {
        return (None, Some(first_ms));
    }
    // The latest launch time due (at most one a second within the window, so the walk
    // is short).
    let mut at_ms = first_ms;
    while let Some(later) = next_after(periodic, at_ms).filter(|later| *later <= now_ms) {
        at_ms = later;
    }
    (Some(at_ms), next_after(periodic, now_ms))
}

/// The schedule's first launch after `after_ms`, in ms, on a whole second (the cron
/// library keeps the milliseconds of the time it starts from).
fn next_after(periodic: &berth_jobspec::Periodic, after_ms: u64) -> Option<u64> {
    let after = DateTime::<Utc>::from_timestamp(i64::try_from(after_ms / 1000).ok()?, 0)?;
    let next = periodic.next_after(after)?;
    u64::try_from(next.timestamp_millis()).ok()
}

/// Whether a child job has not ended: an alloc of it has not, or it has none yet (not
/// placed, or waiting for room), as Nomad counts a pending child.
fn running(snapshot: &Snapshot, child: &str) -> bool {
    let mut placements = snapshot
        .placements
        .iter()
        .filter(|p| p.job_id == child)
        .peekable();
    if placements.peek().is_none() {
        return !snapshot
            .jobs
            .iter()
            .any(|(job, _)| job.id == child && job.stopped);
    }
    placements.any(|p| {
        !snapshot
            .reports
            .iter()
            .any(|r| r.alloc_id == p.alloc_id && r.client_status.is_terminal())
    })
}

/// Children (of periodic and parameterized jobs) whose every alloc ended more than
/// [`super::REPORTS_KEPT_MS`] ago, or that were stopped that long ago with none.
pub(super) fn dead_children(snapshot: &Snapshot, now_ms: u64) -> Vec<String> {
    let mut dead = Vec::new();
    for (job, _) in snapshot.jobs.iter().filter(|(j, _)| j.child_of.is_some()) {
        let mut ended_ms = Some(job.submitted_ms);
        for placement in snapshot.placements.iter().filter(|p| p.job_id == job.id) {
            let ended = snapshot
                .reports
                .iter()
                .find(|r| r.alloc_id == placement.alloc_id && r.client_status.is_terminal())
                .map(|r| r.updated_ms);
            ended_ms = match (ended_ms, ended) {
                (Some(so_far), Some(at)) => Some(so_far.max(at)),
                _ => None,
            };
        }
        let has_allocs = snapshot.placements.iter().any(|p| p.job_id == job.id);
        let over = ended_ms.is_some_and(|at| at.saturating_add(super::REPORTS_KEPT_MS) < now_ms);
        if over && (has_allocs || job.stopped) {
            dead.push(job.id.clone());
        }
    }
    dead
}

/// The child job `launch` makes of `parent`: its source, named by the launch time
/// (`<parent>/periodic-<secs>`), submitted then.
pub(super) fn child_of_launch(
    parent: &super::super::state::ClusterJob,
    launch: &Launch,
) -> super::super::state::ClusterJob {
    super::super::state::ClusterJob {
        id: format!("{}/periodic-{}", launch.parent, launch.at_ms / 1000),
        submitted_ms: launch.at_ms,
        stopped: false,
        child_of: Some(berth_state::ChildOf {
            parent: launch.parent.clone(),
            meta: Vec::new(),
            payload: None,
        }),
        // A child's name is not its parent's: no grant names it.
        by_operator: false,
        ..parent.clone()
    }
}

/// Records the children of periodic jobs the plan launches (once each, whoever else
/// launches them), from their parents' records in `snapshot`.
pub(super) async fn launch_children(
    cluster: &std::sync::Arc<super::super::Cluster>,
    plan: &super::Plan,
    snapshot: &Snapshot,
) {
    for launch in &plan.launch {
        let Some((parent, version)) = snapshot.jobs.iter().find(|(j, _)| j.id == launch.parent)
        else {
            continue;
        };
        let version = *version;
        let child = child_of_launch(parent, launch);
        let cluster = cluster.clone();
        let id = child.id.clone();
        let eval =
            super::super::state::Evaluation::pending(&id, super::super::state::trigger::PERIODIC);
        match tokio::task::spawn_blocking(move || cluster.create_child(&child, version, &eval))
            .await
        {
            Ok(Ok(super::super::state::ChildCreated::Created)) => {
                tracing::info!(job = %launch.parent, child = %id, "launched a child job");
            }
            // Launched already (by an earlier leader), or the job changed meanwhile.
            Ok(Ok(_)) => {}
            Ok(Err(error)) => tracing::warn!(job = %launch.parent, %error,
                "launching a periodic job's child"),
            Err(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::plan;
    use super::*;
    use crate::state::{AllocReport, ClusterJob, Placement};
    use berth_model::status::ClientStatus;

    /// A whole minute's start, in ms: launches every 10 s fall on it and after it.
    const MINUTE: u64 = 1_800_000_000_000 / 60_000 * 60_000;

    fn tick(prohibit_overlap: bool) -> (ClusterJob, i64) {
        let source = format!(
            "job \"tick\" {{\n  type = \"batch\"\n  periodic {{\n    crons = [\"*/10 * * * * * *\"]\n    \
             prohibit_overlap = {prohibit_overlap}\n  }}\n  group \"g\" {{\n    task \"t\" {{\n      \
             driver = \"exec\"\n      config {{\n        command = \"/bin/true\"\n      }}\n    }}\n  }}\n}}\n"
        );
        let job = ClusterJob {
            id: "tick".into(),
            source_name: "tick.hcl".into(),
            source,
            variables: Default::default(),
            submitted_ms: MINUTE - 5_000,
            stopped: false,
            may_run_plugins: false,
            child_of: None,
            by_operator: false,
            owner: None,
            typed: None,
        };
        (job, 3)
    }

    fn child(at_ms: u64) -> (ClusterJob, i64) {
        let (parent, _) = tick(false);
        let child = ClusterJob {
            id: format!("tick/periodic-{}", at_ms / 1000),
            submitted_ms: at_ms,
            child_of: Some(berth_state::ChildOf {
                parent: "tick".into(),
                meta: Vec::new(),
                payload: None,
            }),
            ..parent
        };
        (child, 4)
    }

    fn launched(snapshot: &Snapshot, now_ms: u64) -> (Vec<u64>, Option<u64>) {
        let plan = plan(snapshot, now_ms);
        let at: Vec<u64> = plan.launch.iter().map(|l| l.at_ms).collect();
        assert!(plan.launch.iter().all(|l| l.parent == "tick"));
        (at, plan.wake_at_ms)
    }

    #[test]
    fn a_launch_is_made_once_and_the_scheduler_wakes_for_the_next() {
        let mut snapshot = Snapshot {
            jobs: vec![tick(false)],
            ..Snapshot::default()
        };
        // Before the minute: none due, wake at it.
        assert_eq!(launched(&snapshot, MINUTE - 100), (vec![], Some(MINUTE)));
        // At it: due.
        assert_eq!(launched(&snapshot, MINUTE).0, [MINUTE]);
        // Later, with launches missed: the latest one only, once.
        assert_eq!(
            launched(&snapshot, MINUTE + 25_000),
            (vec![MINUTE + 20_000], Some(MINUTE + 30_000))
        );
        snapshot.jobs.push(child(MINUTE + 20_000));
        assert_eq!(
            launched(&snapshot, MINUTE + 25_000),
            (vec![], Some(MINUTE + 30_000))
        );
        // After a long outage: one launch, not one per missed time.
        assert_eq!(launched(&snapshot, MINUTE + 600_000).0, [MINUTE + 600_000]);
        // A stopped job launches nothing.
        snapshot.jobs[0].0.stopped = true;
        assert_eq!(launched(&snapshot, MINUTE + 30_000), (vec![], None));
    }

    #[test]
    fn a_child_that_ended_over_an_hour_ago_is_removed_and_a_running_one_is_not() {
        let ended_at = MINUTE + 1_000;
        let mut snapshot = Snapshot {
            jobs: vec![tick(false), child(MINUTE)],
            placements: vec![placement(MINUTE)],
            ..Snapshot::default()
        };
        let hour = crate::scheduler::REPORTS_KEPT_MS;
        assert!(
            dead_children(&snapshot, ended_at + 2 * hour).is_empty(),
            "runs"
        );
        snapshot
            .reports
            .push(report(MINUTE, ClientStatus::Complete, ended_at));
        assert!(
            dead_children(&snapshot, ended_at + hour).is_empty(),
            "too soon"
        );
        assert_eq!(
            dead_children(&snapshot, ended_at + hour + 1),
            [format!("tick/periodic-{}", MINUTE / 1000)]
        );
        assert_eq!(plan(&snapshot, ended_at + hour + 1).forget_jobs.len(), 1);
    }

    #[test]
    fn with_prohibit_overlap_a_launch_is_skipped_while_a_child_runs() {
        let mut snapshot = Snapshot {
            jobs: vec![tick(true), child(MINUTE)],
            placements: vec![placement(MINUTE)],
            ..Snapshot::default()
        };
        let next = MINUTE + 10_000;
        assert_eq!(launched(&snapshot, next), (vec![], Some(next + 10_000)));
        snapshot
            .reports
            .push(report(MINUTE, ClientStatus::Complete, MINUTE + 1_000));
        assert_eq!(launched(&snapshot, next).0, [next]);
        // A child not placed yet (no room) has not ended either.
        snapshot.jobs.push(child(next));
        assert_eq!(launched(&snapshot, next + 10_000).0, Vec::<u64>::new());
    }

    /// The alloc of the child launched at `at_ms`.
    fn placement(at_ms: u64) -> Placement {
        Placement {
            alloc_id: format!("a{at_ms}"),
            job_id: format!("tick/periodic-{}", at_ms / 1000),
            job_version: 4,
            group: "g".into(),
            group_index: 0,
            alloc_index: 0,
            name: "tick.g[0]".into(),
            node_id: "id-a".into(),
            cpu_mhz: 100,
            memory_mb: 300,
            disk_mb: 0,
            static_ports: Vec::new(),
            replaces: None,
            placed_ms: at_ms,
            reschedule_events: Vec::new(),
            stop_requested: false,
        }
    }

    fn report(at_ms: u64, client_status: ClientStatus, updated_ms: u64) -> AllocReport {
        AllocReport {
            alloc_id: format!("a{at_ms}"),
            job_id: format!("tick/periodic-{}", at_ms / 1000),
            name: "tick.g[0]".into(),
            node_id: "id-a".into(),
            node_name: "a".into(),
            client_status,
            description: String::new(),
            updated_ms,
            tasks: Default::default(),
        }
    }
}
