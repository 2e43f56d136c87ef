//! `berth alloc status` and `berth alloc logs`.

use std::process::ExitCode;

use super::output::{clock, one_line};
use crate::alloc_runner::AllocStatus;
use crate::api::client::Client;

pub(super) async fn status(client: &Client, id: &str, json: bool) -> anyhow::Result<ExitCode> {
    let alloc: AllocStatus = client.get(&format!("/v1/berth/allocation/{id}")).await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&alloc)?);
        return Ok(ExitCode::SUCCESS);
    }
    let lower = |v: &dyn std::fmt::Debug| format!("{v:?}").to_lowercase();
    println!("ID             = {}", alloc.id);
    println!("Name           = {}", alloc.name);
    println!("Job ID         = {}", alloc.job_id);
    println!("Desired Status = {}", lower(&alloc.desired_status));
    println!("Client Status  = {}", lower(&alloc.client_status));
    println!("Alloc Dir      = {}", alloc.alloc_dir.display());
    let mb = |bytes: u64| bytes.div_ceil(crate::model::limits::MIB);
    let limit = mb(alloc.disk_limit_bytes);
    match alloc.disk_used_bytes {
        Some(used) => println!(
            "Disk           = {} MB used of {limit} MB (ephemeral_disk, logs included)",
            mb(used)
        ),
        None => println!("Disk           = not measured yet ({limit} MB of ephemeral_disk)"),
    }
    for (name, task) in &alloc.tasks {
        println!();
        let failed = if task.failed { ", failed" } else { "" };
        let exit = task
            .exit_code
            .map(|c| format!(", exit code {c}"))
            .unwrap_or_default();
        println!(
            "Task {name:?} is {:?}{failed}{exit} (restarts: {})",
            lower(&task.state),
            task.restarts
        );
        if !task.mounts.is_empty() {
            println!("Mounts");
            println!(
                "{:<28} {:<44} {:<4} Propagation",
                "Destination", "Source", "Mode"
            );
            for mount in &task.mounts {
                println!(
                    "{:<28} {:<44} {:<4} {}",
                    mount.task_path.display(),
                    mount.host_path.display(),
                    if mount.read_only { "ro" } else { "rw" },
                    mount.propagation.as_str()
                );
            }
        }
        println!("Recent Events");
        println!("{:<12}  {:<24} Description", "Time", "Type");
        for event in task.events.iter().rev().take(10) {
            println!(
                "{:<12}  {:<24} {}",
                clock(event.time_ms),
                event.kind.to_string(),
                one_line(&event.message)
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `berth system gc`.
pub(super) async fn collect_garbage(client: &Client) -> anyhow::Result<ExitCode> {
    let done: crate::api::Collected = client.post("/v1/berth/system/gc", &()).await?;
    if done.collected.is_empty() {
        println!("==> Nothing to collect");
    } else {
        println!(
            "==> Collected {} finished alloc(s): {}",
            done.collected.len(),
            done.collected.join(", ")
        );
    }
    if !done.jobs.is_empty() {
        println!(
            "==> Collected {} job(s) with nothing left: {}",
            done.jobs.len(),
            done.jobs.join(", ")
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// `berth alloc logs [-stderr] [-f] ALLOC [TASK]`: the task's log from the start, and
/// with `-f` what it writes next, until the alloc has finished. On a terminal the task's
/// control characters are escaped; into a pipe or a file its bytes go as they are.
pub(super) async fn logs(
    client: &Client,
    alloc: &str,
    task: Option<&str>,
    stderr: bool,
    follow: bool,
) -> anyhow::Result<ExitCode> {
    use std::io::{IsTerminal as _, Write as _};
    let escape = super::job::query_escape;
    let stream = if stderr { "stderr" } else { "stdout" };
    let terminal = std::io::stdout().is_terminal();
    let mut offset = 0u64;
    loop {
        let mut path = format!(
            "/v1/berth/client/fs/logs/{}?type={stream}&offset={offset}",
            escape(alloc)
        );
        if let Some(task) = task {
            path.push_str(&format!("&task={}", escape(task)));
        }
        let chunk: crate::agent::logs::LogChunk = client.get(&path).await?;
        let bytes = chunk.bytes();
        offset = chunk.offset;
        {
            let mut out = std::io::stdout().lock();
            if terminal {
                write!(
                    out,
                    "{}",
                    super::output::text(&String::from_utf8_lossy(&bytes))
                )?;
            } else {
                out.write_all(&bytes)?;
            }
            out.flush()?;
        }
        if bytes.is_empty() {
            if !follow || chunk.finished {
                return Ok(ExitCode::SUCCESS);
            }
            tokio::time::sleep(std::time::Duration::from_millis(250)).await;
        }
    }
}
