//! What the Nomad API shows of rescheduling in a cluster: an alloc's
//! `RescheduleTracker` (the attempts behind it), `PreviousAllocation` and
//! `NextAllocation` (the chain of replacements), and whether a job is waiting to place
//! a failed alloc again or has used up its attempts.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use crate::cluster::scheduler::reschedule::{Verdict, verdict};
use crate::cluster::state::{Placement, Snapshot};
use crate::jobspec::Job;

/// Which alloc replaced which: from each placement's `replaces`, and from the attempts
/// it carries (attempt `i` failed alloc was replaced by attempt `i + 1`'s).
pub(super) fn next_allocations(snapshot: &Snapshot) -> BTreeMap<&str, &str> {
    let mut next = BTreeMap::new();
    for placement in &snapshot.placements {
        for pair in placement.reschedule_events.windows(2) {
            next.insert(
                pair[0].prev_alloc_id.as_str(),
                pair[1].prev_alloc_id.as_str(),
            );
        }
        if let Some(previous) = &placement.replaces {
            next.insert(previous.as_str(), placement.alloc_id.as_str());
        }
    }
    next
}

/// Nomad's `RescheduleTracker` of a placed alloc (`null` when it replaces no failure).
pub(super) fn tracker(placement: &Placement) -> Value {
    if placement.reschedule_events.is_empty() {
        return Value::Null;
    }
    let events: Vec<Value> = placement
        .reschedule_events
        .iter()
        .map(|event| {
            json!({
                "RescheduleTime": event.reschedule_ms.saturating_mul(1_000_000),
                "PrevAllocID": event.prev_alloc_id,
                "PrevNodeID": event.prev_node_id,
                "Delay": event.delay_ms.saturating_mul(1_000_000),
            })
        })
        .collect();
    json!({ "Events": events })
}

/// What the scheduler will do with each failed alloc of job `id` still placed.
fn verdicts<'a>(snapshot: &'a Snapshot, job: &Job, id: &str) -> Vec<(&'a Placement, Verdict)> {
    snapshot
        .placements
        .iter()
        .filter(|p| p.job_id == id)
        .filter_map(|placement| {
            let group = job.groups.iter().find(|g| g.name == placement.group)?;
            let report = snapshot
                .reports
                .iter()
                .find(|r| r.alloc_id == placement.alloc_id);
            Some((placement, verdict(&group.reschedule, placement, report)?))
        })
        .collect()
}

/// Whether a failed alloc of job `id` is waiting for its reschedule delay (the job is
/// pending, not dead).
pub(super) fn awaiting(snapshot: &Snapshot, job: &Job, id: &str) -> bool {
    verdicts(snapshot, job, id)
        .iter()
        .any(|(_, verdict)| matches!(verdict, Verdict::At { .. }))
}

/// Which failed allocs of job `id` are not placed again because their attempts are used
/// up, as a sentence (empty when none).
pub(super) fn exhausted(snapshot: &Snapshot, job: &Job, id: &str) -> String {
    let names: Vec<&str> = verdicts(snapshot, job, id)
        .into_iter()
        .filter(|(_, verdict)| *verdict == Verdict::Exhausted)
        .map(|(placement, _)| placement.name.as_str())
        .collect();
    if names.is_empty() {
        return String::new();
    }
    format!(
        "failed and not rescheduled, its reschedule attempts used up: {}",
        names.join(", ")
    )
}
