//! What the Nomad API shows of rescheduling in a cluster: an alloc's
//! `RescheduleTracker` (the attempts behind it), `PreviousAllocation` and
//! `NextAllocation` (the chain of replacements). Whether a job waits to place a failed
//! alloc again, or has used up its attempts, is the scheduler's
//! (`cluster::scheduler::reschedule::{awaiting, exhausted}`).

use std::collections::BTreeMap;

use berth_nomad_api::allocs::{RescheduleEvent, RescheduleTracker};

use berth_cluster::state::{Placement, Snapshot};

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
pub(super) fn tracker(placement: &Placement) -> Option<RescheduleTracker> {
    if placement.reschedule_events.is_empty() {
        return None;
    }
    let events = placement
        .reschedule_events
        .iter()
        .map(|event| RescheduleEvent {
            reschedule_time: super::shapes::ms_as_ns(event.reschedule_ms),
            prev_alloc_id: event.prev_alloc_id.clone(),
            prev_node_id: event.prev_node_id.clone(),
            delay: super::shapes::ms_as_ns(event.delay_ms),
        })
        .collect();
    Some(RescheduleTracker { events })
}
