//! `berth driver list` and `berth driver inspect`, and the line a large compile prints.

use std::collections::BTreeMap;
use std::process::ExitCode;

use super::output::print_line;
use berth_client::driver_set::DriverSet;
use berth_model::driver::{Capabilities, MountConfigs, WorldVersion};
use berth_runtime::Runtime;
use berth_runtime::cache::CompileNotice;
use berth_runtime::driver::Driver;

#[derive(clap::Subcommand)]
pub(super) enum DriverCommand {
    /// List the loaded drivers with their capabilities and health.
    List {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Show one driver: its world, capabilities, origin, digest, how it was compiled and
    /// the limits its calls run under.
    Inspect {
        /// The driver's name, as `driver list` shows it.
        name: String,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
}

/// A large component (an 18 MB Python hook) compiles for seconds on its first load: the
/// CLI says so on stderr, with where the result is kept.
pub(super) fn compile_progress() -> berth_runtime::cache::CompileProgress {
    berth_runtime::cache::CompileProgress(std::sync::Arc::new(|notice: &CompileNotice| {
        super::output::eprint_line!("{}", compile_line(notice));
    }))
}

/// What `berth` prints before it compiles a large component.
fn compile_line(notice: &CompileNotice) -> String {
    let size = format!("{:.1} MB", notice.bytes as f64 / 1_000_000.0);
    match &notice.cache_dir {
        Some(dir) => format!(
            "==> Compiling {} ({size}) for this machine; once: it is kept in {}",
            notice.label,
            dir.display()
        ),
        None => format!("==> Compiling {} ({size}) for this machine", notice.label),
    }
}

/// `berth driver inspect NAME`: one driver, all that is known of it.
pub(super) async fn driver_inspect(
    drivers: &DriverSet,
    runtime: &Runtime,
    name: &str,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let Some(driver) = drivers.get(name) else {
        let known: Vec<&str> = drivers.iter().map(|d| d.name()).collect();
        anyhow::bail!(
            "no driver {name:?} is loaded (this agent has: {})",
            known.join(", ")
        );
    };
    let health = match driver.fingerprint().await {
        Ok(fingerprint) => {
            let state = serde_json::to_value(fingerprint.health)?;
            let state = state.as_str().unwrap_or_default().to_string();
            match fingerprint.description.as_str() {
                "" => state,
                said => format!("{state} ({})", super::output::one_line(said)),
            }
        }
        Err(error) => format!("unhealthy: {error}"),
    };
    let caps = driver.capabilities();
    // A driver that fails to describe its config is still inspected: the failure is shown.
    let schema = driver.config_schema().await;
    let limits = runtime.limits();
    let kept = berth_runtime::slots_kept_for_checks(runtime.max_instances());
    if json {
        super::output::print_json(&serde_json::json!({
            "name": driver.info().name,
            "version": driver.info().version,
            "world": format!("berth:driver@{}", driver.world().as_str()),
            "origin": driver.origin().to_string(),
            "sha256": driver.digest(),
            "compiled": driver.compiled().to_string(),
            "health": health,
            "capabilities": caps,
            "config_schema": match &schema {
                Ok(fields) => serde_json::to_value(fields)?,
                Err(error) => serde_json::json!({ "error": error.to_string() }),
            },
            "limits": {
                "call_deadline_ms": limits.call_deadline.as_millis() as u64,
                "memory_max_bytes": limits.memory_max,
                "max_instances": runtime.max_instances(),
                "instances_kept_for_checks": kept,
                "slot_wait_ms": runtime.slot_wait().as_millis() as u64,
            },
        }))?;
        return Ok(ExitCode::SUCCESS);
    }
    let rows = [
        ("Name", driver.info().name.clone()),
        // A driver chooses its version string: print it escaped.
        (
            "Version",
            super::output::one_line(&driver.info().version).into_owned(),
        ),
        ("World", format!("berth:driver@{}", driver.world().as_str())),
        ("Origin", driver.origin().to_string()),
        ("SHA-256", driver.digest().to_string()),
        ("Compiled", driver.compiled().to_string()),
        ("Health", health),
        ("Mount configs", mount_configs(caps).to_string()),
        ("FS isolation", caps.fs_isolation.as_str().to_string()),
        ("Spawns", spawns(caps)),
        ("Signals", yes_no(caps.send_signals)),
        ("Exec", yes_no(caps.exec)),
        (
            "Call deadline",
            format!(
                "{} ms of guest compute per call (time blocked in the host does not count)",
                limits.call_deadline.as_millis()
            ),
        ),
        (
            "Memory",
            format!("{} MiB per instance", limits.memory_max >> 20),
        ),
        (
            "Instances",
            format!(
                "{} at once, shared by every driver and hook ({kept} kept for checks); a call \
                 waits up to {} ms for one",
                runtime.max_instances(),
                runtime.slot_wait().as_millis()
            ),
        ),
    ];
    for (label, value) in rows {
        print_line!("{:<14} {}", label, value);
    }
    for (index, line) in config_lines(&schema).iter().enumerate() {
        print_line!("{:<14} {}", if index == 0 { "Config" } else { "" }, line);
    }
    print_line!(
        "\nTo pin it: plugin {:?} {{ sha256 = \"{}\" }}",
        driver.info().name,
        driver.digest()
    );
    Ok(ExitCode::SUCCESS)
}

fn mount_configs(caps: &Capabilities) -> &'static str {
    match (caps.mount_configs, caps.declared) {
        (MountConfigs::All, true) => "all",
        (MountConfigs::None, _) => "none",
        (MountConfigs::All, false) => "all (default)",
    }
}

/// How the driver said its spawns are confined, and what that takes of the operator.
fn spawns(caps: &Capabilities) -> String {
    let Some(spawns) = &caps.spawn_isolation else {
        return "not declared (built before berth:driver@0.2.1; held to its FS isolation)".into();
    };
    if spawns.is_empty() {
        return "nothing".into();
    }
    let names: Vec<&str> = spawns.iter().map(|s| s.as_str()).collect();
    let mut shown = names.join(", ");
    if caps.declares_unconfined() {
        shown.push_str(" (unconfined: its tasks run only where the operator allows it)");
    }
    shown
}

/// The driver's config fields, a line each (`name  type  required`).
fn config_lines(
    schema: &Result<
        Option<Vec<berth_model::driver::ConfigField>>,
        berth_runtime::driver::DriverError,
    >,
) -> Vec<String> {
    let fields = match schema {
        Err(error) => return vec![format!("unreadable: {error}")],
        Ok(None) => {
            return vec!["not described by the driver".into()];
        }
        Ok(Some(fields)) if fields.is_empty() => {
            return vec!["none (a config block must be empty)".into()];
        }
        Ok(Some(fields)) => fields,
    };
    let width = fields
        .iter()
        .map(|f| f.name.chars().count())
        .max()
        .unwrap_or(0);
    fields
        .iter()
        .map(|field| {
            // The driver wrote these: the runtime made each one line and clipped it.
            let required = if field.required { "  (required)" } else { "" };
            format!("{:<width$}  {}{required}", field.name, field.hcl_type)
        })
        .collect()
}

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
            [
                d.info().name.clone(),
                // A driver chooses its version string: print it escaped.
                super::output::one_line(&d.info().version).into_owned(),
                d.world().as_str().to_string(),
                mount_configs(caps).to_string(),
                caps.fs_isolation.as_str().to_string(),
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
