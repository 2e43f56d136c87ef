//! Periodic jobs in a cluster: the scheduler (one per cluster) launches each periodic
//! job's children on its cron schedule, as Nomad's leader does. A child is a job of its
//! own in the store (`<job>/periodic-<launch time>`, its parent's source at launch),
//! placed like any other.
//!
//! The launch time is the schedule's, not the clock's, so the child's id is decided by
//! the schedule: a scheduler that launches it twice (a leader that lost its leadership
//! mid-round, and the next) writes one child, the store refusing the second
//! (`Cluster::create_job`). The last launch is read back from the children in the store,
//! so a new leader goes on where the last one stopped.
//!
//! As on one agent, launches missed while no scheduler ran are not made up: a launch is
//! made within [`LAUNCH_WINDOW_MS`] of its time or not at all. With `prohibit_overlap`,
//! a launch while a child of the job still runs is skipped.

use chrono::{DateTime, Utc};

use super::super::state::Snapshot;
use super::Jobs;

/// How late a launch may still be made.
pub const LAUNCH_WINDOW_MS: u64 = 5_000;

/// A periodic job's child due now: its parent, and its launch time (ms since the epoch,
/// on a whole second: the child's id names it in seconds).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Launch {
    pub parent: String,
    pub at_ms: u64,
}

/// The children of periodic jobs due at `now_ms`, and when the next one is.
pub(super) fn launches(
    snapshot: &Snapshot,
    jobs: &Jobs<'_>,
    now_ms: u64,
) -> (Vec<Launch>, Option<u64>) {
    let mut due = Vec::new();
    let mut next_ms: Option<u64> = None;
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
            .chain([record.submitted_ms])
            .max()
            .unwrap_or(0);
        let from_ms = last_ms.max(now_ms.saturating_sub(LAUNCH_WINDOW_MS));
        let Some(at_ms) = next_after(periodic, from_ms) else {
            continue;
        };
        if at_ms > now_ms {
            next_ms = Some(next_ms.map_or(at_ms, |n| n.min(at_ms)));
            continue;
        }
        if periodic.prohibit_overlap && children.iter().any(|child| running(snapshot, child)) {
            tracing::debug!(job = %id,
                "skipping a periodic launch: the last one still runs (prohibit_overlap)");
        } else {
            due.push(Launch {
                parent: id.to_string(),
                at_ms,
            });
        }
        // The one after, to wake for (a skipped launch is not tried again).
        if let Some(after) = next_after(periodic, now_ms) {
            next_ms = Some(next_ms.map_or(after, |n| n.min(after)));
        }
    }
    (due, next_ms)
}

/// The schedule's first launch after `after_ms`, in ms, on a whole second (the cron
/// library keeps the milliseconds of the time it starts from).
fn next_after(periodic: &crate::jobspec::Periodic, after_ms: u64) -> Option<u64> {
    let after = DateTime::<Utc>::from_timestamp(i64::try_from(after_ms / 1000).ok()?, 0)?;
    let next = periodic.next_after(after)?;
    u64::try_from(next.timestamp_millis()).ok()
}

/// Whether a child job has an alloc that has not ended.
fn running(snapshot: &Snapshot, child: &str) -> bool {
    snapshot
        .placements
        .iter()
        .filter(|p| p.job_id == child)
        .any(|p| {
            !snapshot
                .reports
                .iter()
                .any(|r| r.alloc_id == p.alloc_id && r.client_status.is_terminal())
        })
}

#[cfg(test)]
mod tests {
    use super::super::plan;
    use super::*;
    use crate::cluster::state::{AllocReport, ClusterJob, Placement};
    use crate::model::status::ClientStatus;

    /// A whole minute's start, in ms: launches every 10 s fall on it and after it.
    const MINUTE: u64 = 1_800_000_000_000 / 60_000 * 60_000;

    fn tick(prohibit_overlap: bool) -> (ClusterJob, i64) {
        let source = format!(
            "job \"tick\" {{\n  type = \"batch\"\n  periodic {{\n    crons = [\"*/10 * * * * *\"]\n    \
             prohibit_overlap = {prohibit_overlap}\n  }}\n  group \"g\" {{\n    task \"t\" {{\n      \
             driver = \"exec\"\n      config {{\n        command = \"/bin/true\"\n      }}\n    }}\n  }}\n}}\n"
        );
        let job = ClusterJob {
            id: "tick".into(),
            source_name: "tick.hcl".into(),
            source,
            variables: Default::default(),
            submitted_ms: MINUTE - 30_000,
            stopped: false,
            may_run_plugins: false,
            child_of: None,
        };
        (job, 3)
    }

    fn child(at_ms: u64) -> (ClusterJob, i64) {
        let (parent, _) = tick(false);
        let child = ClusterJob {
            id: format!("tick/periodic-{}", at_ms / 1000),
            submitted_ms: at_ms,
            child_of: Some(crate::state::ChildOf {
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
    fn a_launch_is_made_within_its_window_once_and_the_scheduler_wakes_for_the_next() {
        let mut snapshot = Snapshot {
            jobs: vec![tick(false)],
            ..Snapshot::default()
        };
        // Before the minute: none due, wake at it.
        assert_eq!(launched(&snapshot, MINUTE - 100), (vec![], Some(MINUTE)));
        // At it and up to the window after: due.
        assert_eq!(launched(&snapshot, MINUTE).0, [MINUTE]);
        let late = MINUTE + LAUNCH_WINDOW_MS - 1;
        assert_eq!(
            launched(&snapshot, late),
            (vec![MINUTE], Some(MINUTE + 10_000))
        );
        // Missed by the window or more: not made up.
        assert_eq!(
            launched(&snapshot, late + 1),
            (vec![], Some(MINUTE + 10_000))
        );
        // Launched: not again.
        snapshot.jobs.push(child(MINUTE));
        assert_eq!(
            launched(&snapshot, MINUTE + 1_000),
            (vec![], Some(MINUTE + 10_000))
        );
        // A stopped job launches nothing.
        snapshot.jobs[0].0.stopped = true;
        assert_eq!(launched(&snapshot, MINUTE + 10_000), (vec![], None));
    }

    #[test]
    fn with_prohibit_overlap_a_launch_is_skipped_while_a_child_runs() {
        let mut snapshot = Snapshot {
            jobs: vec![tick(true), child(MINUTE)],
            placements: vec![Placement {
                alloc_id: "a1".into(),
                job_id: format!("tick/periodic-{}", MINUTE / 1000),
                job_version: 4,
                group: "g".into(),
                group_index: 0,
                alloc_index: 0,
                name: "tick.g[0]".into(),
                node_id: "id-a".into(),
                cpu_mhz: 100,
                memory_mb: 300,
                static_ports: Vec::new(),
                replaces: None,
                placed_ms: MINUTE,
                reschedule_events: Vec::new(),
            }],
            ..Snapshot::default()
        };
        let next = MINUTE + 10_000;
        assert_eq!(launched(&snapshot, next), (vec![], Some(next + 10_000)));
        snapshot.reports.push(AllocReport {
            alloc_id: "a1".into(),
            job_id: format!("tick/periodic-{}", MINUTE / 1000),
            name: "tick.g[0]".into(),
            node_id: "id-a".into(),
            node_name: "a".into(),
            client_status: ClientStatus::Complete,
            description: String::new(),
            updated_ms: MINUTE + 1_000,
        });
        assert_eq!(launched(&snapshot, next).0, [next]);
    }
}
