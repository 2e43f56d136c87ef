//! The scheduler's plan for `system` and `sysbatch` jobs, on snapshots built by hand.

use super::tests::tests_support::{job, node};
use super::*;
use crate::state::NodeSettings;

/// A `system` (or `sysbatch`) job with one group `g` of one `exec` task (100 MHz,
/// 100 MiB), with `extra` in the group.
fn per_node_job(id: &str, job_type: &str, extra: &str) -> (ClusterJob, i64) {
    let (mut record, version) = job(id, 1, extra);
    record.source = record
        .source
        .replacen('{', &format!("{{\n  type = \"{job_type}\""), 1)
        .replace("    count = 1\n", "");
    (record, version)
}

fn nodes_of(plan: &Plan) -> Vec<String> {
    let mut nodes: Vec<String> = plan.place.iter().map(|p| p.node_id.clone()).collect();
    nodes.sort();
    nodes
}

fn report(placement: &Placement, status: ClientStatus) -> AllocReport {
    AllocReport {
        alloc_id: placement.alloc_id.clone(),
        job_id: placement.job_id.clone(),
        name: placement.name.clone(),
        node_id: placement.node_id.clone(),
        node_name: String::new(),
        client_status: status,
        description: String::new(),
        updated_ms: 0,
        tasks: Default::default(),
    }
}

/// The snapshot after `plan` was applied: its placements made and its stops done.
fn applied(mut snapshot: Snapshot, plan: &Plan) -> Snapshot {
    snapshot
        .placements
        .retain(|p| !plan.stop.iter().any(|(_, alloc)| *alloc == p.alloc_id));
    snapshot.placements.extend(plan.place.iter().cloned());
    snapshot
}

fn three_nodes() -> Vec<crate::NodeView> {
    vec![
        node("a", 4000, 4096),
        node("b", 4000, 4096),
        node("c", 4000, 4096),
    ]
}

#[test]
fn a_system_job_places_one_alloc_on_every_eligible_node() {
    let snapshot = Snapshot {
        jobs: vec![per_node_job("agentd", "system", "")],
        nodes: three_nodes(),
        ..Snapshot::default()
    };
    let plan = plan(&snapshot, 1);
    assert_eq!(nodes_of(&plan), ["id-a", "id-b", "id-c"], "{plan:#?}");
    assert!(plan.place.iter().all(|p| p.name == "agentd.g[0]"));
    assert!(plan.blocked.is_empty(), "{plan:#?}");
    // Planned again once placed: nothing more to do.
    let again = super::plan(&applied(snapshot, &plan), 2);
    assert!(again.is_empty(), "{again:#?}");
}

#[test]
fn ineligible_and_draining_nodes_get_none_and_an_ineligible_node_keeps_its_own() {
    let mut nodes = three_nodes();
    nodes[1].record.eligibility = "ineligible".into();
    nodes[2].record.eligibility = "ineligible".into();
    nodes[2].record.drain = true;
    let snapshot = Snapshot {
        jobs: vec![per_node_job("agentd", "system", "")],
        nodes,
        ..Snapshot::default()
    };
    let first = plan(&snapshot, 1);
    assert_eq!(nodes_of(&first), ["id-a"], "{first:#?}");
    assert!(first.blocked.is_empty(), "{first:#?}");
    // b becomes eligible again: it gets one; c, still draining, does not.
    let mut eligible_again = applied(snapshot.clone(), &first);
    eligible_again.nodes[1].record.eligibility = "eligible".into();
    let second = plan(&eligible_again, 2);
    assert_eq!(nodes_of(&second), ["id-b"], "{second:#?}");

    // Placed everywhere, then b is marked ineligible: as in Nomad, its alloc stays.
    let everywhere = Snapshot {
        nodes: three_nodes(),
        ..snapshot
    };
    let placed = plan(&everywhere, 1);
    let mut later = applied(everywhere, &placed);
    later.nodes[1].record.eligibility = "ineligible".into();
    let plan = super::plan(&later, 2);
    assert!(plan.is_empty(), "{plan:#?}");
}

#[test]
fn a_draining_node_stops_its_system_alloc_after_its_other_allocs() {
    let mut snapshot = Snapshot {
        jobs: vec![per_node_job("agentd", "system", ""), job("web", 1, "")],
        nodes: vec![node("a", 4000, 4096)],
        ..Snapshot::default()
    };
    let placed = plan(&snapshot, 1);
    assert_eq!(placed.place.len(), 2, "{placed:#?}");
    snapshot = applied(snapshot, &placed);
    snapshot.nodes.push(node("b", 4000, 4096));
    snapshot.nodes[0].record.drain = true;
    snapshot.nodes[0].record.eligibility = "ineligible".into();
    // The web alloc moves to b first; the system alloc on a stays, and b gets its own.
    let moving = plan(&snapshot, 2);
    let system_on_a = |s: &Snapshot| {
        s.placements
            .iter()
            .find(|p| p.job_id == "agentd" && p.node_id == "id-a")
            .map(|p| p.alloc_id.clone())
    };
    let on_a = system_on_a(&snapshot).expect("a system alloc on a");
    assert!(
        !moving.stop.iter().any(|(_, alloc)| *alloc == on_a),
        "{moving:#?}"
    );
    assert_eq!(nodes_of(&moving), ["id-b", "id-b"], "{moving:#?}");
    // The web replacement runs on b, so its original on a stops; the system alloc
    // still waits for it to go.
    snapshot = applied(snapshot, &moving);
    for placement in &moving.place {
        snapshot
            .reports
            .push(report(placement, ClientStatus::Running));
    }
    let web_stops = plan(&snapshot, 3);
    assert_eq!(web_stops.stop.len(), 1, "{web_stops:#?}");
    assert!(!web_stops.stop.iter().any(|(_, alloc)| *alloc == on_a));
    // With the web alloc gone from a, the system alloc stops last.
    snapshot = applied(snapshot, &web_stops);
    let last = plan(&snapshot, 4);
    assert_eq!(last.stop, [("id-a".to_string(), on_a)], "{last:#?}");
    assert!(last.place.is_empty(), "{last:#?}");
}

#[test]
fn a_drain_deadline_stops_a_system_alloc_even_while_others_remain() {
    let mut snapshot = Snapshot {
        jobs: vec![per_node_job("agentd", "system", ""), job("web", 1, "")],
        nodes: vec![node("a", 4000, 4096)],
        ..Snapshot::default()
    };
    let placed = plan(&snapshot, 1);
    snapshot = applied(snapshot, &placed);
    snapshot.nodes[0].record.drain = true;
    snapshot.node_settings.push((
        "id-a".into(),
        NodeSettings {
            ineligible: false,
            drain: true,
            drain_deadline_ms: 10,
        },
    ));
    let before = plan(&snapshot, 5);
    assert!(before.stop.is_empty(), "{before:#?}");
    let after = plan(&snapshot, 10);
    assert_eq!(after.stop.len(), 2, "{after:#?}");
}

#[test]
fn a_node_that_joins_later_gets_one_and_a_down_node_loses_its_own_without_replacement() {
    let mut snapshot = Snapshot {
        jobs: vec![per_node_job("agentd", "system", "")],
        nodes: vec![node("a", 4000, 4096), node("b", 4000, 4096)],
        ..Snapshot::default()
    };
    let placed = plan(&snapshot, 1);
    snapshot = applied(snapshot, &placed);
    snapshot.nodes.push(node("c", 4000, 4096));
    let joined = plan(&snapshot, 2);
    assert_eq!(nodes_of(&joined), ["id-c"], "{joined:#?}");
    assert!(joined.stop.is_empty(), "{joined:#?}");
    snapshot = applied(snapshot, &joined);
    // b goes down: its alloc is lost and stopped; nothing is placed elsewhere.
    snapshot.nodes.retain(|n| n.record.name != "b");
    let down = plan(&snapshot, 3);
    assert!(down.place.is_empty(), "{down:#?}");
    assert_eq!(down.lost.len(), 1, "{down:#?}");
    assert_eq!(down.lost[0].node_id, "id-b");
    assert_eq!(down.stop.len(), 1, "{down:#?}");
    // b is back: it gets a fresh one.
    snapshot = applied(snapshot, &down);
    snapshot.nodes.push(node("b", 4000, 4096));
    let back = plan(&snapshot, 4);
    assert_eq!(nodes_of(&back), ["id-b"], "{back:#?}");
}

#[test]
fn a_completed_sysbatch_alloc_is_not_run_again_on_its_node_but_a_new_node_runs_it() {
    let mut snapshot = Snapshot {
        jobs: vec![per_node_job("sweep", "sysbatch", "")],
        nodes: vec![node("a", 4000, 4096), node("b", 4000, 4096)],
        ..Snapshot::default()
    };
    let placed = plan(&snapshot, 1);
    assert_eq!(nodes_of(&placed), ["id-a", "id-b"], "{placed:#?}");
    snapshot = applied(snapshot, &placed);
    for placement in &placed.place {
        snapshot
            .reports
            .push(report(placement, ClientStatus::Complete));
    }
    let done = plan(&snapshot, 2);
    assert!(done.is_empty(), "{done:#?}");
    // A node that joins runs it once; the two that ran it do not again.
    snapshot.nodes.push(node("c", 4000, 4096));
    let joined = plan(&snapshot, 3);
    assert_eq!(nodes_of(&joined), ["id-c"], "{joined:#?}");
    // A node that ran it and went down keeps its record: back, it does not run again.
    snapshot = applied(snapshot, &joined);
    snapshot.nodes.retain(|n| n.record.name != "a");
    let down = plan(&snapshot, 4);
    assert!(down.is_empty(), "{down:#?}");
    snapshot.nodes.push(node("a", 4000, 4096));
    let back = plan(&snapshot, 5);
    assert!(back.is_empty(), "{back:#?}");
}

#[test]
fn an_infeasible_node_is_filtered_and_a_full_node_is_a_failed_placement_with_counted_reasons() {
    let mut nodes = vec![
        node("a", 4000, 4096),
        node("b", 4000, 4096),
        node("c", 4000, 50),
    ];
    nodes[1].record.drivers.clear();
    let only_filtered = Snapshot {
        jobs: vec![per_node_job("agentd", "system", "")],
        nodes: nodes[..2].to_vec(),
        ..Snapshot::default()
    };
    // A node without the driver is filtered: the job runs where it can, no failure.
    let filtered = plan(&only_filtered, 1);
    assert_eq!(nodes_of(&filtered), ["id-a"], "{filtered:#?}");
    assert!(filtered.blocked.is_empty(), "{filtered:#?}");
    // A node with the driver but no memory left is a failed placement, reported with
    // every node's reason counted.
    // An ineligible node is not evaluated at all (Nomad looks at ready, eligible nodes).
    let mut ineligible = node("d", 4000, 4096);
    ineligible.record.eligibility = "ineligible".into();
    nodes.push(ineligible);
    let with_full = Snapshot {
        nodes,
        ..only_filtered
    };
    let failed = plan(&with_full, 1);
    assert_eq!(nodes_of(&failed), ["id-a"], "{failed:#?}");
    assert_eq!(failed.blocked.len(), 1, "{failed:#?}");
    let blocked = &failed.blocked[0];
    assert_eq!(blocked.name, "agentd.g[0]");
    assert_eq!(blocked.nodes_evaluated, 3);
    assert_eq!(blocked.coalesced, 0);
    assert_eq!(
        blocked.reasons,
        [
            ("memory exhausted".to_string(), 1),
            ("missing driver \"exec\"".to_string(), 1)
        ]
        .into_iter()
        .collect()
    );
}

#[test]
fn system_allocs_take_their_room_before_a_service_jobs_new_allocs() {
    let snapshot = Snapshot {
        // Either fits alone on the node, not both: the system job is placed first.
        jobs: vec![
            job("aaa-web", 1, ""),
            per_node_job("zzz-agent", "system", ""),
        ],
        nodes: vec![node("a", 150, 4096)],
        ..Snapshot::default()
    };
    let plan = plan(&snapshot, 1);
    assert_eq!(plan.place.len(), 1, "{plan:#?}");
    assert_eq!(plan.place[0].job_id, "zzz-agent");
    assert_eq!(plan.blocked.len(), 1, "{plan:#?}");
    assert_eq!(plan.blocked[0].job_id, "aaa-web");
}

#[test]
fn a_stopped_job_or_a_group_with_count_zero_stops_its_allocs_on_every_node() {
    let mut snapshot = Snapshot {
        jobs: vec![per_node_job("agentd", "system", "")],
        nodes: three_nodes(),
        ..Snapshot::default()
    };
    let placed = plan(&snapshot, 1);
    snapshot = applied(snapshot, &placed);
    let mut off = snapshot.clone();
    off.jobs[0].0.source = off.jobs[0]
        .0
        .source
        .replace("group \"g\" {", "group \"g\" {\n    count = 0");
    let plan_off = plan(&off, 2);
    assert_eq!(plan_off.stop.len(), 3, "{plan_off:#?}");
    assert!(plan_off.place.is_empty(), "{plan_off:#?}");
    snapshot.jobs[0].0.stopped = true;
    let stopped = plan(&snapshot, 2);
    assert_eq!(stopped.stop.len(), 3, "{stopped:#?}");
    assert!(stopped.place.is_empty(), "{stopped:#?}");
}

#[test]
fn many_full_nodes_are_one_failed_placement_record_not_one_each() {
    let nodes = (0..200)
        .map(|i| node(&format!("n{i:03}"), 4000, 50))
        .collect();
    let snapshot = Snapshot {
        jobs: vec![per_node_job("agentd", "system", "")],
        nodes,
        ..Snapshot::default()
    };
    let plan = plan(&snapshot, 1);
    assert!(plan.place.is_empty(), "{plan:#?}");
    assert_eq!(plan.blocked.len(), 1, "{:#?}", plan.blocked);
    assert_eq!(plan.blocked[0].coalesced, 199);
    assert_eq!(plan.blocked[0].reasons.len(), 1);
}
