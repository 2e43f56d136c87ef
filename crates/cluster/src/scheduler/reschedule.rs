//! Rescheduling: a failed alloc (its node reports it `failed`, its restarts used up) is
//! replaced by a new alloc after a delay, per its group's `reschedule` policy, as Nomad
//! does:
//!
//! - the delay after the failure is `delay`, then grows per `delay_function` from the
//!   last attempt's delay (`exponential`: doubled; `fibonacci`: the sum of the last
//!   two), capped at `max_delay`; a capped delay starts over from `delay` once the
//!   alloc ran longer than the cap before failing;
//! - unless `unlimited`, at most `attempts` attempts count within `interval` before the
//!   failure; past that the alloc stays failed;
//! - the attempts travel with the replacement ([`RescheduleEvent`]s on its placement),
//!   so a chain of failures on different nodes is counted as one history;
//! - the replacement's ranking penalizes the nodes of earlier attempts, so it goes to
//!   another node when one fits, and to the same one when it is the only fit.
//!
//! The plan replaces only what is due; the scheduler wakes at the earliest time a
//! failed alloc becomes due ([`super::Plan::wake_at_ms`]), since nothing in etcd
//! changes then.

use std::collections::BTreeSet;

use crate::state::{AllocReport, Placement, RescheduleEvent};
use berth_jobspec::{DelayFunction, ReschedulePolicy};
use berth_model::status::ClientStatus;

/// An unlimited policy's replacement carries at most this many past attempts (Nomad
/// keeps 5): they decide the next delay, and the record stays small however often the
/// alloc fails.
const KEPT_UNLIMITED_EVENTS: usize = 5;

/// What becomes of a failed alloc.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Its policy does not reschedule (`attempts = 0`, `unlimited = false`).
    Disabled,
    /// Its attempts within the interval are used: it stays failed.
    Exhausted,
    /// It is replaced at `at_ms`, `delay_ms` after it failed.
    At { at_ms: u64, delay_ms: u64 },
}

/// What becomes of the alloc of `placement`, if `report` says it failed.
pub fn verdict(
    policy: &ReschedulePolicy,
    placement: &Placement,
    report: Option<&AllocReport>,
) -> Option<Verdict> {
    let report = report.filter(|r| r.client_status == ClientStatus::Failed)?;
    if !policy.enabled() {
        return Some(Verdict::Disabled);
    }
    let failed_ms = report.updated_ms;
    let events = &placement.reschedule_events;
    if !policy.unlimited {
        let interval_ms = millis(policy.interval);
        let attempted = events
            .iter()
            .filter(|e| failed_ms.saturating_sub(e.reschedule_ms) < interval_ms)
            .count();
        if attempted >= policy.attempts as usize {
            return Some(Verdict::Exhausted);
        }
    }
    let delay_ms = next_delay_ms(policy, events, placement.placed_ms, failed_ms);
    Some(Verdict::At {
        at_ms: failed_ms.saturating_add(delay_ms),
        delay_ms,
    })
}

/// The delay before the next attempt, from the attempts so far (Nomad's `NextDelay`).
/// `placed_ms` and `failed_ms` are when the failed alloc started and ended: one that ran
/// longer than the ceiling before failing starts the series over.
pub fn next_delay_ms(
    policy: &ReschedulePolicy,
    events: &[RescheduleEvent],
    placed_ms: u64,
    failed_ms: u64,
) -> u64 {
    let base = millis(policy.delay);
    let [.., last] = events else {
        return base;
    };
    let grown = match policy.delay_function {
        DelayFunction::Constant => return base,
        DelayFunction::Exponential => last.delay_ms.saturating_mul(2),
        DelayFunction::Fibonacci => match events {
            [.., before, last] => {
                let ceiling = millis(policy.max_delay);
                // A series that reached the ceiling and started over starts again.
                if before.delay_ms == ceiling && last.delay_ms == base {
                    last.delay_ms
                } else {
                    last.delay_ms.saturating_add(before.delay_ms)
                }
            }
            _ => base,
        },
    };
    let ceiling = millis(policy.max_delay);
    if ceiling > 0 && grown > ceiling {
        // It ran longer than the ceiling before failing: a new series.
        let ran_ms = failed_ms.saturating_sub(last.reschedule_ms.max(placed_ms));
        if ran_ms > ceiling {
            return base;
        }
        return ceiling;
    }
    grown
}

/// The attempts the replacement of `previous` carries: those that still count (within
/// the interval; the last few of an unlimited policy), then this one.
pub fn events_for_replacement(
    policy: &ReschedulePolicy,
    previous: &Placement,
    delay_ms: u64,
    now_ms: u64,
) -> Vec<RescheduleEvent> {
    let past = &previous.reschedule_events;
    let mut events: Vec<RescheduleEvent> = if policy.unlimited {
        past[past.len().saturating_sub(KEPT_UNLIMITED_EVENTS)..].to_vec()
    } else {
        let interval_ms = millis(policy.interval);
        past.iter()
            .filter(|e| now_ms.saturating_sub(e.reschedule_ms) <= interval_ms)
            .cloned()
            .collect()
    };
    events.push(RescheduleEvent {
        reschedule_ms: now_ms,
        prev_alloc_id: previous.alloc_id.clone(),
        prev_node_id: previous.node_id.clone(),
        delay_ms,
    });
    events
}

/// The nodes the replacement of `previous` avoids if it can: those of every attempt it
/// remembers, and the one it failed on.
pub fn penalized_nodes(previous: &Placement) -> BTreeSet<&str> {
    previous
        .reschedule_events
        .iter()
        .map(|e| e.prev_node_id.as_str())
        .chain([previous.node_id.as_str()])
        .collect()
}

/// The score given to a node the replacement avoids (Nomad's rescheduling penalty),
/// averaged with its other scores.
pub const PENALTY: f64 = -1.0;

fn millis(duration: std::time::Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// What the scheduler will do with each failed alloc of job `id` still placed.
fn verdicts<'a>(
    snapshot: &'a crate::state::Snapshot,
    job: &berth_jobspec::Job,
    id: &str,
) -> Vec<(&'a Placement, Verdict)> {
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
pub fn awaiting(snapshot: &crate::state::Snapshot, job: &berth_jobspec::Job, id: &str) -> bool {
    verdicts(snapshot, job, id)
        .iter()
        .any(|(_, verdict)| matches!(verdict, Verdict::At { .. }))
}

/// Which failed allocs of job `id` are not placed again because their attempts are used
/// up, as a sentence (empty when none).
pub fn exhausted(snapshot: &crate::state::Snapshot, job: &berth_jobspec::Job, id: &str) -> String {
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
