//! What the scheduler could not place, as Nomad's CLI prints it: after `job run`
//! (the register's evaluation) and in `job status` (the job's latest evaluation).

use std::collections::BTreeMap;

use berth_nomad_api::evals::{AllocationMetric, Evaluation};

use super::nomad_shapes::path_escape;
use super::output::{one_line, print_line};
use berth_api::client::Client;

/// Prints what evaluation `eval_id` could not place, as `nomad job run` does; whether
/// there was any.
pub(super) fn print_after_run(eval_id: &str, groups: &BTreeMap<String, AllocationMetric>) -> bool {
    if groups.is_empty() {
        return false;
    }
    print_line!(
        "==> Evaluation {:?} finished with status \"complete\" but failed to place all \
         allocations:",
        berth_state::catalog::short_id(eval_id)
    );
    for (group, metric) in groups {
        let count = metric.coalesced_failures.saturating_add(1);
        print_line!(
            "    Task Group {:?} (failed to place {} allocation{}):",
            group,
            count,
            if count == 1 { "" } else { "s" }
        );
        print_metric(metric, "      ");
    }
    true
}

/// `job status`'s "Placement Failure" section, as `nomad job status` prints it, from the
/// job's latest evaluation: what it could not place, and why in the scheduler's words
/// (`Resources exhausted: memory (412 MiB free)`). Nothing when it placed everything.
pub(super) async fn print_latest(client: &Client, job_id: &str) -> anyhow::Result<()> {
    let evaluations: Vec<Evaluation> = client
        .get(&format!("/v1/job/{}/evaluations", path_escape(job_id)))
        .await?;
    let latest = evaluations
        .iter()
        .filter(|e| e.status == "complete")
        .max_by_key(|e| e.modify_index);
    let Some(latest) = latest else {
        return Ok(());
    };
    let Some(groups) = latest.failed_tg_allocs.as_ref().filter(|g| !g.is_empty()) else {
        return Ok(());
    };
    print_line!();
    print_line!("Placement Failure");
    for (group, metric) in groups {
        print_line!("Task Group {:?}:", group);
        print_metric(metric, "  ");
    }
    if !latest.status_description.is_empty() {
        print_line!("  {}", one_line(&latest.status_description));
    }
    Ok(())
}

/// One group's `AllocationMetric`: the constraints that filtered nodes and the
/// resources that were exhausted, with how many nodes each.
fn print_metric(metric: &AllocationMetric, indent: &str) {
    for (constraint, nodes) in &metric.constraint_filtered {
        print_line!(
            "{}* Constraint {:?}: {} nodes excluded by filter",
            indent,
            constraint,
            nodes
        );
    }
    let exhausted = metric.nodes_exhausted;
    if exhausted > 0 {
        print_line!("{}* Resources exhausted on {} nodes", indent, exhausted);
    }
    for (dimension, nodes) in &metric.dimension_exhausted {
        print_line!(
            "{}* Dimension {:?} exhausted on {} nodes",
            indent,
            dimension,
            nodes
        );
    }
}
