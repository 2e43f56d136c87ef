//! `berth hook list`.

use std::collections::BTreeMap;
use std::process::ExitCode;

use serde::Serialize;

use super::output::print_line;
use berth_client::hook_set::HookSet;
use berth_model::hook::HookSpec;

#[derive(Serialize)]
struct Row<'a> {
    #[serde(flatten)]
    spec: &'a HookSpec,
    status: &'static str,
    /// The file's SHA-256, when it loaded.
    #[serde(skip_serializing_if = "Option::is_none")]
    digest: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<&'a str>,
    /// Log messages it dropped past its budget, as the running agent counts them (`null`:
    /// no agent answered).
    log_messages_dropped: Option<u64>,
}

pub(super) fn hook_list(
    hooks: &HookSet,
    json: bool,
    drops: Option<&BTreeMap<String, u64>>,
) -> anyhow::Result<ExitCode> {
    let dropped = |name: &str| drops.map(|drops| drops.get(name).copied().unwrap_or(0));
    let mut rows: Vec<Row> = hooks
        .loaded()
        .iter()
        .map(|h| Row {
            spec: h.spec(),
            status: "loaded",
            digest: Some(h.digest()),
            reason: None,
            log_messages_dropped: dropped(&h.spec().name),
        })
        .collect();
    rows.extend(hooks.refused().iter().map(|(spec, reason)| Row {
        spec,
        status: "refused",
        digest: None,
        reason: Some(reason),
        log_messages_dropped: dropped(&spec.name),
    }));
    // A refusal is a failure of the listing, as Nomad's status commands say one.
    let exit = if hooks.refused().is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    };
    if json {
        super::output::print_json(&rows)?;
        return Ok(exit);
    }
    if rows.is_empty() {
        print_line!(
            "No hooks are declared (add `hook \"name\" {{ path = ... }}` to the agent config)"
        );
        return Ok(ExitCode::SUCCESS);
    }
    print_line!(
        "{:<16} {:<8} {:<8} {:<10} {:<10} {:<10} {:<12} Path",
        "Name",
        "Status",
        "Timeout",
        "Memory",
        "OnFailure",
        "Applies",
        "Logs-Dropped"
    );
    for row in &rows {
        let spec = row.spec;
        print_line!(
            "{:<16} {:<8} {:<8} {:<10} {:<10} {:<10} {:<12} {}",
            spec.name,
            row.status,
            format!("{:?}", spec.timeout),
            format!("{}MiB", spec.memory_max >> 20),
            format!("{:?}", spec.on_failure).to_lowercase(),
            if spec.all_tasks {
                "all tasks"
            } else {
                "opt-in"
            },
            super::driver::dropped_cell(row.log_messages_dropped),
            spec.path.display()
        );
    }
    print_line!("\nSHA-256");
    for row in &rows {
        print_line!(
            "{:<16} {}",
            row.spec.name,
            row.digest.unwrap_or("(not loaded)")
        );
    }
    for row in &rows {
        if let Some(reason) = row.reason {
            print_line!("\n{}", super::output::one_line(reason));
        }
    }
    Ok(exit)
}
