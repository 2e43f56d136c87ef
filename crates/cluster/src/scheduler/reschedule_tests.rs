//! Rescheduling in the scheduler's plan, on snapshots built by hand: when a failed
//! alloc is placed again, where, and with what history.

use std::collections::BTreeMap;
use std::time::Duration;

use super::reschedule::{Verdict, next_delay_ms, verdict};
use super::*;
use crate::state::RescheduleEvent;
use crate::{NodeRecord, NodeView};
use berth_jobspec::{DelayFunction, ReschedulePolicy};

const SECOND: u64 = 1000;

fn node(name: &str, memory_mb: u64) -> NodeView {
    NodeView {
        record: NodeRecord {
            id: format!("id-{name}"),
            name: name.into(),
            datacenter: "dc1".into(),
            node_pool: "default".into(),
            node_class: String::new(),
            http_addr: None,
            attributes: BTreeMap::new(),
            drivers: [("exec".to_string(), true)].into_iter().collect(),
            host_volumes: Vec::new(),
            host_volume_paths: Default::default(),
            eligibility: "eligible".into(),
            drain: false,
            cpu_mhz: 4000,
            memory_mb,
            disk_mb: 0,
            reserved: Default::default(),
            reserved_ports: Vec::new(),
            registered_ms: 0,
        },
        status: "ready",
    }
}

/// A job of one group `g` with one alloc; `reschedule` is the group's block, if any.
fn job(job_type: &str, reschedule: &str) -> (ClusterJob, i64) {
    let source = format!(
        "job \"j\" {{\n  type = \"{job_type}\"\n  group \"g\" {{\n    {reschedule}\n    task \"t\" {{\n      driver = \"exec\"\n      config {{\n        command = \"/bin/false\"\n      }}\n      resources {{\n        cpu = 100\n        memory = 100\n      }}\n    }}\n  }}\n}}\n"
    );
    (
        ClusterJob {
            id: "j".into(),
            source_name: "j.hcl".into(),
            source,
            variables: Default::default(),
            submitted_ms: 0,
            stopped: false,
            may_run_plugins: false,
            child_of: None,
            by_operator: false,
            owner: None,
            typed: None,
        },
        7,
    )
}

/// Alloc `j.g[0]` placed on `node` and reported failed at `failed_ms`, after `events`.
fn failed(node: &str, failed_ms: u64, events: Vec<RescheduleEvent>) -> (Placement, AllocReport) {
    let alloc_id = format!("alloc-on-{node}");
    let placement = Placement {
        alloc_id: alloc_id.clone(),
        job_id: "j".into(),
        job_version: 7,
        group: "g".into(),
        group_index: 0,
        alloc_index: 0,
        name: "j.g[0]".into(),
        node_id: format!("id-{node}"),
        cpu_mhz: 100,
        memory_mb: 100,
        disk_mb: 0,
        static_ports: Vec::new(),
        replaces: None,
        placed_ms: failed_ms.saturating_sub(SECOND),
        reschedule_events: events,
        stop_requested: false,
    };
    let report = AllocReport {
        alloc_id,
        job_id: "j".into(),
        name: "j.g[0]".into(),
        node_id: format!("id-{node}"),
        node_name: node.into(),
        client_status: ClientStatus::Failed,
        description: String::new(),
        updated_ms: failed_ms,
        tasks: Default::default(),
    };
    (placement, report)
}

fn event(node: &str, at_ms: u64, delay_ms: u64) -> RescheduleEvent {
    RescheduleEvent {
        reschedule_ms: at_ms,
        prev_alloc_id: format!("earlier-on-{node}"),
        prev_node_id: format!("id-{node}"),
        delay_ms,
    }
}

fn snapshot(
    job: (ClusterJob, i64),
    nodes: Vec<NodeView>,
    failed: (Placement, AllocReport),
) -> Snapshot {
    Snapshot {
        jobs: vec![job],
        nodes,
        placements: vec![failed.0],
        reports: vec![failed.1],
        ..Snapshot::default()
    }
}

fn policy(delay_function: DelayFunction, delay_s: u64, max_delay_s: u64) -> ReschedulePolicy {
    ReschedulePolicy {
        attempts: 0,
        interval: Duration::ZERO,
        delay: Duration::from_secs(delay_s),
        delay_function,
        max_delay: Duration::from_secs(max_delay_s),
        unlimited: true,
    }
}

/// The delays of `n` attempts in a row, each failing right after it was placed.
fn delays(policy: &ReschedulePolicy, n: usize) -> Vec<u64> {
    let mut events: Vec<RescheduleEvent> = Vec::new();
    let mut now = 1_000_000;
    for _ in 0..n {
        let delay = next_delay_ms(policy, &events, now, now + SECOND);
        now += SECOND + delay;
        events.push(event("a", now, delay));
    }
    events.iter().map(|e| e.delay_ms / SECOND).collect()
}

#[test]
fn delays_grow_as_the_delay_function_says_up_to_max_delay() {
    assert_eq!(
        delays(&policy(DelayFunction::Constant, 5, 0), 4),
        [5, 5, 5, 5]
    );
    assert_eq!(
        delays(&policy(DelayFunction::Exponential, 30, 200), 5),
        [30, 60, 120, 200, 200]
    );
    // Nomad's documented series: 5, 5, 10, 15, 25.
    assert_eq!(
        delays(&policy(DelayFunction::Fibonacci, 5, 3600), 5),
        [5, 5, 10, 15, 25]
    );
    // At the ceiling, an alloc that ran longer than the ceiling starts a new series.
    let capped = policy(DelayFunction::Exponential, 30, 60);
    let events = [
        event("a", 0, 30 * SECOND),
        event("a", 100 * SECOND, 60 * SECOND),
    ];
    assert_eq!(
        next_delay_ms(&capped, &events, 100 * SECOND, 101 * SECOND),
        60 * SECOND
    );
    assert_eq!(
        next_delay_ms(&capped, &events, 100 * SECOND, 200 * SECOND),
        30 * SECOND
    );
}

#[test]
fn a_failed_alloc_is_replaced_on_another_node_after_its_delay_and_not_before() {
    // A batch job's default: once, 5s after the failure.
    let failed_ms = 100 * SECOND;
    let snapshot = snapshot(
        job("batch", ""),
        vec![node("a", 4096), node("b", 4096)],
        failed("a", failed_ms, Vec::new()),
    );
    let early = plan(&snapshot, failed_ms + 5 * SECOND - 1);
    assert!(
        early.place.is_empty() && early.stop.is_empty(),
        "{early:#?}"
    );
    assert_eq!(early.wake_at_ms, Some(failed_ms + 5 * SECOND));

    let now = failed_ms + 5 * SECOND;
    let due = plan(&snapshot, now);
    assert_eq!(due.place.len(), 1, "{due:#?}");
    let replacement = &due.place[0];
    assert_eq!(
        replacement.node_id, "id-b",
        "the node it failed on is avoided"
    );
    assert_eq!(replacement.alloc_index, 0);
    assert_eq!(replacement.replaces.as_deref(), Some("alloc-on-a"));
    assert_eq!(
        replacement.reschedule_events,
        [RescheduleEvent {
            reschedule_ms: now,
            prev_alloc_id: "alloc-on-a".into(),
            prev_node_id: "id-a".into(),
            delay_ms: 5 * SECOND,
        }]
    );
    assert_eq!(due.stop, [("id-a".to_string(), "alloc-on-a".to_string())]);
    assert_eq!(due.wake_at_ms, None);
}

#[test]
fn the_node_it_failed_on_is_used_when_it_is_the_only_fit() {
    let failed_ms = 100 * SECOND;
    let snapshot = snapshot(
        job("batch", ""),
        vec![node("a", 4096), node("b", 50)],
        failed("a", failed_ms, Vec::new()),
    );
    let plan = plan(&snapshot, failed_ms + 60 * SECOND);
    assert_eq!(plan.place.len(), 1, "{plan:#?}");
    assert_eq!(plan.place[0].node_id, "id-a");
}

#[test]
fn a_failed_alloc_that_fits_nowhere_stays_placed_so_its_history_is_kept() {
    let failed_ms = 100 * SECOND;
    let snapshot = snapshot(
        job("batch", ""),
        vec![node("a", 50)],
        failed("a", failed_ms, Vec::new()),
    );
    let plan = plan(&snapshot, failed_ms + 60 * SECOND);
    assert!(plan.place.is_empty() && plan.stop.is_empty(), "{plan:#?}");
    assert_eq!(plan.blocked.len(), 1);
}

#[test]
fn attempts_count_within_the_interval_and_then_the_alloc_stays_failed() {
    // A service is unlimited unless its block says `unlimited = false`, as in Nomad.
    let rules = "reschedule {\n      attempts = 2\n      interval = \"1h\"\n      delay = \"5s\"\n      delay_function = \"constant\"\n      unlimited = false\n    }";
    let hour = 3600 * SECOND;
    let failed_ms = 10 * hour;
    let nodes = || vec![node("a", 4096), node("b", 4096)];
    // Two attempts within the hour before the failure: used up.
    let spent = vec![
        event("a", failed_ms - 50 * 60 * SECOND, 5 * SECOND),
        event("b", failed_ms - 60 * SECOND, 5 * SECOND),
    ];
    let exhausted = snapshot(
        job("service", rules),
        nodes(),
        failed("a", failed_ms, spent),
    );
    let outcome = plan(&exhausted, failed_ms + hour);
    assert!(
        outcome.place.is_empty() && outcome.stop.is_empty(),
        "{outcome:#?}"
    );
    assert_eq!(outcome.wake_at_ms, None, "nothing to wake for");
    let group = berth_jobspec_hcl::parse("j.hcl", &exhausted.jobs[0].0.source)
        .unwrap()
        .groups[0]
        .clone();
    assert_eq!(
        verdict(
            &group.reschedule,
            &exhausted.placements[0],
            exhausted.reports.first()
        ),
        Some(Verdict::Exhausted)
    );
    // One of them older than the interval: one attempt left, and the old one is not
    // carried on.
    let one_left = vec![
        event("a", failed_ms - 2 * hour, 5 * SECOND),
        event("b", failed_ms - 60 * SECOND, 5 * SECOND),
    ];
    let snapshot = snapshot(
        job("service", rules),
        nodes(),
        failed("a", failed_ms, one_left),
    );
    let outcome = plan(&snapshot, failed_ms + 5 * SECOND);
    assert_eq!(outcome.place.len(), 1, "{outcome:#?}");
    let carried: Vec<&str> = outcome.place[0]
        .reschedule_events
        .iter()
        .map(|e| e.prev_node_id.as_str())
        .collect();
    assert_eq!(carried, ["id-b", "id-a"]);
}

#[test]
fn an_unlimited_policy_keeps_rescheduling_and_carries_only_the_last_attempts() {
    // A service's default: unlimited, 30s doubling up to an hour.
    let failed_ms = 1000 * 3600 * SECOND;
    let many: Vec<RescheduleEvent> = (0..20)
        .map(|i| event("b", failed_ms - (20 - i) * 60 * SECOND, 30 * SECOND))
        .collect();
    let snapshot = snapshot(
        job("service", ""),
        vec![node("a", 4096), node("b", 4096), node("c", 4096)],
        failed("a", failed_ms, many),
    );
    let early = plan(&snapshot, failed_ms + 59 * SECOND);
    assert!(early.place.is_empty());
    assert_eq!(
        early.wake_at_ms,
        Some(failed_ms + 60 * SECOND),
        "30s doubled"
    );
    let due = plan(&snapshot, failed_ms + 60 * SECOND);
    assert_eq!(due.place.len(), 1, "{due:#?}");
    assert_eq!(due.place[0].node_id, "id-c", "a and b are avoided");
    assert_eq!(due.place[0].reschedule_events.len(), 6);
}

#[test]
fn attempts_zero_without_unlimited_turns_rescheduling_off() {
    let off = "reschedule {\n      attempts = 0\n      unlimited = false\n    }";
    let snapshot = snapshot(
        job("service", off),
        vec![node("a", 4096), node("b", 4096)],
        failed("a", 100 * SECOND, Vec::new()),
    );
    let plan = plan(&snapshot, 1000 * 3600 * SECOND);
    assert!(plan.place.is_empty() && plan.stop.is_empty(), "{plan:#?}");
    assert_eq!(plan.wake_at_ms, None);
}
