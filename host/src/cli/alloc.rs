//! `berth alloc status`, `logs`, `restart`, `signal`, `stop` and `fs`.

use std::process::ExitCode;

use super::nomad_shapes::{path_escape, resolve_alloc};
use super::output::{clock, one_line, print_line};
use berth_api::client::Client;
use berth_client::alloc_runner::AllocStatus;
use berth_nomad_api::Empty;
use berth_nomad_api::allocs::{
    AllocFileInfo, AllocRestartRequest, AllocSignalRequest, AllocStopResponse, Allocation,
};

/// `berth alloc status`: the alloc from Nomad's `GET /v1/allocation/:id` (its id found
/// from a prefix with `GET /v1/allocations?prefix=`, as Nomad's CLI does), and what
/// Nomad's shape has no field for (the alloc dir, its disk use, each task's mounts with
/// their host paths) from berth's `GET /v1/berth/allocation/:id`.
pub(super) async fn status(client: &Client, id: &str, json: bool) -> anyhow::Result<ExitCode> {
    let id = resolve_alloc(client, id).await?;
    let path = format!("/v1/allocation/{}", path_escape(&id));
    if json {
        let alloc: serde_json::Value = client.get(&path).await?;
        super::output::print_json(&alloc)?;
        return Ok(ExitCode::SUCCESS);
    }
    let alloc: Allocation = client.get(&path).await?;
    let alloc = alloc.stub;
    let local: AllocStatus = client
        .get(&format!("/v1/berth/allocation/{}", path_escape(&id)))
        .await?;
    print_line!("ID             = {}", alloc.id);
    print_line!("Name           = {}", alloc.name);
    print_line!("Job ID         = {}", alloc.job_id);
    print_line!("Desired Status = {}", alloc.desired_status);
    print_line!("Client Status  = {}", alloc.client_status);
    print_line!("Alloc Dir      = {}", local.alloc_dir.display());
    let mb = |bytes: u64| bytes.div_ceil(berth_model::limits::MIB);
    let limit = mb(local.disk_limit_bytes);
    let limited_by = local.disk_limited_by.as_deref().unwrap_or("not yet");
    match local.disk_used_bytes {
        Some(used) => print_line!(
            "Disk           = {} MB used of {} MB (ephemeral_disk, logs included; limited by: {})",
            mb(used),
            limit,
            limited_by
        ),
        None => print_line!(
            "Disk           = not measured yet ({} MB of ephemeral_disk)",
            limit
        ),
    }
    if let Some((used, max)) = local.disk_inodes {
        print_line!("Disk Inodes    = {} used of {}", used, max);
    }
    for (name, task) in &alloc.task_states {
        print_line!();
        let failed = if task.failed { ", failed" } else { "" };
        let exit = task
            .events
            .iter()
            .rev()
            .find(|e| e.kind == "Terminated")
            .map(|e| format!(", exit code {}", e.exit_code))
            .unwrap_or_default();
        print_line!(
            "Task {:?} is {:?}{}{} (restarts: {})",
            name,
            task.state,
            failed,
            exit,
            task.restarts
        );
        let mounts = local
            .tasks
            .get(name)
            .map(|t| t.mounts.as_slice())
            .unwrap_or(&[]);
        if !mounts.is_empty() {
            print_line!("Mounts");
            print_line!(
                "{:<28} {:<44} {:<4} Propagation",
                "Destination",
                "Source",
                "Mode"
            );
            for mount in mounts {
                print_line!(
                    "{:<28} {:<44} {:<4} {}",
                    mount.task_path.display(),
                    mount.host_path.display(),
                    if mount.read_only { "ro" } else { "rw" },
                    mount.propagation.as_str()
                );
            }
        }
        print_line!("Recent Events");
        print_line!("{:<12}  {:<24} Description", "Time", "Type");
        for event in task.events.iter().rev().take(10) {
            print_line!(
                "{:<12}  {:<24} {}",
                clock(event.time / 1_000_000),
                event.kind,
                one_line(&event.display_message)
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `berth alloc restart ALLOC [TASK]`: Nomad's
/// `POST /v1/client/allocation/:alloc_id/restart`.
pub(super) async fn restart(
    client: &Client,
    id: &str,
    task: Option<&str>,
    all_tasks: bool,
) -> anyhow::Result<ExitCode> {
    let id = resolve_alloc(client, id).await?;
    let path = format!("/v1/client/allocation/{}/restart", path_escape(&id));
    let body = AllocRestartRequest {
        task_name: task.unwrap_or("").into(),
        all_tasks,
    };
    let _: Empty = client.post(&path, &body).await?;
    match task {
        Some(task) => print_line!("==> Restarted task {:?} of alloc {}", task, id),
        None => print_line!("==> Restarted the running tasks of alloc {}", id),
    }
    Ok(ExitCode::SUCCESS)
}

/// `berth alloc signal [-s SIGNAL] ALLOC [TASK]`: Nomad's
/// `POST /v1/client/allocation/:alloc_id/signal`.
pub(super) async fn signal(
    client: &Client,
    id: &str,
    task: Option<&str>,
    signal: &str,
) -> anyhow::Result<ExitCode> {
    let id = resolve_alloc(client, id).await?;
    let path = format!("/v1/client/allocation/{}/signal", path_escape(&id));
    let body = AllocSignalRequest {
        signal: signal.into(),
        task: task.unwrap_or("").into(),
    };
    let _: Empty = client.post(&path, &body).await?;
    match task {
        Some(task) => print_line!("==> Sent {} to task {:?} of alloc {}", signal, task, id),
        None => print_line!("==> Sent {} to the running tasks of alloc {}", signal, id),
    }
    Ok(ExitCode::SUCCESS)
}

/// `berth system gc`.
pub(super) async fn collect_garbage(client: &Client) -> anyhow::Result<ExitCode> {
    let done: berth_api::Collected = client.post("/v1/berth/system/gc", &()).await?;
    if done.collected.is_empty() {
        print_line!("==> Nothing to collect");
    } else {
        print_line!(
            "==> Collected {} finished alloc(s): {}",
            done.collected.len(),
            done.collected.join(", ")
        );
    }
    if !done.jobs.is_empty() {
        print_line!(
            "==> Collected {} job(s) with nothing left: {}",
            done.jobs.len(),
            done.jobs.join(", ")
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// `berth alloc logs [-stderr] [-f] ALLOC [TASK]`: the task's log from the start
/// (`GET /v1/client/fs/logs/:alloc_id?plain=true`), and with `-f` what it writes next,
/// until the task has finished (`follow=true`, a stream). On a terminal the task's
/// control characters are escaped; into a pipe or a file its bytes go as they are.
pub(super) async fn logs(
    client: &Client,
    alloc: &str,
    task: Option<&str>,
    stderr: bool,
    follow: bool,
) -> anyhow::Result<ExitCode> {
    let stream = if stderr { "stderr" } else { "stdout" };
    let mut path = format!(
        "/v1/client/fs/logs/{}?type={stream}&origin=start&offset=0&plain=true",
        path_escape(alloc)
    );
    if let Some(task) = task {
        path.push_str(&format!("&task={}", path_escape(task)));
    }
    let write = super::output::write_task_output;
    if follow {
        path.push_str("&follow=true");
        client.stream(&path, write).await?;
    } else {
        write(&client.get_bytes(&path).await?)?;
    }
    Ok(ExitCode::SUCCESS)
}

/// `berth alloc stop [-detach] ALLOC`: Nomad's `POST /v1/allocation/:id/stop`. The
/// alloc's tasks get their kill signal; a service job's scheduler places a replacement.
/// Without `-detach`, it waits until the alloc has ended and says how.
pub(super) async fn stop(client: &Client, id: &str, detach: bool) -> anyhow::Result<ExitCode> {
    let id = resolve_alloc(client, id).await?;
    let path = format!("/v1/allocation/{}", path_escape(&id));
    let stopped: AllocStopResponse = client.post(&format!("{path}/stop"), &Empty {}).await?;
    if stopped.eval_id.is_empty() {
        print_line!("==> Stopping alloc {}", id);
    } else {
        print_line!(
            "==> Stopping alloc {} (evaluation {} places its replacement)",
            id,
            stopped.eval_id
        );
    }
    if detach {
        return Ok(ExitCode::SUCCESS);
    }
    loop {
        let alloc: Allocation = match client.get(&path).await {
            Ok(alloc) => alloc,
            // Removed with its placement (asked of an agent that did not run it, the
            // cluster keeps no record of it once stopped): it has ended.
            Err(berth_api::client::ClientError::Api(_, status)) if status.as_u16() == 404 => {
                print_line!("==> Alloc {} stopped", id);
                return Ok(ExitCode::SUCCESS);
            }
            Err(error) => return Err(error.into()),
        };
        let status = alloc.stub.client_status;
        if matches!(status.as_str(), "complete" | "failed" | "lost") {
            print_line!("==> Alloc {} stopped ({})", id, status);
            return Ok(ExitCode::SUCCESS);
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

/// `berth alloc fs [-stat] ALLOC [PATH]`, as Nomad's: the alloc's directory (`PATH`
/// relative to it, its root by default) listed when it is a directory, a file's bytes
/// when it is a file, and with `-stat` what the file is. The agent resolves the path
/// inside the alloc dir and follows no link a task planted.
pub(super) async fn fs(
    client: &Client,
    id: &str,
    path: Option<&str>,
    stat: bool,
) -> anyhow::Result<ExitCode> {
    let id = resolve_alloc(client, id).await?;
    let path = path.unwrap_or("/");
    let query = |verb: &str| {
        format!(
            "/v1/client/fs/{verb}/{}?path={}",
            path_escape(&id),
            super::output::query_escape(path)
        )
    };
    let info: AllocFileInfo = client.get(&query("stat")).await?;
    if stat {
        print_file_infos(&[info]);
    } else if info.is_dir {
        let entries: Vec<AllocFileInfo> = client.get(&query("ls")).await?;
        print_file_infos(&entries);
    } else {
        super::output::write_task_output(&client.get_bytes(&query("cat")).await?)?;
    }
    Ok(ExitCode::SUCCESS)
}

/// Nomad's table of files: mode, size in bytes, modified time, name (a directory's with
/// a `/`).
fn print_file_infos(infos: &[AllocFileInfo]) {
    print_line!(
        "{:<11} {:>10}  {:<25} {}",
        "Mode",
        "Size",
        "Modified Time",
        "Name"
    );
    for info in infos {
        let slash = if info.is_dir { "/" } else { "" };
        print_line!(
            "{:<11} {:>10}  {:<25} {}{}",
            info.file_mode,
            info.size,
            info.mod_time,
            info.name,
            slash
        );
    }
}
