//! `berth driver list`.

use std::collections::BTreeMap;

use super::output::print_line;
use berth_client::driver_set::DriverSet;
use berth_model::driver::{MountConfigs, WorldVersion};
use berth_runtime::driver::Driver;

/// `drops`: the log messages each plugin dropped, from the running agent (`None`: no
/// agent answered).
pub(super) async fn driver_list(
    drivers: &DriverSet,
    json: bool,
    drops: Option<&BTreeMap<String, u64>>,
) -> anyhow::Result<()> {
    let dropped = |name: &str| drops.map(|drops| drops.get(name).copied().unwrap_or(0));
    let mut rows = Vec::new();
    for driver in drivers.iter() {
        let health = match driver.fingerprint().await {
            Ok(fingerprint) => serde_json::to_value(fingerprint.health)?
                .as_str()
                .unwrap_or_default()
                .to_string(),
            Err(error) => format!("unhealthy: {error}"),
        };
        rows.push((driver, health));
    }
    if json {
        let list: Vec<_> = rows
            .iter()
            .map(|(d, health)| {
                serde_json::json!({
                    "name": d.info().name,
                    "version": d.info().version,
                    "world": d.world().as_str(),
                    "capabilities": d.capabilities(),
                    "health": health,
                    "origin": d.origin().to_string(),
                    "sha256": d.digest(),
                    "log_messages_dropped": dropped(&d.info().name),
                })
            })
            .collect();
        super::output::print_json(&list)?;
        return Ok(());
    }
    let header = [
        "Name",
        "Version",
        "World",
        "Mount-Configs",
        "FS-Isolation",
        "Signals",
        "Exec",
        "Health",
        "Logs-Dropped",
        "Origin",
    ];
    let table: Vec<[String; 10]> = rows
        .iter()
        .map(|(d, health)| {
            let caps = d.capabilities();
            let mounts = match (caps.mount_configs, caps.declared) {
                (MountConfigs::All, true) => "all",
                (MountConfigs::None, _) => "none",
                (MountConfigs::All, false) => "all (default)",
            };
            [
                d.info().name.clone(),
                // A driver chooses its version string: print it escaped.
                super::output::one_line(&d.info().version).into_owned(),
                d.world().as_str().to_string(),
                mounts.to_string(),
                serde_json::to_value(caps.fs_isolation)
                    .unwrap()
                    .as_str()
                    .unwrap()
                    .to_string(),
                yes_no(caps.send_signals),
                yes_no(caps.exec),
                health.clone(),
                dropped_cell(dropped(&d.info().name)),
                d.origin().to_string(),
            ]
        })
        .collect();
    print_table(&header, &table);
    let legacy: Vec<&&std::sync::Arc<Driver>> = rows
        .iter()
        .map(|(d, _)| d)
        .filter(|d| d.world() == WorldVersion::V0_1)
        .collect();
    for driver in legacy {
        print_line!(
            "\n{} is built against berth:driver@0.1.0, which predates capabilities: \
             mount-configs \"all\" is the default.",
            driver.info().name
        );
    }
    // What an operator pins: plugin "NAME" { sha256 = "..." }.
    print_line!("\nSHA-256");
    for (driver, _) in &rows {
        print_line!("{:<12} {}", driver.info().name, driver.digest());
    }
    Ok(())
}

/// A count of dropped log messages, or "-" when no agent answered.
pub(super) fn dropped_cell(dropped: Option<u64>) -> String {
    dropped.map_or_else(|| "-".to_string(), |n| n.to_string())
}

fn yes_no(value: bool) -> String {
    if value { "yes" } else { "no" }.to_string()
}

pub(super) fn print_table<const N: usize>(header: &[&str; N], rows: &[[String; N]]) {
    let mut widths = header.map(str::len);
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.len());
        }
    }
    let line = |cells: Vec<&str>| {
        let padded: Vec<String> = cells
            .iter()
            .zip(widths)
            .map(|(cell, width)| format!("{cell:<width$}"))
            .collect();
        print_line!("{}", padded.join("  ").trim_end());
    };
    line(header.to_vec());
    for row in rows {
        line(row.iter().map(String::as_str).collect());
    }
}
